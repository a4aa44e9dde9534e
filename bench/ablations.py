r"""The paper's Table 2 on the toy world and the wiki world: every row with several seeds,
compared seed by seed.

  python bench/ablations.py [--world toy|wiki] [--out /tmp/realm_ablations] [--write]
      [--only ROW ...] [--seeds 0 1 2 3 4] [--pretrain_steps N] [--finetune_steps N]

The wiki world (`--world wiki`): the rows of `WIKI_ROWS`, each the wiki recipe
(`recipe.WikiRecipe`: its English BERT, settings and steps) with the row's change, laid out by
bench/wiki_runs.py (REALM's run is the compute curve's 1x); its cells in
bench/results/ablations_wiki/. What follows describes the toy world; the wiki world's rows
differ only in their recipe.

A row is the toy recipe (`realm_jax.recipe.Recipe`: pretraining with the index builder alongside,
a frozen index, open-QA fine-tuning on toy QA train, evaluation) with one change, repeated for
every seed (`train_main.seed` of every stage: initialisation, dropout, data order). Rows:

  REALM                        salient-span masks, null document, index refreshed, ICT start
  REALM retriever + baseline   REALM's pretraining fine-tuned with its retriever and index and
    encoder                    the reader from the toy BERT (`finetune_reader='bert'`: the
                               reader the ORQA-style baseline starts from)
  baseline retriever + REALM   the ICT retriever and its index, the reader from REALM's
    encoder                    pretrained encoder (`finetune_retriever='warm_start'`:
                               ENCODER_CHECKPOINT = the pretraining checkpoint)
  ORQA-style baseline          the ICT retriever and its index, the reader from the toy BERT,
                               no REALM pretraining (what `Recipe(baseline=True)` fine-tunes)
  random uniform masks         --gin.TASK='realm_toy_random_token'
  random span masks            --gin.TASK='realm_toy_random_span'
  30x stale index              no index builder (see below)
  beside the paper:
  no null document             --gin.PretrainJob.null_document=False
  no ICT                       the retriever starts as ICT would (random weights, or the BERT
                               with `--ict_from bert`): an "ICT" run of one step at learning
                               rate 0 provides that checkpoint
  REALM fine-tuned again       REALM's pretraining fine-tuned with fine-tuning seed s + 1000
                               (the pretraining keeps seed s): the fine-tuning noise
  retriever held 160 steps     --gin.PretrainJob.freeze_retriever_steps=160: whether the
                               retriever's updates before the encoder reads its blocks are what
                               lowers its recall in some seeds
  random uniform masks on      --gin.TASK='realm_toy_random_token_knowledge': random uniform
    names or dates             masks conditioned on masking a salient wordpiece; whether the
                               random rows' queries without one are what lowers recall

The 30x stale row. The paper refreshed its index every ~500 pretraining steps and its stale row
30 times less often, so that index was still refreshed during pretraining, only rarely. The toy
index builder refreshes at each pretraining checkpoint, every 80 of 400 steps
(`train_main.checkpoint_every` of experiments/toy_pretrain.gin); 30 times that is every 2,400
steps, longer than the run, so this row is never refreshed: pretraining retrieves from the ICT
index throughout. It is the paper's direction (staler is worse) at its extreme, not the
paper's schedule. Its zero-shot recall is of the retriever it ends with, indexed once after
pretraining (the index the builder makes of every other row's last checkpoint).

Paired rows. For each seed every row but "no ICT" starts from one ICT warm start trained with
that seed (`<out>/seed<s>/shared/ict`; `--toy_bert` and `--ict_from` as the recipe's), and every
pretraining reads its data in that seed's order, so a seed's rows differ by their change only:
pretraining refreshes its index in lockstep with its checkpoints (`PretrainJob.
refresh_in_lockstep` in experiments/toy_pretrain.gin), so which index a step searches does not
depend on the machine's load (with asynchronous refreshes that timing alone moved one seed's
REALM recall@5 by 0.097; bench/docs/benchmarks.md), and a cell made again gives the same
figures. The never-refreshed row has no builder, and so no lockstep. The two mixed rows, the
ORQA-style baseline and "REALM fine-tuned again" train
no model of their own before fine-tuning: they are fine-tunings of the REALM row's pretraining
(and ICT) of the same seed (`<out>/seed<s>/realm/<row>`), each kept as its own cell.

Selection and report splits. Fine-tuning picks its checkpoint on toy QA dev (`FinetuneJob.
eval_split = 'dev'`: dev EM at every checkpoint, the best one recorded in best.json); the table's
EM and zero-shot recall@5 are measured on toy QA test, a split nothing was selected on
(`Recipe(eval_split='test')`). `python -m realm_jax.evaluate` evaluates the checkpoint best.json
names (`realm_jax.evaluation.runs.choose_checkpoint`); each cell records that choice
("qa_checkpoint") and the table says if any cell was evaluated on another checkpoint.

Columns: toy QA test EM after fine-tuning; zero-shot recall@5 (an answer in the top 5 blocks of
a toy QA test question) of the retriever the row fine-tunes, before fine-tuning (the toy freezes
the retriever in fine-tuning: experiments/toy_finetune.gin); and, for rows with a pretraining of
their own, masked-span accuracy with retrieval at the last pretraining checkpoint (on the row's
own kind of masks), retrieval utility (undefined without the null document) and index refreshes.
Cells: mean ± sample standard deviation over the seeds.

Comparisons. For each of the paper's directions (REALM > random uniform masks, REALM > random
span masks, random span > random uniform, REALM > 30x stale, REALM > ORQA-style baseline, REALM
> each mixed row, each mixed row > the baseline) and, beside them, REALM > no null document and
REALM > no ICT, on both columns: the mean paired difference (row A minus row B, paired by seed)
± its standard error (the differences' sample standard deviation over the square root of the
number of seeds), the per-seed differences, whether the direction holds in every seed (every
difference has the predicted sign) and whether the mean exceeds two standard errors. Where the
two rows share their retriever, zero-shot recall is equal by construction and is not judged.
Next to the smallest effect of the paper's directions on EM stands the fine-tuning noise:
"REALM fine-tuned again" minus REALM, mean ± standard error and the standard deviation of that
difference.
REALM, its two mixed rows and the ORQA-style baseline are a 2 x 2 design (retriever, encoder),
so REALM minus the baseline on EM is also split into the retriever's effect, the encoder's and
their interaction, seed by seed, beside the change in zero-shot recall the retriever's
pretraining made. `--write` puts the table, the comparisons, the noise line and that split into
bench/docs/benchmarks.md.

Cells. A pretraining row's cell takes 5 to 10 minutes on 2 cores and a fine-tuning row's a few, so
the default 5 seeds are hours, longer than one sitting. Every finished cell (one row, one seed) is
kept as `<cells>/seed<s>_<row>.json` (default `bench/results/ablations/`, kept with the
repository): its summary, minutes, date, commit and a fingerprint of what decides its result (what
the gins configure, Python defaults included, the toy BERT's sha256, the toy world's generator
version, the report split and the step options). A later run reuses every cell whose fingerprint
matches and runs the rest, so the table can be finished in another sitting or on another machine; a
cell whose fingerprint differs is run again. A fine-tuning row's cell is reused only beside the
REALM cell whose pretraining it fine-tuned (each records its pretraining's `pretraining_id`, a
digest of the trained values): when one must be made and `--out` no longer holds that pretraining,
it is made again, and the kept cells stay if the remake trained the same values (a toy pretraining
is deterministic on one CPU model; XLA compiles for the host's instruction set, so another model
trains other values), else REALM's cell is made again with the fine-tunings. The fingerprint does
not cover the code: after a change that alters results, start over with `--fresh_cells`.
`--finetune_steps N` (with its own `--cells` directory) fine-tunes the pretrainings `--out` holds
again, N steps each, into directories of their own (`<row>_<N>steps`): it makes no ICT or
pretraining run again.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from bench import wiki_runs  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import recipe as recipe_lib  # noqa: E402  pylint: disable=wrong-import-position

# The split the tables report. Fine-tuning selects its checkpoint on dev (runs/finetune.gin).
EVAL_SPLIT = "test"
# "REALM fine-tuned again": its fine-tuning seed is the row's seed plus this.
REFIT_SEED_OFFSET = 1000


class Row(NamedTuple):
  """One row of the table.

  name: the cell's name; label: the table's; pretrains: whether the row pretrains a model of its
  own (False: a fine-tuning of the REALM row's pretraining of the seed); kwargs: the Recipe's
  keyword arguments, plus the bench's own "ict" ("untrained") and "finetune_seed_offset";
  version: raised when code that only this row runs changes (e.g. its masking strategy), so
  that its cells alone are made again, in runs of their own (`run_name`), while the other rows'
  cells stay valid."""
  name: str
  label: str
  pretrains: bool
  kwargs: Mapping[str, Any]
  version: int = 0


BASE = "realm"
ROWS = (
    Row(BASE, "REALM", True, {}),
    Row("realm_retriever_bert_encoder", "REALM retriever + baseline encoder", False,
        {"finetune_reader": "bert"}),
    Row("ict_retriever_realm_encoder", "baseline retriever + REALM encoder", False,
        {"finetune_retriever": "warm_start"}),
    Row("orqa", "ORQA-style baseline (ICT retriever + BERT reader)", False,
        {"finetune_retriever": "warm_start", "finetune_reader": "bert"}),
    Row("random_token", "REALM with random uniform masks", True,
        {"pretrain_bindings": ["TASK='realm_toy_random_token'"]}),
    # Version 1: SpanBERT's spans (whole words, geometric lengths, 15% of the sentence), where
    # version 0 masked one run of 1-5 wordpieces.
    Row("random_span", "REALM with random span masks", True,
        {"pretrain_bindings": ["TASK='realm_toy_random_span'"]}, version=1),
    Row("stale_30x", "REALM with a 30x stale index (here: never refreshed)", True,
        {"with_builder": False}),
    Row("no_null", "REALM without the null document (beside the paper)", True,
        {"pretrain_bindings": ["PretrainJob.null_document=False"]}),
    Row("no_ict", "REALM without the ICT warm start (beside the paper)", True,
        {"ict": "untrained"}),
    Row("realm_refit", f"REALM fine-tuned again (fine-tuning seed + {REFIT_SEED_OFFSET})", False,
        {"finetune_seed_offset": REFIT_SEED_OFFSET}),
    # Whether the retriever's early updates, made while the encoder does not yet read its
    # blocks (utility near zero), are what lowers its recall in some seeds.
    Row("retriever_held", "REALM, the retriever held for its first 160 steps (beside the paper)",
        True, {"pretrain_bindings": ["PretrainJob.freeze_retriever_steps=160"]}),
    # Whether random masks lower the retriever's recall through their queries that mask no name
    # or date, whose targets no block helps predict.
    Row("random_token_knowledge",
        "REALM with random uniform masks, every query masking a name or date (beside the paper)",
        True, {"pretrain_bindings": ["TASK='realm_toy_random_token_knowledge'"]}),
)
ROW_BY_NAME = {row.name: row for row in ROWS}
# The rows that fine-tune the REALM row's pretraining.
FINETUNINGS = tuple(row.name for row in ROWS if not row.pretrains)
# The rows of the wiki world (`--world wiki`): the paper's, the null document, no ICT and the
# noise row. Its recipe holds the retriever for the first half of every pretraining already.
WIKI_ROWS = ("realm", "realm_retriever_bert_encoder", "ict_retriever_realm_encoder", "orqa",
             "random_token", "random_span", "stale_30x", "no_null", "no_ict", "realm_refit")

EM, RECALL = "qa_em", "recall@5_zero_shot"
COLUMNS = ((EM, "toy QA test EM"), (RECALL, "zero-shot recall@5 (test)"),
           ("mlm_accuracy", "masked-span accuracy"), ("retrieval_utility", "retrieval utility"),
           ("refreshes", "refreshes"))
COLUMN_TITLES = dict(COLUMNS)
# The wiki world's: its questions are the wiki world's (docs/wiki_world.md), its BERT English.
WIKI_COLUMN_TITLES = {**COLUMN_TITLES, EM: "wiki QA test EM"}
BERT_NAMES = {"toy": "the toy BERT", "wiki": "the English BERT"}


def column_titles(world: str = "toy") -> dict[str, str]:
  return WIKI_COLUMN_TITLES if world == "wiki" else COLUMN_TITLES


class Direction(NamedTuple):
  """better > worse, as the paper reports it (or beside it: `paper` False). `same_retriever`:
  the two rows fine-tune one retriever, so their zero-shot recall is equal by construction."""
  better: str
  worse: str
  says: str
  paper: bool = True
  same_retriever: bool = False


DIRECTIONS = (
    Direction(BASE, "random_token", "REALM > random uniform masks"),
    Direction(BASE, "random_span", "REALM > random span masks"),
    Direction("random_span", "random_token", "random span masks > random uniform masks"),
    Direction(BASE, "stale_30x", "REALM > 30x stale index"),
    Direction(BASE, "orqa", "REALM > ORQA-style baseline"),
    Direction(BASE, "realm_retriever_bert_encoder", "REALM > REALM retriever + baseline encoder",
              same_retriever=True),
    Direction(BASE, "ict_retriever_realm_encoder", "REALM > baseline retriever + REALM encoder"),
    Direction("realm_retriever_bert_encoder", "orqa",
              "REALM retriever + baseline encoder > ORQA-style baseline"),
    Direction("ict_retriever_realm_encoder", "orqa",
              "baseline retriever + REALM encoder > ORQA-style baseline", same_retriever=True),
    Direction(BASE, "no_null", "REALM > no null document", paper=False),
    Direction(BASE, "no_ict", "REALM > no ICT warm start", paper=False),
    Direction("retriever_held", BASE, "retriever held 160 steps > REALM", paper=False),
    Direction("retriever_held", "orqa", "retriever held 160 steps > ORQA-style baseline",
              paper=False),
    Direction("random_token_knowledge", "random_token",
              "random uniform masks on names or dates > random uniform masks", paper=False),
    Direction(BASE, "random_token_knowledge",
              "REALM > random uniform masks on names or dates", paper=False),
)

# ---------------------------------------------------------------------------- the statistics


class PairedDifference(NamedTuple):
  """Row A minus row B over the seeds both were measured with."""
  mean: float
  standard_error: float  # sample std (ddof=1) of the differences / sqrt(n); NaN for one seed
  per_seed: tuple[float, ...]
  all_agree: bool  # every difference nonzero and of one sign


def paired_difference(a: Sequence[float], b: Sequence[float]) -> PairedDifference:
  """`a[i] - b[i]` for each seed i (a[i] and b[i] measured with the same seed), their mean, its
  standard error and whether every seed agrees in sign. Pairing removes what a seed's rows
  share (the warm start, the data order) from the comparison, which the spread of each row's
  mean over seeds does not."""
  if len(a) != len(b) or not a:
    raise ValueError(f"paired_difference: {len(a)} and {len(b)} values; expected the same "
                     f"number, at least one")
  # Rounded so that float noise in the subtraction (0.3 - 0.1 - 0.2) has no sign.
  diffs = np.round(np.asarray(a, float) - np.asarray(b, float), 9)
  n = len(diffs)
  standard_error = float(diffs.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
  return PairedDifference(float(diffs.mean()), standard_error, tuple(float(d) for d in diffs),
                          bool(np.all(diffs > 0) or np.all(diffs < 0)))


def difference_std(d: PairedDifference) -> float:
  """The sample standard deviation (ddof=1) of the per-seed differences."""
  return d.standard_error * math.sqrt(len(d.per_seed))


def paired(rows: Mapping[str, Mapping[int, dict]], a: str, b: str, key: str
           ) -> Optional[tuple[tuple[int, ...], PairedDifference]]:
  """(seeds, paired difference of `key`, row a minus row b) over the seeds both rows have a
  finite value for; None when there is none."""
  seeds = tuple(seed for seed in sorted(set(rows.get(a, {})) & set(rows.get(b, {})))
                if all(finite(rows[r][seed].get(key)) for r in (a, b)))
  if not seeds:
    return None
  return seeds, paired_difference([rows[a][s][key] for s in seeds],
                                  [rows[b][s][key] for s in seeds])


def beyond_two_standard_errors(d: PairedDifference) -> bool:
  """|mean| exceeds twice its standard error (never with one seed: no standard error)."""
  return finite(d.standard_error) and abs(d.mean) > 2 * d.standard_error


def direction_verdict(d: PairedDifference) -> str:
  """Whether a difference bears out a direction that predicts it positive: "holds in every
  seed" when every per-seed difference is positive, "beyond two standard errors" when the mean
  exceeds twice its standard error."""
  every = d.all_agree and d.mean > 0
  beyond = d.mean > 0 and beyond_two_standard_errors(d)
  if every and beyond:
    return "holds in every seed, beyond two standard errors"
  if every:
    return "holds in every seed, within two standard errors"
  if beyond:
    return "beyond two standard errors, but not in every seed"
  if d.mean > 0:
    return "same direction on average, not in every seed, within two standard errors"
  if d.all_agree:
    return "reversed in every seed"
  return "does not hold"


def two_sided_verdict(d: PairedDifference) -> str:
  """For a comparison that predicts no sign: whether every seed agrees and whether |mean|
  exceeds two standard errors."""
  beyond = beyond_two_standard_errors(d)
  if d.all_agree and beyond:
    return "same sign in every seed, beyond two standard errors"
  if d.all_agree:
    return "same sign in every seed, within two standard errors"
  if beyond:
    return "beyond two standard errors, but not the same sign in every seed"
  return "within two standard errors, not the same sign in every seed"


def format_difference(seeds: Sequence[int], d: PairedDifference) -> str:
  """`+0.083 ± 0.017 (seeds 0, 1, 2: +0.100, +0.050, +0.100)`: mean ± standard error."""
  se = f"{d.standard_error:.3f}" if finite(d.standard_error) else "n/a"
  return (f"{d.mean:+.3f} ± {se} (seeds {', '.join(map(str, seeds))}: "
          f"{', '.join(f'{x:+.3f}' for x in d.per_seed)})")


def finite(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------------- cells


DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "ablations")
# What decides a cell's result besides the code: the gins every stage reads.
FINGERPRINT_GINS = ("gin_configs/experiments/toy_*.gin", "gin_configs/runs/*.gin",
                    "gin_configs/models/*.gin")
# Gins of a system no stage of these benches runs (RETRO's, the FiD reader's): they decide no
# cell, and counting them would make every kept cell again whenever they change.
FINGERPRINT_EXCLUDED = ("gin_configs/experiments/toy_retro.gin", "gin_configs/runs/retro.gin",
                        "gin_configs/experiments/toy_finetune_fid.gin")
# Parameters added after cells were kept, at the value that keeps the old computation: left out
# of the fingerprint at that value (so the kept cells stay valid); any other value enters it.
INERT_PARAMETERS = {"realm_jax.jobs.pretrain.PretrainJob": {"oracle_blocks": "0"},
                    **{f"realm_jax.jobs.{job}": {"shuffle_buffer": "None"}
                       for job in ("mlm.MlmJob", "ict.IctJob", "ict.ContrieverJob")}}


def world_options() -> dict:
  """Fingerprint options every bench's cells share: the toy world's generator version (a new
  world makes new cells) and the split the tables report (cells measured on dev, before the
  report moved to test, are not reused)."""
  from realm_jax.data import toy_world  # pylint: disable=import-outside-toplevel
  return {"toy_world_generator_version": toy_world.GENERATOR_VERSION, "eval_split": EVAL_SPLIT}


def cell_options(*, toy_bert_sha256: Optional[str], ict_from_bert: bool,
                 pretrain_steps: Optional[int], finetune_steps: Optional[int]) -> dict:
  """What this bench's cells are fingerprinted with besides the gins."""
  return {"toy_bert_sha256": toy_bert_sha256, "ict_from_bert": ict_from_bert,
          "pretrain_steps": pretrain_steps, "finetune_steps": finetune_steps,
          "refit_seed_offset": REFIT_SEED_OFFSET, **world_options()}


def toy_cell_options(*, toy_bert: Optional[str], ict_from_bert: bool,
                     pretrain_steps: Optional[int], finetune_steps: Optional[int]) -> dict:
  """`cell_options` of toy-world runs from the BERT directory `toy_bert` (None: random)."""
  from realm_jax import toy_bert as toy_bert_lib  # pylint: disable=import-outside-toplevel
  return cell_options(
      toy_bert_sha256=toy_bert_lib.weights_sha256(toy_bert) if toy_bert else None,
      ict_from_bert=ict_from_bert, pretrain_steps=pretrain_steps, finetune_steps=finetune_steps)


def fingerprint(options: dict, *, gins: Sequence[str] = FINGERPRINT_GINS,
                excluded: Sequence[str] = FINGERPRINT_EXCLUDED) -> str:
  """sha256 over `options` (the toy BERT's sha256, `world_options()`, steps...) and what the
  bench's gins configure: `gin_utils.effective_bindings` of each gin among `gins` (glob patterns
  under the repository, less `excluded`) that configures an entry point (binds a `*_main`),
  its includes and the Python defaults it leaves in place resolved. Comments, moving a binding
  or an included gin, and a binding that restates its default keep the fingerprint; a value that
  changes, in a gin or as a default, makes new cells. The gins' paths do not enter it."""
  # pylint: disable=import-outside-toplevel,unused-import
  import realm_jax.build_index  # noqa: F401  registers build_index_main
  import realm_jax.evaluate  # noqa: F401  registers evaluate_main
  import realm_jax.train  # noqa: F401  registers train_main and the jobs
  from realm_jax import gin_utils
  # pylint: enable=import-outside-toplevel,unused-import
  configured = []
  for pattern in gins:
    for path in glob.glob(os.path.join(REPO, pattern)):
      relative = os.path.relpath(path, REPO)
      if relative in excluded:
        continue
      bindings = gin_utils.effective_bindings(relative, root=REPO)
      for configurable, inert in INERT_PARAMETERS.items():
        values = bindings.get(configurable, {})
        for name, value in inert.items():
          if values.get(name) == value:
            del values[name]
      if any(name.endswith("_main") for name in bindings):
        configured.append(json.dumps(bindings, sort_keys=True))
  digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
  for bindings in sorted(configured):
    digest.update(bindings.encode() + b"\0")
  return digest.hexdigest()


def _commit() -> str:
  try:
    return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def load_cell(path: str, expected_fingerprint: str) -> dict | None:
  """The kept summary of a finished cell, or None when there is none or it is stale."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      cell = json.load(f)
    summary, cell_fingerprint = cell["summary"], cell["fingerprint"]
  except (OSError, ValueError, KeyError) as e:
    print(f"ablations: {path}: unreadable ({e}); running the cell again", flush=True)
    return None
  if cell_fingerprint != expected_fingerprint:
    print(f"ablations: {path}: made with other gins or options (commit {cell.get('commit')}); "
          "running the cell again", flush=True)
    return None
  return summary


def cells_machines(paths_by_seed: Mapping[int, Iterable[str]]) -> Optional[str]:
  """The machines kept cells were measured on, for a section's stamp: "<machine>" when they
  share one, else "<machine> (seeds 0, 1); <other> (seed 3)" in order of first seed; None when
  no cell names one. paths_by_seed: {seed: the seed's cell files} (missing files skipped)."""
  seeds_by_machine: dict[str, list[int]] = {}
  for seed in sorted(paths_by_seed):
    for path in paths_by_seed[seed]:
      try:
        with open(path, encoding="utf-8") as f:
          machine = json.load(f).get("machine")
      except (OSError, ValueError):
        continue
      if machine and seed not in seeds_by_machine.setdefault(machine, []):
        seeds_by_machine[machine].append(seed)
  if len(seeds_by_machine) <= 1:
    return next(iter(seeds_by_machine), None)
  return "; ".join(f"{machine} ({'seed' if len(seeds) == 1 else 'seeds'} "
                   f"{', '.join(map(str, seeds))})" for machine, seeds in seeds_by_machine.items())


def save_cell(path: str, summary: dict, cell_fingerprint: str) -> None:
  """Writes a finished cell (atomically: a crash leaves the old file or none)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  record = {"summary": summary, "fingerprint": cell_fingerprint, "commit": _commit(),
            "date": datetime.date.today().isoformat(), "machine": report.machine()}
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(path + ".tmp", path)


def run_name(row: Row) -> str:
  """The directory of a pretraining row's runs under the seed's: a row's new version makes
  new runs rather than resuming the old version's."""
  return row.name if not row.version else f"{row.name}_v{row.version}"


def section_title(finetune_steps: Optional[int]) -> str:
  """The bench/docs/benchmarks.md section `--write` writes: one per fine-tuning length."""
  title = "Ablations on the toy world (paper Table 2)"
  return title if finetune_steps is None else f"{title}, fine-tuning {finetune_steps} steps"


def finetune_slot(name: str, finetune_steps: Optional[int]) -> str:
  """The directory (and evaluation name) of a fine-tuning: `name` at the gins' length, with the
  length appended for another, so that a seed's pretrainings are fine-tuned again at a new
  length beside the old fine-tunings instead of resuming them."""
  return name if finetune_steps is None else f"{name}_{finetune_steps}steps"


def runs_fingerprint(options: dict) -> str:
  """What a seed's runs directory is claimed with: the cells' fingerprint at the gins'
  fine-tuning length, since each length fine-tunes into directories of its own
  (`finetune_slot`) while the ICT and pretraining runs do not depend on it."""
  return fingerprint({**options, "finetune_steps": None})


def row_fingerprint(row: Row, options: dict) -> str:
  """The fingerprint of a row's cells: the bench's (`fingerprint(options)`), and the row's
  version when it has one (version 0 adds nothing, so its cells keep their fingerprint)."""
  return fingerprint(options if not row.version else {**options, "row_version": row.version})


def claim_runs_dir(path: str, cell_fingerprint: str) -> None:
  """Keeps `path`, a directory of a bench's training runs, only if its runs were made for
  `cell_fingerprint`'s cells (recorded beside it in `<path>.fingerprint`): one left by other
  gins, options or code (another fingerprint, or none recorded) is removed, so that a cell made
  again never resumes or re-evaluates an older run. The record is written before any run."""
  marker = os.path.normpath(path) + ".fingerprint"
  recorded = open(marker, encoding="utf-8").read().strip() if os.path.exists(marker) else None
  if recorded == cell_fingerprint:
    return
  if os.path.exists(path):
    made = f"fingerprint {recorded[:12]}" if recorded else "no fingerprint recorded"
    print(f"ablations: {path}: runs made for other gins, options or code ({made}); removed, "
          "its runs are made again", flush=True)
    shutil.rmtree(path)
  os.makedirs(os.path.dirname(marker) or ".", exist_ok=True)
  with open(marker + ".tmp", "w", encoding="utf-8") as f:
    f.write(cell_fingerprint + "\n")
  os.replace(marker + ".tmp", marker)


PRETRAINING_ID_FILE = "PARAMS_VALUES_SHA256.json"


def pretraining_id(run_dir: str) -> Optional[str]:
  """Which pretraining `run_dir` holds: the sha256 of its last checkpoint's parameter values, or
  None when it has not finished. A toy pretraining made again from the same seed, gins and code
  on the same CPU model trains the same values (seed 0's REALM row and bench/methods.py's
  marginal row, made on different days, agree to every digit), so the cells of a pretraining
  made in one sitting stay paired with those of its remake in the next. On another CPU model it
  does not: XLA compiles for the host's instruction set (capping it at AVX2 on one machine
  changes the values after 20 ICT steps), and the remake's cells are paired with it alone.
  Computed once per finished run and kept beside its TRAINING_DONE."""
  from realm_jax import checkpoints, fileio  # pylint: disable=import-outside-toplevel
  try:
    with open(os.path.join(run_dir, checkpoints.TRAINING_DONE), encoding="utf-8") as f:
      done = json.load(f)
    done_unix = done["done_unix"]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  kept_path = os.path.join(run_dir, PRETRAINING_ID_FILE)
  try:
    with open(kept_path, encoding="utf-8") as f:
      kept = json.load(f)
    if kept["done_unix"] == done_unix:
      return kept["pretraining_id"]
  except (OSError, ValueError, KeyError, TypeError):
    pass
  step = done.get("last_checkpoint")
  if step is None:
    step = checkpoints.latest_checkpoint_step(run_dir)
  if step is None:
    raise RuntimeError(f"{run_dir}: TRAINING_DONE but no checkpoint to identify the run by")
  digest = checkpoints.params_values_sha256(checkpoints.checkpoint_path(run_dir, step))
  identity = f"params {digest[:16]} (step {step})"
  fileio.write_json_atomically(kept_path, {"done_unix": done_unix, "pretraining_id": identity})
  return identity


def family_cells_to_make(base: str, finetunings: Sequence[str], wanted: Sequence[str],
                         kept: Mapping[str, Mapping], pretraining_in_out: Optional[str]
                         ) -> list[str]:
  """Which cells of one seed's `base` row and of the rows that fine-tune its pretraining to
  make, base first, so that every fine-tuning cell is paired with the base cell of the
  pretraining it fine-tuned.

  wanted: the rows asked for (the base is needed too when a fine-tuning row is); kept: {row:
  kept cell summary} with its "pretraining" id; pretraining_in_out: the id of the base row's
  pretraining in `--out` (None: none there, so the base cell makes one).
  """
  need = [row for row in (base, *finetunings)
          if row in wanted or (row == base and any(f in wanted for f in finetunings))]

  def valid(row: str, pretraining: Optional[str]) -> bool:
    return (row in kept and pretraining is not None
            and kept[row].get("pretraining") == pretraining)

  base_pretraining = kept[base].get("pretraining") if base in kept else None
  if base_pretraining is not None and all(valid(row, base_pretraining) for row in need):
    return []
  # What is made reads the pretraining in --out (or makes one): kept cells of another are
  # made again.
  return [row for row in need if not valid(row, pretraining_in_out)]


def plan_family(base: str, finetunings: Sequence[str], wanted: Sequence[str],
                kept: Mapping[str, Mapping], base_pretrain_dir: str,
                make_pretraining: Callable[[], Any]) -> list[str]:
  """`family_cells_to_make`, after making the kept base cell's pretraining again when `--out`
  no longer holds it and a cell of its family is to be made (a session's runs do not outlive
  it; its kept cells do). A remake that trains the same values (`pretraining_id`) keeps every
  kept cell paired with it, so only the missing cells are made; one that does not makes the
  base cell and its fine-tunings again, as before."""
  in_out = pretraining_id(base_pretrain_dir)
  made = family_cells_to_make(base, finetunings, wanted, kept, in_out)
  if in_out is None and base in made and base in kept:
    make_pretraining()
    made = family_cells_to_make(base, finetunings, wanted, kept,
                                pretraining_id(base_pretrain_dir))
  return made


def cell_summary(row: Row, recipe_summary: dict, *, minutes: float, qa_checkpoint: str,
                 pretraining: Optional[str]) -> dict:
  """A cell: the table's columns from the recipe's summary (kept whole under "recipe").

  The row's EM is the recipe's fine-tuning slot's ("qa_em_realm"); its zero-shot recall is its
  retriever's before fine-tuning: the warm start's index (recall before pretraining) for rows
  that fine-tune the ICT retriever, else the final pretraining index. The pretraining columns
  are REALM's own for fine-tuning rows, which pretrain nothing: left out (NaN)."""
  own = row.pretrains
  from_warm_start = row.kwargs.get("finetune_retriever") == "warm_start"
  return {
      EM: recipe_summary["qa_em_realm"],
      RECALL: recipe_summary["recall@5_before" if from_warm_start else "recall@5_after"],
      "mlm_accuracy": recipe_summary["mlm_accuracy_realm"] if own else math.nan,
      "retrieval_utility": recipe_summary["retrieval_utility_last"] if own else math.nan,
      "refreshes": recipe_summary["refreshes"] if own else math.nan,
      "qa_checkpoint": qa_checkpoint, "pretraining": pretraining, "minutes": minutes,
      "recipe": recipe_summary,
  }


def evaluated_checkpoint(metrics_path: str) -> str:
  """Which checkpoint an evaluation read ("best by eval/exact_match=... in best.json" when dev
  picked it), from its metrics JSON."""
  with open(metrics_path, encoding="utf-8") as f:
    metrics = json.load(f)
  return f"step {metrics.get('checkpoint_step')}: {metrics.get('checkpoint_choice')}"


def dev_picked(cell: Mapping) -> bool:
  """Whether the cell's EM is of the checkpoint dev EM picked (best.json)."""
  return "best by eval/exact_match" in str(cell.get("qa_checkpoint"))


# ---------------------------------------------------------------------------- runs


def _untrained_ict(shared: recipe_lib.Recipe, seed: int) -> str:
  """An ICT run of one step at learning rate 0: its checkpoint is the towers as ICT starts them
  (random weights, or the BERT under a fresh pooler and projection with `--ict_from bert`), the
  retriever REALM would have without ICT (Adam's update and the decoupled weight decay are both
  scaled by the learning rate)."""
  run_dir = os.path.join(os.path.dirname(shared.out), "ict_untrained")
  if not shared.trained(run_dir):
    shared.train_ict(run_dir, "ict_untrained.log", "NUM_STEPS=1", "LEARNING_RATE=0.0",
                     "train_main.checkpoint_every=1", f"train_main.seed={seed}")
  return run_dir


def _cell_recipe(row: Row, seed: int, seed_out: str, shared: recipe_lib.Recipe, store: str, *,
                 pretrain_steps: Optional[int], finetune_steps: Optional[int],
                 toy_bert: Optional[str], ict_from_bert: bool) -> recipe_lib.Recipe:
  """The recipe of one cell (its seed's shared ICT warm start made first when missing)."""
  seed_binding = f"train_main.seed={seed}"
  shared.stage(f"seed {seed}: the shared ICT warm start", shared.trained(shared.ict),
               lambda: shared.train_ict(shared.ict, "ict.log", seed_binding))
  kwargs = dict(row.kwargs)
  ict_dir = (_untrained_ict(shared, seed) if kwargs.pop("ict", None) == "untrained"
             else shared.ict)
  offset = kwargs.pop("finetune_seed_offset", 0)
  steps = lambda n: [f"NUM_STEPS={n}"] if n is not None else []
  # A fine-tuning row's bindings of the pretraining are REALM's: should the pretraining be
  # missing from --out, it is made again as the REALM row makes it.
  kwargs["pretrain_bindings"] = [*steps(pretrain_steps), seed_binding,
                                 *kwargs.get("pretrain_bindings", [])]
  kwargs["finetune_bindings"] = [*steps(finetune_steps), f"train_main.seed={seed + offset}"]
  kwargs["finetune_name"] = finetune_slot("finetune" if row.pretrains else row.name,
                                         finetune_steps)
  run_dir = os.path.join(seed_out, run_name(row) if row.pretrains else BASE)
  return recipe_lib.Recipe(run_dir, store, ict_dir=ict_dir, toy_bert=toy_bert,
                           ict_from_bert=ict_from_bert, eval_split=EVAL_SPLIT, baseline=False,
                           **kwargs)


def _toy_seed_recipes(seed: int, seed_out: str, store: str, *, pretrain_steps: Optional[int],
                      finetune_steps: Optional[int], toy_bert: Optional[str],
                      ict_from_bert: bool) -> Callable[[Row], recipe_lib.Recipe]:
  """row -> that row's recipe for one seed of the toy world (`_cell_recipe`), all sharing the
  seed's ICT warm start under `<seed_out>/shared`. Call it after the seed's claim: a Recipe makes
  its directories when built, and the claim may remove them."""
  shared = recipe_lib.Recipe(os.path.join(seed_out, "shared"), store, toy_bert=toy_bert,
                             ict_from_bert=ict_from_bert, baseline=False)
  return lambda row: _cell_recipe(row, seed, seed_out, shared, store,
                                  pretrain_steps=pretrain_steps, finetune_steps=finetune_steps,
                                  toy_bert=toy_bert, ict_from_bert=ict_from_bert)


# ---------------------------------------------------------------------------- the wiki world


def wiki_cell_options(smoke: bool = False) -> dict:
  """What the wiki world's cells are fingerprinted with besides the gins."""
  return {**wiki_runs.world_options(EVAL_SPLIT, smoke),
          "pretrain_steps": wiki_runs.recipe_steps("pretrain", smoke)}


def wiki_seed_dir(out: str, seed: int, smoke: bool = False, bert: Optional[str] = None) -> str:
  """`wiki_runs.seed_dir`, claimed for the world's options (`claim_runs_dir`; `bert`: an English
  BERT directory other than the shipped one)."""
  path = wiki_runs.seed_dir(out, seed, bert)
  claim_runs_dir(path, fingerprint(wiki_runs.world_options(EVAL_SPLIT, smoke, bert)))
  return path


def wiki_base_run(smoke: bool = False) -> str:
  """REALM's run under a wiki seed's directory: the compute curve's 1x, the same run."""
  return f"steps{wiki_runs.recipe_steps('pretrain', smoke)}"


def wiki_row_kwargs(row: Row) -> dict:
  """A row's recipe arguments on the wiki world: its pretraining tasks the own corpus's
  (`realm_own_*`), a fine-tuning row's slot named after it."""
  kwargs = {key: value for key, value in row.kwargs.items() if key != "ict"}
  kwargs["pretrain_bindings"] = [binding.replace("'realm_toy_", f"'realm_{recipe_lib.OWN_CORPUS}_")
                                 for binding in kwargs.get("pretrain_bindings", [])]
  if not row.pretrains and row.name != "orqa":
    kwargs["finetune_name"] = row.name
  return kwargs


def wiki_cell_recipe(row: Row, seed: int, out: str, smoke: bool = False):
  """The wiki recipe of one cell (`wiki_runs.recipe`): the ORQA-style baseline is REALM's run,
  which fine-tunes it beside REALM; "no ICT" starts from an untrained ICT run of its own.
  `smoke`: at `wiki_runs.SMOKE_STEPS`."""
  wiki_seed_dir(out, seed, smoke)
  kwargs = wiki_row_kwargs(row)
  name = run_name(row) if row.pretrains and row.name != BASE else wiki_base_run(smoke)
  steps = wiki_runs.recipe_steps("pretrain", smoke)
  if row.kwargs.get("ict") == "untrained":
    shared = wiki_runs.recipe(out, seed, wiki_base_run(smoke), pretrain_steps=steps,
                              smoke=smoke)
    shared.prepare()  # the BlockStore and the settings ICT reads
    kwargs["ict_dir"] = _untrained_ict(shared, seed)
  return wiki_runs.recipe(out, seed, name, pretrain_steps=steps, smoke=smoke, **kwargs)


def wiki_cell_summary(row: Row, summary: dict, *, minutes: float, qa_checkpoint: str,
                      pretraining: Optional[str]) -> dict:
  """`cell_summary` from the wiki recipe's summary: the row's EM is its fine-tuning slot's (the
  baseline's for "orqa"), its zero-shot recall that slot's retriever's (the warm start's for the
  baseline); the pretraining columns at the checkpoint the recipe fine-tunes, by retrieval
  utility, the utility at the last."""
  own = row.pretrains
  orqa = row.name == "orqa"
  return {
      EM: summary["qa"]["orqa" if orqa else "realm"]["exact_match"],
      RECALL: summary["recall"]["warm_start" if orqa else "pretrained"]["recall@5"],
      "mlm_accuracy": summary["mlm_accuracy_realm"] if own else math.nan,
      "retrieval_utility": summary["retrieval_utility"]["last"] if own else math.nan,
      "refreshes": summary["refreshes"] if own else math.nan,
      "qa_checkpoint": qa_checkpoint, "pretraining": pretraining, "minutes": minutes,
      "recipe": summary,
  }


def _make_cell(row: Row, seed: int, recipe: recipe_lib.Recipe, world: str = "toy") -> dict:
  """Runs one cell's recipe (stages already done are skipped) and returns its cell."""
  print(f"\nablations: seed {seed}: {row.label} ...", flush=True)
  start = time.monotonic()
  summary = recipe.run()
  minutes = (time.monotonic() - start) / 60
  if world == "wiki":
    cell = wiki_cell_summary(
        row, summary, minutes=minutes, pretraining=pretraining_id(recipe.pretrain),
        qa_checkpoint=evaluated_checkpoint(recipe.qa_metrics_path(
            "orqa" if row.name == "orqa" else "realm")))
  else:
    cell = cell_summary(row, summary, minutes=minutes,
                        qa_checkpoint=evaluated_checkpoint(recipe.qa_metrics_path()),
                        pretraining=pretraining_id(recipe.pretrain))
  if not dev_picked(cell):
    print(f"ablations: seed {seed}: {row.label}: the evaluation did not read the checkpoint "
          f"dev picked ({cell['qa_checkpoint']})", flush=True)
  return cell


def run(out: str, only: tuple[str, ...], *, seeds: tuple[int, ...], pretrain_steps: int | None,
        finetune_steps: int | None, toy_bert: str | None = None,
        ict_from_bert: bool = False, cells: str = DEFAULT_CELLS,
        world: str = "toy", smoke: bool = False,
        make: bool = True) -> dict[str, dict[int, dict]]:
  """{row name: {seed: cell}}. Finished cells are kept in `cells` and reused (see the module
  docstring); REALM's row is measured too when a row that fine-tunes its pretraining is. `world`
  'wiki': the rows of `WIKI_ROWS` on the wiki world (`wiki_runs`, the recipe's steps, its
  English BERT: the step and BERT arguments must be left as they are; `smoke`: its cells at
  `wiki_runs.SMOKE_STEPS`, the bench itself checked). `make` False: nothing is made or removed,
  the kept cells of the current fingerprints are read as they are."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  wiki = world == "wiki"
  if wiki and (pretrain_steps, finetune_steps, toy_bert, ict_from_bert) != (None, None, None,
                                                                            False):
    raise ValueError("the wiki world's rows take the wiki recipe's steps and English BERT")
  store = None if wiki else realm_jax_tasks.toy_block_store_dir()
  os.makedirs(out, exist_ok=True)
  options = wiki_cell_options(smoke) if wiki else toy_cell_options(
      toy_bert=toy_bert, ict_from_bert=ict_from_bert, pretrain_steps=pretrain_steps,
      finetune_steps=finetune_steps)
  seed_runs_fingerprint = runs_fingerprint(options)
  fingerprints = {row.name: row_fingerprint(row, options) for row in ROWS}
  wanted = [row.name for row in ROWS if (not only or row.name in only)
            and (not wiki or row.name in WIKI_ROWS)]
  # The fine-tuning rows are compared with REALM's, whose pretraining they fine-tune.
  needed = {*wanted, *([BASE] if set(wanted) & set(FINETUNINGS) else [])}
  rows: dict[str, dict[int, dict]] = {}
  for seed in seeds:
    seed_out = os.path.join(out, f"seed{seed}")
    path = lambda name: os.path.join(cells, f"seed{seed}_{name}.json")
    kept = {name: cell for name in sorted(needed)
            if (cell := load_cell(path(name), fingerprints[name])) is not None}
    if not make:
      for name, cell in kept.items():
        rows.setdefault(name, {})[seed] = cell
      continue
    base_pretrain = (os.path.join(wiki_runs.seed_dir(out, seed), wiki_base_run(smoke), "pretrain")
                     if wiki else os.path.join(seed_out, BASE, "pretrain"))
    finetunings = tuple(name for name in FINETUNINGS if not wiki or name in WIKI_ROWS)
    family = family_cells_to_make(BASE, finetunings, wanted, kept, pretraining_id(base_pretrain))
    if (family or needed - set(kept)) and not wiki:
      # Something is made: not from runs of other gins or code (a wiki recipe claims its own).
      claim_runs_dir(seed_out, seed_runs_fingerprint)
    if wiki:
      recipe = lambda row: wiki_cell_recipe(row, seed, out, smoke)  # noqa: E731
      make_pretraining = lambda: recipe(ROW_BY_NAME[BASE]).run()  # noqa: E731
    else:
      recipe = _toy_seed_recipes(seed, seed_out, store, pretrain_steps=pretrain_steps,
                                 finetune_steps=finetune_steps, toy_bert=toy_bert,
                                 ict_from_bert=ict_from_bert)
      make_pretraining = lambda: recipe(ROW_BY_NAME[BASE]).run_pretraining()  # noqa: E731
    if family:
      # Planned again: the claim may have removed the pretraining the kept cells read.
      family = plan_family(BASE, finetunings, wanted, kept, base_pretrain, make_pretraining)
    for row in ROWS:
      if row.name not in needed:
        continue
      in_family = row.name == BASE or not row.pretrains
      make = row.name in family if in_family else row.name not in kept
      if not make:
        print(f"ablations: seed {seed}: {row.label}: kept in {path(row.name)}", flush=True)
        rows.setdefault(row.name, {})[seed] = kept[row.name]
        continue
      if row.name in kept:
        print(f"ablations: seed {seed}: {row.label}: the kept cell is not of the REALM "
              f"pretraining the seed's fine-tuning rows read; made again", flush=True)
      cell = _make_cell(row, seed, recipe(row), world)
      save_cell(path(row.name), cell, fingerprints[row.name])
      rows.setdefault(row.name, {})[seed] = cell
  return rows


def realm_pretraining(out: str, seed: int, *, pretrain_steps: int | None,
                      toy_bert: str | None = None) -> str:
  """The run directory of one seed's REALM pretraining under `out` (as `run` lays it out),
  made when missing (its ICT warm start too): for a bench that reads the pretrained model itself
  where `run` kept only its cells."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  seed_out = os.path.join(out, f"seed{seed}")
  claim_runs_dir(seed_out, runs_fingerprint(toy_cell_options(
      toy_bert=toy_bert, ict_from_bert=False, pretrain_steps=pretrain_steps,
      finetune_steps=None)))
  recipe = _toy_seed_recipes(seed, seed_out, realm_jax_tasks.toy_block_store_dir(),
                             pretrain_steps=pretrain_steps, finetune_steps=None,
                             toy_bert=toy_bert, ict_from_bert=False)(ROW_BY_NAME[BASE])
  if not recipe.trained(recipe.pretrain):
    recipe.run_pretraining()
  return recipe.pretrain


# ---------------------------------------------------------------------------- the report


def mean_sd_cell(values: Sequence[Optional[float]], digits: int = 3) -> str:
  """`mean ± sample standard deviation` of the finite values ("n/a" when none; the mean alone
  for one)."""
  values = [v for v in values if finite(v)]
  if not values:
    return "n/a"
  # Thousands grouped: parameter counts read as 8,788,801.
  if len(values) == 1:
    return f"{values[0]:,.{digits}f}"
  return f"{np.mean(values):,.{digits}f} ± {np.std(values, ddof=1):,.{digits}f}"


def table(rows: Mapping[str, Mapping[int, dict]], world: str = "toy") -> str:
  """The rows measured, in the paper's order, as a Markdown table."""
  titles = column_titles(world)
  lines = ["| row | " + " | ".join(titles[key] for key, _ in COLUMNS) + " | minutes |",
           "|---" * (len(COLUMNS) + 2) + "|"]
  for row in ROWS:
    if row.name not in rows:
      continue
    cells = list(rows[row.name].values())
    values = [mean_sd_cell([c.get(key) for c in cells], 1 if key == "refreshes" else 3)
              for key, _ in COLUMNS]
    minutes = np.mean([c["minutes"] for c in cells])
    lines.append(f"| {row.label} | " + " | ".join(values) + f" | {minutes:.1f} |")
  not_picked = [f"{name} seed {seed}" for name, by_seed in rows.items()
                for seed, c in sorted(by_seed.items()) if not dev_picked(c)]
  if not_picked:
    lines.append(f"\nEvaluated on a checkpoint dev did not pick: {', '.join(not_picked)}.")
  return "\n".join(lines)


def direction_stats(rows: Mapping[str, Mapping[int, dict]]
                    ) -> list[tuple[Direction, str, tuple[int, ...], PairedDifference]]:
  """(direction, column key, seeds, paired difference better minus worse) for each direction
  and column measured; a column equal by construction (`same_retriever`) is left out."""
  out = []
  for direction in DIRECTIONS:
    for key in (EM, RECALL):
      if key == RECALL and direction.same_retriever:
        continue
      pair = paired(rows, direction.better, direction.worse, key)
      if pair is not None:
        out.append((direction, key, *pair))
  return out


def comparisons(rows: Mapping[str, Mapping[int, dict]], world: str = "toy") -> str:
  """One line per direction and column: the mean paired difference ± its standard error, the
  per-seed differences and the verdict (`direction_verdict`)."""
  stats = {(direction.says, key): (seeds, d) for direction, key, seeds, d in direction_stats(rows)}
  lines = []
  for direction in DIRECTIONS:
    if direction.better not in rows or direction.worse not in rows:
      continue
    where = "" if direction.paper else " (beside the paper)"
    for key in (EM, RECALL):
      title = column_titles(world)[key]
      if key == RECALL and direction.same_retriever:
        lines.append(f"* {direction.says}{where}, {title}: one retriever, equal by construction")
      elif (direction.says, key) in stats:
        seeds, d = stats[direction.says, key]
        lines.append(f"* {direction.says}{where}, {title}: {format_difference(seeds, d)}: "
                     f"{direction_verdict(d)}")
  return "\n".join(lines)


def noise_line(rows: Mapping[str, Mapping[int, dict]], world: str = "toy") -> str:
  """The fine-tuning noise ("REALM fine-tuned again" minus REALM, test EM: mean ± standard
  error and the standard deviation of the difference) next to the smallest effect of the
  paper's directions on test EM that it must resolve; "" before both rows are measured with two
  seeds."""
  pair = paired(rows, "realm_refit", BASE, EM)
  if pair is None or len(pair[0]) < 2:
    return ""
  seeds, d = pair
  sd = difference_std(d)
  em_title = column_titles(world)[EM]
  text = (f"Fine-tuning noise: REALM's pretraining fine-tuned again with fine-tuning seed "
          f"s + {REFIT_SEED_OFFSET}, minus REALM, {em_title}: "
          f"{format_difference(seeds, d)}; standard deviation of the difference {sd:.3f} (one "
          f"fine-tuning's own spread about {sd / math.sqrt(2):.3f}, if the two are independent).")
  effects = [(direction, e) for direction, key, _, e in direction_stats(rows)
             if key == EM and direction.paper]
  if effects:
    direction, e = min(effects, key=lambda item: abs(item[1].mean))
    se = f"{e.standard_error:.3f}" if finite(e.standard_error) else "n/a"
    text += (f" The smallest direction effect on {em_title}, {direction.says}: "
             f"{e.mean:+.3f} ± {se}")
    text += (f", {abs(e.mean) / sd:.1f} times the noise's standard deviation." if sd > 0
             else ".")
  return text


# The four fine-tunings of a seed's pretraining form a 2 x 2 design: (retriever, encoder) of
# REALM's pretraining or of the baseline (the ICT retriever, the toy BERT).
FACTORIAL = {("realm", "realm"): BASE, ("realm", "bert"): "realm_retriever_bert_encoder",
             ("ict", "realm"): "ict_retriever_realm_encoder", ("ict", "bert"): "orqa"}


def factorial_effects(rows: Mapping[str, Mapping[int, dict]], key: str = EM
                      ) -> Optional[tuple[tuple[int, ...], dict[str, PairedDifference]]]:
  """REALM minus the ORQA-style baseline on `key`, split by the 2 x 2 design (`FACTORIAL`) seed
  by seed: the retriever's effect (REALM's retriever against ICT's, averaged over the two
  encoders), the encoder's (REALM's encoder against the toy BERT, over the two retrievers) and
  their interaction; the first two add up to REALM minus the baseline. (seeds, {"retriever",
  "encoder", "interaction", "total"}: paired differences against zero), over the seeds all four
  rows have; None when there is none."""
  cells = {factors: rows.get(name, {}) for factors, name in FACTORIAL.items()}
  seeds = tuple(seed for seed in sorted(set.intersection(*(set(c) for c in cells.values())))
                if all(finite(c[seed].get(key)) for c in cells.values()))
  if not seeds:
    return None
  value = lambda retriever, encoder: np.array([cells[retriever, encoder][s][key] for s in seeds])
  rr, rb, ir, ib = (value("realm", "realm"), value("realm", "bert"), value("ict", "realm"),
                    value("ict", "bert"))
  zero = np.zeros(len(seeds))
  effects = {"retriever": ((rr - ir) + (rb - ib)) / 2, "encoder": ((rr - rb) + (ir - ib)) / 2,
             "interaction": ((rr - ir) - (rb - ib)) / 2, "total": rr - ib}
  return seeds, {name: paired_difference(list(e), list(zero)) for name, e in effects.items()}


def factorial_lines(rows: Mapping[str, Mapping[int, dict]], world: str = "toy") -> str:
  """`factorial_effects` on test EM, one line each, and beside the retriever's effect the
  change in zero-shot recall@5 its pretraining made (REALM's retriever minus ICT's); "" before
  the four rows share a seed."""
  found = factorial_effects(rows)
  if found is None:
    return ""
  seeds, effects = found
  bert = BERT_NAMES[world]
  titles = {"total": "REALM minus the ORQA-style baseline",
            "retriever": "of which REALM's retriever (against ICT's, mean over both encoders)",
            "encoder": f"of which REALM's encoder (against {bert}, mean over both "
                       "retrievers)",
            "interaction": "interaction (the retriever's effect with REALM's encoder minus "
                           f"with {bert}, halved)"}
  lines = [f"REALM against the ORQA-style baseline, {column_titles(world)[EM]}, split by its "
           f"2 x 2 design (retriever: REALM's or ICT's; encoder: REALM's or {bert}):"]
  for name in ("total", "retriever", "encoder", "interaction"):
    lines.append(f"* {titles[name]}: {format_difference(seeds, effects[name])}: "
                 f"{two_sided_verdict(effects[name])}")
  recall = paired(rows, BASE, "orqa", RECALL)
  if recall is not None and recall[0] == seeds and len(seeds) > 2:
    x, y = recall[1].per_seed, effects["retriever"].per_seed
    correlation = (f"{float(np.corrcoef(x, y)[0, 1]):+.2f}" if np.std(x) > 0 and np.std(y) > 0
                   else "undefined (one of the two is the same in every seed)")
    lines.append(f"* zero-shot recall@5, REALM's retriever minus ICT's: "
                 f"{format_difference(*recall)}; its correlation over the seeds with the "
                 f"retriever's effect on EM: {correlation}")
  return "\n".join(lines)


# ---------------------------------------------------------------------------- command line


def add_cell_flags(parser: argparse.ArgumentParser, default_cells: str) -> None:
  """--cells and --fresh_cells (and the --toy_bert they fingerprint) of a cell-keeping bench."""
  parser.add_argument("--toy_bert", default="shipped",
                      help="what every tower starts from, as the recipe's --toy_bert: 'shipped' "
                           "(default, the toy BERT), 'none' (random weights) or a "
                           "BertForMaskedLM directory")
  parser.add_argument("--cells", default=default_cells,
                      help="where finished cells are kept and reused (default: "
                           f"{os.path.relpath(default_cells, REPO)})")
  parser.add_argument("--fresh_cells", action="store_true",
                      help="delete the kept cells first (after a code change that alters "
                           "results)")


def parse_cell_flags(parser: argparse.ArgumentParser, args) -> tuple[str | None, str]:
  """(the toy BERT directory, the cells directory); deletes the kept cells on --fresh_cells and
  moves to the repository root, where the recipe's children run."""
  try:
    toy_bert = recipe_lib.toy_bert_dir(args.toy_bert)
  except ValueError as e:
    parser.error(str(e))
  cells = os.path.abspath(args.cells)
  os.chdir(REPO)
  if args.fresh_cells:
    for path in glob.glob(os.path.join(cells, "seed*_*.json")):
      os.remove(path)
  return toy_bert, cells


DEFAULT_SEEDS = (0, 1, 2, 3, 4)
DEFAULT_OUT = "/tmp/realm_ablations"
DEFAULT_WIKI_CELLS = os.path.join(REPO, "bench", "results", "ablations_wiki")


def write_wiki_section(rows: Mapping[str, Mapping[int, dict]], seeds: Sequence[int], cells: str,
                       text: str) -> None:
  """The wiki world's Table 2 section of bench/docs/benchmarks.md."""
  paths = {seed: [os.path.join(cells, f"seed{seed}_{name}.json") for name in rows]
           for seed in seeds}
  body = (
      f"`python bench/ablations.py --world wiki --write` on {cells_machines(paths)}: the wiki "
      "recipe (docs/wiki_world.md: the Vital Articles' leads as Z and X, their questions, the "
      "English BERT, ICT with removal probability "
      f"{recipe_lib.WIKI_ICT_REMOVE_PROBABILITY:g}, {wiki_runs.recipe_steps('pretrain')} "
      "pretraining steps with the retriever held for the first "
      f"{recipe_lib.WIKI_RETRIEVER_FROZEN_SHARE:g} of them, "
      f"{wiki_runs.recipe_steps('finetune')} fine-tuning steps) with one change per row, "
      f"seeds {', '.join(map(str, seeds))} "
      f"({sum(c['minutes'] for r in rows.values() for c in r.values()):.0f} minutes of runs; "
      f"cells in {os.path.relpath(cells, REPO)}/). The rows' changes are the toy table's, the "
      "masking rows on the own corpus's tasks (`realm_own_random_token`, "
      "`realm_own_random_span`). Fine-tuning starts from the pretraining checkpoint with the "
      "best retrieval utility and picks its own checkpoint by dev EM; EM and zero-shot "
      "recall@5 are on the test questions. The mixed rows, the ORQA-style baseline and the "
      "noise row are fine-tunings of REALM's pretraining of the seed, the baseline the one "
      "REALM's recipe makes beside it. Comparisons as in the toy world's table.\n\n" + text)
  report.write_section("Ablations on the wiki world (paper Table 2)", body)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=DEFAULT_OUT,
                      help="run directories (default %(default)s; keep it until a seed's "
                           "cells are done: the fine-tuning rows read REALM's pretraining)")
  parser.add_argument("--write", action="store_true",
                      help="write the table, the comparisons and the noise line into "
                           "bench/docs/benchmarks.md")
  parser.add_argument("--only", nargs="*", default=(), choices=[row.name for row in ROWS],
                      metavar="ROW",
                      help="measure only these rows (of: %(choices)s); REALM's is measured too "
                           "with any row that fine-tunes its pretraining")
  parser.add_argument("--seeds", nargs="+", type=int, default=DEFAULT_SEEDS,
                      help="seeds of every row, the pairs of the comparisons (default: "
                           f"{' '.join(map(str, DEFAULT_SEEDS))})")
  parser.add_argument("--pretrain_steps", type=int, default=None,
                      help="pretraining steps per row (default: the recipe's)")
  parser.add_argument("--finetune_steps", type=int, default=None,
                      help="fine-tuning steps per row (default: the recipe's)")
  parser.add_argument("--ict_from", choices=("random", "bert"), default="random",
                      help="what ICT's towers start from, as the recipe's --ict_from")
  parser.add_argument("--world", choices=("toy", "wiki"), default="toy",
                      help="the toy world (default) or the wiki world (docs/wiki_world.md: its "
                           "recipe's steps and English BERT, rows: " + ", ".join(WIKI_ROWS)
                           + f"; --out default {wiki_runs.DEFAULT_OUT}, shared with "
                           "bench/compute_curve.py, --cells default "
                           f"{os.path.relpath(DEFAULT_WIKI_CELLS, REPO)})")
  parser.add_argument("--smoke", action="store_true",
                      help="with --world wiki: its cells at a tiny size (ICT 8 steps, "
                           "pretraining 4, fine-tuning 4), every row's path checked in minutes; "
                           "with an --out and --cells of its own, never --write")
  parser.add_argument("--report_only", action="store_true",
                      help="make nothing: the table of the kept cells (with --write, its "
                           "section), a missing cell left out of its row")
  add_cell_flags(parser, DEFAULT_CELLS)
  args = parser.parse_args()
  wiki = args.world == "wiki"
  if args.smoke and (not wiki or args.write or args.cells == DEFAULT_CELLS
                     or args.out == DEFAULT_OUT):
    parser.error("--smoke: with --world wiki, an --out and --cells of its own, never --write")
  if wiki:
    if (args.pretrain_steps, args.finetune_steps, args.ict_from, args.toy_bert) != (
        None, None, "random", "shipped"):
      parser.error("--world wiki: its recipe's steps and English BERT (no --pretrain_steps, "
                   "--finetune_steps, --ict_from or --toy_bert)")
    if args.only and not set(args.only) <= set(WIKI_ROWS):
      parser.error(f"--world wiki measures the rows {', '.join(WIKI_ROWS)}")
    if args.cells == DEFAULT_CELLS:
      args.cells = DEFAULT_WIKI_CELLS
    if args.out == DEFAULT_OUT:
      args.out = wiki_runs.DEFAULT_OUT
  toy_bert, cells = parse_cell_flags(parser, args)
  rows = run(os.path.abspath(args.out), tuple(args.only), seeds=tuple(args.seeds),
             pretrain_steps=args.pretrain_steps, finetune_steps=args.finetune_steps,
             toy_bert=None if wiki else toy_bert, ict_from_bert=args.ict_from == "bert",
             cells=cells, world=args.world, smoke=args.smoke, make=not args.report_only)
  text = "\n\n".join(part for part in (table(rows, args.world), comparisons(rows, args.world),
                                         noise_line(rows, args.world),
                                         factorial_lines(rows, args.world)) if part)
  print("\n" + text)
  if args.write and wiki:
    write_wiki_section(rows, args.seeds, cells, text)
  elif args.write:
    steps = lambda n: "the recipe's" if n is None else str(n)
    flags = "".join(f" --{name} {value}" for name, value in (
        ("pretrain_steps", args.pretrain_steps), ("finetune_steps", args.finetune_steps),
        ("cells", os.path.relpath(cells, REPO) if cells != DEFAULT_CELLS else None))
        if value is not None)
    refit = ("" if args.finetune_steps is None else
             " Each seed's ICT warm start and pretrainings are the runs of the gins' "
             "fine-tuning length (the section \"Ablations on the toy world (paper Table 2)\"; "
             "a pretraining `--out` no longer held is made again as it was made), fine-tuned "
             f"again for {args.finetune_steps} steps into directories of their own; the minutes "
             "count what this run made.")
    body = (
        "Toy world (gin_configs/experiments/toy_*.gin), every row measured "
        f"with seeds {', '.join(map(str, args.seeds))} by `python bench/ablations.py --write"
        f"{flags}` "
        f"({sum(c['minutes'] for r in rows.values() for c in r.values()):.0f} minutes of runs "
        f"in all; the cells are kept in {os.path.relpath(cells, REPO)}/ with their commit and "
        f"date).{refit} "
        f"Pretraining rows repeat pretraining ({steps(args.pretrain_steps)} steps), the "
        f"frozen fine-tuning index, fine-tuning ({steps(args.finetune_steps)} steps) and "
        "evaluation with one change; the two mixed rows, the ORQA-style baseline and REALM "
        "fine-tuned again are fine-tunings of the REALM row's pretraining of the same seed. "
        "All rows of a seed but \"no ICT\" share one ICT warm start and the seed's data "
        "order, so rows are compared seed by seed. Fine-tuning picks its checkpoint by toy QA "
        "dev EM (best.json); EM and zero-shot recall@5 are measured on toy QA test, which "
        "nothing was selected on. Zero-shot recall@5: an answer in the top 5 blocks the row's "
        "retriever finds for a toy QA test question before fine-tuning (the toy freezes the "
        "retriever in fine-tuning). Masked-span accuracy: masked wordpieces predicted exactly "
        "by REALM's marginal at the last pretraining checkpoint, on the row's own kind of masks "
        "(so the random-mask rows are not comparable with the others: random uniform masks 15% "
        "of a sentence's wordpieces, random spans are SpanBERT's, whole words in spans of 3.8 "
        "words on average until 15% of the sentence is masked, `realm_jax.data.masking`); "
        "retrieval utility is "
        "undefined without the null document; the three pretraining columns are n/a for the "
        "rows that pretrain nothing. Cells: mean ± sample standard deviation over the seeds.\n\n"
        "The 30x stale row: the paper refreshed its index every ~500 steps and its stale row "
        "30 times less often, still a refresh now and then. The toy refreshes at every "
        "pretraining checkpoint, every 80 of 400 steps; 30 times that, 2,400 steps, is longer "
        "than the run, so the toy row is never refreshed: it retrieves from the ICT index "
        "throughout, the paper's direction at its extreme rather than its schedule (its "
        "zero-shot recall is of its final retriever, indexed once after pretraining).\n\n"
        "Comparisons: row A minus row B seed by seed, mean ± standard error (sample standard "
        "deviation of the differences over √n) and the per-seed differences; a direction "
        "\"holds in every seed\" when every difference has the sign the paper predicts and is "
        "\"beyond two standard errors\" when the mean exceeds twice its standard error. Where "
        "two rows share their retriever, zero-shot recall is equal by construction.\n\n"
        + text)
    report.write_section(section_title(args.finetune_steps), body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
