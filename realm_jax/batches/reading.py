"""The toy BERT's reading examples: a masked sentence read beside a document that states it.

The toy world has no BERT to start REALM's encoder from, so the project trains one
(`experiments/toy_bert.gin`) on reading worlds (`toy_world.reading_world_dir`): fresh worlds
that share no name with the toy world, so it learns to read rather than to know. An example is
REALM's encoder row for one candidate (`pretraining_batches.reader_inputs`):
`[CLS] masked sentence [SEP] body [SEP]`, its masking (salient span or random tokens) and its
context ("own", "copy", "distractor", "null") drawn per example (`ReadingMix`). Why each
context: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from realm_jax.data import block_store as block_store_lib
from realm_jax.data import masking
from realm_jax.data import vocab as vocab_lib
from realm_jax.batches import pretraining_batches

CONTEXTS = ("own", "copy", "distractor", "null")


@dataclasses.dataclass(frozen=True)
class ReadingMix:
  """How often each kind of example is drawn (the rest: salient span read with its own block),
  and `body_mask_probability`: BERT's random-token masking of the body as well (every body
  wordpiece masked independently, into the target slots the sentence left free), which gives a
  row many more targets, most of them words that stand elsewhere in the row."""

  random_token_fraction: float = 0.3
  distractor_fraction: float = 0.1
  null_fraction: float = 0.05
  copy_fraction: float = 0.0
  body_mask_probability: float = 0.0

  def __post_init__(self):
    fractions = ("random_token_fraction", "distractor_fraction", "null_fraction",
                 "copy_fraction", "body_mask_probability")
    for name in fractions:
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"ReadingMix: {name}={getattr(self, name)} is not in [0, 1].")
    if self.distractor_fraction + self.null_fraction + self.copy_fraction > 1.0:
      raise ValueError("ReadingMix: distractor_fraction + null_fraction + copy_fraction "
                       "exceeds 1.")


def blocks_by_title(store: block_store_lib.BlockStore) -> dict[str, list[int]]:
  """Document title -> its block ids, in order."""
  blocks: dict[str, list[int]] = {}
  for block_id in range(store.num_blocks):
    blocks.setdefault(store.title(block_id), []).append(block_id)
  return blocks


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
  """Whether `needle` occurs as a contiguous run in `haystack` (both int 1-D)."""
  n = needle.size
  if n == 0 or n > haystack.size:
    return n == 0
  windows = np.lib.stride_tricks.sliding_window_view(haystack, n)  # [len - n + 1, n]
  return bool((windows == needle).all(axis=1).any())


def own_block(store: block_store_lib.BlockStore, block_ids: Sequence[int],
              targets: np.ndarray) -> int:
  """The first of a document's blocks whose body holds `targets` contiguously (a masked name or
  date), else the one holding most of them (random tokens)."""
  bodies = [store.body_tokens(b) for b in block_ids]
  for block_id, body in zip(block_ids, bodies):
    if _contains(body, targets):
      return block_id
  counts = [np.isin(targets, body).sum() for body in bodies]
  return block_ids[int(np.argmax(counts))]


def _copy_row(query: masking.MaskedQuery, store: block_store_lib.BlockStore, block_id: int,
              reader_len: int) -> dict:
  """`[CLS] masked sentence [SEP] sentence body [SEP]`: the "copy" context (the body cut at its
  end to fit, as `reader_inputs` cuts it)."""
  query_len = int(query.query_mask.sum())
  real = query.mlm_weights > 0
  sentence = query.query_ids[:query_len].copy()  # [CLS] s [SEP] with its masks
  sentence[query.mlm_positions[real]] = query.mlm_targets[real]  # the words themselves
  context = np.concatenate([sentence[1:-1], store.body_tokens(block_id)])
  context = context[:reader_len - query_len - 1]
  row = np.concatenate([query.query_ids[:query_len], context,
                        [vocab_lib.SEP_ID]]).astype(np.int32)
  ids = np.full([reader_len], vocab_lib.PAD_ID, np.int32)
  ids[:row.size] = row
  type_ids = np.zeros([reader_len], np.int32)
  type_ids[query_len:row.size] = 1
  mask = (np.arange(reader_len) < row.size).astype(np.int32)
  return {"input_ids": ids, "type_ids": type_ids, "input_mask": mask,
          "mlm_positions": query.mlm_positions, "mlm_targets": query.mlm_targets,
          "mlm_weights": query.mlm_weights, "context": "copy"}


def _mask_body(row: dict, rng: np.random.Generator, probability: float) -> dict:
  """Masks every body wordpiece of `row` with `probability` (all become [MASK], REALM's
  convention), as targets in the slots the sentence left free (the first ones, in order, when
  more are drawn than fit)."""
  if probability == 0.0:
    return row
  ids = row["input_ids"].copy()
  # [reader_len] body wordpieces: segment 1 less its closing [SEP]
  body = (row["type_ids"] == 1) & (row["input_mask"] == 1) & (ids != vocab_lib.SEP_ID)
  free = np.flatnonzero(row["mlm_weights"] == 0)  # [F] target slots
  drawn = np.flatnonzero(body & (rng.random(ids.size) < probability))[:free.size]
  positions, targets, weights = (row[k].copy() for k in
                                 ("mlm_positions", "mlm_targets", "mlm_weights"))
  slots = free[:drawn.size]
  positions[slots], targets[slots], weights[slots] = drawn, ids[drawn], 1.0
  ids[drawn] = vocab_lib.MASK_ID
  return {**row, "input_ids": ids, "mlm_positions": positions, "mlm_targets": targets,
          "mlm_weights": weights}


def make_reading_example(record: Mapping[str, Any], store: block_store_lib.BlockStore,
                         title_blocks: Mapping[str, Sequence[int]], *, rng: np.random.Generator,
                         mix: ReadingMix = ReadingMix(), query_len: int, reader_len: int,
                         max_masks: int, strategy: str | None = None, context: str | None = None,
                         vocab: vocab_lib.WordPieceVocabulary | None = None,
                         skips: masking.SkipCounter | None = None) -> dict | None:
  """One reading example of a REALM-schema record of X whose title names a document of `store`.

  Args:
    record: the passage (`salient_spans.read_precomputed` schema).
    title_blocks: `blocks_by_title(store)`.
    rng: the only source of randomness.
    mix: the draw of masking and context when `strategy` / `context` are None.
    strategy, context: fix the masking ("salient_span", "random_token") or the context.
    skips: counts the reason whenever None is returned.

  Returns:
    {"input_ids", "type_ids", "input_mask"} int32 [reader_len], {"mlm_positions",
    "mlm_targets"} int32 and "mlm_weights" float32 [max_masks], and "context" (str); None when
    the record gives no example (reason counted in `skips`).
  """
  skips = skips if skips is not None else masking.SkipCounter()
  own_blocks = title_blocks.get(record["title"])
  if not own_blocks:
    skips["title_not_in_corpus"] += 1
    return None
  if strategy is None:
    strategy = "random_token" if rng.random() < mix.random_token_fraction else "salient_span"
  if context is None:
    draw = rng.random()
    context = ("null" if draw < mix.null_fraction else
               "distractor" if draw < mix.null_fraction + mix.distractor_fraction else
               "copy" if draw < mix.null_fraction + mix.distractor_fraction + mix.copy_fraction
               else "own")
  if context not in CONTEXTS:
    raise ValueError(f"context={context!r} is not one of {CONTEXTS}.")
  query = masking.make_masked_query(record, strategy=strategy, rng=rng, vocab=vocab,
                                    query_len=query_len, max_masks=max_masks, skips=skips)
  if query is None:
    return None
  targets = query.mlm_targets[query.mlm_weights > 0]
  if context == "copy":
    row = _copy_row(query, store, own_block(store, own_blocks, targets), reader_len)
    return _mask_body(row, rng, mix.body_mask_probability)
  if context == "own":
    block_id = own_block(store, own_blocks, targets)
  elif context == "distractor":
    own = set(own_blocks)
    block_id = int(rng.integers(store.num_blocks))
    while block_id in own:  # a world has thousands of documents: this ends at once
      block_id = int(rng.integers(store.num_blocks))
  else:
    block_id = pretraining_batches.NULL_BLOCK
  # [1, 1, reader_len] each: `[CLS] masked sentence [SEP] body [SEP]`
  ids, type_ids, mask = pretraining_batches.reader_inputs(
      store, query.query_ids[None], query.query_mask[None], [[block_id]], reader_len=reader_len)
  row = {"input_ids": ids[0, 0], "type_ids": type_ids[0, 0], "input_mask": mask[0, 0],
         "mlm_positions": query.mlm_positions, "mlm_targets": query.mlm_targets,
         "mlm_weights": query.mlm_weights, "context": context}
  return _mask_body(row, rng, mix.body_mask_probability)
