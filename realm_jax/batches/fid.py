"""Generative open-QA batches for the FiD reader (`models.fid_qa.FidReaderModel`): the extractive
job's retrieval and reader rows plus one answer's target tokens.

`build_fid_batch` is `qa_batches.build_open_qa_batch` plus `answer_targets`: the wordpieces of
each question's first answer that fits `max_answer_length` with its EOS. `FidBatches` is
`qa_batches.OpenQABatches` building those batches. Regex answers (CuratedTrec) give nothing to
generate: refused. A model that trains its question tower also gets the question rows and the
frozen index's embeddings of the read blocks (`QUESTION_TOWER_KEYS`). A task whose examples
carry `answer_ids` (Atlas's MLM pretext, `realm_jax_tasks.atlas`) trains on those ids, its
questions encoded with the task's own vocabulary (`question_vocabulary`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import jax
import numpy as np

from realm_jax.batches import qa_batches
from realm_jax.batches import seqio_batches
from realm_jax.data import tensorflow_setup
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.qa_datasets import QAExample
from realm_jax.index import rerank

Batch = dict[str, Any]

# What the FiD model reads (and `fid_model_inputs` keeps).
FID_MODEL_KEYS = ("reader_ids", "reader_type_ids", "reader_mask", "answer_targets",
                  "answer_mask", "retriever_correct", "example_mask")
# What it also reads when a retriever objective trains its question tower: the questions
# [Q, question_len] and the frozen index's embeddings of the read blocks [Q, reader_beam, proj].
QUESTION_TOWER_KEYS = ("question_ids", "question_type_ids", "question_mask",
                       "retrieved_block_emb")
# And when the objective trains the document tower too: the read blocks' document-tower rows
# [Q, reader_beam, block_len] (`build_open_qa_batch`'s `document_beam`).
DOCUMENT_TOWER_KEYS = ("document_ids", "document_type_ids", "document_mask")


# Where a task keeps its examples' precomputed targets (`realm_jax_tasks.atlas`).
ANSWER_IDS_FEATURE = "answer_ids"


@dataclasses.dataclass(frozen=True)
class TargetedExample(QAExample):
  """A QAExample with its decoder targets precomputed as ids (`answer_ids`, no EOS): trained on
  as they are, never re-encoded from `answers` (which the dev EM still reads)."""
  answer_ids: tuple[int, ...] = ()


def answer_targets(answers_per_question: Sequence[Sequence[str]],
                   vocab: vocab_lib.WordPieceVocabulary, *, max_answer_length: int,
                   eos_id: int = vocab_lib.SEP_ID, pad_id: int = vocab_lib.PAD_ID,
                   answer_ids: Optional[Sequence[Optional[Sequence[int]]]] = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Decoder targets of one answer per question: the first (in the task's order) whose wordpieces
  fit `max_answer_length` (T) with their EOS. `answer_ids`: per question, precomputed target ids
  (no EOS) or None; a question with ids trains on them, its answer strings unread.

  Returns:
    (targets int32 [Q, T]: the chosen answer's wordpieces, EOS, pad_id; mask int32 [Q, T]: 1 on
    the answer and its EOS; chosen int32 [Q]: the index of the answer trained on, -1 where no
    answer fits (all pad, mask 0)).
  """
  num = len(answers_per_question)
  targets = np.full((num, max_answer_length), pad_id, np.int32)
  mask = np.zeros((num, max_answer_length), np.int32)
  chosen = np.full((num,), -1, np.int32)
  for q, answers in enumerate(answers_per_question):
    given = None if answer_ids is None else answer_ids[q]
    candidates = ([vocab.encode(answer) for answer in answers] if given is None
                  else [[int(i) for i in given]])
    for a, ids in enumerate(candidates):
      if 0 < len(ids) < max_answer_length:  # room for the EOS
        row = [*ids, eos_id]
        targets[q, :len(row)] = row
        mask[q, :len(row)] = 1
        chosen[q] = a
        break
  return targets, mask, chosen


def build_fid_batch(store, examples: Sequence[Any], retrieved_ids: Any,
                    retrieved_scores: Any = None, *, max_answer_length: int,
                    vocab: vocab_lib.WordPieceVocabulary | None = None,
                    eos_id: int = vocab_lib.SEP_ID, pad_id: int = vocab_lib.PAD_ID,
                    **open_qa_options: Any) -> Batch:
  """`build_open_qa_batch(store, examples, retrieved_ids, retrieved_scores, vocab=vocab,
  **open_qa_options)` (reader rows, retriever labels, host-only text offsets) plus
  `answer_targets` [Q, T], `answer_mask` [Q, T] and `answer_index` [Q] (host only: which
  answer the targets are; -1 none fits). `max_span_width` defaults to the answer width.

  Raises:
    ValueError: regex answers (nothing to generate), or what build_open_qa_batch raises.
  """
  vocab = vocab or vocab_lib.default_vocabulary()
  examples = list(examples)
  if any(getattr(e, "answers_are_regex", False) for e in examples) or open_qa_options.get(
      "answers_are_regex"):
    raise ValueError("the FiD reader generates answer texts: regex answers (CuratedTrec) "
                     "give it none to train on")
  open_qa_options.setdefault("max_span_width", max_answer_length - 1)
  batch = qa_batches.build_open_qa_batch(store, examples, retrieved_ids, retrieved_scores,
                                         vocab=vocab, **open_qa_options)
  given = [getattr(e, "answer_ids", None) for e in examples]
  targets, mask, chosen = answer_targets([e.answers for e in examples], vocab,
                                         max_answer_length=max_answer_length, eos_id=eos_id,
                                         pad_id=pad_id,
                                         answer_ids=None if given == [None] * len(given)
                                         else given)
  batch.update({"answer_targets": targets, "answer_mask": mask, "answer_index": chosen})
  return batch


def fid_model_inputs(batch: Batch, question_tower: bool = False,
                     document_tower: bool = False) -> Batch:
  """What `FidReaderModel` reads of a `build_fid_batch` batch (`FID_MODEL_KEYS`, and
  `QUESTION_TOWER_KEYS` with `question_tower`, `DOCUMENT_TOWER_KEYS` with `document_tower`)."""
  keys = (FID_MODEL_KEYS + (QUESTION_TOWER_KEYS if question_tower else ())
          + (DOCUMENT_TOWER_KEYS if document_tower else ()))
  return {key: batch[key] for key in keys}


def fid_batch_spec(*, beam: int, reader_beam: int, reader_len: int, max_answer_length: int,
                   question_len: int | None = None, proj_size: int | None = None,
                   block_len: int | None = None, scored_beam: int | None = None
                   ) -> dict[str, Any]:
  """The per-example shapes and dtypes of `FidBatches`' batches (`fid_model_inputs`); with
  `question_len` and `proj_size` (a model that trains its question tower) also
  `QUESTION_TOWER_KEYS`' (`retrieved_block_emb` of the first `scored_beam` blocks of the beam,
  by default the `reader_beam` read: `FidReaderModel.scored_beam`), and with `block_len` (one
  that trains its document tower too) `DOCUMENT_TOWER_KEYS`'."""
  shapes = {"reader_ids": [reader_beam, reader_len], "reader_type_ids": [reader_beam, reader_len],
            "reader_mask": [reader_beam, reader_len], "answer_targets": [max_answer_length],
            "answer_mask": [max_answer_length], "retriever_correct": [beam], "example_mask": []}
  if (question_len is None) != (proj_size is None):
    raise ValueError("fid_batch_spec: question_len and proj_size go together (the question "
                     "tower's inputs)")
  if question_len is not None:
    shapes.update(question_ids=[question_len], question_type_ids=[question_len],
                  question_mask=[question_len],
                  retrieved_block_emb=[scored_beam or reader_beam, proj_size])
  if block_len is not None:
    if question_len is None:
      raise ValueError("fid_batch_spec: the document tower trains with the question tower: "
                       "give question_len and proj_size with block_len")
    shapes.update({key: [reader_beam, block_len] for key in DOCUMENT_TOWER_KEYS})
  dtypes = {"retriever_correct": bool, "example_mask": bool, "retrieved_block_emb": np.float32}
  return {key: jax.ShapeDtypeStruct(tuple(int(n) for n in shape), dtypes.get(key, np.int32))
          for key, shape in shapes.items()}


def question_vocabulary(task_name: str) -> vocab_lib.WordPieceVocabulary:
  """The vocabulary of a task's `question_ids` feature (the bundled one for the QA tasks; the
  sentinel-reading `data.sentinels.SentinelVocabulary` for Atlas's pretext), which encodes its
  question texts exactly as the task's question ids.

  Raises:
    UnknownTaskError: the task is not registered.
  """
  feature = seqio_batches.get_task(task_name).output_features.get("question_ids")
  wordpiece = getattr(getattr(feature, "vocabulary", None), "wordpiece", None)
  return (wordpiece if isinstance(wordpiece, vocab_lib.WordPieceVocabulary)
          else vocab_lib.default_vocabulary())


def task_answer_ids(task_name: str, split: str) -> Optional[list[tuple[str, tuple[int, ...]]]]:
  """A task split's precomputed targets, [(question, answer ids)] in the split's order (the
  order `qa_batches.qa_task_examples` reads it in), or None when the task has no
  `answer_ids` feature."""
  task = seqio_batches.get_task(task_name)
  if ANSWER_IDS_FEATURE not in task.output_features:
    return None
  dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False)
  return [(ex["question"].decode("utf-8"), tuple(int(i) for i in ex[ANSWER_IDS_FEATURE]))
          for ex in tensorflow_setup.numpy_iterator(dataset)]


def with_answer_ids(examples: Sequence[QAExample],
                    targets: Sequence[tuple[str, tuple[int, ...]]]) -> list[TargetedExample]:
  """`examples` of a split (`qa_task_examples`' "<task>/<split>:<index>" sources) with the
  precomputed targets of their index in it (`task_answer_ids`).

  Raises:
    ValueError: an example whose source names no index of `targets`, or whose question is not
      the one there (the split was read in another order).
  """
  out = []
  for example in examples:
    index = example.source.rpartition(":")[2]
    if not index.isdigit() or int(index) >= len(targets):
      raise ValueError(f"{example.source!r}: no precomputed target for this example")
    question, ids = targets[int(index)]
    if question != example.question:
      raise ValueError(f"{example.source!r}: the precomputed targets are another question's "
                       f"({question[:60]!r}, not {example.question[:60]!r})")
    out.append(TargetedExample(question=example.question, answers=example.answers,
                               answers_are_regex=example.answers_are_regex,
                               source=example.source, answer_ids=ids))
  return out


class FidBatches(qa_batches.OpenQABatches):
  """`OpenQABatches` (questions, the live question tower's beam, resumable) yielding FiD
  batches: `fid_model_inputs(build_fid_batch(...))`. `model` is a `FidReaderModel`. The
  questions are encoded with the task's question vocabulary (`question_vocabulary`) unless
  `vocab` is given; a task with precomputed targets trains on them (module docstring)."""

  def __init__(self, task_name: str, **kwargs: Any):
    if kwargs.get("vocab") is None:
      kwargs["vocab"] = question_vocabulary(task_name)
    super().__init__(task_name, **kwargs)
    if self.answers_are_regex:
      raise ValueError(f"task {task_name!r} has regex answers (CuratedTrec): the FiD reader "
                       f"generates answer texts and has none to train on")
    targets = task_answer_ids(task_name, self.split)
    if targets is not None:
      self.examples = with_answer_ids(self.examples, targets)
    if self.model.rerank_depth:  # checked once: the beam and the reader's share are fixed
      rerank.check_depth(self.model.rerank_depth, self.beam, self.model.reader_beam)
    if self.model.train_question_tower and self.model.scored_beam > self.beam:
      raise ValueError(f"the objective scores the first {self.model.scored_beam} blocks of a "
                       f"beam of {self.beam} (retriever_beam, or the store's blocks)")

  def retrieve(self, retriever: Any, question_ids: np.ndarray, question_mask: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """The index's beam, its first `FidReaderModel.rerank_depth` blocks re-ranked with the live
    document tower (`index.rerank`) when the model asks for it."""
    depth = self.model.rerank_depth
    if not depth:
      return super().retrieve(retriever, question_ids, question_mask)
    if self._query_params is None:
      raise RuntimeError("re-ranking reads the live document tower: call set_query_params "
                         "with the live retriever params first")
    question_emb = retriever.embed_queries(question_ids, question_mask)  # [B, proj]
    scores, ids = retriever.searcher.search(question_emb, self.beam)  # [B, beam] each
    return rerank.rerank_with_document_tower(
        question_emb, scores, ids, depth=depth,
        params=qa_batches.host_local_params(self._query_params), config=self.model.config,
        store=self.store)

  def build_batch(self, examples: Sequence[Any], ids: np.ndarray, scores: np.ndarray,
                  retriever: Any) -> Batch:
    fid = self.model.fid
    batch = build_fid_batch(
        self.store, examples, ids, scores, max_answer_length=fid.max_answer_length,
        vocab=self.vocab, eos_id=fid.eos_id, pad_id=fid.pad_id,
        reader_beam=self.model.reader_beam, reader_len=self.reader_len,
        question_len=self.question_len, max_occurrences=self.max_occurrences,
        document_beam=self.model.num_reembedded)
    question_tower = self.model.train_question_tower
    if question_tower:  # the frozen index's side of the scores the objective trains
      # [Q, scored_beam, proj]: the objectives score the read blocks (or `objective_beam`'s).
      batch["retrieved_block_emb"] = qa_batches.gather_block_emb(
          retriever.block_emb, np.asarray(ids)[:, :self.model.scored_beam])
    return fid_model_inputs(batch, question_tower, self.model.train_document_tower)
