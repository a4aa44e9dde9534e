"""Retrieval quality of a ranking: which retrieved blocks are hits, and recall@k.

What `python -m realm_jax.evaluate` reports in its modes "retrieval" and "bm25": hits by answer
(``answer_hits``, DPR's ``has_answer`` on the block body) for a QA task or by source block
(``ict_hits``) for an ICT task, recall@k with chance@k for ICT (``recall_metrics``), and the
ceiling of every retriever's recall (``answers_in_corpus``: an answer in any block at all).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from realm_jax.evaluation import metrics

__all__ = ["answer_hits", "answers_in_corpus", "clip_k_values", "ict_hits", "recall_metrics"]


def clip_k_values(k_values: Sequence[int], num_blocks: int) -> tuple[int, ...]:
  """Recall cut-offs, each at most the number of blocks (a larger k would only repeat
  recall@num_blocks), ascending and without repeats."""
  return tuple(sorted({min(int(k), int(num_blocks)) for k in k_values}))


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
  ids = np.asarray(retrieved_ids)  # [n, k]
  uids = np.asarray(store_uids).view(np.int64)[np.maximum(ids, 0)]  # [n, k]
  return (uids == np.asarray(block_uid, np.int64)[:, None]) & (ids >= 0)


def answer_hits(retrieved_ids: Any, examples: Sequence[Any], store: Any,
                answers_are_regex: bool | None = None) -> Any:
  """Whether each retrieved block contains an answer (DPR's has_answer on the block body;
  regex search for regex examples, or for all with `answers_are_regex`). bool [n, k]; -1 ids
  (no result) are misses."""
  ids = np.asarray(retrieved_ids)  # [n, k]
  hits = np.zeros(ids.shape, bool)
  # A block is retrieved for many questions: its tokens are computed once (string answers).
  block_tokens: dict[int, list[str]] = {}
  for row, example in enumerate(examples):
    if example.answers_are_regex if answers_are_regex is None else answers_are_regex:
      for col, block_id in enumerate(ids[row]):
        hits[row, col] = block_id >= 0 and metrics.has_answer(store.body(int(block_id)),
                                                              example.answers, match="regex")
      continue
    answers_tokens = metrics.answers_tokens(example.answers)
    for col, block_id in enumerate(ids[row]):
      if block_id < 0:
        continue
      tokens = block_tokens.get(int(block_id))
      if tokens is None:
        tokens = block_tokens[int(block_id)] = metrics.has_answer_tokens(store.body(int(block_id)))
      hits[row, col] = metrics.tokens_have_answer(tokens, answers_tokens)
  return hits


def recall_metrics(hits: Any, ks: Sequence[int], kind: str, num_blocks: int) -> dict:
  """The retrieval metrics of bool hits [n, k] (modes "retrieval" and "bm25"): recall@k for
  each of `ks`, chance@k next to it for ICT, num_questions (ICT: num_queries), num_blocks."""
  results = {}
  for name, value in metrics.top_k_recall(hits, ks).items():
    results[name] = value
    if kind == "ict":  # a uniformly random ranking finds the one source block with p = k / N
      results["chance@" + name[len("recall@"):]] = int(name[len("recall@"):]) / num_blocks
  results["num_queries" if kind == "ict" else "num_questions"] = int(hits.shape[0])
  results["num_blocks"] = int(num_blocks)
  return results


def answers_in_corpus(examples: Sequence[Any], texts: Iterable[str]) -> Any:
  """Whether an answer of each example occurs in one of `texts` (the block bodies): bool [n],
  what `answer_hits` would say of a ranking holding every block. String answers are looked up
  among each text's token n-grams in one pass; regex answers searched text by text until found.
  """
  found = np.zeros(len(examples), bool)  # [n]
  # (answer tokens) -> the string examples with that answer.
  wanted: dict[tuple[str, ...], list[int]] = {}
  regex = []
  for row, example in enumerate(examples):
    if example.answers_are_regex:
      regex.append(row)
      continue
    for answer in example.answers:
      tokens = tuple(metrics.has_answer_tokens(answer))
      if tokens:  # an answer without tokens matches nothing (`has_answer`)
        wanted.setdefault(tokens, []).append(row)
  lengths = sorted({len(tokens) for tokens in wanted})
  for text in texts:
    if regex and not found[regex].all():
      for row in regex:
        found[row] = found[row] or metrics.has_answer(text, examples[row].answers, match="regex")
    if not wanted:
      continue
    tokens = metrics.has_answer_tokens(text)
    popped = False
    for width in lengths:
      for begin in range(len(tokens) - width + 1):
        rows = wanted.pop(tuple(tokens[begin:begin + width]), None)
        if rows is not None:  # found once is enough: never looked up again
          found[rows] = True
          popped = True
    if popped:
      lengths = sorted({len(t) for t in wanted})
  return found
