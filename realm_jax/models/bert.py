"""BERT encoder in Flax linen, numerically matching transformers' (REALM) BERT.

Every parameter and the main activations carry logical axis names (`embed`, `mlp`, `heads`,
`kv`, `vocab`, `batch`, `length`); the mapping to mesh axes lives in config, so one CPU device
runs the same code path as a pod.

Post-LayerNorm BERT: x = LN(x + Attention(x)); x = LN(x + FFN(x)).

Precision: with `dtype="bfloat16"` the dense layers, attention products and embeddings compute
in bfloat16; attention scores and softmax, LayerNorms and so the residual stream stay float32.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from realm_jax.models.config import RETRIEVER_POOLINGS, BertConfig
from realm_jax.models.peft import BottleneckAdapter

Array = jax.Array


def activation(name: str) -> Callable[[Array], Array]:
  """The activation function transformers calls `name` (see config.ACTIVATIONS)."""
  table = {
      "gelu": functools.partial(jax.nn.gelu, approximate=False),
      "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
      "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
      "relu": jax.nn.relu,
      "silu": jax.nn.silu,
      "swish": jax.nn.silu,
  }
  return table[name]


def param_init(config: BertConfig, names: tuple[str | None, ...]):
  """BERT's truncated-normal(std=initializer_range) initialiser with logical axis names."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(config.initializer_range), names)


# Golden ratio: the local frequencies pi * frac(k * phi), k = 1, 2, ..., spread evenly over
# (0, pi) for any count, so their cosines cancel at every nonzero integer offset.
_PHI = (1 + math.sqrt(5)) / 2


def position_frequencies(features: int, kind: str) -> np.ndarray:
  """Angular frequencies (radians per position) of a sin/cos position table, [features // 2].

  "sinusoidal": the Transformer's geometric 1 .. 1/10000. "neighbours": half of them those
  (1 .. 1/10000 over features // 4 steps), then `features // 2 - features // 4` local
  frequencies pi * frac(k * phi) in (0, pi): with the geometric ones alone (the highest 1
  radian per position) no linear read-out tells a position from its neighbour, with these a
  query/key pair attends to exactly the previous or the next one (`neighbour_kernel_init`).
  """
  pairs = features // 2
  if kind == "sinusoidal":
    return 1.0 / 10000.0 ** (2 * np.arange(pairs) / features)
  geometric = _geometric_pairs(features)
  local = np.pi * np.mod(np.arange(1, pairs - geometric + 1) * _PHI, 1.0)
  return np.concatenate([1.0 / 10000.0 ** (np.arange(geometric) / geometric), local])


def _geometric_pairs(features: int) -> int:
  """How many of a "neighbours" table's frequencies are geometric (the local ones follow)."""
  return features // 4


def _raw_position_table(positions: int, frequencies: np.ndarray) -> np.ndarray:
  """sin(p * w_i) on the first len(w) features, cos(p * w_i) on the next: [positions, 2 len(w)]."""
  # [positions, len(frequencies)]
  angles = np.arange(positions)[:, None] * frequencies[None]
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sinusoidal_init(std: float, kind: str = "sinusoidal"):
  """A sin/cos position table (`position_frequencies(features, kind)`: sin on the first half
  of the features, cos on the second) scaled to standard deviation `std`."""

  def init(key, shape, dtype=jnp.float32):
    del key  # deterministic
    positions, features = shape
    table = np.zeros(shape)
    raw = _raw_position_table(positions, position_frequencies(features, kind))
    table[:, :raw.shape[1]] = raw
    return jnp.asarray(table * std / table.std(), dtype)

  return init


# Layer 0's neighbour heads (position_init="neighbours"): head i attends to position p + offset.
NEIGHBOUR_OFFSETS = (-1, 1)
# Their attention logit at the neighbour, before the other positions' (about zero) are
# subtracted: exp(10) against ~row length others puts ~0.9 of the mass on the neighbour.
NEIGHBOUR_LOGIT = 10.0


def neighbour_kernel_init(config: BertConfig, role: str):
  """Layer 0's query ("query") or key ("key") kernel [embed, heads, kv] when
  position_init="neighbours": head i attends to position p + NEIGHBOUR_OFFSETS[i], reading the
  local frequencies of the position table (the derivation: docs/design/models_and_jobs.md).
  Heads past the offsets keep BERT's truncated normal; the biases stay zero.
  """
  features, head_dim = config.hidden_size, config.head_dim
  # The neighbour heads' columns, deterministic (no key): [embed, heads, kv].
  fixed = np.zeros((features, config.num_heads, head_dim))
  frequencies = position_frequencies(features, "neighbours")
  geometric = _geometric_pairs(features)
  local = frequencies[geometric:][:head_dim // 2]  # [L]
  raw_std = _raw_position_table(config.max_position_embeddings, frequencies).std()
  # The LayerNorm'd table: raw value * (initializer_range / raw_std) / (initializer_range * sqrt 3).
  unit = 1.0 / (raw_std * math.sqrt(3.0))
  # q . k / sqrt(head_dim) = NEIGHBOUR_LOGIT at the neighbour: g^2 L / sqrt(head_dim).
  g = math.sqrt(NEIGHBOUR_LOGIT * math.sqrt(head_dim) / len(local))
  sin_rows = geometric + np.arange(len(local))  # embedding features of sin(w p)
  cos_rows = features // 2 + sin_rows
  cos_cols, sin_cols = 2 * np.arange(len(local)), 2 * np.arange(len(local)) + 1
  for head, offset in enumerate(NEIGHBOUR_OFFSETS):
    if role == "key":
      fixed[cos_rows, head, cos_cols] = g / unit
      fixed[sin_rows, head, sin_cols] = g / unit
    else:  # cos(a + b) = cos a cos b - sin a sin b; sin(a + b) = sin a cos b + cos a sin b
      cos_d, sin_d = np.cos(local * offset), np.sin(local * offset)
      fixed[cos_rows, head, cos_cols] = g / unit * cos_d
      fixed[sin_rows, head, cos_cols] = -g / unit * sin_d
      fixed[sin_rows, head, sin_cols] = g / unit * cos_d
      fixed[cos_rows, head, sin_cols] = g / unit * sin_d
  is_fixed = np.zeros(fixed.shape, bool)
  is_fixed[:, :len(NEIGHBOUR_OFFSETS)] = True
  normal = nn.initializers.truncated_normal(config.initializer_range)

  def init(key, shape, dtype=jnp.float32):
    # DenseGeneral asks for the kernel flattened to [embed, heads * kv]; init runs under jit.
    return jnp.where(is_fixed.reshape(shape), jnp.asarray(fixed.reshape(shape), dtype),
                     normal(key, shape, dtype))

  return init


def zeros_init(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones_init(names: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def layer_norm(epsilon: float, config: BertConfig, name: str,
               axis_name: str = "embed") -> nn.LayerNorm:
  """A LayerNorm computed like torch's (two-pass variance), in float32.

  Its float32 output keeps the residual stream in float32 under bfloat16 compute (the matmuls
  and attention run in bfloat16): a 12-layer BERT-base forward then stays within about 0.5%
  relative of float32, against about 1.2% with a bfloat16 residual stream.
  """
  return nn.LayerNorm(
      epsilon=epsilon, dtype=jnp.float32, param_dtype=config.storage_dtype,
      use_fast_variance=False, scale_init=ones_init((axis_name,)),
      bias_init=zeros_init((axis_name,)), name=name)


def dense(features: int, config: BertConfig, names: tuple[str, str], name: str) -> nn.Dense:
  return nn.Dense(
      features, dtype=config.compute_dtype, param_dtype=config.storage_dtype,
      kernel_init=param_init(config, names), bias_init=zeros_init((names[1],)), name=name)


class FeedForward(nn.Module):
  """Dense (embed -> mlp), activation, dense (mlp -> embed) with bert's parameter names, for
  the pre-LN stacks built on these layers (RETRO's, the FiD decoder's); `config` is any config
  with hidden_size, intermediate_size, hidden_act and BertConfig's dtype and initialiser
  fields."""

  config: Any

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    # [..., length, mlp]
    h = activation(cfg.hidden_act)(
        dense(cfg.intermediate_size, cfg, ("embed", "mlp"), name="intermediate")(x))
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    # [..., length, embed]
    return dense(cfg.hidden_size, cfg, ("mlp", "embed"), name="output")(h)


@jax.custom_vjp
def tied_decode(hidden: Array, table: Array, bias: Array) -> Array:
  """`hidden @ table.T + bias`: [rows, embed] x [vocab, embed] + [vocab] -> [rows, vocab].

  The MLM decoder tied to the word embeddings, with its gradients written out (one matmul and
  one matrix-vector product, cheaper on XLA:CPU than autodiff's); same values up to summation
  order.
  """
  return jnp.dot(hidden, table.T) + bias


def _tied_decode_fwd(hidden, table, bias):
  return tied_decode(hidden, table, bias), (hidden, table)


def _tied_decode_bwd(residuals, g):
  hidden, table = residuals
  # [rows, embed]
  d_hidden = jnp.dot(g, table)
  # [vocab, embed]
  d_table = jnp.dot(hidden.T, g).T
  # [vocab]
  d_bias = jnp.dot(jnp.ones(g.shape[:1], g.dtype), g,
                   preferred_element_type=jnp.float32).astype(g.dtype)
  return d_hidden, d_table, d_bias


tied_decode.defvjp(_tied_decode_fwd, _tied_decode_bwd)


class BertEmbeddings(nn.Module):
  """Word + position + token-type embeddings, then LayerNorm and dropout."""

  config: BertConfig

  def setup(self):
    cfg = self.config
    embed = functools.partial(nn.Embed, features=cfg.hidden_size, dtype=cfg.compute_dtype,
                              param_dtype=cfg.storage_dtype)
    self.word_embeddings = embed(
        cfg.vocab_size, embedding_init=param_init(cfg, ("vocab", "embed")))
    position_init = (param_init(cfg, (None, "embed")) if cfg.position_init == "normal" else
                     nn.with_logical_partitioning(
                         sinusoidal_init(cfg.initializer_range, cfg.position_init),
                         (None, "embed")))
    self.position_embeddings = embed(cfg.max_position_embeddings,
                                     embedding_init=position_init)
    self.token_type_embeddings = embed(
        cfg.type_vocab_size, embedding_init=param_init(cfg, (None, "embed")))
    self.layer_norm = layer_norm(cfg.layer_norm_eps, cfg, name="layer_norm")
    self.dropout = nn.Dropout(cfg.hidden_dropout)

  def __call__(self, input_ids: Array, token_type_ids: Array, *,
               deterministic: bool) -> Array:
    length = input_ids.shape[-1]
    if length > self.config.max_position_embeddings:
      raise ValueError(
          f"Sequence length {length} exceeds max_position_embeddings="
          f"{self.config.max_position_embeddings}.")
    # [batch, length, embed]
    x = (self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
         + self.position_embeddings(jnp.arange(length))[None])
    x = self.layer_norm(x)
    return self.dropout(x, deterministic=deterministic)

  def attend(self, hidden: Array, bias: Array | None = None) -> Array:
    """Logits against the word embeddings (the MLM decoder is tied to them), plus `bias`
    ([vocab], the MLM head's output bias) when given."""
    if bias is None:
      return self.word_embeddings.attend(hidden)
    table = jnp.asarray(self.word_embeddings.embedding, self.config.compute_dtype)
    hidden = jnp.asarray(hidden, self.config.compute_dtype)
    bias = jnp.asarray(bias, self.config.compute_dtype)
    # [rows, vocab]
    logits = tied_decode(hidden.reshape(-1, hidden.shape[-1]), table, bias)
    return logits.reshape(*hidden.shape[:-1], -1)


class SelfAttention(nn.Module):
  """Multi-head self-attention; scores and softmax in float32 for bfloat16 stability."""

  config: BertConfig
  # Start the query and key kernels as neighbour heads (layer 0 under
  # position_init="neighbours"; see neighbour_kernel_init).
  neighbour_heads: bool = False

  @nn.compact
  def __call__(self, x: Array, attention_mask: Array, *, deterministic: bool) -> Array:
    cfg = self.config
    names = ("embed", "heads", "kv")
    projection = functools.partial(
        nn.DenseGeneral, features=(cfg.num_heads, cfg.head_dim), axis=-1,
        dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype,
        kernel_init=param_init(cfg, names), bias_init=zeros_init(("heads", "kv")))
    qk_init = {role: (nn.with_logical_partitioning(neighbour_kernel_init(cfg, role), names)
                      if self.neighbour_heads else param_init(cfg, names))
               for role in ("query", "key")}
    # [batch, length, heads, kv]
    query = projection(name="query", kernel_init=qk_init["query"])(x)
    key = projection(name="key", kernel_init=qk_init["key"])(x)
    value = projection(name="value")(x)
    query = nn.with_logical_constraint(query, ("batch", "length", "heads", "kv"))
    key = nn.with_logical_constraint(key, ("batch", "length", "heads", "kv"))
    value = nn.with_logical_constraint(value, ("batch", "length", "heads", "kv"))

    # [batch, heads, query_length, key_length]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32) / math.sqrt(cfg.head_dim)
    # A fully padded row softmaxes to uniform weights, as transformers' additive mask does.
    scores = jnp.where(attention_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(cfg.compute_dtype)
    if self.is_mutable_collection("intermediates"):
      # Atlas's attention distillation (retriever_objectives.attention_relevance): the weights
      # before dropout and each key's value norm per head, [batch, heads, key_length]. Only for
      # a caller that collects "intermediates"; the default pass computes and keeps nothing.
      self.sow("intermediates", "attention_probs", probs)
      self.sow("intermediates", "value_norms",
               jnp.linalg.norm(value.astype(jnp.float32), axis=-1).transpose(0, 2, 1))
    probs = nn.Dropout(cfg.attention_dropout)(probs, deterministic=deterministic)

    # [batch, length, heads, kv]
    context = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
    context = nn.with_logical_constraint(context, ("batch", "length", "heads", "kv"))
    # [batch, length, embed]
    return nn.DenseGeneral(
        features=cfg.hidden_size, axis=(-2, -1), dtype=cfg.compute_dtype,
        param_dtype=cfg.storage_dtype,
        kernel_init=param_init(cfg, ("heads", "kv", "embed")),
        bias_init=zeros_init(("embed",)), name="out")(context)


class TransformerLayer(nn.Module):
  """One post-LN BERT layer."""

  config: BertConfig
  neighbour_heads: bool = False  # see SelfAttention

  @nn.compact
  def __call__(self, x: Array, attention_mask: Array, *, deterministic: bool) -> Array:
    cfg = self.config
    dropout = nn.Dropout(cfg.hidden_dropout)
    # [batch, length, embed]
    attended = SelfAttention(cfg, self.neighbour_heads, name="attention")(
        x, attention_mask, deterministic=deterministic)
    attended = dropout(attended, deterministic=deterministic)
    if cfg.adapter_size:  # Houlsby et al.'s adapters, before the LayerNorms (models.peft)
      attended = BottleneckAdapter(cfg, activation(cfg.hidden_act), name="attention_adapter")(
          attended)
    x = layer_norm(cfg.layer_norm_eps, cfg, name="attention_layer_norm")(x + attended)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))

    # [batch, length, mlp]
    h = dense(cfg.intermediate_size, cfg, ("embed", "mlp"), name="intermediate")(x)
    h = activation(cfg.hidden_act)(h)
    h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
    # [batch, length, embed]
    h = dense(cfg.hidden_size, cfg, ("mlp", "embed"), name="output")(h)
    h = dropout(h, deterministic=deterministic)
    if cfg.adapter_size:
      h = BottleneckAdapter(cfg, activation(cfg.hidden_act), name="output_adapter")(h)
    x = layer_norm(cfg.layer_norm_eps, cfg, name="output_layer_norm")(x + h)
    return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class BertModel(nn.Module):
  """BERT: embeddings, `num_layers` transformer layers and (optionally) the pooler.

  Inputs may have any number of leading dimensions (e.g. [batch, candidates, length]); they
  are flattened for the encoder and restored on the outputs.
  """

  config: BertConfig
  use_pooler: bool = False
  # What the pooler reads: "cls" (BERT, REALM_SPEC 1) or "mean", the mean of the last hidden
  # states over the real tokens (see RealmConfig.retriever_pooling).
  pooling: str = "cls"

  def setup(self):
    cfg = self.config
    self.embeddings = BertEmbeddings(cfg)
    self.layers = [
        TransformerLayer(cfg, i == 0 and cfg.position_init == "neighbours", name=f"layer_{i}")
        for i in range(cfg.num_layers)]
    if self.use_pooler:
      # A square embed->embed matrix; its output dim is named "mlp" so a model-parallel mesh
      # shards it like the first FFN matrix.
      self.pooler = dense(cfg.hidden_size, cfg, ("embed", "mlp"), name="pooler")

  def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
               attention_mask: Array | None = None, *,
               deterministic: bool = True) -> tuple[Array, Array | None]:
    """Encodes token ids.

    Args:
      input_ids: int [..., length].
      token_type_ids: int [..., length]; zeros when None.
      attention_mask: [..., length], nonzero for real tokens; all ones when None.
      deterministic: disables dropout (eval mode).

    Returns:
      (sequence_output [..., length, embed], pooled_output [..., embed] or None). The pooled
      output is tanh(Dense(h[CLS])), as BERT's pooler, or tanh(Dense(mean of h over the
      attention mask)) with pooling="mean".
    """
    leading = input_ids.shape[:-1]
    length = input_ids.shape[-1]
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    # [batch, length]
    input_ids = input_ids.reshape(-1, length)
    token_type_ids = token_type_ids.reshape(-1, length)
    attention_mask = attention_mask.reshape(-1, length).astype(bool)

    # [batch, length, embed]
    x = self.embeddings(input_ids, token_type_ids, deterministic=deterministic)
    x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
    for layer in self.layers:
      x = layer(x, attention_mask, deterministic=deterministic)

    pooled = None
    if self.use_pooler:
      if self.pooling == "cls":
        # [batch, embed]
        summary = x[:, 0]
      elif self.pooling == "mean":
        weights = attention_mask.astype(x.dtype)[..., None]  # [batch, length, 1]
        # [batch, embed]; a row with no real token (never built by the inputs) would give 0.
        summary = (x * weights).sum(1) / jnp.maximum(weights.sum(1), 1)
      else:
        raise ValueError(f"BertModel: pooling={self.pooling!r} is not one of {RETRIEVER_POOLINGS}.")
      pooled = jnp.tanh(self.pooler(summary))
      pooled = pooled.reshape(*leading, -1)
    return x.reshape(*leading, length, -1), pooled

  def attend(self, hidden: Array, bias: Array | None = None) -> Array:
    """Vocabulary logits from hidden states with the tied word embeddings (+ `bias` [vocab])."""
    return self.embeddings.attend(hidden, bias)
