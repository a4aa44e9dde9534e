"""RETRO training and evaluation batches from a chunk database (`realm_jax.index.chunks`).

A sequence is l consecutive chunks of one document (n = l m tokens, 0 where a last chunk is
partial); each chunk has k neighbours (a chunk and its continuation, r = 2m tokens), retrieved
once (the keys are a frozen BERT's) and never from the sequence's own document. The last
`heldout_fraction` of the documents by id are evaluation text only: never trained on, never
retrieved (the searcher holds the training chunks alone).

Batches (host-local; B = this host's batch size):

  input_ids       [B, n] int32     the sequence's tokens, 0 where padded
  input_mask      [B, n] int32     1 on real tokens
  neighbour_ids   [B, l, k, r]     int32, each chunk's neighbours (only with retrieval)
  neighbour_mask  [B, l, k, r]     int32, 1 on real neighbour tokens (only with retrieval)
  target_bytes    [B] float32      evaluation batches only: UTF-8 bytes of the targets' text
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from realm_jax.data import vocab as vocab_lib
from realm_jax.index import chunks as chunks_lib

Batch = dict[str, np.ndarray]

HELDOUT_FRACTION = 0.05  # the last 5% of the documents by id: evaluation only


def heldout_start(doc_ids: np.ndarray, fraction: float = HELDOUT_FRACTION) -> int:
  """The first chunk row of the held-out documents: the last ceil(fraction * documents) of
  them by id (at least one, and at least one document left to train on)."""
  doc_ids = np.asarray(doc_ids, np.int64)  # [C], non-decreasing
  docs = np.unique(doc_ids)  # [D]
  if docs.size < 2:
    raise ValueError(f"a held-out split needs at least 2 documents, the database has "
                     f"{docs.size}")
  held = min(docs.size - 1, max(1, math.ceil(fraction * docs.size)))
  return int(np.searchsorted(doc_ids, docs[-held], "left"))


@functools.lru_cache(maxsize=8)
def _wordpiece_bytes(vocab: vocab_lib.WordPieceVocabulary) -> tuple[np.ndarray, np.ndarray]:
  """([V] int64 UTF-8 bytes of each wordpiece's text, [V] bool: a `##` continuation)."""
  tokens = vocab.tokens
  # `decode` joins with " " and glues " ##": exact per token only if no wordpiece holds
  # whitespace (then every " ##" in the joined text is a join before a continuation).
  spaced = [t for t in tokens if not t or any(c.isspace() for c in t)]
  if spaced:
    raise ValueError(f"vocabulary {vocab.fingerprint[:12]}...: wordpieces {spaced[:3]!r} are "
                     f"empty or hold whitespace; target bytes assume neither")
  lengths = np.array([len(t.encode("utf-8")) for t in tokens], np.int64)  # [V]
  continuation = np.array([t.startswith("##") for t in tokens], bool)  # [V]
  return lengths, continuation


def target_token_bytes(input_ids: np.ndarray, input_mask: np.ndarray,
                       vocab: vocab_lib.WordPieceVocabulary) -> np.ndarray:
  """[B, n - 1] int64 UTF-8 bytes of each target token's text (column t: the token at t + 1).

  Row sums are `target_bytes`, split per token: a word-initial wordpiece counts its bytes plus one
  for the joining space; a `##` continuation its bytes without the `##`; the row's first target
  its full text. [PAD] (id 0, which `decode` drops) and masked targets count 0.
  """
  lengths, continuation = _wordpiece_bytes(vocab)
  targets = np.asarray(input_ids)[:, 1:].astype(np.int64)  # [B, n - 1]
  real = (np.asarray(input_mask)[:, 1:] > 0) & (targets != vocab_lib.PAD_ID)  # [B, n - 1]
  first = real & (np.cumsum(real, axis=1) == 1)  # [B, n - 1] the row's first decoded target
  joined = np.where(continuation[targets], -2, 1)  # [B, n - 1] "##" glued, or " " added
  return np.where(real, lengths[targets] + np.where(first, 0, joined), 0)


def target_bytes(input_ids: np.ndarray, input_mask: np.ndarray,
                 vocab: vocab_lib.WordPieceVocabulary) -> np.ndarray:
  """[B] float32 UTF-8 bytes of each sequence's target text (tokens 1 .. n - 1, where real).

  The text is the vocabulary's detokenization (`WordPieceVocabulary.decode`): the uncased
  vocabulary's normalised text, not the original document's bytes (the chunk database holds
  wordpieces). The sum of `target_token_bytes`, so per-token analyses add up to it exactly.
  """
  return target_token_bytes(input_ids, input_mask, vocab).sum(axis=1).astype(np.float32)


class RetroBatches:
  """RETRO batches (module docstring) over one split of a chunk database, a `BatchIterator`.

  Training (`shuffle=True`): an endless stream, each epoch a permutation drawn from (seed,
  epoch), batches running across epoch ends; `restore(state())` resumes exactly. Each host takes
  its contiguous slice of every global batch. `shuffle=False`: the split's sequences once.

  Args:
    chunks_per_sequence, num_neighbours: l and k (k is 0 with `retrieval=False`).
    retrieval: False: the no-retrieval baseline (keys, searcher and neighbours never touched).
    split: "train" or "heldout".
    vocab: given, every batch has `target_bytes` (for bits per byte).
    exclude_own_document: RETRO's rule; False is a positive control for analyses, never a
      result (docs/design/data_index_batches.md).
  """

  def __init__(self, database: chunks_lib.ChunkDatabase, *, batch_size: int,
               chunks_per_sequence: int, num_neighbours: int = 2, retrieval: bool = True,
               split: str = "train", seed: int = 0, shuffle: bool = True,
               max_sequences: Optional[int] = None,
               vocab: Optional[vocab_lib.WordPieceVocabulary] = None,
               heldout_fraction: float = HELDOUT_FRACTION, exclude_own_document: bool = True,
               process_index: Optional[int] = None, process_count: Optional[int] = None):
    if split not in ("train", "heldout"):
      raise ValueError(f"split={split!r}; expected 'train' or 'heldout'")
    if process_index is None or process_count is None:
      import jax  # pylint: disable=g-import-not-at-top
      process_index, process_count = jax.process_index(), jax.process_count()
    self.database = database
    self.batch_size = int(batch_size)
    self.chunks_per_sequence = int(chunks_per_sequence)
    self.num_neighbours = int(num_neighbours) if retrieval else 0
    self.retrieval = bool(retrieval)
    self.seed = int(seed)
    self.shuffle = bool(shuffle)
    self.vocab = vocab
    self.split = split
    self.exclude_own_document = bool(exclude_own_document)
    self._host = (int(process_index), int(process_count))
    doc_ids = np.asarray(database.doc_ids)  # [C]
    self.train_rows = heldout_start(doc_ids, heldout_fraction)  # chunks [0, this) train
    starts = chunks_lib.training_sequences(doc_ids, self.chunks_per_sequence)  # [S]
    in_train = starts < self.train_rows
    starts = starts[in_train] if split == "train" else starts[~in_train]
    if max_sequences is not None:
      starts = starts[:int(max_sequences)]
    if starts.size == 0:
      raise ValueError(f"{database.path}: no {split} sequence of {self.chunks_per_sequence} "
                       f"chunks")
    self.starts = starts  # [S] first chunk of each sequence
    # [S, l] the chunks of each sequence.
    self.chunk_ids = chunks_lib.sequence_chunk_ids(doc_ids, starts, self.chunks_per_sequence,
                                                   database.path)
    self.neighbours = self._neighbours() if self.retrieval else None  # [S, l, k] or None
    self._epoch, self._index = 0, 0

  @property
  def num_sequences(self) -> int:
    return int(self.starts.size)

  @property
  def sequence_len(self) -> int:
    return self.chunks_per_sequence * self.database.chunk_len

  def _neighbours(self) -> np.ndarray:
    """[S, l, k] int32 chunk ids: each chunk's k nearest training chunks outside its own
    document, computed once (exact L2 search over the training rows only); or, without
    `exclude_own_document`, its k nearest chunks of the split's searchable rows."""
    from realm_jax.index import search as search_lib  # pylint: disable=g-import-not-at-top
    db = self.database
    doc_ids = np.asarray(db.doc_ids)
    leak = not self.exclude_own_document and self.split == "heldout"
    rows = doc_ids.shape[0] if leak else self.train_rows
    searcher = search_lib.make_searcher("exact", np.asarray(db.index.embeddings[:rows]))
    flat = self.chunk_ids.reshape(-1)  # [S * l]
    queries = chunks_lib.query_vectors(np.asarray(db.keys[flat]))  # [S * l, hidden + 1]
    exclude = (doc_ids[flat] if self.exclude_own_document
               else np.full(flat.shape, -1, np.int64))  # [S * l]; -1: none
    _, ids = chunks_lib.search_excluding_documents(
        searcher, queries, exclude, doc_ids[:rows], self.num_neighbours)  # [S * l, k]
    return ids.reshape(*self.chunk_ids.shape, self.num_neighbours).astype(np.int32)

  def element_spec(self) -> dict[str, Any]:
    """Per-example `{key: ShapeDtypeStruct}` (nothing read)."""
    return spec(self.chunks_per_sequence, self.database.chunk_len, self.num_neighbours,
                with_bytes=self.vocab is not None)

  def sequences(self, rows: np.ndarray) -> Batch:
    """The batch of sequences `rows` (indices into this split's sequences)."""
    db = self.database
    ids = self.chunk_ids[rows]  # [B, l]
    m = db.chunk_len
    tokens = np.asarray(db.chunk_tokens[ids.reshape(-1)], np.int32)  # [B * l, m]
    lengths = np.asarray(db.chunk_lengths[ids.reshape(-1)], np.int32)  # [B * l]
    # [B * l, m] -> [B, n]: a partial chunk's tail (0, [PAD]) is masked out.
    mask = (np.arange(m)[None, :] < lengths[:, None]).astype(np.int32)
    batch = {"input_ids": tokens.reshape(len(rows), -1),
             "input_mask": mask.reshape(len(rows), -1)}
    if self.retrieval:
      neighbour_ids = db.neighbour_tokens(self.neighbours[rows])  # [B, l, k, 2m]
      batch["neighbour_ids"] = neighbour_ids
      # 0 is [PAD]: a partial chunk's or continuation's tail, or an unfilled slot.
      batch["neighbour_mask"] = (neighbour_ids != 0).astype(np.int32)
    if self.vocab is not None:
      batch["target_bytes"] = target_bytes(batch["input_ids"], batch["input_mask"], self.vocab)
    return batch

  def padded(self, rows: np.ndarray, size: int) -> Batch:
    """`sequences(rows)` filled up to `size` rows with copies of the first row, all masked
    (no real target: they count nothing), so every batch has one shape."""
    batch = self.sequences(rows)
    extra = size - len(rows)
    if extra <= 0:
      return batch
    out = {}
    for key, value in batch.items():
      filler = np.repeat(value[:1], extra, axis=0)
      if key in ("input_mask", "target_bytes"):
        filler = np.zeros_like(filler)
      out[key] = np.concatenate([value, filler], axis=0)
    return out

  def fixed_batches(self, batch_size: Optional[int] = None) -> list[Batch]:
    """The split's sequences once, in order, in host batches of one shape (the last padded);
    each host takes its slice of every global batch (a host left without rows gets filler)."""
    size = batch_size or self.batch_size
    index, count = self._host
    batches = []
    for first in range(0, self.num_sequences, size * count):
      rows = np.arange(first, min(first + size * count, self.num_sequences))  # global batch
      mine = rows[index * size:(index + 1) * size]
      batches.append(self.padded(mine, size) if mine.size
                     else _all_masked(self.padded(rows[:1], size)))
    return batches

  # -- the BatchIterator protocol

  def _order(self, epoch: int) -> np.ndarray:
    if not self.shuffle:
      return np.arange(self.num_sequences)
    return np.random.default_rng([self.seed, epoch]).permutation(self.num_sequences)

  def __iter__(self) -> Iterator[Batch]:
    return self

  def __next__(self) -> Batch:
    index, count = self._host
    wanted = self.batch_size * count
    rows = []
    epoch, position = self._epoch, self._index
    while len(rows) < wanted:
      if position >= self.num_sequences:
        if not self.shuffle:
          if rows:
            break
          raise StopIteration
        epoch, position = epoch + 1, 0
      order = self._order(epoch)
      take = order[position:position + wanted - len(rows)]
      rows.extend(take.tolist())
      position += take.size
    self._epoch, self._index = epoch, position
    mine = np.asarray(rows[index * self.batch_size:(index + 1) * self.batch_size], np.int64)
    return self.padded(mine, self.batch_size)

  def state(self) -> dict:
    """The position after the batches returned so far."""
    return {"epoch": self._epoch, "index": self._index, "seed": self.seed,
            "num_sequences": self.num_sequences}

  def restore(self, state: Mapping[str, Any]) -> None:
    if (int(state.get("seed", self.seed)) != self.seed
        or int(state.get("num_sequences", self.num_sequences)) != self.num_sequences):
      raise ValueError(f"RetroBatches.restore: the state is of another stream (seed "
                       f"{state.get('seed')}, {state.get('num_sequences')} sequences; this one: "
                       f"seed {self.seed}, {self.num_sequences})")
    epoch, index = int(state["epoch"]), int(state["index"])
    if epoch < 0 or not 0 <= index <= self.num_sequences:
      raise ValueError(f"RetroBatches.restore: position ({epoch}, {index}) outside the "
                       f"{self.num_sequences} sequences")
    self._epoch, self._index = epoch, index


def _all_masked(batch: Batch) -> Batch:
  return {key: (np.zeros_like(v) if key in ("input_mask", "target_bytes") else v)
          for key, v in batch.items()}


def spec(chunks_per_sequence: int, chunk_len: int, num_neighbours: int, *,
         with_bytes: bool = False) -> dict[str, Any]:
  """Per-example `{key: ShapeDtypeStruct}` of RETRO batches (module docstring); no
  neighbour keys when `num_neighbours` is 0 (retrieval off)."""
  import jax  # pylint: disable=g-import-not-at-top
  n = chunks_per_sequence * chunk_len
  out = {"input_ids": jax.ShapeDtypeStruct((n,), np.int32),
         "input_mask": jax.ShapeDtypeStruct((n,), np.int32)}
  if num_neighbours:
    shape = (chunks_per_sequence, num_neighbours, 2 * chunk_len)
    out["neighbour_ids"] = jax.ShapeDtypeStruct(shape, np.int32)
    out["neighbour_mask"] = jax.ShapeDtypeStruct(shape, np.int32)
  if with_bytes:
    out["target_bytes"] = jax.ShapeDtypeStruct((), np.float32)
  return out
