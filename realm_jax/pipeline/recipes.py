"""REALM's recipe, defined once: from a BERT to evaluated open-QA systems, REALM beside the
ORQA-style baseline, as stages (`stages.Stage`) over one output directory.

`Recipe.plan()` is the stage list: the BERT converted, the warm start (ICT), its index,
REALM pretraining with the index builder, the frozen indexes of fine-tuning, the fine-tunings
and their evaluation, with the world's own evaluations of retrieval between them. The same
definition serves the toy world (`Recipe`), your corpus and questions (`OwnDataRecipe`, whose
checks and choices `prepare` makes first), the wiki world (`WikiRecipe`) and paper scale
(`PaperRecipe`: the wiki_* and nq_finetune gins on shared paths). `run()` runs the plan on a
`stages.Runner` (`realm_jax_launch.local`), skipping every stage that is done, and returns the
figures of the result table; `realm_jax_launch.tpu_pod run` runs `PaperRecipe.plan()` on a pod.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable, Optional, Sequence

from realm_jax import fileio
from realm_jax import gin_utils
from realm_jax.pipeline import bert as bert_lib
from realm_jax.pipeline import data_checks
from realm_jax.pipeline import stages
from realm_jax.pipeline.data_checks import PROG, InputError
from realm_jax.pipeline.stages import (BUILDER, HOST, TRAINER, BestCheckpoint, Checkpoint, File,
                                       Index, Job, LatestCheckpoint, LatestIndex, Stage,
                                       TrainedRun)

DEFAULT_FINETUNE_NAME = "finetune"
DEFAULT_PRETRAIN_STEPS = 400  # toy_pretrain.gin's NUM_STEPS
INDEX_GIN = "gin_configs/runs/build_index.gin"
TOY_WARM_START_GIN = "gin_configs/experiments/toy_ict.gin"
# Checkpoints per run when a --*_steps flag sets its length, as the toy gins have them.
CHECKPOINTS_PER_RUN = {"ict": 4, "pretrain": 5, "finetune": 3}
# The name your corpus's tasks carry (ict_own, realm_own_salient_span): each child registers
# them over the recipe's BlockStore (`realm_jax_tasks.register_corpus_for_task`).
OWN_CORPUS = "own"
# Reader rows are `[CLS] question [SEP] body [SEP]`: the block length and this much room for
# the question, as toy_finetune.gin's 160 for the toy world's blocks of 128.
READER_QUESTION_ROOM = 32
# The wiki world's own settings, chosen on its dev recall@5 (docs/wiki_world.md): ICT keeps the
# query sentence half the time; pretraining freezes the retriever for its first half.
WIKI_ICT_REMOVE_PROBABILITY = 0.5
WIKI_RETRIEVER_FROZEN_SHARE = 0.5
# Its run lengths where they differ from the toy gins': halved for time.
WIKI_STEPS = {"pretrain": 200, "finetune": 150}
# Paper scale (docs/paper_scale.md): the fine-tuning gin and QA task of each benchmark, and the
# global batch of each training gin (BATCH_SIZE in the gins is per host: divided by the hosts).
PAPER_TASKS = {"nq": ("gin_configs/experiments/nq_finetune.gin", "nq_open"),
               "wq": ("gin_configs/experiments/wq_finetune.gin", "web_questions"),
               "ct": ("gin_configs/experiments/ct_finetune.gin", "curated_trec")}
PAPER_GLOBAL_BATCH = {"ict": 4096, "pretrain": 512, "finetune": 16}

Value = Any  # a binding's value: a Python value, gin_utils.GinText or a deferred value


def step_bindings(child: str, steps: Optional[int],
                  learning_rate: Optional[float] = None) -> list[str]:
  """`--ict_steps`, `--pretrain_steps`, `--finetune_steps` ('ict', 'pretrain', 'finetune') as
  gin bindings ("KEY=VALUE" text, as recorded in own_data.json): NUM_STEPS and a checkpoint
  every 1/CHECKPOINTS_PER_RUN of the run; then `--<child>_lr` as LEARNING_RATE; none for None
  (the toy gin's own)."""
  bindings = []
  if steps is not None:
    every = max(1, steps // CHECKPOINTS_PER_RUN[child])
    bindings += [gin_utils.binding("NUM_STEPS", steps),
                 gin_utils.binding("train_main.checkpoint_every", every)]
  if learning_rate is not None:
    bindings.append(gin_utils.binding("LEARNING_RATE", learning_rate))
  return bindings


def qa_eval_name(finetune_name: str = DEFAULT_FINETUNE_NAME) -> str:
  """The evaluation name (`<out>/eval/<name>_<split>.jsonl`) of a `Recipe` fine-tuning slot."""
  return "toy_qa" if finetune_name == DEFAULT_FINETUNE_NAME else f"toy_qa_{finetune_name}"


def read_scalars(logdir: str) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} of the TensorBoard event files under `logdir` (clu writes scalars as
  tensor summaries)."""
  from tensorboard.backend.event_processing import (  # pylint: disable=g-import-not-at-top
      event_accumulator)
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
  accumulator.Reload()
  return {tag: {event.step: float(tensor_util.make_ndarray(event.tensor_proto))
                for event in accumulator.Tensors(tag)}
          for tag in accumulator.Tags()["tensors"]}


def metrics_json(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _parsed(bindings: Sequence[str]) -> stages.Bindings:
  """"KEY=VALUE" bindings given as text (flags, a bench's rows) as pairs, kept as written."""
  return tuple(gin_utils.parse_binding(text) for text in bindings)


def _latest_step(run_dir: str) -> Optional[int]:
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.latest_checkpoint_step(run_dir)


@dataclasses.dataclass(frozen=True)
class Row:
  """A fine-tuned system: its run directory, the checkpoint it starts from (and whose frozen
  index it reads, unless `indexed` is off: the BM25 reader), its log's name, its bindings
  before the recipe's and `last` after them, and its evaluation's name and bindings."""
  run_dir: str
  init: Value
  log: str
  bindings: stages.Bindings
  eval_name: str
  eval_bindings: stages.Bindings = ()
  last: stages.Bindings = ()
  indexed: bool = True


class Recipe:
  """REALM on the toy world: the stages (the module docstring) over one output directory."""

  runner: Optional[stages.Runner] = None
  pretrain_gin = "gin_configs/experiments/toy_pretrain.gin"
  finetune_gin = "gin_configs/experiments/toy_finetune.gin"
  eval_gins: tuple[str, ...] = ("gin_configs/experiments/toy_eval.gin",)
  # Polling often: in lockstep the trainer waits for each index the builder makes.
  builder_bindings: stages.Bindings = (("build_index_main.poll_seconds", 0.5),)
  # The pretraining checkpoint fine-tuning starts from: the newest (the toy world's), or
  # best.json's (BestCheckpoint: what REALM's authors pick).
  pretrained = LatestCheckpoint

  def __init__(self, out: str, store: str, *, ict_dir: Optional[str] = None,
               toy_bert: Optional[str] = None, ict_from_bert: bool = False,
               pretrain_bindings: Sequence[str] = (),
               finetune_bindings: Sequence[str] = (), with_builder: bool = True,
               eval_split: str = "test", baseline: bool = True,
               warm_start_gin: str = TOY_WARM_START_GIN,
               warm_start_bindings: Sequence[str] = (), finetune_name: str = DEFAULT_FINETUNE_NAME,
               finetune_retriever: str = "pretrain", finetune_reader: str = "pretrain",
               runner: Optional[stages.Runner] = None, make_dirs: bool = True):
    """Args: out: the output directory; store: the toy BlockStore; ict_dir: an ICT run to
    start from (None: train one in `<out>/ict`); toy_bert: the BertForMaskedLM directory the
    towers start from (None: random weights); pretrain_bindings, finetune_bindings: extra
    `KEY=VALUE` bindings (the ablations); with_builder: refresh the index while pretraining;
    baseline: also the ORQA-style baseline; warm_start_gin: the retriever's warm start and its
    bindings; finetune_name: REALM's fine-tuning directory under `out`; finetune_retriever
    ('pretrain' or 'warm_start') and finetune_reader ('pretrain' or 'bert'): what it starts
    from (the mixes are Table 2's rows); make_dirs: make `<out>/logs` and `<out>/eval` now."""
    if finetune_retriever not in ("pretrain", "warm_start"):
      raise ValueError(f"finetune_retriever={finetune_retriever!r}: expected 'pretrain' or "
                       f"'warm_start'")
    if finetune_reader not in ("pretrain", "bert"):
      raise ValueError(f"finetune_reader={finetune_reader!r}: expected 'pretrain' or 'bert'")
    if runner is not None:
      self.runner = runner
    self.out = os.path.abspath(out)
    self.store = store
    self.toy_bert = toy_bert
    self.model_bindings, self.larger_than_toy = self._bert_shape(toy_bert)
    self.ict_from_bert = ict_from_bert
    self.baseline = baseline
    self.bert = os.path.join(self.out, "bert")
    self.orqa = os.path.join(self.out, "orqa")
    self.pretrain_bindings = list(pretrain_bindings)
    self.finetune_bindings = list(finetune_bindings)
    self.slot_bindings: list[str] = []
    self.with_builder = with_builder
    self.eval_split = eval_split
    self.logs = os.path.join(self.out, "logs")
    self.ict = os.path.abspath(ict_dir) if ict_dir else os.path.join(self.out, "ict")
    self.pretrain = os.path.join(self.out, "pretrain")
    self.warm_start_gin = warm_start_gin
    self.warm_start_bindings = list(warm_start_bindings)
    self.finetune_name = finetune_name
    self.finetune = os.path.join(self.out, finetune_name)
    self.finetune_retriever = finetune_retriever
    self.finetune_reader = finetune_reader
    self.evals = os.path.join(self.out, "eval")
    self.times: dict[str, float] = {}
    if make_dirs:
      os.makedirs(self.logs, exist_ok=True)
      os.makedirs(self.evals, exist_ok=True)

  @staticmethod
  def _bert_shape(toy_bert: Optional[str]) -> tuple[stages.Bindings, bool]:
    """(the towers' shape bindings, whether the BERT is larger than the toy model)."""
    return bert_lib.bert_shape_bindings(toy_bert), bert_lib.larger_than_toy(toy_bert)

  # -- bindings

  def gin_bindings(self, child: str) -> stages.Bindings:
    """The (name, value) bindings of one kind of child ('ict', 'pretrain', 'finetune',
    'evaluate'): the BERT's shape (`bert_lib.bert_shape_bindings`), then `data_bindings`."""
    return tuple(self.model_bindings) + tuple(self.data_bindings(child))

  def bindings(self, child: str) -> tuple[str, ...]:
    """`gin_bindings` as "KEY=VALUE" text."""
    return tuple(gin_utils.binding(name, value) for name, value in self.gin_bindings(child))

  def data_bindings(self, child: str) -> stages.Bindings:
    """The bindings that point one kind of child at the recipe's data: none here, the toy
    gins' own tasks and the toy store (`OwnDataRecipe`: your corpus and questions)."""
    del child
    return ()

  # -- what the stages start from

  def bert_checkpoint(self) -> Optional[str]:
    """The recipe's BERT as step 0 of `<out>/bert` (the BERT stage converts it), or None."""
    return None if self.toy_bert is None else os.path.join(self.bert, "checkpoints", "0")

  def warm_start_checkpoint(self) -> LatestCheckpoint:
    return LatestCheckpoint(self.ict)

  def pretrained_checkpoint(self):
    """The pretraining checkpoint fine-tuning starts from (a deferred value: `pretrained`)."""
    return self.pretrained(self.pretrain)

  def slot_start(self) -> tuple[Value, stages.Bindings]:
    """REALM's fine-tuning slot: (its retriever's checkpoint, which is also its index's and its
    INIT_CHECKPOINT; its reader binding): `finetune_retriever` and `finetune_reader`. With both
    'pretrain' there is no binding: the reader takes INIT_CHECKPOINT's encoder (REALM)."""
    retriever = (self.pretrained_checkpoint() if self.finetune_retriever == "pretrain"
                 else self.warm_start_checkpoint())
    if self.finetune_reader == "bert":
      reader = self.bert_checkpoint()
    elif self.finetune_retriever == "warm_start":
      reader = self.pretrained_checkpoint()  # the warm start has no encoder: take REALM's
    else:
      return retriever, ()
    return retriever, (("ENCODER_CHECKPOINT", reader),)

  # -- jobs

  def bert_stage(self) -> Optional[Stage]:
    """The BERT converted from its transformers files (none for random weights)."""
    if self.toy_bert is None:
      return None
    return Stage("0 the BERT (converted from its transformers files)", (Job(
        "realm_jax.convert.hf", "bert.log", Checkpoint(self.bert, 0),
        flags=(f"--hf_dir={self.toy_bert}", f"--run_dir={self.bert}"),
        inputs=(self.toy_bert,)),))

  def warm_start_job(self, run_dir: str, log: str, extra: Sequence[str],
                     init_checkpoint: Value, dry_run: bool = False) -> Job:
    """The warm start (`warm_start_gin`: ICT by default) into `run_dir`; `extra`: more
    bindings as text."""
    return Job("realm_jax.train", log, None if dry_run else TrainedRun(run_dir),
               gin_files=(self.warm_start_gin,),
               bindings=(("RUN_DIR", run_dir), ("INIT_CHECKPOINT", init_checkpoint),
                         *self.gin_bindings("ict"), *_parsed(extra)),
               dry_run=dry_run, inputs=_inputs(self.store, init_checkpoint), role=TRAINER)

  def index_job(self, run_dir: str, checkpoint: Value, log: str,
                of_latest_checkpoint: bool = False) -> Job:
    """`build_index --once` of `checkpoint` into `run_dir` (published as index step 0), or with
    None of `run_dir`'s newest checkpoint (published under its step)."""
    where = () if checkpoint is None else (("build_index_main.checkpoint_dir", checkpoint),)
    source = run_dir if checkpoint is None else checkpoint
    return Job("realm_jax.build_index", log, Index(run_dir, of_latest_checkpoint),
               gin_files=(INDEX_GIN,), flags=("--once",),
               bindings=(("RUN_DIR", run_dir), ("BLOCK_STORE", self.store), *where),
               inputs=_inputs(source, self.store), role=BUILDER)

  def recall_job(self, name: str, index_step: Value, split: str, run_dir: str,
                 index_checkpoint: Value) -> Job:
    """Retrieval recall of the questions of `split` against index `index_step` of `run_dir`
    (built from `index_checkpoint`): metrics in `<out>/eval/recall_<name>.metrics.json`."""
    output = os.path.join(self.evals, f"recall_{name}.jsonl")
    return Job("realm_jax.evaluate", f"recall_{name}.log", File(_metrics(output)),
               gin_files=self.eval_gins,
               bindings=(("RUN_DIR", run_dir), ("evaluate_main.mode", "retrieval"),
                         ("evaluate_main.index_step", index_step),
                         ("evaluate_main.first_index_checkpoint_dir", index_checkpoint),
                         ("evaluate_main.split", split), ("evaluate_main.output", output),
                         *self.gin_bindings("evaluate")),
               inputs=(f"{run_dir}/index",), role=HOST)

  def pretrain_job(self, dry_run: bool = False) -> Job:
    """The pretraining trainer (`dry_run`: from no warm start, its configuration checked)."""
    warm_start = None if dry_run else self.warm_start_checkpoint()
    return Job("realm_jax.train", "dry_run_pretrain.log" if dry_run else "trainer.log",
               None if dry_run else TrainedRun(self.pretrain), gin_files=(self.pretrain_gin,),
               bindings=(("RUN_DIR", self.pretrain), ("INIT_CHECKPOINT", warm_start),
                         ("ENCODER_CHECKPOINT", self.bert_checkpoint()),
                         # Without a builder no refresh is ever published to wait for.
                         *(() if self.with_builder
                           else (("PretrainJob.refresh_in_lockstep", False),)),
                         *self.gin_bindings("pretrain"), *_parsed(self.pretrain_bindings)),
               dry_run=dry_run, role=TRAINER,
               inputs=_inputs(warm_start, self.bert_checkpoint(), self.store))

  def builder_job(self) -> Job:
    """The index builder beside the pretraining trainer: it follows the run's checkpoints."""
    return Job("realm_jax.build_index", "builder.log", gin_files=(INDEX_GIN,),
               bindings=(("RUN_DIR", self.pretrain), ("BLOCK_STORE", self.store),
                         *self.builder_bindings),
               inputs=(f"{self.pretrain}/checkpoints", self.store), role=BUILDER)

  def finetune_job(self, run_dir: str, init_checkpoint: Value, log: str,
                   bindings: stages.Bindings, last: stages.Bindings = (),
                   dry_run: bool = False) -> Job:
    """A fine-tuning: `bindings`, the recipe's, then `last` (which override them)."""
    return Job("realm_jax.train", f"{log}.log", None if dry_run else TrainedRun(run_dir),
               gin_files=(self.finetune_gin,),
               bindings=(("RUN_DIR", run_dir), ("INIT_CHECKPOINT", init_checkpoint), *bindings,
                         *self.gin_bindings("finetune"), *_parsed(self.finetune_bindings),
                         *last),
               dry_run=dry_run, role=TRAINER,
               inputs=_inputs(init_checkpoint, None if dry_run else f"{run_dir}/index"))

  def evaluate_job(self, row: Row) -> Job:
    """EM on the questions of `eval_split` (and the reader's own retrieval) of a row."""
    predictions = os.path.join(self.evals, f"{row.eval_name}_{self.eval_split}.jsonl")
    return Job("realm_jax.evaluate", f"evaluate_{row.eval_name}.log", File(_metrics(predictions)),
               gin_files=self.eval_gins,
               bindings=(("RUN_DIR", row.run_dir), ("evaluate_main.split", self.eval_split),
                         ("evaluate_main.output", predictions), *self.gin_bindings("evaluate"),
                         *row.eval_bindings),
               inputs=(row.run_dir,), role=HOST)

  # -- the plan

  def plan(self) -> list[Stage]:
    """Every stage, in order (`data_stages` need `prepare`'s choices to be final)."""
    return self.data_stages() + self.pretraining_stages() + self.finetuning_stages()

  def data_stages(self) -> list[Stage]:
    """Stages that make the recipe's data (none: the toy world's is generated on first use)."""
    return []

  def pretraining_stages(self) -> list[Stage]:
    """The BERT, checks, the warm start, its index, REALM pretraining with the index builder
    beside it, and the world's evaluations after the first index and after pretraining."""
    how = (" + index builder (two processes)" if self.with_builder
           else " (index never refreshed)")
    init = self.bert_checkpoint() if self.ict_from_bert else None
    return [
        *filter(None, [self.bert_stage()]), *self.check_stages(),
        Stage(self.warm_start_title(),
              (self.warm_start_job(self.ict, "ict.log", self.warm_start_bindings, init),)),
        Stage("2 first index (from the warm start's checkpoint)",
              (self.index_job(self.pretrain, self.warm_start_checkpoint(), "index_0.log"),)),
        *self.evaluations("first index"),
        Stage("3 REALM pretraining" + how, (self.pretrain_job(),),
              builder=self.builder_job() if self.with_builder else None, pair=True),
        *self.evaluations("pretraining")]

  def finetuning_stages(self) -> list[Stage]:
    """The rows' frozen indexes, their fine-tuning and their evaluation (side by side), and
    the world's evaluations after the frozen indexes."""
    rows = self.rows()
    indexes, trainings, evaluations = self.finetuning_titles()
    return [
        Stage(indexes, tuple(self.index_job(row.run_dir, row.init, f"index_{row.log}.log")
                             for row in rows if row.indexed)),
        *self.evaluations("frozen indexes"),
        # Side by side for the toy model; one after the other for a larger BERT, whose
        # side-by-side runs outgrow memory (docs/own_corpus.md, "With a real English BERT").
        Stage(trainings, tuple(self.finetune_job(row.run_dir, row.init, row.log, row.bindings,
                                                 row.last) for row in rows),
              together=not self.larger_than_toy),
        Stage(evaluations, tuple(self.evaluate_job(row) for row in rows))]

  def check_stages(self) -> list[Stage]:
    """Stages that check the configuration before anything trains (none here)."""
    return []

  def warm_start_title(self) -> str:
    return f"1 warm start ({os.path.basename(self.warm_start_gin)})"

  def eval_name(self, row: str) -> str:
    """The evaluation name of a row ('realm': REALM's fine-tuning slot, 'orqa')."""
    return qa_eval_name(self.finetune_name) if row == "realm" else f"toy_qa_{row}"

  def slot_description(self) -> str:
    return {("pretrain", "pretrain"): "REALM",
            ("pretrain", "bert"): "REALM's retriever, the BERT reader",
            ("warm_start", "pretrain"): "the warm start's retriever, REALM's reader",
            ("warm_start", "bert"): "the warm start's retriever, the BERT reader",
            }[self.finetune_retriever, self.finetune_reader]

  def finetuning_titles(self) -> tuple[str, str, str]:
    slot = self.slot_description()
    which = f"{slot} and the ORQA-style baseline, side by side" if self.baseline else slot
    return (f"4 frozen indexes for fine-tuning ({which})", f"5 open-QA fine-tuning ({which})",
            f"6 evaluation on the toy QA {self.eval_split} split ({which})")

  def rows(self) -> list[Row]:
    """REALM's fine-tuning slot and, unless `baseline` is off, the ORQA-style baseline: the
    warm start's retriever and its index, the reader from the BERT (no REALM pretraining)."""
    retriever, reader = self.slot_start()
    rows = [Row(self.finetune, retriever, self.finetune_name, reader, self.eval_name("realm"),
                last=_parsed(self.slot_bindings))]
    if self.baseline:
      rows.append(Row(self.orqa, self.warm_start_checkpoint(), "finetune_orqa",
                      (("ENCODER_CHECKPOINT", self.bert_checkpoint()),), self.eval_name("orqa")))
    return rows

  def evaluations(self, after: str) -> list[Stage]:
    """The world's evaluations of retrieval `after` 'first index', 'pretraining' or 'frozen
    indexes': on the toy world the recall of the eval split before pretraining (the ICT
    index) and after it (its newest index; without the builder, the final checkpoint is
    indexed once first, as the builder's last refresh would have been)."""
    ict = self.warm_start_checkpoint()
    if after == "first index":
      return [Stage("  recall before pretraining",
                    (self.recall_job("before", 0, self.eval_split, self.pretrain, ict),))]
    if after != "pretraining":
      return []
    final = [] if self.with_builder else [Stage(
        "  index of the final pretraining checkpoint (no builder ran)",
        (self.index_job(self.pretrain, None, "index_final.log", of_latest_checkpoint=True),))]
    return final + [Stage("  recall after pretraining", (self.recall_job(
        "after", LatestIndex(self.pretrain), self.eval_split, self.pretrain, ict),))]

  # -- running

  def stage(self, name: str, done: bool, fn: Callable[[], Any]) -> None:
    """Runs `fn` as the stage `name` unless `done`, with its wall time in `times`."""
    if done:
      print(f"{PROG}: {name}: already done, skipped", flush=True)
      return
    print(f"{PROG}: {name} ...", flush=True)
    start = time.monotonic()
    fn()
    self.times[name] = time.monotonic() - start
    print(f"{PROG}: {name}: done in {self.times[name]:.0f}s", flush=True)

  def run_stage(self, stage: Stage) -> None:
    """One stage through the runner, skipped when it is done."""
    if self.runner is None:
      raise RuntimeError(f"{type(self).__name__} has no runner: make it with runner=..., or "
                         f"use realm_jax.recipe's, which runs on this machine")
    self.stage(stage.name, stage.done(), lambda: self.runner.run_stage(stage, self.logs))

  def run_stages(self, stage_list: Sequence[Stage]) -> None:
    for stage in stage_list:
      self.run_stage(stage)

  def trained(self, run_dir: str) -> bool:
    return TrainedRun(run_dir).exists()

  def prepare(self) -> None:
    """Checks and choices before anything trains (none on the toy world)."""

  def run_pretraining(self) -> tuple[str, ...]:
    """`prepare`, then every stage up to REALM pretraining and the evaluations after it, each
    skipped when done; returns the metrics files of those evaluations (the toy world: recall
    before and after pretraining). `run` goes on from here; a bench calls it alone to make a
    pretraining again."""
    self.prepare()
    pretraining = self.pretraining_stages()
    self.run_stages(pretraining)
    return tuple(job.output.path for stage in pretraining for job in stage.jobs
                 if job.module == "realm_jax.evaluate")

  def run(self) -> dict:
    """The whole recipe, each stage skipped when done; the figures of the result table."""
    recall = self.run_pretraining()
    self.announce_pretrained_checkpoint()
    self.run_stages(self.finetuning_stages())
    return self.summarize(recall)

  def announce_pretrained_checkpoint(self) -> None:
    """One line on the pretraining checkpoint fine-tuning starts from, when it is chosen."""
    if self.pretrained is BestCheckpoint:
      step, why = self.pretrain_choice()
      print(f"{PROG}: fine-tuning starts from pretraining checkpoint {step} ({why}), as REALM "
            f"picks it: by retrieval utility, not the last ({_latest_step(self.pretrain)})",
            flush=True)

  def pretrain_choice(self) -> tuple[int, str]:
    """The pretraining checkpoint fine-tuning starts from: (step, why)."""
    if self.pretrained is BestCheckpoint:
      return BestCheckpoint(self.pretrain).choice()
    return _latest_step(self.pretrain), "latest"

  def train_ict(self, run_dir: str, log: str, *bindings: str,
                init_checkpoint: Optional[str] = None) -> None:
    """The warm start (`warm_start_gin`: ICT by default) into `run_dir` now, its towers from
    the BERT when `ict_from_bert`, else from random weights; `bindings` are extra gin bindings.
    `init_checkpoint`, a checkpoint step directory with a retriever, is continued instead
    (ICT after RetroMAE: the RetroMAE run's checkpoint)."""
    if init_checkpoint is None and self.ict_from_bert:
      init_checkpoint = self._bert_checkpoint()
    job = self.warm_start_job(run_dir, log, bindings, init_checkpoint)
    self.runner.run_stage(Stage(log, (job,)), self.logs)

  def _bert_checkpoint(self) -> Optional[str]:
    """The recipe's BERT as step 0 of `<out>/bert` (converted once), or None (random)."""
    stage = self.bert_stage()
    if stage is not None:
      self.run_stage(stage)
    return self.bert_checkpoint()

  def qa_metrics_path(self, row: str = "realm") -> str:
    """The metrics JSON `run` writes for a fine-tuned row ('realm': REALM's fine-tuning slot,
    'orqa', and on your data 'bm25_reader'); its "checkpoint_choice" says which checkpoint was
    evaluated (the one best.json names)."""
    return _metrics(os.path.join(self.evals, f"{self.eval_name(row)}_{self.eval_split}.jsonl"))

  def summarize(self, recall: Sequence[str]) -> dict:
    """The result table's figures, after `run`."""
    before, after = recall
    return self.summary(before, after, self.qa_metrics_path(),
                        self.qa_metrics_path("orqa") if self.baseline else None)

  def summary(self, before: str, after: str, qa: str, orqa_qa: Optional[str] = None) -> dict:
    scalars = read_scalars(os.path.join(self.pretrain, "tensorboard"))

    def last(tag):
      return scalars[tag][max(scalars[tag])] if tag in scalars else float("nan")

    staleness = list(scalars.get("retrieval/staleness_steps", {}).values())
    qa_metrics = metrics_json(qa)  # evaluate's {"metrics": {...}, "task", "split", ...}
    return {
        "mlm_accuracy_null_only": last("eval/mlm/null_accuracy"),
        "mlm_accuracy_realm": last("eval/mlm/accuracy"),
        "retrieval_utility_first": (scalars["eval/retrieval/utility"][
            min(scalars["eval/retrieval/utility"])] if "eval/retrieval/utility" in scalars
                                    else float("nan")),
        "retrieval_utility_last": last("eval/retrieval/utility"),
        "qa_em_null_only": 0.0,
        "qa_em_realm": qa_metrics["metrics"]["exact_match"],
        # The fine-tuned reader's own retrieval at the top (EM follows it on the toy world).
        "qa_recall@1_realm": qa_metrics["metrics"].get("recall@1", float("nan")),
        "qa_em_orqa": (metrics_json(orqa_qa)["metrics"]["exact_match"] if orqa_qa
                       else float("nan")),
        "recall@5_before": metrics_json(before)["metrics"]["recall@5"],
        "recall@5_after": metrics_json(after)["metrics"]["recall@5"],
        "refreshes": last("retrieval/refreshes"),
        "mean_staleness_steps": sum(staleness) / len(staleness) if staleness else float("nan"),
        "stage_seconds": self.times,
    }

  def describe_plan(self) -> str:
    """The plan as text (`--dry_run`): every stage and command, deferred values as tokens."""
    return stages.describe(self.plan(), log_dir=self.logs)


def _metrics(predictions: str) -> str:
  """The metrics JSON `evaluate` writes beside its predictions."""
  return predictions.replace(".jsonl", ".metrics.json")


def _inputs(*values: Value) -> tuple[str, ...]:
  """What a job reads, as its plan shows it: paths, and deferred values as their tokens."""
  return tuple(stages.token(value) if isinstance(value, (LatestCheckpoint, BestCheckpoint))
               else str(value) for value in values if value is not None)


def _same_bert(flag: str, then, now) -> bool:
  """Whether a recorded `--bert` directory and this run's hold the same weights: a checkout
  moved or cloned elsewhere resumes its runs of the shipped BERTs."""
  if flag != "--bert" or not (isinstance(then, str) and isinstance(now, str)):
    return False
  files = [os.path.join(d, "model.safetensors") for d in (then, now)]
  return (all(os.path.isfile(f) for f in files)
          and fileio.sha256_file(files[0]) == fileio.sha256_file(files[1]))


class OwnDataRecipe(Recipe):
  """The recipe's stages on your corpus and questions (`python -m realm_jax.recipe --documents
  ... --questions ...`, docs/own_corpus.md).

  `prepare` checks the questions, chooses the block length and ICT's removal probability,
  builds the BlockStore and looks for the answers in it before anything trains. Then the toy
  recipe's stages on your data, with BM25 beside the dense retrievers, the pretrained
  checkpoint picked by best.json, and a third fine-tuning: the reader on BM25's blocks.
  """

  pretrained = BestCheckpoint

  def __init__(self, out: str, *, documents: str, questions: str,
               documents_format: str = "jsonl", toy_bert: Optional[str] = None,
               ict_from_bert: bool = False, max_block_len: Optional[int] = None,
               ict_remove_probability: Optional[float] = None,
               min_answerable: float = data_checks.DEFAULT_MIN_ANSWERABLE,
               warm_start_bindings: Sequence[str] = (), pretrain_bindings: Sequence[str] = (),
               finetune_bindings: Sequence[str] = (), finetune_name: str = DEFAULT_FINETUNE_NAME,
               finetune_retriever: str = "pretrain", finetune_reader: str = "pretrain",
               with_builder: bool = True, slot_bindings: Sequence[str] = (),
               runner: Optional[stages.Runner] = None, make_dirs: bool = True):
    """Args: out: the output directory (its BlockStore in `<out>/store`); documents: the
    corpus (`build_corpus --input`); questions: your QA files; documents_format:
    `build_corpus --source`; slot_bindings: more bindings of REALM's fine-tuning alone (a
    bench's seed), not recorded; max_block_len, ict_remove_probability: None to choose them
    from the data; min_answerable: the least share of a split's questions answerable in the
    corpus; the others as Recipe's."""
    out = os.path.abspath(out)
    super().__init__(out, os.path.join(out, "store"), toy_bert=toy_bert,
                     ict_from_bert=ict_from_bert, warm_start_bindings=warm_start_bindings,
                     pretrain_bindings=pretrain_bindings, finetune_bindings=finetune_bindings,
                     finetune_name=finetune_name, finetune_retriever=finetune_retriever,
                     finetune_reader=finetune_reader, with_builder=with_builder, runner=runner,
                     make_dirs=make_dirs)
    self.documents = documents
    self.documents_format = documents_format
    self.questions = questions
    self.max_block_len = max_block_len
    self.ict_remove_probability = ict_remove_probability
    self.ict_remove_why = "as given"
    self.min_answerable = min_answerable
    self.slot_bindings = list(slot_bindings)
    self.bm25_reader = os.path.join(self.out, "bm25_reader")
    # What the user asked for, by the flags that ask it, recorded: a resumed run must ask for
    # the same.
    self.arguments = {"--documents": documents, "--documents_format": documents_format,
                      "--questions": questions, "--bert": toy_bert,
                      "--ict_from": "bert" if ict_from_bert else "random",
                      "--max_block_len": max_block_len,
                      "--ict_remove_probability": ict_remove_probability,
                      "--ict_steps": list(warm_start_bindings),
                      "--pretrain_steps": list(pretrain_bindings),
                      "--finetune_steps": list(finetune_bindings)}
    self.settings: dict = {}  # what `prepare` chose, and why
    self.span_statistics: dict = {}  # `prepare`'s: how often a masked span is stated elsewhere

  def span_records(self) -> Optional[str]:
    """The pretraining text's salient spans computed once (None here: the pretraining task
    annotates your blocks as it reads them, with the dependency-free "union" annotator)."""
    return None

  def make_span_records(self) -> None:
    """Computes `span_records` once the BlockStore is built (nothing to do here)."""

  def data_bindings(self, child: str) -> stages.Bindings:
    """Each kind of child pointed at your corpus (the tasks `OWN_CORPUS` names, registered by
    the child over the BlockStore) and your questions (their path as the task). Settings
    `prepare` has yet to choose show as placeholders (a plan made before it: `--dry_run`)."""
    records = self.span_records()
    probability = _chosen(self.ict_remove_probability, "chosen from the BlockStore")
    reader_len = (_chosen(None, "chosen from the documents") if self.max_block_len is None
                  else self.max_block_len + READER_QUESTION_ROOM)
    return {
        "ict": (("TASK", f"ict_{OWN_CORPUS}"), ("BLOCK_STORE", self.store),
                ("IctJob.ict_remove_probability", probability)),
        "pretrain": (("TASK", f"realm_{OWN_CORPUS}_salient_span"), ("BLOCK_STORE", self.store),
                     *(() if records is None else (("PretrainJob.pretrain_records", records),))),
        "finetune": (("TASK", self.questions), ("BLOCK_STORE", self.store),
                     ("FinetuneJob.reader_len", reader_len)),
        "evaluate": (("TASK", self.questions), ("evaluate_main.block_store", self.store)),
    }[child]

  def data_stages(self) -> list[Stage]:
    """The BlockStore of your documents (`prepare` builds it, between its checks)."""
    block_len = ("<chosen from the documents>" if self.max_block_len is None
                 else str(self.max_block_len))
    return [Stage(f"0 the BlockStore of your documents ({self.store})", (Job(
        "realm_jax.build_corpus", "build_corpus.log",
        File(os.path.join(self.store, "manifest.json")),  # published last: the store is whole
        flags=("--source", self.documents_format, "--input", self.documents, "--out",
               self.store, "--max_block_len", block_len),
        inputs=(self.documents,)),))]

  def check_stages(self) -> list[Stage]:
    """Each training child's configuration checked by its own `--dry_run`, side by side: the
    tasks over your data, the BERT's shape against the model's, the settings. Nothing is read
    or written; a mistake stops the recipe here, before anything trains."""
    bert = self.bert_checkpoint()
    return [Stage("0 every training stage's configuration (their dry runs, side by side)", (
        self.warm_start_job(self.ict, "dry_run_ict.log", self.warm_start_bindings,
                            bert if self.ict_from_bert else None, dry_run=True),
        self.pretrain_job(dry_run=True),
        self.finetune_job(self.bm25_reader, None, "dry_run_finetune",
                          self._bm25_reader_bindings(), dry_run=True)),
                  done_when=Checkpoint(self.ict))]

  def _bm25_reader_bindings(self) -> stages.Bindings:
    """The BM25 reader's fine-tuning: the baseline's reader (the BERT) on BM25's blocks."""
    return (("ENCODER_CHECKPOINT", self.bert_checkpoint()), ("FinetuneJob.candidates", "bm25"))

  def warm_start_title(self) -> str:
    return "1 warm start (ICT on your corpus)"

  def _slot_suffix(self) -> str:
    """What REALM's fine-tuning slot adds to its evaluation files' names ("" for REALM's own)."""
    return "" if self.finetune_name == DEFAULT_FINETUNE_NAME else f"_{self.finetune_name}"

  def eval_name(self, row: str) -> str:
    return f"realm{self._slot_suffix()}" if row == "realm" else row

  def finetuning_titles(self) -> tuple[str, str, str]:
    which = "REALM, the ORQA-style baseline and the BM25 reader"
    return ("4 frozen indexes for fine-tuning (REALM's from its retriever's checkpoint, the "
            "ORQA-style baseline's from the warm start)", f"5 open-QA fine-tuning ({which})",
            f"6 evaluation on your test questions ({which})")

  def rows(self) -> list[Row]:
    """REALM's slot, the ORQA-style baseline and the reader fine-tuned on BM25's top blocks
    (FinetuneJob.candidates='bm25', DrQA's pipeline: no index of its own)."""
    return super().rows() + [Row(self.bm25_reader, self.warm_start_checkpoint(),
                                 "finetune_bm25", self._bm25_reader_bindings(), "bm25_reader",
                                 (("evaluate_main.candidates", "bm25"),), indexed=False)]

  def evaluations(self, after: str) -> list[Stage]:
    """BM25's recall of the test questions (no model) and the warm start's of dev and test
    after the first index; after the frozen indexes, the recall of dev and test with REALM's
    slot's index (of the checkpoint it starts from: recall after pretraining)."""
    if after == "first index":
      ict = self.warm_start_checkpoint()
      return [Stage("  recall of BM25 (test) and of the warm start (dev, test)", (
          self._bm25_recall_job(),
          *(self.recall_job(f"before_{split}", 0, split, self.pretrain, ict)
            for split in ("dev", "test"))))]
    if after == "frozen indexes":
      retriever, _ = self.slot_start()
      return [Stage("  recall after pretraining (that checkpoint's index; dev, test)", tuple(
          self.recall_job(f"after{self._slot_suffix()}_{split}", 0, split, self.finetune,
                          retriever) for split in ("dev", "test")))]
    return []

  def _bm25_recall_job(self) -> Job:
    """BM25's recall of the test questions (no model)."""
    output = os.path.join(self.evals, "recall_bm25_test.jsonl")
    return Job("realm_jax.evaluate", "recall_bm25_test.log", File(_metrics(output)),
               gin_files=self.eval_gins,
               bindings=(("RUN_DIR", None), ("evaluate_main.mode", "bm25"),
                         ("evaluate_main.split", "test"), ("evaluate_main.output", output),
                         *self.gin_bindings("evaluate")),
               inputs=(self.store,), role=HOST)

  def summarize(self, recall: Sequence[str]) -> dict:
    bm25, before_dev, before_test = recall
    slot = self._slot_suffix()
    after = {split: _metrics(os.path.join(self.evals, f"recall_after{slot}_{split}.jsonl"))
             for split in ("dev", "test")}
    return self.own_summary({"bm25": bm25, "warm_start": before_test,
                             "pretrained": after["test"]},
                            {"warm_start": before_dev, "pretrained": after["dev"]},
                            {row: self.qa_metrics_path(row)
                             for row in ("realm", "orqa", "bm25_reader")})

  def _settings_path(self) -> str:
    return os.path.join(self.out, "own_data.json")

  def _check_same_arguments(self) -> None:
    """InputError when `<out>` holds a run of other data or settings (`own_data.json`)."""
    if not os.path.exists(self._settings_path()):
      return
    with open(self._settings_path(), encoding="utf-8") as f:
      recorded = json.load(f)["arguments"]
    differ = [f"{key} {recorded.get(key)!r} then, {value!r} now"
              for key, value in self.arguments.items()
              if recorded.get(key) != value and not _same_bert(key, recorded.get(key), value)]
    if differ:
      raise InputError(f"--out {self.out} holds a run of other data or settings ("
                       f"{'; '.join(differ)}): pass --fresh to start over, or another --out")

  def prepare(self) -> None:
    """Everything your data decides, checked before anything trains: the questions, the block
    length, the BlockStore, ICT's removal probability and the answers in the corpus; each
    choice printed with its reason (and kept in `settings`, for the summary), the arguments
    recorded in `<out>/own_data.json` once the BlockStore is built."""
    from realm_jax import fileio  # pylint: disable=g-import-not-at-top
    from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
    from realm_jax.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
    self._check_same_arguments()
    splits = data_checks.check_questions(self.questions)
    print(f"{PROG}: your questions: " + ", ".join(
        f"{split} {len(examples):,} ({file})" for split, (file, examples) in splits.items()),
          flush=True)
    why = "as given"
    if self.max_block_len is None:
      try:
        source = sources_lib.make_source(self.documents_format, self.documents)
      except (ValueError, OSError) as e:  # CorpusInputError is a ValueError
        raise InputError(f"--documents: {gin_utils.one_line(e)}") from e
      self.max_block_len, why = data_checks.choose_block_len(data_checks.document_lengths(source))
    self.settings["max_block_len"] = {"value": self.max_block_len, "why": why}
    print(f"{PROG}: max_block_len {self.max_block_len} ({why})", flush=True)
    self.run_stages(self.data_stages())
    store = block_store_lib.BlockStore.open(self.store, verify="fast")
    fileio.write_json_atomically(self._settings_path(), {"arguments": self.arguments})
    print(f"{PROG}: {store.num_blocks:,} blocks of at most {store.max_block_len} wordpieces",
          flush=True)
    why = self.ict_remove_why
    if self.ict_remove_probability is None:
      self.ict_remove_probability, why = data_checks.choose_ict_remove_probability(
          data_checks.sentence_counts(store))
    self.settings["ict_remove_probability"] = {"value": self.ict_remove_probability, "why": why}
    print(f"{PROG}: ICT removal probability {self.ict_remove_probability:g} ({why})", flush=True)
    lines = data_checks.check_answers(splits, (store.body(i) for i in range(store.num_blocks)),
                                      self.min_answerable)
    print("\n".join(lines) or f"{PROG}: every question has an answer somewhere in the corpus",
          flush=True)
    from realm_jax.data import world_statistics  # pylint: disable=g-import-not-at-top
    self.make_span_records()
    redundancy = self._span_redundancy(store)
    self.span_statistics = {"span_share": redundancy.span_share,
                            "sentence_share": redundancy.sentence_share,
                            "spans": redundancy.spans,
                            "line": world_statistics.warning_line(redundancy)}
    print(f"{PROG}: {self.span_statistics['line']}", flush=True)
    store.close()

  def _span_redundancy(self, store):
    """How often a masked salient span of the pretraining text is stated in another article's
    block (`world_statistics.span_redundancy`, a SpanRedundancy): what bounds what REALM's
    retrieval can add."""
    from realm_jax.data import salient_spans  # pylint: disable=g-import-not-at-top
    from realm_jax.data import world_statistics  # pylint: disable=g-import-not-at-top
    records = self.span_records()
    return world_statistics.span_redundancy(
        store, salient_spans.read_precomputed(records) if records is not None
        else salient_spans.annotate_blocks(store, "union"))

  def own_summary(self, recall: dict[str, str], dev_recall: dict[str, str],
                  qa: dict[str, str]) -> dict:
    """The figures of the table: recall (metrics files by row: 'bm25', 'warm_start',
    'pretrained'), dev recall ('warm_start', 'pretrained'), the fine-tuned rows' evaluations
    ('realm', 'orqa', 'bm25_reader'), pretraining's own figures at the chosen checkpoint."""
    scalars = read_scalars(os.path.join(self.pretrain, "tensorboard"))
    step, why = self.pretrain_choice()

    def at(tag: str, which: str) -> float:
      values = scalars.get(tag, {})
      if not values:
        return float("nan")
      return values.get({"first": min(values), "last": max(values)}.get(which, step),
                        float("nan"))

    staleness = list(scalars.get("retrieval/staleness_steps", {}).values())
    from realm_jax_tasks import open_qa  # pylint: disable=g-import-not-at-top

    def metrics(path: str) -> dict:
      return metrics_json(path)["metrics"]

    dev = {row: metrics(path) for row, path in dev_recall.items()}
    return {
        "documents": self.documents, "questions": self.questions, "settings": self.settings,
        "span_redundancy": self.span_statistics,
        "bert": bert_lib.describe_bert(self.toy_bert, self.ict_from_bert),
        "verdict": data_checks.pretraining_verdict(dev["warm_start"], dev["pretrained"], step),
        "answer_metric": "regex_match" if open_qa.qa_path(self.questions)[0] else "exact_match",
        "recall": {row: metrics(path) for row, path in recall.items()},
        "dev_recall": dev,
        "qa": {row: metrics(path) for row, path in qa.items()},
        "pretrain_checkpoint": {"step": step, "choice": why,
                                "last": _latest_step(self.pretrain)},
        "mlm_accuracy_null_only": at("eval/mlm/null_accuracy", "chosen"),
        "mlm_accuracy_realm": at("eval/mlm/accuracy", "chosen"),
        "retrieval_utility": {which: at("eval/retrieval/utility", which)
                              for which in ("first", "chosen", "last")},
        "refreshes": at("retrieval/refreshes", "last"),
        "mean_staleness_steps": sum(staleness) / len(staleness) if staleness else float("nan"),
        "stage_seconds": self.times,
    }


def _chosen(value: Optional[Any], how: str) -> Any:
  """A setting, or while `prepare` has yet to choose it a placeholder naming how it will be."""
  return gin_utils.GinText(f"<{how}>") if value is None else value


class WikiRecipe(OwnDataRecipe):
  """The own-data recipe's stages on the wiki world (`python -m realm_jax.recipe --world wiki`,
  realm_jax.data.wiki): the Vital Articles' leads as the corpus Z and as the pretraining text X
  (the paper's Wikipedia setting), their questions, and by default the English BERT. Its salient
  spans are spaCy's entities and the date patterns (the `entities` extra), computed once over
  the BlockStore, each record naming its block, which REALM excludes from the candidates."""

  def __init__(self, out: str, *, world: str, pretrain_steps: int = DEFAULT_PRETRAIN_STEPS,
               **kwargs):
    """Args: out: the output directory; world: the wiki world's directory
    (`wiki.world_dir`); pretrain_steps: REALM pretraining's steps (the retriever is held for
    the first `WIKI_RETRIEVER_FROZEN_SHARE` of them); kwargs: as OwnDataRecipe's, but the
    documents and questions; ict_remove_probability None is `WIKI_ICT_REMOVE_PROBABILITY`."""
    chosen = kwargs.get("ict_remove_probability") is None
    if chosen:
      kwargs["ict_remove_probability"] = WIKI_ICT_REMOVE_PROBABILITY
    super().__init__(out, documents=os.path.join(world, "docs.jsonl"),
                     questions=os.path.join(world, "qa"), **kwargs)
    if chosen:
      self.ict_remove_why = ("the wiki world's, chosen on its dev recall@5 "
                             "(docs/wiki_world.md); --ict_remove_probability sets it")
    self.frozen_retriever_steps = int(pretrain_steps * WIKI_RETRIEVER_FROZEN_SHARE)
    self.settings["freeze_retriever_steps"] = {
        "value": self.frozen_retriever_steps,
        "why": f"the wiki world's: the first {WIKI_RETRIEVER_FROZEN_SHARE:g} of pretraining's "
               f"{pretrain_steps} steps"}

  def data_bindings(self, child: str) -> stages.Bindings:
    """OwnDataRecipe's, and REALM pretraining's retriever held for its first steps."""
    held = ((("PretrainJob.freeze_retriever_steps", self.frozen_retriever_steps),)
            if child == "pretrain" else ())
    return super().data_bindings(child) + held

  def span_records(self) -> Optional[str]:
    """`<out>/store-spans.jsonl` (`wiki.span_records`), made by `prepare`."""
    return f"{self.store}-spans.jsonl"

  def make_span_records(self) -> None:
    """The BlockStore's salient spans, computed once (spaCy reads every block: about 100
    blocks a second on 2 cores), with a progress line every 10 s."""
    from realm_jax import progress  # pylint: disable=g-import-not-at-top
    from realm_jax.data import wiki  # pylint: disable=g-import-not-at-top
    throttle = progress.Throttle(interval_s=10.0, stream=sys.stdout)

    def annotate():
      wiki.span_records(self.store, progress=throttle)
      throttle.finish()

    self.stage("0 salient spans of the BlockStore (spaCy's entities and the date patterns)",
               os.path.exists(self.span_records()), annotate)


class PaperRecipe(Recipe):
  """REALM at paper scale (docs/paper_scale.md, section 2): BERT-base converted, ICT, the first
  index, pretraining with the index builder, the fine-tuning indexes, REALM's and the baseline's
  fine-tuning (nq, wq or ct) and their test evaluation. Its paths are on a file system every
  host sees; nothing here reads them (the plan is made elsewhere for a pod). BATCH_SIZE is per
  host: the gins' global batch over `hosts`."""

  pretrained = BestCheckpoint
  pretrain_gin = "gin_configs/experiments/wiki_pretrain.gin"
  eval_gins = ("gin_configs/models/base.gin", "gin_configs/runs/eval.gin")
  builder_bindings = ()

  def __init__(self, out: str, *, block_store: str, bert: str, task: str = "nq",
               hosts: int = 1, runner: Optional[stages.Runner] = None, make_dirs: bool = True):
    """Args: out: the runs' directory (<out>/bert, ict, pretrain, finetune, orqa, eval,
    logs); block_store: the Wikipedia BlockStore (python -m realm_jax.build_corpus); bert: a
    transformers BertForMaskedLM directory (bert-base-uncased); task: 'nq', 'wq' or 'ct';
    hosts: the hosts that train (the trainer slice's workers; 1 on one machine)."""
    if task not in PAPER_TASKS:
      raise ValueError(f"task={task!r}: expected one of {', '.join(PAPER_TASKS)}")
    bad = [child for child, batch in PAPER_GLOBAL_BATCH.items() if hosts < 1 or batch % hosts]
    if bad:
      raise ValueError(f"{hosts} hosts: the global batch of {', '.join(bad)} "
                       f"({', '.join(str(PAPER_GLOBAL_BATCH[c]) for c in bad)}) does not divide "
                       f"into them")
    self.finetune_gin, self.task = PAPER_TASKS[task]
    self.hosts = hosts
    super().__init__(out, block_store, toy_bert=bert, ict_from_bert=True,
                     warm_start_gin="gin_configs/experiments/wiki_ict.gin", runner=runner,
                     make_dirs=make_dirs)

  @staticmethod
  def _bert_shape(toy_bert: Optional[str]) -> tuple[stages.Bindings, bool]:
    """models/base.gin sizes the towers (nothing reads the BERT's files here); BERT-base is
    larger than the toy model."""
    del toy_bert
    return (), True

  def data_bindings(self, child: str) -> stages.Bindings:
    """The BlockStore and each training's per-host batch; the task of the evaluation."""
    if child == "evaluate":
      return (("TASK", self.task), ("evaluate_main.block_store", self.store))
    return (("BLOCK_STORE", self.store),
            ("BATCH_SIZE", PAPER_GLOBAL_BATCH[child] // self.hosts))

  def eval_name(self, row: str) -> str:
    return self.task if row == "realm" else f"{self.task}_{row}"

  def finetuning_titles(self) -> tuple[str, str, str]:
    which = "REALM and the ORQA-style baseline"
    return ("4 frozen indexes for fine-tuning (REALM's from best.json's pretraining checkpoint, "
            "the ORQA-style baseline's from ICT's)", f"5 open-QA fine-tuning on {self.task} "
            f"({which}, one after the other)",
            f"6 evaluation on {self.task}'s {self.eval_split} split ({which})")

  def evaluations(self, after: str) -> list[Stage]:
    """None between the stages (the evaluations of the fine-tuned systems close the plan)."""
    del after
    return []

  def summarize(self, recall: Sequence[str]) -> dict:
    del recall
    return {row: metrics_json(self.qa_metrics_path(row))["metrics"]
            for row in ("realm", "orqa")}
