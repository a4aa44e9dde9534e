"""Acceptance: 20 steps straight == 10 steps + kill -9 + resume to 20, bit for bit.

Three processes (tests/training/train_child.py, the tiny ICT model, checkpoints every 5 steps):
  A: 20 steps straight.
  B: the same run, paused by a hook at the boundary before step 11 and killed with SIGKILL as
     soon as checkpoint 10 is listed (finished); it never gets to write TRAINING_DONE.
  C: a new process in B's run directory: resumes from checkpoint 10 (params, optimizer state,
     step, RNG, input position) and trains to 20.
A and C must end with identical parameters and optimizer states (np.array_equal on every
leaf) and log identical losses for steps 11-20. A and B run concurrently; a persistent
compilation cache shared by the children lets C reuse their compiled step.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from realm_jax import checkpoints as ckpt

import train_child

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_child.py")


def _start(run_dir, *extra, env, log_path):
  log_file = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by the caller
  command = [sys.executable, CHILD, "--run_dir", str(run_dir), "--num_steps", "20",
             "--checkpoint_every", "5", "--keep", "2", *extra]
  return subprocess.Popen(command, env=env, stdout=log_file, stderr=subprocess.STDOUT), log_file


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def _losses(path):
  with open(path, encoding="utf-8") as f:
    return {r["step"]: r["train/loss"] for r in map(json.loads, f) if "train/loss" in r}


def _wait_ok(proc, log_file, log_path, timeout=240):
  rc = proc.wait(timeout=timeout)
  log_file.close()
  assert rc == 0, f"child exited {rc}:\n{_read(log_path)[-4000:]}"


def test_kill_and_resume_gives_identical_parameters(tmp_path):
  env = train_child.child_env(devices=1, cache_dir=str(tmp_path / "jax_cache"))
  straight, killed = tmp_path / "straight", tmp_path / "killed"
  a, a_log = _start(straight, "--dump", str(tmp_path / "a.npz"), "--metrics",
                    str(tmp_path / "a.jsonl"), env=env, log_path=tmp_path / "a.log")
  b, b_log = _start(killed, "--pause_before_step", "11", "--metrics", str(tmp_path / "b.jsonl"),
                    env=env, log_path=tmp_path / "b.log")
  try:
    deadline = time.monotonic() + 240
    while 10 not in ckpt.list_checkpoint_steps(killed):
      assert b.poll() is None, f"child B exited early:\n{_read(tmp_path / 'b.log')[-4000:]}"
      assert time.monotonic() < deadline, "checkpoint 10 never appeared"
      time.sleep(0.05)
    os.kill(b.pid, signal.SIGKILL)
    assert b.wait(timeout=30) == -signal.SIGKILL
  finally:
    if b.poll() is None:
      b.kill()
    b_log.close()
  assert "CHILD PAUSED before step 11" in _read(tmp_path / "b.log")
  assert ckpt.latest_checkpoint_step(killed) == 10 and not ckpt.training_done(killed)
  assert max(_losses(tmp_path / "b.jsonl")) == 10  # it never ran step 11

  c, c_log = _start(killed, "--dump", str(tmp_path / "c.npz"), "--metrics",
                    str(tmp_path / "c.jsonl"), env=env, log_path=tmp_path / "c.log")
  _wait_ok(c, c_log, tmp_path / "c.log")
  _wait_ok(a, a_log, tmp_path / "a.log")
  assert "resumed from checkpoint 10 (input position {'position': 10})" in _read(
      tmp_path / "c.log")
  assert "CHILD DONE 20" in _read(tmp_path / "a.log") and "CHILD DONE 20" in _read(
      tmp_path / "c.log")

  with np.load(tmp_path / "a.npz") as straight_state, np.load(tmp_path / "c.npz") as resumed:
    assert sorted(straight_state.files) == sorted(resumed.files)
    assert any(name.startswith("['opt_state']") for name in straight_state.files)
    for name in straight_state.files:
      assert np.array_equal(straight_state[name], resumed[name]), name
    assert int(resumed["['step']"]) == 20
  # The same batches and dropout after the restart: identical losses, step for step.
  straight_losses, resumed_losses = _losses(tmp_path / "a.jsonl"), _losses(tmp_path / "c.jsonl")
  assert sorted(resumed_losses) == list(range(11, 21))
  assert all(resumed_losses[s] == straight_losses[s] for s in range(11, 21))
  # Both runs finished cleanly: keep=2 newest, marker written.
  for run in (straight, killed):
    assert ckpt.list_checkpoint_steps(run) == [15, 20] and ckpt.training_done(run)
