"""realm_jax.pipeline.stages and the one binding renderer (gin_utils): bindings written as gin
reads them, checked against hand-written text; a job's command line in order; deferred values
as tokens, read from real run directories when the job starts; every output's check on this
machine agreeing with its shell test (run in bash) on present and absent outputs; a stage's
pending jobs; the plan's text."""

import json
import os
import subprocess

import numpy as np
import pytest

from realm_jax import checkpoints
from realm_jax import gin_utils
from realm_jax.index import store as store_lib
from realm_jax.pipeline import stages


def test_bindings_are_written_as_gin_reads_them():
  assert gin_utils.binding_flags([
      ("RUN_DIR", "/runs/ict"), ("INIT_CHECKPOINT", None), ("NUM_STEPS", 400),
      ("LEARNING_RATE", 1e-4), ("PretrainJob.refresh_in_lockstep", False),
      ("model_config.tiny_bert.layer_norm_eps", 1e-12), ("TASK", gin_utils.GinText("'toy_qa'")),
      ("k_values", (5, 10)), ("TITLE", "it's"), ("build_index_main.poll_seconds", 0.5)]) == [
          "--gin.RUN_DIR='/runs/ict'", "--gin.INIT_CHECKPOINT=None", "--gin.NUM_STEPS=400",
          "--gin.LEARNING_RATE=0.0001", "--gin.PretrainJob.refresh_in_lockstep=False",
          "--gin.model_config.tiny_bert.layer_norm_eps=1e-12", "--gin.TASK='toy_qa'",
          "--gin.k_values=(5, 10)", "--gin.TITLE=\"it's\"",
          "--gin.build_index_main.poll_seconds=0.5"]
  # Double quotes, as the pod's commands write strings (they read better inside a shell's '').
  assert gin_utils.binding("RUN_DIR", "/mnt/realm/ict", quote='"') == 'RUN_DIR="/mnt/realm/ict"'
  assert gin_utils.binding("X", 'say "hi"', quote='"') == "X='say \"hi\"'"
  # What the renderer writes, gin's parser reads back as the value.
  import gin  # pylint: disable=import-outside-toplevel
  for value in ("/runs/ict", None, 400, 1e-4, False, (5, 10), "it's", 'say "hi"'):
    for quote in ("'", '"'):
      assert gin.config.parse_value(gin_utils.gin_value(value, quote=quote)) == value


def test_a_binding_given_as_text_is_kept_as_written():
  assert gin_utils.parse_binding("NUM_STEPS=1") == ("NUM_STEPS", gin_utils.GinText("1"))
  assert gin_utils.parse_binding("TASK='realm_own_random_token'") == (
      "TASK", gin_utils.GinText("'realm_own_random_token'"))
  assert gin_utils.binding_flags([gin_utils.parse_binding("A = 'x=y'")]) == ["--gin.A = 'x=y'"]
  for bad in ("NO_EQUALS", "=1"):
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
      gin_utils.parse_binding(bad)


def test_a_jobs_command_line_gin_files_flags_bindings_then_dry_run():
  job = stages.Job("realm_jax.build_index", "index_0.log", stages.Index("/runs/pretrain"),
                   gin_files=("gin_configs/runs/build_index.gin",), flags=("--once",),
                   bindings=(("RUN_DIR", "/runs/pretrain"), ("BLOCK_STORE", "/data/blocks"),
                             ("build_index_main.checkpoint_dir",
                              stages.LatestCheckpoint("/runs/ict"))),
                   role=stages.BUILDER)
  assert job.argv("python") == [
      "python", "-m", "realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin",
      "--once", "--gin.RUN_DIR='/runs/pretrain'", "--gin.BLOCK_STORE='/data/blocks'",
      "--gin.build_index_main.checkpoint_dir='{latest_checkpoint:/runs/ict}'"]
  assert job.arguments(quote='"')[2:] == [
      '--gin.RUN_DIR="/runs/pretrain"', '--gin.BLOCK_STORE="/data/blocks"',
      '--gin.build_index_main.checkpoint_dir="{latest_checkpoint:/runs/ict}"']
  checked = stages.Job("realm_jax.train", "dry.log", bindings=(("NUM_STEPS", 3),), dry_run=True)
  assert checked.argv("py")[3:] == ["--gin.NUM_STEPS=3", "--dry_run"]
  with pytest.raises(ValueError, match="role='gpu'"):
    stages.Job("realm_jax.train", "x.log", role="gpu")


def _checkpoint(run_dir, step):
  """A finished checkpoint step directory, as `checkpoints.list_checkpoint_steps` reads one."""
  path = checkpoints.checkpoint_path(str(run_dir), step)
  os.makedirs(os.path.join(path, checkpoints.METADATA_ITEM))
  open(os.path.join(path, "_CHECKPOINT_METADATA"), "w").close()


def test_deferred_values_are_read_from_the_runs_when_the_job_starts(tmp_path):
  ict, pretrain = tmp_path / "ict", tmp_path / "pretrain"
  job = stages.Job("realm_jax.train", "t.log", bindings=(
      ("INIT_CHECKPOINT", stages.LatestCheckpoint(str(ict))),
      ("ENCODER_CHECKPOINT", stages.BestCheckpoint(str(pretrain))),
      ("evaluate_main.index_step", stages.LatestIndex(str(pretrain)))))
  argv = job.argv("py")
  assert argv[3:] == [f"--gin.INIT_CHECKPOINT='{{latest_checkpoint:{ict}}}'",
                      f"--gin.ENCODER_CHECKPOINT='{{best_checkpoint:{pretrain}}}'",
                      f"--gin.evaluate_main.index_step={{latest_index:{pretrain}}}"]
  with pytest.raises(RuntimeError, match="no finished checkpoint"):
    stages.resolve_tokens(argv)
  for step in (100, 400):
    _checkpoint(ict, step)
  for step in (80, 160):
    _checkpoint(pretrain, step)
  (pretrain / "best.json").write_text(json.dumps({"metric": "eval/retrieval/utility",
                                                  "mode": "max", "step": 80, "value": 0.5}))
  store_lib.publish_index(str(pretrain), 160, np.zeros((3, 2), np.float32), block_store_id="b")
  assert stages.resolve_tokens(argv)[3:] == [
      f"--gin.INIT_CHECKPOINT='{ict}/checkpoints/400'",
      f"--gin.ENCODER_CHECKPOINT='{pretrain}/checkpoints/80'",
      "--gin.evaluate_main.index_step=160"]
  assert stages.BestCheckpoint(str(pretrain)).choice() == (
      80, "best by eval/retrieval/utility=0.5 in best.json")
  assert stages.resolve_tokens(["{not_a_kind:/x}", "{'a': 1}"]) == ["{not_a_kind:/x}", "{'a': 1}"]


def _shell(test):
  return subprocess.run(["bash", "-c", test], check=False).returncode == 0


def test_each_outputs_check_agrees_with_its_shell_test(tmp_path):
  run = tmp_path / "run dir"  # a space: the shell tests quote their paths
  outputs = [stages.TrainedRun(str(run)), stages.Index(str(run)), stages.Checkpoint(str(run)),
             stages.Checkpoint(str(run), 0), stages.File(str(run / "metrics.json"))]
  for output in outputs:
    assert not output.exists() and not _shell(output.shell_test()), output
  run.mkdir()
  (run / "TRAINING_DONE").write_text("{}")
  _checkpoint(run, 0)
  store_lib.publish_index(str(run), 0, np.zeros((2, 2), np.float32), block_store_id="b")
  (run / "metrics.json").write_text("{}")
  for output in outputs:
    assert output.exists() and _shell(output.shell_test()), output
  # Checkpoint 0 is no longer the newest: this machine's check says so, the shell's cannot.
  _checkpoint(run, 5)
  assert not stages.Checkpoint(str(run), 0).exists()
  # The index of the newest checkpoint: no shell test (the job runs again on a pod).
  latest = stages.Index(str(run), of_latest_checkpoint=True)
  assert not latest.exists() and latest.shell_test() is None
  store_lib.publish_index(str(run), 5, np.zeros((2, 2), np.float32), block_store_id="b")
  assert latest.exists()


def test_a_stage_runs_its_pending_jobs_and_is_done_when_its_outputs_exist(tmp_path):
  a, b = (stages.Job("zipfile", f"{n}.log", stages.File(str(tmp_path / f"{n}.zip")))
          for n in ("a", "b"))
  stage = stages.Stage("two", (a, b))
  assert stage.pending() == (a, b) and not stage.done()
  (tmp_path / "a.zip").write_text("")
  assert stage.pending() == (b,) and not stage.done()
  (tmp_path / "b.zip").write_text("")
  assert stage.pending() == () and stage.done()
  # Jobs that leave nothing to check (dry runs): the stage's own check, all of them pending.
  checks = stages.Stage("checks", (a, b), done_when=stages.Checkpoint(str(tmp_path / "ict")))
  assert checks.pending() == (a, b) and not checks.done()
  _checkpoint(tmp_path / "ict", 10)
  assert checks.done() and checks.outputs() == (stages.Checkpoint(str(tmp_path / "ict")),)
  with pytest.raises(ValueError, match="pair=True"):
    stages.Stage("x", (a,), builder=b)


def test_the_plan_as_text():
  trainer = stages.Job("realm_jax.train", "trainer.log", stages.TrainedRun("/r/pretrain"),
                       gin_files=("p.gin",),
                       bindings=(("RUN_DIR", "/r/pretrain"),
                                 ("INIT_CHECKPOINT", stages.LatestCheckpoint("/r/ict"))),
                       inputs=("{latest_checkpoint:/r/ict}",), role=stages.TRAINER)
  builder = stages.Job("realm_jax.build_index", "builder.log", gin_files=("b.gin",),
                       bindings=(("RUN_DIR", "/r/pretrain"),), role=stages.BUILDER)
  text = stages.describe([stages.Stage("3 pretraining", (trainer,), builder=builder, pair=True)],
                         log_dir="/r/logs")
  assert text.splitlines() == [
      "3 pretraining [trainer + index builder]",
      "  reads:  {latest_checkpoint:/r/ict}",
      "  writes: /r/pretrain (trained: TRAINING_DONE)",
      "  $ python -m realm_jax.train --gin_file=p.gin --gin.RUN_DIR=\"'/r/pretrain'\" "
      "--gin.INIT_CHECKPOINT=\"'{latest_checkpoint:/r/ict}'\" > /r/logs/trainer.log",
      "  $ python -m realm_jax.build_index --gin_file=b.gin --gin.RUN_DIR=\"'/r/pretrain'\" "
      "> /r/logs/builder.log"]


@pytest.mark.parametrize("arg", ["--gin.RUN_DIR='/tmp/x'", "--gin.X=1", "it's", "$HOME/x",
                                 'a"b', "--gin.K={'a': 1}", "plain"])
def test_shell_words_read_back_as_the_argument(arg):
  import shlex  # pylint: disable=import-outside-toplevel
  assert shlex.split(stages.shell_word(arg)) == [arg]
  assert subprocess.run(["bash", "-c", "printf %s " + stages.shell_word(arg)],
                        capture_output=True, text=True, check=True).stdout == arg
