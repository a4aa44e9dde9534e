r"""The whole REALM recipe on the embedded toy world, on a CPU: the project's main job.

  python -m realm_jax.recipe [--out /tmp/realm_toy] [--fresh] [--toy_bert shipped|none|DIR]
      [--ict_from random|bert]

Stages, each one of the project's own entry points run as a child process (so the index
builder really is a second process next to the trainer, as on a pod):

  0. a BERT                     python -m realm_jax.convert.hf of the shipped toy BERT
                                (realm_jax.toy_bert, docs/toy_bert.md; `--toy_bert DIR` for
                                another BertForMaskedLM directory of the toy model's shape,
                                `--toy_bert none` for random weights): what the paper's BERT is
                                to REALM
  1. ICT warm start             python -m realm_jax.train   experiments/toy_ict.gin (towers
                                from random weights; `--ict_from bert` from the BERT, as
                                REALM's: a toy-world deviation, docs/architecture.md)
  2. first index                python -m realm_jax.build_index --once (from the ICT checkpoint)
  3. REALM pretraining          python -m realm_jax.train   experiments/toy_pretrain.gin
                                (the retriever from ICT, the encoder from the BERT)
     + the index builder        python -m realm_jax.build_index (follows the checkpoints), both
                                started by `realm_jax_launch.local.run_local`
  4. frozen fine-tuning indexes python -m realm_jax.build_index --once (REALM's from the final
                                pretraining checkpoint, the baseline's from the ICT checkpoint)
  5. open-QA fine-tuning        python -m realm_jax.train   experiments/toy_finetune.gin, the
                                two runs side by side (two processes: on 2 cores the pair
                                takes 0.78x the time of one after the other)
     REALM                      from the pretrained checkpoint (reader from its encoder)
     ORQA-style baseline        no REALM pretraining: the ICT retriever and its index, the
                                reader from the BERT (the paper's comparison with ORQA)
  6. evaluation                 python -m realm_jax.evaluate (retrieval recall before and after
                                pretraining; EM on the toy QA test split of both, side by side)

and ends with a table (also written to `<out>/summary.md` and `summary.json`):

  * masked salient-span accuracy of the pretrained model, with REALM's retrieval and with the
    null document only (what the encoder knows without evidence: retrieval's contribution);
  * toy QA test EM with REALM and with the ORQA-style baseline; without retrieval (the null
    document only) an extractive reader has no text to take an answer from, so that EM is 0 by
    construction;
  * retrieval recall@5 of the toy QA test questions (an answer in the top 5 blocks) with the
    ICT index (before pretraining) and the final pretraining index (after);
  * index refreshes picked up during pretraining and their mean staleness (steps);
  * wall time per stage and in all.

A stage whose result exists is not run again (delete `<out>` or pass `--fresh` to start over);
a killed recipe resumes where it stopped (the trainer resumes from its last checkpoint).
SIGINT (Ctrl-C) or SIGTERM stops the running stages as the launcher stops its children (SIGINT,
SIGKILL after 30 s) and exits 130 or 143; killed outright (SIGKILL), its stages die with it on
Linux (`realm_jax_launch.local.tied_to_parent`).
Every child's full log is in `<out>/logs/`; the console shows progress lines only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Optional, Sequence

from realm_jax import gin_utils

PROG = "recipe"
DEFAULT_OUT = "/tmp/realm_toy"
# What the console shows of a child's output (the rest is in <out>/logs/).
_PROGRESS = re.compile(r"step \d+/\d+|published index|: done|error|Error|dry run|evaluate: "
                       r"(toy_qa|ict_toy)|embedding: [\d,]+/[\d,]+ blocks \(100")


class _Progress:
  """A file-like console for `run_local` that passes progress lines only."""

  def __init__(self, stream):
    self._stream = stream
    self._partial = ""

  def write(self, text: str) -> int:
    self._partial += text
    *lines, self._partial = self._partial.split("\n")
    for line in lines:
      if _PROGRESS.search(line):
        self._stream.write(_short(line) + "\n")
    return len(text)

  def flush(self) -> None:
    self._stream.flush()


def _short(line: str) -> str:
  """A log line without its timestamp/level/logger prefix."""
  match = re.match(r"^(\[\w+\] )?\S+ \S+ (INFO|WARNING|ERROR) \S+: (.*)$", line)
  return f"{match.group(1) or ''}{match.group(3)}" if match else line


def python_module(module: str, *args: str) -> list[str]:
  return [sys.executable, "-m", module, *args]


def compilation_cache_dir() -> str:
  """Where the children keep JAX's persistent compilation cache: jax_compilation_cache in the
  toy world's cache root (`toy_world.default_cache_root`)."""
  from realm_jax.data import toy_world  # pylint: disable=g-import-not-at-top
  return str(toy_world.default_cache_root() / "jax_compilation_cache")


def child_env() -> dict[str, str]:
  """The children's settings on top of this environment, each unless set already: the
  launcher's allocator settings (`realm_jax_launch.local.ALLOCATOR_ENV`, 0.74x the toy step's
  time) and JAX's persistent compilation cache (`compilation_cache_dir`): every stage, and
  every cell of a bench, compiles the same steps again, about 8 s each on 2 cores and 1.2 s
  read from the cache."""
  import realm_jax_launch.local as launcher  # pylint: disable=g-import-not-at-top
  settings = {**launcher.ALLOCATOR_ENV, "JAX_COMPILATION_CACHE_DIR": compilation_cache_dir()}
  return {key: value for key, value in settings.items() if key not in os.environ}


def run_child(cmd: Sequence[str], log_path: str) -> None:
  """Runs one child to completion: full output to `log_path`, progress lines to the console."""
  run_children([(cmd, log_path)])


def run_children(children: Sequence[tuple[Sequence[str], str]]) -> None:
  """Runs independent children side by side, each to completion: each one's full output to its
  log, progress lines to the console (prefixed with the log's name when there are several).

  On this 2-core machine two jobs side by side finish sooner than one after the other: neither
  keeps both cores busy alone (the host builds batches and retrieves between steps). Raises
  RuntimeError naming every child that failed, after all have ended. Interrupted (SIGINT or
  SIGTERM to this process: `gin_utils.Interrupted`), it stops the children as the launcher
  does (`realm_jax_launch.local.stop_processes`: SIGINT, SIGKILL after a grace period) before
  the interruption goes on; each child also dies with this process should it be killed outright
  (`realm_jax_launch.local.tied_to_parent`).
  """
  import realm_jax_launch.local as launcher  # pylint: disable=g-import-not-at-top
  lock = threading.Lock()
  console = _Progress(sys.stdout)

  def copy(child: subprocess.Popen, log_path: str, prefix: str) -> None:
    with open(log_path, "a", encoding="utf-8") as log:
      for line in child.stdout:
        log.write(line)
        with lock:
          console.write(prefix + line)

  running = []
  try:
    for cmd, log_path in children:
      child = subprocess.Popen(launcher.tied_to_parent(cmd), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **child_env()})
      prefix = (f"[{os.path.splitext(os.path.basename(log_path))[0]}] "
                if len(children) > 1 else "")
      thread = threading.Thread(target=copy, args=(child, log_path, prefix), daemon=True)
      thread.start()
      running.append((cmd, log_path, child, thread))
    failed = []
    for cmd, log_path, child, thread in running:
      code = child.wait()
      thread.join()
      if code:
        failed.append(f"{' '.join(cmd[2:4])} ... exited with status {code}; see {log_path}")
  finally:
    # Interrupted, or one could not start: stop the others too, and wait for them (bounded).
    stopped = launcher.stop_processes([child for _, _, child, _ in running])
    for pid, how in stopped:
      print(f"{PROG}: stopped child {pid}: {how}", file=sys.stderr, flush=True)
  if failed:
    raise RuntimeError("; ".join(failed))


def _latest_step(run_dir: str) -> Optional[int]:
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.latest_checkpoint_step(run_dir)


def read_scalars(logdir: str) -> dict[str, dict[int, float]]:
  """{tag: {step: value}} of the TensorBoard event files under `logdir` (clu writes scalars as
  tensor summaries)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  accumulator = event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
  accumulator.Reload()
  return {tag: {event.step: float(tensor_util.make_ndarray(event.tensor_proto))
                for event in accumulator.Tensors(tag)}
          for tag in accumulator.Tags()["tensors"]}


def _metrics_json(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def _gin(*args: str) -> list[str]:
  return [f"--gin.{a}" for a in args]


def _quoted(path: Optional[str]) -> str:
  """A gin value: a quoted path, or None."""
  return "None" if path is None else f"'{path}'"


def latest_checkpoint_dir(run_dir: str) -> str:
  """`<run_dir>/checkpoints/<newest step>`: the step directory a warm start or an index reads."""
  return os.path.join(run_dir, "checkpoints", str(_latest_step(run_dir)))


def toy_bert_dir(choice: str) -> Optional[str]:
  """`--toy_bert`: 'shipped' (realm_jax/data/assets/toy_bert), 'none' (None: random weights)
  or a BertForMaskedLM directory; ValueError when it has no weights."""
  from realm_jax import toy_bert  # pylint: disable=g-import-not-at-top
  directory = {"shipped": toy_bert.SHIPPED_DIR, "none": None}.get(choice, choice)
  if directory is not None and not os.path.isfile(os.path.join(directory, "model.safetensors")):
    raise ValueError(f"--toy_bert {choice}: no model.safetensors in {directory}")
  sha256 = toy_bert.weights_sha256(directory) if choice == "shipped" else None
  if sha256 is not None and sha256 != toy_bert.SHIPPED_SHA256:
    raise ValueError(f"--toy_bert shipped: {directory}/model.safetensors has sha256 {sha256}, "
                     f"not the shipped {toy_bert.SHIPPED_SHA256} (docs/toy_bert.md); a "
                     f"partial checkout? `python -m realm_jax.toy_bert` rebuilds it")
  return directory


class Recipe:
  """The stages (see the module docstring) over one output directory."""

  def __init__(self, out: str, store: str, *, ict_dir: Optional[str] = None,
               toy_bert: Optional[str] = None, ict_from_bert: bool = False,
               pretrain_bindings: Sequence[str] = (),
               finetune_bindings: Sequence[str] = (), with_builder: bool = True,
               eval_split: str = "test", baseline: bool = True,
               warm_start_gin: str = "gin_configs/experiments/toy_ict.gin",
               warm_start_bindings: Sequence[str] = (), finetune_name: str = "finetune",
               finetune_retriever: str = "pretrain", finetune_reader: str = "pretrain"):
    """Args: out: the output directory; store: the toy BlockStore; ict_dir: an existing ICT
    run to start from (None: train one in `<out>/ict`); toy_bert: the BertForMaskedLM directory
    ICT's towers, the pretraining encoder and the baseline's reader start from (None: random
    weights); pretrain_bindings, finetune_bindings: extra `KEY=VALUE` gin bindings of those
    stages (the ablations); with_builder: refresh the index during pretraining (False: the
    index stays the ICT one); eval_split: the toy QA split of the recall and EM evaluations;
    baseline: also fine-tune and evaluate the ORQA-style baseline; warm_start_gin: the
    retriever's warm start (ICT, or another job whose checkpoint has a retriever, e.g.
    experiments/toy_retromae.gin) and its extra bindings; finetune_name: REALM's fine-tuning
    run directory and evaluation name under `out` (several fine-tunings of one pretraining
    side by side); finetune_retriever, finetune_reader: what that fine-tuning starts from, each
    'pretrain' (the final pretraining checkpoint: REALM, the default) or, for the retriever,
    'warm_start' (the warm start's checkpoint, its index built from it) and, for the reader,
    'bert' (the BERT, `ENCODER_CHECKPOINT`): 'warm_start' and 'bert' is the ORQA-style
    baseline's fine-tuning, the other two mixes are the paper's Table 2 rows "REALM retriever
    + baseline encoder" ('pretrain', 'bert') and "baseline retriever + REALM encoder"
    ('warm_start', 'pretrain')."""
    if finetune_retriever not in ("pretrain", "warm_start"):
      raise ValueError(f"finetune_retriever={finetune_retriever!r}: expected 'pretrain' or "
                       f"'warm_start'")
    if finetune_reader not in ("pretrain", "bert"):
      raise ValueError(f"finetune_reader={finetune_reader!r}: expected 'pretrain' or 'bert'")
    self.out = os.path.abspath(out)
    self.store = store
    self.toy_bert = toy_bert
    self.ict_from_bert = ict_from_bert
    self.baseline = baseline
    self.bert = os.path.join(self.out, "toy_bert")
    self.orqa = os.path.join(self.out, "orqa")
    self.pretrain_bindings = list(pretrain_bindings)
    self.finetune_bindings = list(finetune_bindings)
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
    os.makedirs(self.logs, exist_ok=True)
    os.makedirs(self.evals, exist_ok=True)

  def stage(self, name: str, done: bool, fn) -> None:
    if done:
      print(f"{PROG}: {name}: already done, skipped", flush=True)
      return
    print(f"{PROG}: {name} ...", flush=True)
    start = time.monotonic()
    fn()
    self.times[name] = time.monotonic() - start
    print(f"{PROG}: {name}: done in {self.times[name]:.0f}s", flush=True)

  def trained(self, run_dir: str) -> bool:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.training_done(run_dir)

  def _index_child(self, run_dir: str, checkpoint_dir: Optional[str],
                   log: str) -> tuple[list[str], str]:
    """`build_index --once` of `checkpoint_dir` into `run_dir` (published as index step 0), or
    with None of `run_dir`'s newest checkpoint (published under its step): (command, log
    path)."""
    where = ([] if checkpoint_dir is None
             else [f"build_index_main.checkpoint_dir='{checkpoint_dir}'"])
    return (python_module("realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin",
                          "--once", *_gin(f"RUN_DIR='{run_dir}'", f"BLOCK_STORE='{self.store}'",
                                          *where)),
            os.path.join(self.logs, log))

  def _recall(self, name: str, index_step: int) -> str:
    """Retrieval recall of the toy QA test questions against one pretraining index."""
    output = os.path.join(self.evals, f"recall_{name}.jsonl")
    run_child(python_module("realm_jax.evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
                 *_gin(f"RUN_DIR='{self.pretrain}'", "evaluate_main.mode='retrieval'",
                       f"evaluate_main.index_step={index_step}",
                       f"evaluate_main.first_index_checkpoint_dir='{self._ict_checkpoint()}'",
                       f"evaluate_main.split='{self.eval_split}'",
                       f"evaluate_main.output='{output}'")),
         os.path.join(self.logs, f"recall_{name}.log"))
    return output

  def _ict_checkpoint(self) -> str:
    return latest_checkpoint_dir(self.ict)

  def _pretrain_checkpoint(self) -> str:
    return latest_checkpoint_dir(self.pretrain)

  def _finetune_starts(self) -> tuple[str, tuple[str, ...]]:
    """REALM's fine-tuning slot: (its retriever's checkpoint, which is also its index's and its
    INIT_CHECKPOINT; its reader binding): `finetune_retriever` and `finetune_reader`. With both
    'pretrain' there is no binding: the reader takes INIT_CHECKPOINT's encoder (REALM)."""
    retriever = (self._pretrain_checkpoint() if self.finetune_retriever == "pretrain"
                 else self._ict_checkpoint())
    if self.finetune_reader == "bert":
      reader = self._bert_checkpoint()
    elif self.finetune_retriever == "warm_start":
      reader = self._pretrain_checkpoint()  # the warm start has no encoder: take REALM's
    else:
      return retriever, ()
    return retriever, (f"ENCODER_CHECKPOINT={_quoted(reader)}",)

  def run(self) -> dict:
    from realm_jax.index import store as store_lib  # pylint: disable=g-import-not-at-top
    import realm_jax_launch.local as launcher  # pylint: disable=g-import-not-at-top

    bert = self._bert_checkpoint()
    self.stage(f"1 warm start ({os.path.basename(self.warm_start_gin)})", self.trained(self.ict),
               lambda: self.train_ict(self.ict, "ict.log", *self.warm_start_bindings))
    self.stage("2 first index (from the warm start's checkpoint)",
                store_lib.latest_index_step(self.pretrain) is not None,
                lambda: run_child(*self._index_child(self.pretrain, self._ict_checkpoint(),
                                                     "index_0.log")))
    before = os.path.join(self.evals, "recall_before.metrics.json")
    self.stage("  recall before pretraining", os.path.exists(before),
                lambda: self._recall("before", 0))

    def pretrain():
      trainer = python_module("realm_jax.train", "--gin_file=gin_configs/experiments/toy_pretrain.gin",
                        *_gin(f"RUN_DIR='{self.pretrain}'",
                              f"INIT_CHECKPOINT='{self._ict_checkpoint()}'",
                              f"ENCODER_CHECKPOINT={_quoted(bert)}",
                              # Without a builder no refresh is ever published to wait for.
                              *([] if self.with_builder
                                else ["PretrainJob.refresh_in_lockstep=False"]),
                              *self.pretrain_bindings))
      builder = None
      if self.with_builder:
        # Polling often: in lockstep the trainer waits for each index the builder makes.
        builder = python_module("realm_jax.build_index", "--gin_file=gin_configs/runs/build_index.gin",
                          *_gin(f"RUN_DIR='{self.pretrain}'", f"BLOCK_STORE='{self.store}'",
                                "build_index_main.poll_seconds=0.5"))
      code = launcher.run_local(trainer, builder, log_dir=self.logs,
                                console=_Progress(sys.stdout), env_trainer=child_env(),
                                env_builder=child_env(), run_dir=self.pretrain)
      if code - 128 in gin_utils.STOP_SIGNALS + (signal.SIGHUP,):
        # The launcher caught the signal meant for this process and stopped both children.
        raise gin_utils.Interrupted(code - 128)
      if code:
        raise RuntimeError(f"pretraining exited with status {code}; see {self.logs}")

    self.stage("3 REALM pretraining" + (" + index builder (two processes)"
                                          if self.with_builder else " (index never refreshed)"),
                self.trained(self.pretrain), pretrain)
    if not self.with_builder:
      # Without the builder the pretraining run's newest index is the warm start's (step 0):
      # "recall after pretraining" must read the pretrained retriever, so its final checkpoint
      # is indexed once (as the builder's last refresh would have been).
      self.stage("  index of the final pretraining checkpoint (no builder ran)",
                 store_lib.latest_index_step(self.pretrain) == _latest_step(self.pretrain),
                 lambda: run_child(*self._index_child(self.pretrain, None, "index_final.log")))
    after = os.path.join(self.evals, "recall_after.metrics.json")
    self.stage("  recall after pretraining", os.path.exists(after),
                lambda: self._recall("after", store_lib.latest_index_step(self.pretrain)))
    # REALM's fine-tuning from the pretrained model (or the mix `finetune_retriever` and
    # `finetune_reader` ask for) and, side by side, the baseline's from the ICT retriever and
    # the BERT reader: (run directory, its index's checkpoint, log name, extra bindings,
    # evaluation name).
    retriever, reader_bindings = self._finetune_starts()
    runs = [(self.finetune, retriever, self.finetune_name, reader_bindings, self._qa_name())]
    if self.baseline:
      runs.append((self.orqa, self._ict_checkpoint(), "finetune_orqa",
                   (f"ENCODER_CHECKPOINT={_quoted(self._bert_checkpoint())}",), "toy_qa_orqa"))
    slot = {("pretrain", "pretrain"): "REALM",
            ("pretrain", "bert"): "REALM's retriever, the BERT reader",
            ("warm_start", "pretrain"): "the warm start's retriever, REALM's reader",
            ("warm_start", "bert"): "the warm start's retriever, the BERT reader",
            }[self.finetune_retriever, self.finetune_reader]
    which = (f"{slot} and the ORQA-style baseline, side by side" if self.baseline else slot)
    self.stage(f"4 frozen indexes for fine-tuning ({which})",
               all(store_lib.latest_index_step(run[0]) is not None for run in runs),
               lambda: run_children([
                   self._index_child(run_dir, checkpoint, f"index_{log}.log")
                   for run_dir, checkpoint, log, _, _ in runs
                   if store_lib.latest_index_step(run_dir) is None]))
    self.stage(f"5 open-QA fine-tuning ({which})", all(self.trained(run[0]) for run in runs),
               lambda: run_children([
                   self._finetune_child(run_dir, checkpoint, log, *bindings)
                   for run_dir, checkpoint, log, bindings, _ in runs
                   if not self.trained(run_dir)]))
    evaluations = [self._evaluate_child(run_dir, name) for run_dir, _, _, _, name in runs]
    self.stage(f"6 evaluation on the toy QA {self.eval_split} split ({which})",
               all(os.path.exists(metrics) for _, metrics in evaluations),
               lambda: run_children([child for child, metrics in evaluations
                                     if not os.path.exists(metrics)]))
    return self.summary(before, after, evaluations[0][1],
                        evaluations[1][1] if self.baseline else None)

  def train_ict(self, run_dir: str, log: str, *bindings: str,
                init_checkpoint: Optional[str] = None) -> None:
    """The warm start (`warm_start_gin`: ICT by default) into `run_dir`, its towers from the
    BERT when `ict_from_bert`, else from random weights; `bindings` are extra gin bindings.
    `init_checkpoint`, a checkpoint step directory with a retriever, is continued instead
    (ICT after RetroMAE: the RetroMAE run's checkpoint)."""
    if init_checkpoint is None and self.ict_from_bert:
      init_checkpoint = self._bert_checkpoint()
    run_child(python_module("realm_jax.train", f"--gin_file={self.warm_start_gin}",
                            *_gin(f"RUN_DIR='{run_dir}'",
                                  f"INIT_CHECKPOINT={_quoted(init_checkpoint)}", *bindings)),
              os.path.join(self.logs, log))

  def _bert_checkpoint(self) -> Optional[str]:
    """The recipe's BERT as step 0 of `<out>/toy_bert` (converted once), or None (random)."""
    if self.toy_bert is None:
      return None
    step_dir = os.path.join(self.bert, "checkpoints", "0")
    self.stage("0 the BERT (converted from its BertForMaskedLM files)",
               _latest_step(self.bert) == 0, lambda: run_child(
                   python_module("realm_jax.convert.hf", f"--hf_dir={self.toy_bert}",
                                 f"--run_dir={self.bert}"),
                   os.path.join(self.logs, "toy_bert.log")))
    return step_dir

  def _finetune_child(self, run_dir: str, init_checkpoint: str, log: str,
                      *bindings: str) -> tuple[list[str], str]:
    return (python_module("realm_jax.train", "--gin_file=gin_configs/experiments/toy_finetune.gin",
                          *_gin(f"RUN_DIR='{run_dir}'", f"INIT_CHECKPOINT='{init_checkpoint}'",
                                *bindings, *self.finetune_bindings)),
            os.path.join(self.logs, f"{log}.log"))

  def _qa_name(self) -> str:
    """The evaluation name of REALM's fine-tuning slot (`finetune_name`)."""
    return "toy_qa" if self.finetune_name == "finetune" else f"toy_qa_{self.finetune_name}"

  def qa_metrics_path(self) -> str:
    """The metrics JSON of the evaluation of REALM's fine-tuning slot, written by `run` (its
    "checkpoint_choice" says which checkpoint was evaluated: the one best.json names)."""
    return self._evaluate_child(self.finetune, self._qa_name())[1]

  def _evaluate_child(self, run_dir: str, name: str) -> tuple[tuple[list[str], str], str]:
    """EM on the toy QA split: (the evaluation child, the metrics file it writes)."""
    predictions = os.path.join(self.evals, f"{name}_{self.eval_split}.jsonl")
    child = (python_module("realm_jax.evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
                           *_gin(f"RUN_DIR='{run_dir}'", f"evaluate_main.split='{self.eval_split}'",
                                 f"evaluate_main.output='{predictions}'")),
             os.path.join(self.logs, f"evaluate_{name}.log"))
    return child, predictions.replace(".jsonl", ".metrics.json")

  def summary(self, before: str, after: str, qa: str, orqa_qa: Optional[str] = None) -> dict:
    scalars = read_scalars(os.path.join(self.pretrain, "tensorboard"))

    def last(tag):
      return scalars[tag][max(scalars[tag])] if tag in scalars else float("nan")

    staleness = list(scalars.get("retrieval/staleness_steps", {}).values())
    qa_metrics = _metrics_json(qa)  # evaluate's {"metrics": {...}, "task", "split", ...}
    return {
        "mlm_accuracy_null_only": last("eval/mlm/null_accuracy"),
        "mlm_accuracy_realm": last("eval/mlm/accuracy"),
        "retrieval_utility_first": (scalars["eval/retrieval/utility"][
            min(scalars["eval/retrieval/utility"])] if "eval/retrieval/utility" in scalars
                                    else float("nan")),
        "retrieval_utility_last": last("eval/retrieval/utility"),
        "qa_em_null_only": 0.0,
        "qa_em_realm": qa_metrics["metrics"]["exact_match"],
        "qa_em_orqa": (_metrics_json(orqa_qa)["metrics"]["exact_match"] if orqa_qa
                       else float("nan")),
        "recall@5_before": _metrics_json(before)["metrics"]["recall@5"],
        "recall@5_after": _metrics_json(after)["metrics"]["recall@5"],
        "refreshes": last("retrieval/refreshes"),
        "mean_staleness_steps": sum(staleness) / len(staleness) if staleness else float("nan"),
        "stage_seconds": self.times,
    }


def format_table(summary: dict, wall_seconds: float) -> str:
  """The recipe's result table (Markdown)."""
  rows = [
      ("masked salient-span accuracy, null document only (no retrieval)",
       f"{summary['mlm_accuracy_null_only']:.3f}"),
      ("masked salient-span accuracy, REALM (marginal over retrieved blocks)",
       f"{summary['mlm_accuracy_realm']:.3f}"),
      ("retrieval utility, first -> last checkpoint",
       f"{summary['retrieval_utility_first']:.3f} -> {summary['retrieval_utility_last']:.3f}"),
      ("toy QA test EM, null document only (extractive reader: 0 by construction)",
       f"{summary['qa_em_null_only']:.3f}"),
      ("toy QA test EM, ORQA-style baseline (ICT retriever, no REALM pretraining)",
       f"{summary['qa_em_orqa']:.3f}"),
      ("toy QA test EM, REALM", f"{summary['qa_em_realm']:.3f}"),
      ("retrieval recall@5 (toy QA test), before pretraining (ICT index)",
       f"{summary['recall@5_before']:.3f}"),
      ("retrieval recall@5 (toy QA test), after pretraining", f"{summary['recall@5_after']:.3f}"),
      ("index refreshes picked up during pretraining", f"{summary['refreshes']:.0f}"),
      ("mean index staleness (steps)", f"{summary['mean_staleness_steps']:.1f}"),
      ("wall time", f"{wall_seconds / 60:.1f} min"),
  ]
  width = max(len(r[0]) for r in rows)
  lines = [f"| {'':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
  lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
  return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog=f"python -m realm_jax.{PROG}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=DEFAULT_OUT, help="output directory (default %(default)s)")
  parser.add_argument("--fresh", action="store_true", help="delete --out first")
  parser.add_argument("--toy_bert", default="shipped",
                      help="the BertForMaskedLM directory every tower starts from: 'shipped' "
                           "(default: the toy BERT in realm_jax/data/assets/toy_bert, "
                           "docs/toy_bert.md), 'none' (random weights) or a directory of the "
                           "toy model's shape")
  parser.add_argument("--ict_from", choices=("random", "bert"), default="random",
                      help="what ICT's towers start from: 'random' (default) weights, or the "
                           "--toy_bert BERT as REALM's start from BERT. A toy-world deviation: "
                           "the toy BERT's hidden states keep too little of which name a "
                           "wordpiece sequence spells for ICT to learn the toy world's name "
                           "matching from them (docs/architecture.md)")
  args = parser.parse_args(argv)
  try:
    bert = toy_bert_dir(args.toy_bert)
  except ValueError as e:
    parser.error(str(e))
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    parser.error(f"--out {args.out} is a file; give a directory (created if missing)")
  if args.fresh and os.path.exists(args.out):
    shutil.rmtree(args.out)
  # The gin files are addressed from the repository root, where the children run.
  os.chdir(gin_utils.REPO_ROOT)
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top

  def run() -> int:
    start = time.monotonic()
    print(f"{PROG}: the toy world and its BlockStore (generated on first use) ...", flush=True)
    recipe = Recipe(args.out, realm_jax_tasks.toy_block_store_dir(), toy_bert=bert,
                    ict_from_bert=args.ict_from == "bert")
    summary = recipe.run()
    wall = time.monotonic() - start
    table = format_table(summary, wall)
    summary["wall_seconds"] = wall
    with open(os.path.join(recipe.out, "summary.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2)
    with open(os.path.join(recipe.out, "summary.md"), "w", encoding="utf-8") as f:
      f.write(table + "\n")
    print(f"\n{table}\n\n{PROG}: done; logs, checkpoints, indexes and predictions in "
          f"{recipe.out}")
    return 0

  # A stage that fails raises RuntimeError naming it and its log: one line, no traceback.
  return gin_utils.run_command(PROG, run, interrupted="run the same command to resume",
                               expected=(RuntimeError,), describe=gin_utils.one_line)


if __name__ == "__main__":
  gin_utils.exit_process(main(), PROG)
