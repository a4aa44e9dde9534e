"""REALM pretraining batches: the candidate rule, null document, embedder and reader inputs, the
batch and its schema, and the iterator that retrieves them from an index.

The stale index only chooses the candidates; the train step re-embeds them with the live
parameters (REALM_SPEC 15). On the host, with NumPy (REALM_SPEC 11-13, 21): `select_candidates`
applies the authors' rule (skip an example with duplicate candidates, remove its source block,
null document at slot 0); `embedder_inputs` builds `[CLS] title [SEP] body [SEP]` rows and
`reader_inputs` `[CLS] q [SEP] body [SEP]` rows (no title); `build_pretraining_batch` assembles
a fixed-shape batch; `PretrainingBatches` retrieves each batch's candidates from the current
index. Duplicates, the retrieval margin and `duplicates="dedupe"`:
docs/design/data_index_batches.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Union

import jax
import numpy as np

from realm_jax.data import block_store as block_store_lib
from realm_jax.data.masking import SkipCounter
from realm_jax.data.vocab import CLS_ID, PAD_ID, SEP_ID
from realm_jax.batches import stating_blocks
from realm_jax.batches.seqio_batches import SeqioBatches
from realm_jax.index.retrieval import Retriever

# Block id of the null document in candidate id arrays. Not a row of any BlockStore: its inputs
# are synthesised (`null_embedder_input`, `reader_inputs`).
NULL_BLOCK = -1
DEFAULT_NUM_CANDIDATES = 8

DUPLICATE_POLICIES = ("skip", "dedupe")
# Skip reasons, always present in the counts (0 when none) so metrics have stable keys.
SKIP_REASONS = ("duplicate_candidates", "too_few_candidates")

# Keys `build_pretraining_batch` reads from its masked batch (the fields of
# `masking.MaskedQuery.to_dict()`, batched).
MASKED_BATCH_KEYS = ("query_ids", "query_mask", "mlm_positions", "mlm_targets", "mlm_weights",
                     "source_uid")
# The reader rows of a pretraining batch, [B, K, reader_len] each and padded at the end
# ("reader_mask" is 1 on their real tokens): what a length bucket cuts together
# (`seqio_batches.LengthBucketed`). The rows hold `[CLS] query [SEP] body [SEP]` at their start, so
# cutting trailing padding moves no token and `mlm_positions` still index them.
READER_ROW_KEYS = ("reader_ids", "reader_type_ids", "reader_mask")


@dataclasses.dataclass(frozen=True)
class CandidateSelection:
  """The candidates chosen for a batch of queries.

  Attributes:
    candidate_ids: int32 [batch, num_candidates] block ids; NULL_BLOCK (-1) at slot 0 of every
      kept example. Rows of skipped examples are NULL_BLOCK everywhere (well-formed inputs that
      carry no information; their weights must be zero).
    keep: bool [batch], False for skipped examples.
    source_removed: bool [batch], True where the example's own source block was among the top
      candidates and was removed (kept examples only).
    skip_counts: reason -> number of skipped examples in this batch (`SKIP_REASONS`, a
      `masking.SkipCounter`, so counts of several batches add with `+`).
  """

  candidate_ids: np.ndarray
  keep: np.ndarray
  source_removed: np.ndarray
  skip_counts: SkipCounter

  @property
  def num_candidates(self) -> int:
    return int(self.candidate_ids.shape[1])


def _new_skip_counts() -> SkipCounter:
  counts = SkipCounter()
  for reason in SKIP_REASONS:
    counts[reason] = 0
  return counts


def select_candidates(retrieved_ids, retrieved_uids, source_uids, *,
                      num_candidates: int = DEFAULT_NUM_CANDIDATES,
                      duplicates: str = "skip", null_document: bool = True
                      ) -> CandidateSelection:
  """Applies REALM's candidate rule (REALM_SPEC 12-13) to a batch of search results.

  Args:
    retrieved_ids: int [batch, num_retrieved] block ids, best first, num_retrieved >=
      num_candidates (more columns are a margin, used only by "dedupe").
    retrieved_uids: uint64 [batch, num_retrieved] content uids (`store.uids[retrieved_ids]`).
    source_uids: uint64 [batch] each query's source block; 0: none (nothing is removed).
    num_candidates: candidates per example including the null document (REALM: 8).
    duplicates: "skip" (the authors' rule) or "dedupe" (ours: refill from the margin).
    null_document: False for the ablation without it: num_candidates retrieved blocks, which
      needs num_candidates + 1 retrieved columns (the source may be among them).
  """
  if duplicates not in DUPLICATE_POLICIES:
    raise ValueError(f"duplicates must be one of {DUPLICATE_POLICIES}, got {duplicates!r}")
  if num_candidates < 1:
    raise ValueError(f"num_candidates must be >= 1 (the null document), got {num_candidates}")
  retrieved_ids = np.asarray(retrieved_ids)  # [batch, num_retrieved]
  retrieved_uids = np.asarray(retrieved_uids, np.uint64)  # [batch, num_retrieved]
  source_uids = np.asarray(source_uids, np.uint64)  # [batch]
  if retrieved_ids.ndim != 2 or retrieved_uids.shape != retrieved_ids.shape:
    raise ValueError(f"retrieved_ids and retrieved_uids must both be [batch, num_retrieved]; "
                     f"got {retrieved_ids.shape} and {retrieved_uids.shape}")
  batch_size, num_retrieved = retrieved_ids.shape
  if source_uids.shape != (batch_size,):
    raise ValueError(f"source_uids must be [batch] = [{batch_size}], got {source_uids.shape}")
  # Without the null document one more real block is needed (the source may take a slot).
  num_real = num_candidates - 1 if null_document else num_candidates
  if num_retrieved < num_real + 1:
    # The authors retrieved exactly num_candidates; fewer cannot give num_candidates - 1 real
    # blocks after removing the source.
    raise ValueError(f"need at least {num_real + 1} retrieved blocks per example for "
                     f"num_candidates={num_candidates} (null document: {null_document}), got "
                     f"{num_retrieved} (is the corpus smaller than that?)")
  if retrieved_ids.size and retrieved_ids.min() < 0:
    raise ValueError("retrieved_ids contain a negative id (search padding?); every retrieved "
                     "column must be a real block")
  retrieved_ids = retrieved_ids.astype(np.int32)

  if duplicates == "skip":
    selection = _select_skip(retrieved_ids, retrieved_uids, source_uids, num_real)
  else:
    selection = _select_dedupe(retrieved_ids, retrieved_uids, source_uids, num_real)
  if null_document:
    return selection
  return dataclasses.replace(selection, candidate_ids=selection.candidate_ids[:, 1:])


def _select_skip(retrieved_ids, retrieved_uids, source_uids, num_real):
  """The authors' rule, vectorised over the batch: [null] + the first `num_real` non-source
  blocks of the top `num_real + 1` (the margin beyond, if any, is ignored)."""
  num_candidates = num_real + 1
  batch_size = retrieved_ids.shape[0]
  top_ids = retrieved_ids[:, :num_candidates]  # [batch, num_candidates]
  top_uids = retrieved_uids[:, :num_candidates]  # [batch, num_candidates]
  # Duplicates among the top num_candidates: equal neighbours after sorting each row.
  sorted_uids = np.sort(top_uids, axis=1)  # [batch, num_candidates]
  has_duplicate = (sorted_uids[:, 1:] == sorted_uids[:, :-1]).any(axis=1)  # [batch]
  keep = ~has_duplicate  # [batch]
  has_source = source_uids != 0  # [batch]
  is_source = (top_uids == source_uids[:, None]) & has_source[:, None]  # [batch, num_candidates]
  # Without duplicates a kept row holds its source at most once. A stable sort on the flag moves
  # it behind the others and keeps the rest in rank order; the first num_candidates - 1 are then
  # what `[null] + [c for c in cands if c.uid != source][:num_candidates - 1]` gives.
  order = np.argsort(is_source, axis=1, kind="stable")  # [batch, num_candidates]
  real = np.take_along_axis(top_ids, order[:, :num_candidates - 1], axis=1)  # [batch, K - 1]
  candidate_ids = np.concatenate(
      [np.full([batch_size, 1], NULL_BLOCK, np.int32), real], axis=1)  # [batch, num_candidates]
  candidate_ids[~keep] = NULL_BLOCK
  counts = _new_skip_counts()
  counts["duplicate_candidates"] = int(has_duplicate.sum())
  return CandidateSelection(candidate_ids=candidate_ids, keep=keep,
                            source_removed=keep & is_source.any(axis=1), skip_counts=counts)


def _select_dedupe(retrieved_ids, retrieved_uids, source_uids, num_real):
  """Our option: [null] + the first `num_real` distinct non-source blocks over all retrieved
  columns."""
  num_candidates = num_real + 1
  batch_size = retrieved_ids.shape[0]
  candidate_ids = np.full([batch_size, num_candidates], NULL_BLOCK, np.int32)
  keep = np.zeros([batch_size], bool)
  source_removed = np.zeros([batch_size], bool)
  counts = _new_skip_counts()
  for b in range(batch_size):  # a per-example loop over <= num_retrieved items: cheap
    uids = retrieved_uids[b]  # [num_retrieved]
    _, first = np.unique(uids, return_index=True)
    first = np.sort(first)  # rank order of first occurrences
    is_source = (uids[first] == source_uids[b]) & (source_uids[b] != 0)
    chosen = first[~is_source][:num_candidates - 1]
    if len(chosen) < num_candidates - 1:
      counts["too_few_candidates"] += 1
      continue
    keep[b] = True
    # As under "skip" on a duplicate-free row: the source was among the top num_candidates
    # (here: distinct) blocks.
    source_removed[b] = bool(is_source[:num_candidates].any())
    candidate_ids[b, 1:] = retrieved_ids[b, chosen]
  return CandidateSelection(candidate_ids=candidate_ids, keep=keep,
                            source_removed=source_removed, skip_counts=counts)


# ------------------------------------------------------------------------------ model inputs


def null_embedder_input(block_len: int = block_store_lib.DEFAULT_MAX_BLOCK_LEN
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Document-embedder input of the null document (REALM_SPEC 13): the empty block
  `[CLS] [SEP] [SEP]`, segments 0, 0, 1.

  Returns:
    (ids, type_ids, mask), each int32 [block_len]: ids [101, 102, 102, 0, ...], type ids
    [0, 0, 1, 0, ...], mask [1, 1, 1, 0, ...].
  """
  if block_len < 3:
    raise ValueError(f"block_len must be >= 3 for [CLS] [SEP] [SEP], got {block_len}")
  ids = np.zeros([block_len], np.int32)
  type_ids = np.zeros([block_len], np.int32)
  mask = np.zeros([block_len], np.int32)
  ids[:3] = (CLS_ID, SEP_ID, SEP_ID)
  type_ids[2] = 1
  mask[:3] = 1
  return ids, type_ids, mask


def _check_candidate_ids(store: block_store_lib.BlockStore, candidate_ids) -> np.ndarray:
  """int64 [batch, num_candidates] ids, each NULL_BLOCK or a row of the store."""
  candidate_ids = np.asarray(candidate_ids)
  if candidate_ids.ndim != 2:
    raise ValueError(f"candidate_ids must be [batch, num_candidates], got {candidate_ids.shape}")
  candidate_ids = candidate_ids.astype(np.int64)
  bad = (candidate_ids != NULL_BLOCK) & ((candidate_ids < 0)
                                          | (candidate_ids >= store.num_blocks))
  if bad.any():
    raise ValueError(f"candidate_ids contain {candidate_ids[bad][:5].tolist()}: neither "
                     f"NULL_BLOCK ({NULL_BLOCK}) nor a block of {store.path} "
                     f"[0, {store.num_blocks})")
  return candidate_ids


def embedder_inputs(store: block_store_lib.BlockStore, candidate_ids,
                    block_len: Optional[int] = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Document-embedder inputs of every candidate (REALM_SPEC 11, 13).

  `candidate_ids`: int [batch, num_candidates] block ids or NULL_BLOCK; `block_len`: row length,
  default (and at least) `store.max_block_len`.

  Returns:
    (ids, type_ids, mask), each int32 [batch, num_candidates, block_len]: `[CLS] title [SEP] body
    [SEP]` (segment 1 from the body on); `null_embedder_input` at NULL_BLOCK slots.
  """
  candidate_ids = _check_candidate_ids(store, candidate_ids)  # [batch, num_candidates]
  store_len = store.max_block_len
  block_len = store_len if block_len is None else int(block_len)
  if block_len < store_len:
    # Cutting a row would cut its final [SEP]; the store's rows are the authors' length already.
    raise ValueError(f"block_len={block_len} is shorter than the store's rows ({store_len})")
  batch_size, num_candidates = candidate_ids.shape
  flat = candidate_ids.reshape(-1)  # [n] with n = batch * num_candidates
  is_real = flat != NULL_BLOCK  # [n]
  null_ids, null_types, null_mask = null_embedder_input(block_len)  # each [block_len]
  # Start from the null row everywhere, then overwrite the real rows.
  ids = np.tile(null_ids, (flat.size, 1))  # [n, block_len]
  type_ids = np.tile(null_types, (flat.size, 1))  # [n, block_len]
  mask = np.tile(null_mask, (flat.size, 1))  # [n, block_len]
  if is_real.any():
    real_ids, real_types, real_mask = store.embedder_inputs(flat[is_real])  # [r, store_len]
    for out, rows in ((ids, real_ids), (type_ids, real_types), (mask, real_mask)):
      out[is_real] = 0  # clears the null tokens; the padding beyond store_len stays 0
      out[is_real, :store_len] = rows
  shape = (batch_size, num_candidates, block_len)
  return ids.reshape(shape), type_ids.reshape(shape), mask.reshape(shape)


def query_lengths(query_ids, query_mask) -> np.ndarray:
  """Lengths of `[CLS] q [SEP]` (int32 [batch]), checking the query layout.

  Raises:
    ValueError: unless every row is `[CLS] ... [SEP]` followed by padding, with a mask of ones
      on exactly those tokens.
  """
  query_ids = np.asarray(query_ids)  # [batch, query_len]
  query_mask = np.asarray(query_mask)  # [batch, query_len]
  if query_ids.ndim != 2 or query_mask.shape != query_ids.shape:
    raise ValueError(f"query_ids and query_mask must both be [batch, query_len]; got "
                     f"{query_ids.shape} and {query_mask.shape}")
  batch_size, query_len = query_ids.shape
  lengths = (query_mask != 0).sum(axis=1).astype(np.int32)  # [batch]
  positions = np.arange(query_len)[None, :]  # [1, query_len]
  prefix = positions < lengths[:, None]  # [batch, query_len]
  rows = np.arange(batch_size)
  bad = ((query_mask != prefix).any(axis=1) | (lengths < 2)
         | (query_ids[:, 0] != CLS_ID)
         | (query_ids[rows, np.maximum(lengths - 1, 0)] != SEP_ID))  # [batch]
  if bad.any():
    raise ValueError(f"queries {np.flatnonzero(bad)[:5].tolist()} are not `[CLS] q [SEP]` "
                     f"followed by padding with query_mask 1 exactly on those tokens")
  return lengths


def reader_inputs(store: block_store_lib.BlockStore, query_ids, query_mask, candidate_ids, *,
                  reader_len: Optional[int] = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Knowledge-augmented-encoder inputs `[CLS] q [SEP] body [SEP]` (REALM_SPEC 11, 13).

  No title, as the release's featurizer; segment 1 from the body on; the null document gives
  `[CLS] q [SEP] [SEP]`. The query part is copied to the same positions, so `mlm_positions` index
  the query and every reader row alike. A body that does not fit is cut at its end.

  Args:
    query_ids, query_mask: int [batch, query_len], `[CLS] q [SEP]` then padding.
    candidate_ids: int [batch, num_candidates] block ids or NULL_BLOCK.
    reader_len: row length, more than query_len; default query_len + store.max_block_len.

  Returns:
    (ids, type_ids, mask), each int32 [batch, num_candidates, reader_len].
  """
  query_ids = np.asarray(query_ids)  # [batch, query_len]
  query_lens = query_lengths(query_ids, query_mask)  # [batch]
  candidate_ids = _check_candidate_ids(store, candidate_ids)  # [batch, num_candidates]
  batch_size, query_len = query_ids.shape
  if candidate_ids.shape[0] != batch_size:
    raise ValueError(f"candidate_ids has batch {candidate_ids.shape[0]}, queries {batch_size}")
  num_candidates = candidate_ids.shape[1]
  reader_len = query_len + store.max_block_len if reader_len is None else int(reader_len)
  if reader_len <= query_len:
    # Room for the final [SEP] after the longest possible query is the least we need.
    raise ValueError(f"reader_len={reader_len} must exceed query_len={query_len}")

  flat = candidate_ids.reshape(-1)  # [n], n = batch * num_candidates
  is_real = flat != NULL_BLOCK  # [n]
  store_len = store.max_block_len
  block_tokens = np.zeros([flat.size, store_len], np.int32)  # [n, store_len]
  title_lens = np.zeros([flat.size], np.int32)  # [n]
  body_lens = np.zeros([flat.size], np.int32)  # [n] (0 for null: an empty body)
  if is_real.any():
    real = flat[is_real]  # [r]
    block_tokens[is_real] = store.tokens[real]
    title_lens[is_real] = store.title_lengths[real]
    body_lens[is_real] = store.body_lengths[real]

  row_query_lens = np.repeat(query_lens, num_candidates)  # [n]
  body_lens = np.minimum(body_lens, reader_len - row_query_lens - 1)  # [n] truncation, if any
  end = row_query_lens + body_lens  # [n] position of the final [SEP]
  positions = np.arange(reader_len, dtype=np.int32)[None, :]  # [1, reader_len]
  # Offset into the body of each reader position; the body of row i sits at
  # block_tokens[i, title_len + 2 + offset] (after [CLS] title [SEP]).
  body_offset = positions - row_query_lens[:, None]  # [n, reader_len]
  in_body = (body_offset >= 0) & (body_offset < body_lens[:, None])  # [n, reader_len]
  source = np.clip(title_lens[:, None] + 2 + body_offset, 0, store_len - 1)  # [n, reader_len]
  body = np.take_along_axis(block_tokens, source, axis=1)  # [n, reader_len]
  ids = np.where(in_body, body, PAD_ID)  # [n, reader_len]
  ids = np.where(positions == end[:, None], SEP_ID, ids).astype(np.int32)
  ids = ids.reshape(batch_size, num_candidates, reader_len)
  # The query part, copied verbatim to positions [0, query_len) of every candidate's row.
  in_query = (positions < query_lens[:, None])[:, None, :query_len]  # [batch, 1, query_len]
  ids[:, :, :query_len] = np.where(in_query, query_ids[:, None, :], ids[:, :, :query_len])
  type_ids = ((positions >= row_query_lens[:, None])
              & (positions <= end[:, None])).astype(np.int32)  # [n, reader_len]
  mask = (positions <= end[:, None]).astype(np.int32)  # [n, reader_len]
  shape = (batch_size, num_candidates, reader_len)
  return ids, type_ids.reshape(shape), mask.reshape(shape)


# ------------------------------------------------------------------------------ the batch


def pretraining_batch_spec(masked_spec: Mapping[str, Any], *, num_candidates: int,
                           block_len: int, reader_len: Optional[int] = None) -> dict[str, Any]:
  """The per-example shapes and dtypes of a `build_pretraining_batch` batch (without the 0-d
  `index_step`, host metadata), declared once: {key: jax.ShapeDtypeStruct}.

  `masked_spec` is one masked query's element spec (query_ids [query_len], mlm_positions
  [max_masks], ...). Batches cut to a length bucket have narrower reader rows:
  `seqio_batches.spec_at_width` gives their schema.
  """
  query_len = int(masked_spec["query_ids"].shape[0])
  max_masks = int(masked_spec["mlm_positions"].shape[0])
  reader_len = query_len + int(block_len) if reader_len is None else int(reader_len)
  k = int(num_candidates)
  shapes = {"query_ids": [query_len], "query_type_ids": [query_len], "query_mask": [query_len],
            "candidate_input_ids": [k, block_len], "candidate_type_ids": [k, block_len],
            "candidate_mask": [k, block_len], "reader_ids": [k, reader_len],
            "reader_type_ids": [k, reader_len], "reader_mask": [k, reader_len],
            "mlm_positions": [max_masks], "mlm_targets": [max_masks],
            "mlm_weights": [max_masks], "candidate_block_ids": [k], "example_mask": [],
            "source_removed": [], "example_index_step": []}
  dtypes = {"mlm_weights": np.float32, "example_mask": np.float32, "source_removed": bool}
  return {key: jax.ShapeDtypeStruct(tuple(int(n) for n in shape), dtypes.get(key, np.int32))
          for key, shape in shapes.items()}


def build_pretraining_batch(store: block_store_lib.BlockStore,
                            masked_batch: Mapping[str, np.ndarray], retrieved_ids, *,
                            index_step: int,
                            num_candidates: int = DEFAULT_NUM_CANDIDATES,
                            duplicates: str = "skip", reader_len: Optional[int] = None,
                            null_document: bool = True
                            ) -> tuple[dict[str, np.ndarray], SkipCounter]:
  """Everything one REALM pretraining train step needs for a batch of masked queries.

  Examples skipped by the candidate rule (REALM_SPEC 12) stay in the batch (fixed shape) with
  zero `example_mask` and `mlm_weights` and null candidates; a loss normalised by the sum of
  `mlm_weights` (REALM_SPEC 16) ignores them exactly.

  Args:
    masked_batch: batched `MaskedQuery.to_dict()` fields (`MASKED_BATCH_KEYS`).
    retrieved_ids: int [B, num_retrieved] block ids, best first, from the index of `index_step`.
    index_step: the checkpoint step of that index (REALM_SPEC 21), to measure staleness.
    num_candidates, duplicates, null_document: as `select_candidates`.

  Returns:
    (batch, skip_counts). batch, with B the batch size and K = num_candidates:
      query_ids, query_type_ids, query_mask: int32 [B, query_len] (type ids all 0).
      candidate_input_ids, candidate_type_ids, candidate_mask: int32 [B, K, block_len]
        (document-embedder inputs; slot 0 is the null document).
      reader_ids, reader_type_ids, reader_mask: int32 [B, K, reader_len].
      mlm_positions, mlm_targets: int32 [B, max_masks]; mlm_weights: float32 [B, max_masks].
      candidate_block_ids: int32 [B, K] BlockStore rows, NULL_BLOCK (-1) for the null document.
      example_mask: float32 [B], 1 for kept examples, 0 for skipped ones.
      source_removed: bool [B], the example's source block was removed from its candidates.
      index_step: int32 0-d; example_index_step: int32 [B], the same per example (as the
        release's per-example `export_timestamp`).
    skip_counts: reason -> count for this batch (a `masking.SkipCounter`).
  """
  missing = [key for key in MASKED_BATCH_KEYS if key not in masked_batch]
  if missing:
    raise KeyError(f"masked_batch lacks {missing} (has {sorted(masked_batch)})")
  query_ids = np.asarray(masked_batch["query_ids"], np.int32)  # [B, query_len]
  query_mask = np.asarray(masked_batch["query_mask"], np.int32)  # [B, query_len]
  mlm_positions = np.asarray(masked_batch["mlm_positions"], np.int32)  # [B, max_masks]
  mlm_targets = np.asarray(masked_batch["mlm_targets"], np.int32)  # [B, max_masks]
  mlm_weights = np.asarray(masked_batch["mlm_weights"], np.float32)  # [B, max_masks]
  source_uids = np.asarray(masked_batch["source_uid"], np.uint64).reshape(-1)  # [B]
  batch_size = query_ids.shape[0]
  retrieved_ids = np.asarray(retrieved_ids)  # [B, num_retrieved]
  if retrieved_ids.ndim != 2 or retrieved_ids.shape[0] != batch_size:
    raise ValueError(f"retrieved_ids must be [batch={batch_size}, num_retrieved], got "
                     f"{retrieved_ids.shape}")
  for name, array in (("mlm_targets", mlm_targets), ("mlm_weights", mlm_weights)):
    if array.shape != mlm_positions.shape:
      raise ValueError(f"{name} is {array.shape}, mlm_positions {mlm_positions.shape}")
  if mlm_positions.shape[0] != batch_size:
    raise ValueError(f"mlm_positions has batch {mlm_positions.shape[0]}, queries {batch_size}")
  if retrieved_ids.size and (retrieved_ids.min() < 0 or retrieved_ids.max() >= store.num_blocks):
    raise ValueError(f"retrieved_ids out of range [0, {store.num_blocks}) of {store.path}")

  query_lens = query_lengths(query_ids, query_mask)  # [B]
  # Weighted targets must sit on query wordpieces (not [CLS], [SEP] or padding): only there do
  # the same positions index the query and every reader row.
  weighted = mlm_weights > 0  # [B, max_masks]
  outside = weighted & ((mlm_positions < 1) | (mlm_positions > query_lens[:, None] - 2))
  if outside.any():
    raise ValueError(f"examples {np.flatnonzero(outside.any(axis=1))[:5].tolist()} have a "
                     f"weighted mlm position outside their query's wordpieces")

  retrieved_uids = np.asarray(store.uids[retrieved_ids.astype(np.int64)], np.uint64)
  selection = select_candidates(retrieved_ids, retrieved_uids, source_uids,
                                num_candidates=num_candidates, duplicates=duplicates,
                                null_document=null_document)
  cand_ids, cand_types, cand_mask = embedder_inputs(store, selection.candidate_ids)
  read_ids, read_types, read_mask = reader_inputs(store, query_ids, query_mask,
                                                  selection.candidate_ids, reader_len=reader_len)
  # The invariant the reader relies on (REALM_SPEC 11): for every candidate, the reader row holds
  # the query's token at each mask position. Cheap ([B, K, max_masks]), so always checked.
  at_positions = np.take_along_axis(read_ids, np.broadcast_to(
      mlm_positions[:, None, :], (batch_size, num_candidates, mlm_positions.shape[1])), axis=2)
  expected = np.take_along_axis(query_ids, mlm_positions, axis=1)[:, None, :]
  if not (at_positions == expected).all():
    raise RuntimeError("reader inputs do not share the query's mask positions (a bug)")

  example_mask = selection.keep.astype(np.float32)  # [B]
  batch = {
      "query_ids": query_ids,
      "query_type_ids": np.zeros_like(query_ids),  # a query is one segment (REALM_SPEC 11)
      "query_mask": query_mask,
      "candidate_input_ids": cand_ids,
      "candidate_type_ids": cand_types,
      "candidate_mask": cand_mask,
      "reader_ids": read_ids,
      "reader_type_ids": read_types,
      "reader_mask": read_mask,
      "mlm_positions": mlm_positions,
      "mlm_targets": mlm_targets,
      "mlm_weights": mlm_weights * example_mask[:, None],
      "candidate_block_ids": selection.candidate_ids,
      "example_mask": example_mask,
      "source_removed": selection.source_removed,
      "index_step": np.asarray(index_step, np.int32),
      "example_index_step": np.full([batch_size], index_step, np.int32),
  }
  return batch, selection.skip_counts

# ------------------------------------------------------------------------------ the iterator


# The keys of a masked-query batch that `build_pretraining_batch` reads.
MASKED_QUERY_KEYS = MASKED_BATCH_KEYS


def masked_query_batches(corpus: str = "toy", strategy: str = "salient_span",
                         **kwargs) -> SeqioBatches:
  """Masked-query batches of `realm_<corpus>_<strategy>` (a `SeqioBatches` taking its arguments),
  the input of `PretrainingBatches`: query_ids, query_mask [B, 96], mlm_positions, mlm_targets,
  mlm_weights [B, 10], source_uid int64 [B] (the uint64 uid's bits).
  """
  kwargs.setdefault("feature_keys", MASKED_QUERY_KEYS)
  return SeqioBatches(f"realm_{corpus}_{strategy}", **kwargs)


# A Retriever, an IndexWatcher of Retrievers (anything with `.current`), or a provider function.
RetrieverOrProvider = Union[Retriever, Any, Callable[[], Retriever]]


class PretrainingBatches:
  """REALM pretraining batches: masked queries + candidates from the current index.

  For each batch of `masked`: retrieve the top `num_candidates + retrieval_margin` blocks with
  the current `Retriever`, then yield `build_pretraining_batch`'s batch (REALM_SPEC 11-13, 21).
  Skipped examples stay in the batch with zero weights; their counts accumulate in
  `skip_counts()`.
  """

  def __init__(self, masked: SeqioBatches, store: block_store_lib.BlockStore,
               retriever: RetrieverOrProvider, *,
               num_candidates: int = DEFAULT_NUM_CANDIDATES,
               retrieval_margin: int = 0, duplicates: str = "skip",
               reader_len: Optional[int] = None, null_document: bool = True,
               oracle_blocks: int = 0):
    """Wraps a masked-query iterator.

    Args:
      masked: masked-query batches (`masked_query_batches`), or any such iterator with
        `state()`/`restore()`.
      retriever: a `Retriever`; an `IndexWatcher` (its `current` is read once per batch, so a swap
        takes effect at the next batch); a function returning one; or later, `set_retriever`.
      retrieval_margin: extra neighbours beyond num_candidates (used by duplicates="dedupe" only).
      reader_len: reader row length; default query_len + store.max_block_len.
      num_candidates, duplicates, null_document: as `select_candidates`.
      oracle_blocks: put up to this many blocks of another document that state the masked span
        first among each query's retrieved blocks (`stating_blocks`, a diagnostic; 0: off).
    """
    if num_candidates < 1 or retrieval_margin < 0 or oracle_blocks < 0:
      raise ValueError(f"need num_candidates >= 1, retrieval_margin >= 0 and oracle_blocks >= 0, "
                       f"got {num_candidates}, {retrieval_margin} and {oracle_blocks}")
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
    self._skips = SkipCounter({reason: 0 for reason in SKIP_REASONS})
    self._examples = 0
    self._last_index_step: Optional[int] = None
    self.oracle_blocks = int(oracle_blocks)
    self._stating = stating_blocks.lookup(store) if oracle_blocks else None
    self._oracle_rows = 0  # examples that got at least one stating block first

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
    if self._stating is not None:
      retrieved_ids, rows = stating_blocks.with_stating_first(self._stating, masked, retrieved_ids,
                                                              self.oracle_blocks)
      self._oracle_rows += rows
    batch, skips = build_pretraining_batch(
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
    `index_step`): `pretraining_batch_spec` over the masked queries' spec."""
    return pretraining_batch_spec(
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
    if self._stating is not None:
      out["retrieval/oracle_fraction"] = (self._oracle_rows / self._examples
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
    if self._stating is not None:
      state["oracle_rows"] = self._oracle_rows
    return state

  def restore(self, state: Mapping[str, Any]) -> None:
    """Restores the masked-query position (and the skip counts) from `state()`."""
    state = dict(state)
    skips = state.pop("skip_counts", None)
    examples = state.pop("examples", None)
    last = state.pop("last_index_step", None)
    self._oracle_rows = int(state.pop("oracle_rows", 0) or 0)
    self.masked.restore(state)
    self._skips = SkipCounter({reason: 0 for reason in SKIP_REASONS})
    for reason, count in (skips or {}).items():
      self._skips[reason] = int(count)
    self._examples = int(examples or 0)
    self._last_index_step = None if last is None else int(last)
