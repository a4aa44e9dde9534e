"""bench/methods.py: its rows, its shared warm starts (RetroMAE, then ICT continuing it), its
three tables (mean ± sample std over seeds) and its paired comparisons, checked on hand-worked
numbers, and the fine-tuning costs read from a run directory."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import methods  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import recipe as recipe_lib  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import toy_bert  # noqa: E402  pylint: disable=wrong-import-position

# A real BERT directory: the recipe reads its config.json for the towers' shape.
SHIPPED_BERT = toy_bert.SHIPPED_DIR


def _summary(em, recall_before=0.4, trainable=1000, recall_after=0.5):
  return {"qa_em_realm": em, "recall@5_before": recall_before, "recall@5_after": recall_after,
          "mlm_accuracy_realm": 0.13, "retrieval_utility_last": 0.4, "minutes": 12.0,
          "trainable_params": trainable, "step_seconds": 0.8, "checkpoint_mb": 34.0}


def _by_seed(*summaries):
  return dict(enumerate(summaries))


def test_rows_share_warm_starts_and_the_base_rows_pretraining_where_they_should():
  rows = {name: kwargs for name, _, kwargs in methods.rows()}
  assert list(rows)[0] == methods.BASE_ROW  # the PEFT rows fine-tune its pretraining
  assert rows["objective_pdist"] == {
      "warm_start": "ict", "pretrain_bindings": ["PretrainJob.retriever_objective='pdist'"]}
  assert rows["warm_retromae_ict"] == {"warm_start": "retromae_ict"}
  assert rows["warm_bert_ict"] == {"warm_start": "bert_ict"}
  assert rows["warm_retromae"] == {"warm_start_gin": methods.RETROMAE_GIN}
  assert rows["warm_retromae_dec70"]["warm_start_bindings"] == ["DECODER_MASK_RATE=0.7"]
  # RetroMAE from the toy BERT is one run: its own row's warm start and what ICT continues.
  assert rows["warm_retromae_bert_dec70"] == {"warm_start": "retromae_bert_dec70"}
  assert methods.SHARED_WARM_STARTS["retromae_ict"].continues == "retromae_bert_dec70"
  assert rows["peft_lora"]["finetune_name"] == "finetune_lora"
  assert methods.PEFT_ROWS == ("peft_lora", "peft_adapters")
  assert len(rows) == 12


def test_shared_warm_starts_retromae_then_ict_continuing_it(tmp_path, monkeypatch):
  commands, trained = [], set()

  def fake_child(cmd, log):
    del log
    commands.append(list(cmd))
    trained.add(next(a for a in cmd if a.startswith("--gin.RUN_DIR=")).split("'")[1])

  monkeypatch.setattr(recipe_lib, "run_child", fake_child)
  monkeypatch.setattr(recipe_lib.Recipe, "trained", lambda self, run_dir: run_dir in trained)
  monkeypatch.setattr(recipe_lib.Recipe, "_bert_checkpoint",
                      lambda self: "/converted/checkpoints/0")
  monkeypatch.setattr(recipe_lib, "_latest_step", lambda run_dir: 400)
  shared = str(tmp_path / "seed3" / "shared")
  run_dir = methods.shared_warm_start("retromae_ict", shared, 3, "/store", SHIPPED_BERT)
  assert run_dir == os.path.join(shared, "retromae_ict")
  retromae, ict = commands
  assert "--gin_file=gin_configs/experiments/toy_retromae.gin" in retromae
  assert "--gin.INIT_CHECKPOINT='/converted/checkpoints/0'" in retromae  # from the toy BERT
  assert "--gin.DECODER_MASK_RATE=0.7" in retromae and "--gin.train_main.seed=3" in retromae
  assert "--gin_file=gin_configs/experiments/toy_ict.gin" in ict
  assert (f"--gin.INIT_CHECKPOINT='{shared}/retromae_bert_dec70/checkpoints/400'" in ict)
  assert "--gin.IctJob.continue_retriever=True" in ict  # the whole retriever, not a BERT
  assert "--gin.train_main.seed=3" in ict and f"--gin.RUN_DIR='{run_dir}'" in ict
  # Trained once: asked again (the RetroMAE row, another row), nothing runs.
  methods.shared_warm_start("retromae_bert_dec70", shared, 3, "/store", SHIPPED_BERT)
  methods.shared_warm_start("retromae_ict", shared, 3, "/store", SHIPPED_BERT)
  assert len(commands) == 2
  # BERT then ICT: ICT from the toy BERT; the recipe's ICT from random weights.
  methods.shared_warm_start("bert_ict", shared, 3, "/store", SHIPPED_BERT)
  methods.shared_warm_start("ict", shared, 3, "/store", SHIPPED_BERT)
  assert "--gin.INIT_CHECKPOINT='/converted/checkpoints/0'" in commands[2]
  assert "--gin.INIT_CHECKPOINT=None" in commands[3]
  assert f"--gin.RUN_DIR='{shared}/ict'" in commands[3]  # where the ablations' ICT lives too


def test_the_three_tables():
  results = {"objective_marginal": _by_seed(_summary(0.2), _summary(0.4)),
             "objective_pdist": _by_seed(_summary(0.1), _summary(0.1)),
             "warm_retromae": _by_seed(*[_summary(0.3, recall_before=0.2)] * 2),
             "warm_retromae_ict": _by_seed(_summary(0.3, recall_before=0.5)),
             "peft_lora": _by_seed(_summary(0.15, trainable=5000), _summary(0.25, trainable=5000))}
  warm, objectives, peft = [t.splitlines() for t in methods.tables(results).split("\n\n")]
  # RetroMAE then ICT first; one seed: its value alone.
  assert warm[2].startswith("| RetroMAE from the toy BERT (decoder mask 70%), then ICT | 0.500 |")
  assert warm[3].startswith("| ICT from random weights (the recipe's) | 0.400 ± 0.000 |")
  assert warm[4].startswith("| RetroMAE instead of ICT | 0.200 ± 0.000 |")
  assert "(test)" in warm[0] and len(warm) == 5
  # 0.2 and 0.4: mean 0.3, sample std 0.141.
  assert objectives[2].startswith("| REALM's marginal likelihood | 0.500 ± 0.000 |")
  assert objectives[2].endswith("| 0.300 ± 0.141 | 12.0 ± 0.0 |")
  assert objectives[3].startswith("| perplexity distillation (PDist)")
  assert len(objectives) == 4  # rows not measured are left out
  assert peft[2].startswith("| full | 0.300 ± 0.141 | 1,000 ± 0 |")
  # 0.15 and 0.25: mean 0.2, sample std sqrt(0.005) = 0.071.
  assert peft[3].startswith("| LoRA | 0.200 ± 0.071 | 5,000 ± 0 |")
  # A table none of whose rows was measured is left out whole.
  only_warm = methods.tables({"warm_bert_ict": _by_seed(_summary(0.3))}).split("\n\n")
  assert len(only_warm) == 1 and only_warm[0].startswith("| warm start |")


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
  results = {
      # RetroMAE then ICT minus BERT then ICT, recall before pretraining: 0.10, 0.05, 0.10:
      # +0.083 ± 0.017 (sd 0.028868 / sqrt 3), every seed: judged as RetroMAE's paper predicts.
      # After pretraining 0.5 - 0.5: no difference. EM: 0.3 - 0.3 in seeds 0 and 2, 0.3 - 0.35
      # in seed 1: mean -0.017, sd 0.028868, SE 0.016667.
      "warm_retromae_ict": _by_seed(_summary(0.3, 0.30), _summary(0.3, 0.25),
                                    _summary(0.3, 0.40)),
      "warm_bert_ict": _by_seed(_summary(0.3, 0.20), _summary(0.35, 0.20), _summary(0.3, 0.30)),
      # PDist minus marginal, EM: 0.1 - 0.2 = -0.1 and 0.05 - 0.4 = -0.35: mean -0.225, sample
      # sd 0.176777, SE 0.125: |mean| < 2 SE = 0.25; utility 0.4 - 0.4: none. Seed 2 of the
      # marginal row has no PDist partner: left out of the pairs.
      "objective_marginal": _by_seed(_summary(0.2), _summary(0.4), _summary(0.9)),
      "objective_pdist": _by_seed(_summary(0.1), _summary(0.05)),
  }
  assert methods.comparisons(results).splitlines() == [
      "* RetroMAE then ICT vs BERT then ICT, zero-shot recall@5 of the warm start: +0.083 ± "
      "0.017 (seeds 0, 1, 2: +0.100, +0.050, +0.100): holds in every seed, beyond two standard "
      "errors",
      "* RetroMAE then ICT vs BERT then ICT, recall@5 after pretraining: +0.000 ± 0.000 (seeds "
      "0, 1, 2: +0.000, +0.000, +0.000): does not hold",
      "* RetroMAE then ICT vs BERT then ICT, fine-tuned EM: -0.017 ± 0.017 (seeds 0, 1, 2: "
      "+0.000, -0.050, +0.000): does not hold",
      "* perplexity distillation (PDist) vs REALM's marginal, retrieval utility: +0.000 ± 0.000 "
      "(seeds 0, 1: +0.000, +0.000): within two standard errors, not the same sign in every "
      "seed",
      "* perplexity distillation (PDist) vs REALM's marginal, fine-tuned EM: -0.225 ± 0.125 "
      "(seeds 0, 1: -0.100, -0.350): same sign in every seed, within two standard errors"]
