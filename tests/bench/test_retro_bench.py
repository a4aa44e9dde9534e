"""bench/retro.py: its table and paired differences on hand-made cells (the runs themselves
are tests/test_retro_job.py's and tests/evaluation/test_retro_eval.py's)."""

import os
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from bench import retro as retro_bench  # noqa: E402


def _cell(bpb, bpb_off, salient, other, minutes=1.0):
  return {"bpb": bpb, "bpb_no_retrieval": bpb_off, "loss": 0.0, "loss_no_retrieval": 0.0,
          "loss_salient": salient, "loss_other": other, "bpb_filtered": bpb, "step": 300,
          "salient_share": 0.16, "params": 1000, "params_trained": 1000,
          "flops_per_token": 2e6, "filtered_share": 0.9, "minutes": minutes}


def test_the_paired_differences_are_per_seed_and_say_whether_seeds_agree():
  results = {
      ("toy", "baseline"): {0: _cell(2.0, 2.0, 5.0, 3.0), 1: _cell(2.2, 2.2, 5.2, 3.1)},
      ("toy", "retro"): {0: _cell(1.8, 2.1, 4.0, 2.9), 1: _cell(2.1, 2.3, 4.6, 3.2)},
  }
  text = retro_bench.differences(results, ["toy"])
  lines = {line.split(": ")[1]: line for line in text.splitlines()}
  # RETRO on minus the baseline: 1.8 - 2.0 = -0.2, 2.1 - 2.2 = -0.1: mean -0.15, SE 0.05.
  on = lines["RETRO (retrieval on) minus the baseline, bits per byte"]
  assert "-0.150 ± 0.050 (seeds 0, 1: -0.200, -0.100); every seed agrees" in on
  # With minus without retrieval, the same model: -0.3, -0.2.
  assert "-0.250 ± 0.050" in lines[
      "RETRO with retrieval minus the same model without, bits per byte"]
  # Other tokens: -0.1 and +0.1: the seeds disagree.
  other = lines["other tokens' loss, RETRO minus the baseline (nats)"]
  assert "+0.000 ± 0.100" in other and other.endswith("the seeds do not agree")
  assert not any("RETRO-fitted" in line for line in lines)  # no retrofit cells, no line


def test_the_table_has_a_row_per_corpus_and_row_and_no_retrieval_figure_for_the_baseline():
  results = {("toy", "baseline"): {0: _cell(2.0, 2.0, 5.0, 3.0)},
             ("toy", "retro"): {0: _cell(1.8, 2.1, 4.0, 2.9), 1: _cell(2.0, 2.3, 4.2, 3.1)}}
  lines = retro_bench.table(results, ["toy"]).splitlines()
  assert len(lines) == 4  # header, rule, two rows
  baseline, retro = lines[2].split(" | "), lines[3].split(" | ")
  assert baseline[4] == "-" and baseline[5] == "2.0000"
  assert retro[4] == "1.9000 ± 0.1414" and retro[5] == "2.2000 ± 0.1414"
  assert retro[3] == "2.00 M"


@pytest.mark.parametrize("row", ["baseline", "retro", "retrofit"])
def test_model_costs_count_what_each_row_has_and_trains(row):
  from realm_jax.models import retro  # pylint: disable=import-outside-toplevel
  config = retro.RetroConfig(vocab_size=64, hidden_size=16, num_layers=2, num_heads=2,
                             intermediate_size=32, chunk_size=4, neighbour_len=8,
                             encoder_layers=1, cca_start=1, cca_every=1)
  run = lambda r: {"chunks_per_sequence": 2, "num_neighbours": 2,  # noqa: E731
                   "retrieval": r != "baseline", "retrofit": r == "retrofit"}
  costs = retro_bench.model_costs(config, run(row))
  reference = {r: retro_bench.model_costs(config, run(r)) for r in ("baseline", "retro")}
  if row == "baseline":
    assert costs["params"] == costs["params_trained"] < reference["retro"]["params"]
  elif row == "retro":
    assert costs["params"] == costs["params_trained"]
    assert costs["flops_per_token"] > reference["baseline"]["flops_per_token"]
  else:  # the decoder is frozen: only the encoder and the CCA train
    assert costs["params"] == reference["retro"]["params"]
    assert costs["params_trained"] == costs["params"] - reference["baseline"]["params"]


def test_the_leakage_table_averages_each_threshold_over_the_seeds():
  curve = lambda bpbs: [{"max_overlap": a, "token_share": s, "bpb": b,  # noqa: E731
                         "bpb_no_retrieval": b}
                        for a, s, b in zip((0.25, 1.0), (0.5, 1.0), bpbs)]
  results = {("toy", "retro"): {0: {**_cell(1, 1, 1, 1), "overlap_curve": curve((1.0, 2.0))},
                                1: {**_cell(1, 1, 1, 1), "overlap_curve": curve((3.0, 4.0))}}}
  lines = retro_bench.leakage_table(results, ["toy"]).splitlines()
  assert lines[0] == "| corpus | row | alpha <= 0.25 | alpha <= 1 |"
  assert lines[2] == "| toy | RETRO (trained with retrieval) | 2.0000 (50%) | 3.0000 (100%) |"


@pytest.mark.parametrize("control_with, expected", [
    (1.0, "give it 1.000, so the CCA reads them"),
    (1.8, "give it 0.200 (10% of its bits, where copying the continuation would save about "
          "half), against 0.100 from the neighbours of other documents"),
    (1.95, "even neighbours that hold the very text it predicts give it only 0.050")])
def test_the_reading_says_how_far_the_positive_control_reads_its_neighbours(control_with,
                                                                            expected):
  """Without its neighbours the control reads 2.0 bits per byte: saving over a quarter of them
  is reading fully, over a twentieth in part, less barely (RETRO itself gains 2.2 - 2.1)."""
  results = {("toy", "baseline"): {0: _cell(2.0, 2.0, 5.0, 3.0)},
             ("toy", "retro"): {0: _cell(2.1, 2.2, 5.1, 3.1)},
             ("toy", "retro_own_document"): {0: _cell(control_with, 2.0, 5.0, 3.0)}}
  assert expected in retro_bench.reading(results, ["toy"])


def test_the_reading_says_when_a_lead_over_the_baseline_is_not_the_neighbours():
  results = {("toy", "baseline"): {0: _cell(2.2, 2.2, 5.0, 3.0)},
             ("toy", "retro"): {0: _cell(2.0, 2.01, 5.1, 3.1)}}
  assert ("its neighbours give it 0.010 of its 0.200 lead, so the rest comes from how it "
          "trained") in retro_bench.reading(results, ["toy"])


@pytest.mark.parametrize("seconds, minutes", [(185.0, 185 / 60), (4.25, 4.2 / 60)])
def test_training_minutes_read_the_trainers_last_line_in_either_duration_form(tmp_path, seconds,
                                                                            minutes):
  from realm_jax import progress  # pylint: disable=import-outside-toplevel
  run_dir = str(tmp_path / "run")
  # The trainer's own words and duration format; a resumed run appends its line.
  with open(run_dir + ".log", "w", encoding="utf-8") as f:
    f.write(f"INFO {run_dir}: trained to step 100 in 1:00:00\n"
            f"INFO {run_dir}: trained to step 300 in {progress.format_duration(seconds)}\n")
  assert retro_bench.training_minutes(run_dir) == pytest.approx(minutes)
  assert retro_bench.training_minutes(str(tmp_path / "missing")) == 0.0


def test_the_wiki_worlds_chunks_are_keyed_by_its_english_bert(tmp_path, monkeypatch):
  """The wiki world's chunk database: its documents' text, each chunk's key the English BERT's
  last hidden states averaged over the chunk, checked against transformers' BertModel."""
  import json  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from realm_jax import data  # pylint: disable=import-outside-toplevel
  from realm_jax.data import vocab as vocab_lib  # pylint: disable=import-outside-toplevel
  from realm_jax.data import wiki  # pylint: disable=import-outside-toplevel
  from realm_jax.index import chunks  # pylint: disable=import-outside-toplevel
  world = tmp_path / "world"
  world.mkdir()
  with open(world / "docs.jsonl", "w", encoding="utf-8") as f:
    for title, text in (("Ada Lovelace", "Ada Lovelace was an English mathematician born in "
                         "London in 1815, known for her work on the Analytical Engine."),
                        ("Paris", "Paris is the capital and largest city of France.")):
      f.write(json.dumps({"id": title, "title": title, "text": text}) + "\n")
  monkeypatch.setattr(wiki, "world_dir", lambda seed=0: str(world))
  path, blocks = retro_bench.chunk_database("wiki", str(tmp_path / "out"))
  assert blocks == str(tmp_path / "out" / "wiki_blocks") and path.endswith("-retro16-wiki_bert")
  db = chunks.ChunkDatabase.open(path)
  assert db.manifest["keys"]["model"] == data.WIKI_BERT_DIR and db.num_chunks >= 2
  model = transformers.BertModel.from_pretrained(data.WIKI_BERT_DIR).eval()
  for i in range(db.num_chunks):
    n = int(db.chunk_lengths[i])
    ids = np.r_[vocab_lib.CLS_ID, db.chunk_tokens[i, :n], vocab_lib.SEP_ID][None]
    with torch.no_grad():
      hidden = model(torch.tensor(ids.astype(np.int64))).last_hidden_state[0, 1:n + 1]
    np.testing.assert_allclose(db.keys[i], hidden.mean(0).numpy(), rtol=1e-4, atol=1e-4)
  assert retro_bench.key_bert("toy") == data.TOY_BERT_DIR


def test_the_keys_paragraph_names_each_corporas_bert():
  assert retro_bench.keys_description(["toy", "pydocs"]) == (
      "the chunk keys of both corpora from the shipped toy BERT, which has read only the toy "
      "world's generated text")
  assert retro_bench.keys_description(["wiki"]).startswith(
      "the wiki world's chunk keys from its English BERT")


def test_another_length_has_runs_cells_and_a_section_of_its_own(tmp_path, monkeypatch, capsys):
  """`--steps N`: the runs in seed<s>_steps<N> and the cells in retro_steps<N>, so that the
  gin's length's cells are never made again over; the section says N and its command
  reproduces it. Without it, the default cells and the plain title."""
  made, written = [], []
  cell = _cell(1.8, 1.81, 8.4, 6.2)
  monkeypatch.setattr(retro_bench, "run", lambda out, corpora, seeds, steps, cells: (
      made.append((out, steps, cells))
      or {("wiki", row): {0: cell} for row, _ in retro_bench.ROWS}))
  monkeypatch.setattr(retro_bench.report, "write_section",
                      lambda title, body, **kwargs: written.append((title, body)))
  args = ["--corpora", "wiki", "--seeds", "0", "--out", str(tmp_path), "--write"]
  assert retro_bench.main(args + ["--steps", "1200"]) == 0
  assert made[-1] == (str(tmp_path), 1200,
                      os.path.join(REPO_ROOT, "bench", "results", "retro_steps1200"))
  assert retro_bench.seed_runs_dir("/o", "wiki", 2, 1200) == "/o/wiki/seed2_steps1200"
  assert retro_bench.seed_runs_dir("/o", "wiki", 2, None) == "/o/wiki/seed2"
  assert written[-1][0] == "RETRO on the wiki world, trained 1200 steps"
  assert written[-1][1].startswith(
      "`python bench/retro.py --seeds 0 --corpora wiki --steps 1200 --write` (4 minutes of "
      "runs; cells kept in bench/results/retro_steps1200/ ")
  assert retro_bench.main(args) == 0
  assert made[-1] == (str(tmp_path), None, os.path.join(REPO_ROOT, "bench", "results", "retro"))
  assert written[-1][0] == "RETRO on the wiki world"
  assert "--corpora wiki --write` (4 minutes of runs; cells kept in bench/results/retro/ " in (
      written[-1][1])
  with pytest.raises(SystemExit):
    retro_bench.main(args + ["--steps", "0"])
  assert "--steps: a positive count" in capsys.readouterr().err
