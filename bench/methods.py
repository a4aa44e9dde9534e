r"""The source documents' retrieval-training methods side by side on the toy world, compared seed
by seed.

  python bench/methods.py [--out /tmp/realm_methods] [--write] [--only ROW ...]
      [--seeds 0 1 2 3 4]

Every row is the toy recipe (`realm_jax.recipe.Recipe`: warm start, pretraining with the index
builder alongside, a frozen index, open-QA fine-tuning, evaluation) with one change, for every
seed (`train_main.seed` of every stage). The methodology is bench/ablations.py's: fine-tuning
picks its checkpoint on toy QA dev (best.json), every figure is measured on toy QA test, which
nothing was selected on; rows of a seed share their warm start (when they have the same) and
data order, and each comparison is a paired difference seed by seed (`ablations.
paired_difference`: mean ± standard error, per-seed differences, every seed's sign). Rows:

  warm start             RetroMAE as its paper uses it: RetroMAE pre-training (from the toy
                         BERT, decoder mask rate 70%), THEN the contrastive stage (ICT continuing
                         the RetroMAE checkpoint's whole retriever, `IctJob.continue_retriever`:
                         its projection is part of the embedding RetroMAE trained), against the
                         toy BERT then ICT (ICT from the toy BERT, the recipe's `--ict_from
                         bert`): the comparison the warm-start table reads first. Beside them,
                         RetroMAE *instead of* ICT (experiments/toy_retromae.gin as the warm
                         start): at its gin's decoder mask rate and at 70%, both from random
                         weights as the toy ICT, and at 70% from the toy BERT; and ICT from
                         random weights (the recipe's, the marginal row below)
  retriever objectives   `PretrainJob.retriever_objective`: REALM's marginal likelihood, EMDR²,
                         perplexity distillation (PDist), leave-one-out PDist (LOOP), attention
                         distillation (ADist); fine-tuning as the recipe's (the toy question
                         tower is frozen in fine-tuning, so the objective acts in pretraining)
  fine-tuning            full (the marginal row) against LoRA and bottleneck adapters
                         (`FinetuneJob.peft`), fine-tunings of the marginal row's pretraining

A seed's shared warm starts are trained once in `<out>/seed<s>/shared/`: `ict` (the objective
rows'), `bert_ict`, `retromae_bert_dec70` (also the RetroMAE-from-BERT row's warm start) and
`retromae_ict` (ICT continuing it).

Tables: (1) per warm start, zero-shot recall@5 of the toy QA test questions with the warm
start's own index (before pretraining) and with the pretrained retriever, and the fine-tuned EM;
(2) per objective, zero-shot recall@5 with the pretrained retriever, masked salient-span accuracy
and retrieval utility at the last pretraining checkpoint, and fine-tuned EM; (3) per fine-tuning,
EM, trainable parameters, seconds per step and the size of a checkpoint. Cells: mean ± sample
standard deviation over the seeds. Below them the comparisons, each row against the one it
changes: RetroMAE then ICT against BERT then ICT is judged in the direction RetroMAE's paper
reports (RetroMAE's pre-training helps); the others predict no sign.

Every finished cell (a row and a seed) is kept in `bench/results/methods/` with its fingerprint
(bench/ablations.py's: the gins, the toy BERT's sha256, the toy world's generator version, the
report split), commit and date, and reused by a later run (a run of hours can be finished in
another sitting); a PEFT cell only beside the marginal cell of the pretraining it fine-tuned.
`--write` puts the tables and the comparisons into bench/docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import NamedTuple, Optional

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import recipe as recipe_lib  # noqa: E402  pylint: disable=wrong-import-position

OBJECTIVES = (("marginal", "REALM's marginal likelihood"), ("emdr2", "EMDR²"),
              ("pdist", "perplexity distillation (PDist)"),
              ("loop", "leave-one-out perplexity distillation (LOOP)"),
              ("adist", "attention distillation (ADist)"))
PEFTS = (("lora", "LoRA", ["FinetuneJob.peft='lora'"]),
         ("adapters", "bottleneck adapters", ["FinetuneJob.peft='adapters'"]))
ICT_GIN = "gin_configs/experiments/toy_ict.gin"
RETROMAE_GIN = "gin_configs/experiments/toy_retromae.gin"


class SharedWarmStart(NamedTuple):
  """A warm start several rows of a seed start from, trained once into
  `<out>/seed<s>/shared/<name>`: its gin, whether its towers start from the toy BERT, its extra
  bindings, and the shared warm start whose checkpoint it continues (None: none)."""
  gin: str
  from_bert: bool
  bindings: tuple[str, ...] = ()
  continues: Optional[str] = None


SHARED_WARM_STARTS = {
    "ict": SharedWarmStart(ICT_GIN, False),
    "bert_ict": SharedWarmStart(ICT_GIN, True),
    # From the toy BERT at the top of the paper's 50-70% (from random weights its toy embeddings
    # collapse at either rate: gin_configs/experiments/toy_retromae.gin).
    "retromae_bert_dec70": SharedWarmStart(RETROMAE_GIN, True, ("DECODER_MASK_RATE=0.7",)),
    # ICT continuing RetroMAE's whole retriever (IctJob.continue_retriever: its projection is
    # part of the embedding RetroMAE trained): RetroMAE's pre-training, then its contrastive
    # stage.
    "retromae_ict": SharedWarmStart(ICT_GIN, False, ("IctJob.continue_retriever=True",),
                                    continues="retromae_bert_dec70"),
}
# (row, description, Recipe keyword arguments; "warm_start" names a SHARED_WARM_STARTS entry).
# The first two are the comparison the warm-start table reads first.
WARM_STARTS = (
    ("warm_retromae_ict", "RetroMAE from the toy BERT (decoder mask 70%), then ICT",
     {"warm_start": "retromae_ict"}),
    ("warm_bert_ict", "the toy BERT, then ICT", {"warm_start": "bert_ict"}),
    ("warm_retromae", "RetroMAE instead of ICT", {"warm_start_gin": RETROMAE_GIN}),
    ("warm_retromae_dec70", "RetroMAE instead of ICT, decoder mask 70%",
     {"warm_start_gin": RETROMAE_GIN, "warm_start_bindings": ["DECODER_MASK_RATE=0.7"]}),
    ("warm_retromae_bert_dec70", "RetroMAE from the toy BERT instead of ICT, decoder mask 70%",
     {"warm_start": "retromae_bert_dec70"}),
)
DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "methods")
# The marginal row is also the ICT-from-random-weights warm start's and the full fine-tuning's.
BASE_ROW = "objective_marginal"
PEFT_ROWS = tuple(f"peft_{name}" for name, _, _ in PEFTS)


def rows() -> list[tuple[str, str, dict]]:
  """(row, description, Recipe keyword arguments, with "warm_start" a shared warm start), the
  base row first (the PEFT rows fine-tune its pretraining)."""
  out = [(f"objective_{name}", description,
          {"warm_start": "ict",
           "pretrain_bindings": [f"PretrainJob.retriever_objective='{name}'"]})
         for name, description in OBJECTIVES]
  out += [(row, description, dict(kwargs)) for row, description, kwargs in WARM_STARTS]
  out += [(f"peft_{name}", description, {"warm_start": "ict", "finetune_bindings": bindings,
                                          "finetune_name": f"finetune_{name}"})
          for name, description, bindings in PEFTS]
  return out


def shared_warm_start(name: str, shared_dir: str, seed: int, store: str,
                      toy_bert: Optional[str]) -> str:
  """The run directory of the seed's shared warm start `name` (`SHARED_WARM_STARTS`),
  `<shared_dir>/<name>`, trained with the seed on first use (and what it continues before
  it)."""
  spec = SHARED_WARM_STARTS[name]
  init = None
  if spec.continues is not None:
    init = recipe_lib.latest_checkpoint_dir(
        shared_warm_start(spec.continues, shared_dir, seed, store, toy_bert))
  recipe = recipe_lib.Recipe(shared_dir, store, toy_bert=toy_bert, ict_from_bert=spec.from_bert,
                             warm_start_gin=spec.gin, baseline=False)
  run_dir = os.path.join(shared_dir, name)
  recipe.stage(f"seed {seed}: the shared warm start {name}", recipe.trained(run_dir),
               lambda: recipe.train_ict(run_dir, f"{name}.log", f"train_main.seed={seed}",
                                        *spec.bindings, init_checkpoint=init))
  return run_dir


def finetune_costs(run_dir: str, log_path: str) -> dict:
  """Trainable parameters (from the run's description line), seconds per step (TensorBoard's
  perf/steps_per_s, the mean over the run) and the newest checkpoint's size in MB."""
  with open(log_path, encoding="utf-8") as f:
    text = f.read()
  # "8,805,185 params (16,384 trained)" for a PEFT run; "8,788,801 params" when all train.
  trainable = re.search(r"\(([\d,]+) trained\)", text) or re.search(r"([\d,]+) params", text)
  logdir = os.path.join(run_dir, "tensorboard")
  scalars = recipe_lib.read_scalars(logdir) if os.path.isdir(logdir) else {}
  rates = list(scalars.get("perf/steps_per_s", {}).values())
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  step = checkpoints.latest_checkpoint_step(run_dir)
  size = sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(checkpoints.checkpoint_path(run_dir, step))
             for name in names)
  return {"trainable_params": int(trainable.group(1).replace(",", "")) if trainable else None,
          "step_seconds": float(1.0 / np.mean(rates)) if rates else float("nan"),
          "checkpoint_mb": size / 2**20}


def _cell_recipe(name: str, kwargs: dict, seed: int, seed_dir: str, store: str,
                 toy_bert: Optional[str]) -> recipe_lib.Recipe:
  """The recipe of one cell (its warm start made first when the row names a shared one)."""
  seed_binding = f"train_main.seed={seed}"
  kwargs = dict(kwargs)
  warm_start = kwargs.pop("warm_start", None)
  if warm_start is not None:
    kwargs["ict_dir"] = shared_warm_start(warm_start, os.path.join(seed_dir, "shared"), seed,
                                          store, toy_bert)
  kwargs["warm_start_bindings"] = [seed_binding, *kwargs.get("warm_start_bindings", [])]
  kwargs["pretrain_bindings"] = [seed_binding, *kwargs.get("pretrain_bindings", [])]
  kwargs["finetune_bindings"] = [seed_binding, *kwargs.get("finetune_bindings", [])]
  # PEFT rows fine-tune the base row's pretrained model: its directory, stages 1-3 done.
  row_dir = os.path.join(seed_dir, BASE_ROW if name in PEFT_ROWS else name)
  return recipe_lib.Recipe(row_dir, store, toy_bert=toy_bert, eval_split=ablations.EVAL_SPLIT,
                           baseline=False, **kwargs)


def _make_cell(description: str, seed: int, recipe: recipe_lib.Recipe) -> dict:
  """Runs one cell's recipe (stages already done are skipped) and returns its summary, with
  "minutes", its fine-tuning's costs, the checkpoint its evaluation read and its pretraining."""
  print(f"\nmethods: seed {seed}: {description} ...", flush=True)
  start = time.monotonic()
  summary = recipe.run()
  summary.update(finetune_costs(recipe.finetune,
                                os.path.join(recipe.logs, f"{recipe.finetune_name}.log")))
  summary["minutes"] = (time.monotonic() - start) / 60
  summary["qa_checkpoint"] = ablations.evaluated_checkpoint(recipe.qa_metrics_path())
  summary["pretraining"] = ablations.pretraining_id(recipe.pretrain)
  if not ablations.dev_picked(summary):
    print(f"methods: seed {seed}: {description}: the evaluation did not read the checkpoint "
          f"dev picked ({summary['qa_checkpoint']})", flush=True)
  return summary


def run(out: str, only: tuple[str, ...], *, seeds: tuple[int, ...], toy_bert: str | None,
        cells: str = DEFAULT_CELLS) -> dict[str, dict[int, dict]]:
  """{row: {seed: summary}} (each with "minutes" and its fine-tuning's costs); finished cells
  are kept in `cells` and reused; the base row is measured too when a PEFT row is."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  from realm_jax import toy_bert as toy_bert_lib  # pylint: disable=import-outside-toplevel
  store = realm_jax_tasks.toy_block_store_dir()
  cell_fingerprint = ablations.fingerprint({
      "bench": "methods",
      "toy_bert_sha256": toy_bert_lib.weights_sha256(toy_bert) if toy_bert else None,
      **ablations.world_options()})
  all_rows = rows()
  wanted = [name for name, _, _ in all_rows if not only or name in only]
  needed = {*wanted, *([BASE_ROW] if set(wanted) & set(PEFT_ROWS) else [])}
  results: dict[str, dict[int, dict]] = {}
  for seed in seeds:
    seed_dir = os.path.join(out, f"seed{seed}")
    path = lambda name: os.path.join(cells, f"seed{seed}_{name}.json")
    kept = {name: cell for name in sorted(needed)
            if (cell := ablations.load_cell(path(name), cell_fingerprint)) is not None}
    kwargs_of = {name: kwargs for name, _, kwargs in all_rows}
    recipe = lambda name: _cell_recipe(  # noqa: E731
        name, kwargs_of[name], seed, seed_dir, store, toy_bert)  # pylint: disable=cell-var-from-loop
    family = ablations.plan_family(
        BASE_ROW, PEFT_ROWS, wanted, kept, os.path.join(seed_dir, BASE_ROW, "pretrain"),
        lambda: recipe(BASE_ROW).run_pretraining())
    for name, description, _ in all_rows:
      if name not in needed:
        continue
      make = name in family if name in (BASE_ROW, *PEFT_ROWS) else name not in kept
      if not make:
        print(f"methods: seed {seed}: {description}: kept in {path(name)}", flush=True)
        results.setdefault(name, {})[seed] = kept[name]
        continue
      summary = _make_cell(description, seed, recipe(name))
      ablations.save_cell(path(name), summary, cell_fingerprint)
      results.setdefault(name, {})[seed] = summary
  return results


def _table(results, header: str, entries: list[tuple[str, str]],
           columns: list[tuple[str, str, int]]) -> str:
  """Markdown rows `entries` [(row, label)] x `columns` [(summary key, title, digits)]; "" when
  no entry was measured."""
  if not any(row in results for row, _ in entries):
    return ""
  lines = [f"| {header} | " + " | ".join(title for _, title, _ in columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
  for row, label in entries:
    if row in results:
      lines.append(f"| {label} | " + " | ".join(
          ablations.mean_sd_cell([s.get(key) for s in results[row].values()], digits)
          for key, _, digits in columns) + " |")
  return "\n".join(lines)


def tables(results: dict[str, dict[int, dict]]) -> str:
  """The warm-start, objective and fine-tuning tables (rows not measured are left out)."""
  warm = _table(results, "warm start",
                [*[(row, label) for row, label, _ in WARM_STARTS[:2]],
                 (BASE_ROW, "ICT from random weights (the recipe's)"),
                 *[(row, label) for row, label, _ in WARM_STARTS[2:]]],
                [("recall@5_before", "zero-shot recall@5 of the warm start (test)", 3),
                 ("recall@5_after", "recall@5 after pretraining (test)", 3),
                 ("qa_em_realm", "fine-tuned EM (test)", 3)])
  objectives = _table(results, "retriever objective (pretraining)",
                      [(f"objective_{n}", d) for n, d in OBJECTIVES],
                      [("recall@5_after", "zero-shot recall@5 (test)", 3),
                       ("mlm_accuracy_realm", "masked-span accuracy", 3),
                       ("retrieval_utility_last", "retrieval utility", 3),
                       ("qa_em_realm", "fine-tuned EM (test)", 3), ("minutes", "minutes", 1)])
  peft = _table(results, "fine-tuning",
                [(BASE_ROW, "full"), *[(f"peft_{n}", d) for n, d, _ in PEFTS]],
                [("qa_em_realm", "EM (test)", 3), ("trainable_params", "trainable parameters", 0),
                 ("step_seconds", "seconds per step", 3),
                 ("checkpoint_mb", "checkpoint (MB)", 2)])
  return "\n\n".join(table for table in (warm, objectives, peft) if table)


WARM_KEYS = (("recall@5_before", "zero-shot recall@5 of the warm start"),
             ("recall@5_after", "recall@5 after pretraining"), ("qa_em_realm", "fine-tuned EM"))
# (row, against, summary key, what is compared, the sign the source predicts for row minus
# against: +1, or 0 for none): each row against the one it changes, RetroMAE's first.
COMPARISONS = (
    *[("warm_retromae_ict", "warm_bert_ict", key, f"RetroMAE then ICT vs BERT then ICT, {title}",
       1) for key, title in WARM_KEYS],
    *[(row, BASE_ROW, key, f"{label} vs ICT from random weights, {title}", 0)
      for row, label, _ in WARM_STARTS[2:] for key, title in WARM_KEYS[::2]],
    *[(f"objective_{name}", BASE_ROW, key, f"{description} vs REALM's marginal, {title}", 0)
      for name, description in OBJECTIVES[1:]
      for key, title in (("retrieval_utility_last", "retrieval utility"),
                         ("qa_em_realm", "fine-tuned EM"))],
    *[(f"peft_{name}", BASE_ROW, "qa_em_realm", f"{description} vs full fine-tuning, EM", 0)
      for name, description, _ in PEFTS],
)


def comparisons(results: dict[str, dict[int, dict]]) -> str:
  """One line per COMPARISONS entry with seeds in common: the paired difference seed by seed
  (rows of a seed share their warm start or pretraining where they can, so a seed's pair differs
  by the change plus run-to-run noise): mean ± standard error, per-seed differences, and the
  verdict (`ablations.direction_verdict` where the source predicts a sign, else
  `ablations.two_sided_verdict`)."""
  lines = []
  for row, against, key, says, sign in COMPARISONS:
    pair = ablations.paired(results, row, against, key)
    if pair is None:
      continue
    seeds, d = pair
    verdict = (ablations.direction_verdict(d) if sign > 0 else ablations.two_sided_verdict(d))
    lines.append(f"* {says}: {ablations.format_difference(seeds, d)}: {verdict}")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="/tmp/realm_methods",
                      help="run directories (default %(default)s)")
  parser.add_argument("--write", action="store_true",
                      help="write the tables and the comparisons into bench/docs/benchmarks.md")
  parser.add_argument("--only", nargs="*", default=(), choices=[r[0] for r in rows()],
                      metavar="ROW", help="measure only these rows (of: %(choices)s); the "
                                          f"base row {BASE_ROW} is measured too with a PEFT row")
  parser.add_argument("--seeds", nargs="+", type=int, default=ablations.DEFAULT_SEEDS,
                      help="seeds of every row, the pairs of the comparisons (default: "
                           f"{' '.join(map(str, ablations.DEFAULT_SEEDS))})")
  ablations.add_cell_flags(parser, DEFAULT_CELLS)
  args = parser.parse_args()
  toy_bert, cells = ablations.parse_cell_flags(parser, args)
  results = run(os.path.abspath(args.out), tuple(args.only), seeds=tuple(args.seeds),
                toy_bert=toy_bert, cells=cells)
  text = tables(results)
  compared = comparisons(results)
  if compared:
    text += "\n\n" + compared
  print("\n" + text)
  if args.write:
    minutes = sum(s["minutes"] for r in results.values() for s in r.values())
    body = (
        "Toy world (gin_configs/experiments/toy_*.gin), seeds "
        f"{', '.join(map(str, args.seeds))}, measured by `python bench/methods.py --write` "
        f"({minutes:.0f} minutes of runs; the cells are kept in bench/results/methods/ with "
        "their commit and date). Each row is the recipe (warm start, 400 pretraining steps "
        "with the builder, the frozen fine-tuning index, fine-tuning, evaluation) with one "
        "change. Fine-tuning picks its checkpoint by toy QA dev EM (best.json); every figure "
        "is measured on toy QA test, which nothing was selected on. RetroMAE then ICT: ICT "
        "continues the retriever RetroMAE pre-trained from the toy BERT (decoder mask 70%), "
        "as RetroMAE's paper follows its pre-training with contrastive fine-tuning; BERT then "
        "ICT: ICT from the toy BERT. Cells: mean ± sample standard deviation over the seeds. "
        "Comparisons: row minus the row it changes, seed by seed, mean ± standard error "
        "(sample standard deviation of the differences over √n) and the per-seed differences; "
        "RetroMAE then ICT against BERT then ICT is judged in the direction RetroMAE's paper "
        "reports (\"holds in every seed\" when every difference is positive, \"beyond two "
        "standard errors\" when the mean exceeds twice its standard error), the others "
        "two-sided.\n\n" + text)
    report.write_section("The source documents' methods side by side (toy world)", body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
