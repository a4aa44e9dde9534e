"""bench/atlas.py: the plan of cells, the commands a cell runs, which cells are made or reused,
the tables and the paired comparisons on made-up cells (numbers worked out by hand in the
comments), and the fingerprint over the gins its rows read. No training runs here (the runs
themselves are tests/test_fid_finetune_run.py's, test_atlas_pretext_run.py's,
test_closed_book_run.py's and test_contriever_run.py's)."""

import fnmatch
import json
import os
import shutil
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import atlas  # noqa: E402  pylint: disable=wrong-import-position
from test_ablations import finished_run  # noqa: E402  pylint: disable=wrong-import-position

PY = sys.executable
DEV_PICKED = "step 300: best by eval/exact_match=0.03 in best.json"
CKPT = "/o/seed1/realm/pretrain/checkpoints/400"


# ---------------------------------------------------------------------------- the plan


def test_the_plan_makes_the_pretraining_cell_first_then_every_row_at_every_size():
  assert atlas.plan(("fid", "contriever"), ("all", "64"), (0, 1)) == [
      (0, "extractive", "all"), (0, "fid", "64"), (0, "fid", "all"), (0, "contriever", "all"),
      (1, "extractive", "all"), (1, "fid", "64"), (1, "fid", "all"), (1, "contriever", "all")]
  # The extractive row's own few-shot cells after its all-questions cell, made once.
  assert atlas.plan(("extractive",), ("256", "64"), (3,)) == [
      (3, "extractive", "all"), (3, "extractive", "64"), (3, "extractive", "256")]
  # Everything: 14 main rows (extractive, fid and its noise row, 4 objectives at two learning
  # rates, two pretexts, closed book) x 3 sizes, the base among them, + Contriever's one cell.
  everything = atlas.plan((), atlas.DEFAULT_SIZES, (0,))
  assert len(everything) == 14 * 3 + 1 and len(set(everything)) == len(everything)
  assert [row for _, row, _ in everything[1:4]] == ["extractive", "extractive", "fid"]


def test_sizes_are_all_or_positive_counts_smallest_first():
  assert atlas.sorted_sizes(["all", "256", "64", "64"]) == ("64", "256", "all")
  assert atlas.parse_size("all") == "all" and atlas.parse_size("064") == "64"
  for bad in ("0", "-3", "half"):
    with pytest.raises(Exception, match="expected 'all' or a positive number"):
      atlas.parse_size(bad)


# ---------------------------------------------------------------------------- the commands


def test_an_objective_rows_cell_builds_its_index_fine_tunes_few_shot_and_evaluates_on_test():
  layout = atlas.Layout("/o/seed1")
  commands = atlas.cell_commands(atlas.ROW_BY_NAME["adist"], "64", 1, layout, "/store",
                                 pretraining_checkpoint=CKPT, init_checkpoint=CKPT)
  assert [stage for stage, _ in commands] == ["frozen index", "fine-tuning", "evaluation"]
  (_, index), (_, train), (_, evaluate) = commands
  assert index == [PY, "-m", "realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin",
                   "--once", "--gin.RUN_DIR='/o/seed1/realm/adist_64'",
                   "--gin.BLOCK_STORE='/store'",
                   f"--gin.build_index_main.checkpoint_dir='{CKPT}'"]
  assert train == [PY, "-m", "realm_jax.train",
                   "--gin_file=gin_configs/experiments/atlas_toy_finetune.gin",
                   "--gin.RUN_DIR='/o/seed1/realm/adist_64'", f"--gin.INIT_CHECKPOINT='{CKPT}'",
                   "--gin.train_main.seed=1", "--gin.FinetuneJob.retriever_objective='adist'",
                   "--gin.FinetuneJob.few_shot=64", "--gin.FinetuneJob.few_shot_seed=1"]
  assert evaluate == [PY, "-m", "realm_jax.evaluate",
                      "--gin_file=gin_configs/experiments/toy_eval.gin",
                      "--gin.RUN_DIR='/o/seed1/realm/adist_64'",
                      "--gin.evaluate_main.split='test'",
                      "--gin.evaluate_main.output='/o/seed1/realm/adist_64/eval/adist_64_test.jsonl'"]


def test_the_slow_objective_rows_add_a_tenth_of_the_learning_rate_to_the_objectives_command():
  layout = atlas.Layout("/o/seed2")
  commands = dict(atlas.cell_commands(atlas.ROW_BY_NAME["emdr2_lr_0.1"], "all", 2, layout,
                                      "/store", pretraining_checkpoint=CKPT,
                                      init_checkpoint=CKPT))
  assert commands["fine-tuning"][3:] == [
      "--gin_file=gin_configs/experiments/atlas_toy_finetune.gin",
      "--gin.RUN_DIR='/o/seed2/realm/emdr2_lr_0.1_all'", f"--gin.INIT_CHECKPOINT='{CKPT}'",
      "--gin.train_main.seed=2", "--gin.FinetuneJob.retriever_objective='emdr2'",
      "--gin.FinetuneJob.retriever_lr_scale=0.1"]
  assert [r for r in atlas.MAIN_ROWS if r.endswith("_lr_0.1")] == [
      "adist_lr_0.1", "emdr2_lr_0.1", "pdist_lr_0.1", "loop_lr_0.1"]


def test_the_noise_row_changes_the_fine_tuning_seed_alone():
  layout = atlas.Layout("/o/seed1")
  commands = dict(atlas.cell_commands(atlas.ROW_BY_NAME["fid_again"], "64", 1, layout, "/store",
                                      pretraining_checkpoint=CKPT, init_checkpoint=CKPT))
  # The same gin, index and few-shot sample (few_shot_seed = the seed) as the fid row.
  assert commands["fine-tuning"][3:] == [
      "--gin_file=gin_configs/experiments/toy_finetune_fid.gin",
      "--gin.RUN_DIR='/o/seed1/realm/fid_again_64'", f"--gin.INIT_CHECKPOINT='{CKPT}'",
      "--gin.train_main.seed=1001", "--gin.FinetuneJob.few_shot=64",
      "--gin.FinetuneJob.few_shot_seed=1"]
  assert commands["frozen index"][-1] == f"--gin.build_index_main.checkpoint_dir='{CKPT}'"


def test_the_noise_line_reads_the_noise_row_against_fid_and_stays_out_of_the_best():
  results = _results()
  # fid on all: 0.03, 0.02, 0.04; again: 0.04, 0.02, 0.02 -> +0.01, 0.00, -0.02: mean -0.0033,
  # sd 0.01528, se 0.00882.
  results[("fid_again", "all")] = {s: _cell(em) for s, em in enumerate((0.04, 0.02, 0.02))}
  # Only one seed at 64: no line for it.
  results[("fid_again", "64")] = {0: _cell(0.9)}
  rows = atlas.by_row(results)
  assert atlas.noise_line(rows, ("64", "all")) == (
      "Fine-tuning noise, the FiD reader fine-tuned again minus itself (test EM): all questions "
      "-0.003 ± 0.009 (seeds 0, 1, 2: +0.010, +0.000, -0.020), standard deviation 0.015. A "
      "difference between two rows within about twice that standard deviation is what two "
      "fine-tunings of one pretraining differ by.")
  reading = atlas.reading(rows, ("64", "all"))
  assert "- Fine-tuning noise, the FiD reader fine-tuned again" in reading
  assert "fid_again" not in reading  # its 0.9 at 64 is no method's EM
  assert atlas.noise_line(atlas.by_row(_results()), ("64", "all")) == ""


def test_the_frozen_fid_row_the_pretext_row_and_the_closed_book_differ_where_they_should():
  layout = atlas.Layout("/o/seed1")
  commands = lambda row, size, init, **kw: dict(atlas.cell_commands(  # noqa: E731
      atlas.ROW_BY_NAME[row], size, 1, layout, "/store", pretraining_checkpoint=CKPT,
      init_checkpoint=init, **kw))
  fid = commands("fid", "all", CKPT)
  # The frozen query tower is the gin's own ('none'): no objective, and no few-shot on all.
  assert fid["fine-tuning"][3:] == [
      "--gin_file=gin_configs/experiments/toy_finetune_fid.gin",
      "--gin.RUN_DIR='/o/seed1/realm/fid_all'", f"--gin.INIT_CHECKPOINT='{CKPT}'",
      "--gin.train_main.seed=1"]
  # The pretext row: the same gin and index, but the reader and tower from the pretext.
  pretext = commands("pretext", "all", "/o/seed1/realm/atlas_pretext/checkpoints/400")
  assert pretext["frozen index"][-1] == f"--gin.build_index_main.checkpoint_dir='{CKPT}'"
  assert pretext["fine-tuning"][3:] == [
      "--gin_file=gin_configs/experiments/toy_finetune_fid.gin",
      "--gin.RUN_DIR='/o/seed1/realm/pretext_all'",
      "--gin.INIT_CHECKPOINT='/o/seed1/realm/atlas_pretext/checkpoints/400'",
      "--gin.train_main.seed=1"]
  # The closed book: no index, its own gin, evaluated without candidates.
  closed = commands("closed_book", "256", CKPT, finetune_steps=10)
  assert list(closed) == ["fine-tuning", "evaluation"]
  assert closed["fine-tuning"][3:] == [
      "--gin_file=gin_configs/experiments/atlas_toy_closed_book.gin",
      "--gin.RUN_DIR='/o/seed1/realm/closed_book_256'", f"--gin.INIT_CHECKPOINT='{CKPT}'",
      "--gin.train_main.seed=1", "--gin.FinetuneJob.few_shot=256",
      "--gin.FinetuneJob.few_shot_seed=1", "--gin.NUM_STEPS=10"]
  assert closed["evaluation"][-1] == "--gin.evaluate_main.candidates='none'"
  with pytest.raises(ValueError, match="runs through the recipe"):
    atlas.cell_commands(atlas.ROW_BY_NAME["extractive"], "all", 1, layout, "/store",
                        pretraining_checkpoint=CKPT, init_checkpoint=CKPT)


def test_the_pretext_runs_once_per_seed_from_the_pretraining_checkpoint():
  layout = atlas.Layout("/o/seed2")
  pretraining = "/o/seed2/realm/pretrain/checkpoints/400"
  (_, index), (_, train) = atlas.pretext_commands(layout, "/store", 2,
                                                  pretraining_checkpoint=pretraining,
                                                  pretext_steps=50)
  assert index[-3:] == ["--gin.RUN_DIR='/o/seed2/realm/atlas_pretext'",
                        "--gin.BLOCK_STORE='/store'",
                        f"--gin.build_index_main.checkpoint_dir='{pretraining}'"]
  assert train == [PY, "-m", "realm_jax.train",
                   "--gin_file=gin_configs/experiments/atlas_toy_pretext.gin",
                   "--gin.RUN_DIR='/o/seed2/realm/atlas_pretext'",
                   f"--gin.INIT_CHECKPOINT='{pretraining}'", "--gin.train_main.seed=2",
                   "--gin.NUM_STEPS=50"]
  assert layout.pretext_eval_output() == (
      "/o/seed2/realm/atlas_pretext/eval/atlas_pretext_zero_shot_test.jsonl")
  assert atlas.metrics_path(layout.pretext_eval_output()).endswith(
      "atlas_pretext_zero_shot_test.metrics.json")
  # The pretext for the reader alone: its own run, no objective and no learning rate for the
  # query tower, the rest as Atlas's.
  (_, index), (_, train) = atlas.pretext_commands(layout, "/store", 2,
                                                  pretraining_checkpoint=pretraining,
                                                  kind="pretext_frozen")
  assert index[-3] == "--gin.RUN_DIR='/o/seed2/realm/atlas_pretext_frozen'"
  assert train[4:] == ["--gin.RUN_DIR='/o/seed2/realm/atlas_pretext_frozen'",
                       f"--gin.INIT_CHECKPOINT='{pretraining}'", "--gin.train_main.seed=2",
                       "--gin.FinetuneJob.retriever_objective='none'",
                       "--gin.FinetuneJob.retriever_lr_scale=0.0"]
  assert layout.pretext_eval_output("pretext_frozen") == (
      "/o/seed2/realm/atlas_pretext_frozen/eval/atlas_pretext_frozen_zero_shot_test.jsonl")
  row = atlas.ROW_BY_NAME["pretext_reader"]
  assert (row.reader, row.gin, row.warm_start) == ("fid", atlas.FID_GIN, "pretext_frozen")


def test_the_recipes_cells_the_extractive_reader_and_the_contriever_warm_start():
  extractive = atlas.ROW_BY_NAME["extractive"]
  # All questions: the recipe's own REALM fine-tuning ("finetune"), the seed everywhere.
  assert atlas.recipe_kwargs(extractive, "all", 2) == {
      "eval_split": "test", "baseline": False, "pretrain_bindings": ["train_main.seed=2"],
      "finetune_bindings": ["train_main.seed=2"]}
  few = atlas.recipe_kwargs(extractive, "64", 2, pretrain_steps=40, finetune_steps=30)
  assert few["finetune_name"] == "extractive_64"
  assert few["pretrain_bindings"] == ["NUM_STEPS=40", "train_main.seed=2"]
  assert few["finetune_bindings"] == ["NUM_STEPS=30", "train_main.seed=2",
                                      "FinetuneJob.few_shot=64", "FinetuneJob.few_shot_seed=2"]
  contriever = atlas.recipe_kwargs(atlas.ROW_BY_NAME["contriever"], "all", 0)
  assert contriever["warm_start_gin"] == "gin_configs/experiments/contriever_toy.gin"
  assert contriever["warm_start_bindings"] == ["train_main.seed=0"]
  assert "finetune_name" not in contriever
  with pytest.raises(ValueError, match="not run by the recipe"):
    atlas.recipe_kwargs(atlas.ROW_BY_NAME["fid"], "all", 0)


def test_commands_are_printed_as_the_gins_headers_write_them_and_paste_back_whole():
  import shlex  # pylint: disable=import-outside-toplevel
  cmd = [PY, "-m", "realm_jax.train", "--gin.RUN_DIR='/runs/a b'", "--once",
         "--gin.FinetuneJob.retriever_objective='adist'", "--gin.train_main.seed=1",
         "--gin.X='$HOME'"]
  line = atlas.shell_command(cmd)
  assert line.startswith(f"{PY} -m realm_jax.train --gin.RUN_DIR=\"'/runs/a b'\" --once "
                         "--gin.FinetuneJob.retriever_objective=\"'adist'\" "
                         "--gin.train_main.seed=1 ")
  assert shlex.split(line) == cmd  # a `$` is quoted as shlex quotes it: still one word


def test_the_agreement_is_the_mean_of_the_last_window_of_steps():
  logged = {step: step / 1000 for step in range(20, 301, 20)}
  # Steps 220..300 (> 300 - 100): 0.22, 0.24, 0.26, 0.28, 0.30.
  assert atlas.last_window_mean(logged) == pytest.approx(0.26)
  assert atlas.last_window_mean(logged, window=20) == pytest.approx(0.30)
  assert atlas.last_window_mean({}) is None


# ---------------------------------------------------------------------------- made or reused


def _cell(em, pretraining="1.5", **figures):
  return {"qa_em": em, "qa_checkpoint": DEV_PICKED, "pretraining": pretraining,
          "minutes": 2.0, **figures}


def test_cells_are_kept_reused_and_only_the_missing_made(tmp_path, monkeypatch, capsys):
  out, cells = tmp_path / "runs", tmp_path / "cells"
  made = []

  pretraining_value = [0.5]  # what a pretraining trains; a remake the same unless changed

  def remake_pretraining(seed, layout, shared, settings):
    del seed, shared, settings
    made.append("pretraining")
    finished_run(os.path.join(layout.realm, "pretrain"), pretraining_value[0])

  def make_cell(row, size, seed, layout, shared, settings):
    pretrain = os.path.join(layout.realm, "pretrain")
    if (row.name, size) == ("extractive", "all") and not os.path.exists(pretrain):
      remake_pretraining(seed, layout, shared, settings)  # the base cell makes it
      made.pop()
    made.append((seed, row.name, size))
    return _cell(0.1, ablations.pretraining_id(pretrain))

  monkeypatch.setattr(atlas, "make_cell", make_cell)
  monkeypatch.setattr(atlas, "remake_pretraining", remake_pretraining)
  settings = atlas.Settings(store=str(tmp_path / "store"))
  go = lambda: atlas.run(str(out), ("fid", "contriever"), ("64", "all"), (0,),  # noqa: E731
                         settings, cells=str(cells))
  results = go()
  assert made == [(0, "extractive", "all"), (0, "fid", "64"), (0, "fid", "all"),
                  (0, "contriever", "all")]
  assert sorted(os.listdir(cells)) == ["seed0_contriever_all.json", "seed0_extractive_all.json",
                                       "seed0_fid_64.json", "seed0_fid_all.json"]
  assert results["fid", "64"][0]["qa_em"] == 0.1
  made.clear()
  go()
  assert made == []  # every cell kept
  assert "kept in" in capsys.readouterr().out
  # A lost FiD cell is made alone, beside the kept cells of the pretraining still in --out.
  os.remove(cells / "seed0_fid_64.json")
  go()
  assert made == [(0, "fid", "64")]
  made.clear()
  # The pretraining gone from --out (a new sitting): it is made again first, and as it trains
  # the same values the kept cells stay paired with it; only the lost cell is made.
  shutil.rmtree(out / "seed0" / "realm" / "pretrain")
  os.remove(cells / "seed0_fid_all.json")
  go()
  assert made == ["pretraining", (0, "fid", "all")]
  made.clear()
  # A remake that trains other values: the base cell and every fine-tuning are made again;
  # the Contriever cell, of a pretraining of its own, stays.
  shutil.rmtree(out / "seed0" / "realm" / "pretrain")
  os.remove(cells / "seed0_fid_all.json")
  pretraining_value[0] = 0.25
  go()
  assert made == ["pretraining", (0, "extractive", "all"), (0, "fid", "64"), (0, "fid", "all")]


def test_kept_results_make_nothing_and_leave_out_what_would_not_pair(tmp_path, monkeypatch,
                                                                      capsys):
  monkeypatch.setattr(atlas, "make_cell", lambda *a, **k: pytest.fail("made a cell"))
  settings = atlas.Settings(store=str(tmp_path / "store"))
  prints = atlas.settings_fingerprints(settings)
  cells = str(tmp_path / "cells")

  def keep(seed, row, size, pretraining):
    ablations.save_cell(atlas.cell_path(cells, seed, row, size), _cell(0.1, pretraining),
                        atlas.row_fingerprint(row, prints))

  keep(0, "extractive", "all", "p")
  keep(0, "fid", "64", "p")
  keep(0, "fid", "all", "q")  # fine-tuned another pretraining than seed 0's REALM cell
  keep(0, "contriever", "all", "c")  # a pretraining of its own
  keep(1, "fid", "64", "p")  # no REALM cell for seed 1 to pair with
  results = atlas.kept_results(("fid", "contriever"), ("64", "all"), (0, 1), settings,
                               cells=cells)
  assert {key: sorted(by_seed) for key, by_seed in results.items()} == {
      ("extractive", "all"): [0], ("fid", "64"): [0], ("contriever", "all"): [0]}
  said = capsys.readouterr().out
  assert "seed 0: FiD reader, query tower frozen ('none'), all questions: not of the seed's " \
         "kept REALM pretraining; left out" in said
  assert "seed 1: REALM's extractive reader, all questions: not kept in" in said
  assert "seed 1: FiD reader, query tower frozen ('none'), 64 questions: not of the seed's" in said
  assert not os.path.exists(tmp_path / "runs")


# ---------------------------------------------------------------------------- the report


def _results():
  """Three seeds of made-up cells: {(row, size): {seed: cell}}."""
  def seeds(row, size, ems, **columns):
    return {(row, size): {s: _cell(em, **{k: v[s] for k, v in columns.items()})
                          for s, em in enumerate(ems)}}

  same = lambda x: (x, x, x)  # noqa: E731
  results = {}
  results.update(seeds("extractive", "all", (0.20, 0.22, 0.24),
                       **{atlas.RECALL: same(0.46), atlas.RECALL_TUNED: same(0.46),
                          atlas.WARM_RECALL: (0.48, 0.47, 0.49),
                          atlas.PRETRAINED_RECALL: same(0.46), atlas.AGREEMENT: same(None)}))
  results.update(seeds("fid", "64", (0.01, 0.01, 0.01), **{atlas.RECALL: same(0.46)}))
  results.update(seeds("fid", "all", (0.03, 0.02, 0.04),
                       **{atlas.RECALL: same(0.46), atlas.RECALL_TUNED: same(0.46),
                          atlas.AGREEMENT: same(None)}))
  results.update(seeds("adist", "64", (0.01, 0.02, 0.00), **{atlas.RECALL: same(0.46)}))
  results.update(seeds("adist", "all", (0.04, 0.03, 0.06),
                       **{atlas.RECALL: same(0.46), atlas.RECALL_TUNED: (0.48, 0.47, 0.49),
                          atlas.AGREEMENT: (0.5, 0.6, 0.7)}))
  results.update(seeds("closed_book", "all", (0.03, 0.03, 0.03),
                       **{atlas.RECALL: same(None), atlas.RECALL_TUNED: same(None)}))
  results.update(seeds("contriever", "all", (0.18, 0.20, 0.25),
                       **{atlas.WARM_RECALL: (0.32, 0.39, 0.35),
                          atlas.PRETRAINED_RECALL: (0.40, 0.41, 0.42)}))
  return results


def test_by_row_takes_every_sizes_em_and_the_retriever_columns_of_all_questions():
  rows = atlas.by_row(_results())
  adist = rows["adist"][2]
  assert adist["qa_em@64"] == 0.00 and adist["qa_em@all"] == 0.06
  assert adist[atlas.AGREEMENT] == 0.7 and adist[atlas.RECALL_TUNED] == 0.49
  assert adist[atlas.RECALL] == 0.46 and adist["minutes"] == 4.0  # two cells of 2 minutes


def test_the_table_in_the_rows_order_mean_and_sample_sd_na_where_undefined():
  lines = atlas.table(atlas.by_row(_results()), ("64", "all")).splitlines()
  assert lines[0] == (
      "| row | toy QA test EM, 64 questions | toy QA test EM, all questions | zero-shot "
      "recall@5 (test) | test recall@5 after fine-tuning (all questions) | retriever "
      "agreement (last 100 steps, all questions) | seeds | minutes |")
  labels = [line.split(" | ")[0][2:] for line in lines[2:]]
  assert labels == ["REALM's extractive reader", "FiD reader, query tower frozen ('none')",
                    "FiD reader + ADist (attention distillation)",
                    "FiD reader, closed book (no retrieval)"]  # Contriever: its own table
  extractive, fid, adist, closed = (line.split(" | ") for line in lines[2:])
  # The extractive row has no few-shot cell here: n/a. EM all 0.20, 0.22, 0.24: sd 0.020.
  assert extractive[1:3] == ["n/a", "0.220 ± 0.020"]
  assert fid[1:6] == ["0.010 ± 0.000", "0.030 ± 0.010", "0.460 ± 0.000", "0.460 ± 0.000", "n/a"]
  # Agreement 0.5, 0.6, 0.7: 0.600 ± 0.100; minutes: two cells of 2 minutes per seed.
  assert adist[5:] == ["0.600 ± 0.100", "0, 1, 2", "4.0 |"]
  assert extractive[6] == "0, 1, 2"  # its only measured size
  assert closed[3:5] == ["n/a", "n/a"]
  assert len(lines) == 6  # every cell dev-picked: no note


def test_the_seeds_column_names_each_sizes_seeds_when_they_differ():
  results = _results()
  results["fid", "all"][3] = {**results["fid", "all"][0], "qa_em": 0.51}
  rows = atlas.by_row(results)
  assert atlas.seeds_cell(rows["fid"], ("64", "all")) == "64: 0, 1, 2; all: 0, 1, 2, 3"
  assert atlas.seeds_cell(rows["adist"], ("64", "all")) == "0, 1, 2"
  # The all-questions mean is over the four seeds: 0.03, 0.02, 0.04 and 0.51.
  fid = [line for line in atlas.table(rows, ("64", "all")).splitlines()
         if line.startswith("| FiD reader, query tower frozen")][0].split(" | ")
  assert fid[2].startswith("0.150 ± ") and fid[6] == "64: 0, 1, 2; all: 0, 1, 2, 3"


def test_the_table_names_a_cell_evaluated_on_a_checkpoint_dev_did_not_pick():
  results = _results()
  results["fid", "all"][1] = {**results["fid", "all"][1], "qa_checkpoint": "step 300: latest"}
  text = atlas.table(atlas.by_row(results), ("64", "all"))
  assert text.endswith("Evaluated on a checkpoint dev did not pick: fid all seed 1.")


def test_the_paired_comparisons_on_hand_worked_differences():
  lines = atlas.comparisons(atlas.by_row(_results()), ("64", "all")).splitlines()
  by_title = {line.split(": ")[0][2:]: line for line in lines}
  # FiD minus extractive, all: -0.17, -0.20, -0.20: mean -0.190, sd 0.0173, se 0.010; no
  # source predicts a sign, both signs are judged.
  assert by_title["FiD reader minus REALM's extractive reader, toy QA test EM, all questions"] \
      .endswith("-0.190 ± 0.010 (seeds 0, 1, 2: -0.170, -0.200, -0.200): same sign in every "
                "seed, beyond two standard errors")
  # ADist minus none, all: +0.01, +0.01, +0.02: mean 0.0133, se 0.0033.
  adist = "ADist (attention distillation) > query tower frozen (Atlas)"
  assert by_title[f"{adist}, toy QA test EM, all questions"].endswith(
      "+0.013 ± 0.003 (seeds 0, 1, 2: +0.010, +0.010, +0.020): holds in every seed, beyond two "
      "standard errors")
  # 64 questions: 0, +0.01, -0.01.
  assert by_title[f"{adist}, toy QA test EM, 64 questions"].endswith("does not hold")
  # Its question tower's recall after fine-tuning: +0.02, +0.01, +0.03.
  assert by_title[f"{adist}, test recall@5 after fine-tuning (all questions)"].endswith(
      "+0.020 ± 0.006 (seeds 0, 1, 2: +0.020, +0.010, +0.030): holds in every seed, beyond two "
      "standard errors")
  # Retrieval against the closed book: 0, -0.01, +0.01; the closed book has no recall.
  assert by_title["retrieval > closed book (Atlas), toy QA test EM, all questions"].endswith(
      "does not hold")
  assert not any("closed book" in title and "recall" in title for title in by_title)
  # No 64-question cell of the extractive row or the closed book: no line for them.
  assert "FiD reader minus REALM's extractive reader, toy QA test EM, 64 questions" \
      not in by_title
  assert len(lines) == 5


def test_the_warm_start_table_and_its_comparison():
  rows = atlas.by_row(_results())
  lines = atlas.warm_start_table(rows).splitlines()
  assert lines[0].startswith("| warm start | zero-shot recall@5 of the warm start (test) | "
                             "recall@5 after REALM pretraining (test) | toy QA test EM, all "
                             "questions (extractive reader) |")
  assert lines[2] == "| ICT (toy_ict.gin) | 0.480 ± 0.010 | 0.460 ± 0.000 | 0.220 ± 0.020 | 3 |"
  assert lines[3].startswith("| Contriever-style (contriever_toy.gin) | 0.353 ± 0.035 | ")
  text = atlas.comparisons(rows, ("64", "all"), [atlas.WARM_START_COMPARISON])
  # Warm-start recall, Contriever minus ICT: -0.16, -0.08, -0.14: reversed in every seed.
  warm = [line for line in text.splitlines() if "of the warm start" in line]
  assert warm[0].endswith("-0.127 ± 0.024 (seeds 0, 1, 2: -0.160, -0.080, -0.140): reversed in "
                          "every seed")
  # Only all questions' EM (Contriever has no few-shot cell) and the two recalls.
  assert len(text.splitlines()) == 3
  # A seed without the Contriever row stays out of the ICT row: the two rows pair.
  results = _results()
  results["extractive", "all"][3] = {**results["extractive", "all"][0], "qa_em": 0.9}
  assert atlas.warm_start_table(atlas.by_row(results)).splitlines()[2] == lines[2]
  del rows["contriever"]
  assert atlas.warm_start_table(rows) == ""


def test_the_markdown_has_both_tables_the_comparisons_and_a_reading_of_the_toy_scale():
  text = atlas.markdown(atlas.by_row(_results()), ("64", "all"), (0, 1, 2))
  assert text.startswith("`python bench/atlas.py --seeds 0 1 2 --sizes 64 all --write` "
                         "(42 min of runs;")  # 7 (row, size) x 3 seeds, 2 minutes each
  assert "| ICT (toy_ict.gin) |" in text and "Paired differences" in text
  reading = text.split("Reading:", 1)[1]
  assert "the best over the seeds every row holds (0, 1, 2), 0.220: REALM's extractive " \
         "reader." in reading
  # A fourth seed of one row alone changes its mean, not which row is best.
  results = _results()
  results["fid", "all"][3] = {**results["fid", "all"][0], "qa_em": 0.99}
  reading = atlas.reading(atlas.by_row(results), ("64", "all"))
  assert "fid 0.270" in reading  # (0.03 + 0.02 + 0.04 + 0.99) / 4
  assert "(0, 1, 2), 0.220: REALM's extractive reader." in reading
  assert "adist +0.013 EM" in reading and "What the toy scale cannot show" in reading
  # ADist minus none, all: +0.01, +0.01, +0.02 (mean 0.0133, se 0.0033).
  assert "(adist +0.013 EM): adist better in every seed, beyond two standard errors." in reading
  # 64 questions: only fid (0.01 x 3) and adist (0.01, 0.02, 0.00) have cells.
  assert "- Few-shot, Atlas's claim: mean test EM with 64 questions: fid 0.010, adist 0.010." \
      in reading


def test_the_reading_names_an_objective_worse_in_every_seed_and_one_that_is_neither():
  results = _results()
  results.update({("emdr2", "all"): {s: _cell(em) for s, em in enumerate((0.02, 0.01, 0.02))},
                  ("pdist", "all"): {s: _cell(em) for s, em in enumerate((0.04, 0.01, 0.04))}})
  reading = atlas.reading(atlas.by_row(results), ("64", "all"))
  # EMDR² minus none: -0.01, -0.01, -0.02; PDist: +0.01, -0.01, 0.00, neither way.
  assert ("(adist +0.013, emdr2 -0.013, pdist +0.000 EM): adist better and emdr2 worse in every "
          "seed, beyond two standard errors.") in reading
  del results[("adist", "all")], results[("emdr2", "all")]
  # The slow rows read on a line of their own: EMDR² at lr x 0.1 minus none +0.02 x 3.
  results[("emdr2_lr_0.1", "all")] = {s: _cell(em) for s, em in enumerate((0.05, 0.04, 0.06))}
  reading = atlas.reading(atlas.by_row(results), ("64", "all"))
  assert ("reader's learning rate, against leaving it frozen (pdist +0.000 EM): no objective "
          "differs in every seed beyond two standard errors.") in reading
  assert ("at a tenth of it, against leaving it frozen (emdr2_lr_0.1 +0.020 EM): emdr2_lr_0.1 "
          "better in every seed") in reading


# ---------------------------------------------------------------------------- fingerprint


def test_the_fingerprint_changes_with_every_gin_the_rows_run_and_only_those(tmp_path,
                                                                            monkeypatch):
  experiments = tmp_path / "gin_configs" / "experiments"
  experiments.mkdir(parents=True)
  for name in ("atlas_toy_pretext.gin", "contriever_toy.gin", "toy_finetune_fid.gin",
               "toy_retro.gin"):
    (experiments / name).write_text(f"NUM_STEPS = 1\n{_MAIN}")
  monkeypatch.setattr(ablations, "REPO", str(tmp_path))
  before = atlas.fingerprint({"bench": "atlas"})
  (experiments / "atlas_toy_pretext.gin").write_text(f"# A comment.\n\nNUM_STEPS = 1\n{_MAIN}")
  assert atlas.fingerprint({"bench": "atlas"}) == before  # comments decide nothing
  assert atlas.fingerprint({"bench": "atlas", "pretext_steps": 5}) != before
  for name in ("atlas_toy_pretext.gin", "contriever_toy.gin", "toy_finetune_fid.gin"):
    (experiments / name).write_text(f"NUM_STEPS = 2\n{_MAIN}")
    changed = atlas.fingerprint({"bench": "atlas"})
    assert changed != before, name
    before = changed
  (experiments / "atlas_toy_new.gin").write_text(f"NUM_STEPS = 7\n{_MAIN}")  # a new atlas_* gin
  assert atlas.fingerprint({"bench": "atlas"}) != before
  before = atlas.fingerprint({"bench": "atlas"})
  (experiments / "toy_retro.gin").write_text(f"NUM_STEPS = 3\n{_MAIN}")  # no row runs RETRO's
  assert atlas.fingerprint({"bench": "atlas"}) == before


def test_a_fid_gin_changes_the_fid_rows_fingerprint_and_keeps_the_recipes(tmp_path,
                                                                          monkeypatch):
  experiments = tmp_path / "gin_configs" / "experiments"
  experiments.mkdir(parents=True)
  for name in ("toy_finetune.gin", "toy_finetune_fid.gin", "atlas_toy_pretext.gin"):
    (experiments / name).write_text(f"NUM_STEPS = 1\n{_MAIN}")
  monkeypatch.setattr(ablations, "REPO", str(tmp_path))
  options = {"bench": "atlas"}
  before = atlas.fingerprints(options)
  assert before["recipe"] != before["fid"]
  assert atlas.row_fingerprint("extractive", before) == before["recipe"]
  assert atlas.row_fingerprint("contriever", before) == before["recipe"]
  assert {atlas.row_fingerprint(row, before) for row in ("fid", "adist", "pretext",
                                                          "closed_book")} == {before["fid"]}
  for name in ("toy_finetune_fid.gin", "atlas_toy_pretext.gin"):
    (experiments / name).write_text(f"NUM_STEPS = 2\n{_MAIN}")
    after = atlas.fingerprints(options)
    assert after["recipe"] == before["recipe"] and after["fid"] != before["fid"], name
    before = after
  # The recipe's fine-tuning gin is read by every row.
  (experiments / "toy_finetune.gin").write_text(f"NUM_STEPS = 2\n{_MAIN}")
  after = atlas.fingerprints(options)
  assert after["recipe"] != before["recipe"] and after["fid"] != before["fid"]


# A gin that runs an entry point (only those enter a fingerprint, with what they include).
_MAIN = "train_main.num_steps = %NUM_STEPS\n"


def test_the_fingerprint_covers_every_gin_a_row_runs():
  covered = lambda path: any(fnmatch.fnmatch(path, p)  # noqa: E731
                             for p in atlas.FINGERPRINT_GINS)
  run = {row.gin for row in atlas.ROWS if row.gin} | {
      atlas.PRETEXT_GIN, atlas.CONTRIEVER_GIN, atlas.EVAL_GIN, atlas.BUILD_INDEX_GIN,
      "gin_configs/experiments/toy_ict.gin", "gin_configs/experiments/toy_pretrain.gin"}
  assert [path for path in sorted(run) if not covered(path)] == []


def test_cell_options_name_the_world_the_split_and_the_steps():
  options = atlas.cell_options(toy_bert_sha256="ab", ict_from_bert=False, pretrain_steps=None,
                               finetune_steps=30, pretext_steps=None)
  assert options["eval_split"] == "test" and options["finetune_steps"] == 30
  assert options["bench"] == "atlas" and "toy_world_generator_version" in options


# -- the wiki world


class _WikiBase:
  """What the wiki cells read of the seed's REALM recipe: its bindings, store and checkpoint."""
  store, pretrain = "/w/store", "/w/seed0/steps200/pretrain"

  def bindings(self, child):
    return {"finetune": ("TASK='/world/qa'", "BLOCK_STORE='/w/store'",
                         "FinetuneJob.reader_len=224"),
            "evaluate": ("TASK='/world/qa'", "evaluate_main.block_store='/w/store'")}[child]

  def pretrain_choice(self):
    return 80, "best by eval/retrieval/utility"


def test_the_wiki_fid_rows_are_the_toy_gins_pointed_at_the_wiki_world():
  layout = atlas.WikiLayout("/w/seed0")
  assert layout.run_dir("fid", "all") == "/w/seed0/steps200/fid_all"
  fid = dict(atlas.wiki_cell_commands(atlas.ROW_BY_NAME["fid"], 0, layout, _WikiBase()))
  chosen = "/w/seed0/steps200/pretrain/checkpoints/80"
  assert f"--gin.build_index_main.checkpoint_dir='{chosen}'" in fid["frozen index"]
  assert "--gin.BLOCK_STORE='/w/store'" in fid["frozen index"]
  finetune = fid["fine-tuning"]
  assert f"--gin_file={atlas.FID_GIN}" in finetune
  assert f"--gin.INIT_CHECKPOINT='{chosen}'" in finetune
  # The wiki world's task after the gin's own (gin: the last binding wins).
  assert finetune[-3:] == ["--gin.TASK='/world/qa'", "--gin.BLOCK_STORE='/w/store'",
                           "--gin.FinetuneJob.reader_len=224"]
  assert fid["evaluation"][-2:] == ["--gin.TASK='/world/qa'",
                                    "--gin.evaluate_main.block_store='/w/store'"]
  closed = dict(atlas.wiki_cell_commands(atlas.ROW_BY_NAME["closed_book"], 0, layout,
                                         _WikiBase()))
  assert "frozen index" not in closed
  # The closed book reads the question alone: its gin's reader length stays.
  assert not any("reader_len" in a for a in closed["fine-tuning"])
  assert "--gin.evaluate_main.candidates='none'" in closed["evaluation"]


def test_the_wiki_section_pairs_fid_with_the_closed_book_seed_by_seed():
  cell = lambda em, recall=None: {"qa_em": em, "recall@5_finetuned": recall, "minutes": 2.0}
  rows = {"extractive": {0: cell(0.04, 0.2), 1: cell(0.05, 0.2)},
          "fid": {0: cell(0.10, 0.3), 1: cell(0.08, 0.3)},
          "closed_book": {0: cell(0.02), 1: cell(0.03)}}
  text = atlas.wiki_markdown(rows, (0, 1))
  # FiD minus the closed book: +0.08, +0.05: mean 0.065, sample std 0.0212, over sqrt(2): 0.015.
  assert ("FiD reader, query tower frozen ('none') minus FiD reader, closed book (no "
          "retrieval), test EM: +0.065 ± 0.015 (seeds 0, 1: +0.080, +0.050): same sign in every "
          "seed, beyond two standard errors") in text
  assert "| FiD reader, closed book (no retrieval) | 0.025 ± 0.007 | n/a | 0, 1 | 2.0 |" in text


def test_a_wiki_fid_cell_runs_its_commands_once_and_reads_its_evaluation(tmp_path, monkeypatch):
  base = _WikiBase()
  base.pretrain = str(tmp_path / "seed0" / "steps200" / "pretrain")
  base.run = lambda: {"qa": {"realm": {"exact_match": 0.04, "recall@5": 0.17}}}
  monkeypatch.setattr(atlas.ablations, "wiki_cell_recipe", lambda row, seed, out: base)
  monkeypatch.setattr(atlas.ablations, "wiki_seed_dir", lambda out, seed: None)
  monkeypatch.setattr(atlas.ablations, "pretraining_id", lambda run_dir: "params p (step 200)")
  monkeypatch.setattr(atlas, "wiki_fingerprint", lambda row: f"fp-{row}")
  stages = []

  def run(name, cmd, realm):
    stages.append(name)
    if "realm_jax.evaluate" in cmd:
      output = next(a for a in cmd if a.startswith("--gin.evaluate_main.output="))
      path = atlas.metrics_path(output.split("=", 1)[1].strip("'"))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w", encoding="utf-8") as f:
        json.dump({"metrics": {"exact_match": 0.0065, "recall@5": 0.1677},
                   "checkpoint_step": 400, "checkpoint_choice": "best by eval/exact_match="
                   "0.0096 in best.json"}, f)

  monkeypatch.setattr(atlas, "_run", run)
  cell = atlas.wiki_cell(atlas.ROW_BY_NAME["fid"], 0, str(tmp_path))
  assert stages == ["fid_all_frozen_index", "fid_all_fine-tuning", "fid_all_evaluation"]
  assert cell["qa_em"] == 0.0065 and cell["recall@5_finetuned"] == 0.1677
  assert ablations.dev_picked(cell) and cell["pretraining"] == "params p (step 200)"
  # Kept evaluation: nothing runs again.
  stages.clear()
  assert atlas.wiki_cell(atlas.ROW_BY_NAME["fid"], 0, str(tmp_path))["qa_em"] == 0.0065
  assert not stages
