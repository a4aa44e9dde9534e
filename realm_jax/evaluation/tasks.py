"""The seqio tasks an evaluation reads: a task's kind (QA or ICT), the registered tasks of a
kind, and the queries of an ICT task split (as wordpiece arrays, or as text for BM25)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

# The tasks' plugin before seqio: it keeps TensorFlow, which seqio imports, off the accelerators.
import realm_jax_tasks  # pylint: disable=unused-import  (it registers the tasks)
import seqio
from realm_jax.batches import seqio_batches
from realm_jax.data import tensorflow_setup
from realm_jax.data import vocab as vocab_lib
from realm_jax.evaluation import metrics

__all__ = ["ict_query_texts", "ict_task_queries", "registered_tasks", "task_kind"]


def task_kind(task: Any) -> Optional[str]:
  """"qa" (question/answers, EM or regex metric), "ict" (queries with their source block's
  uid) or None (a task `python -m realm_jax.evaluate` cannot evaluate, e.g. masked-query
  pretraining, or Atlas's pretext, whose sentinel questions and precomputed targets
  `answer_ids` only the fine-tuning job's dev evaluation reads)."""
  if "answer_ids" in task.output_features:
    return None
  metric_fns = list(task.metric_fns)
  if metrics.orqa_exact_match in metric_fns or metrics.curated_trec_regex_match in metric_fns:
    return "qa"
  if {"query_ids", "query_mask", "block_uid"} <= set(task.output_features):
    return "ict"
  return None


def registered_tasks(kind: str) -> list[str]:
  """Names of the registered seqio tasks of one `task_kind` ("qa" or "ict"), sorted."""
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
  task = seqio_batches.get_task(task_name)
  rows = {"query_ids": [], "query_mask": [], "block_uid": []}
  for example in tensorflow_setup.numpy_iterator(_split_dataset(task, split, max_examples)):
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
  Uncased text: a query word with an accent does not match the block's original spelling."""
  vocab = vocab_lib.default_vocabulary()
  specials = set(vocab_lib.SPECIAL_TOKENS.values())
  return [vocab.decode([int(i) for i, m in zip(ids, mask) if m and int(i) not in specials])
          for ids, mask in zip(query_ids, query_mask)]
