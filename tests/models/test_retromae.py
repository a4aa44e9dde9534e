"""RetroMaeModel (realm_jax.models.retromae): the two-stream decoder layer against a NumPy
re-implementation, what each decoder row can see, the parameter tree (the retriever's, as ICT's),
untied towers held equal, and the loss falling on a tiny batch."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from realm_jax.batches import retromae as rb
from realm_jax.data.vocab import CLS_ID, SEP_ID
from realm_jax.models import realm
from realm_jax.models import retromae
from realm_jax.models.config import RealmConfig, tiny_bert

VOCAB = 200


def _config(**overrides):
  bert = tiny_bert(vocab_size=VOCAB, hidden_size=16, num_heads=2, intermediate_size=32,
                   max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0)
  return RealmConfig(bert=bert, proj_size=8, retriever_pooling="mean", **overrides)


def _batch(seed=0, length=12):
  rng = np.random.default_rng(seed)
  rows = []
  for n in (12, 9, 6, 10):
    body = rng.integers(110, VOCAB, size=n - 4)
    rows.append([CLS_ID, int(rng.integers(110, VOCAB)), SEP_ID, *body, SEP_ID])
  ids = np.zeros((len(rows), length), np.int32)
  for b, row in enumerate(rows):
    ids[b, :len(row)] = row
  blocks = {"block_ids": ids, "block_type_ids": np.zeros_like(ids),
            "block_mask": (ids > 0).astype(np.int32)}
  return rb.build_retromae_batch(blocks, rng=rng, vocab_size=VOCAB)


# -- one decoder layer, in NumPy


def _layer_norm(x, p, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _gelu_tanh(x):
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def numpy_two_stream_layer(p, h1, h2, visible, eps):
  """The paper's Q = H1 W_Q, K = H2 W_K, V = H2 W_V, A = softmax(QK^T / sqrt(d) + M) V, then
  BERT's output projection, residual on H1, LayerNorm and feed-forward block."""
  att = p["attention"]

  def project(x, name):  # [B, rows, embed] -> [B, rows, heads, kv]
    return np.einsum("bre,ehd->brhd", x, att[name]["kernel"]) + att[name]["bias"]

  q, k, v = project(h1, "query"), project(h2, "key"), project(h2, "value")
  scores = np.einsum("bphd,blhd->bhpl", q, k) / math.sqrt(q.shape[-1])
  scores = np.where(visible[:, None], scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  context = np.einsum("bhpl,blhd->bphd", weights, v)
  attended = np.einsum("bphd,hde->bpe", context, att["out"]["kernel"]) + att["out"]["bias"]
  x = _layer_norm(h1 + attended, p["attention_layer_norm"], eps)
  hidden = _gelu_tanh(x @ p["intermediate"]["kernel"] + p["intermediate"]["bias"])
  out = hidden @ p["output"]["kernel"] + p["output"]["bias"]
  return _layer_norm(x + out, p["output_layer_norm"], eps)


def test_two_stream_layer_matches_numpy():
  config = _config().bert
  batch = _batch()
  visible = batch["decoder_attention_mask"]  # [4, 11, 12]
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  h1 = np.asarray(jax.random.normal(keys[0], visible.shape[:2] + (16,)))
  h2 = np.asarray(jax.random.normal(keys[1], visible.shape[:1] + (12, 16)))
  layer = retromae.TwoStreamLayer(config)
  params = nn.unbox(layer.init(keys[2], h1, h2, visible, deterministic=True)["params"])
  got = layer.apply({"params": params}, h1, h2, visible, deterministic=True)
  want = numpy_two_stream_layer(jax.tree.map(np.asarray, params), h1, h2, visible,
                                config.layer_norm_eps)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
  # The layer's parameter names are BERT's (the optimizer's decay mask finds "layer_norm").
  assert set(params) == {"attention", "attention_layer_norm", "intermediate", "output",
                         "output_layer_norm"}


def test_each_decoder_row_reads_only_its_visible_columns():
  """Row i's logits depend on the content stream's token embeddings exactly at its visible
  columns past 0 (never its own position; column 0 is the sentence embedding, so the [CLS]
  embedding is not read at all), and on the sentence embedding."""
  config = _config()
  batch = _batch(seed=1)
  visible = batch["decoder_attention_mask"]
  b, rows, length = 1, visible.shape[1], visible.shape[2]
  decoder = retromae.RetroMaeDecoder(config)
  rng = jax.random.PRNGKey(3)
  sentence = jax.random.normal(rng, (4, config.proj_size))
  tokens = jax.random.normal(jax.random.fold_in(rng, 1), (4, length, 16))
  positions = jax.random.normal(jax.random.fold_in(rng, 2), (4, rows, 16))
  encoder_hidden = jnp.zeros((4, 2, 16))
  table = jax.random.normal(jax.random.fold_in(rng, 3), (VOCAB, 16))

  def decode(h, bias):
    return h @ table.T + bias

  params = decoder.init(rng, sentence, tokens, positions, visible, encoder_hidden, decode)
  probe = jax.random.normal(jax.random.fold_in(rng, 4), (VOCAB,))

  @jax.jit
  def gradients(row):
    def row_output(sentence, tokens):
      logits, _ = decoder.apply(params, sentence, tokens, positions, visible, encoder_hidden,
                                decode)
      return logits[b, row] @ probe

    return jax.grad(row_output, argnums=(0, 1))(sentence, tokens)

  for row in np.flatnonzero(batch["decoder_weights"][b]):
    d_sentence, d_tokens = gradients(row)
    read = np.flatnonzero(np.abs(np.asarray(d_tokens[b])).sum(-1) > 0)
    expected = [j for j in np.flatnonzero(visible[b, row]) if j > 0]
    assert list(read) == expected, row
    assert batch["decoder_positions"][b, row] not in read
    assert np.abs(np.asarray(d_sentence[b])).sum() > 0
    # Other blocks are not read.
    assert np.abs(np.asarray(d_tokens[0])).sum() == 0


# -- the model


def test_parameter_tree_holds_the_retrievers_as_ict():
  config = _config()
  params = jax.eval_shape(retromae.RetroMaeModel(config).init, jax.random.PRNGKey(0))
  assert set(params) == {"retriever", "decoder"}
  ict = jax.eval_shape(realm.IctModel(config).init, jax.random.PRNGKey(0))
  shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)  # noqa: E731
  assert shapes(params["retriever"]) == shapes(ict["retriever"])
  assert set(params["decoder"]) == {"sentence_projection", "sentence_layer_norm", "layer",
                                    "mlm_head"}
  axes = retromae.RetroMaeModel(config).logical_axes()
  assert jax.tree.structure(axes) == jax.tree.structure(params)


def test_untied_towers_start_and_stay_equal_and_both_learn():
  tied, untied = _config(), _config(share_embedders=False)
  batch = _batch()
  model = retromae.RetroMaeModel(untied)
  params = model.init(jax.random.PRNGKey(0))
  towers = params["retriever"]
  assert set(towers) == {"query_embedder", "document_embedder"}
  assert jax.tree.all(jax.tree.map(np.array_equal, towers["query_embedder"],
                                   towers["document_embedder"]))
  # The untied loss is the tied model's with the document tower as the shared one.
  tied_params = {"retriever": {"embedder": towers["document_embedder"]},
                 "decoder": params["decoder"]}
  loss_untied, _ = jax.jit(model.loss_fn)(params, batch, None)
  loss_tied, _ = jax.jit(retromae.RetroMaeModel(tied).loss_fn)(tied_params, batch, None)
  np.testing.assert_allclose(float(loss_untied), float(loss_tied), rtol=1e-6)
  # Both towers get the encoder's gradient, so Adam keeps them bit-identical.
  optimizer = optax.adamw(1e-2)
  state = optimizer.init(params)
  start = params

  @jax.jit
  def step(params, state, rng):
    grads = jax.grad(lambda p: model.loss_fn(p, batch, rng)[0])(params)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for i in range(3):
    params, state = step(params, state, jax.random.PRNGKey(i))
  towers = params["retriever"]
  assert jax.tree.all(jax.tree.map(np.array_equal, towers["query_embedder"],
                                   towers["document_embedder"]))
  assert not np.array_equal(towers["query_embedder"]["projection"]["kernel"],
                            start["retriever"]["query_embedder"]["projection"]["kernel"])


def test_the_retrieval_embedding_is_the_bottleneck():
  """The decoder reads the tower's whole output path: pooler, projection and its LayerNorm
  (the vector the index stores) all get gradients, as do the decoder and the MLM head."""
  model = retromae.RetroMaeModel(_config())
  params = model.init(jax.random.PRNGKey(0))
  # Jitted: op by op, the same gradient takes about 20 s on 2 cores.
  grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, _batch(), None)[0]))(params)
  tower = grads["retriever"]["embedder"]
  for part in (tower["bert"]["pooler"], tower["projection"], tower["projection_layer_norm"],
               tower["bert"]["embeddings"]["position_embeddings"], grads["decoder"]):
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(part)) > 0


def test_loss_falls_on_a_tiny_batch():
  model = retromae.RetroMaeModel(_config())
  params = model.init(jax.random.PRNGKey(0))
  batch = _batch()
  optimizer = optax.adam(1e-2)
  state = optimizer.init(params)

  @jax.jit
  def step(params, state, rng):
    (loss, aux), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, rng)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss, model.summarize(aux)

  history = []
  for i in range(25):
    params, state, loss, metrics = step(params, state, jax.random.PRNGKey(i))
    history.append({k: float(v) for k, v in metrics.items()})
  first, last = history[0], history[-1]
  assert first["loss"] == pytest.approx(first["encoder_mlm_loss"] + first["decoder_loss"])
  assert first["decoder_loss"] > math.log(VOCAB) - 1  # about uniform at the start
  assert last["loss"] < 0.5 * first["loss"]
  assert last["encoder_mlm_loss"] < first["encoder_mlm_loss"]
  assert last["decoder_loss"] < first["decoder_loss"]
  assert last["decoder_accuracy"] > first["decoder_accuracy"]
  # eval_fn: the same sums, deterministic (no dropout in this config).
  aux = model.eval_fn(params, batch)
  _, train_aux = model.loss_fn(params, batch, jax.random.PRNGKey(0))
  for key in aux:
    np.testing.assert_allclose(float(aux[key]), float(train_aux[key]), rtol=1e-5)
  assert float(aux["weight_sum"]) == 4 and float(aux["decoder_token_sum"]) == 33


def test_encoder_loss_weight_scales_the_encoders_share():
  config, batch = _config(), _batch()
  params = retromae.RetroMaeModel(config).init(jax.random.PRNGKey(0))
  _, aux = retromae.RetroMaeModel(config, encoder_loss_weight=0.0).loss_fn(params, batch, None)
  np.testing.assert_allclose(float(aux["loss_sum"]), float(aux["decoder_loss_sum"]), rtol=1e-6)
  _, aux = retromae.RetroMaeModel(config, encoder_loss_weight=2.0).loss_fn(params, batch, None)
  np.testing.assert_allclose(float(aux["loss_sum"]),
                             float(2 * aux["encoder_loss_sum"] + aux["decoder_loss_sum"]),
                             rtol=1e-6)
