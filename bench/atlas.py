r"""Atlas on the toy world: REALM's extractive reader, the Fusion-in-Decoder reader under each of
Atlas's retriever objectives, after Atlas's pretext and closed-book, few-shot and full, paired by
seed; and the ICT warm start against the Contriever-style one.

  python bench/atlas.py [--out /tmp/atlas_bench] [--seeds 0 1 2] [--only ROW ...]
      [--sizes 64 256 all] [--write] [--kept_only] [--cells bench/results/atlas]
  python bench/atlas.py --world wiki [--seeds 0 1 2] [--write]

The wiki world (`--world wiki`): REALM's extractive reader, the FiD reader with retrieval and
the same reader closed-book, on all of the wiki world's questions, from the seed's REALM
pretraining of the wiki recipe (bench/wiki_runs.py: the compute curve's 1x run), the toy FiD gins
pointed at its questions and BlockStore; cells in bench/results/atlas_wiki/, section "Atlas on
the wiki world". The rest of this docstring describes the toy world.

Rows (every one a fine-tuning of the seed's REALM pretraining, the checkpoint REALM's own row
fine-tunes, read against the frozen index built from it):

  extractive   REALM's extractive span reader: the recipe's fine-tuning (`realm_jax.recipe.Recipe`,
               experiments/toy_finetune.gin); on all questions it is made as bench/ablations.py
               makes its REALM row
  fid          the FiD reader, query tower frozen (`retriever_objective` 'none'):
               experiments/toy_finetune_fid.gin
  fid_again    the same fine-tuned again with fine-tuning seed s + 1000 (the same few-shot
               sample): the fine-tuning noise every difference between rows is read against
  adist, emdr2, pdist, loop
               the FiD reader with the query tower trained by that Atlas objective against the
               frozen index: experiments/atlas_toy_finetune.gin with
               --gin.FinetuneJob.retriever_objective='<objective>'
  adist_lr_0.1, emdr2_lr_0.1, pdist_lr_0.1, loop_lr_0.1
               the same with the question tower at a tenth of the reader's learning rate
               (--gin.FinetuneJob.retriever_lr_scale=0.1)
  pretext      the FiD reader and the query tower warm-started from Atlas's MLM pretext
               (experiments/atlas_toy_pretext.gin, ADist, one run per seed from the REALM
               pretraining checkpoint, its checkpoint picked on the pretext's dev EM), then
               fine-tuned exactly as the `fid` row (toy_finetune_fid.gin), so that
               "pretext minus fid" is the pretext's effect alone
  pretext_reader
               the same, after a pretext that leaves the query tower alone
               (`retriever_objective` 'none', its learning rate 0): the pretext's effect on the
               reader alone, apart from what ADist does to the query tower
  closed_book  the FiD reader with no retrieval: experiments/atlas_toy_closed_book.gin
  contriever   (the second table) the toy recipe from the Contriever-style warm start
               (experiments/contriever_toy.gin in place of toy_ict.gin): its own REALM
               pretraining and extractive fine-tuning on all questions, beside the REALM row
               of the same seed, whose warm start is ICT

Columns: toy QA test EM after fine-tuning on 64, 256 and all 2,000 training questions
(`--gin.FinetuneJob.few_shot=N`, drawn with `FinetuneJob.few_shot_seed` = the seed: every row
of a seed trains on the same sample, and each seed on its own); zero-shot recall@5 of the
retriever the row reads with, before fine-tuning (the REALM pretraining index's for every row
but the pretext's, whose question tower the pretext trained: its checkpoint evaluated on toy QA
test with `python -m realm_jax.evaluate` before any question is trained on; none for the closed
book); test recall@5 after fine-tuning on all questions (the question tower each objective
trained, against the same frozen index); and the retrieval-utility analogue of Atlas's
objectives: `train/retriever_agreement`, which FinetuneJob logs for the FiD reader with an
objective (the share of answered training questions whose retriever's top block is the
objective's target's top block: the decoder's attention for ADist, the best single-passage
likelihood for EMDR² and PDist, the passage whose removal hurts most for LOOP), averaged over
the last 100 steps of the all-questions run; undefined for the rows that train no question
tower.

Paired seeds. Every row of a seed starts from the seed's shared ICT (`<out>/seed<s>/shared/ict`)
and its one REALM pretraining (`<out>/seed<s>/realm/pretrain`, made by the extractive row's
recipe, as bench/ablations.py makes REALM's), and every stage runs with `train_main.seed` = the
seed. Fine-tuning picks its checkpoint on toy QA dev EM (best.json); every figure is measured
on toy QA test, which nothing was selected on. Comparisons: row A minus row B seed by seed,
mean ± standard error and the per-seed differences, through bench/ablations.py's helpers.

Cells. Each finished (row, size, seed) is kept in bench/results/atlas/seed<s>_<row>_<size>.json
with its commit, date and a fingerprint of the options and of what the gins its row reads
configure: the recipe's gins for the extractive and Contriever rows (so an edit of a FiD gin
keeps them, and the seed's shared runs), all of this bench's gins for the others (`fingerprints`).
A later run reuses the cells whose fingerprint matches, and, as bench/ablations.py does, those
of the REALM pretraining in `--out` alone (the cell "extractive_all" made it; a cell of another
pretraining is made again); `--kept_only` makes nothing and reads the kept cells alone
(`kept_results`). `--write` puts the tables, the comparisons and a reading into the
section "Atlas on the toy world" of bench/docs/benchmarks.md. Every run's command is printed
(`atlas: $ ...`), with the recipe's stage lines.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import wiki_runs  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import recipe as recipe_lib  # noqa: E402  pylint: disable=wrong-import-position

PROG = "atlas"
SECTION = "Atlas on the toy world"
# The sections of the two benches that look closer at this one's runs (bench/fid_copying.py,
# bench/atlas_controls.py): named here, which they import, so that the caveat can point to them.
COPYING_SECTION = "Where the Atlas bench's answers come from (toy world)"
CONTROLS_SECTION = "Atlas's objectives against the frozen index: controls"
DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "atlas")
DEFAULT_OUT = "/tmp/atlas_bench"
DEFAULT_SEEDS = (0, 1, 2)
ALL = "all"
DEFAULT_SIZES = ("64", "256", ALL)
EVAL_SPLIT = ablations.EVAL_SPLIT
# 1: the first cells.
CELL_FORMAT = 1
# The retriever agreement of a run: the mean of its logged values over its last this many steps.
AGREEMENT_WINDOW = 100

EXPERIMENTS = "gin_configs/experiments"
FINETUNE_GIN = f"{EXPERIMENTS}/toy_finetune.gin"
FID_GIN = f"{EXPERIMENTS}/toy_finetune_fid.gin"
ATLAS_GIN = f"{EXPERIMENTS}/atlas_toy_finetune.gin"
PRETEXT_GIN = f"{EXPERIMENTS}/atlas_toy_pretext.gin"
CLOSED_BOOK_GIN = f"{EXPERIMENTS}/atlas_toy_closed_book.gin"
CONTRIEVER_GIN = f"{EXPERIMENTS}/contriever_toy.gin"
EVAL_GIN = f"{EXPERIMENTS}/toy_eval.gin"
BUILD_INDEX_GIN = "gin_configs/runs/build_index.gin"
# Every gin the recipe's stages run (ICT, pretraining, the index builder, fine-tuning,
# evaluation): all that the extractive and Contriever rows and the seed's shared runs read. What
# they include counts through them.
RECIPE_GINS = (f"{EXPERIMENTS}/toy_ict.gin", f"{EXPERIMENTS}/toy_pretrain.gin", FINETUNE_GIN,
               EVAL_GIN, CONTRIEVER_GIN, "gin_configs/runs/ict.gin",
               "gin_configs/runs/pretrain.gin", "gin_configs/runs/finetune.gin",
               "gin_configs/runs/eval.gin", BUILD_INDEX_GIN)
# Every gin a cell's stages run: the recipe's and the FiD rows' own.
FINGERPRINT_GINS = (*RECIPE_GINS, FID_GIN, f"{EXPERIMENTS}/atlas_*.gin")
# The rows made by the recipe alone, whose cells a FiD gin leaves kept.
RECIPE_READERS = ("extractive", "contriever")


class Row(NamedTuple):
  """One row. reader: 'extractive' (the recipe's fine-tuning), 'fid', 'closed_book' or
  'contriever' (the second table: a whole recipe from the Contriever-style warm start); gin: the
  fine-tuning gin (FiD rows); objective: the FiD reader's `retriever_objective` binding (None:
  the gin's); warm_start: what the fine-tuning starts from, 'pretraining' (the seed's REALM
  pretraining checkpoint) or a `PRETEXTS` entry (the seed's Atlas pretext checkpoint);
  bindings: more gin bindings of the fine-tuning (bench/atlas_controls.py's rows);
  finetune_seed_offset: added to the seed of the fine-tuning alone (its few-shot sample keeps
  the seed's): the fine-tuning noise row."""
  name: str
  label: str
  reader: str
  gin: Optional[str] = None
  objective: Optional[str] = None
  warm_start: str = "pretraining"
  bindings: tuple[str, ...] = ()
  finetune_seed_offset: int = 0


OBJECTIVES = ("adist", "emdr2", "pdist", "loop")
OBJECTIVE_NAMES = {"adist": "ADist (attention distillation)", "emdr2": "EMDR²",
                   "pdist": "PDist (perplexity distillation)", "loop": "LOOP (leave-one-out)"}
# The objectives again with the question tower at a tenth of the reader's learning rate: the
# gin's 5e-4 is what the fresh toy decoder needs, 12 times Atlas's 4e-5 (which Atlas's
# fine-tuning scripts use for both), and at it a target right by construction loses retrieval
# too (bench/atlas_controls.py).
SLOW = "FinetuneJob.retriever_lr_scale=0.1"
SLOW_OBJECTIVES = {f"{o}_lr_0.1": o for o in OBJECTIVES}
ROWS = (
    Row("extractive", "REALM's extractive reader", "extractive", FINETUNE_GIN),
    Row("fid", "FiD reader, query tower frozen ('none')", "fid", FID_GIN),
    # The noise that every difference between rows is read against: two fine-tunings of one
    # pretraining on one few-shot sample.
    Row("fid_again", f"FiD reader, query tower frozen, fine-tuned again (fine-tuning seed + "
        f"{ablations.REFIT_SEED_OFFSET})", "fid", FID_GIN,
        finetune_seed_offset=ablations.REFIT_SEED_OFFSET),
    *(Row(o, f"FiD reader + {OBJECTIVE_NAMES[o]}", "fid", ATLAS_GIN, o) for o in OBJECTIVES),
    *(Row(name, f"FiD reader + {OBJECTIVE_NAMES[o]}, question tower at lr x 0.1", "fid",
          ATLAS_GIN, o, bindings=(SLOW,)) for name, o in SLOW_OBJECTIVES.items()),
    Row("pretext", "FiD reader after Atlas's pretext (ADist), query tower frozen", "fid",
        FID_GIN, warm_start="pretext"),
    Row("pretext_reader", "FiD reader after a pretext with its query tower frozen", "fid",
        FID_GIN, warm_start="pretext_frozen"),
    Row("closed_book", "FiD reader, closed book (no retrieval)", "closed_book", CLOSED_BOOK_GIN),
    Row("contriever", "Contriever-style warm start", "contriever"),
)
ROW_BY_NAME = {row.name: row for row in ROWS}
# Atlas's pretext, one run per seed and kind: its directory under the seed's REALM runs, its
# bindings beside atlas_toy_pretext.gin and what its stage lines add. "pretext_frozen" trains
# the reader alone (no objective and no learning rate for the query tower, which AdamW's
# weight decay would otherwise move).
PRETEXTS = {"pretext": ("atlas_pretext", ()),
            "pretext_frozen": ("atlas_pretext_frozen",
                               ("FinetuneJob.retriever_objective='none'",
                                "FinetuneJob.retriever_lr_scale=0.0"), ", query tower frozen")}
MAIN_ROWS = tuple(row.name for row in ROWS if row.reader != "contriever")
# The fine-tuning noise row: read as noise, not as a method (`reading`).
NOISE_ROW = "fid_again"
BASE_ROW = "extractive"
# The cell that makes the seed's REALM pretraining (the recipe's REALM row); every other cell of
# the main table fine-tunes that pretraining.
BASE_CELL = f"{BASE_ROW}_{ALL}"

EM = "qa_em"
RECALL = "recall@5_zero_shot"
RECALL_TUNED = "recall@5_finetuned"
AGREEMENT = "retriever_agreement"
WARM_RECALL = "recall@5_warm_start"
PRETRAINED_RECALL = "recall@5_pretrained"


def em_key(size: str) -> str:
  return f"{EM}@{size}"


def size_title(size: str) -> str:
  return "all questions" if size == ALL else f"{size} questions"


COLUMN_TITLES = {RECALL: "zero-shot recall@5 (test)",
                 RECALL_TUNED: "test recall@5 after fine-tuning (all questions)",
                 AGREEMENT: f"retriever agreement (last {AGREEMENT_WINDOW} steps, all questions)",
                 WARM_RECALL: "zero-shot recall@5 of the warm start (test)",
                 PRETRAINED_RECALL: "recall@5 after REALM pretraining (test)"}


def column_title(key: str) -> str:
  if key.startswith(f"{EM}@"):
    return f"toy QA test EM, {size_title(key.split('@', 1)[1])}"
  return COLUMN_TITLES[key]


# ---------------------------------------------------------------------------- the plan


def parse_size(text: str) -> str:
  """A --sizes entry: 'all' or a positive number of training questions (as written, '64')."""
  if text == ALL:
    return ALL
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: expected 'all' or a positive number of "
                                     f"training questions")
  return str(value)


def sorted_sizes(sizes: Sequence[str]) -> tuple[str, ...]:
  """Distinct sizes, smallest first, 'all' last."""
  return tuple(sorted(set(sizes), key=lambda s: (s == ALL, 0 if s == ALL else int(s))))


def cell_name(row: str, size: str) -> str:
  return f"{row}_{size}"


def plan(rows: Sequence[str], sizes: Sequence[str], seeds: Sequence[int]
         ) -> list[tuple[int, str, str]]:
  """(seed, row, size) of every cell to have, in the order they are made: seed by seed, the
  REALM pretraining's cell first (`BASE_CELL`: every other row fine-tunes that pretraining, and
  the warm-start table pairs Contriever with it), then the rows in the table's order, each at
  every size. `rows`: the rows asked for (empty: all); the Contriever row has one size, all
  questions."""
  wanted = [row.name for row in ROWS if not rows or row.name in rows]
  sizes = sorted_sizes(sizes)
  cells = []
  for seed in seeds:
    cells.append((seed, BASE_ROW, ALL))
    for name in wanted:
      for size in ((ALL,) if ROW_BY_NAME[name].reader == "contriever" else sizes):
        if (name, size) != (BASE_ROW, ALL):
          cells.append((seed, name, size))
  return cells


# ---------------------------------------------------------------------------- the commands


def _gin(*bindings: str) -> list[str]:
  return [f"--gin.{b}" for b in bindings]


def index_command(run_dir: str, checkpoint: str, store: str) -> list[str]:
  """The frozen index of `checkpoint` as `run_dir`'s index 0 (`build_index --once`)."""
  return recipe_lib.python_module(
      "realm_jax.build_index", f"--gin_file={BUILD_INDEX_GIN}", "--once",
      *_gin(f"RUN_DIR='{run_dir}'", f"BLOCK_STORE='{store}'",
            f"build_index_main.checkpoint_dir='{checkpoint}'"))


def steps_bindings(steps: Optional[int]) -> list[str]:
  return [] if steps is None else [f"NUM_STEPS={steps}"]


def few_shot_bindings(size: str, seed: int) -> list[str]:
  """Atlas's few-shot sample: `size` training questions drawn with the seed (none for all)."""
  if size == ALL:
    return []
  return [f"FinetuneJob.few_shot={int(size)}", f"FinetuneJob.few_shot_seed={seed}"]


def finetune_command(row: Row, size: str, seed: int, run_dir: str, init_checkpoint: str,
                     finetune_steps: Optional[int] = None) -> list[str]:
  """A FiD or closed-book row's fine-tuning (`python -m realm_jax.train` of the row's gin)."""
  objective = ([f"FinetuneJob.retriever_objective='{row.objective}'"] if row.objective
               else [])
  return recipe_lib.python_module(
      "realm_jax.train", f"--gin_file={row.gin}",
      *_gin(f"RUN_DIR='{run_dir}'", f"INIT_CHECKPOINT='{init_checkpoint}'",
            f"train_main.seed={seed + row.finetune_seed_offset}", *objective, *row.bindings,
            *few_shot_bindings(size, seed),
            *steps_bindings(finetune_steps)))


def evaluate_command(run_dir: str, output: str, *, closed_book: bool = False) -> list[str]:
  """Toy QA test EM (and recall@k) of the checkpoint dev picked (best.json): predictions to
  `output`, metrics beside it (`.metrics.json`)."""
  return recipe_lib.python_module(
      "realm_jax.evaluate", f"--gin_file={EVAL_GIN}",
      *_gin(f"RUN_DIR='{run_dir}'", f"evaluate_main.split='{EVAL_SPLIT}'",
            f"evaluate_main.output='{output}'",
            *(["evaluate_main.candidates='none'"] if closed_book else [])))


def pretext_command(run_dir: str, init_checkpoint: str, seed: int,
                    pretext_steps: Optional[int] = None, kind: str = "pretext") -> list[str]:
  """Atlas's MLM pretext (`PRETEXTS[kind]`) from the REALM pretraining checkpoint."""
  return recipe_lib.python_module(
      "realm_jax.train", f"--gin_file={PRETEXT_GIN}",
      *_gin(f"RUN_DIR='{run_dir}'", f"INIT_CHECKPOINT='{init_checkpoint}'",
            f"train_main.seed={seed}", *PRETEXTS[kind][1], *steps_bindings(pretext_steps)))


def metrics_path(output: str) -> str:
  """Where `python -m realm_jax.evaluate` writes the metrics of predictions `output`."""
  return output.replace(".jsonl", ".metrics.json")


class Layout(NamedTuple):
  """Where one seed's runs live under `--out`."""
  seed_out: str

  @property
  def shared(self) -> str:  # the seed's ICT warm start (`Recipe` out: shared/ict)
    return os.path.join(self.seed_out, "shared")

  @property
  def realm(self) -> str:  # the REALM recipe: pretrain/, the extractive fine-tunings, eval/
    return os.path.join(self.seed_out, "realm")

  @property
  def contriever(self) -> str:  # the recipe from the Contriever-style warm start
    return os.path.join(self.seed_out, "contriever")

  def pretext(self, kind: str = "pretext") -> str:
    return os.path.join(self.realm, PRETEXTS[kind][0])

  def run_dir(self, row: str, size: str) -> str:
    return os.path.join(self.realm, cell_name(row, size))

  # The evaluations live in their run's directory: a run made again (`ablations.claim_runs_dir`)
  # takes its old evaluation with it.
  def eval_output(self, row: str, size: str) -> str:
    name = cell_name(row, size)
    return os.path.join(self.run_dir(row, size), "eval", f"{name}_{EVAL_SPLIT}.jsonl")

  def pretext_eval_output(self, kind: str = "pretext") -> str:
    name = PRETEXTS[kind][0]
    return os.path.join(self.pretext(kind), "eval", f"{name}_zero_shot_{EVAL_SPLIT}.jsonl")


def cell_commands(row: Row, size: str, seed: int, layout: Layout, store: str, *,
                  pretraining_checkpoint: str, init_checkpoint: str,
                  finetune_steps: Optional[int] = None) -> list[tuple[str, list[str]]]:
  """(stage, command) of a FiD or closed-book cell, in order: the frozen index of the REALM
  pretraining checkpoint (not for the closed book), the fine-tuning from `init_checkpoint`
  (the pretraining checkpoint, or the pretext's for the pretext row), the evaluation on test."""
  if row.reader not in ("fid", "closed_book"):
    raise ValueError(f"cell_commands: row {row.name!r} runs through the recipe")
  run_dir = layout.run_dir(row.name, size)
  closed = row.reader == "closed_book"
  commands = []
  if not closed:
    commands.append(("frozen index", index_command(run_dir, pretraining_checkpoint, store)))
  commands.append(("fine-tuning", finetune_command(row, size, seed, run_dir, init_checkpoint,
                                                   finetune_steps)))
  commands.append(("evaluation", evaluate_command(
      run_dir, layout.eval_output(row.name, size), closed_book=closed)))
  return commands


def pretext_commands(layout: Layout, store: str, seed: int, *, pretraining_checkpoint: str,
                     pretext_steps: Optional[int] = None, kind: str = "pretext"
                     ) -> list[tuple[str, list[str]]]:
  """(stage, command) of the seed's Atlas pretext of `kind`: its frozen index (the pretraining
  checkpoint's) and its run. Its zero-shot evaluation is `evaluate_command(layout.pretext(kind),
  layout.pretext_eval_output(kind))`."""
  run_dir = layout.pretext(kind)
  return [("frozen index", index_command(run_dir, pretraining_checkpoint, store)),
          ("pretext", pretext_command(run_dir, pretraining_checkpoint, seed, pretext_steps,
                                      kind))]


def recipe_kwargs(row: Row, size: str, seed: int, *, pretrain_steps: Optional[int] = None,
                  finetune_steps: Optional[int] = None) -> dict:
  """The `Recipe` keyword arguments of an extractive or Contriever cell (besides the out, the
  store, the toy BERT and the ICT): every stage with the seed, the fine-tuning with the few-shot
  sample; the extractive row at all questions is the recipe's own REALM fine-tuning
  ("finetune"), the others each a fine-tuning of its own name beside it."""
  seed_binding = f"train_main.seed={seed}"
  kwargs = {"eval_split": EVAL_SPLIT, "baseline": False,
            "pretrain_bindings": [*steps_bindings(pretrain_steps), seed_binding],
            "finetune_bindings": [*steps_bindings(finetune_steps), seed_binding,
                                  *few_shot_bindings(size, seed)]}
  if row.reader == "contriever":
    kwargs.update(warm_start_gin=CONTRIEVER_GIN, warm_start_bindings=[seed_binding])
  elif row.reader == "extractive":
    if size != ALL:
      kwargs["finetune_name"] = cell_name(row.name, size)
  else:
    raise ValueError(f"recipe_kwargs: row {row.name!r} is not run by the recipe")
  return kwargs


# ---------------------------------------------------------------------------- cells


def cell_options(*, toy_bert_sha256: Optional[str], ict_from_bert: bool,
                 pretrain_steps: Optional[int], finetune_steps: Optional[int],
                 pretext_steps: Optional[int]) -> dict:
  """What this bench's cells are fingerprinted with besides the gins."""
  return {"bench": "atlas", "cell_format": CELL_FORMAT, "toy_bert_sha256": toy_bert_sha256,
          "ict_from_bert": ict_from_bert, "pretrain_steps": pretrain_steps,
          "finetune_steps": finetune_steps, "pretext_steps": pretext_steps,
          "few_shot_seed": "the seed", "agreement_window": AGREEMENT_WINDOW,
          **ablations.world_options()}


def fingerprint(options: dict, gins: Sequence[str] = FINGERPRINT_GINS) -> str:
  """ablations.fingerprint over `gins` (this bench's: `FINGERPRINT_GINS`) and `options`."""
  return ablations.fingerprint(options, gins=gins, excluded=())


def fingerprints(options: dict) -> dict[str, str]:
  """{"recipe": the fingerprint of the recipe's rows (`RECIPE_READERS`) and of the seed's
  shared runs, over `RECIPE_GINS`; "fid": that of every other row, over all the gins}."""
  return {"recipe": fingerprint(options, RECIPE_GINS), "fid": fingerprint(options)}


def settings_fingerprints(settings: Settings) -> dict[str, str]:
  """`fingerprints` of the cells made with `settings` (their `cell_options`)."""
  return fingerprints(cell_options(
      toy_bert_sha256=_toy_bert_sha256(settings.toy_bert), ict_from_bert=settings.ict_from_bert,
      pretrain_steps=settings.pretrain_steps, finetune_steps=settings.finetune_steps,
      pretext_steps=settings.pretext_steps))


def row_fingerprint(row: str, prints: Mapping[str, str]) -> str:
  """The fingerprint of `row`'s cells among `fingerprints`."""
  return prints["recipe" if ROW_BY_NAME[row].reader in RECIPE_READERS else "fid"]


def cell_path(cells: str, seed: int, row: str, size: str) -> str:
  return os.path.join(cells, f"seed{seed}_{cell_name(row, size)}.json")


def last_window_mean(values: Mapping[int, float], window: int = AGREEMENT_WINDOW
                     ) -> Optional[float]:
  """The mean of a logged scalar over its last `window` steps ({step: value}: the values logged
  at steps > last step - window); None when nothing was logged."""
  if not values:
    return None
  last = max(values)
  chosen = [v for step, v in values.items() if step > last - window]
  return float(np.mean(chosen))


def retriever_agreement(run_dir: str) -> Optional[float]:
  """`train/retriever_agreement` of a FiD run (`last_window_mean`); None when it logged none
  (no objective trains its question tower)."""
  scalars = recipe_lib.read_scalars(os.path.join(run_dir, "tensorboard"))
  return last_window_mean(scalars.get("train/retriever_agreement", {}))


def _metrics(path: str) -> dict:
  """The "metrics" of an evaluation's metrics JSON."""
  with open(path, encoding="utf-8") as f:
    return json.load(f)["metrics"]


def _recall5(metrics: Mapping[str, Any]) -> Optional[float]:
  value = metrics.get("recall@5")
  return None if value is None else float(value)


# ---------------------------------------------------------------------------- runs


def shell_command(cmd: Sequence[str]) -> str:
  """`cmd` as one shell line, gin bindings written as the gins' headers write them
  (`--gin.RUN_DIR="'/runs/x'"`, not shlex's `'--gin.RUN_DIR='"'"'/runs/x'"'"''`)."""
  def word(arg: str) -> str:
    quoted = shlex.quote(arg)
    if quoted == arg or "'" not in arg or any(c in arg for c in '"$`\\!'):
      return quoted
    return f'"{arg}"' if "=" not in arg else arg.split("=", 1)[0] + f'="{arg.split("=", 1)[1]}"'
  return " ".join(word(arg) for arg in cmd)


class Settings(NamedTuple):
  """What every cell of a run shares."""
  store: str
  toy_bert: Optional[str] = None
  ict_from_bert: bool = False
  pretrain_steps: Optional[int] = None
  finetune_steps: Optional[int] = None
  pretext_steps: Optional[int] = None
  # The FiD rows' fingerprint (`fingerprints`), recorded on each of their runs: one made for
  # other FiD gins is made again.
  fid_fingerprint: str = ""


def _recipe(out: str, settings: Settings, **kwargs) -> recipe_lib.Recipe:
  return recipe_lib.Recipe(out, settings.store, toy_bert=settings.toy_bert,
                           ict_from_bert=settings.ict_from_bert, **kwargs)


def _shared_ict(shared: recipe_lib.Recipe, seed: int) -> None:
  shared.stage(f"seed {seed}: the shared ICT warm start", shared.trained(shared.ict),
               lambda: shared.train_ict(shared.ict, "ict.log", f"train_main.seed={seed}"))


def _pretraining_checkpoint(realm: recipe_lib.Recipe) -> str:
  if not realm.trained(realm.pretrain):
    raise RuntimeError(f"{realm.pretrain}: the seed's REALM pretraining is not done (the cell "
                       f"{BASE_CELL} makes it first)")
  return recipe_lib.latest_checkpoint_dir(realm.pretrain)


def _recipe_cell(row: Row, size: str, seed: int, layout: Layout, shared: recipe_lib.Recipe,
                 settings: Settings) -> dict:
  """An extractive cell (the seed's REALM recipe, made or resumed) or the Contriever cell."""
  kwargs = recipe_kwargs(row, size, seed, pretrain_steps=settings.pretrain_steps,
                         finetune_steps=settings.finetune_steps)
  if row.reader == "contriever":
    recipe = _recipe(layout.contriever, settings, **kwargs)
  else:
    _shared_ict(shared, seed)
    recipe = _recipe(layout.realm, settings, ict_dir=shared.ict, **kwargs)
  summary = recipe.run()
  qa = recipe.qa_metrics_path()
  return {EM: summary["qa_em_realm"], RECALL: summary["recall@5_after"],
          RECALL_TUNED: _recall5(_metrics(qa)), AGREEMENT: None,
          WARM_RECALL: summary["recall@5_before"], PRETRAINED_RECALL: summary["recall@5_after"],
          "qa_checkpoint": ablations.evaluated_checkpoint(qa),
          "pretraining": ablations.pretraining_id(recipe.pretrain), "recipe": summary}


def remake_pretraining(seed: int, layout: Layout, shared: recipe_lib.Recipe,
                       settings: Settings) -> None:
  """The seed's REALM pretraining alone, as its base cell makes it (`ablations.plan_family`)."""
  _shared_ict(shared, seed)
  kwargs = recipe_kwargs(ROW_BY_NAME[BASE_ROW], ALL, seed,
                         pretrain_steps=settings.pretrain_steps,
                         finetune_steps=settings.finetune_steps)
  _recipe(layout.realm, settings, ict_dir=shared.ict, **kwargs).run_pretraining()


def _run(name: str, cmd: Sequence[str], realm: recipe_lib.Recipe) -> None:
  """One of this bench's own children, its command printed first (the recipe's children write
  theirs at the top of their logs in `<out>/.../logs/`)."""
  print(f"{PROG}: $ {shell_command(cmd)}", flush=True)
  recipe_lib.run_child(cmd, os.path.join(realm.logs, f"{name}.log"))


def _pretext(seed: int, layout: Layout, realm: recipe_lib.Recipe, settings: Settings,
             kind: str) -> tuple[str, Optional[float], dict]:
  """The seed's Atlas pretext of `kind` (made once, then reused by each size's cell): (the
  checkpoint dev picked, its zero-shot test recall@5, what the cell records of it: that
  checkpoint and why, and the pretext's own retriever agreement)."""
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  from realm_jax.evaluation import runs  # pylint: disable=import-outside-toplevel
  from realm_jax.index import store as store_lib  # pylint: disable=import-outside-toplevel
  pretraining = _pretraining_checkpoint(realm)
  # A pretext run of another pretraining (made again since) is not reused.
  run_dir, name = layout.pretext(kind), PRETEXTS[kind][0]
  what = f"seed {seed}: Atlas's pretext" + "".join(PRETEXTS[kind][2:])
  ablations.claim_runs_dir(run_dir, f"{ablations.pretraining_id(realm.pretrain)} "
                                    f"{pretraining} {settings.fid_fingerprint}")
  (_, index), (_, train) = pretext_commands(layout, settings.store, seed,
                                            pretraining_checkpoint=pretraining,
                                            pretext_steps=settings.pretext_steps, kind=kind)
  realm.stage(f"{what}: frozen index (the pretraining checkpoint's)",
              store_lib.latest_index_step(run_dir) is not None,
              lambda: _run(f"index_{name}", index, realm))
  realm.stage(f"{what} (MLM with retrieval)", realm.trained(run_dir),
              lambda: _run(name, train, realm))
  output = layout.pretext_eval_output(kind)
  realm.stage(f"{what}: zero-shot toy QA {EVAL_SPLIT} recall",
              os.path.exists(metrics_path(output)),
              lambda: _run(f"evaluate_{name}", evaluate_command(run_dir, output), realm))
  step, why = runs.choose_checkpoint(run_dir, None)
  checkpoint = checkpoints.checkpoint_path(run_dir, step)
  return checkpoint, _recall5(_metrics(metrics_path(output))), {
      "pretext_checkpoint": f"{checkpoint}: {why}",
      "pretext_agreement": retriever_agreement(run_dir)}


def _fid_cell(row: Row, size: str, seed: int, layout: Layout, shared: recipe_lib.Recipe,
              settings: Settings) -> dict:
  """A FiD or closed-book cell: its frozen index, fine-tuning and evaluation, each a stage."""
  from realm_jax.index import store as store_lib  # pylint: disable=import-outside-toplevel
  realm = _recipe(layout.realm, settings, ict_dir=shared.ict)
  pretraining = _pretraining_checkpoint(realm)
  recall, extra = None, {}
  if row.reader == "fid":
    recall = _recall5(_metrics(os.path.join(realm.evals, "recall_after.metrics.json")))
  init = pretraining
  if row.warm_start in PRETEXTS:
    init, recall, extra = _pretext(seed, layout, realm, settings, row.warm_start)
  run_dir = layout.run_dir(row.name, size)
  # A run of another warm start (a pretraining or pretext made again since) or of other FiD
  # gins is not reused.
  ablations.claim_runs_dir(run_dir, f"{ablations.pretraining_id(realm.pretrain)} {init} "
                                    f"{settings.fid_fingerprint}")
  commands = dict(cell_commands(row, size, seed, layout, settings.store,
                                pretraining_checkpoint=pretraining, init_checkpoint=init,
                                finetune_steps=settings.finetune_steps))
  what = f"seed {seed}: {row.label}, {size_title(size)}"
  name = cell_name(row.name, size)
  if "frozen index" in commands:
    realm.stage(f"{what}: frozen index (the pretraining checkpoint's)",
                store_lib.latest_index_step(run_dir) is not None,
                lambda: _run(f"index_{name}", commands["frozen index"], realm))
  realm.stage(f"{what}: fine-tuning", realm.trained(run_dir),
              lambda: _run(name, commands["fine-tuning"], realm))
  output = metrics_path(layout.eval_output(row.name, size))
  realm.stage(f"{what}: evaluation on toy QA {EVAL_SPLIT}", os.path.exists(output),
              lambda: _run(f"evaluate_{name}", commands["evaluation"], realm))
  metrics = _metrics(output)
  return {EM: float(metrics["exact_match"]), RECALL: recall,
          RECALL_TUNED: _recall5(metrics),
          AGREEMENT: retriever_agreement(run_dir) if row.reader == "fid" else None,
          "qa_checkpoint": ablations.evaluated_checkpoint(output),
          "pretraining": ablations.pretraining_id(realm.pretrain), **extra}


def make_cell(row: Row, size: str, seed: int, layout: Layout, shared: recipe_lib.Recipe,
              settings: Settings) -> dict:
  """Runs one cell (stages already done in `--out` are skipped) and returns it."""
  print(f"\n{PROG}: seed {seed}: {row.label}, {size_title(size)} ...", flush=True)
  start = time.monotonic()
  if row.reader in ("extractive", "contriever"):
    cell = _recipe_cell(row, size, seed, layout, shared, settings)
  else:
    cell = _fid_cell(row, size, seed, layout, shared, settings)
  cell.update(row=row.name, size=size, seed=seed, minutes=(time.monotonic() - start) / 60)
  if not ablations.dev_picked(cell):
    print(f"{PROG}: seed {seed}: {row.label}, {size_title(size)}: the evaluation did not read "
          f"the checkpoint dev picked ({cell['qa_checkpoint']})", flush=True)
  return cell


def kept_results(rows: Sequence[str], sizes: Sequence[str], seeds: Sequence[int],
                 settings: Settings, cells: str = DEFAULT_CELLS
                 ) -> dict[tuple[str, str], dict[int, dict]]:
  """`run`'s {(row, size): {seed: cell}} from the kept cells alone, making nothing: a cell not
  kept is left out, and so is a fine-tuning cell of another pretraining than its seed's kept
  REALM cell (it would pair with nothing); each is said. For writing the section where the
  runs are gone, or where a seed holds some rows only."""
  prints = settings_fingerprints(settings)
  results: dict[tuple[str, str], dict[int, dict]] = {}
  for seed, row, size in plan(rows, sizes, seeds):
    path = cell_path(cells, seed, row, size)
    cell = ablations.load_cell(path, row_fingerprint(row, prints))
    what = f"{PROG}: seed {seed}: {ROW_BY_NAME[row].label}, {size_title(size)}"
    if cell is None:
      print(f"{what}: not kept in {path}; left out", flush=True)
      continue
    if row in MAIN_ROWS and cell_name(row, size) != BASE_CELL:
      base = results.get((BASE_ROW, ALL), {}).get(seed)  # `plan` puts it first
      if base is None or base.get("pretraining") != cell.get("pretraining"):
        print(f"{what}: not of the seed's kept REALM pretraining; left out", flush=True)
        continue
    results.setdefault((row, size), {})[seed] = cell
  return results


def run(out: str, rows: Sequence[str], sizes: Sequence[str], seeds: Sequence[int],
        settings: Settings, cells: str = DEFAULT_CELLS) -> dict[tuple[str, str], dict[int, dict]]:
  """{(row, size): {seed: cell}}, every cell of `plan` made or reused (module docstring)."""
  os.makedirs(out, exist_ok=True)
  prints = settings_fingerprints(settings)
  settings = settings._replace(fid_fingerprint=prints["fid"])
  planned = plan(rows, sizes, seeds)
  results: dict[tuple[str, str], dict[int, dict]] = {}
  for seed in seeds:
    layout = Layout(os.path.join(out, f"seed{seed}"))
    mine = [(row, size) for s, row, size in planned if s == seed]
    names = [cell_name(row, size) for row, size in mine]
    family = [cell_name(row, size) for row, size in mine if row in MAIN_ROWS]
    kept = {name: cell for (row, size), name in zip(mine, names)
            if (cell := ablations.load_cell(cell_path(cells, seed, row, size),
                                            row_fingerprint(row, prints))) is not None}
    pretrain_dir = os.path.join(layout.realm, "pretrain")
    finetunings = [n for n in family if n != BASE_CELL]
    made = ablations.family_cells_to_make(BASE_CELL, finetunings, family, kept,
                                          ablations.pretraining_id(pretrain_dir))
    if made or set(names) - set(kept):
      # Something is made: not from shared runs of other gins, options or code (the FiD rows'
      # runs claim their own directories with their fingerprint).
      ablations.claim_runs_dir(layout.seed_out, prints["recipe"])
    # After the claim: a Recipe makes its directories when built, and the claim may remove them.
    shared = _recipe(layout.shared, settings)
    if made:
      # Planned again: the claim may have removed the pretraining the kept cells read.
      made = ablations.plan_family(
          BASE_CELL, finetunings, family, kept, pretrain_dir,
          lambda: remake_pretraining(seed, layout, shared, settings))  # pylint: disable=cell-var-from-loop
    for (row_name, size), name in zip(mine, names):
      row = ROW_BY_NAME[row_name]
      path = cell_path(cells, seed, row_name, size)
      make = name in made if name in family else name not in kept
      if not make:
        print(f"{PROG}: seed {seed}: {row.label}, {size_title(size)}: kept in {path}",
              flush=True)
        results.setdefault((row_name, size), {})[seed] = kept[name]
        continue
      if name in kept:
        print(f"{PROG}: seed {seed}: {row.label}, {size_title(size)}: the kept cell is not of "
              f"the REALM pretraining in {out}; made again", flush=True)
      cell = make_cell(row, size, seed, layout, shared, settings)
      ablations.save_cell(path, cell, row_fingerprint(row_name, prints))
      results.setdefault((row_name, size), {})[seed] = cell
  return results


def _toy_bert_sha256(toy_bert: Optional[str]) -> Optional[str]:
  if not toy_bert:
    return None
  from realm_jax import toy_bert as toy_bert_lib  # pylint: disable=import-outside-toplevel
  return toy_bert_lib.weights_sha256(toy_bert)


# ---------------------------------------------------------------------------- the report


def by_row(results: Mapping[tuple[str, str], Mapping[int, dict]]
           ) -> dict[str, dict[int, dict]]:
  """{row: {seed: its figures}}: the EM of every size (`em_key`), the retriever columns from
  the cell of all questions (zero-shot recall: any size's, one retriever), and the minutes of
  all its cells; the form `ablations.paired` reads."""
  rows: dict[str, dict[int, dict]] = {}
  for (row, size), by_seed in results.items():
    for seed, cell in by_seed.items():
      merged = rows.setdefault(row, {}).setdefault(seed, {"minutes": 0.0, "qa_checkpoints": []})
      merged[em_key(size)] = cell.get(EM)
      merged["minutes"] += cell.get("minutes", 0.0)
      merged["qa_checkpoints"].append((size, cell.get("qa_checkpoint")))
      if merged.get(RECALL) is None:
        merged[RECALL] = cell.get(RECALL)
      if size == ALL:
        for key in (RECALL_TUNED, AGREEMENT, WARM_RECALL, PRETRAINED_RECALL):
          merged[key] = cell.get(key)
  return rows


def _mean_sd(values: Sequence[Any]) -> str:
  return ablations.mean_sd_cell([v for v in values if v is not None])


def main_columns(sizes: Sequence[str]) -> list[str]:
  return [*(em_key(s) for s in sorted_sizes(sizes)), RECALL, RECALL_TUNED, AGREEMENT]


def seeds_with(by_seed: Mapping[int, dict], key: str) -> set[int]:
  """The seeds whose figures (of one row) hold a finite `key`."""
  return {s for s, f in by_seed.items() if ablations.finite(f.get(key))}


def seeds_cell(by_seed: Mapping[int, dict], sizes: Sequence[str]) -> str:
  """The seeds a row's EM columns average: "0, 1, 2" when every measured size has the same,
  else each size's ("64: 0, 1, 2; all: 0, 1, 2, 3"), so that a mean over other seeds shows."""
  listed = [(size, ", ".join(map(str, sorted(seeds_with(by_seed, em_key(size))))))
            for size in sorted_sizes(sizes)]
  measured = [(size, seeds) for size, seeds in listed if seeds]
  if len({seeds for _, seeds in measured}) <= 1:
    return measured[0][1] if measured else ""
  return "; ".join(f"{size}: {seeds}" for size, seeds in measured)


def table(rows: Mapping[str, Mapping[int, dict]], sizes: Sequence[str]) -> str:
  """The main table: a row per measured row (the table's order), mean ± sample standard
  deviation over the seeds (`seeds_cell` names them), n/a where undefined."""
  columns = main_columns(sizes)
  lines = ["| row | " + " | ".join(column_title(c) for c in columns) + " | seeds | minutes |",
           "|---" * (len(columns) + 3) + "|"]
  for name in MAIN_ROWS:
    if name not in rows:
      continue
    figures = list(rows[name].values())
    values = [_mean_sd([f.get(c) for f in figures]) for c in columns]
    minutes = sum(f["minutes"] for f in figures) / len(figures)
    lines.append(f"| {ROW_BY_NAME[name].label} | " + " | ".join(values)
                 + f" | {seeds_cell(rows[name], sizes)} | {minutes:.1f} |")
  lines.extend(_not_dev_picked(rows))
  return "\n".join(lines)


def _not_dev_picked(rows: Mapping[str, Mapping[int, dict]]) -> list[str]:
  missed = [f"{name} {size} seed {seed}" for name, by_seed in rows.items()
            for seed, f in sorted(by_seed.items()) for size, choice in f["qa_checkpoints"]
            if not ablations.dev_picked({"qa_checkpoint": choice})]
  return [f"\nEvaluated on a checkpoint dev did not pick: {', '.join(missed)}."] if missed else []


def warm_start_table(rows: Mapping[str, Mapping[int, dict]]) -> str:
  """ICT (the REALM row's warm start) against the Contriever-style warm start: "" unless the
  Contriever row was measured."""
  if "contriever" not in rows:
    return ""
  columns = (WARM_RECALL, PRETRAINED_RECALL, em_key(ALL))
  lines = ["| warm start | " + " | ".join(
      column_title(c) + (" (extractive reader)" if c == em_key(ALL) else "") for c in columns)
           + " | seeds |", "|---" * (len(columns) + 2) + "|"]
  paired = sorted(rows["contriever"])  # ICT's seeds beyond these would compare other seeds
  for name, label in ((BASE_ROW, "ICT (toy_ict.gin)"),
                      ("contriever", "Contriever-style (contriever_toy.gin)")):
    figures = [rows.get(name, {})[s] for s in paired if s in rows.get(name, {})]
    if figures:
      lines.append(f"| {label} | " + " | ".join(_mean_sd([f.get(c) for f in figures])
                                                for c in columns) + f" | {len(figures)} |")
  return "\n".join(lines)


class Comparison(NamedTuple):
  """Row a minus row b. predicted: the source predicts a > b (its verdict is
  `ablations.direction_verdict`; otherwise `two_sided_verdict`); keys: the columns compared
  besides EM (the zero-shot recall only where the two rows' retrievers differ); every_size:
  EM at every size measured (False: all questions only)."""
  a: str
  b: str
  says: str
  predicted: bool
  keys: tuple[str, ...] = ()
  every_size: bool = True


COMPARISONS = (
    Comparison("fid", "extractive", "FiD reader minus REALM's extractive reader", False),
    *(Comparison(o, "fid", f"{OBJECTIVE_NAMES[o]} > query tower frozen (Atlas)", True,
                 (RECALL_TUNED,)) for o in OBJECTIVES),
    *(Comparison(name, "fid", f"{OBJECTIVE_NAMES[o]} at lr x 0.1 > query tower frozen (Atlas)",
                 True, (RECALL_TUNED,)) for name, o in SLOW_OBJECTIVES.items()),
    *(Comparison(name, o, f"{OBJECTIVE_NAMES[o]} at lr x 0.1 minus at the reader's", False,
                 (RECALL_TUNED,), every_size=False) for name, o in SLOW_OBJECTIVES.items()),
    Comparison("pretext", "fid", "Atlas's pretext > none (Atlas)", True,
               (RECALL, RECALL_TUNED)),
    Comparison("pretext_reader", "fid", "a pretext for the reader alone > none", True),
    Comparison("pretext", "pretext_reader",
               "Atlas's pretext minus the pretext for the reader alone (what ADist's query "
               "tower adds)", False, (RECALL, RECALL_TUNED)),
    Comparison("fid", "closed_book", "retrieval > closed book (Atlas)", True),
)
WARM_START_COMPARISON = Comparison(
    "contriever", BASE_ROW, "Contriever-style > ICT warm start (Contriever, Izacard et al. 2021)",
    True, (WARM_RECALL, PRETRAINED_RECALL), every_size=False)


def comparison_stats(rows: Mapping[str, Mapping[int, dict]], sizes: Sequence[str],
                     comparisons: Sequence[Comparison] = COMPARISONS
                     ) -> list[tuple[Comparison, str, tuple[int, ...],
                                     ablations.PairedDifference]]:
  """(comparison, column, seeds, paired difference a minus b) of every comparison and column
  both rows have (`ablations.paired`: the seeds with a finite value in both)."""
  out = []
  for comparison in comparisons:
    keys = [em_key(s) for s in (sorted_sizes(sizes) if comparison.every_size else (ALL,))]
    for key in (*keys, *comparison.keys):
      pair = ablations.paired(rows, comparison.a, comparison.b, key)
      if pair is not None:
        out.append((comparison, key, *pair))
  return out


def verdict(comparison: Comparison, d: ablations.PairedDifference) -> str:
  return (ablations.direction_verdict(d) if comparison.predicted
          else ablations.two_sided_verdict(d))


def comparisons(rows: Mapping[str, Mapping[int, dict]], sizes: Sequence[str],
                which: Sequence[Comparison] = COMPARISONS) -> str:
  """One line per comparison and column: mean ± standard error, the per-seed differences, and
  whether every seed agrees (`verdict`)."""
  return "\n".join(
      f"* {c.says}, {column_title(key)}: {ablations.format_difference(seeds, d)}: "
      f"{verdict(c, d)}" for c, key, seeds, d in comparison_stats(rows, sizes, which))




def _mean(rows: Mapping[str, Mapping[int, dict]], row: str, key: str) -> Optional[float]:
  values = [f.get(key) for f in rows.get(row, {}).values()]
  values = [v for v in values if ablations.finite(v)]
  return float(np.mean(values)) if values else None


def noise_line(rows: Mapping[str, Mapping[int, dict]], sizes: Sequence[str]) -> str:
  """The fine-tuning noise at each size: the FiD reader fine-tuned again minus itself, paired
  (`ablations.format_difference`) with the standard deviation of the difference; "" before
  two seeds of both rows."""
  parts = []
  for size in sorted_sizes(sizes):
    pair = ablations.paired(rows, NOISE_ROW, "fid", em_key(size))
    if pair is not None and len(pair[0]) >= 2:
      seeds, d = pair
      parts.append(f"{size_title(size)} {ablations.format_difference(seeds, d)}, standard "
                   f"deviation {ablations.difference_std(d):.3f}")
  if not parts:
    return ""
  return ("Fine-tuning noise, the FiD reader fine-tuned again minus itself (test EM): "
          + "; ".join(parts) + ". A difference between two rows within about twice that "
          "standard deviation is what two fine-tunings of one pretraining differ by.")


def reading(rows: Mapping[str, Mapping[int, dict]], sizes: Sequence[str]) -> str:
  """What the figures say, in numbers, and what the toy scale cannot show."""
  size = sorted_sizes(sizes)[-1]
  key = em_key(size)
  out = []
  methods = [name for name in MAIN_ROWS if name != NOISE_ROW]
  means = {name: m for name in methods if (m := _mean(rows, name, key)) is not None}
  if means:
    # The best is picked over the seeds every row holds, so that no row wins by its seeds.
    shared = set.intersection(*(seeds_with(rows[name], key) for name in means))
    on_shared = {name: float(np.mean([rows[name][s][key] for s in shared])) for name in means}
    best = max(on_shared, key=on_shared.get) if shared else None
    out.append(f"Mean test EM with {size_title(size)}, each over its row's seeds (the table's "
               "seeds column; rows are compared by the paired differences above): " + ", ".join(
        f"{name} {m:.3f}" for name, m in means.items())
               + (f"; the best over the seeds every row holds "
                  f"({', '.join(map(str, sorted(shared)))}), {on_shared[best]:.3f}: "
                  f"{ROW_BY_NAME[best].label}." if best else "."))
  fewest = sorted_sizes(sizes)[0]
  few = {name: m for name in methods if (m := _mean(rows, name, em_key(fewest))) is not None}
  if fewest != size and few:
    out.append(f"Few-shot, Atlas's claim: mean test EM with {size_title(fewest)}: " + ", ".join(
        f"{name} {m:.3f}" for name, m in few.items()) + ".")
  noise = noise_line(rows, sizes)
  if noise:
    out.append(noise)
  stats = {(c.a, c.b, k): d for c, k, _, d in comparison_stats(rows, sizes)}
  for names, rate in ((OBJECTIVES, "at the reader's learning rate"),
                      (tuple(SLOW_OBJECTIVES), "at a tenth of it")):
    objectives = [(o, stats[o, "fid", key]) for o in names if (o, "fid", key) in stats]
    if not objectives:
      continue
    held = [(o, d) for o, d in objectives
            if d.all_agree and ablations.beyond_two_standard_errors(d)]
    better = [o for o, d in held if d.mean > 0]
    worse = [o for o, d in held if d.mean < 0]
    verdict = " and ".join(filter(None, [better and f"{', '.join(better)} better",
                                         worse and f"{', '.join(worse)} worse"]))
    out.append(f"Training the query tower against the frozen index {rate}, against leaving "
               "it frozen (" + ", ".join(f"{o} {d.mean:+.3f}" for o, d in objectives) + " EM): "
               + (f"{verdict} in every seed, beyond two standard errors." if verdict
                  else "no objective differs in every seed beyond two standard errors."))
    tuned = [(o, stats[o, "fid", RECALL_TUNED]) for o in names
             if (o, "fid", RECALL_TUNED) in stats]
    if tuned:
      out.append("Their question towers' test recall@5 after fine-tuning moved by "
                 + ", ".join(f"{o} {d.mean:+.3f}" for o, d in tuned) + ".")
  if ("pretext", "fid", RECALL) in stats:
    d = stats["pretext", "fid", RECALL]
    out.append(f"Atlas's pretext moved the zero-shot test recall@5 of the question tower it "
               f"trained by {d.mean:+.3f} (against the frozen index of the pretraining it "
               f"started from).")
  for a, b, what in (("pretext", "fid", "Atlas's pretext before the FiD fine-tuning"),
                     ("pretext_reader", "fid",
                      "a pretext for the reader alone (query tower frozen)"),
                     ("fid", "closed_book", "retrieval against the closed book"),
                     ("fid", "extractive", "the FiD reader against REALM's extractive reader")):
    if (a, b, key) in stats:
      d = stats[a, b, key]
      out.append(f"{what[0].upper()}{what[1:]}: {d.mean:+.3f} EM ("
                 + ("every seed agrees" if d.all_agree else "the seeds do not agree") + ").")
  warm = {k: d for c, k, _, d in comparison_stats(rows, sizes, [WARM_START_COMPARISON])}
  if warm:
    out.append("The Contriever-style warm start against ICT: " + ", ".join(
        f"{column_title(k)} {d.mean:+.3f}" + ("" if d.all_agree else " (the seeds do not agree)")
        for k, d in warm.items()) + ".")
  caveat = (
      "What the toy scale cannot show: Atlas's few-shot results come from a pretrained "
      "sequence-to-sequence reader (T5, up to 11B parameters) and a Contriever retriever "
      "trained on web-scale text, with the index refreshed during Atlas's pretraining; here "
      "the FiD reader is the project's 2-layer toy BERT encoder with a 2-layer decoder "
      "trained from scratch for a few hundred steps, which learns to write answers from at "
      "most 2,000 of them (T5's decoder arrives able to write text), the index stays frozen "
      "throughout, the retriever's warm starts are 400 steps on 2,556 toy blocks (Contriever "
      "trains BERT-base on web-scale text against a MoCo queue of negatives; here its crops, "
      "10-50% of a toy block's body of 44 wordpieces at the median, hold 4 to 22), and the "
      "pretext reads the toy world's restated facts only. The toy world's facts are "
      "fictional, so no reader knows an answer from its warm start alone. With 1,000 test "
      "questions an EM near p has a binomial standard error near sqrt(p(1 - p) / 1000) (0.005 "
      "at 0.03, 0.012 at 0.2), beside the seeds' spread; differences smaller than that say "
      "nothing about Atlas's claims, which are about scale. Two sections look closer: "
      f"\"{COPYING_SECTION}\" (how often each reader's answers are copied from its "
      f"blocks) and \"{CONTROLS_SECTION}\" (why training the question tower against "
      "the frozen index loses retrieval).")
  return "\n".join([*(f"- {line}" for line in out), "", caveat]).strip()


def markdown(rows: Mapping[str, Mapping[int, dict]], sizes: Sequence[str],
             seeds: Sequence[int], *, kept_only: bool = False) -> str:
  minutes = sum(f["minutes"] for by_seed in rows.values() for f in by_seed.values())
  parts = [
      f"`python bench/atlas.py --seeds {' '.join(map(str, seeds))} --sizes "
      f"{' '.join(sorted_sizes(sizes))} --write{' --kept_only' if kept_only else ''}` "
      f"({minutes:.0f} min of runs; the cells are kept in bench/results/atlas/ with their "
      "commit, date and machine"
      + ("; written from them alone, each cell made without `--kept_only`" if kept_only else "")
      + "). Every row fine-tunes the "
      "seed's REALM pretraining (toy_pretrain.gin from the seed's ICT) against the frozen "
      "index built from it: REALM's extractive reader (toy_finetune.gin), the FiD reader "
      "(toy_finetune_fid.gin) with its query tower frozen (and again with fine-tuning seed "
      f"+ {ablations.REFIT_SEED_OFFSET}: the fine-tuning noise) or trained by one of Atlas's "
      "objectives (atlas_toy_finetune.gin), at the reader's learning rate (5e-4, what the "
      "fresh toy decoder needs) or at a tenth of it (`FinetuneJob.retriever_lr_scale=0.1`, "
      "5e-5, near the 4e-5 of Atlas's fine-tuning scripts), the FiD reader warm-started from "
      "Atlas's MLM "
      "pretext (atlas_toy_pretext.gin, ADist) and then fine-tuned as the frozen-tower row, "
      "the same after a pretext that trains the reader alone (its query tower frozen: "
      "`retriever_objective='none'`, its learning rate 0), and the closed book "
      "(atlas_toy_closed_book.gin). Few-shot: `FinetuneJob.few_shot` training "
      "questions of 2,000 drawn with `few_shot_seed` = the seed (every row of a seed trains on "
      "the same sample). Every stage runs with the seed; fine-tuning picks its checkpoint on "
      "toy QA dev EM (best.json), and every figure is measured on toy QA test. Zero-shot "
      "recall@5: the retriever the row reads with, before fine-tuning (the pretraining index's "
      "for all rows but the pretext's). Retriever agreement: `train/retriever_agreement`, the "
      "share of training questions whose retriever's top block is the objective's target's "
      f"top block, mean over the last {AGREEMENT_WINDOW} steps of the all-questions run (n/a "
      "where no objective trains the question tower). Cells: mean ± sample standard deviation "
      "over the seeds. Minutes: the wall-clock of each cell's last sitting, summed over the "
      "row's sizes, on a 2-core machine shared with another bench process; a cell resumed "
      "from its checkpoint counts only its last part and a paused one counts its pause, so "
      "it is not a timing.",
      table(rows, sizes)]
  warm = warm_start_table(rows)
  if warm:
    parts += ["Warm starts: ICT (the REALM row's) against the Contriever-style warm start, each "
              "followed by REALM pretraining and the extractive reader's fine-tuning on all "
              "questions, paired by seed.", warm]
  lines = comparisons(rows, sizes)
  warm_lines = comparisons(rows, sizes, [WARM_START_COMPARISON])
  if lines or warm_lines:
    parts += ["Paired differences (row A minus row B seed by seed, mean ± standard error, "
              "per-seed differences; \"holds in every seed\" when every difference has the "
              "predicted sign, \"beyond two standard errors\" when the mean exceeds twice its "
              "standard error; a comparison no source predicts is judged on either sign):",
              "\n".join(filter(None, [lines, warm_lines]))]
  parts += ["Reading:", reading(rows, sizes)]
  return "\n\n".join(parts)


# ---------------------------------------------------------------------------- command line


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="bench/atlas.py", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=DEFAULT_OUT,
                      help="run directories (default %(default)s; keep it until a seed's "
                           "cells are done: every row reads the seed's REALM pretraining)")
  parser.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS),
                      help="seeds of every row, the pairs of the comparisons (default: "
                           f"{' '.join(map(str, DEFAULT_SEEDS))})")
  parser.add_argument("--only", nargs="*", default=(), choices=[row.name for row in ROWS],
                      metavar="ROW",
                      help="measure only these rows (of: %(choices)s); the extractive row on "
                           "all questions, whose recipe makes the pretraining every row reads, "
                           "is measured too")
  parser.add_argument("--sizes", nargs="+", type=parse_size, default=list(DEFAULT_SIZES),
                      help="training questions of each fine-tuning: numbers or 'all' (default: "
                           f"{' '.join(DEFAULT_SIZES)})")
  parser.add_argument("--write", action="store_true",
                      help=f"write the section {SECTION!r} of bench/docs/benchmarks.md")
  parser.add_argument("--kept_only", action="store_true",
                      help="make nothing: the tables from the kept cells alone, leaving out "
                           "(and naming) the cells not kept; to write the section where the "
                           "runs are gone or a seed holds some rows only")
  parser.add_argument("--pretrain_steps", type=int, default=None,
                      help="REALM pretraining steps (default: the recipe's)")
  parser.add_argument("--finetune_steps", type=int, default=None,
                      help="fine-tuning steps of every row (default: each gin's)")
  parser.add_argument("--pretext_steps", type=int, default=None,
                      help="Atlas pretext steps (default: atlas_toy_pretext.gin's)")
  parser.add_argument("--ict_from", choices=("random", "bert"), default="random",
                      help="what the warm starts' towers start from, as the recipe's --ict_from")
  parser.add_argument("--world", choices=("toy", "wiki"), default="toy",
                      help="the toy world (default) or the wiki world: the rows "
                           f"{', '.join(WIKI_ROWS)} on all questions (--out default "
                           f"{wiki_runs.DEFAULT_OUT}, shared with the compute curve and the "
                           f"Table 2 bench; --cells default "
                           f"{os.path.relpath(DEFAULT_WIKI_CELLS, REPO)})")
  ablations.add_cell_flags(parser, DEFAULT_CELLS)
  args = parser.parse_args(argv)
  if args.world == "wiki":
    if (args.only or args.sizes != list(DEFAULT_SIZES) or args.kept_only
        or args.ict_from != "random" or args.toy_bert != "shipped"
        or any((args.pretrain_steps, args.finetune_steps, args.pretext_steps))):
      parser.error("--world wiki: its rows on all questions with the wiki recipe's settings "
                   "(no --only, --sizes, --kept_only, --ict_from, --toy_bert or steps)")
    if args.cells == DEFAULT_CELLS:
      args.cells = DEFAULT_WIKI_CELLS
    if args.out == DEFAULT_OUT:
      args.out = wiki_runs.DEFAULT_OUT
  args.toy_bert, args.cells = ablations.parse_cell_flags(parser, args)
  return args


# ---------------------------------------------------------------------------- the wiki world

WIKI_SECTION = "Atlas on the wiki world"
DEFAULT_WIKI_CELLS = os.path.join(REPO, "bench", "results", "atlas_wiki")
# REALM's own fine-tuning, the FiD reader with retrieval and without, on all the questions.
WIKI_ROWS = (BASE_ROW, "fid", "closed_book")
WIKI_PAIRS = (("fid", "closed_book"), (BASE_ROW, "closed_book"), (BASE_ROW, "fid"))


class WikiLayout(Layout):
  """A wiki seed's runs (`wiki_runs`): REALM's is the compute curve's 1x run, the FiD rows' run
  directories beside its fine-tunings."""
  __slots__ = ()

  @property
  def realm(self) -> str:
    return os.path.join(self.seed_out, ablations.wiki_base_run())


def wiki_fingerprint(row: str) -> str:
  """A wiki cell's: the wiki world's options and every gin this bench reads, with the row."""
  return fingerprint({**ablations.wiki_cell_options(), "bench": "atlas",
                      "cell_format": CELL_FORMAT, "row": row})


def wiki_cell_commands(row: Row, seed: int, layout: Layout, base: recipe_lib.Recipe
                       ) -> list[tuple[str, list[str]]]:
  """`cell_commands` of a FiD or closed-book row on the wiki world: the toy FiD gins pointed at
  the wiki recipe's questions and BlockStore (`base`, prepared), and its reader length for the
  FiD reader's passages (the closed book keeps its question-only length)."""
  finetune = [b for b in base.bindings("finetune")
              if not (row.reader == "closed_book" and b.startswith("FinetuneJob.reader_len="))]
  extra = {"fine-tuning": _gin(*finetune), "evaluation": _gin(*base.bindings("evaluate"))}
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  chosen = checkpoints.checkpoint_path(base.pretrain, base.pretrain_choice()[0])
  commands = cell_commands(row, ALL, seed, layout, base.store, pretraining_checkpoint=chosen,
                           init_checkpoint=chosen)
  return [(stage, cmd + extra.get(stage, [])) for stage, cmd in commands]


def wiki_cell(row: Row, seed: int, out: str) -> dict:
  """One cell on the wiki world: REALM's row from its recipe (made or resumed, as the compute
  curve's 1x and the Table 2 bench make it), a FiD row from its commands."""
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  start = time.monotonic()
  base = ablations.wiki_cell_recipe(ablations.ROW_BY_NAME[ablations.BASE], seed, out)
  summary = base.run()  # also prepares `base` (its settings) for the FiD rows' bindings
  pretraining = ablations.pretraining_id(base.pretrain)
  if row.name == BASE_ROW:
    qa = base.qa_metrics_path()
    return {EM: summary["qa"]["realm"]["exact_match"],
            RECALL_TUNED: summary["qa"]["realm"].get("recall@5"),
            "qa_checkpoint": ablations.evaluated_checkpoint(qa), "pretraining": pretraining,
            "minutes": (time.monotonic() - start) / 60}
  layout = WikiLayout(wiki_runs.seed_dir(out, seed))
  run_dir = layout.run_dir(row.name, ALL)
  ablations.claim_runs_dir(run_dir, wiki_fingerprint(row.name))
  output = layout.eval_output(row.name, ALL)
  if not os.path.exists(metrics_path(output)):
    for stage, cmd in wiki_cell_commands(row, seed, layout, base):
      if stage == "fine-tuning" and checkpoints.training_done(run_dir):
        continue
      if stage == "frozen index" and os.path.isdir(os.path.join(run_dir, "index")):
        continue
      _run(f"{cell_name(row.name, ALL)}_{stage.replace(' ', '_')}", cmd, base)
  metrics = _metrics(metrics_path(output))
  return {EM: metrics["exact_match"],
          RECALL_TUNED: None if row.reader == "closed_book" else _recall5(metrics),
          "qa_checkpoint": ablations.evaluated_checkpoint(metrics_path(output)),
          "pretraining": pretraining, "minutes": (time.monotonic() - start) / 60}


def run_wiki(out: str, seeds: Sequence[int], cells: str) -> dict[str, dict[int, dict]]:
  """{row: {seed: cell}} of `WIKI_ROWS`, each made or reused."""
  rows: dict[str, dict[int, dict]] = {}
  for seed in seeds:
    for name in WIKI_ROWS:
      path = cell_path(cells, seed, name, ALL)
      cell = ablations.load_cell(path, wiki_fingerprint(name))
      if cell is None:
        print(f"{PROG}: wiki world, seed {seed}: {ROW_BY_NAME[name].label} ...", flush=True)
        cell = wiki_cell(ROW_BY_NAME[name], seed, out)
        ablations.save_cell(path, cell, wiki_fingerprint(name))
      rows.setdefault(name, {})[seed] = cell
  return rows


def wiki_markdown(rows: Mapping[str, Mapping[int, dict]], seeds: Sequence[int]) -> str:
  """The wiki world's section: its table, the paired differences and their provenance."""
  lines = ["| row | wiki QA test EM, all questions | test recall@5 after fine-tuning | seeds | "
           "minutes of this bench's runs |", "|---|---|---|---|---|"]
  for name in WIKI_ROWS:
    if name in rows:
      cells = list(rows[name].values())
      lines.append(f"| {ROW_BY_NAME[name].label} | {_mean_sd([c[EM] for c in cells])} | "
                   f"{_mean_sd([c.get(RECALL_TUNED) for c in cells])} | "
                   f"{', '.join(map(str, sorted(rows[name])))} | "
                   f"{sum(c['minutes'] for c in cells) / len(cells):.1f} |")
  differences = []
  for a, b in WIKI_PAIRS:
    pair = ablations.paired(rows, a, b, EM)
    if pair is not None:
      differences.append(f"* {ROW_BY_NAME[a].label} minus {ROW_BY_NAME[b].label}, test EM: "
                         f"{ablations.format_difference(*pair)}: "
                         f"{ablations.two_sided_verdict(pair[1])}")
  return "\n".join([
      f"`python bench/atlas.py --world wiki --seeds {' '.join(map(str, seeds))} --write`: on "
      "the wiki world (docs/wiki_world.md), every row a fine-tuning of the seed's REALM "
      "pretraining (the wiki recipe's, from its checkpoint with the best retrieval utility: the "
      "compute curve's 1x run), on all the training questions: REALM's extractive reader (the "
      "recipe's own fine-tuning), the FiD reader of experiments/toy_finetune_fid.gin with the "
      "frozen index of that checkpoint, and the same reader closed-book "
      "(experiments/atlas_toy_closed_book.gin), both pointed at the wiki world's questions and "
      "BlockStore. Fine-tuning picks its checkpoint on dev EM; EM on the test questions. "
      "REALM's run is shared with the compute curve and the Table 2 bench: its minutes count "
      "only what this bench made of it (near 0 when another bench had made it). Cells "
      f"in {os.path.relpath(DEFAULT_WIKI_CELLS, REPO)}/; mean ± standard deviation over the "
      "seeds.", "", *lines, "", "Paired differences:", "", *differences])


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  if args.world == "wiki":
    rows = run_wiki(os.path.abspath(args.out), args.seeds, args.cells)
    body = wiki_markdown(rows, args.seeds)
    print("\n" + body, flush=True)
    if args.write:
      paths = {seed: [cell_path(args.cells, seed, name, ALL) for name in rows]
               for seed in args.seeds}
      report.write_section(WIKI_SECTION, body, host=ablations.cells_machines(paths))
    return 0
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  settings = Settings(store=realm_jax_tasks.toy_block_store_dir(), toy_bert=args.toy_bert,
                      ict_from_bert=args.ict_from == "bert", pretrain_steps=args.pretrain_steps,
                      finetune_steps=args.finetune_steps, pretext_steps=args.pretext_steps)
  if args.kept_only:
    results = kept_results(tuple(args.only), args.sizes, tuple(args.seeds), settings,
                           cells=args.cells)
  else:
    results = run(os.path.abspath(args.out), tuple(args.only), args.sizes, tuple(args.seeds),
                  settings, cells=args.cells)
  body = markdown(by_row(results), args.sizes, args.seeds, kept_only=args.kept_only)
  print("\n" + body, flush=True)
  if args.write:
    # Stamped with the machines the kept cells were measured on, not only this one.
    cells_by_seed = {seed: [cell_path(args.cells, seed, row, size)
                            for (row, size), by_seed in results.items() if seed in by_seed]
                     for seed in args.seeds}
    report.write_section(SECTION, body, host=ablations.cells_machines(cells_by_seed))
  return 0


if __name__ == "__main__":
  sys.exit(main())
