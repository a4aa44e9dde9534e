"""realm_jax_launch.local.LocalRunner: a recipe's stage run as real processes on this machine
(the jobs here are `python -m zipfile -c OUT SRC`, whose output is a file, and `-t ZIP` of a
missing zip, which fails): its pending jobs
side by side or one after the other, each one's output in its log; a failure named with its
log; a trainer (and builder) stage under run_local."""

import os

import pytest

from launch import local
from realm_jax.pipeline import stages


def _zip_job(tmp_path, name, source="src.txt"):
  out = str(tmp_path / f"{name}.zip")
  return stages.Job("zipfile", f"{name}.log", stages.File(out),
                    flags=("-c", out, str(tmp_path / source)))


def test_a_stages_pending_jobs_run_and_leave_their_outputs(tmp_path, capsys):
  (tmp_path / "src.txt").write_text("x")
  a, b = _zip_job(tmp_path, "a"), _zip_job(tmp_path, "b")
  runner = local.LocalRunner()
  runner.run_stage(stages.Stage("together", (a, b)), str(tmp_path))
  assert a.done() and b.done()
  os.remove(a.output.path)
  runner.run_stage(stages.Stage("one after the other", (a, b), together=False), str(tmp_path))
  assert a.done()
  assert os.path.getsize(tmp_path / "a.log") == 0  # zipfile prints nothing: an empty log
  capsys.readouterr()


def _failing_job(tmp_path, log):
  return stages.Job("zipfile", log, stages.TrainedRun(str(tmp_path / "never")),
                    flags=("-t", str(tmp_path / "missing.zip")))


def test_a_failed_job_is_named_with_its_log(tmp_path):
  with pytest.raises(RuntimeError, match=r"zipfile -t \.\.\. exited with status 1; see "
                                         r".*bad\.log"):
    local.LocalRunner().run_stage(stages.Stage("bad", (_failing_job(tmp_path, "bad.log"),)),
                                  str(tmp_path))
  assert "missing.zip" in (tmp_path / "bad.log").read_text()


def test_a_trainer_stage_runs_under_run_local(tmp_path, capsys):
  (tmp_path / "src.txt").write_text("x")
  trainer = stages.Job("zipfile", "trainer.log", stages.TrainedRun(str(tmp_path)),
                       flags=("-c", str(tmp_path / "t.zip"), str(tmp_path / "src.txt")))
  local.LocalRunner().run_stage(stages.Stage("3 pretraining", (trainer,), pair=True),
                                str(tmp_path / "logs"))
  assert (tmp_path / "t.zip").exists() and (tmp_path / "logs" / "trainer.log").exists()
  failing = _failing_job(tmp_path, "trainer.log")
  with pytest.raises(RuntimeError, match="3 pretraining: exited with status 1; see "):
    local.LocalRunner().run_stage(stages.Stage("3 pretraining", (failing,), pair=True),
                                  str(tmp_path / "logs"))
  capsys.readouterr()
