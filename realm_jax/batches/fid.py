"""Generative open-QA batches for the FiD reader (`models.fid_qa.FidReaderModel`): the
extractive job's retrieval and reader rows plus one answer's target tokens.

`build_fid_batch` is `open_qa.build_open_qa_batch` (the same `[CLS] question [SEP] body [SEP]`
reader rows of the first `reader_beam` retrieved blocks, type ids 0 / 1, and the same retriever
labels) with `answer_targets`: per question, the wordpieces of its FIRST answer (in the task's
order) that fits `max_answer_length` with its EOS, then EOS, then padding, and their mask.
`FidBatches` is `qa_inputs.OpenQABatches` (the live question tower searching the run's index,
resumable) building those batches. Regex answers (CuratedTrec) are patterns, not texts to
generate: refused. When the model trains its question tower (a retriever objective,
`FidReaderModel.train_question_tower`) the batches also carry the question rows and the frozen
index's embeddings of the K read blocks (`QUESTION_TOWER_KEYS`): the retrieval scores the
objective trains are recomputed from them in the graph.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from realm_jax.batches import open_qa as qa_batches
from realm_jax.batches import qa_inputs
from realm_jax.data import vocab as vocab_lib

Batch = dict[str, Any]

# What the FiD model reads (and `fid_model_inputs` keeps).
FID_MODEL_KEYS = ("reader_ids", "reader_type_ids", "reader_mask", "answer_targets",
                  "answer_mask", "retriever_correct", "example_mask")
# What it also reads when a retriever objective trains its question tower: the questions
# [Q, question_len] and the frozen index's embeddings of the read blocks [Q, reader_beam, proj].
QUESTION_TOWER_KEYS = ("question_ids", "question_type_ids", "question_mask",
                       "retrieved_block_emb")


def answer_targets(answers_per_question: Sequence[Sequence[str]],
                   vocab: vocab_lib.WordPieceVocabulary, *, max_answer_length: int,
                   eos_id: int = vocab_lib.SEP_ID, pad_id: int = vocab_lib.PAD_ID
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Decoder targets of one answer per question.

  Args:
    answers_per_question: each question's answers, in the task's order.
    vocab: the WordPiece vocabulary.
    max_answer_length: T, the target width (answer wordpieces + EOS must fit).
    eos_id, pad_id: the FidConfig's.

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
    for a, answer in enumerate(answers):
      ids = vocab.encode(answer)
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
  targets, mask, chosen = answer_targets([e.answers for e in examples], vocab,
                                         max_answer_length=max_answer_length, eos_id=eos_id,
                                         pad_id=pad_id)
  batch.update({"answer_targets": targets, "answer_mask": mask, "answer_index": chosen})
  return batch


def fid_model_inputs(batch: Batch, question_tower: bool = False) -> Batch:
  """What `FidReaderModel` reads of a `build_fid_batch` batch (`FID_MODEL_KEYS`, and
  `QUESTION_TOWER_KEYS` with `question_tower`)."""
  keys = FID_MODEL_KEYS + (QUESTION_TOWER_KEYS if question_tower else ())
  return {key: batch[key] for key in keys}


def fid_batch_spec(*, beam: int, reader_beam: int, reader_len: int, max_answer_length: int,
                   question_len: int | None = None,
                   proj_size: int | None = None) -> dict[str, Any]:
  """The per-example shapes and dtypes of `FidBatches`' batches (`fid_model_inputs`); with
  `question_len` and `proj_size` (a model that trains its question tower) also
  `QUESTION_TOWER_KEYS`'."""
  shapes = {"reader_ids": [reader_beam, reader_len], "reader_type_ids": [reader_beam, reader_len],
            "reader_mask": [reader_beam, reader_len], "answer_targets": [max_answer_length],
            "answer_mask": [max_answer_length], "retriever_correct": [beam], "example_mask": []}
  if (question_len is None) != (proj_size is None):
    raise ValueError("fid_batch_spec: question_len and proj_size go together (the question "
                     "tower's inputs)")
  if question_len is not None:
    shapes.update(question_ids=[question_len], question_type_ids=[question_len],
                  question_mask=[question_len], retrieved_block_emb=[reader_beam, proj_size])
  dtypes = {"retriever_correct": bool, "example_mask": bool, "retrieved_block_emb": np.float32}
  return {key: jax.ShapeDtypeStruct(tuple(int(n) for n in shape), dtypes.get(key, np.int32))
          for key, shape in shapes.items()}


class FidBatches(qa_inputs.OpenQABatches):
  """`OpenQABatches` (questions, the live question tower's beam, resumable) yielding FiD
  batches: `fid_model_inputs(build_fid_batch(...))`. `model` is a `FidReaderModel`."""

  def __init__(self, task_name: str, **kwargs: Any):
    super().__init__(task_name, **kwargs)
    if self.answers_are_regex:
      raise ValueError(f"task {task_name!r} has regex answers (CuratedTrec): the FiD reader "
                       f"generates answer texts and has none to train on")

  def build_batch(self, examples: Sequence[Any], ids: np.ndarray, scores: np.ndarray,
                  retriever: Any) -> Batch:
    fid = self.model.fid
    batch = build_fid_batch(
        self.store, examples, ids, scores, max_answer_length=fid.max_answer_length,
        vocab=self.vocab, eos_id=fid.eos_id, pad_id=fid.pad_id,
        reader_beam=self.model.reader_beam, reader_len=self.reader_len,
        question_len=self.question_len, max_occurrences=self.max_occurrences)
    question_tower = self.model.train_question_tower
    if question_tower:  # the frozen index's side of the scores the objective trains
      # [Q, reader_beam, proj]: the objectives score the read blocks only.
      batch["retrieved_block_emb"] = qa_batches.gather_block_emb(
          retriever.block_emb, np.asarray(ids)[:, :self.model.reader_beam])
    return fid_model_inputs(batch, question_tower)
