"""Open-QA answers of a model over a QA split: EM / regex match, top-k recall, predictions.

Per batch: embed the questions, retrieve blocks (`realm_jax.index.search`, BM25 or the closed
book), read the top `reader_beam` (span argmax, or a FiD reader's greedy answer) and score:
exact match, or the regex match for CuratedTrec (REALM_SPEC 32); recall@k by `has_answer` on the
block body (REALM_SPEC 33) or ORQA's substring label. A question too long for the reader (never
truncated, REALM_SPEC 26) is skipped and scored as a miss. `evaluate` serves
`python -m realm_jax.evaluate`'s mode "qa" and fine-tuning's dev evaluation; `Predictor.answer`
its free-text questions. Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from realm_jax import progress as progress_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.qa_datasets import QAExample
from realm_jax.batches import qa_batches
from realm_jax.batches import seqio_batches
from realm_jax.evaluation import metrics
from realm_jax.evaluation import recall
from realm_jax.index import rerank
from realm_jax.models import open_qa_model

log = logging.getLogger(__name__)

__all__ = ["Predictor", "answer_question", "evaluate", "format_answer"]

RECALL_MATCHES = ("has_answer", "substring")
EmbedFn = Callable[[Sequence[str]], Any]


@functools.lru_cache(maxsize=32)
def _jitted(model: open_qa_model.OpenQAModel, method: str) -> Callable:
  """One jitted function per (model, method): models are frozen dataclasses, so hashable, and
  repeated calls reuse the compiled executables."""
  return jax.jit(getattr(model, method))


def _check_searcher(searcher: Any, store) -> None:
  num_docs = getattr(searcher, "num_docs", None)
  if num_docs is not None and int(num_docs) != store.num_blocks:
    raise ValueError(f"the searcher indexes {num_docs} blocks but the BlockStore {store.path} "
                     f"has {store.num_blocks}: the index was built from another corpus")


class Predictor:
  """Question texts -> retrieved blocks -> answers, for one model, index and corpus.

  Attributes:
    model: an `OpenQAModel`, or a generative reader with the same interface (FiD; its
      predicted block is -1).
    searcher: `search(queries [n, proj], k) -> (scores [n, k], ids [n, k])`, or
      `retrieve_texts(questions, k)` (BM25), or `qa_batches.ClosedBook` (nothing retrieved).
    store: the BlockStore the index was built from.
    block_emb: index embeddings [num_blocks, proj] for the reader's retrieval scores (default:
      the searcher's `embeddings`).
    embed_fn: optional `questions -> [n, proj]` replacing the model's question tower.
    question_len: fixed question length, or None (the batch's longest).
    length_bucket: reader rows cut to the batch's longest, rounded up to this (0: reader_len).
  """

  def __init__(self, model: open_qa_model.OpenQAModel, params: Any, *, searcher: Any, store,
               vocab: vocab_lib.WordPieceVocabulary | None = None, block_emb: Any = None,
               embed_fn: EmbedFn | None = None, reader_len: int = 320,
               question_len: int | None = None, length_bucket: int = 32):
    if model.train_document_tower and isinstance(model, open_qa_model.OpenQAModel):
      # Prediction reads the published index (a FiD reader re-ranks with it: `rerank_depth`).
      model = type(model)(model.config, reader_beam=model.reader_beam)
    _check_searcher(searcher, store)
    self.closed_book = qa_batches.is_closed_book(searcher)
    if getattr(model, "closed_book", False) and not self.closed_book:
      raise ValueError(f"a closed-book reader reads no blocks: its searcher is "
                       f"qa_batches.ClosedBook(), not a {type(searcher).__name__}")
    if block_emb is None and not self.closed_book:
      block_emb = getattr(searcher, "embeddings", None)
      if block_emb is None:
        raise ValueError(f"{type(searcher).__name__} does not expose its embeddings: pass "
                         f"block_emb (the index embeddings matrix)")
    self.model = model
    self.params = params
    self.searcher = searcher
    self.store = store
    self.vocab = vocab or vocab_lib.default_vocabulary()
    self.block_emb = block_emb
    self.embed_fn = embed_fn
    self.reader_len = reader_len
    self.question_len = question_len
    self.length_bucket = seqio_batches.check_row_bucket(length_bucket, process_count=1)

  def skip_reason(self, question: str) -> str | None:
    """Why a question cannot be read (too long, and never truncated), or None."""
    length = len(self.vocab.encode(question)) + 2  # [CLS] question [SEP]
    if self.question_len is not None and length > self.question_len:
      return (f"question has {length} wordpieces with [CLS]/[SEP] > "
              f"question_len={self.question_len}")
    if length + 2 > self.reader_len:  # at least one block token and the final [SEP]
      return (f"question has {length} wordpieces with [CLS]/[SEP]: no room for a block in "
              f"reader_len={self.reader_len}")
    return None

  def embed(self, questions: Sequence[str]) -> np.ndarray:
    """[n] question texts -> [n, proj] float32 embeddings."""
    if self.embed_fn is not None:
      return np.asarray(self.embed_fn(list(questions)), np.float32)
    ids, mask, _ = qa_batches.question_arrays(questions, self.vocab, question_len=self.question_len)
    batch = {"question_ids": ids, "question_type_ids": np.zeros_like(ids), "question_mask": mask}
    return np.asarray(_jitted(self.model, "embed_questions")(self.params, batch), np.float32)

  def run(self, examples: Sequence[Any], *, depth: int, batch_size: int | None = None,
          answers_are_regex: bool = False) -> tuple[dict, dict, list[str]]:
    """Retrieves, reads and decodes one batch.

    Args:
      examples: the questions (QAExample-like; a padded batch repeats the last one).
      depth: blocks retrieved per question (>= model.reader_beam).
      batch_size: pad to this many questions (fixed shapes, one compilation); None: no padding.
      answers_are_regex: label mode (affects only the labels in the returned batch).

    Returns:
      (batch, predictions as NumPy, answer texts), each for the real examples and the padding.
    """
    examples = list(examples)
    num_real = len(examples)
    if batch_size is not None and num_real < batch_size:
      examples = examples + [examples[-1]] * (batch_size - num_real)
    example_mask = np.arange(len(examples)) < num_real  # [batch]
    # [batch, proj]; the closed book embeds nothing (it may have no question tower).
    question_emb = None if self.closed_book else self.embed([e.question for e in examples])
    ranks_texts = qa_batches.ranks_texts(self.searcher)
    # L: a FiD reader whose document tower trained re-ranks the index's beam (0: none).
    rerank_depth = 0 if ranks_texts else getattr(self.model, "rerank_depth", 0)
    if ranks_texts:  # BM25 (or the closed book) ranks the question texts themselves
      scores, ids = self.searcher.retrieve_texts([e.question for e in examples], depth)
    else:
      scores, ids = self.searcher.search(question_emb, depth)  # [batch, depth] each
      if rerank_depth:
        rerank.check_depth(rerank_depth, depth, self.model.reader_beam)
        scores, ids = rerank.rerank_with_document_tower(
            question_emb, scores, ids, depth=rerank_depth, params=self.params["retriever"],
            config=self.model.config, store=self.store)
    batch = qa_batches.build_open_qa_batch(
        self.store, examples, ids, scores, vocab=self.vocab, reader_beam=self.model.reader_beam,
        reader_len=self.reader_len, answers_are_regex=answers_are_regex,
        block_emb=self.block_emb, question_len=self.question_len,
        max_span_width=self.model.config.max_span_width, example_mask=example_mask)
    device_batch = qa_batches.model_inputs(batch)
    if question_emb is not None:
      # The reader scores blocks with the very embeddings the searcher was queried with.
      device_batch["question_emb"] = question_emb
    if self.length_bucket and "reader_mask" in device_batch:
      # Padding costs as much as tokens: cut to the batch's longest, rounded up to the bucket.
      device_batch, _ = seqio_batches.cut_to_bucket(device_batch, qa_batches.READER_ROW_KEYS,
                                                    "reader_mask", self.length_bucket)
    keys = getattr(self.model, "prediction_keys", None)
    if keys is not None:  # only what it reads: fixed shapes, one compilation
      device_batch = {key: device_batch[key] for key in keys if key in device_batch}
    predictions = jax.tree.map(np.asarray,
                               _jitted(self.model, "predict_batch")(self.params, device_batch))
    if rerank_depth:  # the re-ranked blocks' scores are the live tower's, not the index's
      live = np.array(predictions["retrieval_scores"])  # [batch, depth]
      live[:, :rerank_depth] = scores[:, :rerank_depth]
      predictions["retrieval_scores"] = live
    # A generative reader (`models.fid_qa`) detokenises its answers; a span reader's map back
    # to the block's original text.
    to_texts = getattr(self.model, "answer_texts", qa_batches.answer_texts)
    texts = to_texts(self.store, batch, predictions, self.vocab)
    return batch, predictions, texts

  def answer(self, question: str, *, num_evidence: int | None = None,
             snippet_chars: int = 240) -> dict:
    """Answers one free-text question and shows the evidence.

    Args:
      question: the question.
      num_evidence: blocks shown (default: the reader's beam, the blocks it read).
      snippet_chars: characters of block text per evidence entry (around the answer in the
        answer's block, from the start elsewhere).

    Returns:
      {"question", "answer", "block_id" (the answer's block), "score" (its joint logit),
       "evidence": [{"rank", "block_id", "title", "snippet", "score" (retrieval score),
                     "has_prediction"}]}.
    """
    example = QAExample(question=question, answers=(), source="answer_question")
    # The closed book shows no evidence: it read none.
    num_evidence = 0 if self.closed_book else num_evidence or self.model.reader_beam
    depth = min(max(num_evidence, self.model.reader_beam, getattr(self.model, "rerank_depth", 0)),
                self.store.num_blocks)
    batch, predictions, texts = self.run([example], depth=depth)
    answer = texts[0]
    answer_block = int(predictions["block_id"][0])
    evidence = []
    for rank in range(min(num_evidence, depth)):
      block_id = int(batch["retrieved_block_ids"][0, rank])
      body = self.store.body(block_id)
      is_answer_block = rank == int(predictions["block_index"][0])
      evidence.append({
          "rank": rank,
          "block_id": block_id,
          "title": self.store.title(block_id),
          "snippet": _snippet(body, answer if is_answer_block else "", snippet_chars),
          "score": float(predictions["retrieval_scores"][0, rank]),
          "has_prediction": is_answer_block,
      })
    return {"question": question, "answer": answer, "block_id": answer_block,
            "score": float(predictions["logit"][0]), "evidence": evidence}


def _snippet(text: str, answer: str, chars: int) -> str:
  """`chars` characters of `text`, centred on `answer` when it occurs."""
  if len(text) <= chars:
    return text
  at = text.find(answer) if answer else -1
  if at < 0:
    return text[:chars].rstrip() + " ..."
  begin = max(0, min(at - (chars - len(answer)) // 2, len(text) - chars))
  snippet = text[begin:begin + chars].strip()
  return ("... " if begin > 0 else "") + snippet + (" ..." if begin + chars < len(text) else "")


def evaluate(model: open_qa_model.OpenQAModel, params: Any, examples: Sequence[Any], *,
             searcher: Any, store, vocab: vocab_lib.WordPieceVocabulary | None = None,
             batch_size: int = 16, k_values: Sequence[int] = metrics.DEFAULT_RECALL_KS,
             answers_are_regex: bool | None = None, embed_fn: EmbedFn | None = None,
             block_emb: Any = None, reader_len: int = 320, question_len: int | None = None,
             recall_match: str = "has_answer", num_evidence: int | None = None,
             length_bucket: int = 32,
             progress: Callable[[str], None] | None = None) -> tuple[dict, list[dict]]:
  """Open-QA metrics and predictions of a model over a QA split.

  Args (the others as `Predictor`):
    k_values: recall cut-offs; the retrieval depth is `max(k_values)` (>= the reader beam).
    answers_are_regex: CuratedTrec mode (regex match and recall); None: from the examples.
    recall_match: "has_answer" (DPR's match on the block body) or "substring" (ORQA's label).
    num_evidence: retrieved blocks kept per prediction (default: the reader's beam).
    progress: called after each batch with a `realm_jax.progress.line` (e.g. `print`).

  Returns:
    (metrics, predictions): metrics {"exact_match" or "regex_match", "recall@k" (no recall for
    the closed book), "num_questions", "skipped_questions"}, fractions in [0, 1]; one prediction
    dict per example, in order. ValueError on bad arguments or a searcher of another corpus.
  """
  examples = list(examples)
  if not examples:
    raise ValueError("evaluate: no examples")
  if recall_match not in RECALL_MATCHES:
    raise ValueError(f"recall_match must be one of {RECALL_MATCHES}, got {recall_match!r}")
  if answers_are_regex is None:
    flags = {bool(getattr(e, "answers_are_regex", False)) for e in examples}
    if len(flags) > 1:
      raise ValueError("examples mix regex and plain answers; pass answers_are_regex")
    answers_are_regex = flags.pop()
  predictor = Predictor(model, params, searcher=searcher, store=store, vocab=vocab,
                        block_emb=block_emb, embed_fn=embed_fn, reader_len=reader_len,
                        question_len=question_len, length_bucket=length_bucket)
  closed_book = predictor.closed_book  # nothing retrieved: the reader's rows, no recall
  depth = (model.reader_beam if closed_book
           else min(max(max(k_values), model.reader_beam), store.num_blocks))
  if depth < model.reader_beam:
    raise ValueError(f"the store has {store.num_blocks} blocks, fewer than the reader beam "
                     f"({model.reader_beam})")
  num_evidence = 0 if closed_book else min(num_evidence or model.reader_beam, depth)
  score_fn = metrics.regex_match if answers_are_regex else metrics.exact_match

  predictions: list[dict | None] = [None] * len(examples)
  hits = np.zeros((len(examples), depth), bool)  # [questions, depth]
  retrieved_ids = np.full((len(examples), depth), -1, np.int64)  # [questions, depth]
  readable = []  # indices of the questions the reader can take
  for index, example in enumerate(examples):
    reason = predictor.skip_reason(example.question)
    if reason is None:
      readable.append(index)
      continue
    log.warning("evaluate: skipping %s: %s", example.source or f"example {index}", reason)
    predictions[index] = {"question": example.question, "prediction": "",
                          "answers": list(example.answers), "block_ids": [],
                          "block_scores": [], "predicted_block_id": -1, "correct": False,
                          "skipped": reason}
  answer_metric = "regex_match" if answers_are_regex else "exact_match"
  correct, start = 0, time.monotonic()
  for begin in range(0, len(readable), batch_size):
    indices = readable[begin:begin + batch_size]
    chunk = [examples[i] for i in indices]
    batch, preds, texts = predictor.run(chunk, depth=depth, batch_size=batch_size,
                                        answers_are_regex=answers_are_regex)
    for i, (index, example) in enumerate(zip(indices, chunk)):
      if closed_book:
        pass  # no block: no hit
      elif recall_match == "substring":
        hits[index] = batch["retriever_correct"][i]
      else:
        retrieved_ids[index] = batch["retrieved_block_ids"][i]
      predictions[index] = {
          "question": example.question,
          "prediction": texts[i],
          "answers": list(example.answers),
          "block_ids": [int(b) for b in batch["retrieved_block_ids"][i, :num_evidence]],
          "block_scores": [float(s) for s in batch["retrieved_scores"][i, :num_evidence]],
          "predicted_block_id": int(preds["block_id"][i]),
          "correct": bool(score_fn(texts[i], example.answers)),
      }
      correct += predictions[index]["correct"]
    if progress is not None:
      done = begin + len(indices)
      progress(progress_lib.line("questions", done, len(readable), time.monotonic() - start,
                                 extras=(f"{answer_metric} so far {correct / done:.4f}",)))

  if not closed_book and recall_match != "substring":
    hits = recall.answer_hits(retrieved_ids, examples, store, answers_are_regex)
  results = {answer_metric: float(np.mean([p["correct"] for p in predictions]))}
  if not closed_book:
    results.update(metrics.top_k_recall(hits, k_values))
  results["num_questions"] = len(examples)
  results["skipped_questions"] = len(examples) - len(readable)
  if answers_are_regex:
    # REALM_SPEC 32: a pattern that does not compile is a miss, as in ORQA; counted and said.
    invalid = [(e.question, p) for e in examples for p in metrics.invalid_patterns(e.answers)]
    results["invalid_answer_patterns"] = len(invalid)
    if invalid:
      log.warning("%d answer pattern(s) are not valid regular expressions and score as misses "
                  "(REALM_SPEC 32); the first: %r, an answer to %r", len(invalid),
                  invalid[0][1], invalid[0][0])
  return results, predictions


def answer_question(model: open_qa_model.OpenQAModel, params: Any, question: str, *,
                    searcher: Any, store, vocab: vocab_lib.WordPieceVocabulary | None = None,
                    embed_fn: EmbedFn | None = None, block_emb: Any = None,
                    reader_len: int = 320, num_evidence: int | None = None,
                    snippet_chars: int = 240) -> dict:
  """Answers a free-text question with its evidence (see `Predictor.answer`); for many
  questions, build one `Predictor` and call `answer` on it."""
  predictor = Predictor(model, params, searcher=searcher, store=store, vocab=vocab,
                        block_emb=block_emb, embed_fn=embed_fn, reader_len=reader_len)
  return predictor.answer(question, num_evidence=num_evidence, snippet_chars=snippet_chars)


def format_answer(result: dict) -> list[str]:
  """The lines printed for one `Predictor.answer` result: the answer, then one line per
  evidence block (rank, block id, title, retrieval score, snippet; `*` marks the block the
  answer was read from)."""
  source = (f"block {result['block_id']}, joint logit" if result["block_id"] >= 0 else
            # a generative reader's; the closed book's read no block
            f"generated from {'the blocks read' if result['evidence'] else 'the question alone'}"
            f", log-probability")
  lines = [f"question: {result['question']}",
           f"answer: {result['answer']!r} ({source} {result['score']:.3f})"]
  for evidence in result["evidence"]:
    mark = "*" if evidence["has_prediction"] else " "
    snippet = " ".join(evidence["snippet"].split())
    lines.append(f" {mark}{evidence['rank'] + 1}. block {evidence['block_id']} "
                 f"[{evidence['title']}] score {evidence['score']:.3f}: {snippet}")
  return lines
