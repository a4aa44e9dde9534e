"""bench/compute_curve.py: its lengths, seeds and cell directories, and its table of paired
differences checked on hand-worked numbers."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import compute_curve  # noqa: E402  pylint: disable=wrong-import-position

Variant = compute_curve.Variant


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
  # Without the mixed row, the EM difference has no parts.
  assert line[4:6] == ["n/a", "n/a"]
  assert line[6] == "0.200 ± 0.141"  # utility: mean ± sample std of REALM's
  # With it: the retriever's part (mixed - baseline) and the encoder's (REALM - mixed).
  rows[compute_curve.MIXED] = {0: _cell(0.15, 0.5), 1: _cell(0.1, 0.4)}
  line = compute_curve.curve_line(4, rows)
  assert line[4] == "+0.025 ± 0.025 (seeds 0, 1: +0.050, +0.000)"
  assert line[5] == "+0.125 ± 0.075 (seeds 0, 1: +0.050, +0.200); every seed agrees"
  table = compute_curve.table({4: rows, 16: {}})
  assert table.splitlines()[-1].startswith("| 6,400 (16x) | 0 | n/a | n/a | n/a | n/a |")


def test_kept_rows_read_only_current_cells(tmp_path, monkeypatch):
  monkeypatch.setattr(ablations, "row_fingerprint", lambda row, options: f"fp-{row.name}")
  cells = tmp_path / "toy_1600"
  cells.mkdir()
  for name, fingerprint in (("realm", "fp-realm"), ("orqa", "stale")):
    (cells / f"seed0_{name}.json").write_text(json.dumps(
        {"summary": _cell(0.2, 0.5), "fingerprint": fingerprint}))
  rows = compute_curve.kept_rows(4, (0, 1), None, str(tmp_path))
  assert set(rows) == {"realm"} and set(rows["realm"]) == {0}


def test_encoder_reading_of_a_run_is_the_bert_it_holds(tmp_path):
  """A run whose checkpoint holds the shipped toy BERT reads as that BERT does, measured on the
  transformers files directly (`toy_bert.measure`)."""
  from realm_jax import toy_bert  # pylint: disable=import-outside-toplevel
  from realm_jax.convert import hf  # pylint: disable=import-outside-toplevel
  hf.write_checkpoint(toy_bert.SHIPPED_DIR, str(tmp_path / "run"))
  reading = compute_curve.encoder_reading(str(tmp_path / "run"), 0, "toy", num_sentences=24)
  direct = toy_bert.measure(toy_bert.SHIPPED_DIR, 24, "toy")
  assert reading == {key: direct[key]["wordpiece_accuracy"] for key in compute_curve.READING}


def test_a_wiki_cell_pairs_the_rows_of_one_recipe_run():
  summary = {"qa": {"realm": {"exact_match": 0.037}, "orqa": {"exact_match": 0.034},
                    "bm25_reader": {"exact_match": 0.148}},
             "recall": {"pretrained": {"recall@5": 0.151}, "warm_start": {"recall@5": 0.168}},
             "retrieval_utility": {"first": 0.04, "chosen": 0.04, "last": 0.03},
             "mlm_accuracy_realm": 0.12, "pretrain_checkpoint": {"step": 40}}
  reading = {"with_context": 0.11, "without_context": 0.08, "with_distractor": 0.09}
  cell = compute_curve.wiki_cell(summary, reading, minutes=20.0)
  rows = {name: {0: cell[name]} for name in compute_curve.ROWS if name in cell}
  line = compute_curve.curve_line(1, rows, compute_curve.wiki_steps(1))
  assert line[0] == "200 (1x)"
  assert line[2].startswith("+0.003 ± n/a (seeds 0: +0.003)")
  assert line[3].startswith("-0.017 ± n/a")
  assert line[-1] == "0.110 / 0.080 / 0.090"


def test_the_wiki_runs_share_what_every_length_of_a_seed_shares(tmp_path, monkeypatch):
  from realm_jax.data import wiki  # pylint: disable=import-outside-toplevel
  from bench import wiki_runs  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(wiki, "world_dir", lambda seed=0: "/world")
  monkeypatch.setattr(wiki_runs, "world_options",
                      lambda eval_split, smoke=False, bert=None: {"world": "options"})
  four, one = (compute_curve.wiki_recipe(m, 3, str(tmp_path)) for m in (4, 1))
  # The seed's directory is claimed for the world's options before anything runs in it.
  with open(tmp_path / "seed3.fingerprint", encoding="utf-8") as f:
    assert f.read().strip() == ablations.fingerprint({"world": "options"})
  assert four.ict == one.ict == str(tmp_path / "seed3" / "ict")
  assert four.orqa == one.orqa and four.bm25_reader == one.bm25_reader
  assert four.store == one.store == str(tmp_path / "store")
  assert four.pretrain == str(tmp_path / "seed3" / "steps800" / "pretrain") != one.pretrain
  assert "NUM_STEPS=800" in four.pretrain_bindings
  assert "train_main.seed=3" in four.pretrain_bindings + four.warm_start_bindings
  assert four.frozen_retriever_steps == 400
  # The mixed row: a slot of the same pretraining, named as the Table 2 bench names it.
  mixed = compute_curve.wiki_recipe(1, 3, str(tmp_path), mixed=True)
  assert mixed.pretrain == one.pretrain and mixed.finetune_reader == "bert"
  assert mixed.finetune == str(tmp_path / "seed3" / "steps200" / compute_curve.MIXED)
  # The oracle variant: REALM's pretraining in a run of its own, with the seed's baseline.
  oracle = compute_curve.wiki_recipe(1, 3, str(tmp_path), variant=Variant(oracle=2))
  assert oracle.pretrain == str(tmp_path / "seed3" / "steps200_oracle2" / "pretrain")
  assert "PretrainJob.oracle_blocks=2" in oracle.pretrain_bindings
  assert "PretrainJob.oracle_blocks=2" not in one.pretrain_bindings
  assert oracle.orqa == one.orqa and oracle.ict == one.ict
  oracle_mixed = compute_curve.wiki_recipe(1, 3, str(tmp_path), mixed=True,
                                            variant=Variant(oracle=2))
  assert oracle_mixed.pretrain == oracle.pretrain and oracle_mixed.finetune_reader == "bert"
  assert compute_curve.wiki_cell_path(1, 3, "/c", variant=Variant(oracle=2)) == (
      "/c/wiki_200_oracle2/seed3.json")
  assert compute_curve.wiki_cell_path(1, 3, "/c") == "/c/wiki_200/seed3.json"
  assert compute_curve.wiki_options(1, variant=Variant(oracle=2)) == {
      **compute_curve.wiki_options(1), "oracle_blocks": 2}
  # The encoder's learning rate: a run of its own whose retriever keeps the recipe's rate
  # (3e-4 x 0.3 = 9e-5 = 3e-5 x 3).
  slow = compute_curve.wiki_recipe(1, 3, str(tmp_path), variant=Variant(encoder_lr=3e-5))
  assert slow.pretrain == str(tmp_path / "seed3" / "steps200_enclr3e-05" / "pretrain")
  assert slow.pretrain_bindings[-2:] == ["LEARNING_RATE=3e-05",
                                         "PretrainJob.retriever_lr_scale=3.0"]
  assert slow.orqa == one.orqa and slow.ict == one.ict
  assert compute_curve.wiki_cell_path(1, 3, "/c", variant=Variant(encoder_lr=3e-5)) == (
      "/c/wiki_200_enclr3e-05/seed3.json")
  assert compute_curve.wiki_options(1, variant=Variant(encoder_lr=3e-5)) == {
      **compute_curve.wiki_options(1), "encoder_lr": 3e-5}
  # More candidates per masked query: a run of its own, with the seed's baseline.
  wide = compute_curve.wiki_recipe(1, 3, str(tmp_path), variant=Variant(candidates=32))
  assert wide.pretrain == str(tmp_path / "seed3" / "steps200_cand32" / "pretrain")
  assert wide.pretrain_bindings[-1] == "PretrainJob.num_candidates=32"
  assert wide.orqa == one.orqa and wide.ict == one.ict
  assert compute_curve.wiki_cell_path(
      1, 3, "/c", variant=Variant(candidates=32, encoder_lr=3e-5)) == (
      "/c/wiki_200_enclr3e-05_cand32/seed3.json")
  assert compute_curve.wiki_options(1, variant=Variant(candidates=32)) == {
      **compute_curve.wiki_options(1), "num_candidates": 32}


def test_a_bert_variant_is_every_run_of_its_seeds_from_that_bert(tmp_path, monkeypatch):
  """`--bert DIR`: the seed's runs (baseline, REALM) start from that English BERT, converted
  apart, in seed directories and cells named after its weights' sha256 (computed here with
  hashlib), each seed's directory claimed for options that name that sha256."""
  import hashlib  # pylint: disable=import-outside-toplevel
  import shutil  # pylint: disable=import-outside-toplevel
  from realm_jax import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  from realm_jax import toy_bert  # pylint: disable=import-outside-toplevel
  from realm_jax.data import wiki  # pylint: disable=import-outside-toplevel
  from bench import wiki_runs  # pylint: disable=import-outside-toplevel
  bert = tmp_path / "english_bert_long_copy"
  bert.mkdir()
  shutil.copy(os.path.join(recipe_lib.toy_bert_dir("shipped", "wiki"), "config.json"), bert)
  (bert / "model.safetensors").write_bytes(b"another English BERT's weights")
  digest = hashlib.sha256(b"another English BERT's weights").hexdigest()
  assert digest != toy_bert.shipped_sha256("wiki")
  world = tmp_path / "world"
  world.mkdir()
  (world / "manifest.json").write_text('{"articles": 3}', encoding="utf-8")
  monkeypatch.setattr(wiki, "world_dir", lambda seed=0: str(world))
  shipped = wiki_runs.world_options("test")
  other = wiki_runs.world_options("test", bert=str(bert))
  assert shipped["wiki_bert_sha256"] == toy_bert.shipped_sha256("wiki")
  assert other == {**shipped, "wiki_bert_sha256": digest}
  runs = tmp_path / "runs"
  run = compute_curve.wiki_recipe(1, 3, str(runs), variant=Variant(bert=str(bert)))
  assert run.toy_bert == str(bert)
  seed_out = runs / f"seed3_bert{digest[:8]}"
  assert run.pretrain == str(seed_out / "steps200" / "pretrain")
  assert run.ict == str(seed_out / "ict") and run.orqa == str(seed_out / "orqa")
  assert run.bert == str(runs / f"bert_bert{digest[:8]}")
  with open(f"{seed_out}.fingerprint", encoding="utf-8") as f:
    assert f.read().strip() == ablations.fingerprint(other)
  assert compute_curve.wiki_cell_path(1, 3, "/c", variant=Variant(bert=str(bert))) == (
      f"/c/wiki_200_bert{digest[:8]}/seed3.json")
  assert compute_curve.wiki_options(1, variant=Variant(bert=str(bert))) == {
      **compute_curve.wiki_options(1), "wiki_bert_sha256": digest}
  # The shipped BERT's runs of the same seed and output directory are apart from them.
  shipped_run = compute_curve.wiki_recipe(1, 3, str(runs))
  assert shipped_run.pretrain == str(runs / "seed3" / "steps200" / "pretrain")
  assert shipped_run.bert == str(runs / "bert") and shipped_run.store == run.store
  assert os.path.exists(f"{seed_out}.fingerprint")


def test_the_recipes_pretraining_rates_are_the_pretraining_gins(clean_gin):
  """PRETRAIN_LR and RETRIEVER_LR_SCALE, which `--encoder_lr` keeps the retriever's rate by, are
  experiments/toy_pretrain.gin's (the wiki recipe pretrains with it)."""
  del clean_gin
  import gin  # pylint: disable=import-outside-toplevel
  from realm_jax import gin_utils  # pylint: disable=import-outside-toplevel
  import realm_jax.train  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  gin_file = "gin_configs/experiments/toy_pretrain.gin"
  bindings = gin_utils.effective_bindings(gin_file)
  assert float(bindings["realm_jax.jobs.pretrain.PretrainJob"]["retriever_lr_scale"]) == (
      compute_curve.RETRIEVER_LR_SCALE)
  gin.parse_config_file(gin_file, skip_unknown=True)
  assert gin.query_parameter("%LEARNING_RATE") == compute_curve.PRETRAIN_LR


def test_a_toy_realm_cell_takes_its_seeds_reading_and_the_table_counts_them():
  rows = {"realm": {0: _cell(0.2, 0.5), 1: _cell(0.3, 0.4)},
          "orqa": {0: _cell(0.1, 0.5), 1: _cell(0.1, 0.5)}}
  readings = {1: {"reading": {"with_context": 0.3, "without_context": 0.1,
                              "with_distractor": 0.2}}, 7: {"reading": {}}}
  joined = compute_curve.with_readings(rows, readings)
  assert "reading" not in joined["realm"][0] and "reading" not in rows["realm"][1]
  assert joined["realm"][1]["reading"]["with_context"] == 0.3
  assert set(joined["realm"]) == {0, 1} and joined["orqa"] == rows["orqa"]
  # One of two REALM seeds was read: the mean over it, and the count said.
  assert compute_curve.curve_line(4, joined)[-1] == "0.300 / 0.100 / 0.200 (1 seeds)"


def test_kept_readings_are_read_only_when_current(tmp_path, monkeypatch):
  monkeypatch.setattr(ablations, "fingerprint", lambda options: f"fp-{options['pretrain_steps']}")
  for seed, fingerprint in ((0, "fp-1600"), (1, "fp-400")):
    path = compute_curve.reading_path(4, seed, str(tmp_path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"summary": {"reading": {"with_context": 0.5}}, "fingerprint": fingerprint}, f)
  assert compute_curve.reading_path(4, 0, "/c") == "/c/toy_1600/seed0_reading.json"
  # A missing reading is not made when `make` is off; seed 1's is of another length.
  readings = compute_curve.toy_readings(4, (0, 1, 2), "/nowhere", None, str(tmp_path), make=False)
  assert list(readings) == [0]


def test_curve_points_and_the_plot():
  rows = lambda em_diffs: {"realm": {s: _cell(0.2 + d, 0.5) for s, d in enumerate(em_diffs)},
                           "orqa": {s: _cell(0.2, 0.5) for s in range(len(em_diffs))}}
  curve = {1: rows([0.1, 0.3]), 4: rows([-0.2]), 16: {}}
  points = compute_curve.curve_points(curve, compute_curve.steps_of, ablations.EM)
  # Differences +0.1, +0.3: mean 0.2, sample std 0.1414, over sqrt(2): 0.1; one seed has no SE.
  assert [(x, round(m, 6), n) for x, m, _, n in points] == [(400, 0.2, 2), (1600, -0.2, 1)]
  assert abs(points[0][2] - 0.1) < 1e-9 and points[1][2] != points[1][2]
  import tempfile  # pylint: disable=import-outside-toplevel
  with tempfile.TemporaryDirectory() as directory:
    path = os.path.join(directory, "curve.png")
    compute_curve.plot({"toy": curve, "wiki": {1: rows([0.0, 0.1])}}, path)
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_kept_wiki_cell_gains_the_mixed_row_once(tmp_path, monkeypatch):
  """A wiki cell kept before the mixed row existed keeps its rows, and the mixed row (REALM's
  retriever, the BERT reader: the recipe's mixed slot) is made once and added to it."""
  summary = {"qa": {"realm": {"exact_match": 0.05}}, "recall": {"pretrained": {"recall@5": 0.2}}}
  made = []

  class FakeRecipe:
    def __init__(self, mixed):
      self.mixed = mixed

    def run(self):
      made.append(self.mixed)
      return summary

  monkeypatch.setattr(compute_curve, "wiki_options",
                      lambda multiple, smoke=False, variant=None: {"m": multiple})
  monkeypatch.setattr(compute_curve, "wiki_recipe",
                      lambda multiple, seed, out, smoke=False, mixed=False, variant=None:
                      FakeRecipe(mixed))
  fingerprint = ablations.fingerprint({"m": 1})
  path = compute_curve.wiki_cell_path(1, 0, str(tmp_path))
  ablations.save_cell(path, {"realm": _cell(0.04, 0.17), "orqa": _cell(0.03, 0.17)}, fingerprint)
  kept = compute_curve.wiki_rows(1, (0,), "/out", str(tmp_path), make=False)
  assert set(kept) == {"realm", "orqa"} and not made
  rows = compute_curve.wiki_rows(1, (0,), "/out", str(tmp_path))
  assert made == [True]
  assert rows[compute_curve.MIXED][0] == {ablations.EM: 0.05, ablations.RECALL: 0.2}
  assert rows["realm"][0] == _cell(0.04, 0.17)
  compute_curve.wiki_rows(1, (0,), "/out", str(tmp_path))
  assert made == [True]  # kept with it now


def test_a_variants_section_title_is_the_one_its_written_section_has():
  """The titles `--write` gives the variants' sections, against those written in
  bench/docs/benchmarks.md (the flags in the order the sections' commands give them)."""
  with open(os.path.join(os.path.dirname(compute_curve.PLOT), "benchmarks.md"),
            encoding="utf-8") as f:
    titles = {line[3:].strip() for line in f if line.startswith("## ")}
  for fields, flags in (({"oracle": 1}, " --oracle_blocks 1"),
                        ({"encoder_lr": 3e-5}, " --encoder_lr 3e-05"),
                        ({"oracle": 1, "encoder_lr": 3e-5},
                         " --oracle_blocks 1 --encoder_lr 3e-05")):
    texts = Variant(**fields).texts()
    assert "".join(flag for flag, _, _ in texts) == flags
    assert compute_curve.SECTIONS["wiki"] + "".join(named for _, named, _ in texts) in titles
  retriever_rate = Variant(encoder_lr=3e-5).texts()[0][2]
  assert "(9e-05: `PretrainJob.retriever_lr_scale` 3)" in retriever_rate
