"""Mesh, logical-axis rules, shardings, host-batch assembly; and the sharding acceptance test:
data-parallel and data x model meshes give the loss and gradients of one device."""

import concurrent.futures

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from realm_jax.models import config as config_lib
from realm_jax.models import realm
from realm_jax.training import optim
from realm_jax.training import partitioning
from realm_jax.training import trainer

import train_child

CONFIG = config_lib.RealmConfig(bert=config_lib.tiny_bert(vocab_size=60), proj_size=16)
# The mesh comparisons use one transformer layer instead of tiny's two: every parameter kind
# and every sharding rule is still there, and the eight compiled programs (4 meshes x 2
# models) take half the CPU time.
ONE_LAYER = CONFIG.replace(**{"bert.num_layers": 1})
# Dropout off for REALM pretraining, so that gradient accumulation (microbatches draw their
# own dropout masks) can be compared with one big batch; ICT keeps BERT's dropout 0.1, which
# checks that dropout masks do not depend on the sharding.
NO_DROPOUT = ONE_LAYER.replace(**{"bert.hidden_dropout": 0.0, "bert.attention_dropout": 0.0})


def test_make_mesh_shapes_and_errors():
  mesh = partitioning.make_mesh()
  assert mesh.axis_names == ("data", "model") and dict(mesh.shape) == {"data": 8, "model": 1}
  assert dict(partitioning.make_mesh(data=-1, model=2).shape) == {"data": 4, "model": 2}
  assert dict(partitioning.make_mesh(data=2, model=-1).shape) == {"data": 2, "model": 4}
  one = partitioning.make_mesh(devices=jax.devices()[:1])
  assert dict(one.shape) == {"data": 1, "model": 1}
  with pytest.raises(ValueError, match=r"data x model = 3 x 2 = 6 but there are 8 devices"):
    partitioning.make_mesh(data=3, model=2)
  with pytest.raises(ValueError, match="model=3 does not divide the 8 devices"):
    partitioning.make_mesh(model=3)
  with pytest.raises(ValueError, match="at most one"):
    partitioning.make_mesh(data=-1, model=-1)


def test_param_shardings_follow_the_rules():
  model = realm.RealmPretrainModel(CONFIG)
  mesh = partitioning.make_mesh(data=4, model=2)
  shardings = partitioning.param_shardings(model.logical_axes(), mesh,
                                           partitioning.DEFAULT_RULES)
  bert = shardings["encoder"]["bert"]
  assert bert["layer_0"]["attention"]["query"]["kernel"].spec == P(None, "model", None)
  assert bert["layer_0"]["intermediate"]["kernel"].spec == P(None, "model")
  assert bert["embeddings"]["word_embeddings"]["embedding"].spec == P("model", None)
  assert bert["embeddings"]["layer_norm"]["scale"].spec == P(None)
  # Rules are config: a pure data-parallel table replicates every parameter.
  data_only = (("batch", "data"),)
  shardings = partitioning.param_shardings(model.logical_axes(), mesh, data_only)
  assert all(s.spec == P(*([None] * len(s.spec))) for s in jax.tree.leaves(shardings))


def test_optimizer_state_is_sharded_like_the_params():
  model = realm.IctModel(CONFIG)
  mesh = partitioning.make_mesh(data=4, model=2)
  step = trainer.make_train_step(model, optim.bert_optimizer(1e-4, 100), mesh=mesh)
  adam = step.state_sharding.opt_state[1]
  assert adam.mu == step.state_sharding.params and adam.nu == step.state_sharding.params
  assert adam.count.spec == P() and step.state_sharding.step.spec == P()
  projection = step.abstract_state.params["retriever"]["embedder"]["projection"]
  assert projection["kernel"].shape == (32, 16)


def test_shard_batch_builds_global_arrays_split_over_data():
  mesh = partitioning.make_mesh(data=4, model=2)
  batch = train_child.ict_batch(8, seed=0)
  sharded = partitioning.shard_batch(batch, mesh)
  for name, value in sharded.items():
    assert value.shape == batch[name].shape
    assert value.sharding == NamedSharding(mesh, P("data"))
    np.testing.assert_array_equal(np.asarray(value), batch[name])
    # Each device holds 2 of the 8 examples.
    assert value.addressable_shards[0].data.shape[0] == 2
  with pytest.raises(ValueError, match="same leading"):
    partitioning.shard_batch({"a": np.zeros((8, 2)), "b": np.zeros((4, 2))}, mesh)
  with pytest.raises(ValueError, match="does not split"):
    partitioning.shard_batch({"a": np.zeros((6, 2))}, mesh)


def _pretrain_batch(batch=8, candidates=4, masks=3, query_len=8, block_len=10, seed=0):
  rng = np.random.default_rng(seed)
  ints = lambda *shape: rng.integers(1, 60, shape).astype(np.int32)
  weights = np.ones((batch, masks), np.float32)
  weights[::2, -1] = 0.0  # Different numbers of masked tokens per example.
  reader_len = query_len + block_len
  return {
      "query_ids": ints(batch, query_len),
      "query_type_ids": np.zeros((batch, query_len), np.int32),
      "query_mask": np.ones((batch, query_len), np.int32),
      "candidate_input_ids": ints(batch, candidates, block_len),
      "candidate_type_ids": np.zeros((batch, candidates, block_len), np.int32),
      "candidate_mask": np.ones((batch, candidates, block_len), np.int32),
      "reader_ids": ints(batch, candidates, reader_len),
      "reader_type_ids": np.zeros((batch, candidates, reader_len), np.int32),
      "reader_mask": np.ones((batch, candidates, reader_len), np.int32),
      "mlm_positions": np.tile(np.array([1, 2, 3], np.int32), (batch, 1)),
      "mlm_targets": ints(batch, masks) * (weights > 0),
      "mlm_weights": weights,
      "example_mask": np.ones((batch,), np.float32),
  }


# (data, model, microbatches): 1 device is the reference.
MESHES = [(1, 1, 1), (8, 1, 1), (4, 2, 1), (2, 4, 1)]


def _run_on_meshes(model, batch, meshes):
  """Loss metrics and gradients of one step on each mesh (compiled in parallel threads)."""
  params = jax.jit(model.init)(jax.random.PRNGKey(0))
  rng = jax.random.key_data(jax.random.key(7))
  prepared = []
  for data, model_axis, microbatches in meshes:
    mesh = partitioning.make_mesh(data, model_axis, devices=jax.devices()[:data * model_axis])
    fn = trainer.make_grad_fn(model, mesh=mesh, microbatches=microbatches)
    shardings = partitioning.param_shardings(model.logical_axes(), mesh,
                                             partitioning.DEFAULT_RULES)
    args = (jax.device_put(params, shardings), partitioning.shard_batch(batch, mesh),
            jax.device_put(rng, partitioning.replicated(mesh)))
    prepared.append((fn.lower(*args), args))  # Tracing is not thread-safe; compiling is.
  # Compile the meshes' programs side by side (XLA releases the GIL while it compiles).
  with concurrent.futures.ThreadPoolExecutor(len(prepared)) as pool:
    compiled = list(pool.map(lambda item: item[0].compile(), prepared))
  results = []
  for executable, (_, args) in zip(compiled, prepared):
    metrics, _, grads = executable(*args)
    results.append((jax.device_get(metrics), jax.device_get(grads)))
  return results


def _assert_same_as_one_device(results, meshes):
  """Loss: rtol 1e-6. Gradients: every entry within rtol 1e-5 plus atol 3e-5 * G, where G is
  the largest gradient entry of the whole tree (float32).

  Same arithmetic, different reduction order: the gradient sums over the "data" shards and the
  partial matmul sums over "model" are added in another order than on one device, and the
  compiler fuses differently per partition. Each gradient entry is a sum of many terms, some
  as large as G, so it moves by a few float32 ulps of G (observed: up to 8e-6 * G for REALM
  pretraining, 4e-7 * G for ICT), while entries that are sums of cancelling terms (the key
  bias, whose true gradient is 0) have no meaningful relative error. Hence an absolute
  tolerance scaled by G, and a relative one for the rest. The losses agree to ~1e-7.
  """
  (ref_metrics, ref_grads), *others = results
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(ref_grads))
  for (metrics, grads), mesh in zip(others, meshes[1:]):
    np.testing.assert_allclose(metrics["train/loss"], ref_metrics["train/loss"], rtol=1e-6,
                               err_msg=f"mesh {mesh}")
    for (path, ref), got in zip(jax.tree_util.tree_leaves_with_path(ref_grads),
                                jax.tree.leaves(grads)):
      np.testing.assert_allclose(got, ref, rtol=1e-5, atol=3e-5 * scale,
                                 err_msg=f"mesh {mesh} {jax.tree_util.keystr(path)}")


def test_ict_meshes_agree_with_one_device():
  model = realm.IctModel(ONE_LAYER)
  results = _run_on_meshes(model, train_child.ict_batch(8, seed=3), MESHES)
  _assert_same_as_one_device(results, MESHES)


def test_pretraining_meshes_and_microbatches_agree_with_one_device():
  model = realm.RealmPretrainModel(NO_DROPOUT)
  # The 2 x 4 mesh also accumulates over 2 microbatches of 4 examples: the masked-token mean
  # over the whole batch needs the summed aux weights, not a mean of microbatch means.
  meshes = MESHES[:-1] + [(2, 4, 2)]
  results = _run_on_meshes(model, _pretrain_batch(), meshes)
  _assert_same_as_one_device(results, meshes)
  # Sanity: the gradients are not all zero (the comparison means something).
  assert max(float(np.max(np.abs(g))) for g in jax.tree.leaves(results[0][1])) > 1e-3
