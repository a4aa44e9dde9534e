"""bench/ablations.py: the paired statistics, the verdicts, the table, the comparisons and the
fine-tuning noise line, checked on numbers worked out by hand in the comments; which cells are
made or reused; and the fingerprint of a cell."""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position

PD = ablations.PairedDifference
DEV_PICKED = "step 100: best by eval/exact_match=0.2 in best.json"


def _cell(em, recall=0.5, *, mlm=0.1, utility=0.2, refreshes=4.0, picked=DEV_PICKED):
  return {"qa_em": em, "recall@5_zero_shot": recall, "mlm_accuracy": mlm,
          "retrieval_utility": utility, "refreshes": refreshes, "qa_checkpoint": picked,
          "minutes": 10.0}


def _by_seed(*cells):
  return dict(enumerate(cells))


def test_paired_difference_on_hand_worked_numbers():
  # Differences 0.10, 0.05, 0.10: mean 0.25 / 3 = 0.083333; deviations +1/60, -1/30, +1/60,
  # squares sum 6/3600, / (n - 1) = 1/1200, sd 0.028868, SE = sd / sqrt(3) = 1/60 = 0.016667.
  d = ablations.paired_difference([0.30, 0.25, 0.40], [0.20, 0.20, 0.30])
  assert d.mean == pytest.approx(0.083333, abs=1e-6)
  assert d.standard_error == pytest.approx(0.016667, abs=1e-6)
  assert d.per_seed == pytest.approx((0.10, 0.05, 0.10))
  assert d.all_agree
  assert ablations.difference_std(d) == pytest.approx(0.028868, abs=1e-6)
  # Differences 0.10, -0.02, 0.04, 0.00, 0.08: mean 0.04; deviations 0.06, -0.06, 0, -0.04,
  # 0.04, squares sum 0.0104, / 4 = 0.0026, sd 0.050990, SE = 0.050990 / sqrt(5) = 0.022804.
  d = ablations.paired_difference([0.5, 0.3, 0.44, 0.2, 0.38], [0.4, 0.32, 0.40, 0.2, 0.30])
  assert d.mean == pytest.approx(0.04, abs=1e-9)
  assert d.standard_error == pytest.approx(0.022804, abs=1e-6)
  assert not d.all_agree  # one negative, one zero
  # All negative agrees too (in the other direction).
  assert ablations.paired_difference([0.1, 0.2], [0.2, 0.4]).all_agree
  # 0.3 - (0.1 + 0.2) is -5.6e-17 in floats: no difference, so no sign to agree on.
  d = ablations.paired_difference([0.3, 0.3], [0.1 + 0.2, 0.1 + 0.2])
  assert d.per_seed == (0.0, 0.0) and not d.all_agree
  # One seed: no standard error.
  assert math.isnan(ablations.paired_difference([0.3], [0.1]).standard_error)
  with pytest.raises(ValueError):
    ablations.paired_difference([0.1, 0.2], [0.1])
  with pytest.raises(ValueError):
    ablations.paired_difference([], [])


@pytest.mark.parametrize("d,expected", [
    # 0.0833 > 2 x 0.0167 and every seed positive.
    (PD(0.0833, 0.0167, (0.10, 0.05, 0.10), True),
     "holds in every seed, beyond two standard errors"),
    # Every seed positive, 0.03 < 2 x 0.02.
    (PD(0.03, 0.02, (0.01, 0.07, 0.01), True), "holds in every seed, within two standard errors"),
    # One seed: no standard error to exceed.
    (PD(0.05, math.nan, (0.05,), True), "holds in every seed, within two standard errors"),
    # 0.05 > 2 x 0.02 but one seed is negative.
    (PD(0.05, 0.02, (0.09, -0.01, 0.07), False),
     "beyond two standard errors, but not in every seed"),
    # 0.04 < 2 x 0.0228, seeds of both signs.
    (PD(0.04, 0.0228, (0.10, -0.02, 0.04, 0.00, 0.08), False),
     "same direction on average, not in every seed, within two standard errors"),
    (PD(-0.05, 0.01, (-0.04, -0.06), True), "reversed in every seed"),
    (PD(-0.01, 0.02, (0.01, -0.03), False), "does not hold"),
    (PD(0.0, 0.0, (0.0, 0.0), False), "does not hold"),
])
def test_direction_verdict(d, expected):
  assert ablations.direction_verdict(d) == expected


def test_two_sided_verdict_judges_either_sign():
  assert (ablations.two_sided_verdict(PD(-0.05, 0.01, (-0.04, -0.06), True))
          == "same sign in every seed, beyond two standard errors")  # |-0.05| > 0.02
  assert (ablations.two_sided_verdict(PD(-0.05, 0.03, (-0.02, -0.08), True))
          == "same sign in every seed, within two standard errors")  # 0.05 < 0.06
  assert (ablations.two_sided_verdict(PD(0.0, 0.05, (-0.05, 0.05), False))
          == "within two standard errors, not the same sign in every seed")


def test_paired_lines_up_seeds_and_skips_missing_or_undefined_values():
  rows = {"a": {0: _cell(0.3), 1: _cell(0.5), 2: _cell(0.4), 3: _cell(math.nan)},
          "b": {0: _cell(0.1), 2: _cell(0.1), 3: _cell(0.1)}}
  seeds, d = ablations.paired(rows, "a", "b", "qa_em")
  # Seed 1 has no b, seed 3 no finite a: 0.3 - 0.1 and 0.4 - 0.1.
  assert seeds == (0, 2) and d.per_seed == pytest.approx((0.2, 0.3))
  assert ablations.paired(rows, "a", "missing", "qa_em") is None
  assert (ablations.format_difference((0, 2), PD(0.25, 0.05, (0.2, 0.3), True))
          == "+0.250 ± 0.050 (seeds 0, 2: +0.200, +0.300)")


def test_table_cells_are_mean_and_sample_std_in_the_papers_order():
  rows = {"orqa": _by_seed(_cell(0.1, mlm=math.nan, utility=math.nan, refreshes=math.nan),
                           _cell(0.1, mlm=math.nan, utility=math.nan, refreshes=math.nan)),
          "realm": _by_seed(_cell(0.2), _cell(0.4)),
          "no_null": _by_seed(_cell(0.3, utility=math.nan, picked="step 120: latest"))}
  lines = ablations.table(rows).splitlines()
  assert lines[0].startswith("| row | toy QA test EM | zero-shot recall@5 (test) |")
  # 0.2 and 0.4: mean 0.3, sample std sqrt(0.02 / 1) = 0.141.
  assert lines[2].startswith("| REALM | 0.300 ± 0.141 | 0.500 ± 0.000 | 0.100 ± 0.000 |")
  assert lines[3].startswith("| ORQA-style baseline") and "| n/a | n/a | n/a |" in lines[3]
  # One seed: its value alone; utility undefined without the null document.
  assert lines[4].startswith("| REALM without the null document (beside the paper) | 0.300 |")
  assert "| n/a |" in lines[4]
  assert lines[-1] == "Evaluated on a checkpoint dev did not pick: no_null seed 0."


def test_comparisons_give_every_direction_both_columns():
  rows = {
      # EM: REALM - random uniform = 0.10, 0.05, 0.10 (the first hand-worked example):
      # +0.083 ± 0.017. Recall: 0.05 each seed: +0.050 ± 0.000, every seed.
      "realm": _by_seed(_cell(0.30, 0.55), _cell(0.25, 0.45), _cell(0.40, 0.65)),
      "random_token": _by_seed(_cell(0.20, 0.50), _cell(0.20, 0.40), _cell(0.30, 0.60)),
      # Shares REALM's retriever: recall equal by construction, not judged.
      "realm_retriever_bert_encoder": _by_seed(_cell(0.35, 0.55), _cell(0.20, 0.45),
                                               _cell(0.30, 0.65)),
  }
  lines = ablations.comparisons(rows).splitlines()
  assert lines == [
      "* REALM > random uniform masks, toy QA test EM: +0.083 ± 0.017 (seeds 0, 1, 2: +0.100, "
      "+0.050, +0.100): holds in every seed, beyond two standard errors",
      "* REALM > random uniform masks, zero-shot recall@5 (test): +0.050 ± 0.000 (seeds 0, 1, "
      "2: +0.050, +0.050, +0.050): holds in every seed, beyond two standard errors",
      # -0.05, +0.05, +0.10: mean 0.033; deviations -0.0833, 0.0167, 0.0667, squares sum
      # 0.011667, / 2 = 0.005833, sd 0.076376, SE 0.044096.
      "* REALM > REALM retriever + baseline encoder, toy QA test EM: +0.033 ± 0.044 (seeds 0, "
      "1, 2: -0.050, +0.050, +0.100): same direction on average, not in every seed, within two "
      "standard errors",
      "* REALM > REALM retriever + baseline encoder, zero-shot recall@5 (test): one retriever, "
      "equal by construction"]


def test_noise_line_next_to_the_smallest_direction_effect():
  rows = {
      "realm": _by_seed(_cell(0.20), _cell(0.30), _cell(0.25)),
      # Refit minus REALM: +0.02, -0.03, 0.00: mean -0.003333; deviations 0.023333, -0.026667,
      # 0.003333, squares sum 0.0012667, / 2 = 0.00063333, sd 0.025166, SE 0.014530; one
      # fine-tuning's spread 0.025166 / sqrt(2) = 0.017795.
      "realm_refit": _by_seed(_cell(0.22), _cell(0.27), _cell(0.25)),
      # REALM minus random uniform: 0.05, 0.02, 0.05: mean 0.04, sd 0.017321, SE 0.01;
      # 0.04 / 0.025166 = 1.59 times the noise.
      "random_token": _by_seed(_cell(0.15), _cell(0.28), _cell(0.20)),
      # REALM minus ORQA: 0.15, 0.20, 0.20: mean 0.183, larger.
      "orqa": _by_seed(_cell(0.05), _cell(0.10), _cell(0.05)),
  }
  assert ablations.noise_line(rows) == (
      "Fine-tuning noise: REALM's pretraining fine-tuned again with fine-tuning seed s + 1000, "
      "minus REALM, toy QA test EM: -0.003 ± 0.015 (seeds 0, 1, 2: +0.020, -0.030, +0.000); "
      "standard deviation of the difference 0.025 (one fine-tuning's own spread about 0.018, "
      "if the two are independent). The smallest direction effect on toy QA test EM, REALM > "
      "random uniform masks: +0.040 ± 0.010, 1.6 times the noise's standard deviation.")
  assert ablations.noise_line({"realm": rows["realm"]}) == ""  # not measured: no line
  one_seed = {name: {0: by_seed[0]} for name, by_seed in rows.items()}
  assert ablations.noise_line(one_seed) == ""  # no spread from one seed


def test_factorial_effects_split_realm_minus_the_baseline_by_hand():
  rows = {
      # Seed 0: REALM 0.30, REALM retriever + BERT 0.26, ICT retriever + REALM encoder 0.20,
      # ORQA 0.18. Retriever ((0.30 - 0.20) + (0.26 - 0.18)) / 2 = 0.09; encoder ((0.30 - 0.26)
      # + (0.20 - 0.18)) / 2 = 0.03; interaction (0.10 - 0.08) / 2 = 0.01; total 0.12 = 0.09 +
      # 0.03.
      # Seed 1: 0.20, 0.22, 0.24, 0.20: retriever (-0.04 + 0.02) / 2 = -0.01; encoder (-0.02 +
      # 0.04) / 2 = 0.01; interaction (-0.04 - 0.02) / 2 = -0.03; total 0.00.
      # Seed 2: 0.25, 0.21, 0.19, 0.18: retriever (0.06 + 0.03) / 2 = 0.045; encoder (0.04 +
      # 0.01) / 2 = 0.025; interaction 0.015; total 0.07.
      "realm": _by_seed(_cell(0.30, 0.50), _cell(0.20, 0.40), _cell(0.25, 0.45)),
      "realm_retriever_bert_encoder": _by_seed(_cell(0.26), _cell(0.22), _cell(0.21)),
      "ict_retriever_realm_encoder": _by_seed(_cell(0.20), _cell(0.24), _cell(0.19)),
      "orqa": _by_seed(_cell(0.18, 0.40), _cell(0.20, 0.45), _cell(0.18, 0.40)),
  }
  seeds, effects = ablations.factorial_effects(rows)
  assert seeds == (0, 1, 2)
  expected = {"retriever": (0.09, -0.01, 0.045), "encoder": (0.03, 0.01, 0.025),
              "interaction": (0.01, -0.03, 0.015), "total": (0.12, 0.0, 0.07)}
  for name, per_seed in expected.items():
    assert effects[name].per_seed == pytest.approx(per_seed), name
    assert effects[name].mean == pytest.approx(sum(per_seed) / 3), name
  lines = ablations.factorial_lines(rows).splitlines()
  # Retriever effect: mean 0.041667; deviations 0.048333, -0.051667, 0.003333; squares sum
  # 0.0050167, / 2 = 0.0025083, sd 0.050083, SE 0.028916.
  assert lines[2] == ("* of which REALM's retriever (against ICT's, mean over both encoders): "
                      "+0.042 ± 0.029 (seeds 0, 1, 2: +0.090, -0.010, +0.045): within two "
                      "standard errors, not the same sign in every seed")
  # Recall differences +0.10, -0.05, +0.05 against the retriever's effects +0.09, -0.01,
  # +0.045: means 0.033333 and 0.041667; centred (0.066667, -0.083333, 0.016667) and
  # (0.048333, -0.051667, 0.003333); products sum 0.0075556; norms 0.108012 and 0.070829:
  # r = 0.0075556 / 0.0076504 = 0.99.
  assert lines[-1].endswith("its correlation over the seeds with the retriever's effect on "
                            "EM: +0.99")
  # One retriever in every seed (REALM's rule picked a checkpoint with the retriever still
  # ICT's): zero recall and retriever differences, no correlation to print.
  held = dict(rows, realm_retriever_bert_encoder=rows["orqa"],
              ict_retriever_realm_encoder=rows["realm"],
              orqa=_by_seed(_cell(0.18, 0.50), _cell(0.20, 0.40), _cell(0.18, 0.45)))
  assert ablations.factorial_lines(held).splitlines()[-1].endswith(
      "its correlation over the seeds with the retriever's effect on EM: undefined (one of the "
      "two is the same in every seed)")
  del rows["orqa"][2]  # a seed missing one of the four rows is left out
  assert ablations.factorial_effects(rows)[0] == (0, 1)
  assert ablations.factorial_lines({"realm": rows["realm"]}) == ""


def test_rows_and_directions():
  names = [row.name for row in ablations.ROWS]
  assert names[:4] == ["realm", "realm_retriever_bert_encoder", "ict_retriever_realm_encoder",
                       "orqa"]  # the paper's order
  assert ablations.FINETUNINGS == ("realm_retriever_bert_encoder", "ict_retriever_realm_encoder",
                                   "orqa", "realm_refit")
  kwargs = {row.name: row.kwargs for row in ablations.ROWS}
  # The ORQA-style baseline: the ICT retriever and the BERT reader, as Recipe(baseline=True).
  assert kwargs["orqa"] == {"finetune_retriever": "warm_start", "finetune_reader": "bert"}
  assert kwargs["stale_30x"] == {"with_builder": False}
  assert kwargs["realm_refit"] == {"finetune_seed_offset": 1000}
  for direction in ablations.DIRECTIONS:
    assert {direction.better, direction.worse} <= set(names), direction
  # The retriever each row fine-tunes: its own pretraining's, or for a fine-tuning row
  # REALM's ("pretrain") or ICT's ("warm_start"). Rows that fine-tune the same one are exactly
  # those whose recall the comparisons leave unjudged.
  retriever = {row.name: row.name if row.pretrains else
               {"pretrain": "realm", "warm_start": "ict"}[
                   row.kwargs.get("finetune_retriever", "pretrain")]
               for row in ablations.ROWS}
  for direction in ablations.DIRECTIONS:
    assert direction.same_retriever == (retriever[direction.better]
                                        == retriever[direction.worse]), direction


def test_cell_summary_takes_each_rows_own_retriever_and_pretraining_columns():
  recipe = {"qa_em_realm": 0.2, "recall@5_before": 0.4, "recall@5_after": 0.6,
            "mlm_accuracy_realm": 0.13, "retrieval_utility_last": 0.43, "refreshes": 4.0}
  rows = ablations.ROW_BY_NAME
  realm = ablations.cell_summary(rows["realm"], recipe, minutes=9.0, qa_checkpoint=DEV_PICKED,
                                 pretraining="1.5")
  assert (realm["qa_em"], realm["recall@5_zero_shot"], realm["mlm_accuracy"],
          realm["retrieval_utility"], realm["refreshes"]) == (0.2, 0.6, 0.13, 0.43, 4.0)
  assert realm["recipe"] is recipe and realm["pretraining"] == "1.5"
  for name, recall in (("orqa", 0.4), ("ict_retriever_realm_encoder", 0.4),
                       ("realm_retriever_bert_encoder", 0.6), ("realm_refit", 0.6)):
    cell = ablations.cell_summary(rows[name], recipe, minutes=2.0, qa_checkpoint=DEV_PICKED,
                                  pretraining="1.5")
    assert cell["recall@5_zero_shot"] == recall, name
    assert all(math.isnan(cell[key]) for key in ("mlm_accuracy", "retrieval_utility",
                                                 "refreshes")), name


FT = ("f1", "f2")


@pytest.mark.parametrize("wanted,kept,in_out,expected", [
    # Nothing kept: the base first, then its fine-tunings.
    (["base", "f1", "f2"], {}, None, ["base", "f1", "f2"]),
    # All kept from one pretraining: nothing to make, whatever --out holds.
    (["base", "f1", "f2"], {"base": "P1", "f1": "P1", "f2": "P1"}, None, []),
    # A missing fine-tuning, REALM's pretraining still in --out: only it.
    (["base", "f1", "f2"], {"base": "P1", "f2": "P1"}, "P1", ["f1"]),
    # ... and a fine-tuning kept from an older pretraining is made again.
    (["base", "f1", "f2"], {"base": "P1", "f1": "P0"}, "P1", ["f1", "f2"]),
    # The pretraining is gone from --out: the base cell is made again with every fine-tuning.
    (["base", "f1", "f2"], {"base": "P1", "f2": "P1"}, None, ["base", "f1", "f2"]),
    # --out holds another pretraining than the kept base cell's: all made from it.
    (["base", "f1"], {"base": "P1", "f1": "P2"}, "P2", ["base"]),
    # Only a fine-tuning asked for: the base is needed beside it.
    (["f2"], {}, "P1", ["base", "f2"]),
    (["f2"], {"base": "P1"}, "P1", ["f2"]),
    # No fine-tuning asked for: the base alone.
    (["base"], {"base": "P1"}, None, []),
    (["other"], {}, None, []),
])
def test_family_cells_to_make(wanted, kept, in_out, expected):
  kept = {row: {"pretraining": pretraining} for row, pretraining in kept.items()}
  assert ablations.family_cells_to_make("base", FT, wanted, kept, in_out) == expected


def finished_run(run_dir, value: float, step: int = 400) -> None:
  """A finished pretraining run: one tiny checkpoint of `value`s and TRAINING_DONE."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  from realm_jax.models import config as config_lib  # pylint: disable=import-outside-toplevel
  params = {"retriever": {"dense": {"kernel": np.full((2, 3), value, np.float32),
                                    "bias": np.zeros(3, np.float32)}}}
  checkpoints.save_checkpoint(str(run_dir), step, params,
                              config=config_lib.RealmConfig(bert=config_lib.tiny_bert()))
  checkpoints.mark_training_done(str(run_dir))


def test_a_pretraining_is_identified_by_its_trained_values_not_by_when_it_ran(tmp_path):
  first, again, other = tmp_path / "first", tmp_path / "again", tmp_path / "other"
  assert ablations.pretraining_id(str(first)) is None  # not finished
  finished_run(first, 0.5)
  finished_run(again, 0.5)  # made again later: other files, other TRAINING_DONE time
  finished_run(other, 0.25)
  identity = ablations.pretraining_id(str(first))
  assert identity.startswith("params ") and identity.endswith("(step 400)")
  assert ablations.pretraining_id(str(again)) == identity
  assert ablations.pretraining_id(str(other)) != identity
  # Kept beside TRAINING_DONE, and computed again once the run is finished anew.
  kept = json.loads((first / ablations.PRETRAINING_ID_FILE).read_text())
  assert kept["pretraining_id"] == identity
  (first / ablations.PRETRAINING_ID_FILE).write_text(json.dumps({**kept, "done_unix": 0.0}))
  assert ablations.pretraining_id(str(first)) == identity


@pytest.mark.parametrize("remade_value,expected", [
    (0.5, ["f1"]),  # the remake trained the same values: the kept cells stay
    (0.25, ["base", "f1", "f2"]),  # another pretraining: the family is made again
])
def test_a_lost_pretraining_is_made_again_before_its_family_is_planned(tmp_path, remade_value,
                                                                       expected):
  finished_run(tmp_path / "made_before", 0.5)
  identity = ablations.pretraining_id(str(tmp_path / "made_before"))
  kept = {"base": {"pretraining": identity}, "f2": {"pretraining": identity}}
  pretrain_dir = tmp_path / "out" / "pretrain"  # lost with the sitting that made it
  remade = []
  remake = lambda: remade.append(1) or finished_run(pretrain_dir, remade_value)  # noqa: E731
  assert ablations.plan_family("base", FT, ["base", "f1", "f2"], kept, str(pretrain_dir),
                               remake) == expected
  assert remade == [1]
  # Nothing to make: no pretraining is made again.
  everything = {**kept, "f1": {"pretraining": identity}}
  assert ablations.plan_family("base", FT, ["base", "f1", "f2"], everything,
                               str(tmp_path / "gone"), remake) == []
  assert remade == [1]


def test_the_evaluated_checkpoint(tmp_path):
  metrics = tmp_path / "toy_qa_test.metrics.json"
  metrics.write_text(json.dumps({"checkpoint_step": 100, "checkpoint_choice":
                                 "best by eval/exact_match=0.2 in best.json", "metrics": {}}))
  choice = ablations.evaluated_checkpoint(str(metrics))
  assert choice == DEV_PICKED and ablations.dev_picked({"qa_checkpoint": choice})
  metrics.write_text(json.dumps({"checkpoint_step": 120, "checkpoint_choice": "latest"}))
  assert not ablations.dev_picked({"qa_checkpoint": ablations.evaluated_checkpoint(str(metrics))})


def test_fingerprint_covers_the_world_version_and_the_report_split(monkeypatch):
  from realm_jax.data import toy_world  # pylint: disable=import-outside-toplevel
  options = lambda: ablations.cell_options(toy_bert_sha256="ab", ict_from_bert=False,
                                           pretrain_steps=None, finetune_steps=None)
  assert options()["eval_split"] == "test"
  assert options()["toy_world_generator_version"] == toy_world.GENERATOR_VERSION
  before = ablations.fingerprint(options())
  monkeypatch.setattr(toy_world, "GENERATOR_VERSION", toy_world.GENERATOR_VERSION + 1)
  assert ablations.fingerprint(options()) != before  # a new world: no cell of the old reused
  monkeypatch.undo()
  monkeypatch.setattr(ablations, "EVAL_SPLIT", "dev")
  assert ablations.fingerprint(options()) != before  # cells reported on dev are not reused


def test_a_rows_version_remakes_its_cells_alone_in_runs_of_their_own():
  options = {"pretrain_steps": None}
  base = ablations.fingerprint(options)
  unversioned = ablations.Row("x", "X", True, {})
  versioned = unversioned._replace(version=2)
  # Version 0 keeps the bench's fingerprint, so the other rows' kept cells stay valid.
  assert ablations.row_fingerprint(unversioned, options) == base
  assert ablations.row_fingerprint(versioned, options) not in (
      base, ablations.row_fingerprint(versioned._replace(version=1), options))
  assert (ablations.run_name(unversioned), ablations.run_name(versioned)) == ("x", "x_v2")
  assert ablations.ROW_BY_NAME["random_span"].version == 1  # SpanBERT's spans


def test_finished_cells_are_reused_unless_made_with_other_gins_or_options(tmp_path,
                                                                         monkeypatch, capsys):
  fingerprint = ablations.fingerprint({"pretrain_steps": None})
  assert fingerprint != ablations.fingerprint({"pretrain_steps": 100})
  path = str(tmp_path / "cells" / "seed0_realm.json")
  assert ablations.load_cell(path, fingerprint) is None  # nothing kept yet
  ablations.save_cell(path, _cell(0.25), fingerprint)
  assert ablations.load_cell(path, fingerprint) == _cell(0.25)
  assert os.listdir(tmp_path / "cells") == ["seed0_realm.json"]  # no temporary left behind
  # What the gins configure decides the fingerprint, not how they are written.
  experiments = tmp_path / "repo" / "gin_configs" / "experiments"
  experiments.mkdir(parents=True)
  (experiments / "toy_model.gin").write_text("train_main.batch_size = 8\n")
  pretrain = ("include 'gin_configs/experiments/toy_model.gin'\n"
              "NUM_STEPS = 200\ntrain_main.num_steps = %NUM_STEPS\n")
  (experiments / "toy_pretrain.gin").write_text(pretrain)
  monkeypatch.setattr(ablations, "REPO", str(tmp_path / "repo"))
  before = ablations.fingerprint({})
  (experiments / "toy_pretrain.gin").write_text("# How many steps.\n\n" + pretrain)
  assert ablations.fingerprint({}) == before  # comments do not decide results
  (experiments / "toy_pretrain.gin").write_text(pretrain + "train_main.seed = 0\n")
  assert ablations.fingerprint({}) == before  # nor a binding that restates its default
  # nor where the model gin lies (a gin that runs nothing counts only where it is included)
  (tmp_path / "repo" / "gin_configs" / "models").mkdir()
  (experiments / "toy_model.gin").rename(tmp_path / "repo" / "gin_configs" / "models" / "toy.gin")
  (experiments / "toy_pretrain.gin").write_text(pretrain.replace("experiments/toy_model",
                                                                 "models/toy"))
  assert ablations.fingerprint({}) == before
  (tmp_path / "repo" / "gin_configs" / "models" / "toy.gin").write_text(
      "train_main.batch_size = 16\n")
  assert ablations.fingerprint({}) != before  # a value the runs read
  changed = ablations.fingerprint({})
  (experiments / "toy_pretrain.gin").write_text(
      pretrain.replace("experiments/toy_model", "models/toy").replace("200", "201"))
  assert ablations.fingerprint({}) != changed
  # RETRO's gins decide no cell of these benches: adding one leaves the fingerprint.
  changed = ablations.fingerprint({})
  (experiments / "toy_retro.gin").write_text("train_main.num_steps = 300\n")
  assert ablations.fingerprint({}) == changed
  ablations.save_cell(path, _cell(0.25), before)
  capsys.readouterr()
  assert ablations.load_cell(path, ablations.fingerprint({})) is None
  assert "made with other gins or options" in capsys.readouterr().out
  with open(path, "w", encoding="utf-8") as f:
    f.write("{not json")
  assert ablations.load_cell(path, before) is None
  assert f"{path}: unreadable" in capsys.readouterr().out


def test_a_runs_dir_of_other_gins_or_code_is_removed_before_runs_are_made(tmp_path):
  runs = tmp_path / "seed0"
  (runs / "realm").mkdir(parents=True)
  (runs / "realm" / "old_checkpoint").write_text("made before fingerprints were recorded")
  ablations.claim_runs_dir(str(runs), "fp-a")
  assert not (runs / "realm").exists()  # no fingerprint recorded: not trusted
  assert (tmp_path / "seed0.fingerprint").read_text().strip() == "fp-a"
  (runs / "realm").mkdir(parents=True)
  (runs / "realm" / "checkpoint").write_text("made for fp-a")
  ablations.claim_runs_dir(str(runs), "fp-a")
  assert (runs / "realm" / "checkpoint").exists()  # same cells: resumed, not removed
  ablations.claim_runs_dir(str(runs), "fp-b")
  assert not (runs / "realm").exists()
  assert (tmp_path / "seed0.fingerprint").read_text().strip() == "fp-b"


def test_a_stale_runs_dir_is_removed_before_the_seeds_recipes_make_their_directories(
    tmp_path, monkeypatch):
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  out, cells = tmp_path / "runs", tmp_path / "cells"
  (out / "seed0" / "shared" / "ict").mkdir(parents=True)  # no fingerprint recorded: stale
  monkeypatch.setattr(realm_jax_tasks, "toy_block_store_dir", lambda: str(tmp_path / "blocks"))
  made = []

  def cell_recipe(row, seed, seed_out, shared, store, **kwargs):
    del seed_out, store, kwargs
    # What the recipe's first stage writes to: there, and the stale run gone.
    assert os.path.isdir(shared.logs) and not os.path.exists(shared.ict)
    return row, seed

  monkeypatch.setattr(ablations, "_cell_recipe", cell_recipe)
  monkeypatch.setattr(ablations, "_make_cell",
                      lambda row, seed, recipe, world: made.append(recipe) or _cell(0.5))
  rows = ablations.run(str(out), ("no_ict",), seeds=(0,), pretrain_steps=None,
                       finetune_steps=None, cells=str(cells))
  assert made == [(ablations.ROW_BY_NAME["no_ict"], 0)] and rows["no_ict"][0]["qa_em"] == 0.5


def test_another_fine_tuning_length_keeps_the_pretrainings_and_fine_tunes_beside_them(
    tmp_path, monkeypatch):
  """Cells of another length are other cells, but the seed's runs (ICT, pretrainings) stay:
  the new fine-tunings go to directories named with their length."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  default = {"pretrain_steps": None, "finetune_steps": None}
  longer = {**default, "finetune_steps": 900}
  assert ablations.fingerprint(longer) != ablations.fingerprint(default)
  assert ablations.runs_fingerprint(longer) == ablations.runs_fingerprint(default) == \
      ablations.fingerprint(default)
  assert ablations.finetune_slot("finetune", None) == "finetune"
  assert ablations.finetune_slot("orqa", 900) == "orqa_900steps"
  # Each length has its own docs section: the gins' length's table stays beside the new one.
  assert ablations.section_title(None) == "Ablations on the toy world (paper Table 2)"
  assert ablations.section_title(900) == (
      "Ablations on the toy world (paper Table 2), fine-tuning 900 steps")

  out, cells = tmp_path / "runs", tmp_path / "cells"
  monkeypatch.setattr(realm_jax_tasks, "toy_block_store_dir", lambda: str(tmp_path / "blocks"))
  options = ablations.cell_options(toy_bert_sha256=None, ict_from_bert=False,
                                   pretrain_steps=None, finetune_steps=None)
  ablations.claim_runs_dir(str(out / "seed0"), ablations.runs_fingerprint(options))
  (out / "seed0" / "realm" / "pretrain").mkdir(parents=True)
  (out / "seed0" / "realm" / "pretrain" / "TRAINING_DONE").write_text('{"done_unix": 1.5}')
  names = []

  class FakeRecipe:
    def __init__(self, out_dir, store, **kwargs):
      del store
      self.out, self.logs = out_dir, os.path.join(out_dir, "logs")
      self.ict = os.path.join(out_dir, "ict")
      self.pretrain = os.path.join(out_dir, "pretrain")
      names.append(kwargs.get("finetune_name"))

    def run(self):
      return {}

    def qa_metrics_path(self):
      return os.path.join(self.out, "eval", "metrics.json")

  monkeypatch.setattr(ablations.recipe_lib, "Recipe", FakeRecipe)
  monkeypatch.setattr(ablations, "cell_summary", lambda row, summary, **kw: _cell(0.5))
  monkeypatch.setattr(ablations, "evaluated_checkpoint", lambda path: None)
  monkeypatch.setattr(ablations, "dev_picked", lambda cell: True)
  shared = FakeRecipe(str(out / "seed0" / "shared"), None)
  monkeypatch.setattr(shared, "trained", lambda path: True, raising=False)
  monkeypatch.setattr(shared, "stage", lambda *args: None, raising=False)
  monkeypatch.setattr(ablations, "pretraining_id", lambda run_dir: "P")
  names.clear()
  for name in ("realm", "orqa"):
    row = ablations.ROW_BY_NAME[name]
    ablations._make_cell(row, 0, ablations._cell_recipe(
        row, 0, str(out / "seed0"), shared, "store", pretrain_steps=None, finetune_steps=900,
        toy_bert=None, ict_from_bert=False))
  assert names == ["finetune_900steps", "orqa_900steps"]
  # The claim with the longer length's options keeps the pretraining.
  ablations.claim_runs_dir(str(out / "seed0"), ablations.runs_fingerprint(
      {**options, "finetune_steps": 900}))
  assert (out / "seed0" / "realm" / "pretrain" / "TRAINING_DONE").exists()


def test_cells_machines_names_each_machine_with_its_seeds(tmp_path):
  def cell(name, machine):
    path = tmp_path / name
    path.write_text(json.dumps({"summary": {}, "machine": machine}))
    return str(path)
  amd, intel = "AMD EPYC, 2 cores, 24 GiB", "Intel Xeon, 2 cores, 24 GiB"
  one_machine = {0: [cell("a", amd), cell("b", amd)], 1: [cell("c", amd)]}
  assert ablations.cells_machines(one_machine) == amd
  mixed = {3: [cell("d", intel), str(tmp_path / "missing")], 0: [cell("e", amd)],
           1: [cell("f", amd), cell("g", intel)]}
  # In order of first seed; a seed whose cells were made on both is under both.
  assert ablations.cells_machines(mixed) == f"{amd} (seeds 0, 1); {intel} (seeds 1, 3)"
  assert ablations.cells_machines({0: [str(tmp_path / "missing")]}) is None


# -- the wiki world


@pytest.fixture(name="wiki_world")
def fixture_wiki_world(monkeypatch):
  """The wiki world's directory and options without the generated world."""
  from bench import wiki_runs  # pylint: disable=import-outside-toplevel
  from realm_jax.data import wiki  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(wiki, "world_dir", lambda seed=0: "/world")
  monkeypatch.setattr(wiki_runs, "world_options",
                      lambda eval_split, smoke=False, bert=None: {"world": "options",
                                                                  "split": eval_split})


def test_the_wiki_rows_are_the_toy_rows_on_the_own_corpus(tmp_path, wiki_world):
  del wiki_world
  recipe = lambda name: ablations.wiki_cell_recipe(  # pylint: disable=protected-access
      ablations.ROW_BY_NAME[name], 2, str(tmp_path))
  seed = tmp_path / "seed2"
  realm = recipe("realm")
  assert realm.pretrain == str(seed / "steps200" / "pretrain")  # the compute curve's 1x run
  assert realm.ict == str(seed / "ict") and realm.orqa == str(seed / "orqa")
  assert realm.frozen_retriever_steps == 100 and realm.with_builder
  # The masking rows: their own runs, the own corpus's tasks after the recipe's (gin: last wins).
  span = recipe("random_span")
  assert span.pretrain == str(seed / "random_span_v1" / "pretrain")
  assert span.pretrain_bindings[-1] == "TASK='realm_own_random_span'"
  assert "TASK='realm_own_random_token'" in recipe("random_token").pretrain_bindings
  assert not recipe("stale_30x").with_builder
  assert "PretrainJob.null_document=False" in recipe("no_null").pretrain_bindings
  # Fine-tunings of REALM's pretraining: slots named after their rows, the baseline REALM's own.
  mixed = recipe("realm_retriever_bert_encoder")
  assert mixed.pretrain == realm.pretrain and mixed.finetune_reader == "bert"
  assert mixed.finetune == str(seed / "steps200" / "realm_retriever_bert_encoder")
  warm = recipe("ict_retriever_realm_encoder")
  assert warm.finetune_retriever == "warm_start" and warm.finetune_reader == "pretrain"
  refit = recipe("realm_refit")
  assert refit.finetune == str(seed / "steps200" / "realm_refit")
  # The noise row's seed: its slot's fine-tuning alone, the run's recorded arguments REALM's.
  assert refit.slot_bindings == ["train_main.seed=1002"]
  assert refit.finetune_bindings == realm.finetune_bindings
  assert realm.finetune_bindings[-1] == "train_main.seed=2" and not realm.slot_bindings
  assert recipe("orqa").finetune == realm.finetune
  # The seed's directory is claimed for the world's options.
  with open(tmp_path / "seed2.fingerprint", encoding="utf-8") as f:
    assert f.read().strip() == ablations.fingerprint({"world": "options", "split": "test"})


def test_a_wiki_cell_reads_its_slot_and_the_baseline_its_own():
  summary = {"qa": {"realm": {"exact_match": 0.04}, "orqa": {"exact_match": 0.03}},
             "recall": {"pretrained": {"recall@5": 0.17}, "warm_start": {"recall@5": 0.16}},
             "mlm_accuracy_realm": 0.12, "retrieval_utility": {"last": 0.05, "chosen": 0.07},
             "refreshes": 3.0}
  cell = lambda name: ablations.wiki_cell_summary(
      ablations.ROW_BY_NAME[name], summary, minutes=2.0, qa_checkpoint="step 50", pretraining="p")
  realm, orqa, mixed = cell("realm"), cell("orqa"), cell("realm_retriever_bert_encoder")
  assert (realm["qa_em"], realm["recall@5_zero_shot"], realm["mlm_accuracy"],
          realm["retrieval_utility"], realm["refreshes"]) == (0.04, 0.17, 0.12, 0.05, 3.0)
  assert (orqa["qa_em"], orqa["recall@5_zero_shot"]) == (0.03, 0.16)
  assert mixed["qa_em"] == 0.04 and math.isnan(mixed["mlm_accuracy"])
  assert orqa["qa_checkpoint"] == "step 50" and orqa["pretraining"] == "p"


def test_the_wiki_world_takes_its_recipes_settings_alone(tmp_path):
  with pytest.raises(ValueError, match="wiki recipe's steps"):
    ablations.run(str(tmp_path), (), seeds=(0,), pretrain_steps=100, finetune_steps=None,
                  world="wiki")
  assert set(ablations.WIKI_ROWS) <= set(ablations.ROW_BY_NAME)
  assert "retriever_held" not in ablations.WIKI_ROWS


def test_the_wiki_table_runs_each_rows_recipe_once_and_keeps_its_cells(tmp_path, monkeypatch,
                                                                       wiki_world):
  del wiki_world
  made = []

  class FakeWikiRecipe:
    def __init__(self, row):
      self.row, self.pretrain = row, str(tmp_path / "pretrain")

    def run(self):
      made.append(self.row.name)
      em = {"realm": 0.05, "realm_retriever_bert_encoder": 0.04, "orqa": 0.05}[self.row.name]
      return {"qa": {"realm": {"exact_match": em}, "orqa": {"exact_match": 0.03}},
              "recall": {"pretrained": {"recall@5": 0.2}, "warm_start": {"recall@5": 0.1}},
              "mlm_accuracy_realm": 0.1, "retrieval_utility": {"last": 0.05}, "refreshes": 2.0}

    def qa_metrics_path(self, row="realm"):
      path = tmp_path / f"{self.row.name}_{row}.json"
      path.write_text(json.dumps({"checkpoint_step": 9, "checkpoint_choice": "best by "
                                  "eval/exact_match=0.1 in best.json"}))
      return str(path)

  monkeypatch.setattr(ablations, "wiki_cell_recipe",
                      lambda row, seed, out, smoke=False: FakeWikiRecipe(row))
  monkeypatch.setattr(ablations, "pretraining_id", lambda run_dir: "params abc (step 200)")
  wanted = ("orqa", "realm_retriever_bert_encoder")
  rows = ablations.run(str(tmp_path / "out"), wanted, seeds=(0,), pretrain_steps=None,
                       finetune_steps=None, cells=str(tmp_path / "cells"), world="wiki")
  assert sorted(made) == ["orqa", "realm", "realm_retriever_bert_encoder"]
  assert rows["orqa"][0]["qa_em"] == 0.03 and rows["orqa"][0]["recall@5_zero_shot"] == 0.1
  assert rows["realm_retriever_bert_encoder"][0]["qa_em"] == 0.04
  assert rows["realm"][0]["qa_em"] == 0.05 and ablations.dev_picked(rows["realm"][0])
  assert ablations.table(rows, "wiki").startswith("| row | wiki QA test EM |")
  made.clear()
  again = ablations.run(str(tmp_path / "out"), wanted, seeds=(0,), pretrain_steps=None,
                        finetune_steps=None, cells=str(tmp_path / "cells"), world="wiki")
  assert not made
  assert {name: c[0]["qa_em"] for name, c in again.items()} == {
      name: c[0]["qa_em"] for name, c in rows.items()}
  # Reporting only: the kept cells as they are, a missing seed left out, nothing made.
  reported = ablations.run(str(tmp_path / "elsewhere"), ("orqa", "random_token"), seeds=(0, 1),
                           pretrain_steps=None, finetune_steps=None,
                           cells=str(tmp_path / "cells"), world="wiki", make=False)
  assert not made and not (tmp_path / "elsewhere" / "seed1").exists()
  assert {name: sorted(c) for name, c in reported.items()} == {"orqa": [0], "realm": [0]}
  assert reported["orqa"][0]["qa_em"] == 0.03


def test_a_parameter_added_at_its_inert_value_keeps_the_fingerprint(tmp_path, monkeypatch):
  experiments = tmp_path / "repo" / "gin_configs" / "experiments"
  experiments.mkdir(parents=True)
  pretrain = "train_main.num_steps = 200\nPretrainJob.num_candidates = 8\n"
  (experiments / "toy_pretrain.gin").write_text(pretrain)
  monkeypatch.setattr(ablations, "REPO", str(tmp_path / "repo"))
  inert = ablations.fingerprint({})
  (experiments / "toy_pretrain.gin").write_text(pretrain + "PretrainJob.oracle_blocks = 0\n")
  assert ablations.fingerprint({}) == inert
  # Without the entry the default enters the fingerprint: cells kept before the parameter
  # existed would all be made again.
  monkeypatch.setattr(ablations, "INERT_PARAMETERS", {})
  assert ablations.fingerprint({}) != inert
  monkeypatch.undo()
  monkeypatch.setattr(ablations, "REPO", str(tmp_path / "repo"))
  (experiments / "toy_pretrain.gin").write_text(pretrain + "PretrainJob.oracle_blocks = 1\n")
  assert ablations.fingerprint({}) != inert  # any other value is another computation
