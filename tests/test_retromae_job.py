"""The RetroMAE job (realm_jax.jobs.retromae) through the generic `train_main`: a dry run, two
real steps on the toy world, and its checkpoint used as an ICT checkpoint is: the
INIT_CHECKPOINT of a toy pretraining dry run, PretrainJob's retriever warm start, and the
first index (`build_index --once` with `checkpoint_dir`)."""

import json
import os

import jax
import numpy as np
import pytest

import realm_jax_tasks
from realm_jax import build_index
from realm_jax import checkpoints
from realm_jax import jobs
from realm_jax import train
from realm_jax.models import realm

pytestmark = pytest.mark.usefixtures("one_device", "clean_gin")

TOY = ["--gin_file=gin_configs/experiments/toy_retromae.gin"]
# Two small steps: 8 blocks (one per test device), at most 16 predicted wordpieces each.
SMALL = ["--gin.NUM_STEPS=2", "--gin.BATCH_SIZE=8", "--gin.RetroMaeJob.decoder_predictions=16",
         "--gin.train_main.checkpoint_every=2", "--gin.train_main.log_every=1"]


def _train(*args):
  return train.main(["train", *args])


def test_retromae_runs_and_warm_starts_pretraining_and_the_first_index(tmp_path, capsys):
  run_dir = tmp_path / "retromae"
  assert _train(*TOY, f"--gin.RUN_DIR='{run_dir}'", "--dry_run") == 0, capsys.readouterr().err
  out = capsys.readouterr().out
  assert "dry run ok (job retromae, task ict_toy" in out, out
  assert "encoder mask 0.3, decoder mask 0.5" in out and not run_dir.exists()

  assert _train(*TOY, *SMALL, f"--gin.RUN_DIR='{run_dir}'") == 0, capsys.readouterr().err
  out = capsys.readouterr().out
  assert "train: done (job retromae" in out and "at most 16 decoder rows" in out, out
  assert checkpoints.list_checkpoint_steps(str(run_dir)) == [2]
  step_dir = checkpoints.checkpoint_path(str(run_dir), 2)
  params, config, _ = checkpoints.restore_checkpoint_dir(step_dir)
  assert set(params) == {"retriever", "decoder"}

  # The INIT_CHECKPOINT of toy pretraining (its model size checked from the metadata) ...
  assert _train("--gin_file=gin_configs/experiments/toy_pretrain.gin",
                f"--gin.RUN_DIR='{tmp_path / 'pretrain'}'", f"--gin.INIT_CHECKPOINT='{step_dir}'",
                "--dry_run") == 0, capsys.readouterr().err
  assert "warm start from" in capsys.readouterr().out
  # ... whose warm start takes its retriever, as an ICT checkpoint's.
  fresh = jax.device_get(realm.RealmPretrainModel(config).init(jax.random.PRNGKey(1)))
  warm, taken = jobs.PretrainJob(task="realm_toy_salient_span").warm_start(
      params, fresh, step_dir)
  assert taken == "retriever"
  assert jax.tree.all(jax.tree.map(np.array_equal, warm["retriever"], params["retriever"]))

  # The first index, from its checkpoint.
  index_run = tmp_path / "indexed"
  store = realm_jax_tasks.toy_block_store_dir()
  assert build_index.main([
      "build_index", "--gin_file=gin_configs/runs/build_index.gin", "--once",
      f"--gin.RUN_DIR='{index_run}'", f"--gin.BLOCK_STORE='{store}'",
      f"--gin.build_index_main.checkpoint_dir='{step_dir}'"]) == 0, capsys.readouterr().err
  (index_dir,) = [os.path.join(index_run, "index", d)
                  for d in os.listdir(index_run / "index")]
  with open(os.path.join(index_dir, "manifest.json"), encoding="utf-8") as f:
    manifest = json.load(f)
  embeddings = np.load(os.path.join(index_dir, "embeddings.npy"), mmap_mode="r")
  assert embeddings.shape[1] == config.proj_size and len(embeddings) > 1000, manifest


def test_retromae_settings_are_checked_before_anything_runs(tmp_path, capsys):
  code = _train(*TOY, f"--gin.RUN_DIR='{tmp_path}'", "--gin.ENCODER_MASK_RATE=1.5",
                "--dry_run")
  err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert code == 2 and len(err) == 1, err
  assert err[0] == ("train: config error: RetroMaeJob.encoder_mask_rate=1.5: expected a "
                    "fraction in (0, 1)"), err
  # Another job's setting is refused on it.
  assert _train(*TOY, f"--gin.RUN_DIR='{tmp_path}'",
                "--gin.RetroMaeJob.ict_remove_probability=0.5", "--dry_run") == 2
  assert "'RetroMaeJob' doesn't have a parameter named" in capsys.readouterr().err
