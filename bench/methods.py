r"""The source documents' retrieval-training methods side by side on the toy world, 3 seeds a row.

  python bench/methods.py [--out /tmp/realm_methods] [--write] [--only ROW ...] [--seeds 0 1 2]

Every row is the toy recipe (`realm_jax.recipe.Recipe`: warm start, pretraining with the index
builder alongside, a frozen index, open-QA fine-tuning, evaluation on toy QA dev) with one
change, for every seed (`train_main.seed` of every stage):

  retriever objectives   `PretrainJob.retriever_objective`: REALM's marginal likelihood, EMDR²,
                         perplexity distillation (PDist), leave-one-out PDist (LOOP), attention
                         distillation (ADist); fine-tuning as the recipe's (the toy question
                         tower is frozen in fine-tuning, so the objective acts in pretraining)
  warm start             ICT (the marginal row; the objective rows of a seed share one ICT run)
                         against RetroMAE (experiments/toy_retromae.gin instead of
                         experiments/toy_ict.gin), with its decoder mask rate and at 70%,
                         both from random weights as the toy ICT, and at 70% from the toy
                         BERT (as published, RetroMAE continues BERT's pretraining)
  fine-tuning            full (the marginal row) against LoRA and bottleneck adapters
                         (`FinetuneJob.peft`), from the same pretrained checkpoint

Tables: (1) per objective, zero-shot recall@5 of the toy QA dev questions with the pretrained
retriever, masked salient-span accuracy and retrieval utility at the last pretraining checkpoint,
and fine-tuned dev EM; (2) per warm start, recall@5 before pretraining (the warm start's own
index) and the EM at the end; (3) per fine-tuning, EM, trainable parameters, seconds per step
and the size of a checkpoint. Cells: mean ± standard deviation over the seeds.

Every finished cell (a row and a seed) is kept in `bench/results/methods/` with its fingerprint,
commit and date, and reused by a later run (the same mechanism as bench/ablations.py: a run of
hours can be finished in another sitting); `--write` puts the tables into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

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
RETROMAE_GIN = "gin_configs/experiments/toy_retromae.gin"
# (row, description, Recipe keyword arguments besides RETROMAE_GIN): the gin's decoder mask
# rate and the top of the paper's 50-70%, from random weights as the toy ICT, and from the toy
# BERT, as published RetroMAE continues BERT's pretraining (from random weights its toy
# embeddings collapse at either rate: gin_configs/experiments/toy_retromae.gin).
WARM_STARTS = (
    ("warm_retromae", "RetroMAE", {}),
    ("warm_retromae_dec70", "RetroMAE, decoder mask 70%",
     {"warm_start_bindings": ["DECODER_MASK_RATE=0.7"]}),
    ("warm_retromae_bert_dec70", "RetroMAE from the toy BERT, decoder mask 70%",
     {"ict_from_bert": True, "warm_start_bindings": ["DECODER_MASK_RATE=0.7"]}),
)
DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "methods")
# The marginal row is also the ICT warm start's and the full fine-tuning's.
BASE_ROW = "objective_marginal"


def rows() -> list[tuple[str, str, dict]]:
  """(row, description, Recipe keyword arguments), the base row first (the others reuse its
  pretraining directory)."""
  out = [(f"objective_{name}", description,
          {"pretrain_bindings": [f"PretrainJob.retriever_objective='{name}'"]})
         for name, description in OBJECTIVES]
  out += [(row, description, {"warm_start_gin": RETROMAE_GIN, **kwargs})
          for row, description, kwargs in WARM_STARTS]
  out += [(f"peft_{name}", description, {"finetune_bindings": bindings,
                                          "finetune_name": f"finetune_{name}"})
          for name, description, bindings in PEFTS]
  return out


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


def run(out: str, only: tuple[str, ...], *, seeds: tuple[int, ...], toy_bert: str | None,
        cells: str = DEFAULT_CELLS) -> dict[str, list[dict]]:
  """{row: [summary of each seed]} (each with "minutes" and its fine-tuning's costs); finished
  cells are kept in `cells` and reused."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  from realm_jax import toy_bert as toy_bert_lib  # pylint: disable=import-outside-toplevel
  store = realm_jax_tasks.toy_block_store_dir()
  cell_fingerprint = ablations.fingerprint({
      "bench": "methods",
      "toy_bert_sha256": toy_bert_lib.weights_sha256(toy_bert) if toy_bert else None})
  results: dict[str, list[dict]] = {}
  for seed in seeds:
    seed_binding = f"train_main.seed={seed}"
    for name, description, kwargs in rows():
      if only and name not in only:
        continue
      cell_path = os.path.join(cells, f"seed{seed}_{name}.json")
      kept = ablations.load_cell(cell_path, cell_fingerprint)
      if kept is not None:
        print(f"methods: seed {seed}: {description}: kept in {cell_path}", flush=True)
        results.setdefault(name, []).append(kept)
        continue
      kwargs = dict(kwargs)
      # PEFT rows fine-tune the base row's pretrained model: its directory, stages 1-3 done.
      row_dir = os.path.join(out, f"seed{seed}", BASE_ROW if name.startswith("peft_") else name)
      if "warm_start_gin" not in kwargs:  # the objective rows of a seed share one ICT run
        shared = recipe_lib.Recipe(os.path.join(out, f"seed{seed}", "shared"), store,
                                   toy_bert=toy_bert, baseline=False)
        shared.stage(f"seed {seed}: the shared ICT warm start", shared.trained(shared.ict),
                     lambda: shared.train_ict(shared.ict, "ict.log", seed_binding))
        kwargs["ict_dir"] = shared.ict
      kwargs["warm_start_bindings"] = [seed_binding, *kwargs.get("warm_start_bindings", [])]
      kwargs["pretrain_bindings"] = [seed_binding, *kwargs.get("pretrain_bindings", [])]
      kwargs["finetune_bindings"] = [seed_binding, *kwargs.get("finetune_bindings", [])]
      print(f"\nmethods: seed {seed}: {description} ...", flush=True)
      start = time.monotonic()
      recipe = recipe_lib.Recipe(row_dir, store, toy_bert=toy_bert, eval_split="dev",
                                 baseline=False, **kwargs)
      summary = recipe.run()
      summary.update(finetune_costs(recipe.finetune,
                                    os.path.join(recipe.logs, f"{recipe.finetune_name}.log")))
      summary["minutes"] = (time.monotonic() - start) / 60
      ablations.save_cell(cell_path, summary, cell_fingerprint)
      results.setdefault(name, []).append(summary)
  return results


def _table(results, header: str, entries: list[tuple[str, str]],
           columns: list[tuple[str, str, int]]) -> str:
  """Markdown rows `entries` [(row, label)] x `columns` [(summary key, title, digits)]."""
  lines = [f"| {header} | " + " | ".join(title for _, title, _ in columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
  for row, label in entries:
    if row in results:
      lines.append(f"| {label} | " + " | ".join(
          ablations._cell([s[key] for s in results[row]], digits)  # pylint: disable=protected-access
          for key, _, digits in columns) + " |")
  return "\n".join(lines)


def tables(results: dict[str, list[dict]]) -> str:
  objectives = _table(results, "retriever objective (pretraining)",
                      [(f"objective_{n}", d) for n, d in OBJECTIVES],
                      [("recall@5_after", "zero-shot recall@5 (dev)", 3),
                       ("mlm_accuracy_realm", "masked-span accuracy", 3),
                       ("retrieval_utility_last", "retrieval utility", 3),
                       ("qa_em_realm", "fine-tuned EM (dev)", 3), ("minutes", "minutes", 1)])
  warm = _table(results, "warm start",
                [(BASE_ROW, "ICT"), *[(row, label) for row, label, _ in WARM_STARTS]],
                [("recall@5_before", "recall@5 before pretraining (dev)", 3),
                 ("recall@5_after", "recall@5 after pretraining (dev)", 3),
                 ("qa_em_realm", "fine-tuned EM (dev)", 3)])
  peft = _table(results, "fine-tuning",
                [(BASE_ROW, "full"), *[(f"peft_{n}", d) for n, d, _ in PEFTS]],
                [("qa_em_realm", "EM (dev)", 3), ("trainable_params", "trainable parameters", 0),
                 ("step_seconds", "seconds per step", 3),
                 ("checkpoint_mb", "checkpoint (MB)", 2)])
  return "\n\n".join([objectives, warm, peft])


# (row, against, summary key, what is compared): each row against the one it changes.
COMPARISONS = (
    *[(f"objective_{name}", BASE_ROW, key, f"{description} vs REALM's marginal, {title}")
      for name, description in OBJECTIVES[1:]
      for key, title in (("retrieval_utility_last", "retrieval utility"),
                         ("qa_em_realm", "fine-tuned EM"))],
    *[(row, BASE_ROW, key, f"{label} vs ICT, {title}")
      for row, label, _ in WARM_STARTS
      for key, title in (("recall@5_before", "recall@5 before pretraining"),
                         ("qa_em_realm", "fine-tuned EM"))],
    *[(f"peft_{name}", BASE_ROW, "qa_em_realm", f"{description} vs full fine-tuning, EM")
      for name, description, _ in PEFTS],
)


def comparisons(results: dict[str, list[dict]], seeds: tuple[int, ...]) -> str:
  """One line per COMPARISONS entry measured for every seed: the per-seed differences (rows of a
  seed share their warm start or pretraining, so a seed's pair differs by the change alone plus
  run-to-run noise), their mean ± std, and whether the mean stands clear of that std."""
  lines = []
  for row, against, key, says in COMPARISONS:
    if len(results.get(row, [])) != len(seeds) or len(results.get(against, [])) != len(seeds):
      continue
    # Rounded so that float noise in the subtraction has no sign.
    diffs = np.round([a[key] - b[key] for a, b in zip(results[row], results[against])], 9)
    mean, std = float(diffs.mean()), float(diffs.std())
    agree = int(np.sum(np.sign(diffs) == np.sign(mean))) if mean else 0
    verdict = ("differs beyond the seed spread" if abs(mean) > std and agree == len(diffs)
               else "within the seed spread")
    lines.append(f"* {says}: {verdict} (difference {mean:+.3f} ± {std:.3f} over seeds "
                 f"{', '.join(map(str, seeds))}; same sign in {agree} of {len(diffs)})")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="/tmp/realm_methods")
  parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
  parser.add_argument("--only", nargs="*", default=(), choices=[r[0] for r in rows()])
  parser.add_argument("--seeds", nargs="+", type=int, default=(0, 1, 2),
                      help="seeds of every row (default: 0 1 2)")
  ablations.add_cell_flags(parser, DEFAULT_CELLS)
  args = parser.parse_args()
  toy_bert, cells = ablations.parse_cell_flags(parser, args)
  results = run(os.path.abspath(args.out), tuple(args.only), seeds=tuple(args.seeds),
                toy_bert=toy_bert, cells=cells)
  text = tables(results)
  compared = comparisons(results, tuple(args.seeds))
  if compared:
    text += "\n\n" + compared
  print("\n" + text)
  if args.write:
    minutes = sum(s["minutes"] for r in results.values() for s in r)
    body = (
        "Toy world (gin_configs/experiments/toy_*.gin), seeds "
        f"{', '.join(map(str, args.seeds))}, measured by `python bench/methods.py --write` "
        f"({minutes:.0f} minutes of runs; the cells are kept in bench/results/methods/ with "
        "their commit and date). Each row is the recipe (warm start, 400 pretraining steps "
        "with the builder, the frozen fine-tuning index, fine-tuning, evaluation on toy QA "
        "dev) with one change. Cells: mean ± standard deviation over the seeds.\n\n" + text)
    report.write_section("The source documents' methods side by side (toy world)", body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
