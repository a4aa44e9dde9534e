"""Open-QA fine-tuning batches: questions, their beam retrieved with the live question tower.

ORQA retrieves inside the training graph, with the question encoder being trained: the beam of
step s is chosen by the parameters after s - 1 updates (REALM_SPEC 25-26). Here the search runs
on the host side of the input pipeline, so the trainer hands the current question tower to the
iterator at every step boundary (`set_query_params`, called from a trainer hook before the
batch is drawn); the iterator

1. takes the next `batch_size` questions of this host's shard (a fresh permutation per epoch,
   seeded by (seed, epoch), so a resumed run draws the same questions);
2. embeds them with that question tower (eval mode) and searches the current index (a frozen
   one by default, or one the index builder refreshes when the document tower trains) for the
   top `retriever_beam` blocks (5000 in the paper; at most the number of blocks);
3. builds the `OpenQAModel` batch with `qa_batches.build_open_qa_batch`: the frozen index
   embeddings of the beam (the model recomputes `question . block` with the live, dropout-on
   question tower, so both losses train it), the reader inputs of the top `reader_beam`, the
   retriever and reader labels (CuratedTrec: its regex answers).

Shapes are fixed (`question_len`, `max_occurrences`), so the train step compiles once and every
host builds identical shapes. A question longer than `question_len` (never truncated,
REALM_SPEC 26) is left out when the split is read and counted (`qa/skipped_too_long`).

Cost of the live question tower: one host-to-device copy of the tower per step (a multi-host
run also gathers it from every process, `jax.experimental.multihost_utils.process_allgather`);
small next to a train step at BERT-base, and `query_params_every` refreshes it less often.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional, Sequence

import jax
import numpy as np

from realm_jax.data import corpus as corpus_lib
from realm_jax.data import vocab as vocab_lib
from realm_jax.data.open_qa import QAExample
from realm_jax.data import tensorflow_setup
from realm_jax.batches import open_qa as qa_batches
from realm_jax.batches.candidates import NULL_BLOCK
from realm_jax.models import open_qa
from realm_jax.batches import inputs

log = logging.getLogger(__name__)

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
  """The `QAExample`s of a registered QA task split, in the task's order.

  Read through seqio (the task is the source of truth for the data); `source` is
  "<task>/<split>:<index>" for messages.

  Raises:
    UnknownTaskError: the task is not registered.
    ValueError: the task is not a QA task (no `question`/`answers` features), or the split is
      empty.
  """
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top  (the task knows its metric)
  task = inputs.get_task(task_name)
  regex = realm_jax_tasks.answers_are_regex(task)
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
  `candidates.NULL_BLOCK` only, from which `qa_batches.build_open_qa_batch` builds reader rows
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
  """Open-QA fine-tuning batches on this host (see the module docstring); resumable.

  Yields `qa_batches.model_inputs(build_open_qa_batch(...))`: question_ids/type_ids/mask
  [B, question_len], retrieved_block_ids [B, beam], retrieved_block_emb [B, beam, proj],
  retriever_correct [B, beam], reader_ids/type_ids/mask/block_mask [B, reader_beam, reader_len],
  reader_gold_starts/ends [B, reader_beam, max_occurrences], example_mask [B] (and
  document_ids/type_ids/mask [B, document_beam, block_len] when the document tower trains).
  """

  def __init__(self, task_name: str, *, batch_size: int, store: corpus_lib.BlockStore,
               model: open_qa.OpenQAModel, retriever: inputs.RetrieverOrProvider = None,
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
      store: the BlockStore the index embeds.
      model: the OpenQAModel (reader beam, span width, whether the document tower trains).
      retriever: an `inputs.IndexRetriever`, an `IndexWatcher` of them, or a provider; or one
        that ranks the question texts (`retrieve_texts(questions, k) -> (scores, ids)` and
        `block_emb`: `evaluation.bm25.BM25Searcher`, or `ClosedBook`, which retrieves nothing:
        rows of the question alone); or set it later with `set_retriever`.
      split: the split to train on.
      seed: the data seed (epoch e is permuted with `inputs.epoch_seed(seed, e)`).
      retriever_beam: blocks per question for the retriever loss (clipped to the store size).
      reader_len: reader row length (320).
      question_len: fixed question row length; longer questions are left out (counted).
      max_occurrences: gold-span slots per (question, block); later occurrences are dropped.
      shard_index, num_shards: this host's share (default: process index and count).
      max_examples: read only the first this many questions of the split (tests, smoke runs).
      vocab: the WordPiece vocabulary (bundled BERT uncased by default).
      few_shot: train on only this many questions of the split (Atlas's few-shot protocol:
        64, 256, ...; None: all), `few_shot_sample`'s seeded sample, drawn before the split is
        sharded over hosts, so that every host and every training seed sees the same sample.
      few_shot_seed: the sample's seed, apart from `seed` (which orders the sample's epochs).

    Raises:
      UnknownTaskError: the task is not registered.
      ValueError: bad sizes, or no question of this shard fits.
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

  def set_retriever(self, retriever: inputs.RetrieverOrProvider) -> None:
    self._retriever = retriever

  def set_query_params(self, retriever_params: Any) -> None:
    """The question tower to retrieve with from the next batch on: the live `params["retriever"]`
    (possibly sharded; see `host_local_params`)."""
    self._query_params = retriever_params

  def _current_retriever(self) -> inputs.IndexRetriever:
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
      rng = np.random.default_rng(inputs.epoch_seed(self.seed, self._epoch))
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
    question_ids, question_mask, _ = qa_batches.question_arrays(
        [e.question for e in examples], self.vocab, question_len=self.question_len)
    # [B, beam] each, best first.
    if ranks_texts(retriever):
      scores, ids = retriever.retrieve_texts([e.question for e in examples], self.beam)
    else:
      if self._query_params is not None:
        retriever.set_query_params(host_local_params(self._query_params), self.model.config)
      scores, ids = retriever.retrieve(question_ids, question_mask, k=self.beam)
    batch = self.build_batch(examples, np.asarray(ids), np.asarray(scores), retriever)
    self._batches_in_epoch += 1
    self._batches_consumed += 1
    return batch

  def build_batch(self, examples: list[QAExample], ids: np.ndarray, scores: np.ndarray,
                  retriever: Any) -> dict[str, np.ndarray]:
    """The model's batch of `examples` and their retrieved beam ([B, beam] ids and scores, best
    first) from `retriever`: `OpenQAModel`'s here (`batches.fid.FidBatches` builds the FiD
    reader's from the same retrieval)."""
    batch = qa_batches.build_open_qa_batch(
        self.store, examples, ids, scores, vocab=self.vocab,
        reader_beam=self.model.reader_beam, reader_len=self.reader_len,
        answers_are_regex=self.answers_are_regex, block_emb=retriever.block_emb,
        question_len=self.question_len, max_occurrences=self.max_occurrences,
        max_span_width=self.model.config.max_span_width,
        document_beam=self.model.num_reembedded)
    return qa_batches.model_inputs(batch)

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
    inputs.check_same_stream(state, self.state(), _MUST_MATCH)
    consumed = int(state["batches_consumed"])
    if "epoch" in state and state.get("shard_index", self.shard_index) == self.shard_index:
      epoch, in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
    else:  # another host's state: hosts step in lockstep, so locate by the count
      epoch, in_epoch = divmod(consumed, self.batches_per_epoch)
      if in_epoch == 0 and epoch:
        epoch, in_epoch = epoch - 1, self.batches_per_epoch
    self._epoch, self._batches_in_epoch, self._batches_consumed = epoch, in_epoch, consumed
    self._order = None

