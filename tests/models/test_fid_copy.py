"""The FiD reader's copy head (`FidConfig.copy_head`): the mixture against a NumPy
pointer-generator, hidden and padded memory tokens get no copied mass, the gradient stays finite
for words absent from the memory, and the decoding paths (greedy, beam) read the same
distribution as the teacher-forced pass."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import fid

CONFIG = fid.FidConfig.tiny(initializer_range=0.2, copy_head=True)
D, V = CONFIG.hidden_size, CONFIG.vocab_size
ROWS, GROUP, T, S = 4, 2, 3, 7  # decoder rows N, rows per memory row G (B = N / G), steps, memory


def _copy_inputs(seed=0):
  """hidden [N, T, D], generated log-probabilities [N, T, V], memory [B, S, D], memory ids
  [B, S] (token 5 twice in row 0, token 9 in both rows), visibility [B, 1, S]."""
  rng = np.random.default_rng(seed)
  hidden = rng.normal(size=(ROWS, T, D)).astype(np.float32)
  logits = rng.normal(size=(ROWS, T, V)).astype(np.float32)
  generated = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  memory = rng.normal(size=(ROWS // GROUP, S, D)).astype(np.float32)
  ids = np.array([[5, 7, 5, 9, 11, 0, 0], [9, 3, 4, 6, 8, 10, 0]], np.int32)
  visible = (ids != 0)[:, None, :]
  return hidden, generated, memory, ids, visible


def numpy_copy_head(p, hidden, generated, memory, ids, visible):
  """p(w) = g exp(generated_w) + (1 - g) sum_{s: ids_s = w} softmax_s(q . k_s / sqrt(D)), row n
  reading memory row n // G; float64."""
  hidden, memory = hidden.astype(np.float64), memory.astype(np.float64)
  out = np.zeros(generated.shape)
  for n in range(hidden.shape[0]):
    b = n // GROUP
    q = hidden[n] @ p["query"]["kernel"] + p["query"]["bias"]  # [T, D]
    k = memory[b] @ p["key"]["kernel"] + p["key"]["bias"]  # [S, D]
    scores = np.where(visible[b, 0][None], q @ k.T / np.sqrt(D), -np.inf)  # [T, S]
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    copied = np.zeros((hidden.shape[1], generated.shape[-1]))
    for s, token in enumerate(ids[b]):
      copied[:, token] += weights[:, s]
    gate = 1 / (1 + np.exp(-(hidden[n] @ p["gate"]["kernel"] + p["gate"]["bias"])))  # [T, 1]
    out[n] = np.log(gate * np.exp(generated[n].astype(np.float64)) + (1 - gate) * copied)
  return out


def _keys_then_mixture(head, hidden, generated, memory, ids, visible):
  return head(hidden, generated, head.keys(memory), ids, visible)


@pytest.fixture(scope="module")
def head_params():
  return nn.unbox(fid.CopyHead(CONFIG).init(jax.random.PRNGKey(3), *_copy_inputs(),
                                            method=_keys_then_mixture)["params"])


def _apply_head(p, hidden, generated, memory, ids, visible):
  return fid.CopyHead(CONFIG).apply({"params": p}, hidden, generated, memory, ids, visible,
                                    method=_keys_then_mixture)


def test_copy_head_is_the_numpy_pointer_generator(head_params):
  inputs = _copy_inputs()
  got = np.asarray(jax.jit(_apply_head)(head_params, *inputs), np.float64)
  expected = numpy_copy_head(jax.tree.map(np.asarray, head_params), *inputs)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  # A distribution, and the memory's words are more likely than the generator alone makes them.
  np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)
  generated, ids = inputs[1], inputs[3]
  gain = got - generated  # [N, T, V]
  assert np.all(gain[0, :, [5, 7, 9, 11]] > 0.01)
  # Padding (id 0) is never copied: token 0's probability is the gated generator's alone.
  gate = np.exp(got - generated)[..., 1]  # token 1 is in no memory row: the gate g itself
  np.testing.assert_allclose(np.exp(got[..., 0]), gate * np.exp(generated[..., 0]), rtol=1e-5)
  assert ids[0, 5] == 0


def test_a_hidden_memory_token_is_not_copied(head_params):
  hidden, generated, memory, ids, visible = _copy_inputs()
  hidden_11 = visible.copy()
  hidden_11[0, 0, 4] = False  # token 11, only in memory row 0, position 4
  with_it = np.asarray(_apply_head(head_params, hidden, generated, memory, ids, visible))
  without = np.asarray(_apply_head(head_params, hidden, generated, memory, ids, hidden_11))
  gate = np.exp(without - generated)[..., 1]  # token 1 appears nowhere: g
  np.testing.assert_allclose(np.exp(without[:GROUP, :, 11]),
                             gate[:GROUP] * np.exp(generated[:GROUP, :, 11]), rtol=1e-5)
  assert np.all(with_it[:GROUP, :, 11] - without[:GROUP, :, 11] > 0.01)
  # Memory row 1's decodes do not read row 0's visibility.
  np.testing.assert_allclose(with_it[GROUP:], without[GROUP:], rtol=1e-6, atol=1e-6)


def test_gradient_is_finite_for_answers_absent_from_the_memory(head_params):
  hidden, generated, memory, ids, visible = _copy_inputs()
  targets = np.array([1, 2, 5])  # 1 and 2 are in no memory row, 5 is in row 0's

  def loss(p, hidden):
    log_probs = _apply_head(p, hidden, generated, memory, ids, visible)
    return -jnp.sum(log_probs[:, jnp.arange(T), targets])

  grads = jax.grad(loss, argnums=(0, 1))(head_params, hidden)
  leaves = jax.tree.leaves(grads)
  assert all(np.all(np.isfinite(np.asarray(g))) for g in leaves)
  assert all(np.abs(np.asarray(g)).max() > 0 for g in leaves)


# -- the whole reader with the copy head

BATCH, PASSAGES, LENGTH, ANSWER = 2, 3, 6, 5


def _reader_inputs(seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, 40, (BATCH, PASSAGES, LENGTH)).astype(np.int32)
  mask = np.ones(ids.shape, np.int32)
  mask[:, 1, LENGTH - 2:] = 0
  ids[mask == 0] = 0
  return ids, mask


@pytest.fixture(scope="module")
def params():
  return jax.jit(lambda key: nn.unbox(fid.init_params(CONFIG, key)))(jax.random.PRNGKey(1))


def _forward(p, ids, mask, decoder_ids, config=CONFIG):
  return fid.FidModel(config).apply({"params": p}, ids, mask, decoder_ids)


def test_reader_has_the_copy_parameters_only_when_asked(params):
  assert set(params["copy"]) == {"query", "key", "gate"}
  plain = fid.init_params(dataclasses.replace(CONFIG, copy_head=False), jax.random.PRNGKey(1))
  assert "copy" not in plain
  with pytest.raises(ValueError, match="copy_head"):
    fid.FidConfig.tiny(copy_head=1)


def test_reader_copies_words_of_its_passages(params):
  """With the gate forced to copy only, all the mass is on the passages' real tokens."""
  ids, mask = _reader_inputs()
  forced = jax.tree.map(lambda x: x, params)
  forced["copy"]["gate"]["bias"] = jnp.full_like(params["copy"]["gate"]["bias"], -60.0)
  log_probs = np.asarray(_forward(forced, ids, mask, np.full((BATCH, ANSWER), 101, np.int32)))
  probs = np.exp(log_probs)
  for b in range(BATCH):
    words = np.unique(ids[b][mask[b] > 0])  # ids 3 .. 39: the padding's 0 is none of them
    np.testing.assert_allclose(probs[b][:, words].sum(-1), 1.0, atol=1e-5)
    assert probs[b][:, 0].max() < 1e-6


def test_greedy_and_beam_read_the_teacher_forced_distribution(params):
  ids, mask = _reader_inputs()
  free = np.asarray(fid.greedy_decode(params, CONFIG, ids, mask, ANSWER))
  log_probs = np.asarray(_forward(params, ids, mask, fid.shift_right(jnp.asarray(free),
                                                                     CONFIG.bos_id)))
  # Greedy follows the teacher-forced argmax path up to its EOS (or max_len).
  lengths = np.asarray(fid.answer_lengths(jnp.asarray(free), CONFIG.eos_id))
  for b in range(BATCH):
    np.testing.assert_array_equal(log_probs[b, :lengths[b]].argmax(-1), free[b, :lengths[b]])
  tokens, scores = fid.beam_search(params, CONFIG, ids, mask, 3, ANSWER, length_penalty=0.0)
  tokens, scores = np.asarray(tokens), np.asarray(scores)
  for i in range(3):
    forced = np.asarray(_forward(params, ids, mask, fid.shift_right(jnp.asarray(tokens[:, i]),
                                                                    CONFIG.bos_id)))
    expected = np.asarray(fid.sequence_log_probs(jnp.asarray(forced), jnp.asarray(tokens[:, i]),
                                                 CONFIG.eos_id))
    np.testing.assert_allclose(scores[:, i], expected, rtol=1e-4, atol=1e-4)
  # The best beam is at least as likely as the greedy answer.
  greedy = np.asarray(fid.sequence_log_probs(jnp.asarray(log_probs), jnp.asarray(free),
                                             CONFIG.eos_id))
  assert np.all(scores[:, 0] >= greedy - 1e-4)
