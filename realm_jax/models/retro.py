"""RETRO (Borgeaud et al. 2022): a causal decoder that reads retrieved text through chunked
cross-attention (CCA).

The input is l chunks of m tokens; chunk u's k neighbours (a retrieved chunk and its
continuation, r = 2m tokens each) arrive as neighbour_ids [B, l, k, r]. A small encoder reads
them, cross-attending to the decoder's activations of chunk u, and the decoder's CCA layers let
the last token of chunk u and the first m - 1 of chunk u + 1 read them, so the model stays
causal. Rotary positions; with `neighbour_ids=None` a plain decoder on the same parameters
(RETRO-fitting trains `retrieval_parameter_mask`'s leaves). Design:
docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from realm_jax.models import losses
from realm_jax.models.bert import FeedForward, layer_norm, param_init, zeros_init
from realm_jax.models.config import ACTIVATIONS, ShapeProperties

Array = jax.Array
Params = Any

# Parameter subtrees that only retrieval uses: RETRO-fitting trains these and freezes the rest.
RETRIEVAL_MODULES = ("neighbour_encoder", "cca", "cca_layer_norm")


@dataclasses.dataclass(frozen=True)
class RetroConfig(ShapeProperties):
  """Shapes and numerics of a RETRO model. Defaults: the paper's 172M model with the
  repository's WordPiece vocabulary. Field names shared with BertConfig let bert.py's layers
  take a RetroConfig. The number of neighbours k is the batch's neighbour_ids.shape[2].

  Attributes:
    vocab_size, hidden_size, num_layers, intermediate_size, hidden_act: decoder and encoder.
    num_heads: heads of every attention; must divide `hidden_size` into an even head width.
    chunk_size: m, the tokens of one chunk (one retrieval).
    neighbour_len: r, the tokens of one neighbour (retrieved chunk + continuation; 2m).
    encoder_layers: layers of the neighbour encoder (2).
    cca_start, cca_every: CCA in every `cca_every`-th decoder layer from `cca_start` (from 0);
      the encoder reads the decoder's activations at `cca_start`.
    rotary_base: the wavelength base of the rotary embeddings.
    cross_attention_positions: rotary positions in the encoder's cross-attention and in CCA;
      False: those two match by content only.
    layer_norm_eps, initializer_range, hidden_dropout, attention_dropout: as BertConfig's.
    dtype, param_dtype: compute dtype ("float32" or "bfloat16") and parameter storage dtype.
  """

  vocab_size: int = 30522
  hidden_size: int = 896
  num_layers: int = 12
  num_heads: int = 16
  intermediate_size: int = 3584
  hidden_act: str = "gelu"
  chunk_size: int = 64
  neighbour_len: int = 128
  encoder_layers: int = 2
  cca_start: int = 5
  cca_every: int = 3
  rotary_base: float = 10000.0
  cross_attention_positions: bool = True
  layer_norm_eps: float = 1e-5
  initializer_range: float = 0.02
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  dtype: str = "float32"
  param_dtype: str = "float32"

  def __post_init__(self):
    if self.hidden_size % self.num_heads or self.head_dim % 2:
      raise ValueError(f"RetroConfig: hidden_size={self.hidden_size} must split into "
                       f"num_heads={self.num_heads} heads of even width (rotary pairs).")
    if not 0 <= self.cca_start < self.num_layers or self.cca_every < 1:
      raise ValueError(f"RetroConfig: cca_start={self.cca_start}, cca_every={self.cca_every} "
                       f"name no CCA layer among num_layers={self.num_layers}.")
    if min(self.chunk_size, self.neighbour_len, self.encoder_layers) < 1:
      raise ValueError(f"RetroConfig: chunk_size={self.chunk_size}, neighbour_len="
                       f"{self.neighbour_len}, encoder_layers={self.encoder_layers}; expected "
                       f">= 1 each.")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"RetroConfig: hidden_act={self.hidden_act!r} is not one of "
                       f"{ACTIVATIONS}.")
    for field in ("dtype", "param_dtype"):
      if getattr(self, field) not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"RetroConfig: {field}={getattr(self, field)!r}; expected 'float32', "
                         f"'bfloat16' or 'float16'.")

  @classmethod
  def tiny(cls, **overrides) -> "RetroConfig":
    """Unit-test sizes (seconds on CPU): 5 layers with CCA in layers 1 and 4, m = 4, r = 8."""
    defaults = dict(vocab_size=64, hidden_size=16, num_layers=5, num_heads=2,
                    intermediate_size=32, chunk_size=4, neighbour_len=8, encoder_layers=2,
                    cca_start=1, cca_every=3, hidden_dropout=0.0, attention_dropout=0.0)
    return cls(**{**defaults, **overrides})

  @property
  def cca_layers(self) -> tuple[int, ...]:
    """Indices (from 0) of the decoder layers with chunked cross-attention."""
    return tuple(range(self.cca_start, self.num_layers, self.cca_every))


# ----------------------------------------------------------------------- pure functions


def rotary_embedding(x: Array, positions: Array, base: float) -> Array:
  """Rotates x [..., length, heads, head_dim] by its positions [length] (RoPE).

  Feature pairs (j, j + head_dim / 2) turn by positions * base^(-2j / head_dim), so the dot
  product of a rotated query and key depends on their positions only through the difference.
  """
  half = x.shape[-1] // 2
  # [half]
  frequencies = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  # [length, 1, half]: one angle per position and pair, broadcast over heads.
  angles = (positions.astype(jnp.float32)[:, None] * frequencies[None])[:, None, :]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x32 = x.astype(jnp.float32)
  first, second = x32[..., :half], x32[..., half:]  # [..., length, heads, half]
  rotated = jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)
  return rotated.astype(x.dtype)


def causal_mask(length: int) -> Array:
  """[1, length, length] bool: query i sees keys j <= i."""
  return jnp.tril(jnp.ones((length, length), bool))[None]


def attending_chunks(hidden: Array, chunk_size: int) -> Array:
  """[B, n, D] -> [B, l, m, D]: row u holds positions (u + 1) m - 1 .. (u + 2) m - 2, the
  tokens that read chunk u's neighbours (the last m - 1 rows of row l - 1, past the sequence,
  are zero padding)."""
  batch, length, features = hidden.shape
  shift = chunk_size - 1
  # [B, n, D]: the sequence shifted left by m - 1, zeros after its end.
  shifted = jnp.pad(hidden[:, shift:], ((0, 0), (0, shift), (0, 0)))
  return shifted.reshape(batch, length // chunk_size, chunk_size, features)


def merge_attending_chunks(chunked: Array, chunk_size: int) -> Array:
  """Inverse of `attending_chunks`: [B, l, m, D] -> [B, n, D], positions 0 .. m - 2 zero (they
  read no neighbours) and the padding rows dropped."""
  batch, num_chunks, _, features = chunked.shape
  length = num_chunks * chunk_size
  shift = chunk_size - 1
  flat = chunked.reshape(batch, length, features)
  return jnp.pad(flat[:, :length - shift], ((0, 0), (shift, 0), (0, 0)))


def next_token_losses(logits: Array, input_ids: Array) -> Array:
  """Per-token next-token cross entropy in nats: position t's logits against token t + 1.

  Args:
    logits: [B, n, V] (any float dtype; normalised in float32).
    input_ids: int [B, n].

  Returns:
    float32 [B, n - 1]; entry t is -log p(x_{t+1} | x_{<=t}, neighbours of complete chunks).
  """
  # losses' target log-softmax with its hand-written gradient, read as one "candidate".
  # [B, 1, n - 1]
  log_probs = losses.mlm_token_log_probs(logits[:, None, :-1], input_ids[:, 1:])
  return -log_probs[:, 0]


# ---------------------------------------------------------------------------- modules


class RetroAttention(nn.Module):
  """Multi-head attention of `x` over `context` (self-attention when they are the same);
  bert.SelfAttention's parameter names and logical axes, scores and softmax in float32."""

  config: RetroConfig
  # Rotate queries and keys by their positions 0 .. (self-attention).
  rotary: bool = False

  @nn.compact
  def __call__(self, x: Array, context: Array, visible: Array | None, *,
               deterministic: bool, positions: tuple[Array, Array] | None = None) -> Array:
    """[batch, queries, embed] over [batch, keys, embed] -> [batch, queries, embed].

    `visible`: bool, broadcastable to [batch, queries, keys], or None (all visible). A query
    that sees no key gets a zero output (a chunk without neighbours reads nothing), where a
    softmax over all-masked scores would spread its weight over the padding.
    `positions`: (query positions [queries], key positions [keys]) to rotate by; with
    `rotary`, both default to 0, 1, ...; without either, no rotation.
    """
    cfg = self.config

    def heads(name: str, inputs: Array) -> Array:
      # [batch, rows, heads, kv]
      out = nn.DenseGeneral(
          features=(cfg.num_heads, cfg.head_dim), axis=-1, dtype=cfg.compute_dtype,
          param_dtype=cfg.storage_dtype, kernel_init=param_init(cfg, ("embed", "heads", "kv")),
          bias_init=zeros_init(("heads", "kv")), name=name)(inputs)
      return nn.with_logical_constraint(out, ("batch", "length", "heads", "kv"))

    query, key, value = heads("query", x), heads("key", context), heads("value", context)
    if positions is None and self.rotary:
      positions = (jnp.arange(query.shape[1]), jnp.arange(key.shape[1]))
    if positions is not None:
      query = rotary_embedding(query, positions[0], cfg.rotary_base)
      key = rotary_embedding(key, positions[1], cfg.rotary_base)
    # [batch, heads, queries, keys]
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key,
                        preferred_element_type=jnp.float32) / math.sqrt(cfg.head_dim)
    if visible is not None:
      visible = visible[:, None]  # [batch | 1, 1, queries | 1, keys]
      scores = jnp.where(visible, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    if visible is not None:
      probs = jnp.where(visible.any(axis=-1, keepdims=True), probs, 0.0)
    probs = nn.Dropout(cfg.attention_dropout)(
        probs.astype(cfg.compute_dtype), deterministic=deterministic)
    # [batch, queries, heads, kv]
    attended = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
    attended = nn.with_logical_constraint(attended, ("batch", "length", "heads", "kv"))
    # [batch, queries, embed]
    return nn.DenseGeneral(
        features=cfg.hidden_size, axis=(-2, -1), dtype=cfg.compute_dtype,
        param_dtype=cfg.storage_dtype, kernel_init=param_init(cfg, ("heads", "kv", "embed")),
        bias_init=zeros_init(("embed",)), name="out")(attended)


class ChunkedCrossAttention(nn.Module):
  """CCA (module docstring): the output a token adds to the residual stream, 0 at positions
  0 .. m - 2; parameters under `attention`."""

  config: RetroConfig

  @nn.compact
  def __call__(self, hidden: Array, encoded: Array, neighbour_mask: Array, *,
               deterministic: bool) -> Array:
    """Chunked cross-attention of the decoder over its encoded neighbours.

    Args:
      hidden: [B, n, D], the (normalised) decoder activations, n = l m.
      encoded: [B, l, k, r, D], the neighbours of each chunk, encoded.
      neighbour_mask: bool [B, l, k, r], the real neighbour tokens.
      deterministic: disables dropout.

    Returns:
      [B, n, D].
    """
    batch, num_chunks, num_neighbours, neighbour_len, features = encoded.shape
    m = self.config.chunk_size
    # [B l, m, D]: the tokens that read chunk u's neighbours, one row per chunk.
    queries = attending_chunks(hidden, m).reshape(batch * num_chunks, m, features)
    # [B l, k r, D]: all neighbours of a chunk read at once, neighbour and time merged.
    keys = encoded.reshape(batch * num_chunks, num_neighbours * neighbour_len, features)
    # [B l, 1, k r]
    visible = neighbour_mask.reshape(batch * num_chunks, 1, num_neighbours * neighbour_len)
    positions = None
    if self.config.cross_attention_positions:
      # [m], [k r]: chunk u's axis (module docstring): readers at m - 1 .. 2m - 2, each
      # neighbour's tokens at 0 .. r - 1.
      positions = (m - 1 + jnp.arange(m), jnp.tile(jnp.arange(neighbour_len), num_neighbours))
    # [B l, m, D]
    out = RetroAttention(self.config, name="attention")(
        queries, keys, visible, deterministic=deterministic, positions=positions)
    # [B, n, D]
    return merge_attending_chunks(out.reshape(batch, num_chunks, m, features), m)


class RetroEncoderLayer(nn.Module):
  """One pre-LN encoder layer: bidirectional self-attention within each neighbour, cross-
  attention of a chunk's neighbour tokens to the chunk's decoder activations, feed-forward."""

  config: RetroConfig

  @nn.compact
  def __call__(self, encoded: Array, context: Array, visible: Array, *,
               deterministic: bool) -> Array:
    """Neighbours [B l k, r, D], chunk context H_u [B l, m, D] and visible [B l k, 1, r]
    -> [B l k, r, D]."""
    cfg = self.config
    dropout = nn.Dropout(cfg.hidden_dropout)

    def norm(name: str, x: Array) -> Array:
      return layer_norm(cfg.layer_norm_eps, cfg, name=name)(x)

    h = norm("self_attention_layer_norm", encoded)
    attended = RetroAttention(cfg, rotary=True, name="self_attention")(
        h, h, visible, deterministic=deterministic)
    encoded = encoded + dropout(attended, deterministic=deterministic)

    rows, neighbour_len, features = encoded.shape
    num_chunk_rows = context.shape[0]
    # [B l, k r, D]: every neighbour token of chunk u reads the same H_u, so the k neighbours
    # share one query axis and H_u's keys and values are projected once per chunk.
    h = norm("cross_attention_layer_norm", encoded).reshape(num_chunk_rows, -1, features)
    positions = None
    if cfg.cross_attention_positions:
      # [k r], [m]: neighbour token j at j, H_u's token i at i (module docstring).
      positions = (jnp.tile(jnp.arange(neighbour_len), rows // num_chunk_rows),
                   jnp.arange(context.shape[1]))
    attended = RetroAttention(cfg, name="cross_attention")(
        h, context, None, deterministic=deterministic,
        positions=positions).reshape(rows, neighbour_len, features)
    encoded = encoded + dropout(attended, deterministic=deterministic)

    h = FeedForward(cfg, name="mlp")(norm("mlp_layer_norm", encoded))
    encoded = encoded + dropout(h, deterministic=deterministic)
    return nn.with_logical_constraint(encoded, ("batch", "length", "embed"))


class RetroNeighbourEncoder(nn.Module):
  """Encodes each chunk's neighbours conditioned on the chunk's decoder activations.

  `token_embeddings` is the decoder's embedding table (the paper's Emb_enc "may be shared with
  the decoder"); its parameters stay the decoder's.
  """

  config: RetroConfig
  token_embeddings: nn.Module

  def setup(self):
    cfg = self.config
    # H is the decoder's raw residual stream; normalised once for the encoder's keys.
    self.context_layer_norm = layer_norm(cfg.layer_norm_eps, cfg, name="context_layer_norm")
    self.layers = [RetroEncoderLayer(cfg, name=f"layer_{j}") for j in range(cfg.encoder_layers)]
    self.final_layer_norm = layer_norm(cfg.layer_norm_eps, cfg, name="final_layer_norm")
    self.dropout = nn.Dropout(cfg.hidden_dropout)

  def __call__(self, neighbour_ids: Array, decoder_hidden: Array, neighbour_mask: Array, *,
               deterministic: bool = True) -> Array:
    """Encodes the neighbours.

    Args:
      neighbour_ids: int [B, l, k, r].
      decoder_hidden: [B, n, D], the decoder's activations H (n = l m).
      neighbour_mask: bool [B, l, k, r], the real neighbour tokens.
      deterministic: disables dropout.

    Returns:
      float32 [B, l, k, r, D].
    """
    batch, num_chunks, num_neighbours, neighbour_len = neighbour_ids.shape
    m, features = self.config.chunk_size, self.config.hidden_size
    # [B l k, r, D]
    encoded = self.token_embeddings(neighbour_ids).astype(jnp.float32).reshape(
        -1, neighbour_len, features)
    encoded = self.dropout(encoded, deterministic=deterministic)
    # [B l, m, D]: H_u, the activations of chunk u's own tokens.
    context = self.context_layer_norm(decoder_hidden).reshape(batch * num_chunks, m, features)
    # [B l k, 1, r]: padding keys are hidden from the neighbour's own self-attention.
    visible = neighbour_mask.reshape(-1, 1, neighbour_len)
    for layer in self.layers:
      encoded = layer(encoded, context, visible, deterministic=deterministic)
    encoded = self.final_layer_norm(encoded)
    return encoded.reshape(batch, num_chunks, num_neighbours, neighbour_len, features)


class RetroDecoderLayer(nn.Module):
  """One pre-LN decoder layer, in the three steps the model interleaves with the encoder:
  causal self-attention, CCA (only when `has_cca`), feed-forward."""

  config: RetroConfig
  has_cca: bool = False

  def setup(self):
    cfg = self.config
    norm = functools.partial(layer_norm, cfg.layer_norm_eps, cfg)
    self.self_attention_layer_norm = norm(name="self_attention_layer_norm")
    self.self_attention = RetroAttention(cfg, rotary=True)
    if self.has_cca:
      self.cca_layer_norm = norm(name="cca_layer_norm")
      self.cca = ChunkedCrossAttention(cfg)
    self.mlp_layer_norm = norm(name="mlp_layer_norm")
    self.mlp = FeedForward(cfg)
    self.dropout = nn.Dropout(cfg.hidden_dropout)

  def _residual(self, hidden: Array, branch: Array, deterministic: bool) -> Array:
    out = hidden + self.dropout(branch, deterministic=deterministic)
    return nn.with_logical_constraint(out, ("batch", "length", "embed"))

  def attend_causally(self, hidden: Array, *, deterministic: bool) -> Array:
    """[B, n, D] -> [B, n, D]: h + SelfAttention(LN h), causal."""
    h = self.self_attention_layer_norm(hidden)
    attended = self.self_attention(h, h, causal_mask(hidden.shape[1]),
                                   deterministic=deterministic)
    return self._residual(hidden, attended, deterministic)

  def attend_neighbours(self, hidden: Array, encoded: Array, neighbour_mask: Array, *,
                        deterministic: bool) -> Array:
    """[B, n, D], encoded [B, l, k, r, D], mask [B, l, k, r] -> [B, n, D]: h + CCA(LN h, E)."""
    attended = self.cca(self.cca_layer_norm(hidden), encoded, neighbour_mask,
                        deterministic=deterministic)
    return self._residual(hidden, attended, deterministic)

  def feed_forward(self, hidden: Array, *, deterministic: bool) -> Array:
    """[B, n, D] -> [B, n, D]: h + FFW(LN h)."""
    return self._residual(hidden, self.mlp(self.mlp_layer_norm(hidden)), deterministic)


class RetroModel(nn.Module):
  """RETRO (module docstring): token ids and their chunks' neighbours -> next-token logits.

  Parameters: token_embeddings, layer_{i} (self_attention, mlp and their LayerNorms; cca and
  cca_layer_norm in `config.cca_layers`), neighbour_encoder, final_layer_norm.
  """

  config: RetroConfig

  def setup(self):
    cfg = self.config
    self.token_embeddings = nn.Embed(
        cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype,
        embedding_init=param_init(cfg, ("vocab", "embed")))
    self.embedding_dropout = nn.Dropout(cfg.hidden_dropout)
    self.layers = [RetroDecoderLayer(cfg, i in cfg.cca_layers, name=f"layer_{i}")
                   for i in range(cfg.num_layers)]
    self.neighbour_encoder = RetroNeighbourEncoder(cfg, self.token_embeddings)
    self.final_layer_norm = layer_norm(cfg.layer_norm_eps, cfg, name="final_layer_norm")

  def __call__(self, input_ids: Array, neighbour_ids: Array | None = None,
               neighbour_mask: Array | None = None, *, deterministic: bool = True) -> Array:
    """Next-token logits.

    Args:
      input_ids: int [B, n]; n = l m when `neighbour_ids` is given.
      neighbour_ids: int [B, l, k, r], the neighbours retrieved with each chunk, or None:
        retrieval off (a plain decoder; the encoder and CCA add nothing).
      neighbour_mask: [B, l, k, r], nonzero for real neighbour tokens; all ones when None. A
        chunk whose neighbours are all masked adds nothing to the tokens that read it.
      deterministic: disables dropout.

    Returns:
      [B, n, V] logits; position t predicts token t + 1.
    """
    hidden, _ = self._run(input_ids, neighbour_ids, neighbour_mask, deterministic, False)
    return self.token_embeddings.attend(hidden.astype(self.config.compute_dtype))

  def encode_neighbours(self, input_ids: Array, neighbour_ids: Array,
                        neighbour_mask: Array | None = None, *,
                        deterministic: bool = True) -> Array:
    """The encoded neighbours E [B, l, k, r, D] that the CCA layers read (args: __call__)."""
    return self._run(input_ids, neighbour_ids, neighbour_mask, deterministic, True)[1]

  def _run(self, input_ids: Array, neighbour_ids: Array | None, neighbour_mask: Array | None,
           deterministic: bool, stop_at_encoder: bool) -> tuple[Array, Array | None]:
    """(final hidden states [B, n, D], encoded neighbours [B, l, k, r, D] or None)."""
    cfg = self.config
    if neighbour_ids is not None:
      neighbour_mask = _check_neighbours(cfg, input_ids, neighbour_ids, neighbour_mask)
    # [B, n, D]; float32, so the residual stream stays float32 under bfloat16 compute.
    hidden = self.token_embeddings(input_ids).astype(jnp.float32)
    hidden = self.embedding_dropout(hidden, deterministic=deterministic)
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "embed"))
    encoded = None
    for index, layer in enumerate(self.layers):
      hidden = layer.attend_causally(hidden, deterministic=deterministic)
      if neighbour_ids is not None and index == cfg.cca_start:
        # [B, l, k, r, D], conditioned on H = this layer's stream before its CCA.
        encoded = self.neighbour_encoder(neighbour_ids, hidden, neighbour_mask,
                                         deterministic=deterministic)
        if stop_at_encoder:
          return hidden, encoded
      if layer.has_cca and encoded is not None:
        hidden = layer.attend_neighbours(hidden, encoded, neighbour_mask,
                                         deterministic=deterministic)
      hidden = layer.feed_forward(hidden, deterministic=deterministic)
    return self.final_layer_norm(hidden), encoded


def _check_neighbours(config: RetroConfig, input_ids: Array, neighbour_ids: Array,
                      neighbour_mask: Array | None) -> Array:
  """Raises on shapes that do not chunk; returns the neighbour mask as bool [B, l, k, r]."""
  length = input_ids.shape[-1]
  m = config.chunk_size
  if (neighbour_ids.ndim != 4 or length % m or neighbour_ids.shape[1] != length // m
      or neighbour_ids.shape[3] != config.neighbour_len):
    raise ValueError(
        f"RetroModel: input length {length} and neighbour_ids {neighbour_ids.shape} do not "
        f"chunk; expected a multiple of chunk_size={m} and [B, length / {m}, k, "
        f"neighbour_len={config.neighbour_len}].")
  if neighbour_mask is None:
    return jnp.ones(neighbour_ids.shape, bool)
  return jnp.asarray(neighbour_mask).astype(bool)


# ------------------------------------------------------------------ parameters and cost


def init_params(config: RetroConfig, rng: Array, num_neighbours: int = 1) -> Params:
  """Boxed (logically partitioned) parameters of the whole model, encoder and CCA included
  (an init without neighbours would build the plain decoder's only). They do not depend on
  the number of neighbours or chunks; `nn.unbox` gives the plain tree."""
  input_ids = jnp.zeros((1, 2 * config.chunk_size), jnp.int32)
  neighbour_ids = jnp.zeros((1, 2, num_neighbours, config.neighbour_len), jnp.int32)
  return RetroModel(config).init(rng, input_ids, neighbour_ids)["params"]


def _path_names(path) -> list[str]:
  return [str(getattr(key, "key", getattr(key, "name", key))) for key in path]


def retrieval_parameter_mask(params: Params) -> Params:
  """A tree of bools shaped like `params` (boxed or not): True on the neighbour encoder's and
  the CCA layers' leaves (what RETRO-fitting trains), False on the decoder's (frozen)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: any(name in RETRIEVAL_MODULES for name in _path_names(path)), params)


def parameter_counts(params: Params) -> dict[str, int]:
  """Scalars in `params` (plain tree): total, retrieval (encoder + CCA) and decoder."""
  sizes = [int(math.prod(leaf.shape)) for leaf in jax.tree.leaves(params)]
  selected = jax.tree.leaves(retrieval_parameter_mask(params))
  retrieval = sum(size for size, on in zip(sizes, selected) if on)
  return {"total": sum(sizes), "retrieval": retrieval, "decoder": sum(sizes) - retrieval}


def flops_per_token(config: RetroConfig, context_length: int, num_neighbours: int = 0) -> float:
  """Approximate forward FLOPs per decoder token (training: about 3x): matrix products only,
  2 FLOPs per multiply-add, decoder plus CCA plus neighbour encoder (the terms:
  docs/design/models_and_jobs.md).

  Args:
    config: the model.
    context_length: n, the decoder's sequence length.
    num_neighbours: k; 0 gives the decoder alone (retrieval off).

  Returns:
    FLOPs per decoder token.
  """
  d, f, n = config.hidden_size, config.intermediate_size, context_length
  m, r, k = config.chunk_size, config.neighbour_len, num_neighbours
  decoder = config.num_layers * (8 * d * d + 4 * d * f + 4 * n * d) + 2 * d * config.vocab_size
  if k == 0:
    return float(decoder)
  neighbour_tokens_per_token = k * r / m
  cca = len(config.cca_layers) * (
      4 * d * d + 4 * d * d * neighbour_tokens_per_token + 4 * k * r * d)
  per_encoded_token = 8 * d * d + 4 * d * d + 4 * d * f + 4 * r * d + 4 * m * d
  encoder = config.encoder_layers * (
      neighbour_tokens_per_token * per_encoded_token + 4 * d * d)
  return float(decoder + cca + encoder)
