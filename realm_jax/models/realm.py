"""The models the trainer runs: a BERT-style encoder warm start, ICT and REALM pretraining.

Each is a small frozen dataclass with the trainer's interface (t5x's BaseModel in spirit):
`init(rng)`, `logical_axes()`, `loss_fn(params, batch, rng) -> (loss, aux)` and `eval_fn`. `aux`
carries sums and their weights, never means, so devices and microbatches add up exactly.
Parameter trees: `{"encoder"}` for MLM, `{"retriever"}` for ICT and both for pretraining, so
each warm start copies one subtree. Design notes: docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from realm_jax.models import losses
from realm_jax.models import retriever_objectives
from realm_jax.models.config import RealmConfig
from realm_jax.models.retriever_objectives import EXTRACTIVE, Target
from realm_jax.models.reader import RealmKnowledgeAugEncoder, block_attention_relevance
from realm_jax.models.retriever import RealmRetriever

Array = jax.Array
Params = Any
Batch = dict[str, Array]

# IctModel's in-batch scores: the dot products (ICT) or the cosines (Contriever's form).
ICT_SIMILARITIES = ("dot", "cosine")
# Shapes used only to trace `init`; parameters do not depend on them.
_INIT_QUERY_LEN = 8
_INIT_BLOCK_LEN = 8


def dropout_rngs(rng: Array | None) -> dict:
  """The `rngs` argument of `apply`: dropout on with a key, off (eval) without."""
  return {} if rng is None else {"dropout": rng}


def init_retriever_params(config: RealmConfig, rng: Array) -> Params:
  """Boxed (logically partitioned) RealmRetriever parameters."""
  query = jnp.zeros((1, _INIT_QUERY_LEN), jnp.int32)
  blocks = jnp.zeros((1, 1, _INIT_BLOCK_LEN), jnp.int32)
  return RealmRetriever(config).init(rng, query, query, query, blocks, blocks, blocks)["params"]


def init_encoder_params(config: RealmConfig, rng: Array) -> Params:
  """Boxed (logically partitioned) RealmKnowledgeAugEncoder parameters."""
  reader = jnp.zeros((1, 1, _INIT_QUERY_LEN + _INIT_BLOCK_LEN), jnp.int32)
  positions = jnp.zeros((1, 1), jnp.int32)
  return RealmKnowledgeAugEncoder(config).init(rng, reader, reader, reader, positions)["params"]


class ParamsFromBoxedInit:
  """`init` and `logical_axes` of a model, both derived from the `_boxed_init(rng)` it defines
  (its logically partitioned parameter tree): one source for the parameters and their sharding."""

  def init(self, rng: Array) -> Params:
    """Plain (unboxed) parameters."""
    return nn.unbox(self._boxed_init(rng))

  def logical_axes(self) -> Params:
    """Logical axis names per parameter (PartitionSpecs), traced without allocating."""
    return nn.get_partition_spec(jax.eval_shape(self._boxed_init, jax.random.PRNGKey(0)))


@dataclasses.dataclass(frozen=True)
class BertMlmModel(ParamsFromBoxedInit):
  """Masked language modelling of single sequences with the knowledge-augmented encoder.

  A stand-in for BERT where there is none (the toy world; REALM starts its encoder and
  retriever from BERT): the `mlm_<corpus>` tasks, a block sentence with a salient span masked
  read next to its own block. The encoder is the pretraining one, read with one "candidate", so
  its parameters carry over to REALM pretraining unchanged.

  Batch: input_ids, type_ids, input_mask [B, L]; mlm_positions, mlm_targets, mlm_weights [B, M].
  """

  config: RealmConfig

  def _boxed_init(self, rng: Array) -> Params:
    return {"encoder": init_encoder_params(self.config, rng)}

  def _sums(self, params: Params, batch: Batch, rng: Array | None) -> dict:
    # [B, 1, M, V]: one "candidate" per example.
    logits = RealmKnowledgeAugEncoder(self.config).apply(
        {"params": params["encoder"]}, batch["input_ids"][:, None], batch["type_ids"][:, None],
        batch["input_mask"][:, None], batch["mlm_positions"], deterministic=rng is None,
        rngs=dropout_rngs(rng))
    # REALM's marginal over a single candidate is plain masked LM: the same loss and accuracy
    # code as pretraining, with one score (its prior is 1).
    scores = jnp.zeros(logits.shape[:2], jnp.float32)  # [B, 1]
    weights = batch["mlm_weights"].astype(jnp.float32)
    _, aux = losses.marginal_mlm_loss(
        scores, losses.mlm_token_log_probs(logits, batch["mlm_targets"]), weights)
    correct = losses.mlm_accuracy_sums(scores, logits, batch["mlm_targets"], weights,
                                       null_index=None)
    return {"loss_sum": aux["loss_sum"], "weight_sum": aux["weight_sum"],
            "accuracy_sum": correct["mlm_correct_sum"]}

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    aux = self._sums(params, batch, rng)
    return aux["loss_sum"] / jnp.maximum(aux["weight_sum"], 1.0), aux

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    return self._sums(params, batch, None)


@dataclasses.dataclass(frozen=True)
class IctModel(ParamsFromBoxedInit):
  """Inverse Cloze Task (REALM_SPEC 14): a sentence must find its own block, a softmax over
  every block of the global batch (the `contriever_<corpus>` tasks have the same batch).

  Batch (from the `ict_<corpus>` tasks): query_ids, query_mask [B, 64]; block_ids,
  block_type_ids, block_mask [B, 288].

  Attributes:
    config: model configuration.
    similarity: "dot", the retriever's own score (ICT, REALM), or "cosine" (Contriever's).
    temperature: the scores are divided by it (1.0: ICT; Contriever: cosine over 0.05).
  """

  config: RealmConfig
  similarity: str = "dot"
  temperature: float = 1.0

  def __post_init__(self):
    if self.similarity not in ICT_SIMILARITIES:
      raise ValueError(f"IctModel: similarity={self.similarity!r} is not one of "
                       f"{', '.join(ICT_SIMILARITIES)}")
    if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
        or not self.temperature > 0):
      raise ValueError(f"IctModel: temperature={self.temperature!r}: expected a number > 0")

  def _boxed_init(self, rng: Array) -> Params:
    return {"retriever": init_retriever_params(self.config, rng)}

  def _in_batch_loss(self, query_emb: Array, block_emb: Array) -> tuple[Array, dict]:
    """`losses.in_batch_softmax_loss` over the scores `similarity` / `temperature` (the
    defaults: the plain dot products, nothing added)."""
    if self.similarity == "cosine":
      normalize = lambda x: x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True),
                                                          1e-12))
      query_emb = normalize(query_emb.astype(jnp.float32))
      block_emb = normalize(block_emb.astype(jnp.float32))
    if self.temperature != 1.0:
      # (q / T) . b = (q . b) / T
      query_emb = query_emb.astype(jnp.float32) / self.temperature
    return losses.in_batch_softmax_loss(query_emb, block_emb)

  def _embed(self, params: Params, batch: Batch, rng: Array | None) -> tuple[Array, Array]:
    retriever = RealmRetriever(self.config)
    variables = {"params": params["retriever"]}
    deterministic = rng is None
    query_rng, block_rng = (None, None) if rng is None else jax.random.split(rng)
    # [B, proj]
    query_emb = retriever.apply(
        variables, batch["query_ids"], jnp.zeros_like(batch["query_ids"]), batch["query_mask"],
        deterministic=deterministic, rngs=dropout_rngs(query_rng),
        method=RealmRetriever.embed_queries)
    # [B, proj]
    block_emb = retriever.apply(
        variables, batch["block_ids"], batch["block_type_ids"], batch["block_mask"],
        deterministic=deterministic, rngs=dropout_rngs(block_rng),
        method=RealmRetriever.embed_documents)
    return query_emb, block_emb

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    query_emb, block_emb = self._embed(params, batch, rng)
    loss, aux = self._in_batch_loss(query_emb, block_emb)
    return loss, {"loss_sum": aux["loss_sum"], "weight_sum": aux["weight_sum"],
                  "accuracy_sum": aux["accuracy_sum"]}

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    query_emb, block_emb = self._embed(params, batch, None)
    _, aux = self._in_batch_loss(query_emb, block_emb)
    return {"loss_sum": aux["loss_sum"], "weight_sum": aux["weight_sum"],
            "accuracy_sum": aux["accuracy_sum"]}


@dataclasses.dataclass(frozen=True)
class RealmPretrainModel(ParamsFromBoxedInit):
  """REALM pretraining (REALM_SPEC 15-17): retrieve-then-predict masked salient spans; the K
  candidates are re-embedded with the live document tower so gradients reach the retriever.

  Batch (realm_jax.batches.pretraining_batches.build_pretraining_batch): query_ids,
  query_type_ids, query_mask [B, 96]; candidate_input_ids, candidate_type_ids, candidate_mask
  [B, K, 288] (null document at slot 0); reader_ids, reader_type_ids, reader_mask [B, K, 384];
  mlm_positions, mlm_targets, mlm_weights [B, M]; example_mask [B].

  Attributes:
    config: model configuration.
    marginalization: "per_token" (the release's, default) or "per_example" (the paper's).
    null_index: candidate slot of the null document (0); None for batches without one.
    retriever_objective: "marginal" (REALM) or Atlas's "emdr2", "pdist", "loop", "adist"
      (realm_jax.models.retriever_objectives).
    objective_temperature: T of the retriever's softmax in Atlas's objectives.
  """

  config: RealmConfig
  marginalization: str = "per_token"
  null_index: int | None = 0
  retriever_objective: str = "marginal"
  objective_temperature: float = 1.0

  def __post_init__(self):
    retriever_objectives.check_objective(self.retriever_objective, self.objective_temperature)

  @property
  def objective(self) -> retriever_objectives.Objective:
    """The registered `retriever_objective`, whose declarations decide what the reader
    computes."""
    return retriever_objectives.get(self.retriever_objective)

  def _boxed_init(self, rng: Array) -> Params:
    retriever_rng, encoder_rng = jax.random.split(rng)
    return {"retriever": init_retriever_params(self.config, retriever_rng),
            "encoder": init_encoder_params(self.config, encoder_rng)}

  def _sums(self, params: Params, batch: Batch, rng: Array | None) -> tuple[Array, dict]:
    deterministic = rng is None
    retriever_rng, encoder_rng = (None, None) if rng is None else jax.random.split(rng)
    # [B, K] relevance scores f(x, z_k) from the live towers.
    scores, _, _ = RealmRetriever(self.config).apply(
        {"params": params["retriever"]}, batch["query_ids"], batch["query_type_ids"],
        batch["query_mask"], batch["candidate_input_ids"], batch["candidate_type_ids"],
        batch["candidate_mask"], deterministic=deterministic, rngs=dropout_rngs(retriever_rng))
    # [B, K, M, V] MLM logits at the mask positions only.
    attention = self.objective.target(EXTRACTIVE) is Target.ATTENTION
    logits = RealmKnowledgeAugEncoder(self.config).apply(
        {"params": params["encoder"]}, batch["reader_ids"], batch["reader_type_ids"],
        batch["reader_mask"], batch["mlm_positions"], deterministic=deterministic,
        rngs=dropout_rngs(encoder_rng), mutable=["intermediates"] if attention else False)
    intermediates = None
    if attention:  # the encoder's attention maps too (bert.SelfAttention sows them)
      logits, intermediates = logits[0], logits[1]["intermediates"]
    # [B, K, M] log p(y_j | z_k, x)
    token_log_probs = losses.mlm_token_log_probs(logits, batch["mlm_targets"])
    example_mask = batch["example_mask"].astype(jnp.float32)
    # [B, M] skipped examples (duplicate candidates) contribute nothing.
    weights = batch["mlm_weights"].astype(jnp.float32) * example_mask[:, None]
    if not self.objective.joint:
      relevance = (None if intermediates is None
                   else self._attention_relevance(intermediates, batch, weights))
      loss, aux = self._objective_sums(scores, token_log_probs, weights, relevance)
    else:
      loss, loss_aux = losses.marginal_mlm_loss(scores, token_log_probs, weights,
                                                marginalization=self.marginalization)
      aux = {"loss_sum": loss_aux["loss_sum"], "weight_sum": loss_aux["weight_sum"]}
    if deterministic:
      # Evaluation only: another pass over the [B, K, M, V] logits, a large share of a CPU
      # train step at toy sizes.
      aux.update(losses.mlm_accuracy_sums(scores, logits, batch["mlm_targets"], weights,
                                          null_index=self.null_index))
    if self.null_index is not None:
      _, utility_aux = losses.retrieval_utility(scores, token_log_probs, weights,
                                                null_index=self.null_index)
      # [B]
      null_prob = losses.null_document_probability(scores, null_index=self.null_index)
      aux.update({"utility_sum": utility_aux["utility_sum"],
                  "utility_weight_sum": utility_aux["weight_sum"],
                  "null_prob_sum": jnp.sum(null_prob * example_mask),
                  "example_sum": jnp.sum(example_mask)})
    return loss, aux

  def _objective_sums(self, scores: Array, token_log_probs: Array, weights: Array,
                      relevance: Array | None) -> tuple[Array, dict]:
    """Loss and sums under one of Atlas's objectives (retriever_objectives): the reader keeps
    the marginal MLM loss with the scores held fixed, the objective trains the retriever, both
    over the reader's `weight_sum`; aux adds `reader_loss_sum` and `objective_loss_sum` (their
    sum is `loss_sum`). Targets per example or per token: design notes.

    Args:
      scores: [B, K] live retrieval scores.
      token_log_probs: [B, K, M] log p(y_j | z_k, x).
      weights: [B, M] mask weights (0 for padding and skipped examples).
      relevance: [B, K] the reader's attention relevance (`Target.ATTENTION`), else None.
    """
    objective = self.objective
    _, reader_aux = losses.marginal_mlm_loss(jax.lax.stop_gradient(scores), token_log_probs,
                                             weights, marginalization=self.marginalization)
    batch_size, num_candidates, num_masks = token_log_probs.shape
    if objective.per_token_targets and self.marginalization == "per_token":
      # [B * M, K]: one row per masked token, its example's scores.
      rows = jnp.broadcast_to(scores[:, None, :], (batch_size, num_masks, num_candidates))
      values = jnp.swapaxes(token_log_probs, 1, 2)
      row_weights = weights
    else:
      rows, values = scores, relevance
      if relevance is None:
        valid = (weights > 0)[:, None, :]  # [B, 1, M]
        # [B, K] the example's masked tokens under each candidate (padded slots made 0 first).
        values = jnp.sum(jnp.where(valid, token_log_probs.astype(jnp.float32), 0.0)
                         * weights[:, None, :], axis=-1)
      row_weights = (jnp.sum(weights, axis=-1) if self.marginalization == "per_token"
                     else (jnp.sum(weights, axis=-1) > 0).astype(jnp.float32))
    _, objective_aux = objective.loss(
        EXTRACTIVE, rows.reshape(-1, num_candidates), values.reshape(-1, num_candidates),
        row_weights.reshape(-1), temperature=self.objective_temperature)
    loss_sum = reader_aux["loss_sum"] + objective_aux["loss_sum"]
    weight_sum = reader_aux["weight_sum"]
    loss = losses._safe_divide(loss_sum, weight_sum)  # pylint: disable=protected-access
    return loss, {"loss_sum": loss_sum, "weight_sum": weight_sum,
                  "reader_loss_sum": reader_aux["loss_sum"],
                  "objective_loss_sum": objective_aux["loss_sum"]}

  def _attention_relevance(self, intermediates: dict, batch: Batch, weights: Array) -> Array:
    """[B, K] the attention the masked positions (weighted as the loss) put on each
    candidate's block, from the encoder's sown attention maps (retriever_objectives.adist_loss)."""
    batch_size, num_candidates, length = batch["reader_ids"].shape
    # [B, L] mask weights at their query positions (padding slots point at 0 with weight 0).
    query_weights = jnp.zeros((batch_size, length), jnp.float32).at[
        jnp.arange(batch_size)[:, None], batch["mlm_positions"]].add(weights)
    query_weights = jnp.broadcast_to(query_weights[:, None],
                                     (batch_size, num_candidates, length))
    return jax.lax.stop_gradient(block_attention_relevance(
        intermediates, self.config.bert.num_layers, query_weights, batch["reader_type_ids"],
        batch["reader_mask"]))

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    return self._sums(params, batch, rng)

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    return self._sums(params, batch, None)[1]


def summarize(aux: dict) -> dict[str, Array]:
  """Means from summed aux values (after summing over devices/microbatches)."""

  def ratio(numerator: str, denominator: str) -> Array:
    den = aux[denominator]
    return jnp.where(den > 0, aux[numerator] / jnp.maximum(den, 1e-12), 0.0)

  out = {"loss": ratio("loss_sum", "weight_sum")}
  if "objective_loss_sum" in aux:
    # Atlas's objectives: the reader's loss and the retriever's, parts of "loss".
    out["reader_loss"] = ratio("reader_loss_sum", "weight_sum")
    out["retriever_objective"] = ratio("objective_loss_sum", "weight_sum")
  if "accuracy_sum" in aux:
    out["accuracy"] = ratio("accuracy_sum", "weight_sum")
  if "mlm_correct_sum" in aux:
    # Masked tokens predicted exactly: REALM's marginal, and the null document alone.
    out["mlm/accuracy"] = ratio("mlm_correct_sum", "weight_sum")
    if "null_mlm_correct_sum" in aux:
      out["mlm/null_accuracy"] = ratio("null_mlm_correct_sum", "weight_sum")
  if "utility_sum" in aux:
    out["retrieval/utility"] = ratio("utility_sum", "utility_weight_sum")
    out["retrieval/null_prob"] = ratio("null_prob_sum", "example_sum")
  return out
