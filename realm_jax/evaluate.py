r"""The evaluation job: open-QA exact match, free-text answers, and retrieval recall of a run, or
of a BM25 baseline.

  python -m realm_jax.evaluate --gin_file=gin_configs/experiments/toy_eval.gin \
      --gin.RUN_DIR="'/tmp/realm_toy/finetune'" [--dry_run] [--question="Who ...?" ...]

t5x style (shared with `realm_jax.train` and `realm_jax.build_index`, see `realm_jax.gin_utils`):
`--gin_file` (repeatable; relative paths are also looked up from the repository root),
`--gin_bindings` (repeatable) and `--gin.KEY=VALUE`. Gin binds only `evaluate_main` below (plus
the model gins' %MODEL_CONFIG); `--dry_run` overrides its `dry_run`, `--question` (repeatable)
its `questions`.

Three things it does with a run directory (`<run>/checkpoints/<step>`, `<run>/index/<step>`):

* mode "qa" (default): the fine-tuned `OpenQAModel` of one checkpoint (the best one recorded
  in `<run>/best.json`, else the newest, or `checkpoint_step`) answers every question of a QA
  task split, retrieving from the run's published index (`realm_jax.evaluation.evaluate`).
  Writes the predictions JSONL (`{"question", "prediction"}` first, ORQA's format) and the
  metrics JSON next to it, and prints one summary line (exact match or CuratedTrec's regex
  match, recall@k, questions, skipped) to stdout. Progress (rate, ETA) goes to stderr.
* mode "retrieval": no reader. The query tower of the checkpoint the index was built from
  searches the index (`training.inputs.make_index_loader`), as the trainer would retrieve.
  For a QA task recall@k = an answer occurs in one of the first k blocks (`metrics.has_answer`,
  regex mode for CuratedTrec); for an `ict_<corpus>` task recall@k = the query's source block
  is among the first k, reported with chance@k = k / blocks. This is how "ICT recall@5 above
  chance" and "recall before/after pretraining" (`index_step=0` vs the newest) are measured; it
  works on an ICT run (params {"retriever"} only), a pretraining run (even before its first
  checkpoint: index 0 comes from the ICT checkpoint) and a fine-tuning run.
* `--question` (predict): answers free-text questions with the "qa" model and prints each
  answer with its evidence blocks (rank, block id, title, retrieval score, snippet). No task.

And one without a run:

* mode "bm25": the lexical baseline for mode "retrieval". Okapi BM25 (`evaluation.bm25`: k1 0.9,
  b 0.4, Lucene's idf, lower-cased alphanumeric terms of each block's title and body) ranks the
  blocks of the BlockStore (`block_store`, or the toy store for toy tasks) for every question of
  the same task split, and reports the same metrics the same way (recall@k by `answer_hits`,
  regex answers for regex tasks; for an ICT task the source block's recall by `ict_hits`, its
  wordpiece query decoded back to text, with chance@k), "bm25" in place of "retrieval". No
  checkpoint, index or model: the settings for those (checkpoint_step, index_step,
  index_run_dir, first_index_checkpoint_dir, backend, reader_beam, reader_len, verify_index)
  are refused unless left at their defaults. `--gin.RUN_DIR=None` with `evaluate_main.output`
  (metrics at its .metrics.json); with a RUN_DIR the metrics go next to the retrieval mode's,
  `<run>/predictions/<task>_<split>_bm25.metrics.json`.

`--dry_run` checks the configuration (mode, task registered and of the right kind, split, block
store needed, k values) and, if the run directory has checkpoints, that the one to evaluate is
of this model size (and has a reader for "qa"); it reads no data, writes nothing, and prints one
line `evaluate: dry run ok (...)`. It works without any run.

Exit status: 0 done (or dry run), 1 a runtime error (one line: no checkpoint, no published
index, unreadable data), 2 a configuration error (one line: unknown flag or gin binding,
missing required macro, unknown task or mode, a checkpoint of another model size), 130
interrupted (nothing partial is written: the output files are renamed into place).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

import gin

from realm_jax import fileio
from realm_jax import gin_utils
from realm_jax.gin_utils import ConfigError, split_gin_args

PROG = "evaluate"
MODES = ("qa", "retrieval", "bm25")
BACKENDS = ("exact", "scann")
PREDICTIONS_DIR = "predictions"
PROGRESS_INTERVAL_S = 5.0  # seconds between progress lines on stderr
BUILD_INDEX_HINT = ("python -m realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
                    "--once --gin.RUN_DIR=... --gin.BLOCK_STORE=...")

log = logging.getLogger(PROG)

_CALL_STARTED = [False]  # set by evaluate_main: errors before it are gin's (config errors)


# ------------------------------------------------------------------------------ tasks


def task_kind(task: Any) -> Optional[str]:
  """"qa" (question/answers, EM or regex metric), "ict" (queries with their source block's
  uid) or None (a task this job cannot evaluate, e.g. masked-query pretraining)."""
  from realm_jax.evaluation import metrics  # pylint: disable=g-import-not-at-top
  metric_fns = list(task.metric_fns)
  if metrics.orqa_exact_match in metric_fns or metrics.curated_trec_regex_match in metric_fns:
    return "qa"
  if {"query_ids", "query_mask", "block_uid"} <= set(task.output_features):
    return "ict"
  return None


def registered_tasks(kind: str) -> list[str]:
  """Names of the registered seqio tasks of one `task_kind` ("qa" or "ict"), sorted."""
  import seqio  # pylint: disable=g-import-not-at-top
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top,unused-import  (registers tasks)
  del realm_jax_tasks
  return sorted(name for name in seqio.TaskRegistry.names()
                if task_kind(seqio.get_mixture_or_task(name)) == kind)


def _split_dataset(task: Any, split: str, max_examples: Optional[int]):
  """One unshuffled pass over a task split (as the task emits it: no padding, no trimming)."""
  dataset = task.get_dataset(split=split, shuffle=False, sequence_length=None, num_epochs=1)
  return dataset.take(max_examples) if max_examples is not None else dataset


def ict_task_queries(task_name: str, split: str, max_examples: Optional[int] = None) -> dict:
  """The queries of an ICT task split and their source blocks.

  Returns:
    {"query_ids", "query_mask": int32 [n, query_len], "block_uid": int64 [n] (the source
    block's uint64 uid as the int64 with the same bits, as the task carries it)}.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  task = inputs.get_task(task_name)
  rows = {"query_ids": [], "query_mask": [], "block_uid": []}
  for example in _split_dataset(task, split, max_examples).as_numpy_iterator():
    for name, values in rows.items():
      values.append(example[name])
  if not rows["block_uid"]:
    raise ValueError(f"task {task_name!r} split {split!r} has no examples")
  return {"query_ids": np.stack(rows["query_ids"]).astype(np.int32),  # [n, query_len]
          "query_mask": np.stack(rows["query_mask"]).astype(np.int32),  # [n, query_len]
          "block_uid": np.asarray(rows["block_uid"], np.int64)}  # [n]


def ict_query_texts(query_ids: Any, query_mask: Any) -> list[str]:
  """ICT queries as text (BM25's queries for an ICT task): the wordpieces of `[CLS] sentence
  [SEP]` (int [n, query_len], mask [n, query_len]) decoded, special tokens and padding dropped.

  The text is the uncased vocabulary's: lower-cased and without accents, so a query word with
  an accent does not match the block's original spelling.
  """
  from realm_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  vocab = vocab_lib.default_vocabulary()
  specials = set(vocab_lib.SPECIAL_TOKENS.values())
  return [vocab.decode([int(i) for i, m in zip(ids, mask) if m and int(i) not in specials])
          for ids, mask in zip(query_ids, query_mask)]


# ------------------------------------------------------------------------------ small pieces


def clip_k_values(k_values: Sequence[int], num_blocks: int) -> tuple[int, ...]:
  """Recall cut-offs, each at most the number of blocks, ascending and without repeats.

  A k above the corpus size would only repeat recall@num_blocks (1.0 for ICT), so it becomes
  num_blocks.
  """
  return tuple(sorted({min(int(k), int(num_blocks)) for k in k_values}))


def _check_k_values(k_values: Any) -> tuple[int, ...]:
  if isinstance(k_values, int) or not k_values:
    raise ConfigError(f"evaluate_main.k_values={k_values!r}: expected a non-empty sequence of "
                      f"positive integers, e.g. (1, 5, 20, 100)")
  for k in k_values:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      raise ConfigError(f"evaluate_main.k_values={tuple(k_values)!r}: {k!r} is not a positive "
                        f"integer")
  return tuple(int(k) for k in k_values)


def choose_checkpoint(run_dir: str, checkpoint_step: Optional[int]) -> tuple[Optional[int], str]:
  """The checkpoint step to evaluate and why it was chosen.

  `checkpoint_step` if given; else the best one recorded by the trainer in `<run>/best.json`
  (its metric, e.g. eval exact match) when that checkpoint still exists; else the newest.

  Returns:
    (step or None when the run has no finished checkpoint, a description such as
    "best by eval/exact_match=0.41 in best.json", "latest" or "as asked").
  """
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  steps = ckpt_lib.list_checkpoint_steps(run_dir)
  if checkpoint_step is not None:
    return int(checkpoint_step), "as asked"
  best = ckpt_lib.read_best(run_dir)
  if best is not None and int(best.get("step", -1)) in steps:
    return int(best["step"]), (f"best by {best.get('metric')}={float(best.get('value')):.4g} "
                               f"in {ckpt_lib.BEST_FILE}")
  if not steps:
    return None, "none"
  why = "latest"
  if best is not None:
    why += f" ({ckpt_lib.BEST_FILE} names step {best.get('step')}, which no longer exists)"
  return steps[-1], why


def _checkpoint_metadata(step_dir: str, config: Any, where: str) -> dict:
  """The metadata of a checkpoint step directory; ConfigError (naming both sizes) when it is
  of another model size than `config`."""
  from realm_jax.models.config import realm_config_from_dict  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  metadata = ckpt_lib.read_metadata(step_dir)
  try:
    try:
      their_config = realm_config_from_dict(metadata["config"])
    except (KeyError, TypeError, ValueError) as e:
      raise ckpt_lib.CheckpointError(f"{step_dir}: the metadata's model config is unreadable "
                                     f"({e})") from e
    ckpt_lib.check_model_size(their_config, config, step_dir)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(f"{where}: {gin_utils.one_line(e)}") from e
  return metadata


def _require_reader(metadata: dict, step_dir: str) -> None:
  items = list(metadata.get("param_items", []))
  if "reader" not in items:
    raise ConfigError(f"{step_dir} holds params {items}, no fine-tuned reader (an ICT or "
                      f"pretraining run?): mode 'qa' needs an open-QA checkpoint; measure its "
                      f"retrieval with --gin.evaluate_main.mode=\"'retrieval'\"")


def output_paths(output: Optional[str], run_dir: str, stem: str) -> tuple[str, str]:
  """(predictions JSONL, metrics JSON): `output` or `<run_dir>/predictions/<stem>.jsonl`, and
  the same path with `.metrics.json` in place of `.jsonl`."""
  predictions = output or os.path.join(run_dir, PREDICTIONS_DIR, f"{stem}.jsonl")
  base = predictions[:-len(".jsonl")] if predictions.endswith(".jsonl") else predictions
  return predictions, base + ".metrics.json"


def format_metrics(metrics: dict) -> str:
  """'exact_match 0.1250, recall@5 0.5000, ..., num_questions 8, skipped 0' (fractions with 4
  decimals, counts as integers; chance@k shown next to its recall@k)."""
  parts = []
  for name, value in metrics.items():
    if name.startswith("chance@"):
      continue
    if name == "skipped_questions":
      parts.append(f"skipped {int(value)}")
    elif isinstance(value, int):
      parts.append(f"{name} {value}")
    else:
      chance = metrics.get(name.replace("recall@", "chance@")) if "recall@" in name else None
      parts.append(f"{name} {value:.4f}"
                   + (f" (chance {chance:.4f})" if chance is not None else ""))
  return ", ".join(parts)


class _Progress:
  """Prints progress lines to stderr at most every PROGRESS_INTERVAL_S seconds; `finish`
  prints the last one if it was held back, so the final count always shows."""

  def __init__(self, interval_s: float = PROGRESS_INTERVAL_S):
    self.interval_s = interval_s
    self._last_print = time.monotonic()
    self._pending: Optional[str] = None

  def __call__(self, line: str) -> None:
    now = time.monotonic()
    if now - self._last_print >= self.interval_s:
      print(line, file=sys.stderr, flush=True)
      self._last_print, self._pending = now, None
    else:
      self._pending = line

  def finish(self) -> None:
    if self._pending is not None:
      print(self._pending, file=sys.stderr, flush=True)
      self._pending = None


def _rate_line(what: str, done: int, total: int, start: float) -> str:
  rate = done / max(time.monotonic() - start, 1e-9)
  eta = (total - done) / max(rate, 1e-9)
  return f"{PROG}: {done}/{total} {what}, {rate:.1f}/s, ETA {eta:.0f}s"


# ------------------------------------------------------------------------------ retrieval


def ict_hits(retrieved_ids: Any, block_uid: Any, store_uids: Any) -> Any:
  """Whether each retrieved block is the query's source block.

  Args:
    retrieved_ids: int [n, k] block rows (-1: no result, a miss).
    block_uid: int64 [n] the source block's uid bits (ICT task feature).
    store_uids: uint64 [num_blocks] `BlockStore.uids`.

  Returns:
    bool [n, k]. Compared by uid, not row: a block whose text occurs twice in the corpus is
    found either way.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  ids = np.asarray(retrieved_ids)  # [n, k]
  uids = np.asarray(store_uids).view(np.int64)[np.maximum(ids, 0)]  # [n, k]
  return (uids == np.asarray(block_uid, np.int64)[:, None]) & (ids >= 0)


def answer_hits(retrieved_ids: Any, examples: Sequence[Any], store: Any) -> Any:
  """Whether each retrieved block contains an answer (DPR's has_answer on the block body;
  regex search for regex examples). bool [n, k]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation import metrics  # pylint: disable=g-import-not-at-top
  ids = np.asarray(retrieved_ids)  # [n, k]
  hits = np.zeros(ids.shape, bool)
  for row, example in enumerate(examples):
    match = "regex" if example.answers_are_regex else "string"
    for col, block_id in enumerate(ids[row]):
      hits[row, col] = block_id >= 0 and metrics.has_answer(store.body(int(block_id)),
                                                            example.answers, match=match)
  return hits


def recall_metrics(hits: Any, ks: Sequence[int], kind: str, num_blocks: int) -> dict:
  """The retrieval metrics of bool hits [n, k] (modes "retrieval" and "bm25"): recall@k for
  each of `ks`, chance@k next to it for ICT, num_questions (ICT: num_queries), num_blocks."""
  from realm_jax.evaluation import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  metrics = {}
  for name, value in metrics_lib.top_k_recall(hits, ks).items():
    metrics[name] = value
    if kind == "ict":  # a uniformly random ranking finds the one source block with p = k / N
      metrics["chance@" + name[len("recall@"):]] = int(name[len("recall@"):]) / num_blocks
  metrics["num_queries" if kind == "ict" else "num_questions"] = int(hits.shape[0])
  metrics["num_blocks"] = int(num_blocks)
  return metrics


def _retrieve_all(retriever: Any, query_ids: Any, query_mask: Any, *, k: int,
                  batch_size: int, progress: Callable[[str], None]) -> Any:
  """Top-k block ids of every query, in batches. int32 [n, k]."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  total = int(query_ids.shape[0])
  ids = []
  start = time.monotonic()
  for begin in range(0, total, batch_size):
    _, batch_ids = retriever.retrieve(query_ids[begin:begin + batch_size],
                                      query_mask[begin:begin + batch_size], k=k)
    ids.append(np.asarray(batch_ids))  # [batch, k]
    progress(_rate_line("queries", min(begin + batch_size, total), total, start))
  return np.concatenate(ids)


def _question_arrays_batches(examples: Sequence[Any], batch_size: int):
  """[CLS] question [SEP] ids and masks of the examples, batch by batch (each batch padded to
  its own longest question, as evaluation does)."""
  from realm_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import open_qa as qa_batches  # pylint: disable=g-import-not-at-top
  vocab = vocab_lib.default_vocabulary()
  for begin in range(0, len(examples), batch_size):
    chunk = examples[begin:begin + batch_size]
    ids, mask, _ = qa_batches.question_arrays([e.question for e in chunk], vocab,
                                           sources=[e.source for e in chunk])
    yield ids, mask


# ------------------------------------------------------------------------------ the job


def _load_published_index(run_dir: str, index_step: Optional[int], store: Any, config: Any, *,
                          verify: bool | str = True):
  """The index of `run_dir` (newest, or `index_step`), checked against the store and model
  (`verify`: True re-hashes every file against its manifest, "fast" checks sizes only)."""
  from realm_jax.index import store as index_lib  # pylint: disable=g-import-not-at-top
  steps = index_lib.list_indexes(run_dir)
  root = index_lib.index_root(os.path.abspath(run_dir))
  if not steps:
    raise FileNotFoundError(f"{root}: no published index; build one from the run's checkpoint "
                            f"with `{BUILD_INDEX_HINT}`")
  step = steps[-1] if index_step is None else int(index_step)
  if step not in steps:
    raise FileNotFoundError(f"{root}: no published index of step {step} (published: "
                            f"{steps})")
  return index_lib.load_index(index_lib.index_dir(run_dir, step), block_store_id=store.store_id,
                              num_blocks=store.num_blocks, dim=config.proj_size, verify=verify)


def _searcher(loaded: Any, backend: str) -> Any:
  from realm_jax.index import search  # pylint: disable=g-import-not-at-top
  if backend == "scann" and loaded.scann_dir is None:
    raise ValueError(f"{loaded.path}: the index has no ScaNN artifacts (build it with "
                     f"--gin.build_index_main.scann=True) or use backend 'exact'")
  return search.make_searcher(backend, loaded.embeddings,
                              artifacts_dir=loaded.scann_dir if backend == "scann" else None)


def _open_qa_model(run_dir: str, config: Any, step: int, reader_beam: int):
  """(OpenQAModel, params on the default device) of one checkpoint of the run."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models.open_qa import OpenQAModel  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  params, _, _ = ckpt_lib.restore_params(run_dir, step, expected_config=config)
  # Only the two towers the model reads; placed once rather than copied at every call.
  params = jax.device_put({"retriever": params["retriever"], "reader": params["reader"]})
  return OpenQAModel(config, reader_beam=reader_beam), params


def _run_qa(*, run_dir, config, task, split, step, why, loaded, store,
            batch_size, k_values, reader_beam, reader_len, backend, max_examples,
            output) -> int:
  from realm_jax.evaluation import evaluate as evaluate_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import qa_inputs  # pylint: disable=g-import-not-at-top
  searcher = _searcher(loaded, backend)
  model, params = _open_qa_model(run_dir, config, step, reader_beam)
  examples = qa_inputs.qa_task_examples(task, split, max_examples=max_examples)
  print(f"{PROG}: {len(examples)} questions of {task}/{split}, checkpoint step {step} ({why}), "
        f"index step {loaded.step} ({store.num_blocks:,} blocks, {backend} search)",
        file=sys.stderr, flush=True)
  progress = _Progress()
  metrics, predictions = evaluate_lib.evaluate(
      model, params, examples, searcher=searcher, store=store, batch_size=batch_size,
      k_values=clip_k_values(k_values, store.num_blocks), block_emb=loaded.embeddings,
      reader_len=reader_len, progress=progress)
  progress.finish()
  predictions_path, metrics_path = output_paths(output, run_dir, f"{task}_{split}_step{step}")
  evaluate_lib.write_predictions_jsonl(predictions_path, predictions)
  fileio.write_json_atomically(metrics_path, {
      "mode": "qa", "run_dir": os.path.abspath(run_dir), "task": task, "split": split,
      "checkpoint_step": step, "checkpoint_choice": why, "index_step": loaded.step,
      "backend": backend, "predictions": os.path.abspath(predictions_path),
      "metrics": metrics})
  print(f"{PROG}: {task}/{split}, checkpoint step {step} ({why}), index step {loaded.step}: "
        f"{format_metrics(metrics)}; predictions {predictions_path}, metrics {metrics_path}",
        flush=True)
  return 0


def _run_retrieval(*, run_dir, config, task, kind, split, index_run, loaded, store,
                   batch_size, k_values, backend, max_examples, output,
                   first_index_checkpoint_dir) -> int:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import qa_inputs  # pylint: disable=g-import-not-at-top
  try:
    tower = inputs.index_query_tower(loaded, config)
  except ckpt_lib.CheckpointError as e:  # another model size: a config error
    raise ConfigError(str(e)) from e
  if tower is not None:  # published with the index: its checkpoint may be pruned by now
    step_dir = loaded.manifest.get("checkpoint") or "its checkpoint (not recorded)"
    retriever = inputs.IndexRetriever(loaded, tower, config, backend=backend)
  else:
    step_dir = inputs.index_checkpoint_dir(index_run, loaded,
                                           first_checkpoint_dir=first_index_checkpoint_dir)
    # Size mismatch as a config error before restoring anything (the loader refuses it too).
    _checkpoint_metadata(step_dir, config, f"the checkpoint of index {loaded.step}")
    retriever = inputs.make_index_loader(index_run, config,
                                         first_checkpoint_dir=first_index_checkpoint_dir,
                                         backend=backend)(loaded)
  ks = clip_k_values(k_values, store.num_blocks)
  progress = _Progress()
  if kind == "ict":
    queries = ict_task_queries(task, split, max_examples)
    ids = _retrieve_all(retriever, queries["query_ids"], queries["query_mask"], k=ks[-1],
                        batch_size=batch_size, progress=progress)  # [n, k]
    hits = ict_hits(ids, queries["block_uid"], store.uids)  # [n, k]
  else:
    examples = qa_inputs.qa_task_examples(task, split, max_examples=max_examples)
    ids, start = [], time.monotonic()
    for query_ids, query_mask in _question_arrays_batches(examples, batch_size):
      ids.append(retriever.retrieve(query_ids, query_mask, k=ks[-1])[1])
      done = sum(len(i) for i in ids)
      progress(_rate_line("questions", done, len(examples), start))
    hits = answer_hits(np.concatenate(ids), examples, store)  # [n, k]
  progress.finish()
  metrics = recall_metrics(hits, ks, kind, store.num_blocks)
  _, metrics_path = output_paths(output, run_dir, f"{task}_{split}_retrieval_index{loaded.step}")
  fileio.write_json_atomically(metrics_path, {
      "mode": "retrieval", "run_dir": os.path.abspath(run_dir), "task": task, "split": split,
      "index_step": loaded.step, "query_tower_checkpoint": step_dir, "backend": backend,
      "metrics": metrics})
  print(f"{PROG}: retrieval {task}/{split}, index step {loaded.step} (query tower from "
        f"{step_dir}): {format_metrics(metrics)}; metrics {metrics_path}", flush=True)
  return 0


def block_texts(store: Any):
  """Each block's title and body text, as BM25 indexes it (block id order)."""
  for block_id in range(store.num_blocks):
    yield store.title(block_id) + "\n" + store.body(block_id)


def _refuse_unused_for_bm25(settings: dict) -> None:
  """ConfigError for a setting of a checkpoint, an index or the reader ({name: value}) that is
  not at evaluate_main's default: mode "bm25" has none of them."""
  import inspect  # pylint: disable=g-import-not-at-top
  defaults = inspect.signature(evaluate_main).parameters
  for name, value in settings.items():
    default = defaults[name].default
    if value != default:
      raise ConfigError(f"evaluate_main.{name}={value!r} does not apply to mode 'bm25', which "
                        f"ranks the BlockStore's own text (no checkpoint, index or reader): "
                        f"leave it at its default {default!r}")


def _bm25_job(*, run_dir, task, kind, split, block_store, batch_size, k_values, max_examples,
              output, dry_run) -> int:
  """Mode "bm25" after the common checks; `block_store` None: the toy store."""
  if run_dir is None and not output:
    raise ConfigError("mode 'bm25' without a run directory (RUN_DIR=None) needs "
                      "evaluate_main.output: e.g. --gin.evaluate_main.output=\"'/tmp/bm25.jsonl'\" "
                      "writes /tmp/bm25.metrics.json (or give a RUN_DIR: "
                      "<RUN_DIR>/predictions/<task>_<split>_bm25.metrics.json)")
  _, metrics_path = output_paths(output, run_dir, f"{task}_{split}_bm25")
  if dry_run:
    print(f"{PROG}: dry run ok (bm25, task {task}/{split}, block store "
          f"{block_store or 'the toy store'}, metrics {metrics_path}; no data read, nothing "
          f"written)", flush=True)
    return 0
  from realm_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  if run_dir is not None and not os.path.isdir(run_dir):
    # A typo would otherwise create a run directory holding nothing but this file.
    raise FileNotFoundError(f"{os.path.abspath(run_dir)}: no such run directory (mode 'bm25' "
                            f"needs none: --gin.RUN_DIR=None with evaluate_main.output)")
  if block_store is None:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top
    block_store = realm_jax_tasks.toy_block_store_dir()
  store = corpus_lib.BlockStore.open(block_store, verify="fast")
  return _run_bm25(run_dir=run_dir, task=task, kind=kind, split=split, store=store,
                   batch_size=batch_size, k_values=k_values, max_examples=max_examples,
                   metrics_path=metrics_path)


def _run_bm25(*, run_dir, task, kind, split, store, batch_size, k_values, max_examples,
              metrics_path) -> int:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from realm_jax.evaluation import bm25  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import qa_inputs  # pylint: disable=g-import-not-at-top
  ks = clip_k_values(k_values, store.num_blocks)
  start = time.monotonic()
  index = bm25.BM25Index(block_texts(store))
  print(f"{PROG}: BM25 index of {store.num_blocks:,} blocks ({index.num_terms:,} terms) in "
        f"{time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)
  if kind == "ict":
    queries = ict_task_queries(task, split, max_examples)
    texts = ict_query_texts(queries["query_ids"], queries["query_mask"])
  else:
    examples = qa_inputs.qa_task_examples(task, split, max_examples=max_examples)
    texts = [e.question for e in examples]
  progress = _Progress()
  hits, start = [], time.monotonic()
  for begin in range(0, len(texts), batch_size):
    end = min(begin + batch_size, len(texts))
    ids, _ = index.top_k(texts[begin:end], ks[-1])  # [batch, k]
    hits.append(ict_hits(ids, queries["block_uid"][begin:end], store.uids) if kind == "ict"
                else answer_hits(ids, examples[begin:end], store))  # [batch, k]
    progress(_rate_line("queries" if kind == "ict" else "questions", end, len(texts), start))
  progress.finish()
  metrics = recall_metrics(np.concatenate(hits), ks, kind, store.num_blocks)
  fileio.write_json_atomically(metrics_path, {
      "mode": "bm25", "run_dir": os.path.abspath(run_dir) if run_dir else None, "task": task,
      "split": split, "block_store": os.path.abspath(store.path),
      "bm25": {"k1": index.k1, "b": index.b}, "metrics": metrics})
  print(f"{PROG}: bm25 {task}/{split}, {store.num_blocks:,} blocks of {store.path} (k1 "
        f"{index.k1:g}, b {index.b:g}): {format_metrics(metrics)}; metrics {metrics_path}",
        flush=True)
  return 0


def _run_questions(*, run_dir, config, questions, step, why, loaded, store,
                   reader_beam, reader_len, backend) -> int:
  from realm_jax.evaluation import evaluate as evaluate_lib  # pylint: disable=g-import-not-at-top
  searcher = _searcher(loaded, backend)
  model, params = _open_qa_model(run_dir, config, step, reader_beam)
  predictor = evaluate_lib.Predictor(model, params, searcher=searcher, store=store,
                                     block_emb=loaded.embeddings, reader_len=reader_len)
  print(f"{PROG}: checkpoint step {step} ({why}), index step {loaded.step}", flush=True)
  for question in questions:
    reason = predictor.skip_reason(question)
    if reason is not None:
      print(f"question: {question}\n  cannot answer: {reason}", flush=True)
      continue
    result = predictor.answer(question)
    print("\n".join(format_answer(result)), flush=True)
  return 0


def format_answer(result: dict) -> list[str]:
  """The lines printed for one `Predictor.answer` result: the answer, then one line per
  evidence block (rank, block id, title, retrieval score, snippet; `*` marks the block the
  answer was read from)."""
  lines = [f"question: {result['question']}",
           f"answer: {result['answer']!r} (block {result['block_id']}, joint logit "
           f"{result['score']:.3f})"]
  for evidence in result["evidence"]:
    mark = "*" if evidence["has_prediction"] else " "
    snippet = " ".join(evidence["snippet"].split())
    lines.append(f" {mark}{evidence['rank'] + 1}. block {evidence['block_id']} "
                 f"[{evidence['title']}] score {evidence['score']:.3f}: {snippet}")
  return lines


def _resolve_task(task: str, mode: str, split: str) -> tuple[Any, str]:
  """(seqio task, kind) after checking it is registered, fits the mode and has the split."""
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  try:
    seqio_task = inputs.get_task(task)
  except inputs.UnknownTaskError as e:
    raise ConfigError(f"evaluate_main.task: unknown task {task!r}; registered QA tasks: "
                      f"{', '.join(registered_tasks('qa'))} (modes 'retrieval' and 'bm25' also "
                      f"take ICT tasks: {', '.join(registered_tasks('ict'))})") from e
  kind = task_kind(seqio_task)
  allowed = ("qa",) if mode == "qa" else ("qa", "ict")
  if kind not in allowed:
    raise ConfigError(f"evaluate_main.task={task!r} is not a "
                      f"{'QA' if mode == 'qa' else 'QA or ICT'} task, which mode {mode!r} needs "
                      f"(QA tasks: {', '.join(registered_tasks('qa'))}"
                      + ("" if mode == "qa" else
                         f"; ICT tasks: {', '.join(registered_tasks('ict'))}") + ")")
  splits = tuple(seqio_task.splits)
  if split not in splits:
    raise ConfigError(f"evaluate_main.split={split!r}: task {task!r} has splits "
                      f"{', '.join(splits)} (e.g. --gin.evaluate_main.split=\"'{splits[-1]}'\")")
  return seqio_task, kind


@gin.configurable
def evaluate_main(run_dir: str = gin.REQUIRED, model_config: Any = gin.REQUIRED,
                  task: Optional[str] = gin.REQUIRED, split: str = "test", mode: str = "qa",
                  checkpoint_step: Optional[int] = None, index_step: Optional[int] = None,
                  index_run_dir: Optional[str] = None, block_store: Optional[str] = None,
                  first_index_checkpoint_dir: Optional[str] = None, batch_size: int = 16,
                  k_values: Sequence[int] = (1, 5, 20, 100), reader_beam: int = 5,
                  reader_len: int = 320, backend: str = "exact",
                  max_examples: Optional[int] = None, output: Optional[str] = None,
                  questions: Sequence[str] = (), verify_index: bool = True,
                  dry_run: bool = False) -> int:
  """Evaluates a run, or BM25 over a block store (the only gin-configurable function of this job).

  Args:
    run_dir: the run directory: its checkpoints/ (and best.json) and its published index/.
      Mode "bm25" reads nothing from it: None (--gin.RUN_DIR=None) needs `output`; a run
      directory gets the metrics beside its retrieval metrics (see `output`).
    model_config: a RealmConfig (%MODEL_CONFIG of gin_configs/models/*.gin); checkpoints of
      another model size are refused. Not used by mode "bm25".
    task: a seqio QA task (`toy_qa`, `nq_open`, ...) or, for modes "retrieval" and "bm25", an
      ICT task (`ict_toy`; `ict_<corpus>` of your own corpus is registered over `block_store`,
      as `train` does); or your own QA files, a path (`regex:<path>` for regex answers; see
      `realm_jax_tasks.register_qa_files`). Not needed with `questions`.
    split: the task split ("test"; the ICT tasks have only "train").
    mode: "qa" (reader predictions, EM, recall), "retrieval" (recall of the index's own
      query tower, no reader) or "bm25" (the same recall of Okapi BM25 over the block store's
      title and body text, `realm_jax.evaluation.bm25`: the lexical baseline; no checkpoint,
      index or model, so checkpoint_step, index_step, index_run_dir,
      first_index_checkpoint_dir, backend, reader_beam, reader_len and verify_index must stay
      at their defaults).
    checkpoint_step: "qa": the checkpoint to evaluate; None: the best in best.json, else the
      newest. (Mode "retrieval" uses the checkpoint the index was built from.)
    index_step: the published index to retrieve from; None: the newest.
    index_run_dir: the run whose published index/ is searched; None: `run_dir` (set it when a
      fine-tuning run searches its pretraining run's frozen index instead of its own copy).
    block_store: the BlockStore the index embeds ("bm25": the one BM25 ranks); None: the toy
      store for toy tasks (and for `questions`), required otherwise.
    first_index_checkpoint_dir: "retrieval": the checkpoint index step 0 was built from, when
      its manifest's path no longer exists (e.g. moved run directories).
    batch_size: questions (queries) per step.
    k_values: recall cut-offs (clipped to the number of blocks).
    reader_beam: blocks the reader reads per question.
    reader_len: reader sequence length.
    backend: "exact" or "scann" (the index's ScaNN artifacts).
    max_examples: evaluate only the first this many examples.
    output: predictions JSONL path (metrics go to the same path with .metrics.json); None:
      `<run_dir>/predictions/<task>_<split>_step<N>.jsonl` ("retrieval":
      `<task>_<split>_retrieval_index<N>.metrics.json`, "bm25": `<task>_<split>_bm25.metrics.json`;
      "bm25" without a run_dir has no default: set `output`).
    questions: free-text questions to answer and show evidence for (overrides the task).
    verify_index: re-hash every file of the index against its manifest before searching it
      (as the trainer does: a flipped byte is refused); False checks file sizes only, for
      speed on a large index.
    dry_run: check the configuration (and the run's checkpoint size, if any), print one line.

  Returns:
    The exit status (0).
  """
  _CALL_STARTED[0] = True
  from realm_jax.models.config import RealmConfig  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top

  questions = [str(q) for q in (questions or ())]
  if mode not in MODES:
    raise ConfigError(f"evaluate_main.mode={mode!r}; expected one of {', '.join(MODES)}")
  if questions and mode != "qa":
    raise ConfigError("--question answers with the reader: it needs mode 'qa'")
  if mode != "bm25" and not isinstance(model_config, RealmConfig):  # BM25 has no model
    raise ConfigError(f"evaluate_main.model_config is a {type(model_config).__name__}, not a "
                      f"RealmConfig: include a gin_configs/models/*.gin and bind %MODEL_CONFIG")
  if not (mode == "bm25" and run_dir is None) and (not isinstance(run_dir, str) or not run_dir):
    raise ConfigError(f"evaluate_main.run_dir={run_dir!r}: expected a directory path "
                      f"(--gin.RUN_DIR=\"'/runs/x'\"; mode 'bm25' also takes --gin.RUN_DIR=None)")
  if backend not in BACKENDS:
    raise ConfigError(f"evaluate_main.backend={backend!r}; expected one of {', '.join(BACKENDS)}")
  k_values = _check_k_values(k_values)
  for name, value in (("batch_size", batch_size), ("reader_beam", reader_beam),
                      ("reader_len", reader_len)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ConfigError(f"evaluate_main.{name}={value!r}: expected a positive integer")
  if max_examples is not None and (not isinstance(max_examples, int) or max_examples < 1):
    raise ConfigError(f"evaluate_main.max_examples={max_examples!r}: expected None or a "
                      f"positive integer")
  if checkpoint_step is not None and mode == "retrieval":
    raise ConfigError("evaluate_main.checkpoint_step is for mode 'qa'; mode 'retrieval' uses "
                      "the checkpoint its index was built from: pick the index with "
                      "evaluate_main.index_step")
  if mode == "bm25":
    _refuse_unused_for_bm25({
        "checkpoint_step": checkpoint_step, "index_step": index_step,
        "index_run_dir": index_run_dir, "first_index_checkpoint_dir": first_index_checkpoint_dir,
        "backend": backend, "reader_beam": reader_beam, "reader_len": reader_len,
        "verify_index": verify_index})

  kind = None
  if not questions:
    if not isinstance(task, str) or not task:
      raise ConfigError(f"evaluate_main.task={task!r}: name a seqio task "
                        f"(--gin.TASK=\"'toy_qa'\"), or pass --question")
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top
    if realm_jax_tasks.is_qa_path(task):  # your own question files
      try:
        task = realm_jax_tasks.register_qa_files(task)
      except ValueError as e:
        raise ConfigError(f"evaluate_main.task={task!r}: {e}") from e
    elif block_store is not None and mode in ("retrieval", "bm25"):
      realm_jax_tasks.register_corpus_for_task(task, block_store)  # as train does
    _, kind = _resolve_task(task, mode, split)
  toy_store = False
  if block_store is None:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top
    if questions or task in realm_jax_tasks.TOY_TASKS:
      toy_store = True
    else:
      raise ConfigError(f"evaluate_main.block_store is required for task {task!r} (the "
                        + ("BlockStore whose blocks BM25 ranks)" if mode == "bm25" else
                           "BlockStore the run's index embeds)"))
  if mode == "bm25":
    return _bm25_job(run_dir=run_dir, task=task, kind=kind, split=split,
                     block_store=None if toy_store else block_store, batch_size=batch_size,
                     k_values=k_values, max_examples=max_examples, output=output,
                     dry_run=dry_run)

  what = ("predict" if questions else mode) + ("" if questions else f", task {task}/{split}")
  what += f", model ({ckpt_lib.describe_size(model_config)}), run_dir {run_dir}"
  # Only what is already on disk is checked here, so a dry run works before the run exists.
  steps = ckpt_lib.list_checkpoint_steps(run_dir)
  if checkpoint_step is not None and steps and int(checkpoint_step) not in steps:
    raise ConfigError(f"evaluate_main.checkpoint_step={checkpoint_step}: "
                      f"{ckpt_lib.checkpoints_dir(run_dir)} has steps {steps}")
  step, why = None, "none"
  if mode == "qa" and steps:
    step, why = choose_checkpoint(run_dir, checkpoint_step)
    step_dir = ckpt_lib.checkpoint_path(run_dir, step)
    _require_reader(_checkpoint_metadata(step_dir, model_config, "checkpoint"), step_dir)
    what += f"; checkpoint step {step} ({why})"
  elif mode == "retrieval" and steps and dry_run:
    # Retrieval uses the checkpoint its index was built from (checked when it is loaded); the
    # run's newest one tells the model size without reading an index.
    _checkpoint_metadata(ckpt_lib.checkpoint_path(run_dir, steps[-1]), model_config,
                         "checkpoint")

  index_run = index_run_dir or run_dir
  if index_run_dir:
    what += f", index of {index_run_dir}"
  if dry_run:
    from realm_jax.index import store as index_lib  # pylint: disable=g-import-not-at-top
    if not steps:
      what += f"; no checkpoints in {ckpt_lib.checkpoints_dir(run_dir)} yet"
    indexes = index_lib.list_indexes(index_run)
    what += (f"; index steps {indexes}" if indexes
             else f"; no published index in {index_lib.index_root(index_run)} yet")
    if toy_store:
      what += "; block store: the toy store"
    print(f"{PROG}: dry run ok ({what}; no data read, nothing written)", flush=True)
    return 0

  from realm_jax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  for directory in ([run_dir] if mode == "qa" else []) + [index_run]:
    if not os.path.isdir(directory):
      raise FileNotFoundError(f"{os.path.abspath(directory)}: no such run directory")
  if mode == "qa" and step is None:
    raise ckpt_lib.CheckpointError(f"{ckpt_lib.checkpoints_dir(run_dir)}: no finished "
                                   f"checkpoint to evaluate")
  if toy_store:
    import realm_jax_tasks  # pylint: disable=g-import-not-at-top
    block_store = realm_jax_tasks.toy_block_store_dir()
  store = corpus_lib.BlockStore.open(block_store, verify="fast")
  log.info("%s", what)
  loaded = _load_published_index(index_run, index_step, store, model_config,
                                 verify=True if verify_index else "fast")
  if questions:
    return _run_questions(run_dir=run_dir, config=model_config, questions=questions, step=step,
                          why=why, loaded=loaded, store=store,
                          reader_beam=reader_beam, reader_len=reader_len, backend=backend)
  if mode == "qa":
    return _run_qa(run_dir=run_dir, config=model_config, task=task, split=split, step=step,
                   why=why, loaded=loaded, store=store,
                   batch_size=batch_size, k_values=k_values, reader_beam=reader_beam,
                   reader_len=reader_len, backend=backend, max_examples=max_examples,
                   output=output)
  return _run_retrieval(run_dir=run_dir, config=model_config, task=task, kind=kind, split=split,
                        index_run=index_run, loaded=loaded, store=store,
                        batch_size=batch_size,
                        k_values=k_values, backend=backend, max_examples=max_examples,
                        output=output, first_index_checkpoint_dir=first_index_checkpoint_dir)


# ------------------------------------------------------------------------------ command line


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Entry point; returns the exit status."""
  argv = list(sys.argv if argv is None else argv)
  gin_utils.setup_logging()
  _CALL_STARTED[0] = False

  def job() -> int:
    gin_bindings, rest = split_gin_args(argv[1:])
    values = gin_utils.parse_flags(
        [argv[0] if argv else PROG] + rest,
        {"dry_run": "Check the configuration (and the run's checkpoint size), print one line "
                    "and exit without reading data."},
        multi_strings={"question": "A free-text question to answer with its evidence "
                                   "(repeatable); no task needed."})
    if not values.gin_file:
      raise ConfigError("no --gin_file given (e.g. --gin_file=gin_configs/experiments/"
                        "toy_eval.gin)")
    bindings = list(values.gin_bindings) + gin_bindings
    if values.question:
      # Free-text questions need no task; gin refuses a config whose TASK macro is left at
      # %gin.REQUIRED (at parse time, whether or not the call uses it), so set it here.
      bindings.append("TASK = None")
    gin_utils.parse_gin(values.gin_file, bindings)
    overrides: dict[str, Any] = {"dry_run": True} if values.dry_run else {}
    if values.question:
      overrides["questions"] = list(values.question)
    return evaluate_main(**overrides)

  # Runtime errors that explain themselves: CheckpointError, IndexLoadError, FileNotFoundError...
  return gin_utils.run_job(PROG, job, started=lambda: _CALL_STARTED[0],
                           interrupted="nothing partial was written",
                           doc=__doc__, configurables=(evaluate_main,))


if __name__ == "__main__":
  sys.exit(main())
