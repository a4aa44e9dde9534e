"""bench/ablations.py's report: mean ± std cells over seeds and the verdict on each of the
paper's directions, checked on hand-worked numbers."""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position


def _row(em, utility=0.1):
  return {"qa_em_realm": em, "recall@5_after": 0.25, "mlm_accuracy_realm": 0.5,
          "retrieval_utility_last": utility, "refreshes": 9.0, "minutes": 2.0}


def test_cells_are_mean_and_population_std_over_seeds():
  rows = {"realm": [_row(0.2), _row(0.4)], "no_null": [_row(0.1, math.nan)] * 2}
  table = ablations.table(rows).splitlines()
  assert table[2].startswith("| REALM") and "| 0.300 ± 0.100 |" in table[2]
  assert "| n/a |" in table[3]  # utility is undefined without the null document


def test_a_direction_holds_only_beyond_the_sum_of_the_spreads():
  rows = {"realm": [_row(0.30), _row(0.32)],          # 0.31 ± 0.01
          "random_span": [_row(0.20), _row(0.30)],    # 0.25 ± 0.05: gap 0.06 = spread 0.06
          "random_token": [_row(0.10), _row(0.12)],   # 0.11 ± 0.01: gap 0.14 > 0.06
          "never_refresh": [_row(0.40), _row(0.40)]}  # better than REALM
  lines = ablations.directions(rows).splitlines()
  verdicts = {line.split(":")[0][2:]: line for line in lines}
  assert "within the seed spread" in verdicts["salient-span masking > random-span masking"]
  assert "holds beyond" in verdicts["random-span masking > random-token masking"]
  assert "does not hold" in verdicts["refreshing beats a never-refreshed index"]
  assert len(lines) == 3  # rows not measured (no_null, no_ict) are not judged


def test_finished_cells_are_reused_unless_made_with_other_gins_or_options(tmp_path,
                                                                         monkeypatch, capsys):
  fingerprint = ablations.fingerprint({"pretrain_steps": None})
  assert fingerprint != ablations.fingerprint({"pretrain_steps": 100})
  path = str(tmp_path / "cells" / "seed0_realm.json")
  assert ablations.load_cell(path, fingerprint) is None  # nothing kept yet
  ablations.save_cell(path, _row(0.25), fingerprint)
  assert ablations.load_cell(path, fingerprint) == _row(0.25)
  assert os.listdir(tmp_path / "cells") == ["seed0_realm.json"]  # no temporary left behind
  # Another gin's contents change the fingerprint, and the kept cell is not reused.
  gin_dir = tmp_path / "repo" / "gin_configs" / "experiments"
  gin_dir.mkdir(parents=True)
  (gin_dir / "toy_pretrain.gin").write_text("NUM_STEPS = 200\n")
  monkeypatch.setattr(ablations, "REPO", str(tmp_path / "repo"))
  before = ablations.fingerprint({})
  (gin_dir / "toy_pretrain.gin").write_text("# How many steps.\n\nNUM_STEPS = 200\n")
  assert ablations.fingerprint({}) == before  # comments do not decide results
  (gin_dir / "toy_pretrain.gin").write_text("NUM_STEPS = 201\n")
  assert ablations.fingerprint({}) != before
  ablations.save_cell(path, _row(0.25), before)
  capsys.readouterr()
  assert ablations.load_cell(path, ablations.fingerprint({})) is None
  assert "made with other gins or options" in capsys.readouterr().out
  with open(path, "w", encoding="utf-8") as f:
    f.write("{not json")
  assert ablations.load_cell(path, before) is None
  assert f"{path}: unreadable" in capsys.readouterr().out
