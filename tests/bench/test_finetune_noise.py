"""bench/finetune_noise.py: the paired comparison of two runs' predictions, worked by hand."""

import json
import math
import os
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import finetune_noise  # noqa: E402  pylint: disable=wrong-import-position


def test_paired_by_hand():
  a = {"q1": True, "q2": True, "q3": False, "q4": False}
  b = {"q1": True, "q2": False, "q3": True, "q4": True, "q5": True}  # q5: not in a
  r = finetune_noise.paired(a, b)
  # d = (0, 1, -1, -1): mean -1/4; squares about the mean 1/16 + 25/16 + 9/16 + 9/16 = 44/16.
  assert (r["questions"], r["only_a"], r["only_b"]) == (4, 1, 2)
  assert (r["em_a"], r["em_b"]) == (0.5, 0.75)
  assert r["difference"] == -0.25
  assert math.isclose(r["question_se"], math.sqrt(44 / 16 / 3 / 4))
  with pytest.raises(ValueError, match="1 question"):
    finetune_noise.paired({"q": True}, {"q": False})


def test_a_bad_record_names_its_file_and_line(tmp_path):
  path = tmp_path / "p.jsonl"
  path.write_text(json.dumps({"question": "q", "correct": True}) + "\n{\"question\": \"r\"}\n")
  with pytest.raises(ValueError, match=r"p.jsonl: record 2: 'correct'"):
    finetune_noise.read_correct(str(path))


def _write_predictions(out, seed, row, correct):
  path = finetune_noise.predictions_path(str(out), seed, row)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for question, right in correct.items():
      f.write(json.dumps({"question": question, "correct": right}) + "\n")


def test_cells_outlive_the_runs_and_the_table_reads_them(tmp_path):
  out, cells = tmp_path / "runs", str(tmp_path / "cells")
  realm = {"q1": True, "q2": True, "q3": False, "q4": False}
  _write_predictions(out, 3, "realm", realm)
  _write_predictions(out, 3, "realm_refit", {"q1": True, "q2": False, "q3": True, "q4": True})
  _write_predictions(out, 3, "orqa", {"q1": False, "q2": False, "q3": False, "q4": False})
  by_seed, missing = finetune_noise.collect(str(out), [3, 4], cells, "print")
  assert missing == [4]
  refit, orqa = by_seed[3]["realm_refit"], by_seed[3]["orqa"]
  # refit minus REALM: d = (0, -1, 1, 1); ORQA minus REALM: d = (-1, -1, 0, 0).
  assert (refit["em_a"], refit["em_b"], refit["only_a"], refit["only_b"]) == (0.75, 0.5, 2, 1)
  assert (orqa["difference"], orqa["only_a"], orqa["only_b"]) == (-0.5, 0, 2)
  shutil.rmtree(out)
  kept, _ = finetune_noise.collect(str(out), [3], cells, "print")
  assert kept == by_seed
  assert finetune_noise.collect(str(out), [3], cells, "other print")[0] == {}  # stale: not read
  lines = finetune_noise.table(kept).splitlines()
  assert lines[2] == ("| REALM fine-tuned again minus REALM | 3 | 0.750, 0.500 | 2 | 1 | +0.250 | "
                      f"{math.sqrt((0.25**2 + 1.25**2 + 2 * 0.75**2) / 3 / 4):.4f} |")
  assert lines[3].startswith(
      "| ORQA-style baseline minus REALM | 3 | 0.000, 0.500 | 0 | 2 | -0.500 |")
  assert lines[-1].startswith("- the two fine-tunings of one pretraining disagree on 3 to 3 of 4")
