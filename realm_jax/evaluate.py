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

Mode "qa" and `--question` read the blocks the run's index ranks; with
`evaluate_main.candidates='bm25'` they read the blocks BM25 ranks instead, with no retrieval
score added (a run fine-tuned with `FinetuneJob.candidates='bm25'`: DrQA's pipeline; no index);
with `evaluate_main.candidates='none'` they read no block (a closed-book FiD run,
`FinetuneJob.candidates='none'`: one row `[CLS] question [SEP]`, empty evidence, no recall; no
index).

And one without a run:

* mode "bm25": the lexical baseline for mode "retrieval". Okapi BM25 (`evaluation.bm25`: k1 0.9,
  b 0.4, Lucene's idf, lower-cased alphanumeric terms of each block's title and body) ranks the
  blocks of the BlockStore (`block_store`, or the toy store for toy tasks) for every question of
  the same task split, and reports the same metrics the same way (recall@k by
  `evaluation.retrieval.answer_hits`, regex answers for regex tasks; for an ICT task the source
  block's recall by `evaluation.retrieval.ict_hits`, its wordpiece query decoded back to text,
  with chance@k), "bm25" in place of "retrieval". No
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
from typing import Any, Callable, NamedTuple, Optional, Sequence

import gin

from realm_jax import fileio
from realm_jax import gin_utils
from realm_jax.evaluation import bm25 as bm25_lib
from realm_jax.evaluation import metrics as metrics_lib
from realm_jax.evaluation import retrieval
from realm_jax.evaluation import runs
from realm_jax.evaluation import tasks as tasks_lib
from realm_jax.gin_utils import ConfigError

PROG = "evaluate"
MODES = ("qa", "retrieval", "bm25")
BACKENDS = ("exact", "scann")
PROGRESS_INTERVAL_S = 5.0  # seconds between progress lines on stderr
BUILD_INDEX_HINT = ("python -m realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
                    "--once --gin.RUN_DIR=... --gin.BLOCK_STORE=...")

log = logging.getLogger(PROG)


# ------------------------------------------------------------------------------ small pieces


def _check_k_values(k_values: Any) -> tuple[int, ...]:
  if isinstance(k_values, int) or not k_values:
    raise ConfigError(f"evaluate_main.k_values={k_values!r}: expected a non-empty sequence of "
                      f"positive integers, e.g. (1, 5, 20, 100)")
  for k in k_values:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
      raise ConfigError(f"evaluate_main.k_values={tuple(k_values)!r}: {k!r} is not a positive "
                        f"integer")
  return tuple(int(k) for k in k_values)


def _checkpoint_metadata(step_dir: str, config: Any, where: str) -> dict:
  """The metadata of a checkpoint step directory; ConfigError (naming both sizes) when it is
  of another model size than `config`."""
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  metadata = ckpt_lib.read_metadata(step_dir)
  try:
    ckpt_lib.checkpoint_config(step_dir, metadata, config)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(f"{where}: {gin_utils.one_line(e)}") from e
  return metadata


def _require_reader(metadata: dict, step_dir: str) -> None:
  items = list(metadata.get("param_items", []))
  if "reader" not in items and "fid" not in items:  # a span reader, or FiD's (generative)
    raise ConfigError(f"{step_dir} holds params {items}, no fine-tuned reader (an ICT or "
                      f"pretraining run?): mode 'qa' needs an open-QA checkpoint; measure its "
                      f"retrieval with --gin.evaluate_main.mode=\"'retrieval'\"")


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
  """(OpenQAModel, params on the default device) of one checkpoint of the run; for a
  `FinetuneJob(reader='fid')` run, its `FidReaderModel` (the FidConfig the run wrote beside
  its checkpoints, `<run_dir>/fid_config.json`), which generates its answers."""
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.models.open_qa import OpenQAModel  # pylint: disable=g-import-not-at-top
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
  # A PEFT checkpoint comes back with LoRA merged; adapters need the config that has them.
  params, theirs, _ = ckpt_lib.restore_params(run_dir, step, expected_config=config)
  if "fid" in params:
    from realm_jax.models import fid_qa  # pylint: disable=g-import-not-at-top
    try:
      fid = fid_qa.read_fid_config(run_dir, theirs.bert)
    except FileNotFoundError as e:
      raise ckpt_lib.CheckpointError(f"{run_dir}: a FiD reader's checkpoint without its "
                                     f"{fid_qa.FID_CONFIG_FILE}") from e
    closed_book = "retriever" not in params  # FinetuneJob(candidates='none'): no retriever
    params = jax.device_put({key: params[key] for key in ("retriever", "fid") if key in params})
    return fid_qa.FidReaderModel(config, fid, reader_beam=reader_beam,
                                 closed_book=closed_book), params
  config = config.replace(**{"bert.adapter_size": theirs.bert.adapter_size})
  # Only the two towers the model reads; placed once rather than copied at every call.
  params = jax.device_put({"retriever": params["retriever"], "reader": params["reader"]})
  return OpenQAModel(config, reader_beam=reader_beam), params


class _Candidates(NamedTuple):
  """What the reader reads, for modes "qa" and predict: a searcher, the embeddings of the
  reader's retrieval scores, the index step (None: BM25), and how to name them."""
  searcher: Any
  block_emb: Any
  index_step: Optional[int]
  where: str  # "index step 7" or "BM25's blocks"
  how: str  # "exact search" or "BM25 ranking"
  kind: str = "index"  # evaluate_main.candidates


def _reader_candidates(loaded: Any, backend: str, store: Any, config: Any,
                       kind: str = "index") -> _Candidates:
  """The published index's candidates (`loaded`), or with None BM25's over `store`; with
  `kind` 'none' the closed book's (no block, no index)."""
  if kind == "none":
    from realm_jax.batches import qa_inputs  # pylint: disable=g-import-not-at-top
    return _Candidates(qa_inputs.ClosedBook(), None, None, "closed book (nothing retrieved)",
                       "no retrieval", "none")
  if loaded is None:
    searcher = bm25_lib.BM25Searcher(store, config.proj_size)
    return _Candidates(searcher, searcher.embeddings, None, "BM25's blocks", "BM25 ranking",
                       "bm25")
  return _Candidates(_searcher(loaded, backend), loaded.embeddings, loaded.step,
                     f"index step {loaded.step}", f"{backend} search")


def _run_qa(*, run_dir, config, task, split, step, why, candidates, store,
            batch_size, k_values, reader_beam, reader_len, backend, max_examples,
            output) -> int:
  from realm_jax.evaluation import evaluate as evaluate_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.batches import qa_inputs  # pylint: disable=g-import-not-at-top
  model, params = _open_qa_model(run_dir, config, step, reader_beam)
  examples = qa_inputs.qa_task_examples(task, split, max_examples=max_examples)
  print(f"{PROG}: {len(examples)} questions of {task}/{split}, checkpoint step {step} ({why}), "
        f"{candidates.where} ({store.num_blocks:,} blocks, {candidates.how})",
        file=sys.stderr, flush=True)
  progress = _Progress()
  metrics, predictions = evaluate_lib.evaluate(
      model, params, examples, searcher=candidates.searcher, store=store, batch_size=batch_size,
      k_values=retrieval.clip_k_values(k_values, store.num_blocks),
      block_emb=candidates.block_emb, reader_len=reader_len, progress=progress)
  progress.finish()
  predictions_path, metrics_path = runs.output_paths(output, run_dir, f"{task}_{split}_step{step}")
  evaluate_lib.write_predictions_jsonl(predictions_path, predictions)
  fileio.write_json_atomically(metrics_path, {
      "mode": "qa", "run_dir": os.path.abspath(run_dir), "task": task, "split": split,
      "checkpoint_step": step, "checkpoint_choice": why, "index_step": candidates.index_step,
      # Only BM25's or the closed book's candidates are named: an index's metrics stay as they
      # were.
      **({"candidates": candidates.kind} if candidates.index_step is None else {}),
      "backend": backend, "predictions": os.path.abspath(predictions_path),
      "metrics": metrics})
  print(f"{PROG}: {task}/{split}, checkpoint step {step} ({why}), {candidates.where}: "
        f"{metrics_lib.format_metrics(metrics)}; predictions {predictions_path}, "
        f"metrics {metrics_path}", flush=True)
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
  ks = retrieval.clip_k_values(k_values, store.num_blocks)
  progress = _Progress()
  if kind == "ict":
    queries = tasks_lib.ict_task_queries(task, split, max_examples)
    ids = _retrieve_all(retriever, queries["query_ids"], queries["query_mask"], k=ks[-1],
                        batch_size=batch_size, progress=progress)  # [n, k]
    hits = retrieval.ict_hits(ids, queries["block_uid"], store.uids)  # [n, k]
  else:
    examples = qa_inputs.qa_task_examples(task, split, max_examples=max_examples)
    ids, start = [], time.monotonic()
    for query_ids, query_mask in _question_arrays_batches(examples, batch_size):
      ids.append(retriever.retrieve(query_ids, query_mask, k=ks[-1])[1])
      done = sum(len(i) for i in ids)
      progress(_rate_line("questions", done, len(examples), start))
    hits = retrieval.answer_hits(np.concatenate(ids), examples, store)  # [n, k]
  progress.finish()
  metrics = retrieval.recall_metrics(hits, ks, kind, store.num_blocks)
  _, metrics_path = runs.output_paths(output, run_dir,
                                      f"{task}_{split}_retrieval_index{loaded.step}")
  fileio.write_json_atomically(metrics_path, {
      "mode": "retrieval", "run_dir": os.path.abspath(run_dir), "task": task, "split": split,
      "index_step": loaded.step, "query_tower_checkpoint": step_dir, "backend": backend,
      "metrics": metrics})
  print(f"{PROG}: retrieval {task}/{split}, index step {loaded.step} (query tower from "
        f"{step_dir}): {metrics_lib.format_metrics(metrics)}; metrics {metrics_path}", flush=True)
  return 0


def _check_closed_book(metadata: dict, step_dir: str, candidates: str) -> None:
  """ConfigError unless `candidates='none'` goes with a FiD checkpoint and a closed-book one
  (a FiD reader without a retriever, `FinetuneJob.candidates='none'`) with it."""
  items = list(metadata.get("param_items", []))
  if candidates == "none" and "fid" not in items:
    raise ConfigError(f"evaluate_main.candidates='none' (closed book) reads no block: it needs "
                      f"a generative FiD reader, and {step_dir} holds params {items} (a span "
                      f"reader answers with spans of the blocks it reads)")
  if candidates != "none" and "fid" in items and "retriever" not in items:
    raise ConfigError(f"{step_dir} is a closed-book reader (FinetuneJob.candidates='none': "
                      f"params {items}, no retriever): evaluate it with "
                      f"--gin.evaluate_main.candidates=\"'none'\"")


def _default(name: str) -> Any:
  """evaluate_main's default of one setting."""
  import inspect  # pylint: disable=g-import-not-at-top
  return inspect.signature(evaluate_main).parameters[name].default


def _refuse_unused(settings: dict, what: str) -> None:
  """ConfigError for a setting ({name: value}) that is not at evaluate_main's default, where
  `what` has no use for it."""
  import inspect  # pylint: disable=g-import-not-at-top
  defaults = inspect.signature(evaluate_main).parameters
  for name, value in settings.items():
    default = defaults[name].default
    if value != default:
      raise ConfigError(f"evaluate_main.{name}={value!r} does not apply to {what}: leave it at "
                        f"its default {default!r}")


def _refuse_unused_for_bm25(settings: dict) -> None:
  """ConfigError for a setting of a checkpoint, an index or the reader ({name: value}) that is
  not at evaluate_main's default: mode "bm25" has none of them."""
  _refuse_unused(settings, "mode 'bm25', which ranks the BlockStore's own text (no checkpoint, "
                           "index or reader)")


def _bm25_job(*, run_dir, task, kind, split, block_store, batch_size, k_values, max_examples,
              output, dry_run) -> int:
  """Mode "bm25" after the common checks; `block_store` None: the toy store."""
  if run_dir is None and not output:
    raise ConfigError("mode 'bm25' without a run directory (RUN_DIR=None) needs "
                      "evaluate_main.output: e.g. --gin.evaluate_main.output=\"'/tmp/bm25.jsonl'\" "
                      "writes /tmp/bm25.metrics.json (or give a RUN_DIR: "
                      "<RUN_DIR>/predictions/<task>_<split>_bm25.metrics.json)")
  _, metrics_path = runs.output_paths(output, run_dir, f"{task}_{split}_bm25")
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
  ks = retrieval.clip_k_values(k_values, store.num_blocks)
  start = time.monotonic()
  index = bm25.BM25Index(bm25.block_texts(store))
  print(f"{PROG}: BM25 index of {store.num_blocks:,} blocks ({index.num_terms:,} terms) in "
        f"{time.monotonic() - start:.1f}s", file=sys.stderr, flush=True)
  if kind == "ict":
    queries = tasks_lib.ict_task_queries(task, split, max_examples)
    texts = tasks_lib.ict_query_texts(queries["query_ids"], queries["query_mask"])
  else:
    examples = qa_inputs.qa_task_examples(task, split, max_examples=max_examples)
    texts = [e.question for e in examples]
  progress = _Progress()
  hits, start = [], time.monotonic()
  for begin in range(0, len(texts), batch_size):
    end = min(begin + batch_size, len(texts))
    ids, _ = index.top_k(texts[begin:end], ks[-1])  # [batch, k]
    hits.append(retrieval.ict_hits(ids, queries["block_uid"][begin:end], store.uids)
                if kind == "ict" else
                retrieval.answer_hits(ids, examples[begin:end], store))  # [batch, k]
    progress(_rate_line("queries" if kind == "ict" else "questions", end, len(texts), start))
  progress.finish()
  metrics = retrieval.recall_metrics(np.concatenate(hits), ks, kind, store.num_blocks)
  fileio.write_json_atomically(metrics_path, {
      "mode": "bm25", "run_dir": os.path.abspath(run_dir) if run_dir else None, "task": task,
      "split": split, "block_store": os.path.abspath(store.path),
      "bm25": {"k1": index.k1, "b": index.b}, "metrics": metrics})
  print(f"{PROG}: bm25 {task}/{split}, {store.num_blocks:,} blocks of {store.path} (k1 "
        f"{index.k1:g}, b {index.b:g}): {metrics_lib.format_metrics(metrics)}; "
        f"metrics {metrics_path}", flush=True)
  return 0


def _run_questions(*, run_dir, config, questions, step, why, candidates, store,
                   reader_beam, reader_len) -> int:
  from realm_jax.evaluation import evaluate as evaluate_lib  # pylint: disable=g-import-not-at-top
  model, params = _open_qa_model(run_dir, config, step, reader_beam)
  predictor = evaluate_lib.Predictor(model, params, searcher=candidates.searcher, store=store,
                                     block_emb=candidates.block_emb, reader_len=reader_len)
  print(f"{PROG}: checkpoint step {step} ({why}), {candidates.where}", flush=True)
  for question in questions:
    reason = predictor.skip_reason(question)
    if reason is not None:
      print(f"question: {question}\n  cannot answer: {reason}", flush=True)
      continue
    result = predictor.answer(question)
    print("\n".join(evaluate_lib.format_answer(result)), flush=True)
  return 0


def _resolve_task(task: str, mode: str, split: str) -> tuple[Any, str]:
  """(seqio task, kind) after checking it is registered, fits the mode and has the split."""
  from realm_jax.batches import inputs  # pylint: disable=g-import-not-at-top
  try:
    seqio_task = inputs.get_task(task)
  except inputs.UnknownTaskError as e:
    raise ConfigError(f"evaluate_main.task: unknown task {task!r}; registered QA tasks: "
                      f"{', '.join(tasks_lib.registered_tasks('qa'))} (modes 'retrieval' and "
                      f"'bm25' also take ICT tasks: "
                      f"{', '.join(tasks_lib.registered_tasks('ict'))})") from e
  kind = tasks_lib.task_kind(seqio_task)
  allowed = ("qa",) if mode == "qa" else ("qa", "ict")
  if kind not in allowed:
    raise ConfigError(f"evaluate_main.task={task!r} is not a "
                      f"{'QA' if mode == 'qa' else 'QA or ICT'} task, which mode {mode!r} needs "
                      f"(QA tasks: {', '.join(tasks_lib.registered_tasks('qa'))}"
                      + ("" if mode == "qa" else
                         f"; ICT tasks: {', '.join(tasks_lib.registered_tasks('ict'))}") + ")")
  splits = tuple(seqio_task.splits)
  if split not in splits:
    raise ConfigError(f"evaluate_main.split={split!r}: task {task!r} has splits "
                      f"{', '.join(splits)} (e.g. --gin.evaluate_main.split=\"'{splits[-1]}'\")")
  return seqio_task, kind


def _question_bindings(values: Any) -> list[str]:
  """Free-text questions need no task; gin refuses a config whose TASK macro is left at
  %gin.REQUIRED (at parse time, whether or not the call uses it), so --question sets it."""
  return ["TASK = None"] if values.question else []


# Runtime errors that explain themselves: CheckpointError, IndexLoadError, FileNotFoundError...
@gin_utils.command(
    PROG, doc=__doc__, example_gin="gin_configs/experiments/toy_eval.gin",
    interrupted="nothing partial was written",
    booleans={"dry_run": "Check the configuration (and the run's checkpoint size), print one "
                         "line and exit without reading data."},
    multi_strings={"question": "A free-text question to answer with its evidence "
                               "(repeatable); no task needed."},
    arguments={"question": "questions"}, extra_bindings=_question_bindings)
def evaluate_main(run_dir: str = gin.REQUIRED, model_config: Any = gin.REQUIRED,
                  task: Optional[str] = gin.REQUIRED, split: str = "test", mode: str = "qa",
                  checkpoint_step: Optional[int] = None, index_step: Optional[int] = None,
                  index_run_dir: Optional[str] = None, block_store: Optional[str] = None,
                  first_index_checkpoint_dir: Optional[str] = None, batch_size: int = 16,
                  k_values: Sequence[int] = (1, 5, 20, 100), reader_beam: int = 5,
                  reader_len: int = 320, backend: str = "exact",
                  max_examples: Optional[int] = None, output: Optional[str] = None,
                  questions: Sequence[str] = (), verify_index: bool = True,
                  candidates: str = "index", dry_run: bool = False) -> int:
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
    candidates: what the reader reads in mode "qa" and for `questions`: "index" (the blocks
      the published index ranks) or "bm25" (the blocks BM25 ranks over the block store, with
      no retrieval score added: a run fine-tuned with FinetuneJob.candidates='bm25'; no index,
      so index_step, index_run_dir, backend and verify_index stay at their defaults), or
      "none" (the closed book: no block, one row `[CLS] question [SEP]`, empty evidence, no
      recall; a FiD run fine-tuned with FinetuneJob.candidates='none'; no index either, and
      reader_beam is 1).
    dry_run: check the configuration (and the run's checkpoint size, if any), print one line.

  Returns:
    The exit status (0).
  """
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
  if candidates not in bm25_lib.READER_CANDIDATES:
    raise ConfigError(f"evaluate_main.candidates={candidates!r}; expected one of "
                      f"{', '.join(bm25_lib.READER_CANDIDATES)}")
  if candidates != "index":
    if mode != "qa":
      raise ConfigError(f"evaluate_main.candidates={candidates!r} is what the reader reads "
                        f"(mode 'qa' or --question); mode {mode!r} does not read"
                        + (": BM25's own recall is mode 'bm25'" if candidates == "bm25" else ""))
    _refuse_unused({"index_step": index_step, "index_run_dir": index_run_dir,
                    "backend": backend, "verify_index": verify_index},
                   f"candidates={candidates!r}, which reads no index")
  if candidates == "none":
    if reader_beam not in (1, _default("reader_beam")):
      raise ConfigError(f"evaluate_main.reader_beam={reader_beam} does not apply to "
                        f"candidates='none' (the closed book reads one row per question, the "
                        f"question alone): leave it unset")
    reader_beam = 1
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
    step, why = runs.choose_checkpoint(run_dir, checkpoint_step)
    step_dir = ckpt_lib.checkpoint_path(run_dir, step)
    metadata = _checkpoint_metadata(step_dir, model_config, "checkpoint")
    _require_reader(metadata, step_dir)
    _check_closed_book(metadata, step_dir, candidates)
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
    if candidates == "bm25":
      what += "; candidates: BM25's blocks, no index"
    elif candidates == "none":
      what += "; closed book: nothing retrieved, no index"
    else:
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
  loaded = None if candidates != "index" else _load_published_index(
      index_run, index_step, store, model_config, verify=True if verify_index else "fast")
  if questions or mode == "qa":
    reader_candidates = _reader_candidates(loaded, backend, store, model_config, candidates)
  if questions:
    return _run_questions(run_dir=run_dir, config=model_config, questions=questions, step=step,
                          why=why, candidates=reader_candidates, store=store,
                          reader_beam=reader_beam, reader_len=reader_len)
  if mode == "qa":
    return _run_qa(run_dir=run_dir, config=model_config, task=task, split=split, step=step,
                   why=why, candidates=reader_candidates, store=store,
                   batch_size=batch_size, k_values=k_values, reader_beam=reader_beam,
                   reader_len=reader_len, backend=backend, max_examples=max_examples,
                   output=output)
  return _run_retrieval(run_dir=run_dir, config=model_config, task=task, kind=kind, split=split,
                        index_run=index_run, loaded=loaded, store=store,
                        batch_size=batch_size,
                        k_values=k_values, backend=backend, max_examples=max_examples,
                        output=output, first_index_checkpoint_dir=first_index_checkpoint_dir)


main = evaluate_main.main  # python -m realm_jax.evaluate; returns the exit status


if __name__ == "__main__":
  gin_utils.exit_process(main(), PROG)
