"""Inverse Cloze Task examples: the retriever's warm start (REALM_SPEC 14, from ORQA).

One sentence of a block is the pseudo-query; the block is the "document" it should retrieve.
With probability `remove_probability` (0.9) the sentence is removed from the block, so the
retriever must match on context; otherwise it stays (some exact-match signal). As ORQA's
`ict_dataset.py`: the sentence drawn uniformly, the removal coin independent, the title cut to
`block_len - 3` wordpieces and the body to what is left. Unlike ORQA (which dropped only removed
single-sentence blocks), every example with an empty block body or an empty query sentence is
dropped. The loss lives in `models/losses.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from realm_jax.data.masking import SkipCounter
from realm_jax.data.sentences import split_sentences
from realm_jax.data.vocab import CLS_ID, SEP_ID, WordPieceVocabulary, default_vocabulary

QUERY_LEN = 64
BLOCK_LEN = 288
REMOVE_PROBABILITY = 0.9


def query_and_block_rows(query_tokens, title_tokens, body_tokens, *, query_len: int,
                         block_len: int) -> dict[str, np.ndarray]:
  """ICT's two rows: the query `[CLS] query [SEP]` (cut to query_len) and the block
  `[CLS] title [SEP] body [SEP]` with type ids 1 on the body (the caller has cut title and body
  to fit block_len), zero-padded, with their masks."""
  # [query_len]
  query_tokens = query_tokens[:query_len - 2]
  query_ids = np.zeros([query_len], np.int32)
  query_ids[:len(query_tokens) + 2] = [CLS_ID, *query_tokens, SEP_ID]
  query_mask = (np.arange(query_len) < len(query_tokens) + 2).astype(np.int32)
  # [block_len]
  num_title, num_body = len(title_tokens) + 2, len(body_tokens) + 1  # with CLS/SEP and SEP
  block_ids = np.zeros([block_len], np.int32)
  block_ids[:num_title + num_body] = [CLS_ID, *title_tokens, SEP_ID, *body_tokens, SEP_ID]
  block_type_ids = np.zeros([block_len], np.int32)
  block_type_ids[num_title:num_title + num_body] = 1
  block_mask = (np.arange(block_len) < num_title + num_body).astype(np.int32)
  return {"query_ids": query_ids, "query_mask": query_mask, "block_ids": block_ids,
          "block_type_ids": block_type_ids, "block_mask": block_mask}


def make_ict_example(title: str, body_text: str, *, rng: np.random.Generator,
                     vocab: WordPieceVocabulary | None = None, query_len: int = QUERY_LEN,
                     block_len: int = BLOCK_LEN, remove_probability: float = REMOVE_PROBABILITY,
                     skips: SkipCounter | None = None) -> dict[str, Any] | None:
  """One ICT example from a block (its title and body text), or None with the reason counted in
  `skips`: "no_sentences", "empty_query_sentence", "empty_block_body" (a removed single sentence,
  or a title filling the block). `rng` is the only source of randomness (one draw picks the
  sentence, one the removal); the query sentence is cut to query_len - 2 wordpieces.

  Returns:
    query_ids, query_mask: int32 [query_len].
    block_ids, block_type_ids, block_mask: int32 [block_len] (type ids 1 on body [SEP]).
    block_uid: uint64 `block_store.content_uid(title, body_text)` of the original block (with the
      sentence), the uid the index knows it by.
    sentence_removed: bool; query_sentence_index: int32.
  """
  # Imported here: ICT needs nothing else of the BlockStore module.
  from realm_jax.data.block_store import content_uid

  vocab = vocab or default_vocabulary()
  skips = skips if skips is not None else SkipCounter()
  if query_len < 3 or block_len < 4:
    raise ValueError(f"query_len must be >= 3 and block_len >= 4, got {query_len}, {block_len}.")

  sentences = split_sentences(body_text)  # [(byte_start, byte_limit)]
  if not sentences:
    return skips.skip("no_sentences")
  # One tokeniser pass over the body; each wordpiece belongs to the sentence holding its first
  # byte (sentences are separated by whitespace, so no wordpiece straddles two).
  ids, starts, _ = vocab.tokenize_with_offsets(body_text)
  sentence_of = np.searchsorted([s for s, _ in sentences], starts, side="right") - 1

  query_index = int(rng.integers(len(sentences)))
  removed = bool(rng.random() < remove_probability)

  query_tokens = [t for t, s in zip(ids, sentence_of) if s == query_index]
  if not query_tokens:
    return skips.skip("empty_query_sentence")
  body_tokens = [t for t, s in zip(ids, sentence_of) if not (removed and s == query_index)]

  # Title first, cut to leave room for the three special tokens; the body fills the rest and
  # loses its end if it must (as ORQA's pad_or_truncate_pair).
  title_tokens = vocab.encode(title)[:block_len - 3]
  body_tokens = body_tokens[:block_len - 3 - len(title_tokens)]
  if not body_tokens:
    return skips.skip("empty_block_body")

  return {
      **query_and_block_rows(query_tokens, title_tokens, body_tokens, query_len=query_len,
                             block_len=block_len),
      "block_uid": np.uint64(content_uid(title, body_text)),
      "sentence_removed": np.bool_(removed),
      "query_sentence_index": np.int32(query_index),
  }
