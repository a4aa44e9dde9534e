"""bench/finetune_noise.py: the paired comparison of two runs' predictions, worked by hand."""

import json
import math
import os
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
