"""The gin-configured entry points: every run/experiment gin builds its job (dry runs, no
training), and config mistakes are one line on stderr with exit status 2. In-process (not
subprocesses), gin's config cleared around each test."""

import os

import gin
import numpy as np
import pytest

from realm_jax import build_index
from realm_jax import gin_utils
from realm_jax import train
from realm_jax.models import config as config_lib
from realm_jax.training import checkpoints

REPO = gin_utils.REPO_ROOT


@pytest.fixture(autouse=True)
def clean_gin(monkeypatch):
  monkeypatch.chdir(REPO)  # gin finds includes without logging failed look-ups
  gin.clear_config()
  yield
  gin.clear_config()


def _train(*args):
  return train.main(["train", *args])


def _stderr_lines(capsys):
  captured = capsys.readouterr()
  return captured.out, [line for line in captured.err.splitlines() if line.strip()]


DRY_RUNS = {
    "toy_ict": ["--gin_file=gin_configs/experiments/toy_ict.gin"],
    "toy_pretrain": ["--gin_file=gin_configs/experiments/toy_pretrain.gin",
                     "--gin.INIT_CHECKPOINT=None"],
    "runs_ict": ["--gin_file=gin_configs/models/tiny.gin", "--gin_file=gin_configs/runs/ict.gin",
                 "--gin.TASK='ict_toy'", "--gin.BATCH_SIZE=8", "--gin.NUM_STEPS=10"],
    "runs_pretrain": ["--gin_file=gin_configs/models/tiny.gin",
                      "--gin_file=gin_configs/runs/pretrain.gin",
                      "--gin.TASK='realm_toy_salient_span'", "--gin.BATCH_SIZE=8",
                      "--gin.NUM_STEPS=10", "--gin.INIT_CHECKPOINT=None",
                      "--gin.train_main.mesh_shape=(4, 2)"],
}


@pytest.mark.parametrize("name", sorted(DRY_RUNS))
def test_run_gin_dry_run_builds_the_job(name, tmp_path, capsys):
  run_dir = tmp_path / "run"
  code = _train(*DRY_RUNS[name], f"--gin.RUN_DIR='{run_dir}'", "--dry_run")
  out, err = _stderr_lines(capsys)
  assert code == 0, err
  lines = out.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("train: dry run ok (job "), out
  job = "pretrain" if "pretrain" in name else "ict"
  assert f"job {job}," in lines[0] and "params" in lines[0]
  assert not run_dir.exists()  # a dry run writes nothing


def test_every_run_and_experiment_gin_is_covered():
  names = {f"runs/{f}" for f in os.listdir(os.path.join(REPO, "gin_configs", "runs"))}
  names |= {f"experiments/{f}"
            for f in os.listdir(os.path.join(REPO, "gin_configs", "experiments"))}
  covered = {arg.split("gin_configs/")[1] for args in DRY_RUNS.values() for arg in args
             if arg.startswith("--gin_file=")} | {"runs/build_index.gin"}
  assert names <= covered, names - covered


def test_build_index_gin_parses_and_binds(tmp_path):
  gin_utils.parse_gin(["gin_configs/runs/build_index.gin"],
                      [f"RUN_DIR = '{tmp_path}'", "BLOCK_STORE = '/data/blocks'"])
  assert gin.query_parameter("build_index_main.once") is False
  assert gin.query_parameter("build_index_main.batch_size") == 128


def _one_config_error(capsys, code):
  out, err = _stderr_lines(capsys)
  assert code == 2, (out, err)
  assert len(err) == 1, err
  assert err[0].startswith("train: config error: "), err
  return err[0]


def test_unknown_gin_binding(tmp_path, capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], f"--gin.RUN_DIR='{tmp_path}'",
                                          "--gin.train_main.bogus_knob=3", "--dry_run"))
  assert "bogus_knob" in line


def test_missing_required_macro(capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], "--dry_run"))
  assert "required macro RUN_DIR is not set" in line


def test_unregistered_task(tmp_path, capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], f"--gin.RUN_DIR='{tmp_path}'",
                                          "--gin.TASK='ict_toyy'", "--dry_run"))
  assert "unknown seqio task or mixture 'ict_toyy'" in line and "ict_toy" in line


def test_unknown_flag(capsys):
  line = _one_config_error(capsys, _train(*DRY_RUNS["toy_ict"], "--no_such_flag"))
  assert "no_such_flag" in line


def test_init_checkpoint_of_another_model_size(tmp_path, capsys):
  small = config_lib.RealmConfig(bert=config_lib.small_bert())
  ict_dir = tmp_path / "ict"
  step_dir = checkpoints.save_checkpoint(
      str(ict_dir), 5, {"retriever": {"w": np.zeros([2], np.float32)}}, config=small)
  line = _one_config_error(capsys, _train(
      *DRY_RUNS["toy_pretrain"][:1], f"--gin.RUN_DIR='{tmp_path / 'pretrain'}'",
      f"--gin.INIT_CHECKPOINT='{step_dir}'", "--dry_run"))
  assert "init_checkpoint" in line and "another model size" in line


def test_build_index_config_error_is_one_line(capsys):
  code = build_index.main(["build_index", "--gin_file=gin_configs/runs/build_index.gin"])
  out, err = _stderr_lines(capsys)
  assert code == 2 and len(err) == 1, err
  assert "required macro" in err[0]
