"""Index refresh inside a training process (issue 4 item 4): first index, background loads,
swaps only at step boundaries, broken indexes kept out, staleness metrics."""

import logging
import os
import threading
import time

import numpy as np
import pytest

from realm_jax.index import store
from realm_jax.index import swap

STORE_ID = "store-abc"
TIMEOUT = 10.0


def publish(run_dir, step, **kwargs):
  emb = np.random.default_rng(step).standard_normal((50, 8)).astype(np.float32)
  return store.publish_index(str(run_dir), step, emb, block_store_id=STORE_ID, keep=None,
                             **kwargs)


def corrupt(path):
  with open(os.path.join(path, store.EMBEDDINGS), "r+b") as f:
    f.seek(-1, os.SEEK_END)
    byte = f.read(1)
    f.seek(-1, os.SEEK_END)
    f.write(bytes([byte[0] ^ 0xFF]))


class CountingLoads:
  """Wraps store.load_index to count the load attempts per step (good or bad)."""

  def __init__(self, monkeypatch):
    self.steps = []
    real = store.load_index

    def counting(path, **kwargs):
      self.steps.append(int(os.path.basename(path)))
      return real(path, **kwargs)
    monkeypatch.setattr(store, "load_index", counting)


def step_of(loaded):
  return loaded.step


def test_start_without_an_index_says_how_to_build_one(tmp_path):
  watcher = swap.IndexWatcher(str(tmp_path))
  with pytest.raises(swap.NoIndexError) as info:
    watcher.start()
  message = str(info.value)
  assert message.startswith(os.path.join(str(tmp_path), "index") + ": no published index")
  assert "python -m realm_jax.build_index --once" in message and "ICT" in message
  with pytest.raises(RuntimeError, match="before start"):
    watcher.maybe_swap(0)


def test_start_loads_the_newest_or_the_given_step(tmp_path):
  for step in (0, 10, 20):
    publish(tmp_path, step)
  with swap.IndexWatcher(str(tmp_path), load_fn=step_of) as watcher:
    assert watcher.start() == 20 and watcher.current == 20 and watcher.index_step == 20
  with swap.IndexWatcher(str(tmp_path)) as watcher:  # default load_fn: the LoadedIndex itself
    loaded = watcher.start(initial_step=10)
    assert isinstance(loaded, store.LoadedIndex) and loaded.step == 10
  with pytest.raises(store.IndexLoadError, match="no such index directory"):
    swap.IndexWatcher(str(tmp_path)).start(initial_step=15)


def test_start_falls_back_past_a_broken_newest_index(tmp_path, caplog):
  publish(tmp_path, 0)
  corrupt(publish(tmp_path, 10))
  with swap.IndexWatcher(str(tmp_path), load_fn=step_of) as watcher:
    assert watcher.start() == 0
    assert watcher.failed_steps == {10}
  assert f"{store.index_dir(str(tmp_path), 10)}: embeddings.npy does not match" in caplog.text
  corrupt(store.index_dir(str(tmp_path), 0))
  with pytest.raises(swap.NoIndexError, match="none of the published indexes"):
    swap.IndexWatcher(str(tmp_path)).start()


def test_swaps_only_at_maybe_swap_after_check_every_steps(tmp_path, monkeypatch):
  publish(tmp_path, 0)
  loads = CountingLoads(monkeypatch)
  with swap.IndexWatcher(str(tmp_path), load_fn=step_of, check_every_steps=10) as watcher:
    assert watcher.start() == 0
    assert watcher.maybe_swap(100) == 0  # first call: the baseline for counting steps
    publish(tmp_path, 5)
    for step in range(101, 110):
      assert watcher.maybe_swap(step) == 0
    assert watcher.wait(TIMEOUT) and loads.steps == [0]  # no check before 10 steps passed
    assert watcher.maybe_swap(110) == 0  # starts the background check
    assert watcher.wait(TIMEOUT) and loads.steps == [0, 5]
    assert watcher.current == 0 and watcher.refreshes == 0  # loaded, but not swapped yet
    assert watcher.maybe_swap(111) == 5  # the next step boundary swaps it in
    assert watcher.current == 5 and watcher.refreshes == 1
    for step in range(112, 125):  # nothing newer: checks at 120 find nothing to load
      assert watcher.maybe_swap(step) == 5
      watcher.wait(TIMEOUT)
    assert loads.steps == [0, 5] and watcher.refreshes == 1


def test_a_background_load_does_not_block_the_train_step(tmp_path):
  publish(tmp_path, 0)
  release, entered = threading.Event(), threading.Event()

  def slow_load(loaded):
    if loaded.step != 0:
      entered.set()
      assert release.wait(TIMEOUT)
    return loaded.step

  with swap.IndexWatcher(str(tmp_path), load_fn=slow_load, check_every_steps=2) as watcher:
    watcher.start()
    watcher.maybe_swap(0)
    publish(tmp_path, 50)
    assert watcher.maybe_swap(2) == 0
    assert entered.wait(TIMEOUT)  # the load is now held inside load_fn
    for step in range(3, 12):  # several check intervals pass; no second load is started
      began = time.monotonic()
      assert watcher.maybe_swap(step) == 0
      assert time.monotonic() - began < 0.5
    assert not watcher.wait(0.05)
    release.set()
    assert watcher.wait(TIMEOUT)
    assert watcher.maybe_swap(12) == 50 and watcher.refreshes == 1


@pytest.mark.parametrize("fault", ["checksum", "num_blocks", "load_fn"])
def test_a_broken_newer_index_is_kept_out_and_not_retried(tmp_path, monkeypatch, caplog, fault):
  publish(tmp_path, 0)
  loads = CountingLoads(monkeypatch)

  def load_fn(loaded):
    if fault == "load_fn" and loaded.step == 10:
      raise RuntimeError("device out of memory")
    return loaded.step

  with swap.IndexWatcher(str(tmp_path), load_fn=load_fn, check_every_steps=5,
                         block_store_id=STORE_ID, num_blocks=50, dim=8) as watcher:
    watcher.start()
    watcher.maybe_swap(0)
    if fault == "num_blocks":  # an index of another corpus size, published by mistake
      store.publish_index(str(tmp_path), 10, np.ones((40, 8), np.float32),
                          block_store_id=STORE_ID)
    else:
      path = publish(tmp_path, 10)
      if fault == "checksum":
        corrupt(path)
    watcher.maybe_swap(5)
    assert watcher.wait(TIMEOUT)
    for step in range(6, 30):  # later checks at 10, 15, ... do not try step 10 again
      assert watcher.maybe_swap(step) == 0
      assert watcher.wait(TIMEOUT)
    assert loads.steps == [0, 10] and watcher.failed_steps == {10}
    assert watcher.refreshes == 0 and watcher.metrics(30)["retrieval/index_step"] == 0

    publish(tmp_path, 20)  # a newer good one is picked up as usual
    watcher.maybe_swap(30)
    assert watcher.wait(TIMEOUT)
    assert watcher.maybe_swap(31) == 20 and watcher.refreshes == 1

  path = store.index_dir(str(tmp_path), 10)
  reason = {"checksum": "embeddings.npy does not match its sha256",
            "num_blocks": "has 40 blocks, expected 50",
            "load_fn": "RuntimeError: device out of memory"}[fault]
  errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
  assert any(path in m and reason in m and "Keeping index step 0" in m for m in errors), errors


def test_metrics_with_a_fake_clock(tmp_path):
  publish(tmp_path, 100)
  now = [0.0]
  with swap.IndexWatcher(str(tmp_path), load_fn=step_of, check_every_steps=1,
                         clock=lambda: now[0]) as watcher:
    watcher.start()
    published = watcher.current_index.published_unix
    now[0] = published + 42.5
    watcher.maybe_swap(130)
    assert watcher.metrics(130) == {"retrieval/index_step": 100,
                                    "retrieval/staleness_steps": 30,
                                    "retrieval/staleness_seconds": 42.5,
                                    "retrieval/refreshes": 0}
    publish(tmp_path, 120)
    watcher.maybe_swap(131)
    assert watcher.wait(TIMEOUT)
    assert watcher.maybe_swap(132) == 120
    published = watcher.current_index.published_unix
    now[0] = published + 7.0
    assert watcher.metrics(140) == {"retrieval/index_step": 120,
                                    "retrieval/staleness_steps": 20,
                                    "retrieval/staleness_seconds": 7.0,
                                    "retrieval/refreshes": 1}


def test_concurrent_callers_start_one_load_and_close_joins(tmp_path, monkeypatch):
  publish(tmp_path, 0)
  loads = CountingLoads(monkeypatch)
  release = threading.Event()

  def held(loaded):
    if loaded.step:
      assert release.wait(TIMEOUT)
    return loaded.step

  watcher = swap.IndexWatcher(str(tmp_path), load_fn=held, check_every_steps=1)
  watcher.start()
  watcher.maybe_swap(0)
  publish(tmp_path, 9)
  callers = [threading.Thread(target=watcher.maybe_swap, args=(1,)) for _ in range(8)]
  for thread in callers:
    thread.start()
  for thread in callers:
    thread.join(TIMEOUT)
  release.set()
  watcher.close()  # joins the background load and drops its result
  assert loads.steps == [0, 9] and watcher.current == 0
  with pytest.raises(RuntimeError, match="closed"):
    watcher.maybe_swap(2)
