"""Open-QA batches (host side, NumPy; ORQA's recipe, REALM_SPEC 25-29) and the fine-tuning iterator.

`build_open_qa_batch` turns questions, their retrieved blocks and a BlockStore into the
`OpenQAModel` batch: question rows, the index embeddings of the beam, reader rows
`[CLS] question [SEP] body [SEP]` (no title, REALM_SPEC 11), retriever labels (ORQA's HasAnswer
substring search; `re.search` for CuratedTrec's regex answers) and gold reader spans. A beam of
`NULL_BLOCK` throughout is the closed book: rows of the question alone. `open_qa_batch_spec`
declares the schema; `span_text` / `answer_texts` map predicted spans back to the original text.
`OpenQABatches` retrieves each step's beam with the live question tower (`set_query_params`), as
ORQA retrieves inside its training graph (REALM_SPEC 25-26). Questions are never truncated
(REALM_SPEC 26). Design notes: docs/design/data_index_batches.md.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from realm_jax.data import answer_match
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import tensorflow_setup
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.qa_datasets import QAExample
from realm_jax.batches import seqio_batches
from realm_jax.batches.pretraining_batches import NULL_BLOCK, RetrieverOrProvider
from realm_jax.index.retrieval import IndexRetriever
from realm_jax.models import open_qa_model

Batch = dict[str, Any]
log = logging.getLogger(__name__)

# The CuratedTrec metric's flags (realm_jax.evaluation.metrics, REALM_SPEC 32).
_REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE
_PATTERN_ERRORS = (re.error, OverflowError, RecursionError, ValueError, TypeError)
LABEL_TEXTS = ("body", "title_and_body")
# Batch entries only the host uses (text mapping, evidence); the model never reads them.
HOST_ONLY_KEYS = ("retrieved_scores", "reader_token_starts", "reader_token_limits",
                  "reader_offsets_valid")
# The reader rows, [Q, reader_beam, reader_len] each and padded at the end ("reader_mask" is 1 on
# their real tokens): what a length bucket cuts together (`seqio_batches.LengthBucketed`). A row is
# `[CLS] question [SEP] body [SEP]` from position 0, so cutting trailing padding moves no token:
# gold spans and predicted spans keep their positions. Host-only ones are cut when present.
READER_ROW_KEYS = ("reader_ids", "reader_type_ids", "reader_mask", "reader_block_mask",
                   "reader_token_starts", "reader_token_limits")


# ------------------------------------------------------------------------------ features


def compile_answer_patterns(patterns: Sequence[str]) -> list[re.Pattern[str]]:
  """CuratedTrec answer patterns compiled with the metric's flags; one that does not compile is
  dropped (it matches nothing, as in the metric).
  """
  compiled = []
  for pattern in patterns:
    try:
      compiled.append(re.compile(pattern, _REGEX_FLAGS))
    except _PATTERN_ERRORS:
      pass
  return compiled


def question_arrays(questions: Sequence[str], vocab: vocab_lib.WordPieceVocabulary, *,
                    question_len: int | None = None, question_len_multiple: int = 8,
                    sources: Sequence[str] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
  """`[CLS] question [SEP]` rows, never truncated (REALM_SPEC 26).

  `question_len`: a fixed row length (a longer question raises ValueError), or None for the
  batch's longest rounded up to `question_len_multiple` (few shapes, few recompilations).
  `sources` name each question's origin in error messages.

  Returns:
    (ids [Q, question_len] int32, mask [Q, question_len] int32, each question's wordpieces).
  """
  tokens = [vocab.encode(q) for q in questions]
  longest = max((len(t) for t in tokens), default=0) + 2
  if question_len is None:
    multiple = max(1, int(question_len_multiple))
    length = -(-longest // multiple) * multiple
  else:
    length = int(question_len)
    for i, t in enumerate(tokens):
      if len(t) + 2 > length:
        where = f" ({sources[i]})" if sources and sources[i] else ""
        raise ValueError(
            f"question {i}{where} has {len(t)} wordpieces + [CLS]/[SEP] > question_len="
            f"{length}; questions are never truncated (REALM_SPEC 26): raise question_len or "
            f"pass None to pad to the longest question of the batch. Question: "
            f"{questions[i][:80]!r}")
  ids = np.zeros((len(tokens), length), np.int32)  # [Q, question_len]
  mask = np.zeros((len(tokens), length), np.int32)  # [Q, question_len]
  for i, t in enumerate(tokens):
    row = [vocab_lib.CLS_ID, *t, vocab_lib.SEP_ID]
    ids[i, :len(row)] = row
    mask[i, :len(row)] = 1
  return ids, mask, tokens


def _find_all(haystack: Sequence[int], needle: Sequence[int]) -> list[int]:
  """Start indices of every (possibly overlapping) occurrence of `needle` in `haystack`."""
  width = len(needle)
  if width == 0 or width > len(haystack):
    return []
  first = needle[0]
  return [i for i in range(len(haystack) - width + 1)
          if haystack[i] == first and list(haystack[i:i + width]) == list(needle)]


def _retriever_label(texts: Sequence[str], answers: Sequence[str],
                     patterns: list[re.Pattern[str]] | None) -> bool:
  """ORQA's HasAnswer (raw, case-sensitive substring) or, for regex answers, re.search."""
  if patterns is not None:
    return any(p.search(text) is not None for p in patterns for text in texts)
  return any(answer and answer in text for answer in answers for text in texts)


def _block_offsets(store, block_id: int, vocab: vocab_lib.WordPieceVocabulary
                   ) -> tuple[np.ndarray, bytes, np.ndarray | None, np.ndarray | None]:
  """A block's body wordpieces with the byte span of each in its original body text.

  The store keeps no offsets, so the body is re-tokenised; where that disagrees with the stored
  ids (a sentence boundary inside a word), the stored ids win and the offsets are None.

  Returns:
    (ids [body_len] int32, body UTF-8 bytes, starts [body_len] or None, limits or None).
  """
  stored = store.body_tokens(block_id)
  body = store.body(block_id)
  ids, starts, limits = vocab.tokenize_with_offsets(body)
  body_bytes = body.encode("utf-8")
  if len(ids) != len(stored) or not np.array_equal(np.asarray(ids, np.int32), stored):
    return stored, body_bytes, None, None
  return stored, body_bytes, np.asarray(starts, np.int64), np.asarray(limits, np.int64)


def build_open_qa_batch(store, examples: Sequence[Any], retrieved_ids: Any,
                        retrieved_scores: Any = None, *,
                        vocab: vocab_lib.WordPieceVocabulary | None = None,
                        reader_beam: int = 5, reader_len: int = 320,
                        answers_are_regex: bool | None = None,
                        block_emb: Any = None,
                        question_len: int | None = None, question_len_multiple: int = 8,
                        max_occurrences: int | None = None, max_span_width: int = 10,
                        retriever_label_text: str = "body", document_beam: int = 0,
                        example_mask: Any = None) -> Batch:
  """Features of a batch of questions and their retrieved blocks (the module docstring).

  Args:
    store: the BlockStore the index was built from (block ids are its rows).
    examples: Q `QAExample`s (`question`, `answers`, `answers_are_regex`, optionally `source`).
    retrieved_ids: [Q, beam] block ids, best first (beam >= reader_beam); `NULL_BLOCK`
      throughout for the closed book (then no `block_emb`, no `document_beam`).
    block_emb: the index embeddings [num_blocks(+padding), proj], NumPy or JAX.
    max_occurrences: gold-span slots; None: the batch's largest count rounded up to 8. A fixed
      value fixes the shape and drops later occurrences.
    document_beam: also emit document-tower inputs for the first `document_beam` blocks.
    example_mask: optional [Q] bool; False marks padding questions (no loss, no metrics).

  Returns:
    A dict of NumPy arrays, every one with leading dimension Q:
      question_ids, question_type_ids, question_mask   [Q, question_len] int32
      retrieved_block_ids                             [Q, beam] int32
      retrieved_scores                                [Q, beam] float32 (if given)
      retrieved_block_emb                             [Q, beam, proj] float32 (if block_emb)
      retriever_correct                               [Q, beam] bool
      reader_ids, reader_type_ids, reader_mask        [Q, reader_beam, reader_len] int32
      reader_block_mask                               [Q, reader_beam, reader_len] bool
      reader_gold_starts, reader_gold_ends            [Q, reader_beam, occurrences] int32, -1 pad
      reader_token_starts, reader_token_limits        [Q, reader_beam, reader_len] int32: byte
                                                      span of each block token in the body, -1
      reader_offsets_valid                            [Q, reader_beam] bool
      document_ids, document_type_ids, document_mask  [Q, document_beam, max_block_len] int32
      example_mask                                    [Q] bool
  """
  vocab = vocab or vocab_lib.default_vocabulary()
  if retriever_label_text not in LABEL_TEXTS:
    raise ValueError(f"retriever_label_text must be one of {LABEL_TEXTS}, got "
                     f"{retriever_label_text!r}")
  examples = list(examples)
  num_questions = len(examples)
  if num_questions == 0:
    raise ValueError("build_open_qa_batch: no examples")
  retrieved_ids = np.asarray(retrieved_ids)
  if retrieved_ids.ndim != 2 or retrieved_ids.shape[0] != num_questions:
    raise ValueError(f"retrieved_ids must be [num_questions={num_questions}, beam]; got shape "
                     f"{retrieved_ids.shape}")
  if not np.issubdtype(retrieved_ids.dtype, np.integer):
    raise ValueError(f"retrieved_ids must be integers; got {retrieved_ids.dtype}")
  beam = retrieved_ids.shape[1]
  if beam < reader_beam:
    raise ValueError(f"the retrieved beam ({beam}) is smaller than reader_beam ({reader_beam})")
  if not 0 <= document_beam <= beam:
    raise ValueError(f"document_beam={document_beam} must lie in [0, beam={beam}]")
  closed_book = retrieved_ids.size > 0 and bool(np.all(retrieved_ids == NULL_BLOCK))
  if closed_book and (block_emb is not None or document_beam):
    raise ValueError("a closed-book beam (NULL_BLOCK throughout) has no block embeddings or "
                     "document rows: pass block_emb=None and document_beam=0")
  if not closed_book and (retrieved_ids.min() < 0 or retrieved_ids.max() >= store.num_blocks):
    raise ValueError(f"retrieved_ids out of range [0, {store.num_blocks}) of the BlockStore "
                     f"{store.path}: was the index built from another store?"
                     + (" (NULL_BLOCK, the closed book, only as the whole beam)"
                        if retrieved_ids.min() == NULL_BLOCK else ""))
  if retrieved_scores is not None:
    retrieved_scores = np.asarray(retrieved_scores, np.float32)
    if retrieved_scores.shape != retrieved_ids.shape:
      raise ValueError(f"retrieved_scores has shape {retrieved_scores.shape}, retrieved_ids "
                       f"{retrieved_ids.shape}")
  regex_flags = {bool(getattr(e, "answers_are_regex", False)) for e in examples}
  if answers_are_regex is None:
    if len(regex_flags) > 1:
      raise ValueError("examples mix regex and plain answers; pass answers_are_regex")
    answers_are_regex = regex_flags.pop()
  if example_mask is None:
    example_mask = np.ones((num_questions,), bool)
  example_mask = np.asarray(example_mask, bool)
  if example_mask.shape != (num_questions,):
    raise ValueError(f"example_mask must be [{num_questions}], got {example_mask.shape}")
  sources = [getattr(e, "source", "") for e in examples]

  question_ids, question_mask, question_tokens = question_arrays(
      [e.question for e in examples], vocab, question_len=question_len,
      question_len_multiple=question_len_multiple, sources=sources)

  batch: Batch = {
      "question_ids": question_ids,
      "question_type_ids": np.zeros_like(question_ids),
      "question_mask": question_mask,
      "retrieved_block_ids": retrieved_ids.astype(np.int32),
  }
  if retrieved_scores is not None:
    batch["retrieved_scores"] = retrieved_scores
  if block_emb is not None:
    if block_emb.shape[0] < store.num_blocks:
      raise ValueError(f"block_emb has {block_emb.shape[0]} rows but the BlockStore "
                       f"{store.path} has {store.num_blocks} blocks: was the index built "
                       f"from another store?")
    batch["retrieved_block_emb"] = gather_block_emb(block_emb, retrieved_ids)

  # [Q, beam]: the whole (untruncated) block text, ORQA's HasAnswer.
  retriever_correct = np.zeros((num_questions, beam), bool)
  shape = (num_questions, reader_beam, reader_len)
  reader_ids = np.zeros(shape, np.int32)
  reader_type_ids = np.zeros(shape, np.int32)
  reader_mask = np.zeros(shape, np.int32)
  reader_block_mask = np.zeros(shape, bool)
  token_starts = np.full(shape, -1, np.int32)
  token_limits = np.full(shape, -1, np.int32)
  offsets_valid = np.zeros((num_questions, reader_beam), bool)
  gold: list[list[list[tuple[int, int]]]] = []

  for q, example in enumerate(examples):
    patterns = compile_answer_patterns(example.answers) if answers_are_regex else None
    answer_ids = ([] if answers_are_regex else
                  [a for a in (vocab.encode(ans) for ans in example.answers)
                   if 0 < len(a) <= max_span_width])
    for k in range(0 if closed_book else beam):  # the closed book's labels stay False
      block_id = int(retrieved_ids[q, k])
      texts = [store.body(block_id)]
      if retriever_label_text == "title_and_body":
        texts.append(store.title(block_id))
      retriever_correct[q, k] = _retriever_label(texts, example.answers, patterns)

    block_start = len(question_tokens[q]) + 2  # [CLS] question [SEP]
    room = reader_len - block_start - 1  # the final [SEP] always fits
    if room < (-1 if closed_book else 1):  # the closed book needs no room for a block
      where = f" ({sources[q]})" if sources[q] else ""
      raise ValueError(
          f"question {q}{where} has {len(question_tokens[q])} wordpieces: with [CLS]/[SEP] it "
          + ("does not fit" if closed_book else "leaves no room for the block in")
          + f" reader_len={reader_len}; questions are never truncated (REALM_SPEC 26), raise "
          f"reader_len.")
    if closed_book:  # [CLS] question [SEP] alone in every row: type ids 0, no gold span
      reader_ids[q, :, :block_start] = [vocab_lib.CLS_ID, *question_tokens[q], vocab_lib.SEP_ID]
      reader_mask[q, :, :block_start] = 1
      gold.append([[] for _ in range(reader_beam)])
      continue
    gold.append([])
    for r in range(reader_beam):
      block_id = int(retrieved_ids[q, r])
      body_ids, body_bytes, starts, limits = _block_offsets(store, block_id, vocab)
      num_block = min(len(body_ids), room)  # overflow: cut, the last position becomes [SEP]
      block_tokens = body_ids[:num_block]
      end = block_start + num_block
      row = [vocab_lib.CLS_ID, *question_tokens[q], vocab_lib.SEP_ID, *block_tokens,
             vocab_lib.SEP_ID]
      reader_ids[q, r, :len(row)] = row
      reader_mask[q, r, :len(row)] = 1
      reader_type_ids[q, r, block_start:end + 1] = 1
      reader_block_mask[q, r, block_start:end] = True
      if starts is not None:
        offsets_valid[q, r] = True
        token_starts[q, r, block_start:end] = starts[:num_block]
        token_limits[q, r, block_start:end] = limits[:num_block]

      spans: set[tuple[int, int]] = set()
      if answers_are_regex:
        if patterns:
          for s in range(num_block):
            for e in range(s, min(num_block, s + max_span_width)):
              text = _token_span_text(body_bytes, starts, limits, block_tokens, s, e, vocab)
              if any(p.fullmatch(text) for p in patterns):
                spans.add((block_start + s, block_start + e))
      else:
        for ids in answer_ids:
          for s in _find_all(block_tokens, ids):
            spans.add((block_start + s, block_start + s + len(ids) - 1))
      gold[q].append(sorted(spans))

  most = max((len(spans) for row in gold for spans in row), default=0)
  if max_occurrences is None:
    width = max(1, -(-most // 8) * 8)
  else:
    width = max(1, int(max_occurrences))
  gold_starts = np.full((num_questions, reader_beam, width), -1, np.int32)
  gold_ends = np.full((num_questions, reader_beam, width), -1, np.int32)
  for q, row in enumerate(gold):
    for r, spans in enumerate(row):
      spans = spans[:width]
      if spans:
        gold_starts[q, r, :len(spans)] = [s for s, _ in spans]
        gold_ends[q, r, :len(spans)] = [e for _, e in spans]

  batch.update({
      "retriever_correct": retriever_correct,
      "reader_ids": reader_ids,
      "reader_type_ids": reader_type_ids,
      "reader_mask": reader_mask,
      "reader_block_mask": reader_block_mask,
      "reader_gold_starts": gold_starts,
      "reader_gold_ends": gold_ends,
      "reader_token_starts": token_starts,
      "reader_token_limits": token_limits,
      "reader_offsets_valid": offsets_valid,
      "example_mask": example_mask,
  })
  if document_beam:
    ids, type_ids, mask = store.embedder_inputs(retrieved_ids[:, :document_beam].reshape(-1))
    block_len = ids.shape[-1]
    batch["document_ids"] = ids.reshape(num_questions, document_beam, block_len)
    batch["document_type_ids"] = type_ids.reshape(num_questions, document_beam, block_len)
    batch["document_mask"] = mask.reshape(num_questions, document_beam, block_len)
  return batch


def open_qa_batch_spec(*, question_len: int, beam: int, proj_size: int, reader_beam: int,
                       reader_len: int, max_occurrences: int, document_beam: int = 0,
                       block_len: int = 0) -> dict[str, Any]:
  """The per-question shapes and dtypes of what `OpenQABatches` yields, declared once:
  {key: jax.ShapeDtypeStruct}; `document_*` only with `document_beam` (`block_len`: the
  BlockStore's row length). Batches cut to a length bucket have narrower reader rows:
  `seqio_batches.spec_at_width` gives their schema.
  """
  shapes = {"question_ids": [question_len], "question_type_ids": [question_len],
            "question_mask": [question_len], "retrieved_block_ids": [beam],
            "retrieved_block_emb": [beam, proj_size], "retriever_correct": [beam],
            "reader_ids": [reader_beam, reader_len], "reader_type_ids": [reader_beam, reader_len],
            "reader_mask": [reader_beam, reader_len],
            "reader_block_mask": [reader_beam, reader_len],
            "reader_gold_starts": [reader_beam, max_occurrences],
            "reader_gold_ends": [reader_beam, max_occurrences], "example_mask": []}
  if document_beam:
    for key in ("document_ids", "document_type_ids", "document_mask"):
      shapes[key] = [document_beam, block_len]
  dtypes = {"retrieved_block_emb": np.float32, "retriever_correct": bool,
            "reader_block_mask": bool, "example_mask": bool}
  return {key: jax.ShapeDtypeStruct(tuple(int(n) for n in shape), dtypes.get(key, np.int32))
          for key, shape in shapes.items()}


def gather_block_emb(block_emb: Any, ids: Any) -> np.ndarray:
  """Rows `ids` (int [...]) of the index embedding matrix as float32 NumPy [..., proj]. A JAX
  `block_emb` (possibly sharded) is gathered on its devices: the full matrix never comes to the
  host.
  """
  ids = np.asarray(ids)
  if isinstance(block_emb, jax.Array):
    rows = jnp.take(block_emb, jnp.asarray(ids.reshape(-1), jnp.int32), axis=0)
    return np.asarray(rows, np.float32).reshape(*ids.shape, -1)
  return np.asarray(np.asarray(block_emb)[ids], np.float32)


def model_inputs(batch: Batch) -> Batch:
  """The batch without its host-only entries (text offsets, evidence ids and scores)."""
  return {k: v for k, v in batch.items() if k not in HOST_ONLY_KEYS}


def _token_span_text(body_bytes: bytes, starts, limits, tokens, s: int, e: int,
                     vocab: vocab_lib.WordPieceVocabulary) -> str:
  """Original text of body wordpieces s..e (inclusive); joined wordpieces without offsets."""
  if starts is not None:
    return body_bytes[int(starts[s]):int(limits[e])].decode("utf-8", errors="replace")
  return vocab.decode([int(t) for t in tokens[s:e + 1]])


def span_text(store, batch: Batch, question: int, block_index: int, start: int, end: int,
              vocab: vocab_lib.WordPieceVocabulary | None = None) -> str:
  """The original text (original casing, REALM_SPEC 29) of a reader span.

  `question` is the batch row, `block_index` the reader block (0..reader_beam-1), `start`/`end`
  reader-input positions (`end` inclusive); `batch` must hold the host-only entries. Returns the
  body bytes of those wordpieces decoded ("" when the span is not inside the block), or joined
  wordpieces when the block has no offsets.
  """
  q, r, start, end = int(question), int(block_index), int(start), int(end)
  block_mask = np.asarray(batch["reader_block_mask"][q, r])
  if not (0 <= start <= end < block_mask.shape[0]) or not (block_mask[start] and block_mask[end]):
    return ""
  if bool(batch["reader_offsets_valid"][q, r]):
    byte_start = int(batch["reader_token_starts"][q, r, start])
    byte_limit = int(batch["reader_token_limits"][q, r, end])
    block_id = int(batch["retrieved_block_ids"][q, r])
    body = store.body(block_id).encode("utf-8")
    return body[byte_start:byte_limit].decode("utf-8", errors="replace")
  vocab = vocab or vocab_lib.default_vocabulary()
  return vocab.decode([int(t) for t in np.asarray(batch["reader_ids"][q, r, start:end + 1])])


def answer_texts(store, batch: Batch, predictions: dict,
                 vocab: vocab_lib.WordPieceVocabulary | None = None) -> list[str]:
  """`span_text` of every question's predicted span (`OpenQAModel.predict_batch` output)."""
  block = np.asarray(predictions["block_index"])
  start = np.asarray(predictions["start"])
  end = np.asarray(predictions["end"])
  return [span_text(store, batch, q, block[q], start[q], end[q], vocab)
          for q in range(block.shape[0])]


# ------------------------------------------------------------------------------ fine-tuning batches


DEFAULT_RETRIEVER_BEAM = 5000
DEFAULT_QUESTION_LEN = 64
DEFAULT_MAX_OCCURRENCES = 32
# Keys of `OpenQABatches.state()` that must match on restore.
_MUST_MATCH = ("task", "split", "seed", "batch_size", "num_shards", "few_shot",
               "few_shot_seed")


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def qa_task_examples(task_name: str, split: str, *,
                     max_examples: Optional[int] = None) -> list[QAExample]:
  """The `QAExample`s of a registered QA task split, in the task's order, read through seqio;
  `source` is "<task>/<split>:<index>" for messages.

  Raises:
    UnknownTaskError: the task is not registered (`import realm_jax_tasks` registers them).
    ValueError: not a QA task (no `question`/`answers` features), or an empty split.
  """
  task = seqio_batches.get_task(task_name)
  regex = answer_match.answers_are_regex(task)  # the task knows its metric
  dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False)
  missing = [k for k in ("question", "answers") if k not in dataset.element_spec]
  if missing:
    raise ValueError(f"task {task_name!r} is not a QA task: it has no {missing} features (has "
                     f"{sorted(dataset.element_spec)})")
  if max_examples is not None:
    dataset = dataset.take(int(max_examples))
  examples = [QAExample(question=_text(ex["question"]),
                        answers=tuple(_text(a) for a in ex["answers"]),
                        answers_are_regex=regex, source=f"{task_name}/{split}:{i}")
              for i, ex in enumerate(tensorflow_setup.numpy_iterator(dataset))]
  if not examples:
    raise ValueError(f"task {task_name!r} split {split!r} has no examples")
  return examples


def ranks_texts(retriever: Any) -> bool:
  """Whether a retriever ranks the question texts themselves (`retrieve_texts`: BM25,
  `evaluation.bm25.BM25Searcher`) rather than their embeddings by a question tower."""
  return hasattr(retriever, "retrieve_texts")


class ClosedBook:
  """No retrieval: Atlas's closed-book baseline (`FinetuneJob.candidates='none'`), a retriever
  that ranks question texts (`ranks_texts`) and returns for each a beam of
  `NULL_BLOCK` only, from which `build_open_qa_batch` builds reader rows
  `[CLS] question [SEP]` with no block. Nothing to embed or search (`block_emb` and
  `embeddings` None: no retrieval score), no index, no BlockStore identity to check."""

  block_emb = None
  embeddings = None
  block_store_id = None
  num_docs = None
  step = 0  # no index step: named in the batches' messages only

  def retrieve_texts(self, questions: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32 [n, k] zeros, ids int32 [n, k] all `NULL_BLOCK`)."""
    shape = (len(questions), int(k))
    return np.zeros(shape, np.float32), np.full(shape, NULL_BLOCK, np.int32)


def is_closed_book(retriever: Any) -> bool:
  """Whether `retriever` reads no blocks (`ClosedBook`)."""
  return isinstance(retriever, ClosedBook)


def host_local_params(params: Any) -> Any:
  """A copy of (possibly multi-host sharded) parameters usable by this host alone.

  One process: the arrays themselves (device_put re-shards them where needed). Several
  processes: gathered from all of them (a collective: every process must call it in step).
  """
  if jax.process_count() == 1:
    return params
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.process_allgather(params, tiled=True)


def check_few_shot(size: Any) -> None:
  """Raises ValueError (one line) unless `size` is None (every question) or a positive int."""
  if size is not None and (isinstance(size, bool) or not isinstance(size, (int, np.integer))
                           or size < 1):
    raise ValueError(f"few_shot={size!r}: expected a positive number of training questions, "
                     f"or None for all of them")


def few_shot_sample(examples: Sequence[Any], size: int, seed: int, *, where: str = "the split"
                    ) -> list[Any]:
  """`size` of `examples` drawn without replacement with `seed`, in the split's order (a
  uniform sample: the same `size` and `seed` give the same questions whatever the training
  seed; a larger sample of one seed does not contain a smaller one).

  Raises:
    ValueError: `size` is not a positive integer, or exceeds the number of examples.
  """
  check_few_shot(size)
  if size > len(examples):
    raise ValueError(f"few_shot={size}: {where} has only {len(examples)} questions")
  chosen = np.random.default_rng(seed).choice(len(examples), size=size, replace=False)
  return [examples[i] for i in np.sort(chosen)]


class OpenQABatches:
  """Open-QA fine-tuning batches on this host (the module docstring); resumable.

  Yields `model_inputs(build_open_qa_batch(...))`: question_ids/type_ids/mask
  [B, question_len], retrieved_block_ids [B, beam], retrieved_block_emb [B, beam, proj],
  retriever_correct [B, beam], reader_ids/type_ids/mask/block_mask [B, reader_beam, reader_len],
  reader_gold_starts/ends [B, reader_beam, max_occurrences], example_mask [B] (and
  document_ids/type_ids/mask [B, document_beam, block_len] when the document tower trains).
  """

  def __init__(self, task_name: str, *, batch_size: int, store: block_store_lib.BlockStore,
               model: open_qa_model.OpenQAModel, retriever: RetrieverOrProvider = None,
               split: str = "train", seed: int = 0,
               retriever_beam: int = DEFAULT_RETRIEVER_BEAM, reader_len: int = 320,
               question_len: int = DEFAULT_QUESTION_LEN,
               max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
               shard_index: Optional[int] = None, num_shards: Optional[int] = None,
               max_examples: Optional[int] = None,
               vocab: Optional[vocab_lib.WordPieceVocabulary] = None,
               few_shot: Optional[int] = None, few_shot_seed: int = 0):
    """Reads the split (question texts only: cheap) and checks the arguments.

    Args:
      task_name: a registered QA task (toy_qa, nq_open, web_questions, curated_trec).
      batch_size: questions per step on this host.
      retriever: an `IndexRetriever`, an `IndexWatcher` of them, a provider, or one that ranks
        question texts (`retrieve_texts`: `evaluation.bm25.BM25Searcher`, `ClosedBook`); or
        later, `set_retriever`.
      retriever_beam: blocks per question for the retriever loss (clipped to the store size).
      question_len: fixed question row length; longer questions are left out (counted).
      max_occurrences: gold-span slots per (question, block); later occurrences are dropped.
      few_shot: train on this many questions (Atlas's few-shot protocol; None: all), sampled with
        `few_shot_seed` before sharding, so every host and training seed sees the same sample.
    """
    if isinstance(batch_size, bool) or int(batch_size) < 1:
      raise ValueError(f"batch_size must be a positive integer (per host), got {batch_size!r}")
    self.task_name = task_name
    self.split = split
    self.batch_size = int(batch_size)
    self.seed = int(seed)
    self.store = store
    self.model = model
    self.vocab = vocab or vocab_lib.default_vocabulary()
    self.beam = min(int(retriever_beam), store.num_blocks)
    if self.beam < model.reader_beam:
      raise ValueError(f"retriever_beam {retriever_beam} (store {store.path}: "
                       f"{store.num_blocks} blocks) is smaller than the reader beam "
                       f"{model.reader_beam}")
    self.reader_len = int(reader_len)
    self.question_len = int(question_len)
    self.max_occurrences = int(max_occurrences)
    self.shard_index = int(jax.process_index() if shard_index is None else shard_index)
    self.num_shards = int(jax.process_count() if num_shards is None else num_shards)
    if not 0 <= self.shard_index < self.num_shards:
      raise ValueError(f"shard_index={self.shard_index} must be in [0, {self.num_shards})")
    examples = qa_task_examples(task_name, split, max_examples=max_examples)
    self.few_shot = None if few_shot is None else int(few_shot)
    self.few_shot_seed = int(few_shot_seed)
    if self.few_shot is not None:
      examples = few_shot_sample(examples, self.few_shot, self.few_shot_seed,
                                 where=f"{task_name}/{split}")
    fits, self.skipped_too_long = [], 0
    for example in examples[self.shard_index::self.num_shards]:
      # [CLS] question [SEP] must fit the question row, and leave the reader a block token.
      length = len(self.vocab.encode(example.question)) + 2
      if length > self.question_len or length + 2 > self.reader_len:
        self.skipped_too_long += 1
        continue
      fits.append(example)
    if self.skipped_too_long:
      log.warning("%s/%s: %d questions longer than question_len=%d wordpieces left out",
                  task_name, split, self.skipped_too_long, self.question_len)
    if len(fits) < self.batch_size:
      raise ValueError(f"task {task_name!r} split {split!r} has {len(fits)} usable questions on "
                       f"shard {self.shard_index}/{self.num_shards}, fewer than the per-host "
                       f"batch size {self.batch_size}")
    self.examples = fits
    self.answers_are_regex = bool(fits[0].answers_are_regex)
    self._retriever = retriever
    self._query_params = None
    self._epoch = 0
    self._batches_in_epoch = 0
    self._batches_consumed = 0
    self._order: Optional[np.ndarray] = None

  @property
  def batches_per_epoch(self) -> int:
    return len(self.examples) // self.batch_size  # the remainder of each epoch is dropped

  def set_retriever(self, retriever: RetrieverOrProvider) -> None:
    self._retriever = retriever

  def set_query_params(self, retriever_params: Any) -> None:
    """The question tower to retrieve with from the next batch on: the live `params["retriever"]`
    (possibly sharded; see `host_local_params`)."""
    self._query_params = retriever_params

  def _current_retriever(self) -> IndexRetriever:
    retriever = self._retriever
    if retriever is None:
      raise RuntimeError("OpenQABatches has no retriever: call set_retriever first")
    if not (hasattr(retriever, "retrieve") or ranks_texts(retriever)):
      retriever = retriever.current if hasattr(retriever, "current") else retriever()
    if getattr(retriever, "block_store_id", None) not in (None, self.store.store_id):
      raise ValueError(f"the index of step {retriever.step} embeds BlockStore "
                       f"{retriever.block_store_id}, not {self.store.path}")
    return retriever

  def _epoch_order(self) -> np.ndarray:
    if self._order is None:
      rng = np.random.default_rng(seqio_batches.epoch_seed(self.seed, self._epoch))
      self._order = rng.permutation(len(self.examples))
    return self._order

  def __iter__(self) -> "OpenQABatches":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self._batches_in_epoch >= self.batches_per_epoch:
      self._epoch += 1
      self._batches_in_epoch = 0
      self._order = None
    begin = self._batches_in_epoch * self.batch_size
    chosen = self._epoch_order()[begin:begin + self.batch_size]
    examples = [self.examples[i] for i in chosen]
    retriever = self._current_retriever()
    question_ids, question_mask, _ = question_arrays(
        [e.question for e in examples], self.vocab, question_len=self.question_len)
    # [B, beam] each, best first.
    if ranks_texts(retriever):
      scores, ids = retriever.retrieve_texts([e.question for e in examples], self.beam)
    else:
      if self._query_params is not None:
        retriever.set_query_params(host_local_params(self._query_params), self.model.config)
      scores, ids = self.retrieve(retriever, question_ids, question_mask)
    batch = self.build_batch(examples, np.asarray(ids), np.asarray(scores), retriever)
    self._batches_in_epoch += 1
    self._batches_consumed += 1
    return batch

  def retrieve(self, retriever: IndexRetriever, question_ids: np.ndarray,
               question_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The beam the reader reads ([B, beam] scores and ids, best first): the index's
    (`batches.fid.FidBatches` may re-rank it with the live document tower)."""
    return retriever.retrieve(question_ids, question_mask, k=self.beam)

  def build_batch(self, examples: list[QAExample], ids: np.ndarray, scores: np.ndarray,
                  retriever: Any) -> dict[str, np.ndarray]:
    """The model's batch of `examples` and their retrieved beam ([B, beam] ids and scores, best
    first) from `retriever`: `OpenQAModel`'s here (`batches.fid.FidBatches` builds the FiD
    reader's from the same retrieval)."""
    batch = build_open_qa_batch(
        self.store, examples, ids, scores, vocab=self.vocab,
        reader_beam=self.model.reader_beam, reader_len=self.reader_len,
        answers_are_regex=self.answers_are_regex, block_emb=retriever.block_emb,
        question_len=self.question_len, max_occurrences=self.max_occurrences,
        max_span_width=self.model.config.max_span_width,
        document_beam=self.model.num_reembedded)
    return model_inputs(batch)

  def metrics(self) -> dict[str, float]:
    return {"qa/skipped_too_long": float(self.skipped_too_long),
            "qa/epoch": float(self._epoch)}

  def state(self) -> dict[str, Any]:
    """The data position, JSON-able (saved with each checkpoint)."""
    return {"task": self.task_name, "split": self.split, "seed": self.seed,
            "batch_size": self.batch_size, "shard_index": self.shard_index,
            "num_shards": self.num_shards, "few_shot": self.few_shot,
            "few_shot_seed": self.few_shot_seed, "epoch": self._epoch,
            "batches_in_epoch": self._batches_in_epoch,
            "batches_consumed": self._batches_consumed}

  def restore(self, state: Mapping[str, Any]) -> None:
    """Continues from a `state()`: the next batch is the one that followed it.

    Raises:
      ValueError: the state belongs to another stream.
    """
    seqio_batches.check_same_stream(state, self.state(), _MUST_MATCH)
    consumed = int(state["batches_consumed"])
    if "epoch" in state and state.get("shard_index", self.shard_index) == self.shard_index:
      epoch, in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
    else:  # another host's state: hosts step in lockstep, so locate by the count
      epoch, in_epoch = divmod(consumed, self.batches_per_epoch)
      if in_epoch == 0 and epoch:
        epoch, in_epoch = epoch - 1, self.batches_per_epoch
    self._epoch, self._batches_in_epoch, self._batches_consumed = epoch, in_epoch, consumed
    self._order = None

