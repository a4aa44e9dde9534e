"""Acceptance (issue 4): two processes on one machine, a stand-in trainer saving checkpoints and
the index builder (`python -m realm_jax.build_index`), show at least three published refreshes
picked up by the trainer, with the staleness metrics logged; both exit 0 on TRAINING_DONE."""

import json
import os
import subprocess
import sys
import time

from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib
from realm_jax.index import store as store_lib
from realm_jax import checkpoints as ckpt

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin_trainer.py")
TIMEOUT = 90.0  # for the whole exchange; a normal run takes well under half of it


def _run_builder_and_trainer(tmp_path, *trainer_args):
  """Runs the builder and the stand-in trainer to the end: (metrics records, builder output,
  trainer output, run directory)."""
  src = tmp_path / "docs.jsonl"
  with open(src, "w", encoding="utf-8") as f:
    for i in range(6):
      f.write(json.dumps({"title": f"Topic {i}", "text": " ".join(
          f"Sentence {j} about topic {i} is here." for j in range(4))}) + "\n")
  corpus_build.build_block_store(sources_lib.JsonlSource(str(src)), str(tmp_path / "blocks"),
                                 max_block_len=32)
  run_dir, metrics = str(tmp_path / "run"), str(tmp_path / "metrics.jsonl")
  env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))

  builder_log = open(tmp_path / "builder.out", "w+", encoding="utf-8")
  trainer_log = open(tmp_path / "trainer.out", "w+", encoding="utf-8")
  # Started first: it must wait for the trainer's first checkpoint, saying so.
  builder = subprocess.Popen(
      [sys.executable, "-m", "realm_jax.build_index",
       "--gin_file=gin_configs/runs/build_index.gin", f"--gin.RUN_DIR='{run_dir}'",
       f"--gin.BLOCK_STORE='{tmp_path / 'blocks'}'", "--gin.build_index_main.poll_seconds=0.1",
       "--gin.build_index_main.batch_size=8"],
      cwd=REPO_ROOT, env=env, stdout=builder_log, stderr=subprocess.STDOUT, text=True)
  trainer = None
  deadline = time.monotonic() + TIMEOUT
  try:
    # The trainer starts once the builder says it is waiting (so that message is always seen).
    while "waiting for a first checkpoint in" not in (tmp_path / "builder.out").read_text():
      assert builder.poll() is None, (tmp_path / "builder.out").read_text()[-3000:]
      assert time.monotonic() < deadline, "the builder never said it was waiting"
      time.sleep(0.05)
    trainer = subprocess.Popen(
        [sys.executable, TRAINER, "--run_dir", run_dir, "--block_store",
         str(tmp_path / "blocks"), "--metrics", metrics, "--min_refreshes", "3", "--timeout",
         str(TIMEOUT), *trainer_args],
        cwd=REPO_ROOT, env=env, stdout=trainer_log, stderr=subprocess.STDOUT, text=True)
    for proc in (trainer, builder):
      proc.wait(timeout=max(1.0, deadline - time.monotonic()))
  finally:
    for proc in (trainer, builder):
      if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    builder_log.seek(0)
    trainer_log.seek(0)
    builder_out, trainer_out = builder_log.read(), trainer_log.read()
    builder_log.close()
    trainer_log.close()
  assert trainer.returncode == 0, trainer_out[-3000:]
  assert builder.returncode == 0, builder_out[-3000:]
  records = [json.loads(line) for line in open(metrics, encoding="utf-8")]
  assert records, trainer_out
  return records, builder_out, trainer_out, run_dir


def _published_steps(builder_out):
  return [int(line.split()[4]) for line in builder_out.splitlines()
          if line.startswith("build_index: published index step")]


def test_builder_and_standin_trainer_refresh_three_times(tmp_path):
  records, builder_out, _, run_dir = _run_builder_and_trainer(tmp_path)
  index_steps = [r["retrieval/index_step"] for r in records]
  picked_up = sorted(set(index_steps))
  # The first index (built from the step-0 checkpoint) plus at least three refreshes.
  assert len(picked_up) >= 4 and picked_up[0] == 0, picked_up
  assert records[-1]["retrieval/refreshes"] >= 3
  assert index_steps == sorted(index_steps), "the trainer went back to an older index"
  for r in records:
    assert set(r) >= {"step", "retrieval/index_step", "retrieval/staleness_steps",
                      "retrieval/staleness_seconds", "retrieval/refreshes"}
    assert r["retrieval/staleness_steps"] == r["step"] - r["retrieval/index_step"] >= 0
    assert r["retrieval/staleness_seconds"] >= 0
  # Every index the trainer used is one of its periodic checkpoints (step 0 or every 4 steps).
  assert all(s % 4 == 0 for s in picked_up), picked_up

  # The builder said it was waiting, published each refresh on stdout, and indexed the last
  # checkpoint before exiting on TRAINING_DONE.
  assert ckpt.training_done(run_dir)
  assert "waiting for a first checkpoint in" in builder_out
  assert len(_published_steps(builder_out)) >= 4, builder_out[-3000:]
  assert store_lib.latest_index_step(run_dir) == ckpt.latest_checkpoint_step(run_dir)
  assert "build_index: done" in builder_out


def test_a_builder_slower_than_the_checkpoint_cadence_still_refreshes(tmp_path):
  # A checkpoint every step, only the newest kept: every index the builder publishes was built
  # from a checkpoint the trainer has already pruned, as at paper scale, where embedding the
  # corpus takes longer than the trainer's checkpoint interval. The trainer loads each index
  # with its real loader, which needs the query tower the index was built with.
  records, builder_out, trainer_out, _ = _run_builder_and_trainer(
      tmp_path, "--save_every", "1", "--keep", "1", "--query_tower")
  picked_up = sorted({r["retrieval/index_step"] for r in records})
  assert len(picked_up) >= 4 and picked_up[0] == 0, picked_up
  assert "Not swapping in index" not in trainer_out, trainer_out[-3000:]
  # Every index the trainer swapped in is one the builder published, taken in order. (An index
  # published while the trainer was busy may be passed over for a newer one: the watcher takes
  # the newest there is, so which ones are skipped depends on the machine's load.)
  published = _published_steps(builder_out)
  assert set(picked_up) <= set(published), (published, picked_up)
  index_steps = [r["retrieval/index_step"] for r in records]
  assert index_steps == sorted(index_steps), index_steps
  # ... though the checkpoints of the refreshes were gone when they were in use.
  refreshed = [r for r in records if r["retrieval/index_step"] > 0]
  assert refreshed and not any(r["checkpoint_present"] for r in refreshed)
