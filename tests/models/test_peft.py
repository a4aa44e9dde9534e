"""Parameter-efficient fine-tuning (realm_jax.models.peft): LoRA's merge against NumPy and
against an unmerged (activation-side) LoRA forward, adapters that change nothing until trained,
short runs with the real optimizer that change only the PEFT parameters, and checkpoints that
hold only those (resumed bit for bit, refused when the base changed, exported merged)."""

import functools
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from realm_jax import checkpoints
from realm_jax import export_peft
from realm_jax.batches import qa_batches
from realm_jax.evaluation import modes as evaluation_modes
from realm_jax.models import bert
from realm_jax.models import config as model_config
from realm_jax.models import open_qa_model
from realm_jax.models import peft
from realm_jax.training import optim
from realm_jax.training import partitioning
from realm_jax.training import trainer

from test_open_qa_model import CONFIG, _batch, block_emb, store, vocab  # noqa: F401 (fixtures)

ALL_TARGETS = tuple(peft.LORA_TARGETS)


def _flat(tree):
  return traverse_util.flatten_dict(jax.device_get(tree))


def _bitwise_equal(a, b):
  a, b = np.asarray(a), np.asarray(b)
  return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _with_random_b(params, seed=1):
  """LoRA factors with B nonzero (a fresh B is zero: every update would be zero)."""
  rng = np.random.default_rng(seed)
  flat = _flat(params)
  for path, leaf in flat.items():
    if path[-1] == peft.LORA_B:
      flat[path] = rng.normal(0.0, 0.05, leaf.shape).astype(leaf.dtype)
  return traverse_util.unflatten_dict(flat)


@pytest.fixture(scope="module")
def qa_batch(store, vocab, block_emb):  # noqa: F811
  return qa_batches.model_inputs(_batch(store, vocab, block_emb))


# ----------------------------------------------------------------------------------- merge


def test_merge_equals_numpy_for_every_kernel_shape():
  config = peft.PeftConfig("lora", lora_rank=3, lora_alpha=5.0, lora_targets=ALL_TARGETS)
  model = open_qa_model.OpenQAModel(CONFIG, reader_beam=2, peft=config)
  params = _with_random_b(model.init(jax.random.PRNGKey(0)))
  merged = _flat(peft.merge({k: v for k, v in params.items() if k != peft.PEFT_KEY},
                            params[peft.PEFT_KEY], config))
  base, factors = _flat(params), _flat(params[peft.PEFT_KEY])
  shapes = set()
  for path in factors:
    if path[-1] != peft.LORA_A:
      continue
    module = path[:-1]
    w = base[module + ("kernel",)]
    a, b = factors[path], factors[module + (peft.LORA_B,)]
    split = 2 if module[-1] == "out" else 1
    assert a.shape == (int(np.prod(w.shape[:split])), 3)
    assert b.shape == (3, int(np.prod(w.shape[split:])))
    expected = (w.astype(np.float64) + 5.0 / 3 * (a.astype(np.float64) @ b).reshape(w.shape))
    np.testing.assert_allclose(merged[module + ("kernel",)], expected, rtol=1e-6, atol=1e-7)
    shapes.add((module[-1], w.shape))
  # Every target of both BERTs ([embed, heads, kv], [heads, kv, embed], [embed, mlp],
  # [mlp, embed]) and nothing else changed.
  assert {name for name, _ in shapes} == set(ALL_TARGETS)
  assert len(factors) == 2 * 2 * len(ALL_TARGETS) * CONFIG.bert.num_layers
  changed = {path for path in merged if not _bitwise_equal(merged[path], base[path])}
  assert changed == {path[:-1] + ("kernel",) for path in factors if path[-1] == peft.LORA_A}


def _unmerged_lora(factors, scale):
  """An interceptor adding scale * (x A) B to the output of every module with factors: LoRA as
  the paper writes it, h = W0 x + B A x, never forming W0 + BA."""
  by_path = {}
  for path, leaf in _flat(factors).items():
    # The module's path inside its tower's `apply` (RealmReader's or RealmRetriever's).
    by_path.setdefault(path[1:-1], {})[path[-1]] = leaf

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    found = by_path.get(tuple(context.module.path))
    if context.method_name != "__call__" or found is None:
      return out
    x = args[0]
    split = peft.LORA_TARGETS[context.module.path[-1]]
    flat_x = x.reshape(x.shape[:-split] + (-1,))
    delta = (flat_x @ found[peft.LORA_A]) @ found[peft.LORA_B]
    return out + scale * delta.reshape(out.shape)

  return interceptor


def test_merged_lora_model_predicts_as_the_unmerged_one(qa_batch):
  config = peft.PeftConfig("lora", lora_rank=4, lora_alpha=8.0, lora_targets=ALL_TARGETS)
  lora_model = open_qa_model.OpenQAModel(CONFIG, reader_beam=2, peft=config)
  plain = open_qa_model.OpenQAModel(CONFIG, reader_beam=2)
  params = _with_random_b(lora_model.init(jax.random.PRNGKey(0)))
  base = {k: v for k, v in params.items() if k != peft.PEFT_KEY}
  forward = lambda model, p: model.forward(p, qa_batch)[:2]  # noqa: E731 (scores, logits)

  with nn.intercept_methods(_unmerged_lora(params[peft.PEFT_KEY], config.lora_scale)):
    unmerged = jax.jit(functools.partial(forward, plain))(base)
  merged = jax.jit(functools.partial(forward, plain))(peft.merged_params(params, config))
  inside = jax.jit(functools.partial(forward, lora_model))(params)
  without = jax.jit(functools.partial(forward, plain))(base)
  for got, want, name in zip(merged, unmerged, ("retrieval scores", "span logits")):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
  for got, want in zip(inside, merged):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # The update is not a no-op: without it the predictions differ.
  assert not np.allclose(without[1], unmerged[1], rtol=1e-5, atol=1e-5)
  assert not np.allclose(without[0], unmerged[0], rtol=1e-5, atol=1e-5)


def test_lora_settings_are_checked():
  for bad in (dict(lora_rank=0), dict(lora_alpha=0.0), dict(lora_targets=("qkv",)),
              dict(lora_targets=())):
    with pytest.raises(ValueError):
      peft.PeftConfig("lora", **bad)
  with pytest.raises(ValueError, match="is not one of"):
    peft.PeftConfig("prefix")
  config = peft.PeftConfig("lora", lora_rank=2, lora_alpha=3.0, lora_targets=("out",))
  assert peft.PeftConfig.from_dict(config.to_dict()) == config


# -------------------------------------------------------------------------------- adapters


def test_no_adapters_by_default_and_a_fresh_adapter_is_the_identity():
  ids = jnp.array([[101, 7592, 2088, 102, 0], [101, 2023, 102, 0, 0]])
  mask = ids > 0
  plain = bert.BertModel(model_config.tiny_bert(), use_pooler=True)
  assert model_config.tiny_bert().adapter_size == 0
  adapted = bert.BertModel(model_config.tiny_bert(adapter_size=8), use_pooler=True)
  p0 = nn.unbox(plain.init(jax.random.PRNGKey(3), ids, None, mask)["params"])
  p1 = nn.unbox(adapted.init(jax.random.PRNGKey(3), ids, None, mask)["params"])
  # Without adapters: BERT's layer exactly as documented (docs/architecture.md).
  assert set(p0["layer_0"]) == {"attention", "attention_layer_norm", "intermediate", "output",
                                "output_layer_norm"}
  flat0, flat1 = _flat(p0), _flat(p1)
  added = set(flat1) - set(flat0)
  assert {path[1] for path in added} == {"attention_adapter", "output_adapter"}
  assert {path[2:] for path in added} == {("down", "kernel"), ("down", "bias"), ("up", "kernel"),
                                          ("up", "bias")}
  assert flat1[("layer_0", "attention_adapter", "down", "kernel")].shape == (32, 8)
  assert all(_bitwise_equal(flat0[path], flat1[path]) for path in flat0)
  # Up-projections start at zero: the outputs are bit for bit those without adapters.
  out0 = plain.apply({"params": p0}, ids, None, mask)
  out1 = adapted.apply({"params": p1}, ids, None, mask)
  for a, b in zip(out0, out1):
    assert _bitwise_equal(a, b)
  # A trained adapter changes them.
  flat1[("layer_1", "output_adapter", "up", "kernel")] = np.random.default_rng(0).normal(
      0.0, 0.1, (8, 32)).astype(np.float32)
  out2 = adapted.apply({"params": traverse_util.unflatten_dict(flat1)}, ids, None, mask)
  assert not np.allclose(out0[0], out2[0])


# --------------------------------------------------------------- training and checkpoints


class _Writer:
  def write_scalars(self, step, scalars):
    pass

  def flush(self):
    pass

  def close(self):
    pass


def _peft_setup(method):
  config = CONFIG.replace(**{"bert.adapter_size": 4}) if method == "adapters" else CONFIG
  peft_config = peft.PeftConfig(method, lora_rank=2, lora_alpha=4.0,
                                lora_targets=("query", "value", "output"))
  model = open_qa_model.OpenQAModel(config, reader_beam=2, peft=peft_config)
  options = {"trainable": peft_config.trainable_mask}
  if method == "lora":
    options["retriever_keys"] = ("retriever", "peft/retriever")
  # The real optimizer (toy fine-tuning's retriever protection included), no warmup.
  optimizer = optim.bert_optimizer(1e-2, 10, warmup_steps=0, retriever_lr_scale=0.5, **options)
  mesh = partitioning.make_mesh(devices=jax.devices()[:1])
  step = trainer.make_train_step(model, optimizer, mesh=mesh)
  return dict(model=model, config=config, optimizer=optimizer, mesh=mesh, step=step,
              peft_config=peft_config)


@pytest.fixture(scope="module", params=["lora", "adapters"])
def peft_run(request, qa_batch, tmp_path_factory):
  """A 4-step PEFT run checkpointed every 2 steps, and its initial parameters."""
  setup = _peft_setup(request.param)
  run_dir = str(tmp_path_factory.mktemp(f"peft_{request.param}") / "run")
  initial = jax.device_get(setup["step"].init_state(0).params)
  state = _train(setup, qa_batch, run_dir, num_steps=4)
  return dict(setup, method=request.param, run_dir=run_dir, initial=initial,
              final=jax.device_get(state.params), state=state)


def _checkpointing(setup, run_dir):
  base_config = setup["config"].replace(**{"bert.adapter_size": 0})
  return checkpoints.PeftCheckpoints(run_dir=run_dir,
                                     trainable=setup["peft_config"].trainable_mask,
                                     settings=setup["peft_config"].to_dict(),
                                     base_config=base_config)


def _train(setup, batch, run_dir, num_steps):
  batches = trainer.ListBatches([batch] * 4)
  return trainer.train(setup["model"], setup["optimizer"], batches, run_dir=run_dir,
                       num_steps=num_steps, mesh=setup["mesh"], config=setup["config"],
                       checkpoint_every=2, keep=None, writer=_Writer(), best_metric=None,
                       train_step=setup["step"], async_checkpoints=False, seed=0,
                       peft=_checkpointing(setup, run_dir))


def test_only_the_peft_parameters_change(peft_run):
  before, after = _flat(peft_run["initial"]), _flat(peft_run["final"])
  trained = _flat(peft_run["peft_config"].trainable_mask(peft_run["initial"]))
  assert before.keys() == after.keys() and any(trained.values())
  for path, on in trained.items():
    if on:
      assert not np.array_equal(before[path], after[path]), path
    else:
      assert _bitwise_equal(before[path], after[path]), path
  kinds = {path[:2] if path[:2] == peft.TASK_HEAD else
           path[0] if peft_run["method"] == "lora" else path[-3]
           for path, on in trained.items() if on}
  # The span head, new at fine-tuning, trains with either method (all of it, nothing else of
  # the reader outside the method's own parameters).
  assert kinds == ({"peft", ("reader", "span_head")} if peft_run["method"] == "lora"
                   else {"attention_adapter", "output_adapter", ("reader", "span_head")})
  assert all(on for path, on in trained.items() if path[:2] == ("reader", "span_head"))
  # The document side of an untied retriever would stay frozen; here the towers are tied and
  # the question tower's PEFT parameters train too.
  assert any(on and "retriever" in path for path, on in trained.items())


def test_the_checkpoint_holds_only_the_trained_parameters_and_restores_the_model(peft_run):
  step_dir = checkpoints.checkpoint_path(peft_run["run_dir"], 4)
  trained = _flat(peft_run["peft_config"].trainable_mask(peft_run["final"]))
  saved = traverse_util.flatten_dict(checkpoints._saved_tree(step_dir, "params"))
  assert set(saved) == {path for path, on in trained.items() if on}
  # The optimizer state: Adam's moments of those leaves only (+ counts).
  opt_state, _, _ = checkpoints.restore_checkpoint_dir(step_dir, item=trainer.OPT_STATE_ITEM)
  opt_leaves = jax.tree.leaves(opt_state)
  assert sum(leaf.size for leaf in opt_leaves) <= 2 * sum(leaf.size for leaf in saved.values()) + 8
  metadata = checkpoints.read_metadata(step_dir)
  record = metadata["peft"]
  base_dir = checkpoints.checkpoint_path(os.path.join(peft_run["run_dir"], "peft_base"), 0)
  assert record["method"] == peft_run["method"] and record["base_checkpoint"] == base_dir
  assert record["base_params_sha256"] == checkpoints.params_sha256(base_dir)
  assert metadata["param_items"] == sorted(peft_run["final"])
  # The base is an ordinary checkpoint of the frozen parameters (no adapters in its config).
  assert checkpoints.read_metadata(base_dir).get("peft") is None

  # Into host arrays: the effective model (LoRA merged; adapters as trained).
  restored, config, _ = checkpoints.restore_params(peft_run["run_dir"], 4)
  assert config == peft_run["config"]
  want = _flat(peft.merged_params(peft_run["final"], peft_run["peft_config"]))
  got = _flat(restored)
  assert got.keys() == want.keys()
  for path in want:
    np.testing.assert_allclose(got[path], want[path], rtol=1e-6, atol=1e-7, err_msg=str(path))

  # The merged export: an ordinary checkpoint of the same model.
  out = os.path.join(os.path.dirname(peft_run["run_dir"]), "merged")
  exported = checkpoints.export_merged(step_dir, out)
  params, config, metadata = checkpoints.restore_checkpoint_dir(exported)
  assert "peft" not in metadata and config == peft_run["config"] and "peft" not in params
  assert all(_bitwise_equal(params_leaf, got[path])
             for path, params_leaf in _flat(params).items())
  shutil.rmtree(out)
  # `evaluate` reads a PEFT run with the model config its checkpoint has (adapters included).
  model, params = evaluation_modes.open_qa_model(peft_run["run_dir"], CONFIG, 4, 2)
  assert model.config == peft_run["config"] and "peft" not in params


def test_resuming_a_peft_run_is_bit_exact(peft_run, qa_batch):
  resumed = os.path.join(os.path.dirname(peft_run["run_dir"]), "resumed")
  _train(peft_run, qa_batch, resumed, num_steps=2)
  state = _train(peft_run, qa_batch, resumed, num_steps=4)
  for got, want in ((state.params, peft_run["state"].params),
                    (state.opt_state, peft_run["state"].opt_state)):
    got, want = jax.device_get(got), jax.device_get(want)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert all(_bitwise_equal(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def test_a_changed_base_is_refused(peft_run, tmp_path, capsys):
  # A copy of the run uses its own base (found relative to its checkpoints).
  run_dir = str(tmp_path / "run")
  shutil.copytree(peft_run["run_dir"], run_dir)
  step_dir = checkpoints.checkpoint_path(run_dir, 4)
  checkpoints.restore_params(run_dir, 4)
  base_run = os.path.join(run_dir, "peft_base")
  base, base_config, _ = checkpoints.restore_params(base_run, 0)
  # Re-saved with one leaf changed: its checksums are recorded afresh, its hash differs.
  flat = traverse_util.flatten_dict(base)
  path = next(iter(sorted(flat)))
  flat[path] = flat[path] + 1.0
  shutil.rmtree(base_run)
  checkpoints.save_checkpoint(base_run, 0, traverse_util.unflatten_dict(flat),
                              config=base_config)
  with pytest.raises(checkpoints.CheckpointError) as error:
    checkpoints.restore_params(run_dir, 4)
  message = str(error.value)
  assert "\n" not in message and "has changed" in message
  assert step_dir in message and checkpoints.checkpoint_path(base_run, 0) in message
  # So does the merged export, in one line and exit status 1.
  capsys.readouterr()
  assert export_peft.main([step_dir, str(tmp_path / "merged")]) == 1
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(err) == 1 and err[0].startswith("export_peft: error: ") and "has changed" in err[0]
  assert not (tmp_path / "merged").exists()
  # A run resuming from it stops with that error (it never sets the checkpoint aside).
  with pytest.raises(checkpoints.CheckpointError, match="has changed"):
    _train(peft_run, None, run_dir, num_steps=6)
  assert checkpoints.latest_checkpoint_step(run_dir) == 4
