"""Open-QA fine-tuning batches (host side, NumPy; ORQA's recipe, REALM_SPEC 25-29).

`build_open_qa_batch` turns questions, the blocks a searcher retrieved for them and a
BlockStore into the `OpenQAModel` batch (`realm_jax.models.open_qa`): question ids, the
index embeddings of the retrieved blocks, reader rows, and the correctness labels of the
retriever and of the span reader; `span_text` / `answer_texts` map predicted spans back to the
original text. `open_qa_batch_spec` declares the batch (shapes and dtypes) once: dry runs and
`eval_shape` ask it.

What the authors' code does, and what is followed here (`language/orqa/models/orqa_model.py`,
`language/orqa/ops/orqa_ops.cc`):

* **Retriever labels** (`retriever_correct [Q, beam]`): ORQA's `HasAnswer` op is a
  case-sensitive raw substring search (`std::string::find`) of every answer in the retrieved
  block's text. ORQA's block records (`blocks.tfr`, written by `wiki_preprocessor.py`) hold the
  *body* only (" ".join of the block's sentences); titles live in a separate file and never reach
  this op. So the default searches the whole (untruncated) body; `retriever_label_text=
  "title_and_body"` also accepts a match inside the title (title and body searched separately,
  never across the boundary).
* **Reader inputs** (`orqa_ops.ReaderInputs`): `[CLS] question [SEP] body [SEP]`, length
  `reader_len` (320); segment 0 for `[CLS] question [SEP]`, 1 for the body and its `[SEP]`; when
  the body overflows, it is cut and the last position is forced to `[SEP]`. The question is
  never truncated (an error if it leaves no room for a single block token). No title, as ORQA
  and REALM_SPEC 11.
* **Reader labels**: every occurrence (overlapping ones too) of every answer's wordpiece ids
  inside the block part of the reader input is a gold span (`reader_gold_starts/ends
  [Q, reader_beam, occurrences]`, -1 padded); the model turns them into `reader_correct
  [Q, reader_beam, spans]` with `reader.span_correctness`. ORQA records answers longer than
  `max_span_width` too, but no candidate span can equal them; they are left out here (same
  labels, smaller arrays).
* **CuratedTrec (regex answers)**. The release could not fine-tune on CT (its labels need
  answer strings). Here: the retriever label is `re.search(pattern, text)`; a reader span (of at
  most `max_span_width` wordpieces, inside the block) is gold iff its ORIGINAL text, the body
  bytes from its first wordpiece's start to its last wordpiece's end, is matched as a whole
  (`re.fullmatch`) by some pattern. Patterns are compiled with the CT metric's flags
  (IGNORECASE | UNICODE | MULTILINE); one that does not compile matches nothing, as in the metric.
  `fullmatch` rather than the metric's prefix `match`: `match` would also mark "Paris, France and
  the" for the pattern "Paris", pushing the reader to over-long spans; every fullmatch span also
  passes the metric.
* **Closed book** (Atlas's baseline without retrieval, `FinetuneJob.candidates='none'`): a beam
  of `NULL_BLOCK` ids throughout (`qa_inputs.ClosedBook` retrieves them) reads no block: every
  reader row is `[CLS] question [SEP]` alone (type ids 0, nothing after the question's [SEP],
  no block tokens, no gold spans), its retriever labels False and its embeddings none.
Host-only batch entries (`retrieved_scores`, `reader_token_starts/limits`,
`reader_offsets_valid`) ride along so predictions can be mapped back to the original text
(`span_text`, `answer_texts`); `model_inputs(batch)` drops them before a device transfer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from realm_jax.batches.candidates import NULL_BLOCK
from realm_jax.data import vocab as vocab_lib

Batch = dict[str, Any]

# The CuratedTrec metric's flags (realm_jax.evaluation.metrics, REALM_SPEC 32).
_REGEX_FLAGS = re.IGNORECASE | re.UNICODE | re.MULTILINE
_PATTERN_ERRORS = (re.error, OverflowError, RecursionError, ValueError, TypeError)
LABEL_TEXTS = ("body", "title_and_body")
# Batch entries only the host uses (text mapping, evidence); the model never reads them.
HOST_ONLY_KEYS = ("retrieved_scores", "reader_token_starts", "reader_token_limits",
                  "reader_offsets_valid")
# The reader rows, [Q, reader_beam, reader_len] each and padded at the end ("reader_mask" is 1 on
# their real tokens): what a length bucket cuts together (`inputs.LengthBucketed`). A row is
# `[CLS] question [SEP] body [SEP]` from position 0, so cutting trailing padding moves no token:
# gold spans and predicted spans keep their positions. Host-only ones are cut when present.
READER_ROW_KEYS = ("reader_ids", "reader_type_ids", "reader_mask", "reader_block_mask",
                   "reader_token_starts", "reader_token_limits")


# ------------------------------------------------------------------------------ features


def compile_answer_patterns(patterns: Sequence[str]) -> list[re.Pattern[str]]:
  """CuratedTrec answer patterns compiled with the metric's flags; invalid ones are dropped.

  Args:
    patterns: regular expressions.

  Returns:
    The compiled patterns that compile (an invalid pattern matches nothing, as in the metric).
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
  """`[CLS] question [SEP]` rows, never truncated.

  Args:
    questions: Q question texts.
    vocab: the WordPiece vocabulary.
    question_len: a fixed row length; a question that does not fit is an error (never
      truncated, REALM_SPEC 26). None: the longest question of the batch, rounded up to a
      multiple of `question_len_multiple` (few distinct shapes, so few recompilations).
    question_len_multiple: rounding for the automatic length.
    sources: per question, where it came from (for error messages).

  Returns:
    (ids [Q, question_len] int32, mask [Q, question_len] int32, the wordpieces of each
    question without specials).

  Raises:
    ValueError: a question longer than a fixed `question_len`.
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

  The BlockStore keeps the body's wordpieces and its original text but not the offsets, so
  the text is re-tokenised. For whole-record blocks this gives exactly the stored ids; for
  sentence-packed blocks too, unless a sentence boundary fell inside a word. If the ids differ,
  the stored ids are used (they are what the index embedded) and offsets are None: the
  prediction text then falls back to joined wordpieces.

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
  """Features of a batch of questions and their retrieved blocks (see the module docstring).

  Args:
    store: the BlockStore the index was built from (block ids are its rows).
    examples: Q `QAExample`s (anything with `question`, `answers`, `answers_are_regex`, and
      optionally `source`).
    retrieved_ids: [Q, beam] block ids, best first (beam >= reader_beam; 5000 in the paper);
      or `NULL_BLOCK` throughout, the closed book: rows `[CLS] question [SEP]` only (module
      docstring; no `block_emb`, no `document_beam`).
    retrieved_scores: optional [Q, beam] searcher scores, kept for the predictions' evidence.
    vocab: the WordPiece vocabulary (the bundled BERT uncased by default).
    reader_beam: blocks read by the reader (5).
    reader_len: reader sequence length (320).
    answers_are_regex: treat answers as regular expressions (CuratedTrec). None: from the
      examples, which must agree.
    block_emb: the frozen index embeddings [num_blocks, proj] (NumPy or a JAX array, e.g. an
      `ExactSearcher.embeddings`); when given, `retrieved_block_emb` is gathered from it. Rows
      past `num_blocks` (a sharded searcher's padding) are allowed and never gathered.
    question_len: fixed question row length, or None for the batch's longest (see
      `question_arrays`).
    question_len_multiple: rounding of the automatic question length.
    max_occurrences: width of the gold-span arrays. None: the batch's largest count (rounded
      up to a multiple of 8), so no occurrence is ever dropped. A fixed value gives fixed shapes;
      occurrences beyond it are dropped (in reading order).
    max_span_width: longest correct answer span in wordpieces (the model config's, 10).
    retriever_label_text: "body" (ORQA) or "title_and_body".
    document_beam: also emit document-tower inputs (`document_ids/type_ids/mask
      [Q, document_beam, max_block_len]`) for the first `document_beam` blocks, for
      `OpenQAModel(train_document_tower=True)`.
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
                                                      span of each block token in the block's
                                                      body text, -1 elsewhere
      reader_offsets_valid                            [Q, reader_beam] bool
      document_ids, document_type_ids, document_mask  [Q, document_beam, max_block_len] int32
                                                      (if document_beam)
      example_mask                                    [Q] bool

  Raises:
    ValueError: mismatched shapes, a beam smaller than reader_beam, block ids out of range,
      examples that disagree on regex answers, or a question too long for reader_len.
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
  """The per-example shapes and dtypes of the `OpenQAModel` batch, `model_inputs` of a
  `build_open_qa_batch` built with fixed `question_len` and `max_occurrences` and a `block_emb`
  (what `OpenQABatches` yields): the schema, declared once. Batches cut to a length bucket
  (`inputs.LengthBucketed` over `READER_ROW_KEYS`) have narrower reader rows:
  `inputs.spec_at_width` gives their schema.

  Returns:
    {key: jax.ShapeDtypeStruct of one question}; `document_*` only with `document_beam`
    (`block_len`: the BlockStore's row length).
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
  """Rows of the index embedding matrix as float32 NumPy.

  Args:
    block_emb: [num_blocks(+padding), proj] NumPy array or (possibly sharded) JAX array; a JAX
      array is gathered on its devices, so the full matrix never comes to the host.
    ids: int [...] block ids.

  Returns:
    [..., proj] float32.
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

  Args:
    store: the BlockStore of the batch.
    batch: from `build_open_qa_batch` (needs the host-only entries).
    question: row in the batch.
    block_index: position among the reader's blocks (0..reader_beam-1).
    start, end: reader-input token positions, `end` inclusive.
    vocab: used only when a block has no offsets (joined wordpieces, lower-cased).

  Returns:
    The body bytes from the start of wordpiece `start` to the end of wordpiece `end`, decoded;
    "" when the span does not lie inside the block.
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
