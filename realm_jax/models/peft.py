"""Parameter-efficient fine-tuning (PEFT) of open-QA fine-tuning: LoRA and bottleneck adapters.

Both train a few new parameters (plus the reader's span head, `TASK_HEAD`) while the optimizer
keeps the pretrained model frozen (`PeftConfig.trainable_mask`). LoRA (Hu et al. 2021) adds
factors A, B per targeted kernel in a "peft" subtree; the model reads the merged
W + (alpha / r) A @ B (`merge`, also the serving export). Bottleneck adapters (Houlsby et al.
2019) are modules inside each BertModel layer (`BertConfig.adapter_size`).
`effective_params` is what a PEFT model's forward pass reads. Design:
docs/design/models_and_jobs.md.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from realm_jax.models.config import BertConfig, RealmConfig

Array = jax.Array
Params = Any

METHODS = ("none", "lora", "adapters")
# The LoRA subtree's top-level key in a PEFT model's parameters.
PEFT_KEY = "peft"
# A targeted module -> how many leading dimensions of its kernel are its input.
LORA_TARGETS = {"query": 1, "key": 1, "value": 1, "out": 2, "intermediate": 1, "output": 1}
_ATTENTION_TARGETS = ("query", "key", "value", "out")
# The task's output layer, new at fine-tuning: trained with either method.
TASK_HEAD = ("reader", "span_head")
# Adapter modules of a BertModel layer are named "<where>_adapter".
ADAPTER_SUFFIX = "_adapter"
LORA_A, LORA_B = "lora_a", "lora_b"


@dataclasses.dataclass(frozen=True)
class PeftConfig:
  """Which PEFT method a model trains, and LoRA's settings.

  Attributes:
    method: "lora" or "adapters" (the adapters' width is `BertConfig.adapter_size`).
    lora_rank: r, the rank of each update A @ B.
    lora_alpha: alpha; the update is scaled by alpha / r.
    lora_targets: the modules of each BertModel layer that get factors (`LORA_TARGETS`).
  """

  method: str
  lora_rank: int = 8
  lora_alpha: float = 16.0
  lora_targets: tuple[str, ...] = ("query", "value")

  def __post_init__(self):
    object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
    if self.method not in METHODS[1:]:
      raise ValueError(f"peft={self.method!r} is not one of {METHODS}")
    if self.method != "lora":
      return
    if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or (
        self.lora_rank < 1):
      raise ValueError(f"lora_rank={self.lora_rank!r}; expected an integer >= 1")
    if not 0.0 < float(self.lora_alpha) < float("inf"):
      raise ValueError(f"lora_alpha={self.lora_alpha!r}; expected a finite number > 0")
    unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
    if unknown or not self.lora_targets:
      raise ValueError(f"lora_targets={self.lora_targets!r}: expected a non-empty subset of "
                       f"{tuple(LORA_TARGETS)}")

  @property
  def lora_scale(self) -> float:
    """alpha / r."""
    return float(self.lora_alpha) / self.lora_rank

  def to_dict(self) -> dict:
    """JSON for a checkpoint's metadata (`from_dict` reads it back)."""
    out = {"method": self.method}
    if self.method == "lora":
      out.update(lora_rank=self.lora_rank, lora_alpha=float(self.lora_alpha),
                 lora_targets=list(self.lora_targets))
    return out

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "PeftConfig":
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: (tuple(v) if k == "lora_targets" else v) for k, v in values.items()
                  if k in fields})

  def trainable_mask(self, params: Params) -> Params:
    """A tree of bools shaped like `params`: True on the leaves this method trains."""
    def trained(path, _):
      keys = [_key_name(k) for k in path]
      if tuple(keys[:len(TASK_HEAD)]) == TASK_HEAD:
        return True
      if self.method == "lora":
        return keys[0] == PEFT_KEY
      return (any(k.endswith(ADAPTER_SUFFIX) for k in keys)
              and "document_embedder" not in keys)
    return jax.tree_util.tree_map_with_path(trained, params)


def _key_name(key: Any) -> str:
  return str(getattr(key, "key", getattr(key, "name", key)))


def count_trained(params: Params, trainable: Callable[[Params], Params]) -> int:
  """How many parameters (scalars) the mask function `trainable` selects."""
  return sum(int(math.prod(leaf.shape)) for leaf, on in
             zip(jax.tree.leaves(params), jax.tree.leaves(trainable(params))) if on)


# ------------------------------------------------------------------------------------- LoRA


def lora_roots(config: RealmConfig) -> tuple[tuple[str, ...], ...]:
  """Where OpenQAModel's LoRA applies: the reader's BERT and the question tower's."""
  tower = "embedder" if config.share_embedders else "query_embedder"
  return (("reader", "bert"), ("retriever", tower, "bert"))


def _is_target(module_path: tuple[str, ...], targets: Sequence[str]) -> bool:
  """A BertModel-relative module path (layer_i, [attention,] name) of a targeted kernel."""
  if not module_path or not module_path[0].startswith("layer_"):
    return False
  name = module_path[-1]
  if name not in targets:
    return False
  expected = (2 if name in _ATTENTION_TARGETS else 1) + 1
  return len(module_path) == expected and (name not in _ATTENTION_TARGETS
                                           or module_path[1] == "attention")


def init_lora(rng: Array, params: Params, config: PeftConfig,
              roots: Sequence[tuple[str, ...]]) -> Params:
  """LoRA factors for every targeted kernel under `roots` (boxed: replicated).

  Args:
    rng: key for the A factors.
    params: the base parameters (boxed or plain; only shapes are read).
    config: rank and targets.
    roots: paths of the BertModel trees to adapt (`lora_roots`).

  Returns:
    The "peft" subtree: {path of the kernel's module: {"lora_a": [in, r] normal with std
    1/sqrt(in), "lora_b": [r, out] zeros}}, nested.
  """
  flat = traverse_util.flatten_dict(nn.unbox(params))
  kernels = sorted(path[:-1] for path in flat if path[-1] == "kernel"
                   and any(path[:len(root)] == root
                           and _is_target(path[len(root):-1], config.lora_targets)
                           for root in roots))
  if not kernels:
    raise ValueError(f"no LoRA target {config.lora_targets} found under {list(roots)}")
  factors = {}
  for i, module in enumerate(kernels):
    shape = flat[module + ("kernel",)].shape
    split = LORA_TARGETS[module[-1]]
    fan_in, fan_out = math.prod(shape[:split]), math.prod(shape[split:])
    a = jax.random.normal(jax.random.fold_in(rng, i), (fan_in, config.lora_rank), jnp.float32)
    factors[module + (LORA_A,)] = nn.Partitioned(a / math.sqrt(fan_in), (None, None))
    factors[module + (LORA_B,)] = nn.Partitioned(
        jnp.zeros((config.lora_rank, fan_out), jnp.float32), (None, None))
  return traverse_util.unflatten_dict(factors)


def merge(base_params: Params, lora_params: Params, config: PeftConfig) -> Params:
  """The base parameters with W + (alpha / r) * (A @ B).reshape(W.shape) at every kernel that
  `lora_params` has factors for (the other leaves are the base's own objects).

  Args:
    base_params: nested dicts of arrays (without the "peft" subtree).
    lora_params: the "peft" subtree (`init_lora`'s layout, plain arrays).
    config: rank and alpha.

  Returns:
    A tree like `base_params`; each merged kernel keeps its dtype.
  """
  flat = traverse_util.flatten_dict(base_params)
  factors = traverse_util.flatten_dict(lora_params)
  for path, a in factors.items():
    if path[-1] != LORA_A:
      continue
    module = path[:-1]
    kernel = flat.get(module + ("kernel",))
    b = factors.get(module + (LORA_B,))
    if kernel is None or b is None:
      raise ValueError(f"LoRA factors at {'/'.join(module)} have no kernel or no B")
    if a.shape[-1] != config.lora_rank or b.shape[0] != config.lora_rank:
      raise ValueError(f"LoRA factors at {'/'.join(module)} are of rank {a.shape[-1]}, the "
                       f"config's lora_rank is {config.lora_rank}")
    delta = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST).reshape(kernel.shape)
    flat[module + ("kernel",)] = (kernel + config.lora_scale * delta).astype(kernel.dtype)
  return traverse_util.unflatten_dict(flat)


def merged_params(params: Params, config: PeftConfig | None) -> Params:
  """A PEFT model's parameters with LoRA merged (the "peft" subtree consumed): an ordinary
  model's tree, for serving (adapters stay modules: their parameters as they are)."""
  if config is None or config.method != "lora" or PEFT_KEY not in params:
    return params
  return merge({k: v for k, v in params.items() if k != PEFT_KEY}, params[PEFT_KEY], config)


def effective_params(params: Params, config: PeftConfig | None) -> Params:
  """What the forward pass of a PEFT model reads (see the module docstring); `params` as they
  are without PEFT, and for LoRA once merged (no "peft" subtree: a merged export, or
  parameters this function already returned)."""
  if config is None or (config.method == "lora" and PEFT_KEY not in params):
    return params
  held = jax.tree.map(lambda p, trained: p if trained else jax.lax.stop_gradient(p),
                      params, config.trainable_mask(params))
  if config.method == "lora":
    return merge({k: v for k, v in held.items() if k != PEFT_KEY}, held[PEFT_KEY], config)
  return held


def with_missing_leaves(params: Params, fresh: Params) -> Params:
  """`params` plus every leaf of `fresh` it lacks (a warm start gives no adapters: they stay
  as initialised)."""
  flat = traverse_util.flatten_dict(params)
  missing = {path: leaf for path, leaf in traverse_util.flatten_dict(fresh).items()
             if path not in flat}
  if not missing:
    return params
  return traverse_util.unflatten_dict({**flat, **missing})


def split_params(params: Params, mask: Params) -> tuple[Params, Params]:
  """(the leaves where `mask` is True, the others), each as nested dicts."""
  flat, on = traverse_util.flatten_dict(params), traverse_util.flatten_dict(mask)
  return (traverse_util.unflatten_dict({p: v for p, v in flat.items() if on[p]}),
          traverse_util.unflatten_dict({p: v for p, v in flat.items() if not on[p]}))


# --------------------------------------------------------------------------------- adapters


class BottleneckAdapter(nn.Module):
  """x + up(act(down(x))): Houlsby et al.'s adapter. `up` starts at zero, so a fresh adapter is
  the identity; `down` starts as BERT's dense layers do."""

  config: BertConfig
  activation: Callable[[Array], Array]

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    dense = lambda features, init, names, name: nn.Dense(  # noqa: E731
        features, dtype=cfg.compute_dtype, param_dtype=cfg.storage_dtype,
        kernel_init=nn.with_logical_partitioning(init, names),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), names[1:]),
        name=name)
    # [..., adapter]
    h = dense(cfg.adapter_size, nn.initializers.truncated_normal(cfg.initializer_range),
              ("embed", None), "down")(x)
    h = self.activation(h)
    # [..., embed]
    return x + dense(x.shape[-1], nn.initializers.zeros_init(), (None, "embed"), "up")(h)
