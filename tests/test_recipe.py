"""The main job's driver (`python -m realm_jax.recipe`): its console filter, its result table,
what ICT starts from and the children's environment.
The recipe itself runs for minutes (README command one); its stages are the entry points, each
tested on its own (tests/test_entry_points.py, tests/test_evaluate_main.py, tests/index)."""

import io

import pytest

from realm_jax import recipe


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
  from realm_jax import toy_bert  # pylint: disable=import-outside-toplevel
  assert recipe.toy_bert_dir("shipped") == toy_bert.SHIPPED_DIR
  assert recipe.toy_bert_dir("none") is None
  with pytest.raises(ValueError, match="no model.safetensors"):
    recipe.toy_bert_dir(str(tmp_path))
  # A shipped file that is not the documented one (a partial checkout, a Git LFS pointer).
  monkeypatch.setattr(toy_bert, "SHIPPED_SHA256", "0" * 64)
  with pytest.raises(ValueError, match="sha256 .* not the shipped 0000"):
    recipe.toy_bert_dir("shipped")


def test_ict_starts_from_random_weights_unless_asked_to_start_from_the_bert(tmp_path,
                                                                           monkeypatch):
  commands = []
  monkeypatch.setattr(recipe, "run_child", lambda cmd, log: commands.append(list(cmd)))
  for ict_from_bert in (False, True):
    run = recipe.Recipe(str(tmp_path / "out"), "/store", toy_bert="/the/bert",
                        ict_from_bert=ict_from_bert)
    monkeypatch.setattr(run, "_bert_checkpoint", lambda: "/converted/checkpoints/0")
    run.train_ict(str(tmp_path / "ict"), "ict.log", "NUM_STEPS=3")
  random_start, bert_start = commands
  assert "--gin.INIT_CHECKPOINT=None" in random_start
  assert "--gin.INIT_CHECKPOINT='/converted/checkpoints/0'" in bert_start
  for command in commands:
    assert "--gin_file=gin_configs/experiments/toy_ict.gin" in command
    assert f"--gin.RUN_DIR='{tmp_path / 'ict'}'" in command and "--gin.NUM_STEPS=3" in command


def test_children_get_the_launchers_allocator_settings_unless_the_user_set_them(monkeypatch):
  expected = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
              "MALLOC_TRIM_THRESHOLD_": "4294967296"}
  for key in expected:
    monkeypatch.delenv(key, raising=False)
  assert recipe.child_env() == expected
  monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
  assert recipe.child_env() == {k: v for k, v in expected.items() if k != "MALLOC_ARENA_MAX"}


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
