"""FidModel (realm_jax.models.fid): the decoder's cross-attention over the concatenated passages
against NumPy, the encoder's independence of the passages, causality, greedy decoding against
the teacher-forced argmax path, beam search against hand-worked and brute-force answers, the
loss, the ADist scores and the warm start from a BERT."""

import dataclasses
import itertools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import fid
from realm_jax.models.bert import BertModel

# A larger initialiser than the default 0.02, so that every path moves the logits visibly.
CONFIG = fid.FidConfig.tiny(initializer_range=0.2)
BATCH, PASSAGES, LENGTH, ANSWER = 2, 3, 6, 6
D, V = CONFIG.hidden_size, CONFIG.vocab_size
SAME, CHANGED = 1e-5, 1e-3  # largest |difference| of "unchanged", smallest of "changed"


def _inputs(seed=0):
  """Passages [B, K, L] with padded tails, and decoder inputs [B, T]."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, V, (BATCH, PASSAGES, LENGTH)).astype(np.int32)
  mask = np.ones(ids.shape, np.int32)
  mask[:, 1, LENGTH - 2:] = 0
  mask[1, 2, 3:] = 0
  ids[mask == 0] = 0
  decoder_ids = rng.integers(1, V, (BATCH, ANSWER)).astype(np.int32)
  return ids, mask, decoder_ids


@pytest.fixture(scope="module")
def params():
  # Seed 1: greedy answers that change token after their first steps (test_greedy_decode_...).
  return jax.jit(lambda key: nn.unbox(fid.init_params(CONFIG, key)))(jax.random.PRNGKey(1))


_MODEL = fid.FidModel(CONFIG)
forward = jax.jit(lambda p, ids, mask, dec: _MODEL.apply({"params": p}, ids, mask, dec))
encode = jax.jit(lambda p, ids, mask: _MODEL.apply({"params": p}, ids, mask,
                                                   method=fid.FidModel.encode))


def _max_diff(a, b, axis):
  """max |a - b| over every axis but `axis`, float64."""
  diff = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
  return diff.max(axis=tuple(i for i in range(diff.ndim) if i != axis))


# -- cross-attention over the K passages against NumPy


def numpy_cross_attention(p, hidden, encoded, mask):
  """Cross-attention of hidden [B, T, D] over encodings [B, K, L, D], passage by passage:
  every passage's scores against its real tokens, ONE softmax over all passages together.
  Returns (output [B, T, D], weights [B, heads, T, K, L], value norms [B, heads, K, L])."""
  batch, num_passages, length, _ = encoded.shape
  heads = p["query"]["kernel"].shape[1]
  out = np.zeros(hidden.shape)
  weights = np.zeros((batch, heads, hidden.shape[1], num_passages, length))
  norms = np.zeros((batch, heads, num_passages, length))
  for b in range(batch):
    q = np.einsum("te,ehd->thd", hidden[b], p["query"]["kernel"]) + p["query"]["bias"]
    scores, values = [], []
    for k in range(num_passages):
      key = np.einsum("le,ehd->lhd", encoded[b, k], p["key"]["kernel"]) + p["key"]["bias"]
      value = np.einsum("le,ehd->lhd", encoded[b, k], p["value"]["kernel"]) + p["value"]["bias"]
      s = np.einsum("thd,lhd->htl", q, key) / math.sqrt(q.shape[-1])
      scores.append(np.where(mask[b, k][None, None], s, -np.inf))  # [heads, T, L]
      values.append(value)
      norms[b, :, k] = np.linalg.norm(value, axis=-1).T
    s = np.stack(scores, axis=2)  # [heads, T, K, L]
    w = np.exp(s - s.max(axis=(2, 3), keepdims=True))
    w /= w.sum(axis=(2, 3), keepdims=True)
    weights[b] = w
    context = np.einsum("htkl,klhd->thd", w, np.stack(values))
    out[b] = np.einsum("thd,hde->te", context, p["out"]["kernel"]) + p["out"]["bias"]
  return out, weights, norms


def test_cross_attention_over_concatenated_passages_matches_numpy():
  rng = np.random.default_rng(1)
  hidden = rng.normal(size=(BATCH, ANSWER, D)).astype(np.float32)
  encoded = rng.normal(size=(BATCH, PASSAGES, LENGTH, D)).astype(np.float32)
  mask = rng.random(encoded.shape[:-1]) < 0.7
  mask[:, :, 0] = True
  mask[1, 0] = False  # a fully padded passage: no weight at all
  memory, memory_mask = fid.concatenate_passages(jnp.asarray(encoded), jnp.asarray(mask))
  assert memory.shape == (BATCH, PASSAGES * LENGTH, D)
  attention = fid.FidAttention(CONFIG)
  variables = nn.unbox(attention.init(jax.random.PRNGKey(3), hidden, memory,
                                      memory_mask[:, None], deterministic=True))
  out, sown = attention.apply(variables, hidden, memory, memory_mask[:, None],
                              deterministic=True, sow=True, mutable=["intermediates"])
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), variables["params"])
  expected, weights, norms = numpy_cross_attention(p, hidden.astype(np.float64),
                                                   encoded.astype(np.float64), mask)
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
  probs = np.asarray(sown["intermediates"]["attention_probs"][0])  # [B, heads, T, K L]
  np.testing.assert_allclose(probs, weights.reshape(probs.shape), rtol=1e-5, atol=1e-6)
  assert np.all(probs.reshape(weights.shape)[1, :, :, 0] == 0)
  np.testing.assert_allclose(np.asarray(sown["intermediates"]["value_norms"][0]),
                             norms.reshape(BATCH, -1, PASSAGES * LENGTH), rtol=1e-5)

  # ADist: weights times value norms, averaged over layers, heads and targets, per passage.
  target_mask = np.ones((BATCH, ANSWER), bool)
  target_mask[0, 4:] = False
  second = rng.random(weights.shape)  # a second "layer"
  layers = [(weights, norms), (second, norms[::-1])]
  got = fid.passage_attention_scores(
      [jnp.asarray(w.reshape(probs.shape)) for w, _ in layers],
      [jnp.asarray(n.reshape(BATCH, -1, PASSAGES * LENGTH)) for _, n in layers],
      jnp.asarray(target_mask), jnp.asarray(mask))
  want = np.zeros((BATCH, PASSAGES))
  for b, k in itertools.product(range(BATCH), range(PASSAGES)):
    for w, n in layers:
      want[b, k] += sum(w[b, h, t, k, j] * n[b, h, k, j]
                        for h in range(w.shape[1]) for t in range(ANSWER)
                        for j in range(LENGTH) if target_mask[b, t] and mask[b, k, j])
    want[b, k] /= len(layers) * weights.shape[1] * target_mask[b].sum()
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)
  assert want[1, 0] == 0 and want.min(initial=1, where=mask.any(-1)) > 0


def test_model_sows_every_layers_cross_attention(params):
  ids, mask, dec = _inputs()
  _, sown = _MODEL.apply({"params": params}, ids, mask, dec, mutable=["intermediates"])
  probs, norms = fid.cross_attention_maps(sown["intermediates"])
  assert len(probs) == len(norms) == CONFIG.decoder_layers
  for p, n in zip(probs, norms):
    assert p.shape == (BATCH, CONFIG.num_heads, ANSWER, PASSAGES * LENGTH)
    assert n.shape == (BATCH, CONFIG.num_heads, PASSAGES * LENGTH)
    np.testing.assert_allclose(np.asarray(p).sum(-1), 1.0, rtol=1e-5)
    assert np.all(np.asarray(p)[np.broadcast_to(
        (mask.reshape(BATCH, 1, 1, -1) == 0), p.shape)] == 0)
  scores = fid.passage_attention_scores(probs, norms, np.ones((BATCH, ANSWER)), mask)
  assert scores.shape == (BATCH, PASSAGES) and np.all(np.asarray(scores) > 0)


# -- what depends on what


def test_encoder_reads_each_passage_alone(params):
  ids, mask, _ = _inputs()
  base = encode(params, ids, mask)
  assert base.shape == (BATCH, PASSAGES, LENGTH, D)
  for k in range(PASSAGES):
    changed = ids.copy()
    changed[:, k, 1] = (changed[:, k, 1] + 7) % V
    diff = _max_diff(base, encode(params, changed, mask), axis=1)  # [K]
    assert np.delete(diff, k).max() <= SAME and diff[k] > CHANGED, (k, diff)


def test_decoder_reads_every_passage_and_no_padding(params):
  ids, mask, dec = _inputs()
  base = forward(params, ids, mask, dec)
  assert base.shape == (BATCH, ANSWER, V) and np.isfinite(base).all()
  for k in range(PASSAGES):
    changed = ids.copy()
    changed[:, k, 1] = (changed[:, k, 1] + 7) % V
    diff = _max_diff(base, forward(params, changed, mask, dec), axis=1)  # [T]
    assert diff.min() > CHANGED, (k, diff)
  padded = ids.copy()
  padded[mask == 0] = 5
  np.testing.assert_allclose(forward(params, padded, mask, dec), base, rtol=1e-5, atol=1e-5)


def test_an_answer_token_changes_no_earlier_logit(params):
  ids, mask, dec = _inputs()
  base = forward(params, ids, mask, dec)
  for t in range(ANSWER):
    changed = dec.copy()
    changed[:, t] = (changed[:, t] + 7) % V
    diff = _max_diff(base, forward(params, ids, mask, changed), axis=1)  # [T]
    assert diff[:t].max(initial=0) <= SAME, (t, diff)
    assert diff[t:].min() > CHANGED, (t, diff)


# -- decoding the model


def _truncate_at(tokens, eos, pad):
  """Each row up to and including its first `eos`, then `pad`."""
  out = tokens.copy()
  for row in out:
    hits = np.flatnonzero(row == eos)
    if hits.size:
      row[hits[0] + 1:] = pad
  return out


def test_greedy_decode_is_the_teacher_forced_argmax_path_and_stops_at_eos(params):
  ids, mask, _ = _inputs()
  # Under an EOS the model never picks, greedy runs to max_len: the argmax path.
  free = np.asarray(fid.greedy_decode(params, CONFIG, ids, mask, ANSWER))
  assert free.shape == (BATCH, ANSWER) and not np.any(free == CONFIG.eos_id)
  logits = forward(params, ids, mask, fid.shift_right(jnp.asarray(free), CONFIG.bos_id))
  np.testing.assert_array_equal(np.asarray(logits).argmax(-1), free)

  # The same parameters with EOS := a token row 0 first takes at step t >= 1: every row stops
  # at that token's first occurrence, padded after it, its earlier tokens unchanged.
  t = next(t for t in range(1, ANSWER) if free[0, t] not in free[0, :t])
  eos = int(free[0, t])
  config = fid.FidConfig.tiny(initializer_range=0.2, eos_id=eos)
  stopped = np.asarray(fid.greedy_decode(params, config, ids, mask, ANSWER))
  np.testing.assert_array_equal(stopped, _truncate_at(free, eos, CONFIG.pad_id))
  assert t < ANSWER - 1 and np.all(stopped[0, t + 1:] == CONFIG.pad_id), (free, stopped)


def test_beam_search_scores_are_the_teacher_forced_log_probabilities(params):
  ids, mask, _ = _inputs()
  beam = 3
  tokens, scores = fid.beam_search(params, CONFIG, ids, mask, beam, ANSWER, 0.0)
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  assert tokens.shape == (BATCH, beam, ANSWER) and scores.shape == (BATCH, beam)
  assert np.all(np.diff(scores, axis=1) <= 0) and np.isfinite(scores).all()
  for w in range(beam):
    np.testing.assert_array_equal(
        tokens[:, w], _truncate_at(tokens[:, w], CONFIG.eos_id, CONFIG.pad_id))
    logits = forward(params, ids, mask, fid.shift_right(jnp.asarray(tokens[:, w]),
                                                        CONFIG.bos_id))
    rescored = fid.sequence_log_probs(logits, jnp.asarray(tokens[:, w]), CONFIG.eos_id)
    np.testing.assert_allclose(np.asarray(rescored), scores[:, w], rtol=1e-4, atol=1e-4)
  # Length-normalised (the same compiled search: length_penalty is traced).
  tokens1, scores1 = fid.beam_search(params, CONFIG, ids, mask, beam, ANSWER, 1.0)
  for w in range(beam):
    logits = forward(params, ids, mask, fid.shift_right(tokens1[:, w], CONFIG.bos_id))
    lengths = np.asarray(fid.answer_lengths(tokens1[:, w], CONFIG.eos_id))
    np.testing.assert_allclose(
        np.asarray(fid.sequence_log_probs(logits, tokens1[:, w], CONFIG.eos_id)) / lengths,
        np.asarray(scores1[:, w]), rtol=1e-4, atol=1e-4)


# -- the searches on a fixed table of next-token log-probabilities

# Tokens of the table "model": 0 is BOS and padding, 3 is EOS.
TV, EOS, PAD, BOS = 4, 3, 0, 0


def _prefix_id(prefix):
  """A distinct row of the table for each prefix (the empty one: 0)."""
  code = 0
  for token in prefix:
    code = code * (TV + 1) + token + 1
  return code


def table_step(table):
  """A StepFn whose state is the prefix id [N]; the next-token log-probabilities are
  table[prefix id]."""

  def step(tokens, index, prefix):
    prefix = jnp.where(index == 0, 0, prefix * (TV + 1) + tokens + 1)
    return table[prefix], prefix

  return step


@jax.jit
def _table_greedy(table):
  return fid.greedy_search(table_step(table), jnp.zeros((1,), jnp.int32), 1, 3, bos_id=BOS,
                           eos_id=EOS, pad_id=PAD)


@jax.jit
def _beams_of_2(table, length_penalty):
  return fid.search_beams(table_step(table), jnp.zeros((2,), jnp.int32), 1, 2, 3, bos_id=BOS,
                          eos_id=EOS, pad_id=PAD, length_penalty=length_penalty)


@jax.jit
def _beams_of_9(table, length_penalty):
  return fid.search_beams(table_step(table), jnp.zeros((9,), jnp.int32), 1, 9, 3, bos_id=BOS,
                          eos_id=EOS, pad_id=PAD, length_penalty=length_penalty)


def _table(rows):
  """Log-probabilities [(TV + 1)^3, TV]: uniform over 1, 2, EOS (and ~0 on 0) except `rows`
  ({prefix: [p(0), p(1), p(2), p(EOS)]})."""
  probs = np.tile([0, 1 / 3, 1 / 3, 1 / 3], ((TV + 1) ** 3, 1))
  for prefix, row in rows.items():
    probs[_prefix_id(prefix)] = row
  probs = np.maximum(probs, 1e-9)
  return jnp.asarray(np.log(probs / probs.sum(-1, keepdims=True)), jnp.float32)


def test_beam_of_two_finds_what_greedy_misses():
  """p(1) = .5, p(2) = .4, p(EOS) = .1; after 1: at most .4 (EOS); after 2: EOS .9.
  Greedy: 1 EOS (.5 x .4 = .2). Beam 2 keeps 2 alive: 2 EOS (.4 x .9 = .36) wins, then 1 EOS;
  every 3-token answer has at most .5 x .3 x 1/3 < .2."""
  table = _table({(): [0, .5, .4, .1], (1,): [0, .3, .3, .4], (2,): [0, .05, .05, .9]})
  np.testing.assert_array_equal(_table_greedy(table), [[1, EOS, PAD]])
  tokens, scores = _beams_of_2(table, 0.0)
  np.testing.assert_array_equal(tokens, [[[2, EOS, PAD], [1, EOS, PAD]]])
  np.testing.assert_allclose(scores, [[math.log(.36), math.log(.2)]], rtol=1e-5)
  # Normalised by length (2 tokens each): the same order, halved.
  _, scores = _beams_of_2(table, 1.0)
  np.testing.assert_allclose(scores, [[math.log(.36) / 2, math.log(.2) / 2]], rtol=1e-5)


def _all_answers(max_len):
  """Every answer: 0 .. max_len - 1 non-EOS tokens then EOS, or max_len non-EOS tokens."""
  tokens = [t for t in range(TV) if t != EOS]
  for n in range(max_len):
    for body in itertools.product(tokens, repeat=n):
      yield body + (EOS,)
  yield from itertools.product(tokens, repeat=max_len)


def _score(table, answer, length_penalty):
  log_prob = sum(table[_prefix_id(answer[:t]), token] for t, token in enumerate(answer))
  return log_prob / len(answer) ** length_penalty


def numpy_beam_search(table, beam, max_len, length_penalty):
  """Beam search as the docstring says, over Python lists: [(answer, score)], best first."""
  alive, finished = [((), 0.0)], []
  for t in range(max_len):
    extended = []
    for answer, log_prob in alive:
      for token in range(TV):
        candidate = (answer + (token,), log_prob + table[_prefix_id(answer), token])
        if token == EOS:
          finished.append((candidate[0], candidate[1] / (t + 1) ** length_penalty))
        else:
          extended.append(candidate)
    alive = sorted(extended, key=lambda c: -c[1])[:beam]
  finished += [(answer, lp / max_len ** length_penalty) for answer, lp in alive]
  return sorted(finished, key=lambda c: -c[1])[:beam]


def _padded(answers, max_len):
  return [list(a) + [PAD] * (max_len - len(a)) for a in answers]


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_search_matches_brute_force_and_a_numpy_beam(length_penalty):
  rng = np.random.default_rng(6)
  for _ in range(3):
    logits = rng.normal(size=((TV + 1) ** 3, TV)) * 2
    table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    # Beam 9 keeps all 3^2 two-token prefixes alive: the search is exhaustive.
    everything = sorted(((a, _score(table, a, length_penalty)) for a in _all_answers(3)),
                        key=lambda c: -c[1])[:9]
    tokens, scores = _beams_of_9(jnp.asarray(table, jnp.float32), length_penalty)
    np.testing.assert_array_equal(tokens[0], _padded([a for a, _ in everything], 3))
    np.testing.assert_allclose(scores[0], [s for _, s in everything], rtol=1e-5, atol=1e-6)
    # Beam 2 prunes; a plain reading of the algorithm prunes the same way.
    expected = numpy_beam_search(table, 2, 3, length_penalty)
    tokens, scores = _beams_of_2(jnp.asarray(table, jnp.float32), length_penalty)
    np.testing.assert_array_equal(tokens[0], _padded([a for a, _ in expected], 3))
    np.testing.assert_allclose(scores[0], [s for _, s in expected], rtol=1e-5, atol=1e-6)


# -- the loss


def test_answer_loss_matches_numpy():
  rng = np.random.default_rng(4)
  logits = rng.normal(size=(2, 5, 11)).astype(np.float32)
  targets = rng.integers(0, 11, (2, 5))
  target_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  loss, aux = fid.answer_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(target_mask))
  x = logits.astype(np.float64)
  log_softmax = x - x.max(-1, keepdims=True)
  log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_softmax, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(aux["loss_sum"]), (nll * target_mask).sum(), rtol=1e-5)
  assert float(aux["weight_sum"]) == 8
  np.testing.assert_allclose(float(loss), (nll * target_mask).sum() / 8, rtol=1e-5)
  np.testing.assert_array_equal(fid.shift_right(jnp.asarray(targets), 101)[:, 1:], targets[:, :-1])
  assert np.all(np.asarray(fid.shift_right(jnp.asarray(targets), 101))[:, 0] == 101)
  assert float(fid.answer_loss(jnp.asarray(logits), jnp.asarray(targets),
                               jnp.zeros((2, 5)))[0]) == 0.0


# -- warm start, parameters, config


def test_encoder_warm_starts_from_a_bert(params):
  ids, mask, _ = _inputs()
  bert = BertModel(CONFIG.encoder, use_pooler=True)
  bert_params = nn.unbox(bert.init(jax.random.PRNGKey(7), ids, None, mask)["params"])
  assert "pooler" in bert_params
  warm = fid.encoder_from_bert(params, bert_params)
  assert warm["decoder"] is params["decoder"]
  # The same computation, unjitted both: the same numbers.
  expected, _ = bert.apply({"params": bert_params}, ids, None, mask)
  np.testing.assert_array_equal(
      np.asarray(_MODEL.apply({"params": warm}, ids, mask, method=fid.FidModel.encode)),
      np.asarray(expected))
  shallow = dataclasses.replace(CONFIG.encoder, num_layers=1)
  small = nn.unbox(BertModel(shallow).init(jax.random.PRNGKey(7), ids)["params"])
  with pytest.raises(ValueError, match="parameter tree"):
    fid.encoder_from_bert(params, small)
  wide = {**bert_params, "embeddings": {**bert_params["embeddings"], "position_embeddings": {
      "embedding": jnp.zeros((32, D))}}}
  with pytest.raises(ValueError, match="position_embeddings"):
    fid.encoder_from_bert(params, wide)


def test_parameters_carry_logical_axes_and_configs_check_themselves():
  boxed = jax.eval_shape(lambda: fid.init_params(CONFIG, jax.random.PRNGKey(0)))
  specs = nn.get_partition_spec(boxed)
  layer = specs["decoder"]["layer_0"]
  assert tuple(layer["cross_attention"]["query"]["kernel"]) == ("embed", "heads", "kv")
  assert tuple(layer["mlp"]["intermediate"]["kernel"]) == ("embed", "mlp")
  assert tuple(specs["encoder"]["embeddings"]["word_embeddings"]["embedding"]) == (
      "vocab", "embed")
  assert all(spec is not None and len(spec) for spec in jax.tree.leaves(
      specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))

  from_bert = fid.FidConfig.from_bert(CONFIG.bert, max_answer_length=4)
  assert (from_bert.decoder_layers, from_bert.num_heads, from_bert.intermediate_size) == (
      CONFIG.bert.num_layers, CONFIG.bert.num_heads, CONFIG.bert.intermediate_size)
  assert fid.FidConfig.tiny(dtype="bfloat16").encoder.dtype == "bfloat16"
  with pytest.raises(ValueError, match="not divisible"):
    fid.FidConfig.tiny(num_heads=3)
  with pytest.raises(ValueError, match="outside"):
    fid.FidConfig.tiny(eos_id=128)
  with pytest.raises(ValueError, match="max_answer_length"):
    _MODEL.apply({"params": {}}, *_inputs()[:2], np.zeros((1, 9), np.int32))
  with pytest.raises(ValueError, match="max_len"):
    fid.greedy_decode({}, CONFIG, *_inputs()[:2], 9)
