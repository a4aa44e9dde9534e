"""Generative open-QA fine-tuning with the Fusion-in-Decoder reader (`models.fid`): the
`FinetuneJob(reader='fid')` model, Atlas's reader (Izacard et al. 2022) over this project's
retrieval.

`FidReaderModel` is the trainer's model interface over `batches.fid.build_fid_batch`'s batches:
the question tower searches the frozen index, the reader reads the first K blocks and trains on
one answer per question (teacher-forced token cross entropy); prediction decodes greedily. A
`retriever_objective` (Atlas's query-side fine-tuning) also trains the question tower,
`train_document_tower` the document tower over a re-ranked beam; `closed_book` reads the
question alone. Design notes: docs/design/models_and_jobs.md, docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from realm_jax import fileio
from realm_jax.data import vocab as vocab_lib
from realm_jax.models import fid as fid_lib
from realm_jax.models import losses
from realm_jax.models import retriever_objectives
from realm_jax.models.config import BertConfig, RealmConfig
from realm_jax.models.realm import ParamsFromBoxedInit, dropout_rngs, init_retriever_params
from realm_jax.models.retriever import RealmRetriever, relevance_scores
from realm_jax.models.retriever_objectives import FID, Target

Array = jax.Array
Params = Any
Batch = dict[str, Any]

__all__ = ["FID_CONFIG_FILE", "RETRIEVAL_SETTINGS", "FidReaderModel",
           "check_objective", "detokenize", "fid_config_from_dict", "fid_config_to_dict",
           "read_fid_config", "read_retrieval_settings", "retrieval_settings", "summarize",
           "trainable_mask", "write_fid_config"]

FID_CONFIG_FILE = "fid_config.json"

# The basic tokenizer split punctuation off words ("o ' brien", "3 . 5"); glued back as HF's
# `clean_up_tokenization` does, plus inside-word hyphens and numbers (design notes).
_CLEANUPS = ((re.compile(r"(\d) \. (\d)"), r"\1.\2"), (re.compile(r"(\d) , (\d{3})\b"), r"\1,\2"),
             (re.compile(r" ([.,!?;:%)\]])"), r"\1"), (re.compile(r"([(\[$]) "), r"\1"),
             (re.compile(r" ' "), "'"), (re.compile(r" (n't|'s|'m|'re|'ve|'ll|'d)\b"), r"\1"),
             (re.compile(r"(\w) ([-/]) (\w)"), r"\1\2\3"))


def detokenize(ids: Sequence[int], vocab: vocab_lib.WordPieceVocabulary, *,
               eos_id: int = vocab_lib.SEP_ID) -> str:
  """Generated wordpiece ids -> answer text: cut at the first EOS, [PAD] and [CLS] dropped,
  `##` continuations glued (`WordPieceVocabulary.decode`), then the spaces the basic tokenizer
  put around punctuation removed where the original text had none (`_CLEANUPS`)."""
  ids = [int(i) for i in ids]
  if eos_id in ids:
    ids = ids[:ids.index(eos_id)]
  text = vocab.decode([i for i in ids if i not in (vocab_lib.PAD_ID, vocab_lib.CLS_ID)])
  for pattern, replacement in _CLEANUPS:
    text = pattern.sub(replacement, text)
  return text.strip()


def check_objective(objective: str, temperature: float) -> retriever_objectives.Objective:
  """The registered `objective` if the FiD reader serves it (`retriever_objectives.names(FID)`)
  with a valid `objective_temperature`; else a one-line ValueError."""
  return retriever_objectives.check_objective(objective, temperature, reader=FID)


def trainable_mask(params: Params, train_question_tower: bool = False,
                   train_document_tower: bool = False) -> Params:
  """The optimizer's `trainable`: the FiD reader trains; of the retriever only the question
  tower, and only with `train_question_tower`; the untied document tower (whose embeddings the
  frozen index holds) only with `train_document_tower`."""

  def trains(path, _) -> bool:
    if path[0].key != "retriever":
      return True
    if path[1].key == "document_embedder":
      return train_document_tower
    return train_question_tower

  return jax.tree_util.tree_map_with_path(trains, params)


# ------------------------------------------------------------------ the FidConfig on disk


def fid_config_to_dict(config: fid_lib.FidConfig) -> dict:
  """The FidConfig as JSON-able settings; the encoder's BertConfig included (`bert`)."""
  return dataclasses.asdict(config)


def fid_config_from_dict(settings: dict, bert: BertConfig | None = None) -> fid_lib.FidConfig:
  """The FidConfig of `fid_config_to_dict`; `bert` (e.g. the checkpoint's model config's)
  replaces the stored encoder config when given."""
  settings = dict(settings)
  stored = settings.pop("bert", None)
  if bert is None:
    if stored is None:
      raise ValueError("the FiD settings hold no encoder config ('bert') and none was given")
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    bert = BertConfig(**{k: (tuple(v) if isinstance(v, list) else v)
                         for k, v in stored.items() if k in fields})
  return fid_lib.FidConfig(bert=bert, **settings)


def write_fid_config(run_dir: str, config: fid_lib.FidConfig, **extra: Any) -> str:
  """`<run_dir>/fid_config.json` (atomically): the reader's FidConfig and `extra` settings."""
  path = os.path.join(run_dir, FID_CONFIG_FILE)
  fileio.write_json_atomically(path, {"fid": fid_config_to_dict(config), **extra})
  return path


def _written(run_dir: str) -> dict:
  """`<run_dir>/fid_config.json` as `write_fid_config` wrote it; FileNotFoundError without one."""
  with open(os.path.join(run_dir, FID_CONFIG_FILE), encoding="utf-8") as f:
    return json.load(f)


def read_fid_config(run_dir: str, bert: BertConfig | None = None) -> fid_lib.FidConfig:
  """The FidConfig a `reader='fid'` fine-tuning run wrote; FileNotFoundError without one."""
  return fid_config_from_dict(_written(run_dir)["fid"], bert)


# The FidReaderModel fields that decide how a run's reader retrieves (`retrieval_settings`).
RETRIEVAL_SETTINGS = ("retriever_objective", "objective_temperature", "train_document_tower",
                      "document_beam")


def retrieval_settings(model: "FidReaderModel") -> dict:
  """The model's `RETRIEVAL_SETTINGS`, written to fid_config.json beside the FidConfig so that
  an evaluation retrieves as the run did (a trained document tower re-ranks its beam)."""
  return {name: getattr(model, name) for name in RETRIEVAL_SETTINGS}


def read_retrieval_settings(run_dir: str) -> dict:
  """The `retrieval_settings` a run wrote to its fid_config.json ({} for a file written
  without them: a run whose document tower did not train)."""
  written = _written(run_dir)
  return {name: written[name] for name in RETRIEVAL_SETTINGS if name in written}


# ------------------------------------------------------------------------------ the model


@dataclasses.dataclass(frozen=True)
class FidReaderModel(ParamsFromBoxedInit):
  """Question tower + FiD reader over a frozen index (module docstring).

  Batch (`batches.fid.build_fid_batch`): reader_ids, reader_type_ids, reader_mask
  [Q, reader_beam, reader_len]; answer_targets, answer_mask [Q, T]; retriever_correct [Q, beam];
  example_mask [Q]; with an objective also question_ids, question_type_ids, question_mask
  [Q, question_len] and retrieved_block_emb [Q, >= scored_beam, proj].

  Attributes:
    config: the run's RealmConfig (the question tower's). fid: the reader's FidConfig.
    reader_beam: blocks the reader reads (K).
    retriever_objective: "none", "adist", "emdr2", "pdist", "loop" or the control
      "answer_blocks" (`retriever_objectives.names(FID)`); objective_temperature: its T.
    closed_book: no retrieval: the question alone in one row, no retriever parameters.
    train_document_tower: the objective trains the document tower too (re-embedded in graph).
    document_beam: L blocks of the index's beam re-ranked by the live document tower; or None.
    objective_beam: "answer_blocks" scores this many blocks of the beam (>= K); None: the K read.
    targets_in_read_blocks: with `objective_beam`, only the K read blocks can be targets.
  """

  config: RealmConfig
  fid: fid_lib.FidConfig
  reader_beam: int = 5
  retriever_objective: str = "none"
  objective_temperature: float = 1.0
  closed_book: bool = False
  train_document_tower: bool = False
  document_beam: int | None = None
  objective_beam: int | None = None
  targets_in_read_blocks: bool = False

  # What the batch source and the predictor ask every open-QA model.
  generative = True
  # What `predict_batch` reads (the predictor passes only these: the other arrays of a
  # `build_open_qa_batch` change width from batch to batch, which would recompile the decoding).
  prediction_keys = ("reader_ids", "reader_type_ids", "reader_mask", "retrieved_block_ids",
                     "retrieved_block_emb", "question_emb")

  def __post_init__(self):
    if self.reader_beam < 1:
      raise ValueError(f"reader_beam must be positive, got {self.reader_beam}")
    objective = check_objective(self.retriever_objective, self.objective_temperature)
    if self.closed_book and (self.reader_beam != 1 or objective.trains_retriever):
      raise ValueError(f"the closed-book reader reads one row per question (the question alone) "
                       f"and has no retriever: reader_beam={self.reader_beam} and "
                       f"retriever_objective={self.retriever_objective!r} must be 1 and 'none'")
    if self.train_document_tower and not objective.trains_retriever:
      raise ValueError("train_document_tower=True with retriever_objective='none': nothing "
                       "trains the document tower (the FiD loss has no path to the retrieval "
                       "scores); choose 'adist', 'emdr2', 'pdist' or 'loop'")
    if self.document_beam is not None and not self.train_document_tower:
      raise ValueError(f"document_beam={self.document_beam} re-ranks with the live document "
                       f"tower: set train_document_tower=True (with the tower frozen the "
                       f"index's ranking is already exact)")
    target = objective.target(FID)
    if self.objective_beam is not None and (target is None or target.needs_reader
                                            or self.train_document_tower):
      raise ValueError(f"objective_beam={self.objective_beam} scores blocks the reader does "
                       f"not read: only retriever_objective='answer_blocks' has targets there "
                       f"(its target needs no reader), with the document tower frozen")
    if self.targets_in_read_blocks and (self.objective_beam or 0) <= self.reader_beam:
      raise ValueError(f"targets_in_read_blocks=True leaves the blocks beyond the K read as "
                       f"negatives: set objective_beam above reader_beam={self.reader_beam} "
                       f"(got {self.objective_beam})")
    # Both widen what the reader reads: the first of the beam, then more of it.
    for name, verb in (("document_beam", "re-ranks"), ("objective_beam", "scores")):
      beam = getattr(self, name)
      if beam is not None and beam < self.reader_beam:
        raise ValueError(f"{name}={beam} {verb} fewer blocks than the reader reads "
                         f"(reader_beam={self.reader_beam})")

  @property
  def objective(self) -> retriever_objectives.Objective:
    """The registered `retriever_objective`, whose declarations decide what the reader
    computes (`objective.target(FID)`)."""
    return retriever_objectives.get(self.retriever_objective)

  @property
  def train_question_tower(self) -> bool:
    """Whether a retriever objective trains the question tower (and the batches carry its
    inputs: `batches.fid.QUESTION_TOWER_KEYS`)."""
    return self.objective.trains_retriever

  @property
  def num_reembedded(self) -> int:
    """Blocks per question the batches carry document-tower inputs for (`document_ids`...
    [Q, K, block_len]): the K read blocks when the document tower trains, else 0."""
    return self.reader_beam if self.train_document_tower else 0

  @property
  def scored_beam(self) -> int:
    """The blocks per question the objective scores, the first of the beam: `objective_beam`,
    else the K read (the batches' `retrieved_block_emb` [Q, scored_beam, proj])."""
    return self.objective_beam or self.reader_beam

  @property
  def rerank_depth(self) -> int:
    """L, the blocks of the index's beam re-ranked with the live document tower before reading
    (`index.rerank`; the batches' and the predictor's); 0: none."""
    return self.document_beam or 0

  def _boxed_init(self, rng: Array) -> Params:
    retriever_rng, fid_rng = jax.random.split(rng)  # closed book: the same FiD init
    fid = {"fid": fid_lib.init_params(self.fid, fid_rng)}
    if self.closed_book:
      return fid
    return {"retriever": init_retriever_params(self.config, retriever_rng), **fid}

  def _check_rows(self, batch: Batch) -> None:
    if batch["reader_ids"].shape[1] != self.reader_beam:
      raise ValueError(f"the batch has {batch['reader_ids'].shape[1]} reader blocks per "
                       f"question, the model reader_beam={self.reader_beam}")

  def logits(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """Teacher-forced answer logits [Q, T, V] of the batch's targets."""
    return self._reader_pass(params["fid"], batch, rng)[0]

  def _reader_pass(self, fid_params: Params, batch: Batch, rng: Array | None
                   ) -> tuple[Array, fid_lib.Cross, Array, Array | None]:
    """The teacher-forced pass (dropout with `rng`).

    Returns:
      (logits [Q, T, V]; the memory as the decoder reads it (`fid.Cross`: per decoder layer
      the cross-attention's (keys, values) [Q, K L, heads, kv], and the copy head's) and the
      memory mask bool [Q, K L], for the objectives' decodes;
      with an objective of `Target.ATTENTION`, the passages' attention scores [Q, K] held
      fixed (else None)).
    """
    self._check_rows(batch)
    decoder_input_ids = fid_lib.shift_right(batch["answer_targets"], self.fid.bos_id)
    sow = self.objective.target(FID) is Target.ATTENTION  # the cross-attention maps
    outputs = fid_lib.FidModel(self.fid).apply(
        {"params": fid_params}, batch["reader_ids"], batch["reader_mask"], decoder_input_ids,
        batch["reader_type_ids"], deterministic=rng is None, rngs=dropout_rngs(rng),
        mutable=["intermediates"] if sow else False, method=fid_lib.FidModel.teacher_forced)
    if not sow:
      return (*outputs, None)
    (logits, cross, memory_mask), state = outputs
    probs, norms = fid_lib.cross_attention_maps(state["intermediates"])
    # [Q, K]: Atlas's a_k from the decoder's cross-attention on the answer's tokens.
    attention = fid_lib.passage_attention_scores(probs, norms, batch["answer_mask"],
                                                 batch["reader_mask"])
    return logits, cross, memory_mask, jax.lax.stop_gradient(attention)

  def _targets(self, fid_params: Params, batch: Batch, cross: fid_lib.Cross,
               memory_mask: Array, attention: Array | None) -> Array:
    """What the objective distils per read block [Q, K], held fixed (its `Target`): attention
    scores (adist), `log p(y | z_k, x)` (emdr2, pdist), `log p(y | Z \\ z_k, x)` (loop), or 0 /
    -inf for a block holding an answer or not (answer_blocks)."""
    target = self.objective.target(FID)
    if target is Target.ATTENTION:
      return attention
    if target is Target.ANSWER_BLOCKS:
      holds_answer = batch["retriever_correct"][:, :self.scored_beam] > 0  # [Q, L]
      if self.targets_in_read_blocks:  # the blocks beyond the K read: negatives only
        holds_answer &= (jnp.arange(self.scored_beam) < self.reader_beam)[None, :]
      return jnp.where(holds_answer, 0.0, -jnp.inf)
    fixed = jax.lax.stop_gradient
    decodes = (fid_lib.left_out_log_likelihoods if target is Target.LEFT_OUT_LIKELIHOODS
               else fid_lib.passage_log_likelihoods)
    return fixed(decodes(fixed(fid_params), self.fid, fixed(cross), memory_mask,
                         self.reader_beam, batch["answer_targets"], batch["answer_mask"]))

  def objective_targets(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """The objective's targets [Q, K] of a batch (as `loss_fn` computes them; deterministic
    without `rng`)."""
    if not self.train_question_tower:
      raise ValueError(f"retriever_objective={self.retriever_objective!r} has no targets")
    _, cross, memory_mask, attention = self._reader_pass(params["fid"], batch, rng)
    return self._targets(params["fid"], batch, cross, memory_mask, attention)

  def retrieval_scores(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """`s_k = q . d_k` [Q, scored_beam] of the live question tower against the frozen index's
    block embeddings (the gradient reaches the question tower only), or with
    `train_document_tower` against the live document tower's (it reaches both)."""
    question_emb = self.embed_questions(params, batch, rng)  # [Q, proj]
    if not self.train_document_tower:  # [Q, scored_beam]
      return relevance_scores(question_emb, batch["retrieved_block_emb"][:, :self.scored_beam])
    if batch["document_ids"].shape[1] != self.reader_beam:
      raise ValueError(f"the batch carries {batch['document_ids'].shape[1]} blocks per question "
                       f"for the document tower, the model reads reader_beam="
                       f"{self.reader_beam}")
    document_rng = None if rng is None else jax.random.fold_in(rng, 2)
    block_emb = RealmRetriever(self.config).apply(  # [Q, K, proj] the live document tower's
        {"params": params["retriever"]}, batch["document_ids"], batch["document_type_ids"],
        batch["document_mask"], deterministic=document_rng is None,
        rngs=dropout_rngs(document_rng), method=RealmRetriever.embed_documents)
    return relevance_scores(question_emb, block_emb)

  def _objective_sums(self, params: Params, batch: Batch, rng: Array | None, targets: Array,
                      weights: Array) -> dict:
    """The objective's summed loss (rows weighted by their counted answer tokens) and the counts
    of answered questions whose retriever's top block is the target's, and whose target's
    preferred block and retriever's top block hold an answer."""
    scores = self.retrieval_scores(params, batch, rng)  # [Q, scored_beam]
    question_weights = jnp.sum(weights, axis=-1)  # [Q] counted tokens, 0 for padding
    _, aux = self.objective.loss(FID, scores, targets, question_weights,
                                 temperature=self.objective_temperature)
    # LOOP's target prefers the block whose absence hurts most: the lowest left-out likelihood.
    preferred = -targets if self.objective.target(FID).lower_is_preferred else targets
    target_top = jnp.argmax(preferred, axis=-1)  # [Q]
    retriever_top = jnp.argmax(scores, axis=-1)  # [Q]
    answered = question_weights > 0  # [Q]
    holds_answer = batch["retriever_correct"][:, :self.scored_beam] > 0  # [Q, scored_beam]

    def count(flags: Array) -> Array:
      return jnp.sum(flags.astype(jnp.float32))

    def top_holds_answer(top: Array) -> Array:  # [Q] -> [Q]
      return jnp.take_along_axis(holds_answer, top[:, None], axis=-1)[:, 0] & answered

    return {"objective_loss_sum": aux["loss_sum"],
            "retriever_agreement_sum": count((retriever_top == target_top) & answered),
            "target_top_answer_sum": count(top_holds_answer(target_top)),
            "retriever_top_answer_sum": count(top_holds_answer(retriever_top))}

  def _sums(self, params: Params, batch: Batch, rng: Array | None) -> tuple[Array, dict]:
    logits, cross, memory_mask, attention = self._reader_pass(params["fid"], batch, rng)
    example_mask = batch["example_mask"].astype(jnp.float32)  # [Q]
    weights = batch["answer_mask"].astype(jnp.float32) * example_mask[:, None]  # [Q, T]
    loss, aux = fid_lib.answer_loss(logits, batch["answer_targets"], weights)
    # [Q, T] teacher-forced argmax = target: token accuracy, and whole answers right.
    hit = (jnp.argmax(logits, axis=-1) == batch["answer_targets"]).astype(jnp.float32)
    answered = jnp.any(weights > 0, axis=-1)  # [Q] a target to train on
    answer_hit = jnp.all((hit > 0) | (weights == 0), axis=-1) & answered
    retriever_correct = batch["retriever_correct"].astype(bool)  # [Q, beam]
    sums = {
        "loss_sum": aux["loss_sum"],
        "weight_sum": aux["weight_sum"],
        "token_correct_sum": jnp.sum(hit * weights),
        "answer_correct_sum": jnp.sum(answer_hit.astype(jnp.float32) * example_mask),
        "answered_sum": jnp.sum(answered.astype(jnp.float32) * example_mask),
        "example_sum": jnp.sum(example_mask),
        "retriever_any_correct_sum": jnp.sum(jnp.any(retriever_correct, -1) * example_mask),
        "reader_any_correct_sum": jnp.sum(
            jnp.any(retriever_correct[:, :self.reader_beam], -1) * example_mask),
    }
    if not self.train_question_tower:
      return loss, sums
    targets = self._targets(params["fid"], batch, cross, memory_mask, attention)  # [Q, K]
    # The question tower's dropout apart from the reader's, whose pass stays the one of "none".
    question_rng = None if rng is None else jax.random.fold_in(rng, 1)
    objective = self._objective_sums(params, batch, question_rng, targets, weights)
    sums.update(objective, answer_loss_sum=sums["loss_sum"],
                loss_sum=sums["loss_sum"] + objective["objective_loss_sum"])
    loss = losses._safe_divide(  # pylint: disable=protected-access
        sums["loss_sum"], sums["weight_sum"])
    return loss, sums

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    """(mean answer-token cross entropy, plus the objective's token-weighted mean, summed aux)
    with dropout."""
    return self._sums(params, batch, rng)

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    """Summed aux values, deterministic."""
    return self._sums(params, batch, None)[1]

  def summarize(self, aux: dict) -> dict[str, Array]:
    return summarize(aux)

  # -- prediction (`evaluation.qa.Predictor`)

  def embed_questions(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """[Q, question_len] question ids -> [Q, proj] question embeddings (the search's)."""
    if self.closed_book:
      raise ValueError("the closed-book reader has no question tower: nothing to embed")
    return RealmRetriever(self.config).apply(
        {"params": params["retriever"]}, batch["question_ids"], batch.get("question_type_ids"),
        batch["question_mask"], deterministic=rng is None, rngs=dropout_rngs(rng),
        method=RealmRetriever.embed_queries)

  def predict_batch(self, params: Params, batch: Batch) -> dict[str, Array]:
    """Greedy answers of the reader over the batch's reader rows.

    Returns:
      answer_tokens int32 [Q, max_answer_length] (answer, EOS, pad), logit [Q] (its
      log-probability), block_index / block_id [Q] (-1: FiD reads the K blocks together),
      retrieval_scores [Q, beam] (zeros for the closed book) and retrieved_block_ids [Q, beam].
    """
    self._check_rows(batch)
    cfg = self.fid
    tokens = fid_lib.greedy_decode(params["fid"], cfg, batch["reader_ids"],
                                   batch["reader_mask"], cfg.max_answer_length,
                                   batch["reader_type_ids"])  # [Q, T]
    logits = fid_lib.FidModel(cfg).apply(
        {"params": params["fid"]}, batch["reader_ids"], batch["reader_mask"],
        fid_lib.shift_right(tokens, cfg.bos_id), batch["reader_type_ids"])
    log_prob = fid_lib.sequence_log_probs(logits, tokens, cfg.eos_id)  # [Q]
    retrieved = jnp.asarray(batch["retrieved_block_ids"])  # [Q, beam]
    scores = jnp.zeros(retrieved.shape, jnp.float32)
    if "retrieved_block_emb" in batch and not self.closed_book:
      question_emb = batch.get("question_emb")
      if question_emb is None:
        question_emb = self.embed_questions(params, batch)
      scores = relevance_scores(question_emb, batch["retrieved_block_emb"])
    none = jnp.full(tokens.shape[:1], -1, jnp.int32)
    return {"answer_tokens": tokens, "logit": log_prob, "block_index": none, "block_id": none,
            "retrieval_scores": scores, "retrieved_block_ids": retrieved}

  def answer_texts(self, store, batch: Batch, predictions: dict,
                   vocab: vocab_lib.WordPieceVocabulary | None = None) -> list[str]:
    """The generated answers as text (`detokenize`); `store` and `batch` are not read (the
    extractive reader's signature)."""
    del store, batch
    vocab = vocab or vocab_lib.default_vocabulary()
    return [detokenize(row, vocab, eos_id=self.fid.eos_id)
            for row in np.asarray(predictions["answer_tokens"])]


def summarize(aux: dict) -> dict[str, Array]:
  """Means from summed aux values: per counted answer token (loss, token accuracy) and per
  question (answer accuracy, answerable, recall); with a retriever objective also its two loss
  terms and the agreement and top-block-answer shares (docs/design/models_and_jobs.md)."""

  def ratio(numerator: str, denominator: str) -> Array:
    den = aux[denominator]
    return jnp.where(den > 0, aux[numerator] / jnp.maximum(den, 1e-12), 0.0)

  out = {"loss": ratio("loss_sum", "weight_sum"),
         "token_accuracy": ratio("token_correct_sum", "weight_sum"),
         "answer_accuracy": ratio("answer_correct_sum", "answered_sum"),
         "answerable": ratio("answered_sum", "example_sum"),
         "retriever_any_correct": ratio("retriever_any_correct_sum", "example_sum"),
         "reader_any_correct": ratio("reader_any_correct_sum", "example_sum")}
  if "objective_loss_sum" in aux:
    out.update(answer_loss=ratio("answer_loss_sum", "weight_sum"),
               retriever_objective=ratio("objective_loss_sum", "weight_sum"),
               retriever_agreement=ratio("retriever_agreement_sum", "answered_sum"),
               target_top_answer=ratio("target_top_answer_sum", "answered_sum"),
               retriever_top_answer=ratio("retriever_top_answer_sum", "answered_sum"))
  return out
