"""Acceptance: two processes under jax.distributed (gloo CPU collectives) train like one.

Two local processes (tests/training/train_child.py), each with 2 fake CPU devices, join one
`jax.distributed` job (coordinator on 127.0.0.1, a free port, num_processes=2) and train the
tiny ICT model (one layer) for 3 steps on a global ("data": 4) mesh, each process feeding its
contiguous half of every global batch of 8 (`partitioning.shard_batch` assembles the global
arrays with `jax.make_array_from_process_local_data`). A third process trains the same 3 steps
alone on 4 devices with the whole batches. The logged losses agree (rtol 1e-5: the only
difference is where the cross-device sums are reduced, in-process or over gloo); the in-batch
softmax spans both hosts' examples, so a process that saw only its own half would log a
different loss.

The final checkpoint (step 3) is written by both processes together (Orbax, multi-process) and
records each process's input position.
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from realm_jax import checkpoints as ckpt

import train_child

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_child.py")


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _losses(path):
  with open(path, encoding="utf-8") as f:
    return {r["step"]: r["train/loss"] for r in map(json.loads, f) if "train/loss" in r}


def test_two_processes_log_the_same_losses_as_one(tmp_path):
  cache = str(tmp_path / "jax_cache")
  # One transformer layer (tiny has two): the property does not depend on depth, and three
  # processes compiling at once on a small CPU is most of this test's time.
  common = ["--num_steps", "3", "--checkpoint_every", "3", "--batch", "8", "--mesh", "4,1",
            "--num_layers", "1"]
  port = _free_port()
  procs = []
  for pid in (0, 1):
    log = open(tmp_path / f"w{pid}.log", "w", encoding="utf-8")  # noqa: SIM115
    procs.append((subprocess.Popen(
        [sys.executable, CHILD, "--run_dir", str(tmp_path / "multi"), *common,
         "--metrics", str(tmp_path / f"w{pid}.jsonl"), "--coordinator", f"127.0.0.1:{port}",
         "--num_processes", "2", "--process_id", str(pid)],
        env=train_child.child_env(devices=2, cache_dir=cache), stdout=log,
        stderr=subprocess.STDOUT), log, f"w{pid}"))
  log = open(tmp_path / "single.log", "w", encoding="utf-8")  # noqa: SIM115
  procs.append((subprocess.Popen(
      [sys.executable, CHILD, "--run_dir", str(tmp_path / "single"), *common,
       "--metrics", str(tmp_path / "single.jsonl")],
      env=train_child.child_env(devices=4, cache_dir=cache), stdout=log,
      stderr=subprocess.STDOUT), log, "single"))
  try:
    for proc, log, name in procs:
      rc = proc.wait(timeout=300)
      log.close()
      with open(tmp_path / f"{name}.log", encoding="utf-8") as f:
        text = f.read()
      assert rc == 0, f"{name} exited {rc}:\n{text[-4000:]}"
      assert "CHILD DONE 3" in text, text[-2000:]
  finally:
    for proc, log, _ in procs:
      if proc.poll() is None:
        proc.kill()
      log.close()

  single = _losses(tmp_path / "single.jsonl")
  assert sorted(single) == [1, 2, 3]
  for worker in ("w0", "w1"):
    multi = _losses(tmp_path / f"{worker}.jsonl")
    assert sorted(multi) == [1, 2, 3]
    np.testing.assert_allclose([multi[s] for s in (1, 2, 3)], [single[s] for s in (1, 2, 3)],
                               rtol=1e-5, atol=0)
  # The losses change from step to step (the parameters were updated on both hosts alike).
  assert len({round(single[s], 6) for s in (1, 2, 3)}) > 1

  multi_run = tmp_path / "multi"
  assert ckpt.list_checkpoint_steps(multi_run) == [3] and ckpt.training_done(multi_run)
  data_state, _, _ = ckpt.restore_params(multi_run, 3, item="data_state")
  assert data_state == {"num_processes": 2, "per_process": [{"position": 3}, {"position": 3}]}
