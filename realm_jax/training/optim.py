"""BERT's optimizer (REALM_SPEC item 18), as optax transformations.

REALM trains every stage (ICT warm start, REALM pretraining, open-QA fine-tuning) with BERT's
``optimization.create_optimizer`` from google-research/bert, which the REALM release calls with
``num_warmup_steps = min(10000, max(100, int(num_train_steps / 10)))``. That optimizer is *not*
``optax.adamw``:

* Adam moments with beta1 0.9, beta2 0.999, eps 1e-6 and **no bias correction**: the first
  Adam direction is ``(1 - b1) * g / sqrt((1 - b2) * g**2) ~ 3.16 * sign(g)``, not ``sign(g)`` as
  with bias correction (the first update still does nothing, because its lr is 0).
* Decoupled weight decay 0.01, added to the Adam direction *before* the learning rate multiplies it
  (``update = adam + wd * param; param -= lr * update``), skipped for LayerNorm and bias parameters.
* Gradients clipped by global norm 1.0 before anything else (``tf.clip_by_global_norm``).
* The learning-rate schedule in ``bert_learning_rate_schedule``, including its discontinuity.

Everything here follows the code (which produced the published numbers) where it and a "clean"
description would differ. The public pieces:

* ``default_warmup_steps(total_steps)``: the release's warmup length.
* ``bert_learning_rate_schedule(peak, total_steps, warmup_steps)``: an ``optax.Schedule``.
* ``scale_by_adam_without_bias_correction(b1, b2, eps)``: the Adam part alone.
* ``weight_decay_mask(params)``: which leaves are decayed.
* ``bert_optimizer(...)``: the full chain; optionally with the retriever's updates scaled
  (``retriever_lr_scale``) or held at zero for the first steps (``freeze_retriever_steps``), a
  toy-world deviation (REALM uses one optimizer for both towers), off by default; and with only
  some parameters trained (``trainable``: parameter-efficient fine-tuning, ``models.peft``).
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

# BERT's exclude list is ["LayerNorm", "layer_norm", "bias"], matched by ``re.search`` against the
# TF variable name. In Flax trees the equivalent names are a module called "...layer_norm..." (or
# "LayerNorm_0" for auto-named modules) and leaves called "bias".
_NO_DECAY_LEAF_NAMES = frozenset({"bias"})
_NO_DECAY_MODULE_SUBSTRING = "layernorm"

# The REALM release's warmup bounds: min(10000, max(100, T // 10)).
_MIN_WARMUP_STEPS = 100
_MAX_WARMUP_STEPS = 10000


def _as_int(value: Any, name: str) -> int:
  """Returns ``value`` as a Python int, or raises a ValueError naming the argument.

  A float step count (say ``1e4`` from a config) is rejected rather than silently truncated,
  because a truncated step count shifts the whole schedule.
  """
  if isinstance(value, bool):
    raise ValueError(f"{name} must be an integer, got the bool {value!r}.")
  try:
    return operator.index(value)
  except TypeError:
    raise ValueError(
        f"{name} must be an integer, got {value!r} of type {type(value).__name__}."
    ) from None


def default_warmup_steps(total_steps: int) -> int:
  """Returns the REALM release's warmup length for a run of ``total_steps`` updates.

  The release computes ``min(10000, max(100, int(num_train_steps / 10)))``: a tenth of the run,
  but at least 100 and at most 10000 steps (200k-step pretraining warms up for 10000 steps).

  Args:
    total_steps: Total number of optimizer updates ``T`` in the run; must be > 0.

  Returns:
    ``min(10000, max(100, total_steps // 10))``.

  Raises:
    ValueError: If ``total_steps`` is not a positive integer.
  """
  total_steps = _as_int(total_steps, "total_steps")
  if total_steps <= 0:
    raise ValueError(f"total_steps must be > 0, got {total_steps}.")
  return min(_MAX_WARMUP_STEPS, max(_MIN_WARMUP_STEPS, total_steps // 10))


def bert_learning_rate_schedule(
    peak_learning_rate: float,
    total_steps: int,
    warmup_steps: int | None = None,
) -> optax.Schedule:
  """Returns BERT's learning-rate schedule, exactly as ``create_optimizer`` computes it.

  With ``P = peak_learning_rate``, ``T = total_steps``, ``W = warmup_steps`` and ``step`` the
  number of updates already applied (0 for the first update, like BERT's ``global_step``):

      lr(step) = P * step / W                 if step < W
               = P * (1 - min(step, T) / T)   otherwise

  The decay is ``tf.train.polynomial_decay(P, step, T, power=1.0, end_learning_rate=0.0)``, which
  counts from step 0, not from the end of warmup; the warmup branch merely overrides it while
  ``step < W``. So the schedule is **discontinuous at W**: it reaches ``P * (W - 1) / W`` at step
  ``W - 1`` and then jumps to ``P * (1 - W / T)`` at step W, never touching ``P``. A "clean"
  schedule (warm up to ``P``, then decay from ``P`` over ``T - W`` steps) is what the paper's
  prose suggests; this follows the code, since the code produced the published numbers. The
  first update uses lr 0, and from step T on lr stays 0.

  ``W = 0`` means no warmup (BERT skips the warmup branch when ``num_warmup_steps`` is falsy). A
  ``W > T`` is accepted as in BERT: the warmup ramp then runs until step ``W - 1`` (below ``P``)
  and lr is 0 from step W on.

  Args:
    peak_learning_rate: ``P``; 3e-5 for REALM pretraining, 1e-4 for ICT, 1e-5 for open-QA
      fine-tuning. Must be >= 0.
    total_steps: ``T``, the step at which the decay reaches 0; must be > 0.
    warmup_steps: ``W``; must be >= 0. None uses ``default_warmup_steps(total_steps)``.

  Returns:
    A function from the update count (int, or a scalar int array; traceable) to a float32 scalar.

  Raises:
    ValueError: If ``total_steps <= 0``, ``warmup_steps < 0``, ``peak_learning_rate < 0``, or a
      step count is not an integer.
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
    # Compare steps as integers (as BERT does with tf.int32) so ``step < W`` is exact; do the
    # arithmetic in float32 like BERT's tf.float32 graph.
    step_int = jnp.asarray(count).astype(jnp.int32)
    step = step_int.astype(jnp.float32)
    # (T - min(step, T)) / T rather than 1 - min(step, T) / T: under jit XLA turns the division
    # into a multiply by 1/T, and 1 - T * (1/T) comes out as -1.5e-8, a negative lr (a step
    # *up* the gradient) from step T on. The numerator form is exactly 0 there.
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
    count: Number of updates applied so far (int32 scalar). Not used by the update itself (there
      is no bias correction); kept so the state reads like optax's Adam state.
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

  Per leaf, with ``g`` the (already clipped) gradient:

      m = b1 * m + (1 - b1) * g
      v = b2 * v + (1 - b2) * g ** 2
      update = m / (sqrt(v) + eps)

  ``optax.scale_by_adam`` divides ``m`` by ``1 - b1**t`` and ``v`` by ``1 - b2**t``; BERT does
  not, and neither does this. The moments are kept in the gradient dtype promoted to at least
  float32, and the returned updates are in that dtype too (``optax.apply_updates`` casts the new
  params back to their own dtype).

  Args:
    b1: Decay of the first moment; in [0, 1).
    b2: Decay of the second moment; in [0, 1).
    eps: Added to ``sqrt(v)`` in the denominator (outside the square root, as BERT); >= 0.

  Returns:
    An ``optax.GradientTransformation`` with state ``ScaleByAdamWithoutBiasCorrectionState``.

  Raises:
    ValueError: If a hyperparameter is out of range.
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
  """Returns which parameters BERT's optimizer decays: a tree of bools shaped like ``params``.

  BERT excludes any variable whose name matches one of "LayerNorm", "layer_norm", "bias"
  (``re.search`` on the TF name). For Flax trees the rule is: a leaf is **not** decayed if its own
  name is "bias", or if any component of its path, lower-cased with underscores removed, contains
  "layernorm" (so a LayerNorm module's ``scale`` and ``bias`` are both excluded). Everything else
  (Dense ``kernel``, ``embedding``, ...) is decayed. Unlike BERT's substring search, a leaf that
  merely contains "bias" in a longer name (say ``relative_attention_bias``) is decayed; BERT's
  parameters have no such names.

  Args:
    params: A parameter tree: nested dicts, flax ``FrozenDict``s, or any other pytree.

  Returns:
    A tree with the structure of ``params`` (dicts stay dicts, FrozenDicts stay FrozenDicts) whose
    leaves are Python bools, True where weight decay applies.
  """
  return jax.tree_util.tree_map_with_path(lambda path, _: _is_decayed(path), params)


def _top_level_mask(keys: Sequence[str]):
  """A mask function for ``optax.masked``: True on every leaf under one of the top-level ``keys``.

  Raises a ValueError naming the missing key and the keys present when the tree lacks one, so a
  misnamed tower fails when the optimizer is initialised rather than silently scaling nothing.
  """
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
  """The factor on the retriever's updates at update ``count`` (0 for the first update).

  ``0`` while ``count < freeze_retriever_steps``, ``retriever_lr_scale`` from then on. Applied
  after the learning rate, it scales the retriever's learning rate (Adam direction and weight
  decay alike, as BERT's decay is multiplied by the lr too) on the same schedule.
  """
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
  """Returns BERT's ``create_optimizer`` as an optax chain.

  In order: clip gradients by global norm ``clip_norm``; Adam scaling without bias correction;
  add ``weight_decay * param`` for the leaves ``weight_decay_mask`` selects; multiply by
  ``-bert_learning_rate_schedule(peak_learning_rate, total_steps, warmup_steps)(count)``.
  The trainer logs ``train/learning_rate`` as ``bert_learning_rate_schedule(...)(step)`` with the
  same arguments, ``step`` being the number of updates applied before the current one.

  With ``retriever_lr_scale != 1`` or ``freeze_retriever_steps > 0`` (a toy-world deviation:
  REALM uses this one optimizer for both towers, REALM_SPEC 18), one more transformation ends the
  chain: the updates of the subtrees under ``retriever_keys`` are multiplied by
  ``retriever_update_scale(...)(count)``, 0 for the first ``freeze_retriever_steps`` updates and
  ``retriever_lr_scale`` after (Atlas's ``--freeze_retriever_steps`` and ``--lr_retriever``). The
  chain before it is unchanged, so clipping still uses the global norm of *all* gradients, and
  the retriever's Adam moments keep accumulating during the freeze: only its parameters stand
  still (see the comment in the code). With the defaults the chain, and its state, are exactly
  the plain optimizer's; turning an option on adds a step count to the optimizer state, so a run
  cannot switch between the two kinds of state when it resumes.

  Args:
    peak_learning_rate: Peak learning rate (3e-5 pretraining, 1e-4 ICT, 1e-5 open-QA).
    total_steps: Total number of updates; the lr reaches 0 at this step.
    warmup_steps: Warmup length; None uses ``default_warmup_steps(total_steps)``.
    weight_decay: Decoupled weight-decay rate (BERT: 0.01).
    b1: Adam first-moment decay (BERT: 0.9).
    b2: Adam second-moment decay (BERT: 0.999).
    eps: Adam epsilon (BERT: 1e-6).
    clip_norm: Global-norm clipping threshold (BERT: 1.0).
    retriever_lr_scale: Factor on the retriever's updates (its lr relative to the rest); >= 0.
    freeze_retriever_steps: The retriever's updates are exactly 0 for this many first updates.
    retriever_keys: Top-level keys of the parameter tree that are the retriever (``retriever``
      in pretraining and open-QA fine-tuning, whose question tower lives there), or paths
      "key/subkey" (a LoRA run's ``peft/retriever``). Only read when an option above is active;
      a key the tree lacks is a ValueError at ``init``.
    trainable: ``params -> tree of bools``: only those leaves train (the whole chain above runs
      on them alone: clipping by their global norm, their Adam moments); every other leaf gets
      an update of exactly zero (``optax.set_to_zero``) and no optimizer state. None: all train.

  Returns:
    An ``optax.GradientTransformation``; its ``update`` needs ``params`` (for the weight decay).

  Raises:
    ValueError: If an argument is out of range.
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
    # Scaling the final update scales the retriever's lr and nothing else: Adam's moments are
    # those of the plain optimizer. During the freeze the factor is 0, so the update is exactly
    # zero (p + 0 == p for every finite p; only a -0.0 parameter could come back as +0.0) while
    # the moments still accumulate the retriever's gradients. That is the simplest correct
    # choice (no state beyond one count, no second Adam), and the moments it leaves are the
    # better start: BERT's Adam has no bias correction, so a tower whose moments began at zero
    # on the first unfrozen step would take a ~3x sign(g) step driven by one gradient, the very
    # kind of step the freeze is there to prevent.
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
