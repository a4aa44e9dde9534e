r"""REALM's whole recipe on this machine, the project's main job: from a BERT to evaluated open-QA
systems, REALM beside the ORQA-style baseline, each stage an entry point run as a child process.

  python -m realm_jax.recipe [--out /tmp/realm_toy] [--fresh] [--bert shipped|none|DIR] [--dry_run]
  python -m realm_jax.recipe --world wiki ...                                (docs/wiki_world.md)
  python -m realm_jax.recipe --documents docs.jsonl --questions qa/ ...      (docs/own_corpus.md)
  python -m realm_jax.recipe --scale paper --out /mnt/realm/runs --block_store \
      /mnt/realm/data/wiki_blocks --bert /mnt/realm/bert-base-uncased --dry_run (paper_scale.md)

The stages are `realm_jax.pipeline.recipes`' (docs/architecture.md, "The recipe"); --dry_run
prints them and runs nothing. A stage whose outputs check out is skipped: run again to resume
(--fresh starts over). SIGINT or SIGTERM stops the stages (exit 130, 143). Logs in
`<out>/logs/`, the table also in `<out>/summary.md`. On a pod: `realm_jax_launch.tpu_pod run`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import Optional, Sequence

import realm_jax_launch.local as launcher
from realm_jax import gin_utils
from realm_jax.pipeline import recipes
from realm_jax.pipeline.bert import (bert_shape_bindings, describe_bert,  # noqa: F401
                                     larger_than_toy, toy_bert_dir)
from realm_jax.pipeline.data_checks import (  # noqa: F401
    DEFAULT_MIN_ANSWERABLE, ICT_MAX_SKIPPED, PROG, InputError, absolute_questions, check_answers,
    check_questions, choose_block_len, choose_ict_remove_probability, document_lengths,
    pretraining_verdict)
from realm_jax.pipeline.recipes import (  # noqa: F401
    CHECKPOINTS_PER_RUN, DEFAULT_FINETUNE_NAME, OWN_CORPUS, PAPER_TASKS,
    WIKI_ICT_REMOVE_PROBABILITY, WIKI_RETRIEVER_FROZEN_SHARE, WIKI_STEPS, qa_eval_name,
    read_scalars, step_bindings)
from realm_jax.pipeline.tables import format_own_table, format_paper_table, format_table
from realm_jax_launch.local import ALLOCATOR_CHOICE, child_env  # noqa: F401
from realm_jax_launch.local import Progress as _Progress  # noqa: F401

DEFAULT_OUT = "/tmp/realm_toy"
OWN_OUT = "/tmp/realm_own"
WIKI_OUT = "/tmp/realm_wiki"


def python_module(module: str, *args: str) -> list[str]:
  return [sys.executable, "-m", module, *args]


def run_child(cmd: Sequence[str], log_path: str) -> None:
  """Runs one child to completion: full output to `log_path`, progress lines to the console."""
  run_children([(cmd, log_path)])


def run_children(children: Sequence[tuple[Sequence[str], str]]) -> None:
  """Independent children side by side (`realm_jax_launch.local.run_children`)."""
  launcher.run_children(children, prog=PROG)


def _latest_step(run_dir: str) -> Optional[int]:
  from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.latest_checkpoint_step(run_dir)


def latest_checkpoint_dir(run_dir: str) -> str:
  """`<run_dir>/checkpoints/<newest step>`: the step directory a warm start or an index reads."""
  return os.path.join(run_dir, "checkpoints", str(_latest_step(run_dir)))


class _Runner(launcher.LocalRunner):
  """The local runner, its children through this module's `run_child` and `run_children`
  (looked up at each call: the benches' tests replace them)."""

  def run_child(self, cmd: Sequence[str], log_path: str) -> None:
    run_child(cmd, log_path)

  def run_children(self, children: Sequence[tuple[Sequence[str], str]]) -> None:
    run_children(children)


_RUNNER = _Runner(PROG)


class Recipe(recipes.Recipe):
  """`recipes.Recipe` (the toy world) on this machine; the classes below derive from it, as
  their pipeline classes do from theirs."""
  runner = _RUNNER


class OwnDataRecipe(recipes.OwnDataRecipe, Recipe):
  """`recipes.OwnDataRecipe` (your corpus and questions) on this machine."""


class WikiRecipe(recipes.WikiRecipe, OwnDataRecipe):
  """`recipes.WikiRecipe` (the wiki world) on this machine."""


class PaperRecipe(recipes.PaperRecipe, Recipe):
  """`recipes.PaperRecipe` (paper scale) on this machine; a pod runs its plan with
  `realm_jax_launch.tpu_pod run`."""


def _number(kind: type, least: float = 0.0, most: Optional[float] = None):
  """An argparse type: a `kind` (int or float) above `least`, or in [least, most]."""
  def parse(text: str):
    value = kind(text)
    if not (least < value if most is None else least <= value <= most):
      raise argparse.ArgumentTypeError(f"{text}: expected " + (
          "a positive number" if most is None else f"a probability in [{least:g}, {most:g}]"))
    return value
  return parse


_PROBABILITY = _number(float, 0.0, 1.0)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """The recipe's flags, checked together (`--documents` and `--questions` go as a pair; the
  settings of your data need them; paper scale needs its shared paths)."""
  parser = argparse.ArgumentParser(prog=f"python -m realm_jax.{PROG}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  add = parser.add_argument
  add("--world", choices=("toy", "wiki"), default="toy", help="the embedded toy world "
      "(default) or the wiki world: Wikipedia's Vital Articles and questions about them")
  add("--scale", choices=("toy", "paper"), default="toy", help="'paper': the wiki_*/nq_finetune "
      "gins' settings on --block_store and a BERT-base --bert, paths every host sees")
  add("--out", help=f"output directory (default {DEFAULT_OUT}; --world wiki: {WIKI_OUT}; "
      f"--documents: {OWN_OUT}; required with --scale paper)")
  add("--fresh", action="store_true", help="delete --out first")
  add("--dry_run", action="store_true", help="print the plan: every stage, what it reads and "
      "writes, its commands; run nothing")
  add("--bert", "--toy_bert", dest="toy_bert", default="shipped", help="the BERT every tower "
      "starts from: 'shipped' (the world's, docs/toy_bert.md), 'none' (random weights) or a "
      "transformers BERT directory, whose config.json sizes every tower")
  add("--ict_from", choices=("random", "bert"), default="random", help="ICT's towers from "
      "random weights (default: a toy-world deviation, docs/architecture.md) or the BERT")
  paper = parser.add_argument_group("paper scale (--scale paper, docs/paper_scale.md)")
  paper.add_argument("--block_store", help="the Wikipedia BlockStore (realm_jax.build_corpus)")
  paper.add_argument("--task", choices=tuple(PAPER_TASKS), default="nq", help="the benchmark")
  paper.add_argument("--hosts", type=_number(int), default=1, help="hosts that train: "
                     "BATCH_SIZE is the gins' global batch over them (default 1)")
  own = parser.add_argument_group("your own corpus and questions (docs/own_corpus.md)")
  own.add_argument("--documents", help="the corpus as `build_corpus --input` reads it (JSONL "
                   "{\"title\", \"text\"} per line, a TFDS name, REALM's TFRecords)")
  own.add_argument("--documents_format", choices=("jsonl", "tfds", "realm"), default="jsonl")
  own.add_argument("--questions", help="train, dev and test questions: <split>.jsonl (ORQA's) "
                   "or .csv/.tsv (DPR's); regex:DIR for regex answers")
  own.add_argument("--max_block_len", type=_number(int),
                   help="wordpieces per block (default: chosen from the documents)")
  own.add_argument("--ict_remove_probability", type=_PROBABILITY, help="ICT's (default: chosen "
                   f"from the BlockStore; --world wiki: {WIKI_ICT_REMOVE_PROBABILITY:g})")
  own.add_argument("--min_answerable", type=_PROBABILITY, default=DEFAULT_MIN_ANSWERABLE,
                   help="the least share of a split's questions answerable in the corpus")
  steps = parser.add_argument_group("run lengths and peak learning rates (default: the gins')")
  for child, what in (("ict", "ICT"), ("pretrain", "pretraining"), ("finetune", "fine-tuning")):
    steps.add_argument(f"--{child}_steps", type=_number(int), help=f"{what} steps, a "
                       f"checkpoint every 1/{CHECKPOINTS_PER_RUN[child]} of them"
                       + (f" (--world wiki: {WIKI_STEPS[child]})" if child in WIKI_STEPS else ""))
    steps.add_argument(f"--{child}_lr", type=_number(float), help=f"{what}'s peak rate")
  args = parser.parse_args(argv)
  given = [f"--{flag}" for flag in ("max_block_len", "ict_remove_probability")
           if getattr(args, flag) is not None]
  given += ["--documents_format"] * (args.documents_format != "jsonl")
  given += ["--min_answerable"] * (args.min_answerable != DEFAULT_MIN_ANSWERABLE)
  if args.scale == "paper":
    given += [f"--{flag}" for flag in ("documents", "ict_steps", "pretrain_steps",
                                       "finetune_steps", "ict_lr", "pretrain_lr", "finetune_lr")
              if getattr(args, flag) is not None]
    given += [f"--bert {args.toy_bert}"] * (args.toy_bert in ("shipped", "none"))
    if given or args.world != "toy" or not (args.out and args.block_store):
      parser.error("--scale paper takes --out, --block_store, a --bert directory, --task and "
                   "--hosts (the gins' settings)" + (f", not {', '.join(given)}" * bool(given)))
    args.bert = args.toy_bert
    return args
  if (args.documents is None) != (args.questions is None):
    parser.error("--documents and --questions go together: your corpus and its questions")
  if args.world == "wiki" and args.documents is not None:
    parser.error("--world wiki and --documents: the wiki world is a corpus and questions "
                 "already; give one or the other")
  if given and args.documents is None and args.world != "wiki":
    parser.error(f"{', '.join(given)}: settings of your own corpus, which --documents and "
                 f"--questions (or --world wiki) give")
  try:
    args.bert = toy_bert_dir(args.toy_bert, args.world)
  except ValueError as e:
    parser.error(str(e))
  for child, steps in (WIKI_STEPS.items() if args.world == "wiki" else ()):
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


def make_recipe(args: argparse.Namespace) -> recipes.Recipe:
  """The recipe the flags ask for (`--dry_run`: a plan only, nothing made)."""
  made = {"make_dirs": not args.dry_run}
  if args.scale == "paper":
    return PaperRecipe(args.out, block_store=args.block_store, bert=args.bert, task=args.task,
                       hosts=args.hosts, **made)
  steps = {f"{child}_bindings": step_bindings(child, getattr(args, f"{child}_steps"),
                                              getattr(args, f"{child}_lr"))
           for child in ("ict", "pretrain", "finetune")}
  steps["warm_start_bindings"] = steps.pop("ict_bindings")
  common = dict(toy_bert=args.bert, ict_from_bert=args.ict_from == "bert", **steps, **made)
  own = dict(max_block_len=args.max_block_len, min_answerable=args.min_answerable,
             ict_remove_probability=args.ict_remove_probability, **common)
  if args.world == "wiki":
    from realm_jax.data import wiki  # pylint: disable=g-import-not-at-top
    print(f"{PROG}: the wiki world (generated on first use from {wiki.PACKAGE}) ...", flush=True)
    return WikiRecipe(args.out, world=wiki.world_dir(), pretrain_steps=args.pretrain_steps, **own)
  if args.documents is not None:
    return OwnDataRecipe(args.out, documents=args.documents, questions=args.questions,
                         documents_format=args.documents_format, **own)
  import realm_jax_tasks  # pylint: disable=g-import-not-at-top
  print(f"{PROG}: the toy world and its BlockStore (generated on first use) ...", flush=True)
  return Recipe(args.out, realm_jax_tasks.toy_block_store_dir(), **common)


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  if args.fresh and not args.dry_run and os.path.exists(args.out):
    shutil.rmtree(args.out)
  # The gin files are addressed from the repository root, where the children run.
  os.chdir(gin_utils.REPO_ROOT)
  large = args.scale == "paper" or larger_than_toy(args.bert)
  if not args.dry_run and large and ALLOCATOR_CHOICE not in os.environ:
    os.environ[ALLOCATOR_CHOICE] = "system"
    print(f"{PROG}: a BERT larger than the toy model: the children keep glibc's malloc "
          f"defaults ({ALLOCATOR_CHOICE}=system), not the launcher's toy-tuned settings")

  def run() -> int:
    start = time.monotonic()
    recipe = make_recipe(args)
    if args.dry_run:
      print(f"{PROG}: the plan (a stage whose outputs exist is skipped; {{latest_checkpoint:"
            f"DIR}} and the like are read when the stage starts)\n{recipe.describe_plan()}")
      return 0
    summary = recipe.run()
    wall = time.monotonic() - start
    table = (format_paper_table if isinstance(recipe, recipes.PaperRecipe) else format_own_table
             if isinstance(recipe, recipes.OwnDataRecipe) else format_table)(summary, wall)
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
