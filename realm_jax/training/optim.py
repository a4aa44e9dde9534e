"""BERT's optimizer (REALM_SPEC item 18), as optax transformations.

REALM trains every stage with google-research/bert's ``create_optimizer``, which is not
``optax.adamw``: Adam without bias correction, decoupled weight decay 0.01 added before the
learning rate (not on LayerNorm or bias), clipping by global norm 1.0 first, and a schedule that
jumps at the end of warmup. This follows the code, which produced the published numbers.
``bert_optimizer`` is the chain; it can also scale or freeze the retriever's updates (a toy-world
deviation, off by default) and train only some parameters (PEFT).
Design notes: docs/design/training_and_commands.md.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

__all__ = [
    "ScaleByAdamWithoutBiasCorrectionState",
    "bert_learning_rate_schedule",
    "bert_optimizer",
    "default_warmup_steps",
    "retriever_update_scale",
    "scale_by_adam_without_bias_correction",
    "weight_decay_mask",
]

# BERT's no-decay list ["LayerNorm", "layer_norm", "bias"], as Flax module and leaf names.
_NO_DECAY_LEAF_NAMES = frozenset({"bias"})
_NO_DECAY_MODULE_SUBSTRING = "layernorm"

# The REALM release's warmup bounds: min(10000, max(100, T // 10)).
_MIN_WARMUP_STEPS = 100
_MAX_WARMUP_STEPS = 10000


def _as_int(value: Any, name: str) -> int:
  """``value`` as a Python int, else a ValueError naming the argument: a float step count
  (``1e4`` from a config) is refused rather than truncated, which would shift the schedule."""
  if isinstance(value, bool):
    raise ValueError(f"{name} must be an integer, got the bool {value!r}.")
  try:
    return operator.index(value)
  except TypeError:
    raise ValueError(
        f"{name} must be an integer, got {value!r} of type {type(value).__name__}."
    ) from None


def default_warmup_steps(total_steps: int) -> int:
  """The REALM release's warmup length for ``total_steps`` (> 0) updates:
  ``min(10000, max(100, total_steps // 10))``; ValueError unless a positive integer."""
  total_steps = _as_int(total_steps, "total_steps")
  if total_steps <= 0:
    raise ValueError(f"total_steps must be > 0, got {total_steps}.")
  return min(_MAX_WARMUP_STEPS, max(_MIN_WARMUP_STEPS, total_steps // 10))


def bert_learning_rate_schedule(
    peak_learning_rate: float,
    total_steps: int,
    warmup_steps: int | None = None,
) -> optax.Schedule:
  """BERT's learning-rate schedule, exactly as ``create_optimizer`` computes it.

      lr(step) = P * step / W                 if step < W
               = P * (1 - min(step, T) / T)   otherwise

  ``step`` counts the updates already applied (0 first). The decay counts from step 0, so the
  schedule jumps at W and never reaches P; W = 0 means no warmup.

  Args:
    peak_learning_rate: P (>= 0): 3e-5 REALM pretraining, 1e-4 ICT, 1e-5 open-QA.
    total_steps: T (> 0), where the lr reaches 0.
    warmup_steps: W (>= 0); None: ``default_warmup_steps(total_steps)``.

  Returns a traceable function from the update count to a float32 scalar; ValueError on an
  argument out of range or a step count that is not an integer.
  """
  total_steps = _as_int(total_steps, "total_steps")
  if total_steps <= 0:
    raise ValueError(f"total_steps must be > 0, got {total_steps}.")
  if warmup_steps is None:
    warmup_steps = default_warmup_steps(total_steps)
  warmup_steps = _as_int(warmup_steps, "warmup_steps")
  if warmup_steps < 0:
    raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}.")
  peak_learning_rate = float(peak_learning_rate)
  if not peak_learning_rate >= 0.0:  # Also rejects NaN.
    raise ValueError(f"peak_learning_rate must be >= 0, got {peak_learning_rate}.")

  def schedule(count: jax.typing.ArrayLike) -> jax.Array:
    # Compare steps as integers so ``step < W`` is exact; the arithmetic in float32, like BERT.
    step_int = jnp.asarray(count).astype(jnp.int32)
    step = step_int.astype(jnp.float32)
    # (T - min(step, T)) / T: under jit 1 - min(step, T) / T comes out as -1.5e-8 from step T.
    remaining = float(total_steps) - jnp.minimum(step, float(total_steps))
    decayed = peak_learning_rate * remaining / float(total_steps)
    if warmup_steps == 0:
      return decayed
    warmup = peak_learning_rate * step / float(warmup_steps)
    return jnp.where(step_int < warmup_steps, warmup, decayed)

  return schedule


class ScaleByAdamWithoutBiasCorrectionState(NamedTuple):
  """State of ``scale_by_adam_without_bias_correction``.

  Attributes:
    count: int32 [] updates applied so far; unused (no bias correction), kept like optax's Adam.
    mu: First moments, same tree as the params, dtype promoted to at least float32.
    nu: Second moments, same tree and dtypes as ``mu``.
  """

  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def _moment_dtype(dtype: Any) -> jnp.dtype:
  # bf16/f16 moments lose the small (1 - b2) * g^2 increments; BERT kept them in float32.
  return jnp.promote_types(dtype, jnp.float32)


def scale_by_adam_without_bias_correction(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
) -> optax.GradientTransformation:
  """Adam's scaling as in BERT's ``AdamWeightDecayOptimizer``: no bias correction.

      m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g ** 2;  update = m / (sqrt(v) + eps)

  Moments and updates in the gradient dtype promoted to at least float32. b1, b2 in [0, 1) and
  eps >= 0 (outside the square root, as BERT), else ValueError. The state is a
  ``ScaleByAdamWithoutBiasCorrectionState``.
  """
  if not 0.0 <= b1 < 1.0:
    raise ValueError(f"b1 must be in [0, 1), got {b1}.")
  if not 0.0 <= b2 < 1.0:
    raise ValueError(f"b2 must be in [0, 1), got {b2}.")
  if not eps >= 0.0:
    raise ValueError(f"eps must be >= 0, got {eps}.")

  def init_fn(params: optax.Params) -> ScaleByAdamWithoutBiasCorrectionState:
    zeros = lambda p: jnp.zeros(jnp.shape(p), _moment_dtype(jnp.result_type(p)))
    return ScaleByAdamWithoutBiasCorrectionState(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree_util.tree_map(zeros, params),
        nu=jax.tree_util.tree_map(zeros, params),
    )

  def update_fn(
      updates: optax.Updates,
      state: ScaleByAdamWithoutBiasCorrectionState,
      params: optax.Params | None = None,
  ) -> tuple[optax.Updates, ScaleByAdamWithoutBiasCorrectionState]:
    del params  # Weight decay is a separate transformation in the chain.

    def first_moment(g, m):
      return b1 * m + (1.0 - b1) * g.astype(m.dtype)

    def second_moment(g, v):
      g = g.astype(v.dtype)
      return b2 * v + (1.0 - b2) * g * g

    mu = jax.tree_util.tree_map(first_moment, updates, state.mu)
    nu = jax.tree_util.tree_map(second_moment, updates, state.nu)
    new_updates = jax.tree_util.tree_map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    count = optax.safe_int32_increment(state.count)
    return new_updates, ScaleByAdamWithoutBiasCorrectionState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def _key_name(key: Any) -> str:
  """Returns the name of one path entry from ``jax.tree_util`` (dict key, attribute, index)."""
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  if isinstance(key, jax.tree_util.SequenceKey):
    return str(key.idx)
  if isinstance(key, jax.tree_util.FlattenedIndexKey):
    return str(key.key)
  return str(key)


def _is_decayed(path: tuple[Any, ...]) -> bool:
  names = [_key_name(key) for key in path]
  if names and names[-1] in _NO_DECAY_LEAF_NAMES:
    return False
  # "LayerNorm_0", "layer_norm", "mlp_layer_norm", "final_layernorm" all normalise to contain
  # "layernorm"; their ``scale`` leaves are excluded along with their ``bias``.
  return not any(
      _NO_DECAY_MODULE_SUBSTRING in name.lower().replace("_", "") for name in names)


def weight_decay_mask(params: optax.Params) -> Any:
  """Which parameters BERT's optimizer decays: a tree of Python bools shaped like ``params``.

  Not decayed: a leaf named "bias", or one with a path component that contains "layernorm"
  (lower-cased, underscores removed). Everything else (kernels, embeddings) is decayed.
  """
  return jax.tree_util.tree_map_with_path(lambda path, _: _is_decayed(path), params)


def _top_level_mask(keys: Sequence[str]):
  """A mask function for ``optax.masked``: True on every leaf under one of the top-level ``keys``;
  a key the tree lacks is a ValueError at init, not a tower silently left unscaled."""
  keys = tuple(keys)

  def mask(tree: Any) -> Any:
    present = sorted(str(k) for k in tree.keys()) if isinstance(tree, Mapping) else None
    for key in keys:
      if "/" in key:
        head, rest = key.split("/", 1)
        sub = tree.get(head) if present is not None else None
        if not isinstance(sub, Mapping) or rest not in sub:
          raise ValueError(f"retriever key {key!r} is not in the parameter tree (keys of "
                           f"{head!r}: {sorted(sub) if isinstance(sub, Mapping) else None}).")
        continue
      if present is None or key not in tree:
        raise ValueError(f"retriever key {key!r} is not a top-level key of the parameter tree "
                         f"(keys present: {present}); set retriever_keys to the retriever "
                         f"(question tower) subtree's key.")
    return jax.tree_util.tree_map_with_path(
        lambda path, _: (_key_name(path[0]) in keys
                         or "/".join(_key_name(k) for k in path[:2]) in keys), tree)

  return mask


def retriever_update_scale(retriever_lr_scale: float, freeze_retriever_steps: int
                           ) -> optax.Schedule:
  """The factor on the retriever's updates at update ``count`` (0 first): 0 while
  ``count < freeze_retriever_steps``, then ``retriever_lr_scale``; it scales the retriever's lr."""
  freeze_retriever_steps = _as_int(freeze_retriever_steps, "freeze_retriever_steps")
  if freeze_retriever_steps < 0:
    raise ValueError(f"freeze_retriever_steps must be >= 0, got {freeze_retriever_steps}.")
  retriever_lr_scale = float(retriever_lr_scale)
  if not 0.0 <= retriever_lr_scale < float("inf"):  # Also rejects NaN.
    raise ValueError(f"retriever_lr_scale must be finite and >= 0, got {retriever_lr_scale}.")

  def scale(count: jax.typing.ArrayLike) -> jax.Array:
    count = jnp.asarray(count).astype(jnp.int32)
    return jnp.where(count < freeze_retriever_steps, 0.0, retriever_lr_scale).astype(jnp.float32)

  return scale


def bert_optimizer(
    peak_learning_rate: float,
    total_steps: int,
    *,
    warmup_steps: int | None = None,
    weight_decay: float = 0.01,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    clip_norm: float = 1.0,
    retriever_lr_scale: float = 1.0,
    freeze_retriever_steps: int = 0,
    retriever_keys: Sequence[str] = ("retriever",),
    trainable: Callable[[Any], Any] | None = None,
) -> optax.GradientTransformation:
  """BERT's ``create_optimizer`` as an optax chain; ``update`` needs ``params`` (weight decay).

  In order: clip by global norm, Adam without bias correction, weight decay on the
  ``weight_decay_mask`` leaves, times ``-bert_learning_rate_schedule(...)(count)``. A retriever
  lr scale or freeze (a toy-world deviation; REALM uses one optimizer for both towers,
  REALM_SPEC 18) adds a last factor on the retriever's updates and a count to the state.

  Args (the others BERT's defaults; ValueError when out of range):
    retriever_lr_scale: factor (>= 0) on the retriever's updates.
    freeze_retriever_steps: the retriever's updates are exactly 0 for this many first updates.
    retriever_keys: the retriever's top-level keys or "key/subkey" paths (``peft/retriever``).
    trainable: ``params -> tree of bools``: only those train; others get zero updates and no
      state. None: all train.
  """
  if not clip_norm > 0.0:
    raise ValueError(f"clip_norm must be > 0, got {clip_norm}.")
  if not weight_decay >= 0.0:
    raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
  schedule = bert_learning_rate_schedule(peak_learning_rate, total_steps, warmup_steps)
  retriever_scale = retriever_update_scale(retriever_lr_scale, freeze_retriever_steps)
  if isinstance(retriever_keys, str):
    retriever_keys = (retriever_keys,)
  transforms = [
      # BERT clips the raw gradients (tf.clip_by_global_norm) before the optimizer sees them.
      optax.clip_by_global_norm(clip_norm),
      scale_by_adam_without_bias_correction(b1=b1, b2=b2, eps=eps),
      # Decay joins the Adam direction before the lr scales it: param -= lr * (adam + wd * param).
      optax.add_decayed_weights(weight_decay, mask=weight_decay_mask),
      # Uses its own update count, starting at 0 for the first update like BERT's global_step.
      optax.scale_by_learning_rate(schedule),
  ]
  if float(retriever_lr_scale) != 1.0 or int(freeze_retriever_steps) > 0:
    if not retriever_keys:
      raise ValueError("retriever_keys is empty while retriever_lr_scale or "
                       "freeze_retriever_steps is set.")
    # Scales the final update only: during a freeze the moments keep accumulating, so the first
    # unfrozen step is not a ~3x sign(g) step from zero moments (no bias correction).
    transforms.append(optax.masked(optax.scale_by_schedule(retriever_scale),
                                   _top_level_mask(retriever_keys)))
  chain = optax.chain(*transforms)
  if trainable is None:
    return chain

  def labels(params: Any) -> Any:
    mask = trainable(params)
    if not any(jax.tree.leaves(mask)):
      raise ValueError("trainable selects no parameter: nothing would train.")
    return jax.tree.map(lambda on: "trained" if on else "frozen", mask)

  return optax.multi_transform({"trained": chain, "frozen": optax.set_to_zero()}, labels)
