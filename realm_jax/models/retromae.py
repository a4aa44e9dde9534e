"""RetroMAE (Xiao et al. 2022): the retriever's document tower pre-trained as the encoder of a
masked auto-encoder, a warm start of the retriever beside ICT.

The tower reads the block with 30% of its wordpieces masked (plus BERT's MLM loss); its
embedding, the vector the index stores, is the only view of the block a one-layer decoder gets
to reconstruct it under the paper's enhanced decoding (query and content streams, a sampled
attention mask). Untied towers are kept equal. Params: {"retriever", "decoder"}; the
`retriever` warm-starts REALM like an ICT checkpoint. Design: docs/design/models_and_jobs.md.

Batch (`realm_jax.batches.retromae.retromae_batch_spec`): block_ids, block_type_ids,
block_mask, encoder_ids [B, L]; encoder_positions/targets/weights [B, M];
decoder_positions/targets/weights [B, P]; decoder_attention_mask [B, P, L] bool.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from realm_jax.models import losses
from realm_jax.models.bert import (BertEmbeddings, BertModel, activation, dense, layer_norm,
                                   param_init, zeros_init)
from realm_jax.models.config import BertConfig, RealmConfig
from realm_jax.models.realm import (ParamsFromBoxedInit, dropout_rngs, init_retriever_params,
                                    summarize as realm_summarize)
from realm_jax.models.reader import MlmHead, gather_positions
from realm_jax.models.retriever import RealmEmbedder

Array = jax.Array
Params = Any
Batch = dict[str, Array]

_INIT_LEN = 8


class TwoStreamAttention(nn.Module):
  """Multi-head attention of query-stream rows over the content stream under a per-row mask
  (the paper's A = softmax(Q K^T / sqrt(d) + M) V); scores and softmax in float32."""

  config: BertConfig

  @nn.compact
  def __call__(self, query_stream: Array, content_stream: Array, visible: Array, *,
               deterministic: bool) -> Array:
    """[B, P, embed] rows over [B, L, embed] columns, `visible` bool [B, P, L] -> [B, P, embed]."""
    cfg = self.config

    def heads(name: str, x: Array) -> Array:
      # [B, rows, heads, kv]
      return nn.DenseGeneral(
          features=(cfg.num_heads, cfg.head_dim), axis=-1, dtype=cfg.compute_dtype,
          param_dtype=cfg.storage_dtype, kernel_init=param_init(cfg, ("embed", "heads", "kv")),
          bias_init=zeros_init(("heads", "kv")), name=name)(x)

    q = heads("query", query_stream)
    k, v = heads("key", content_stream), heads("value", content_stream)
    # [B, heads, P, L]
    logits = jnp.einsum("bphd,blhd->bhpl", q, k, preferred_element_type=jnp.float32)
    logits = jnp.where(visible[:, None], logits / math.sqrt(cfg.head_dim),
                       jnp.finfo(jnp.float32).min)
    weights = nn.Dropout(cfg.attention_dropout)(
        jax.nn.softmax(logits, axis=-1).astype(cfg.compute_dtype), deterministic=deterministic)
    # [B, P, heads, kv] -> [B, P, embed]
    attended = jnp.einsum("bhpl,blhd->bphd", weights, v)
    return nn.DenseGeneral(
        features=cfg.hidden_size, axis=(-2, -1), dtype=cfg.compute_dtype,
        param_dtype=cfg.storage_dtype, kernel_init=param_init(cfg, ("heads", "kv", "embed")),
        bias_init=zeros_init(("embed",)), name="out")(attended)


class TwoStreamLayer(nn.Module):
  """One post-LN BERT layer whose attention is `TwoStreamAttention` (residual on the query
  stream); the parameter names of `bert.TransformerLayer`."""

  config: BertConfig

  @nn.compact
  def __call__(self, query_stream: Array, content_stream: Array, visible: Array, *,
               deterministic: bool) -> Array:
    cfg = self.config
    dropout = nn.Dropout(cfg.hidden_dropout)
    attended = TwoStreamAttention(cfg, name="attention")(
        query_stream, content_stream, visible, deterministic=deterministic)
    x = layer_norm(cfg.layer_norm_eps, cfg, name="attention_layer_norm")(
        query_stream + dropout(attended, deterministic=deterministic))
    h = activation(cfg.hidden_act)(
        dense(cfg.intermediate_size, cfg, ("embed", "mlp"), name="intermediate")(x))
    h = dense(cfg.hidden_size, cfg, ("mlp", "embed"), name="output")(h)
    return layer_norm(cfg.layer_norm_eps, cfg, name="output_layer_norm")(
        x + dropout(h, deterministic=deterministic))


class RetroMaeDecoder(nn.Module):
  """The decoder (`decoder` params) and the MLM head shared with the encoder's MLM loss."""

  config: RealmConfig

  @nn.compact
  def __call__(self, sentence_emb: Array, token_embeddings: Array, query_positions: Array,
               visible: Array, encoder_hidden: Array, decode: Callable[[Array, Array], Array],
               *, deterministic: bool = True) -> tuple[Array, Array]:
    """Decoder and encoder MLM logits.

    Args:
      sentence_emb: [B, proj], the encoder's embedding of the masked block.
      token_embeddings: [B, L, embed], the tower's embeddings of the unmasked block.
      query_positions: [B, P, embed], the position embeddings of the predicted positions.
      visible: bool [B, P, L], the content-stream columns each row sees (column 0: the
        sentence embedding).
      encoder_hidden: [B, M, embed], the encoder's last hidden states at its masked positions.
      decode: (hidden, bias) -> logits, the output layer tied to the tower's word embeddings.
      deterministic: disables dropout.

    Returns:
      (decoder logits [B, P, vocab], encoder logits [B, M, vocab]).
    """
    cfg = self.config.bert
    h = dense(cfg.hidden_size, cfg, ("proj", "embed"), name="sentence_projection")(sentence_emb)
    h = layer_norm(cfg.layer_norm_eps, cfg, name="sentence_layer_norm")(h)[:, None]  # [B, 1, E]
    # H1 [B, P, embed] and H2 [B, L, embed].
    query_stream = h + query_positions.astype(h.dtype)
    content_stream = jnp.concatenate([h, token_embeddings[:, 1:].astype(h.dtype)], axis=1)
    decoded = TwoStreamLayer(cfg, name="layer")(query_stream, content_stream, visible,
                                                deterministic=deterministic)
    # One pass of the head (one tied matmul) over the decoder's and the encoder's rows.
    rows = decoded.shape[1]
    logits = MlmHead(cfg, name="mlm_head")(
        jnp.concatenate([decoded, encoder_hidden.astype(decoded.dtype)], axis=1), decode)
    return logits[:, :rows], logits[:, rows:]


def _captures_bert(module: nn.Module, method: str) -> bool:
  return isinstance(module, BertModel) and method == "__call__"


def encoder_tower(retriever: Params, config: RealmConfig) -> Params:
  """The RealmEmbedder params RetroMAE trains: the document tower's (the only one when tied);
  untied, its values with its gradient reaching the query tower too (module docstring)."""
  if config.share_embedders:
    return retriever["embedder"]
  return jax.tree.map(lambda d, q: d + (q - jax.lax.stop_gradient(q)),
                      retriever["document_embedder"], retriever["query_embedder"])


def _block_means(log_probs: Array, weights: Array) -> Array:
  """[B] each block's mean negative log-likelihood over its weighted slots (0 when none)."""
  total = weights.sum(axis=1)
  return -(log_probs * weights).sum(axis=1) / jnp.maximum(total, 1.0)


def _correct(logits: Array, targets: Array, weights: Array) -> Array:
  return jnp.sum((jnp.argmax(logits, axis=-1) == targets) * weights)


@dataclasses.dataclass(frozen=True)
class RetroMaeModel(ParamsFromBoxedInit):
  """RetroMAE pre-training of the retriever (module docstring).

  Attributes:
    config: the model configuration (the retriever's towers and BERT).
    encoder_loss_weight: weight of the encoder's MLM loss beside the decoder's (1: the paper).
  """

  config: RealmConfig
  encoder_loss_weight: float = 1.0

  def _boxed_init(self, rng: Array) -> Params:
    retriever_rng, decoder_rng = jax.random.split(rng)
    retriever = dict(init_retriever_params(self.config, retriever_rng))
    if not self.config.share_embedders:
      retriever["query_embedder"] = retriever["document_embedder"]
    bert = self.config.bert
    batch, length, rows = 1, _INIT_LEN, 2
    decoder = RetroMaeDecoder(self.config).init(
        decoder_rng, jnp.zeros((batch, self.config.proj_size)),
        jnp.zeros((batch, length, bert.hidden_size)), jnp.zeros((batch, rows, bert.hidden_size)),
        jnp.ones((batch, rows, length), bool), jnp.zeros((batch, rows, bert.hidden_size)),
        lambda hidden, bias: hidden[..., :1] + bias)["params"]
    return {"retriever": retriever, "decoder": decoder}

  def _sums(self, params: Params, batch: Batch, rng: Array | None) -> dict:
    cfg = self.config
    deterministic = rng is None
    encoder_rng, embed_rng, decoder_rng = ((None,) * 3 if rng is None
                                           else jax.random.split(rng, 3))
    tower = encoder_tower(params["retriever"], cfg)
    # [B, proj] sentence embedding, and the tower's BERT states [B, L, embed].
    sentence_emb, state = RealmEmbedder(cfg).apply(
        {"params": tower}, batch["encoder_ids"], batch["block_type_ids"], batch["block_mask"],
        deterministic=deterministic, rngs=dropout_rngs(encoder_rng),
        capture_intermediates=_captures_bert, mutable=["intermediates"])
    hidden = state["intermediates"]["bert"]["__call__"][0][0]
    embeddings = {"params": tower["bert"]["embeddings"]}
    token_embeddings = BertEmbeddings(cfg.bert).apply(
        embeddings, batch["block_ids"], batch["block_type_ids"], deterministic=deterministic,
        rngs=dropout_rngs(embed_rng))
    table = tower["bert"]["embeddings"]["position_embeddings"]["embedding"]
    query_positions = jnp.take(table, batch["decoder_positions"], axis=0)  # [B, P, embed]

    def decode(h: Array, bias: Array) -> Array:
      return BertEmbeddings(cfg.bert).apply(embeddings, h, bias, method=BertEmbeddings.attend)

    decoder_logits, encoder_logits = RetroMaeDecoder(cfg).apply(
        {"params": params["decoder"]}, sentence_emb, token_embeddings, query_positions,
        batch["decoder_attention_mask"], gather_positions(hidden, batch["encoder_positions"]),
        decode, deterministic=deterministic, rngs=dropout_rngs(decoder_rng))
    enc_w = batch["encoder_weights"].astype(jnp.float32)
    dec_w = batch["decoder_weights"].astype(jnp.float32)
    # [B, slots] log p(target) (the marginal loss's helper with one "candidate").
    enc_lp = losses.mlm_token_log_probs(encoder_logits[:, None], batch["encoder_targets"])[:, 0]
    dec_lp = losses.mlm_token_log_probs(decoder_logits[:, None], batch["decoder_targets"])[:, 0]
    encoder_loss, decoder_loss = _block_means(enc_lp, enc_w), _block_means(dec_lp, dec_w)
    blocks = (dec_w.sum(axis=1) > 0).astype(jnp.float32)  # [B]
    return {
        "loss_sum": jnp.sum((self.encoder_loss_weight * encoder_loss + decoder_loss) * blocks),
        "weight_sum": jnp.sum(blocks),
        "encoder_loss_sum": jnp.sum(encoder_loss * blocks),
        "decoder_loss_sum": jnp.sum(decoder_loss * blocks),
        "encoder_correct_sum": _correct(encoder_logits, batch["encoder_targets"], enc_w),
        "encoder_token_sum": jnp.sum(enc_w),
        "decoder_correct_sum": _correct(decoder_logits, batch["decoder_targets"], dec_w),
        "decoder_token_sum": jnp.sum(dec_w)}

  def loss_fn(self, params: Params, batch: Batch, rng: Array) -> tuple[Array, dict]:
    aux = self._sums(params, batch, rng)
    return aux["loss_sum"] / jnp.maximum(aux["weight_sum"], 1.0), aux

  def eval_fn(self, params: Params, batch: Batch) -> dict:
    return self._sums(params, batch, None)

  @staticmethod
  def summarize(aux: dict) -> dict[str, Array]:
    """Means from the summed aux: loss, encoder_mlm_loss and decoder_loss (per block),
    encoder_mlm_accuracy and decoder_accuracy (per predicted wordpiece)."""

    def ratio(numerator: str, denominator: str) -> Array:
      den = aux[denominator]
      return jnp.where(den > 0, aux[numerator] / jnp.maximum(den, 1e-12), 0.0)

    return {**realm_summarize(aux),
            "encoder_mlm_loss": ratio("encoder_loss_sum", "weight_sum"),
            "decoder_loss": ratio("decoder_loss_sum", "weight_sum"),
            "encoder_mlm_accuracy": ratio("encoder_correct_sum", "encoder_token_sum"),
            "decoder_accuracy": ratio("decoder_correct_sum", "decoder_token_sum")}
