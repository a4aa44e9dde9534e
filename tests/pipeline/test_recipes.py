"""realm_jax.pipeline.recipes: REALM's recipe defined once. The toy plan's stages in order; a
stage whose outputs exist is skipped, so a second run runs nothing (the outputs made for real
by a runner that writes what each job would leave); the paper-scale plan's commands against
hand-written ones, its per-host batches against the gins', and every one of its gin jobs
parsed by gin with the bindings the plan gives it."""

import os
import re

import numpy as np
import pytest

from realm_jax import checkpoints
from realm_jax import gin_utils
from realm_jax.index import store as store_lib
from realm_jax.pipeline import recipes
from realm_jax.pipeline import stages

TOY_STAGES = [
    "0 the BERT (converted from its transformers files)",
    "1 warm start (toy_ict.gin)",
    "2 first index (from the warm start's checkpoint)",
    "  recall before pretraining",
    "3 REALM pretraining + index builder (two processes)",
    "  recall after pretraining",
    "4 frozen indexes for fine-tuning (REALM and the ORQA-style baseline, side by side)",
    "5 open-QA fine-tuning (REALM and the ORQA-style baseline, side by side)",
    "6 evaluation on the toy QA test split (REALM and the ORQA-style baseline, side by side)"]


def _checkpoint(run_dir, step):
  path = checkpoints.checkpoint_path(run_dir, step)
  os.makedirs(os.path.join(path, checkpoints.METADATA_ITEM), exist_ok=True)
  open(os.path.join(path, "_CHECKPOINT_METADATA"), "w").close()


def _make(output):
  """What a job leaves behind, made for real: a trained run (its checkpoint 400), an index, a
  converted BERT, a metrics file."""
  if isinstance(output, stages.TrainedRun):
    _checkpoint(output.run_dir, 400)
    with open(os.path.join(output.run_dir, "TRAINING_DONE"), "w", encoding="utf-8") as f:
      f.write("{}")
  elif isinstance(output, stages.Index):
    step = checkpoints.latest_checkpoint_step(output.run_dir) or 0
    store_lib.publish_index(output.run_dir, step, np.zeros((2, 2), np.float32),
                            block_store_id="b")
  elif isinstance(output, stages.Checkpoint):
    _checkpoint(output.run_dir, output.step or 0)
  elif isinstance(output, stages.File):
    os.makedirs(os.path.dirname(output.path), exist_ok=True)
    with open(output.path, "w", encoding="utf-8") as f:
      f.write("{}")


class _MakingRunner:
  """A runner that runs nothing but leaves what each pending job would: it records each
  command line with its deferred values read (they must be readable by then)."""

  def __init__(self):
    self.commands = []

  def run_stage(self, stage, log_dir):
    del log_dir
    for job in stage.pending():
      self.commands.append(stages.resolve_tokens(job.argv("python")))
      _make(job.output)
    if stage.builder is not None:  # the builder's last refresh: the final checkpoint's index
      self.commands.append(stages.resolve_tokens(stage.builder.argv("python")))
      _make(stages.Index(stage.jobs[0].output.run_dir))


def test_the_toy_plan_and_a_second_run_that_runs_nothing(tmp_path, capsys):
  runner = _MakingRunner()
  run = recipes.Recipe(str(tmp_path / "out"), "/store", toy_bert=recipes.bert_lib.toy_bert_dir(
      "shipped"), runner=runner)
  plan = run.plan()
  assert [stage.name for stage in plan] == TOY_STAGES
  run.run_stages(plan)
  modules = [cmd[2].rsplit(".", 1)[1] for cmd in runner.commands]
  assert modules == ["hf", "train", "build_index", "evaluate", "train", "build_index",
                     "evaluate", "build_index", "build_index", "train", "train", "evaluate",
                     "evaluate"]
  out = tmp_path / "out"
  recall_after = runner.commands[6]
  assert "--gin.evaluate_main.index_step=400" in recall_after  # the builder's last index
  assert f"--gin.evaluate_main.first_index_checkpoint_dir='{out}/ict/checkpoints/400'" in (
      recall_after)
  capsys.readouterr()
  runner.commands.clear()
  run.run_stages(run.plan())
  assert runner.commands == []
  assert capsys.readouterr().out.splitlines() == [
      f"recipe: {name}: already done, skipped" for name in TOY_STAGES]


PAPER = "/mnt/realm/runs"
STORE = "/mnt/realm/data/wiki_blocks"
BERT_HF = "/mnt/realm/bert-base-uncased"
BERT = "/mnt/realm/runs/bert/checkpoints/0"
ICT = "{latest_checkpoint:/mnt/realm/runs/ict}"
BEST = "{best_checkpoint:/mnt/realm/runs/pretrain}"


def _paper(**kwargs):
  return recipes.PaperRecipe(PAPER, block_store=STORE, bert=BERT_HF, make_dirs=False, **kwargs)


def test_the_paper_scale_plan_is_the_papers_stages_with_the_wiki_and_nq_gins():
  plan = _paper(hosts=8).plan()
  commands = [(stage.name, [job.argv("python") for job in stage.jobs],
               stage.builder and stage.builder.argv("python")) for stage in plan]
  py = ["python", "-m"]
  assert commands == [
      ("0 the BERT (converted from its transformers files)",
       [py + ["realm_jax.convert.hf", f"--hf_dir={BERT_HF}", f"--run_dir={PAPER}/bert"]], None),
      ("1 warm start (wiki_ict.gin)",
       [py + ["realm_jax.train", "--gin_file=gin_configs/experiments/wiki_ict.gin",
              f"--gin.RUN_DIR='{PAPER}/ict'", f"--gin.INIT_CHECKPOINT='{BERT}'",
              f"--gin.BLOCK_STORE='{STORE}'", "--gin.BATCH_SIZE=512"]], None),
      ("2 first index (from the warm start's checkpoint)",
       [py + ["realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin", "--once",
              f"--gin.RUN_DIR='{PAPER}/pretrain'", f"--gin.BLOCK_STORE='{STORE}'",
              f"--gin.build_index_main.checkpoint_dir='{ICT}'"]], None),
      ("3 REALM pretraining + index builder (two processes)",
       [py + ["realm_jax.train", "--gin_file=gin_configs/experiments/wiki_pretrain.gin",
              f"--gin.RUN_DIR='{PAPER}/pretrain'", f"--gin.INIT_CHECKPOINT='{ICT}'",
              f"--gin.ENCODER_CHECKPOINT='{BERT}'", f"--gin.BLOCK_STORE='{STORE}'",
              "--gin.BATCH_SIZE=64"]],
       py + ["realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin",
             f"--gin.RUN_DIR='{PAPER}/pretrain'", f"--gin.BLOCK_STORE='{STORE}'"]),
      ("4 frozen indexes for fine-tuning (REALM's from best.json's pretraining checkpoint, the "
       "ORQA-style baseline's from ICT's)",
       [py + ["realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin", "--once",
              f"--gin.RUN_DIR='{PAPER}/finetune'", f"--gin.BLOCK_STORE='{STORE}'",
              f"--gin.build_index_main.checkpoint_dir='{BEST}'"],
        py + ["realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin", "--once",
              f"--gin.RUN_DIR='{PAPER}/orqa'", f"--gin.BLOCK_STORE='{STORE}'",
              f"--gin.build_index_main.checkpoint_dir='{ICT}'"]], None),
      ("5 open-QA fine-tuning on nq_open (REALM and the ORQA-style baseline, one after the "
       "other)",
       [py + ["realm_jax.train", "--gin_file=gin_configs/experiments/nq_finetune.gin",
              f"--gin.RUN_DIR='{PAPER}/finetune'", f"--gin.INIT_CHECKPOINT='{BEST}'",
              f"--gin.BLOCK_STORE='{STORE}'", "--gin.BATCH_SIZE=2"],
        py + ["realm_jax.train", "--gin_file=gin_configs/experiments/nq_finetune.gin",
              f"--gin.RUN_DIR='{PAPER}/orqa'", f"--gin.INIT_CHECKPOINT='{ICT}'",
              f"--gin.ENCODER_CHECKPOINT='{BERT}'", f"--gin.BLOCK_STORE='{STORE}'",
              "--gin.BATCH_SIZE=2"]], None),
      ("6 evaluation on nq_open's test split (REALM and the ORQA-style baseline)",
       [py + ["realm_jax.evaluate", "--gin_file=gin_configs/models/base.gin",
              "--gin_file=gin_configs/runs/eval.gin", f"--gin.RUN_DIR='{PAPER}/finetune'",
              "--gin.evaluate_main.split='test'",
              f"--gin.evaluate_main.output='{PAPER}/eval/nq_open_test.jsonl'",
              "--gin.TASK='nq_open'", f"--gin.evaluate_main.block_store='{STORE}'"],
        py + ["realm_jax.evaluate", "--gin_file=gin_configs/models/base.gin",
              "--gin_file=gin_configs/runs/eval.gin", f"--gin.RUN_DIR='{PAPER}/orqa'",
              "--gin.evaluate_main.split='test'",
              f"--gin.evaluate_main.output='{PAPER}/eval/nq_open_orqa_test.jsonl'",
              "--gin.TASK='nq_open'", f"--gin.evaluate_main.block_store='{STORE}'"]], None)]
  roles = [[job.role for job in stage.jobs] for stage in plan]
  assert roles == [["host"], ["trainer"], ["builder"], ["trainer"], ["builder", "builder"],
                   ["trainer", "trainer"], ["host", "host"]]
  assert plan[3].builder.role == "builder" and not plan[5].together
  assert not os.path.exists(PAPER)  # a plan only: nothing made


def test_the_paper_batches_are_the_gins_global_batches_over_the_hosts():
  for child, gin_file in (("ict", "wiki_ict"), ("pretrain", "wiki_pretrain"),
                          ("finetune", "nq_finetune"), ("finetune", "wq_finetune"),
                          ("finetune", "ct_finetune")):
    with open(os.path.join(gin_utils.REPO_ROOT, "gin_configs", "experiments", f"{gin_file}.gin"),
              encoding="utf-8") as f:
      (batch,) = re.findall(r"^BATCH_SIZE = (\d+)$", f.read(), re.M)
    assert recipes.PAPER_GLOBAL_BATCH[child] == int(batch), gin_file
  assert _paper(hosts=2).data_bindings("ict") == (("BLOCK_STORE", STORE), ("BATCH_SIZE", 2048))
  with pytest.raises(ValueError, match="3 hosts: the global batch of ict, pretrain, finetune"):
    _paper(hosts=3)
  with pytest.raises(ValueError, match="task='squad'"):
    _paper(task="squad")


@pytest.mark.parametrize("task", sorted(recipes.PAPER_TASKS))
def test_every_paper_gin_job_parses_with_the_bindings_the_plan_gives_it(task):
  """Each training, index and evaluation job's gin files and bindings, parsed as its entry
  point parses them: every required macro set, none set that nothing uses."""
  # pylint: disable-next=import-outside-toplevel,unused-import
  from realm_jax import build_index, evaluate, train  # noqa: F401  (their configurables)
  plan = _paper(task=task, hosts=8).plan()
  jobs = [job for stage in plan for job in (*stage.jobs, stage.builder)
          if job is not None and job.gin_files]
  assert len(jobs) == 10
  try:
    for job in jobs:
      bindings, rest = gin_utils.split_gin_args(job.arguments())
      gin_utils.parse_gin(job.gin_files, bindings)
      assert rest == [f"--gin_file={f}" for f in job.gin_files] + list(job.flags)
  finally:
    import gin  # pylint: disable=import-outside-toplevel
    gin.clear_config()
