"""RETRO's chunk database (Borgeaud et al. 2022): chunks, frozen-BERT keys, neighbours.

RETRO splits the retrieval text into chunks of m tokens (64) and stores for each its key (the
frozen BERT's hidden states averaged over the chunk, BERT reading `[CLS] chunk [SEP]`) and its
value: the chunk and its continuation, r = 2m tokens. Each chunk of a training sequence
retrieves its k nearest neighbours by L2 distance of the keys, never from the sequence's own
document. Here a document's text is its BlockStore blocks' bodies back to back; a last,
partial chunk is kept, padded with 0. L2 search goes through the inner-product searchers (rows
[x, -|x|^2 / 2], queries [q, 1]). The database is one directory published atomically and
verified on open. Choices, the on-disk layout: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import logging
import os
import re
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from realm_jax import fileio
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.block_store import BlockStore
from realm_jax.index import builder as builder_lib
from realm_jax.index import search as search_lib
from realm_jax.index import store as store_lib
from realm_jax.models.bert import BertModel
from realm_jax.models.config import BertConfig

log = logging.getLogger(__name__)

FORMAT_NAME = "realm_jax.ChunkDatabase"
FORMAT_VERSION = 1

RETRO_CHUNK_LEN = 64  # m in RETRO
TOY_CHUNK_LEN = 16  # the toy world's m (docs/toy_settings.md, "RETRO chunk length")
RETRO_TRAIN_NEIGHBOURS = 2  # k in RETRO's training
DEFAULT_BATCH_SIZE = 128  # chunks per jitted BERT call

MANIFEST = "manifest.json"
CHUNK_TOKENS = "chunk_tokens.npy"
CONTINUATION_TOKENS = "continuation_tokens.npy"
CHUNK_LENGTHS = "chunk_lengths.npy"
DOC_IDS = "doc_ids.npy"
DATA_FILES = (CHUNK_TOKENS, CONTINUATION_TOKENS, CHUNK_LENGTHS, DOC_IDS)
KEY_INDEX_STEP = 0  # the keys' index is `index/0`: one frozen model, no training steps
# Blocks per slab of a build: whole documents are chunked and embedded slab by slab, so host
# memory holds one slab's token stream, not the corpus's.
_SLAB_BLOCKS = 1 << 16

# Names of a build's private directories next to its destination (as the BlockStore's).
_PRIVATE_SUFFIX = r"\.(?:staging|old)-"


class ChunkDatabaseError(ValueError):
  """A chunk database directory is missing, incomplete, corrupt or not what was expected; or a
  BlockStore cannot be chunked. The message starts with the path."""


# ------------------------------------------------------------------------------ chunking


@dataclasses.dataclass(frozen=True, eq=False)
class Chunks:
  """Chunks of documents, in document order and text order within a document.

  Attributes:
    tokens: [num_chunks, chunk_len] the chunk's wordpieces, padded with 0.
    continuations: [num_chunks, chunk_len] the next chunk_len wordpieces of the same document,
      padded with 0 (all 0 for a document's last chunk).
    lengths: [num_chunks] int32 real wordpieces of the chunk (1..chunk_len).
    doc_ids: [num_chunks] int64 the document of the chunk.
  """

  tokens: np.ndarray
  continuations: np.ndarray
  lengths: np.ndarray
  doc_ids: np.ndarray

  @property
  def num_chunks(self) -> int:
    return int(self.lengths.shape[0])


def _check_chunk_len(chunk_len: Any) -> int:
  if isinstance(chunk_len, bool) or not isinstance(chunk_len, (int, np.integer)) or (
      chunk_len < 1):
    raise ValueError(f"chunk_len must be a positive integer (RETRO: {RETRO_CHUNK_LEN}), got "
                     f"{chunk_len!r}")
  return int(chunk_len)


def chunk_documents(stream: np.ndarray, doc_lengths: np.ndarray, doc_ids: np.ndarray,
                    chunk_len: int) -> Chunks:
  """Cuts documents, given as one token stream, into chunks with their continuations.

  Args:
    stream: [sum(doc_lengths)] the documents' tokens back to back.
    doc_lengths: [num_docs] tokens of each document.
    doc_ids: [num_docs] the documents' ids.
    chunk_len: m, tokens per chunk.

  Returns:
    Chunks (tokens and continuations in the stream's dtype); a document of L tokens has
    ceil(L / m) chunks, the last one padded.
  """
  chunk_len = _check_chunk_len(chunk_len)
  stream = np.asarray(stream)
  doc_lengths = np.asarray(doc_lengths, np.int64)  # [num_docs]
  doc_ids = np.asarray(doc_ids, np.int64)  # [num_docs]
  if doc_lengths.shape != doc_ids.shape or int(doc_lengths.sum()) != stream.shape[0]:
    raise ValueError(f"doc_lengths ({doc_lengths.shape}, sum {int(doc_lengths.sum())}) and "
                     f"doc_ids ({doc_ids.shape}) do not describe the {stream.shape[0]} tokens")
  counts = -(-doc_lengths // chunk_len)  # [num_docs] chunks per document
  doc_starts = np.cumsum(doc_lengths) - doc_lengths  # [num_docs] offset in the stream
  doc_of_chunk = np.repeat(np.arange(doc_ids.shape[0]), counts)  # [C]
  first_chunk = np.cumsum(counts) - counts  # [num_docs]
  within = np.arange(doc_of_chunk.shape[0]) - first_chunk[doc_of_chunk]  # [C] chunk j of doc
  starts = doc_starts[doc_of_chunk] + within * chunk_len  # [C]
  lengths = np.minimum(chunk_len, doc_lengths[doc_of_chunk] - within * chunk_len)  # [C]
  offsets = np.arange(chunk_len)[None, :]  # [1, m]
  valid = offsets < lengths[:, None]  # [C, m]
  positions = np.minimum(starts[:, None] + offsets, max(stream.shape[0] - 1, 0))  # [C, m]
  tokens = np.where(valid, stream[positions] if stream.size else 0, 0).astype(stream.dtype)
  # The continuation of chunk c is chunk c + 1 when that one is of the same document.
  continuations = np.zeros_like(tokens)  # [C, m]
  same = doc_of_chunk[1:] == doc_of_chunk[:-1]  # [C - 1]
  continuations[:-1][same] = tokens[1:][same]
  return Chunks(tokens=tokens, continuations=continuations, lengths=lengths.astype(np.int32),
                doc_ids=doc_ids[doc_of_chunk])


def _check_sorted_documents(store: BlockStore) -> np.ndarray:
  """[num_blocks] the store's doc ids, which must be non-decreasing (a document's blocks are
  consecutive rows, as `build_block_store` writes them)."""
  doc_ids = np.asarray(store.doc_ids, np.int64)  # [num_blocks]
  if doc_ids.size and np.any(np.diff(doc_ids) < 0):
    bad = int(np.argmax(np.diff(doc_ids) < 0)) + 1
    raise ChunkDatabaseError(f"{store.path}: doc_ids.npy is not in document order (block {bad} "
                             f"has doc {int(doc_ids[bad])} after doc {int(doc_ids[bad - 1])}); "
                             f"a document's text must be consecutive blocks")
  return doc_ids


def _doc_block_range(doc_ids: np.ndarray, doc_range: Optional[tuple[int, int]],
                     path: str) -> tuple[int, int, int, int]:
  """(first doc, end doc, first block, end block) of `doc_range` (default: all documents)."""
  num_docs = int(doc_ids[-1]) + 1 if doc_ids.size else 0
  start, end = (0, num_docs) if doc_range is None else (int(doc_range[0]), int(doc_range[1]))
  if not 0 <= start <= end <= num_docs:
    raise ChunkDatabaseError(f"{path}: doc_range {doc_range} outside [0, {num_docs}]")
  return (start, end, int(np.searchsorted(doc_ids, start, "left")),
          int(np.searchsorted(doc_ids, end, "left")))


def document_stream(store: BlockStore, block_start: int, block_end: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The body tokens of blocks [block_start, block_end), which must be whole documents.

  Returns:
    (stream [T] in the store's token dtype, doc_ids [num_docs] int64, doc_lengths [num_docs]
    int64): the documents' body wordpieces back to back, block after block, without [CLS],
    title or [SEP].
  """
  tokens = np.asarray(store.tokens[block_start:block_end])  # [n, max_block_len]
  titles = np.asarray(store.title_lengths[block_start:block_end], np.int64)[:, None]  # [n, 1]
  bodies = np.asarray(store.body_lengths[block_start:block_end], np.int64)[:, None]  # [n, 1]
  positions = np.arange(store.max_block_len)[None, :]  # [1, max_block_len]
  body = (positions >= titles + 2) & (positions < titles + 2 + bodies)  # [n, max_block_len]
  stream = tokens[body]  # [T], row-major: block order, then position order
  block_docs = np.asarray(store.doc_ids[block_start:block_end], np.int64)  # [n]
  doc_ids, first = np.unique(block_docs, return_index=True)  # sorted input: first blocks
  doc_lengths = np.add.reduceat(bodies[:, 0], first) if first.size else np.zeros(0, np.int64)
  return stream, doc_ids, doc_lengths.astype(np.int64)


def _slabs(doc_ids: np.ndarray, block_start: int, block_end: int,
           slab_blocks: int) -> Iterator[tuple[int, int]]:
  """Block ranges of about `slab_blocks` blocks covering [block_start, block_end), cut only at
  document boundaries (a longer document is a slab of its own)."""
  start = block_start
  while start < block_end:
    end = min(start + slab_blocks, block_end)
    if end < block_end:
      # Back to the start of the document that `end` falls in, unless that empties the slab.
      cut = int(np.searchsorted(doc_ids, doc_ids[end], "left"))
      end = cut if cut > start else int(np.searchsorted(doc_ids, doc_ids[end], "right"))
    yield start, end
    start = end


def chunk_block_store(store: BlockStore, chunk_len: int, *,
                      doc_range: Optional[tuple[int, int]] = None) -> Chunks:
  """Chunks of a BlockStore's documents (all of them, or the ids in `doc_range`), in memory.

  Args:
    store: the BlockStore.
    chunk_len: m, tokens per chunk (RETRO: 64; the toy world: TOY_CHUNK_LEN).
    doc_range: (start, end) document ids to chunk; default: every document.

  Returns:
    Chunks, tokens in the store's token dtype.
  """
  doc_ids = _check_sorted_documents(store)
  _, _, block_start, block_end = _doc_block_range(doc_ids, doc_range, store.path)
  stream, doc_ids, doc_lengths = document_stream(store, block_start, block_end)
  return chunk_documents(stream, doc_lengths, doc_ids, chunk_len)


# ------------------------------------------------------------------------------ keys


def key_inputs(tokens: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """BERT inputs `[CLS] chunk [SEP]` of chunks.

  Args:
    tokens: [n, m] chunk tokens (padding ignored).
    lengths: [n] real tokens per chunk, 1..m.

  Returns:
    (ids, mask), int32 [n, m + 2]: [CLS] at 0, the chunk at 1..len, [SEP] at len + 1, then 0;
    mask 1 on those len + 2 positions.
  """
  tokens = np.asarray(tokens, np.int32)  # [n, m]
  lengths = np.asarray(lengths, np.int32)[:, None]  # [n, 1]
  m = tokens.shape[1]
  positions = np.arange(m + 2, dtype=np.int32)[None, :]  # [1, m + 2]
  body = np.pad(tokens, ((0, 0), (1, 1)))  # [n, m + 2], chunk at 1..m
  ids = np.where((positions >= 1) & (positions <= lengths), body, 0)
  ids = np.where(positions == 0, vocab_lib.CLS_ID, ids)
  ids = np.where(positions == lengths + 1, vocab_lib.SEP_ID, ids).astype(np.int32)
  mask = (positions < lengths + 2).astype(np.int32)  # [n, m + 2]
  return ids, mask


@functools.lru_cache(maxsize=8)
def _key_fn(config: BertConfig, mesh: Mesh) -> Callable:
  """The jitted mean-pooled BERT for one (config, mesh); cached, so one compilation per batch
  shape serves every call."""
  module = BertModel(config)
  batch_sharding = NamedSharding(mesh, P(builder_lib.DATA_AXIS, None))

  def keys(params, ids, mask):
    # ids, mask: [batch, m + 2] -> [batch, hidden] float32.
    hidden, _ = module.apply({"params": params}, ids, jnp.zeros_like(ids), mask,
                             deterministic=True)  # [batch, m + 2, hidden]
    positions = jnp.arange(ids.shape[1])[None, :]  # [1, m + 2]
    lengths = mask.sum(axis=1, keepdims=True) - 2  # [batch, 1] chunk tokens
    # The chunk's tokens only: not [CLS] (0), not [SEP] (len + 1), not padding.
    weights = ((positions >= 1) & (positions <= lengths)).astype(jnp.float32)  # [batch, m + 2]
    total = jnp.einsum("bl,bld->bd", weights, hidden.astype(jnp.float32),
                       precision="highest")  # [batch, hidden]
    return total / jnp.maximum(lengths, 1).astype(jnp.float32)

  return jax.jit(keys, in_shardings=(NamedSharding(mesh, P()), batch_sharding, batch_sharding),
                 out_shardings=batch_sharding)


def bert_params_of(params: Mapping[str, Any]) -> Any:
  """The BertModel params in `params`: either they are, or `params["bert"]` is (the tree
  `convert.hf.load_checkpoint` returns for a BERT)."""
  if "embeddings" not in params and "bert" in params:
    return params["bert"]
  return params


def chunk_keys(params: Mapping[str, Any], config: BertConfig, tokens: np.ndarray,
               lengths: np.ndarray, *, batch_size: int = DEFAULT_BATCH_SIZE,
               mesh: Optional[Mesh] = None) -> np.ndarray:
  """RETRO's keys: the frozen BERT's last hidden states averaged over each chunk's tokens.

  Args:
    params: BertModel params (or a tree with them under "bert", see `bert_params_of`).
    config: the BERT's config; computed in float32 whatever its `dtype`.
    tokens, lengths: [n, m] chunk tokens and [n] real tokens per chunk, 1..m.
    batch_size: chunks per jitted call (rounded up to a multiple of the devices).
    mesh: a 1-D mesh with axis "data"; default: all local devices.

  Returns:
    [n, hidden] float32 keys.
  """
  tokens = np.asarray(tokens)
  lengths = np.asarray(lengths, np.int32)
  if tokens.ndim != 2 or lengths.shape != tokens.shape[:1]:
    raise ValueError(f"tokens must be [n, m] and lengths [n], got {list(tokens.shape)} and "
                     f"{list(lengths.shape)}")
  n, m = tokens.shape
  if n and (lengths.min() < 1 or lengths.max() > m):
    raise ValueError(f"chunk lengths must be in [1, {m}], got [{lengths.min()}, "
                     f"{lengths.max()}]")
  if m + 2 > config.max_position_embeddings:
    raise ValueError(f"chunks of {m} tokens + [CLS] + [SEP] do not fit the BERT's "
                     f"{config.max_position_embeddings} positions")
  if n and int(tokens.max()) >= config.vocab_size:
    raise ValueError(f"token id {int(tokens.max())} is outside the BERT's vocabulary of "
                     f"{config.vocab_size} (chunks of another vocabulary?)")
  config = dataclasses.replace(config, dtype="float32")
  mesh = mesh if mesh is not None else builder_lib.local_mesh()
  num_devices = mesh.devices.size
  batch_size = -(-max(int(batch_size), 1) // num_devices) * num_devices
  fn = _key_fn(config, mesh)
  params = jax.device_put(bert_params_of(params), NamedSharding(mesh, P()))
  out = np.zeros((n, config.hidden_size), np.float32)  # [n, hidden]
  pending = None
  for start in range(0, n, batch_size):
    rows = np.arange(start, min(start + batch_size, n))  # [count]
    padded = np.concatenate([rows, np.full(batch_size - rows.size, rows[-1])])  # [batch]
    ids, mask = key_inputs(tokens[padded], lengths[padded])  # [batch, m + 2] each
    result = fn(params, ids, mask)  # dispatched asynchronously
    if pending is not None:
      out[pending[0]] = np.asarray(pending[1])[:pending[0].size]
    pending = (rows, result)
  if pending is not None:
    out[pending[0]] = np.asarray(pending[1])[:pending[0].size]
  return out


def index_vectors(keys: np.ndarray) -> np.ndarray:
  """[n, d + 1] float32 rows [key, -|key|^2 / 2] of [n, d] keys: the key index's rows, whose
  inner product with `query_vectors` ranks by L2 distance (the module docstring)."""
  keys = np.asarray(keys, np.float32)  # [n, d]
  half_norm = -0.5 * np.square(keys.astype(np.float64)).sum(axis=1, keepdims=True)  # [n, 1]
  return np.concatenate([keys, half_norm.astype(np.float32)], axis=1)


def query_vectors(keys: np.ndarray) -> np.ndarray:
  """[n, d + 1] float32 rows [key, 1] of [n, d] query keys (see `index_vectors`)."""
  keys = np.asarray(keys, np.float32)  # [n, d]
  return np.concatenate([keys, np.ones((keys.shape[0], 1), np.float32)], axis=1)


# ------------------------------------------------------------------------------ publishing



def _check_dest(dest: str, overwrite: bool) -> None:
  """ChunkDatabaseError unless `dest` is free, or `overwrite` and `dest` is a chunk database."""
  if not os.path.lexists(dest):
    return
  if not overwrite:
    raise ChunkDatabaseError(f"{dest}: already exists; pass overwrite=True to replace it")
  try:
    with open(os.path.join(dest, MANIFEST), encoding="utf-8") as f:
      is_database = json.load(f).get("format") == FORMAT_NAME
  except (OSError, ValueError, AttributeError):
    is_database = False
  if os.path.islink(dest) or not is_database:
    raise ChunkDatabaseError(f"{dest}: exists and is not a chunk database; overwrite replaces "
                             f"only a chunk database (remove it yourself, or choose another "
                             f"output)")


def build_chunk_database(store: BlockStore, dest: str, params: Mapping[str, Any],
                         config: BertConfig, *, chunk_len: int = RETRO_CHUNK_LEN,
                         doc_range: Optional[tuple[int, int]] = None,
                         batch_size: int = DEFAULT_BATCH_SIZE, mesh: Optional[Mesh] = None,
                         model: str = "",
                         scann_builder: Optional[Callable[[str, np.ndarray], dict]] = None,
                         overwrite: bool = False) -> str:
  """Chunks a BlockStore, computes the chunks' keys and publishes the database at `dest`.

  Documents are processed in slabs of whole documents (chunked, embedded, streamed into
  memory-mapped staging files), so memory holds one slab, not the corpus.

  Args:
    params, config: the frozen BERT (BertModel params or a tree with them under "bert").
    chunk_len: m (RETRO: 64; the toy world: TOY_CHUNK_LEN).
    doc_range: (start, end) document ids to include; default: every document.
    model: description of the BERT (its directory, say), for the manifests.
    scann_builder: `fn(scann_dir, index_rows) -> dict` writing ScaNN artifacts for the key
      index (e.g. `search.build_scann_artifacts`); none by default (exact search needs none).
    overwrite: replace an existing database at `dest`.
  """
  chunk_len = _check_chunk_len(chunk_len)
  dest = os.path.abspath(os.fspath(dest))
  start_time = time.monotonic()
  doc_ids = _check_sorted_documents(store)
  first_doc, end_doc, block_start, block_end = _doc_block_range(doc_ids, doc_range, store.path)
  bodies = np.asarray(store.body_lengths[block_start:block_end], np.int64)  # [blocks]
  doc_lengths = np.bincount(doc_ids[block_start:block_end] - first_doc, weights=bodies,
                            minlength=end_doc - first_doc).astype(np.int64)  # [docs]
  num_chunks = int((-(-doc_lengths // chunk_len)).sum())
  if num_chunks == 0:
    raise ChunkDatabaseError(f"{store.path}: documents [{first_doc}, {end_doc}) hold no tokens; "
                             f"nothing to chunk")
  _check_dest(dest, overwrite)
  os.makedirs(os.path.dirname(dest), exist_ok=True)
  fileio.remove_stale(os.path.dirname(dest), re.escape(os.path.basename(dest)) + _PRIVATE_SUFFIX)
  token_dtype = np.dtype(store.tokens.dtype)
  hidden = int(config.hidden_size)

  with fileio.staged_directory(dest, f"{os.path.basename(dest)}.staging-") as staging:
    arrays = {
        CHUNK_TOKENS: ((num_chunks, chunk_len), token_dtype),
        CONTINUATION_TOKENS: ((num_chunks, chunk_len), token_dtype),
        CHUNK_LENGTHS: ((num_chunks,), np.dtype(np.int32)),
        DOC_IDS: ((num_chunks,), np.dtype(np.int64)),
    }
    out = {name: np.lib.format.open_memmap(os.path.join(staging, name), mode="w+", dtype=dtype,
                                           shape=shape) for name, (shape, dtype) in arrays.items()}
    with store_lib.IndexWriter(staging, KEY_INDEX_STEP, num_chunks, hidden + 1) as writer:
      row = 0
      for slab_start, slab_end in _slabs(doc_ids, block_start, block_end, _SLAB_BLOCKS):
        stream, slab_docs, slab_lengths = document_stream(store, slab_start, slab_end)
        chunks = chunk_documents(stream, slab_lengths, slab_docs, chunk_len)
        rows = slice(row, row + chunks.num_chunks)
        out[CHUNK_TOKENS][rows] = chunks.tokens
        out[CONTINUATION_TOKENS][rows] = chunks.continuations
        out[CHUNK_LENGTHS][rows] = chunks.lengths
        out[DOC_IDS][rows] = chunks.doc_ids
        keys = chunk_keys(params, config, chunks.tokens, chunks.lengths,
                          batch_size=batch_size, mesh=mesh)  # [slab chunks, hidden]
        writer.write_rows(row, index_vectors(keys))
        row += chunks.num_chunks
        log.info("chunk database: %d/%d chunks", row, num_chunks)
      assert row == num_chunks, (row, num_chunks)  # the count above and the chunking agree
      for array in out.values():
        array.flush()
      del out, array  # unmap before hashing: the files are final now
      index_path = writer.commit(
          block_store_id=store.store_id, checkpoint=model, scann_builder=scann_builder,
          keep=None, extra={"kind": FORMAT_NAME, "chunk_len": chunk_len,
                            "rows": "[key, -|key|^2 / 2]: L2 search by inner product"})
    files = {}
    for name in DATA_FILES:
      path = os.path.join(staging, name)
      fileio.fsync_file(path)
      files[name] = {"bytes": os.path.getsize(path), "sha256": fileio.sha256_file(path)}
    index_manifest = store_lib.load_index(index_path, verify=False).manifest
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "num_chunks": num_chunks,
        "num_documents": int(np.count_nonzero(doc_lengths)),
        "doc_range": [first_doc, end_doc],
        "chunk_len": chunk_len,
        "token_dtype": token_dtype.name,
        "partial_chunks": "padded with 0",
        "block_store_id": store.store_id,
        "vocab_fingerprint": store.vocab_fingerprint,
        "keys": {"model": model, "hidden_size": hidden,
                 "input": "[CLS] chunk [SEP]", "pooling": "mean of the last hidden states over "
                 "the chunk's tokens", "dtype": "float32", "metric": "l2"},
        "key_index": {"path": os.path.relpath(index_path, staging).replace(os.sep, "/"),
                      "sha256": index_manifest["sha256"]},
        "files": files,
        "build_seconds": time.monotonic() - start_time,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "builder": {"python": sys.version.split()[0], "numpy": np.__version__},
    }
    fileio.write_manifest(staging, manifest)
    # Re-open it as a reader will (shapes, dtypes, sizes); the hashes were just computed.
    _open(staging, verify="fast", block_store_id=store.store_id, mmap=True)
    _check_dest(dest, overwrite)  # again: it may have appeared while we built
    fileio.publish_staged(staging, dest, aside_prefix=(
        f"{os.path.basename(dest)}.old-" if overwrite else None))
  log.info("Published chunk database %s (%d chunks of %d tokens).", dest, num_chunks, chunk_len)
  return dest


# ------------------------------------------------------------------------------ reading


@dataclasses.dataclass(frozen=True, eq=False)
class ChunkDatabase:
  """A verified, loaded chunk database (layout: docs/design/data_index_batches.md).

  Attributes:
    chunk_tokens, continuation_tokens: [num_chunks, chunk_len] memmaps.
    chunk_lengths: [num_chunks] int32 memmap.
    doc_ids: [num_chunks] int64 memmap, non-decreasing.
    index: the key index, rows [key, -|key|^2 / 2].
  """

  path: str
  manifest: dict
  chunk_tokens: np.ndarray
  continuation_tokens: np.ndarray
  chunk_lengths: np.ndarray
  doc_ids: np.ndarray
  index: store_lib.LoadedIndex

  @classmethod
  def open(cls, path: str, *, verify: Union[bool, str] = True,
           block_store_id: Optional[str] = None, mmap: bool = True) -> "ChunkDatabase":
    """Opens a published chunk database, refusing anything incomplete, corrupt or unexpected
    (ChunkDatabaseError, its message starting with `path`).

    `verify`: True re-hashes every file against the manifests, "fast" checks sizes only, False
    neither (shapes and dtypes are always checked). `block_store_id`, if given, must be the
    BlockStore it was built from. `mmap`: map the arrays read-only.
    """
    path = os.fspath(path)
    if fileio.private_owner(os.path.basename(os.path.normpath(path)),
                            r".+" + _PRIVATE_SUFFIX) is not None:
      raise ChunkDatabaseError(f"{path}: a staging directory of an unfinished build, not a "
                               f"published chunk database")
    return _open(path, verify=verify, block_store_id=block_store_id, mmap=mmap)

  @property
  def num_chunks(self) -> int:
    return int(self.manifest["num_chunks"])

  @property
  def chunk_len(self) -> int:
    return int(self.manifest["chunk_len"])

  @property
  def block_store_id(self) -> str:
    return self.manifest["block_store_id"]

  @property
  def keys(self) -> np.ndarray:
    """[num_chunks, hidden] float32 the chunks' keys (a view of the index rows)."""
    return self.index.embeddings[:, :-1]

  def document_chunks(self, doc_id: int) -> tuple[int, int]:
    """[start, end) the chunk ids of document `doc_id` (empty if it has none here)."""
    return (int(np.searchsorted(self.doc_ids, doc_id, "left")),
            int(np.searchsorted(self.doc_ids, doc_id, "right")))

  def searcher(self, backend: str = "exact", **kwargs) -> Any:
    """A searcher over the key index (`search.make_searcher`): "exact" by default; "scann"
    loads the index's ScaNN artifacts if it has them, else builds them in memory."""
    artifacts = self.index.scann_dir if backend == "scann" else None
    return search_lib.make_searcher(backend, self.index.embeddings, artifacts_dir=artifacts,
                                    **kwargs)

  def neighbours(self, searcher: Any, query_keys: np.ndarray, k: int, *,
                 exclude_doc_ids: Optional[np.ndarray] = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest chunks (L2 distance of the keys) of each query key ([q, hidden]).

    `exclude_doc_ids`: [q] a document whose chunks the query must not get (RETRO: the training
    sequence's own; -1: none). Exact search with exclusion returns the true k nearest among the
    other documents' chunks.

    Returns:
      (squared L2 distances [q, k] float32, chunk ids [q, k] int32), nearest first; ties by
      lower chunk id (exact search).
    """
    query_keys = np.asarray(query_keys, np.float32)  # [q, hidden]
    queries = query_vectors(query_keys)  # [q, hidden + 1]
    if exclude_doc_ids is None:
      scores, ids = searcher.search(queries, k)
    else:
      scores, ids = search_excluding_documents(searcher, queries, exclude_doc_ids,
                                               self.doc_ids, k)
    # q.x - |x|^2 / 2 = (|q|^2 - |q - x|^2) / 2.
    norms = np.square(query_keys.astype(np.float64)).sum(axis=1, keepdims=True)  # [q, 1]
    distances = np.maximum(norms - 2.0 * scores.astype(np.float64), 0.0)  # [q, k]
    return np.where(ids >= 0, distances, np.inf).astype(np.float32), ids

  def sequence_neighbours(self, searcher: Any, starts: np.ndarray, num_chunks: int,
                          k: int = RETRO_TRAIN_NEIGHBOURS, *,
                          exclude_same_document: bool = True
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours of every chunk of training sequences taken from this database: sequence i is
    chunks starts[i] .. starts[i] + num_chunks - 1 of one document (`training_sequences`), each
    chunk getting k neighbours, none from its document with `exclude_same_document`.

    Returns:
      (squared L2 distances [s, l, k] float32, chunk ids [s, l, k] int32).
    """
    chunk_ids = sequence_chunk_ids(self.doc_ids, starts, num_chunks, self.path)  # [s, l]
    flat = chunk_ids.reshape(-1)  # [s * l]
    exclude = np.asarray(self.doc_ids[flat]) if exclude_same_document else None
    distances, ids = self.neighbours(searcher, np.asarray(self.keys[flat]), k,
                                     exclude_doc_ids=exclude)
    return distances.reshape(*chunk_ids.shape, k), ids.reshape(*chunk_ids.shape, k)

  def neighbour_tokens(self, ids: np.ndarray) -> np.ndarray:
    """RETRO's retrieved values [N, F]: each neighbour's chunk followed by its continuation.

    Args:
      ids: [..., k] chunk ids; -1 (a slot ScaNN could not fill) gives all 0.

    Returns:
      [..., k, 2 * chunk_len] int32.
    """
    ids = np.asarray(ids, np.int64)
    if ids.size and ids.max() >= self.num_chunks:
      raise IndexError(f"{self.path}: chunk id {int(ids.max())} out of range "
                       f"[0, {self.num_chunks})")
    flat = np.maximum(ids.reshape(-1), 0)  # [num]
    values = np.concatenate([np.asarray(self.chunk_tokens[flat], np.int32),
                             np.asarray(self.continuation_tokens[flat], np.int32)],
                            axis=1)  # [num, 2m]
    values[ids.reshape(-1) < 0] = 0
    return values.reshape(*ids.shape, 2 * self.chunk_len)


def _open(path: str, *, verify: Union[bool, str], block_store_id: Optional[str],
          mmap: bool) -> ChunkDatabase:
  fileio.check_verify_mode(verify)

  def fail(problem: str):
    raise ChunkDatabaseError(f"{path}: {problem}")

  manifest = fileio.read_format_manifest(path, MANIFEST, FORMAT_NAME, FORMAT_VERSION,
                                        "chunk database", fail)
  try:
    num_chunks = int(manifest["num_chunks"])
    chunk_len = int(manifest["chunk_len"])
    token_dtype = np.dtype(manifest["token_dtype"])
    hidden = int(manifest["keys"]["hidden_size"])
    files = dict(manifest["files"])
    index_rel = str(manifest["key_index"]["path"])
    index_sha = manifest["key_index"]["sha256"]
    store_id = manifest["block_store_id"]
  except (KeyError, TypeError, ValueError) as e:
    fail(f"{MANIFEST} lacks or has a bad entry: {e!r}")
  if block_store_id is not None and store_id != block_store_id:
    fail(f"built from BlockStore {store_id}, expected {block_store_id}")

  fileio.verify_listed_files(path, files, DATA_FILES, MANIFEST, verify, fail)

  expected = {CHUNK_TOKENS: ((num_chunks, chunk_len), token_dtype),
              CONTINUATION_TOKENS: ((num_chunks, chunk_len), token_dtype),
              CHUNK_LENGTHS: ((num_chunks,), np.dtype(np.int32)),
              DOC_IDS: ((num_chunks,), np.dtype(np.int64))}
  arrays = fileio.load_checked_arrays(path, expected, fail, mmap=mmap)

  try:
    index = store_lib.load_index(os.path.join(path, *index_rel.split("/")),
                                 block_store_id=store_id, num_blocks=num_chunks, dim=hidden + 1,
                                 dtype="float32", verify=verify, mmap=mmap)
  except store_lib.IndexLoadError as e:
    fail(f"key index {index_rel}: {e}")
  if index.manifest["sha256"] != index_sha:
    fail(f"key index {index_rel} is not the one this database was built with (sha256 "
         f"{index.manifest['sha256'][:12]}..., the manifest says {str(index_sha)[:12]}...)")
  return ChunkDatabase(path=path, manifest=manifest, chunk_tokens=arrays[CHUNK_TOKENS],
                       continuation_tokens=arrays[CONTINUATION_TOKENS],
                       chunk_lengths=arrays[CHUNK_LENGTHS], doc_ids=arrays[DOC_IDS],
                       index=index)


# ------------------------------------------------------------------------------ neighbours


def training_sequences(doc_ids: np.ndarray, num_chunks: int) -> np.ndarray:
  """First chunk ids of RETRO training sequences: each document's chunks cut into runs of
  `num_chunks` (l) consecutive chunks, not overlapping; a shorter remainder is not a sequence.

  Args:
    doc_ids: [C] non-decreasing document of each chunk (`ChunkDatabase.doc_ids`).
    num_chunks: l, chunks per sequence.

  Returns:
    [s] int64 first chunk ids, ascending.
  """
  if num_chunks < 1:
    raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
  doc_ids = np.asarray(doc_ids, np.int64)  # [C]
  if doc_ids.size == 0:
    return np.zeros(0, np.int64)
  firsts = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1]])  # [docs] first chunks
  counts = np.diff(np.r_[firsts, doc_ids.size]) // num_chunks  # [docs] sequences per doc
  doc_of_sequence = np.repeat(np.arange(firsts.size), counts)  # [s]
  within = np.arange(doc_of_sequence.size) - (np.cumsum(counts) - counts)[doc_of_sequence]
  return firsts[doc_of_sequence] + within * num_chunks


def sequence_chunk_ids(doc_ids: np.ndarray, starts: np.ndarray, num_chunks: int,
                       where: str = "chunk database") -> np.ndarray:
  """[s, l] the chunk ids of sequences `starts`, each checked to be l chunks of one document.

  Raises:
    ValueError: naming the first sequence that leaves the database or its document.
  """
  starts = np.asarray(starts, np.int64).reshape(-1)  # [s]
  if num_chunks < 1:
    raise ValueError(f"num_chunks must be >= 1, got {num_chunks}")
  ids = starts[:, None] + np.arange(num_chunks)[None, :]  # [s, l]
  outside = (starts < 0) | (ids[:, -1] >= len(doc_ids))  # [s]
  if outside.any():
    i = int(np.argmax(outside))
    raise ValueError(f"{where}: sequence {i} (chunks {int(starts[i])}..+{num_chunks}) is "
                     f"outside [0, {len(doc_ids)})")
  first_docs = np.asarray(doc_ids[starts])  # [s]
  crossing = first_docs != np.asarray(doc_ids[ids[:, -1]])  # [s]; doc ids are sorted
  if crossing.any():
    i = int(np.argmax(crossing))
    raise ValueError(f"{where}: sequence {i} (chunks {int(starts[i])}..+{num_chunks}) crosses "
                     f"from document {int(first_docs[i])} into another; a RETRO training "
                     f"sequence is chunks of one document")
  return ids


def _next_power_of_two(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def search_excluding_documents(searcher: Any, queries: np.ndarray, exclude_doc_ids: np.ndarray,
                               doc_ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """Top-k by the searcher's inner product, never a chunk of the query's excluded document.

  A query whose document has D chunks asks for k + D candidates, rounded up to a power of two
  (so a handful of k values compile), and keeps the first k of other documents: exact when the
  searcher is, since at most D of the true top k + D are removed.

  Args:
    queries: [q, dim] query rows (`query_vectors`).
    exclude_doc_ids: [q] the document each query must not get (-1: none).
    doc_ids: [C] non-decreasing document of each indexed row.

  Returns:
    (scores [q, k] float32, ids [q, k] int32), best first; -1 / -inf where an approximate
    searcher returned too few.
  """
  queries = np.asarray(queries, np.float32)  # [q, dim]
  exclude = np.asarray(exclude_doc_ids, np.int64).reshape(-1)  # [q]
  if exclude.shape[0] != queries.shape[0]:
    raise ValueError(f"exclude_doc_ids has {exclude.shape[0]} entries for {queries.shape[0]} "
                     f"queries")
  num_rows = len(doc_ids)
  same = (np.searchsorted(doc_ids, exclude, "right")
          - np.searchsorted(doc_ids, exclude, "left"))  # [q] excluded rows per query
  if queries.shape[0] and (num_rows - same).min() < k:
    i = int(np.argmin(num_rows - same))
    raise ValueError(f"query {i}: only {num_rows - int(same[i])} chunks are outside document "
                     f"{int(exclude[i])}, fewer than k={k}")
  wanted = np.array([min(num_rows, _next_power_of_two(k + s)) for s in same],
                    np.int64)  # [q] candidates to ask for
  scores = np.full((queries.shape[0], k), -np.inf, np.float32)  # [q, k]
  ids = np.full((queries.shape[0], k), -1, np.int32)  # [q, k]
  for size in np.unique(wanted):
    rows = np.flatnonzero(wanted == size)  # the queries asking for `size` candidates
    cand_scores, cand_ids = searcher.search(queries[rows], int(size))  # [r, size] each
    cand_docs = np.asarray(doc_ids[np.maximum(cand_ids, 0)])  # [r, size]
    keep = (cand_ids >= 0) & (cand_docs != exclude[rows, None])  # [r, size]
    # Kept candidates first, each group in the searcher's (rank) order.
    order = np.argsort(~keep, axis=1, kind="stable")[:, :k]  # [r, k]
    kept = np.take_along_axis(keep, order, axis=1)  # [r, k]
    scores[rows] = np.where(kept, np.take_along_axis(cand_scores, order, axis=1), -np.inf)
    ids[rows] = np.where(kept, np.take_along_axis(cand_ids, order, axis=1), -1)
  return scores, ids


__all__ = [
    "CHUNK_LENGTHS", "CHUNK_TOKENS", "CONTINUATION_TOKENS", "ChunkDatabase",
    "ChunkDatabaseError", "Chunks", "DOC_IDS", "FORMAT_NAME", "FORMAT_VERSION", "MANIFEST",
    "RETRO_CHUNK_LEN", "RETRO_TRAIN_NEIGHBOURS", "TOY_CHUNK_LEN", "bert_params_of",
    "build_chunk_database", "chunk_block_store", "chunk_documents", "chunk_keys",
    "document_stream", "index_vectors", "key_inputs", "query_vectors",
    "search_excluding_documents", "sequence_chunk_ids", "training_sequences",
]
