"""Contriever's positive pairs: two independent random crops of one block (Izacard et al. 2021),
an alternative to ICT's sentence-and-block pairs for the retriever's warm start.

Each crop is `max(1, floor(ratio * n))` contiguous body wordpieces, `ratio ~ U[min_ratio,
max_ratio]` (0.1-0.5 in the paper), at a uniform start, as Contriever's `randomcrop`; the two
may overlap. The example has exactly ICT's layout (`realm_jax.data.ict`), so `IctModel` trains
on it unchanged: crop 1 is the query row `[CLS] crop1 [SEP]` (no title), crop 2 the block row
`[CLS] title [SEP] crop2 [SEP]` (the document tower always reads a title). Crops too long for
their row are cut at the end; crops count BERT wordpieces; Contriever's token deletion and
replacement augmentations are not applied.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from realm_jax.data import ict as ict_lib
from realm_jax.data.masking import SkipCounter
from realm_jax.data.vocab import WordPieceVocabulary, default_vocabulary

QUERY_LEN = 64
BLOCK_LEN = 288
MIN_CROP_RATIO = 0.1
MAX_CROP_RATIO = 0.5


def check_crop_ratios(min_ratio: float, max_ratio: float) -> None:
  """ValueError (one line, naming both) unless 0 < min_ratio <= max_ratio <= 1."""
  for value in (min_ratio, max_ratio):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ValueError(f"crop ratios must be numbers, got min_ratio={min_ratio!r}, "
                       f"max_ratio={max_ratio!r}")
  if not 0 < min_ratio <= max_ratio <= 1:
    raise ValueError(f"crop ratios must satisfy 0 < min_ratio <= max_ratio <= 1, got "
                     f"min_ratio={min_ratio!r}, max_ratio={max_ratio!r}")


def random_crop(num_tokens: int, rng: np.random.Generator, min_ratio: float = MIN_CROP_RATIO,
                max_ratio: float = MAX_CROP_RATIO) -> tuple[int, int]:
  """One crop `[start, end)` of a sequence of `num_tokens` (>= 1) wordpieces.

  Two draws, in order: `ratio = rng.uniform(min_ratio, max_ratio)`, then `start =
  rng.integers(0, num_tokens - length + 1)` with `length = max(1, floor(ratio * num_tokens))`.
  """
  check_crop_ratios(min_ratio, max_ratio)
  if num_tokens < 1:
    raise ValueError(f"random_crop needs at least one token, got {num_tokens}")
  ratio = float(rng.uniform(min_ratio, max_ratio))
  length = max(1, math.floor(ratio * num_tokens))
  start = int(rng.integers(0, num_tokens - length + 1))
  return start, start + length


def make_contriever_example(title: str, body_text: str, *, rng: np.random.Generator,
                            vocab: WordPieceVocabulary | None = None,
                            query_len: int = QUERY_LEN, block_len: int = BLOCK_LEN,
                            min_ratio: float = MIN_CROP_RATIO, max_ratio: float = MAX_CROP_RATIO,
                            skips: SkipCounter | None = None) -> dict[str, Any] | None:
  """One Contriever pair from a block, in ICT's example layout, or None with the reason counted in
  `skips`: "no_tokens" (no body wordpieces), "empty_block_body" (a title filling the block row).
  `rng` is the only source of randomness: crop 1's ratio and start, then crop 2's.

  Returns:
    query_ids, query_mask: int32 [query_len]; block_ids, block_type_ids, block_mask: int32
      [block_len] (types as ICT's); block_uid: uint64 `content_uid(title, body_text)`, the whole
      block's; query_span, block_span: int32 [2], each crop's [start, end) in the body's
      wordpieces as drawn (before any cut to its row).
  """
  from realm_jax.data.block_store import content_uid  # pylint: disable=g-import-not-at-top

  vocab = vocab or default_vocabulary()
  skips = skips if skips is not None else SkipCounter()
  if query_len < 3 or block_len < 4:
    raise ValueError(f"query_len must be >= 3 and block_len >= 4, got {query_len}, {block_len}.")
  check_crop_ratios(min_ratio, max_ratio)

  body = vocab.encode(body_text)
  if not body:
    return skips.skip("no_tokens")
  query_span = random_crop(len(body), rng, min_ratio, max_ratio)
  block_span = random_crop(len(body), rng, min_ratio, max_ratio)

  title_tokens = vocab.encode(title)[:block_len - 3]
  crop2 = body[block_span[0]:block_span[1]][:block_len - 3 - len(title_tokens)]
  if not crop2:
    return skips.skip("empty_block_body")
  crop1 = body[query_span[0]:query_span[1]]
  return {
      **ict_lib.query_and_block_rows(crop1, title_tokens, crop2, query_len=query_len,
                                     block_len=block_len),
      "block_uid": np.uint64(content_uid(title, body_text)),
      "query_span": np.array(query_span, np.int32),
      "block_span": np.array(block_span, np.int32),
  }
