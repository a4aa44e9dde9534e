"""bench/paper_rehearsal.py: its synthetic queries, its job wired into train_main, and the
phase analysis on hand-made runs (the GPU run itself is not repeated here)."""

import argparse
import os
import sys
import time

import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from bench import paper_rehearsal as rehearsal  # noqa: E402
from realm_jax.data import vocab as vocab_lib  # noqa: E402
from realm_jax.index import builder  # noqa: E402


def test_synthetic_queries_mask_nine_wordpieces_and_resume():
  queries = rehearsal.SyntheticMaskedQueries(4, query_len=12, max_masks=4, seed=3)
  first, second = next(queries), next(queries)
  for key, spec in queries.element_spec().items():
    assert first[key].shape == (4,) + spec.shape and first[key].dtype == spec.dtype, key
  ids, positions = first["query_ids"], first["mlm_positions"]
  assert (ids[:, 0] == vocab_lib.CLS_ID).all() and (ids[:, -1] == vocab_lib.SEP_ID).all()
  assert first["mlm_weights"].tolist() == [[1, 1, 1, 0]] * 4
  for row in range(4):
    real = positions[row, :3]
    assert len(set(real)) == 3 and real.min() >= 1 and real.max() <= 10
    assert (ids[row, real] == vocab_lib.MASK_ID).all()
    assert (first["mlm_targets"][row, :3] >= 1000).all()  # the wordpieces that were there
    assert (np.delete(ids[row], real) != vocab_lib.MASK_ID).all()
  resumed = rehearsal.SyntheticMaskedQueries(4, query_len=12, max_masks=4, seed=3)
  resumed.restore(queries.state())
  again = rehearsal.SyntheticMaskedQueries(4, query_len=12, max_masks=4, seed=3)
  next(again)
  next(again)
  for key in first:
    np.testing.assert_array_equal(next(resumed)[key], next(again)[key])
  assert not np.array_equal(first["query_ids"], second["query_ids"])


def test_the_synthetic_job_builds_in_train_main(tmp_path, capsys):
  from realm_jax import train  # pylint: disable=import-outside-toplevel
  store = str(tmp_path / "blocks")
  rehearsal.write_synthetic_store(store, 64, 32)
  gin_path = tmp_path / "rehearsal.gin"
  gin_path.write_text("\n".join(rehearsal.model_gin_lines("tiny", "float32") + [
      "include 'gin_configs/runs/pretrain.gin'", "train_main.job = @SyntheticPretrainJob()",
      f"SyntheticPretrainJob.block_store = '{store}'", "SyntheticPretrainJob.eval_batches = 0",
      f"RUN_DIR = '{tmp_path / 'run'}'", "TASK = 'synthetic'", "BATCH_SIZE = 8",
      "NUM_STEPS = 10", "INIT_CHECKPOINT = None", "train_main.metrics_format = 'jsonl'"]))
  code = train.main(["realm_jax.train", f"--gin_file={gin_path}", "--dry_run"])
  out, err = capsys.readouterr()
  assert code == 0 and "train: dry run ok (job pretrain, task synthetic" in out, (out, err)


def _args(**overrides):
  values = dict(blocks=1000, block_len=288, batch_size=8, log_every=10, checkpoint_every=50,
                index_check_every=10, builder_batch=256, seconds=100.0, dtype="bfloat16",
                matmul_n=8192, from_json=None, size="base")
  values.update(overrides)
  return argparse.Namespace(**values)


def _run(records, events, refreshed=None):
  from realm_jax.models import config as config_lib  # pylint: disable=import-outside-toplevel
  import dataclasses  # pylint: disable=import-outside-toplevel
  return {"records": records, "builder_events": events, "refreshed": refreshed,
          "launched": 1000.0, "config": dataclasses.asdict(config_lib.RealmConfig()),
          "peak": {"flops_per_s": 1e15}, "trainer_log": "", "builder_log": "",
          "device_kind": "test", "store_seconds": 1.0, "total_seconds": 100.0,
          "outcome": "stopped"}


def _record(step, t, steps_per_s, index_step=0):
  return {"step": step, "time": t, "perf/steps_per_s": steps_per_s,
          "retrieval/index_step": index_step, "retrieval/staleness_steps": step - index_step}


def test_an_unfinished_refresh_is_projected_from_the_builders_last_minute():
  # Alone: 10 steps per 2 s (0.2 s/step wall, 5 steps/s compute); the builder starts at t=1100;
  # beside it: 10 steps per 5 s (0.5 wall, 2.5 steps/s compute).
  records = ([_record(10 * i, 1080.0 + 2 * i, 5.0) for i in range(1, 11)]
             + [_record(100 + 10 * i, 1100.0 + 5 * i, 2.5) for i in range(1, 31)])
  # Progress: 100 blocks at t=1110, 700 at t=1170 (600 blocks in the last 60 s: 10/s).
  events = {"started": {"50": 1100.0},
            "progress": [(1110.0, 100.0, 1000.0, 10.0), (1170.0, 700.0, 1000.0, 9.0)]}
  a = rehearsal.analyse(_run(records, events), _args())
  assert a["alone"]["wall_s"] == pytest.approx(0.2) and a["alone"]["compute_s"] == 0.2
  assert a["beside"]["wall_s"] == pytest.approx(0.5) and a["beside"]["compute_s"] == 0.4
  assert a["alone"]["intervals"] == 9 and a["beside"]["intervals"] == 30
  refresh = a["refresh"]
  assert refresh["step"] == 50 and not refresh["finished"]
  assert refresh["recent_blocks_per_s"] == pytest.approx(10.0)
  # 70 s so far + 300 blocks left at 10/s = 100 s; at 0.5 s/step that is 200 steps.
  assert refresh["projected_seconds"] == pytest.approx(100.0)
  assert refresh["projected_staleness_steps"] == pytest.approx(200.0)
  text = rehearsal.markdown(_run(records, events), a, _args())
  assert "about 100 s (not measured to the end)" in text and "about 200 steps" in text


def test_a_published_refresh_and_its_swap_are_measured():
  records = ([_record(10 * i, 1080.0 + 2 * i, 5.0) for i in range(1, 11)]
             + [_record(100 + 10 * i, 1100.0 + 5 * i, 2.5) for i in range(1, 21)]
             + [_record(310, 1203.0, 5.0, index_step=50)])
  events = {"started": {"50": 1100.0}, "progress": [(1150.0, 1000.0, 1000.0, 20.0)]}
  refreshed = {"step": 50, "published_unix": 1200.0, "build_seconds": 99.0,
               "extra": {"embed_seconds": 90.0, "blocks_per_s": 11.1}}
  a = rehearsal.analyse(_run(records, events, refreshed), _args())
  assert a["refresh"]["finished"] and a["refresh"]["seconds"] == pytest.approx(100.0)
  assert a["swap"] == {"step": 310, "staleness_steps": 260, "age_s": pytest.approx(103.0),
                       "wait_s": pytest.approx(3.0)}
  assert a["beside"]["intervals"] == 20  # not the interval across the publication


def test_builder_events_are_read_from_its_log():
  stamp = lambda s: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s))  # noqa: E731
  log = "\n".join([
      f"{stamp(1_700_000_000)},250 INFO realm_jax.index.builder: waiting for a first "
      "checkpoint ...",
      f"{stamp(1_700_000_010)},500 INFO realm_jax.index.builder: building index 50 from "
      "/r/checkpoints/50: 1000000 blocks of /b, float32, batch 256",
      # The builder's own progress line: 12,800 blocks in 16 s.
      f"{stamp(1_700_000_020)},000 INFO realm_jax.index.builder: embedding: "
      + builder.EmbedProgress(12_800, 1_000_000, 16.0).line()])
  events = rehearsal.builder_events(log)
  assert events["started"] == {50: pytest.approx(1_700_000_010.5)}
  assert events["progress"] == [(pytest.approx(1_700_000_020.0), 12800.0, 1e6, 800.0)]
