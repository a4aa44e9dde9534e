"""The released REALM open-QA models evaluated with the paper's settings: a transformers
`RealmForOpenQA` directory (google/realm-orqa-nq-openqa, google/realm-orqa-wq-openqa) answers a
QA task split, scored by exact match (`python -m realm_jax.evaluate --released DIR`).

The directory holds config.json, the weights (pytorch_model.bin or model.safetensors, with the
frozen index `block_emb`), vocab.txt and block_records.npy (the block texts). Nothing is
downloaded; the TensorFlow release is not read (docs/paper_scale.md). Each question is answered
as transformers and ORQA do: embed, search block_emb (exact or ScaNN), read the top 5 blocks,
take the best span. Unlike transformers, the question is never truncated (REALM_SPEC 26) and the
answer is the span's original text (REALM_SPEC 29); the spans chosen are the same.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import numpy as np

from realm_jax import progress as progress_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.evaluation import qa as qa_lib
from realm_jax.evaluation import recall
from realm_jax.evaluation import results
from realm_jax.gin_utils import ConfigError
from realm_jax.index import search
from realm_jax.models import open_qa_model

__all__ = ["BlockRecords", "DIRECTORY_FILES", "Settings", "check_directory", "check_kind",
           "check_task", "evaluate_released", "make_parser", "read_block_records",
           "read_vocabulary", "settings"]

PROG = results.PROG
BLOCK_RECORDS = "block_records.npy"
VOCAB = "vocab.txt"
WEIGHTS = ("pytorch_model.bin", "model.safetensors")
# What the directory must hold: one name, or any one of several.
DIRECTORY_FILES = (("config.json",), WEIGHTS, (VOCAB,), (BLOCK_RECORDS,))
BACKENDS = ("exact", "scann")
# The release's prediction settings when config.json leaves them out (transformers' defaults).
DEFAULT_READER_BEAM = 5
DEFAULT_READER_LEN = 320
# Files of the TensorFlow release: a TF checkpoint and the block TFRecords.
_TF_FILE = "checkpoint"
_TF_SUFFIXES = (".index", ".tfr", ".tfrecord")


# ------------------------------------------------------------------------------ the directory


def _looks_like_tensorflow(names: Sequence[str]) -> bool:
  return any(name == _TF_FILE or name.endswith(_TF_SUFFIXES) for name in names)


def check_directory(directory: str) -> None:
  """FileNotFoundError naming every file the released directory lacks (`DIRECTORY_FILES`),
  with a word on the TensorFlow release when the directory holds its files instead."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"{os.path.abspath(directory)}: no such directory (a transformers "
                            f"RealmForOpenQA directory: config.json, pytorch_model.bin, vocab.txt, "
                            f"{BLOCK_RECORDS})")
  names = os.listdir(directory)
  missing = [" or ".join(group) for group in DIRECTORY_FILES
             if not any(name in names for name in group)]
  if not missing:
    return
  hint = ("; it holds TensorFlow checkpoint or TFRecord files: the TensorFlow release is not read "
          "here, convert it to a transformers directory first (docs/paper_scale.md)"
          if _looks_like_tensorflow(names) else
          f" (RealmForOpenQA.save_pretrained writes the weights and config.json, "
          f"RealmRetriever.save_pretrained {BLOCK_RECORDS} and the tokenizer files)")
  raise FileNotFoundError(f"{os.path.abspath(directory)}: missing {', '.join(missing)}{hint}")


class Settings(NamedTuple):
  """The prediction settings of a released model's config.json."""

  reader_beam: int  # blocks the reader reads (reader_beam_size)
  reader_len: int  # wordpieces of a reader row (reader_seq_len)
  num_blocks: int  # rows of block_emb (num_block_records)


def settings(hf_config: dict, reader_beam: Optional[int] = None) -> Settings:
  """The settings of a config.json dict; `reader_beam` overrides its reader_beam_size."""
  beam = int(reader_beam or hf_config.get("reader_beam_size", DEFAULT_READER_BEAM))
  return Settings(beam, int(hf_config.get("reader_seq_len", DEFAULT_READER_LEN)),
                  int(hf_config.get("num_block_records", 0)))


def read_vocabulary(directory: str, hf_config: dict) -> vocab_lib.WordPieceVocabulary:
  """The directory's WordPiece vocabulary, refused unless it is lower-cased BERT's layout
  (the project's tokenizer is BERT uncased) and fits the model's embedding table."""
  path = pathlib.Path(directory, "tokenizer_config.json")
  if path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("do_lower_case") is False:
    raise ValueError(f"{path}: do_lower_case is false; the released REALM models and this "
                     f"project's tokenizer are uncased")
  vocab = vocab_lib.WordPieceVocabulary(os.path.join(directory, VOCAB))
  if vocab.vocab_size > int(hf_config["vocab_size"]):
    raise ValueError(f"{vocab.vocab_path} has {vocab.vocab_size} wordpieces, more than the "
                     f"model's vocab_size {hf_config['vocab_size']}")
  return vocab


def read_block_records(directory: str) -> np.ndarray:
  """block_records.npy: [num_blocks] block texts (UTF-8 bytes), as RealmRetriever saves them.
  A pickled object array, loaded with `allow_pickle=True` as transformers does: read only
  directories you trust."""
  path = os.path.join(directory, BLOCK_RECORDS)
  records = np.load(path, allow_pickle=True)
  if records.ndim != 1:
    raise ValueError(f"{path}: expected [num_blocks] block texts, got shape {records.shape}")
  return records


def check_kind(kind: str, directory: str) -> None:
  """ValueError unless config.json's architecture is RealmForOpenQA (`convert.hf` kind
  "open_qa"): the reader or embedder alone has no index to retrieve from."""
  if kind != "open_qa":
    raise ValueError(f"{directory}: config.json describes a {kind!r} checkpoint; the open-QA "
                     f"evaluation needs a RealmForOpenQA directory (question embedder, reader and "
                     f"block_emb), e.g. google/realm-orqa-nq-openqa rather than "
                     f"google/realm-orqa-nq-reader")


def check_task(task: str, split: str) -> str:
  """The seqio name of a QA task split (your own QA files, a path, registered first).

  Raises:
    ConfigError: an unknown task, one that is not a QA task, or a split it lacks.
  """
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top  (TensorFlow)
  from realm_jax.batches import seqio_batches  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  if realm_jax_tasks.is_qa_path(task):
    try:
      task = realm_jax_tasks.register_qa_files(task)
    except ValueError as e:
      raise ConfigError(f"--task {task}: {e}") from e
  try:
    seqio_task = seqio_batches.get_task(task)
  except seqio_batches.UnknownTaskError:
    seqio_task = None
  if seqio_task is None or tasks_lib.task_kind(seqio_task) != "qa":
    raise ConfigError(f"--task {task}: not a registered QA task (QA tasks: "
                      f"{', '.join(tasks_lib.registered_tasks('qa'))}; or a path to your own "
                      f"QA files)")
  if split not in tuple(seqio_task.splits):
    raise ConfigError(f"--split {split}: task {task} has splits {', '.join(seqio_task.splits)}")
  return task


class BlockRecords:
  """The released block texts as the store the QA evaluation reads (bodies, their wordpieces,
  no titles). Wordpieces are computed on demand from the whole text, as transformers does, so
  13M blocks cost only their texts in memory."""

  def __init__(self, records: np.ndarray, vocab: vocab_lib.WordPieceVocabulary, path: str):
    self.records = records  # [num_blocks] bytes
    self.vocab = vocab
    self.path = path

  @property
  def num_blocks(self) -> int:
    return int(self.records.shape[0])

  def __len__(self) -> int:
    return self.num_blocks

  def _record(self, block_id: int) -> Any:
    block_id = int(block_id)
    if not 0 <= block_id < self.num_blocks:
      raise IndexError(f"{self.path}: block id {block_id} out of range [0, {self.num_blocks})")
    return self.records[block_id]

  def title(self, block_id: int) -> str:
    """"": the release's blocks hold their body only."""
    self._record(block_id)
    return ""

  def body(self, block_id: int) -> str:
    """The block's text."""
    record = self._record(block_id)
    return record.decode("utf-8") if isinstance(record, bytes) else str(record)

  def body_tokens(self, block_id: int) -> np.ndarray:
    """[body_len] int32 wordpieces of the whole block text (no specials)."""
    return np.asarray(self.vocab.encode(self.body(block_id)), np.int32)


# ------------------------------------------------------------------------------ the evaluation


def released_model(config: Any, params: dict, reader_beam: int
                   ) -> tuple[open_qa_model.OpenQAModel, dict]:
  """The `OpenQAModel` (tied towers: the release has one question embedder; its block side is
  `block_emb`) and its parameters, from `convert.hf.load_checkpoint(kind="open_qa")`'s."""
  config = config.replace(share_embedders=True)
  return (open_qa_model.OpenQAModel(config, reader_beam=reader_beam),
          open_qa_model.params_from_hf_open_qa(params))


def make_searcher(block_emb: np.ndarray, backend: str) -> Any:
  """Exact inner-product search over block_emb [num_blocks, proj], or ScaNN built in memory
  with ORQA's settings (`index.search`)."""
  if backend not in BACKENDS:
    raise ValueError(f"backend {backend!r}; expected one of {', '.join(BACKENDS)}")
  return search.make_searcher(backend, block_emb)


def _say(line: str) -> None:
  """One line on stderr, led by the command's name."""
  print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def evaluate_released(directory: str, config: Any, params: dict, block_emb: np.ndarray,
                      store: BlockRecords, examples: Sequence[Any], *, task: str, split: str,
                      run: Settings, backend: str = "exact", batch_size: int = 16,
                      k_values: Sequence[int] = (1, 5, 20, 100)) -> results.Result:
  """Exact match (and recall@k) of a released model over a task split's examples; progress
  lines go to stderr.

  Args:
    config, params: `convert.hf.load_checkpoint(directory, "open_qa")`'s.
    block_emb: [num_blocks, proj] float32, its `extras["block_emb"]`.
    store: the block texts, one per row of block_emb.
    run: the prediction settings (`settings`); backend: "exact" or "scann".

  Returns:
    The `results.Result` of mode "qa" (predictions included), stem `<task>_<split>_released`.
  """
  if block_emb.shape[0] != store.num_blocks:
    raise ValueError(f"block_emb has {block_emb.shape[0]:,} rows but {store.path} has "
                     f"{store.num_blocks:,} blocks: they must come from the same release")
  model, params = released_model(config, params, run.reader_beam)
  start = time.monotonic()
  searcher = make_searcher(block_emb, backend)
  _say(f"{backend} search over {store.num_blocks:,} x {block_emb.shape[1]} block embeddings "
       f"ready in {progress_lib.format_duration(time.monotonic() - start)}")
  throttle = progress_lib.Throttle()
  metrics, predictions = qa_lib.evaluate(
      model, params, examples, searcher=searcher, store=store, vocab=store.vocab,
      batch_size=batch_size, k_values=recall.clip_k_values(k_values, store.num_blocks),
      block_emb=getattr(searcher, "embeddings", block_emb), reader_len=run.reader_len,
      progress=lambda line: throttle(f"{PROG}: {line}"))
  throttle.finish()
  fields = {"released": os.path.abspath(directory), "task": task, "split": split,
            "backend": backend, "reader_beam": run.reader_beam, "reader_len": run.reader_len,
            "max_span_width": model.config.max_span_width, "num_blocks": store.num_blocks}
  summary = (f"{task}/{split}, released model {directory} ({store.num_blocks:,} blocks, "
             f"{backend} search, reader top {run.reader_beam})")
  return results.Result("qa", f"{task}_{split}_released", fields, metrics, summary, predictions)


# ------------------------------------------------------------------------------ the command line


def _positive_int(text: str) -> int:
  """argparse type: a positive integer."""
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text}: expected a positive integer")
  return value


def make_parser(prog: str) -> argparse.ArgumentParser:
  """The flags of `python -m realm_jax.evaluate --released DIR`."""
  parser = argparse.ArgumentParser(
      prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
      description=__doc__,
      epilog="Example (NQ test, 3,610 questions; the data under $REALM_JAX_QA_DATA/nq_open/):\n"
             "  python -m realm_jax.evaluate --released /models/realm-orqa-nq-openqa "
             "--task nq_open\n"
             "Exit status: 0 done (or dry run), 1 a runtime error (one line: a missing file, "
             "unreadable data), 2 a bad flag, task or split.")
  parser.add_argument("--released", required=True, metavar="DIR",
                      help="the transformers RealmForOpenQA directory: config.json, "
                           "pytorch_model.bin (or model.safetensors) with block_emb, vocab.txt, "
                           f"{BLOCK_RECORDS}")
  parser.add_argument("--task", required=True,
                      help="a QA task: nq_open, web_questions, curated_trec (ORQA's files under "
                           "$REALM_JAX_QA_DATA/<task>/), or your own QA files (a path; "
                           "regex:<path> for regex answers)")
  parser.add_argument("--split", default="test", help="the task split (default: test)")
  parser.add_argument("--output", default=None,
                      help="predictions JSONL (metrics beside it, .metrics.json); default "
                           "<DIR>/predictions/<task>_<split>_released.jsonl")
  parser.add_argument("--reader_beam", type=_positive_int, default=None,
                      help="blocks the reader reads (default: config.json's reader_beam_size, "
                           "5 in the release)")
  parser.add_argument("--backend", default="exact", choices=BACKENDS,
                      help="exact inner-product search over block_emb (default; the paper's), or "
                           "ScaNN built in memory with ORQA's settings (approximate)")
  parser.add_argument("--batch_size", type=_positive_int, default=16,
                      help="questions per step (16)")
  parser.add_argument("--max_examples", type=_positive_int, default=None,
                      help="evaluate only the first this many questions")
  parser.add_argument("--dry_run", action="store_true",
                      help="check the directory's files, config and vocabulary, the task and the "
                           "split; load no weights, print one line")
  return parser
