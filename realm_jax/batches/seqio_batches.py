"""Batches of seqio tasks as resumable host NumPy batches, and length buckets.

Every iterator here and built on them (`PretrainingBatches`, `OpenQABatches`) yields host
batches (dicts of NumPy arrays, leading dimension this host's `batch_size`) and implements
`state()` / `restore(state)`, so a resumed run sees exactly the batches of an uninterrupted one.
`SeqioBatches` reads any registered task per host shard and shuffles each epoch itself;
`ict_batches` gives the `IctModel` keys; `LengthBucketed` cuts one kind of row to a length
bucket. Registering tasks is the caller's part (`import realm_jax_tasks`); `get_task` only
looks names up. Sharding, shuffling and resuming: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Iterator, Mapping, Optional, Sequence

import jax
import numpy as np

from realm_jax.data import tensorflow_setup
from realm_jax.index import builder as builder_lib

log = logging.getLogger(__name__)

# The keys of an IctModel batch (realm_jax.models.realm.IctModel).
ICT_BATCH_KEYS = ("query_ids", "query_mask", "block_ids", "block_type_ids", "block_mask")
# The keys of a BertMlmModel batch (the `mlm_<corpus>` tasks).
BLOCK_MLM_KEYS = ("input_ids", "type_ids", "input_mask", "mlm_positions", "mlm_targets",
                  "mlm_weights")
DEFAULT_SHUFFLE_BUFFER_SIZE = 10_000
# Keys of `SeqioBatches.state()` that must match on `restore` (a different value means a
# different data stream, so the position would be meaningless).
_MUST_MATCH = ("task", "split", "seed", "shuffle", "batch_size", "num_shards")


class UnknownTaskError(ValueError):
  """A seqio task or mixture name that is not registered (one line, with close names)."""


def get_task(task_name: str):
  """`seqio.get_mixture_or_task(task_name)` of a registered task: registering is the caller's
  part (`import realm_jax_tasks`, or the module that registers the task); this only reads
  seqio's registries.

  Raises:
    UnknownTaskError: the name is not registered; the message lists close names and says what
      registers them.
  """
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow: only for input pipelines)
  names = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))
  if task_name not in names:
    close = difflib.get_close_matches(task_name, names, n=5, cutoff=0.5)
    hint = (f"did you mean {', '.join(close)}?" if close else
            f"registered: {', '.join(names)}" if names else "no task is registered")
    raise UnknownTaskError(
        f"unknown seqio task or mixture {task_name!r}; {hint} (`import realm_jax_tasks` "
        f"registers realm_<corpus>_<strategy>, ict_<corpus> and the QA tasks, or import the "
        f"module that registers yours; other corpora need "
        f"realm_jax_tasks.register_pretraining_tasks)")
  return seqio.get_mixture_or_task(task_name)


def check_same_stream(state: Mapping[str, Any], mine: Mapping[str, Any],
                      must_match: Sequence[str]) -> None:
  """Raises ValueError unless a saved data position `state` belongs to this iterator's stream:
  it has the required keys, and every `must_match` key it has equals this iterator's value."""
  for key in ("task", "seed", "batches_consumed"):
    if key not in state:
      raise ValueError(f"data state {dict(state)} lacks {key!r}")
  differ = [f"{k} {state[k]!r} (this run: {mine[k]!r})" for k in must_match
            if k in state and state[k] != mine[k]]
  if differ:
    raise ValueError(f"cannot resume the data position of another input stream: "
                     f"{'; '.join(differ)}")


def epoch_seed(seed: int, epoch: int) -> int:
  """The shuffle seed of one epoch: a hash of (seed, epoch), in [0, 2**31)."""
  state = np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1, np.uint32)
  return int(state[0] & 0x7FFFFFFF)


def _default_process_index() -> int:
  return jax.process_index()


def _default_process_count() -> int:
  return jax.process_count()


class SeqioBatches:
  """Batches of a seqio task on this host, resumable (see the module docstring).

  An iterator of dicts of NumPy arrays, each [batch_size, ...] (the last batch of an epoch may
  be smaller with `drop_remainder=False`). Iterating is single-threaded: call `next` from one
  thread.
  """

  def __init__(self, task_name: str, *, split: str = "train", batch_size: int, seed: int = 0,
               shuffle: bool = True, num_epochs: Optional[int] = None,
               shard_index: Optional[int] = None, num_shards: Optional[int] = None,
               drop_remainder: bool = True, feature_keys: Optional[Sequence[str]] = None,
               shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER_SIZE,
               sequence_length: Optional[Mapping[str, int]] = None):
    """Creates the iterator; nothing is read until the first batch.

    Args:
      task_name: a registered seqio task or mixture (see `get_task`).
      batch_size: examples per batch on this host (the global batch is num_shards times this).
      seed: the data seed; epoch e is shuffled (and preprocessed) with `epoch_seed(seed, e)`.
      shuffle: shuffle each epoch (False: the task's order, e.g. for evaluation).
      num_epochs: epochs to read; None repeats forever (training).
      shard_index, num_shards: this host's shard; default the process index and count.
      drop_remainder: drop each epoch's last partial batch (one shape, one compiled step).
      feature_keys: keep only these features (all of the task's when None).
      sequence_length: passed to seqio (None: the tasks' own fixed lengths).
    """
    self._task = get_task(task_name)
    self.task_name = task_name
    if isinstance(batch_size, bool) or int(batch_size) < 1:
      raise ValueError(f"batch_size must be a positive integer (per host), got {batch_size!r}")
    if num_epochs is not None and int(num_epochs) < 1:
      raise ValueError(f"num_epochs must be None (repeat) or >= 1, got {num_epochs}")
    self.split = split
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self.shuffle = bool(shuffle)
    self.num_epochs = None if num_epochs is None else int(num_epochs)
    self.shard_index = int(_default_process_index() if shard_index is None else shard_index)
    self.num_shards = int(_default_process_count() if num_shards is None else num_shards)
    if not 0 <= self.shard_index < self.num_shards:
      raise ValueError(f"shard_index={self.shard_index} must be in [0, num_shards="
                       f"{self.num_shards})")
    self.drop_remainder = bool(drop_remainder)
    self.feature_keys = None if feature_keys is None else tuple(feature_keys)
    if shuffle_buffer_size < 1:
      raise ValueError(f"shuffle_buffer_size must be >= 1, got {shuffle_buffer_size}")
    self.shuffle_buffer_size = int(shuffle_buffer_size)
    self.sequence_length = sequence_length
    # The data position: epochs started, batches taken from the current one, batches in all.
    self._epoch = 0
    self._batches_in_epoch = 0
    self._batches_consumed = 0
    self._iterator: Optional[Iterator[dict]] = None

  def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
    """{feature: shape and dtype of one example}, from the task's dataset spec (built, not
    read): the schema is the task's output features."""
    ds = self._task.get_dataset(sequence_length=self.sequence_length, split=self.split,
                                shuffle=False)
    keys = self.feature_keys if self.feature_keys is not None else tuple(ds.element_spec)
    missing = [k for k in keys if k not in ds.element_spec]
    if missing:
      raise KeyError(f"task {self.task_name!r} has no features {missing} (has "
                     f"{sorted(ds.element_spec)})")
    return {k: jax.ShapeDtypeStruct(tuple(ds.element_spec[k].shape),
                                    ds.element_spec[k].dtype.as_numpy_dtype) for k in keys}

  # -- the stream

  def _epoch_dataset(self, epoch: int):
    """The batched tf.data.Dataset of one epoch of this host's shard."""
    import seqio  # pylint: disable=g-import-not-at-top
    seed = epoch_seed(self.seed, epoch)
    # shuffle=False: seqio would shuffle after repeating (no epoch boundaries); the seed still
    # reaches any stochastic seqio preprocessor, per epoch.
    ds = self._task.get_dataset(
        sequence_length=self.sequence_length, split=self.split, shuffle=False, seed=seed,
        shard_info=seqio.ShardInfo(self.shard_index, self.num_shards), num_epochs=1)
    if self.feature_keys is not None:
      missing = [k for k in self.feature_keys if k not in ds.element_spec]
      if missing:
        raise KeyError(f"task {self.task_name!r} has no features {missing} (has "
                       f"{sorted(ds.element_spec)})")
      keys = self.feature_keys
      ds = ds.map(lambda ex: {k: ex[k] for k in keys})
    if self.shuffle:
      # reshuffle_each_iteration=False: re-creating this epoch on restore gives the same order.
      ds = ds.shuffle(self.shuffle_buffer_size, seed=seed, reshuffle_each_iteration=False)
    return ds.batch(self.batch_size, drop_remainder=self.drop_remainder)

  def _open_epoch(self) -> Iterator[dict]:
    ds = self._epoch_dataset(self._epoch)
    if self._batches_in_epoch:
      ds = ds.skip(self._batches_in_epoch)  # a restore into the middle of this epoch
    return tensorflow_setup.numpy_iterator(ds.prefetch(2))

  def __iter__(self) -> "SeqioBatches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    while True:
      if self.num_epochs is not None and self._epoch >= self.num_epochs:
        raise StopIteration
      if self._iterator is None:
        self._iterator = self._open_epoch()
      try:
        batch = next(self._iterator)
      except StopIteration:
        self._iterator = None
        if self._batches_in_epoch == 0:
          # Else a repeating stream would loop forever over empty epochs.
          raise ValueError(
              f"task {self.task_name!r} split {self.split!r} gave no batch of {self.batch_size} "
              f"in epoch {self._epoch} on shard {self.shard_index}/{self.num_shards}: the shard "
              f"has fewer examples than the per-host batch size") from None
        self._epoch += 1
        self._batches_in_epoch = 0
        continue
      self._batches_in_epoch += 1
      self._batches_consumed += 1
      return batch

  # -- the resume protocol

  @property
  def batches_consumed(self) -> int:
    return self._batches_consumed

  @property
  def epoch(self) -> int:
    """The epoch the next batch comes from (or the one just finished)."""
    return self._epoch

  def state(self) -> dict[str, Any]:
    """The data position, JSON-able: save it with the checkpoint.

    Returns:
      {"task", "split", "seed", "shuffle", "batch_size", "shard_index", "num_shards",
      "batches_consumed", "epoch", "batches_in_epoch"}.
    """
    return {"task": self.task_name, "split": self.split, "seed": self.seed,
            "shuffle": self.shuffle, "batch_size": self.batch_size,
            "shard_index": self.shard_index, "num_shards": self.num_shards,
            "batches_consumed": self._batches_consumed, "epoch": self._epoch,
            "batches_in_epoch": self._batches_in_epoch}

  def restore(self, state: Mapping[str, Any]) -> None:
    """Continues from a `state()`: the next batch is the one that followed it.

    Only "task", "seed" and "batches_consumed" are required. With this shard's "epoch" and
    "batches_in_epoch" it jumps to that epoch; otherwise (e.g. another host's state: hosts step in
    lockstep) it counts one epoch's batches and divides. Either way the work is an epoch or two.
    Raises ValueError for another stream's state or one past the end.
    """
    check_same_stream(state, self.state(), _MUST_MATCH)
    consumed = int(state["batches_consumed"])
    if consumed < 0:
      raise ValueError(f"batches_consumed must be >= 0, got {consumed}")
    same_shard = state.get("shard_index", self.shard_index) == self.shard_index
    if same_shard and "epoch" in state and "batches_in_epoch" in state:
      epoch, in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
    else:
      epoch, in_epoch = self._locate(consumed)
    # A finished stream stands at (num_epochs, 0); anything later is not a position of it.
    if self.num_epochs is not None and (epoch > self.num_epochs
                                        or (epoch == self.num_epochs and in_epoch > 0)):
      raise ValueError(f"data state epoch {epoch} is past num_epochs={self.num_epochs}")
    self._epoch, self._batches_in_epoch, self._batches_consumed = epoch, in_epoch, consumed
    self._iterator = None
    log.info("%s: resuming at batch %d (epoch %d, batch %d of it).", self.task_name, consumed,
             epoch, in_epoch)

  def _locate(self, consumed: int) -> tuple[int, int]:
    """(epoch, batches into it) after `consumed` batches, as `state()` would report them.

    Counts the batches of epoch 0 of this shard once (tf.data only, no NumPy copies): every
    epoch has that many, because an epoch is the shard's examples in a new order.
    """
    if consumed == 0:
      return 0, 0
    per_epoch = sum(1 for _ in self._epoch_dataset(0))
    if per_epoch == 0:
      raise ValueError(f"task {self.task_name!r} gave no batch of {self.batch_size} on shard "
                       f"{self.shard_index}/{self.num_shards}")
    # After the last batch of an epoch the position is (that epoch, per_epoch), as in __next__.
    epoch = (consumed - 1) // per_epoch
    in_epoch = consumed - epoch * per_epoch
    if self.num_epochs is not None and epoch >= self.num_epochs:
      raise ValueError(f"batches_consumed={consumed} is past the end of {self.num_epochs} "
                       f"epoch(s) of {per_epoch} batches of {self.task_name!r}")
    return epoch, in_epoch


def ict_batches(corpus: str = "toy", **kwargs) -> SeqioBatches:
  """ICT warm-start batches: `ict_<corpus>` (a `SeqioBatches` taking its arguments) with exactly
  the IctModel batch keys: query_ids, query_mask [B, 64] and block_ids, block_type_ids,
  block_mask [B, 288] (int32).
  """
  kwargs.setdefault("feature_keys", ICT_BATCH_KEYS)
  return SeqioBatches(f"ict_{corpus}", **kwargs)


# ------------------------------------------------------------------------------ length buckets


def check_row_bucket(length_bucket: Any, process_count: Optional[int] = None) -> int:
  """`length_bucket` if a `LengthBucketed` iterator can use it in this run, else ValueError.

  An int >= 0 (0: no cutting, the batches' full width); and 0 with several hosts: each host
  would cut its own batch to its own width, and the global batch is one array of one shape.
  `process_count`: the run's hosts (default `jax.process_count()`).
  """
  if (isinstance(length_bucket, bool) or not isinstance(length_bucket, (int, np.integer))
      or length_bucket < 0):
    raise ValueError(f"length_bucket must be an int >= 0 (wordpieces; 0: the batches' full "
                     f"width), got {length_bucket!r}")
  length_bucket = int(length_bucket)
  hosts = _default_process_count() if process_count is None else int(process_count)
  if length_bucket and hosts > 1:
    raise ValueError(f"length_bucket={length_bucket} cuts each host's batch to that batch's own "
                     f"width, and the {hosts} hosts' batches must have one shape; use 0 with "
                     f"several hosts")
  return length_bucket


def cut_rows(batch: Mapping[str, Any], keys: Sequence[str], width: int) -> dict[str, Any]:
  """`batch` with the last axis of each array of `keys` that it has cut to its first `width`
  positions (the others as they are)."""
  return {key: value[..., :width] if key in keys else value for key, value in batch.items()}


def cut_to_bucket(batch: Mapping[str, Any], keys: Sequence[str], mask_key: str,
                  length_bucket: int) -> tuple[dict[str, Any], int]:
  """(`batch` with `keys` cut to `index.builder.bucket_width` of its `mask_key` rows, that
  width): the smallest multiple of `length_bucket` holding the longest row (0: no cut)."""
  width = builder_lib.bucket_width(np.asarray(batch[mask_key]), length_bucket)
  return cut_rows(batch, keys, width), width


def spec_at_width(spec: Mapping[str, Any], keys: Sequence[str], width: int
                  ) -> dict[str, jax.ShapeDtypeStruct]:
  """The schema of `cut_rows(batch, keys, width)` for batches of schema `spec`: the last axis
  of `keys` at `width`."""
  return {key: (jax.ShapeDtypeStruct((*value.shape[:-1], int(width)), value.dtype)
                if key in keys else value) for key, value in spec.items()}


class LengthBucketed:
  """Batches of another iterator with one kind of row cut to a length bucket.

  The arrays `keys` (rows padded at the end, `mask_key` nonzero on real tokens) are cut to
  `index.builder.bucket_width(mask, length_bucket)`: a row's padding costs the encoder as much as
  its tokens. Only all-padding positions go, so the model's values on real tokens are unchanged.
  Each distinct width is one compilation: new widths are logged and counted in `metrics()`.
  Everything else (`state`, `restore`, `element_spec`: the full width) is the wrapped iterator's.
  """

  def __init__(self, batches: Any, *, keys: Sequence[str], mask_key: str, length_bucket: int,
               name: str):
    """Wraps `batches`.

    Args:
      batches: an iterator of host batches (dicts of NumPy arrays).
      keys: the arrays cut together (those a batch has); their last axis is the row length.
      mask_key: the array (among `keys`, or not) whose nonzero entries mark the real tokens.
      length_bucket: the bucket, in wordpieces (see `check_row_bucket`; 0: no cutting).
      name: what the rows are, for the log and the metrics ("reader").
    """
    self.batches = batches
    self.keys = tuple(keys)
    self.mask_key = mask_key
    self.length_bucket = check_row_bucket(length_bucket)
    self.name = name
    self.widths: set[int] = set()  # every width a batch was cut to, in this process
    self._batches_cut = 0
    self._width_sum = 0

  def __iter__(self) -> "LengthBucketed":
    return self

  def __next__(self) -> dict[str, Any]:
    batch, width = cut_to_bucket(next(self.batches), self.keys, self.mask_key,
                                 self.length_bucket)
    if width not in self.widths:
      self.widths.add(width)
      log.info("%s rows: a batch of width %d of %d (widths so far: %s; each is one compilation "
               "of the step)", self.name, width, np.shape(batch[self.mask_key])[-1],
               sorted(self.widths))
    self._batches_cut += 1
    self._width_sum += width
    return batch

  def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
    """The wrapped iterator's schema: the full width, the widest batch this yields."""
    return self.batches.element_spec()

  def metrics(self) -> dict[str, float]:
    """The wrapped iterator's metrics (if any), the number of distinct widths so far and the
    mean width so far."""
    out = dict(self.batches.metrics()) if hasattr(self.batches, "metrics") else {}
    out[f"input/{self.name}_widths"] = float(len(self.widths))
    if self._batches_cut:
      out[f"input/{self.name}_width"] = self._width_sum / self._batches_cut
    return out

  def state(self) -> dict[str, Any]:
    return self.batches.state()

  def restore(self, state: Mapping[str, Any]) -> None:
    self.batches.restore(state)

  def __getattr__(self, attribute: str) -> Any:
    # Only reached for attributes this class does not define: the wrapped iterator's
    # (`set_retriever`, `set_query_params`, `skip_counts`, ...).
    if attribute == "batches":  # not set yet (e.g. while unpickling): no recursion
      raise AttributeError(attribute)
    return getattr(self.batches, attribute)
