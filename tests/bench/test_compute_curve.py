"""bench/compute_curve.py: its lengths, seeds and cell directories, and its table of paired
differences checked on hand-worked numbers."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import compute_curve  # noqa: E402  pylint: disable=wrong-import-position


def test_lengths_seeds_and_cells():
  assert [compute_curve.steps_of(m) for m in (1, 4, 16)] == [400, 1600, 6400]
  # 1x is Table 2's own cells, made with the recipe's steps (no pretrain_steps option).
  assert compute_curve.cells_dir(1) == ablations.DEFAULT_CELLS
  assert compute_curve.pretrain_steps_option(1) is None
  assert compute_curve.cells_dir(4, "/c") == "/c/toy_1600"
  assert compute_curve.pretrain_steps_option(16) == 6400
  assert compute_curve.seeds_at(1, (0, 1, 2)) == (0, 1, 2, 3, 4)
  assert compute_curve.seeds_at(4, (2, 0)) == (0, 2)


def _cell(em, recall, utility=0.1, accuracy=0.12):
  return {ablations.EM: em, ablations.RECALL: recall, "retrieval_utility": utility,
          "mlm_accuracy": accuracy}


def test_the_table_pairs_realm_with_the_baseline_seed_by_seed():
  rows = {"realm": {0: _cell(0.2, 0.5, 0.1), 1: _cell(0.3, 0.4, 0.3)},
          "orqa": {0: _cell(0.1, 0.5), 1: _cell(0.1, 0.5)}}
  line = compute_curve.curve_line(4, rows)
  # EM differences +0.1 and +0.2: mean 0.15, sample std 0.0707, over sqrt(2): 0.05.
  assert line[:3] == ["1,600 (4x)", "2", "+0.150 ± 0.050 (seeds 0, 1: +0.100, +0.200); every "
                                          "seed agrees"]
  # Recall differences 0 and -0.1: no agreement (a zero difference has no sign).
  assert line[3] == "-0.050 ± 0.050 (seeds 0, 1: +0.000, -0.100)"
  assert line[4] == "0.200 ± 0.141"  # utility: mean ± sample std of REALM's
  table = compute_curve.table({4: rows, 16: {}})
  assert table.splitlines()[-1].startswith("| 6,400 (16x) | 0 | n/a | n/a |")


def test_kept_rows_read_only_current_cells(tmp_path, monkeypatch):
  monkeypatch.setattr(ablations, "row_fingerprint", lambda row, options: f"fp-{row.name}")
  cells = tmp_path / "toy_1600"
  cells.mkdir()
  for name, fingerprint in (("realm", "fp-realm"), ("orqa", "stale")):
    (cells / f"seed0_{name}.json").write_text(json.dumps(
        {"summary": _cell(0.2, 0.5), "fingerprint": fingerprint}))
  rows = compute_curve.kept_rows(4, (0, 1), None, str(tmp_path))
  assert set(rows) == {"realm"} and set(rows["realm"]) == {0}
