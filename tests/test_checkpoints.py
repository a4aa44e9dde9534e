"""Orbax checkpoints of a run: round trip, listing, unfinished steps, model size, done marker."""

import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from realm_jax.models import config as config_lib
from realm_jax.models.retriever import RealmRetriever
from realm_jax import checkpoints as ckpt

TINY = config_lib.RealmConfig(bert=config_lib.tiny_bert())


def _random_params(config, seed=0, unbox=True):
  """RealmRetriever params of the right shapes without running init (seconds on this CPU)."""
  q = np.ones((1, 8), np.int32)
  c = np.ones((1, 2, 8), np.int32)
  shapes = jax.eval_shape(lambda: RealmRetriever(config).init(jax.random.PRNGKey(0), q, q, q,
                                                               c, c, c))["params"]
  if unbox:
    shapes = nn.unbox(shapes)
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype), shapes)


@pytest.fixture(scope="module")
def retriever_params():
  return _random_params(TINY)


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_params_config_and_metadata(tmp_path, retriever_params):
  path = ckpt.save_checkpoint(tmp_path, 7, {"retriever": retriever_params}, config=TINY,
                              extra_state={"rng": {"key": np.arange(2, dtype=np.uint32)}})
  assert path == os.path.join(str(tmp_path), "checkpoints", "7")
  params, config, metadata = ckpt.restore_params(tmp_path, 7, expected_config=TINY)
  assert config == TINY
  assert metadata["step"] == 7 and metadata["model_kind"] == "retriever"
  assert metadata["param_items"] == ["retriever"] and metadata["extra_items"] == ["rng"]
  _assert_trees_equal(params["retriever"], retriever_params)
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(params))  # host arrays
  rng, _, _ = ckpt.restore_params(tmp_path, 7, item="rng")
  np.testing.assert_array_equal(rng["key"], [0, 1])
  # Boxed (nn.Partitioned) params are unboxed on save.
  boxed = _random_params(TINY, unbox=False)
  assert any(isinstance(x, nn.Partitioned)
             for x in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)))
  ckpt.save_checkpoint(tmp_path, 8, {"retriever": boxed}, config=TINY)
  params8, _, _ = ckpt.restore_params(tmp_path)  # newest
  _assert_trees_equal(params8["retriever"], retriever_params)


def test_latest_list_and_keep(tmp_path, retriever_params):
  assert ckpt.list_checkpoint_steps(tmp_path) == []
  assert ckpt.latest_checkpoint_step(tmp_path) is None
  for step in (10, 20, 30):
    ckpt.save_checkpoint(tmp_path, step, {"retriever": retriever_params}, config=TINY, keep=2)
  assert ckpt.list_checkpoint_steps(tmp_path) == [20, 30]
  assert ckpt.latest_checkpoint_step(tmp_path) == 30
  with pytest.raises(ckpt.CheckpointError, match=r"no checkpoint for step 10 \(have \[20, 30\]"):
    ckpt.restore_params(tmp_path, 10)


def test_unfinished_checkpoints_are_never_listed(tmp_path, retriever_params):
  ckpt.save_checkpoint(tmp_path, 5, {"retriever": retriever_params}, config=TINY)
  root = ckpt.checkpoints_dir(tmp_path)
  # Orbax's temporary directory of a save in progress (or killed), and a bare step directory.
  os.makedirs(os.path.join(root, "9.orbax-checkpoint-tmp-1795240388"), exist_ok=True)
  os.makedirs(os.path.join(root, "11", "params"))
  assert ckpt.list_checkpoint_steps(tmp_path) == [5]
  assert ckpt.latest_checkpoint_step(tmp_path) == 5
  with pytest.raises(ckpt.CheckpointError, match="not a finished Orbax checkpoint"):
    ckpt.restore_params(tmp_path, 11)


def test_another_model_size_is_a_one_line_error(tmp_path, retriever_params):
  ckpt.save_checkpoint(tmp_path, 1, {"retriever": retriever_params}, config=TINY)
  small = config_lib.RealmConfig(bert=config_lib.small_bert())
  with pytest.raises(ckpt.CheckpointError) as info:
    ckpt.restore_params(tmp_path, 1, expected_config=small)
  message = str(info.value)
  assert "\n" not in message
  assert "another model size" in message and "hidden_size 32 vs 256" in message
  # Compute dtype and dropout are not sizes: the checkpoint still loads.
  ckpt.restore_params(tmp_path, 1, expected_config=TINY.replace(**{"bert.dtype": "bfloat16"}))


def test_training_done_marker(tmp_path, retriever_params):
  assert not ckpt.training_done(tmp_path)
  ckpt.save_checkpoint(tmp_path, 3, {"retriever": retriever_params}, config=TINY)
  path = ckpt.mark_training_done(tmp_path)
  assert ckpt.training_done(tmp_path) and os.path.basename(path) == ckpt.TRAINING_DONE
  assert ckpt.list_checkpoint_steps(tmp_path) == [3]  # the marker is not a checkpoint


def test_params_without_retriever_or_encoder_are_refused(tmp_path, retriever_params):
  with pytest.raises(ckpt.CheckpointError, match="'retriever' or an 'encoder' entry"):
    ckpt.save_checkpoint(tmp_path, 1, {"reader": retriever_params}, config=TINY)


def test_span_reader_width_is_part_of_the_model_size():
  """A fine-tuned reader of another span width cannot be loaded (its span head's kernels have
  other shapes), and the error names the field."""
  base = config_lib.RealmConfig(bert=config_lib.tiny_bert())
  narrow = base.replace(span_hidden_size=64)
  ckpt.check_model_size(base, base.replace(max_span_width=10), "here")  # same shapes
  with pytest.raises(ckpt.CheckpointError, match="span_hidden_size 64 vs 256"):
    ckpt.check_model_size(narrow, base, "here")


def test_retriever_pooling_must_match_a_checkpoint():
  """Same shapes, other embeddings: a mean-pooled retriever's checkpoint is refused by a
  [CLS]-pooled run (its index would not answer this run's queries)."""
  base = config_lib.RealmConfig(bert=config_lib.tiny_bert())
  mean = base.replace(retriever_pooling="mean")
  with pytest.raises(ckpt.CheckpointError,
                     match=r"mean-pooled retriever\).*differs in retriever_pooling mean vs cls"):
    ckpt.check_model_size(mean, base, "here")


# ------------------------------------------------------- a save that fails or never completes


def _writer_whose_second_save_is_lost(run_dir, params, monkeypatch, wait):
  """A CheckpointWriter (1 s save timeout) with step 1 on disk and step 2 "in flight": from step
  2 on, Orbax's save starts nothing and its wait is `wait` (blocks for ever, or raises)."""
  writer = ckpt.CheckpointWriter(run_dir, save_timeout=1.0)
  writer.save(1, {"retriever": params}, config=TINY)
  writer.wait()
  monkeypatch.setattr(writer._manager, "save", lambda *args, **kwargs: True)
  monkeypatch.setattr(writer._manager, "wait_until_finished", wait)
  writer.save(2, {"retriever": params}, config=TINY)
  return writer


@pytest.mark.parametrize("lost", ["never_completes", "fails"])
def test_a_lost_save_is_an_error_naming_its_step_not_a_hang(lost, tmp_path, retriever_params,
                                                             monkeypatch):
  import threading  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  run_dir = str(tmp_path / "run")
  never = threading.Event()

  def fail():
    raise FileNotFoundError("2.orbax-checkpoint-tmp: No such file or directory")

  wait = never.wait if lost == "never_completes" else fail
  writer = _writer_whose_second_save_is_lost(run_dir, retriever_params, monkeypatch, wait)
  manager = writer._manager
  try:
    started = time.monotonic()
    with pytest.raises(ckpt.CheckpointSaveError) as lost_save:
      writer.close()
    assert time.monotonic() - started < 30
    what = ("did not finish within 1s" if lost == "never_completes" else
            "failed (FileNotFoundError: 2.orbax-checkpoint-tmp: No such file or directory)")
    assert str(lost_save.value) == (
        f"saving checkpoint step 2 in {run_dir} {what}; the last complete checkpoint is step 1 "
        f"({ckpt.checkpoint_path(run_dir, 1)})")
    # Once lost, nothing waits on Orbax again: a second close fails at once, the same way.
    started = time.monotonic()
    with pytest.raises(ckpt.CheckpointSaveError, match="saving checkpoint step 2"):
      writer.close()
    assert time.monotonic() - started < 0.5
    assert ckpt.list_checkpoint_steps(run_dir) == [1]
    assert ckpt.verify_checkpoint(ckpt.checkpoint_path(run_dir, 1))
  finally:
    never.set()
    monkeypatch.undo()
    manager.close()
