"""Model configurations: BERT shapes and the REALM heads on top of them.

Configs are frozen dataclasses of plain Python values (dtypes are strings) so they can be
bound from gin, written next to a checkpoint as JSON and compared for equality.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from realm_jax.data import vocab as vocab_lib

# Activation names as transformers' `hidden_act` spells them. REALM uses `gelu_new` (the tanh
# approximation); plain BERT checkpoints such as all-MiniLM use `gelu` (the exact erf form).
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
POSITION_INITS = ("normal", "sinusoidal", "neighbours")


class ShapeProperties:
  """What bert.py's layers read from any model config: the width of one attention head and
  the compute and storage dtypes as jnp dtypes. A config mixing this in has `hidden_size`,
  `num_heads`, `dtype` and `param_dtype` (fields or properties)."""

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def compute_dtype(self) -> Any:
    return jnp.dtype(self.dtype)

  @property
  def storage_dtype(self) -> Any:
    return jnp.dtype(self.param_dtype)


@dataclasses.dataclass(frozen=True)
class BertConfig(ShapeProperties):
  """Shapes and numerics of a BERT encoder (REALM_SPEC 4: BERT-base defaults).

  Attributes:
    vocab_size: WordPiece vocabulary size (30522 for BERT uncased).
    hidden_size: width of the residual stream ("embed").
    num_layers: transformer layers.
    num_heads: attention heads; must divide `hidden_size`.
    intermediate_size: width of the feed-forward layer ("mlp").
    hidden_act: activation of the feed-forward layer and the MLM transform.
    max_position_embeddings: learned absolute positions.
    type_vocab_size: token types (segments).
    layer_norm_eps: epsilon of every BERT LayerNorm.
    initializer_range: std of the truncated-normal initialiser.
    hidden_dropout: dropout on embeddings and residual branches.
    attention_dropout: dropout on attention probabilities.
    dtype: compute dtype ("float32" or "bfloat16"); parameters stay in `param_dtype`.
    param_dtype: storage dtype of the parameters.
    position_init: how the position embeddings start: "normal", "sinusoidal" or "neighbours"
      (design notes); only the initialisation differs.
    adapter_size: width of the bottleneck adapters (`models.peft.BottleneckAdapter`); 0: none.
  """

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu_new"
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  hidden_dropout: float = 0.1
  attention_dropout: float = 0.1
  dtype: str = "float32"
  param_dtype: str = "float32"
  position_init: str = "normal"
  adapter_size: int = 0

  def __post_init__(self):
    if isinstance(self.adapter_size, bool) or not isinstance(self.adapter_size, int) or (
        self.adapter_size < 0):
      raise ValueError(f"BertConfig: adapter_size={self.adapter_size!r}; expected an integer "
                       f">= 0 (0: no adapters).")
    if self.hidden_size % self.num_heads:
      raise ValueError(
          f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
          f"num_heads={self.num_heads}.")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(
          f"BertConfig: hidden_act={self.hidden_act!r} is not one of {ACTIVATIONS}.")
    if self.position_init not in POSITION_INITS:
      raise ValueError(f"BertConfig: position_init={self.position_init!r} is not one of "
                       f"{POSITION_INITS}.")
    if self.position_init == "neighbours" and (
        self.num_heads < 2 or self.head_dim < 2 or self.hidden_size < 8):
      raise ValueError(f"BertConfig: position_init='neighbours' needs at least 2 heads of "
                       f"width >= 2 and hidden_size >= 8 (num_heads={self.num_heads}, "
                       f"hidden_size={self.hidden_size}).")
    for field in ("dtype", "param_dtype"):
      value = getattr(self, field)
      if value not in ("float32", "bfloat16", "float16"):
        raise ValueError(
            f"BertConfig: {field}={value!r}; expected 'float32', 'bfloat16' or 'float16'.")


RETRIEVER_POOLINGS = ("cls", "mean")
RETRIEVER_QUERY_MASKS = ("read", "ignore")


@dataclasses.dataclass(frozen=True)
class RealmConfig:
  """REALM's retriever and reader heads over a BERT encoder (REALM_SPEC 1-6).

  Attributes:
    bert: the encoder shared in shape (not in parameters) by every tower.
    proj_size: retriever embedding size (128).
    proj_layer_norm_eps: epsilon of the projection LayerNorm (the port's 1e-12, not ICT's 1e-3).
    proj_dropout: dropout on the 128-d embedding in training.
    retriever_pooling: "cls", the [CLS] hidden state (REALM_SPEC 1), or "mean" over real tokens
      (for retrievers trained from random weights).
    retriever_query_masks: "read" a query's `[MASK]` wordpieces (REALM) or "ignore" them.
    mask_token_id: the vocabulary's `[MASK]` id (default `realm_jax.data.vocab.MASK_ID`).
    share_embedders: tie the query and document embedders (the release's default).
    span_hidden_size: width of the span start/end projections (256).
    max_span_width: longest answer span in wordpieces (10).
    span_layer_norm_eps: epsilon of the span LayerNorm (1e-3, as ORQA and the port).
    invalid_span_logit: added to a span not inside the block (excluded from argmax and softmax).
  """

  bert: BertConfig = dataclasses.field(default_factory=BertConfig)
  proj_size: int = 128
  proj_layer_norm_eps: float = 1e-12
  proj_dropout: float = 0.0
  retriever_pooling: str = "cls"
  retriever_query_masks: str = "read"
  mask_token_id: int = vocab_lib.MASK_ID
  share_embedders: bool = True
  span_hidden_size: int = 256
  max_span_width: int = 10
  span_layer_norm_eps: float = 1e-3
  invalid_span_logit: float = -10000.0

  def __post_init__(self):
    if self.retriever_pooling not in RETRIEVER_POOLINGS:
      raise ValueError(f"RealmConfig: retriever_pooling={self.retriever_pooling!r} is not one "
                       f"of {RETRIEVER_POOLINGS}.")
    if self.retriever_query_masks not in RETRIEVER_QUERY_MASKS:
      raise ValueError(f"RealmConfig: retriever_query_masks={self.retriever_query_masks!r} is "
                       f"not one of {RETRIEVER_QUERY_MASKS}.")

  def replace(self, **changes) -> "RealmConfig":
    """Returns a copy with `changes`; keys prefixed `bert.` change the BERT config."""
    bert_changes = {k[len("bert."):]: v for k, v in changes.items() if k.startswith("bert.")}
    own = {k: v for k, v in changes.items() if not k.startswith("bert.")}
    bert = dataclasses.replace(own.pop("bert", self.bert), **bert_changes)
    return dataclasses.replace(self, bert=bert, **own)


# Named sizes. `tiny` is for unit tests (seconds on CPU), `small` for the toy world, `base` is
# BERT-base as in the paper.
def tiny_bert(**overrides) -> BertConfig:
  defaults = dict(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=4,
                  intermediate_size=64, max_position_embeddings=512)
  return BertConfig(**{**defaults, **overrides})


def small_bert(**overrides) -> BertConfig:
  defaults = dict(vocab_size=30522, hidden_size=256, num_layers=4, num_heads=4,
                  intermediate_size=1024)
  return BertConfig(**{**defaults, **overrides})


def base_bert(**overrides) -> BertConfig:
  return BertConfig(**overrides)


def config_to_dict(config: RealmConfig | BertConfig) -> dict:
  """A JSON-ready dict of a config (nested for RealmConfig)."""
  return dataclasses.asdict(config)


def realm_config_from_dict(values: dict) -> RealmConfig:
  """Inverse of `config_to_dict` for a RealmConfig."""
  values = dict(values)
  bert = BertConfig(**values.pop("bert"))
  return RealmConfig(bert=bert, **values)
