"""Batch iterators the trainer consumes: seqio tasks as host NumPy batches that can resume.

Every iterator here yields **host batches**: dicts of NumPy arrays whose leading dimension is
this host's share of the global batch (`batch_size` is per host), and implements the resume
protocol

    state() -> JSON-able dict        saved with each checkpoint
    restore(state)                   a resumed run continues from the same data position

so that a resumed run sees exactly the batches the uninterrupted run would have seen.

Three iterators:

* `SeqioBatches(task_name, ...)`: any registered seqio task or mixture (`realm_<corpus>_<strategy>`,
  `ict_<corpus>`, the QA tasks), batched, per-host sharded.
* `ict_batches(corpus)`: `SeqioBatches` over `ict_<corpus>` giving exactly the `IctModel` keys.
* `PretrainingBatches(masked, store, retriever)`: REALM pretraining. For every batch of masked
  queries it embeds the queries with the **current index's** query tower, searches the index for
  the top `num_candidates` (+ a margin) blocks, and turns them into the `RealmPretrainModel`
  batch with `candidates.build_pretraining_batch` (null document at slot 0, the index step that
  chose the candidates recorded, skipped examples kept with zero weights).

And a wrapper, `LengthBucketed(batches, keys=..., mask_key=..., length_bucket=32)`: each batch
of another iterator with one kind of row (a pretraining or fine-tuning batch's reader rows) cut
from its full width to the smallest multiple of `length_bucket` that holds the batch's longest
row. Only padding goes, so the model's values on the real tokens are unchanged; each distinct
width is one compilation of the step. Single-host only (`check_row_bucket`).

Per-host input sharding (multi-host). Each process reads only its shard of the examples
(`seqio.ShardInfo(jax.process_index(), jax.process_count())` by default, i.e. every
`num_shards`-th example) and yields `batch_size` examples per step. The trainer assembles the
global batch, whose leading dimension is `num_shards * batch_size`, from the hosts' batches with
`jax.make_array_from_process_local_data(batch_sharding, host_array)`; nothing here talks to
other processes. (The 0-d `index_step` of a pretraining batch is host metadata: the trainer
reads it on the host; the per-example `example_index_step` [B] is the array form.) Shards differ
in size by at most one example, so two hosts may count a different number of batches per epoch;
training repeats forever (`num_epochs=None`) so that no host runs out while others still step.
A finite `num_epochs` over several hosts (evaluation) must agree on a step count some other way.

Shuffling and resuming (why `SeqioBatches` shuffles itself). seqio's `Task.get_dataset` with a
fixed seed is deterministic here (checked: same seed, same batches), but it repeats *before* it
shuffles, so its stream has no epoch boundaries: resuming after n batches would mean replaying
all n batches from the start through the tasks' Python example generators (hours, late in a
pretraining run). So `SeqioBatches` asks seqio for one unshuffled epoch of its shard
(`shuffle=False, num_epochs=1`), shuffles that with tf.data
(`shuffle(buffer, seed=epoch_seed, reshuffle_each_iteration=False)`) where `epoch_seed` is
derived from (seed, epoch), batches it, and goes on to the next epoch. A data position is then
(epoch, batches into that epoch): `restore` rebuilds that epoch's dataset and skips the batches
already consumed, replaying at most one epoch. Batches never straddle epochs; with
`drop_remainder=True` the last `examples_in_shard % batch_size` examples of each epoch are
dropped (a different set every epoch, since each epoch is shuffled differently). The shuffle
buffer (default 10,000 examples) is a window over the task's example order, as seqio's is;
note that the REALM tasks' masks are fixed per record (the task's masking seed), so every epoch
sees the same masked queries in a new order.

Retrieval in pretraining (REALM_SPEC 21: an index is one snapshot). The document matrix of an
index and the query embedder that searches it come from the same checkpoint, so retrieval must
not use the live trainer parameters. `IndexRetriever` holds (index step, that checkpoint's query
tower, a searcher over the index's embeddings); `make_index_loader` is the `load_fn` that gives
`IndexWatcher` one IndexRetriever per published index, and the watcher swaps them at step
boundaries:

    watcher = IndexWatcher(run_dir, load_fn=make_index_loader(run_dir, config),
                           block_store_id=store.store_id, dim=config.proj_size)
    watcher.start()
    batches = PretrainingBatches(masked_query_batches("toy", batch_size=...), store,
                                 retriever=watcher)  # reads watcher.current per batch
    for step in range(start_step, num_steps):
      watcher.maybe_swap(step)          # the step boundary: maybe a newer snapshot
      batch = next(batches)             # retrieved with watcher.current; records its step
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence, Union

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from realm_jax.data import corpus as corpus_lib
from realm_jax.data.masking import SkipCounter
from realm_jax.data import tensorflow_setup
from realm_jax.batches import candidates as candidates_lib
from realm_jax.index import builder as builder_lib
from realm_jax.index import search as search_lib
from realm_jax.index import store as store_lib
from realm_jax.models.config import RealmConfig
from realm_jax.models.retriever import RealmRetriever
from realm_jax.models import realm as realm_lib
from realm_jax.models import retriever as retriever_lib
from realm_jax import checkpoints as ckpt_lib

log = logging.getLogger(__name__)

# The keys of an IctModel batch (realm_jax.models.realm.IctModel).
ICT_BATCH_KEYS = ("query_ids", "query_mask", "block_ids", "block_type_ids", "block_mask")
# The keys of a masked-query batch that `build_pretraining_batch` reads.
MASKED_QUERY_KEYS = candidates_lib.MASKED_BATCH_KEYS
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
  """`seqio.get_mixture_or_task(task_name)` after registering realm_jax's tasks.

  Raises:
    UnknownTaskError: the name is not registered; the message lists close names.
  """
  import seqio  # pylint: disable=g-import-not-at-top  (TensorFlow: only for input pipelines)
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top,unused-import  (registers tasks)
  del realm_jax_tasks
  names = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))
  if task_name not in names:
    close = difflib.get_close_matches(task_name, names, n=5, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"registered: {', '.join(names)}"
    raise UnknownTaskError(
        f"unknown seqio task or mixture {task_name!r}; {hint} (realm_jax_tasks registers "
        f"realm_<corpus>_<strategy> and ict_<corpus>; other corpora need "
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
      task_name: a registered seqio task or mixture (`import realm_jax_tasks` is done here).
      split: the split to read.
      batch_size: examples per batch on this host (the global batch is num_shards times this).
      seed: the data seed; epoch e is shuffled with `epoch_seed(seed, e)` (and seqio's
        preprocessors get that seed too).
      shuffle: shuffle each epoch (False: the task's order, e.g. for evaluation).
      num_epochs: epochs to read; None repeats forever (training).
      shard_index: this host's shard; default `jax.process_index()`.
      num_shards: number of shards; default `jax.process_count()`.
      drop_remainder: drop each epoch's last partial batch, so every batch has the same shape
        (one compiled train step).
      feature_keys: keep only these features (all of the task's when None).
      shuffle_buffer_size: tf.data shuffle buffer, in examples.
      sequence_length: passed to seqio (None: the tasks' own fixed lengths).

    Raises:
      UnknownTaskError: `task_name` is not registered.
      ValueError: a bad batch size, shard or epoch count.
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
    # shuffle=False: seqio would shuffle after repeating (no epoch boundaries, see the module
    # docstring); the seed still reaches any stochastic seqio preprocessor, per epoch.
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

    Only "task", "seed" and "batches_consumed" are required. With "epoch" and
    "batches_in_epoch" of this shard (as `state()` writes them) the restore jumps to that epoch;
    otherwise (or when the state is another host's: hosts step in lockstep, so every host has
    consumed the same number of batches and a trainer may save host 0's state only) it counts
    the batches of one epoch of this shard and divides, since every epoch of a shard holds the
    same examples, reordered. Either way the work is bounded by an epoch or two of the
    example generator (counting one, skipping into the current one), not by the run's length.

    Raises:
      ValueError: the state belongs to another stream (task, split, seed, shuffle, batch size or
        sharding differ: the position would not mean the same data), or lies past the end.
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
  """ICT warm-start batches: `ict_<corpus>` with exactly the IctModel batch keys.

  Args:
    corpus: the corpus name of the task (`ict_toy`, or one registered with
      `realm_jax_tasks.register_pretraining_tasks`).
    **kwargs: `SeqioBatches` arguments (batch_size is required).

  Returns:
    A SeqioBatches yielding query_ids, query_mask [B, 64] and block_ids, block_type_ids,
    block_mask [B, 288] (int32).
  """
  kwargs.setdefault("feature_keys", ICT_BATCH_KEYS)
  return SeqioBatches(f"ict_{corpus}", **kwargs)


def masked_query_batches(corpus: str = "toy", strategy: str = "salient_span",
                         **kwargs) -> SeqioBatches:
  """Masked-query batches of `realm_<corpus>_<strategy>`, the input of `PretrainingBatches`.

  Args:
    corpus: corpus name of the task.
    strategy: masking strategy ("salient_span", "random_span", "random_token").
    **kwargs: `SeqioBatches` arguments (batch_size is required).

  Returns:
    A SeqioBatches yielding query_ids, query_mask [B, 96], mlm_positions, mlm_targets,
    mlm_weights [B, 10], source_uid int64 [B] (the uint64 uid's bits).
  """
  kwargs.setdefault("feature_keys", MASKED_QUERY_KEYS)
  return SeqioBatches(f"realm_{corpus}_{strategy}", **kwargs)


# ------------------------------------------------------------------------------ retrieval


class Retriever(Protocol):
  """What `PretrainingBatches` retrieves with: one index snapshot and its query tower.

  Attributes:
    step: the checkpoint step of the index (recorded in every batch it chose candidates for).
  """

  step: int

  def retrieve(self, query_ids: np.ndarray, query_mask: np.ndarray, *,
               k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32 [B, k], block ids int32 [B, k]), best first, for [B, query_len] queries."""


class FunctionRetriever:
  """A `Retriever` from a plain function (tests, or a custom search)."""

  def __init__(self, step: int, fn: Callable[..., tuple[np.ndarray, np.ndarray]], *,
               block_store_id: Optional[str] = None):
    """Args: step: the index step; fn: `fn(query_ids, query_mask, k) -> (scores, ids)`;
    block_store_id: the BlockStore the ids index (checked by PretrainingBatches if given)."""
    self.step = int(step)
    self.block_store_id = block_store_id
    self._fn = fn

  def retrieve(self, query_ids, query_mask, *, k: int = candidates_lib.DEFAULT_NUM_CANDIDATES):
    return self._fn(query_ids, query_mask, k)


def query_tower_params(params: Mapping[str, Any], config: RealmConfig) -> dict:
  """The retriever params `embed_queries` needs: the query tower only.

  Args:
    params: RealmRetriever params ({"embedder"} tied or {"query_embedder",
      "document_embedder"} untied), optionally wrapped as {"params": ...} and/or
      {"retriever": ...} (a checkpoint's parameter dict).
    config: the model config.

  Returns:
    {"embedder": ...} (tied) or {"query_embedder": ...} (untied): a RealmRetriever param tree
    that `RealmRetriever.embed_queries` can apply. The untied document tower is left out, so an
    index holds one tower on the devices, not two.
  """
  name, tower = retriever_lib.tower_params(params, config, "query")
  return {name: tower}


def local_query_mesh() -> Mesh:
  """A 1-D mesh named "docs" over this host's devices: where an index lives by default.

  Process-local on purpose: each host holds the whole index (sharded over its own devices) and
  searches its own queries, so the input pipeline never needs another host.
  """
  return Mesh(np.asarray(jax.local_devices()), ("docs",))


@functools.lru_cache(maxsize=8)
def _embed_queries_fn(config: RealmConfig, mesh: Mesh, axis: str) -> Callable:
  """The jitted query tower for one (config, mesh); cached so every new index reuses one
  compilation (the params are arguments, not constants)."""
  module = RealmRetriever(config)
  batch_sharding = NamedSharding(mesh, P(axis, None))

  def embed(tower_params, query_ids, query_mask):
    # [B, query_len] -> [B, proj] float32, eval mode: the index was built without dropout too.
    emb = module.apply({"params": tower_params}, query_ids, jnp.zeros_like(query_ids),
                       query_mask, deterministic=True, method=RealmRetriever.embed_queries)
    return emb.astype(jnp.float32)

  return jax.jit(embed, in_shardings=(NamedSharding(mesh, P()), batch_sharding, batch_sharding),
                 out_shardings=NamedSharding(mesh, P()))


class IndexRetriever:
  """One index snapshot: its step, its checkpoint's query tower and a searcher (REALM_SPEC 21).

  Queries are embedded with the jitted `RealmRetriever.embed_queries` of the params the index's
  documents were embedded with (never the live trainer params), batch-sharded over the mesh,
  then searched for the top k by inner product.

  Attributes:
    step: checkpoint step of the index.
    index: the LoadedIndex.
    block_store_id: the BlockStore the index embeds.
    searcher: the search backend (`ExactSearcher` by default).
    mesh: the devices the query tower (and the exact searcher) run on.
  """

  def __init__(self, loaded_index: store_lib.LoadedIndex, query_params: Mapping[str, Any],
               config: RealmConfig, *, mesh: Optional[Mesh] = None, backend: str = "exact",
               searcher: Any = None, **searcher_kwargs):
    """Places the query tower and the index on the devices.

    Args:
      loaded_index: the published index (`store.load_index`).
      query_params: the retriever params of the checkpoint the index was built from (any
        layout `query_tower_params` accepts).
      config: the model config.
      mesh: a 1-D mesh for the query tower and the exact searcher; default: this host's devices
        (`local_query_mesh`).
      backend: "exact" or "scann" (`search.make_searcher`; ScaNN loads the index's artifacts
        when it has them).
      searcher: use this searcher instead of building one.
      **searcher_kwargs: passed to the searcher (e.g. query_batch_size, precision).

    Raises:
      ValueError: the index's dimension is not the config's proj_size.
    """
    if loaded_index.dim != config.proj_size:
      raise ValueError(f"{loaded_index.path}: index embeddings have dim {loaded_index.dim} but "
                       f"the model projects to proj_size={config.proj_size}")
    self.index = loaded_index
    self.step = int(loaded_index.step)
    self.block_store_id = loaded_index.block_store_id
    self.config = config
    self.mesh = mesh if mesh is not None else local_query_mesh()
    if len(self.mesh.axis_names) != 1:
      raise ValueError(f"IndexRetriever needs a 1-D mesh, got axes {self.mesh.axis_names}")
    self._axis = self.mesh.axis_names[0]
    self.set_query_params(query_params)
    if searcher is None:
      if backend == "exact":
        searcher_kwargs = {"mesh": self.mesh, "docs_axis": self._axis, **searcher_kwargs}
      searcher = search_lib.make_searcher(
          backend, loaded_index.embeddings,
          artifacts_dir=loaded_index.scann_dir if backend == "scann" else None,
          **searcher_kwargs)
    self.searcher = searcher
    self._embed = _embed_queries_fn(config, self.mesh, self._axis)

  @property
  def block_emb(self) -> Any:
    """The index embeddings [num_blocks(+padding), proj]: the searcher's device copy when it
    has one (exact search), else the loaded matrix."""
    emb = getattr(self.searcher, "embeddings", None)
    return self.index.embeddings if emb is None else emb

  def set_query_params(self, query_params: Mapping[str, Any],
                       config: Optional[RealmConfig] = None) -> None:
    """Searches with another query tower from now on (open-QA fine-tuning retrieves with the
    live question tower; any layout `query_tower_params` accepts), of `config` when given (a
    PEFT run's tower has adapters the index's own has not)."""
    if config is not None and config != self.config:
      self.config = config
      self._embed = _embed_queries_fn(config, self.mesh, self._axis)
    tower = query_tower_params(query_params, self.config)
    self._params = jax.device_put(tower, NamedSharding(self.mesh, P()))

  def embed_queries(self, query_ids, query_mask) -> np.ndarray:
    """Query embeddings of this snapshot's query tower.

    Args:
      query_ids, query_mask: int [B, query_len] `[CLS] q [SEP]` and its mask.

    Returns:
      float32 [B, proj].
    """
    query_ids = np.asarray(query_ids, np.int32)  # [B, query_len]
    query_mask = np.asarray(query_mask, np.int32)  # [B, query_len]
    batch_size = query_ids.shape[0]
    if batch_size == 0:
      return np.zeros([0, self.config.proj_size], np.float32)
    # Pad to a multiple of the devices so the batch shards evenly; the padding repeats the first
    # query (a well-formed input) and its rows are dropped.
    num_devices = self.mesh.devices.size
    pad = -batch_size % num_devices
    if pad:
      query_ids = np.concatenate([query_ids, np.repeat(query_ids[:1], pad, axis=0)])
      query_mask = np.concatenate([query_mask, np.repeat(query_mask[:1], pad, axis=0)])
    emb = self._embed(self._params, query_ids, query_mask)  # [B + pad, proj]
    return np.asarray(emb)[:batch_size]

  def retrieve(self, query_ids, query_mask, *,
               k: int = candidates_lib.DEFAULT_NUM_CANDIDATES) -> tuple[np.ndarray, np.ndarray]:
    """Top-k blocks of the index for each query.

    Returns:
      (scores float32 [B, k], ids int32 [B, k]), best first (ties: lower id first with exact
      search).
    """
    return self.searcher.search(self.embed_queries(query_ids, query_mask), k)


def index_checkpoint_dir(run_dir: str, loaded_index: store_lib.LoadedIndex, *,
                         first_checkpoint_dir: Optional[str] = None) -> str:
  """The checkpoint step directory whose parameters built an index.

  Looked up in this order:
    1. the manifest's "checkpoint" field, when it names an existing directory: the builder
       records the absolute step directory it embedded (`<run_dir>/checkpoints/<step>` for a
       refresh, the ICT run's `checkpoints/<step>` for the first index, REALM_SPEC 22);
    2. `first_checkpoint_dir`, for the first index (step 0) only, e.g. when the run
       directories were moved since the index was built;
    3. `<run_dir>/checkpoints/<index step>`, the trainer's own checkpoint of that step.

  Raises:
    CheckpointError: none of them exists.
  """
  recorded = str(loaded_index.manifest.get("checkpoint") or "")
  tried = []
  if recorded:
    if os.path.isdir(recorded):
      return recorded
    tried.append(f"the manifest's checkpoint {recorded}")
  if first_checkpoint_dir is not None and loaded_index.step == store_lib.FIRST_INDEX_STEP:
    if os.path.isdir(first_checkpoint_dir):
      return os.path.abspath(first_checkpoint_dir)
    tried.append(f"first_checkpoint_dir {first_checkpoint_dir}")
  own = ckpt_lib.checkpoint_path(run_dir, loaded_index.step)
  if os.path.isdir(own):
    return own
  tried.append(own)
  raise ckpt_lib.CheckpointError(
      f"{loaded_index.path}: cannot find the checkpoint the index was built from (tried "
      f"{'; '.join(tried)}); its query tower is needed to search it (REALM_SPEC 21)")


def index_query_tower(loaded_index: store_lib.LoadedIndex, config: RealmConfig
                      ) -> Optional[dict]:
  """The query tower the index was published with (`store.QUERY_TOWER`, written by the
  builder), as `query_tower_params` returns it; None for an index without one (published
  before indexes carried it).

  Raises:
    CheckpointError: unreadable, or not of this model's shapes.
  """
  if store_lib.QUERY_TOWER not in (loaded_index.manifest.get("files") or {}):
    return None
  path = os.path.join(loaded_index.path, store_lib.QUERY_TOWER)
  try:
    with open(path, "rb") as f:
      tower = flax.serialization.msgpack_restore(f.read())
  except (OSError, ValueError) as e:
    raise ckpt_lib.CheckpointError(f"{path}: unreadable ({e})") from e
  # The shapes this model's query tower has (traced only, nothing allocated).
  expected = query_tower_params(nn.unbox(jax.eval_shape(
      lambda: realm_lib.init_retriever_params(config, jax.random.PRNGKey(0)))), config)
  want = {jax.tree_util.keystr(p): leaf.shape
          for p, leaf in jax.tree_util.tree_leaves_with_path(expected)}
  have = ({jax.tree_util.keystr(p): np.shape(leaf)
           for p, leaf in jax.tree_util.tree_leaves_with_path(tower)}
          if isinstance(tower, Mapping) else {})
  if have != want:
    differ = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
    first = differ[0]
    raise ckpt_lib.CheckpointError(
        f"{path}: a query tower of another model (first difference: {first} is "
        f"{have.get(first, 'missing')}, this model's {want.get(first, 'absent')})")
  return tower


def make_index_loader(run_dir: str, config: RealmConfig, *, mesh: Optional[Mesh] = None,
                      first_checkpoint_dir: Optional[str] = None, backend: str = "exact",
                      **searcher_kwargs) -> Callable[[store_lib.LoadedIndex], IndexRetriever]:
  """The `load_fn` for `IndexWatcher`: an index plus the query tower of its checkpoint.

  For each loaded index, takes the query tower published with it (`index_query_tower`: the
  checkpoint it was built from may be pruned by now). For an index without one, finds the
  checkpoint it was built from (`index_checkpoint_dir`: the manifest's "checkpoint" path
  first), restores that checkpoint's params on the host, checks
  that it is the model size of this run and the step the builder recorded (the manifest's
  `extra["checkpoint_step"]`, when present), and returns an `IndexRetriever` with
  `params["retriever"]`'s query tower. Runs on the watcher's background thread for refreshes; a
  failure (e.g. the checkpoint was pruned meanwhile) is logged by the watcher, which keeps the
  index it has.

  Args:
    run_dir: the training run directory.
    config: this run's model config (a checkpoint of another size is a one-line error).
    mesh: see `IndexRetriever`.
    first_checkpoint_dir: the ICT warm-start checkpoint step directory, used for index step 0
      when the manifest's path does not exist.
    backend, **searcher_kwargs: see `IndexRetriever`.

  Returns:
    `load_fn(loaded_index) -> IndexRetriever`.
  """

  def load(loaded: store_lib.LoadedIndex) -> IndexRetriever:
    tower = index_query_tower(loaded, config)
    if tower is not None:
      log.info("index %d: query tower published with it (%s)", loaded.step,
               loaded.manifest.get("checkpoint") or "checkpoint not recorded")
      return IndexRetriever(loaded, tower, config, mesh=mesh, backend=backend, **searcher_kwargs)
    step_dir = index_checkpoint_dir(run_dir, loaded, first_checkpoint_dir=first_checkpoint_dir)
    params, _, metadata = ckpt_lib.restore_checkpoint_dir(step_dir, expected_config=config)
    recorded_step = (loaded.manifest.get("extra") or {}).get("checkpoint_step")
    if recorded_step is not None and int(metadata["step"]) != int(recorded_step):
      raise ckpt_lib.CheckpointError(
          f"{loaded.path}: built from checkpoint step {recorded_step}, but {step_dir} holds "
          f"step {metadata['step']}; its query tower would not match the index (REALM_SPEC 21)")
    if "retriever" not in params:
      raise ckpt_lib.CheckpointError(f"{step_dir}: no retriever params (has {sorted(params)})")
    log.info("index %d: query tower from %s", loaded.step, step_dir)
    return IndexRetriever(loaded, params["retriever"], config, mesh=mesh, backend=backend,
                          **searcher_kwargs)

  return load


# ------------------------------------------------------------------------------ pretraining


# A Retriever, an IndexWatcher of Retrievers (anything with `.current`), or a provider function.
RetrieverOrProvider = Union[Retriever, Any, Callable[[], Retriever]]


class PretrainingBatches:
  """REALM pretraining batches: masked queries + candidates from the current index.

  For each batch of `masked`: retrieve the top `num_candidates + retrieval_margin` blocks with
  the current `Retriever`, then `candidates.build_pretraining_batch` (REALM_SPEC 11-13, 21).
  Yields the `RealmPretrainModel` batch, with B = batch size and K = num_candidates:
    query_ids, query_type_ids, query_mask [B, query_len]; candidate_input_ids,
    candidate_type_ids, candidate_mask [B, K, block_len] (slot 0: null document); reader_ids,
    reader_type_ids, reader_mask [B, K, query_len + block_len]; mlm_positions, mlm_targets,
    mlm_weights [B, max_masks]; example_mask [B]; candidate_block_ids [B, K] (-1 = null);
    source_removed [B]; example_index_step [B]; index_step 0-d (host metadata).
  Examples skipped by the candidate rule stay in the batch with zero weights; their counts
  accumulate in `skip_counts()`.
  """

  def __init__(self, masked: SeqioBatches, store: corpus_lib.BlockStore,
               retriever: RetrieverOrProvider, *,
               num_candidates: int = candidates_lib.DEFAULT_NUM_CANDIDATES,
               retrieval_margin: int = 0, duplicates: str = "skip",
               reader_len: Optional[int] = None, null_document: bool = True):
    """Wraps a masked-query iterator.

    Args:
      masked: masked-query batches (`masked_query_batches`), or any iterator of such dicts with
        `state()`/`restore()`.
      store: the BlockStore the index was built over.
      retriever: a `Retriever` (e.g. an `IndexRetriever`, fixed for every batch); or an
        `IndexWatcher` whose load_fn is `make_index_loader` (its `current` is read once per
        batch, so a swap at a step boundary takes effect at the next batch); or a function
        returning the current Retriever, called once per batch. Or set one later with
        `set_retriever`.
      num_candidates: candidates per example including the null document (REALM: 8).
      retrieval_margin: extra neighbours retrieved beyond num_candidates (used only by
        duplicates="dedupe"; see `candidates`).
      duplicates: "skip" (authors) or "dedupe" (ours), see `candidates.select_candidates`.
      reader_len: reader row length; default query_len + store.max_block_len.
      null_document: False for the ablation without the null document (K retrieved blocks;
        one more block is retrieved, since the source block may take a slot).
    """
    if num_candidates < 1 or retrieval_margin < 0:
      raise ValueError(f"need num_candidates >= 1 and retrieval_margin >= 0, got "
                       f"{num_candidates} and {retrieval_margin}")
    self.k = int(num_candidates) + int(retrieval_margin) + (0 if null_document else 1)
    self.null_document = bool(null_document)
    if self.k > store.num_blocks:
      raise ValueError(f"retrieving {self.k} blocks per query from {store.path}, which has only "
                       f"{store.num_blocks}")
    self.masked = masked
    self.store = store
    self.num_candidates = int(num_candidates)
    self.retrieval_margin = int(retrieval_margin)
    self.duplicates = duplicates
    self.reader_len = reader_len
    self._retriever = retriever
    self._skips = SkipCounter({reason: 0 for reason in candidates_lib.SKIP_REASONS})
    self._examples = 0
    self._last_index_step: Optional[int] = None

  def set_retriever(self, retriever: RetrieverOrProvider) -> None:
    """Retrieve with `retriever` (or the provider's current one) from the next batch on."""
    self._retriever = retriever

  def current_retriever(self) -> Retriever:
    """The Retriever the next batch will use."""
    retriever = self._retriever
    if not hasattr(retriever, "retrieve"):
      # An IndexWatcher (its `current` is the swapped-in load_fn result), or a provider.
      retriever = retriever.current if hasattr(retriever, "current") else retriever()
    if getattr(retriever, "block_store_id", None) not in (None, self.store.store_id):
      raise ValueError(f"the index of step {retriever.step} embeds BlockStore "
                       f"{retriever.block_store_id}, not {self.store.path} "
                       f"({self.store.store_id})")
    return retriever

  def __iter__(self) -> "PretrainingBatches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    masked = dict(next(self.masked))
    retriever = self.current_retriever()
    # tf.data has no uint64: the tasks carry the uid's bits as int64 (`uid_to_int64`).
    masked["source_uid"] = np.asarray(masked["source_uid"]).astype(np.int64).view(np.uint64)
    _, retrieved_ids = retriever.retrieve(masked["query_ids"], masked["query_mask"], k=self.k)
    retrieved_ids = np.asarray(retrieved_ids)  # [B, k]
    if retrieved_ids.shape != (masked["query_ids"].shape[0], self.k):
      raise ValueError(f"the retriever of index {retriever.step} returned ids of shape "
                       f"{retrieved_ids.shape}, expected [{masked['query_ids'].shape[0]}, "
                       f"{self.k}]")
    batch, skips = candidates_lib.build_pretraining_batch(
        self.store, masked, retrieved_ids, index_step=retriever.step,
        num_candidates=self.num_candidates, duplicates=self.duplicates,
        reader_len=self.reader_len, null_document=self.null_document)
    for reason, count in skips.items():
      self._skips[reason] += count
    self._examples += retrieved_ids.shape[0]
    self._last_index_step = int(retriever.step)
    return batch

  def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
    """{key: shape and dtype of one example} of the batches this yields (without the 0-d
    `index_step`): `candidates.pretraining_batch_spec` over the masked queries' spec."""
    return candidates_lib.pretraining_batch_spec(
        self.masked.element_spec(), num_candidates=self.num_candidates,
        block_len=self.store.max_block_len, reader_len=self.reader_len)

  def skip_counts(self) -> dict[str, int]:
    """Examples skipped by the candidate rule so far, by reason (every reason present)."""
    return dict(self._skips)

  def metrics(self) -> dict[str, float]:
    """`retrieval/skipped_<reason>` counts and `retrieval/skipped_fraction` so far."""
    out = {f"retrieval/skipped_{reason}": count for reason, count in self._skips.items()}
    out["retrieval/skipped_fraction"] = (sum(self._skips.values()) / self._examples
                                         if self._examples else 0.0)
    return out

  def state(self) -> dict[str, Any]:
    """The masked-query iterator's state, plus the skip counts so far and the index step of
    the last batch (a trainer that wants the resumed run to retrieve from the same index
    passes it to `IndexWatcher.start(initial_step=...)`)."""
    state = dict(self.masked.state())
    state["skip_counts"] = self.skip_counts()
    state["examples"] = self._examples
    state["last_index_step"] = self._last_index_step
    return state

  def restore(self, state: Mapping[str, Any]) -> None:
    """Restores the masked-query position (and the skip counts) from `state()`."""
    state = dict(state)
    skips = state.pop("skip_counts", None)
    examples = state.pop("examples", None)
    last = state.pop("last_index_step", None)
    self.masked.restore(state)
    self._skips = SkipCounter({reason: 0 for reason in candidates_lib.SKIP_REASONS})
    for reason, count in (skips or {}).items():
      self._skips[reason] = int(count)
    self._examples = int(examples or 0)
    self._last_index_step = None if last is None else int(last)


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

  In each batch, the arrays `keys` (rows [..., length] padded at the end; `mask_key` nonzero on
  their real tokens) are cut to `index.builder.bucket_width(mask, length_bucket)`, the index
  builder's rule: the smallest multiple of `length_bucket` that holds the batch's longest row,
  capped at the full length. Why: a row's padding costs the encoder as much as its tokens, and
  the rows of a batch are padded to the longest any batch can have (a pretraining reader row to
  query_len + block_len), not to the longest this batch has. Only positions that are padding in
  every row go; attention and pooling leave padding out and the heads read real positions only,
  so the model gives the same values on the real tokens (up to float rounding).

  Each distinct width is one compilation of the jitted step that reads these batches: every new
  width is logged, and `metrics()` counts them (`input/<name>_widths`, this process's) with
  the mean width so far (`input/<name>_width`).

  Iteration, the resume protocol (`state`, `restore`) and every other attribute
  (`set_retriever`, `set_query_params`, ...) are the wrapped iterator's; so is `element_spec()`:
  the full width, the widest batch (what a dry run lowers). `spec_at_width` gives the schema of a
  cut batch.
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
