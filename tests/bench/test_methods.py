"""bench/methods.py: its rows and its three tables (mean ± std over seeds), checked on
hand-worked numbers, and the fine-tuning costs read from a run directory."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import methods  # noqa: E402  pylint: disable=wrong-import-position


def _summary(em, recall_before=0.4, trainable=1000):
  return {"qa_em_realm": em, "recall@5_before": recall_before, "recall@5_after": 0.5,
          "mlm_accuracy_realm": 0.13, "retrieval_utility_last": 0.4, "minutes": 12.0,
          "trainable_params": trainable, "step_seconds": 0.8, "checkpoint_mb": 34.0}


def test_rows_share_the_base_rows_pretraining_where_they_should():
  rows = {name: kwargs for name, _, kwargs in methods.rows()}
  assert list(rows)[0] == methods.BASE_ROW  # the others may reuse its directory
  assert rows["objective_pdist"]["pretrain_bindings"] == [
      "PretrainJob.retriever_objective='pdist'"]
  assert rows["warm_retromae"] == {"warm_start_gin": methods.RETROMAE_GIN}
  assert rows["peft_lora"]["finetune_name"] == "finetune_lora"
  assert rows["warm_retromae_dec70"]["warm_start_bindings"] == ["DECODER_MASK_RATE=0.7"]
  assert rows["warm_retromae_bert_dec70"]["ict_from_bert"] is True
  assert len(rows) == 10


def test_the_three_tables():
  results = {"objective_marginal": [_summary(0.2), _summary(0.4)],
             "objective_pdist": [_summary(0.1), _summary(0.1)],
             "warm_retromae": [_summary(0.3, recall_before=0.2)] * 2,
             "peft_lora": [_summary(0.15, trainable=5000), _summary(0.25, trainable=5000)]}
  objectives, warm, peft = [t.splitlines() for t in methods.tables(results).split("\n\n")]
  assert objectives[2].startswith("| REALM's marginal likelihood | 0.500 ± 0.000 |")
  assert objectives[2].endswith("| 0.300 ± 0.100 | 12.0 ± 0.0 |")
  assert objectives[3].startswith("| perplexity distillation (PDist)")
  assert len(objectives) == 4  # rows not measured are left out
  assert warm[2].startswith("| ICT | 0.400 ± 0.000 |")
  assert warm[3].startswith("| RetroMAE | 0.200 ± 0.000 |")
  assert peft[2].startswith("| full | 0.300 ± 0.100 | 1,000 ± 0 |")
  assert peft[3].startswith("| LoRA | 0.200 ± 0.050 | 5,000 ± 0 |")


def test_finetune_costs_from_a_run_directory(tmp_path, monkeypatch):
  run = tmp_path / "run"
  step = run / "checkpoints" / "120"
  step.mkdir(parents=True)
  (step / "a.bin").write_bytes(b"x" * (3 << 20))
  (step / "b.bin").write_bytes(b"x" * (1 << 20))
  log = tmp_path / "finetune.log"
  log.write_text("train: done (job finetune, ..., 8,805,185 params (12,345 trained), ...)\n")
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(checkpoints, "latest_checkpoint_step", lambda run_dir: 120)
  costs = methods.finetune_costs(str(run), str(log))
  assert costs["trainable_params"] == 12345 and costs["checkpoint_mb"] == 4.0
  assert costs["step_seconds"] != costs["step_seconds"]  # no TensorBoard: NaN
  log.write_text("train: done (job finetune, ..., 8,788,801 params, mesh ...)\n")
  assert methods.finetune_costs(str(run), str(log))["trainable_params"] == 8788801


def test_comparisons_pair_each_seed_with_the_row_it_changes():
  # PDist minus marginal, per seed: 0.1 - 0.2 = -0.1 and 0.1 - 0.4 = -0.3: mean -0.2, std 0.1,
  # the same sign in both: beyond the spread. LoRA: 0.15 - 0.2 = -0.05, 0.45 - 0.4 = +0.05:
  # mean 0, within. RetroMAE has one seed of two: left out.
  results = {"objective_marginal": [_summary(0.2), _summary(0.4)],
             "objective_pdist": [_summary(0.1), _summary(0.1)],
             "warm_retromae": [_summary(0.3, recall_before=0.2)],
             "peft_lora": [_summary(0.15), _summary(0.45)]}
  lines = methods.comparisons(results, (0, 1)).splitlines()
  assert lines == [
      "* perplexity distillation (PDist) vs REALM's marginal, retrieval utility: within the "
      "seed spread (difference +0.000 ± 0.000 over seeds 0, 1; same sign in 0 of 2)",
      "* perplexity distillation (PDist) vs REALM's marginal, fine-tuned EM: differs beyond the "
      "seed spread (difference -0.200 ± 0.100 over seeds 0, 1; same sign in 2 of 2)",
      "* LoRA vs full fine-tuning, EM: within the seed spread (difference +0.000 ± 0.050 over "
      "seeds 0, 1; same sign in 0 of 2)"]
