"""The modes of `python -m realm_jax.evaluate`, one function each, run once the command has
checked its settings:

* `run_qa`: a fine-tuned reader answers every question of a QA task split (`qa.evaluate`),
  reading the blocks the run's published index ranks, BM25's, or none (the closed book);
* `run_retrieval`: recall@k of the index's own query tower, no reader, for a QA task or an
  ICT task (with chance@k);
* `run_bm25`: the same recall of Okapi BM25 over the BlockStore's title and body text;
* `run_questions`: free-text questions answered, each with its evidence, on stdout.

The first three return a `results.Result` (`results.write`); progress lines go to stderr.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import numpy as np

import realm_jax_tasks
from realm_jax import checkpoints as ckpt_lib
from realm_jax import progress as progress_lib
from realm_jax.batches import qa_batches
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.evaluation import bm25 as bm25_lib
from realm_jax.evaluation import qa as qa_lib
from realm_jax.evaluation import recall
from realm_jax.evaluation import results
from realm_jax.evaluation import runs
from realm_jax.evaluation import tasks as tasks_lib
from realm_jax.gin_utils import ConfigError
from realm_jax.index import retrieval as retrieval_lib
from realm_jax.index import search
from realm_jax.index import store as index_lib
from realm_jax.models import fid_qa
from realm_jax.models.open_qa_model import OpenQAModel

__all__ = ["Index", "load_index", "open_block_store", "open_qa_model", "run_bm25", "run_qa",
           "run_questions", "run_retrieval"]

PROG = results.PROG
BUILD_INDEX_HINT = ("python -m realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
                    "--once --gin.RUN_DIR=... --gin.BLOCK_STORE=...")


class Index(NamedTuple):
  """The published index a mode searches, and how."""

  run_dir: str  # the run whose index/ holds it
  step: Optional[int] = None  # None: the newest
  backend: str = "exact"  # or "scann" (the index's ScaNN artifacts)
  verify: bool = True  # re-hash every file against its manifest; False: sizes only


class _Candidates(NamedTuple):
  """What the reader reads (modes "qa" and questions): a searcher, the embeddings of the
  reader's retrieval scores, the index step (None: BM25 or the closed book), how to name them."""

  searcher: Any
  block_emb: Any  # [num_blocks, proj], or None for the closed book
  index_step: Optional[int]
  where: str  # "index step 7" or "BM25's blocks"
  how: str  # "exact search" or "BM25 ranking"
  kind: str = "index"  # evaluate_main.candidates


# ------------------------------------------------------------------------------ small pieces


def _say(line: str) -> None:
  """One line on stderr, led by the command's name."""
  print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def _progress_to(throttle: progress_lib.Throttle) -> Callable[[str], None]:
  """A progress callback: each line, led by the command's name, through `throttle` (stderr)."""
  return lambda line: throttle(f"{PROG}: {line}")


def _in_batches(fn: Callable[[int, int], Any], total: int, batch_size: int,
                what: str) -> np.ndarray:
  """`fn(begin, end)` over [0, total) in batches, concatenated on the first axis ([total, ...]),
  with progress lines counting `what`."""
  throttle = progress_lib.Throttle()
  report = _progress_to(throttle)
  parts, start = [], time.monotonic()
  for begin in range(0, total, batch_size):
    end = min(begin + batch_size, total)
    parts.append(np.asarray(fn(begin, end)))  # [end - begin, ...]
    report(progress_lib.line(what, end, total, time.monotonic() - start))
  throttle.finish()
  return np.concatenate(parts)


def open_block_store(block_store: Optional[str]) -> block_store_lib.BlockStore:
  """The BlockStore at `block_store` (file sizes checked); None: the toy world's."""
  return block_store_lib.BlockStore.open(block_store or realm_jax_tasks.toy_block_store_dir(),
                                         verify="fast")


def load_index(index: Index, store: block_store_lib.BlockStore, config: Any) -> Any:
  """The published index of `index.run_dir` (newest, or `index.step`), checked against the
  store and the model (`index.verify`: every file re-hashed, else sizes only)."""
  steps = index_lib.list_indexes(index.run_dir)
  root = index_lib.index_root(os.path.abspath(index.run_dir))
  if not steps:
    raise FileNotFoundError(f"{root}: no published index; build one from the run's checkpoint "
                            f"with `{BUILD_INDEX_HINT}`")
  step = steps[-1] if index.step is None else int(index.step)
  if step not in steps:
    raise FileNotFoundError(f"{root}: no published index of step {step} (published: "
                            f"{steps})")
  return index_lib.load_index(index_lib.index_dir(index.run_dir, step),
                              block_store_id=store.store_id, num_blocks=store.num_blocks,
                              dim=config.proj_size, verify=True if index.verify else "fast")


def _searcher(loaded: Any, backend: str) -> Any:
  if backend == "scann" and loaded.scann_dir is None:
    raise ValueError(f"{loaded.path}: the index has no ScaNN artifacts (build it with "
                     f"--gin.build_index_main.scann=True) or use backend 'exact'")
  return search.make_searcher(backend, loaded.embeddings,
                              artifacts_dir=loaded.scann_dir if backend == "scann" else None)


def _reader_candidates(kind: str, index: Index, store: block_store_lib.BlockStore,
                       config: Any) -> _Candidates:
  """The reader's candidates of `evaluate_main.candidates`: the published index's ("index"),
  BM25's over `store` ("bm25") or the closed book's ("none": no block, no index)."""
  if kind == "none":
    return _Candidates(qa_batches.ClosedBook(), None, None, "closed book (nothing retrieved)",
                       "no retrieval", "none")
  if kind == "bm25":
    searcher = bm25_lib.BM25Searcher(store, config.proj_size)
    return _Candidates(searcher, searcher.embeddings, None, "BM25's blocks", "BM25 ranking",
                       "bm25")
  loaded = load_index(index, store, config)
  return _Candidates(_searcher(loaded, index.backend), loaded.embeddings, loaded.step,
                     f"index step {loaded.step}", f"{index.backend} search")


def _require_checkpoint(run_dir: str, step: Optional[int]) -> None:
  if step is None:
    raise ckpt_lib.CheckpointError(f"{ckpt_lib.checkpoints_dir(run_dir)}: no finished "
                                   f"checkpoint to evaluate")


def open_qa_model(run_dir: str, config: Any, step: int, reader_beam: int) -> tuple[Any, Any]:
  """(OpenQAModel, params on the default device) of one checkpoint of the run; for a
  `FinetuneJob(reader='fid')` run, its `FidReaderModel` (the FidConfig the run wrote beside
  its checkpoints, `<run_dir>/fid_config.json`), which generates its answers."""
  # A PEFT checkpoint comes back with LoRA merged; adapters need the config that has them.
  params, theirs, _ = ckpt_lib.restore_params(run_dir, step, expected_config=config)
  if "fid" in params:
    try:
      fid = fid_qa.read_fid_config(run_dir, theirs.bert)
    except FileNotFoundError as e:
      raise ckpt_lib.CheckpointError(f"{run_dir}: a FiD reader's checkpoint without its "
                                     f"{fid_qa.FID_CONFIG_FILE}") from e
    closed_book = "retriever" not in params  # FinetuneJob(candidates='none'): no retriever
    params = jax.device_put({key: params[key] for key in ("retriever", "fid") if key in params})
    # How the run retrieved: a document tower it trained re-ranks the index's beam.
    settings = {} if closed_book else fid_qa.read_retrieval_settings(run_dir)
    return fid_qa.FidReaderModel(config, fid, reader_beam=reader_beam, closed_book=closed_book,
                                 **settings), params
  config = config.replace(**{"bert.adapter_size": theirs.bert.adapter_size})
  # Only the two towers the model reads; placed once rather than copied at every call.
  params = jax.device_put({"retriever": params["retriever"], "reader": params["reader"]})
  return OpenQAModel(config, reader_beam=reader_beam), params


def _task_queries(task: str, kind: str, split: str,
                  max_examples: Optional[int]) -> tuple[Optional[dict], Optional[list]]:
  """What a task split asks: (its queries, None) for an ICT task (`tasks.ict_task_queries`),
  (None, its QAExamples) for a QA task."""
  if kind == "ict":
    return tasks_lib.ict_task_queries(task, split, max_examples), None
  return None, qa_batches.qa_task_examples(task, split, max_examples=max_examples)


def _counted(kind: str) -> str:
  """What a progress line counts: an ICT task's queries, a QA task's questions."""
  return "queries" if kind == "ict" else "questions"


def _question_arrays(examples: Sequence[Any], vocab: Any) -> tuple[np.ndarray, np.ndarray]:
  """[CLS] question [SEP] ids and mask of the examples, padded to their longest question (as
  evaluation pads a batch). int32 [n, len] each."""
  ids, mask, _ = qa_batches.question_arrays([e.question for e in examples], vocab,
                                            sources=[e.source for e in examples])
  return ids, mask


# ------------------------------------------------------------------------------ the modes


def run_qa(run_dir: str, config: Any, step: Optional[int], why: str, *, task: str, split: str,
           block_store: Optional[str], candidates: str, index: Index, batch_size: int,
           k_values: Sequence[int], reader_beam: int, reader_len: int,
           max_examples: Optional[int]) -> results.Result:
  """Mode "qa": checkpoint `step` of the run (chosen because `why`) answers the task split's
  questions, reading the `candidates` ("index", "bm25" or "none") of `block_store` (None: the
  toy store); exact match (regex match), recall@k and the predictions. A run without a
  finished checkpoint (`step` None) is a CheckpointError."""
  _require_checkpoint(run_dir, step)
  store = open_block_store(block_store)
  reader = _reader_candidates(candidates, index, store, config)
  model, params = open_qa_model(run_dir, config, step, reader_beam)
  examples = qa_batches.qa_task_examples(task, split, max_examples=max_examples)
  _say(f"{len(examples)} questions of {task}/{split}, checkpoint step {step} ({why}), "
       f"{reader.where} ({store.num_blocks:,} blocks, {reader.how})")
  throttle = progress_lib.Throttle()
  metrics, predictions = qa_lib.evaluate(
      model, params, examples, searcher=reader.searcher, store=store, batch_size=batch_size,
      k_values=recall.clip_k_values(k_values, store.num_blocks),
      block_emb=reader.block_emb, reader_len=reader_len, progress=_progress_to(throttle))
  throttle.finish()
  fields = {"run_dir": os.path.abspath(run_dir), "task": task, "split": split,
            "checkpoint_step": step, "checkpoint_choice": why, "index_step": reader.index_step,
            # Only BM25's or the closed book's are named: an index's fields stay as they were.
            **({"candidates": reader.kind} if reader.index_step is None else {}),
            "backend": index.backend}
  return results.Result("qa", results.file_stem("qa", task, split, step), fields, metrics,
                        f"{task}/{split}, checkpoint step {step} ({why}), {reader.where}",
                        predictions)


def run_questions(run_dir: str, config: Any, step: Optional[int], why: str,
                  questions: Sequence[str], *, block_store: Optional[str], candidates: str,
                  index: Index, reader_beam: int, reader_len: int) -> None:
  """Free-text questions: each answered by checkpoint `step` and printed with its evidence
  blocks (rank, block id, title, retrieval score, snippet); one that cannot be read says why."""
  _require_checkpoint(run_dir, step)
  store = open_block_store(block_store)
  reader = _reader_candidates(candidates, index, store, config)
  model, params = open_qa_model(run_dir, config, step, reader_beam)
  predictor = qa_lib.Predictor(model, params, searcher=reader.searcher, store=store,
                               block_emb=reader.block_emb, reader_len=reader_len)
  print(f"{PROG}: checkpoint step {step} ({why}), {reader.where}", flush=True)
  for question in questions:
    reason = predictor.skip_reason(question)
    if reason is not None:
      print(f"question: {question}\n  cannot answer: {reason}", flush=True)
      continue
    print("\n".join(qa_lib.format_answer(predictor.answer(question))), flush=True)


def run_retrieval(run_dir: str, config: Any, *, task: str, kind: str, split: str,
                  block_store: Optional[str], index: Index, batch_size: int,
                  k_values: Sequence[int], max_examples: Optional[int],
                  first_index_checkpoint_dir: Optional[str]) -> results.Result:
  """Mode "retrieval": the query tower of the checkpoint the index was built from searches the
  index for every query of the task split (`kind` "qa": recall of an answer; "ict": of the
  query's source block, with chance@k). `first_index_checkpoint_dir`: index 0's checkpoint,
  when its manifest's path no longer exists."""
  store = open_block_store(block_store)
  loaded = load_index(index, store, config)
  try:
    tower = retrieval_lib.index_query_tower(loaded, config)
  except ckpt_lib.CheckpointError as e:  # another model size: a config error
    raise ConfigError(str(e)) from e
  if tower is not None:  # published with the index: its checkpoint may be pruned by now
    step_dir = loaded.manifest.get("checkpoint") or "its checkpoint (not recorded)"
    retriever = retrieval_lib.IndexRetriever(loaded, tower, config, backend=index.backend)
  else:
    step_dir = retrieval_lib.index_checkpoint_dir(
        index.run_dir, loaded, first_checkpoint_dir=first_index_checkpoint_dir)
    # Size mismatch as a config error before restoring anything (the loader refuses it too).
    runs.checkpoint_metadata(step_dir, config, f"the checkpoint of index {loaded.step}")
    retriever = retrieval_lib.make_index_loader(index.run_dir, config,
                                                first_checkpoint_dir=first_index_checkpoint_dir,
                                                backend=index.backend)(loaded)
  ks = recall.clip_k_values(k_values, store.num_blocks)
  queries, examples = _task_queries(task, kind, split, max_examples)
  vocab = vocab_lib.default_vocabulary()

  def top_ids(begin: int, end: int) -> Any:
    if kind == "ict":
      arrays = queries["query_ids"][begin:end], queries["query_mask"][begin:end]
    else:  # each batch padded to its longest question
      arrays = _question_arrays(examples[begin:end], vocab)
    return retriever.retrieve(*arrays, k=ks[-1])[1]  # [batch, k]

  total = len(queries["block_uid"]) if kind == "ict" else len(examples)
  ids = _in_batches(top_ids, total, batch_size, _counted(kind))  # [n, k]
  hits = (recall.ict_hits(ids, queries["block_uid"], store.uids) if kind == "ict"
          else recall.answer_hits(ids, examples, store))  # [n, k]
  metrics = recall.recall_metrics(hits, ks, kind, store.num_blocks)
  fields = {"run_dir": os.path.abspath(run_dir), "task": task, "split": split,
            "index_step": loaded.step, "query_tower_checkpoint": step_dir,
            "backend": index.backend}
  return results.Result(
      "retrieval", results.file_stem("retrieval", task, split, loaded.step), fields, metrics,
      f"retrieval {task}/{split}, index step {loaded.step} (query tower from {step_dir})")


def run_bm25(run_dir: Optional[str], *, task: str, kind: str, split: str,
             block_store: Optional[str], batch_size: int, k_values: Sequence[int],
             max_examples: Optional[int]) -> results.Result:
  """Mode "bm25": Okapi BM25 (`evaluation.bm25`) ranks the blocks of `block_store` (None: the
  toy store) for every query of the task split, with mode "retrieval"'s metrics (an ICT task's
  wordpiece queries decoded back to text). `run_dir` (or None) is only recorded."""
  store = open_block_store(block_store)
  ks = recall.clip_k_values(k_values, store.num_blocks)
  start = time.monotonic()
  index = bm25_lib.BM25Index(bm25_lib.block_texts(store))
  _say(f"BM25 index of {store.num_blocks:,} blocks ({index.num_terms:,} terms) in "
       f"{progress_lib.format_duration(time.monotonic() - start)}")
  queries, examples = _task_queries(task, kind, split, max_examples)
  texts = (tasks_lib.ict_query_texts(queries["query_ids"], queries["query_mask"])
           if kind == "ict" else [e.question for e in examples])

  def top_hits(begin: int, end: int) -> Any:
    ids, _ = index.top_k(texts[begin:end], ks[-1])  # [batch, k]
    if kind == "ict":
      return recall.ict_hits(ids, queries["block_uid"][begin:end], store.uids)  # [batch, k]
    return recall.answer_hits(ids, examples[begin:end], store)  # [batch, k]

  hits = _in_batches(top_hits, len(texts), batch_size, _counted(kind))  # [n, k]
  metrics = recall.recall_metrics(hits, ks, kind, store.num_blocks)
  fields = {"run_dir": os.path.abspath(run_dir) if run_dir else None, "task": task,
            "split": split, "block_store": os.path.abspath(store.path),
            "bm25": {"k1": index.k1, "b": index.b}}
  return results.Result(
      "bm25", results.file_stem("bm25", task, split), fields, metrics,
      f"bm25 {task}/{split}, {store.num_blocks:,} blocks of {store.path} (k1 {index.k1:g}, "
      f"b {index.b:g})")
