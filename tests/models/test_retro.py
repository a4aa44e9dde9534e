"""RetroModel (realm_jax.models.retro): chunked cross-attention against a NumPy reading of the
paper's definition, causality of the whole model, what the neighbour encoder is conditioned
on, retrieval off, the RETRO-fitting parameter mask, the loss and FLOPs helpers."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import retro

# A larger initialiser than the default 0.02, so that every path moves the logits visibly.
CONFIG = retro.RetroConfig.tiny(initializer_range=0.2)
BATCH, NUM_CHUNKS, NUM_NEIGHBOURS = 2, 4, 2
M, R, D = CONFIG.chunk_size, CONFIG.neighbour_len, CONFIG.hidden_size
LENGTH = NUM_CHUNKS * M
SAME, CHANGED = 1e-5, 1e-3  # largest |difference| of "unchanged", smallest of "changed"


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, CONFIG.vocab_size, (BATCH, LENGTH)).astype(np.int32)
  neighbours = rng.integers(1, CONFIG.vocab_size,
                            (BATCH, NUM_CHUNKS, NUM_NEIGHBOURS, R)).astype(np.int32)
  mask = np.ones(neighbours.shape, bool)
  mask[:, :, 1, R - 3:] = False  # a padded tail on every second neighbour
  return ids, neighbours, mask


@pytest.fixture(scope="module")
def params():
  init = jax.jit(lambda key: nn.unbox(retro.init_params(CONFIG, key, NUM_NEIGHBOURS)))
  return init(jax.random.PRNGKey(0))


_MODEL = retro.RetroModel(CONFIG)
forward = jax.jit(lambda p, ids, nb, mask: _MODEL.apply({"params": p}, ids, nb, mask))
forward_off = jax.jit(lambda p, ids: _MODEL.apply({"params": p}, ids))
encode = jax.jit(lambda p, ids, nb, mask: _MODEL.apply(
    {"params": p}, ids, nb, mask, method=retro.RetroModel.encode_neighbours))


def _max_diff(a, b, axis):
  """max |a - b| over every axis but `axis` (positions or chunks), float64."""
  diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
  return diff.max(axis=tuple(i for i in range(diff.ndim) if i != axis))


# -- chunked cross-attention against NumPy


def numpy_rotate(x, positions, base):
  """RoPE as complex multiplication: feature pair (j, j + d/2) of x [t, heads, d] is the
  complex number x_j + i x_{j + d/2}, turned by the angle position * base^(-2j / d)."""
  half = x.shape[-1] // 2
  angles = np.asarray(positions, np.float64)[:, None] * base ** (-2.0 * np.arange(half)
                                                                   / x.shape[-1])
  z = (x[..., :half] + 1j * x[..., half:]) * np.exp(1j * angles)[:, None, :]
  return np.concatenate([z.real, z.imag], axis=-1)


def numpy_cca(p, hidden, encoded, mask, m, positions=True, base=10000.0):
  """The paper's CCA, token by token: token i (from 0) reads the neighbours of the chunk u
  whose last token is at or before i and whose next chunk's first m - 1 tokens include i,
  i.e. (u + 1) m - 1 <= i <= (u + 2) m - 2 (the last token: u = l - 1); it attends over the
  k r tokens of those neighbours together; a token that reads no chunk gets 0. With
  `positions`, relative positions on chunk u's axis: token i sits at i - u m, token j of every
  neighbour at j."""
  batch, length, _ = hidden.shape
  _, num_chunks, k, r, features = encoded.shape
  out = np.zeros(hidden.shape)
  for b in range(batch):
    for i in range(length):
      chunks = [u for u in range(num_chunks) if (u + 1) * m - 1 <= i <= (u + 2) * m - 2]
      assert len(chunks) <= 1
      if not chunks or not mask[b, chunks[0]].any():
        continue
      keys = encoded[b, chunks[0]].reshape(k * r, features)
      visible = mask[b, chunks[0]].reshape(k * r)
      q = np.einsum("e,ehd->hd", hidden[b, i], p["query"]["kernel"]) + p["query"]["bias"]
      key = np.einsum("te,ehd->thd", keys, p["key"]["kernel"]) + p["key"]["bias"]
      value = np.einsum("te,ehd->thd", keys, p["value"]["kernel"]) + p["value"]["bias"]
      if positions:
        q = numpy_rotate(q[None], [i - chunks[0] * m], base)[0]
        key = numpy_rotate(key, np.tile(np.arange(r), k), base)
      scores = np.einsum("hd,thd->ht", q, key) / math.sqrt(q.shape[-1])
      scores = np.where(visible[None], scores, -np.inf)
      weights = np.exp(scores - scores.max(-1, keepdims=True))
      weights /= weights.sum(-1, keepdims=True)
      context = np.einsum("ht,thd->hd", weights, value)
      out[b, i] = np.einsum("hd,hde->e", context, p["out"]["kernel"]) + p["out"]["bias"]
  return out


def _cca_inputs():
  rng = np.random.default_rng(1)
  hidden = rng.normal(size=(BATCH, LENGTH, D)).astype(np.float32)
  encoded = rng.normal(size=(BATCH, NUM_CHUNKS, NUM_NEIGHBOURS, R, D)).astype(np.float32)
  mask = rng.random(encoded.shape[:-1]) < 0.7
  mask[1, 2] = False  # a chunk without neighbours: its readers get 0
  return hidden, encoded, mask


def _apply_cca(config, hidden, encoded, mask):
  """(CCA output [B, n, D], its attention parameters as float64 NumPy)."""
  cca = retro.ChunkedCrossAttention(config)
  variables = nn.unbox(cca.init(jax.random.PRNGKey(3), hidden, encoded, mask,
                                deterministic=True))
  out = cca.apply(variables, hidden, encoded, mask, deterministic=True)
  return np.asarray(out), jax.tree.map(lambda x: np.asarray(x, np.float64),
                                       variables["params"]["attention"])


@pytest.mark.parametrize("positions", [True, False])
def test_chunked_cross_attention_matches_numpy(positions):
  hidden, encoded, mask = _cca_inputs()
  config = retro.RetroConfig.tiny(initializer_range=0.2, cross_attention_positions=positions)
  out, p = _apply_cca(config, hidden, encoded, mask)
  expected = numpy_cca(p, hidden.astype(np.float64), encoded.astype(np.float64), mask, M,
                       positions=positions, base=config.rotary_base)
  assert out.shape == (BATCH, LENGTH, D)
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
  assert np.all(np.asarray(out)[:, :M - 1] == 0)
  assert np.abs(expected[0, M - 1:]).min() > 0  # the reference is not trivially zero


@pytest.mark.parametrize("positions", [True, False])
def test_cca_reads_neighbour_token_order_only_with_positions(positions):
  """Reversing every neighbour's tokens: content-only attention is blind to it, rotary
  positions are not (what lets a reader find the token after its aligned one)."""
  hidden, encoded, mask = _cca_inputs()
  mask[:] = True
  config = retro.RetroConfig.tiny(initializer_range=0.2, cross_attention_positions=positions)
  out, _ = _apply_cca(config, hidden, encoded, mask)
  reversed_out, _ = _apply_cca(config, hidden, encoded[:, :, :, ::-1].copy(), mask)
  if positions:
    # [B, n - m + 1]: every reading token, in every batch row, moves.
    assert np.abs(out - reversed_out).max(axis=-1)[:, M - 1:].min() > CHANGED
  else:
    np.testing.assert_allclose(reversed_out, out, rtol=1e-5, atol=1e-5)


# -- causality


def test_neighbours_of_chunk_u_reach_only_tokens_from_its_last_one(params):
  ids, neighbours, mask = _inputs()
  base = forward(params, ids, neighbours, mask)
  rng = np.random.default_rng(2)
  for u in range(NUM_CHUNKS):
    changed = neighbours.copy()
    changed[:, u] = rng.integers(1, CONFIG.vocab_size, changed[:, u].shape)
    diff = _max_diff(base, forward(params, ids, changed, mask), axis=1)  # [n]
    first_reader = (u + 1) * M - 1
    assert diff[:first_reader].max(initial=0) <= SAME, (u, diff)
    assert diff[first_reader] > CHANGED, (u, diff)
    assert diff[first_reader:].min() > CHANGED, (u, diff)


def test_a_token_changes_no_earlier_logit(params):
  ids, neighbours, mask = _inputs()
  base = forward(params, ids, neighbours, mask)
  for t in (0, M - 1, M, 2 * M + 1, LENGTH - 1):
    changed = ids.copy()
    changed[:, t] = (changed[:, t] + 7) % CONFIG.vocab_size
    diff = _max_diff(base, forward(params, changed, neighbours, mask), axis=1)
    assert diff[:t].max(initial=0) <= SAME, (t, diff)
    assert diff[t] > CHANGED, (t, diff)


# -- the encoder's conditioning


def test_encoded_chunk_u_depends_on_tokens_up_to_its_end_only(params):
  ids, neighbours, mask = _inputs()
  base = encode(params, ids, neighbours, mask)
  assert base.shape == (BATCH, NUM_CHUNKS, NUM_NEIGHBOURS, R, D)
  for u in range(NUM_CHUNKS):
    # The last token of chunk u is part of H_u: E_u moves, earlier chunks' E do not.
    changed = ids.copy()
    changed[:, (u + 1) * M - 1] = (changed[:, (u + 1) * M - 1] + 5) % CONFIG.vocab_size
    diff = _max_diff(base, encode(params, changed, neighbours, mask), axis=1)  # [l]
    assert diff[:u].max(initial=0) <= SAME, (u, diff)
    assert diff[u] > CHANGED, (u, diff)
    # Every token after chunk u: E_0 .. E_u do not move.
    if u + 1 < NUM_CHUNKS:
      changed = ids.copy()
      changed[:, (u + 1) * M:] = (changed[:, (u + 1) * M:] + 3) % CONFIG.vocab_size
      diff = _max_diff(base, encode(params, changed, neighbours, mask), axis=1)
      assert diff[:u + 1].max() <= SAME, (u, diff)
      assert diff[u + 1] > CHANGED, (u, diff)


def test_each_chunk_encodes_only_its_own_neighbours(params):
  ids, neighbours, mask = _inputs()
  base = encode(params, ids, neighbours, mask)
  u = 2
  changed = neighbours.copy()
  changed[:, u, 0, :3] = (changed[:, u, 0, :3] + 1) % CONFIG.vocab_size
  diff = _max_diff(base, encode(params, ids, changed, mask), axis=1)
  assert np.delete(diff, u).max() <= SAME and diff[u] > CHANGED, diff


# -- retrieval off and the parameter groups


def _without_cca_output(params):
  """The same parameters with every CCA's output projection zero: CCA adds exactly 0."""
  out = jax.tree.map(lambda x: x, params)
  for i in CONFIG.cca_layers:
    projection = out[f"layer_{i}"]["cca"]["attention"]["out"]
    projection["kernel"] = jnp.zeros_like(projection["kernel"])
    projection["bias"] = jnp.zeros_like(projection["bias"])
  return out


def test_retrieval_off_is_the_decoder_with_zero_cca(params):
  ids, neighbours, mask = _inputs()
  off = np.asarray(forward_off(params, ids))
  assert off.shape == (BATCH, LENGTH, CONFIG.vocab_size) and np.isfinite(off).all()
  zero_cca = np.asarray(forward(_without_cca_output(params), ids, neighbours, mask))
  np.testing.assert_allclose(off, zero_cca, rtol=1e-5, atol=1e-5)
  # A chunk whose neighbours are all masked adds nothing either.
  np.testing.assert_allclose(off, forward(params, ids, neighbours, np.zeros_like(mask)),
                             rtol=1e-5, atol=1e-5)
  # And retrieval on does change the logits (after the first m - 1 tokens only).
  diff = _max_diff(off, forward(params, ids, neighbours, mask), axis=1)
  assert diff[:M - 1].max() <= SAME and diff[M - 1:].min() > CHANGED, diff


def _paths(tree):
  return {tuple(str(k.key) for k in path): leaf.shape
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_parameter_mask_selects_exactly_the_encoder_and_cca(params):
  mask = retro.retrieval_parameter_mask(params)
  selected = {path for path, on in zip(_paths(params), jax.tree.leaves(mask)) if on}
  # The unselected leaves are exactly the plain decoder's (an init without neighbours).
  decoder = jax.eval_shape(lambda: nn.unbox(retro.RetroModel(CONFIG).init(
      jax.random.PRNGKey(0), jnp.zeros((1, LENGTH), jnp.int32))["params"]))
  unselected = {p: s for p, s in _paths(params).items() if p not in selected}
  assert unselected == _paths(decoder)
  assert {p[:2] if p[0] != "neighbour_encoder" else p[:1] for p in selected} == (
      {("neighbour_encoder",)} | {(f"layer_{i}", name) for i in CONFIG.cca_layers
                                  for name in ("cca", "cca_layer_norm")})
  # Counted by hand: an attention is 4 d^2 + 4 d, a LayerNorm 2 d, a FFW 2 d f + f + d.
  d, f = CONFIG.hidden_size, CONFIG.intermediate_size
  attention, norm, ffw = 4 * d * d + 4 * d, 2 * d, 2 * d * f + f + d
  encoder = CONFIG.encoder_layers * (2 * attention + ffw + 3 * norm) + 2 * norm
  cca = len(CONFIG.cca_layers) * (attention + norm)
  counts = retro.parameter_counts(params)
  assert counts["retrieval"] == encoder + cca == 8992
  assert counts["decoder"] == sum(math.prod(s) for s in _paths(decoder).values())
  # Boxed parameters get the same mask.
  boxed = jax.eval_shape(lambda: retro.init_params(CONFIG, jax.random.PRNGKey(0)))
  assert sum(jax.tree.leaves(retro.retrieval_parameter_mask(boxed))) == len(selected)


# -- shapes, config, helpers


def test_shapes_and_bad_neighbour_shapes(params):
  ids, neighbours, mask = _inputs()
  logits = forward(params, ids, neighbours, mask)
  assert logits.shape == (BATCH, LENGTH, CONFIG.vocab_size) and np.isfinite(logits).all()
  assert CONFIG.cca_layers == (1, 4)
  assert retro.RetroConfig().cca_layers == (5, 8, 11)  # the paper's 6, 9, 12 from 1
  with pytest.raises(ValueError, match="do not chunk"):
    _MODEL.apply({"params": params}, ids[:, :-1], neighbours, mask)
  with pytest.raises(ValueError, match="do not chunk"):
    _MODEL.apply({"params": params}, ids, neighbours[:, 1:], mask[:, 1:])
  with pytest.raises(ValueError, match="even width"):
    retro.RetroConfig.tiny(num_heads=16)
  with pytest.raises(ValueError, match="no CCA layer"):
    retro.RetroConfig.tiny(cca_start=5)


def test_next_token_losses_match_numpy():
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(2, 6, 11)).astype(np.float32)
  ids = rng.integers(0, 11, (2, 6))
  got = retro.next_token_losses(jnp.asarray(logits), jnp.asarray(ids))
  x = logits.astype(np.float64)
  log_softmax = x - x.max(-1, keepdims=True)
  log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
  expected = -np.take_along_axis(log_softmax[:, :-1], ids[:, 1:, None], -1)[..., 0]
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6)


def test_rotary_scores_depend_on_relative_position_only():
  rng = np.random.default_rng(5)
  q, k = rng.normal(size=(2, 1, 1, 8))  # [length 1, heads 1, head_dim 8] each

  def score(p_q, p_k):
    rq = retro.rotary_embedding(jnp.asarray(q), jnp.array([p_q]), 10000.0)
    rk = retro.rotary_embedding(jnp.asarray(k), jnp.array([p_k]), 10000.0)
    return float(jnp.sum(rq * rk))

  np.testing.assert_allclose(score(0, 0), float(np.sum(q * k)), rtol=1e-5)
  np.testing.assert_allclose(score(3, 7), score(10, 14), rtol=1e-4)
  assert abs(score(3, 7) - score(3, 8)) > 1e-3


def test_flops_per_token_counts_the_matmul_weights(params):
  """2 FLOPs per weight of every matmul a token passes, read off the parameter tree, plus the
  attention products."""
  n, k = LENGTH, NUM_NEIGHBOURS
  d, m, r = CONFIG.hidden_size, CONFIG.chunk_size, CONFIG.neighbour_len
  kernels = {p: math.prod(s) for p, s in _paths(params).items()
             if p[-1] in ("kernel", "embedding")}
  retrieval = {p for p in kernels if "neighbour_encoder" in p or "cca" in p}
  decoder = sum(v for p, v in kernels.items() if p not in retrieval)
  assert retro.flops_per_token(CONFIG, n) == 2 * decoder + CONFIG.num_layers * 4 * n * d

  per_chunk = {p for p in retrieval  # projected once per chunk: H_u's keys and values
               if "cross_attention" in p and p[-2] in ("key", "value")}
  per_neighbour_token = {p for p in retrieval - per_chunk  # once per neighbour token
                         if "neighbour_encoder" in p or p[-2] in ("key", "value")}
  weights = (sum(kernels[p] for p in per_neighbour_token) * k * r / m
             + sum(kernels[p] for p in retrieval - per_neighbour_token))
  products = (len(CONFIG.cca_layers) * 4 * k * r * d
              + CONFIG.encoder_layers * k * r / m * (4 * r * d + 4 * m * d))
  np.testing.assert_allclose(retro.flops_per_token(CONFIG, n, k) - retro.flops_per_token(
      CONFIG, n), 2 * weights + products, rtol=1e-12)
