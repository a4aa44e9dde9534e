"""bench/fid_copying.py: copied answers and EM by question kind, worked by hand."""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import fid_copying  # noqa: E402  pylint: disable=wrong-import-position

BLOCKS = {0: "Tessavar Tessavar was founded on 9 November 1790 by the Glassblowers' Guild.",
          1: "Zoë Müller Zoë Müller was born in 1843."}


def test_copied_is_whole_words_after_normalisation():
  texts = list(BLOCKS.values())
  assert fid_copying.copied("9 November 1790", texts)
  assert fid_copying.copied("The Glassblowers Guild", texts)  # article and punctuation dropped
  assert fid_copying.copied("zoe muller", texts) is False  # NFD keeps the marks: "zoë" != "zoe"
  assert not fid_copying.copied("9 march 1790", texts)  # spliced from copied and new words
  assert not fid_copying.copied("glassbl", texts)  # a word cut inside
  assert not fid_copying.copied("184", texts)
  assert not fid_copying.copied("", texts) and not fid_copying.copied("the", texts)


def test_year_questions():
  assert fid_copying.is_year_question("When was Tessavar founded?")
  assert fid_copying.is_year_question("In what year was Zoë Müller born?")
  assert not fid_copying.is_year_question("Who founded Tessavar?")
  assert not fid_copying.is_year_question("Whenever")


def test_summarize_by_hand():
  records = [
      # year, right, copied; the answer in a read block
      {"question": "When was Tessavar founded?", "answers": ["1790"],
       "prediction": "9 November 1790", "correct": True, "block_ids": [0, -1]},
      # year, wrong, spliced; the answer in block 1, read
      {"question": "In what year was Zoë Müller born?", "answers": ["1843"],
       "prediction": "9 march 1843", "correct": False, "block_ids": [1, 0]},
      # other, wrong, copied from block 1 (the null document, -1, is skipped); its answer is
      # only in block 0, not read
      {"question": "Who founded Tessavar?", "answers": ["the Glassblowers' Guild"],
       "prediction": "Zoë Müller", "correct": False, "block_ids": [-1, 1]},
      # other, right, not in its one block (block 0 holds it, but was not retrieved)
      {"question": "Who founded Tessavar?", "answers": ["Glassblowers' Guild"],
       "prediction": "glassblowers guild", "correct": True, "block_ids": [1]},
  ]
  s = fid_copying.summarize(records, BLOCKS.__getitem__)
  assert (s["questions"], s["year_questions"]) == (4, 2)
  assert s["em"] == 0.5 and s["copied"] == 0.5
  assert s["copied_wrong"] == 0.5  # of the two wrong, the third is copied
  assert (s["em_year"], s["em_other"]) == (0.5, 0.5)
  # The first two read a block with their answer; of those, the first is right.
  assert (s["answer_read"], s["em_answer_read"]) == (0.5, 0.5)
  none_wrong = fid_copying.summarize(records[:1], BLOCKS.__getitem__)
  assert math.isnan(none_wrong["copied_wrong"]) and math.isnan(none_wrong["em_other"])
  # The closed book reads no block (only padding): copying is undefined, not 0.
  closed = fid_copying.summarize([{**r, "block_ids": [-1]} for r in records],
                                 BLOCKS.__getitem__)
  assert math.isnan(closed["copied"]) and math.isnan(closed["copied_wrong"])
  assert math.isnan(closed["answer_read"]) and math.isnan(closed["em_answer_read"])
  assert closed["em"] == 0.5


def test_the_table_is_mean_and_sd_over_seeds_per_row_and_size():
  def summary(em, copied, year=212):
    return {"questions": 1000, "em": em, "copied": copied, "copied_wrong": copied,
            "year_questions": year, "em_year": em, "em_other": em, "answer_read": copied,
            "em_answer_read": em}
  nan = float("nan")
  kept_before = summary(0.03, 0.2)  # a summary kept before the answer columns existed
  del kept_before["answer_read"], kept_before["em_answer_read"]
  lines = fid_copying.table({("fid", "all", 0): summary(0.10, 0.50),
                             ("fid", "all", 2): summary(0.12, 0.60),
                             ("closed_book", "64", 1): summary(0.02, nan),
                             ("adist", "all", 0): kept_before}).splitlines()
  assert lines[0].startswith("| row | questions | test EM | copied from a retrieved block (%) |")
  assert "EM, year questions (212) |" in lines[0]
  assert lines[0].endswith("| answer in a read block (%) | EM, answer in a read block | seeds |")
  # 0.10 and 0.12: mean 0.110, sample sd 0.0141; 50% and 60%: 55.0 ± 7.1.
  assert lines[2] == "| fid | all | 0.110 ± 0.014 | 55.0 ± 7.1 | 55.0 ± 7.1 | 0.110 ± 0.014 | " \
      "0.110 ± 0.014 | 55.0 ± 7.1 | 0.110 ± 0.014 | 0, 2 |"
  assert lines[3] == "| closed_book | 64 | 0.020 | n/a | n/a | 0.020 | 0.020 | n/a | 0.020 | 1 |"
  assert lines[4] == "| adist | all | 0.030 | 20.0 | 20.0 | 0.030 | 0.030 | n/a | n/a | 0 |"


def test_a_bad_record_names_its_file_and_line(tmp_path):
  path = tmp_path / "p.jsonl"
  good = {"question": "q", "answers": ["a"], "prediction": "a", "correct": True,
          "block_ids": [0]}
  path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "block_ids": None}) + "\n")
  with pytest.raises(ValueError, match=r"p.jsonl: record 2: TypeError"):
    fid_copying.read_predictions(str(path))
  path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "answers": []}) + "\n")
  with pytest.raises(ValueError, match=r"p.jsonl: record 2: TypeError.*answers"):
    fid_copying.read_predictions(str(path))
  empty = tmp_path / "e.jsonl"
  empty.write_text("")
  with pytest.raises(ValueError, match="e.jsonl: no predictions"):
    fid_copying.read_predictions(str(empty))


def test_predictions_paths_are_where_the_atlas_bench_writes_them():
  assert fid_copying.predictions_path("/o", 1, "extractive", "all") == (
      "/o/seed1/realm/eval/toy_qa_test.jsonl")
  assert fid_copying.predictions_path("/o", 1, "extractive", "64") == (
      "/o/seed1/realm/eval/toy_qa_extractive_64_test.jsonl")
  assert fid_copying.predictions_path("/o", 0, "fid", "256") == (
      "/o/seed0/realm/fid_256/eval/fid_256_test.jsonl")
  # The wiki world's: beside the seed's REALM 1x run of bench/wiki_runs.py.
  assert fid_copying.predictions_path("/w", 3, "extractive", "all", "wiki") == (
      "/w/seed3/steps200/eval/realm_test.jsonl")
  assert fid_copying.predictions_path("/w", 3, "fid", "all", "wiki") == (
      "/w/seed3/steps200/fid_all/eval/fid_all_test.jsonl")
  assert fid_copying.predictions_path("/w", 3, "closed_book", "all", "wiki") == (
      "/w/seed3/steps200/closed_book_all/eval/closed_book_all_test.jsonl")


def test_summaries_are_kept_and_read_back_when_the_predictions_are_gone(tmp_path, capsys):
  out, cells = str(tmp_path / "out"), str(tmp_path / "cells")
  prints = {"fid": "f" * 64, "adist": "f" * 64}
  record = {"question": "When was Tessavar founded?", "answers": ["1790"],
            "prediction": "9 November 1790", "correct": True, "block_ids": [0]}
  path = fid_copying.predictions_path(out, 0, "fid", "all")
  os.makedirs(os.path.dirname(path))
  wrong = {"question": "Who founded Tessavar?", "answers": ["the Glassblowers' Guild"],
           "prediction": "Zoë Müller", "correct": False, "block_ids": [0]}
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n" + json.dumps(wrong) + "\n")
  rows, sizes, seeds = ("fid", "adist"), ("all",), (0,)
  summaries, missing = fid_copying.collect(out, rows, sizes, seeds, BLOCKS.__getitem__, cells,
                                           prints)
  assert (summaries[("fid", "all", 0)]["em"], summaries[("fid", "all", 0)]["copied"]) == (0.5, 0.5)
  assert missing == [f"adist all seed 0 ({fid_copying.predictions_path(out, 0, 'adist', 'all')})"]
  os.remove(path)  # --out is gone: the kept summary stands in
  again, _ = fid_copying.collect(out, rows, sizes, seeds, BLOCKS.__getitem__, cells, prints)
  assert again == summaries
  # Kept for other gins: not read.
  other, missing = fid_copying.collect(out, rows, sizes, seeds, BLOCKS.__getitem__, cells,
                                       {"fid": "g" * 64, "adist": "g" * 64})
  assert other == {} and len(missing) == 2
  assert "made with other gins or options" in capsys.readouterr().out
