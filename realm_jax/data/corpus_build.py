"""The corpus build: documents -> sentences packed into blocks -> a published BlockStore.

A block's body is a run of whole sentences of one article, packed greedily as the authors' ORQA
preprocessor does (`orqa/preprocessing/wiki_preprocessor.py`): a sentence joins the current
block while `3 + len(title) + len(block body) + len(sentence) <= max_block_len`. Blocks never
cross articles. Deviations: an over-long sentence is cut into pieces (no wordpiece is lost), an
over-long title skips its document, empty and duplicate documents are counted skips, and each
block keeps its original text (REALM_SPEC 27). With `workers > 1` documents are tokenised in
worker processes and the store is byte for byte that of one process. Why each deviation:
docs/design/data_index_batches.md.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import datetime
import hashlib
import itertools
import json
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import signal
import struct
import sys
import threading
import time
from typing import Callable, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from realm_jax import fileio
from realm_jax import progress as progress_lib
from realm_jax.data import sentences as sentences_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.block_store import (BODY_LENGTHS, DATA_FILES, DEFAULT_MAX_BLOCK_LEN, DOC_IDS,
                                        DOC_KEYS, FORMAT_NAME, FORMAT_VERSION, MANIFEST,
                                        NUM_SPECIAL_TOKENS, TEXT, TEXT_OFFSETS, TITLE_LENGTHS,
                                        TOKENS, UIDS, BlockStore, BlockStoreError,
                                        _uid_from_bytes, token_dtype_for)
from realm_jax.data.sources import (BAD_INPUT_REASONS, BadRecord, CorpusInputError, Document,
                                    SourceItem)

DEFAULT_MAX_TITLE_LEN = 64
# Skips of well-formed input: a property of the data, always counted (malformed input is
# `sources.BAD_INPUT_REASONS`).
DATA_SKIP_REASONS = ("empty", "title_too_long", "duplicate")
SKIP_EXAMPLES_PER_REASON = 5


# ------------------------------------------------------------------------------ packing


def pack_sentences(sentence_lengths: Sequence[int], budget: int,
                   word_starts: Optional[Sequence[bool]] = None) -> list[tuple[int, int]]:
  """Greedy packing of an article's sentences into blocks of at most `budget` body tokens
  (`max_block_len - 3 - title_len`).

  `word_starts`: optional [num_tokens] flags, True where a token is not a `##` continuation, to
  cut an over-long sentence between words when possible. Returns [(start, end)] half-open ranges
  over the concatenated body tokens, one per block, covering every token in order.
  """
  if budget < 1:
    raise ValueError(f"budget must be >= 1, got {budget}")
  blocks = []
  block_start = 0  # first token of the open block
  position = 0  # tokens consumed so far
  for length in sentence_lengths:
    if length <= 0:
      continue
    if position - block_start + length <= budget:
      position += length
      continue
    if position > block_start:  # close the open block; this sentence starts the next
      blocks.append((block_start, position))
      block_start = position
    sentence_end = position + length
    while sentence_end - block_start > budget:  # only for a sentence longer than the budget
      cut = block_start + budget
      if word_starts is not None:
        # The last word start in (block_start, block_start + budget]; else cut mid-word.
        for candidate in range(block_start + budget, block_start, -1):
          if word_starts[candidate]:
            cut = candidate
            break
      blocks.append((block_start, cut))
      block_start = cut
    position = sentence_end
  if position > block_start:
    blocks.append((block_start, position))
  return blocks


# ------------------------------------------------------------------------------ writing


_NPY_HEADER_BYTES = 128  # fixed, so the header can be rewritten in place once the shape is known


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
  """A version-1.0 .npy header padded to exactly _NPY_HEADER_BYTES."""
  body = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (np.dtype(dtype).str,
                                                                      tuple(shape))
  prefix = b"\x93NUMPY\x01\x00"
  body_len = _NPY_HEADER_BYTES - len(prefix) - 2
  if len(body) + 1 > body_len:
    raise ValueError(f"npy header too long for shape {shape}")
  return prefix + struct.pack("<H", body_len) + (body.ljust(body_len - 1) + "\n").encode("latin1")


class _NpyAppender:
  """Streams rows into a .npy file; the header's shape is fixed up by `close()`."""

  def __init__(self, path: str, dtype, row_shape: tuple[int, ...] = (), chunk_rows: int = 4096):
    self.path = path
    self.dtype = np.dtype(dtype)
    self.row_shape = tuple(row_shape)
    self.rows = 0
    self._file = open(path, "wb")
    self._file.write(_npy_header(self.dtype, (0,) + self.row_shape))
    # [chunk_rows, *row_shape] rows waiting to be written.
    self._buffer = np.zeros((chunk_rows,) + self.row_shape, self.dtype)
    self._pending = 0

  def append(self, value) -> None:
    self._buffer[self._pending] = value
    self._pending += 1
    if self._pending == len(self._buffer):
      self.flush()

  def append_prefix(self, values: Sequence[int]) -> None:
    """Appends a row whose first len(values) entries are `values`, the rest 0 (padding)."""
    self._buffer[self._pending, :len(values)] = values
    self._pending += 1
    if self._pending == len(self._buffer):
      self.flush()

  def next_row(self) -> np.ndarray:
    """The next row (zeros), to fill in place and then `commit()`."""
    return self._buffer[self._pending]

  def commit(self) -> None:
    self._pending += 1
    if self._pending == len(self._buffer):
      self.flush()

  def flush(self) -> None:
    if self._pending:
      self._file.write(self._buffer[:self._pending].tobytes())
      self.rows += self._pending
      self._buffer[:self._pending] = 0  # padding must be zero for the next rows
      self._pending = 0
    self._file.flush()

  def close(self) -> None:
    self.flush()
    self._file.seek(0)
    self._file.write(_npy_header(self.dtype, (self.rows,) + self.row_shape))
    self._file.flush()
    os.fsync(self._file.fileno())
    self._file.close()

  def abort(self) -> None:
    self._file.close()


class _StagingWriter:
  """Writes the BlockStore arrays and texts incrementally into a staging directory."""

  def __init__(self, directory: str, max_block_len: int, token_dtype: np.dtype,
               store_options_json: bytes):
    self.directory = directory
    self.max_block_len = max_block_len
    join = lambda name: os.path.join(directory, name)  # noqa: E731
    self.tokens = _NpyAppender(join(TOKENS), token_dtype, (max_block_len,), chunk_rows=1024)
    self.title_lengths = _NpyAppender(join(TITLE_LENGTHS), np.int32)
    self.body_lengths = _NpyAppender(join(BODY_LENGTHS), np.int32)
    self.uids = _NpyAppender(join(UIDS), np.uint64)
    self.doc_ids = _NpyAppender(join(DOC_IDS), np.int64)
    self.text_offsets = _NpyAppender(join(TEXT_OFFSETS), np.int64)
    self._appenders = [self.tokens, self.title_lengths, self.body_lengths, self.uids,
                       self.doc_ids, self.text_offsets]
    self._text = open(join(TEXT), "wb")
    self._text_buffer = bytearray()
    self._text_size = 0
    self.text_offsets.append(0)
    self.num_blocks = 0
    # store_id = sha256(options JSON + "\n" + uids as little-endian uint64), streamed.
    self._store_hash = hashlib.sha256(store_options_json + b"\n")

  def add(self, title_ids: Sequence[int], body_ids: Sequence[int], title: bytes, body: bytes,
          doc_id: int, uid: Optional[int] = None) -> int:
    """Appends one block; returns its uid (`_uid_from_bytes(title, body)`, unless given)."""
    t, b = len(title_ids), len(body_ids)
    assert t + b + NUM_SPECIAL_TOKENS <= self.max_block_len, (t + b + 3, self.max_block_len)
    if uid is None:
      uid = _uid_from_bytes(title, body)
    # [CLS] title [SEP] body [SEP], written into the (zero-padded) row in place.
    row = self.tokens.next_row()
    row[0] = vocab_lib.CLS_ID
    row[1:1 + t] = title_ids
    row[1 + t] = vocab_lib.SEP_ID
    row[2 + t:2 + t + b] = body_ids
    row[2 + t + b] = vocab_lib.SEP_ID
    self.tokens.commit()
    self.title_lengths.append(len(title_ids))
    self.body_lengths.append(len(body_ids))
    self.uids.append(uid)
    self.doc_ids.append(doc_id)
    self._text_buffer += title
    self.text_offsets.append(self._text_size + len(self._text_buffer))
    self._text_buffer += body
    self.text_offsets.append(self._text_size + len(self._text_buffer))
    if len(self._text_buffer) >= 4 << 20:
      self._flush_text()
    self._store_hash.update(uid.to_bytes(8, "little"))
    self.num_blocks += 1
    return uid

  def _flush_text(self) -> None:
    self._text.write(self._text_buffer)
    self._text_size += len(self._text_buffer)
    self._text_buffer = bytearray()

  def close(self) -> str:
    """Flushes, fixes the .npy headers, fsyncs every file; returns the store_id."""
    for appender in self._appenders:
      appender.close()
    self._flush_text()
    self._text.flush()
    os.fsync(self._text.fileno())
    self._text.close()
    return self._store_hash.hexdigest()

  def abort(self) -> None:
    for appender in self._appenders:
      appender.abort()
    self._text.close()


class _UInt64Set:
  """A set of 64-bit hashes in a NumPy open-addressing table (8-24 bytes per key).

  A Python set of ints costs about 70 bytes per key (450 MB for all of Wikipedia's articles);
  this keeps duplicate detection within a bounded, small footprint.
  """

  def __init__(self, capacity: int = 1 << 16):
    self._table = np.zeros(capacity, np.uint64)  # 0 marks an empty slot
    self._mask = capacity - 1
    self._size = 0

  def __len__(self) -> int:
    return self._size

  def add(self, key: int) -> bool:
    """Adds `key`; returns False if it was already present."""
    key = key or 1  # 0 is the empty marker; merging keys 0 and 1 costs nothing in practice
    if self._insert(key):
      self._size += 1
      if 2 * self._size > len(self._table):
        self._grow()
      return True
    return False

  def _insert(self, key: int) -> bool:
    table, mask = self._table, self._mask
    slot = key & mask
    while True:
      value = int(table[slot])
      if value == 0:
        table[slot] = key
        return True
      if value == key:
        return False
      slot = (slot + 1) & mask

  def _grow(self) -> None:
    keys = self._table[self._table != 0].tolist()
    self._table = np.zeros(2 * len(self._table), np.uint64)
    self._mask = len(self._table) - 1
    for key in keys:
      self._insert(key)


def clean_stale_staging(dest: str) -> list[str]:
  """Removes staging/old directories left next to `dest` by builds that died.

  A leftover is `<dest>.staging-<host>-<pid>-<random>` (or `.old-...`) whose host is this host
  and whose process no longer runs. Directories of live builds, or of other hosts (a shared
  filesystem), are left alone.

  Returns:
    The removed paths.
  """
  dest = os.path.abspath(dest)
  return fileio.remove_stale(os.path.dirname(dest),
                             re.escape(os.path.basename(dest)) + r"\.(?:staging|old)-")


# A module name, not a direct fileio call, so that tests can inject a fault here.
_write_manifest = fileio.write_manifest


def _check_dest(dest: str, overwrite: bool) -> None:
  """Raises BlockStoreError unless `dest` is free, or `overwrite` and `dest` is a BlockStore
  (never a file or a directory that is not one)."""
  if not os.path.lexists(dest):
    return
  if not overwrite:
    raise BlockStoreError(f"{dest}: already exists; pass overwrite=True (--overwrite) to "
                          f"replace it")
  if os.path.islink(dest) or not os.path.isdir(dest):
    raise BlockStoreError(f"{dest}: exists and is not a directory; overwrite replaces only a "
                          f"BlockStore (remove it yourself, or choose another output)")
  if not os.path.isfile(os.path.join(dest, MANIFEST)):
    raise BlockStoreError(f"{dest}: not a BlockStore (no {MANIFEST}); overwrite replaces only "
                          f"a BlockStore (remove it yourself, or choose another output)")


def _publish(staging: str, dest: str, overwrite: bool) -> None:
  """Renames the verified staging directory to `dest` (atomically when dest does not exist)."""
  _check_dest(dest, overwrite)  # again: it may have changed while the store was built
  # A directory cannot be replaced in one rename: an old store is moved aside first. dest is
  # briefly absent, but it never names a half-written store.
  fileio.publish_staged(staging, dest, aside_prefix=(
      f"{os.path.basename(dest)}.old-" if overwrite else None))


# ------------------------------------------------------------------------------ tokenising


# Documents are tokenised in chunks of at most this many documents or characters: one batch
# call per chunk (so per-call costs are paid per chunk), and the unit of work of a worker.
CHUNK_DOCS = 128
CHUNK_CHARS = 1 << 20
# Chunks handed to the workers ahead of the writer, per worker (memory stays bounded).
CHUNKS_AHEAD_PER_WORKER = 2

# What the analysis of one document says (the first element of its result tuple).
_EMPTY, _TITLE_TOO_LONG, _TITLE_MISMATCH, _BODY_MISMATCH, _BLOCKS = range(5)
# The record's own token ids that differ from ours, by result kind: which part of the document.
_MISMATCHED = {_TITLE_MISMATCH: "title", _BODY_MISMATCH: "body"}


def default_workers() -> int:
  """The CPU cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


@dataclasses.dataclass
class _Analyzer:
  """Tokenises and packs documents: everything of a build but its bookkeeping and writing.

  Pure (the same documents give the same result in any process), so that chunks can go to
  worker processes and come back in order while one writer keeps the one-process order and
  counts.
  """

  vocab: vocab_lib.WordPieceVocabulary
  max_block_len: int
  max_title_len: int
  record_token_ids: str
  sentence_splitter: Callable[[str], list[tuple[int, int]]]

  def __call__(self, docs: Sequence[tuple]) -> "_ChunkResult":
    """Analyses (title, text, is_block, title_token_ids, body_token_ids) documents.

    Returns:
      One result tuple per document up to the first that raised, and that error (the
      one-process build stopped there); the chunk's tokens and blocks.
    """
    results: list = [(_EMPTY,)] * len(docs)
    stop, error = len(docs), None
    texts = []
    for i, (title, text, *_) in enumerate(docs):
      try:
        texts.append((title.strip(), text.strip()))
      except Exception as e:  # pylint: disable=broad-except
        stop, error = i, e
        break
    todo = [i for i, (_, text) in enumerate(texts) if text]
    titles = self._tokenize([texts[i][0] for i in todo], encode=True)
    survivors = []  # (index, title ids, title bytes, text bytes, sentence spans)
    for i, title_ids in zip(todo, titles):
      title, text = texts[i]
      _, _, is_block, title_token_ids, _ = docs[i]
      if len(title_ids) > self.max_title_len:
        results[i] = (_TITLE_TOO_LONG, len(title_ids))
        continue
      if is_block and self.record_token_ids == "verify" and title_token_ids is not None \
          and list(title_token_ids) != title_ids:
        results[i] = (_TITLE_MISMATCH,)
        continue
      try:
        title_bytes, text_bytes = title.encode("utf-8"), text.encode("utf-8")
        spans = None if is_block else self.sentence_splitter(text)
      except Exception as e:  # pylint: disable=broad-except
        stop, error = i, e
        break
      survivors.append((i, title_ids, title_bytes, text_bytes, spans))
    try:
      bodies = self._tokenize([texts[i][1] for i, *_ in survivors])
    except Exception:  # pylint: disable=broad-except
      bodies = None  # find the document that raises, one by one
    chunk = _ChunkResult([], [], [])
    for k, (i, title_ids, title_bytes, text_bytes, spans) in enumerate(survivors):
      try:
        body = bodies[k] if bodies is not None else self._tokenize([texts[i][1]])[0]
        results[i] = self._pack(docs[i], title_ids, title_bytes, text_bytes, spans, body, chunk)
      except Exception as e:  # pylint: disable=broad-except
        stop, error = i, e
        break
    chunk.docs = results[:stop]
    chunk.error = None if error is None else _picklable(error)
    return chunk.finish()

  def _tokenize(self, texts: list[str], encode: bool = False) -> list:
    """Per text: ids (`encode`) or (ids, starts, limits) arrays, in one batch call."""
    try:
      batch = self.vocab.tokenize_batch(texts)
    except UnicodeEncodeError:  # lone surrogates: the reference's `encode` drops them
      if encode:
        return [self.vocab.encode(t) for t in texts]
      raise
    if encode:
      return [ids.tolist() for ids in np.split(batch.ids, batch.bounds[1:-1])]
    return [batch.item(i) for i in range(len(batch))]

  def _pack(self, doc, title_ids, title_bytes, text_bytes, spans, body, chunk) -> tuple:
    """The result of one document that reached tokenisation, its blocks added to `chunk`."""
    _, _, is_block, title_token_ids, body_token_ids = doc
    budget = self.max_block_len - NUM_SPECIAL_TOKENS - len(title_ids)
    mismatches = truncated = oversize = 0
    if is_block:
      # One record, one block: the body tokenised whole.
      ids, starts, limits = body
      if body_token_ids is not None and list(body_token_ids) != ids.tolist():
        if self.record_token_ids == "verify":
          return (_BODY_MISMATCH,)
        mismatches += 1
      if title_token_ids is not None and list(title_token_ids) != title_ids:
        mismatches += 1  # only reachable with record_token_ids="ours"
      if len(ids) > budget:  # as the authors' featurize_document: truncate
        truncated = 1
      ranges = [(0, min(len(ids), budget))] if len(ids) else []
    else:
      ids, starts, limits, lengths = self._sentences(text_bytes, spans, body)
      oversize = int(np.count_nonzero(lengths > budget))
      word_starts = self.vocab.word_start_table[ids] if oversize else None
      ranges = pack_sentences(lengths.tolist(), budget, word_starts)
    first_block = len(chunk.blocks)
    for begin, end in ranges:
      start, limit = int(starts[begin]), int(limits[end - 1])
      chunk.blocks.append((chunk.num_tokens, end - begin, start, limit))
      # Hashed here, not by the one writer: its time bounds a build with many workers.
      chunk.uids.append(_uid_from_bytes(title_bytes, text_bytes[start:limit]))
      chunk.tokens.append(ids[begin:end])
      chunk.num_tokens += end - begin
    return (_BLOCKS, title_ids, (mismatches, truncated, oversize), first_block, len(ranges),
            _uid_from_bytes(title_bytes, text_bytes))

  def _sentences(self, text_bytes: bytes, spans, body):
    """(ids, starts, limits, [num_sentences] wordpieces per sentence) of the sentences.

    As if each sentence were tokenised alone (what the build does by definition), but read
    off the whole text's tokens when that is provably the same: every token lies inside a
    sentence and each sentence starts a word; else each sentence is tokenised alone.
    """
    spans = np.asarray(spans, np.int64).reshape(-1, 2)
    lengths = _sentence_lengths(spans, text_bytes, body, self.vocab.word_start_table)
    if lengths is not None:
      if len(spans) == 0:
        return (np.zeros(0, np.int32),) + (np.zeros(0, np.int64),) * 2 + (lengths,)
      return (*body, lengths)
    sentences = [text_bytes[start:limit].decode("utf-8") for start, limit in spans.tolist()]
    batch = self.vocab.tokenize_batch(sentences)
    shift = np.repeat(spans[:, 0], np.diff(batch.bounds))
    return batch.ids, batch.starts + shift, batch.limits + shift, np.diff(batch.bounds)


def _sentence_lengths(spans: np.ndarray, text_bytes: bytes, body, word_start_table
                      ) -> Optional[np.ndarray]:
  """Wordpieces per sentence read off the whole text's tokens, or None where that could differ
  from tokenising each sentence alone.

  Both encoders work character by character and split words only at whitespace and
  punctuation, so a sentence that starts and ends at word boundaries has exactly the whole
  text's tokens inside it. A sentence boundary inside a word shows as a token crossing it, as a
  token outside every sentence, or as a sentence whose first token continues a word ("##").
  """
  ids, starts, limits = body
  if len(spans) == 0:
    return np.zeros(0, np.int64) if len(ids) == 0 else None
  span_starts, span_limits = spans[:, 0], spans[:, 1]
  # In order, inside the text, on character boundaries (else slicing and decoding them, as the
  # reference does, may behave otherwise).
  ends = np.concatenate([span_starts, span_limits])
  if (span_starts > span_limits).any() or (span_starts[1:] < span_limits[:-1]).any() or \
      span_starts[0] < 0 or span_limits[-1] > len(text_bytes):
    return None
  raw = np.frombuffer(text_bytes + b"\0", np.uint8)
  if ((raw[ends] & 0xC0) == 0x80).any():
    return None
  # [num_tokens] the sentence each token would belong to.
  sentence = np.searchsorted(span_starts, starts, side="right") - 1
  if len(ids) and (sentence[0] < 0 or (limits > span_limits[sentence]).any()):
    return None
  lengths = np.bincount(sentence, minlength=len(spans)) if len(ids) else np.zeros(
      len(spans), np.int64)
  firsts = (np.cumsum(lengths) - lengths)[lengths > 0]
  if not word_start_table[ids[firsts]].all():
    return None
  return lengths


@dataclasses.dataclass
class _ChunkResult:
  """Per document: its result tuple; the blocks' body tokens, flat; per block: first token,
  number of tokens, byte start and limit of its body in the document's stripped text, and
  its uid."""

  docs: list
  tokens: Union[list, np.ndarray]
  blocks: Union[list, np.ndarray]
  error: Optional[BaseException] = None
  num_tokens: int = 0
  uids: list = dataclasses.field(default_factory=list)  # per block: its content uid

  def finish(self) -> "_ChunkResult":
    """Flat arrays (pickle fast) instead of lists."""
    self.tokens = (np.concatenate(self.tokens) if self.tokens else np.zeros(0, np.int32))
    self.blocks = np.array(self.blocks, np.int64).reshape(-1, 4)
    return self


def _picklable(error: Exception) -> Exception:
  """`error`, or one that says the same and survives the trip back from a worker."""
  try:
    pickle.loads(pickle.dumps(error))
    return error
  except Exception:  # pylint: disable=broad-except
    return RuntimeError(f"{type(error).__name__}: {error}")


@dataclasses.dataclass
class _Chunk:
  """Source items in order, each Document with its (title, text, is_block, title_token_ids,
  body_token_ids); `error`: what the source raised after them (raised once they are built);
  `fractions`: the source's fraction_done() before and after reading them."""

  items: list
  documents: list
  error: Optional[Exception] = None
  fractions: tuple = (None, None)

  def fraction_done(self, done: int) -> Optional[float]:
    """The source's fraction_done() when `done` of the items had been read (interpolated: the
    source is read ahead of the writer)."""
    before, after = self.fractions
    if before is None or after is None:
      return after
    return before + (after - before) * done / max(1, len(self.items))


def _read_chunks(items: Iterator[SourceItem], fraction_done: Callable[[], Optional[float]]
                 ) -> Iterator[_Chunk]:
  chunk = _Chunk([], [], fractions=(fraction_done(), None))
  chars = 0
  try:
    for item in items:
      if not isinstance(item, BadRecord):
        document = (item.title, item.text, item.is_block, item.title_token_ids,
                    item.body_token_ids)
        chars += sum(len(x) for x in document[:2] if isinstance(x, str))
        chunk.documents.append(document)
      chunk.items.append(item)
      if len(chunk.items) >= CHUNK_DOCS or chars >= CHUNK_CHARS:
        after = fraction_done()
        chunk.fractions = (chunk.fractions[0], after)
        yield chunk
        chunk = _Chunk([], [], fractions=(after, None))
        chars = 0
  except Exception as e:  # pylint: disable=broad-except
    # The source failed (or gave something that is not a document): what came before it is
    # built first, as in a build that takes one document at a time.
    chunk.error = e
  if chunk.items or chunk.error is not None:
    chunk.fractions = (chunk.fractions[0], fraction_done())
    yield chunk


_worker_analyzer: Optional[_Analyzer] = None


def _init_worker(analyzer: _Analyzer) -> None:
  global _worker_analyzer  # pylint: disable=global-statement
  # The parent handles Ctrl-C: it stops reading, lets the running chunks finish and shuts the
  # workers down.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  # A killed parent cannot shut the pool down, and a worker waiting for work would wait
  # forever (it holds the queue's other end itself): leave with the parent.
  parent = multiprocessing.parent_process()
  if parent is not None:
    threading.Thread(target=_exit_when_ready, args=(parent.sentinel,), daemon=True).start()
  # One thread per process: the workers already fill the cores.
  os.environ["TOKENIZERS_PARALLELISM"] = "false"
  _worker_analyzer = analyzer


def _exit_when_ready(sentinel) -> None:
  multiprocessing.connection.wait([sentinel])
  os._exit(1)


def _analyze_in_worker(documents: list) -> _ChunkResult:
  return _worker_analyzer(documents)


def _analyzed_chunks(chunks: Iterator[_Chunk], analyzer: _Analyzer, workers: int
                     ) -> Iterator[tuple[_Chunk, _ChunkResult]]:
  """(chunk, its analysis), in order; with workers > 1 chunks are analysed ahead, in
  `workers` processes (started only for an input of more than one chunk)."""
  if workers > 1:
    head = list(itertools.islice(chunks, 2))
    chunks = itertools.chain(head, chunks)
    if len(head) == 2 and head[0].error is None:
      yield from _analyzed_in_workers(chunks, analyzer, workers)
      return
  for chunk in chunks:
    yield chunk, analyzer(chunk.documents)


def _analyzed_in_workers(chunks: Iterator[_Chunk], analyzer: _Analyzer, workers: int
                         ) -> Iterator[tuple[_Chunk, _ChunkResult]]:
  # "spawn": the parent may have imported JAX or TensorFlow, whose threads make fork unsafe.
  pool = concurrent.futures.ProcessPoolExecutor(
      max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
      initializer=_init_worker, initargs=(analyzer,))
  pending: collections.deque = collections.deque()
  try:
    for chunk in chunks:
      pending.append((chunk, pool.submit(_analyze_in_worker, chunk.documents)))
      while len(pending) >= workers * CHUNKS_AHEAD_PER_WORKER:
        chunk, future = pending.popleft()
        yield chunk, future.result()
    while pending:
      chunk, future = pending.popleft()
      yield chunk, future.result()
  finally:
    pool.shutdown(wait=True, cancel_futures=True)


def _check_picklable(analyzer: _Analyzer) -> None:
  try:
    pickle.dumps(analyzer)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f"workers > 1 sends the vocabulary and sentence_splitter to worker processes, but they "
        f"cannot be pickled ({type(e).__name__}: {e}); pass a module-level function as "
        f"sentence_splitter, or workers=1") from e


# ------------------------------------------------------------------------------ building


@dataclasses.dataclass
class BuildProgress:
  """Progress of a running build (passed to the `progress` callback every few seconds)."""

  documents_read: int
  documents_used: int
  blocks_written: int
  elapsed_s: float
  fraction_done: Optional[float]

  @property
  def eta_s(self) -> Optional[float]:
    return progress_lib.eta_seconds(self.documents_read, None, self.elapsed_s,
                                    fraction=self.fraction_done)

  def line(self) -> str:
    # The share done is of the input's bytes, so the documents read have no total.
    return progress_lib.line("documents read", self.documents_read, None, self.elapsed_s,
                             unit="documents", fraction=self.fraction_done,
                             extras=[f"{self.blocks_written:,} blocks written"])


@dataclasses.dataclass
class BuildReport:
  """What a build did.

  Attributes:
    path: the published BlockStore directory.
    store_id: content fingerprint of the store.
    num_blocks: blocks written.
    counts: documents_read, documents_used, blocks, skipped (by reason), oversize_sentences,
      truncated_records, token_mismatches, removed_leftovers.
    skip_examples: reason -> the first few messages.
    elapsed_s: wall time of the build.
  """

  path: str
  store_id: str
  num_blocks: int
  counts: dict
  skip_examples: dict
  elapsed_s: float

  def summary_lines(self) -> list[str]:
    c = self.counts
    lines = [f"BlockStore written to {self.path}",
             f"  store_id {self.store_id}",
             f"  {c['documents_read']:,} documents read, {c['documents_used']:,} used, "
             f"{self.num_blocks:,} blocks in {progress_lib.format_duration(self.elapsed_s)}",
             f"  oversize sentences split: {c['oversize_sentences']:,}; records truncated: "
             f"{c['truncated_records']:,}; token-id mismatches kept: {c['token_mismatches']:,}"]
    skipped = {k: v for k, v in c["skipped"].items() if v}
    lines.append(f"  skipped: {sum(skipped.values()):,}" + (
        " (" + ", ".join(f"{k} {v:,}" for k, v in sorted(skipped.items())) + ")"
        if skipped else ""))
    for reason in sorted(skipped):
      for example in self.skip_examples.get(reason, []):
        lines.append(f"    {reason}: {example}")
    return lines


def _canonical_json(obj) -> bytes:
  return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")


def build_block_store(source: Iterable[SourceItem], dest: str, *,
                      vocab: Optional[vocab_lib.WordPieceVocabulary] = None,
                      max_block_len: int = DEFAULT_MAX_BLOCK_LEN,
                      max_title_len: Optional[int] = None,
                      on_error: str = "raise",
                      limit: Optional[int] = None,
                      record_token_ids: str = "verify",
                      overwrite: bool = False,
                      progress: Optional[Callable[[BuildProgress], None]] = None,
                      progress_interval_s: float = 5.0,
                      sentence_splitter: Callable[[str], list[tuple[int, int]]] = (
                          sentences_lib.split_sentences),
                      workers: int = 1) -> BuildReport:
  """Builds a BlockStore at `dest` from documents, streaming and atomically.

  Everything is written into `<dest>.staging-<host>-<pid>-<random>` (arrays appended in chunks, so
  memory stays bounded), fsynced, hashed, re-opened and checked, the manifest last, then renamed to
  `dest`: an interrupted build leaves no `dest`.

  Args:
    source: a `JsonlSource`/`TfdsSource`/`RealmSource` or any iterable of Document/BadRecord.
    max_block_len: wordpieces per block including [CLS]/[SEP]/[SEP] (REALM: 288).
    max_title_len: longest title kept (default min(64, max_block_len - 4)); longer ones skip the
      document (`title_too_long`).
    on_error: "raise" stops at the first malformed record with CorpusInputError; "skip" counts it.
    record_token_ids: for records carrying token ids: "verify" (a mismatch is bad input) or
      "ours" (keep our tokens, count `token_mismatches`).
    sentence_splitter: text -> byte spans of its sentences.
    workers: processes that tokenise documents (`default_workers()`: this machine's cores); the
      output is that of workers=1. With workers > 1, `vocab` and `sentence_splitter` must pickle.
  """
  max_title_len = _check_build_options(max_block_len, max_title_len, on_error, record_token_ids,
                                       workers)
  vocab = vocab or vocab_lib.default_vocabulary()
  analyzer = _Analyzer(vocab, max_block_len, max_title_len, record_token_ids, sentence_splitter)
  if workers > 1:
    _check_picklable(analyzer)
  dest, removed = _prepare_dest(dest, overwrite)

  start_time = time.monotonic()
  token_dtype = token_dtype_for(vocab.vocab_size)
  store_options = {"format_version": FORMAT_VERSION, "max_block_len": max_block_len,
                   "max_title_len": max_title_len, "vocab_fingerprint": vocab.fingerprint}
  log = _BuildLog(on_error, len(removed))
  fraction_done = getattr(source, "fraction_done", lambda: None)

  sink = None
  with fileio.staged_directory(dest, f"{os.path.basename(dest)}.staging-") as staging:
    try:
      sink = _DocumentSink(staging, max_block_len, token_dtype, _canonical_json(store_options),
                           max_title_len, log)
      reporter = _ProgressReporter(progress, progress_interval_s, log.counts, fraction_done,
                                   start_time)
      items = iter(source) if limit is None else itertools.islice(source, limit)
      _write_documents(_analyzed_chunks(_read_chunks(items, fraction_done), analyzer, workers),
                       log, sink, reporter)
      _check_some_blocks(source, log.counts)
      store_id = sink.close_blocks()
      reporter.report()
      any_key = sink.close_keys()
      manifest = _build_manifest(
          staging, source=source, log=log, store_id=store_id, store_options=store_options,
          vocab=vocab, token_dtype=token_dtype, any_key=any_key,
          options={"max_block_len": max_block_len, "max_title_len": max_title_len,
                   "on_error": on_error, "limit": limit, "record_token_ids": record_token_ids})
      _write_manifest(staging, manifest)
      # Re-open what we wrote (sizes, shapes, dtypes, offsets); hashes were just computed.
      BlockStore.open(staging, verify="fast", vocab_fingerprint=vocab.fingerprint).close()
      _publish(staging, dest, overwrite)
    except BaseException:  # close the files; leaving the block removes staging
      if sink is not None:
        sink.abort()
      raise

  return BuildReport(path=dest, store_id=store_id, num_blocks=log.counts["blocks"],
                     counts=log.counts, skip_examples=log.skip_examples,
                     elapsed_s=time.monotonic() - start_time)


def _check_build_options(max_block_len: int, max_title_len: Optional[int], on_error: str,
                         record_token_ids: str, workers: int) -> int:
  """Raises ValueError for a bad option; returns max_title_len, its default filled in."""
  if on_error not in ("raise", "skip"):
    raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
  if record_token_ids not in ("verify", "ours"):
    raise ValueError(f"record_token_ids must be 'verify' or 'ours', got {record_token_ids!r}")
  if workers < 1:
    raise ValueError(f"workers must be >= 1, got {workers}")
  if max_title_len is None:
    max_title_len = min(DEFAULT_MAX_TITLE_LEN, max_block_len - NUM_SPECIAL_TOKENS - 1)
  if max_title_len < 0 or max_block_len - NUM_SPECIAL_TOKENS - max_title_len < 1:
    raise ValueError(f"max_title_len={max_title_len} leaves no room for a body in "
                     f"max_block_len={max_block_len} (need max_title_len <= max_block_len - 4)")
  return max_title_len


def _prepare_dest(dest: str, overwrite: bool) -> tuple[str, list[str]]:
  """(dest as an absolute path, the leftovers of dead builds removed next to it), once `dest`
  is known free (or a BlockStore to overwrite) and its parent exists."""
  dest = os.path.abspath(os.fspath(dest))
  _check_dest(dest, overwrite)
  os.makedirs(os.path.dirname(dest), exist_ok=True)
  return dest, clean_stale_staging(dest)


class _BuildLog:
  """A build's counts and the first few messages of each skip reason."""

  def __init__(self, on_error: str, removed_leftovers: int):
    self.on_error = on_error
    self.counts = {"documents_read": 0, "documents_used": 0, "blocks": 0,
                   "skipped": {reason: 0 for reason in BAD_INPUT_REASONS + DATA_SKIP_REASONS},
                   "oversize_sentences": 0, "truncated_records": 0, "token_mismatches": 0,
                   "removed_leftovers": removed_leftovers}
    self.skip_examples: dict[str, list[str]] = {}

  def skip(self, reason: str, message: str) -> None:
    self.counts["skipped"][reason] = self.counts["skipped"].get(reason, 0) + 1
    examples = self.skip_examples.setdefault(reason, [])
    if len(examples) < SKIP_EXAMPLES_PER_REASON:
      examples.append(message)

  def bad_input(self, bad: BadRecord) -> None:
    if self.on_error == "raise":
      raise CorpusInputError(bad.message, bad)
    self.skip(bad.reason, bad.message)


class _ProgressReporter:
  """Calls `progress` (if any) with a BuildProgress every `interval_s` seconds and at the end."""

  def __init__(self, progress: Optional[Callable[[BuildProgress], None]], interval_s: float,
               counts: dict, fraction_done: Callable[[], Optional[float]], start_time: float):
    self.progress = progress
    self.interval_s = interval_s
    self.counts = counts
    self.fraction_done = fraction_done
    self.start_time = start_time
    self.chunk: Optional[_Chunk] = None  # the chunk being written
    self.done = 0  # how many of its items are done
    self.last = time.monotonic()

  def at(self, chunk: _Chunk, done: int) -> None:
    """Notes that `done` items of `chunk` are read; reports when the interval has passed."""
    self.chunk, self.done = chunk, done
    now = time.monotonic()
    if now - self.last >= self.interval_s:
      self.report()
      self.last = now

  def report(self) -> None:
    if self.progress is not None:
      counts = self.counts
      self.progress(BuildProgress(
          counts["documents_read"], counts["documents_used"], counts["blocks"],
          time.monotonic() - self.start_time,
          self.fraction_done() if self.chunk is None else self.chunk.fraction_done(self.done)))


class _DocumentSink:
  """Writes analysed documents into the staging directory in input order: their blocks, one
  doc_keys line per document kept, and the duplicate check; counts into the build's log."""

  def __init__(self, staging: str, max_block_len: int, token_dtype: np.dtype,
               store_options_json: bytes, max_title_len: int, log: _BuildLog):
    self.staging = staging
    self.max_title_len = max_title_len
    self.log = log
    self.writer = _StagingWriter(staging, max_block_len, token_dtype, store_options_json)
    try:
      # One line per document kept: its own id (kept only if the input had any).
      self.keys = open(os.path.join(staging, DOC_KEYS), "w", encoding="utf-8")
    except BaseException:
      self.writer.abort()
      raise
    self.any_key = False
    self.seen = _UInt64Set()

  def add(self, item: Document, result: tuple, chunk: _ChunkResult) -> None:
    """Bookkeeping and writing of one analysed document, in the order of `_Analyzer`."""
    log, counts = self.log, self.log.counts
    kind = result[0]
    if kind == _EMPTY:
      log.skip("empty", f"{item.source}: no text")
      return
    title = item.title.strip()
    if kind == _TITLE_TOO_LONG:
      log.skip("title_too_long", f"{item.source}: title has {result[1]} wordpieces "
               f"(max_title_len={self.max_title_len}): {title[:60]!r}")
      return
    if kind in _MISMATCHED:
      part = _MISMATCHED[kind]
      field = f"{part}_token_ids"
      log.bad_input(BadRecord(item.source, "token_mismatch", field,
                              f"{item.source}: field '{field}' differs from our tokenisation "
                              f"of the {part} (use record_token_ids='ours' to keep ours)"))
      return
    _, title_ids, (mismatches, truncated, oversize), first, num_blocks, doc_uid = result
    counts["token_mismatches"] += mismatches
    counts["truncated_records"] += truncated
    counts["oversize_sentences"] += oversize
    if not num_blocks:
      log.skip("empty", f"{item.source}: text has no wordpieces")
      return
    # Checked last so that only documents that would be written claim their content.
    if not self.seen.add(doc_uid):
      log.skip("duplicate", f"{item.source}: same title and text as an earlier document "
               f"({title[:60]!r})")
      return

    doc_id = counts["documents_used"]
    counts["documents_used"] += 1
    self.keys.write(json.dumps(item.key) + "\n")
    self.any_key = self.any_key or item.key is not None
    title_bytes = title.encode("utf-8")
    text_bytes = item.text.strip().encode("utf-8")
    for (token, length, begin, end), uid in zip(
        chunk.blocks[first:first + num_blocks].tolist(),
        chunk.uids[first:first + num_blocks]):
      self.writer.add(title_ids, chunk.tokens[token:token + length], title_bytes,
                      text_bytes[begin:end], doc_id, uid)
      counts["blocks"] += 1

  def close_blocks(self) -> str:
    """Closes the block files; returns the store_id."""
    store_id = self.writer.close()
    self.writer = None
    return store_id

  def close_keys(self) -> bool:
    """Closes doc_keys.jsonl, removed when the input had no ids; returns whether it is kept."""
    self.keys.close()
    if not self.any_key:  # the input had no ids: nothing to keep
      os.remove(os.path.join(self.staging, DOC_KEYS))
    return self.any_key

  def abort(self) -> None:
    if self.writer is not None:
      self.writer.abort()
    self.keys.close()


def _write_documents(analyzed: Iterator[tuple[_Chunk, _ChunkResult]], log: _BuildLog,
                     sink: _DocumentSink, reporter: _ProgressReporter) -> None:
  """Counts and writes the analysed chunks' items in input order, raising what the source or
  the analysis raised where a one-process build would have."""
  try:
    for chunk, result in analyzed:
      results = iter(result.docs)
      for done, item in enumerate(chunk.items, start=1):
        log.counts["documents_read"] += 1
        reporter.at(chunk, done)
        if isinstance(item, BadRecord):
          log.bad_input(item)
          continue
        doc_result = next(results, None)
        if doc_result is None:  # its analysis raised, as the one-process build would
          raise result.error
        sink.add(item, doc_result, result)
      if chunk.error is not None:
        raise chunk.error
  finally:
    analyzed.close()  # stops the workers, also when the build fails


def _check_some_blocks(source: Iterable[SourceItem], counts: dict) -> None:
  """Raises CorpusInputError when the build wrote no block, saying why."""
  if counts["blocks"] == 0:
    description = getattr(source, "description", None) or {}  # a property of our sources
    where = description.get("path") or description.get("name") or "the input"
    if counts["documents_read"] == 0:
      raise CorpusInputError(f"{where}: no blocks: the input has no records (an empty file?)")
    raise CorpusInputError(
        f"{where}: no blocks: all {counts['documents_read']} input records were skipped "
        f"({ {k: v for k, v in counts['skipped'].items() if v} })")


def _build_manifest(staging: str, *, source: Iterable[SourceItem], log: _BuildLog,
                    store_id: str, store_options: dict, vocab: vocab_lib.WordPieceVocabulary,
                    token_dtype: np.dtype, any_key: bool, options: dict) -> dict:
  """The manifest of the store written in `staging`, with every file's size and sha256."""
  files = {}
  for name in DATA_FILES + ((DOC_KEYS,) if any_key else ()):
    path = os.path.join(staging, name)
    files[name] = {"bytes": os.path.getsize(path), "sha256": fileio.sha256_file(path)}
  return {
      "format": FORMAT_NAME,
      "format_version": FORMAT_VERSION,
      "num_blocks": log.counts["blocks"],
      "max_block_len": options["max_block_len"],
      "token_dtype": token_dtype.name,
      "vocab": {"fingerprint": vocab.fingerprint, "size": vocab.vocab_size},
      "source": getattr(source, "description", {"kind": type(source).__name__}),
      "options": options,
      "store_id_options": store_options,
      "counts": log.counts,
      "skip_examples": log.skip_examples,
      "store_id": store_id,
      "files": files,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "builder": {"python": sys.version.split()[0], "numpy": np.__version__},
  }


def write_tokenized_block_store(dest: str, tokens: np.ndarray, title_lengths: np.ndarray,
                                body_lengths: np.ndarray, *,
                                vocab: Optional[vocab_lib.WordPieceVocabulary] = None,
                                source: Optional[dict] = None,
                                overwrite: bool = False) -> str:
  """Publishes a BlockStore whose blocks are already wordpiece ids, without their text, and returns
  its store_id.

  For corpora tokenised elsewhere and synthetic stores at Wikipedia scale, where
  `build_block_store`'s tokenizer would take hours. Every block is its own document, with empty
  `title()` and `body()` and a uid over its token row. Published atomically, every hash checked.
  `tokens`: [num_blocks, max_block_len] rows `[CLS] title [SEP] body [SEP]`, 0-padded;
  `title_lengths`, `body_lengths`: [num_blocks] wordpieces of each part.
  """
  vocab = vocab or vocab_lib.default_vocabulary()
  tokens = np.asarray(tokens)
  title_lengths = np.asarray(title_lengths, np.int32)
  body_lengths = np.asarray(body_lengths, np.int32)
  if tokens.ndim != 2 or tokens.shape[0] == 0:
    raise ValueError(f"tokens must be [num_blocks > 0, max_block_len], got {tokens.shape}")
  num_blocks, max_block_len = tokens.shape
  if title_lengths.shape != (num_blocks,) or body_lengths.shape != (num_blocks,):
    raise ValueError(f"title_lengths and body_lengths must be [{num_blocks}], got "
                     f"{title_lengths.shape} and {body_lengths.shape}")
  row_lengths = title_lengths + body_lengths + NUM_SPECIAL_TOKENS  # [num_blocks]
  if title_lengths.min() < 0 or body_lengths.min() < 1 or row_lengths.max() > max_block_len:
    raise ValueError(f"every block needs a body and must fit max_block_len={max_block_len}")
  if tokens.min() < 0 or tokens.max() >= vocab.vocab_size:
    raise ValueError(f"token ids must lie in [0, {vocab.vocab_size})")
  token_dtype = token_dtype_for(vocab.vocab_size)
  tokens = tokens.astype(token_dtype, copy=False)
  dest, _ = _prepare_dest(dest, overwrite)

  store_options = {"format_version": FORMAT_VERSION, "max_block_len": int(max_block_len),
                   "max_title_len": int(title_lengths.max()),
                   "vocab_fingerprint": vocab.fingerprint, "text": False}
  uids = np.fromiter((int.from_bytes(hashlib.sha256(row.tobytes()).digest()[:8], "big")
                      for row in tokens), np.uint64, num_blocks)  # [num_blocks]
  if len(np.unique(uids)) != num_blocks:
    raise ValueError("two blocks have the same token row (a BlockStore's blocks are distinct)")
  # As _StagingWriter: sha256(options JSON + "\n" + uids as little-endian uint64).
  store_hash = hashlib.sha256(_canonical_json(store_options) + b"\n")
  store_hash.update(uids.astype("<u8").tobytes())
  store_id = store_hash.hexdigest()
  arrays = {TOKENS: tokens, TITLE_LENGTHS: title_lengths, BODY_LENGTHS: body_lengths,
            UIDS: uids, DOC_IDS: np.arange(num_blocks, dtype=np.int64),
            TEXT_OFFSETS: np.zeros(2 * num_blocks + 1, np.int64)}
  with fileio.staged_directory(dest, f"{os.path.basename(dest)}.staging-") as staging:
    for name, array in arrays.items():
      np.save(os.path.join(staging, name), array)
    open(os.path.join(staging, TEXT), "wb").close()
    files = {}
    for name in DATA_FILES:
      path = os.path.join(staging, name)
      fileio.fsync_file(path)
      files[name] = {"bytes": os.path.getsize(path), "sha256": fileio.sha256_file(path)}
    counts = {"documents_read": num_blocks, "documents_used": num_blocks, "blocks": num_blocks}
    manifest = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "num_blocks": num_blocks,
        "max_block_len": int(max_block_len), "token_dtype": np.dtype(token_dtype).name,
        "vocab": {"fingerprint": vocab.fingerprint, "size": vocab.vocab_size},
        "source": source or {"kind": "tokenized"}, "options": {"text": False},
        "store_id_options": store_options, "counts": counts, "skip_examples": {},
        "store_id": store_id, "files": files,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "builder": {"python": sys.version.split()[0], "numpy": np.__version__},
    }
    _write_manifest(staging, manifest)
    BlockStore.open(staging, verify=True, vocab_fingerprint=vocab.fingerprint).close()
    _publish(staging, dest, overwrite)
  return store_id
