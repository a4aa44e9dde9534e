"""The RETRO job (realm_jax.jobs.retro) through the generic `train_main` on the toy world: a dry
run; a short real run whose eval loss and bits per byte (retrieval on and off) are finite and
move; exact resume (4 steps straight == 2 steps, interrupted, resumed to 4, bit for bit); the
no-retrieval baseline never reading a neighbour; and RETRO-fitting it: the decoder stays the
baseline checkpoint's exactly, the encoder and CCA train."""

import jax
import numpy as np
import pytest

from realm_jax import checkpoints
from realm_jax import train
from realm_jax.batches import retro as retro_batches
from realm_jax.index import chunks
from realm_jax.jobs import retro as retro_job
from realm_jax.models import retro as retro_model

pytestmark = pytest.mark.usefixtures("one_device", "clean_gin")

TOY = ["--gin_file=gin_configs/experiments/toy_retro.gin"]
# A tiny RETRO (2 layers, CCA in the second, width 32) on the BERT vocabulary, 8 sequences of
# 2 chunks per step (one per test device), a checkpoint (and an evaluation of 8 held-out
# sequences) every 2 steps.
SMALL = ["--gin.BATCH_SIZE=8", "--gin.EVAL_SEQUENCES=8", "--gin.RetroConfig.hidden_size=32",
         "--gin.RetroConfig.num_layers=2", "--gin.RetroConfig.intermediate_size=64",
         "--gin.RetroConfig.encoder_layers=1", "--gin.RetroConfig.cca_every=1",
         "--gin.train_main.checkpoint_every=2", "--gin.train_main.log_every=1"]


def _train(*args):
  return train.main(["train", *args])


def _params(run_dir, step):
  params, _, _ = checkpoints.restore_checkpoint_dir(checkpoints.checkpoint_path(str(run_dir),
                                                                                step))
  return params


def _same(a, b):
  return all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


@pytest.fixture
def evals(monkeypatch):
  """Every evaluation's metrics, and an optional interruption at a step boundary."""
  seen, control = [], {"stop_at": None}
  start = retro_job.RetroJob.start

  def patched(self, ctx, model, batches):
    hooks, eval_fn, best = start(self, ctx, model, batches)

    def recorded(step, state):
      seen.append(dict(eval_fn(step, state)))
      return seen[-1]

    def stop(step, state):
      del state
      if step == control["stop_at"]:
        raise KeyboardInterrupt  # as a SIGINT there: the pending checkpoint is finished
    return [*hooks, stop], recorded if eval_fn else None, best

  monkeypatch.setattr(retro_job.RetroJob, "start", patched)
  return seen, control


def test_retro_dry_run_trains_and_resumes_exactly(tmp_path, capsys, evals):
  seen, control = evals
  straight = tmp_path / "straight"
  assert _train(*TOY, *SMALL, f"--gin.RUN_DIR='{straight}'", "--dry_run") == 0
  out = capsys.readouterr().out
  assert "dry run ok (job retro, task retro_toy" in out and "retrieval k=2" in out, out
  assert not straight.exists()

  assert _train(*TOY, *SMALL, "--gin.NUM_STEPS=4", f"--gin.RUN_DIR='{straight}'") == 0, (
      capsys.readouterr().err)
  assert "train: done (job retro" in capsys.readouterr().out
  assert checkpoints.list_checkpoint_steps(str(straight)) == [2, 4]
  assert len(seen) == 2
  for metrics in seen:
    for name in ("loss", "bits_per_byte", "no_retrieval/loss", "no_retrieval/bits_per_byte"):
      assert np.isfinite(metrics[f"eval/{name}"]), metrics
    # Bits per byte: nats / ln 2 over about 4-5 bytes per wordpiece, well below the loss.
    assert 0 < metrics["eval/bits_per_byte"] < metrics["eval/loss"]
  assert seen[1]["eval/loss"] != seen[0]["eval/loss"], seen
  assert seen[1]["eval/loss"] < 11.0  # ln 30522 = 10.3 at a uniform start

  # The same run interrupted at the boundary before step 3 (checkpoint 2 finished), resumed.
  resumed = tmp_path / "resumed"
  control["stop_at"] = 3
  assert _train(*TOY, *SMALL, "--gin.NUM_STEPS=4", f"--gin.RUN_DIR='{resumed}'") != 0
  assert checkpoints.list_checkpoint_steps(str(resumed)) == [2]
  capsys.readouterr()
  control["stop_at"] = None
  assert _train(*TOY, *SMALL, "--gin.NUM_STEPS=4", f"--gin.RUN_DIR='{resumed}'") == 0, (
      capsys.readouterr().err)
  assert _same(_params(straight, 4), _params(resumed, 4))


def test_baseline_reads_no_neighbour_and_retrofit_trains_only_retrieval(tmp_path, capsys,
                                                                         monkeypatch, evals):
  seen, _ = evals

  def refuse(*args, **kwargs):
    raise AssertionError("the no-retrieval baseline read neighbours")

  with monkeypatch.context() as patch:
    patch.setattr(chunks.ChunkDatabase, "searcher", refuse)
    patch.setattr(chunks.ChunkDatabase, "neighbour_tokens", refuse)
    patch.setattr(chunks, "search_excluding_documents", refuse)
    baseline = tmp_path / "baseline"
    assert _train(*TOY, *SMALL, "--gin.NUM_STEPS=2", "--gin.RETRIEVAL=False",
                  f"--gin.RUN_DIR='{baseline}'") == 0, capsys.readouterr().err
    assert "no retrieval" in capsys.readouterr().out
  assert set(seen[-1]) == {"eval/loss", "eval/bits_per_byte"}, seen

  retrofit = tmp_path / "retrofit"
  init = checkpoints.checkpoint_path(str(baseline), 2)
  assert _train(*TOY, *SMALL, "--gin.NUM_STEPS=2", "--gin.RETROFIT=True",
                f"--gin.INIT_CHECKPOINT='{init}'", f"--gin.RUN_DIR='{retrofit}'") == 0, (
      capsys.readouterr().err)
  out = capsys.readouterr().out
  assert "RETRO-fitting" in out and " trained)" in out, out
  before, after = _params(baseline, 2), _params(retrofit, 2)
  mask = retro_model.retrieval_parameter_mask(after)
  flags = jax.tree.leaves(mask)
  assert any(flags) and not all(flags)
  leaves = zip(flags, jax.tree.leaves(before), jax.tree.leaves(after))
  frozen_equal = [np.array_equal(b, a) for on, b, a in leaves if not on]
  assert all(frozen_equal)
  # The retrieval parameters started fresh (the trainer's init of seed 0) and trained.
  rng = jax.random.key_data(jax.random.key(0))
  params_rng, _ = jax.random.split(jax.random.wrap_key_data(rng))
  config = retro_job.RetroLanguageModel(_retro_config(retrofit))
  fresh = jax.device_get(config.init(params_rng))
  changed = [not np.array_equal(f, a) for on, f, a in
             zip(flags, jax.tree.leaves(fresh), jax.tree.leaves(after)) if on]
  assert sum(changed) > len(changed) // 2, changed


def _retro_config(run_dir):
  from realm_jax.evaluation import retro as retro_eval  # pylint: disable=import-outside-toplevel
  return retro_eval.read_run_config(str(run_dir))[0]


def test_batches_hold_out_documents_and_resume_exactly():
  db = chunks.ChunkDatabase.open(retro_job.toy_chunk_database(chunks.TOY_CHUNK_LEN),
                                 verify="fast")
  make = lambda **kw: retro_batches.RetroBatches(
      db, batch_size=3, chunks_per_sequence=2, seed=1, max_sequences=40, process_index=0,
      process_count=1, **kw)
  stream = make()
  first = [next(stream) for _ in range(5)]  # 15 of 40 sequences
  state = stream.state()
  rest = [next(stream) for _ in range(12)]  # crosses into the next epoch
  again = make()
  again.restore(state)
  for a, b in zip(rest, [next(again) for _ in range(12)]):
    assert all(np.array_equal(a[key], b[key]) for key in a)
  batch = first[0]
  assert batch["input_ids"].shape == (3, 32) and batch["neighbour_ids"].shape == (3, 2, 2, 32)
  assert batch["neighbour_mask"].shape == (3, 2, 2, 32)
  # Neighbours never from the sequence's document, nor from the held-out documents.
  cut = stream.train_rows
  assert (stream.neighbours < cut).all() and (stream.neighbours >= 0).all()
  own = np.asarray(db.doc_ids)[stream.chunk_ids][:, :, None]
  assert (np.asarray(db.doc_ids)[stream.neighbours] != own).all()
  heldout = make(split="heldout")
  assert (heldout.starts >= cut).all() and (stream.starts < cut).all()


def test_without_retros_rule_a_chunk_retrieves_itself_and_training_never_sees_heldout_text():
  db = chunks.ChunkDatabase.open(retro_job.toy_chunk_database(chunks.TOY_CHUNK_LEN),
                                 verify="fast")
  make = lambda split: retro_batches.RetroBatches(  # noqa: E731
      db, batch_size=3, chunks_per_sequence=2, seed=1, max_sequences=40, process_index=0,
      process_count=1, split=split, exclude_own_document=False)
  train, heldout = make("train"), make("heldout")
  # A chunk's own key is its nearest (L2 distance 0): the positive control retrieves the chunk
  # itself, whose continuation is the text that follows it (or, a tie broken by the lower id,
  # a chunk of the very same text elsewhere).
  keys = np.asarray(db.keys)
  for batches in (train, heldout):
    first = batches.neighbours[:, :, 0]  # [S, l]
    np.testing.assert_array_equal(keys[first], keys[batches.chunk_ids])
    assert (first == batches.chunk_ids).mean() > 0.9
  assert (train.neighbours < train.train_rows).all()  # training never retrieves held-out text
  assert (heldout.neighbours >= heldout.train_rows).mean() > 0.4  # held-out text searched


def test_adam_epsilon_reaches_the_optimizer_and_a_bad_one_is_a_config_error():
  from realm_jax.gin_utils import ConfigError  # pylint: disable=g-import-not-at-top
  from realm_jax.training import optim  # pylint: disable=g-import-not-at-top
  config = retro_model.RetroConfig.tiny()
  assert retro_job.RetroJob(model=config).optimizer_options() == {}
  options = retro_job.RetroJob(model=config, adam_epsilon=1e-8).optimizer_options()
  assert options == {"eps": 1e-8}
  # Hand-worked first step (BERT's Adam, no bias correction, lr 1, no decay of a 0-d leaf):
  # m = 0.1 g, v = 0.001 g^2, update = -m / (sqrt(v) + eps); for g = 1e-6 the epsilon of
  # 1e-6 shrinks it 10.3x against 1e-8's 2.40.
  grads = {"w": np.float32(1e-6)}
  for eps, expected in ((1e-8, -2.4025), (1e-6, -0.0969)):
    opt = optim.bert_optimizer(1.0, 10, warmup_steps=0, weight_decay=0.0, eps=eps)
    update, _ = opt.update(grads, opt.init({"w": np.float32(0.0)}), {"w": np.float32(0.0)})
    np.testing.assert_allclose(float(update["w"]), expected, rtol=2e-3)
  with pytest.raises(ConfigError, match="adam_epsilon"):
    retro_job.RetroJob(model=config, adam_epsilon=-1.0).configure(None)
