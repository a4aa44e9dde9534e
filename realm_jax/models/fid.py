"""Fusion-in-Decoder (FiD; Izacard & Grave 2021), the reader of Atlas (Izacard et al. 2022).

The encoder (this repository's BERT, so it warm-starts from its checkpoints) reads each
(query, passage) row on its own [B, K, L] -> [B, K, L, D]; the K encodings are concatenated into
one memory [B, K L, D] that a pre-LN decoder, trained from scratch, cross-attends over all at
once. Also here: an optional copy head, the cross-attention maps ADist distils, the per-passage
and leave-one-out likelihoods of Atlas's other objectives, and greedy and beam decoding over a
key/value cache. Design, deviations from Atlas's T5 and tokens: docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from realm_jax.data import vocab as vocab_lib
from realm_jax.models import losses
from realm_jax.models.bert import BertModel, FeedForward, layer_norm, param_init, zeros_init
from realm_jax.models.config import ACTIVATIONS, BertConfig, ShapeProperties, tiny_bert

Array = jax.Array
Params = Any
# Per decoder layer, the self-attention's (keys, values), each [rows, cache_len, heads, kv].
Cache = list[tuple[Array, Array]]
# The memory as the decoder reads it (`FidModel.cross_keys_values`): per decoder layer, the
# cross-attention's (keys, values) [B, S, heads, kv]; with the copy head, one more pair: its
# keys [B, S, D] and the memory's token ids int32 [B, S]. Every leaf leads with [B, S].
Cross = list[tuple[Array, Array]]
# (tokens int32 [N], step int32 [], state) -> (log-probabilities float32 [N, V], state): the
# next-token distribution of N rows given each row's last token (BOS at step 0) and its state (a
# pytree whose leaves lead with N: the searches reorder it when beams are re-ranked).
StepFn = Callable[[Array, Array, Any], tuple[Array, Any]]

_NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class FidConfig(ShapeProperties):
  """Shapes and numerics of a FiD reader: a BERT encoder (`bert`) and a decoder of width
  `bert.hidden_size` over `bert`'s vocabulary (defaults: BERT-base and a T5-base-sized
  decoder). `initializer_range`, `dtype` and `param_dtype` are named as BertConfig's, so bert.py's
  layers take a FidConfig for the decoder.

  Attributes:
    bert: the encoder's configuration (its dtypes overridden by this config's).
    decoder_layers, num_heads, intermediate_size, hidden_act: the decoder's layers.
    max_answer_length: decoder positions, the longest target / decoded answer, EOS included.
    copy_head: a pointer-generator readout (`CopyHead`) mixing in a copy of the memory's tokens.
    bos_id, eos_id, pad_id: start token ([CLS]), answer end ([SEP]), filler after it ([PAD]).
    layer_norm_eps, initializer_range, hidden_dropout, attention_dropout: the decoder's.
    dtype, param_dtype: compute dtype of the whole model, and the parameters' storage dtype.
  """

  bert: BertConfig = dataclasses.field(default_factory=BertConfig)
  decoder_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu_new"
  max_answer_length: int = 32
  copy_head: bool = False
  bos_id: int = vocab_lib.CLS_ID
  eos_id: int = vocab_lib.SEP_ID
  pad_id: int = vocab_lib.PAD_ID
  layer_norm_eps: float = 1e-6
  initializer_range: float = 0.02
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(f"FidConfig: the width {self.hidden_size} (bert.hidden_size) is not "
                       f"divisible by num_heads={self.num_heads}.")
    if min(self.decoder_layers, self.intermediate_size, self.max_answer_length) < 1:
      raise ValueError(f"FidConfig: decoder_layers={self.decoder_layers}, intermediate_size="
                       f"{self.intermediate_size}, max_answer_length={self.max_answer_length}; "
                       f"expected >= 1 each.")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"FidConfig: hidden_act={self.hidden_act!r} is not one of "
                       f"{ACTIVATIONS}.")
    for field in ("bos_id", "eos_id", "pad_id"):
      if not 0 <= getattr(self, field) < self.vocab_size:
        raise ValueError(f"FidConfig: {field}={getattr(self, field)} is outside the encoder's "
                         f"vocabulary of {self.vocab_size}.")
    if not isinstance(self.copy_head, bool):
      raise ValueError(f"FidConfig: copy_head={self.copy_head!r}; expected True or False.")
    if self.eos_id == self.pad_id:
      raise ValueError(f"FidConfig: eos_id and pad_id are both {self.eos_id}.")
    for field in ("dtype", "param_dtype"):
      if getattr(self, field) not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"FidConfig: {field}={getattr(self, field)!r}; expected 'float32', "
                         f"'bfloat16' or 'float16'.")

  @classmethod
  def from_bert(cls, bert: BertConfig, **overrides) -> "FidConfig":
    """A FiD reader over `bert` whose decoder is shaped like it (its layers, heads, FFW width,
    activation, initialiser, dropouts and dtypes), with `overrides`."""
    defaults = dict(bert=bert, decoder_layers=bert.num_layers, num_heads=bert.num_heads,
                    intermediate_size=bert.intermediate_size, hidden_act=bert.hidden_act,
                    initializer_range=bert.initializer_range, hidden_dropout=bert.hidden_dropout,
                    attention_dropout=bert.attention_dropout, dtype=bert.dtype,
                    param_dtype=bert.param_dtype)
    return cls(**{**defaults, **overrides})

  @classmethod
  def tiny(cls, **overrides) -> "FidConfig":
    """Unit-test sizes (seconds on CPU): a 2-layer width-16 BERT over 128 words (BERT's [PAD],
    [CLS], [SEP] ids fit), a 2-layer decoder, answers of up to 8 tokens, no dropout."""
    bert = tiny_bert(vocab_size=128, hidden_size=16, num_layers=2, num_heads=2,
                     intermediate_size=32, max_position_embeddings=64, hidden_dropout=0.0,
                     attention_dropout=0.0, initializer_range=overrides.get(
                         "initializer_range", 0.02))
    defaults = dict(bert=bert, decoder_layers=2, num_heads=2, intermediate_size=32,
                    max_answer_length=8, hidden_dropout=0.0, attention_dropout=0.0)
    return cls(**{**defaults, **overrides})

  @property
  def encoder(self) -> BertConfig:
    """The encoder's BertConfig: `bert` in this config's dtypes."""
    return dataclasses.replace(self.bert, dtype=self.dtype, param_dtype=self.param_dtype)

  @property
  def hidden_size(self) -> int:
    return self.bert.hidden_size

  @property
  def vocab_size(self) -> int:
    return self.bert.vocab_size


# ----------------------------------------------------------------------- pure functions


def concatenate_passages(encoded: Array, input_mask: Array) -> tuple[Array, Array]:
  """The fusion: [B, K, L, D] encodings and their mask [B, K, L] -> the decoder's memory
  [B, K L, D] (passage k's tokens at k L .. k L + L - 1) and its bool mask [B, K L]."""
  batch, num_passages, length, features = encoded.shape
  memory = encoded.reshape(batch, num_passages * length, features)
  memory = nn.with_logical_constraint(memory, ("batch", "length", "embed"))
  return memory, input_mask.reshape(batch, num_passages * length).astype(bool)


def shift_right(targets: Array, bos_id: int) -> Array:
  """Decoder inputs from targets [B, T]: [BOS, y_0, ..., y_{T-2}] (teacher forcing)."""
  # [B, T]
  return jnp.concatenate(
      [jnp.full(targets.shape[:1] + (1,), bos_id, targets.dtype), targets[:, :-1]], axis=1)


def visible_softmax(scores: Array, visible: Array) -> Array:
  """Attention weights: float32 scores [..., S] -> the softmax over the keys each query sees
  (`visible`, bool, broadcastable to the scores); a query that sees no key gets zeros."""
  probs = jax.nn.softmax(jnp.where(visible, scores, jnp.finfo(jnp.float32).min), axis=-1)
  return jnp.where(visible.any(axis=-1, keepdims=True), probs, 0.0)


def token_log_probs(logits: Array, targets: Array) -> Array:
  """log p(y_t | y_<t, passages): logits [B, T, V] (any float dtype; normalised in float32)
  and targets int [B, T] -> float32 [B, T]."""
  # losses' target log-softmax with its hand-written gradient, read as one "candidate".
  return losses.mlm_token_log_probs(logits[:, None], targets)[:, 0]


def answer_loss(logits: Array, targets: Array, target_mask: Array) -> tuple[Array, dict]:
  """Teacher-forced token cross entropy of the answers, in nats.

  Args:
    logits: [B, T, V], the decoder's output on `shift_right(targets, bos_id)`.
    targets: int [B, T], the answer tokens, EOS, then padding.
    target_mask: [B, T], nonzero on the tokens that count (the answer and its EOS).

  Returns:
    (mean loss over the counted tokens (0 without any), {"loss_sum", "weight_sum"}: sums, so
    that microbatches and devices add up exactly).
  """
  weights = target_mask.astype(jnp.float32)  # [B, T]
  loss_sum = -jnp.sum(token_log_probs(logits, targets) * weights)
  weight_sum = jnp.sum(weights)
  return losses._safe_divide(loss_sum, weight_sum), {  # pylint: disable=protected-access
      "loss_sum": loss_sum, "weight_sum": weight_sum}


def init_cache(config: FidConfig, rows: int, length: int) -> Cache:
  """An empty self-attention cache: per decoder layer, zero keys and values
  [rows, length, heads, kv] in the compute dtype."""
  shape = (rows, length, config.num_heads, config.head_dim)
  return [(jnp.zeros(shape, config.compute_dtype), jnp.zeros(shape, config.compute_dtype))
          for _ in range(config.decoder_layers)]


def cross_attention_maps(intermediates: dict) -> tuple[list[Array], list[Array]]:
  """The decoder's sown cross-attention, layer by layer, from the "intermediates" of a pass
  with that collection mutable: (attention_probs, per layer [B, heads, T, K L]; value_norms,
  per layer [B, heads, K L])."""
  decoder = intermediates["decoder"]
  layers = sorted((name for name in decoder if name.startswith("layer_")),
                  key=lambda name: int(name[len("layer_"):]))
  probs = [decoder[name]["cross_attention"]["attention_probs"][0] for name in layers]
  norms = [decoder[name]["cross_attention"]["value_norms"][0] for name in layers]
  return probs, norms


def passage_attention_scores(attention_probs: Sequence[Array], value_norms: Sequence[Array],
                             target_mask: Array, input_mask: Array) -> Array:
  """Atlas's ADist relevance of each passage: the cross-attention weights times the value norms,
  averaged over layers, heads and the target tokens, summed over the passage's real tokens
  (the formula: docs/design/models_and_jobs.md). 0 for a row without targets. Stop its gradient
  before distilling.

  Args:
    attention_probs: per layer, [B, heads, T, K L].
    value_norms: per layer, [B, heads, K L].
    target_mask: [B, T], the target tokens that count.
    input_mask: [B, K, L], the real tokens of each passage row.

  Returns:
    float32 [B, K].
  """
  batch, num_passages, length = input_mask.shape
  weights = target_mask.astype(jnp.float32)  # [B, T]
  mask = input_mask.astype(jnp.float32)  # [B, K, L]
  total = jnp.zeros((batch, num_passages), jnp.float32)
  for probs, norms in zip(attention_probs, value_norms, strict=True):
    heads, targets = probs.shape[1], probs.shape[2]
    # [B, heads, T, K, L]
    probs = probs.astype(jnp.float32).reshape(batch, heads, targets, num_passages, length)
    # [B, heads, K, L]: the value norms of the real tokens.
    keys = norms.astype(jnp.float32).reshape(batch, heads, num_passages, length) * mask[:, None]
    total = total + jnp.einsum("bhtkl,bhkl,bt->bk", probs, keys, weights)
  heads = attention_probs[0].shape[1]
  return losses._safe_divide(  # pylint: disable=protected-access
      total, len(attention_probs) * heads * jnp.sum(weights, axis=-1, keepdims=True))


# ---------------------------------------------------------------------------- modules


class FidAttention(nn.Module):
  """Multi-head attention with its key/value projection separate from the attending, so that
  keys and values can be cached; bert.SelfAttention's parameter names (query, key, value, out)
  and logical axes, scores and softmax in float32."""

  config: FidConfig

  def setup(self):
    cfg = self.config
    heads = functools.partial(
        nn.DenseGeneral, features=(cfg.num_heads, cfg.head_dim), axis=-1,
        dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype,
        kernel_init=param_init(cfg, ("embed", "heads", "kv")),
        bias_init=zeros_init(("heads", "kv")))
    self.query = heads()
    self.key = heads()
    self.value = heads()
    self.out = nn.DenseGeneral(
        features=cfg.hidden_size, axis=(-2, -1), dtype=cfg.compute_dtype,
        param_dtype=cfg.storage_dtype, kernel_init=param_init(cfg, ("heads", "kv", "embed")),
        bias_init=zeros_init(("embed",)))
    self.dropout = nn.Dropout(cfg.attention_dropout)

  def keys_values(self, context: Array) -> tuple[Array, Array]:
    """[R, S, D] -> (keys, values), each [R, S, heads, kv]."""
    names = ("batch", "length", "heads", "kv")
    return (nn.with_logical_constraint(self.key(context), names),
            nn.with_logical_constraint(self.value(context), names))

  def attend(self, x: Array, keys: Array, values: Array, visible: Array, *,
             deterministic: bool, sow: bool = False) -> Array:
    """Queries from x [N, T, D] over keys and values [R, S, heads, kv] -> [N, T, D].

    R divides N: the G = N / R consecutive rows of x (a batch row's beams) read the same keys
    together, as G T queries of one row. `visible`: bool, broadcastable to [R, G T, S]. A query
    that sees no key gets a zero output. With `sow` (and "intermediates" mutable), sows
    `attention_probs` [R, heads, G T, S] (before dropout) and `value_norms` [R, heads, S].
    """
    cfg = self.config
    rows, length, _ = x.shape
    key_rows, key_length = keys.shape[:2]
    group = rows // key_rows
    # [R, G T, heads, kv]
    query = self.query(x).reshape(key_rows, group * length, cfg.num_heads, cfg.head_dim)
    query = nn.with_logical_constraint(query, ("batch", "length", "heads", "kv"))
    # [R, heads, G T, S]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, keys,
                        preferred_element_type=jnp.float32) / math.sqrt(cfg.head_dim)
    visible = jnp.broadcast_to(visible, (key_rows, group * length, key_length))[:, None]
    probs = visible_softmax(scores, visible)
    if sow and self.is_mutable_collection("intermediates"):
      self.sow("intermediates", "attention_probs", probs)
      # [R, heads, S]
      self.sow("intermediates", "value_norms",
               jnp.linalg.norm(values.astype(jnp.float32), axis=-1).transpose(0, 2, 1))
    probs = self.dropout(probs.astype(cfg.compute_dtype), deterministic=deterministic)
    # [R, G T, heads, kv]
    attended = jnp.einsum("bhqk,bkhd->bqhd", probs, values)
    # [N, T, heads, kv]
    attended = attended.reshape(rows, length, cfg.num_heads, cfg.head_dim)
    attended = nn.with_logical_constraint(attended, ("batch", "length", "heads", "kv"))
    # [N, T, D]
    return self.out(attended)

  def __call__(self, x: Array, context: Array, visible: Array, *, deterministic: bool,
               sow: bool = False) -> Array:
    """x [N, T, D] over context [R, S, D] -> [N, T, D] (see `attend`)."""
    return self.attend(x, *self.keys_values(context), visible, deterministic=deterministic,
                       sow=sow)


class FidDecoderLayer(nn.Module):
  """One pre-LN decoder layer: causal self-attention (over a key/value cache), cross-attention
  to the memory, feed-forward."""

  config: FidConfig

  def setup(self):
    cfg = self.config
    norm = functools.partial(layer_norm, cfg.layer_norm_eps, cfg)
    self.self_attention_layer_norm = norm(name="self_attention_layer_norm")
    self.self_attention = FidAttention(cfg)
    self.cross_attention_layer_norm = norm(name="cross_attention_layer_norm")
    self.cross_attention = FidAttention(cfg)
    self.mlp_layer_norm = norm(name="mlp_layer_norm")
    self.mlp = FeedForward(cfg)
    self.dropout = nn.Dropout(cfg.hidden_dropout)

  def cross_keys_values(self, memory: Array) -> tuple[Array, Array]:
    """The cross-attention's keys and values of the memory [B, S, D]: each [B, S, heads, kv]."""
    return self.cross_attention.keys_values(memory)

  def _residual(self, hidden: Array, branch: Array, deterministic: bool) -> Array:
    out = hidden + self.dropout(branch, deterministic=deterministic)
    return nn.with_logical_constraint(out, ("batch", "length", "embed"))

  def __call__(self, hidden: Array, index: Array, cache: tuple[Array, Array],
               cross: tuple[Array, Array], memory_visible: Array, *,
               deterministic: bool) -> tuple[Array, tuple[Array, Array]]:
    """Decodes positions index .. index + T - 1.

    Args:
      hidden: [N, T, D], the residual stream at those positions.
      index: int [], the position of hidden's first row.
      cache: (keys, values) [N, C, heads, kv] of positions 0 .. index - 1 (C >= index + T).
      cross: the memory's (keys, values) [B, S, heads, kv] (B divides N).
      memory_visible: bool [B, 1, S], the memory's real tokens.
      deterministic: disables dropout.

    Returns:
      (hidden [N, T, D], the cache with positions index .. index + T - 1 written).
    """
    length, cache_len = hidden.shape[1], cache[0].shape[1]
    h = self.self_attention_layer_norm(hidden)
    # [N, T, heads, kv]
    keys, values = self.self_attention.keys_values(h)
    # [N, C, heads, kv]
    start = (0, index, 0, 0)
    cache = (jax.lax.dynamic_update_slice(cache[0], keys.astype(cache[0].dtype), start),
             jax.lax.dynamic_update_slice(cache[1], values.astype(cache[1].dtype), start))
    # [1, T, C]: position index + t sees cached positions <= index + t (causal).
    visible = (jnp.arange(cache_len)[None, :] <= index + jnp.arange(length)[:, None])[None]
    attended = self.self_attention.attend(h, cache[0], cache[1], visible,
                                          deterministic=deterministic)
    hidden = self._residual(hidden, attended, deterministic)

    attended = self.cross_attention.attend(
        self.cross_attention_layer_norm(hidden), cross[0], cross[1], memory_visible,
        deterministic=deterministic, sow=True)
    hidden = self._residual(hidden, attended, deterministic)

    hidden = self._residual(hidden, self.mlp(self.mlp_layer_norm(hidden)), deterministic)
    return hidden, cache


class FidDecoder(nn.Module):
  """The decoder stack over embedded answer tokens (the token embeddings and the readout are
  the encoder's word embeddings, applied by `FidModel`)."""

  config: FidConfig

  def setup(self):
    cfg = self.config
    self.position_embeddings = nn.Embed(
        cfg.max_answer_length, cfg.hidden_size, dtype=cfg.compute_dtype,
        param_dtype=cfg.storage_dtype, embedding_init=param_init(cfg, (None, "embed")))
    self.layers = [FidDecoderLayer(cfg, name=f"layer_{i}") for i in range(cfg.decoder_layers)]
    self.final_layer_norm = layer_norm(cfg.layer_norm_eps, cfg, name="final_layer_norm")
    self.dropout = nn.Dropout(cfg.hidden_dropout)

  def cross_keys_values(self, memory: Array) -> list[tuple[Array, Array]]:
    """Per layer, the memory's cross-attention (keys, values) [B, S, heads, kv]."""
    return [layer.cross_keys_values(memory) for layer in self.layers]

  def __call__(self, token_embeddings: Array, index: Array, cache: Cache,
               cross: list[tuple[Array, Array]], memory_mask: Array, *,
               deterministic: bool) -> tuple[Array, Cache]:
    """Token embeddings [N, T, D] at positions index .. index + T - 1 -> (the normalised last
    hidden states [N, T, D] float32, the updated cache); cross per layer [B, S, heads, kv],
    memory_mask bool [B, S] (the real tokens) or [B, G T, S] (what each query of the G = N / B
    rows reading memory row b sees: row b G + g's position t is query g T + t)."""
    length = token_embeddings.shape[1]
    # [N, T, D]; float32, so the residual stream stays float32 under bfloat16 compute.
    hidden = (token_embeddings.astype(jnp.float32)
              + self.position_embeddings(index + jnp.arange(length))[None].astype(jnp.float32))
    hidden = self.dropout(hidden, deterministic=deterministic)
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "embed"))
    # [B, 1, S]: every query sees the real tokens; or already one visibility per query
    # [B, G T, S] (G = N / B decodes per memory row: `leave_one_out_visibility`).
    memory_visible = memory_mask[:, None, :] if memory_mask.ndim == 2 else memory_mask
    new_cache = []
    for layer, layer_cache, layer_cross in zip(self.layers, cache, cross, strict=True):
      hidden, layer_cache = layer(hidden, index, layer_cache, layer_cross, memory_visible,
                                  deterministic=deterministic)
      new_cache.append(layer_cache)
    return self.final_layer_norm(hidden), new_cache


class CopyHead(nn.Module):
  """The pointer-generator readout (`FidConfig.copy_head`, module docstring): the decoder's last
  states and the tied readout's log-probabilities -> the mixture's log-probabilities."""

  config: FidConfig

  def setup(self):
    cfg = self.config
    square = functools.partial(
        nn.Dense, cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype,
        kernel_init=param_init(cfg, ("embed", "mlp")), bias_init=zeros_init(("mlp",)))
    self.query = square()
    self.key = square()
    self.gate = nn.Dense(1, dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype,
                         kernel_init=param_init(cfg, ("embed", None)),
                         bias_init=zeros_init((None,)))

  def keys(self, memory: Array) -> Array:
    """The copy attention's keys of the memory [B, S, D] -> [B, S, D]."""
    return nn.with_logical_constraint(self.key(memory), ("batch", "length", "mlp"))

  def __call__(self, hidden: Array, generated: Array, keys: Array, memory_ids: Array,
               visible: Array) -> Array:
    """log p(w) = log(g exp(generated_w) + (1 - g) sum_{s: x_s = w} c_s).

    Args:
      hidden: [N, T, D], the decoder's normalised last states.
      generated: float32 [N, T, V], the tied readout's log-probabilities.
      keys: [B, S, D] (`keys`); B divides N, the G = N / B consecutive rows of a memory row
        read it together (as `FidAttention.attend`).
      memory_ids: int [B, S], the memory's tokens.
      visible: bool, broadcastable to [B, G T, S]: what each query sees.

    Returns:
      float32 [N, T, V] log-probabilities.
    """
    rows, length, features = hidden.shape
    key_rows, key_length = keys.shape[:2]
    group = rows // key_rows
    # [B, G T, D]
    query = self.query(hidden).reshape(key_rows, group * length, features)
    # [B, G T, S]
    scores = jnp.einsum("bqd,bkd->bqk", query, keys,
                        preferred_element_type=jnp.float32) / math.sqrt(features)
    probs = visible_softmax(scores, visible)
    # [N, T, S] -> [N, T, V]: each attention weight added to its token's probability.
    probs = probs.reshape(rows, length, key_length)
    ids = jnp.repeat(memory_ids.astype(jnp.int32), group, axis=0)  # [N, S]
    copied = jnp.zeros(generated.shape, jnp.float32).at[
        jnp.arange(rows)[:, None, None], jnp.arange(length)[None, :, None],
        ids[:, None, :]].add(probs)
    # log of the copied mass, -inf where none (the inner where keeps the gradient finite).
    log_copied = jnp.where(copied > 0, jnp.log(jnp.where(copied > 0, copied, 1.0)), _NEG_INF)
    gate = self.gate(hidden).astype(jnp.float32)  # [N, T, 1]
    return jnp.logaddexp(jax.nn.log_sigmoid(gate) + generated,
                         jax.nn.log_sigmoid(-gate) + log_copied)


class FidModel(nn.Module):
  """The FiD reader (module docstring): passages -> answer-token logits.

  Parameters: encoder (exactly `BertModel`'s tree without pooler: embeddings, layer_{i}),
  decoder (position_embeddings, layer_{i} with self_attention, cross_attention, mlp and their
  LayerNorms, final_layer_norm), with `copy_head` copy (query, key, gate). The decoder's
  token embeddings and readout are encoder/embeddings/word_embeddings.
  """

  config: FidConfig

  def setup(self):
    self.encoder = BertModel(self.config.encoder)
    self.decoder = FidDecoder(self.config)
    if self.config.copy_head:
      self.copy = CopyHead(self.config)

  def encode(self, input_ids: Array, input_mask: Array, type_ids: Array | None = None, *,
             deterministic: bool = True) -> Array:
    """Each (query, passage) row on its own: int [B, K, L] ids, mask and type ids (zeros when
    None) -> float32 [B, K, L, D]."""
    # [B, K, L, D]
    encoded, _ = self.encoder(input_ids, type_ids, input_mask, deterministic=deterministic)
    return nn.with_logical_constraint(encoded, ("batch", "candidates", "length", "embed"))

  def cross_keys_values(self, memory: Array, memory_ids: Array | None = None) -> Cross:
    """The memory [B, S, D] as the decoder reads it (`Cross`), computed once per decoding: per
    decoder layer the cross-attention's (keys, values) [B, S, heads, kv]; with the copy head
    also (its keys [B, S, D], `memory_ids` int [B, S], the memory's tokens)."""
    cross = self.decoder.cross_keys_values(memory)
    if not self.config.copy_head:
      return cross
    if memory_ids is None:
      raise ValueError("FidModel.cross_keys_values: the copy head needs the memory's token ids")
    return [*cross, (self.copy.keys(memory), memory_ids.astype(jnp.int32))]

  def decode(self, decoder_input_ids: Array, index: Array, cache: Cache,
             cross: Cross, memory_mask: Array, *,
             deterministic: bool = True) -> tuple[Array, Cache]:
    """Logits of the next tokens after decoder_input_ids [N, T] (positions index ..
    index + T - 1) -> ([N, T, V] in the compute dtype; with the copy head, log-probabilities
    in float32), the cache with those positions written). cross: `cross_keys_values` of the
    memory, leaves [B, S, ...] (B divides N: beams read their row's memory); memory_mask bool
    [B, S], or a visibility per query [B, G T, S] (`FidDecoder`; G = N / B)."""
    cfg = self.config
    # [N, T, D]
    embedded = self.encoder.embeddings.word_embeddings(decoder_input_ids)
    hidden, cache = self.decoder(embedded, index, cache, cross[:cfg.decoder_layers], memory_mask,
                                 deterministic=deterministic)
    # [N, T, V]: the readout tied to the word embeddings.
    logits = self.encoder.attend(hidden.astype(cfg.compute_dtype))
    if cfg.copy_head:
      copy_keys, memory_ids = cross[cfg.decoder_layers]
      visible = memory_mask[:, None, :] if memory_mask.ndim == 2 else memory_mask
      logits = self.copy(hidden, jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1),
                         copy_keys, memory_ids, visible)
    return nn.with_logical_constraint(logits, ("batch", "length", "vocab")), cache

  def __call__(self, input_ids: Array, input_mask: Array, decoder_input_ids: Array,
               type_ids: Array | None = None, *, deterministic: bool = True) -> Array:
    """Teacher-forced answer logits.

    Args:
      input_ids: int [B, K, L], one (query, passage) row per passage.
      input_mask: [B, K, L], nonzero on real tokens.
      decoder_input_ids: int [B, T], `shift_right(targets, bos_id)`; T <= max_answer_length.
      type_ids: int [B, K, L], or None (zeros).
      deterministic: disables dropout.

    Returns:
      [B, T, V] logits (compute dtype): position t predicts target t.
    """
    return self.teacher_forced(input_ids, input_mask, decoder_input_ids, type_ids,
                               deterministic=deterministic)[0]

  def teacher_forced(self, input_ids: Array, input_mask: Array, decoder_input_ids: Array,
                     type_ids: Array | None = None, *, deterministic: bool = True
                     ) -> tuple[Array, Cross, Array]:
    """`__call__`'s logits [B, T, V] with what more decodes over the same memory reuse (the
    retriever objectives' passes, `passage_log_likelihoods`, `left_out_log_likelihoods`): the
    memory as the decoder reads it (`Cross`: every decoder layer's cross-attention (keys,
    values), each [B, K L, heads, kv], and the copy head's), and its mask, bool [B, K L]."""
    cfg = self.config
    length = decoder_input_ids.shape[1]
    if length > cfg.max_answer_length:
      raise ValueError(f"FidModel: decoder length {length} exceeds max_answer_length="
                       f"{cfg.max_answer_length}.")
    encoded = self.encode(input_ids, input_mask, type_ids, deterministic=deterministic)
    # [B, K L, D], [B, K L]
    memory, memory_mask = concatenate_passages(encoded, input_mask)
    cross = self.cross_keys_values(memory, input_ids.reshape(memory_mask.shape))
    # The whole answer at once: a cache as long as it, written at position 0.
    logits, _ = self.decode(decoder_input_ids, jnp.zeros((), jnp.int32),
                            init_cache(cfg, decoder_input_ids.shape[0], length), cross,
                            memory_mask, deterministic=deterministic)
    return logits, cross, memory_mask


# ------------------------------------------------------------------ parameters


def init_params(config: FidConfig, rng: Array) -> Params:
  """Boxed (logically partitioned) parameters; `nn.unbox` gives the plain tree. They do not
  depend on the number or length of passages or answers."""
  input_ids = jnp.zeros((1, 2, 4), jnp.int32)
  return FidModel(config).init(rng, input_ids, jnp.ones_like(input_ids),
                               jnp.zeros((1, 2), jnp.int32))["params"]


def encoder_from_bert(params: Params, bert_params: Params) -> Params:
  """FiD parameters (plain tree) with the encoder taken from a BERT: `bert_params` is a
  `BertModel` tree (a checkpoint's `["encoder"]["bert"]` or a converted BERT); a pooler in it is
  left out. Raises ValueError when its layers or shapes differ from the encoder's."""
  bert = {name: tree for name, tree in bert_params.items() if name != "pooler"}
  expected = jax.tree_util.tree_structure(params["encoder"])
  if jax.tree_util.tree_structure(bert) != expected:
    raise ValueError(f"encoder_from_bert: the BERT's parameter tree {sorted(bert)} is not the "
                     f"FiD encoder's {sorted(params['encoder'])} (or their subtrees differ).")
  for (path, ours), theirs in zip(jax.tree_util.tree_leaves_with_path(params["encoder"]),
                                  jax.tree.leaves(bert)):
    if ours.shape != theirs.shape:
      raise ValueError(f"encoder_from_bert: {jax.tree_util.keystr(path)} is "
                       f"{tuple(theirs.shape)} in the BERT, {tuple(ours.shape)} in the encoder.")
  return {**params, "encoder": jax.tree.map(
      lambda ours, theirs: jnp.asarray(theirs, ours.dtype), params["encoder"], bert)}


# ------------------------------------------------ the retriever objectives' decodes


def split_passages(cross: Cross, memory_mask: Array, num_passages: int
                   ) -> tuple[Cross, Array]:
  """The memory of each passage alone: every leaf of `cross` [B, K L, ...] -> [B K, L, ...]
  (per layer (keys, values) [B, K L, heads, kv]), memory_mask [B, K L] -> [B K, L]; row
  b K + k is passage k of row b.
  The cross-attention projects every memory token on its own, and the encoder reads every
  passage row on its own, so these are exactly what a pass over passage k alone computes."""

  def split(x: Array) -> Array:
    batch, total = x.shape[:2]
    return x.reshape(batch * num_passages, total // num_passages, *x.shape[2:])

  return [(split(keys), split(values)) for keys, values in cross], split(memory_mask)


def leave_one_out_visibility(memory_mask: Array, num_passages: int, target_len: int) -> Array:
  """What each of K leave-one-out decodes sees of the memory: bool [B, K L] -> bool
  [B, K T, K L]. Decode k of row b (row b K + k of the decoder's [B K, T] input, its queries
  k T .. k T + T - 1 of memory row b) sees every real token but passage k's."""
  total = memory_mask.shape[1]
  passage = jnp.arange(total) // (total // num_passages)  # [K L] the passage of each token
  decode = jnp.arange(num_passages * target_len) // target_len  # [K T] the decode of each query
  others = passage[None, :] != decode[:, None]  # [K T, K L]
  return memory_mask.astype(bool)[:, None, :] & others[None]


def target_log_likelihoods(params: Params, config: FidConfig, cross: Cross,
                           memory_visible: Array, targets: Array, target_mask: Array, *,
                           repeats: int = 1) -> Array:
  """Teacher-forced `log p(y | memory)` of each row's target, summed over its counted tokens,
  with the decoder alone (its memory's keys and values given) and no dropout.

  Args:
    params: FidModel parameters (plain tree).
    config: the model's config.
    cross: the memory as the decoder reads it (`Cross`), leaves [R, S, ...].
    memory_visible: bool [R, S] (every decode of row r sees the same tokens) or [R, G T, S]
      (decode g of row r sees `memory_visible[r, g T + t]` at position t; G = repeats).
    targets: int [R, T], the answer tokens, EOS, padding.
    target_mask: [R, T], nonzero on the tokens that count.
    repeats: G, decodes of each row's target (rows r G .. r G + G - 1 of the decoder).

  Returns:
    float32 [R, G].
  """
  rows, length = targets.shape
  # [R G, T]: each target's decodes next to each other (FidAttention's groups).
  decoder_input_ids = jnp.repeat(shift_right(targets, config.bos_id), repeats, axis=0)
  logits, _ = FidModel(config).apply(
      {"params": params}, decoder_input_ids, jnp.zeros((), jnp.int32),
      init_cache(config, rows * repeats, length), cross, memory_visible,
      method=FidModel.decode)  # [R G, T, V]
  # [R G, T]
  token = token_log_probs(logits, jnp.repeat(targets, repeats, axis=0))
  weights = jnp.repeat(target_mask, repeats, axis=0).astype(jnp.float32)
  return jnp.sum(token * weights, axis=-1).reshape(rows, repeats)


def passage_log_likelihoods(params: Params, config: FidConfig, cross: Cross,
                            memory_mask: Array, num_passages: int, targets: Array,
                            target_mask: Array) -> Array:
  """`log p(y | z_k, x)`, the decoder reading passage k ALONE (EMDR^2's and PDist's
  likelihoods in Atlas): each passage's slice of the memory as its own memory row
  (`split_passages`), the target decoded once over each.

  Args:
    params, config: the FiD reader's.
    cross: the K passages' memory as the decoder reads it (`Cross`, leaves [B, K L, ...]:
      `FidModel.teacher_forced`).
    memory_mask: bool [B, K L].
    num_passages: K.
    targets, target_mask: [B, T].

  Returns:
    float32 [B, K], summed over the counted target tokens.
  """
  batch = targets.shape[0]
  cross, mask = split_passages(cross, memory_mask, num_passages)  # [B K, L, ...], [B K, L]
  return target_log_likelihoods(
      params, config, cross, mask, jnp.repeat(targets, num_passages, axis=0),
      jnp.repeat(target_mask, num_passages, axis=0)).reshape(batch, num_passages)


def left_out_log_likelihoods(params: Params, config: FidConfig,
                             cross: Cross, memory_mask: Array,
                             num_passages: int, targets: Array, target_mask: Array) -> Array:
  """`log p(y | Z \\ z_k, x)`, the decoder reading every passage but k (LOOP's in Atlas): the
  memory's keys and values computed once, K decodes of each target over it, decode k blind
  to passage k (`leave_one_out_visibility`); the cross-attention's softmax then runs over the
  other K - 1 passages' tokens, as it would with passage k removed. Args and returns as
  `passage_log_likelihoods`."""
  visible = leave_one_out_visibility(memory_mask, num_passages, targets.shape[1])
  return target_log_likelihoods(params, config, cross, visible, targets, target_mask,
                                repeats=num_passages)


# ------------------------------------------------------------------ searches


def greedy_search(step_fn: StepFn, state: Any, batch_size: int, max_len: int, *, bos_id: int,
                  eos_id: int, pad_id: int) -> Array:
  """Greedy decoding: each row takes the most probable next token until it takes EOS.

  Args:
    step_fn: see `StepFn`, over N = batch_size rows.
    state: its initial state, leaves leading with batch_size.
    batch_size, max_len: the output's shape.
    bos_id, eos_id, pad_id: the first input token, the last output token, the filler after it.

  Returns:
    int32 [batch_size, max_len]: the tokens up to and including EOS, then pad_id. A lax
    while loop; it stops once every row has taken EOS.
  """
  # [B, max_len]
  tokens = jnp.full((batch_size, max_len), pad_id, jnp.int32)

  def not_finished(carry):
    step, _, _, done, _ = carry
    return (step < max_len) & ~jnp.all(done)

  def advance(carry):
    step, tokens, last, done, state = carry
    # [B, V]
    log_probs, state = step_fn(last, step, state)
    # [B]
    chosen = jnp.where(done, pad_id, jnp.argmax(log_probs, axis=-1).astype(jnp.int32))
    tokens = jax.lax.dynamic_update_slice(tokens, chosen[:, None], (0, step))
    return step + 1, tokens, chosen, done | (chosen == eos_id), state

  carry = (jnp.zeros((), jnp.int32), tokens, jnp.full((batch_size,), bos_id, jnp.int32),
           jnp.zeros((batch_size,), bool), state)
  return jax.lax.while_loop(not_finished, advance, carry)[1]


def search_beams(step_fn: StepFn, state: Any, batch_size: int, beam_size: int, max_len: int, *,
                 bos_id: int, eos_id: int, pad_id: int,
                 length_penalty: float = 1.0) -> tuple[Array, Array]:
  """Beam search for the highest-scoring answers (every step and all max_len steps run).

  A hypothesis y_1 .. y_n scores `sum_t log p(y_t | y_<t) / n ** length_penalty` (n counts its
  EOS; 0: the plain log-probability; 1, the default, as transformers': the mean per token). It
  is finished when it takes EOS or reaches max_len tokens.

  Args:
    step_fn: see `StepFn`, over N = batch_size * beam_size rows (row b * beam_size + i is beam
      i of batch row b).
    state: its initial state, leaves leading with N (every beam of a row alike).
    batch_size, beam_size, max_len: the output's shape.
    bos_id, eos_id, pad_id: the first input token, the last output token, the filler after it.
    length_penalty: the exponent of the length normalisation.

  Returns:
    (int32 [batch_size, beam_size, max_len] tokens, float32 [batch_size, beam_size] scores),
    best first; a hypothesis that could never be completed scores -inf.
  """
  rows = batch_size * beam_size

  def normalised(log_probs: Array, length) -> Array:
    return log_probs / jnp.asarray(length, jnp.float32) ** length_penalty

  def keep_best(scores: Array, tokens: Array) -> tuple[Array, Array]:
    """The best beam_size of [B, X] scores and their tokens [B, X, max_len]."""
    scores, indices = jax.lax.top_k(scores, beam_size)  # [B, W]
    return scores, jnp.take_along_axis(tokens, indices[..., None], axis=1)

  def advance(step, carry):
    alive_tokens, alive_log_probs, last, state, finished_tokens, finished_scores = carry
    # [B, W, V]
    log_probs, state = step_fn(last.reshape(rows), step, state)
    vocab_size = log_probs.shape[-1]
    candidates = alive_log_probs[..., None] + log_probs.reshape(batch_size, beam_size, -1)

    # Every alive hypothesis + EOS is finished, at length step + 1: [B, W], [B, W, max_len].
    eos_scores = normalised(candidates[..., eos_id], step + 1)
    eos_tokens = alive_tokens.at[:, :, step].set(eos_id)
    finished_scores, finished_tokens = keep_best(
        jnp.concatenate([finished_scores, eos_scores], axis=1),
        jnp.concatenate([finished_tokens, eos_tokens], axis=1))

    # The best beam_size extensions by another token stay alive: [B, W] each.
    candidates = candidates.at[..., eos_id].set(_NEG_INF).reshape(batch_size, -1)
    alive_log_probs, flat = jax.lax.top_k(candidates, beam_size)
    parent, token = flat // vocab_size, (flat % vocab_size).astype(jnp.int32)
    alive_tokens = jnp.take_along_axis(alive_tokens, parent[..., None], axis=1)
    alive_tokens = alive_tokens.at[:, :, step].set(token)
    # [N]: each new beam's parent row; the state follows its hypothesis.
    parent_rows = (jnp.arange(batch_size)[:, None] * beam_size + parent).reshape(rows)
    state = jax.tree.map(lambda leaf: leaf[parent_rows], state)
    return alive_tokens, alive_log_probs, token, state, finished_tokens, finished_scores

  # Only beam 0 is alive at first (the others, -inf, would repeat it).
  alive_log_probs = jnp.full((batch_size, beam_size), _NEG_INF, jnp.float32).at[:, 0].set(0.0)
  tokens = jnp.full((batch_size, beam_size, max_len), pad_id, jnp.int32)
  carry = (tokens, alive_log_probs, jnp.full((batch_size, beam_size), bos_id, jnp.int32), state,
           tokens, jnp.full((batch_size, beam_size), _NEG_INF, jnp.float32))
  alive_tokens, alive_log_probs, _, _, finished_tokens, finished_scores = jax.lax.fori_loop(
      0, max_len, advance, carry)
  # Hypotheses still alive after max_len tokens finish there, without EOS.
  scores, tokens = keep_best(
      jnp.concatenate([finished_scores, normalised(alive_log_probs, max_len)], axis=1),
      jnp.concatenate([finished_tokens, alive_tokens], axis=1))
  return tokens, scores


# ------------------------------------------------------------------ decoding the model


def model_step_fn(params: Params, config: FidConfig, input_ids: Array, input_mask: Array,
                type_ids: Array | None) -> StepFn:
  """The FiD reader over passages [B, K, L] as a `StepFn` whose state is the self-attention
  cache (`init_cache(config, N, max_len)`, N a multiple of B: row n reads batch row
  n // (N / B)'s passages). The encoder and the memory's cross-attention keys and values run
  once, here; each step runs the decoder on one token per row."""
  model = FidModel(config)
  variables = {"params": params}
  # [B, K, L, D]
  encoded = model.apply(variables, input_ids, input_mask, type_ids, method=FidModel.encode)
  # [B, K L, D], [B, K L]
  memory, memory_mask = concatenate_passages(encoded, input_mask)
  # Per layer, [B, K L, heads, kv] each (and the copy head's).
  cross = model.apply(variables, memory, input_ids.reshape(memory_mask.shape),
                      method=FidModel.cross_keys_values)

  def step(tokens: Array, index: Array, cache: Cache) -> tuple[Array, Cache]:
    # [N, 1, V]
    logits, cache = model.apply(variables, tokens[:, None], index, cache, cross, memory_mask,
                                method=FidModel.decode)
    return jax.nn.log_softmax(logits[:, 0].astype(jnp.float32), axis=-1), cache

  return step


def _check_max_len(config: FidConfig, max_len: int) -> None:
  if not 1 <= max_len <= config.max_answer_length:
    raise ValueError(f"max_len={max_len}: expected 1 .. max_answer_length="
                     f"{config.max_answer_length}.")


@functools.partial(jax.jit, static_argnames=("config", "max_len"))
def greedy_decode(params: Params, config: FidConfig, input_ids: Array, input_mask: Array,
                  max_len: int, type_ids: Array | None = None) -> Array:
  """Greedy answers of the FiD reader (plain parameters; `greedy_search`).

  Args:
    params: FidModel parameters (plain tree).
    config: the model's config (static).
    input_ids, input_mask: [B, K, L], one (query, passage) row per passage.
    max_len: tokens to generate at most (static; <= max_answer_length).
    type_ids: [B, K, L] or None (zeros).

  Returns:
    int32 [B, max_len]: answer tokens, EOS, then pad_id.
  """
  _check_max_len(config, max_len)
  batch_size = input_ids.shape[0]
  step = model_step_fn(params, config, input_ids, input_mask, type_ids)
  return greedy_search(step, init_cache(config, batch_size, max_len), batch_size, max_len,
                       bos_id=config.bos_id, eos_id=config.eos_id, pad_id=config.pad_id)


@functools.partial(jax.jit, static_argnames=("config", "beam_size", "max_len"))
def beam_search(params: Params, config: FidConfig, input_ids: Array, input_mask: Array,
                beam_size: int, max_len: int, length_penalty: float = 1.0,
                type_ids: Array | None = None) -> tuple[Array, Array]:
  """Beam-searched answers of the FiD reader (`search_beams`; args as `greedy_decode`).

  Returns:
    (int32 [B, beam_size, max_len] tokens (answer, EOS, pad_id; a hypothesis without EOS fills
    max_len), float32 [B, beam_size] scores: log-probability / length ** length_penalty), best
    first.
  """
  _check_max_len(config, max_len)
  batch_size = input_ids.shape[0]
  step = model_step_fn(params, config, input_ids, input_mask, type_ids)
  return search_beams(step, init_cache(config, batch_size * beam_size, max_len), batch_size,
                      beam_size, max_len, bos_id=config.bos_id, eos_id=config.eos_id,
                      pad_id=config.pad_id, length_penalty=length_penalty)


def sequence_log_probs(logits: Array, tokens: Array, eos_id: int) -> Array:
  """The log-probability of decoded answers under teacher-forced logits [B, T, V] of their
  own tokens [B, T]: the sum over the tokens up to and including the first EOS (all T when
  none) -> float32 [B]."""
  # [B, T]: positions after the first EOS do not count.
  after_eos = jnp.cumsum(tokens == eos_id, axis=1) - (tokens == eos_id)
  return jnp.sum(jnp.where(after_eos == 0, token_log_probs(logits, tokens), 0.0), axis=1)


def answer_lengths(tokens: Array, eos_id: int) -> Array:
  """Tokens [B, T] -> [B] the answers' lengths, EOS included (T when none)."""
  is_eos = tokens == eos_id
  return jnp.where(is_eos.any(axis=1), jnp.argmax(is_eos, axis=1) + 1, tokens.shape[1])
