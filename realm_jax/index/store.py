"""The published-index format: one snapshot of the document embeddings, committed atomically.

REALM_SPEC 20-21: a separate job re-embeds the whole BlockStore from one trainer checkpoint and
commits the result atomically; the trainer swaps it in at a step boundary and records which
index chose its candidates. This module is that format (`<run_dir>/index/<step>/`:
embeddings.npy, optional scann/ and query_tower.msgpack, manifest.json written last) and its
protocol (`IndexWriter`, `publish_index`: staging directory, fsync, hash, rename into place;
`load_index` verifies; `prune_indexes`). A published index is immutable: republishing the same
snapshot is a no-op, anything else `IndexExistsError`. The builder (`index/builder.py`) and
the trainer's watcher (`index/swap.py`) are written against it. Layout, manifest fields and the
protocol step by step: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import shutil
import socket
import sys
import time
from typing import Callable, Optional, Union

import ml_dtypes
import numpy as np

from realm_jax import fileio

# The shared rules of every atomically published artifact (realm_jax.fileio), under module
# names: the tests inject faults at these points of a publish.
_fsync_dir = fileio.fsync_dir
_sha256_file = fileio.sha256_file
_write_manifest = fileio.write_manifest
# No `aside_prefix`: a published index is immutable. On Linux, rename(2) onto an existing
# non-empty directory fails, so two builders racing for the same step cannot overwrite each
# other: the loser gets an OSError and compares contents.
_rename_into_place = fileio.publish_staged

FORMAT_NAME = "realm_jax.Index"
FORMAT_VERSION = 1

INDEX_SUBDIR = "index"
MANIFEST = "manifest.json"
EMBEDDINGS = "embeddings.npy"
SCANN_DIR = "scann"
QUERY_TOWER = "query_tower.msgpack"
# The index built from the warm-start checkpoint (REALM_SPEC 22): the trainer starts at step 0
# with it, so its staleness is simply the train step. Never pruned.
FIRST_INDEX_STEP = 0
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"
# Names of staging/trash directories up to the writer's `<host>-<pid>-<random>`.
_PRIVATE_PATTERN = r"\.(?:staging|trash)-\d+-"

DTYPES = ("float32", "bfloat16")
# How each public dtype is stored in embeddings.npy: bfloat16 is not a NumPy dtype that .npy
# readers know, so its bit pattern is stored as uint16 and the manifest carries the real dtype.
_STORAGE_DTYPE = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(np.uint16)}
_PUBLIC_DTYPE = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16)}

_COPY_CHUNK_ROWS = 65536  # rows per copy when publishing an in-memory/memmapped matrix

log = logging.getLogger(__name__)


class IndexLoadError(ValueError):
  """A directory is not a complete, intact index matching what the caller expects.

  The message starts with the index path and says what is wrong.
  """


class IndexExistsError(FileExistsError):
  """`index/<step>` is already published with different contents."""


# ------------------------------------------------------------------------------ naming


def index_root(run_dir: str) -> str:
  """`<run_dir>/index`, the directory holding the published indexes of a run."""
  return os.path.join(os.fspath(run_dir), INDEX_SUBDIR)


def _check_step(step) -> int:
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ValueError(f"step must be a non-negative integer, got {step!r}")
  return int(step)


def index_dir(run_dir: str, step: int) -> str:
  """Path of the index published for checkpoint `step` (whether or not it exists):
  `<run_dir>/index/<step>`.
  """
  return os.path.join(index_root(run_dir), str(_check_step(step)))


def _normalize_dtype(dtype) -> str:
  """'float32' | 'bfloat16' from a name or a NumPy/ml_dtypes dtype; ValueError otherwise."""
  try:
    name = np.dtype(dtype).name
  except TypeError:
    name = str(dtype)
  if name not in DTYPES:
    raise ValueError(f"index embeddings must be float32 or bfloat16, got {dtype!r}")
  return name


# ------------------------------------------------------------------------------ staging


def clean_stale_staging(run_dir: str) -> list[str]:
  """Removes `.staging-*` / `.trash-*` directories left in `<run_dir>/index` by dead processes and
  returns their paths. Only this host's whose process is gone (or this process's own, unused)
  go: live publishes and other hosts' (whose pids mean nothing here) are left alone.
  """
  return fileio.remove_stale(index_root(run_dir), _PRIVATE_PATTERN)



def _hash_tree(staging: str, subdir: str) -> dict[str, dict]:
  """{relative path: {"sha256", "bytes"}} of every file under `staging/subdir`, all fsynced."""
  files = {}
  top = os.path.join(staging, subdir)
  for dirpath, dirnames, filenames in os.walk(top):
    dirnames.sort()
    for name in sorted(filenames) + [d for d in dirnames
                                     if os.path.islink(os.path.join(dirpath, d))]:
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, staging).replace(os.sep, "/")
      if os.path.islink(path) or not os.path.isfile(path):
        # A published index must be self-contained: a link would point outside the snapshot.
        raise ValueError(f"{path}: the scann_builder wrote a link or special file; write "
                         f"regular files only")
      fileio.fsync_file(path)
      files[rel] = {"sha256": _sha256_file(path), "bytes": os.path.getsize(path)}
    _fsync_dir(dirpath)
  return files


# ------------------------------------------------------------------------------ listing


_WARNED_INVALID: set[str] = set()


def _read_manifest(path: str) -> dict:
  """The parsed manifest of the index directory `path`; IndexLoadError naming what is wrong."""
  manifest_path = os.path.join(path, MANIFEST)
  if not os.path.isfile(manifest_path):
    raise IndexLoadError(f"{path}: no {MANIFEST}: not an index, or an unfinished publish")
  try:
    with open(manifest_path, encoding="utf-8") as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    raise IndexLoadError(f"{path}: unreadable {MANIFEST} ({e})") from e
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
    raise IndexLoadError(f"{path}: {MANIFEST} is not a {FORMAT_NAME} manifest")
  if manifest.get("format_version") != FORMAT_VERSION:
    raise IndexLoadError(f"{path}: format_version {manifest.get('format_version')!r} is not "
                         f"supported (this code reads {FORMAT_VERSION})")
  return manifest


def list_indexes(run_dir: str) -> list[int]:
  """Steps of the complete published indexes of a run, ascending ([] without `<run_dir>/index`).

  Listed: a decimal step directory with a readable manifest of this format for that step. Files
  are not re-hashed (that is `load_index(verify=True)`); staging and trash directories never
  appear.
  """
  steps = []
  for step, path in fileio.numbered_dirs(index_root(run_dir)):
    try:
      manifest = _read_manifest(path)
      if int(manifest.get("step", -1)) != step:
        raise IndexLoadError(f"{path}: {MANIFEST} says step {manifest.get('step')!r}")
    except (IndexLoadError, TypeError, ValueError) as e:
      # Our protocol never leaves such a directory; someone copied or edited it by hand.
      # Warn once per path rather than at every watcher poll.
      if path not in _WARNED_INVALID:
        _WARNED_INVALID.add(path)
        log.warning("Ignoring %s: not a complete index (%s)", path, e)
      continue
    steps.append(step)
  return steps


def latest_index_step(run_dir: str) -> Optional[int]:
  """The step of the newest complete published index of a run, or None if there is none."""
  steps = list_indexes(run_dir)
  return steps[-1] if steps else None


# ------------------------------------------------------------------------------ loading


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedIndex:
  """A verified, loaded index.

  Attributes:
    path: the index directory.
    step: checkpoint step the embeddings were computed from.
    embeddings: [num_blocks, dim] float32 or ml_dtypes.bfloat16 (a read-only memmap when loaded
      with mmap=True).
    manifest: the parsed manifest.json.
    published_unix: time.time() at publishing (for staleness in seconds).
  """

  path: str
  step: int
  embeddings: np.ndarray
  manifest: dict
  published_unix: float

  @property
  def num_blocks(self) -> int:
    return int(self.manifest["num_blocks"])

  @property
  def dim(self) -> int:
    return int(self.manifest["dim"])

  @property
  def dtype(self) -> str:
    return self.manifest["dtype"]

  @property
  def block_store_id(self) -> str:
    return self.manifest["block_store_id"]

  @property
  def scann_dir(self) -> Optional[str]:
    """`<path>/scann` if the index carries ScaNN artifacts, else None."""
    return os.path.join(self.path, SCANN_DIR) if "scann" in self.manifest else None


def load_index(path: str, *, block_store_id: Optional[str] = None,
               num_blocks: Optional[int] = None, dim: Optional[int] = None,
               dtype: Optional[str] = None, verify: Union[bool, str] = True,
               mmap: bool = True) -> LoadedIndex:
  """Loads a published index, refusing anything incomplete, corrupt or not what is expected.

  Args:
    path: an index directory (`index_dir(run_dir, step)`).
    block_store_id, num_blocks, dim, dtype: if given, what the index must have.
    verify: True re-hashes every file against the manifest (reads everything once); "fast"
      checks file sizes only; False checks neither (shape and dtype are always checked).
    mmap: map embeddings.npy read-only instead of reading it into memory.

  Raises:
    IndexLoadError: the message starts with `path` and names the problem.
  """
  return _load(os.fspath(path), block_store_id=block_store_id, num_blocks=num_blocks, dim=dim,
               dtype=dtype, verify=verify, mmap=mmap, allow_staging=False)


def _load(path: str, *, block_store_id, num_blocks, dim, dtype, verify, mmap,
          allow_staging: bool) -> LoadedIndex:
  fileio.check_verify_mode(verify)

  def fail(problem: str):
    raise IndexLoadError(f"{path}: {problem}")

  base = os.path.basename(os.path.normpath(path))
  if not allow_staging and fileio.private_owner(base, _PRIVATE_PATTERN) is not None:
    # Even with a manifest, a staging dir has not been renamed into place: its publish was
    # interrupted (or is still running), so it is not an index anyone published.
    fail("a staging/trash directory of an unfinished publish, not a published index")
  if not os.path.isdir(path):
    fail("no such index directory")
  manifest = _read_manifest(path)
  try:
    step = int(manifest["step"])
    n, d = int(manifest["num_blocks"]), int(manifest["dim"])
    dtype_name = manifest["dtype"]
    store_id = manifest["block_store_id"]
    files = dict(manifest["files"])
    published_unix = float(manifest["published_unix"])
    sha = manifest["sha256"]
  except (KeyError, TypeError, ValueError) as e:
    fail(f"{MANIFEST} lacks or has a bad entry: {e!r}")
  if dtype_name not in DTYPES:
    fail(f"{MANIFEST} has dtype {dtype_name!r}, expected one of {DTYPES}")
  if base.isdigit() and int(base) != step:
    fail(f"directory name says step {base} but {MANIFEST} says step {step} (moved by hand?)")
  if block_store_id is not None and store_id != block_store_id:
    fail(f"embeds BlockStore {store_id}, expected {block_store_id} (an index of another "
         f"corpus; rebuild it from this BlockStore)")
  if num_blocks is not None and n != int(num_blocks):
    fail(f"has {n} blocks, expected {num_blocks} (built from a different BlockStore?)")
  if dim is not None and d != int(dim):
    fail(f"has embedding dim {d}, expected {dim} (a different model's projection size?)")
  if dtype is not None and dtype_name != _normalize_dtype(dtype):
    fail(f"has dtype {dtype_name}, expected {_normalize_dtype(dtype)}")
  entry = files.get(EMBEDDINGS)
  if not isinstance(entry, dict) or entry.get("sha256") != sha:
    fail(f"{MANIFEST} files entry for {EMBEDDINGS} disagrees with its sha256")

  for rel, entry in sorted(files.items()):
    file_path = os.path.join(path, *rel.split("/"))
    if not os.path.isfile(file_path):
      fail(f"missing file {rel}")
    if not isinstance(entry, dict):
      fail(f"{MANIFEST} has a bad files entry for {rel}")
    try:
      fileio.check_listed_file(file_path, rel, entry, verify, fail, sha256=_sha256_file)
    except OSError as e:  # e.g. pruned by a publisher while we were reading it
      fail(f"cannot read {rel} ({e})")

  emb_path = os.path.join(path, EMBEDDINGS)
  try:
    stored = np.load(emb_path, mmap_mode="r" if mmap else None, allow_pickle=False)
  except (OSError, ValueError) as e:
    fail(f"cannot read {EMBEDDINGS} ({e})")
  want_dtype = _STORAGE_DTYPE[dtype_name]
  if stored.shape != (n, d) or stored.dtype != want_dtype:
    fail(f"{EMBEDDINGS} is {stored.dtype}{list(stored.shape)}, the manifest says "
         f"{want_dtype}{[n, d]} (stored as {want_dtype} for {dtype_name})")
  embeddings = stored.view(_PUBLIC_DTYPE[dtype_name])
  return LoadedIndex(path=path, step=step, embeddings=embeddings, manifest=manifest,
                     published_unix=published_unix)


# ------------------------------------------------------------------------------ publishing


def _json_dict(value, what: str) -> dict:
  if value is None:
    return {}
  if not isinstance(value, dict):
    raise TypeError(f"{what} must be a dict, got {type(value).__name__}")
  try:
    json.dumps(value)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{what} must be JSON-serializable ({e})") from e
  return value


class IndexWriter:
  """Streams an embedding matrix into a staging directory and publishes it (`commit`).

  Rows go straight into a memory-mapped embeddings.npy, so the full matrix is never held
  twice. Use as a context manager, or call `abort()` on failure: an uncommitted writer publishes
  nothing.

    with IndexWriter(run_dir, step, store.num_blocks, 128, "bfloat16") as writer:
      for start, rows in batches:
        writer.write_rows(start, rows)
      writer.commit(block_store_id=store.store_id, checkpoint=ckpt_path)
  """

  def __init__(self, run_dir: str, step: int, num_blocks: int, dim: int,
               dtype: Union[str, np.dtype] = "float32"):
    """Creates the staging directory and the (zero-filled, sparse) embeddings file for
    `<run_dir>/index/<step>`: `num_blocks` x `dim` rows (each at least 1) of "float32" or
    "bfloat16".
    """
    self.run_dir = os.path.abspath(os.fspath(run_dir))
    self.step = _check_step(step)
    self.num_blocks, self.dim = int(num_blocks), int(dim)
    if self.num_blocks < 1 or self.dim < 1:
      raise ValueError(f"an index needs num_blocks >= 1 and dim >= 1, got "
                       f"[{num_blocks}, {dim}]")
    self.dtype = _normalize_dtype(dtype)
    self.dest = index_dir(self.run_dir, self.step)
    self._start_time = time.monotonic()
    self._done = False

    os.makedirs(index_root(self.run_dir), exist_ok=True)
    clean_stale_staging(self.run_dir)
    # Holds the staging directory from here until commit() or abort() closes it.
    self._staging = contextlib.ExitStack()
    self.staging = self._staging.enter_context(
        fileio.staged_directory(self.dest, f"{STAGING_PREFIX}{self.step}-"))
    try:
      # [num_blocks, dim] in the storage dtype; bfloat16 rows are written through a view.
      self._memmap = np.lib.format.open_memmap(
          os.path.join(self.staging, EMBEDDINGS), mode="w+",
          dtype=_STORAGE_DTYPE[self.dtype], shape=(self.num_blocks, self.dim))
    except BaseException:
      self.abort()
      raise
    self._rows = self._memmap.view(_PUBLIC_DTYPE[self.dtype])
    # [num_blocks] which rows were written: a builder that skips a batch must not publish an
    # index whose missing rows silently score 0 against every query.
    self._written = np.zeros(self.num_blocks, bool)

  def write_rows(self, start: int, rows) -> None:
    """Writes `rows` ([n, dim], any float dtype; cast to the writer's dtype) at rows start..+n.

    Raises:
      ValueError: wrong shape, rows out of range, or non-finite values (a diverged checkpoint
        must not become an index).
    """
    self._check_open()
    rows = np.asarray(rows)
    start = int(start)
    if rows.ndim != 2 or rows.shape[1] != self.dim:
      raise ValueError(f"{self.staging}: rows must be [n, {self.dim}], got {list(rows.shape)}")
    stop = start + rows.shape[0]
    if start < 0 or stop > self.num_blocks:
      raise ValueError(f"{self.staging}: rows [{start}, {stop}) outside [0, {self.num_blocks})")
    if not np.issubdtype(rows.dtype, np.floating) and rows.dtype != ml_dtypes.bfloat16:
      raise ValueError(f"{self.staging}: rows must be floating point, got {rows.dtype}")
    rows = rows.astype(_PUBLIC_DTYPE[self.dtype], copy=False)
    finite = np.isfinite(rows).all(axis=1)  # [n]
    if not finite.all():
      bad = start + int(np.argmin(finite))
      raise ValueError(f"{self.staging}: non-finite embedding in row {bad} (and "
                       f"{int((~finite).sum()) - 1} more rows of this chunk); refusing to "
                       f"publish a diverged checkpoint's embeddings")
    self._rows[start:stop] = rows
    self._written[start:stop] = True

  def commit(self, *, block_store_id: str, checkpoint: str = "", build_seconds: Optional[float]
             = None, scann_builder: Optional[Callable[[str, np.ndarray], dict]] = None,
             keep: Optional[int] = 3, extra: Optional[dict] = None,
             extra_files: Optional[dict[str, bytes]] = None) -> str:
    """Finishes and publishes the index (the module docstring's protocol); returns its directory.

    Args:
      block_store_id: `store_id` of the BlockStore that was embedded.
      checkpoint: path or description of the checkpoint.
      scann_builder: `fn(scann_dir, embeddings) -> dict`, called with the empty staging `scann/`
        and the read-only embeddings as published; returns its settings for the manifest.
      keep: keep the newest `keep` indexes (never the one just published); None keeps all. Keep
        at least 2 while a trainer runs, so the index it may be loading is not pruned.
      extra_files: {file name: contents} published and hashed beside the embeddings.

    Raises:
      ValueError: rows never written, or a scann_builder that wrote links.
      IndexExistsError: the step is already published with different embeddings/BlockStore.
    """
    self._check_open()
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None, got {keep}")
    extra = _json_dict(extra, "extra")
    try:
      missing = np.flatnonzero(~self._written)
      if missing.size:
        raise ValueError(f"{self.staging}: {missing.size} of {self.num_blocks} rows were never "
                         f"written (first: row {int(missing[0])}); not publishing a partial "
                         f"index")
      emb_path = os.path.join(self.staging, EMBEDDINGS)
      self._memmap.flush()
      del self._rows, self._memmap  # unmap before hashing: the file is final now
      fileio.fsync_file(emb_path)
      files = {EMBEDDINGS: {"sha256": _sha256_file(emb_path),
                            "bytes": os.path.getsize(emb_path)}}
      sha = files[EMBEDDINGS]["sha256"]

      # A restarted builder re-publishing the same snapshot: skip the (expensive) ScaNN build.
      if os.path.lexists(self.dest) and self._same_as_published(sha, block_store_id):
        return self._finish_noop(keep)

      for name, data in (extra_files or {}).items():
        if name in files or name == MANIFEST or os.path.basename(name) != name:
          raise ValueError(f"extra file {name!r}: not a plain file name of its own")
        with open(os.path.join(self.staging, name), "wb") as f:
          f.write(data)
        fileio.fsync_file(os.path.join(self.staging, name))
        files[name] = {"sha256": _sha256_file(os.path.join(self.staging, name)),
                       "bytes": len(data)}

      scann_info = None
      if scann_builder is not None:
        scann_dir = os.path.join(self.staging, SCANN_DIR)
        os.mkdir(scann_dir)
        staged = np.load(emb_path, mmap_mode="r").view(_PUBLIC_DTYPE[self.dtype])
        scann_info = _json_dict(scann_builder(scann_dir, staged), "scann_builder's result")
        del staged
        files.update(_hash_tree(self.staging, SCANN_DIR))

      now = time.time()
      manifest = {
          "format": FORMAT_NAME,
          "format_version": FORMAT_VERSION,
          "step": self.step,
          "checkpoint": "" if checkpoint is None else str(
              os.fspath(checkpoint) if isinstance(checkpoint, os.PathLike) else checkpoint),
          "block_store_id": block_store_id,
          "num_blocks": self.num_blocks,
          "dim": self.dim,
          "dtype": self.dtype,
          "sha256": sha,
          "files": files,
          "build_seconds": float(time.monotonic() - self._start_time
                                 if build_seconds is None else build_seconds),
          "created": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(
              timespec="seconds"),
          "published_unix": now,
          "extra": extra,
          "writer": {"host": socket.gethostname(), "pid": os.getpid(),
                     "python": sys.version.split()[0], "numpy": np.__version__},
      }
      if scann_info is not None:
        manifest["scann"] = scann_info
      _fsync_dir(self.staging)
      _write_manifest(self.staging, manifest)
      # Re-open it the way a reader will (manifest, shapes, dtype, sizes); the hashes were just
      # computed from the files on disk, so re-hashing would only read them twice.
      _load(self.staging, block_store_id=block_store_id, num_blocks=self.num_blocks,
            dim=self.dim, dtype=self.dtype, verify="fast", mmap=True, allow_staging=True)

      if os.path.lexists(self.dest):
        if self._same_as_published(sha, block_store_id):
          return self._finish_noop(keep)
      try:
        _rename_into_place(self.staging, self.dest)
      except OSError:
        # Lost a race with another publisher of this step; same snapshot -> fine.
        if os.path.lexists(self.dest) and self._same_as_published(sha, block_store_id):
          return self._finish_noop(keep)
        raise
      self._done = True
      log.info("Published index %s (%d x %d %s, block store %s).", self.dest, self.num_blocks,
               self.dim, self.dtype, block_store_id)
    except BaseException:
      self.abort()
      raise
    finally:
      self._staging.close()  # published or aborted by now: only releases the name
    prune_indexes(self.run_dir, keep, protect=self.step)
    return self.dest

  def _same_as_published(self, sha: str, block_store_id: str) -> bool:
    """True if `dest` holds this very snapshot; IndexExistsError if it holds anything else."""
    try:
      manifest = _read_manifest(self.dest)
    except IndexLoadError as e:
      raise IndexExistsError(f"{self.dest}: already exists but is not a valid index ({e}); "
                             f"remove it by hand to republish step {self.step}") from e
    if manifest.get("sha256") == sha and manifest.get("block_store_id") == block_store_id:
      return True
    raise IndexExistsError(
        f"{self.dest}: step {self.step} is already published with different contents "
        f"(sha256 {str(manifest.get('sha256'))[:12]}... vs {sha[:12]}..., block store "
        f"{manifest.get('block_store_id')} vs {block_store_id}); published indexes are "
        f"immutable: delete it by hand if it is wrong")

  def _finish_noop(self, keep: Optional[int]) -> str:
    log.info("%s: already published with identical embeddings; nothing to do.", self.dest)
    self.abort()
    self._done = True
    prune_indexes(self.run_dir, keep, protect=self.step)
    return self.dest

  def abort(self) -> None:
    """Discards the staging directory (idempotent). Nothing is published."""
    for attr in ("_rows", "_memmap"):
      if hasattr(self, attr):
        delattr(self, attr)
    self._staging.close()
    self._done = True

  def _check_open(self) -> None:
    if self._done:
      raise RuntimeError(f"{self.staging}: this IndexWriter is already committed or aborted")

  def __enter__(self) -> "IndexWriter":
    return self

  def __exit__(self, exc_type, *exc) -> None:
    if not self._done:
      if exc_type is None:
        log.warning("%s: IndexWriter closed without commit(); discarding.", self.staging)
      self.abort()


def publish_index(run_dir: str, step: int, embeddings, *, block_store_id: str,
                  checkpoint: str = "", build_seconds: float = 0.0,
                  scann_builder: Optional[Callable[[str, np.ndarray], dict]] = None,
                  keep: Optional[int] = 3, extra: Optional[dict] = None) -> str:
  """Publishes an embedding matrix ([num_blocks, dim] float32 or bfloat16, any array; its dtype
  kept) as `<run_dir>/index/<step>`, atomically, through an `IndexWriter`.

  The matrix is copied in row chunks, so a memmapped `embeddings` is never read whole. The
  arguments and errors are `IndexWriter.commit`'s; an identical step already published is a
  no-op. Returns the published directory.
  """
  if not isinstance(embeddings, np.ndarray):
    embeddings = np.asarray(embeddings)
  if embeddings.ndim != 2:
    raise ValueError(f"embeddings must be [num_blocks, dim], got shape {list(embeddings.shape)}")
  dtype = _normalize_dtype(embeddings.dtype)
  with IndexWriter(run_dir, step, embeddings.shape[0], embeddings.shape[1], dtype) as writer:
    for start in range(0, embeddings.shape[0], _COPY_CHUNK_ROWS):
      writer.write_rows(start, embeddings[start:start + _COPY_CHUNK_ROWS])
    return writer.commit(block_store_id=block_store_id, checkpoint=checkpoint,
                         build_seconds=build_seconds, scann_builder=scann_builder, keep=keep,
                         extra=extra)


def prune_indexes(run_dir: str, keep: Optional[int], *, protect: Optional[int] = None
                  ) -> list[int]:
  """Deletes all but the newest `keep` published indexes (None: none) and returns their steps;
  never `protect` nor FIRST_INDEX_STEP (the warm start's index: the run's record of retrieval
  before training). Each victim is renamed to `.trash-*` first, so a crash mid-delete never
  leaves a listed, half-deleted index; a trainer with it memory-mapped keeps reading it.
  """
  if keep is None:
    return []
  steps = list_indexes(run_dir)
  victims = [s for s in steps[:max(len(steps) - keep, 0)] if s not in (protect, FIRST_INDEX_STEP)]
  root = index_root(run_dir)
  pruned = []
  for step in victims:
    with fileio.private_path(root, f"{TRASH_PREFIX}{step}-") as trash:
      try:
        os.rename(index_dir(run_dir, step), trash)
      except FileNotFoundError:  # pruned concurrently by another publisher
        continue
      _fsync_dir(root)
      shutil.rmtree(trash, ignore_errors=True)
    log.info("Pruned index %s (keeping the newest %d).", index_dir(run_dir, step), keep)
    pruned.append(step)
  return pruned


__all__ = [
    "DTYPES", "EMBEDDINGS", "FORMAT_NAME", "FORMAT_VERSION", "IndexExistsError",
    "FIRST_INDEX_STEP", "IndexLoadError", "IndexWriter", "LoadedIndex", "MANIFEST",
    "QUERY_TOWER", "SCANN_DIR",
    "clean_stale_staging", "index_dir", "index_root", "latest_index_step", "list_indexes",
    "load_index", "prune_indexes", "publish_index",
]
