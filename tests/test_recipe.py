"""The main job's driver (`python -m realm_jax.recipe`): its console filter, its result table,
what ICT starts from and the children's environment; what the benches' rows ask of it (the
fine-tuning slot's retriever and reader, the never-refreshed row's final index, a warm start
continuing a checkpoint) and the warm starts those rows rely on.
The recipe itself runs for minutes (README command one); its stages are the entry points, each
tested on its own (tests/test_entry_points.py, tests/test_evaluate_main.py, tests/index)."""

import io
import os
import signal
import subprocess
import sys
import time

import pytest

from realm_jax import recipe
from realm_jax import toy_bert

SHIPPED_BERT = toy_bert.SHIPPED_DIR  # a real BERT directory: its config.json sizes the towers


def test_progress_filter_keeps_progress_lines_only_and_strips_log_prefixes():
  out = io.StringIO()
  console = recipe._Progress(out)  # pylint: disable=protected-access
  console.write("2026-11-21 08:20:01,123 INFO realm_jax.training.trainer: step 20/600 (3.3%) | "
                "5.27 steps/s\nsome chatter\n[builder] 2026-11-21 08:20:02,000 INFO "
                "realm_jax.index.builder: published index 20 at /x/index/20 in 8.4s\npartial ")
  console.write("line: done\n")
  assert out.getvalue().splitlines() == [
      "step 20/600 (3.3%) | 5.27 steps/s",
      "[builder] published index 20 at /x/index/20 in 8.4s",
      "partial line: done"]


def test_table_lists_every_figure_the_main_job_promises():
  summary = {"mlm_accuracy_null_only": 0.05, "mlm_accuracy_realm": 0.61,
             "retrieval_utility_first": 0.01, "retrieval_utility_last": 1.5,
             "qa_em_null_only": 0.0, "qa_em_realm": 0.42, "qa_em_orqa": 0.25,
             "recall@5_before": 0.3,
             "recall@5_after": 0.5, "refreshes": 7.0, "mean_staleness_steps": 11.25,
             "stage_seconds": {}}
  table = recipe.format_table(summary, wall_seconds=600)
  lines = table.splitlines()
  assert len(lines) == 13 and all(line.startswith("|") and line.endswith("|") for line in lines)
  for label, value in [("null document only (no retrieval)", "0.050"),
                       ("REALM (marginal over retrieved blocks)", "0.610"),
                       ("first -> last checkpoint", "0.010 -> 1.500"),
                       ("toy QA test EM, REALM", "0.420"),
                       ("ORQA-style baseline (ICT retriever, no REALM pretraining)", "0.250"),
                       ("before pretraining", "0.300"),
                       ("after pretraining", "0.500"), ("refreshes picked up", "7"),
                       ("staleness (steps)", "11.2"), ("wall time", "10.0 min")]:
    assert any(label in line and f"| {value} |" in line for line in lines), (label, table)


def test_toy_bert_choice_checks_the_shipped_weights(tmp_path, monkeypatch):
  assert recipe.toy_bert_dir("shipped") == toy_bert.SHIPPED_DIR
  assert recipe.toy_bert_dir("none") is None
  with pytest.raises(ValueError, match="no model.safetensors"):
    recipe.toy_bert_dir(str(tmp_path))
  # A shipped file that is not the documented one (a partial checkout, a Git LFS pointer).
  monkeypatch.setattr(toy_bert, "SHIPPED_SHA256", "0" * 64)
  with pytest.raises(ValueError, match="sha256 .* not the shipped 0000"):
    recipe.toy_bert_dir("shipped")
  # The wiki world's shipped BERT is the English one, checked by its own hash.
  assert recipe.toy_bert_dir("shipped", "wiki") == toy_bert.SHIPPED_DIRS["wiki"]
  monkeypatch.setattr(toy_bert, "WIKI_SHIPPED_SHA256", "1" * 64)
  with pytest.raises(ValueError, match="not the shipped 1111.*toy_bert --world wiki"):
    recipe.toy_bert_dir("shipped", "wiki")


def test_ict_starts_from_random_weights_unless_asked_to_start_from_the_bert(tmp_path,
                                                                           monkeypatch):
  commands = []
  monkeypatch.setattr(recipe, "run_child", lambda cmd, log: commands.append(list(cmd)))
  for ict_from_bert in (False, True):
    run = recipe.Recipe(str(tmp_path / "out"), "/store", toy_bert=SHIPPED_BERT,
                        ict_from_bert=ict_from_bert)
    monkeypatch.setattr(run, "_bert_checkpoint", lambda: "/converted/checkpoints/0")
    run.train_ict(str(tmp_path / "ict"), "ict.log", "NUM_STEPS=3")
  random_start, bert_start = commands
  assert "--gin.INIT_CHECKPOINT=None" in random_start
  assert "--gin.INIT_CHECKPOINT='/converted/checkpoints/0'" in bert_start
  for command in commands:
    assert "--gin_file=gin_configs/experiments/toy_ict.gin" in command
    assert f"--gin.RUN_DIR='{tmp_path / 'ict'}'" in command and "--gin.NUM_STEPS=3" in command


def test_children_get_the_allocator_settings_and_compilation_cache_unless_the_user_set_them(
    monkeypatch, tmp_path):
  monkeypatch.setenv("REALM_JAX_CACHE", str(tmp_path))
  expected = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
              "MALLOC_TRIM_THRESHOLD_": "4294967296",
              "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax_compilation_cache")}
  for key in (*expected, "REALM_JAX_ALLOCATOR"):
    monkeypatch.delenv(key, raising=False)
  assert recipe.child_env() == expected
  monkeypatch.setenv("REALM_JAX_ALLOCATOR", "system")  # glibc's defaults: no malloc settings
  assert recipe.child_env() == {"JAX_COMPILATION_CACHE_DIR": str(tmp_path /
                                                                 "jax_compilation_cache")}
  monkeypatch.delenv("REALM_JAX_ALLOCATOR")
  monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")
  assert recipe.child_env() == {k: v for k, v in expected.items()
                                if k not in ("MALLOC_ARENA_MAX", "JAX_COMPILATION_CACHE_DIR")}


def test_a_bert_larger_than_the_toy_model_keeps_glibcs_allocator(tmp_path):
  """The toy-tuned malloc settings keep each process's peak heap: only the toy model's shape
  (width x layers 128 x 2) gets them."""
  import json  # pylint: disable=import-outside-toplevel
  assert not recipe.larger_than_toy(SHIPPED_BERT) and not recipe.larger_than_toy(None)
  with open(os.path.join(SHIPPED_BERT, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  for width, layers, larger in ((384, 6, True), (128, 3, True), (64, 4, False)):
    directory = tmp_path / f"{width}x{layers}"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(
        {**config, "hidden_size": width, "num_hidden_layers": layers}))
    assert recipe.larger_than_toy(str(directory)) == larger


def test_children_side_by_side_each_log_their_own_output_and_failures_are_named(
    tmp_path, capsys):
  import sys  # pylint: disable=import-outside-toplevel
  import time  # pylint: disable=import-outside-toplevel
  # Each child waits for the other's file: one after the other, neither would ever finish.
  script = ("import os, sys, time\n"
            "open(sys.argv[1], 'w').close()\n"
            "deadline = time.time() + 20\n"
            "while not os.path.exists(sys.argv[2]) and time.time() < deadline: time.sleep(0.01)\n"
            "print('step 1/1 (100.0%)' if os.path.exists(sys.argv[2]) else 'alone')\n"
            "print('chatter')\n")
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  start = time.monotonic()
  recipe.run_children([([sys.executable, "-c", script, a, b], str(tmp_path / "one.log")),
                       ([sys.executable, "-c", script, b, a], str(tmp_path / "two.log"))])
  assert time.monotonic() - start < 15
  for name in ("one", "two"):
    assert (tmp_path / f"{name}.log").read_text().splitlines() == ["step 1/1 (100.0%)",
                                                                   "chatter"]
  # The console: progress lines only, each with its child's name.
  assert sorted(capsys.readouterr().out.splitlines()) == ["[one] step 1/1 (100.0%)",
                                                          "[two] step 1/1 (100.0%)"]
  fail = "import sys; sys.exit(3)"
  with pytest.raises(RuntimeError, match=r"exited with status 3; see .*bad\.log") as error:
    recipe.run_children([([sys.executable, "-c", "pass"], str(tmp_path / "good.log")),
                         ([sys.executable, "-c", fail], str(tmp_path / "bad.log"))])
  assert "good.log" not in str(error.value)


# The main job stopped the ways schedulers and people stop jobs, with stand-in stages: a
# process running `run_children` through `run_command`, as `python -m realm_jax.recipe` does.
_STAGE = r"""
import os, sys, time
out, name = sys.argv[1], sys.argv[2]
open(os.path.join(out, name + ".pid"), "w").write(str(os.getpid()))
try:
  time.sleep(120)
except KeyboardInterrupt:
  open(os.path.join(out, name + ".sigint"), "w").close()
  sys.exit(130)
"""
_MAIN_JOB = r"""
import sys
from realm_jax import gin_utils, recipe
out = sys.argv[1]
stages = [([sys.executable, "-c", sys.argv[2], out, name], f"{out}/{name}.log")
          for name in ("ict", "orqa")]
def run():
  recipe.run_children(stages)
  return 0
gin_utils.exit_process(gin_utils.run_command("recipe", run, interrupted="run it again"),
                       "recipe")
"""


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper counts as gone
    return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _main_job_with_stages_running(tmp_path):
  """The stand-in main job, once both its stages run: (process, [stage pids])."""
  proc = subprocess.Popen([sys.executable, "-c", _MAIN_JOB, str(tmp_path), _STAGE],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  pids = [tmp_path / f"{name}.pid" for name in ("ict", "orqa")]
  deadline = time.monotonic() + 60
  while not all(p.exists() and p.read_text() for p in pids):
    assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
    time.sleep(0.02)
  time.sleep(0.3)  # past the stages' imports: their KeyboardInterrupt handling is in place
  return proc, [int(p.read_text()) for p in pids]


def test_sigterm_to_the_main_job_stops_its_stages_and_says_so(tmp_path):
  proc, pids = _main_job_with_stages_running(tmp_path)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err
  lines = err.strip().splitlines()
  assert lines[-1] == "recipe: interrupted (SIGTERM); run it again", lines
  assert sorted(lines[:-1]) == sorted(f"recipe: stopped child {pid}: exit 130" for pid in pids)
  for name, pid in zip(("ict", "orqa"), pids):
    assert (tmp_path / f"{name}.sigint").exists() and not _alive(pid)


def test_stages_die_with_a_main_job_killed_outright(tmp_path):
  proc, pids = _main_job_with_stages_running(tmp_path)
  proc.send_signal(signal.SIGKILL)  # nothing of the main job runs: only the kernel acts
  proc.communicate(timeout=60)
  deadline = time.monotonic() + 30
  while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
    time.sleep(0.02)
  try:
    assert not any(_alive(pid) for pid in pids), "a stage outlived the main job"
  finally:
    for pid in pids:
      if _alive(pid):
        os.kill(pid, signal.SIGKILL)


# -- What the benches' rows ask of the recipe (bench/ablations.py, bench/methods.py): Recipe.run
# over an output directory whose warm start and pretraining are done, its children recorded
# rather than run.


def _finished_recipe(tmp_path, monkeypatch, *, index_of_pretrain=400, **kwargs):
  """(Recipe over `tmp_path/out`, its BERT converted, its ICT in `tmp_path/ict` and its
  pretraining done, and the list the children's commands are appended to, in the order they
  would run). What the stages check is faked where they read it: the runs' TRAINING_DONE, their
  newest checkpoint (400; the BERT's 0) and their newest index."""
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  from realm_jax.index import store as store_lib  # pylint: disable=import-outside-toplevel
  out, ict = tmp_path / "out", str(tmp_path / "ict")
  run = recipe.Recipe(str(out), "/store", ict_dir=ict, toy_bert=SHIPPED_BERT,
                      finetune_bindings=["NUM_STEPS=7"], **{"baseline": False, **kwargs})
  trained, indexes, commands = {ict, run.pretrain}, {run.pretrain: index_of_pretrain}, []

  def record(cmd):
    commands.append(list(cmd))
    run_dir = next(a for a in cmd if a.startswith("--gin.RUN_DIR=")).split("'")[1]
    if cmd[2] == "realm_jax.build_index":  # an index of the newest checkpoint, or step 0
      indexes[run_dir] = 0 if any("checkpoint_dir=" in a for a in cmd) else 400
    elif cmd[2] == "realm_jax.train":
      trained.add(run_dir)

  monkeypatch.setattr(recipe, "run_child", lambda cmd, log: record(cmd))
  monkeypatch.setattr(recipe, "run_children",
                      lambda children: [record(cmd) for cmd, _ in children])
  monkeypatch.setattr(checkpoints, "training_done", lambda run_dir: run_dir in trained)
  monkeypatch.setattr(checkpoints, "latest_checkpoint_step",
                      lambda run_dir: 0 if run_dir == run.bert else 400)
  monkeypatch.setattr(recipe.Recipe, "summary", lambda self, *paths: paths)
  monkeypatch.setattr(store_lib, "latest_index_step", indexes.get)
  for name in ("before", "after"):
    (out / "eval" / f"recall_{name}.metrics.json").write_text("{}")
  return run, commands


ICT_CHECKPOINT = "ict/checkpoints/400"
PRETRAIN_CHECKPOINT = "out/pretrain/checkpoints/400"


BERT_CHECKPOINT = "out/bert/checkpoints/0"


@pytest.mark.parametrize("retriever,reader,init,encoder", [
    ("pretrain", "pretrain", PRETRAIN_CHECKPOINT, None),  # REALM
    ("pretrain", "bert", PRETRAIN_CHECKPOINT, BERT_CHECKPOINT),
    ("warm_start", "pretrain", ICT_CHECKPOINT, PRETRAIN_CHECKPOINT),
    ("warm_start", "bert", ICT_CHECKPOINT, BERT_CHECKPOINT),  # ORQA-style
])
def test_the_fine_tuning_slot_starts_from_the_retriever_and_the_reader_asked_for(
    tmp_path, monkeypatch, retriever, reader, init, encoder):
  run, commands = _finished_recipe(tmp_path, monkeypatch, finetune_name="mix",
                                   finetune_retriever=retriever, finetune_reader=reader)
  run.run()
  index, finetune, evaluate = commands
  path = lambda p: p if p.startswith("/") else str(tmp_path / p)
  assert f"--gin.RUN_DIR='{tmp_path}/out/mix'" in index
  # The frozen index is the retriever's: built from the checkpoint fine-tuning starts from.
  assert f"--gin.build_index_main.checkpoint_dir='{path(init)}'" in index
  assert f"--gin.INIT_CHECKPOINT='{path(init)}'" in finetune
  encoders = [a for a in finetune if a.startswith("--gin.ENCODER_CHECKPOINT=")]
  assert encoders == ([] if encoder is None else [f"--gin.ENCODER_CHECKPOINT='{path(encoder)}'"])
  assert finetune[-1] == "--gin.NUM_STEPS=7"
  assert f"--gin.evaluate_main.output='{tmp_path}/out/eval/toy_qa_mix_test.jsonl'" in evaluate
  assert run.qa_metrics_path() == f"{tmp_path}/out/eval/toy_qa_mix_test.metrics.json"


def test_the_orqa_mix_is_the_baselines_fine_tuning(tmp_path, monkeypatch):
  """The ablations' ORQA row ('warm_start', 'bert') issues the baseline's commands."""
  baseline, baseline_commands = _finished_recipe(tmp_path / "a", monkeypatch, baseline=True)
  baseline.run()
  mix, mix_commands = _finished_recipe(tmp_path / "b", monkeypatch, finetune_name="orqa",
                                       finetune_retriever="warm_start", finetune_reader="bert")
  mix.run()
  # The baseline's index, fine-tuning and evaluation, beside REALM's in each stage.
  orqa = [c for c in baseline_commands if f"--gin.RUN_DIR='{tmp_path}/a/out/orqa'" in c]
  assert len(orqa) == 3 and len(baseline_commands) == 6
  normalise = lambda cmd, root: [a.replace(str(root), "ROOT") for a in cmd]
  assert ([normalise(c, tmp_path / "a") for c in orqa]
          == [normalise(c, tmp_path / "b") for c in mix_commands])
  with pytest.raises(ValueError, match="finetune_reader='ict'"):
    recipe.Recipe(str(tmp_path / "c"), "/store", finetune_reader="ict")


def test_without_the_builder_recall_after_pretraining_reads_the_final_checkpoints_index(
    tmp_path, monkeypatch):
  run, commands = _finished_recipe(tmp_path, monkeypatch, index_of_pretrain=0,
                                   with_builder=False)
  (tmp_path / "out" / "eval" / "recall_after.metrics.json").unlink()
  run.run()
  final_index, recall_after = commands[:2]
  assert final_index[2] == "realm_jax.build_index" and "--once" in final_index
  assert f"--gin.RUN_DIR='{run.pretrain}'" in final_index
  assert not any("checkpoint_dir" in a for a in final_index)  # its newest checkpoint, step 400
  assert recall_after[2] == "realm_jax.evaluate"
  assert "--gin.evaluate_main.index_step=400" in recall_after


def test_the_warm_start_can_continue_a_checkpoint_instead_of_the_bert(tmp_path, monkeypatch):
  commands = []
  monkeypatch.setattr(recipe, "run_child", lambda cmd, log: commands.append(list(cmd)))
  run = recipe.Recipe(str(tmp_path / "out"), "/store", toy_bert=SHIPPED_BERT, ict_from_bert=True)
  monkeypatch.setattr(run, "_bert_checkpoint", lambda: "/converted/checkpoints/0")
  run.train_ict(str(tmp_path / "ict"), "ict.log", init_checkpoint="/retromae/checkpoints/400")
  run.train_ict(str(tmp_path / "ict2"), "ict.log")
  assert "--gin.INIT_CHECKPOINT='/retromae/checkpoints/400'" in commands[0]
  assert "--gin.INIT_CHECKPOINT='/converted/checkpoints/0'" in commands[1]


# -- The warm starts those rows rely on, on tiny models.


def _tiny_params(model, seed, proj_size=8):
  import jax  # pylint: disable=import-outside-toplevel
  from realm_jax.models import config as config_lib  # pylint: disable=import-outside-toplevel
  from realm_jax.models import open_qa_model  # pylint: disable=import-outside-toplevel
  from realm_jax.models import realm, retromae  # pylint: disable=import-outside-toplevel
  config = config_lib.RealmConfig(bert=config_lib.tiny_bert(vocab_size=50), proj_size=proj_size)
  cls = {"OpenQAModel": open_qa_model.OpenQAModel, "RetroMaeModel": retromae.RetroMaeModel}.get(
      model) or getattr(realm, model)
  return jax.device_get(cls(config).init(jax.random.PRNGKey(seed)))


def _equal(a, b):
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  return (jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
          and all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(a),
                                                       jax.tree_util.tree_leaves(b))))


def test_encoder_checkpoint_takes_the_reader_from_a_pretraining_checkpoint():
  """'baseline retriever + REALM encoder': ICT's retriever (INIT_CHECKPOINT), the reader's BERT
  from the REALM pretraining checkpoint's encoder (ENCODER_CHECKPOINT), a fresh span head."""
  from realm_jax import jobs  # pylint: disable=import-outside-toplevel
  ict, pretrained = _tiny_params("IctModel", 1), _tiny_params("RealmPretrainModel", 2)
  fresh = _tiny_params("OpenQAModel", 3)
  job = jobs.FinetuneJob(task="toy_qa")
  params, _ = job.warm_start(ict, fresh, "ict/400")
  params, taken = job.warm_start_extra("encoder_checkpoint", pretrained, params, "pretrain/400")
  assert taken == "reader BERT"
  assert _equal(params["reader"]["bert"], pretrained["encoder"]["bert"])
  assert not _equal(params["reader"]["bert"], fresh["reader"]["bert"])
  assert _equal(params["reader"]["span_head"], fresh["reader"]["span_head"])
  assert _equal(params["retriever"], ict["retriever"])  # not the pretraining's retriever
  assert not _equal(params["retriever"], pretrained["retriever"])


def test_ict_continues_a_retromae_checkpoints_retriever_whole():
  from realm_jax import jobs  # pylint: disable=import-outside-toplevel
  from realm_jax.gin_utils import ConfigError  # pylint: disable=import-outside-toplevel
  retromae, fresh = _tiny_params("RetroMaeModel", 1), _tiny_params("IctModel", 2)
  job = jobs.IctJob(task="ict_toy", continue_retriever=True)
  params, taken = job.warm_start(retromae, fresh, "retromae/400")
  assert taken == "retriever (continued)"
  # Every tower's BERT, pooler, projection and LayerNorm: the embedding RetroMAE trained.
  assert _equal(params["retriever"], retromae["retriever"])
  assert not _equal(params["retriever"], fresh["retriever"])
  # A retriever of another projection size is refused in one line, and so is a BERT.
  other = _tiny_params("RetroMaeModel", 4, proj_size=16)
  with pytest.raises(ConfigError, match="not of this run's shape"):
    job.warm_start(other, fresh, "retromae/400")
  with pytest.raises(ConfigError, match="no retriever params"):
    job.warm_start(_tiny_params("BertMlmModel", 3), fresh, "bert/0")
  # Without the setting ICT takes only an encoder's BERT, as REALM's ICT from BERT: a RetroMAE
  # checkpoint, which has none, is refused.
  with pytest.raises(ConfigError, match="no encoder params"):
    jobs.IctJob(task="ict_toy").warm_start(retromae, fresh, "retromae/400")


def test_trainings_of_a_bert_larger_than_the_toy_model_run_one_after_the_other(tmp_path,
                                                                               monkeypatch):
  import json  # pylint: disable=import-outside-toplevel
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  calls = []
  monkeypatch.setattr(checkpoints, "latest_checkpoint_step", lambda run_dir: 400)
  monkeypatch.setattr(recipe, "run_children", lambda children: calls.append(
      [os.path.basename(log) for _, log in children]))

  def fine_tune(run):
    (stage,) = [s for s in run.finetuning_stages() if s.name.startswith("5 ")]
    run.runner.run_stage(stage, run.logs)

  fine_tune(recipe.Recipe(str(tmp_path / "toy"), "/store", toy_bert=SHIPPED_BERT))
  assert calls == [["finetune.log", "finetune_orqa.log"]]  # the toy model's: side by side
  with open(os.path.join(SHIPPED_BERT, "config.json"), encoding="utf-8") as f:
    config = {**json.load(f), "hidden_size": 384, "num_hidden_layers": 6}
  (tmp_path / "big").mkdir()
  (tmp_path / "big" / "config.json").write_text(json.dumps(config))
  calls.clear()
  fine_tune(recipe.Recipe(str(tmp_path / "out"), "/store", toy_bert=str(tmp_path / "big")))
  assert calls == [["finetune.log"], ["finetune_orqa.log"]]


def test_the_dry_run_prints_every_stage_and_command_and_makes_nothing(tmp_path, monkeypatch,
                                                                      capsys):
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  monkeypatch.chdir(tmp_path)  # main moves to the repository root
  monkeypatch.setattr(realm_jax_tasks, "toy_block_store_dir", lambda: "/toy/blocks")
  out = tmp_path / "out"
  assert recipe.main(["--dry_run", "--out", str(out), "--bert", "none", "--fresh"]) == 0
  printed = capsys.readouterr().out
  for stage in ("1 warm start (toy_ict.gin)", "2 first index", "  recall before pretraining",
                "3 REALM pretraining + index builder (two processes) [trainer + index builder]",
                "  recall after pretraining", "4 frozen indexes", "5 open-QA fine-tuning",
                "6 evaluation on the toy QA test split"):
    assert f"\n{stage}" in printed, stage
  assert "0 the BERT" not in printed  # --bert none: random weights, nothing to convert
  assert (f"--gin.INIT_CHECKPOINT=\"'{{latest_checkpoint:{out}/ict}}'\"" in printed
          and f"> {out}/logs/trainer.log" in printed)
  assert not out.exists()
  # Paper scale: its shared paths, BATCH_SIZE per host; nothing is read or made there.
  assert recipe.main(["--scale", "paper", "--out", str(tmp_path / "runs"), "--block_store",
                      "/mnt/blocks", "--bert", "/mnt/bert-base-uncased", "--hosts", "8",
                      "--task", "wq", "--dry_run"]) == 0
  printed = capsys.readouterr().out
  assert "--gin_file=gin_configs/experiments/wq_finetune.gin" in printed
  assert "--gin.BATCH_SIZE=512" in printed and "--gin.BATCH_SIZE=64" in printed
  assert not (tmp_path / "runs").exists()
  with pytest.raises(SystemExit):
    recipe.parse_args(["--scale", "paper", "--out", "/r", "--block_store", "/b"])
  assert "not --bert shipped" in capsys.readouterr().err
