"""realm_jax_launch.tpu_pod run, the recipe: every stage of REALM at paper scale on the two
slices. Its dry run for a two-host trainer slice against gcloud commands written out by hand;
its stages run in order, a failed one stopping the workers (gcloud faked); worker-exec reading
a recipe's deferred values from the shared run directories before the entry point."""

import os
import shlex
import subprocess
import sys
import types

import pytest

from launch import local
from launch import tpu_pod

ZONE = "us-central2-b"
RECIPE = ["run", f"--zone={ZONE}", "--out=/mnt/realm/runs", "--bert=/mnt/realm/bert-base-uncased",
          "--block_store=/mnt/realm/data/wiki_blocks", "--trainer_hosts=2"]
PY = '"$HOME/realm_venv/bin/python" -m realm_jax_launch.tpu_pod worker-exec'
GO_TRAINER = "cd $HOME/realm_jax && echo $$ > $HOME/.realm_jax_trainer.pid && exec"
GO_BUILDER = "cd $HOME/realm_jax && echo $$ > $HOME/.realm_jax_builder.pid && exec"
STORE = "'--gin.BLOCK_STORE=\"/mnt/realm/data/wiki_blocks\"'"


def _ssh(tpu, worker, command):
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu, f"--worker={worker}",
          f"--command={command}", f"--zone={ZONE}"]


# Every stage, in order, as written by hand: its slice, its workers, its remote shell line.
EXPECTED = [
    "# 0 the BERT (converted from its transformers files)",
    _ssh("realm-builder", "0",
         "if ls /mnt/realm/runs/bert/checkpoints/0/_CHECKPOINT_METADATA >/dev/null 2>&1; "
         "then echo 'already done, skipped: /mnt/realm/runs/bert (checkpoint 0)'; exit 0; fi; "
         f"{GO_BUILDER} env JAX_PLATFORMS=cpu {PY} --no-jax_distributed realm_jax.convert.hf "
         "--hf_dir=/mnt/realm/bert-base-uncased --run_dir=/mnt/realm/runs/bert"),
    "# 1 warm start (wiki_ict.gin)",
    _ssh("realm-trainer", "all",
         "if test -f /mnt/realm/runs/ict/TRAINING_DONE; then echo 'already done, skipped: "
         "/mnt/realm/runs/ict (trained: TRAINING_DONE)'; exit 0; fi; "
         f"{GO_TRAINER} {PY} realm_jax.train --gin_file=gin_configs/experiments/wiki_ict.gin "
         "'--gin.RUN_DIR=\"/mnt/realm/runs/ict\"' "
         "'--gin.INIT_CHECKPOINT=\"/mnt/realm/runs/bert/checkpoints/0\"' "
         f"{STORE} --gin.BATCH_SIZE=2048"),
    "# 2 first index (from the warm start's checkpoint)",
    _ssh("realm-builder", "all",
         "if ls /mnt/realm/runs/pretrain/index/[0-9]*/manifest.json >/dev/null 2>&1; then echo "
         "'already done, skipped: /mnt/realm/runs/pretrain/index (published)'; exit 0; fi; "
         f"{GO_BUILDER} {PY} realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
         f"--once '--gin.RUN_DIR=\"/mnt/realm/runs/pretrain\"' {STORE} "
         "'--gin.build_index_main.checkpoint_dir=\"{latest_checkpoint:/mnt/realm/runs/ict}\"'"),
    "# 3 REALM pretraining + index builder (two processes)",
    _ssh("realm-trainer", "all",
         "if test -f /mnt/realm/runs/pretrain/TRAINING_DONE; then echo 'already done, skipped: "
         "/mnt/realm/runs/pretrain (trained: TRAINING_DONE)'; exit 0; fi; "
         f"{GO_TRAINER} {PY} realm_jax.train "
         "--gin_file=gin_configs/experiments/wiki_pretrain.gin "
         "'--gin.RUN_DIR=\"/mnt/realm/runs/pretrain\"' "
         "'--gin.INIT_CHECKPOINT=\"{latest_checkpoint:/mnt/realm/runs/ict}\"' "
         "'--gin.ENCODER_CHECKPOINT=\"/mnt/realm/runs/bert/checkpoints/0\"' "
         f"{STORE} --gin.BATCH_SIZE=256"),
    _ssh("realm-builder", "all",
         "if test -f /mnt/realm/runs/pretrain/TRAINING_DONE; then echo 'already done, skipped: "
         "/mnt/realm/runs/pretrain (trained: TRAINING_DONE)'; exit 0; fi; "
         f"{GO_BUILDER} {PY} realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
         f"'--gin.RUN_DIR=\"/mnt/realm/runs/pretrain\"' {STORE}"),
    "# 4 frozen indexes for fine-tuning (REALM's from best.json's pretraining checkpoint, the "
    "ORQA-style baseline's from ICT's)",
    _ssh("realm-builder", "all",
         "if ls /mnt/realm/runs/finetune/index/[0-9]*/manifest.json >/dev/null 2>&1; then echo "
         "'already done, skipped: /mnt/realm/runs/finetune/index (published)'; exit 0; fi; "
         f"{GO_BUILDER} {PY} realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
         f"--once '--gin.RUN_DIR=\"/mnt/realm/runs/finetune\"' {STORE} "
         "'--gin.build_index_main.checkpoint_dir=\"{best_checkpoint:/mnt/realm/runs/pretrain}\"'"),
    _ssh("realm-builder", "all",
         "if ls /mnt/realm/runs/orqa/index/[0-9]*/manifest.json >/dev/null 2>&1; then echo "
         "'already done, skipped: /mnt/realm/runs/orqa/index (published)'; exit 0; fi; "
         f"{GO_BUILDER} {PY} realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin "
         f"--once '--gin.RUN_DIR=\"/mnt/realm/runs/orqa\"' {STORE} "
         "'--gin.build_index_main.checkpoint_dir=\"{latest_checkpoint:/mnt/realm/runs/ict}\"'"),
    "# 5 open-QA fine-tuning on nq_open (REALM and the ORQA-style baseline, one after the other)",
    _ssh("realm-trainer", "all",
         "if test -f /mnt/realm/runs/finetune/TRAINING_DONE; then echo 'already done, skipped: "
         "/mnt/realm/runs/finetune (trained: TRAINING_DONE)'; exit 0; fi; "
         f"{GO_TRAINER} {PY} realm_jax.train --gin_file=gin_configs/experiments/nq_finetune.gin "
         "'--gin.RUN_DIR=\"/mnt/realm/runs/finetune\"' "
         "'--gin.INIT_CHECKPOINT=\"{best_checkpoint:/mnt/realm/runs/pretrain}\"' "
         f"{STORE} --gin.BATCH_SIZE=8"),
    _ssh("realm-trainer", "all",
         "if test -f /mnt/realm/runs/orqa/TRAINING_DONE; then echo 'already done, skipped: "
         "/mnt/realm/runs/orqa (trained: TRAINING_DONE)'; exit 0; fi; "
         f"{GO_TRAINER} {PY} realm_jax.train --gin_file=gin_configs/experiments/nq_finetune.gin "
         "'--gin.RUN_DIR=\"/mnt/realm/runs/orqa\"' "
         "'--gin.INIT_CHECKPOINT=\"{latest_checkpoint:/mnt/realm/runs/ict}\"' "
         "'--gin.ENCODER_CHECKPOINT=\"/mnt/realm/runs/bert/checkpoints/0\"' "
         f"{STORE} --gin.BATCH_SIZE=8"),
    "# 6 evaluation on nq_open's test split (REALM and the ORQA-style baseline)",
    _ssh("realm-builder", "0",
         "if test -e /mnt/realm/runs/eval/nq_open_test.metrics.json; then echo 'already done, "
         "skipped: /mnt/realm/runs/eval/nq_open_test.metrics.json'; exit 0; fi; "
         f"{GO_BUILDER} env JAX_PLATFORMS=cpu {PY} --no-jax_distributed realm_jax.evaluate "
         "--gin_file=gin_configs/models/base.gin --gin_file=gin_configs/runs/eval.gin "
         "'--gin.RUN_DIR=\"/mnt/realm/runs/finetune\"' '--gin.evaluate_main.split=\"test\"' "
         "'--gin.evaluate_main.output=\"/mnt/realm/runs/eval/nq_open_test.jsonl\"' "
         "'--gin.TASK=\"nq_open\"' "
         "'--gin.evaluate_main.block_store=\"/mnt/realm/data/wiki_blocks\"'"),
    _ssh("realm-builder", "0",
         "if test -e /mnt/realm/runs/eval/nq_open_orqa_test.metrics.json; then echo 'already "
         "done, skipped: /mnt/realm/runs/eval/nq_open_orqa_test.metrics.json'; exit 0; fi; "
         f"{GO_BUILDER} env JAX_PLATFORMS=cpu {PY} --no-jax_distributed realm_jax.evaluate "
         "--gin_file=gin_configs/models/base.gin --gin_file=gin_configs/runs/eval.gin "
         "'--gin.RUN_DIR=\"/mnt/realm/runs/orqa\"' '--gin.evaluate_main.split=\"test\"' "
         "'--gin.evaluate_main.output=\"/mnt/realm/runs/eval/nq_open_orqa_test.jsonl\"' "
         "'--gin.TASK=\"nq_open\"' "
         "'--gin.evaluate_main.block_store=\"/mnt/realm/data/wiki_blocks\"'"),
    "# when a stage fails, or on Ctrl-C:",
    _ssh("realm-trainer", "all",
         "pid=$(cat $HOME/.realm_jax_trainer.pid 2>/dev/null) && grep -qa realm_jax "
         "/proc/$pid/cmdline 2>/dev/null && kill -INT $pid && echo \"sent SIGINT to the "
         "trainer (pid $pid) on $(hostname)\"; true"),
    _ssh("realm-builder", "all",
         "pid=$(cat $HOME/.realm_jax_builder.pid 2>/dev/null) && grep -qa realm_jax "
         "/proc/$pid/cmdline 2>/dev/null && kill -INT $pid && echo \"sent SIGINT to the "
         "builder (pid $pid) on $(hostname)\"; true"),
]


def test_the_recipes_dry_run_on_a_two_host_trainer_slice_lists_every_stage(no_subprocess,
                                                                            capsys):
  assert tpu_pod.main([*RECIPE, "--dry-run"]) == 0
  lines = capsys.readouterr().out.splitlines()
  printed = [line if line.startswith("#") else shlex.split(line) for line in lines]
  assert len(printed) == len(EXPECTED)
  for got, expected in zip(printed, EXPECTED):
    assert got == expected


@pytest.mark.parametrize("extra,message", [
    (["--detach"], "--detach: flags of the trainer and builder alone"),
    (["--first_index_from=/mnt/realm/ict/checkpoints/1"], "--first_index_from: flags of"),
    (["--out=gs://bucket/runs"], "URLs do not work"),
    (["--bert=relative/bert"], "absolute path"),
    (["--trainer_hosts=3"], "3 hosts: the global batch of ict, pretrain, finetune"),
])
def test_the_recipes_usage_errors(no_subprocess, capsys, extra, message):
  argv = [a for a in RECIPE if a.split("=")[0] not in [e.split("=")[0] for e in extra]]
  assert tpu_pod.main([*argv, *extra, "--dry-run"]) == 2
  assert message in capsys.readouterr().err
  assert tpu_pod.main(["run", f"--zone={ZONE}", "--block_store=/b", "--dry-run"]) == 2
  assert "needs --out and --bert" in capsys.readouterr().err


def test_the_recipes_stages_run_in_order_and_a_failure_stops_the_workers(monkeypatch,
                                                                         tmp_path, capsys):
  calls, pairs = [], []

  def run(cmd, check=False):
    del check
    calls.append(cmd)
    failed = "--gin_file=gin_configs/experiments/nq_finetune.gin" in cmd[7] and "orqa" in cmd[7]
    return subprocess.CompletedProcess(cmd, 1 if failed else 0)

  def run_local(trainer_cmd, builder_cmd, **kwargs):
    pairs.append((trainer_cmd, builder_cmd, kwargs["log_dir"]))
    return 0

  monkeypatch.setattr(subprocess, "run", run)
  monkeypatch.setattr(local, "run_local", run_local)
  assert tpu_pod.main([*RECIPE, f"--log_dir={tmp_path}"]) == 1
  commands = [cmd for cmd in EXPECTED if not isinstance(cmd, str)]
  # Stages 0-2 one command after the other, the pair under run_local, then stages 4 and 5 up to
  # the failed fine-tuning of the baseline; then the stop on both slices.
  assert calls == [*commands[:3], *commands[5:9], *commands[11:]]
  assert pairs == [(commands[3], commands[4], str(tmp_path))]
  assert "failed with status 1" in capsys.readouterr().err


def test_worker_exec_reads_the_recipes_deferred_values_before_the_entry_point(monkeypatch,
                                                                               tmp_path,
                                                                               capsys):
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  step = checkpoints.checkpoint_path(str(tmp_path / "ict"), 300)
  os.makedirs(os.path.join(step, checkpoints.METADATA_ITEM))
  open(os.path.join(step, "_CHECKPOINT_METADATA"), "w").close()
  events = []
  fake_jax = types.ModuleType("jax")
  fake_jax.distributed = types.SimpleNamespace(initialize=lambda: events.append("initialize"))
  monkeypatch.setitem(sys.modules, "jax", fake_jax)
  (tmp_path / "fake_recipe_entry.py").write_text("import sys\nprint('entry', sys.argv[1:])\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(sys, "argv", list(sys.argv))
  token = f'--gin.INIT_CHECKPOINT="{{latest_checkpoint:{tmp_path}/ict}}"'
  assert tpu_pod.main(["worker-exec", "--no-jax_distributed", "fake_recipe_entry", token]) == 0
  assert events == []  # one process: no distributed runtime
  assert f"""entry ['--gin.INIT_CHECKPOINT="{step}"']""" in capsys.readouterr().out
  assert tpu_pod.main(["worker-exec", "fake_recipe_entry", "--once"]) == 0
  assert events == ["initialize"]
