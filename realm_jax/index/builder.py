"""The index-refresh job: embed every block with a checkpoint's document tower and publish it.

REALM_SPEC 20-22. A separate job follows the trainer's latest checkpoint, re-embeds the whole
corpus in eval mode and commits the result atomically (`realm_jax.index.store`); it keeps the
newest few indexes (and the first) and exits at the trainer's training-done marker. The first
index comes from the ICT warm start (`checkpoint_dir`, index step 0). Three layers:
`embed_blocks` (the jitted document tower over a 1-D "data" mesh, batches cut to length
buckets, shortest blocks first, rows streamed to a writer), `build_index` (restore, embed,
publish with the query tower) and `follow` (the loop). Several hosts each embed a slice and
host 0 publishes. Design and multi-host protocol: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.serialization
import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from realm_jax.data.block_store import BlockStore
from realm_jax.index import store as store_lib
from realm_jax.models.config import RealmConfig
from realm_jax.models.retriever import RealmEmbedder
from realm_jax.models import retriever as retriever_lib
from realm_jax import checkpoints as ckpt_lib
from realm_jax import progress as progress_lib

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 128
DEFAULT_LENGTH_BUCKET = 32  # wordpieces; batch widths are multiples of it (see embed_blocks)
DATA_AXIS = "data"
_PARTS_PREFIX = ".parts-"
WAITING_LOG_SECONDS = 60.0  # "waiting for a first checkpoint" at most this often
_PARTS_POLL_SECONDS = 1.0  # multi-host: how often hosts look for the others' parts / the index
_NUMPY_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
INDEX_DTYPES = tuple(_NUMPY_DTYPES)  # the index dtypes embed_blocks writes


# ------------------------------------------------------------------------------ progress


@dataclasses.dataclass(frozen=True)
class EmbedProgress:
  """Progress of `embed_blocks`, passed to its `progress` callback.

  Attributes:
    blocks_done: blocks embedded and written so far (this host).
    blocks_total: blocks this host embeds.
    elapsed_s: seconds since embedding started (the first batch includes compilation).
  """

  blocks_done: int
  blocks_total: int
  elapsed_s: float

  def line(self) -> str:
    return progress_lib.line("blocks", self.blocks_done, self.blocks_total, self.elapsed_s)


def log_progress(progress: EmbedProgress) -> None:
  """The default progress callback: one INFO line."""
  log.info("embedding: %s", progress.line())


# ------------------------------------------------------------------------------ embedding


def local_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A 1-D mesh named "data" over this host's devices (or the given ones)."""
  devices = list(devices) if devices is not None else jax.local_devices()
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def document_tower_params(params: Mapping[str, Any], config: RealmConfig) -> Any:
  """The RealmEmbedder params of the document side (the shared tower when tied), from
  RealmRetriever params ({"embedder"} tied, {"query_embedder", "document_embedder"} untied),
  optionally wrapped as {"params": ...} and/or {"retriever": ...} (a checkpoint's layout).
  """
  return retriever_lib.tower_params(params, config, "document")[1]


def query_tower_bytes(params: Mapping[str, Any], config: RealmConfig) -> bytes:
  """The query tower of retriever params (any layout `document_tower_params` accepts) as the
  index publishes it (`store.QUERY_TOWER`, flax msgpack): a RealmRetriever tree holding that
  tower only ({"embedder"} tied, {"query_embedder"} untied). With it, the index can be
  searched after the trainer has pruned the checkpoint it was built from."""
  name, tower = retriever_lib.tower_params(params, config, "query")
  return flax.serialization.to_bytes({name: jax.device_get(tower)})


@functools.lru_cache(maxsize=8)
def _embed_fn(config: RealmConfig, mesh: Mesh, out_dtype: str) -> Callable:
  """The jitted document tower for one (config, mesh, dtype); cached so that embedding every
  new checkpoint in a long-running builder reuses one compilation (params are arguments)."""
  module = RealmEmbedder(config)
  batch_sharding = NamedSharding(mesh, P(DATA_AXIS, None))
  replicated = NamedSharding(mesh, P())

  def embed(tower_params, ids, type_ids, mask):
    # ids, type_ids, mask: [batch, block_len] -> [batch, proj], eval mode (REALM_SPEC 20).
    emb = module.apply({"params": tower_params}, ids, type_ids, mask, deterministic=True)
    # Cast on the device: a bfloat16 index moves half the bytes to the host.
    return emb.astype(_NUMPY_DTYPES[out_dtype])

  return jax.jit(embed, in_shardings=(replicated, batch_sharding, batch_sharding,
                                      batch_sharding),
                 out_shardings=batch_sharding)


def _process_count() -> int:
  """jax.process_count(), behind a name tests can replace to simulate several hosts."""
  return jax.process_count()


def _process_index() -> int:
  """jax.process_index(), behind a name tests can replace to simulate several hosts."""
  return jax.process_index()


def host_block_range(num_blocks: int, process_index: Optional[int] = None,
                     process_count: Optional[int] = None) -> tuple[int, int]:
  """This host's contiguous slice [start, end) of the blocks: [n*i//P, n*(i+1)//P)."""
  i = _process_index() if process_index is None else process_index
  count = _process_count() if process_count is None else process_count
  return num_blocks * i // count, num_blocks * (i + 1) // count


class _ArrayWriter:
  """Collects rows of a block range into one array (when `embed_blocks` returns a matrix)."""

  def __init__(self, start: int, stop: int, dim: int, dtype: np.dtype):
    self.start = start
    self.rows = np.zeros((stop - start, dim), dtype)  # [stop - start, dim]

  def write_rows(self, start: int, rows: np.ndarray) -> None:
    self.rows[start - self.start:start - self.start + rows.shape[0]] = rows


def check_length_bucket(length_bucket: Any) -> int:
  """`length_bucket` if it is a valid `embed_blocks` argument (an int >= 0), else ValueError."""
  if isinstance(length_bucket, bool) or not isinstance(length_bucket, (int, np.integer)):
    raise ValueError(f"length_bucket must be an int (wordpieces; 0 = the store's full "
                     f"max_block_len), got {length_bucket!r}")
  if length_bucket < 0:
    raise ValueError(f"length_bucket must be >= 0 (wordpieces; 0 = the store's full "
                     f"max_block_len), got {length_bucket}")
  return int(length_bucket)


def bucket_width(mask: np.ndarray, length_bucket: int) -> int:
  """The width a batch is cut to: the smallest multiple of `length_bucket` that holds every
  position where some row's `mask` ([..., length], nonzero on real tokens) is nonzero, capped at
  the full width; the full width for 0.
  """
  full = mask.shape[-1]
  if length_bucket == 0:
    return full
  used = np.flatnonzero(mask.reshape(-1, full).any(axis=0))  # [positions real in some row]
  longest = int(used[-1]) + 1 if used.size else 0
  return min(full, max(1, -(-longest // length_bucket)) * length_bucket)


def length_order(store: BlockStore, start: int, end: int) -> np.ndarray:
  """int64 [end - start] the block ids of [start, end) shortest first (by title + body
  wordpieces: the document tower's row less its three special tokens), ties in id order."""
  lengths = (np.asarray(store.title_lengths[start:end], np.int64)
             + np.asarray(store.body_lengths[start:end], np.int64))  # [end - start]
  return start + np.argsort(lengths, kind="stable")


def write_at(writer: Any, block_ids: np.ndarray, rows: np.ndarray) -> None:
  """Writes `rows[i]` ([n, proj]) at row `block_ids[i]` ([n]) of `writer`: one `write_rows` per
  run of consecutive ids (the writers take contiguous rows)."""
  breaks = np.flatnonzero(np.diff(block_ids) != 1) + 1  # where a run of consecutive ids ends
  for run_ids, run_rows in zip(np.split(block_ids, breaks), np.split(rows, breaks)):
    writer.write_rows(int(run_ids[0]), run_rows)


def embed_blocks(params: Mapping[str, Any], config: RealmConfig, store: BlockStore, *,
                 batch_size: int = DEFAULT_BATCH_SIZE,
                 length_bucket: int = DEFAULT_LENGTH_BUCKET, mesh: Optional[Mesh] = None,
                 dtype: str = "float32", writer: Any = None,
                 block_range: Optional[tuple[int, int]] = None,
                 progress: Optional[Callable[[EmbedProgress], None]] = log_progress,
                 progress_interval_s: float = 5.0) -> Optional[np.ndarray]:
  """Embeds blocks with the retriever's document tower, in eval mode.

  Args:
    params: retriever params (see `document_tower_params` for the accepted layouts).
    store: the BlockStore; block i's input is `store.embedder_inputs([i])` (REALM_SPEC 11).
    batch_size: blocks per jitted call, global over the mesh (rounded up to the devices); the
      last batch is padded.
    length_bucket: each batch is cut to `bucket_width(mask, length_bucket)`, blocks taken
      shortest first (`length_order`); 0: the full `store.max_block_len`, blocks in id order.
    dtype: "float32" or "bfloat16", the dtype of the output rows.
    writer: anything with `write_rows(start, rows)` (an `IndexWriter`); None: return the matrix.
    block_range: (start, end) of the blocks to embed; default this host's (`host_block_range`).
    progress: called with an EmbedProgress every `progress_interval_s` seconds and at the end.

  Returns:
    [end - start, proj] embeddings of the range when `writer` is None, else None.
  """
  if dtype not in _NUMPY_DTYPES:
    raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
  length_bucket = check_length_bucket(length_bucket)
  if store.max_block_len > config.bert.max_position_embeddings:
    raise ValueError(f"{store.path}: blocks of {store.max_block_len} wordpieces do not fit the "
                     f"model's {config.bert.max_position_embeddings} positions")
  mesh = mesh if mesh is not None else local_mesh()
  if mesh.axis_names != (DATA_AXIS,):
    raise ValueError(f"embed_blocks needs a 1-D mesh with axis {DATA_AXIS!r}, got "
                     f"{mesh.axis_names}")
  num_devices = mesh.devices.size
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if batch_size % num_devices:
    rounded = -(-batch_size // num_devices) * num_devices
    log.info("batch_size %d rounded up to %d (a multiple of the %d devices).", batch_size,
             rounded, num_devices)
    batch_size = rounded
  start, end = block_range if block_range is not None else host_block_range(store.num_blocks)
  if not 0 <= start <= end <= store.num_blocks:
    raise ValueError(f"block_range {(start, end)} outside [0, {store.num_blocks}]")
  result = None
  if writer is None:
    result = writer = _ArrayWriter(start, end, config.proj_size, _NUMPY_DTYPES[dtype])

  fn = _embed_fn(config, mesh, dtype)
  tower = jax.device_put(document_tower_params(params, config), NamedSharding(mesh, P()))
  vocab_size = config.bert.vocab_size
  total = end - start
  done = 0
  start_time = time.monotonic()
  last_report = start_time

  def finish(pending) -> None:
    nonlocal done, last_report
    block_ids, out = pending  # [count] the batch's real blocks, [batch, proj]
    count = block_ids.shape[0]
    rows = np.asarray(out)[:count]  # [count, proj]; blocks until this batch is computed
    write_at(writer, block_ids, rows)
    done += count
    now = time.monotonic()
    if progress is not None and (now - last_report >= progress_interval_s or done == total):
      last_report = now
      progress(EmbedProgress(done, total, now - start_time))

  # [end - start] the blocks in the order they are embedded.
  order = (length_order(store, start, end) if length_bucket
           else np.arange(start, end, dtype=np.int64))
  pending = None
  for offset in range(0, total, batch_size):
    count = min(batch_size, total - offset)
    block_ids = order[offset:offset + count]  # [count]
    if count < batch_size:  # fixed shape: pad with the last real block, drop its rows later
      block_ids = np.concatenate([block_ids, np.full(batch_size - count, block_ids[-1])])
    ids, type_ids, mask = store.embedder_inputs(block_ids)  # each [batch, max_block_len] int32
    # Trailing all-padding positions change nothing but cost as much as real tokens; widths
    # are rounded up to a bucket so that jit compiles a handful of shapes.
    width = bucket_width(mask, length_bucket)
    ids, type_ids, mask = ids[:, :width], type_ids[:, :width], mask[:, :width]  # [batch, width]
    if ids.size and int(ids.max()) >= vocab_size:
      bad = int(block_ids[int(np.argmax(ids.max(axis=1)))])
      raise ValueError(f"{store.path}: token id {int(ids.max())} in block {bad} is outside the "
                       f"model's vocabulary of {vocab_size} (a BlockStore of another "
                       f"vocabulary?)")
    out = fn(tower, ids, type_ids, mask)  # [batch, proj], dispatched asynchronously
    if pending is not None:
      finish(pending)  # fetch the previous batch while this one computes
    pending = (block_ids[:count], out)
  if pending is not None:
    finish(pending)
  elif progress is not None:
    progress(EmbedProgress(0, 0, time.monotonic() - start_time))
  return result.rows if result is not None else None


def embed_block_ids(params: Mapping[str, Any], config: RealmConfig, store: BlockStore,
                    block_ids: Any, *, mesh: Optional[Mesh] = None) -> np.ndarray:
  """float32 [n, proj]: the document tower of `params` (any layout `document_tower_params`
  accepts), in eval mode as `embed_blocks`, over the given block ids [n] (any order, repeats
  allowed): one jitted call at the store's full width, so that a fixed n compiles once (the
  re-ranking of `index.rerank` calls it at every training step)."""
  block_ids = np.asarray(block_ids, np.int64).reshape(-1)  # [n]
  count = block_ids.shape[0]
  if count == 0:
    return np.zeros([0, config.proj_size], np.float32)
  mesh = mesh if mesh is not None else local_mesh()
  pad = -count % mesh.devices.size  # the batch shards evenly: pad with the last block
  padded = np.concatenate([block_ids, np.full(pad, block_ids[-1])]) if pad else block_ids
  ids, type_ids, mask = store.embedder_inputs(padded)  # each [n + pad, max_block_len]
  tower = jax.device_put(document_tower_params(params, config), NamedSharding(mesh, P()))
  out = _embed_fn(config, mesh, "float32")(tower, ids, type_ids, mask)  # [n + pad, proj]
  return np.asarray(out)[:count]


# ------------------------------------------------------------------------------ one index


class _PartWriter:
  """Rows of this host's block range, into `<parts>/part-<i>-of-<P>.npy` (multi-host)."""

  def __init__(self, path: str, start: int, stop: int, dim: int, dtype: str):
    self.path, self.start = path, start
    self.tmp = f"{path}.tmp-{os.getpid()}"
    # bfloat16 is stored by its uint16 bit pattern, as in the published format.
    storage = np.uint16 if dtype == "bfloat16" else np.float32
    self._memmap = np.lib.format.open_memmap(self.tmp, mode="w+", dtype=storage,
                                             shape=(stop - start, dim))
    self._rows = self._memmap.view(_NUMPY_DTYPES[dtype])

  def write_rows(self, start: int, rows: np.ndarray) -> None:
    self._rows[start - self.start:start - self.start + rows.shape[0]] = rows

  def close(self) -> None:
    self._memmap.flush()
    del self._rows, self._memmap
    os.replace(self.tmp, self.path)  # a part that exists is complete


def _restore(run_dir: str, step: Optional[int], checkpoint_dir: Optional[str]
             ) -> tuple[Any, RealmConfig, dict, str]:
  """(params, config, metadata, checkpoint path) of the checkpoint to embed."""
  if checkpoint_dir is not None:
    path = os.path.abspath(os.fspath(checkpoint_dir))
  else:
    if step is None:
      step = ckpt_lib.latest_checkpoint_step(run_dir)
      if step is None:
        raise ckpt_lib.CheckpointError(f"{ckpt_lib.checkpoints_dir(run_dir)}: no finished "
                                       f"checkpoint to build an index from")
    path = ckpt_lib.checkpoint_path(run_dir, step)
  params, config, metadata = ckpt_lib.restore_checkpoint_dir(path)
  if "retriever" not in params:
    raise ckpt_lib.CheckpointError(f"{path}: the checkpoint has no retriever params (has "
                                   f"{sorted(params)})")
  return params, config, metadata, path


def build_index(run_dir: str, step: Optional[int] = None, *, store: BlockStore,
                checkpoint_dir: Optional[str] = None, index_step: Optional[int] = None,
                keep: Optional[int] = 3, dtype: str = "float32",
                batch_size: int = DEFAULT_BATCH_SIZE,
                length_bucket: int = DEFAULT_LENGTH_BUCKET, scann: bool = False,
                scann_options: Optional[Mapping[str, Any]] = None,
                mesh: Optional[Mesh] = None,
                progress: Optional[Callable[[EmbedProgress], None]] = log_progress,
                embed_fn: Optional[Callable[..., Any]] = None) -> str:
  """Builds and publishes one index, `<run_dir>/index/<index_step>/`, and returns its path.

  Args:
    step: the checkpoint step of `run_dir` to embed; None: the newest.
    checkpoint_dir: embed this checkpoint step directory instead (e.g. the ICT run's for the
      first index, REALM_SPEC 22).
    index_step: default the checkpoint step, or `store.FIRST_INDEX_STEP` (0) with
      `checkpoint_dir`.
    keep, dtype, batch_size, length_bucket: see `IndexWriter.commit` and `embed_blocks`.
    scann, scann_options: also build ScaNN artifacts (`search.build_scann_artifacts`).
    embed_fn: replaces `embed_blocks` (tests inject failures through it).

  Raises:
    CheckpointError: the checkpoint is missing, unfinished or has no retriever.
    IndexExistsError: `index_step` is already published with different contents.
  """
  start_time = time.monotonic()
  length_bucket = check_length_bucket(length_bucket)  # before the (slow) restore
  params, config, metadata, checkpoint = _restore(run_dir, step, checkpoint_dir)
  if index_step is None:
    index_step = (store_lib.FIRST_INDEX_STEP if checkpoint_dir is not None
                  else int(metadata["step"]))
  embed = embed_fn or embed_blocks
  dim = config.proj_size
  scann_builder = None
  if scann:
    from realm_jax.index import search  # lazily: only the ScaNN path needs it
    scann_builder = functools.partial(search.build_scann_artifacts, **dict(scann_options or {}))
  log.info("building index %d from %s: %d blocks of %s, %s, batch %d, length bucket %d, %d "
           "local device(s), %d host(s)", index_step, checkpoint, store.num_blocks, store.path,
           dtype, batch_size, length_bucket,
           (mesh.devices.size if mesh is not None else jax.local_device_count()),
           _process_count())
  embed_kwargs = dict(batch_size=batch_size, length_bucket=length_bucket, mesh=mesh, dtype=dtype,
                      progress=progress)
  query_tower = {store_lib.QUERY_TOWER: query_tower_bytes(params, config)}

  def extra(embed_seconds: float) -> dict:
    return {"checkpoint_step": int(metadata["step"]), "model_kind": metadata.get("model_kind"),
            "embed_seconds": round(embed_seconds, 3),
            "blocks_per_s": round(store.num_blocks / embed_seconds, 3) if embed_seconds else None,
            "batch_size": batch_size, "length_bucket": length_bucket,
            "num_hosts": _process_count(),
            "local_devices": (mesh.devices.size if mesh is not None
                              else jax.local_device_count())}

  if _process_count() == 1:
    with store_lib.IndexWriter(run_dir, index_step, store.num_blocks, dim, dtype) as writer:
      embed_start = time.monotonic()
      embed(params["retriever"], config, store, writer=writer, **embed_kwargs)
      embed_seconds = time.monotonic() - embed_start
      path = writer.commit(block_store_id=store.store_id, checkpoint=checkpoint,
                           build_seconds=time.monotonic() - start_time,
                           scann_builder=scann_builder, keep=keep, extra=extra(embed_seconds),
                           extra_files=query_tower)
  else:
    path = _build_multi_host(run_dir, index_step, params, config, store, checkpoint, dim, dtype,
                             start_time, scann_builder, keep, extra, embed, embed_kwargs,
                             query_tower)
  log.info("published index %d at %s in %.1fs", index_step, path,
           time.monotonic() - start_time)
  return path


def _build_multi_host(run_dir, index_step, params, config, store, checkpoint, dim, dtype,
                      start_time, scann_builder, keep, extra, embed, embed_kwargs,
                      query_tower) -> str:
  """The multi-host path of `build_index` (see the module docstring)."""
  count, me = _process_count(), _process_index()
  parts_dir = os.path.join(store_lib.index_root(run_dir), f"{_PARTS_PREFIX}{index_step}")
  os.makedirs(parts_dir, exist_ok=True)
  parts = [os.path.join(parts_dir, f"part-{i}-of-{count}.npy") for i in range(count)]
  lo, hi = host_block_range(store.num_blocks)
  embed_start = time.monotonic()
  if not os.path.exists(parts[me]):  # a restarted host whose part survived skips its work
    part = _PartWriter(parts[me], lo, hi, dim, dtype)
    embed(params["retriever"], config, store, writer=part, block_range=(lo, hi), **embed_kwargs)
    part.close()
  embed_seconds = time.monotonic() - embed_start
  dest = store_lib.index_dir(run_dir, index_step)
  if me != 0:
    while not os.path.isdir(dest):  # host 0 publishes; wait so every host returns a real path
      time.sleep(_PARTS_POLL_SECONDS)
    return dest
  while not all(os.path.exists(p) for p in parts):
    log.info("host 0: waiting for index parts from the other hosts (%d/%d present)",
             sum(os.path.exists(p) for p in parts), count)
    time.sleep(_PARTS_POLL_SECONDS)
  with store_lib.IndexWriter(run_dir, index_step, store.num_blocks, dim, dtype) as writer:
    for i, part_path in enumerate(parts):
      rows = np.load(part_path, mmap_mode="r").view(_NUMPY_DTYPES[dtype])
      part_start, _ = host_block_range(store.num_blocks, i, count)
      for offset in range(0, rows.shape[0], 65536):
        writer.write_rows(part_start + offset, rows[offset:offset + 65536])
      del rows
    path = writer.commit(block_store_id=store.store_id, checkpoint=checkpoint,
                         build_seconds=time.monotonic() - start_time, scann_builder=scann_builder,
                         keep=keep, extra=extra(embed_seconds), extra_files=query_tower)
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.rmtree(parts_dir, ignore_errors=True)
  return path


# ------------------------------------------------------------------------------ the job loop


def follow(run_dir: str, *, store: BlockStore, poll_seconds: float = 10.0, once: bool = False,
           checkpoint_dir: Optional[str] = None, keep: Optional[int] = 3,
           dtype: str = "float32", batch_size: int = DEFAULT_BATCH_SIZE,
           length_bucket: int = DEFAULT_LENGTH_BUCKET, scann: bool = False,
           scann_options: Optional[Mapping[str, Any]] = None, mesh: Optional[Mesh] = None,
           stop: Optional[threading.Event] = None,
           on_publish: Optional[Callable[[str], None]] = None,
           embed_fn: Optional[Callable[..., Any]] = None) -> list[str]:
  """The refresh job: publish an index of the trainer's newest checkpoint, again and again.

  Each poll reads `TRAINING_DONE` before listing checkpoints (the final checkpoint is written
  before the marker), says when no checkpoint exists yet, embeds the newest checkpoint when it is
  newer than the newest index (skipping intermediate ones: REALM follows the latest export), and
  returns once training is done and indexed. Killed at any point, it publishes nothing partial.

  Args:
    once: build one index (the newest checkpoint, or `checkpoint_dir`) and return.
    checkpoint_dir: the first index's checkpoint (REALM_SPEC 22: the ICT warm start), published
      as step 0 when the run has no index yet.
    stop: an Event that ends the loop at the next poll (for running the job in a thread).
    on_publish: called with each published path.

  Returns:
    The published paths, in order.
  """
  run_dir = os.path.abspath(os.fspath(run_dir))
  length_bucket = check_length_bucket(length_bucket)  # now, not after waiting for a checkpoint
  stop = stop or threading.Event()
  published: list[str] = []
  build = functools.partial(build_index, run_dir, store=store, keep=keep, dtype=dtype,
                            batch_size=batch_size, length_bucket=length_bucket, scann=scann,
                            scann_options=scann_options, mesh=mesh, embed_fn=embed_fn)

  def publish(path: str) -> None:
    published.append(path)
    if on_publish is not None:
      on_publish(path)

  if checkpoint_dir is not None and (once or store_lib.latest_index_step(run_dir) is None):
    publish(build(checkpoint_dir=checkpoint_dir))
    if once:
      return published

  waiting_logged_for: Optional[int] = -1  # the index step we last said we are idle at
  last_waiting_log = -math.inf  # when we last said we wait for a first checkpoint
  while not stop.is_set():
    done = ckpt_lib.training_done(run_dir)  # before listing: see the docstring
    newest = ckpt_lib.latest_checkpoint_step(run_dir)
    indexed = store_lib.latest_index_step(run_dir)
    if newest is None:
      if done:
        message = (f"{run_dir}: training is done and it saved no checkpoint; nothing to index")
        if once:
          raise ckpt_lib.CheckpointError(message)
        log.info("%s; exiting.", message)
        return published
      if time.monotonic() - last_waiting_log >= WAITING_LOG_SECONDS:
        log.info("waiting for a first checkpoint in %s (none yet) ... polling every %gs; the "
                 "trainer writes them as checkpoints/<step>/", ckpt_lib.checkpoints_dir(run_dir),
                 poll_seconds)
        last_waiting_log = time.monotonic()
    elif indexed is None or newest > indexed:
      try:
        path = build(newest)
      except ckpt_lib.CheckpointError as e:
        if newest in ckpt_lib.list_checkpoint_steps(run_dir):
          raise
        # The trainer keeps only its newest few checkpoints: it pruned this one while we read
        # it. A newer one exists; take that instead.
        log.warning("checkpoint %d was removed while it was being read (%s); moving on to the "
                    "newest", newest, e)
        continue
      publish(path)
      if once:
        return published
      continue  # a newer checkpoint may have arrived while embedding: look again at once
    elif once:
      log.info("index %d of the newest checkpoint is already published at %s", indexed,
               store_lib.index_dir(run_dir, indexed))
      return published
    elif done:
      log.info("training is done and its last checkpoint (step %d) is indexed; exiting.",
               newest)
      return published
    elif waiting_logged_for != indexed:
      waiting_logged_for = indexed
      log.info("index %d is current; waiting for a newer checkpoint in %s (or %s)", indexed,
               ckpt_lib.checkpoints_dir(run_dir), ckpt_lib.TRAINING_DONE)
    stop.wait(poll_seconds)
  log.info("stopped.")
  return published
