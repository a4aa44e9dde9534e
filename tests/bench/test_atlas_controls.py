"""bench/atlas_controls.py: its rows' commands, the logged shares' windows, which rows are made,
read from bench/atlas.py's runs or kept, and the table, on made-up values worked by hand. No
training runs here (the control objective's own tests are tests/models/test_fid_objectives.py's)."""

import json
import os
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import atlas  # noqa: E402  pylint: disable=wrong-import-position
from bench import atlas_controls as controls  # noqa: E402  pylint: disable=wrong-import-position

CKPT = "/o/seed2/realm/pretrain/checkpoints/400"
DEV_PICKED = "step 600: best by eval/exact_match=0.03 in best.json"


def test_the_controls_train_all_questions_with_their_objective_and_learning_rate():
  layout = atlas.Layout("/o/seed2")
  row = {r.name: r for r in controls.CONTROLS}["answer_blocks_lr_0.1"]
  commands = dict(atlas.cell_commands(row, atlas.ALL, 2, layout, "/store",
                                      pretraining_checkpoint=CKPT, init_checkpoint=CKPT))
  assert list(commands) == ["frozen index", "fine-tuning", "evaluation"]
  assert commands["fine-tuning"][3:] == [
      "--gin_file=gin_configs/experiments/atlas_toy_finetune.gin",
      "--gin.RUN_DIR='/o/seed2/realm/answer_blocks_lr_0.1_all'",
      f"--gin.INIT_CHECKPOINT='{CKPT}'", "--gin.train_main.seed=2",
      "--gin.FinetuneJob.retriever_objective='answer_blocks'",
      "--gin.FinetuneJob.retriever_lr_scale=0.1"]
  plain = {r.name: r for r in controls.CONTROLS}["answer_blocks"]
  train = dict(atlas.cell_commands(plain, atlas.ALL, 2, layout, "/store",
                                   pretraining_checkpoint=CKPT,
                                   init_checkpoint=CKPT))["fine-tuning"]
  assert not any("retriever_lr_scale" in arg for arg in train)
  # The bench's rows come first (the frozen reference, then its objectives at both learning
  # rates, in its order), and none of the controls is one of them.
  assert [r.name for r in controls.ROWS[:9]] == ["fid", *atlas.OBJECTIVES,
                                                 *atlas.SLOW_OBJECTIVES]
  assert not set(controls.CONTROL_NAMES) & set(atlas.ROW_BY_NAME)


def test_the_first_and_last_windows_of_a_logged_share():
  logged = {step: step / 1000 for step in range(20, 601, 20)}
  # First: steps 20..100 (< 20 + 100) -> 0.02..0.10, mean 0.06; last: 520..600, mean 0.56.
  assert controls.first_window_mean(logged) == pytest.approx(0.06)
  assert atlas.last_window_mean(logged, controls.WINDOW) == pytest.approx(0.56)
  assert controls.first_window_mean({}) is None


def _shares(first, last):
  return {"reader_any_correct_first": 0.45, "reader_any_correct_last": 0.3,
          "retriever_top_answer_first": first, "retriever_top_answer_last": last,
          "target_top_answer_first": 0.5, "target_top_answer_last": 0.4}


def test_controls_are_made_bench_rows_read_and_every_cell_kept(tmp_path, monkeypatch, capsys):
  out, cells, bench_cells = tmp_path / "runs", tmp_path / "cells", tmp_path / "bench"
  prints = {"recipe": "r" * 64, "fid": "f" * 64}
  monkeypatch.setattr(atlas, "fingerprints", lambda options: prints)
  monkeypatch.setattr(atlas, "_toy_bert_sha256", lambda toy_bert: None)
  layout = atlas.Layout(str(out / "seed2"))
  # The seed's pretraining, finished and claimed for these gins.
  os.makedirs(os.path.join(layout.realm, "pretrain"))
  monkeypatch.setattr(controls.checkpoints, "training_done",
                      lambda run_dir: os.path.basename(run_dir) in ("pretrain", "adist_all",
                                                                    "emdr2_all"))
  (tmp_path / "runs" / "seed2.fingerprint").write_text(prints["recipe"] + "\n")
  # bench/atlas.py kept ADist's and EMDR²'s cells; EMDR²'s run predates the logged shares.
  for row, em in (("adist", 0.03), ("emdr2", 0.02)):
    ablations.save_cell(atlas.cell_path(str(bench_cells), 2, row, atlas.ALL),
                        {"qa_em": em, "recall@5_zero_shot": 0.5, "recall@5_finetuned": 0.05,
                         "qa_checkpoint": DEV_PICKED, "pretraining": "p"}, prints["fid"])
  logged = {os.path.join(layout.realm, "adist_all"): _shares(0.6, 0.2)}
  monkeypatch.setattr(controls, "logged_shares",
                      lambda run_dir: logged.get(run_dir, {**_shares(0.6, 0.7),
                                                           "target_top_answer_last": None}))
  monkeypatch.setattr(controls, "distinct_top_blocks", lambda predictions: 7)
  made = []

  def make_cell(row, size, seed, layout_, shared, settings):
    del shared
    assert (size, seed, layout_, settings.fid_fingerprint) == (atlas.ALL, 2, layout, prints["fid"])
    made.append(row.name)
    logged[layout.run_dir(row.name, size)] = _shares(0.6, 0.9)
    return {"qa_em": 0.04, "recall@5_zero_shot": 0.5, "recall@5_finetuned": 0.6,
            "qa_checkpoint": DEV_PICKED, "pretraining": "p", "row": row.name}

  monkeypatch.setattr(atlas, "make_cell", make_cell)
  settings = atlas.Settings(store="/store")
  results = controls.run(str(out), (2,), settings, str(cells), str(bench_cells))
  assert made == list(controls.CONTROL_NAMES)
  # No kept cell of the frozen reference: left out.
  assert set(results) == {"adist", *controls.CONTROL_NAMES}
  assert results["adist"][2]["retriever_top_answer_last"] == 0.2
  assert results["answer_blocks"][2]["retriever_top_answer_last"] == 0.9
  assert results["answer_blocks"][2]["distinct_top_blocks"] == 7
  said = capsys.readouterr().out
  assert "FiD reader + EMDR²: no finished run" not in said
  assert "logged no train/target_top_answer (made before it was logged); left out" in said
  assert "FiD reader + PDist (perplexity distillation): no finished run" in said
  # Again: every cell kept as it was written, nothing made, nothing read from the runs.
  made.clear()
  logged.clear()
  written = {path.name: path.stat().st_mtime_ns for path in cells.iterdir()}
  again = controls.run(str(out), (2,), settings, str(cells), str(bench_cells))
  assert made == [] and again == results
  assert {path.name: path.stat().st_mtime_ns for path in cells.iterdir()} == written
  assert "answer blocks (control): kept in" in capsys.readouterr().out
  # --only: those rows alone.
  assert set(controls.run(str(out), (2,), settings, str(cells), str(bench_cells),
                          only=("adist", "answer_blocks"))) == {"adist", "answer_blocks"}
  # --kept_only, with the seed's runs gone: the kept cells alone, nothing made or checked.
  monkeypatch.setattr(controls, "check_pretraining", lambda *args: pytest.fail("checked runs"))
  kept = controls.run(str(tmp_path / "gone"), (2,), settings, str(cells), str(bench_cells),
                      make=False)
  assert made == [] and kept == results
  os.remove(controls.cell_path(str(cells), 2, "answer_blocks"))
  kept = controls.run(str(tmp_path / "gone"), (2,), settings, str(cells), str(bench_cells),
                      make=False)
  assert made == [] and set(kept) == set(results) - {"answer_blocks"}


def test_a_seed_without_its_pretraining_of_these_gins_is_refused(tmp_path, monkeypatch):
  layout = atlas.Layout(str(tmp_path / "seed2"))
  monkeypatch.setattr(controls.checkpoints, "training_done", lambda run_dir: True)
  with pytest.raises(SystemExit, match="no finished REALM pretraining of these gins; make it "
                                       r"first: python bench/atlas.py --out .* --seeds 2"):
    controls.check_pretraining(layout, "r" * 64)  # no claim recorded
  (tmp_path / "seed2.fingerprint").write_text("other\n")
  with pytest.raises(SystemExit, match="--seeds 2"):
    controls.check_pretraining(layout, "r" * 64)
  (tmp_path / "seed2.fingerprint").write_text("r" * 64 + "\n")
  controls.check_pretraining(layout, "r" * 64)
  monkeypatch.setattr(controls.checkpoints, "training_done", lambda run_dir: False)
  with pytest.raises(SystemExit):
    controls.check_pretraining(layout, "r" * 64)


def test_the_table_has_the_rows_measured_in_order_mean_and_sd_over_seeds():
  cell = lambda em, after: {"qa_em": em, "recall@5_finetuned": after,  # noqa: E731
                            "recall@5_zero_shot": 0.511, **_shares(0.6, after)}
  results = {"answer_blocks": {2: {**cell(0.10, 0.6), "distinct_top_blocks": 16},
                               1: {**cell(0.12, 0.8), "distinct_top_blocks": 19}},
             "adist": {2: cell(0.03, 0.02)}, "fid": {2: cell(0.11, 0.48)}}
  text = controls.markdown(results, (1, 2), only=("adist", "answer_blocks"))
  assert text.startswith("`python bench/atlas_controls.py --seeds 1 2 --only adist "
                         "answer_blocks --write`")
  lines = text.splitlines()
  rows = [line for line in lines if line.startswith("| ") and "---" not in line][1:]
  # The frozen reference, ADist (the bench's), then the control; 0.10 and 0.12: mean 0.110,
  # sample sd 0.014; 16 and 19 distinct blocks: 18 ± 2 (17.5 and 2.1 at no decimals).
  assert rows[0].startswith("| FiD reader, query tower frozen ('none') | 0.110 | 0.480 |")
  assert rows[1].startswith("| FiD reader + ADist (attention distillation) | 0.030 | 0.020 |")
  assert rows[2].startswith("| answer blocks (control) | 0.110 ± 0.014 | 0.700 ± 0.141 |")
  assert rows[2].endswith("| 18 ± 2 | 1, 2 |")
  assert "Zero-shot test recall@5 of that index: 0.511." in text


def test_distinct_top_blocks_counts_the_first_retrieved_block_of_each_question(tmp_path):
  path = tmp_path / "p.jsonl"
  records = [{"question": "q", "answers": ["b"], "prediction": "a", "correct": False,
              "block_ids": ids} for ids in ([3, 1], [3, 2], [5, 3], [], [1])]
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  assert controls.distinct_top_blocks(str(path)) == 3  # 3, 5 and 1


def test_relative_paths_are_read_from_where_the_command_runs(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  args = controls.parse_args(["--out", "runs", "--bench_cells", "bench", "--cells", "cells"])
  assert (args.out, args.bench_cells, args.cells) == tuple(
      str(tmp_path / name) for name in ("runs", "bench", "cells"))
