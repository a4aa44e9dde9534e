"""Masked queries for REALM pretraining: salient-span masking and the two ablations.

A pretraining example is one sentence of X with masked wordpieces (REALM_SPEC 9-11):
"salient_span" (REALM: one (span, sentence) pair drawn uniformly, spans crossing a sentence
boundary dropped), "random_span" (SpanBERT-style spans of whole words, 15% of the sentence),
"random_token" (BERT-style, each wordpiece with probability 0.15) and
"random_token_knowledge" (a diagnostic: random_token conditioned on masking a salient span).
Every chosen wordpiece becomes [MASK] (REALM's convention, not BERT's 80/10/10). A
`MaskedQuery` is `[CLS] sentence [SEP]` padded to query_len (96), with up to max_masks (10)
targets whose positions index the query and, unchanged, the reader row `[CLS] q [SEP] body
[SEP]`. Pure Python/NumPy, deterministic given the numpy Generator passed in.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from realm_jax.data.salient_spans import annotate_record  # noqa: F401  (re-exported helper)
from realm_jax.data.vocab import CLS_ID, MASK_ID, SEP_ID, WordPieceVocabulary, default_vocabulary

QUERY_LEN = 96
MAX_MASKS = 10


class SkipCounter(collections.Counter):
  """Reasons for skipped examples -> counts, so a long job reports them instead of dying.

  A `collections.Counter`, so counters from several workers add with `+`.
  """

  def skip(self, reason: str) -> None:
    """Counts one skipped example under `reason`; returns None so builders can
    `return skips.skip("...")`."""
    self[reason] += 1

  def summary(self) -> str:
    """One line, e.g. "skipped 3: span_truncated=2, no_span_in_sentence=1"."""
    if not self:
      return "skipped 0"
    parts = ", ".join(f"{reason}={count}" for reason, count in sorted(self.items()))
    return f"skipped {sum(self.values())}: {parts}"


# eq=False: fields are arrays, whose == is elementwise.
@dataclasses.dataclass(frozen=True, eq=False)
class MaskedQuery:
  """One masked pretraining query.

  Attributes:
    query_ids: int32 [query_len]: [CLS] masked sentence [SEP], then 0 padding.
    query_mask: int32 [query_len]: 1 on [CLS], sentence and [SEP]; 0 on padding. (Segment ids
      are 0 everywhere for a query, so none are stored.)
    mlm_positions: int32 [max_masks]: positions in `query_ids` of the masked wordpieces that
      have targets, in increasing order; padding slots are 0.
    mlm_targets: int32 [max_masks]: original wordpiece ids at those positions; padding 0.
    mlm_weights: float32 [max_masks]: 1.0 for real targets, 0.0 for padding.
    source_uid: uint64 uid of the block of Z this text came from (0: none), so retrieval can
      drop the trivial candidate (REALM_SPEC 12).
    span_byte_start, span_byte_limit: the masked span in bytes of the record's text (for
      debugging; random_span's several spans: from the first masked wordpiece to the last;
      -1 for random_token, whose masks need not be contiguous).
    sentence_index: which of the record's sentences is the query.
  """

  query_ids: np.ndarray
  query_mask: np.ndarray
  mlm_positions: np.ndarray
  mlm_targets: np.ndarray
  mlm_weights: np.ndarray
  source_uid: np.uint64
  span_byte_start: int
  span_byte_limit: int
  sentence_index: int

  def to_dict(self) -> dict[str, np.ndarray]:
    """Feature dict of NumPy arrays (scalars as 0-d arrays), e.g. for tf.data/seqio."""
    return {
        "query_ids": self.query_ids,
        "query_mask": self.query_mask,
        "mlm_positions": self.mlm_positions,
        "mlm_targets": self.mlm_targets,
        "mlm_weights": self.mlm_weights,
        "source_uid": np.asarray(self.source_uid, np.uint64),
        "span_byte_start": np.asarray(self.span_byte_start, np.int64),
        "span_byte_limit": np.asarray(self.span_byte_limit, np.int64),
        "sentence_index": np.asarray(self.sentence_index, np.int32),
    }


@dataclasses.dataclass(frozen=True)
class _Sentence:
  """A record sentence, tokenised; offsets relative to the sentence's first byte."""

  index: int
  byte_start: int
  ids: list[int]
  starts: list[int]
  limits: list[int]


def _tokenize_sentence(record: Mapping[str, Any], index: int,
                       vocab: WordPieceVocabulary, data: bytes | None = None) -> _Sentence:
  data = data if data is not None else record["text"].encode("utf-8")
  start = record["sentence_byte_start"][index]
  limit = record["sentence_byte_limit"][index]
  ids, starts, limits = vocab.tokenize_with_offsets(data[start:limit].decode("utf-8"))
  return _Sentence(index, start, ids, starts, limits)


def _build_query(sentence: _Sentence, masked: Sequence[int], *, query_len: int, max_masks: int,
                 source_uid: int, span: tuple[int, int]) -> MaskedQuery:
  """Assembles a MaskedQuery; `masked` are sorted indices into the sentence's wordpieces, all
  < query_len - 2 (checked by the callers, which count a skip instead)."""
  kept = sentence.ids[:query_len - 2]  # the sentence is truncated to leave room for CLS/SEP
  tokens = list(kept)
  for i in masked:
    tokens[i] = MASK_ID
  # [query_len]
  query_ids = np.zeros([query_len], np.int32)
  query_ids[:len(tokens) + 2] = [CLS_ID, *tokens, SEP_ID]
  query_mask = np.zeros([query_len], np.int32)
  query_mask[:len(tokens) + 2] = 1
  # [max_masks]: only the first max_masks masked wordpieces get targets; the rest stay [MASK]
  # without one (as the release's truncate_or_pad). Padding slots are (0, 0, 0.0).
  with_target = list(masked[:max_masks])
  mlm_positions = np.zeros([max_masks], np.int32)
  mlm_targets = np.zeros([max_masks], np.int32)
  mlm_weights = np.zeros([max_masks], np.float32)
  mlm_positions[:len(with_target)] = [1 + i for i in with_target]  # +1: after [CLS]
  mlm_targets[:len(with_target)] = [kept[i] for i in with_target]
  mlm_weights[:len(with_target)] = 1.0
  return MaskedQuery(query_ids=query_ids, query_mask=query_mask, mlm_positions=mlm_positions,
                     mlm_targets=mlm_targets, mlm_weights=mlm_weights,
                     source_uid=np.uint64(source_uid), span_byte_start=int(span[0]),
                     span_byte_limit=int(span[1]), sentence_index=sentence.index)


def spans_by_sentence(record: Mapping[str, Any]) -> list[tuple[tuple[int, int], int]]:
  """The (span, sentence index) pairs salient-span masking draws from.

  Each distinct span goes to the first sentence (in record order) that fully contains it;
  a span contained in no sentence (one that crosses a boundary) is dropped.

  Returns:
    [((byte_start, byte_limit), sentence_index)] in order of first appearance.
  """
  sentences = list(zip(record["sentence_byte_start"], record["sentence_byte_limit"]))
  pairs = []
  # dict.fromkeys dedupes but keeps order: the release keyed its span map by span.
  for start, limit in dict.fromkeys(zip(record["span_byte_start"], record["span_byte_limit"])):
    for index, (sent_start, sent_limit) in enumerate(sentences):
      if sent_start <= start and limit <= sent_limit:
        pairs.append(((start, limit), index))
        break
  return pairs


def _contained(sentence: _Sentence, start: int, limit: int) -> np.ndarray:
  """[len(sentence.ids)] bool: the wordpieces lying entirely inside bytes [start, limit) of
  the sentence (salient-span masking's default rule, `coverage="contained"`)."""
  return ((np.asarray(sentence.starts, np.int64) >= start)
          & (np.asarray(sentence.limits, np.int64) <= limit))


def salient_wordpieces(record: Mapping[str, Any], sentence: _Sentence) -> np.ndarray:
  """[len(sentence.ids)] bool: the sentence's wordpieces lying entirely inside one of the
  record's salient spans (`_contained`)."""
  inside = np.zeros(len(sentence.ids), bool)
  for span_start, span_limit in zip(record["span_byte_start"], record["span_byte_limit"]):
    inside |= _contained(sentence, span_start - sentence.byte_start,
                         span_limit - sentence.byte_start)
  return inside


class SalientSpanMasker:
  """REALM's salient-span masking (REALM_SPEC 9-10).

  A wordpiece is masked iff it lies entirely inside the span (`coverage="contained"`, the
  release's rule and the default). A span covering only part of a wordpiece leaves that
  wordpiece visible; `coverage="overlap"` masks every wordpiece the span touches instead (the
  span "ller" of "Müller" then masks "muller"). With word-aligned spans, as annotators
  produce, the two agree.

  Skips (counted): "no_span_in_sentence" (no span lies inside a sentence),
  "span_covers_no_token", "span_truncated" (a masked wordpiece lies beyond query_len - 2).
  """

  name = "salient_span"

  def __init__(self, coverage: str = "contained"):
    if coverage not in ("overlap", "contained"):
      raise ValueError(f"coverage must be 'overlap' or 'contained', got {coverage!r}.")
    self.coverage = coverage

  def __call__(self, record, *, rng, vocab, query_len, max_masks, source_uid, skips):
    pairs = spans_by_sentence(record)
    if not pairs:
      return skips.skip("no_span_in_sentence")
    (span_start, span_limit), index = pairs[int(rng.integers(len(pairs)))]
    sentence = _tokenize_sentence(record, index, vocab)
    # The span relative to the sentence's bytes.
    start, limit = span_start - sentence.byte_start, span_limit - sentence.byte_start
    if self.coverage == "overlap":
      masked = [i for i, (a, b) in enumerate(zip(sentence.starts, sentence.limits))
                if a < limit and b > start]
    else:
      masked = np.flatnonzero(_contained(sentence, start, limit)).tolist()
    if not masked:
      return skips.skip("span_covers_no_token")
    if masked[-1] >= query_len - 2:
      return skips.skip("span_truncated")
    return _build_query(sentence, masked, query_len=query_len, max_masks=max_masks,
                        source_uid=source_uid, span=(span_start, span_limit))


def _random_sentence(record, rng, vocab, query_len, skips,
                     tokenized: dict[int, _Sentence] | None = None
                     ) -> tuple[_Sentence, int] | None:
  """A uniformly drawn sentence and how many of its wordpieces fit in the query. `tokenized`:
  the record's sentences tokenised so far, by index, for callers that draw several times."""
  num_sentences = len(record["sentence_byte_start"])
  if num_sentences == 0:
    return skips.skip("no_sentence")
  tokenized = {} if tokenized is None else tokenized
  index = int(rng.integers(num_sentences))
  if index not in tokenized:
    tokenized[index] = _tokenize_sentence(record, index, vocab)
  sentence = tokenized[index]
  num_tokens = min(len(sentence.ids), query_len - 2)
  if num_tokens == 0:
    return skips.skip("empty_sentence")
  return sentence, num_tokens


def spanbert_length_probs(p: float = 0.2, max_length: int = 10) -> np.ndarray:
  """SpanBERT's span lengths (Joshi et al. 2020, section 3.1): a geometric distribution of
  parameter `p` over 1..max_length, renormalised (mean 3.8 for p = 0.2 and 10 words).

  Returns:
    float64 [max_length]: probabilities of lengths 1..max_length.
  """
  if not 0 < p <= 1 or max_length < 1:
    raise ValueError(f"p must be in (0, 1] and max_length positive, got {p}, {max_length}.")
  lengths = np.arange(1, max_length + 1)
  probs = p * (1 - p) ** (lengths - 1)
  return probs / probs.sum()


class RandomSpanMasker:
  """Ablation: random spans (the paper's "random span" row, after SpanBERT, Joshi et al. 2020).

  By default as SpanBERT: in a uniformly drawn sentence, spans of whole words of geometric
  length (`spanbert_length_probs()`: p = 0.2, at most 10 words, mean 3.8) at uniform starts,
  drawn until `mask_budget` (15%) of its wordpieces are masked (overlapping draws redrawn, up to
  `MAX_DRAWS`). `unit="wordpiece"` counts lengths in wordpieces, `mask_budget=None` masks one
  span, `length_probs` sets the lengths (e.g. `span_length_distribution(records)`).
  Skips (counted): "no_sentence", "empty_sentence".
  """

  name = "random_span"
  MAX_DRAWS = 100

  def __init__(self, length_probs: Sequence[float] | None = None, *, unit: str = "word",
               mask_budget: float | None = 0.15):
    probs = (spanbert_length_probs() if length_probs is None
             else np.asarray(length_probs, np.float64))
    if probs.ndim != 1 or not len(probs) or (probs < 0).any() or probs.sum() <= 0:
      raise ValueError(f"length_probs must be non-negative weights of lengths 1..n, got "
                       f"{length_probs!r}.")
    if unit not in ("word", "wordpiece"):
      raise ValueError(f"unit must be 'word' or 'wordpiece', got {unit!r}.")
    if mask_budget is not None and not 0 < mask_budget <= 1:
      raise ValueError(f"mask_budget must be in (0, 1] or None, got {mask_budget!r}.")
    self.length_probs = probs / probs.sum()
    self.unit = unit
    self.mask_budget = mask_budget

  def _draw_span(self, units: list[int], num_tokens: int, rng: np.random.Generator
                 ) -> list[int]:
    """One span: the wordpiece indices of L consecutive units (words or wordpieces), `units`
    being each unit's first wordpiece."""
    length = min(1 + int(rng.choice(len(self.length_probs), p=self.length_probs)), len(units))
    first = int(rng.integers(len(units) - length + 1))
    limit = units[first + length] if first + length < len(units) else num_tokens
    return list(range(units[first], limit))

  def __call__(self, record, *, rng, vocab, query_len, max_masks, source_uid, skips):
    drawn = _random_sentence(record, rng, vocab, query_len, skips)
    if drawn is None:
      return None
    sentence, num_tokens = drawn
    # The units' first wordpieces: every wordpiece, or the word starts (the first wordpiece
    # always starts one, even a "##" piece left first by truncation).
    starts = vocab.word_start_table[np.asarray(sentence.ids[:num_tokens], np.int64)]
    starts[0] = True
    units = (list(range(num_tokens)) if self.unit == "wordpiece"
             else np.flatnonzero(starts).tolist())
    masked = self._draw_span(units, num_tokens, rng)
    if self.mask_budget is not None:
      budget = self.mask_budget * num_tokens
      for _ in range(self.MAX_DRAWS):
        if len(masked) >= budget:
          break
        span = self._draw_span(units, num_tokens, rng)
        if not set(span) & set(masked):
          masked = sorted(masked + span)
    span = (sentence.byte_start + sentence.starts[masked[0]],
            sentence.byte_start + sentence.limits[masked[-1]])
    return _build_query(sentence, masked, query_len=query_len, max_masks=max_masks,
                        source_uid=source_uid, span=span)


class RandomTokenMasker:
  """Ablation: BERT-style random-token masking (the paper's "random token" ablation).

  Each wordpiece of a uniformly drawn sentence is chosen with `mask_probability`; none chosen:
  one is drawn; more than max_masks: a uniform subset is kept, so every [MASK] has a target. All
  become [MASK] (REALM's convention). `knowledge_only` (a diagnostic, not the paper's row) draws
  again until a target lies in a salient span, so every query has a name or date for retrieval
  to supply. Skips (counted): "no_sentence", "empty_sentence"; with `knowledge_only`,
  "no_salient_span" and "no_salient_mask" (no draw of `MAX_DRAWS` masked one).
  """

  name = "random_token"
  MAX_DRAWS = 100

  def __init__(self, mask_probability: float = 0.15, *, knowledge_only: bool = False):
    if not 0.0 < mask_probability <= 1.0:
      raise ValueError(f"mask_probability must be in (0, 1], got {mask_probability}.")
    self.mask_probability = mask_probability
    self.knowledge_only = knowledge_only

  def _draw(self, record, rng, vocab, query_len, max_masks, skips, tokenized
            ) -> tuple[_Sentence, np.ndarray] | None:
    """A sentence and the sorted indices of its chosen wordpieces."""
    drawn = _random_sentence(record, rng, vocab, query_len, skips, tokenized)
    if drawn is None:
      return None
    sentence, num_tokens = drawn
    # [num_tokens] independent draws; the count is then forced into [1, max_masks].
    chosen = np.flatnonzero(rng.random(num_tokens) < self.mask_probability)
    if len(chosen) == 0:
      chosen = rng.integers(num_tokens, size=1)
    elif len(chosen) > max_masks:
      chosen = np.sort(rng.choice(chosen, size=max_masks, replace=False))
    return sentence, chosen

  def __call__(self, record, *, rng, vocab, query_len, max_masks, source_uid, skips):
    if self.knowledge_only and not len(record["span_byte_start"]):
      return skips.skip("no_salient_span")
    tokenized: dict[int, _Sentence] = {}  # a redraw may draw a sentence again
    for _ in range(self.MAX_DRAWS if self.knowledge_only else 1):
      drawn = self._draw(record, rng, vocab, query_len, max_masks, skips, tokenized)
      if drawn is None:
        return None
      sentence, chosen = drawn
      if not self.knowledge_only or salient_wordpieces(record, sentence)[chosen].any():
        return _build_query(sentence, [int(i) for i in chosen], query_len=query_len,
                            max_masks=max_masks, source_uid=source_uid, span=(-1, -1))
    return skips.skip("no_salient_mask")


MASKERS: dict[str, Callable[..., Any]] = {
    "salient_span": SalientSpanMasker,
    "random_span": RandomSpanMasker,
    "random_token": RandomTokenMasker,
    "random_token_knowledge": functools.partial(RandomTokenMasker, knowledge_only=True),
}


def get_masker(name: str, **kwargs):
  """Builds the masking strategy registered under `name` (see `MASKERS`) with `kwargs`."""
  try:
    factory = MASKERS[name]
  except KeyError:
    raise ValueError(f"Unknown masking strategy {name!r}; known: {sorted(MASKERS)}.") from None
  return factory(**kwargs)


def make_masked_query(record: Mapping[str, Any], *, strategy: str | Callable = "salient_span",
                      rng: np.random.Generator, vocab: WordPieceVocabulary | None = None,
                      query_len: int = QUERY_LEN, max_masks: int = MAX_MASKS,
                      source_uid: int = 0,
                      skips: SkipCounter | None = None) -> MaskedQuery | None:
  """One masked query from a record of the precomputed schema, or None when the record yields no
  valid example (the reason counted in `skips`).

  Args:
    record: a record as `salient_spans.validate_record` accepts (`read_precomputed` or
      `annotate_record` give such).
    strategy: a `MASKERS` name ("salient_span", "random_span", "random_token") or a masker
      instance (e.g. `RandomSpanMasker(length_probs=...)`).
    rng: the only source of randomness.
    source_uid: uid of the record's block in Z (`block_store.content_uid(title, body)`), 0 if none.
  """
  if query_len < 3:
    raise ValueError(f"query_len must be at least 3 ([CLS] w [SEP]), got {query_len}.")
  if max_masks < 1:
    raise ValueError(f"max_masks must be positive, got {max_masks}.")
  masker = get_masker(strategy) if isinstance(strategy, str) else strategy
  return masker(record, rng=rng, vocab=vocab or default_vocabulary(), query_len=query_len,
                max_masks=max_masks, source_uid=source_uid,
                skips=skips if skips is not None else SkipCounter())


def span_length_distribution(records: Iterable[Mapping[str, Any]],
                             vocab: WordPieceVocabulary | None = None,
                             max_length: int = 10) -> np.ndarray:
  """Empirical wordpiece-length distribution of salient spans, for `RandomSpanMasker`.

  Counts every (span, sentence) pair salient-span masking could draw, its length being the
  number of wordpieces it overlaps; lengths above `max_length` count as `max_length`, spans
  covering no wordpiece are ignored.

  Returns:
    float64 [max_length]: probabilities of lengths 1..max_length.
  """
  vocab = vocab or default_vocabulary()
  counts = np.zeros([max_length], np.float64)
  for record in records:
    data = record["text"].encode("utf-8")
    cache: dict[int, _Sentence] = {}
    for (start, limit), index in spans_by_sentence(record):
      if index not in cache:
        cache[index] = _tokenize_sentence(record, index, vocab, data)
      sentence = cache[index]
      start, limit = start - sentence.byte_start, limit - sentence.byte_start
      length = sum(a < limit and b > start for a, b in zip(sentence.starts, sentence.limits))
      if length:
        counts[min(length, max_length) - 1] += 1
  if counts.sum() == 0:
    raise ValueError("No salient span covers a wordpiece: cannot estimate span lengths.")
  return counts / counts.sum()
