"""Open-domain QA fine-tuning model (ORQA's recipe, used for REALM's numbers; REALM_SPEC
25-29).

`OpenQAModel` is the model interface of `realm_jax.models.realm` over batches built on the host
by `realm_jax.batches.qa_batches.build_open_qa_batch`: the question tower scores the retrieved
beam against the frozen index's embeddings (REALM_SPEC 25), the span reader reads the top
blocks, and the loss is ORQA's retriever plus reader `marginal_log_loss` (REALM_SPEC 28).
Optionally the document tower trains on the top of the beam, or an Atlas objective replaces
the reader's pull on the retriever. `summarize` turns summed aux values into means. What is
followed from the authors' code: docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from realm_jax.models import losses
from realm_jax.models import peft as peft_lib
from realm_jax.models import retriever_objectives
from realm_jax.models.config import RealmConfig
from realm_jax.models.reader import (RealmReader, block_attention_relevance, predict_span,
                                     span_correctness)
from realm_jax.models.realm import ParamsFromBoxedInit, dropout_rngs, init_retriever_params
from realm_jax.models.retriever_objectives import EXTRACTIVE, Target
from realm_jax.models.retriever import RealmRetriever, relevance_scores

Array = jax.Array
Params = Any
Batch = dict[str, Any]

__all__ = ["OpenQAModel", "params_from_hf_open_qa", "summarize"]

# Shapes used only to trace `init`; parameters do not depend on them.
_INIT_READER_LEN = 16


# ------------------------------------------------------------------------------ the model


def _reader_init(config: RealmConfig, rng: Array) -> Params:
  length = max(_INIT_READER_LEN, config.max_span_width)
  ids = jnp.zeros((1, 1, length), jnp.int32)
  return RealmReader(config).init(rng, ids, ids, ids, ids.astype(bool),
                                  jnp.zeros((1, 1), jnp.float32))["params"]


def params_from_hf_open_qa(params: Params) -> Params:
  """Our tree from `convert.hf.load_checkpoint(kind="open_qa")`'s {query_embedder, reader}.

  The port's RealmForOpenQA holds only the question embedder (its block embeddings are the
  frozen index, `extras["block_emb"]`), so it becomes a tied retriever: use a config with
  `share_embedders=True` (what the converter returns) and keep `train_document_tower=False`.
  """
  return {"retriever": {"embedder": params["query_embedder"]}, "reader": params["reader"]}


@dataclasses.dataclass(frozen=True)
class OpenQAModel(ParamsFromBoxedInit):
  """ORQA/REALM open-QA fine-tuning: question tower + span reader over a frozen index.

  Batch: `build_open_qa_batch`'s arrays. Parameters: `{"retriever": RealmRetriever params,
  "reader": RealmReader params}`.

  Attributes:
    config: model configuration.
    reader_beam: blocks the reader reads (5).
    train_document_tower: re-embed the first `document_beam` blocks with the live document
      tower (needs the batch's `document_*` inputs and an index builder alongside).
    document_beam: blocks re-embedded when training the document tower (None: reader_beam).
    retriever_objective: "marginal" (ORQA's losses, REALM_SPEC 28) or Atlas's "emdr2",
      "pdist", "loop", "adist" over the reader beam (`realm_jax.models.retriever_objectives`).
    objective_temperature: T of the retriever's softmax in Atlas's objectives.
    peft: None, or LoRA / adapters (`models.peft`): then only those train.
  """

  config: RealmConfig
  reader_beam: int = 5
  train_document_tower: bool = False
  document_beam: int | None = None
  retriever_objective: str = "marginal"
  objective_temperature: float = 1.0
  peft: peft_lib.PeftConfig | None = None

  def __post_init__(self):
    retriever_objectives.check_objective(self.retriever_objective, self.objective_temperature)
    if self.reader_beam < 1:
      raise ValueError(f"reader_beam must be positive, got {self.reader_beam}")
    if self.document_beam is not None and self.document_beam < 1:
      raise ValueError(f"document_beam must be positive, got {self.document_beam}")

  @property
  def objective(self) -> retriever_objectives.Objective:
    """The registered `retriever_objective`, whose declarations decide what the reader
    computes."""
    return retriever_objectives.get(self.retriever_objective)

  @property
  def num_reembedded(self) -> int:
    """Blocks per question re-embedded by the live document tower (0 when frozen)."""
    if not self.train_document_tower:
      return 0
    return self.reader_beam if self.document_beam is None else self.document_beam

  def _boxed_init(self, rng: Array) -> Params:
    retriever_rng, reader_rng = jax.random.split(rng)
    params = {"retriever": init_retriever_params(self.config, retriever_rng),
              "reader": _reader_init(self.config, reader_rng)}
    if self.peft is not None and self.peft.method == "lora":
      params[peft_lib.PEFT_KEY] = peft_lib.init_lora(
          jax.random.fold_in(rng, 1), params, self.peft, peft_lib.lora_roots(self.config))
    return params

  # -- pieces

  def embed_questions(self, params: Params, batch: Batch, rng: Array | None = None) -> Array:
    """[Q, question_len] question ids -> [Q, proj] question embeddings."""
    params = peft_lib.effective_params(params, self.peft)
    return RealmRetriever(self.config).apply(
        {"params": params["retriever"]}, batch["question_ids"], batch.get("question_type_ids"),
        batch["question_mask"], deterministic=rng is None, rngs=dropout_rngs(rng),
        method=RealmRetriever.embed_queries)

  def retrieval_scores(self, params: Params, batch: Batch, question_emb: Array,
                       rng: Array | None = None) -> Array:
    """f(x, z) for the whole retrieved beam.

    Args:
      params: model parameters.
      batch: needs `retrieved_block_emb [Q, beam, proj]` (unless the live document tower
        covers the whole beam) and, when training the document tower, `document_*`.
      question_emb: [Q, proj].
      rng: dropout rng or None.

    Returns:
      [Q, beam] float32.
    """
    params = peft_lib.effective_params(params, self.peft)
    num_live = self.num_reembedded
    stale = None
    if "retrieved_block_emb" in batch:
      # [Q, beam] the frozen index's embeddings with the live question tower (ORQA).
      stale = relevance_scores(question_emb, batch["retrieved_block_emb"])
    if not num_live:
      if stale is None:
        raise ValueError("the batch has no retrieved_block_emb: pass block_emb (the frozen "
                         "index embeddings) to build_open_qa_batch")
      return stale
    if "document_ids" not in batch:
      raise ValueError("train_document_tower=True needs document_ids/document_type_ids/"
                       "document_mask: pass document_beam to build_open_qa_batch")
    if batch["document_ids"].shape[1] != num_live:
      raise ValueError(f"the batch re-embeds {batch['document_ids'].shape[1]} blocks per "
                       f"question, the model expects document_beam={num_live}")
    # [Q, document_beam, proj] re-embedded with the live (trainable) document tower.
    live_emb = RealmRetriever(self.config).apply(
        {"params": params["retriever"]}, batch["document_ids"], batch["document_type_ids"],
        batch["document_mask"], deterministic=rng is None, rngs=dropout_rngs(rng),
        method=RealmRetriever.embed_documents)
    live = relevance_scores(question_emb, live_emb)  # [Q, document_beam]
    if stale is None:
      beam = batch["retrieved_block_ids"].shape[1] if "retrieved_block_ids" in batch else (
          batch["retriever_correct"].shape[1] if "retriever_correct" in batch else num_live)
      if beam != num_live:
        raise ValueError(f"the live document tower scores {num_live} of {beam} retrieved "
                         f"blocks; the rest need retrieved_block_emb (pass block_emb to "
                         f"build_open_qa_batch)")
      return live
    if stale.shape[1] == num_live:
      return live
    return jnp.concatenate([live, stale[:, num_live:]], axis=1)  # [Q, beam]

  def forward(self, params: Params, batch: Batch, rng: Array | None = None,
              question_emb: Array | None = None) -> tuple[Array, Array, Array, Array]:
    """(retrieval scores [Q, beam], reader logits [Q, reader_beam, spans], starts, ends)."""
    return self._forward(params, batch, rng, question_emb)[:4]

  def _forward(self, params: Params, batch: Batch, rng: Array | None = None,
               question_emb: Array | None = None, attention: bool = False) -> tuple:
    """`forward`'s four outputs and, with `attention`, the reader's attention relevance of
    each reader block [Q, reader_beam] (`Target.ATTENTION`; else None)."""
    params = peft_lib.effective_params(params, self.peft)
    question_rng, document_rng, reader_rng = (
        (None, None, None) if rng is None else jax.random.split(rng, 3))
    if question_emb is None:
      question_emb = self.embed_questions(params, batch, question_rng)  # [Q, proj]
    scores = self.retrieval_scores(params, batch, question_emb, document_rng)  # [Q, beam]
    if batch["reader_ids"].shape[1] != self.reader_beam:
      raise ValueError(f"the batch has {batch['reader_ids'].shape[1]} reader blocks per "
                       f"question, the model reader_beam={self.reader_beam}")
    reader_scores = scores[:, :self.reader_beam]
    if not self.objective.joint:
      # Atlas's objectives: the reader's loss trains the reader, not the retriever.
      reader_scores = jax.lax.stop_gradient(reader_scores)
    # [Q, reader_beam, spans]: span logits + the block's retrieval score (joint scoring).
    outputs = RealmReader(self.config).apply(
        {"params": params["reader"]}, batch["reader_ids"], batch["reader_type_ids"],
        batch["reader_mask"], batch["reader_block_mask"], reader_scores,
        deterministic=rng is None, rngs=dropout_rngs(reader_rng),
        mutable=["intermediates"] if attention else False)
    if not attention:
      return (scores, *outputs, None)
    (logits, starts, ends), state = outputs
    # The question's tokens ([CLS] question [SEP]) attending to the block.
    question = ((batch["reader_type_ids"] == 0) & (batch["reader_mask"] > 0)).astype(jnp.float32)
    relevance = block_attention_relevance(state["intermediates"], self.config.bert.num_layers,
                                          question, batch["reader_type_ids"],
                                          batch["reader_mask"])
    return scores, logits, starts, ends, jax.lax.stop_gradient(relevance)

  def _sums(self, params: Params, batch: Batch, rng: Array | None) -> tuple[Array, dict]:
    scores, logits, starts, ends, relevance = self._forward(
        params, batch, rng, attention=self.objective.target(EXTRACTIVE) is Target.ATTENTION)
    num_questions = logits.shape[0]
    example_mask = batch["example_mask"].astype(jnp.float32)  # [Q]
    retriever_correct = batch["retriever_correct"].astype(bool)  # [Q, beam]
    # [Q, reader_beam, spans]
    reader_correct = span_correctness(starts, ends, batch["reader_gold_starts"],
                                      batch["reader_gold_ends"])
    # [Q] each 0 when nothing is correct (REALM_SPEC 28).
    retriever_loss = losses.marginal_log_loss(scores, retriever_correct)
    reader_loss = losses.marginal_log_loss(logits.reshape(num_questions, -1),
                                           reader_correct.reshape(num_questions, -1))
    retriever_loss_sum = jnp.sum(retriever_loss * example_mask)
    reader_loss_sum = jnp.sum(reader_loss * example_mask)
    loss_sum = retriever_loss_sum + reader_loss_sum
    objective = {}
    if not self.objective.joint:
      objective["objective_loss_sum"] = self._objective_sum(scores, logits, reader_correct,
                                                            example_mask, relevance)
      loss_sum = loss_sum + objective["objective_loss_sum"]
    weight_sum = jnp.sum(example_mask)
    # Per-question mean; 0 (not NaN) for a batch of padding only.
    loss = jnp.where(weight_sum > 0, loss_sum / jnp.maximum(weight_sum, 1.0), 0.0)
    reader_any = jnp.any(reader_correct.reshape(num_questions, -1), axis=-1)  # [Q]
    # Whether the predicted (block, span), the global argmax, is a gold span: ORQA's in-graph
    # `exact_match` metric (token level; the official EM is computed on text by evaluate).
    best = jnp.argmax(logits.reshape(num_questions, -1), axis=-1)  # [Q]
    span_match = jnp.take_along_axis(reader_correct.reshape(num_questions, -1), best[:, None],
                                     axis=-1)[:, 0]  # [Q]
    return loss, {
        "loss_sum": loss_sum,
        "weight_sum": weight_sum,
        "retriever_loss_sum": retriever_loss_sum,
        "reader_loss_sum": reader_loss_sum,
        "retriever_any_correct_sum": jnp.sum(jnp.any(retriever_correct, -1) * example_mask),
        "reader_any_correct_sum": jnp.sum(reader_any * example_mask),
        "span_match_sum": jnp.sum(span_match * example_mask),
        **objective,
    }

  def _objective_sum(self, scores: Array, logits: Array, reader_correct: Array,
                     example_mask: Array, relevance: Array | None) -> Array:
    """The summed loss of Atlas's objective over the reader beam (retriever_objectives): the
    block likelihoods are the reader's gold-span probabilities within each block (-inf without
    a gold span), "adist" the question tokens' attention on each block (design notes).

    Args:
      scores: [Q, beam] retrieval scores.
      logits: [Q, reader_beam, spans] joint logits.
      reader_correct: [Q, reader_beam, spans] bool.
      example_mask: [Q] float, 0 for padding questions.
      relevance: [Q, reader_beam] ("adist") or None.

    Returns:
      scalar float32, summed over questions (the per-question mean divides by weight_sum).
    """
    block_correct = jnp.any(reader_correct, axis=-1)  # [Q, reader_beam]
    weights = example_mask
    if relevance is None:
      # -log of the block's gold spans' share of its spans; 0 where it has none, replaced.
      block_nll = losses.marginal_log_loss(logits, reader_correct)  # [Q, reader_beam]
      values = jnp.where(block_correct, -block_nll, -jnp.inf)
    else:
      values = relevance
      weights = weights * jnp.any(block_correct, axis=-1).astype(jnp.float32)
    _, aux = self.objective.loss(EXTRACTIVE, scores[:, :self.reader_beam], values, weights,
                                 temperature=self.objective_temperature)
    return aux["loss_sum"]

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    """(mean per-question retriever + reader loss, summed aux) with dropout."""
    return self._sums(params, batch, rng)

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    """Summed aux values, deterministic."""
    return self._sums(params, batch, None)[1]

  def summarize(self, aux: dict) -> dict[str, Array]:
    """The train step's means (the trainer asks the model for them): `summarize` below."""
    return summarize(aux)

  def predict_batch(self, params: Params, batch: Batch) -> dict[str, Array]:
    """The best (block, span) per question by a global argmax (REALM_SPEC 29).

    If the batch holds `question_emb [Q, proj]` (e.g. the embeddings the searcher was queried
    with), it is used instead of running the question tower again.

    Returns:
      block_index [Q] (among the reader's blocks), start, end [Q] (reader-input positions,
      end inclusive), logit [Q] (the joint logit of the answer), block_id [Q] (the store row
      of the answer's block), retrieval_scores [Q, beam] and retrieved_block_ids [Q, beam].
      `answer_texts` maps the spans back to the original text.
    """
    scores, logits, starts, ends = self.forward(params, batch, None, batch.get("question_emb"))
    num_questions = logits.shape[0]
    block, start, end = predict_span(logits, starts, ends)  # [Q] each
    best_logit = jnp.max(logits.reshape(num_questions, -1), axis=-1)  # [Q]
    retrieved = jnp.asarray(batch["retrieved_block_ids"])  # [Q, beam]
    block_id = jnp.take_along_axis(retrieved, block[:, None], axis=1)[:, 0]
    return {"block_index": block, "start": start, "end": end, "logit": best_logit,
            "block_id": block_id, "retrieval_scores": scores, "retrieved_block_ids": retrieved}


def summarize(aux: dict) -> dict[str, Array]:
  """Means from summed aux values (after summing over devices/microbatches)."""
  den = aux["weight_sum"]

  def per_question(name: str) -> Array:
    return jnp.where(den > 0, aux[name] / jnp.maximum(den, 1e-12), 0.0)

  out = {"loss": per_question("loss_sum"),
         "retriever_loss": per_question("retriever_loss_sum"),
         "reader_loss": per_question("reader_loss_sum"),
         "retriever_any_correct": per_question("retriever_any_correct_sum"),
         "reader_any_correct": per_question("reader_any_correct_sum")}
  if "span_match_sum" in aux:
    out["span_exact_match"] = per_question("span_match_sum")
  if "objective_loss_sum" in aux:
    out["retriever_objective"] = per_question("objective_loss_sum")
  return out
