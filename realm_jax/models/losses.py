"""Loss functions for REALM pretraining, ICT warm start and open-QA fine-tuning.

Pure JAX functions shared by every model's ``loss_fn`` and tested against NumPy. Everything is
float32; averaging functions return ``(value, aux)`` with the mean's numerator and denominator
(``*_sum``, ``weight_sum``) so devices and microbatches add up exactly; weight-0 positions are
made finite by ``jnp.where`` before any arithmetic, so they never touch a value or gradient.
Spec references (REALM_SPEC n) are to the numbered items of ``docs/realm_spec.md``; design
notes: docs/design/models_and_jobs.md.
"""

from typing import Any, Dict, Tuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

MARGINALIZATIONS = ("per_token", "per_example")


def mlm_accuracy_sums(scores: Array, mlm_logits: Array, mlm_targets: Array, weights: Array, *,
                      null_index: int | None = 0) -> dict[str, Array]:
  """Weighted counts of masked tokens predicted exactly: by the argmax of the marginal over
  the candidates (REALM's prediction), and of the null document alone (what the encoder knows
  without evidence); their gap is retrieval utility in accuracy form.

  Args:
    scores: [batch, candidates] relevance scores f(x, z_k).
    mlm_logits: [batch, candidates, masks, vocab].
    mlm_targets: [batch, masks] target ids.
    weights: [batch, masks] float mask weights (0 for padding and skipped examples).
    null_index: candidate slot of the null document (None: there is none).

  Returns:
    {"mlm_correct_sum", "null_mlm_correct_sum"} float32 (the second only with a null document).
  """
  logits = mlm_logits.astype(jnp.float32)
  x_max, shifted_logsumexp = _log_softmax_parts(logits)  # [B, K, M, 1] each
  # jax.nn.log_softmax's values; and their maximum over the vocabulary, the same expression
  # at the largest logit (it is non-decreasing in the logit, rounding included).
  log_probs = (logits - x_max) - shifted_logsumexp  # [B, K, M, V]
  log_probs_max = (x_max - x_max) - shifted_logsumexp  # [B, K, M, 1]
  log_prior = jax.nn.log_softmax(scores.astype(jnp.float32), axis=-1)  # [B, K]
  if logits.shape[1] == 1:
    # logsumexp over one candidate is its value plus its log prior, exactly.
    marginal = log_probs[:, 0] + log_prior[:, 0, None, None]  # [B, M, V]
    marginal_max = log_probs_max[:, 0] + log_prior[:, 0, None, None]  # [B, M, 1]
  else:
    marginal = jax.nn.logsumexp(log_probs + log_prior[:, :, None, None], axis=1)  # [B, M, V]
    marginal_max = None
  correct = _is_argmax(marginal, mlm_targets, marginal_max).astype(jnp.float32)  # [B, M]
  if null_index is None:
    return {"mlm_correct_sum": jnp.sum(correct * weights)}
  null_correct = _is_argmax(log_probs[:, null_index], mlm_targets,
                            log_probs_max[:, null_index]).astype(jnp.float32)  # [B, M]
  return {"mlm_correct_sum": jnp.sum(correct * weights),
          "null_mlm_correct_sum": jnp.sum(null_correct * weights)}


def _is_argmax(values: Array, targets: Array, values_max: Array | None = None) -> Array:
  """`jnp.argmax(values, axis=-1) == targets` from the maximum and one min-reduction (the first
  index holding the maximum, or the first NaN, as argmax picks): faster than argmax on a CPU.

  Args:
    values: [..., vocab].
    targets: int [...].
    values_max: [..., 1] the maximum of `values` over the last axis, or None.

  Returns:
    bool [...].
  """
  if values_max is None:
    values_max = jnp.max(values, axis=-1, keepdims=True)
  vocab = values.shape[-1]
  index = jax.lax.broadcasted_iota(jnp.int32, values.shape, values.ndim - 1)
  first = jnp.min(jnp.where((values == values_max) | jnp.isnan(values), index, vocab), axis=-1)
  return first == targets


def mlm_token_log_probs(mlm_logits: Array, mlm_targets: Array) -> Array:
  """Log-probability of each target token under each candidate document.

  Args:
    mlm_logits: ``[batch, candidates, masks, vocab]`` reader MLM logits at the masked positions,
      one set per retrieved candidate. Any float dtype (bfloat16 is fine).
    mlm_targets: ``[batch, masks]`` integer target token ids (shared by all candidates: the
      query, and therefore its masked tokens, is the same whichever document is retrieved).

  Returns:
    ``[batch, candidates, masks]`` float32 ``log p(y_j | z_k, x)``. Padded mask slots get whatever
    their (padding) target yields; the losses below ignore them through ``mlm_weights``.
  """
  # Normalise in float32: log_softmax over a 30k vocabulary in bfloat16 loses most digits.
  logits = mlm_logits.astype(jnp.float32)
  # [batch, candidates, masks, vocab]
  num_candidates = logits.shape[1]
  # The same targets for every candidate.
  targets = jnp.broadcast_to(mlm_targets[:, None, :],
                             (mlm_targets.shape[0], num_candidates, mlm_targets.shape[1]))
  # [batch, candidates, masks]
  return _target_log_softmax(logits, targets)


def _log_softmax_parts(logits: Array) -> tuple[Array, Array]:
  """`max` and `log(sum(exp(logits - max)))` over the last axis (keepdims), as
  `jax.nn.log_softmax` computes them."""
  x_max = jnp.max(logits, axis=-1, initial=-np.inf, keepdims=True)
  shifted_logsumexp = jnp.log(jnp.sum(jnp.exp(logits - x_max), axis=-1, keepdims=True))
  return x_max, shifted_logsumexp


@jax.custom_vjp
def _target_log_softmax(logits: Array, targets: Array) -> Array:
  """`take_along_axis(log_softmax(logits), targets[..., None], -1)[..., 0]` without forming the
  log-softmax over the vocabulary and with its gradient written out, which saves full passes
  over the logits. Same values (out-of-range targets give NaN and no gradient).

  Args:
    logits: float32 [..., vocab].
    targets: int [...].

  Returns:
    float32 [...].
  """
  return _target_log_softmax_fwd(logits, targets)[0]


def _target_log_softmax_fwd(logits, targets):
  x_max, shifted_logsumexp = _log_softmax_parts(logits)
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)
  out = ((target_logits - x_max) - shifted_logsumexp)[..., 0]
  return out, (logits, targets, x_max, shifted_logsumexp)


def _target_log_softmax_bwd(residuals, g):
  logits, targets, x_max, shifted_logsumexp = residuals
  vocab = logits.shape[-1]
  # The gather's index rules: negative targets count from the end, out-of-range ones match none.
  targets = jnp.where(targets < 0, targets + vocab, targets)
  onehot = jax.lax.broadcasted_iota(targets.dtype, logits.shape, logits.ndim - 1) == (
      targets[..., None])
  # d log_softmax(x)_t / dx = onehot(t) - softmax(x)
  softmax = jnp.exp((logits - x_max) - shifted_logsumexp)
  d_logits = g[..., None] * (onehot.astype(logits.dtype) - softmax)
  return d_logits, None


_target_log_softmax.defvjp(_target_log_softmax_fwd, _target_log_softmax_bwd)


def _masked_token_log_probs(token_log_probs: Array, mlm_weights: Array) -> Array:
  """Replaces padded slots' token log-probs with 0 so they stay finite downstream.

  A padded slot may hold ``-inf`` (or NaN, from an out-of-range padding target). Multiplying it
  by its zero weight later would give NaN, and an all-``-inf`` logsumexp has a NaN gradient, so
  the value is swapped out here; ``jnp.where`` sends zero cotangent to the unselected branch.
  """
  valid = (mlm_weights > 0)[:, None, :]
  # [batch, 1, masks]
  return jnp.where(valid, token_log_probs.astype(jnp.float32), 0.0)
  # [batch, candidates, masks]


def _per_token_marginal(log_prior: Array, token_log_probs: Array) -> Array:
  """Per-token marginal log-likelihood, REALM_SPEC item 16.

  ``marg[b, j] = logsumexp_k(log p(z_k | x) + log p(y_j | z_k, x))``. Shared by the loss and the
  retrieval utility so both always use exactly the same marginal.

  Args:
    log_prior: ``[batch, candidates]`` float32 ``log p(z | x)``.
    token_log_probs: ``[batch, candidates, masks]`` float32, padded slots already made finite.

  Returns:
    ``[batch, masks]`` float32 marginal log-probabilities (0 at slots whose token log-probs were
    zeroed, since the prior sums to one).
  """
  joint = log_prior[:, :, None] + token_log_probs
  # [batch, candidates, masks]
  return jax.nn.logsumexp(joint, axis=1)
  # [batch, masks]


def _safe_divide(numerator: Array, denominator: Array) -> Array:
  """``numerator / denominator``, or exactly 0 where the denominator is 0 (finite gradients)."""
  nonzero = denominator != 0
  # The inner where keeps the division itself finite, so the outer where's gradient is too.
  return jnp.where(nonzero, numerator / jnp.where(nonzero, denominator, 1.0), 0.0)


def marginal_mlm_loss(
    candidate_logits: Array,
    token_log_probs: Array,
    mlm_weights: Array,
    *,
    marginalization: str = "per_token",
) -> Tuple[Array, Dict[str, Array]]:
  """REALM pretraining loss: masked-LM likelihood marginalised over retrieved documents,
  ``p(z | x) = softmax_k(f(x, z_k))`` (null document included). ``"per_token"`` (default, the
  authors' code, REALM_SPEC item 16) marginalises each masked token on its own;
  ``"per_example"`` (the paper's formula) once per example (design notes).

  Args:
    candidate_logits: ``[batch, candidates]`` retrieval scores ``f(x, z)``.
    token_log_probs: ``[batch, candidates, masks]`` ``log p(y_j | z_k, x)``.
    mlm_weights: ``[batch, masks]`` weights, 0 for padded slots (any log-prob there is ignored).
    marginalization: ``"per_token"`` or ``"per_example"`` (else ValueError).

  Returns:
    ``(loss, aux)``: float32 loss (0 without masks); ``loss_sum``, ``weight_sum`` (mask weights,
    or examples with a mask) and ``marginal_log_probs`` (``[batch, masks]`` or ``[batch]``).
  """
  if marginalization not in MARGINALIZATIONS:
    raise ValueError(
        f"marginalization must be one of {MARGINALIZATIONS}, got {marginalization!r}")
  # Gradients reach the retriever only through this log_softmax (REALM_SPEC item 15).
  log_prior = jax.nn.log_softmax(candidate_logits.astype(jnp.float32), axis=-1)
  # [batch, candidates]
  weights = mlm_weights.astype(jnp.float32)
  # [batch, masks]
  token_lp = _masked_token_log_probs(token_log_probs, weights)
  # [batch, candidates, masks]

  if marginalization == "per_token":
    marg = _per_token_marginal(log_prior, token_lp)
    # [batch, masks]
    loss_sum = -jnp.sum(marg * weights)
    weight_sum = jnp.sum(weights)
    marginal_log_probs = marg
  else:
    # log prod_j p(y_j|z,x) = sum_j log p(y_j|z,x); padded slots contribute 0 (zeroed above).
    doc_ll = jnp.sum(token_lp * weights[:, None, :], axis=-1)
    # [batch, candidates]
    ex_ll = jax.nn.logsumexp(log_prior + doc_ll, axis=-1)
    # [batch]
    # An example without masks has ex_ll = logsumexp(log_prior) = 0; still excluded explicitly
    # so it does not count in the denominator.
    has_mask = (jnp.sum(weights, axis=-1) > 0).astype(jnp.float32)
    # [batch]
    loss_sum = -jnp.sum(ex_ll * has_mask)
    weight_sum = jnp.sum(has_mask)
    marginal_log_probs = ex_ll * has_mask

  loss = _safe_divide(loss_sum, weight_sum)
  aux = {
      "loss_sum": loss_sum,
      "weight_sum": weight_sum,
      "marginal_log_probs": marginal_log_probs,
  }
  return loss, aux


def retrieval_utility(
    candidate_logits: Array,
    token_log_probs: Array,
    mlm_weights: Array,
    *,
    null_index: int = 0,
) -> Tuple[Array, Dict[str, Array]]:
  """Retrieval utility (REALM_SPEC item 17): the weighted mean over masked tokens of
  ``marg_j - log p(y_j | null, x)``, ``marg_j`` the per-token marginal of ``marginal_mlm_loss``.
  Positive: retrieval makes the tokens likelier than no document; the authors select
  checkpoints on it (higher is better).

  Args:
    candidate_logits: ``[batch, candidates]`` retrieval scores ``f(x, z)``.
    token_log_probs: ``[batch, candidates, masks]`` ``log p(y_j | z_k, x)``.
    mlm_weights: ``[batch, masks]`` non-negative float weights, 0 for padded mask slots.
    null_index: candidate slot holding the null document (slot 0 in REALM).

  Returns:
    ``(ru, aux)``: float32 utility (0 without masks), ``utility_sum`` and ``weight_sum``.
  """
  log_prior = jax.nn.log_softmax(candidate_logits.astype(jnp.float32), axis=-1)
  # [batch, candidates]
  weights = mlm_weights.astype(jnp.float32)
  # [batch, masks]
  token_lp = _masked_token_log_probs(token_log_probs, weights)
  # [batch, candidates, masks]
  marg = _per_token_marginal(log_prior, token_lp)
  # [batch, masks]
  null_lp = token_lp[:, null_index, :]
  # [batch, masks]
  utility_sum = jnp.sum((marg - null_lp) * weights)
  weight_sum = jnp.sum(weights)
  ru = _safe_divide(utility_sum, weight_sum)
  return ru, {"utility_sum": utility_sum, "weight_sum": weight_sum}


def null_document_probability(candidate_logits: Array, *, null_index: int = 0) -> Array:
  """Retrieval probability of the null document (the ``retrieval/null_prob`` metric).

  Args:
    candidate_logits: ``[batch, candidates]`` retrieval scores ``f(x, z)``.
    null_index: candidate slot holding the null document.

  Returns:
    ``[batch]`` float32 ``p(z = null | x)``.
  """
  probs = jax.nn.softmax(candidate_logits.astype(jnp.float32), axis=-1)
  # [batch, candidates]
  return probs[:, null_index]


def marginal_log_loss(logits: Array, is_correct: Array) -> Array:
  """Negative log of the total probability of the correct entries (ORQA; REALM_SPEC item 28).

  ``logsumexp(logits) - logsumexp(logits restricted to correct entries)`` over the last axis.
  Used for the retriever (``[questions, beam]``) and for the reader with its logits flattened to
  ``[questions, beam * spans]``. Rows without any correct entry give exactly 0, with zero
  (finite) gradient, as in ORQA, which zeroes the loss when nothing is correct.

  Args:
    logits: ``[..., entries]`` scores, any float dtype.
    is_correct: ``[..., entries]`` bool (or 0/1) correctness labels.

  Returns:
    ``logits.shape[:-1]`` float32 per-row losses. Average them per question (REALM_SPEC item 28).
  """
  logits = logits.astype(jnp.float32)
  # [..., entries]
  correct = is_correct.astype(bool)
  # [..., entries]
  any_correct = jnp.any(correct, axis=-1)
  # [...]
  # finfo.min rather than -inf: the logsumexp of an all-masked row stays finite, so its gradient
  # (multiplied by zero below) is finite too. Its exp underflows to 0 next to any real logit.
  masked = jnp.where(correct, logits, jnp.finfo(jnp.float32).min)
  # [..., entries]
  log_total = jax.nn.logsumexp(logits, axis=-1)
  # [...]
  log_correct = jax.nn.logsumexp(masked, axis=-1)
  # [...]
  # For rows with nothing correct, log_total - finfo.min would overflow; substitute log_total so
  # the difference is 0 and stays finite before the outer where.
  log_correct = jnp.where(any_correct, log_correct, log_total)
  return jnp.where(any_correct, log_total - log_correct, 0.0)


def in_batch_softmax_loss(
    query_emb: Array,
    block_emb: Array,
    *,
    label_offset: Any = 0,
) -> Tuple[Array, Dict[str, Array]]:
  """Inverse Cloze Task loss with in-batch negatives (REALM_SPEC item 14, from ORQA): each query
  picks its own block among all blocks of the (global) batch, softmax over dot products.

  Args:
    query_emb: ``[queries, proj]`` query embeddings.
    block_emb: ``[blocks, proj]`` block embeddings, possibly gathered from all devices.
    label_offset: index of query 0's positive block (a device's shard offset when the blocks
      are all-gathered). A Python int is validated; a traced value is trusted.

  Returns:
    ``(loss, aux)``: mean cross-entropy over the queries and ``loss_sum``, ``weight_sum``,
    ``accuracy_sum``, ``scores`` (``[queries, blocks]``). ValueError on mismatched shapes.
  """
  if query_emb.ndim != 2 or block_emb.ndim != 2:
    raise ValueError(
        "in_batch_softmax_loss expects query_emb [queries, proj] and block_emb [blocks, proj], "
        f"got shapes {query_emb.shape} and {block_emb.shape}")
  if query_emb.shape[1] != block_emb.shape[1]:
    raise ValueError(
        f"query_emb and block_emb projection widths differ: {query_emb.shape[1]} vs "
        f"{block_emb.shape[1]}")
  num_queries = query_emb.shape[0]
  num_blocks = block_emb.shape[0]
  if isinstance(label_offset, (int, np.integer)):
    if label_offset < 0 or label_offset + num_queries > num_blocks:
      raise ValueError(
          f"label_offset ({label_offset}) + queries ({num_queries}) must lie within the "
          f"{num_blocks} blocks: query i's positive block is i + label_offset")

  scores = jnp.einsum(
      "qd,nd->qn", query_emb.astype(jnp.float32), block_emb.astype(jnp.float32))
  # [queries, blocks]
  labels = label_offset + jnp.arange(num_queries)
  # [queries]
  log_probs = jax.nn.log_softmax(scores, axis=-1)
  # [queries, blocks]
  nll = -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
  # [queries]
  correct = (jnp.argmax(scores, axis=-1) == labels).astype(jnp.float32)
  # [queries]
  loss_sum = jnp.sum(nll)
  weight_sum = jnp.asarray(num_queries, jnp.float32)
  loss = _safe_divide(loss_sum, weight_sum)
  aux = {
      "loss_sum": loss_sum,
      "weight_sum": weight_sum,
      "accuracy_sum": jnp.sum(correct),
      "scores": scores,
  }
  return loss, aux
