r"""Ablations like the paper's Table 2, on the toy world, every row in one run.

  python bench/ablations.py [--out /tmp/realm_ablations] [--write] [--only NAME ...]
      [--pretrain_steps 100] [--finetune_steps 150] [--ict_dir /tmp/realm_toy/ict]

Each row is the whole toy recipe (`realm_jax.recipe.Recipe`: pretraining with the index builder
alongside, a frozen index of the final checkpoint, open-QA fine-tuning, evaluation; shorter
than the recipe by default) with one
gin override of the pretraining stage, all from the same ICT warm start (trained once, in
`<out>/shared/ict`, or `--ict_dir`) unless the row removes it:

  REALM                      salient-span masking, null document, index refreshed, ICT start
  random-span masking        --gin.TASK='realm_toy_random_span'
  random-token masking       --gin.TASK='realm_toy_random_token'
  without the null document  --gin.train_main.null_document=False
  index never refreshed      no index builder: pretraining retrieves from the ICT index
  without ICT warm start     the retriever starts from random weights (an "ICT" run of one
                             step at learning rate 0 provides that checkpoint and its index)

Columns, as the paper's (NQ dev EM; zero-shot retrieval recall@5) plus what the toy shows:
toy QA dev EM after fine-tuning, recall@5 of the toy QA dev questions with the pretrained
retriever before fine-tuning, masked salient-span accuracy with retrieval at the end of
pretraining (on the row's own kind of masks), retrieval utility (undefined
without the null document) and index refreshes. `--write` puts the table into
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import recipe as recipe_lib  # noqa: E402  pylint: disable=wrong-import-position

# (name, description, Recipe keyword arguments)
VARIANTS = (
    ("realm", "REALM (salient span, null document, refresh, ICT)", {}),
    ("random_span", "random-span masking",
     {"pretrain_bindings": ["TASK='realm_toy_random_span'"]}),
    ("random_token", "random-token masking",
     {"pretrain_bindings": ["TASK='realm_toy_random_token'"]}),
    ("no_null", "without the null document",
     {"pretrain_bindings": ["train_main.null_document=False"]}),
    ("never_refresh", "index never refreshed", {"with_builder": False}),
    ("no_ict", "without ICT warm start", {"ict": "random"}),
)


def _random_ict(out: str) -> str:
  """An ICT run of one step at learning rate 0: its checkpoint is the random initialisation
  (Adam's update and the decoupled weight decay are both scaled by the learning rate)."""
  run_dir = os.path.join(out, "ict_random")
  recipe_lib.run_child(
      recipe_lib.python_module(
          "realm_jax.train", "--gin_file=gin_configs/experiments/toy_ict.gin",
          f"--gin.RUN_DIR='{run_dir}'", "--gin.NUM_STEPS=1", "--gin.LEARNING_RATE=0.0",
          "--gin.train_main.checkpoint_every=1"),
      os.path.join(out, "ict_random.log"))
  return run_dir


def _cell(value: float, digits: int = 3) -> str:
  return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else (
      f"{value:.{digits}f}")


def run(out: str, only: tuple[str, ...], *, pretrain_steps: int, finetune_steps: int,
        ict_dir: str | None = None) -> list[tuple[str, dict, float]]:
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  store = realm_jax_tasks.toy_block_store_dir()
  os.makedirs(out, exist_ok=True)
  shared = recipe_lib.Recipe(os.path.join(out, "shared"), store, ict_dir=ict_dir)
  print("ablations: the shared ICT warm start ...", flush=True)
  shared.stage("ICT warm start", shared.trained(shared.ict), lambda: recipe_lib.run_child(
      recipe_lib.python_module("realm_jax.train", "--gin_file=gin_configs/experiments/toy_ict.gin",
                         f"--gin.RUN_DIR='{shared.ict}'"),
      os.path.join(shared.logs, "ict.log")))
  rows = []
  for name, description, kwargs in VARIANTS:
    if only and name not in only:
      continue
    kwargs = dict(kwargs)
    ict = kwargs.pop("ict", None)
    ict_dir = _random_ict(out) if ict == "random" else shared.ict
    print(f"\nablations: {description} ...", flush=True)
    start = time.monotonic()
    kwargs["pretrain_bindings"] = [f"NUM_STEPS={pretrain_steps}",
                                   *kwargs.get("pretrain_bindings", [])]
    kwargs["finetune_bindings"] = [f"NUM_STEPS={finetune_steps}"]
    summary = recipe_lib.Recipe(os.path.join(out, name), store, ict_dir=ict_dir,
                                eval_split="dev", **kwargs).run()
    rows.append((description, summary, time.monotonic() - start))
  return rows


def table(rows) -> str:
  lines = ["| pretraining | toy QA dev EM | zero-shot recall@5 (dev) | masked-span accuracy "
           "| retrieval utility | refreshes | minutes |",
           "|---|---|---|---|---|---|---|"]
  for description, s, seconds in rows:
    lines.append(
        f"| {description} | {_cell(s['qa_em_realm'])} | {_cell(s['recall@5_after'])} | "
        f"{_cell(s['mlm_accuracy_realm'])} | {_cell(s['retrieval_utility_last'])} | "
        f"{s['refreshes']:.0f} | {seconds / 60:.1f} |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="/tmp/realm_ablations")
  parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
  parser.add_argument("--only", nargs="*", default=(), choices=[v[0] for v in VARIANTS])
  parser.add_argument("--pretrain_steps", type=int, default=100,
                      help="pretraining steps per row (the recipe: 200)")
  parser.add_argument("--finetune_steps", type=int, default=150,
                      help="fine-tuning steps per row (the recipe: 300)")
  parser.add_argument("--ict_dir", default=None,
                      help="reuse this toy ICT run (e.g. /tmp/realm_toy/ict) as the shared warm "
                           "start instead of training one")
  args = parser.parse_args()
  os.chdir(REPO)
  start = time.monotonic()
  rows = run(os.path.abspath(args.out), tuple(args.only), pretrain_steps=args.pretrain_steps,
             finetune_steps=args.finetune_steps,
             ict_dir=os.path.abspath(args.ict_dir) if args.ict_dir else None)
  text = table(rows)
  print("\n" + text)
  if args.write:
    body = (
        "Toy world, tiny model (gin_configs/experiments/toy_*.gin), every row measured in one "
        f"run of `python bench/ablations.py --write` ({(time.monotonic() - start) / 60:.0f} "
        f"minutes). Each row repeats pretraining ({args.pretrain_steps} steps, batch 8), the "
        f"frozen fine-tuning index, fine-tuning ({args.finetune_steps} steps, batch 16) and "
        "evaluation with one change; all rows but the last share one ICT warm start (600 "
        "steps). Zero-shot recall@5: an answer in the top 5 "
        "blocks the pretrained retriever finds for a toy QA dev question (before fine-tuning). "
        "Masked-span accuracy: masked salient-span wordpieces predicted exactly by REALM's "
        "marginal at the last pretraining checkpoint (for the random-span and random-token "
        "rows, on their own kind of masks). Retrieval utility is undefined without the null "
        "document. One seed per row: differences of a few points are within noise.\n\n" + text)
    report.write_section("Ablations on the toy world (paper Table 2)", body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
