"""The training loop on one CPU device: metrics (TensorBoard + console), progress with ETA, the
learning-rate schedule, hooks, eval and best checkpoint, NaN handling, the input protocol.

Every test shares one compiled train step (module fixture; `train(train_step=...)`): the tiny
ICT model wrapped so that a batch feature, `loss_scale`, multiplies the loss; a batch whose
`loss_scale` is NaN makes that step's loss and gradients NaN.
"""

import dataclasses
import glob
import json
import logging
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from realm_jax.models import config as config_lib
from realm_jax.models import realm
from realm_jax import checkpoints as ckpt
from realm_jax.training import optim
from realm_jax.training import partitioning
from realm_jax.training import trainer

import train_child
from test_partitioning import _pretrain_batch

CONFIG = config_lib.RealmConfig(bert=config_lib.tiny_bert(vocab_size=60), proj_size=16)
PEAK_LR, TOTAL_STEPS, WARMUP = 1e-3, 8, 2
BATCH = 4


@dataclasses.dataclass(frozen=True)
class ScaledIct(realm.IctModel):
  """ICT whose loss (and loss_sum) is multiplied by mean(batch["loss_scale"])."""

  def loss_fn(self, params, batch, rng):
    batch = dict(batch)
    scale = jnp.mean(batch.pop("loss_scale"))
    loss, aux = super().loss_fn(params, batch, rng)
    return loss * scale, {**aux, "loss_sum": aux["loss_sum"] * scale}

  def eval_fn(self, params, batch):
    batch = dict(batch)
    batch.pop("loss_scale")
    return super().eval_fn(params, batch)


def _batches(num, poison_step=None):
  out = []
  for i in range(num):
    batch = train_child.ict_batch(BATCH, seed=i)
    scale = np.nan if poison_step == i + 1 else 1.0
    batch["loss_scale"] = np.full((BATCH,), scale, np.float32)
    out.append(batch)
  return out


class Recorder:
  """A metric writer that keeps what it is given."""

  def __init__(self):
    self.scalars = {}

  def write_scalars(self, step, scalars):
    self.scalars.setdefault(int(step), {}).update(scalars)

  def flush(self):
    pass

  def close(self):
    pass


@pytest.fixture(scope="module")
def setup():
  model = ScaledIct(CONFIG)
  optimizer = optim.bert_optimizer(PEAK_LR, TOTAL_STEPS, warmup_steps=WARMUP)
  schedule = optim.bert_learning_rate_schedule(PEAK_LR, TOTAL_STEPS, WARMUP)
  mesh = partitioning.make_mesh(devices=jax.devices()[:1])
  step = trainer.make_train_step(model, optimizer, mesh=mesh, learning_rate_fn=schedule)
  return dict(model=model, optimizer=optimizer, schedule=schedule, mesh=mesh, step=step)


def _train(setup, batches, run_dir, **kwargs):
  defaults = dict(run_dir=run_dir, num_steps=6, mesh=setup["mesh"], config=CONFIG,
                  checkpoint_every=2, keep=3, log_every=1, train_step=setup["step"],
                  learning_rate_fn=setup["schedule"], best_metric=None)
  defaults.update(kwargs)
  return trainer.train(setup["model"], setup["optimizer"], batches, **defaults)


def _tensorboard_scalars(logdir):
  from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415
  from tensorboard.util import tensor_util  # noqa: PLC0415

  accumulator = event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
  accumulator.Reload()
  return {tag: {event.step: float(tensor_util.make_ndarray(event.tensor_proto))
                for event in accumulator.Tensors(tag)}
          for tag in accumulator.Tags()["tensors"]}


def test_metrics_progress_eval_and_best_checkpoint(setup, tmp_path, caplog):
  caplog.set_level(logging.INFO)
  # clu's console writer logs through absl's logger, whose level a CLI main run in this
  # process earlier (build_index quiets Orbax) may have raised.
  caplog.set_level(logging.INFO, logger="absl")
  run_dir = tmp_path / "run"
  real_eval = trainer.make_eval_fn(setup["model"], _batches(1), mesh=setup["mesh"])

  def eval_fn(step, state):
    # A made-up "utility" that peaks at step 4, next to the real eval metrics.
    return {**real_eval(step, state), "eval/utility": -abs(step - 4.0)}

  def hook(step, state):
    assert int(state.step) == step - 1  # called at the boundary before `step`
    return {"retrieval/index_step": float(step // 3)}

  state = _train(setup, trainer.ListBatches(_batches(6)), run_dir, keep=1, hooks=[hook],
                 eval_fn=eval_fn, best_metric="eval/utility", peak_flops_per_device=1e13)
  assert int(state.step) == 6

  # TensorBoard event file under the run directory, with the namespaced scalars.
  assert glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*"))
  scalars = _tensorboard_scalars(os.path.join(run_dir, "tensorboard"))
  for tag in ("train/loss", "train/grad_norm", "train/grad_norm/retriever",
              "train/learning_rate", "train/accuracy", "retrieval/index_step"):
    assert sorted(scalars[tag]) == [1, 2, 3, 4, 5, 6], tag
  # Step s applies lr(s - 1): 0 at the first update, BERT's warmup then linear decay.
  schedule = setup["schedule"]
  expected = [float(schedule(s - 1)) for s in range(1, 7)]
  np.testing.assert_allclose([scalars["train/learning_rate"][s] for s in range(1, 7)], expected,
                             rtol=1e-6)
  assert expected[0] == 0.0 and expected[1] == pytest.approx(PEAK_LR / 2)
  assert scalars["retrieval/index_step"][5] == 1.0
  # Throughput from step 2 on (step 1 includes the compile); MFU with the given peak.
  assert sorted(scalars["perf/examples_per_s"]) == [2, 3, 4, 5, 6]
  assert all(v > 0 for v in scalars["perf/examples_per_s"].values())
  assert all(0 < v < 1 for v in scalars["perf/mfu"].values())
  assert sorted(scalars["eval/loss"]) == [2, 4, 6] and "eval/accuracy" in scalars

  # Console: clu's logging writer and the progress line with rate and ETA.
  text = caplog.text
  assert "train/loss=" in text and "perf/examples_per_s=" in text
  assert "train/grad_norm/retriever=" in text
  assert "step 3/6 (50.0%)" in text and "steps/s" in text
  assert re.search(r"ETA (\d+\.\ds|\d+:\d\d:\d\d)", text), text

  # Best checkpoint by eval/utility (step 4) survives keep=1; the newest (6) is kept too.
  assert ckpt.read_best(run_dir) == {"metric": "eval/utility", "mode": "max", "step": 4,
                                     "value": 0.0}
  assert ckpt.list_checkpoint_steps(run_dir) == [4, 6]
  assert ckpt.training_done(run_dir)
  metadata = ckpt.read_metadata(ckpt.checkpoint_path(run_dir, 6))
  assert metadata["extra_items"] == ["opt_state", "train_state"]
  assert metadata["json_items"] == ["data_state"]
  assert metadata["extra"]["trainer"]["mesh"] == {"data": 1, "model": 1}
  # A finished run asked for the same number of steps does nothing (and does not fail).
  again = _train(setup, trainer.ListBatches(_batches(6)), run_dir, writer=Recorder())
  assert int(again.step) == 6
  # Asked to go further, it withdraws TRAINING_DONE while it trains (the index builder follows
  # it) and writes it again at the end.
  seen = []
  longer = _train(setup, trainer.ListBatches(_batches(7)), run_dir, num_steps=7,
                  writer=Recorder(), hooks=[lambda step, state: seen.append(
                      ckpt.training_done(run_dir))])
  assert int(longer.step) == 7 and seen == [False] and ckpt.training_done(run_dir)


def test_nan_loss_stops_with_the_last_good_checkpoint_intact(setup, tmp_path):
  run_dir = tmp_path / "run"
  writer = Recorder()
  with pytest.raises(trainer.NonFiniteLossError) as info:
    _train(setup, trainer.ListBatches(_batches(6, poison_step=5)), run_dir, writer=writer)
  message = str(info.value)
  assert "non-finite loss at step 5" in message
  assert f"the last good checkpoint is step 4 ({ckpt.checkpoint_path(run_dir, 4)})" in message
  assert info.value.step == 5 and info.value.last_checkpoint == 4
  # Nothing at or after the NaN step was saved, and the run is not marked done.
  assert ckpt.list_checkpoint_steps(run_dir) == [2, 4]
  assert not os.path.exists(ckpt.checkpoint_path(run_dir, 5))
  assert not ckpt.training_done(run_dir)
  assert max(writer.scalars) == 4  # step 5's metrics were not logged

  # The last good checkpoint restores: finite state at step 4, input position 4.
  state, data_state, _ = trainer.restore_train_state(run_dir, 4, setup["step"], config=CONFIG)
  assert int(state.step) == 4 and data_state == {"position": 4}
  assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree.leaves(state.params))
  # With the bad batch fixed, the run resumes from step 4 and finishes.
  state = _train(setup, trainer.ListBatches(_batches(6)), run_dir, writer=Recorder())
  assert int(state.step) == 6 and ckpt.training_done(run_dir)


def test_resume_refuses_a_checkpoint_of_another_model_size(setup, tmp_path):
  run_dir = tmp_path / "run"
  _train(setup, trainer.ListBatches(_batches(2)), run_dir, num_steps=2, writer=Recorder())
  other = config_lib.RealmConfig(bert=config_lib.tiny_bert(vocab_size=60, hidden_size=64),
                                 proj_size=16)
  with pytest.raises(ckpt.CheckpointError) as info:
    _train(setup, trainer.ListBatches(_batches(6)), run_dir, config=other, writer=Recorder())
  assert "another model size" in str(info.value) and "\n" not in str(info.value)


def test_input_protocol_and_running_out(setup, tmp_path):
  batches = trainer.ListBatches(_batches(3))
  next(batches)
  assert batches.state() == {"position": 1}
  batches.restore({"position": 3})
  with pytest.raises(StopIteration):
    next(batches)
  with pytest.raises(ValueError, match="outside the 3 batches"):
    batches.restore({"position": 4})
  cycling = trainer.ListBatches(_batches(2), repeat=True)
  assert [int(next(cycling)["query_ids"][0, 0]) for _ in range(3)][2] == int(
      _batches(1)[0]["query_ids"][0, 0])

  with pytest.raises(ValueError, match="the input ran out before step 3 of 6"):
    _train(setup, trainer.ListBatches(_batches(2)), tmp_path / "run", writer=Recorder())
  with pytest.raises(TypeError, match=r"state\(\) and restore\(state\)"):
    _train(setup, iter(_batches(6)), tmp_path / "other", writer=Recorder())


class CountingBatches(trainer.ListBatches):
  """ListBatches that count what they gave, as PretrainingBatches counts its skips."""

  def __next__(self):
    batch = super().__next__()
    self.given = getattr(self, "given", 0) + 1
    return batch

  def metrics(self):
    return {"input/given": float(self.given)}


def test_the_inputs_own_metrics_reach_the_writer(setup, tmp_path):
  writer = Recorder()
  _train(setup, CountingBatches(_batches(6)), tmp_path / "run", writer=writer, log_every=2)
  # Written with every log line, at the batch count of that step.
  assert {step: s["input/given"] for step, s in writer.scalars.items()
          if "input/given" in s} == {2: 2.0, 4: 4.0, 6: 6.0}


def test_host_metadata_stays_on_the_host(setup, tmp_path):
  """0-d batch entries (a pretraining batch's `index_step`) are host metadata: training and
  evaluation run on the per-example arrays only, and give what they give without them."""
  plain = _batches(2)
  tagged = [{**batch, "index_step": np.asarray(7)} for batch in plain]
  assert trainer.device_batch(tagged[0]).keys() == plain[0].keys()
  with_meta = _train(setup, trainer.ListBatches(tagged), tmp_path / "a", num_steps=2,
                     writer=Recorder(), eval_fn=trainer.make_eval_fn(setup["model"], tagged[:1],
                                                                    mesh=setup["mesh"]))
  without = _train(setup, trainer.ListBatches(plain), tmp_path / "b", num_steps=2,
                   writer=Recorder())
  for a, b in zip(jax.tree.leaves(with_meta.params), jax.tree.leaves(without.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_per_tower_grad_norms_match_numpy():
  """train/grad_norm/<key> for REALM pretraining's two towers: the L2 norm of each top-level
  subtree's raw (unclipped) gradient, here from `jax.grad` of the loss and NumPy."""
  config = CONFIG.replace(**{"bert.num_layers": 1, "bert.hidden_dropout": 0.0,
                             "bert.attention_dropout": 0.0})
  model = realm.RealmPretrainModel(config)
  mesh = partitioning.make_mesh(devices=jax.devices()[:1])
  optimizer = optim.bert_optimizer(PEAK_LR, TOTAL_STEPS, warmup_steps=WARMUP)
  step = trainer.make_train_step(model, optimizer, mesh=mesh)
  state = step.init_state(0)
  # Host copies before the step donates the state's buffers.
  params, rng = jax.device_get(state.params), jax.device_get(state.rng)
  batch = _pretrain_batch(batch=4, candidates=3)
  _, metrics = step(state, partitioning.shard_batch(batch, mesh))
  metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}

  key = jax.random.fold_in(jax.random.wrap_key_data(rng), 0)  # the step's dropout key
  grads = jax.device_get(jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, key)[0]))(params))

  def norm(tree):
    return float(np.linalg.norm(np.concatenate(
        [np.asarray(leaf, np.float64).ravel() for leaf in jax.tree.leaves(tree)])))

  assert sorted(grads) == ["encoder", "retriever"]
  for tower in ("retriever", "encoder"):
    assert metrics[f"train/grad_norm/{tower}"] == pytest.approx(norm(grads[tower]), rel=1e-4)
  assert metrics["train/grad_norm"] == pytest.approx(norm(grads), rel=1e-4)
  # Before clipping (at 1.0): the encoder's norm alone is above the threshold, and the towers
  # differ, so neither a clipped norm nor one tower's norm under the other's name would pass.
  assert metrics["train/grad_norm/encoder"] > 1.0
  assert metrics["train/grad_norm/retriever"] != pytest.approx(metrics["train/grad_norm/encoder"],
                                                               rel=0.05)


def _flip_a_byte(step_dir):
  """Flips one byte in the middle of the largest file of the checkpoint's params."""
  files = [os.path.join(root, name) for root, _, names in os.walk(os.path.join(step_dir, "params"))
           for name in names]
  path = max(files, key=os.path.getsize)
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x40
  with open(path, "wb") as f:
    f.write(bytes(data))
  return os.path.relpath(path, step_dir)


def test_a_corrupt_checkpoint_is_set_aside_and_the_run_resumes_from_the_intact_one(
    setup, tmp_path, caplog):
  straight = _train(setup, trainer.ListBatches(_batches(6)), tmp_path / "straight",
                    writer=Recorder())
  run_dir = tmp_path / "run"
  _train(setup, trainer.ListBatches(_batches(6)), run_dir, num_steps=4, writer=Recorder())
  assert sorted(os.listdir(run_dir / ckpt.CHECKSUMS_DIR)) == ["2.json", "4.json"]
  flipped = _flip_a_byte(ckpt.checkpoint_path(run_dir, 4))
  # Restoring it is refused, naming the file (no silently changed parameters).
  with pytest.raises(ckpt.CorruptCheckpointError,
                     match=f"{ckpt.checkpoint_path(run_dir, 4)}: {flipped} does not match"):
    ckpt.restore_checkpoint_dir(ckpt.checkpoint_path(run_dir, 4))
  # Resuming sets it aside, says so, resumes from step 2 and ends where the straight run did.
  resumed = _train(setup, trainer.ListBatches(_batches(6)), run_dir, writer=Recorder())
  assert "resuming from the newest intact checkpoint, step 2" in caplog.text
  assert os.path.isdir(run_dir / ckpt.CORRUPT_DIR / "4")
  assert ckpt.list_checkpoint_steps(run_dir) == [2, 4, 6]
  for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  ckpt.restore_checkpoint_dir(ckpt.checkpoint_path(run_dir, 4))  # the new step 4 is intact


# Orbax's failed read leaves a callback for its closed asyncio loop behind (said at exit).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_truncated_checkpoint_is_a_corrupt_one(setup, tmp_path):
  run_dir = tmp_path / "run"
  _train(setup, trainer.ListBatches(_batches(2)), run_dir, num_steps=2, writer=Recorder())
  step_dir = ckpt.checkpoint_path(run_dir, 2)
  os.remove(os.path.join(run_dir, ckpt.CHECKSUMS_DIR, "2.json"))  # say, written before them
  files = [os.path.join(root, name) for root, _, names in os.walk(os.path.join(step_dir, "params"))
           for name in names]
  path = max(files, key=os.path.getsize)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)
  with pytest.raises(ckpt.CorruptCheckpointError, match="a truncated or corrupt checkpoint"):
    ckpt.restore_checkpoint_dir(step_dir)


def test_jsonl_metrics_are_one_record_per_write_and_a_resumed_run_appends(setup, tmp_path):
  run_dir = str(tmp_path / "run")
  recorder = Recorder()
  _train(setup, trainer.ListBatches(_batches(8)), str(tmp_path / "reference"), num_steps=4,
         writer=recorder)
  _train(setup, trainer.ListBatches(_batches(8)), run_dir, num_steps=4, writer="jsonl")
  path = os.path.join(run_dir, trainer.METRICS_JSONL)
  with open(path, encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  times = [r["time"] for r in records]
  assert times == sorted(times) and abs(times[-1] - time.time()) < 600
  for record in records:  # the same scalars a writer object is given
    expected = recorder.scalars[record["step"]]
    assert {k for k in record if k not in ("step", "time")} == set(expected)
    assert record["train/loss"] == pytest.approx(expected["train/loss"], rel=1e-6)
  _train(setup, trainer.ListBatches(_batches(8)), run_dir, num_steps=6, writer="jsonl")
  with open(path, encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2, 3, 4, 5, 6]
