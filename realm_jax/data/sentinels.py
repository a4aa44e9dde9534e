"""T5 span corruption on wordpiece ids, with BERT's `[unused*]` tokens as sentinels: the query
and target of Atlas's masked-language-modelling pretext task (Izacard et al. 2022, sec. 2.3;
Raffel et al. 2020, sec. 3.1.4).

About `noise_density` of a text's units are hidden in spans of `mean_span_length` on average
(T5's 0.15 and 3); the k-th span is replaced in the input by the k-th sentinel, and the target
lists the spans, each after its sentinel:

  ids        the cat sat on the mat .        spans (1, 2) and (4, 6)
  inputs     the s_0 sat on s_1 .
  targets    s_0 cat s_1 the mat

Sentinels are `[unused0]` .. `[unused98]` (ids 1 .. 99), which WordPiece never produces from
text; `SentinelVocabulary` reads their names back to those ids. Units are wordpieces or, with
`word_starts`, whole words. How spans are drawn, and the one departure from T5 (the first and
last runs may be empty): docs/design/data_index_batches.md.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional, Sequence

import numpy as np

from realm_jax.data import vocab as vocab_lib

NOISE_DENSITY = 0.15  # T5's
MEAN_SPAN_LENGTH = 3.0  # T5's
NUM_SENTINELS = 99  # [unused0] .. [unused98]: BERT uncased's ids 1 .. 99
_SENTINEL_NAME = re.compile(r"\[unused(\d+)\]")


def sentinel_name(k: int) -> str:
  """The vocabulary token of the k-th sentinel: `[unused<k>]`."""
  return f"[unused{int(k)}]"


@functools.lru_cache(maxsize=None)
def _sentinel_ids(vocab: vocab_lib.WordPieceVocabulary) -> tuple[int, ...]:
  ids = []
  for k in range(NUM_SENTINELS):
    name = sentinel_name(k)
    if name not in vocab.token_ids:
      raise ValueError(f"{vocab.vocab_path}: no {name} token (BERT's [unused*] tokens are the "
                       f"sentinels of span corruption)")
    ids.append(vocab.token_ids[name])
  return tuple(ids)


def sentinel_ids(vocab: Optional[vocab_lib.WordPieceVocabulary] = None) -> tuple[int, ...]:
  """The ids of `[unused0]` .. `[unused98]` in `vocab` (the bundled BERT uncased by default),
  the k-th span's sentinel first.

  Raises:
    ValueError: the vocabulary lacks one of them.
  """
  return _sentinel_ids(vocab or vocab_lib.default_vocabulary())


# ------------------------------------------------------------------------------ span choice


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator
                         ) -> np.ndarray:
  """`num_items` cut into `num_segments` non-empty runs, every cut uniformly at random (T5's
  `_random_segmentation`): lengths int64 [num_segments], summing to num_items."""
  cuts = np.sort(rng.choice(num_items - 1, size=num_segments - 1, replace=False) + 1)
  return np.diff(np.concatenate([[0], cuts, [num_items]]))


def span_counts(num_units: int, noise_density: float = NOISE_DENSITY,
                mean_span_length: float = MEAN_SPAN_LENGTH) -> tuple[int, int]:
  """(noise units, noise spans) of a sequence of `num_units` (T5's numbers; spans at most one
  more than the other units, so that a unit separates every two spans).

  Raises:
    ValueError: fewer than 2 units, or a density outside (0, 1) or a mean length < 1.
  """
  if not 0.0 < noise_density < 1.0:
    raise ValueError(f"noise_density={noise_density!r}: expected a fraction in (0, 1)")
  if not mean_span_length >= 1.0:
    raise ValueError(f"mean_span_length={mean_span_length!r}: expected >= 1")
  if num_units < 2:
    raise ValueError(f"span corruption needs at least 2 units (one noise, one kept); got "
                     f"{num_units}")
  num_noise = min(max(int(round(num_units * noise_density)), 1), num_units - 1)
  num_spans = max(int(round(num_noise / mean_span_length)), 1)
  num_spans = min(num_spans, num_units - num_noise + 1)
  return num_noise, num_spans


def random_spans_noise_mask(num_units: int, rng: np.random.Generator, *,
                            noise_density: float = NOISE_DENSITY,
                            mean_span_length: float = MEAN_SPAN_LENGTH) -> np.ndarray:
  """Which of `num_units` units are noise, bool [num_units]: T5's counts and cuts, except that the
  runs before the first and after the last span may be empty.
  """
  num_noise, num_spans = span_counts(num_units, noise_density, mean_span_length)
  num_kept = num_units - num_noise
  noise_lengths = _random_segmentation(num_noise, num_spans, rng)
  # num_spans + 1 kept runs, the first and last possibly empty: cut num_kept + 2 into non-empty
  # runs and take one unit off each end.
  kept_lengths = _random_segmentation(num_kept + 2, num_spans + 1, rng)
  kept_lengths[0] -= 1
  kept_lengths[-1] -= 1
  mask = np.zeros((num_units,), bool)
  position = 0
  for kept, noise in zip(kept_lengths[:-1], noise_lengths):
    position += int(kept)
    mask[position:position + int(noise)] = True
    position += int(noise)
  return mask


def noise_spans(token_mask: Sequence[bool]) -> list[tuple[int, int]]:
  """The maximal runs of True in `token_mask`: [(start, limit)] in order."""
  spans, start = [], None
  for i, noise in enumerate(list(token_mask) + [False]):
    if noise and start is None:
      start = i
    elif not noise and start is not None:
      spans.append((start, i))
      start = None
  return spans


def word_starts(ids: Sequence[int], vocab: Optional[vocab_lib.WordPieceVocabulary] = None
                ) -> np.ndarray:
  """bool [n]: where a word starts, i.e. the wordpiece is not a `##` continuation."""
  vocab = vocab or vocab_lib.default_vocabulary()
  return vocab.word_start_table[np.asarray(ids, np.int64)]


# ------------------------------------------------------------------------------ corruption


@dataclasses.dataclass(frozen=True, eq=False)
class SpanCorruption:
  """One corrupted sequence.

  Attributes:
    inputs: int32 [n - noise + spans]: the ids with each span replaced by its sentinel.
    targets: int32 [noise + spans]: s_0 span_0 s_1 span_1 ... (no EOS).
    spans: [(start, limit)] of the masked wordpieces in the original ids, in order.
  """
  inputs: np.ndarray
  targets: np.ndarray
  spans: tuple[tuple[int, int], ...]


def corrupt(ids: Sequence[int], spans: Sequence[tuple[int, int]],
            sentinels: Optional[Sequence[int]] = None) -> SpanCorruption:
  """The inputs and targets of `ids` with the given spans masked.

  Args:
    ids: wordpiece ids (no [CLS]/[SEP]).
    spans: [(start, limit)] in increasing order, non-empty, not overlapping and not touching
      (two touching spans would be one).
    sentinels: the sentinel ids, the k-th span's k-th (`sentinel_ids()` by default).

  Raises:
    ValueError: bad spans, more spans than sentinels, or ids that are sentinels already.
  """
  ids = [int(i) for i in ids]
  sentinels = list(sentinel_ids() if sentinels is None else sentinels)
  if len(spans) > len(sentinels):
    raise ValueError(f"{len(spans)} spans but only {len(sentinels)} sentinels")
  if set(ids) & set(sentinels):
    raise ValueError("the ids already hold a sentinel id: the corrupted input would be "
                     "ambiguous")
  previous = -1
  for start, limit in spans:
    if not (previous < start < limit <= len(ids)):
      raise ValueError(f"spans {list(spans)} of {len(ids)} ids: expected increasing, non-empty, "
                       f"separated spans inside the ids")
    previous = limit
  inputs, targets, position = [], [], 0
  for k, (start, limit) in enumerate(spans):
    inputs += ids[position:start] + [sentinels[k]]
    targets += [sentinels[k]] + ids[start:limit]
    position = limit
  inputs += ids[position:]
  return SpanCorruption(np.asarray(inputs, np.int32), np.asarray(targets, np.int32),
                        tuple((int(s), int(e)) for s, e in spans))


def span_corruption(ids: Sequence[int], rng: np.random.Generator, *,
                    noise_density: float = NOISE_DENSITY,
                    mean_span_length: float = MEAN_SPAN_LENGTH,
                    unit_starts: Optional[Sequence[bool]] = None,
                    sentinels: Optional[Sequence[int]] = None) -> SpanCorruption:
  """T5 span corruption of `ids` (module docstring).

  Args:
    ids: wordpiece ids (no [CLS]/[SEP]).
    rng: the numpy Generator the spans are drawn with.
    noise_density, mean_span_length: T5's 0.15 and 3, counted in units.
    unit_starts: bool [n], True where a unit starts (the first must be): spans cover whole
      units (`word_starts` for whole words). None: every wordpiece is a unit.
    sentinels: the sentinel ids (`sentinel_ids()` by default).

  Raises:
    ValueError: fewer than 2 units, or what `corrupt` raises.
  """
  num_ids = len(ids)
  starts = (np.ones((num_ids,), bool) if unit_starts is None
            else np.asarray(unit_starts, bool))
  if starts.shape != (num_ids,) or (num_ids and not starts[0]):
    raise ValueError(f"unit_starts must be bool [{num_ids}] with the first True")
  unit_of = np.cumsum(starts) - 1  # [n]: each wordpiece's unit
  unit_mask = random_spans_noise_mask(int(starts.sum()), rng, noise_density=noise_density,
                                      mean_span_length=mean_span_length)
  return corrupt(ids, noise_spans(unit_mask[unit_of]), sentinels)


# ------------------------------------------------------------------------------ as text


def corrupted_text(text: str, starts: Sequence[int], limits: Sequence[int],
                   spans: Sequence[tuple[int, int]]) -> str:
  """`text` with the bytes of each span's wordpieces replaced by its sentinel's name, spaced:
  "Alpha was born in [unused0] in [unused1] ." (`starts`/`limits` are the wordpieces' byte
  offsets in `text`, `WordPieceVocabulary.tokenize_with_offsets`). With spans of whole words,
  `SentinelVocabulary.encode` of it gives the corrupted ids (the callers check)."""
  data = text.encode("utf-8")
  pieces, position = [], 0
  for k, (start, limit) in enumerate(spans):
    pieces.append(data[position:int(starts[start])].decode("utf-8").strip())
    pieces.append(sentinel_name(k))
    position = int(limits[limit - 1])
  pieces.append(data[position:].decode("utf-8").strip())
  return " ".join(p for p in pieces if p)


class SentinelVocabulary(vocab_lib.WordPieceVocabulary):
  """The WordPiece vocabulary, with the sentinels' names read as their ids by `encode` (module
  docstring). Only `encode` differs: offsets (`tokenize_with_offsets`, the blocks' text), the
  batch and TensorFlow encoders are the vocabulary's."""

  def __init__(self, vocab_path: str | None = None, backend: Optional[str] = None):
    super().__init__(vocab_path, backend)
    self.sentinel_ids = tuple(self.token_ids[sentinel_name(k)] for k in range(NUM_SENTINELS))

  def encode(self, text: str) -> list[int]:
    """WordPiece ids of `text` (no [CLS]/[SEP]); `[unused<k>]` (k < 99) is the k-th
    sentinel's id, the text around it encoded as WordPiece does."""
    ids, position = [], 0
    for match in _SENTINEL_NAME.finditer(text):
      k = int(match.group(1))
      if k >= NUM_SENTINELS:
        continue
      ids += super().encode(text[position:match.start()]) + [self.sentinel_ids[k]]
      position = match.end()
    return ids + super().encode(text[position:])

  def __eq__(self, other) -> bool:
    return isinstance(other, SentinelVocabulary) and other.fingerprint == self.fingerprint

  def __hash__(self) -> int:
    return hash(("sentinels", self.fingerprint))


@functools.lru_cache(maxsize=None)
def sentinel_vocabulary() -> SentinelVocabulary:
  """The bundled BERT uncased vocabulary reading sentinel names (loaded once per process)."""
  return SentinelVocabulary()
