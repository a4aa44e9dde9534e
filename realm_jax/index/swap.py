"""Index refresh inside a training process: load newer indexes in the background, swap at step
boundaries, report staleness.

The index is a versioned input, not train state: a separate builder publishes
`<run_dir>/index/<step>/` (`index/store.py`) and `IndexWatcher` follows it. Loading runs on a
background thread; the swap is a pointer change inside `maybe_swap`, so every train step sees
one index and each batch records the index step that chose its candidates (REALM_SPEC 21). An
index that fails to load is logged and never retried; the trainer keeps the one it has.
`lockstep_every=R` instead searches at step s the index of checkpoint R * floor((s - 1) / R),
waiting for it, so a run no longer depends on the builder's speed. Usage and design:
docs/design/data_index_batches.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Generic, Optional, TypeVar

from realm_jax.index import store

T = TypeVar("T")

log = logging.getLogger(__name__)

BUILD_INDEX_COMMAND = "python -m realm_jax.build_index --once"


class NoIndexError(FileNotFoundError):
  """No usable published index exists when training needs its first one."""


def _identity(loaded: store.LoadedIndex) -> Any:
  return loaded


class IndexNotPublishedError(TimeoutError):
  """Lockstep: the index a step must search was not published in time (is the builder
  running?)."""


class IndexWatcher(Generic[T]):
  """Follows a run's published indexes and swaps newer ones in at step boundaries.

  Thread-safe: `maybe_swap`, `metrics`, `current` and `close` may be called from any thread;
  at most one background load runs at a time.
  """

  def __init__(self, run_dir: str, *,
               load_fn: Optional[Callable[[store.LoadedIndex], T]] = None,
               check_every_steps: int = 100, block_store_id: Optional[str] = None,
               num_blocks: Optional[int] = None, dim: Optional[int] = None,
               clock: Callable[[], float] = time.time, verify: bool | str = True,
               mmap: bool = True, lockstep_every: Optional[int] = None,
               lockstep_timeout: float = 600.0, poll_seconds: float = 0.2):
    """Creates a watcher; nothing is loaded until `start`.

    Args:
      load_fn: turns a verified LoadedIndex into what the trainer searches with; runs on the
        background thread for refreshes, synchronously in `start`. Default: the LoadedIndex.
      check_every_steps: look for a newer index once every this many train steps.
      block_store_id, num_blocks, dim: if given, refuse indexes that differ.
      clock: seconds since the epoch, for staleness in seconds (injectable for tests).
      verify, mmap: passed to `store.load_index`.
      lockstep_every: refresh in lockstep with the checkpoints every this many steps (the module
        docstring); None: in the background. `lockstep_timeout` bounds the wait for an index.
    """
    if check_every_steps < 1:
      raise ValueError(f"check_every_steps must be >= 1, got {check_every_steps}")
    if lockstep_every is not None and (isinstance(lockstep_every, bool)
                                       or not isinstance(lockstep_every, int)
                                       or lockstep_every < 1):
      raise ValueError(f"lockstep_every must be None or an int >= 1, got {lockstep_every!r}")
    self.lockstep_every = lockstep_every
    self._lockstep_timeout = float(lockstep_timeout)
    self._poll_seconds = float(poll_seconds)
    self.run_dir = os.fspath(run_dir)
    self._load_fn = load_fn or _identity
    self.check_every_steps = int(check_every_steps)
    self._expect = {"block_store_id": block_store_id, "num_blocks": num_blocks, "dim": dim}
    self._clock = clock
    self._verify = verify
    self._mmap = mmap

    self._lock = threading.Lock()
    self._index: Optional[store.LoadedIndex] = None  # the index in use
    self._value: Optional[T] = None  # load_fn(self._index)
    self._pending: Optional[tuple[store.LoadedIndex, T]] = None  # loaded, not yet swapped in
    self._thread: Optional[threading.Thread] = None
    self._last_check_step: Optional[int] = None
    self._failed_steps: set[int] = set()
    self._refreshes = 0
    self._closed = False

  # -- loading

  def _load(self, step: int) -> tuple[store.LoadedIndex, T]:
    loaded = store.load_index(store.index_dir(self.run_dir, step), verify=self._verify,
                              mmap=self._mmap, **self._expect)
    return loaded, self._load_fn(loaded)

  def start(self, initial_step: Optional[int] = None) -> T:
    """Loads the first index synchronously, so training never starts without one, and returns its
    `load_fn` value (also `current`): `initial_step`, or the newest that loads (a broken newest one
    is logged and an older one tried). NoIndexError, saying how to build the first one, when none
    loads; store.IndexLoadError when `initial_step` does not.
    """
    with self._lock:
      if self._closed:
        raise RuntimeError("IndexWatcher is closed")
      if self._index is not None:
        raise RuntimeError("IndexWatcher.start() was already called")
    root = store.index_root(self.run_dir)
    if initial_step is not None:
      loaded, value = self._load(initial_step)
    else:
      steps = store.list_indexes(self.run_dir)
      if not steps:
        raise NoIndexError(
            f"{root}: no published index. Training retrieves from an index from its first step "
            f"(REALM_SPEC 22): build the first one from the ICT warm-start checkpoint with "
            f"`{BUILD_INDEX_COMMAND} ...` (pointing it at this run directory and that "
            f"checkpoint), then start training again.")
      reasons = []
      loaded = None
      for step in reversed(steps):
        try:
          loaded, value = self._load(step)
          break
        except Exception as e:  # pylint: disable=broad-except
          # Start on an older good index rather than not at all; say so loudly.
          path = store.index_dir(self.run_dir, step)
          log.error("Index %s does not load (%s); trying an older one.", path, e)
          reasons.append(f"step {step}: {e}")
          self._failed_steps.add(step)
      if loaded is None:
        raise NoIndexError(
            f"{root}: none of the published indexes {steps} loads:\n  " + "\n  ".join(reasons)
            + f"\nRebuild one with `{BUILD_INDEX_COMMAND} ...`.")
    with self._lock:
      self._index, self._value = loaded, value
    log.info("Retrieving from index %s (checkpoint step %d).", loaded.path, loaded.step)
    return value

  def _background_check(self, current_step: int) -> None:
    """Finds the newest published step newer than `current_step` that has not failed; loads it."""
    try:
      steps = store.list_indexes(self.run_dir)
    except OSError as e:  # e.g. a network filesystem hiccup: just try at the next check
      log.warning("Cannot list %s (%s); will look again later.", store.index_root(self.run_dir), e)
      return
    with self._lock:
      candidates = [s for s in steps if s > current_step and s not in self._failed_steps]
    if not candidates:
      return
    step = candidates[-1]
    path = store.index_dir(self.run_dir, step)
    try:
      result = self._load(step)
    except Exception as e:  # pylint: disable=broad-except
      # Refreshing is best effort: a bad publication must not stop training.
      if isinstance(e, store.IndexLoadError):
        log.error("Not swapping in index %s: %s. Keeping index step %d.", path, e, current_step)
      else:
        log.exception("Not swapping in index %s: loading it raised %s: %s. Keeping index step "
                      "%d.", path, type(e).__name__, e, current_step)
      with self._lock:
        self._failed_steps.add(step)
      return
    with self._lock:
      if not self._closed:
        self._pending = result

  # -- the trainer's calls

  def maybe_swap(self, train_step: int) -> T:
    """Called at every step boundary with the step about to run: swaps in a finished background
    load, maybe starts one, and returns the `load_fn` value to use for this step. Never waits
    (outside lockstep): a check for a newer index starts every `check_every_steps` steps unless
    one is running.
    """
    train_step = int(train_step)
    if self.lockstep_every is not None:
      return self._lockstep_swap(train_step)
    with self._lock:
      if self._index is None:
        raise RuntimeError("IndexWatcher.maybe_swap() before start()")
      if self._closed:
        raise RuntimeError("IndexWatcher is closed")
      if self._pending is not None:
        old_step = self._index.step
        (self._index, self._value), self._pending = self._pending, None
        self._refreshes += 1
        log.info("Step %d: swapped in index %s (checkpoint step %d, was %d).", train_step,
                 self._index.path, self._index.step, old_step)
      running = self._thread is not None and self._thread.is_alive()
      if self._last_check_step is None or train_step < self._last_check_step:
        # First call (start() has just looked), or the step went back (a restore): count anew.
        self._last_check_step = train_step
      elif train_step - self._last_check_step >= self.check_every_steps and not running:
        self._last_check_step = train_step
        self._thread = threading.Thread(
            target=self._background_check, args=(self._index.step,),
            name=f"IndexWatcher-check-{train_step}", daemon=True)
        self._thread.start()
      return self._value

  def lockstep_index_step(self, train_step: int) -> int:
    """Lockstep: the checkpoint step whose index `train_step` searches."""
    return (int(train_step) - 1) // self.lockstep_every * self.lockstep_every

  def _lockstep_swap(self, train_step: int) -> T:
    """Lockstep `maybe_swap`: swaps in the index `train_step` is due to search, waiting for its
    publication (IndexNotPublishedError after `lockstep_timeout`); a broken one raises."""
    due = self.lockstep_index_step(train_step)
    with self._lock:
      if self._index is None:
        raise RuntimeError("IndexWatcher.maybe_swap() before start()")
      if self._closed:
        raise RuntimeError("IndexWatcher is closed")
      # The schedule's count, not this invocation's swaps: a resumed run reports what an
      # uninterrupted one would.
      self._refreshes = due // self.lockstep_every
      if self._index.step == due:
        return self._value
      old_step = self._index.step
    path = store.index_dir(self.run_dir, due)
    started = self._clock()
    deadline = time.monotonic() + self._lockstep_timeout
    while due not in store.list_indexes(self.run_dir):
      if time.monotonic() >= deadline:
        raise IndexNotPublishedError(
            f"step {train_step} searches the index of checkpoint {due} ({path}), which was not "
            f"published within {self._lockstep_timeout:g}s: is the index builder running "
            f"(python -m realm_jax.build_index on this run directory)?")
      time.sleep(self._poll_seconds)
    loaded, value = self._load(due)  # a published index that does not load: an error here
    with self._lock:
      self._index, self._value = loaded, value
    log.info("Step %d: swapped in index %s (checkpoint step %d, was %d; waited %.1fs for it).",
             train_step, loaded.path, due, old_step, self._clock() - started)
    return value

  def metrics(self, train_step: int) -> dict[str, float]:
    """The metrics of the index in use at `train_step`: `retrieval/index_step`,
    `retrieval/staleness_steps` (train_step - index step), `retrieval/staleness_seconds` (now - its
    publish time) and `retrieval/refreshes` (swaps so far; in lockstep, those the schedule has made
    by this step, counting those before a resume).
    """
    with self._lock:
      if self._index is None:
        raise RuntimeError("IndexWatcher.metrics() before start()")
      index = self._index
      refreshes = self._refreshes
    return {
        "retrieval/index_step": index.step,
        "retrieval/staleness_steps": int(train_step) - index.step,
        "retrieval/staleness_seconds": float(self._clock() - index.published_unix),
        "retrieval/refreshes": refreshes,
    }

  # -- state

  @property
  def current(self) -> T:
    """`load_fn` of the index in use."""
    with self._lock:
      if self._index is None:
        raise RuntimeError("IndexWatcher.current before start()")
      return self._value

  @property
  def current_index(self) -> store.LoadedIndex:
    """The LoadedIndex in use."""
    with self._lock:
      if self._index is None:
        raise RuntimeError("IndexWatcher.current_index before start()")
      return self._index

  @property
  def index_step(self) -> int:
    """Checkpoint step of the index in use (record it with each batch, REALM_SPEC 21)."""
    return self.current_index.step

  @property
  def refreshes(self) -> int:
    with self._lock:
      return self._refreshes

  @property
  def failed_steps(self) -> frozenset[int]:
    """Published steps that failed to load and will not be tried again."""
    with self._lock:
      return frozenset(self._failed_steps)

  def wait(self, timeout: Optional[float] = None) -> bool:
    """Waits for a running background check/load (for tests, or before a final evaluation).

    Returns:
      True if no background work is running afterwards.
    """
    with self._lock:
      thread = self._thread
    if thread is not None:
      thread.join(timeout)
      return not thread.is_alive()
    return True

  def close(self) -> None:
    """Stops refreshing: waits for a running background load and drops its result."""
    with self._lock:
      self._closed = True
      thread = self._thread
    if thread is not None:
      thread.join()
    with self._lock:
      self._pending = None

  def __enter__(self) -> "IndexWatcher[T]":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
