"""ICT and REALM pretraining models: losses wired as the spec says, gradients reach the
retriever, sums survive sharding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from realm_jax.models import config as model_config
from realm_jax.models import realm
from realm_jax.models.reader import RealmKnowledgeAugEncoder
from realm_jax.models.retriever import RealmRetriever

CONFIG = model_config.RealmConfig(bert=model_config.tiny_bert(vocab_size=60), proj_size=16)


@functools.lru_cache(maxsize=None)
def _init(model):
  """`model.init(PRNGKey(0))`, compiled, once per model (jax arrays: nothing can change them)."""
  return jax.jit(model.init)(jax.random.PRNGKey(0))


def _ict_batch(batch=8, query_len=6, block_len=10, seed=0):
  rng = np.random.default_rng(seed)
  return {"query_ids": rng.integers(1, 60, (batch, query_len)).astype(np.int32),
          "query_mask": np.ones((batch, query_len), np.int32),
          "block_ids": rng.integers(1, 60, (batch, block_len)).astype(np.int32),
          "block_type_ids": np.repeat([[0] * 3 + [1] * (block_len - 3)], batch, 0).astype(
              np.int32),
          "block_mask": np.ones((batch, block_len), np.int32)}


def _log_softmax(x, axis=-1):
  x = np.asarray(x, np.float64)
  x = x - x.max(axis=axis, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=axis, keepdims=True))


def test_ict_loss_is_softmax_over_all_blocks_of_the_batch():
  model = realm.IctModel(CONFIG)
  params = _init(model)
  batch = _ict_batch()
  aux = jax.jit(model.eval_fn)(params, batch)
  retriever = RealmRetriever(CONFIG)
  variables = {"params": params["retriever"]}
  embed = jax.jit(lambda v, ids, types, mask, method: retriever.apply(
      v, ids, types, mask, method=method), static_argnums=4)
  q = np.asarray(embed(variables, batch["query_ids"], None, batch["query_mask"],
                       RealmRetriever.embed_queries), np.float64)
  d = np.asarray(embed(variables, batch["block_ids"], batch["block_type_ids"],
                       batch["block_mask"], RealmRetriever.embed_documents), np.float64)
  log_probs = _log_softmax(q @ d.T)
  np.testing.assert_allclose(aux["loss_sum"], -np.trace(log_probs), rtol=1e-5)
  assert float(aux["weight_sum"]) == 8
  assert float(aux["accuracy_sum"]) == np.sum(log_probs.argmax(1) == np.arange(8))
  loss, _ = jax.jit(model.loss_fn)(params, batch, jax.random.PRNGKey(1))
  assert np.isfinite(float(loss))


def test_ict_in_batch_negatives_span_the_global_batch_when_sharded():
  model = realm.IctModel(CONFIG)
  params = _init(model)
  batch = _ict_batch(batch=16)
  single = jax.jit(model.eval_fn)(params, batch)
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  sharded_batch = jax.device_put(batch, NamedSharding(mesh, P("data")))
  sharded = jax.jit(model.eval_fn)(params, sharded_batch)
  for key in single:
    np.testing.assert_allclose(sharded[key], single[key], rtol=1e-5)


def _pretrain_batch(batch=3, candidates=4, masks=3, query_len=8, block_len=10, seed=0):
  rng = np.random.default_rng(seed)
  reader_len = query_len + block_len
  ints = lambda *shape: rng.integers(1, 60, shape).astype(np.int32)
  weights = np.ones((batch, masks), np.float32)
  weights[:, -1] = 0.0
  return {
      "query_ids": ints(batch, query_len), "query_type_ids": np.zeros((batch, query_len),
                                                                      np.int32),
      "query_mask": np.ones((batch, query_len), np.int32),
      "candidate_input_ids": ints(batch, candidates, block_len),
      "candidate_type_ids": np.zeros((batch, candidates, block_len), np.int32),
      "candidate_mask": np.ones((batch, candidates, block_len), np.int32),
      "reader_ids": ints(batch, candidates, reader_len),
      "reader_type_ids": np.zeros((batch, candidates, reader_len), np.int32),
      "reader_mask": np.ones((batch, candidates, reader_len), np.int32),
      "mlm_positions": np.tile(np.array([1, 2, 0], np.int32), (batch, 1)),
      "mlm_targets": ints(batch, masks) * (weights > 0),
      "mlm_weights": weights,
      "example_mask": np.ones((batch,), np.float32),
  }


@jax.jit
def _module_outputs(params, batch):
  scores, _, _ = RealmRetriever(CONFIG).apply(
      {"params": params["retriever"]}, batch["query_ids"], batch["query_type_ids"],
      batch["query_mask"], batch["candidate_input_ids"], batch["candidate_type_ids"],
      batch["candidate_mask"])
  logits = RealmKnowledgeAugEncoder(CONFIG).apply(
      {"params": params["encoder"]}, batch["reader_ids"], batch["reader_type_ids"],
      batch["reader_mask"], batch["mlm_positions"])
  return scores, logits


def _reference_pretrain_sums(params, batch):
  """NumPy float64 loss, utility and null probability from the modules' raw outputs."""
  scores, logits = _module_outputs(params, batch)
  log_prior = _log_softmax(scores)                                         # [B, K]
  token = np.take_along_axis(_log_softmax(logits), batch["mlm_targets"][:, None, :, None],
                             axis=-1)[..., 0]                              # [B, K, M]
  weights = batch["mlm_weights"] * batch["example_mask"][:, None]
  joint = log_prior[:, :, None] + token
  marg = np.log(np.exp(joint).sum(axis=1))                                 # [B, M]
  # Predicted tokens: the argmax of the marginal over the vocabulary, and of the null alone.
  vocab_marg = np.log(np.exp(log_prior[:, :, None, None] + _log_softmax(logits)).sum(axis=1))
  targets = batch["mlm_targets"]
  return {"loss_sum": -(marg * weights).sum(), "weight_sum": weights.sum(),
          "utility_sum": ((marg - token[:, 0]) * weights).sum(),
          "null_prob_sum": (np.exp(log_prior[:, 0]) * batch["example_mask"]).sum(),
          "mlm_correct_sum": ((vocab_marg.argmax(-1) == targets) * weights).sum(),
          "null_mlm_correct_sum": ((logits[:, 0].argmax(-1) == targets) * weights).sum()}


def test_pretraining_sums_match_a_numpy_reference():
  model = realm.RealmPretrainModel(CONFIG)
  params = _init(model)
  batch = _pretrain_batch()
  aux = jax.jit(model.eval_fn)(params, batch)
  expected = _reference_pretrain_sums(params, batch)
  for key, value in expected.items():
    np.testing.assert_allclose(aux[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
  means = realm.summarize(aux)
  assert set(means) == {"loss", "retrieval/utility", "retrieval/null_prob", "mlm/accuracy",
                        "mlm/null_accuracy"}
  np.testing.assert_allclose(means["loss"], expected["loss_sum"] / expected["weight_sum"],
                             rtol=1e-4)


def test_skipped_examples_do_not_count():
  model = realm.RealmPretrainModel(CONFIG)
  params = _init(model)
  batch = _pretrain_batch()
  batch["example_mask"][1] = 0.0
  aux = jax.jit(model.eval_fn)(params, batch)
  changed = dict(batch, reader_ids=batch["reader_ids"].copy(),
                 mlm_targets=batch["mlm_targets"].copy())
  changed["reader_ids"][1] = 7
  changed["mlm_targets"][1] = 9
  aux_changed = jax.jit(model.eval_fn)(params, changed)
  for key in aux:
    np.testing.assert_allclose(aux_changed[key], aux[key], rtol=1e-6, err_msg=key)
  assert float(aux["weight_sum"]) == 2 * 2  # two kept examples, two real masks each


def test_gradients_reach_both_towers_and_the_reader():
  model = realm.RealmPretrainModel(CONFIG)
  params = _init(model)
  grads = jax.jit(jax.grad(lambda p, batch: model.loss_fn(p, batch, jax.random.PRNGKey(3))[0]))(
      params, _pretrain_batch())
  norm = lambda tree: float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree_util.tree_leaves(
      tree))))
  # The query and document towers are the same (tied) parameters; gradients flow into them
  # only through log_softmax of the candidate scores.
  assert norm(grads["retriever"]["embedder"]["projection"]) > 0
  assert norm(grads["encoder"]["mlm_head"]) > 0
  assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize("model_cls", [realm.IctModel, realm.RealmPretrainModel,
                                       realm.BertMlmModel])
def test_logical_axes_cover_every_parameter(model_cls):
  model = model_cls(CONFIG)
  params = _init(model)
  axes = model.logical_axes()
  assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(
      axes, is_leaf=lambda x: isinstance(x, P))


def test_per_example_marginalization_is_an_option():
  params = _init(realm.RealmPretrainModel(CONFIG))
  batch = _pretrain_batch()
  per_token = jax.jit(realm.RealmPretrainModel(CONFIG).eval_fn)(params, batch)
  per_example = jax.jit(realm.RealmPretrainModel(CONFIG, marginalization="per_example").eval_fn)(
      params, batch)
  assert float(per_example["weight_sum"]) == 3  # examples, not tokens
  assert abs(float(per_example["loss_sum"]) / 3 - float(per_token["loss_sum"]) / 6) > 1e-4


def test_without_a_null_document_only_loss_and_accuracy():
  """The no-null-document ablation: the same loss; no utility, null probability or null-only
  accuracy (they compare against a null slot that is not there)."""
  params = _init(realm.RealmPretrainModel(CONFIG))
  batch = _pretrain_batch()
  with_null = jax.jit(realm.RealmPretrainModel(CONFIG).eval_fn)(params, batch)
  without = jax.jit(realm.RealmPretrainModel(CONFIG, null_index=None).eval_fn)(params, batch)
  assert set(without) == {"loss_sum", "weight_sum", "mlm_correct_sum"}
  for key in without:
    np.testing.assert_allclose(without[key], with_null[key], rtol=1e-6, err_msg=key)
  assert set(realm.summarize(without)) == {"loss", "mlm/accuracy"}


def _mlm_batch(batch=3, length=12, masks=4, seed=0):
  rng = np.random.default_rng(seed)
  weights = np.zeros((batch, masks), np.float32)
  weights[:, :2] = 1.0
  weights[0, 2] = 1.0
  return {"input_ids": rng.integers(1, 60, (batch, length)).astype(np.int32),
          "type_ids": np.repeat([[0] * 4 + [1] * (length - 4)], batch, 0).astype(np.int32),
          "input_mask": np.ones((batch, length), np.int32),
          "mlm_positions": np.sort(rng.choice(np.arange(1, length), (batch, masks)), -1).astype(
              np.int32),
          # Padding slots hold an out-of-vocabulary target: it must count for nothing.
          "mlm_targets": np.where(weights > 0, rng.integers(1, 60, (batch, masks)), 999).astype(
              np.int32),
          "mlm_weights": weights}


def test_block_mlm_sums_match_a_numpy_reference():
  model = realm.BertMlmModel(CONFIG)
  params = _init(model)
  batch = _mlm_batch()
  aux = jax.jit(model.eval_fn)(params, batch)
  # The encoder's logits at the mask positions of each sequence, read as one candidate.
  logits = np.asarray(RealmKnowledgeAugEncoder(CONFIG).apply(
      {"params": params["encoder"]}, batch["input_ids"][:, None], batch["type_ids"][:, None],
      batch["input_mask"][:, None], batch["mlm_positions"]))[:, 0]        # [B, M, V]
  log_probs = _log_softmax(logits)
  weights = batch["mlm_weights"]
  targets = np.minimum(batch["mlm_targets"], 59)  # padding slots: any id, weight 0
  token = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [B, M]
  np.testing.assert_allclose(aux["loss_sum"], -(token * weights).sum(), rtol=1e-5)
  assert float(aux["weight_sum"]) == 7.0
  np.testing.assert_allclose(
      aux["accuracy_sum"], ((logits.argmax(-1) == batch["mlm_targets"]) * weights).sum())
  loss, _ = model.loss_fn(params, batch, jax.random.PRNGKey(1))  # dropout 0.1 in CONFIG
  assert np.isfinite(float(loss))
  assert set(realm.summarize(aux)) == {"loss", "accuracy"}


def test_block_mlm_encoder_is_the_pretraining_encoder():
  """An mlm checkpoint's encoder drops into REALM pretraining unchanged."""
  mlm = _init(realm.BertMlmModel(CONFIG))
  pretrain = _init(realm.RealmPretrainModel(CONFIG))
  shapes = lambda tree: jax.tree_util.tree_map(np.shape, tree)
  assert shapes(mlm["encoder"]) == shapes(pretrain["encoder"])
