r"""The whole REALM recipe on the embedded toy world, on a CPU: the project's main job; or on
your own corpus and questions.

  python -m realm_jax.recipe [--out /tmp/realm_toy] [--fresh] [--bert shipped|none|DIR]
      [--ict_from random|bert]
  python -m realm_jax.recipe --world wiki [--out /tmp/realm_wiki] [--bert shipped|none|DIR] ...
  python -m realm_jax.recipe --documents docs.jsonl --questions qa/ [--out /tmp/realm_own]
      [--max_block_len N] [--ict_remove_probability P] [--ict_steps N] [--pretrain_steps N]
      [--finetune_steps N] [--ict_lr R] [--pretrain_lr R] [--finetune_lr R] [--bert DIR] ...

Stages, each one of the project's own entry points run as a child process (so the index
builder really is a second process next to the trainer, as on a pod):

  0. a BERT                     python -m realm_jax.convert.hf of the shipped toy BERT
                                (realm_jax.toy_bert, docs/toy_bert.md; `--bert DIR` for
                                another transformers BERT directory, whose config.json then
                                sizes every tower, `--bert none` for random weights): what
                                the paper's BERT is to REALM
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

Your own corpus and questions (`--documents`, `--questions`; docs/own_corpus.md): the same
stages, on the toy model, each child pointed at your data, after checks that stop the recipe
before anything trains, with one line naming the file (and record and field) of what is wrong:

  0. your data                  the questions read whole: a train, dev and test split, none
                                empty, every record well formed; the block length chosen from
                                the documents (--max_block_len to set it) and the BlockStore
                                built (python -m realm_jax.build_corpus); ICT's sentence
                                removal probability chosen from the blocks' sentences
                                (--ict_remove_probability); the answers looked for in the
                                corpus (a split where fewer than --min_answerable of them occur
                                stops the recipe; the others are named); each choice printed
                                with its reason; the BERT converted; every training stage's
                                configuration checked by its own --dry_run (the BERT's shape
                                among it)
  1-3.                          ICT on your blocks, the first index, REALM pretraining (salient
                                spans of your corpus itself, X = Z) with the index builder;
                                BM25's recall of the test questions (no model) and the warm
                                start's recall of dev and test
  4. frozen indexes             REALM's from the pretrained checkpoint REALM's authors would
                                pick: the best by retrieval utility (<out>/pretrain/best.json),
                                not the last; its recall of dev and test (after pretraining)
  5. open-QA fine-tuning        REALM, the ORQA-style baseline and the reader fine-tuned on
                                BM25's top blocks (FinetuneJob.candidates='bm25', DrQA's
                                pipeline: a working system where the dense retriever cannot
                                compete yet), three side by side (one after the other for a
                                BERT larger than the toy model: memory)
  6. evaluation                 each of the three on the test questions

The wiki world (`--world wiki`; docs/wiki_world.md) is such a corpus and its questions, made
from English Wikipedia's Vital Articles leads (realm_jax.data.wiki, the `wiki` extra): the same
stages, the salient spans spaCy's entities and the date patterns computed once over the
BlockStore, the English BERT (realm_jax/data/assets/wiki_bert) by default, and the wiki
world's settings (`WIKI_*` below): ICT's removal probability 0.5, the retriever held for the
first half of pretraining, 200 pretraining and 150 fine-tuning steps.

The own-data and wiki runs end with a table of recall at every cut-off (1, 5, 20, 100, clipped to the corpus) of
BM25, the warm start, the pretrained retriever and the three fine-tuned systems, with their
test EM; pretraining's own figures; a line saying plainly whether pretraining improved the
retriever's dev recall over the warm start; and the settings chosen from the data. Run again
to resume; a different --documents, --questions or setting in the same --out is refused
(`<out>/own_data.json`); --fresh starts over.
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

import numpy as np

from realm_jax import gin_utils

PROG = "recipe"
DEFAULT_OUT = "/tmp/realm_toy"
# What the console shows of a child's output (the rest is in <out>/logs/).
_PROGRESS = re.compile(r"step \d+/\d+|published index|: done|error|Error|dry run|evaluate: "
                       r"(toy_qa|ict_toy|((retrieval|bm25) )?qa_(regex_)?files_)|"
                       r"embedding: blocks [\d,]+/[\d,]+ \(100")


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
  read from the cache. No malloc settings with REALM_JAX_ALLOCATOR=system (below)."""
  import realm_jax_launch.local as launcher  # pylint: disable=g-import-not-at-top
  allocator = {} if os.environ.get(ALLOCATOR_CHOICE) == "system" else launcher.ALLOCATOR_ENV
  settings = {**allocator, "JAX_COMPILATION_CACHE_DIR": compilation_cache_dir()}
  return {key: value for key, value in settings.items() if key not in os.environ}


# REALM_JAX_ALLOCATOR=system: the children keep glibc's malloc defaults. The launcher's settings
# keep each process's peak heap, which suits the toy model; a larger model's heap then grows
# past memory (docs/own_corpus.md, "With a real English BERT"), so `main` chooses it for a BERT
# larger than the toy model's.
ALLOCATOR_CHOICE = "REALM_JAX_ALLOCATOR"
TOY_BERT_WIDTH_X_LAYERS = 128 * 2


def bert_config(directory: str):
  """The BertConfig of a transformers BERT directory (its config.json)."""
  from realm_jax.convert import hf  # pylint: disable=g-import-not-at-top
  return hf.bert_config_from_hf(hf.read_config(directory))


def larger_than_toy(directory: Optional[str]) -> bool:
  """Whether the BERT in `directory` is larger (width x layers) than the toy model."""
  if directory is None:
    return False
  config = bert_config(directory)
  return config.hidden_size * config.num_layers > TOY_BERT_WIDTH_X_LAYERS


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


# The BertConfig fields that decide the shape of the towers a BERT warm-starts.
BERT_SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps")


def bert_shape_bindings(directory: Optional[str]) -> tuple[str, ...]:
  """Gin bindings that give every tower the shape of the BERT in `directory` (its config.json),
  so that a BERT of any size (the toy BERT, all-MiniLM-L6-v2, BERT-base) warm-starts the toy
  gins' model; () for random weights (the toy model's shape). Dropout stays the toy model's."""
  if directory is None:
    return ()
  config = bert_config(directory)
  return tuple(f"model_config.tiny_bert.{field}={getattr(config, field)!r}"
               for field in BERT_SHAPE_FIELDS)


def describe_bert(directory: Optional[str], ict_from_bert: bool) -> str:
  """One line on the BERT a run started from: its directory and shape, and what it started."""
  if directory is None:
    return "none (every tower from random weights of the toy model's shape)"
  config = bert_config(directory)
  towers = ("the retriever (ICT's towers), the encoder and the readers" if ict_from_bert
            else "the encoder and the readers; ICT's towers from random weights")
  return (f"{directory} (hidden {config.hidden_size}, {config.num_layers} layers, "
          f"{config.num_heads} heads, intermediate {config.intermediate_size}): {towers}")


def toy_bert_dir(choice: str, world: str = "toy") -> Optional[str]:
  """`--bert`: 'shipped' (the world's: realm_jax/data/assets/toy_bert, or wiki_bert for the
  wiki world), 'none' (None: random weights) or a transformers BERT directory
  (BertForMaskedLM, or BertModel, whose MLM head then starts fresh); ValueError when it has no
  weights, an unreadable config.json, or another WordPiece vocabulary than the one the corpus
  is tokenised with."""
  from realm_jax import toy_bert  # pylint: disable=g-import-not-at-top
  from realm_jax.data import vocab  # pylint: disable=g-import-not-at-top
  directory = {"shipped": toy_bert.SHIPPED_DIRS[world], "none": None}.get(choice, choice)
  if directory is None:
    return None
  if not os.path.isfile(os.path.join(directory, "model.safetensors")):
    raise ValueError(f"--bert {choice}: no model.safetensors in {directory}")
  sha256 = toy_bert.weights_sha256(directory) if choice == "shipped" else None
  expected = toy_bert.shipped_sha256(world)
  if sha256 is not None and sha256 != expected:
    raise ValueError(f"--bert shipped: {directory}/model.safetensors has sha256 {sha256}, "
                     f"not the shipped {expected} (docs/{toy_bert.DOCS[world]}); a partial "
                     f"checkout? `python -m realm_jax.toy_bert --world {world}` rebuilds it")
  try:
    bert_config(directory)
  except (OSError, ValueError, KeyError) as e:
    raise ValueError(f"--bert {choice}: {gin_utils.one_line(e)}"
                     + (" missing from its config.json" if isinstance(e, KeyError) else "")
                     ) from e
  vocab_file = os.path.join(directory, "vocab.txt")
  if os.path.isfile(vocab_file):
    with open(vocab_file, encoding="utf-8") as theirs, open(
        vocab.bundled_vocab_path(), encoding="utf-8") as ours:
      if theirs.read().split() != ours.read().split():
        raise ValueError(f"--bert {choice}: {vocab_file} is not the BERT uncased WordPiece "
                         f"vocabulary the corpus is tokenised with ({vocab.bundled_vocab_path()}"
                         f"): the blocks' ids would mean other wordpieces to this BERT")
  return directory


DEFAULT_FINETUNE_NAME = "finetune"
DEFAULT_PRETRAIN_STEPS = 400  # toy_pretrain.gin's NUM_STEPS


def qa_eval_name(finetune_name: str = DEFAULT_FINETUNE_NAME) -> str:
  """The evaluation name (`<out>/eval/<name>_<split>.jsonl`) of a `Recipe` fine-tuning slot."""
  return "toy_qa" if finetune_name == DEFAULT_FINETUNE_NAME else f"toy_qa_{finetune_name}"


class Recipe:
  """The stages (see the module docstring) over one output directory."""

  def __init__(self, out: str, store: str, *, ict_dir: Optional[str] = None,
               toy_bert: Optional[str] = None, ict_from_bert: bool = False,
               pretrain_bindings: Sequence[str] = (),
               finetune_bindings: Sequence[str] = (), with_builder: bool = True,
               eval_split: str = "test", baseline: bool = True,
               warm_start_gin: str = "gin_configs/experiments/toy_ict.gin",
               warm_start_bindings: Sequence[str] = (), finetune_name: str = DEFAULT_FINETUNE_NAME,
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
    self.model_bindings = bert_shape_bindings(toy_bert)
    self.larger_than_toy = larger_than_toy(toy_bert)
    self.ict_from_bert = ict_from_bert
    self.baseline = baseline
    self.bert = os.path.join(self.out, "bert")
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

  def run_trainings(self, children: Sequence[tuple[Sequence[str], str]]) -> None:
    """Independent training children: side by side for the toy model (`run_children`), one
    after the other for a BERT larger than it, whose side-by-side runs outgrow memory
    (docs/own_corpus.md, "With a real English BERT")."""
    if self.larger_than_toy:
      for child in children:
        run_children([child])
    else:
      run_children(children)

  def bindings(self, child: str) -> tuple[str, ...]:
    """The gin bindings of one kind of child ('ict', 'pretrain', 'finetune', 'evaluate'): the
    BERT's shape (`bert_shape_bindings`), then the recipe's data (`data_bindings`)."""
    return self.model_bindings + self.data_bindings(child)

  def data_bindings(self, child: str) -> tuple[str, ...]:
    """The gin bindings that point one kind of child at the recipe's data: none here, the toy
    gins' own tasks and the toy store (`OwnDataRecipe`: your corpus and questions)."""
    del child
    return ()

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
    child, output = self._recall_child(name, index_step, self.eval_split, self.pretrain,
                                       self._ict_checkpoint())
    run_child(*child)
    return output

  def _recall_child(self, name: str, index_step: int, split: str, run_dir: str,
                    index_checkpoint: str) -> tuple[tuple[list[str], str], str]:
    """Retrieval recall of the questions of `split` against index `index_step` of `run_dir`
    (built from `index_checkpoint`): (the evaluation child, the metrics file it writes)."""
    output = os.path.join(self.evals, f"recall_{name}.jsonl")
    child = (python_module("realm_jax.evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
                           *_gin(f"RUN_DIR='{run_dir}'", "evaluate_main.mode='retrieval'",
                                 f"evaluate_main.index_step={index_step}",
                                 f"evaluate_main.first_index_checkpoint_dir='{index_checkpoint}'",
                                 f"evaluate_main.split='{split}'",
                                 f"evaluate_main.output='{output}'",
                                 *self.bindings("evaluate"))),
             os.path.join(self.logs, f"recall_{name}.log"))
    return child, output.replace(".jsonl", ".metrics.json")

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

  def _pretrain_command(self, bert: Optional[str], dry_run: bool = False) -> list[str]:
    """The pretraining trainer's command line (`dry_run`: from no warm start, checked only)."""
    return python_module(
        "realm_jax.train", "--gin_file=gin_configs/experiments/toy_pretrain.gin",
        *_gin(f"RUN_DIR='{self.pretrain}'",
              f"INIT_CHECKPOINT={_quoted(None if dry_run else self._ict_checkpoint())}",
              f"ENCODER_CHECKPOINT={_quoted(bert)}",
              # Without a builder no refresh is ever published to wait for.
              *([] if self.with_builder else ["PretrainJob.refresh_in_lockstep=False"]),
              *self.bindings("pretrain"), *self.pretrain_bindings),
        *(["--dry_run"] if dry_run else []))

  def _pretrain(self, bert: Optional[str]) -> None:
    """REALM pretraining from the warm start, with the index builder alongside unless
    `with_builder` is off (`realm_jax_launch.local.run_local` starts both)."""
    import realm_jax_launch.local as launcher  # pylint: disable=g-import-not-at-top
    builder = None
    if self.with_builder:
      # Polling often: in lockstep the trainer waits for each index the builder makes.
      builder = python_module("realm_jax.build_index",
                              "--gin_file=gin_configs/runs/build_index.gin",
                              *_gin(f"RUN_DIR='{self.pretrain}'", f"BLOCK_STORE='{self.store}'",
                                    "build_index_main.poll_seconds=0.5"))
    code = launcher.run_local(self._pretrain_command(bert), builder, log_dir=self.logs,
                              console=_Progress(sys.stdout), env_trainer=child_env(),
                              env_builder=child_env(), run_dir=self.pretrain)
    if code - 128 in gin_utils.STOP_SIGNALS + (signal.SIGHUP,):
      # The launcher caught the signal meant for this process and stopped both children.
      raise gin_utils.Interrupted(code - 128)
    if code:
      raise RuntimeError(f"pretraining exited with status {code}; see {self.logs}")

  def run_pretraining(self) -> tuple[str, str]:
    """Stages 1-3: the warm start, its index and REALM pretraining, each skipped when done, with
    recall before and after; returns the paths of those two recall metrics. `run` goes on from
    here; a bench calls it alone to make a pretraining again."""
    from realm_jax.index import store as store_lib  # pylint: disable=g-import-not-at-top

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

    self.stage("3 REALM pretraining" + (" + index builder (two processes)"
                                          if self.with_builder else " (index never refreshed)"),
                self.trained(self.pretrain), lambda: self._pretrain(bert))
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
    return before, after

  def run(self) -> dict:
    from realm_jax.index import store as store_lib  # pylint: disable=g-import-not-at-top

    before, after = self.run_pretraining()
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
               lambda: self.run_trainings([
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
                                  f"INIT_CHECKPOINT={_quoted(init_checkpoint)}",
                                  *self.bindings("ict"), *bindings)),
              os.path.join(self.logs, log))

  def _bert_checkpoint(self) -> Optional[str]:
    """The recipe's BERT as step 0 of `<out>/bert` (converted once), or None (random)."""
    if self.toy_bert is None:
      return None
    step_dir = os.path.join(self.bert, "checkpoints", "0")
    self.stage("0 the BERT (converted from its transformers files)",
               _latest_step(self.bert) == 0, lambda: run_child(
                   python_module("realm_jax.convert.hf", f"--hf_dir={self.toy_bert}",
                                 f"--run_dir={self.bert}"),
                   os.path.join(self.logs, "bert.log")))
    return step_dir

  def _finetune_child(self, run_dir: str, init_checkpoint: Optional[str], log: str,
                      *bindings: str, last: Sequence[str] = ()) -> tuple[list[str], str]:
    """A fine-tuning child: `bindings`, the recipe's, then `last` (which override them)."""
    return (python_module("realm_jax.train", "--gin_file=gin_configs/experiments/toy_finetune.gin",
                          *_gin(f"RUN_DIR='{run_dir}'",
                                f"INIT_CHECKPOINT={_quoted(init_checkpoint)}",
                                *bindings, *self.bindings("finetune"),
                                *self.finetune_bindings, *last)),
            os.path.join(self.logs, f"{log}.log"))

  def _qa_name(self) -> str:
    """The evaluation name of REALM's fine-tuning slot (`finetune_name`)."""
    return qa_eval_name(self.finetune_name)

  def qa_metrics_path(self) -> str:
    """The metrics JSON of the evaluation of REALM's fine-tuning slot, written by `run` (its
    "checkpoint_choice" says which checkpoint was evaluated: the one best.json names)."""
    return self._evaluate_child(self.finetune, self._qa_name())[1]

  def _evaluate_child(self, run_dir: str, name: str,
                      *bindings: str) -> tuple[tuple[list[str], str], str]:
    """EM on the toy QA split (`bindings`: extra evaluate_main ones): (the evaluation child, the
    metrics file it writes)."""
    predictions = os.path.join(self.evals, f"{name}_{self.eval_split}.jsonl")
    child = (python_module("realm_jax.evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
                           *_gin(f"RUN_DIR='{run_dir}'", f"evaluate_main.split='{self.eval_split}'",
                                 f"evaluate_main.output='{predictions}'",
                                 *self.bindings("evaluate"), *bindings)),
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
        # The fine-tuned reader's own retrieval at the top (EM follows it on the toy world).
        "qa_recall@1_realm": qa_metrics["metrics"].get("recall@1", float("nan")),
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


# ------------------------------------------------------------------------------ your own data

OWN_OUT = "/tmp/realm_own"
# The name your corpus's tasks carry (ict_own, realm_own_salient_span): each child registers
# them over the recipe's BlockStore (`realm_jax_tasks.register_corpus_for_task`).
OWN_CORPUS = "own"
# Fine-tuning trains on train, picks its checkpoint on dev (and the verdict on pretraining
# reads dev); the table reports test.
QA_SPLITS = ("train", "dev", "test")
# The block length chosen from the documents: the smallest multiple of BLOCK_LEN_MULTIPLE that
# holds BLOCK_LEN_QUANTILE of the first SAMPLED_DOCUMENTS documents whole, within
# [MIN_BLOCK_LEN, REALM's 288]. Multiples of 32: the index builder cuts each batch to such a
# bucket anyway (`build_index_main.length_bucket`). A longer document becomes several blocks,
# as a Wikipedia article does.
SAMPLED_DOCUMENTS = 2000
BLOCK_LEN_QUANTILE = 0.9
BLOCK_LEN_MULTIPLE = 32
MIN_BLOCK_LEN = 64
# ICT's removal probability chosen from the BlockStore: the highest of ORQA's 0.9, 0.8, ..., 0.0
# at which the blocks ICT cannot use (one sentence, removed: no body left) stay at most this
# share of the corpus, the share past which ICT itself warns (realm_jax_tasks.pretraining).
ICT_MAX_SKIPPED = 0.1
ORQA_REMOVE_PROBABILITY = 0.9
DEFAULT_MIN_ANSWERABLE = 0.5
# Reader rows are `[CLS] question [SEP] body [SEP]`: the block length and this much room for
# the question, as toy_finetune.gin's 160 for the toy world's blocks of 128.
READER_QUESTION_ROOM = 32
# Checkpoints per run when --ict_steps, --pretrain_steps or --finetune_steps set its length, as
# the toy gins have them: ICT 400 steps / 100; pretraining 400 / 80, five refreshes of the
# index in lockstep and five retrieval-utility evaluations to pick the best from; fine-tuning
# 300 / 100, three dev evaluations.
CHECKPOINTS_PER_RUN = {"ict": 4, "pretrain": 5, "finetune": 3}


class InputError(Exception):
  """Your corpus or questions cannot be used, or `--out` holds another run's: one line naming
  the file (and the record and field where there is one), raised before anything trains."""


def step_bindings(child: str, steps: Optional[int],
                  learning_rate: Optional[float] = None) -> list[str]:
  """`--ict_steps`, `--pretrain_steps`, `--finetune_steps` ('ict', 'pretrain', 'finetune') as
  gin bindings: NUM_STEPS and a checkpoint every 1/CHECKPOINTS_PER_RUN of the run; then
  `--<child>_lr` as LEARNING_RATE; none for None (the toy gin's own)."""
  bindings = []
  if steps is not None:
    every = max(1, steps // CHECKPOINTS_PER_RUN[child])
    bindings += [f"NUM_STEPS={steps}", f"train_main.checkpoint_every={every}"]
  if learning_rate is not None:
    bindings.append(f"LEARNING_RATE={learning_rate!r}")
  return bindings


def absolute_questions(questions: str) -> str:
  """`--questions` with its path made absolute (the children run from the repository root),
  `regex:` kept."""
  from realm_jax_tasks import open_qa  # pylint: disable=g-import-not-at-top
  regex, path = open_qa.qa_path(questions)
  return (open_qa.REGEX_PREFIX if regex else "") + path


def check_questions(questions: str) -> dict[str, tuple[str, list]]:
  """Your question files read whole and checked: {split: (file, its QAExamples)} for train,
  dev and test, each example's `source` its "file:line".

  Raises:
    InputError: no such path, a split missing or empty, or a bad record (naming its file, line
      and field).
  """
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top
  try:
    splits = realm_jax_tasks.read_qa_files(questions)
  except ValueError as e:  # QADataError (a bad record) is one too, and names file:line, field
    raise InputError(f"--questions: {e}") from e
  missing = [split for split in QA_SPLITS if split not in splits]
  if missing:
    found = ", ".join(f"{split} ({file})" for split, (file, _) in splits.items())
    raise InputError(
        f"--questions {questions}: no {' or '.join(missing)} split (found {found}): the recipe "
        f"fine-tunes on train, picks its checkpoints on dev and reports test, so it needs a "
        f"directory with train, dev and test as .jsonl (ORQA's form, {{\"question\", "
        f"\"answer\": [...]}} per line) or .csv/.tsv (DPR's)")
  for split, (file, examples) in splits.items():
    if not examples:
      raise InputError(f"{file}: no questions (the {split} split of --questions is empty)")
  return {split: splits[split] for split in QA_SPLITS}


def document_lengths(source, limit: int = SAMPLED_DOCUMENTS) -> list[int]:
  """Wordpieces of `[CLS] title [SEP] text [SEP]` of the first `limit` documents of a
  `sources.make_source` source (REALM's records: of each block).

  Raises:
    InputError: a bad record among them, named as build_corpus names it.
  """
  from realm_jax.data import sources as sources_lib  # pylint: disable=g-import-not-at-top
  from realm_jax.data import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  vocab = vocab_lib.default_vocabulary()
  lengths = []
  for item in source:
    if isinstance(item, sources_lib.BadRecord):
      raise InputError(f"--documents: {item.message}")
    lengths.append(3 + len(vocab.encode(item.title)) + len(vocab.encode(item.text)))
    if len(lengths) >= limit:
      break
  return lengths


def choose_block_len(lengths: Sequence[int]) -> tuple[int, str]:
  """(max_block_len, why) from documents' wordpiece lengths (`document_lengths`): the smallest
  multiple of BLOCK_LEN_MULTIPLE that holds BLOCK_LEN_QUANTILE of them whole, within
  [MIN_BLOCK_LEN, REALM's 288]."""
  from realm_jax.data import block_store as block_store_lib  # pylint: disable=g-import-not-at-top
  if not lengths:
    raise InputError("--documents: no documents")
  lengths = np.asarray(lengths)  # [documents]
  # The least length that this share of the documents does not exceed.
  quantile = float(np.quantile(lengths, BLOCK_LEN_QUANTILE, method="inverted_cdf"))
  block_len = int(np.clip(-(-quantile // BLOCK_LEN_MULTIPLE) * BLOCK_LEN_MULTIPLE,
                          MIN_BLOCK_LEN, block_store_lib.DEFAULT_MAX_BLOCK_LEN))
  whole = float(np.mean(lengths <= block_len))
  return block_len, (
      f"chosen from the documents: {BLOCK_LEN_QUANTILE:.0%} of the first {len(lengths):,} have "
      f"at most {quantile:.0f} wordpieces as [CLS] title [SEP] text [SEP] (median "
      f"{np.median(lengths):.0f}), and blocks of {block_len} hold {whole:.0%} of them whole: "
      f"the smallest multiple of {BLOCK_LEN_MULTIPLE} to hold {BLOCK_LEN_QUANTILE:.0%}, within "
      f"{MIN_BLOCK_LEN}..{block_store_lib.DEFAULT_MAX_BLOCK_LEN} (REALM's, for Wikipedia's long "
      f"articles); a longer document becomes several blocks; --max_block_len sets it")


def sentence_counts(store) -> np.ndarray:
  """The sentences of each block's body as ICT splits them (`data.sentences`). int [blocks]."""
  from realm_jax.data import sentences  # pylint: disable=g-import-not-at-top
  return np.array([len(sentences.split_sentences(store.body(block_id)))
                   for block_id in range(store.num_blocks)], np.int64)


def choose_ict_remove_probability(counts: Sequence[int]) -> tuple[float, str]:
  """(ICT's removal probability, why) from each block's sentence count (`sentence_counts`):
  the highest of 0.9, 0.8, ..., 0.0 at which the one-sentence blocks ICT cannot use (their
  sentence removed, no body is left) stay at most ICT_MAX_SKIPPED of the blocks."""
  counts = np.asarray(counts)  # [blocks]
  one = float(np.mean(counts == 1)) if counts.size else 0.0
  # ICT loses a one-sentence block with probability p: about one * p of the corpus.
  probability = next(p / 10 for p in range(round(ORQA_REMOVE_PROBABILITY * 10), -1, -1)
                     if one * p / 10 <= ICT_MAX_SKIPPED + 1e-9)
  lost_at_orqa = one * ORQA_REMOVE_PROBABILITY
  orqa = ("ORQA's" if probability == ORQA_REMOVE_PROBABILITY else
          f"at ORQA's {ORQA_REMOVE_PROBABILITY:g} it would lose {lost_at_orqa:.0%}: the highest "
          f"of 0.9, 0.8, ... to keep the loss within the")
  return probability, (
      f"chosen from the BlockStore: {one:.0%} of its {counts.size:,} blocks are one sentence, "
      f"which ICT cannot use when it removes that sentence (no body is left), so at "
      f"{probability:g} it loses about {one * probability:.0%} of the blocks; {orqa} "
      f"{ICT_MAX_SKIPPED:.0%} past which ICT warns; --ict_remove_probability sets it")


def check_answers(splits: dict[str, tuple[str, list]], texts, min_answerable: float
                  ) -> list[str]:
  """Whether the questions' answers occur in the corpus at all (`texts`: the block bodies, as
  recall reads them): the lines to print about the questions whose answers occur nowhere (no
  retriever can find them; they count as misses), one per split that has some.

  Raises:
    InputError: in some split, less than `min_answerable` of the questions has an answer in
      the corpus: the questions are not this corpus's (naming the file and the first ones).
  """
  from realm_jax.evaluation import recall  # pylint: disable=g-import-not-at-top
  examples = [e for _, split_examples in splits.values() for e in split_examples]
  found = recall.answers_in_corpus(examples, texts)  # [all questions]
  lines, begin = [], 0
  for split, (file, split_examples) in splits.items():
    absent = [e for e, ok in zip(split_examples, found[begin:begin + len(split_examples)])
              if not ok]
    begin += len(split_examples)
    if not absent:
      continue
    first = "; ".join(f"{e.source}: answers {list(e.answers)}" for e in absent[:3])
    share = 1 - len(absent) / len(split_examples)
    if share < min_answerable:
      raise InputError(
          f"{file}: {len(absent):,} of {len(split_examples):,} {split} questions have no answer "
          f"anywhere in --documents (only {share:.0%} do, less than --min_answerable "
          f"{min_answerable:g}): are these the questions of this corpus? First: {first}")
    lines.append(f"{PROG}: {len(absent):,} of {len(split_examples):,} {split} questions have "
                 f"no answer anywhere in the corpus (no retriever can find one; they count as "
                 f"misses): {first}")
  return lines


def pretraining_verdict(before: dict, after: dict, step: int) -> str:
  """One plain line: did pretraining improve retrieval over the warm start? `before`, `after`:
  the dev recall metrics ({"recall@k": ...}) of the warm start's index and of the index of the
  pretrained checkpoint `step`; improved means higher at a recall cut-off."""
  ks = sorted((k for k in before if k.startswith("recall@")), key=lambda k: int(k[7:]))
  higher = [k for k in ks if after[k] > before[k]]
  figures = ", ".join(f"{k} {before[k]:.3f} -> {after[k]:.3f}" for k in ks)
  if not higher:
    how = "Pretraining did not improve retrieval over the warm start"
  elif len(higher) == len(ks):
    how = "Pretraining improved retrieval over the warm start"
  else:
    how = (f"Pretraining improved retrieval over the warm start at {', '.join(higher)} only")
  return (f"{how}: dev {figures} (the warm start's index -> that of pretraining checkpoint "
          f"{step}).")


class OwnDataRecipe(Recipe):
  """The recipe's stages on your corpus and questions (`python -m realm_jax.recipe --documents
  ... --questions ...`, the module docstring's "Your own corpus and questions").

  Before anything trains (`prepare`, then `_dry_runs`): the questions read and checked, the
  block length chosen from the documents, the BlockStore built, ICT's removal probability
  chosen from it, the answers looked for in it, the settings recorded (a resumed run must share
  them) and every training child's configuration checked by its own dry run. Then the toy
  recipe's stages over the toy gins, each child pointed at your data (`data_bindings`), with
  BM25 beside the dense retrievers, REALM's pretrained checkpoint picked by retrieval utility
  (best.json) rather than the last, and a third fine-tuning: the reader on BM25's blocks.
  """

  def __init__(self, out: str, *, documents: str, questions: str,
               documents_format: str = "jsonl", toy_bert: Optional[str] = None,
               ict_from_bert: bool = False, max_block_len: Optional[int] = None,
               ict_remove_probability: Optional[float] = None,
               min_answerable: float = DEFAULT_MIN_ANSWERABLE,
               warm_start_bindings: Sequence[str] = (), pretrain_bindings: Sequence[str] = (),
               finetune_bindings: Sequence[str] = (), finetune_name: str = DEFAULT_FINETUNE_NAME,
               finetune_retriever: str = "pretrain", finetune_reader: str = "pretrain",
               with_builder: bool = True, slot_bindings: Sequence[str] = ()):
    """Args: out: the output directory (its BlockStore in `<out>/store`); documents: the
    corpus (`build_corpus --input`, an absolute path for files); questions: your QA files
    (`absolute_questions`); documents_format: `build_corpus --source`; toy_bert, ict_from_bert,
    the bindings, REALM's fine-tuning slot (finetune_name, finetune_retriever, finetune_reader),
    with_builder: as Recipe's; slot_bindings: more bindings of that slot's fine-tuning alone,
    last (a bench's: another fine-tuning seed), not recorded with the run's arguments;
    max_block_len, ict_remove_probability: None to choose them from the data; min_answerable:
    the least share of a split's questions whose answers must occur in the corpus."""
    out = os.path.abspath(out)
    super().__init__(out, os.path.join(out, "store"), toy_bert=toy_bert,
                     ict_from_bert=ict_from_bert, warm_start_bindings=warm_start_bindings,
                     pretrain_bindings=pretrain_bindings, finetune_bindings=finetune_bindings,
                     finetune_name=finetune_name, finetune_retriever=finetune_retriever,
                     finetune_reader=finetune_reader, with_builder=with_builder)
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

  def data_bindings(self, child: str) -> tuple[str, ...]:
    """Each kind of child pointed at your corpus (the tasks `OWN_CORPUS` names, registered by
    the child over the BlockStore) and your questions (their path as the task)."""
    store = f"'{self.store}'"
    records = self.span_records()
    return {
        "ict": (f"TASK='ict_{OWN_CORPUS}'", f"BLOCK_STORE={store}",
                f"IctJob.ict_remove_probability={self.ict_remove_probability}"),
        "pretrain": (f"TASK='realm_{OWN_CORPUS}_salient_span'", f"BLOCK_STORE={store}",
                     *([] if records is None else [f"PretrainJob.pretrain_records='{records}'"])),
        "finetune": (f"TASK='{self.questions}'", f"BLOCK_STORE={store}",
                     f"FinetuneJob.reader_len={self.max_block_len + READER_QUESTION_ROOM}"),
        "evaluate": (f"TASK='{self.questions}'", f"evaluate_main.block_store={store}"),
    }[child]

  def _settings_path(self) -> str:
    return os.path.join(self.out, "own_data.json")

  def _check_same_arguments(self) -> None:
    """InputError when `<out>` holds a run of other data or settings (`own_data.json`)."""
    if not os.path.exists(self._settings_path()):
      return
    with open(self._settings_path(), encoding="utf-8") as f:
      recorded = json.load(f)["arguments"]
    differ = [f"{key} {recorded.get(key)!r} then, {value!r} now"
              for key, value in self.arguments.items() if recorded.get(key) != value]
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
    splits = check_questions(self.questions)
    print(f"{PROG}: your questions: " + ", ".join(
        f"{split} {len(examples):,} ({file})" for split, (file, examples) in splits.items()),
          flush=True)
    why = "as given"
    if self.max_block_len is None:
      try:
        source = sources_lib.make_source(self.documents_format, self.documents)
      except (ValueError, OSError) as e:  # CorpusInputError is a ValueError
        raise InputError(f"--documents: {gin_utils.one_line(e)}") from e
      self.max_block_len, why = choose_block_len(document_lengths(source))
    self.settings["max_block_len"] = {"value": self.max_block_len, "why": why}
    print(f"{PROG}: max_block_len {self.max_block_len} ({why})", flush=True)
    manifest = os.path.join(self.store, "manifest.json")  # published last: the store is whole
    self.stage(f"0 the BlockStore of your documents ({self.store})", os.path.isfile(manifest),
               lambda: run_child(python_module(
                   "realm_jax.build_corpus", "--source", self.documents_format, "--input",
                   self.documents, "--out", self.store, "--max_block_len",
                   str(self.max_block_len)), os.path.join(self.logs, "build_corpus.log")))
    store = block_store_lib.BlockStore.open(self.store, verify="fast")
    fileio.write_json_atomically(self._settings_path(), {"arguments": self.arguments})
    print(f"{PROG}: {store.num_blocks:,} blocks of at most {store.max_block_len} wordpieces",
          flush=True)
    why = self.ict_remove_why
    if self.ict_remove_probability is None:
      self.ict_remove_probability, why = choose_ict_remove_probability(sentence_counts(store))
    self.settings["ict_remove_probability"] = {"value": self.ict_remove_probability, "why": why}
    print(f"{PROG}: ICT removal probability {self.ict_remove_probability:g} ({why})", flush=True)
    lines = check_answers(splits, (store.body(i) for i in range(store.num_blocks)),
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

  def _dry_runs(self, bert: Optional[str]) -> None:
    """Each training child's configuration checked by its own `--dry_run`, side by side: the
    tasks over your data, the BERT's shape against the model's, the settings. Nothing is read
    or written; a mistake stops the recipe here, before anything trains."""
    ict = python_module("realm_jax.train", f"--gin_file={self.warm_start_gin}",
                        *_gin(f"RUN_DIR='{self.ict}'",
                              f"INIT_CHECKPOINT={_quoted(bert if self.ict_from_bert else None)}",
                              *self.bindings("ict"), *self.warm_start_bindings), "--dry_run")
    finetune, _ = self._finetune_child(self.bm25_reader, None, "dry_run_finetune",
                                       *self._bm25_reader_bindings(bert))
    run_children([(ict, os.path.join(self.logs, "dry_run_ict.log")),
                  (self._pretrain_command(bert, dry_run=True),
                   os.path.join(self.logs, "dry_run_pretrain.log")),
                  (finetune + ["--dry_run"], os.path.join(self.logs, "dry_run_finetune.log"))])

  def _bm25_reader_bindings(self, bert: Optional[str]) -> tuple[str, ...]:
    """The BM25 reader's fine-tuning: the baseline's reader (the BERT) on BM25's blocks."""
    return (f"ENCODER_CHECKPOINT={_quoted(bert)}", "FinetuneJob.candidates='bm25'")

  def pretrain_choice(self) -> tuple[int, str]:
    """The pretraining checkpoint fine-tuning starts from, as REALM's authors pick it: the best
    by retrieval utility, recorded by the trainer in best.json (`evaluation.runs.
    choose_checkpoint`, as `evaluate` picks a fine-tuned checkpoint by dev EM); the newest
    when there is no best.json. (step, why)."""
    from realm_jax.evaluation import runs  # pylint: disable=g-import-not-at-top
    step, why = runs.choose_checkpoint(self.pretrain, None)
    if step is None:
      raise RuntimeError(f"{self.pretrain}: no finished pretraining checkpoint")
    return step, why

  def _pretrain_checkpoint(self) -> str:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    return checkpoints.checkpoint_path(self.pretrain, self.pretrain_choice()[0])

  def _bm25_recall_child(self) -> tuple[tuple[list[str], str], str]:
    """BM25's recall of the test questions (no model): (the child, its metrics file)."""
    output = os.path.join(self.evals, "recall_bm25_test.jsonl")
    child = (python_module("realm_jax.evaluate", "--gin_file=gin_configs/experiments/toy_eval.gin",
                           *_gin("RUN_DIR=None", "evaluate_main.mode='bm25'",
                                 "evaluate_main.split='test'", f"evaluate_main.output='{output}'",
                                 *self.bindings("evaluate"))),
             os.path.join(self.logs, "recall_bm25_test.log"))
    return child, output.replace(".jsonl", ".metrics.json")

  def run(self) -> dict:
    from realm_jax.index import store as store_lib  # pylint: disable=g-import-not-at-top
    self.prepare()
    bert = self._bert_checkpoint()
    self.stage("0 every training stage's configuration (their dry runs, side by side)",
               _latest_step(self.ict) is not None, lambda: self._dry_runs(bert))
    self.stage("1 warm start (ICT on your corpus)", self.trained(self.ict),
               lambda: self.train_ict(self.ict, "ict.log", *self.warm_start_bindings))
    self.stage("2 first index (from the warm start's checkpoint)",
               store_lib.latest_index_step(self.pretrain) is not None,
               lambda: run_child(*self._index_child(self.pretrain, self._ict_checkpoint(),
                                                    "index_0.log")))
    ict = self._ict_checkpoint()
    before = {split: self._recall_child(f"before_{split}", 0, split, self.pretrain, ict)
              for split in ("dev", "test")}
    bm25 = self._bm25_recall_child()
    self._stage_children("  recall of BM25 (test) and of the warm start (dev, test)",
                         [bm25, *before.values()])
    self.stage("3 REALM pretraining" + (" + index builder (two processes)" if self.with_builder
                                         else " (index never refreshed)"),
               self.trained(self.pretrain), lambda: self._pretrain(bert))
    step, why = self.pretrain_choice()
    print(f"{PROG}: fine-tuning starts from pretraining checkpoint {step} ({why}), as REALM "
          f"picks it: by retrieval utility, not the last ({_latest_step(self.pretrain)})",
          flush=True)
    # REALM's fine-tuning slot: the chosen checkpoint (REALM), or the mix `finetune_retriever`
    # and `finetune_reader` ask for (Table 2's mixed rows), in files of its own.
    retriever, reader_bindings = self._finetune_starts()
    slot = self._slot_suffix()
    self.stage("4 frozen indexes for fine-tuning (REALM's from its retriever's checkpoint, the "
               "ORQA-style baseline's from the warm start)",
               all(store_lib.latest_index_step(d) is not None for d in (self.finetune, self.orqa)),
               lambda: run_children([
                   self._index_child(run_dir, checkpoint, f"index_{name}.log")
                   for run_dir, checkpoint, name in ((self.finetune, retriever,
                                                      self.finetune_name),
                                                     (self.orqa, ict, "finetune_orqa"))
                   if store_lib.latest_index_step(run_dir) is None]))
    # The REALM fine-tuning's frozen index is the chosen checkpoint's: recall after pretraining.
    after = {split: self._recall_child(f"after{slot}_{split}", 0, split, self.finetune,
                                       retriever)
             for split in ("dev", "test")}
    self._stage_children("  recall after pretraining (that checkpoint's index; dev, test)",
                         list(after.values()))
    baseline_reader = (f"ENCODER_CHECKPOINT={_quoted(bert)}",)
    # (run directory, INIT_CHECKPOINT, log, bindings, evaluation name, evaluate's bindings)
    runs = [(self.finetune, retriever, self.finetune_name, reader_bindings, f"realm{slot}", ()),
            (self.orqa, ict, "finetune_orqa", baseline_reader, "orqa", ()),
            (self.bm25_reader, ict, "finetune_bm25", self._bm25_reader_bindings(bert),
             "bm25_reader", ("evaluate_main.candidates='bm25'",))]
    which = "REALM, the ORQA-style baseline and the BM25 reader"
    self.stage(f"5 open-QA fine-tuning ({which})", all(self.trained(run[0]) for run in runs),
               lambda: self.run_trainings([
                   self._finetune_child(run_dir, init, log, *bindings,
                                        last=self.slot_bindings if run_dir == self.finetune
                                        else ())
                   for run_dir, init, log, bindings, _, _ in runs if not self.trained(run_dir)]))
    evaluations = {name: self._evaluate_child(run_dir, name, *bindings)
                   for run_dir, _, _, _, name, bindings in runs}
    self._stage_children(f"6 evaluation on your test questions ({which})",
                         list(evaluations.values()))
    return self.own_summary({"bm25": bm25[1], "warm_start": before["test"][1],
                             "pretrained": after["test"][1]},
                            {"warm_start": before["dev"][1], "pretrained": after["dev"][1]},
                            {"realm" if name == f"realm{slot}" else name: metrics
                             for name, (_, metrics) in evaluations.items()})

  def _slot_suffix(self) -> str:
    """What REALM's fine-tuning slot adds to its evaluation files' names ("" for REALM's own)."""
    return "" if self.finetune_name == DEFAULT_FINETUNE_NAME else f"_{self.finetune_name}"

  def qa_metrics_path(self, row: str = "realm") -> str:
    """The metrics JSON `run` writes for a fine-tuned row ('realm': REALM's fine-tuning slot,
    'orqa', 'bm25_reader'); its "checkpoint_choice" says which checkpoint was evaluated."""
    name = f"realm{self._slot_suffix()}" if row == "realm" else row
    return os.path.join(self.evals, f"{name}_{self.eval_split}.metrics.json")

  def _stage_children(self, name: str, children: Sequence[tuple[tuple[list[str], str], str]]
                      ) -> None:
    """A stage of independent evaluations ((child, its metrics file) each), side by side,
    done when every metrics file exists."""
    self.stage(name, all(os.path.exists(metrics) for _, metrics in children),
               lambda: run_children([child for child, metrics in children
                                     if not os.path.exists(metrics)]))

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
      return _metrics_json(path)["metrics"]

    dev = {row: metrics(path) for row, path in dev_recall.items()}
    return {
        "documents": self.documents, "questions": self.questions, "settings": self.settings,
        "span_redundancy": self.span_statistics,
        "bert": describe_bert(self.toy_bert, self.ict_from_bert),
        "verdict": pretraining_verdict(dev["warm_start"], dev["pretrained"], step),
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


# ------------------------------------------------------------------------------ the wiki world

WIKI_OUT = "/tmp/realm_wiki"
# The wiki world's own settings, each chosen on its dev questions' recall@5
# (docs/wiki_world.md#the-recipe-on-the-wiki-world): ICT keeps the query sentence in its block
# half the time (a toy-sized ICT from random weights learns the words a description shares with
# its article's lead; at ORQA's 0.9 it learns too little of them), and REALM pretraining holds
# the retriever still for the first half of its steps, while the encoder learns to read the
# blocks (before that, the retriever's updates follow a reader that reads nothing).
WIKI_ICT_REMOVE_PROBABILITY = 0.5
WIKI_RETRIEVER_FROZEN_SHARE = 0.5
# Its run lengths, where they differ from the toy gins': halved for time (the whole recipe takes
# 25 minutes on 2 cores with them, docs/wiki_world.md).
WIKI_STEPS = {"pretrain": 200, "finetune": 150}


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

  def data_bindings(self, child: str) -> tuple[str, ...]:
    """OwnDataRecipe's, and REALM pretraining's retriever held for its first steps."""
    held = ((f"PretrainJob.freeze_retriever_steps={self.frozen_retriever_steps}",)
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


def _markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
  """A Markdown table, its columns padded to their widest cell."""
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

  def line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

  return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|",
          *(line(row) for row in rows)]


def format_own_table(summary: dict, wall_seconds: float) -> str:
  """The own-data recipe's result (Markdown): recall at every cut-off of every retriever, BM25
  beside the dense ones, and test EM of the three fine-tuned readers; pretraining's figures;
  the verdict on pretraining and the settings chosen from the data, one line each."""
  ks = sorted((k for k in summary["recall"]["bm25"] if k.startswith("recall@")),
              key=lambda k: int(k[7:]))
  answer = summary["answer_metric"]
  step = summary["pretrain_checkpoint"]["step"]
  chosen = ("best retrieval utility" if summary["pretrain_checkpoint"]["choice"].startswith("best")
            else summary["pretrain_checkpoint"]["choice"])
  rows = [("BM25 over the blocks' title and text", summary["recall"]["bm25"], None),
          ("warm start (ICT) retriever, before pretraining", summary["recall"]["warm_start"],
           None),
          (f"REALM-pretrained retriever (checkpoint {step}: {chosen})",
           summary["recall"]["pretrained"], None),
          ("ORQA-style: warm-start retriever, BERT reader, fine-tuned", summary["qa"]["orqa"],
           summary["qa"]["orqa"][answer]),
          ("REALM: pretrained retriever and encoder, fine-tuned", summary["qa"]["realm"],
           summary["qa"]["realm"][answer]),
          ("BM25's top blocks, BERT reader fine-tuned on them (DrQA-style)",
           summary["qa"]["bm25_reader"], summary["qa"]["bm25_reader"][answer])]
  header = ["", *ks, "test EM" if answer == "exact_match" else "test regex match"]
  lines = _markdown(header, [[name, *(f"{metrics[k]:.3f}" for k in ks),
                              "" if em is None else f"{em:.3f}"] for name, metrics, em in rows])
  utility = summary["retrieval_utility"]
  lines += [""] + _markdown(["pretraining", "value"], [
      ("masked salient-span accuracy, null document only -> REALM (checkpoint "
       f"{step})", f"{summary['mlm_accuracy_null_only']:.3f} -> "
                   f"{summary['mlm_accuracy_realm']:.3f}"),
      ("retrieval utility, first -> chosen -> last checkpoint",
       f"{utility['first']:.3f} -> {utility['chosen']:.3f} -> {utility['last']:.3f}"),
      ("index refreshes picked up during pretraining", f"{summary['refreshes']:.0f}"),
      ("mean index staleness (steps)", f"{summary['mean_staleness_steps']:.1f}"),
      ("wall time", f"{wall_seconds / 60:.1f} min")])
  lines += ["", summary["verdict"], summary["span_redundancy"]["line"]]
  lines += [f"bert: {summary['bert']}"]
  lines += [f"{name}: {setting['value']:g} ({setting['why']})"
            for name, setting in summary["settings"].items()]
  return "\n".join(lines)


def _positive(kind: type):
  """An argparse type: a positive `kind` (int or float)."""
  def parse(text: str):
    value = kind(text)
    if value <= 0:
      raise argparse.ArgumentTypeError(f"{text}: expected a positive number")
    return value
  return parse


def _probability(text: str) -> float:
  value = float(text)
  if not 0 <= value <= 1:
    raise argparse.ArgumentTypeError(f"{text}: expected a probability in [0, 1]")
  return value


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """The recipe's flags, checked together (`--documents` and `--questions` go as a pair; the
  settings of your data need them)."""
  parser = argparse.ArgumentParser(prog=f"python -m realm_jax.{PROG}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--world", choices=("toy", "wiki"), default="toy",
                      help="what the recipe runs on: the embedded toy world (default), or the "
                           "wiki world, real English Wikipedia (the Vital Articles' leads and "
                           "questions about them, realm_jax.data.wiki; the `wiki` and "
                           "`entities` extras), with its English BERT; --documents and "
                           "--questions run it on your own data instead")
  parser.add_argument("--out", default=None,
                      help=f"output directory (default {DEFAULT_OUT}; with --world wiki "
                           f"{WIKI_OUT}; with --documents {OWN_OUT})")
  parser.add_argument("--fresh", action="store_true", help="delete --out first")
  parser.add_argument("--bert", "--toy_bert", dest="toy_bert", default="shipped",
                      help="the BERT every tower starts from: 'shipped' (default: the toy BERT "
                           "in realm_jax/data/assets/toy_bert, docs/toy_bert.md; with --world "
                           "wiki the English BERT in realm_jax/data/assets/wiki_bert, "
                           "docs/wiki_world.md), 'none' "
                           "(random weights of the toy model's shape) or a transformers BERT "
                           "directory (config.json, model.safetensors, and vocab.txt if any "
                           "must be BERT uncased's), whose config.json sizes every tower, e.g. "
                           "all-MiniLM-L6-v2; a BertModel without an MLM head gets a fresh one "
                           "(its decoder tied to the BERT's word embeddings). --toy_bert is the "
                           "same flag"),
  parser.add_argument("--ict_from", choices=("random", "bert"), default="random",
                      help="what ICT's towers start from: 'random' (default) weights, or the "
                           "--bert BERT as REALM's start from BERT. A toy-world deviation: "
                           "the toy BERT's hidden states keep too little of which name a "
                           "wordpiece sequence spells for ICT to learn the toy world's name "
                           "matching from them (docs/architecture.md)")
  own = parser.add_argument_group(
      "your own corpus and questions (instead of the toy world; docs/own_corpus.md)")
  own.add_argument("--documents",
                   help="the corpus, as `build_corpus --input` reads it: a JSONL file "
                        "({\"title\", \"text\"} per line, an optional \"id\" kept), a TFDS "
                        "name with title/text features (train split), or the REALM release's "
                        "retrieval-corpus TFRecords or ORQA's block files (--documents_format)")
  own.add_argument("--documents_format", choices=("jsonl", "tfds", "realm"), default="jsonl",
                   help="what --documents is (build_corpus --source; default %(default)s)")
  own.add_argument("--questions",
                   help="a directory with train, dev and test questions: <split>.jsonl in "
                        "ORQA's form ({\"question\", \"answer\": [...]} per line) or "
                        "<split>.csv/.tsv in DPR's (question, then a list literal of answers); "
                        "regex:DIR for regular-expression answers scored by CuratedTrec's regex "
                        "match. Fine-tuning trains on train and picks its checkpoint on dev; the "
                        "table reports test")
  own.add_argument("--max_block_len", type=_positive(int),
                   help="wordpieces per block with [CLS] title [SEP] body [SEP] (default: chosen "
                        "from the documents, the smallest multiple of 32 that holds 90%% of "
                        "them whole, within 64..288, REALM's; the line it prints says why)")
  own.add_argument("--ict_remove_probability", type=_probability,
                   help="the probability that ICT removes its query sentence from the block "
                        "(default: chosen from the BlockStore, ORQA's 0.9 or the highest tenth "
                        "below it at which one-sentence blocks, which ICT cannot use without "
                        "their sentence, stay within 10%% of the corpus; with --world wiki "
                        f"{WIKI_ICT_REMOVE_PROBABILITY:g}, the wiki world's)")
  own.add_argument("--min_answerable", type=_probability, default=DEFAULT_MIN_ANSWERABLE,
                   help="stop before anything trains when less than this share of a split's "
                        "questions has an answer anywhere in the corpus (default %(default)s: "
                        "a corpus and questions that do not belong together); the rest are "
                        "named and count as misses")
  steps = parser.add_argument_group(
      "run lengths and peak learning rates (default: the toy gins', made for the toy model; "
      "fewer steps try the pipeline in minutes, and a pretrained BERT of real size wants the "
      "smaller rates of its papers, e.g. ORQA's ICT 1e-4, REALM's pretraining 3e-5)")
  for child, what, default, rate in (("ict", "ICT", 400, 1e-3),
                                     ("pretrain", "REALM pretraining", DEFAULT_PRETRAIN_STEPS,
                                      3e-4),
                                     ("finetune", "each fine-tuning", 300, 3e-4)):
    steps.add_argument(f"--{child}_steps", type=_positive(int),
                       help=f"{what} steps (default {default}"
                            + (f"; with --world wiki {WIKI_STEPS[child]}" if child in WIKI_STEPS
                               else "") + "), with a checkpoint every "
                            f"1/{CHECKPOINTS_PER_RUN[child]} of them as the toy gin has it")
    steps.add_argument(f"--{child}_lr", type=_positive(float),
                       help=f"{what}'s peak learning rate (default {rate:g})")
  args = parser.parse_args(argv)
  if (args.documents is None) != (args.questions is None):
    parser.error("--documents and --questions go together: your corpus and its questions")
  if args.world == "wiki" and args.documents is not None:
    parser.error("--world wiki and --documents: the wiki world is a corpus and questions "
                 "already; give one or the other")
  own_data = args.documents is not None or args.world == "wiki"
  if not own_data:
    given = [flag for flag, value in (("--max_block_len", args.max_block_len),
                                      ("--ict_remove_probability", args.ict_remove_probability),
                                      ("--documents_format", args.documents_format != "jsonl"),
                                      ("--min_answerable",
                                       args.min_answerable != DEFAULT_MIN_ANSWERABLE))
             if value not in (None, False)]
    if given:
      parser.error(f"{', '.join(given)}: settings of your own corpus, which --documents and "
                   f"--questions (or --world wiki) give")
  try:
    args.bert = toy_bert_dir(args.toy_bert, args.world)
  except ValueError as e:
    parser.error(str(e))
  if args.world == "wiki":
    for child, steps in WIKI_STEPS.items():
      if getattr(args, f"{child}_steps") is None:
        setattr(args, f"{child}_steps", steps)
  args.out = args.out or (WIKI_OUT if args.world == "wiki" else
                          DEFAULT_OUT if args.documents is None else OWN_OUT)
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    parser.error(f"--out {args.out} is a file; give a directory (created if missing)")
  if args.documents is not None:
    # The children run from the repository root: files are named by absolute paths.
    if args.documents_format != "tfds":
      args.documents = os.path.abspath(args.documents)
    args.questions = absolute_questions(args.questions)
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  if args.fresh and os.path.exists(args.out):
    shutil.rmtree(args.out)
  # The gin files are addressed from the repository root, where the children run.
  os.chdir(gin_utils.REPO_ROOT)
  if larger_than_toy(args.bert) and ALLOCATOR_CHOICE not in os.environ:
    os.environ[ALLOCATOR_CHOICE] = "system"
    print(f"{PROG}: a BERT larger than the toy model: the children keep glibc's malloc "
          f"defaults ({ALLOCATOR_CHOICE}=system), not the launcher's toy-tuned settings",
          flush=True)
  bindings = {"warm_start_bindings": step_bindings("ict", args.ict_steps, args.ict_lr),
              "pretrain_bindings": step_bindings("pretrain", args.pretrain_steps,
                                                 args.pretrain_lr),
              "finetune_bindings": step_bindings("finetune", args.finetune_steps,
                                                 args.finetune_lr)}

  def run() -> int:
    start = time.monotonic()
    own_settings = dict(toy_bert=args.bert, ict_from_bert=args.ict_from == "bert",
                        max_block_len=args.max_block_len,
                        ict_remove_probability=args.ict_remove_probability,
                        min_answerable=args.min_answerable, **bindings)
    if args.world == "wiki":
      from realm_jax.data import wiki  # pylint: disable=g-import-not-at-top
      print(f"{PROG}: the wiki world (generated on first use from {wiki.PACKAGE}) ...",
            flush=True)
      recipe = WikiRecipe(args.out, world=wiki.world_dir(),
                          pretrain_steps=args.pretrain_steps,
                          **own_settings)
    elif args.documents is None:
      import realm_jax_tasks  # pylint: disable=g-import-not-at-top
      print(f"{PROG}: the toy world and its BlockStore (generated on first use) ...", flush=True)
      recipe = Recipe(args.out, realm_jax_tasks.toy_block_store_dir(), toy_bert=args.bert,
                      ict_from_bert=args.ict_from == "bert", **bindings)
    else:
      recipe = OwnDataRecipe(args.out, documents=args.documents, questions=args.questions,
                             documents_format=args.documents_format, **own_settings)
    summary = recipe.run()
    wall = time.monotonic() - start
    table = (format_own_table if isinstance(recipe, OwnDataRecipe) else format_table)(summary,
                                                                                      wall)
    summary["wall_seconds"] = wall
    with open(os.path.join(recipe.out, "summary.json"), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2)
    with open(os.path.join(recipe.out, "summary.md"), "w", encoding="utf-8") as f:
      f.write(table + "\n")
    print(f"\n{table}\n\n{PROG}: done; logs, checkpoints, indexes and predictions in "
          f"{recipe.out}")
    return 0

  # A stage that fails raises RuntimeError naming it and its log, bad input an InputError
  # naming the file: one line, no traceback.
  from realm_jax.data import wiki  # pylint: disable=g-import-not-at-top
  return gin_utils.run_command(PROG, run, interrupted="run the same command to resume",
                               expected=(RuntimeError, InputError, wiki.WikiDataError),
                               describe=gin_utils.one_line)


if __name__ == "__main__":
  gin_utils.exit_process(main(), PROG)
