"""Tests for realm_jax.models.losses against independent float64 NumPy references.

The references below are written with plain loops and ``np.log(np.sum(np.exp(...)))`` and never
call the code under test, so a shared mistake would have to be made twice.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import losses

RTOL = 1e-5
ATOL = 1e-5


# ----------------------------------------------------------------------------------------------
# NumPy references (float64, loops).
# ----------------------------------------------------------------------------------------------


def np_logsumexp(values):
  values = np.asarray(values, dtype=np.float64)
  shift = np.max(values)
  return shift + np.log(np.sum(np.exp(values - shift)))


def np_log_softmax(values):
  values = np.asarray(values, dtype=np.float64)
  return values - np_logsumexp(values)


def ref_token_log_probs(mlm_logits, mlm_targets):
  batch, candidates, masks, _ = mlm_logits.shape
  out = np.zeros((batch, candidates, masks))
  for b in range(batch):
    for k in range(candidates):
      for j in range(masks):
        out[b, k, j] = np_log_softmax(mlm_logits[b, k, j])[mlm_targets[b, j]]
  return out


def ref_per_token_marginals(candidate_logits, token_log_probs, mlm_weights):
  """marg[b, j] = log sum_k p(z_k|x) p(y_j|z_k,x); NaN at padded slots (never used)."""
  batch, candidates, masks = token_log_probs.shape
  marg = np.full((batch, masks), np.nan)
  for b in range(batch):
    prior = np.exp(np_log_softmax(candidate_logits[b]))
    for j in range(masks):
      if mlm_weights[b, j] == 0:
        continue
      total = 0.0
      for k in range(candidates):
        total += prior[k] * np.exp(np.float64(token_log_probs[b, k, j]))
      marg[b, j] = np.log(total)
  return marg


def ref_per_token_loss(candidate_logits, token_log_probs, mlm_weights):
  marg = ref_per_token_marginals(candidate_logits, token_log_probs, mlm_weights)
  num, den = 0.0, 0.0
  for b in range(mlm_weights.shape[0]):
    for j in range(mlm_weights.shape[1]):
      if mlm_weights[b, j] != 0:
        num += mlm_weights[b, j] * marg[b, j]
        den += mlm_weights[b, j]
  return 0.0 if den == 0 else -num / den


def ref_per_example_loss(candidate_logits, token_log_probs, mlm_weights):
  batch, candidates, masks = token_log_probs.shape
  num, count = 0.0, 0
  for b in range(batch):
    if np.sum(mlm_weights[b]) <= 0:
      continue
    log_prior = np_log_softmax(candidate_logits[b])
    per_doc = []
    for k in range(candidates):
      doc_ll = 0.0
      for j in range(masks):
        if mlm_weights[b, j] != 0:
          doc_ll += mlm_weights[b, j] * np.float64(token_log_probs[b, k, j])
      per_doc.append(log_prior[k] + doc_ll)
    num += np_logsumexp(per_doc)
    count += 1
  return 0.0 if count == 0 else -num / count


def ref_retrieval_utility(candidate_logits, token_log_probs, mlm_weights, null_index):
  marg = ref_per_token_marginals(candidate_logits, token_log_probs, mlm_weights)
  num, den = 0.0, 0.0
  for b in range(mlm_weights.shape[0]):
    for j in range(mlm_weights.shape[1]):
      if mlm_weights[b, j] != 0:
        num += mlm_weights[b, j] * (marg[b, j] - token_log_probs[b, null_index, j])
        den += mlm_weights[b, j]
  return 0.0 if den == 0 else num / den


def ref_marginal_log_loss(logits, is_correct):
  flat_logits = logits.reshape(-1, logits.shape[-1])
  flat_correct = is_correct.reshape(-1, is_correct.shape[-1])
  out = np.zeros(flat_logits.shape[0])
  for row in range(flat_logits.shape[0]):
    correct = [flat_logits[row, i] for i in range(flat_logits.shape[1]) if flat_correct[row, i]]
    if correct:
      out[row] = np_logsumexp(flat_logits[row]) - np_logsumexp(correct)
  return out.reshape(logits.shape[:-1])


def ref_in_batch_loss(query_emb, block_emb, label_offset):
  q64 = query_emb.astype(np.float64)
  b64 = block_emb.astype(np.float64)
  losses_, hits = [], 0
  for i in range(q64.shape[0]):
    scores = np.array([np.dot(q64[i], b64[n]) for n in range(b64.shape[0])])
    label = i + label_offset
    losses_.append(-np_log_softmax(scores)[label])
    hits += int(np.argmax(scores) == label)
  return np.mean(losses_), hits


def random_pretraining_inputs(seed, batch=3, candidates=4, masks=5):
  """Candidate scores, token log-probs (from a real softmax) and weights with some padding."""
  rng = np.random.default_rng(seed)
  candidate_logits = rng.normal(size=(batch, candidates)).astype(np.float32) * 2.0
  raw = rng.normal(size=(batch, candidates, masks, 7)) * 2.0
  token_log_probs = np.zeros((batch, candidates, masks), np.float32)
  for b in range(batch):
    for k in range(candidates):
      for j in range(masks):
        token_log_probs[b, k, j] = np_log_softmax(raw[b, k, j])[0]
  mlm_weights = np.ones((batch, masks), np.float32)
  mlm_weights[0, 3:] = 0.0  # example 0 has 3 masks
  mlm_weights[1, 1:] = 0.0  # example 1 has 1 mask
  return candidate_logits, token_log_probs, mlm_weights


# ----------------------------------------------------------------------------------------------
# mlm_token_log_probs
# ----------------------------------------------------------------------------------------------


def test_mlm_token_log_probs_matches_numpy():
  rng = np.random.default_rng(0)
  mlm_logits = rng.normal(size=(2, 3, 4, 11)).astype(np.float32) * 3.0
  mlm_targets = rng.integers(0, 11, size=(2, 4)).astype(np.int32)
  got = losses.mlm_token_log_probs(jnp.asarray(mlm_logits), jnp.asarray(mlm_targets))
  assert got.shape == (2, 3, 4)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(
      got, ref_token_log_probs(mlm_logits, mlm_targets), rtol=RTOL, atol=ATOL)


def test_mlm_token_log_probs_bfloat16_computes_in_float32():
  rng = np.random.default_rng(1)
  mlm_logits = rng.normal(size=(2, 3, 4, 11)).astype(np.float32) * 3.0
  mlm_targets = rng.integers(0, 11, size=(2, 4)).astype(np.int32)
  bf16_logits = jnp.asarray(mlm_logits, dtype=jnp.bfloat16)
  got = losses.mlm_token_log_probs(bf16_logits, jnp.asarray(mlm_targets))
  assert got.dtype == jnp.float32
  # Only the bfloat16 rounding of the inputs differs from the float32 result...
  np.testing.assert_allclose(
      got, ref_token_log_probs(mlm_logits, mlm_targets), atol=5e-2)
  # ...the normalisation itself is done in float32 on the rounded values.
  rounded = np.asarray(bf16_logits.astype(jnp.float32))
  np.testing.assert_allclose(
      got, ref_token_log_probs(rounded, mlm_targets), rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# marginal_mlm_loss
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("marginalization, reference", [
    ("per_token", ref_per_token_loss),
    ("per_example", ref_per_example_loss),
])
def test_marginal_mlm_loss_matches_numpy(marginalization, reference):
  cand, tlp, weights = random_pretraining_inputs(seed=2)
  loss, aux = losses.marginal_mlm_loss(
      jnp.asarray(cand), jnp.asarray(tlp), jnp.asarray(weights),
      marginalization=marginalization)
  np.testing.assert_allclose(loss, reference(cand, tlp, weights), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(aux["loss_sum"] / aux["weight_sum"], loss, rtol=RTOL)
  if marginalization == "per_token":
    assert float(aux["weight_sum"]) == float(weights.sum())
    assert aux["marginal_log_probs"].shape == weights.shape
    marg = ref_per_token_marginals(cand, tlp, weights)
    valid = weights > 0
    np.testing.assert_allclose(
        np.asarray(aux["marginal_log_probs"])[valid], marg[valid], rtol=RTOL, atol=ATOL)
  else:
    assert float(aux["weight_sum"]) == 3.0
    assert aux["marginal_log_probs"].shape == (3,)


def test_per_token_gradient_matches_numpy_finite_differences():
  cand, tlp, weights = random_pretraining_inputs(seed=3, batch=2, candidates=3, masks=4)
  grad = jax.grad(lambda c: losses.marginal_mlm_loss(
      c, jnp.asarray(tlp), jnp.asarray(weights))[0])(jnp.asarray(cand))
  eps = 1e-5
  expected = np.zeros(cand.shape)
  cand64 = cand.astype(np.float64)
  for index in np.ndindex(cand.shape):
    plus, minus = cand64.copy(), cand64.copy()
    plus[index] += eps
    minus[index] -= eps
    expected[index] = (ref_per_token_loss(plus, tlp, weights)
                       - ref_per_token_loss(minus, tlp, weights)) / (2 * eps)
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5)


def test_per_token_and_per_example_differ():
  # One example, two equally likely documents, two masked tokens. Document 0 knows token 0
  # (p=0.9) but not token 1 (p=0.1); document 1 the reverse.
  #   per-token:   marg_j = log(0.5*0.9 + 0.5*0.1) = log 0.5 for both tokens -> loss log 2 = 0.6931
  #   per-example: log(0.5*0.9*0.1 + 0.5*0.1*0.9) = log 0.09 -> loss 2.4079 (one example)
  cand = np.zeros((1, 2), np.float32)
  tlp = np.log(np.array([[[0.9, 0.1], [0.1, 0.9]]], np.float32))
  weights = np.ones((1, 2), np.float32)
  per_token, _ = losses.marginal_mlm_loss(
      jnp.asarray(cand), jnp.asarray(tlp), jnp.asarray(weights), marginalization="per_token")
  per_example, _ = losses.marginal_mlm_loss(
      jnp.asarray(cand), jnp.asarray(tlp), jnp.asarray(weights), marginalization="per_example")
  np.testing.assert_allclose(per_token, math.log(2.0), rtol=RTOL)
  np.testing.assert_allclose(per_example, -math.log(0.09), rtol=RTOL)
  np.testing.assert_allclose(per_token, ref_per_token_loss(cand, tlp, weights), rtol=RTOL)
  np.testing.assert_allclose(per_example, ref_per_example_loss(cand, tlp, weights), rtol=RTOL)
  assert abs(float(per_token) - float(per_example)) > 1e-3

  # Random inputs with several masks per example differ as well.
  cand, tlp, weights = random_pretraining_inputs(seed=4)
  args = (jnp.asarray(cand), jnp.asarray(tlp), jnp.asarray(weights))
  per_token, _ = losses.marginal_mlm_loss(*args, marginalization="per_token")
  per_example, _ = losses.marginal_mlm_loss(*args, marginalization="per_example")
  assert abs(float(per_token) - float(per_example)) > 1e-3
  np.testing.assert_allclose(per_token, ref_per_token_loss(cand, tlp, weights), rtol=RTOL)
  np.testing.assert_allclose(per_example, ref_per_example_loss(cand, tlp, weights), rtol=RTOL)


@pytest.mark.parametrize("marginalization", ["per_token", "per_example"])
def test_zero_masks_give_zero_loss_and_zero_gradient(marginalization):
  cand, tlp, weights = random_pretraining_inputs(seed=5)
  weights = np.zeros_like(weights)
  tlp[0, 0, 0] = -np.inf  # garbage in a padded slot must not matter either

  def loss_fn(c):
    return losses.marginal_mlm_loss(
        c, jnp.asarray(tlp), jnp.asarray(weights), marginalization=marginalization)[0]

  loss, grad = jax.value_and_grad(loss_fn)(jnp.asarray(cand))
  assert float(loss) == 0.0
  assert not np.isnan(float(loss))
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grad, np.zeros_like(cand))


@pytest.mark.parametrize("marginalization", ["per_token", "per_example"])
def test_padded_mask_slots_do_not_change_loss_or_gradient(marginalization):
  rng = np.random.default_rng(6)
  batch, candidates, masks, vocab = 2, 3, 4, 9
  cand = rng.normal(size=(batch, candidates)).astype(np.float32)
  mlm_logits = rng.normal(size=(batch, candidates, masks, vocab)).astype(np.float32)
  mlm_targets = rng.integers(0, vocab, size=(batch, masks)).astype(np.int32)
  weights = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], np.float32)

  garbage_logits = mlm_logits.copy()
  garbage_logits[0, :, 2:] = 1e30  # huge
  garbage_logits[1, :, 1:, ::2] = -1e30
  garbage_targets = mlm_targets.copy()
  garbage_targets[0, 2:] = vocab - 1
  garbage_targets[1, 1:] = 0

  def loss_fn(c, logits, targets):
    tlp = losses.mlm_token_log_probs(logits, targets)
    return losses.marginal_mlm_loss(
        c, tlp, jnp.asarray(weights), marginalization=marginalization)[0]

  grad_fn = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))
  loss, (g_cand, g_logits) = grad_fn(
      jnp.asarray(cand), jnp.asarray(mlm_logits), jnp.asarray(mlm_targets))
  loss_g, (g_cand_g, g_logits_g) = grad_fn(
      jnp.asarray(cand), jnp.asarray(garbage_logits), jnp.asarray(garbage_targets))
  np.testing.assert_allclose(loss_g, loss, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(g_cand_g, g_cand, rtol=RTOL, atol=ATOL)
  assert np.all(np.isfinite(g_logits_g))
  np.testing.assert_allclose(g_logits_g, g_logits, rtol=RTOL, atol=ATOL)
  # Padded slots receive no gradient at all.
  padded = np.broadcast_to((weights == 0)[:, None, :, None], g_logits.shape)
  assert np.all(np.asarray(g_logits_g)[padded] == 0.0)

  # Directly on token log-probs: -inf and huge values in padded slots.
  tlp = np.asarray(losses.mlm_token_log_probs(jnp.asarray(mlm_logits), jnp.asarray(mlm_targets)))
  bad_tlp = tlp.copy()
  bad_tlp[0, :, 2] = -np.inf
  bad_tlp[0, :, 3] = 1e30
  bad_tlp[1, 0, 1:] = -np.inf
  bad_tlp[1, 1:, 1:] = -1e30
  tlp_grad_fn = jax.jit(jax.value_and_grad(
      lambda c, t: losses.marginal_mlm_loss(
          c, t, jnp.asarray(weights), marginalization=marginalization)[0], argnums=(0, 1)))
  loss_t, (g_cand_t, g_tlp_t) = tlp_grad_fn(jnp.asarray(cand), jnp.asarray(tlp))
  loss_b, (g_cand_b, g_tlp_b) = tlp_grad_fn(jnp.asarray(cand), jnp.asarray(bad_tlp))
  assert np.isfinite(float(loss_b))
  np.testing.assert_allclose(loss_b, loss_t, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(g_cand_b, g_cand_t, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(g_tlp_b, g_tlp_t, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(loss_t, (ref_per_token_loss if marginalization == "per_token"
                                      else ref_per_example_loss)(cand, tlp, weights),
                             rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("marginalization", ["per_token", "per_example"])
def test_aux_sums_combine_across_microbatches(marginalization):
  cand, tlp, weights = random_pretraining_inputs(seed=7, batch=4)
  weights[3, :] = 0.0  # one example without masks
  fn = jax.jit(functools.partial(losses.marginal_mlm_loss, marginalization=marginalization))
  full_loss, _ = fn(jnp.asarray(cand), jnp.asarray(tlp), jnp.asarray(weights))
  _, aux_a = fn(jnp.asarray(cand[:2]), jnp.asarray(tlp[:2]), jnp.asarray(weights[:2]))
  _, aux_b = fn(jnp.asarray(cand[2:]), jnp.asarray(tlp[2:]), jnp.asarray(weights[2:]))
  combined = ((aux_a["loss_sum"] + aux_b["loss_sum"])
              / (aux_a["weight_sum"] + aux_b["weight_sum"]))
  np.testing.assert_allclose(combined, full_loss, rtol=RTOL, atol=ATOL)


def test_unknown_marginalization_raises():
  cand, tlp, weights = random_pretraining_inputs(seed=8)
  with pytest.raises(ValueError, match="per_token.*per_example"):
    losses.marginal_mlm_loss(
        jnp.asarray(cand), jnp.asarray(tlp), jnp.asarray(weights), marginalization="paper")


def test_marginal_mlm_loss_bfloat16_inputs_return_float32():
  cand, tlp, weights = random_pretraining_inputs(seed=9)
  loss, _ = losses.marginal_mlm_loss(
      jnp.asarray(cand, jnp.bfloat16), jnp.asarray(tlp, jnp.bfloat16), jnp.asarray(weights))
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, ref_per_token_loss(cand, tlp, weights), atol=5e-2)


# ----------------------------------------------------------------------------------------------
# retrieval_utility and null_document_probability
# ----------------------------------------------------------------------------------------------


def test_retrieval_utility_hand_worked():
  # Two candidates (null at slot 0), equal scores -> p(z|x) = (0.5, 0.5).
  # Token 0: p(y|null) = 0.2, p(y|doc) = 0.6 -> marg = log(0.5*0.2 + 0.5*0.6) = log 0.4,
  #          utility = log 0.4 - log 0.2 = log 2 = 0.693147
  # Token 1: p(y|null) = 0.5, p(y|doc) = 0.1 -> marg = log 0.3,
  #          utility = log 0.3 - log 0.5 = log 0.6 = -0.510826
  # Token 2: padded (weight 0) with a -inf log-prob: ignored.
  # RU = (log 2 + log 0.6) / 2 = log(1.2) / 2 = 0.0911608
  cand = jnp.zeros((1, 2))
  with np.errstate(divide="ignore"):  # log(0) = -inf on purpose
    tlp = jnp.asarray(np.log(np.array([[[0.2, 0.5, 0.0], [0.6, 0.1, 0.3]]])))
  weights = jnp.array([[1.0, 1.0, 0.0]])
  ru, aux = losses.retrieval_utility(cand, tlp, weights)
  np.testing.assert_allclose(ru, 0.0911608, rtol=1e-5)
  np.testing.assert_allclose(ru, math.log(1.2) / 2, rtol=1e-5)
  assert float(aux["weight_sum"]) == 2.0
  np.testing.assert_allclose(aux["utility_sum"], math.log(1.2), rtol=1e-5)


@pytest.mark.parametrize("null_index", [0, 2])
def test_retrieval_utility_matches_numpy(null_index):
  cand, tlp, weights = random_pretraining_inputs(seed=10)
  ru, aux = losses.retrieval_utility(
      jnp.asarray(cand), jnp.asarray(tlp), jnp.asarray(weights), null_index=null_index)
  np.testing.assert_allclose(
      ru, ref_retrieval_utility(cand, tlp, weights, null_index), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(aux["utility_sum"] / aux["weight_sum"], ru, rtol=RTOL, atol=ATOL)


def test_retrieval_utility_without_masks_is_zero():
  cand, tlp, weights = random_pretraining_inputs(seed=11)
  ru, aux = losses.retrieval_utility(
      jnp.asarray(cand), jnp.asarray(tlp), jnp.zeros_like(jnp.asarray(weights)))
  assert float(ru) == 0.0
  assert float(aux["weight_sum"]) == 0.0


def test_null_document_probability_matches_numpy():
  rng = np.random.default_rng(12)
  cand = rng.normal(size=(3, 5)).astype(np.float32)
  expected = [np.exp(c[1]) / np.sum(np.exp(c.astype(np.float64))) for c in cand]
  got = losses.null_document_probability(jnp.asarray(cand), null_index=1)
  assert got.shape == (3,)
  np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
  expected0 = [np.exp(c[0]) / np.sum(np.exp(c.astype(np.float64))) for c in cand]
  np.testing.assert_allclose(
      losses.null_document_probability(jnp.asarray(cand)), expected0, rtol=RTOL, atol=ATOL)


# ----------------------------------------------------------------------------------------------
# marginal_log_loss
# ----------------------------------------------------------------------------------------------


def test_marginal_log_loss_matches_numpy():
  rng = np.random.default_rng(13)
  logits = rng.normal(size=(4, 6)).astype(np.float32) * 3.0
  is_correct = rng.random(size=(4, 6)) < 0.3
  is_correct[0] = False  # nothing correct
  is_correct[1] = True  # everything correct -> loss 0
  is_correct[2, :] = False
  is_correct[2, 4] = True
  got = losses.marginal_log_loss(jnp.asarray(logits), jnp.asarray(is_correct))
  assert got.shape == (4,)
  np.testing.assert_allclose(got, ref_marginal_log_loss(logits, is_correct), rtol=RTOL, atol=ATOL)

  # Reader logits with extra leading axes keep them: [questions, beam, spans] -> [questions, beam].
  logits3 = rng.normal(size=(2, 3, 5)).astype(np.float32)
  correct3 = rng.random(size=(2, 3, 5)) < 0.4
  got3 = losses.marginal_log_loss(jnp.asarray(logits3), jnp.asarray(correct3))
  assert got3.shape == (2, 3)
  np.testing.assert_allclose(got3, ref_marginal_log_loss(logits3, correct3), rtol=RTOL, atol=ATOL)


def test_marginal_log_loss_all_incorrect_is_zero_with_finite_gradient():
  logits = jnp.array([[1.0, -2.0, 50.0], [0.5, 0.1, -0.3]])
  is_correct = jnp.array([[False, False, False], [False, True, False]])
  loss_fn = lambda l: jnp.sum(losses.marginal_log_loss(l, is_correct))
  per_row = losses.marginal_log_loss(logits, is_correct)
  assert float(per_row[0]) == 0.0
  assert np.all(np.isfinite(per_row))
  grad = jax.grad(loss_fn)(logits)
  assert np.all(np.isfinite(grad))
  np.testing.assert_array_equal(grad[0], np.zeros(3))
  # The other row still trains: d/dl = softmax(all) - softmax(correct only).
  probs = np.exp(np.array([0.5, 0.1, -0.3])) / np.sum(np.exp(np.array([0.5, 0.1, -0.3])))
  np.testing.assert_allclose(grad[1], probs - np.array([0.0, 1.0, 0.0]), rtol=1e-5, atol=1e-6)


def test_marginal_log_loss_all_incorrect_row_never_produces_inf():
  # With near-float32-max logits, logsumexp(all) - logsumexp(masked) would overflow to inf in the
  # discarded branch of an all-incorrect row; debug_infs catches any inf an op produces.
  logits = jnp.array([[3e38, 1.0, 2e38], [1.0, 2.0, 3.0]])
  is_correct = jnp.array([[False, False, False], [True, False, True]])
  with jax.debug_infs(True):
    per_row = losses.marginal_log_loss(logits, is_correct)
    grad = jax.grad(lambda l: jnp.sum(losses.marginal_log_loss(l, is_correct)))(logits)
  assert float(per_row[0]) == 0.0
  np.testing.assert_allclose(per_row[1], 0.2806780, rtol=1e-5)
  np.testing.assert_array_equal(grad[0], np.zeros(3))


def test_marginal_log_loss_hand_worked():
  # logits (1, 2, 3), entries 0 and 2 correct:
  # loss = log(e + e^2 + e^3) - log(e + e^3) = log(1 + e^2 / (e + e^3)) = log(1 + e / (1 + e^2))
  #      = log(1 + 0.3240271) = 0.2806780
  got = losses.marginal_log_loss(jnp.array([1.0, 2.0, 3.0]), jnp.array([True, False, True]))
  assert got.shape == ()
  np.testing.assert_allclose(got, 0.2806780, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# in_batch_softmax_loss
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_queries, num_blocks, label_offset", [(6, 6, 0), (3, 8, 4)])
def test_in_batch_softmax_loss_matches_numpy(num_queries, num_blocks, label_offset):
  rng = np.random.default_rng(14)
  block_emb = rng.normal(size=(num_blocks, 5)).astype(np.float32)
  # Queries near their positive block so the accuracy count is non-trivial.
  positives = block_emb[label_offset:label_offset + num_queries]
  query_emb = (positives + rng.normal(size=positives.shape) * 1.5).astype(np.float32)
  loss, aux = losses.in_batch_softmax_loss(
      jnp.asarray(query_emb), jnp.asarray(block_emb), label_offset=label_offset)
  expected_loss, expected_hits = ref_in_batch_loss(query_emb, block_emb, label_offset)
  np.testing.assert_allclose(loss, expected_loss, rtol=RTOL, atol=ATOL)
  assert float(aux["weight_sum"]) == num_queries
  assert float(aux["accuracy_sum"]) == expected_hits
  np.testing.assert_allclose(aux["loss_sum"], expected_loss * num_queries, rtol=RTOL, atol=ATOL)
  assert aux["scores"].shape == (num_queries, num_blocks)
  np.testing.assert_allclose(aux["scores"], query_emb.astype(np.float64) @ block_emb.T.astype(
      np.float64), rtol=RTOL, atol=ATOL)


def test_in_batch_softmax_loss_traced_offset_matches_static():
  rng = np.random.default_rng(15)
  query_emb = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  block_emb = jnp.asarray(rng.normal(size=(9, 5)), jnp.float32)
  static_loss, _ = losses.in_batch_softmax_loss(query_emb, block_emb, label_offset=6)
  traced = jax.jit(lambda q, b, o: losses.in_batch_softmax_loss(q, b, label_offset=o)[0])
  np.testing.assert_allclose(traced(query_emb, block_emb, 6), static_loss, rtol=RTOL)


def test_in_batch_softmax_loss_rejects_out_of_range_labels():
  query_emb = jnp.zeros((4, 5))
  block_emb = jnp.zeros((8, 5))
  with pytest.raises(ValueError, match="label_offset"):
    losses.in_batch_softmax_loss(query_emb, block_emb, label_offset=5)
  with pytest.raises(ValueError, match="label_offset"):
    losses.in_batch_softmax_loss(jnp.zeros((9, 5)), block_emb)
  with pytest.raises(ValueError, match="widths"):
    losses.in_batch_softmax_loss(query_emb, jnp.zeros((8, 6)))


def test_mlm_accuracy_sums_hand_worked():
  # One query, 2 candidates (null at slot 0) with p(z|x) = (0.25, 0.75), vocabulary of 3.
  # Mask 0, target 1: p(.|null) = (0.6, 0.3, 0.1), p(.|doc) = (0.1, 0.8, 0.1)
  #   marginal = 0.25*(0.6,0.3,0.1) + 0.75*(0.1,0.8,0.1) = (0.225, 0.675, 0.1) -> 1: right;
  #   null alone -> 0: wrong.
  # Mask 1, target 0: p(.|null) = (0.7, 0.2, 0.1), p(.|doc) = (0.2, 0.5, 0.3)
  #   marginal = (0.325, 0.425, 0.25) -> 1: wrong; null alone -> 0: right.
  # Mask 2: padding (weight 0), would be right both ways.
  scores = jnp.log(jnp.array([[0.25, 0.75]]))
  probs = np.array([[[[0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [1.0, 0.0, 0.0]],
                     [[0.1, 0.8, 0.1], [0.2, 0.5, 0.3], [1.0, 0.0, 0.0]]]])
  with np.errstate(divide="ignore"):
    logits = jnp.asarray(np.log(probs) + 3.0)  # any per-row shift: softmax is invariant
  targets = jnp.array([[1, 0, 0]])
  weights = jnp.array([[1.0, 2.0, 0.0]])
  sums = losses.mlm_accuracy_sums(scores, logits, targets, weights)
  assert float(sums["mlm_correct_sum"]) == 1.0
  assert float(sums["null_mlm_correct_sum"]) == 2.0
