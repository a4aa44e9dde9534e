"""The open-domain QA benchmarks: NaturalQuestions-Open, WebQuestions, CuratedTrec.

REALM fine-tunes and evaluates with ORQA's data (REALM_SPEC item 30): JSON lines
``{"question": str, "answer": [str, ...]}``, with ORQA's own train/dev re-split of each
benchmark's original training set (none has a public dev split): a question goes to dev iff
``tf.strings.to_hash_bucket_fast(question, 100000) % 10 == 0``
(``language/orqa/preprocessing/create_data_splits.py``); the original test set (NQ's dev set)
is the test split. CuratedTrec answers are regular expressions. Readers for ORQA's JSONL and
DPR's ``*.qa.csv`` (bad input: ``QADataError`` naming file, line and field), the re-split
(``resplit``), ``load_benchmark`` (from a directory, size-checked) and the TFDS builders
(``load_benchmark_from_tfds``). TensorFlow and tensorflow_datasets are imported lazily.
"""

from __future__ import annotations

import ast
import collections
import csv
import dataclasses
import json
import logging
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, overload

import numpy as np

log = logging.getLogger(__name__)

__all__ = [
    "BENCHMARKS",
    "BenchmarkSpec",
    "DataFile",
    "ORQA_DEV_MODULUS",
    "ORQA_NUM_HASH_BUCKETS",
    "QADataError",
    "QAExample",
    "SPLITS",
    "SkipReport",
    "SplitSizeError",
    "check_split_sizes",
    "from_tfds",
    "is_orqa_dev",
    "load_benchmark",
    "load_benchmark_from_tfds",
    "nq_open_keep_answer",
    "orqa_dev_bucket",
    "orqa_dev_mask",
    "read_dpr_csv",
    "read_orqa_jsonl",
    "resplit",
]

# ORQA's re-split: dev iff to_hash_bucket_fast(question, 100000) % 10 == 0.
ORQA_NUM_HASH_BUCKETS = 100000
ORQA_DEV_MODULUS = 10
SPLITS = ("train", "dev", "test")

OnError = Literal["raise", "skip"]

# Reasons a record is rejected; the keys of ``SkipReport.counts``.
NOT_UTF8 = "not_utf8"
MALFORMED_JSON = "malformed_json"
MALFORMED_CSV = "malformed_csv"
NOT_AN_OBJECT = "not_an_object"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
WRONG_COLUMN_COUNT = "wrong_column_count"
BAD_ANSWER_LITERAL = "bad_answer_literal"
EMPTY_QUESTION = "empty_question"
EMPTY_ANSWERS = "empty_answers"
BLANK_ANSWER = "blank_answer"


@dataclasses.dataclass(frozen=True)
class QAExample:
  """One open-QA question.

  Attributes:
    question: the question text, exactly as in the file (the re-split hashes these bytes, so it
      is never stripped or normalised).
    answers: the reference answers; regular expressions when ``answers_are_regex``.
    answers_are_regex: True for CuratedTrec, whose references are patterns.
    source: where the example came from, "file:line" (or "tfds:name/split:index", a 0-based
      record index), for messages.
  """
  question: str
  answers: tuple[str, ...]
  answers_are_regex: bool = False
  source: str = ""

  def __post_init__(self):
    # A bare string would be iterated as characters by every consumer.
    if isinstance(self.answers, str):
      raise TypeError(f"QAExample.answers must be a sequence of str, got the str {self.answers!r}"
                      f" ({self.source or 'no source'})")
    if not isinstance(self.answers, tuple):
      object.__setattr__(self, "answers", tuple(self.answers))


class QADataError(ValueError):
  """A QA data file holds a record that cannot be used.

  Attributes:
    path: the file.
    line: the 1-based line number (None when not line-based).
    field: the offending field, e.g. "answer" or "answer[2]".
    reason: a short machine-readable reason, one of the ``SkipReport.counts`` keys.
  """

  def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
               field: str | None = None, reason: str = "invalid"):
    super().__init__(message)
    self.path = path
    self.line = line
    self.field = field
    self.reason = reason


class SplitSizeError(ValueError):
  """A loaded benchmark's split sizes differ from the published ones."""


@dataclasses.dataclass
class SkipReport:
  """What ``on_error="skip"`` left out.

  Attributes:
    counts: number of skipped records per reason (``QADataError.reason``).
    examples: the messages of the first ``max_examples`` skipped records (each names file:line).
    num_kept: records read successfully.
    max_examples: how many messages to keep.
  """
  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  examples: list[str] = dataclasses.field(default_factory=list)
  num_kept: int = 0
  max_examples: int = 5

  @property
  def num_skipped(self) -> int:
    return sum(self.counts.values())

  def record(self, error: QADataError) -> None:
    """Counts one skipped record."""
    self.counts[error.reason] += 1
    if len(self.examples) < self.max_examples:
      self.examples.append(str(error))

  def update(self, other: SkipReport) -> None:
    """Adds another report's counts (e.g. of the next file) to this one."""
    self.counts.update(other.counts)
    self.num_kept += other.num_kept
    room = self.max_examples - len(self.examples)
    self.examples.extend(other.examples[:max(room, 0)])

  def summary(self) -> str:
    """One line for the log: kept, skipped per reason, first example."""
    if not self.num_skipped:
      return f"kept {self.num_kept} records, skipped none"
    reasons = ", ".join(f"{reason}={n}" for reason, n in sorted(self.counts.items()))
    return (f"kept {self.num_kept} records, skipped {self.num_skipped} ({reasons}); "
            f"first: {self.examples[0]}")


def _check_on_error(on_error: str) -> None:
  if on_error not in ("raise", "skip"):
    raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


# ------------------------------------------------------------------------------------------------
# Files.
# ------------------------------------------------------------------------------------------------


def _is_remote(path: str) -> bool:
  return "://" in path


def _exists(path: str) -> bool:
  if _is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.exists(path)
  return os.path.exists(path)


def _read_bytes(path: str) -> bytes:
  """The whole file; gs:// and other remote paths go through tf.io.gfile."""
  if _is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()


def _decoded_lines(path: str) -> Iterator[tuple[int, str | QADataError]]:
  """Yields (1-based line number, text) for every non-blank line; a line that is not UTF-8
  yields a QADataError in place of the text, so the caller can raise or skip it.

  The file is split as bytes and decoded line by line so that a bad byte is reported on its own
  line rather than as an offset into the whole file.
  """
  # bytes.splitlines splits on \n, \r\n and \r only (str.splitlines would also split on U+2028
  # and friends, which may occur inside a JSON string).
  for line_number, raw in enumerate(_read_bytes(path).splitlines(), start=1):
    if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
      raw = raw[3:]  # A UTF-8 byte-order mark (editors on Windows add one); not part of the data.
    if not raw.strip():
      continue
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      yield line_number, QADataError(
          f"{path}:{line_number}: line is not valid UTF-8 (byte {raw[e.start]:#04x} at column "
          f"{e.start + 1}: {e.reason})", path=path, line=line_number, field="line",
          reason=NOT_UTF8)
      continue
    yield line_number, text


def _make_example(question: Any, answers: Any, *, answers_are_regex: bool, path: str,
                  line: int, question_field: str, answer_field: str) -> QAExample:
  """Validates one record's question and answers and builds the QAExample.

  Raises:
    QADataError: naming path:line and the field.
  """
  where = f"{path}:{line}"

  def error(field: str, message: str, reason: str) -> QADataError:
    return QADataError(f"{where}: field '{field}': {message}", path=path, line=line,
                       field=field, reason=reason)

  if not isinstance(question, str):
    raise error(question_field, f"expected a string, got {type(question).__name__} "
                f"{question!r:.80}", WRONG_TYPE)
  if not question.strip():
    raise error(question_field, "the question is empty", EMPTY_QUESTION)
  if not isinstance(answers, list):
    raise error(answer_field, f"expected a list of strings, got {type(answers).__name__} "
                f"{answers!r:.80}", WRONG_TYPE)
  if not answers:
    raise error(answer_field, "the answer list is empty", EMPTY_ANSWERS)
  for i, answer in enumerate(answers):
    if not isinstance(answer, str):
      raise error(f"{answer_field}[{i}]", f"expected a string, got {type(answer).__name__} "
                  f"{answer!r:.80}", WRONG_TYPE)
    # A blank reference would make DPR-style has_answer true for every block and exact match true
    # for an empty prediction.
    if not answer.strip():
      raise error(f"{answer_field}[{i}]", "the answer is blank", BLANK_ANSWER)
  for field, value in [(question_field, question)] + [
      (f"{answer_field}[{i}]", a) for i, a in enumerate(answers)]:
    try:
      # JSON "\ud800" escapes decode to lone surrogates, which TF (the hash) cannot encode.
      value.encode("utf-8")
    except UnicodeEncodeError:
      raise error(field, "contains a lone UTF-16 surrogate (a bad \\u escape)", NOT_UTF8) from None
  return QAExample(question=question, answers=tuple(answers),
                   answers_are_regex=answers_are_regex, source=where)


def _read_records(path: str, parse_line: Callable[[str, int], QAExample], on_error: str,
                  max_reported: int) -> list[QAExample] | tuple[list[QAExample], SkipReport]:
  _check_on_error(on_error)
  examples = []
  report = SkipReport(max_examples=max_reported)
  for line_number, text in _decoded_lines(path):
    try:
      if isinstance(text, QADataError):
        raise text
      examples.append(parse_line(text, line_number))
    except QADataError as e:
      if on_error == "raise":
        raise
      report.record(e)
  report.num_kept = len(examples)
  if on_error == "skip":
    if report.num_skipped:
      log.warning("%s: %s", path, report.summary())
    return examples, report
  return examples


@overload
def read_orqa_jsonl(path: str, *, answers_are_regex: bool = ...,
                    on_error: Literal["raise"] = ..., max_reported: int = ...) -> list[QAExample]:
  ...


@overload
def read_orqa_jsonl(path: str, *, answers_are_regex: bool = ..., on_error: Literal["skip"],
                    max_reported: int = ...) -> tuple[list[QAExample], SkipReport]:
  ...


def read_orqa_jsonl(path, *, answers_are_regex=False, on_error="raise", max_reported=5):
  """Reads ORQA's JSON-lines QA format: ``{"question": str, "answer": [str, ...]}`` per line (also
  NQ-open's ``NQ-open.*.jsonl`` and DrQA's WebQuestions and CuratedTrec ``*-train.txt``).

  `path` may be local or gs://. `on_error`: "raise" (QADataError naming the file, the 1-based line
  and the field, at the first bad line) or "skip" (bad lines left out and counted; then the result
  is ``(examples, SkipReport)`` keeping `max_reported` messages). Returns the examples in file
  order.
  """

  def parse_line(text: str, line: int) -> QAExample:
    try:
      record = json.loads(text)
    except json.JSONDecodeError as e:
      raise QADataError(f"{path}:{line}: malformed JSON at column {e.colno}: {e.msg}",
                        path=path, line=line, field="line", reason=MALFORMED_JSON) from None
    except RecursionError:
      # Absurdly deep nesting ("[[[[..."); report it on its line like any other bad JSON.
      raise QADataError(f"{path}:{line}: malformed JSON: nested too deeply", path=path,
                        line=line, field="line", reason=MALFORMED_JSON) from None
    if not isinstance(record, dict):
      raise QADataError(
          f"{path}:{line}: expected a JSON object with 'question' and 'answer', got "
          f"{type(record).__name__}", path=path, line=line, field="line", reason=NOT_AN_OBJECT)
    for field in ("question", "answer"):
      if field not in record:
        hint = (" (found 'answers'; ORQA's format spells it 'answer')"
                if field == "answer" and "answers" in record else "")
        raise QADataError(f"{path}:{line}: field '{field}' is missing{hint}; keys: "
                          f"{sorted(record)}", path=path, line=line, field=field,
                          reason=MISSING_FIELD)
    return _make_example(record["question"], record["answer"],
                         answers_are_regex=answers_are_regex, path=path, line=line,
                         question_field="question", answer_field="answer")

  return _read_records(path, parse_line, on_error, max_reported)


@overload
def read_dpr_csv(path: str, *, answers_are_regex: bool = ..., on_error: Literal["raise"] = ...,
                 delimiter: str = ..., max_reported: int = ...) -> list[QAExample]:
  ...


@overload
def read_dpr_csv(path: str, *, answers_are_regex: bool = ..., on_error: Literal["skip"],
                 delimiter: str = ..., max_reported: int = ...
                 ) -> tuple[list[QAExample], SkipReport]:
  ...


def read_dpr_csv(path, *, answers_are_regex=False, on_error="raise", delimiter="\t",
                 max_reported=5):
  """Reads DPR's QA files (``nq-test.qa.csv`` etc.): ``question<TAB>['answer', "it's", ...]``.

  Despite the name the files are tab-separated, with no header; each line is split as DPR does
  (``csv.reader``, tab delimiter) and the answer column parsed with ``ast.literal_eval``, which
  accepts literals only (DPR's ``eval`` would run any expression). `on_error` and the result as in
  ``read_orqa_jsonl``.
  """

  def parse_line(text: str, line: int) -> QAExample:
    try:
      row = next(csv.reader([text], delimiter=delimiter))
    except csv.Error as e:
      raise QADataError(f"{path}:{line}: malformed CSV line: {e}", path=path, line=line,
                        field="line", reason=MALFORMED_CSV) from None
    if len(row) != 2:
      raise QADataError(
          f"{path}:{line}: expected 2 {delimiter!r}-separated columns (question, answers), "
          f"got {len(row)}", path=path, line=line, field="line", reason=WRONG_COLUMN_COUNT)
    question, answers_literal = row
    try:
      answers = ast.literal_eval(answers_literal.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
      raise QADataError(
          f"{path}:{line}: field 'answers' (column 2): not a Python list literal of strings "
          f"({type(e).__name__}): {answers_literal!r:.120}", path=path, line=line,
          field="answers", reason=BAD_ANSWER_LITERAL) from None
    return _make_example(question, answers, answers_are_regex=answers_are_regex, path=path,
                         line=line, question_field="question", answer_field="answers")

  return _read_records(path, parse_line, on_error, max_reported)


# ------------------------------------------------------------------------------------------------
# ORQA's re-split.
# ------------------------------------------------------------------------------------------------


def orqa_dev_bucket(questions: Sequence[str]) -> np.ndarray:
  """``tf.strings.to_hash_bucket_fast(question, 100000) % 10`` for each question, batched.

  This is ORQA's rule with the TF op itself (a FarmHash Fingerprint64 of the UTF-8 bytes, which
  TF guarantees stable), run eagerly on the CPU over the whole list at once.

  Args:
    questions: the question strings, exactly as in the data.

  Returns:
    ``[num_questions]`` int64 in 0..9; a question belongs to ORQA's dev split iff its value is 0.
  """
  if isinstance(questions, str):
    raise TypeError("orqa_dev_bucket takes a sequence of questions; use is_orqa_dev for one")
  questions = list(questions)
  if not questions:
    return np.zeros([0], np.int64)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # On the CPU so that a JAX job on an accelerator does not have TF claim it; entry points also
  # hide accelerators from TF, as t5x does.
  with tf.device("/CPU:0"):
    buckets = tf.strings.to_hash_bucket_fast(
        tf.constant(questions, dtype=tf.string), ORQA_NUM_HASH_BUCKETS)  # [num_questions]
  return buckets.numpy().astype(np.int64) % ORQA_DEV_MODULUS


def orqa_dev_mask(questions: Sequence[str]) -> np.ndarray:
  """``[num_questions]`` bool: which questions ORQA's re-split puts in dev."""
  return orqa_dev_bucket(questions) == 0


def is_orqa_dev(question: str) -> bool:
  """Whether ORQA's re-split puts ``question`` in dev (``to_hash_bucket_fast % 10 == 0``)."""
  if not isinstance(question, str):
    raise TypeError(f"is_orqa_dev takes one question string, got {type(question).__name__}")
  return bool(orqa_dev_mask([question])[0])


def resplit(examples: Sequence[QAExample]) -> tuple[list[QAExample], list[QAExample]]:
  """Splits an original training set into ORQA's (train, dev), each in the input order.

  Args:
    examples: the benchmark's original training examples.

  Returns:
    (train, dev), where dev holds the examples whose question ``is_orqa_dev``.
  """
  examples = list(examples)
  dev_mask = orqa_dev_mask([example.question for example in examples])  # [num_examples]
  train = [ex for ex, is_dev in zip(examples, dev_mask) if not is_dev]
  dev = [ex for ex, is_dev in zip(examples, dev_mask) if is_dev]
  return train, dev


def nq_open_keep_answer(answer: str, max_tokens: int = 5) -> bool:
  """NQ-open's answer filter: True iff the answer has 1 to ``max_tokens`` (5) tokens.

  ORQA's ``convert_to_nq_open.py`` counts NQ's own document tokens of the span, which exist only
  in the raw NQ release; this counts whitespace tokens of the answer text, which agrees for
  answers without HTML. ``load_benchmark`` does not re-filter the (already filtered) files.
  """
  num_tokens = len(answer.split())
  return 0 < num_tokens <= max_tokens


# ------------------------------------------------------------------------------------------------
# The benchmarks.
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DataFile:
  """A file name in a benchmark directory and its format ("jsonl" or "dpr_csv")."""
  name: str
  format: Literal["jsonl", "dpr_csv"] = "jsonl"


@dataclasses.dataclass(frozen=True)
class BenchmarkSpec:
  """One benchmark: what ORQA's split looks like and which files hold it.

  Attributes:
    name: the registry key ("nq_open", ...).
    orqa_name: the name in ORQA's files ("NaturalQuestions", ...).
    split_sizes: ORQA's train/dev/test sizes (the ORQA README's table, REALM_SPEC item 30).
    answers_are_regex: whether the references are regular expressions (CuratedTrec).
    original_train_files: candidates for the original training set, which gets re-split; the
      first one present is used.
    original_test_files: candidates for the original test set (for NQ: NQ's dev set).
    presplit_layouts: file triples (train, dev, test) that already hold ORQA's split, in order
      of preference; each is used only when all three files are present.
    tfds_name: the TFDS builder, or None.
    tfds_test_split: the TFDS split that is ORQA's test split.
  """
  name: str
  orqa_name: str
  split_sizes: Mapping[str, int]
  answers_are_regex: bool
  original_train_files: tuple[DataFile, ...]
  original_test_files: tuple[DataFile, ...]
  presplit_layouts: tuple[tuple[DataFile, DataFile, DataFile], ...]
  tfds_name: str | None = None
  tfds_test_split: str | None = None


def _presplit_layouts(orqa_name: str, *extra) -> tuple[tuple[DataFile, DataFile, DataFile], ...]:
  return (
      # What realm_jax's toy world and any hand-made split write.
      tuple(DataFile(f"{split}.jsonl") for split in SPLITS),
      # The output of ORQA's create_data_splits.py, also published at gs://orqa-data/resplit.
      tuple(DataFile(f"{orqa_name}.resplit.{split}.jsonl") for split in SPLITS),
  ) + tuple(extra)


# File names assumed, from the ORQA README: NQ-open is produced by ORQA's convert_to_nq_open.py as
# NaturalQuestions-{train,dev}.txt, and published by Google as NQ-open.{train,dev}.jsonl (the
# same data); WebQuestions and CuratedTrec come from DrQA's download.sh as
# {WebQuestions,CuratedTrec}-{train,test}.txt. All are ORQA JSON lines. DPR publishes the NQ split
# as nq-{train,dev,test}.qa.csv (the same sizes) and only the test sets of the other two.
BENCHMARKS: dict[str, BenchmarkSpec] = {
    "nq_open": BenchmarkSpec(
        name="nq_open",
        orqa_name="NaturalQuestions",
        split_sizes={"train": 79168, "dev": 8757, "test": 3610},
        answers_are_regex=False,
        original_train_files=(DataFile("NaturalQuestions-train.txt"),
                              DataFile("NQ-open.train.jsonl")),
        # NQ has no public test set: NQ's dev set is ORQA's test set.
        original_test_files=(DataFile("NaturalQuestions-dev.txt"), DataFile("NQ-open.dev.jsonl")),
        presplit_layouts=_presplit_layouts(
            "NaturalQuestions",
            tuple(DataFile(f"nq-{split}.qa.csv", "dpr_csv") for split in SPLITS)),
        tfds_name="natural_questions_open",
        tfds_test_split="validation",
    ),
    "web_questions": BenchmarkSpec(
        name="web_questions",
        orqa_name="WebQuestions",
        split_sizes={"train": 3417, "dev": 361, "test": 2032},
        answers_are_regex=False,
        original_train_files=(DataFile("WebQuestions-train.txt"),),
        original_test_files=(DataFile("WebQuestions-test.txt"),
                             DataFile("webquestions-test.qa.csv", "dpr_csv")),
        presplit_layouts=_presplit_layouts("WebQuestions"),
        tfds_name="web_questions",
        tfds_test_split="test",
    ),
    "curated_trec": BenchmarkSpec(
        name="curated_trec",
        orqa_name="CuratedTrec",
        split_sizes={"train": 1353, "dev": 133, "test": 694},
        answers_are_regex=True,
        original_train_files=(DataFile("CuratedTrec-train.txt"),),
        original_test_files=(DataFile("CuratedTrec-test.txt"),
                             DataFile("curatedtrec-test.qa.csv", "dpr_csv")),
        presplit_layouts=_presplit_layouts("CuratedTrec"),
    ),
}


def _spec(name: str) -> BenchmarkSpec:
  if name not in BENCHMARKS:
    raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
  return BENCHMARKS[name]


def _read_file(path: str, file_format: str, *, answers_are_regex: bool, on_error: str,
               report: SkipReport) -> list[QAExample]:
  reader = {"jsonl": read_orqa_jsonl, "dpr_csv": read_dpr_csv}[file_format]
  if on_error == "raise":
    return reader(path, answers_are_regex=answers_are_regex)
  examples, file_report = reader(path, answers_are_regex=answers_are_regex, on_error="skip")
  report.update(file_report)
  return examples


def check_split_sizes(name: str, splits: Mapping[str, Sequence[Any]], *, origin: str = "") -> None:
  """Raises ``SplitSizeError`` unless every split has ORQA's published size.

  Args:
    name: the benchmark.
    splits: split name -> examples.
    origin: where the data came from, for the message.
  """
  spec = _spec(name)
  wrong = [f"split '{split}': expected {expected}, found {len(splits.get(split, ()))}"
           for split, expected in spec.split_sizes.items()
           if len(splits.get(split, ())) != expected]
  if wrong:
    raise SplitSizeError(
        f"benchmark '{name}': split sizes differ from ORQA's (REALM_SPEC item 30): "
        f"{'; '.join(wrong)}{f' (read from {origin})' if origin else ''}. Pass "
        f"check_sizes=False for toy data or a partial download.")


@overload
def load_benchmark(name: str, data_dir: str, *, check_sizes: bool = ...,
                   on_error: Literal["raise"] = ...) -> dict[str, list[QAExample]]:
  ...


@overload
def load_benchmark(name: str, data_dir: str, *, check_sizes: bool = ...,
                   on_error: Literal["skip"]
                   ) -> tuple[dict[str, list[QAExample]], SkipReport]:
  ...


def load_benchmark(name, data_dir, *, check_sizes=True, on_error="raise"):
  """Loads one benchmark's train/dev/test split from a directory (local, or gs://).

  Layouts, in order: an already split triple (``train.jsonl``/``dev.jsonl``/``test.jsonl``, as
  under a toy world's ``qa/``; ORQA's ``<OrqaName>.resplit.<split>.jsonl``; NQ's DPR
  ``nq-<split>.qa.csv``; a half-present triple is an error), else the original release re-split
  with ORQA's hash rule (``BENCHMARKS`` lists the names). `check_sizes` raises
  ``SplitSizeError`` on sizes other than ORQA's (False for toy data); `on_error` as in
  ``read_orqa_jsonl``. Returns ``{"train", "dev", "test"}`` lists (with "skip", and the combined
  ``SkipReport``); FileNotFoundError lists the names looked for.
  """
  spec = _spec(name)
  _check_on_error(on_error)
  report = SkipReport()

  def read(data_file: DataFile) -> list[QAExample]:
    return _read_file(os.path.join(data_dir, data_file.name), data_file.format,
                      answers_are_regex=spec.answers_are_regex, on_error=on_error, report=report)

  splits = None
  for layout in spec.presplit_layouts:
    present = [_exists(os.path.join(data_dir, f.name)) for f in layout]
    if all(present):
      splits = {split: read(data_file) for split, data_file in zip(SPLITS, layout)}
      origin = ", ".join(os.path.join(data_dir, f.name) for f in layout)
      break
    if any(present):
      missing = [f.name for f, p in zip(layout, present) if not p]
      raise QADataError(
          f"{data_dir}: benchmark '{name}': found part of an already-split layout "
          f"({[f.name for f in layout]}) but {missing} is missing", path=data_dir,
          field="files", reason="incomplete_layout")
  if splits is None:
    train_file = next((f for f in spec.original_train_files
                       if _exists(os.path.join(data_dir, f.name))), None)
    test_file = next((f for f in spec.original_test_files
                      if _exists(os.path.join(data_dir, f.name))), None)
    if train_file is None or test_file is None:
      missing = [what for what, found in (("training", train_file), ("test", test_file))
                 if found is None]
      raise FileNotFoundError(
          f"{data_dir}: benchmark '{name}': no {' or '.join(missing)} file. Looked for a "
          f"pre-split triple {[[f.name for f in layout] for layout in spec.presplit_layouts]}, "
          f"or an original training file {[f.name for f in spec.original_train_files]} with a "
          f"test file {[f.name for f in spec.original_test_files]}.")
    train, dev = resplit(read(train_file))
    splits = {"train": train, "dev": dev, "test": read(test_file)}
    origin = (f"{os.path.join(data_dir, train_file.name)} (re-split) and "
              f"{os.path.join(data_dir, test_file.name)}")

  log.info("benchmark %s: %s from %s", name,
           ", ".join(f"{split}={len(splits[split])}" for split in SPLITS), origin)
  if check_sizes:
    check_split_sizes(name, splits, origin=origin)
  if on_error == "skip":
    return splits, report
  return splits


# ------------------------------------------------------------------------------------------------
# TFDS.
# ------------------------------------------------------------------------------------------------

_TFDS_NAMES = {spec.name: spec.tfds_name for spec in BENCHMARKS.values() if spec.tfds_name}


def _text(value: Any) -> Any:
  return value.decode("utf-8") if isinstance(value, bytes) else value


@overload
def from_tfds(name: str, split: str, data_dir: str | None = ..., *, download: bool = ...,
              on_error: Literal["raise"] = ...) -> list[QAExample]:
  ...


@overload
def from_tfds(name: str, split: str, data_dir: str | None = ..., *, download: bool = ...,
              on_error: Literal["skip"]) -> tuple[list[QAExample], SkipReport]:
  ...


def from_tfds(name, split, data_dir=None, *, download=True, on_error="raise"):
  """Reads a TFDS QA split as QAExamples (TFDS's own splits, not ORQA's re-split: use
  ``load_benchmark_from_tfds`` for that); with `on_error="skip"`, ``(examples, SkipReport)``.

  ``natural_questions_open`` has "train" (ORQA's train + dev) and "validation" (ORQA's test);
  ``web_questions`` has "train" and "test", its ``answers`` parsed by TFDS from the Freebase
  target values (DrQA's file, which ORQA used, may spell a few answers differently).
  """
  _check_on_error(on_error)
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  tfds_name = _TFDS_NAMES.get(name, name)
  if tfds_name not in _TFDS_NAMES.values():
    raise ValueError(f"no TFDS builder for {name!r}; supported: {sorted(_TFDS_NAMES.items())}")
  dataset = tfds.load(tfds_name, split=split, data_dir=data_dir, download=download,
                      shuffle_files=False)
  path = f"tfds:{tfds_name}/{split}"
  examples = []
  report = SkipReport()
  for index, record in enumerate(tfds.as_numpy(dataset)):
    answer_field = "answer" if "answer" in record else "answers"
    try:
      examples.append(_make_example(
          _text(record.get("question")),
          [_text(a) for a in record.get(answer_field, [])],
          answers_are_regex=False, path=path, line=index,
          question_field="question", answer_field=answer_field))
    except QADataError as e:
      if on_error == "raise":
        raise
      report.record(e)
  report.num_kept = len(examples)
  if on_error == "skip":
    return examples, report
  return examples


def load_benchmark_from_tfds(name: str, data_dir: str | None = None, *, check_sizes: bool = True,
                             download: bool = True) -> dict[str, list[QAExample]]:
  """ORQA's train/dev/test split ("nq_open" or "web_questions") built from TFDS: TFDS's "train"
  re-split with ORQA's hash rule, its held-out split (NQ's "validation", WebQuestions' "test") as
  test. `check_sizes` as in ``load_benchmark``.
  """
  spec = _spec(name)
  if spec.tfds_name is None:
    raise ValueError(f"benchmark {name!r} has no TFDS builder; use load_benchmark with files")
  train, dev = resplit(from_tfds(name, "train", data_dir, download=download))
  test = from_tfds(name, spec.tfds_test_split, data_dir, download=download)
  splits = {"train": train, "dev": dev, "test": test}
  if check_sizes:
    check_split_sizes(name, splits, origin=f"tfds:{spec.tfds_name}")
  return splits


def seeded_split(names: Sequence[str], fractions: Sequence[tuple[str, float]],
                 key: str) -> dict[str, str]:
  """{name: split}: the sorted names shuffled by `random.Random(key)` and cut in order by
  `fractions` ((split, share) pairs; the last split takes the remainder). How the generated
  question sets split by module or by article, so no unit is asked about in two splits."""
  order = sorted(names)
  random.Random(key).shuffle(order)
  splits, start = {}, 0
  for i, (split, fraction) in enumerate(fractions):
    stop = len(order) if i == len(fractions) - 1 else start + round(fraction * len(order))
    splits.update({name: split for name in order[start:stop]})
    start = stop
  return splits
