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
  release, entered, left = threading.Event(), threading.Event(), threading.Event()

  def slow_load(loaded):
    if loaded.step != 0:
      entered.set()
      try:
        assert release.wait(TIMEOUT)
      finally:
        left.set()
    return loaded.step

  with swap.IndexWatcher(str(tmp_path), load_fn=slow_load, check_every_steps=2) as watcher:
    watcher.start()
    watcher.maybe_swap(0)
    publish(tmp_path, 50)
    assert watcher.maybe_swap(2) == 0
    assert entered.wait(TIMEOUT)  # the load is now held inside load_fn
    # Several check intervals pass; no second load is started, and each step boundary returns
    # while the load is still held (a blocking one would return only once load_fn had left,
    # after the release or the timeout), however long the machine's load makes a step.
    for step in range(3, 12):
      assert watcher.maybe_swap(step) == 0
      assert not left.is_set()
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


# ------------------------------------------------------------------------------- lockstep


def _lockstep_watcher(run_dir, **kwargs):
  kwargs = {"lockstep_every": 4, "lockstep_timeout": TIMEOUT, "poll_seconds": 0.01,
            "load_fn": step_of, **kwargs}
  return swap.IndexWatcher(str(run_dir), **kwargs)


def test_lockstep_step_s_searches_the_newest_checkpoint_before_it_waiting_for_it(tmp_path,
                                                                                  monkeypatch):
  publish(tmp_path, 0)
  publish(tmp_path, 8)  # published early: lockstep never takes an index before its turn
  loads = CountingLoads(monkeypatch)
  watcher = _lockstep_watcher(tmp_path)
  with watcher:
    watcher.start(initial_step=0)
    assert [watcher.maybe_swap(s) for s in (1, 2, 3, 4)] == [0, 0, 0, 0]
    # Step 5 must search checkpoint 4's index, which the builder publishes 0.3 s from now.
    threading.Timer(0.3, publish, args=(tmp_path, 4)).start()
    started = time.monotonic()
    assert watcher.maybe_swap(5) == 4
    assert time.monotonic() - started >= 0.25
    assert [watcher.maybe_swap(s) for s in (6, 7, 8)] == [4, 4, 4]
    assert watcher.maybe_swap(9) == 8  # already there: no wait
    assert watcher.refreshes == 2
    assert watcher.metrics(9)["retrieval/staleness_steps"] == 1
  assert loads.steps == [0, 4, 8]  # nothing loaded in the background, nothing twice


def test_lockstep_resumed_run_goes_back_to_the_index_its_step_is_due(tmp_path):
  for step in (0, 4, 8):
    publish(tmp_path, step)
  with _lockstep_watcher(tmp_path) as watcher:
    assert watcher.start() == 8  # the newest, as any start
    assert watcher.maybe_swap(5) == 4  # resumed from checkpoint 4: steps 5-8 search index 4
    assert watcher.refreshes == 1  # as uninterrupted: the refresh at step 5 is the schedule's


def test_lockstep_an_index_never_published_is_an_error_naming_it(tmp_path):
  publish(tmp_path, 0)
  with _lockstep_watcher(tmp_path, lockstep_timeout=0.2) as watcher:
    watcher.start()
    with pytest.raises(swap.IndexNotPublishedError) as error:
      watcher.maybe_swap(5)
  assert str(error.value) == (
      f"step 5 searches the index of checkpoint 4 ({store.index_dir(str(tmp_path), 4)}), which "
      f"was not published within 0.2s: is the index builder running (python -m "
      f"realm_jax.build_index on this run directory)?")


@pytest.mark.parametrize("every", [0, -4, 2.5, True])
def test_lockstep_every_must_be_a_positive_int(tmp_path, every):
  with pytest.raises(ValueError, match="lockstep_every must be None or an int >= 1"):
    swap.IndexWatcher(str(tmp_path), lockstep_every=every)
