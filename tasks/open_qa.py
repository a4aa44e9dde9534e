"""seqio tasks for open-domain QA: NaturalQuestions-Open, WebQuestions, CuratedTrec, toy QA.

Features of an example (REALM_SPEC 26, 30):
  question_ids  int32 [None]  `[CLS] question [SEP]`, never truncated
  question      tf.string []  the raw question
  answers       tf.string [None]  reference answers (regular expressions for CuratedTrec)

Metrics (REALM_SPEC 31-32): ORQA exact match, or CuratedTrec's regex match. The references
reach the metric functions through `postprocess_fn(..., is_target=True)`, which returns the
example's `answers`.
"""

from __future__ import annotations

import functools
import os
from typing import Callable, Sequence

import seqio
import tensorflow as tf

from realm_jax.data import answer_match
from realm_jax.data import qa_datasets
from realm_jax.data import vocab as vocab_lib

QA_DATA_ENV = "REALM_JAX_QA_DATA"
CHECK_SIZES_ENV = "REALM_JAX_QA_CHECK_SIZES"
BENCHMARK_TASKS = ("nq_open", "web_questions", "curated_trec")

ExamplesFn = Callable[[str], Sequence[qa_datasets.QAExample]]


def _answers_postprocess(output, example=None, is_target=False):
  """Targets are the example's reference answers; predictions pass through as text."""
  if is_target:
    return [a.decode("utf-8") if isinstance(a, bytes) else a for a in example["answers"]]
  return output.decode("utf-8") if isinstance(output, bytes) else output


def _tokenize_question(dataset: tf.data.Dataset) -> tf.data.Dataset:
  vocab = vocab_lib.default_vocabulary()

  def tokenize(example):
    ids = vocab.encode_tf(example["question"])
    example["question_ids"] = tf.concat(
        [[vocab_lib.CLS_ID], ids, [vocab_lib.SEP_ID]], axis=0)
    return example

  return dataset.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)


def register_qa_task(name: str, examples_fn: ExamplesFn, *, answers_are_regex: bool = False,
                     splits: Sequence[str] = qa_datasets.SPLITS) -> str:
  """Registers a QA task whose examples come from `examples_fn(split)` (called lazily)."""

  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None):
    del shuffle_files, seed
    examples = list(examples_fn(split))
    if not examples:
      raise ValueError(f"task {name!r}: split {split!r} has no examples")
    return tf.data.Dataset.from_generator(
        lambda: ({"question": e.question, "answers": list(e.answers)} for e in examples),
        output_signature={"question": tf.TensorSpec([], tf.string),
                          "answers": tf.TensorSpec([None], tf.string)})

  metric = (answer_match.curated_trec_regex_match if answers_are_regex
            else answer_match.orqa_exact_match)
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(dataset_fn, splits=tuple(splits)),
      output_features={"question_ids": seqio.Feature(vocab_lib.seqio_vocabulary(),
                                                     add_eos=False)},
      preprocessors=[_tokenize_question],
      postprocess_fn=_answers_postprocess,
      metric_fns=[metric])
  return name


@functools.lru_cache(maxsize=None)
def _benchmark_splits(name: str, data_dir: str, check_sizes: bool):
  return qa_datasets.load_benchmark(name, data_dir, check_sizes=check_sizes)


def _benchmark_examples(name: str, split: str) -> Sequence[qa_datasets.QAExample]:
  root = os.environ.get(QA_DATA_ENV)
  if not root:
    raise FileNotFoundError(
        f"task {name!r}: set ${QA_DATA_ENV} to the directory holding {name}/ with the ORQA "
        f"files (see realm_jax.data.qa_datasets.BENCHMARKS for the file names)")
  check_sizes = os.environ.get(CHECK_SIZES_ENV, "1") != "0"
  return _benchmark_splits(name, os.path.join(root, name), check_sizes)[split]


def register_benchmark_tasks() -> tuple[str, ...]:
  """nq_open, web_questions, curated_trec from $REALM_JAX_QA_DATA/<name>/ (ORQA re-split,
  split sizes checked against the released ones unless $REALM_JAX_QA_CHECK_SIZES=0)."""
  for name in BENCHMARK_TASKS:
    register_qa_task(name, functools.partial(_benchmark_examples, name),
                     answers_are_regex=qa_datasets.BENCHMARKS[name].answers_are_regex)
  return BENCHMARK_TASKS


# ------------------------------------------------------------------------------ your own files

REGEX_PREFIX = "regex:"
QA_FILE_SUFFIXES = (".jsonl", ".csv", ".tsv")


def _split_files(path: str) -> dict[str, str]:
  """{split: file} of a directory of `<split>.jsonl|csv|tsv` files, or {"test": path}."""
  if os.path.isfile(path):
    if not path.endswith(QA_FILE_SUFFIXES):
      raise ValueError(f"{path}: a QA file is ORQA JSON lines (.jsonl: {{\"question\", "
                       f"\"answer\": [...]}}) or DPR's CSV (.csv/.tsv: question<TAB>"
                       f"[\"answer\", ...])")
    return {"test": path}
  if not os.path.isdir(path):
    raise ValueError(f"{path}: no such QA file or directory")
  files = {}
  for split in qa_datasets.SPLITS:
    found = [os.path.join(path, split + suffix) for suffix in QA_FILE_SUFFIXES
             if os.path.isfile(os.path.join(path, split + suffix))]
    if len(found) > 1:
      raise ValueError(f"{path}: split {split!r} has more than one file ({', '.join(found)})")
    if found:
      files[split] = found[0]
  if not files:
    raise ValueError(f"{path}: no QA files (expected some of "
                     f"{', '.join(s + '.jsonl' for s in qa_datasets.SPLITS)}, or .csv/.tsv)")
  return files


def _read_qa_file(path: str, answers_are_regex: bool) -> list[qa_datasets.QAExample]:
  if path.endswith(".jsonl"):
    return qa_datasets.read_orqa_jsonl(path, answers_are_regex=answers_are_regex)
  delimiter = "\t"
  if path.endswith(".csv"):
    # DPR's own .csv files are tab-separated; a spreadsheet's are comma-separated.
    with open(path, encoding="utf-8", errors="replace") as f:
      delimiter = "\t" if "\t" in f.readline() else ","
  return qa_datasets.read_dpr_csv(path, answers_are_regex=answers_are_regex, delimiter=delimiter)


def qa_path(task: str) -> tuple[bool, str]:
  """(answers are regular expressions, absolute path) of your own QA files' task name (a
  path, `regex:<path>` for regex answers)."""
  answers_are_regex = task.startswith(REGEX_PREFIX)
  return answers_are_regex, os.path.abspath(task[len(REGEX_PREFIX):] if answers_are_regex
                                            else task)


def read_qa_files(task: str) -> dict[str, tuple[str, list[qa_datasets.QAExample]]]:
  """Every split of your own QA files (`task` as `register_qa_files` takes it), read now:
  {split: (its file, its examples in file order)}, each example's `source` its "file:line".

  Raises:
    ValueError: no such file or directory, no QA file in it, or two files of one split.
    qa_datasets.QADataError: a bad record, naming file, line and field.
  """
  answers_are_regex, path = qa_path(task)
  return {split: (file, _read_qa_file(file, answers_are_regex))
          for split, file in _split_files(path).items()}


def is_qa_path(task: str) -> bool:
  """Whether a task name is your own QA files (a path, `regex:` for regex answers)."""
  path = task[len(REGEX_PREFIX):] if task.startswith(REGEX_PREFIX) else task
  return os.sep in path or os.path.exists(path)


def register_qa_files(task: str) -> str:
  """Registers a QA task over your own question files and returns its seqio name.

  `task` is a path (`regex:<path>`: CuratedTrec-style regex answers): a directory holding some
  of `train`, `dev`, `test` as `<split>.jsonl` (ORQA's form) or `<split>.csv`/`.tsv` (DPR's: the
  question, then a list literal of answers; a .csv without tabs is comma-separated), or one such
  file, whose split is "test". Bad records are errors naming file, line and field. The name is
  `qa_files_` and the sanitized absolute path, so the same files always get the same task.
  """
  answers_are_regex, path = qa_path(task)
  files = _split_files(path)
  name = ("qa_regex_files_" if answers_are_regex else "qa_files_") + "".join(
      c if c.isalnum() else "_" for c in path).strip("_")

  @functools.lru_cache(maxsize=None)
  def examples(split: str) -> Sequence[qa_datasets.QAExample]:
    return _read_qa_file(files[split], answers_are_regex)

  return register_qa_task(name, examples, answers_are_regex=answers_are_regex,
                          splits=tuple(files))
