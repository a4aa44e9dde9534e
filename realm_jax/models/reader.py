"""REALM's readers: the knowledge-augmented MLM encoder and the open-QA span reader.

Knowledge-augmented encoder (REALM_SPEC 5): BERT over `[CLS] query [SEP] block [SEP]` and the
standard MLM head (decoder tied to the word embeddings), evaluated only at the gathered mask
positions: logits [batch, candidates, masks, vocab].

Span reader (REALM_SPEC 6, ORQA): spans of width 1..max_span_width enumerated width-major;
a span is valid iff its start and end tokens are block tokens; the block's retrieval score is
added to each of its span logits so (block, span) is scored jointly.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from realm_jax.models import retriever_objectives
from realm_jax.models.bert import BertModel, activation, dense, layer_norm, zeros_init
from realm_jax.models.config import BertConfig, RealmConfig

Array = jax.Array


def gather_positions(hidden: Array, positions: Array) -> Array:
  """Hidden states at given positions.

  Args:
    hidden: [batch, length, embed].
    positions: int [batch, masks] indices into `length`.

  Returns:
    [batch, masks, embed].
  """
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


class MlmHead(nn.Module):
  """BERT's MLM head; `decode(h, bias)` is the decoder tied to the word embeddings plus the
  head's output bias (BertModel.attend)."""

  config: BertConfig

  @nn.compact
  def __call__(self, hidden: Array, decode) -> Array:
    """[..., embed] hidden states -> [..., vocab] logits."""
    cfg = self.config
    h = dense(cfg.hidden_size, cfg, ("embed", "mlp"), name="transform")(hidden)
    h = activation(cfg.hidden_act)(h)
    h = layer_norm(cfg.layer_norm_eps, cfg, name="transform_layer_norm")(h)
    bias = self.param("bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.storage_dtype)
    # [..., vocab]
    return decode(h, bias)


class RealmKnowledgeAugEncoder(nn.Module):
  """p(y_j | z, x): the reader of REALM pretraining, logits at the mask positions only."""

  config: RealmConfig

  @nn.compact
  def __call__(self, input_ids: Array, token_type_ids: Array, attention_mask: Array,
               mlm_positions: Array, *, deterministic: bool = True) -> Array:
    """MLM logits of every candidate's reader input at the query's mask positions.

    Args:
      input_ids, token_type_ids, attention_mask: [batch, candidates, reader_len]
        (`[CLS] query [SEP] block [SEP]`, REALM_SPEC 11).
      mlm_positions: int [batch, masks]; the same positions index the query and every
        candidate's reader input, since both start with `[CLS] query`.
      deterministic: disables dropout.

    Returns:
      [batch, candidates, masks, vocab] logits in the compute dtype.
    """
    batch, num_candidates, reader_len = input_ids.shape
    bert = BertModel(self.config.bert, name="bert")
    # [batch, candidates, reader_len, embed]
    hidden, _ = bert(input_ids, token_type_ids, attention_mask, deterministic=deterministic)
    hidden = hidden.reshape(batch * num_candidates, reader_len, -1)
    # [batch * candidates, masks]
    positions = jnp.repeat(mlm_positions, num_candidates, axis=0)
    # [batch * candidates, masks, embed]
    masked_hidden = gather_positions(hidden, positions)
    # [batch * candidates, masks, vocab]
    logits = MlmHead(self.config.bert, name="mlm_head")(masked_hidden, bert.attend)
    logits = logits.reshape(batch, num_candidates, mlm_positions.shape[1], -1)
    return nn.with_logical_constraint(logits, ("batch", "candidates", None, "vocab"))


def enumerate_spans(length: int, max_span_width: int) -> tuple[np.ndarray, np.ndarray]:
  """All spans of width 1..max_span_width, width-major (all width-1 spans, then width-2, ...).

  Args:
    length: sequence length L.
    max_span_width: W.

  Returns:
    (starts, ends) int32 arrays of `W * L - W * (W - 1) / 2` spans (3155 at L=320, W=10);
    `ends` are inclusive.
  """
  starts, ends = [], []
  for width in range(1, max_span_width + 1):
    starts.append(np.arange(0, length - width + 1))
    ends.append(np.arange(width - 1, length))
  return np.concatenate(starts).astype(np.int32), np.concatenate(ends).astype(np.int32)


class SpanHead(nn.Module):
  """ORQA's span scorer over the reader's hidden states."""

  config: RealmConfig

  @nn.compact
  def __call__(self, hidden: Array, block_mask: Array) -> tuple[Array, Array, Array]:
    """Scores every span.

    Args:
      hidden: [beam, length, embed].
      block_mask: [beam, length], true on the block's own tokens.

    Returns:
      (logits [beam, spans] float32, starts [spans], ends [spans]); spans not inside the block
      have `invalid_span_logit` added.
    """
    cfg = self.config
    length = hidden.shape[1]
    starts, ends = enumerate_spans(length, cfg.max_span_width)
    # [beam, length, 2 * span_hidden]
    projected = dense(2 * cfg.span_hidden_size, cfg.bert, ("embed", "mlp"),
                      name="intermediate")(hidden)
    # [beam, length, span_hidden] each
    start_proj, end_proj = jnp.split(projected, 2, axis=-1)
    # [beam, spans, span_hidden]
    span_hidden = jax.nn.relu(start_proj[:, starts] + end_proj[:, ends])
    span_hidden = layer_norm(cfg.span_layer_norm_eps, cfg.bert, name="span_layer_norm",
                             axis_name="mlp")(span_hidden)
    # [beam, spans]
    logits = dense(1, cfg.bert, ("mlp", None), name="output")(span_hidden)[..., 0]
    logits = logits.astype(jnp.float32)
    block_mask = block_mask.astype(bool)
    valid = block_mask[:, starts] & block_mask[:, ends]
    logits = logits + jnp.where(valid, 0.0, cfg.invalid_span_logit)
    return logits, jnp.asarray(starts), jnp.asarray(ends)


class RealmReader(nn.Module):
  """The open-QA reader: BERT + span head; block retrieval scores added to span logits."""

  config: RealmConfig

  @nn.compact
  def __call__(self, input_ids: Array, token_type_ids: Array, attention_mask: Array,
               block_mask: Array, retrieval_scores: Array, *,
               deterministic: bool = True) -> tuple[Array, Array, Array]:
    """Joint (block, span) logits.

    Args:
      input_ids, token_type_ids, attention_mask, block_mask: [..., beam, reader_len]
        (`[CLS] question [SEP] block [SEP]`).
      retrieval_scores: [..., beam] f(x, z) of each block.
      deterministic: disables dropout.

    Returns:
      (logits [..., beam, spans] float32, starts [spans], ends [spans]).
    """
    cfg = self.config
    if input_ids.shape[-1] < cfg.max_span_width:
      raise ValueError(
          f"Reader sequence length {input_ids.shape[-1]} is shorter than "
          f"max_span_width={cfg.max_span_width}.")
    leading = input_ids.shape[:-1]
    length = input_ids.shape[-1]
    # [..., beam, length, embed]
    hidden, _ = BertModel(cfg.bert, name="bert")(
        input_ids, token_type_ids, attention_mask, deterministic=deterministic)
    logits, starts, ends = SpanHead(cfg, name="span_head")(
        hidden.reshape(-1, length, hidden.shape[-1]), block_mask.reshape(-1, length))
    # [..., beam, spans]
    logits = logits.reshape(*leading, -1) + retrieval_scores.astype(jnp.float32)[..., None]
    return logits, starts, ends


def predict_span(logits: Array, starts: Array, ends: Array) -> tuple[Array, Array, Array]:
  """The best (block, span) by a global argmax over the joint logits (REALM_SPEC 29).

  Args:
    logits: [..., beam, spans].
    starts, ends: [spans] from `enumerate_spans`.

  Returns:
    (block index [...], start [...], end [...]) in reader-input token positions, end inclusive.
  """
  num_spans = logits.shape[-1]
  # [...]
  best = jnp.argmax(logits.reshape(*logits.shape[:-2], -1), axis=-1)
  block, span = best // num_spans, best % num_spans
  return block, starts[span], ends[span]


def span_correctness(starts: Array, ends: Array, gold_starts: Array, gold_ends: Array) -> Array:
  """Which spans equal a gold answer occurrence in their block (REALM_SPEC 27).

  Args:
    starts, ends: [spans] from `enumerate_spans`.
    gold_starts, gold_ends: int [..., beam, answers] reader-input positions of every
      occurrence of an answer in each block; -1 pads.

  Returns:
    bool [..., beam, spans].
  """
  # [..., beam, answers, spans]
  hit = ((jnp.asarray(starts) == gold_starts[..., None])
         & (jnp.asarray(ends) == gold_ends[..., None]))
  return jnp.any(hit, axis=-2)


def block_attention_relevance(intermediates: dict, num_layers: int, query_weights: Array,
                              token_type_ids: Array, attention_mask: Array) -> Array:
  """Atlas's attention relevance of each reader row's block (retriever_objectives.adist_loss),
  from the attention weights and value norms the reader's BERT sowed under
  `mutable=["intermediates"]`; the block is the row's segment-1 tokens.

  Args:
    intermediates: the "intermediates" collection the apply returned.
    num_layers: the BERT's layers.
    query_weights: [..., length] weights of the attending positions of each row.
    token_type_ids, attention_mask: [..., length] the reader rows'.

  Returns:
    [...] float32 (retriever_objectives.attention_relevance of each row).
  """
  bert = intermediates["bert"]
  layers = [bert[f"layer_{i}"]["attention"] for i in range(num_layers)]
  length = query_weights.shape[-1]
  key_mask = (token_type_ids == 1) & (attention_mask > 0)
  relevance = retriever_objectives.attention_relevance(
      [layer["attention_probs"][0] for layer in layers],
      [layer["value_norms"][0] for layer in layers],
      query_weights.reshape(-1, length), key_mask.reshape(-1, length))
  return relevance.reshape(query_weights.shape[:-1])
