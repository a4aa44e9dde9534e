"""Tests for realm_jax.training.optim against an independent NumPy port of BERT's optimizer.

The reference below re-implements google-research/bert ``optimization.py`` (``create_optimizer``
with ``AdamWeightDecayOptimizer``) in plain float64 NumPy, looping over a flat dict of named
variables and deciding weight decay with BERT's own ``re.search`` rule. It shares no code with
the module under test.
"""

import math
import re
from typing import Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.core import FrozenDict

from realm_jax.training import optim

_EXCLUDE_FROM_WEIGHT_DECAY = ["LayerNorm", "layer_norm", "bias"]

# name -> shape; "/"-joined paths of the nested tree used throughout.
_SHAPES = {
    "encoder/layer_0/attention/query/kernel": (4, 6),
    "encoder/layer_0/attention/query/bias": (6,),
    "encoder/layer_0/mlp_layer_norm/scale": (6,),
    "encoder/layer_0/mlp_layer_norm/bias": (6,),
    "embeddings/word_embeddings/embedding": (10, 4),
}
_EXPECTED_DECAYED = {
    "encoder/layer_0/attention/query/kernel",
    "embeddings/word_embeddings/embedding",
}

# Small run so the schedule moves within 3 updates: lr = 0, 0.05, 0.09 for steps 0, 1, 2.
_PEAK_LR = 0.1
_TOTAL_STEPS = 20
_WARMUP_STEPS = 2
# Global gradient norms per step: clipped, not clipped, clipped.
_GRAD_NORMS = (3.0, 0.5, 2.0)


# ----------------------------------------------------------------------------------------------
# Independent reference (BERT's optimization.py in NumPy).
# ----------------------------------------------------------------------------------------------


def _bert_learning_rate(step: int, peak: float, total: int, warmup: int) -> float:
  """create_optimizer's lr: polynomial_decay(power 1, end 0), overridden while step < warmup."""
  learning_rate = peak * (1.0 - min(step, total) / total)
  if warmup:  # BERT: `if num_warmup_steps:`
    is_warmup = 1.0 if step < warmup else 0.0
    warmup_learning_rate = peak * (step / warmup)
    learning_rate = (1.0 - is_warmup) * learning_rate + is_warmup * warmup_learning_rate
  return learning_rate


def _bert_do_use_weight_decay(param_name: str, weight_decay_rate: float) -> bool:
  """AdamWeightDecayOptimizer._do_use_weight_decay."""
  if not weight_decay_rate:
    return False
  for r in _EXCLUDE_FROM_WEIGHT_DECAY:
    if re.search(r, param_name) is not None:
      return False
  return True


class _BertReference:
  """BERT's clip_by_global_norm + AdamWeightDecayOptimizer + schedule, float64 NumPy."""

  def __init__(self, params: Dict[str, np.ndarray], *, peak: float, total: int, warmup: int,
               weight_decay: float = 0.01, beta_1: float = 0.9, beta_2: float = 0.999,
               epsilon: float = 1e-6, clip_norm: Optional[float] = 1.0,
               bias_correction: bool = False):
    self.params = {k: np.array(v, np.float64) for k, v in params.items()}
    self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
    self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
    self.global_step = 0
    self.peak, self.total, self.warmup = peak, total, warmup
    self.weight_decay = weight_decay
    self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
    self.clip_norm = clip_norm
    self.bias_correction = bias_correction  # Only to build the "wrong" optax.adamw-like numbers.

  def step(self, grads: Dict[str, np.ndarray]) -> None:
    grads = {k: np.array(g, np.float64) for k, g in grads.items()}
    if self.clip_norm is not None:
      # tf.clip_by_global_norm: t * clip_norm / max(global_norm, clip_norm).
      global_norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
      grads = {k: g * self.clip_norm / max(global_norm, self.clip_norm) for k, g in grads.items()}
    lr = _bert_learning_rate(self.global_step, self.peak, self.total, self.warmup)
    t = self.global_step + 1
    for name in sorted(self.params):
      grad, param = grads[name], self.params[name]
      next_m = self.beta_1 * self.m[name] + (1.0 - self.beta_1) * grad
      next_v = self.beta_2 * self.v[name] + (1.0 - self.beta_2) * np.square(grad)
      if self.bias_correction:
        update = (next_m / (1 - self.beta_1**t)) / (
            np.sqrt(next_v / (1 - self.beta_2**t)) + self.epsilon)
      else:
        update = next_m / (np.sqrt(next_v) + self.epsilon)
      if _bert_do_use_weight_decay(name, self.weight_decay):
        update = update + self.weight_decay * param
      self.params[name] = param - lr * update
      self.m[name], self.v[name] = next_m, next_v
    self.global_step += 1


# ----------------------------------------------------------------------------------------------
# Helpers.
# ----------------------------------------------------------------------------------------------


def _nest(flat: Dict[str, np.ndarray]) -> dict:
  tree: dict = {}
  for name, value in flat.items():
    node = tree
    *parents, leaf = name.split("/")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def _flatten(tree) -> Dict[str, np.ndarray]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {"/".join(str(k.key) for k in path): np.asarray(leaf) for path, leaf in leaves}


def _random_params(seed: int = 0) -> Dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {k: rng.normal(size=s).astype(np.float32) for k, s in _SHAPES.items()}


def _random_grads(seed: int = 1) -> List[Dict[str, np.ndarray]]:
  """Random gradients rescaled to the global norms in _GRAD_NORMS (exactly, in float32)."""
  rng = np.random.default_rng(seed)
  steps = []
  for target_norm in _GRAD_NORMS:
    grads = {k: rng.normal(size=s) for k, s in _SHAPES.items()}
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    steps.append({k: (g * target_norm / norm).astype(np.float32) for k, g in grads.items()})
  return steps


def _global_norm(grads: Dict[str, np.ndarray]) -> float:
  return math.sqrt(sum(float(np.sum(np.asarray(g, np.float64)**2)) for g in grads.values()))


def _run_optax(tx: optax.GradientTransformation, params: Dict[str, np.ndarray],
               grads_per_step: List[Dict[str, np.ndarray]]) -> List[Dict[str, np.ndarray]]:
  """Applies ``tx`` for each step under jit; returns the flat params after every step."""

  @jax.jit
  def train_step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax.apply_updates(p, updates), s

  p = jax.tree_util.tree_map(jnp.asarray, _nest(params))
  state = tx.init(p)
  history = []
  for grads in grads_per_step:
    p, state = train_step(p, state, jax.tree_util.tree_map(jnp.asarray, _nest(grads)))
    history.append(_flatten(p))
  return history


def _run_reference(params, grads_per_step, **kwargs) -> List[Dict[str, np.ndarray]]:
  ref = _BertReference(params, **kwargs)
  history = []
  for grads in grads_per_step:
    ref.step(grads)
    history.append(dict(ref.params))
  return history


def _max_abs_diff(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> float:
  assert set(a) == set(b)
  return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - b[k]))) for k in a)


# ----------------------------------------------------------------------------------------------
# The optimizer against the reference.
# ----------------------------------------------------------------------------------------------


def test_gradient_norms_exercise_clipping_both_ways():
  norms = [_global_norm(g) for g in _random_grads()]
  assert norms[0] > 1.0 and norms[2] > 1.0  # clipped
  assert norms[1] < 1.0  # passes through unchanged


def test_bert_optimizer_matches_numpy_reference_for_three_steps():
  params, grads = _random_params(), _random_grads()
  tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS)
  ours = _run_optax(tx, params, grads)
  reference = _run_reference(params, grads, peak=_PEAK_LR, total=_TOTAL_STEPS,
                             warmup=_WARMUP_STEPS)
  for step, (got, want) in enumerate(zip(ours, reference)):
    for name in _SHAPES:
      np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6,
                                 err_msg=f"step {step}, {name}")

  # Step 0 has lr 0 (BERT's global_step starts at 0): params unchanged. Steps 1 and 2 must move
  # them visibly, so the comparison above is not a comparison of untouched params.
  assert _max_abs_diff(ours[0], params) == 0.0
  assert _max_abs_diff(ours[1], ours[0]) > 1e-2
  assert _max_abs_diff(ours[2], ours[1]) > 1e-2


def test_default_warmup_matches_reference():
  # T = 50 -> W = max(100, 5) = 100: still warming up for all three steps.
  params, grads = _random_params(2), _random_grads(3)
  tx = optim.bert_optimizer(1.0, 50)
  ours = _run_optax(tx, params, grads)
  reference = _run_reference(params, grads, peak=1.0, total=50, warmup=100)
  for got, want in zip(ours, reference):
    for name in _SHAPES:
      np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6)


def test_reference_differs_without_clipping_or_weight_decay():
  """The tolerance is tight enough that clipping and decay each change the outcome."""
  params, grads = _random_params(), _random_grads()
  kwargs = dict(peak=_PEAK_LR, total=_TOTAL_STEPS, warmup=_WARMUP_STEPS)
  reference = _run_reference(params, grads, **kwargs)[-1]
  unclipped = _run_reference(params, grads, clip_norm=None, **kwargs)[-1]
  undecayed = _run_reference(params, grads, weight_decay=0.0, **kwargs)[-1]
  assert _max_abs_diff(reference, unclipped) > 1e-4
  assert _max_abs_diff(reference, undecayed) > 1e-4


def test_weight_decay_applies_only_to_masked_leaves():
  params, grads = _random_params(), _random_grads()
  with_decay = _run_optax(
      optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS), params, grads)[-1]
  without_decay = _run_optax(
      optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS, weight_decay=0.0),
      params, grads)[-1]
  for name in _SHAPES:
    diff = float(np.max(np.abs(with_decay[name] - without_decay[name])))
    if name in _EXPECTED_DECAYED:
      assert diff > 1e-4, name
    else:
      assert diff == 0.0, name


def test_no_bias_correction():
  """Fails if bias correction were applied (as optax.adamw and optax.scale_by_adam do)."""
  params, grads = _random_params(), _random_grads()
  kwargs = dict(peak=_PEAK_LR, total=_TOTAL_STEPS, warmup=_WARMUP_STEPS)
  ours = _run_optax(
      optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS), params, grads)
  reference = _run_reference(params, grads, **kwargs)
  corrected = _run_reference(params, grads, bias_correction=True, **kwargs)
  schedule = optim.bert_learning_rate_schedule(_PEAK_LR, _TOTAL_STEPS, _WARMUP_STEPS)
  adamw = optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                  mask=optim.weight_decay_mask))
  adamw_params = _run_optax(adamw, params, grads)
  # The bias-corrected NumPy reference is optax.adamw's rule: check that, so the differences
  # asserted below are differences from a correct bias-corrected optimizer.
  assert _max_abs_diff(adamw_params[-1], corrected[-1]) < 1e-5
  for step in (1, 2):
    assert _max_abs_diff(ours[step], reference[step]) < 1e-6
    assert _max_abs_diff(ours[step], corrected[step]) > 1e-3
    assert _max_abs_diff(ours[step], adamw_params[step]) > 1e-3


def test_scale_by_adam_first_update_is_not_bias_corrected():
  g = {"w": jnp.array([0.5, -2.0, 1e-3], jnp.float32)}
  tx = optim.scale_by_adam_without_bias_correction()
  state = tx.init(g)
  updates, state = tx.update(g, state)
  gw = np.array([0.5, -2.0, 1e-3], np.float64)
  expected = 0.1 * gw / (np.sqrt(0.001 * gw**2) + 1e-6)  # ~3.16 * sign(g), not sign(g)
  np.testing.assert_allclose(np.asarray(updates["w"]), expected, rtol=1e-5)
  corrected, _ = optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6).update(
      g, optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-6).init(g))
  assert np.max(np.abs(np.asarray(updates["w"]) - np.asarray(corrected["w"]))) > 1.0
  assert int(state.count) == 1
  np.testing.assert_allclose(np.asarray(state.mu["w"]), 0.1 * gw, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(state.nu["w"]), 0.001 * gw**2, rtol=1e-5)


def test_moments_are_at_least_float32_for_bfloat16_params():
  params = {"dense": {"kernel": jnp.ones((3, 2), jnp.bfloat16),
                      "bias": jnp.ones((2,), jnp.bfloat16)}}
  tx = optim.bert_optimizer(1e-3, 100, warmup_steps=0)
  state = tx.init(params)
  adam_state = state[1]
  assert isinstance(adam_state, optim.ScaleByAdamWithoutBiasCorrectionState)
  for leaf in jax.tree_util.tree_leaves((adam_state.mu, adam_state.nu)):
    assert leaf.dtype == jnp.float32
  grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.25), params)
  updates, state = jax.jit(tx.update)(grads, state, params)
  new_params = optax.apply_updates(params, updates)
  for leaf in jax.tree_util.tree_leaves(new_params):
    assert leaf.dtype == jnp.bfloat16
  for leaf in jax.tree_util.tree_leaves((state[1].mu, state[1].nu)):
    assert leaf.dtype == jnp.float32


def test_optimizer_uses_the_schedule_the_trainer_logs():
  tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS)
  schedule = optim.bert_learning_rate_schedule(_PEAK_LR, _TOTAL_STEPS, _WARMUP_STEPS)
  params, grads = _random_params(), _random_grads()
  ours = _run_optax(tx, params, grads)
  np.testing.assert_allclose(
      [float(schedule(s)) for s in range(3)], [0.0, 0.05, 0.09], rtol=1e-6)
  reference = _run_reference(params, grads, peak=_PEAK_LR, total=_TOTAL_STEPS,
                             warmup=_WARMUP_STEPS)
  assert _max_abs_diff(ours[-1], reference[-1]) < 1e-6


# ----------------------------------------------------------------------------------------------
# Schedule.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("total_steps, expected", [
    (1, 100), (500, 100), (1000, 100), (1009, 100), (1010, 101), (50000, 5000),
    (100000, 10000), (200000, 10000), (10**7, 10000),
])
def test_default_warmup_steps(total_steps, expected):
  assert optim.default_warmup_steps(total_steps) == expected
  assert expected == min(10000, max(100, int(total_steps / 10)))  # The release's expression.


@pytest.mark.parametrize("peak, total, warmup, expected_warmup", [
    (0.1, 20, 2, 2),
    (3e-5, 1000, None, 100),
    (1e-4, 50000, None, 5000),
    (3e-5, 200000, None, 10000),
    (1e-5, 500, None, 100),
    (1.0, 10, 0, 0),
    (1.0, 10, 15, 15),
])
def test_schedule_matches_bert_formula(peak, total, warmup, expected_warmup):
  schedule = optim.bert_learning_rate_schedule(peak, total, warmup)
  w = expected_warmup
  steps = sorted({0, 1, max(w - 1, 0), w, w + 1, total // 2, total - 1, total, total + 5})
  got = np.array([float(schedule(s)) for s in steps])
  jitted = jax.jit(schedule)
  got_jit = np.array([float(jitted(jnp.asarray(s, jnp.int32))) for s in steps])
  want = np.array([_bert_learning_rate(s, peak, total, w) for s in steps])
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
  np.testing.assert_allclose(got_jit, want, rtol=1e-6, atol=0)


def test_schedule_is_discontinuous_at_warmup_end_as_in_bert():
  peak, total, warmup = 1e-4, 1000, 100
  schedule = optim.bert_learning_rate_schedule(peak, total, warmup)
  assert float(schedule(0)) == 0.0
  np.testing.assert_allclose(float(schedule(warmup - 1)), peak * (warmup - 1) / warmup, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(warmup)), peak * (1 - warmup / total), rtol=1e-6)
  assert float(schedule(total)) == 0.0
  assert float(schedule(total + 1000)) == 0.0
  # Never reaches the peak.
  assert max(float(schedule(s)) for s in range(total + 1)) < peak


# ----------------------------------------------------------------------------------------------
# Weight-decay mask.
# ----------------------------------------------------------------------------------------------


def _decayed_paths(mask) -> set:
  return {name for name, value in _flatten(mask).items() if bool(value)}


def test_weight_decay_mask_paths():
  params = _nest(_random_params())
  mask = optim.weight_decay_mask(params)
  assert jax.tree_util.tree_structure(mask) == jax.tree_util.tree_structure(params)
  assert _decayed_paths(mask) == _EXPECTED_DECAYED
  # Same answer as BERT's regex on the joined names.
  assert _EXPECTED_DECAYED == {n for n in _SHAPES if _bert_do_use_weight_decay(n, 0.01)}


def test_weight_decay_mask_more_names():
  params = {
      "LayerNorm_0": {"scale": 1.0, "bias": 1.0},
      "final_LayerNorm": {"scale": 1.0},
      "output": {"dense": {"kernel": 1.0, "bias": 1.0}},
      "bias_free": {"kernel": 1.0},  # "bias" is only excluded as a leaf name.
      "norm": {"scale": 1.0},  # Not a LayerNorm by name: decayed, as BERT would.
  }
  assert _decayed_paths(optim.weight_decay_mask(params)) == {
      "output/dense/kernel", "bias_free/kernel", "norm/scale"}


def test_weight_decay_mask_frozen_dict():
  params = FrozenDict(_nest(_random_params()))
  mask = optim.weight_decay_mask(params)
  assert isinstance(mask, FrozenDict)
  assert _decayed_paths(mask) == _EXPECTED_DECAYED
  # And the whole optimizer runs on FrozenDict params.
  tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS)
  state = tx.init(params)
  grads = jax.tree_util.tree_map(jnp.ones_like, params)
  updates, _ = tx.update(grads, state, params)
  assert isinstance(updates, FrozenDict)


# ----------------------------------------------------------------------------------------------
# Validation.
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    (dict(peak_learning_rate=1e-4, total_steps=0), "total_steps must be > 0"),
    (dict(peak_learning_rate=1e-4, total_steps=-5), "total_steps must be > 0"),
    (dict(peak_learning_rate=1e-4, total_steps=100, warmup_steps=-1), "warmup_steps must be >= 0"),
    (dict(peak_learning_rate=1e-4, total_steps=1e4), "total_steps must be an integer"),
    (dict(peak_learning_rate=1e-4, total_steps=100, warmup_steps=2.5),
     "warmup_steps must be an integer"),
    (dict(peak_learning_rate=-1e-4, total_steps=100), "peak_learning_rate must be >= 0"),
])
def test_schedule_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optim.bert_learning_rate_schedule(**kwargs)
  with pytest.raises(ValueError, match=message):
    optim.bert_optimizer(**kwargs)


def test_default_warmup_steps_validation():
  with pytest.raises(ValueError, match="total_steps must be > 0"):
    optim.default_warmup_steps(0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(b1=1.0), "b1 must be in"),
    (dict(b2=-0.1), "b2 must be in"),
    (dict(eps=-1.0), "eps must be >= 0"),
    (dict(clip_norm=0.0), "clip_norm must be > 0"),
    (dict(weight_decay=-0.01), "weight_decay must be >= 0"),
])
def test_optimizer_hyperparameter_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optim.bert_optimizer(1e-4, 100, **kwargs)


# ----------------------------------------------------------------------------------------------
# Protecting the retriever: retriever_lr_scale and freeze_retriever_steps.
# ----------------------------------------------------------------------------------------------

# Two towers under the top-level keys the pretraining model uses; both have decayed and
# undecayed leaves, so the weight-decay part of an update is scaled (or frozen) too.
_TOWER_SHAPES = {
    "retriever/embedder/dense/kernel": (4, 6),
    "retriever/embedder/dense/bias": (6,),
    "retriever/embedder/projection_layer_norm/scale": (6,),
    "encoder/bert/dense/kernel": (6, 4),
    "encoder/bert/dense/bias": (4,),
    "encoder/mlm_head/layer_norm/scale": (4,),
}


def _tower_params(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  return _nest({k: rng.normal(size=s).astype(np.float32) for k, s in _TOWER_SHAPES.items()})


def _tower_grads(num_steps: int, seed: int = 1) -> List[dict]:
  # Global norms alternate above and below the clip threshold (1.0).
  rng = np.random.default_rng(seed)
  steps = []
  for step in range(num_steps):
    grads = {k: rng.normal(size=s) for k, s in _TOWER_SHAPES.items()}
    norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    target = 3.0 if step % 2 == 0 else 0.5
    steps.append(_nest({k: (g * target / norm).astype(np.float32) for k, g in grads.items()}))
  return steps


def _lockstep(tx, plain, params, grads_per_step):
  """Runs ``tx`` over the gradients; at every step also asks ``plain`` for its update of the same
  params and gradients. Returns [(params before, tx's updates, plain's updates)] as NumPy."""
  update = jax.jit(lambda g, s, p: tx.update(g, s, p))
  plain_update = jax.jit(lambda g, s, p: plain.update(g, s, p))
  p = jax.tree_util.tree_map(jnp.asarray, params)
  state, plain_state = tx.init(p), plain.init(p)
  history = []
  for grads in grads_per_step:
    g = jax.tree_util.tree_map(jnp.asarray, grads)
    updates, state = update(g, state, p)
    plain_updates, plain_state = plain_update(g, plain_state, p)
    history.append((_flatten(p), _flatten(updates), _flatten(plain_updates)))
    p = optax.apply_updates(p, updates)
  return history, _flatten(p)


def _bits(x: np.ndarray) -> bytes:
  return np.ascontiguousarray(x).tobytes()


def test_freeze_retriever_steps_holds_the_retriever_then_releases_it():
  params, grads = _tower_params(), _tower_grads(5)
  # No warmup, so lr(0) > 0 and the encoder moves from the first update on.
  plain = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=0)
  tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=0, freeze_retriever_steps=3)
  history, final = _lockstep(tx, plain, params, grads)
  initial = _flatten(params)
  retriever = [k for k in _TOWER_SHAPES if k.startswith("retriever/")]
  encoder = [k for k in _TOWER_SHAPES if k.startswith("encoder/")]
  for step in range(3):
    before = history[step][0]
    after = history[step + 1][0]
    for name in retriever:  # bit for bit, after each of the 3 frozen updates
      assert _bits(after[name]) == _bits(initial[name]), (step, name)
    assert max(float(np.max(np.abs(after[n] - before[n]))) for n in encoder) > 1e-3, step
  # Update 4 (count 3) moves the retriever, by what the plain optimizer would do from the same
  # params: its Adam moments kept accumulating through the freeze.
  before, updates, plain_updates = history[3]
  for name in retriever:
    assert float(np.max(np.abs(updates[name]))) > 1e-4, name
    np.testing.assert_array_equal(updates[name], plain_updates[name], err_msg=name)
  assert any(_bits(final[n]) != _bits(initial[n]) for n in retriever)
  # The encoder's updates are the plain optimizer's throughout.
  for _, updates, plain_updates in history:
    for name in encoder:
      np.testing.assert_array_equal(updates[name], plain_updates[name], err_msg=name)


def test_retriever_lr_scale_scales_only_the_retrievers_update():
  params, grads = _tower_params(2), _tower_grads(4, seed=3)
  # With BERT's warmup schedule: lr = 0, 0.05, 0.09, 0.085 for counts 0..3.
  plain = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS)
  tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS,
                            retriever_lr_scale=0.1)
  history, _ = _lockstep(tx, plain, params, grads)
  for step, (_, updates, plain_updates) in enumerate(history):
    for name in _TOWER_SHAPES:
      if name.startswith("retriever/"):
        np.testing.assert_allclose(updates[name], 0.1 * plain_updates[name], rtol=1e-6,
                                   atol=0, err_msg=f"step {step}, {name}")
      else:
        np.testing.assert_array_equal(updates[name], plain_updates[name],
                                      err_msg=f"step {step}, {name}")
  # The comparison means something: the plain retriever updates are not zero after step 0.
  for _, _, plain_updates in history[1:]:
    assert min(float(np.max(np.abs(plain_updates[n]))) for n in _TOWER_SHAPES
               if n.startswith("retriever/")) > 1e-3


def test_retriever_keys_name_another_tower():
  # Fine-tuning style: the question tower under its own key, the reader beside it.
  params = {"question": _tower_params()["retriever"], "reader": _tower_params()["encoder"]}
  grads = [{"question": g["retriever"], "reader": g["encoder"]} for g in _tower_grads(2)]
  tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=0, freeze_retriever_steps=2,
                            retriever_keys=("question",))
  history, final = _lockstep(tx, optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=0),
                             params, grads)
  initial = _flatten(params)
  for name, value in initial.items():
    if name.startswith("question/"):
      assert _bits(final[name]) == _bits(value), name
    else:
      assert float(np.max(np.abs(final[name] - value))) > 1e-3, name
  assert history  # two updates ran


def test_default_retriever_options_are_the_plain_optimizer():
  params, grads = _tower_params(4), _tower_grads(3, seed=5)
  schedule = optim.bert_learning_rate_schedule(_PEAK_LR, _TOTAL_STEPS, _WARMUP_STEPS)
  # The chain as it was before the options existed, spelled out.
  before = optax.chain(
      optax.clip_by_global_norm(1.0),
      optim.scale_by_adam_without_bias_correction(b1=0.9, b2=0.999, eps=1e-6),
      optax.add_decayed_weights(0.01, mask=optim.weight_decay_mask),
      optax.scale_by_learning_rate(schedule))
  defaults = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS,
                                  retriever_lr_scale=1.0, freeze_retriever_steps=0)
  without = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, warmup_steps=_WARMUP_STEPS)
  p = jax.tree_util.tree_map(jnp.asarray, params)
  # Same state (a checkpoint of either resumes in the other), leaf for leaf.
  for tx in (defaults, without):
    assert (jax.tree_util.tree_structure(tx.init(p))
            == jax.tree_util.tree_structure(before.init(p)))
  for tx in (defaults, without):
    history, _ = _lockstep(tx, before, params, grads)
    for _, updates, reference in history:
      for name in _TOWER_SHAPES:
        assert _bits(updates[name]) == _bits(reference[name]), name
  # Off, the retriever key is never looked at: trees without one (mlm, say) are fine.
  defaults.init({"encoder": p["encoder"]})


def test_missing_retriever_key_is_a_value_error():
  params = jax.tree_util.tree_map(jnp.asarray, _tower_params())
  for kwargs in (dict(freeze_retriever_steps=3), dict(retriever_lr_scale=0.1)):
    tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, retriever_keys=("question",), **kwargs)
    with pytest.raises(ValueError, match=r"retriever key 'question' .*keys present: "
                                         r"\['encoder', 'retriever'\]"):
      tx.init(params)
  tx = optim.bert_optimizer(_PEAK_LR, _TOTAL_STEPS, freeze_retriever_steps=3)
  with pytest.raises(ValueError, match=r"retriever key 'retriever' .*\['encoder'\]"):
    tx.init({"encoder": params["encoder"]})


@pytest.mark.parametrize("kwargs, message", [
    (dict(retriever_lr_scale=-0.1), "retriever_lr_scale must be finite and >= 0"),
    (dict(retriever_lr_scale=float("nan")), "retriever_lr_scale must be finite and >= 0"),
    (dict(freeze_retriever_steps=-1), "freeze_retriever_steps must be >= 0"),
    (dict(freeze_retriever_steps=1e3), "freeze_retriever_steps must be an integer"),
    (dict(freeze_retriever_steps=2, retriever_keys=()), "retriever_keys is empty"),
])
def test_retriever_option_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    optim.bert_optimizer(1e-4, 100, **kwargs)
