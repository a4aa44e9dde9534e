r"""Ablations like the paper's Table 2, on the toy world, every row with several seeds in one run.

  python bench/ablations.py [--out /tmp/realm_ablations] [--write] [--only NAME ...]
      [--seeds 0 1 2] [--pretrain_steps N] [--finetune_steps N]

Each row is the whole toy recipe (`realm_jax.recipe.Recipe`: pretraining with the index builder
alongside, a frozen index of the final checkpoint, open-QA fine-tuning,
evaluation) with one change, repeated for every seed (`train_main.seed` of every stage: the
initialisation, dropout and the data order). For each seed, all rows but the last share one ICT
warm start, trained with that seed in `<out>/seed<s>/shared/ict` (`--toy_bert` and
`--ict_from` as the recipe's):

  REALM                      salient-span masking, null document, index refreshed, ICT start
  random-span masking        --gin.TASK='realm_toy_random_span'
  random-token masking       --gin.TASK='realm_toy_random_token'
  without the null document  --gin.PretrainJob.null_document=False
  index never refreshed      no index builder: pretraining retrieves from the ICT index
  without ICT warm start     the retriever starts as ICT would (random, or the BERT with
                             `--ict_from bert`): an "ICT" run of one step at learning rate 0
                             provides that checkpoint

Columns, as the paper's (NQ dev EM; zero-shot retrieval recall@5) plus what the toy shows:
toy QA dev EM after fine-tuning, recall@5 of the toy QA dev questions with the pretrained
retriever before fine-tuning, masked salient-span accuracy with retrieval at the end of
pretraining (on the row's own kind of masks), retrieval utility (undefined without the null
document) and index refreshes; each cell is the mean over the seeds with their standard
deviation. Below the table, each of the paper's directions is checked: it "holds beyond the
seed spread" when the difference of the means exceeds the sum of the two standard deviations.
`--write` puts the table into docs/benchmarks.md.

A whole run takes hours on 2 cores, longer than one sitting. Every finished cell (one row, one
seed) is kept as `<cells>/seed<s>_<row>.json` (default `bench/results/ablations/`, kept with the
repository): its summary, minutes, date, commit and a fingerprint of what decides its result
(the toy gins, the toy BERT's sha256 and the step options). A later run reuses every cell whose
fingerprint matches and runs the rest, so the table can be finished in another sitting or on
another machine; a cell whose fingerprint differs is run again. The fingerprint does not cover
the code: after a change that alters results, start over with `--fresh_cells`.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

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
     {"pretrain_bindings": ["PretrainJob.null_document=False"]}),
    ("never_refresh", "index never refreshed", {"with_builder": False}),
    ("no_ict", "without ICT warm start", {"ict": "untrained"}),
)
# The paper's Table 2 directions: (better row, worse row, column key, what it says).
DIRECTIONS = (
    ("realm", "random_span", "qa_em_realm", "salient-span masking > random-span masking"),
    ("random_span", "random_token", "qa_em_realm", "random-span masking > random-token masking"),
    ("realm", "no_null", "qa_em_realm", "the null document helps"),
    ("realm", "never_refresh", "qa_em_realm", "refreshing beats a never-refreshed index"),
    ("realm", "no_ict", "qa_em_realm", "the ICT warm start helps"),
)
COLUMNS = (("qa_em_realm", "toy QA dev EM"), ("recall@5_after", "zero-shot recall@5 (dev)"),
           ("mlm_accuracy_realm", "masked-span accuracy"),
           ("retrieval_utility_last", "retrieval utility"), ("refreshes", "refreshes"))


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


DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "ablations")
# What decides a cell's result besides the code: the gins every stage reads.
FINGERPRINT_GINS = ("gin_configs/experiments/toy_*.gin", "gin_configs/runs/*.gin",
                    "gin_configs/models/*.gin")


def fingerprint(options: dict) -> str:
  """sha256 over the gins every stage reads (comments aside) and `options` (the toy BERT's
  sha256, steps...)."""
  digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
  for pattern in FINGERPRINT_GINS:
    for path in sorted(glob.glob(os.path.join(REPO, pattern))):
      with open(path, encoding="utf-8") as f:
        # Comments and blank lines do not decide results.
        lines = [line.rstrip() for line in f if line.strip() and not line.lstrip().startswith("#")]
      digest.update(("\n".join([os.path.relpath(path, REPO), *lines]) + "\n\0").encode())
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


def save_cell(path: str, summary: dict, cell_fingerprint: str) -> None:
  """Writes a finished cell (atomically: a crash leaves the old file or none)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  record = {"summary": summary, "fingerprint": cell_fingerprint, "commit": _commit(),
            "date": datetime.date.today().isoformat(), "machine": report.machine()}
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1, sort_keys=True)
    f.write("\n")
  os.replace(path + ".tmp", path)


def _cell(values: list[float], digits: int = 3) -> str:
  values = [v for v in values if v is not None and not math.isnan(v)]
  if not values:
    return "n/a"
  # Thousands grouped: parameter counts read as 8,788,801.
  return f"{np.mean(values):,.{digits}f} ± {np.std(values):,.{digits}f}"


def run(out: str, only: tuple[str, ...], *, seeds: tuple[int, ...], pretrain_steps: int | None,
        finetune_steps: int | None, toy_bert: str | None = None,
        ict_from_bert: bool = False, cells: str = DEFAULT_CELLS) -> dict[str, list[dict]]:
  """{row name: [summary of each seed]}; every row's summary has its "minutes". Finished cells
  are kept in `cells` and reused (see the module docstring)."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  from realm_jax import toy_bert as toy_bert_lib  # pylint: disable=import-outside-toplevel
  store = realm_jax_tasks.toy_block_store_dir()
  os.makedirs(out, exist_ok=True)
  cell_fingerprint = fingerprint({
      "toy_bert_sha256": toy_bert_lib.weights_sha256(toy_bert) if toy_bert else None,
      "ict_from_bert": ict_from_bert, "pretrain_steps": pretrain_steps,
      "finetune_steps": finetune_steps})
  rows: dict[str, list[dict]] = {}
  for seed in seeds:
    seed_out = os.path.join(out, f"seed{seed}")
    seed_binding = f"train_main.seed={seed}"
    shared = recipe_lib.Recipe(os.path.join(seed_out, "shared"), store, toy_bert=toy_bert,
                               ict_from_bert=ict_from_bert, baseline=False)
    for name, description, kwargs in VARIANTS:
      if only and name not in only:
        continue
      cell_path = os.path.join(cells, f"seed{seed}_{name}.json")
      kept = load_cell(cell_path, cell_fingerprint)
      if kept is not None:
        print(f"ablations: seed {seed}: {description}: kept in {cell_path}", flush=True)
        rows.setdefault(name, []).append(kept)
        continue
      shared.stage(f"seed {seed}: the shared ICT warm start", shared.trained(shared.ict),
                   lambda: shared.train_ict(shared.ict, "ict.log", seed_binding))
      kwargs = dict(kwargs)
      ict = kwargs.pop("ict", None)
      ict_dir = _untrained_ict(shared, seed) if ict == "untrained" else shared.ict
      print(f"\nablations: seed {seed}: {description} ...", flush=True)
      start = time.monotonic()
      steps = lambda n: [f"NUM_STEPS={n}"] if n is not None else []
      kwargs["pretrain_bindings"] = [*steps(pretrain_steps), seed_binding,
                                     *kwargs.get("pretrain_bindings", [])]
      kwargs["finetune_bindings"] = [*steps(finetune_steps), seed_binding]
      summary = recipe_lib.Recipe(os.path.join(seed_out, name), store, ict_dir=ict_dir,
                                  toy_bert=toy_bert, ict_from_bert=ict_from_bert,
                                  eval_split="dev", baseline=False,
                                  **kwargs).run()
      summary["minutes"] = (time.monotonic() - start) / 60
      save_cell(cell_path, summary, cell_fingerprint)
      rows.setdefault(name, []).append(summary)
  return rows


def table(rows: dict[str, list[dict]]) -> str:
  lines = ["| pretraining | " + " | ".join(title for _, title in COLUMNS) + " | minutes |",
           "|---" * (len(COLUMNS) + 2) + "|"]
  for name, description, _ in VARIANTS:
    if name not in rows:
      continue
    cells = [_cell([s[key] for s in rows[name]], 1 if key == "refreshes" else 3)
             for key, _ in COLUMNS]
    minutes = np.mean([s["minutes"] for s in rows[name]])
    lines.append(f"| {description} | " + " | ".join(cells) + f" | {minutes:.1f} |")
  return "\n".join(lines)


def directions(rows: dict[str, list[dict]]) -> str:
  """Whether each of the paper's directions holds beyond the seed spread."""
  lines = []
  for better, worse, key, says in DIRECTIONS:
    if better not in rows or worse not in rows:
      continue
    a = np.array([s[key] for s in rows[better]])
    b = np.array([s[key] for s in rows[worse]])
    gap, spread = a.mean() - b.mean(), a.std() + b.std()
    verdict = ("holds beyond the seed spread" if gap > spread else
               "same direction, within the seed spread" if gap > 0 else "does not hold")
    lines.append(f"* {says}: {verdict} (toy QA dev EM {a.mean():.3f} vs {b.mean():.3f}, "
                 f"difference {gap:+.3f}, spreads {a.std():.3f} + {b.std():.3f})")
  return "\n".join(lines)


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


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="/tmp/realm_ablations")
  parser.add_argument("--write", action="store_true", help="write docs/benchmarks.md")
  parser.add_argument("--only", nargs="*", default=(), choices=[v[0] for v in VARIANTS])
  parser.add_argument("--seeds", nargs="+", type=int, default=(0, 1, 2),
                      help="seeds of every row (default: 0 1 2)")
  parser.add_argument("--pretrain_steps", type=int, default=None,
                      help="pretraining steps per row (default: the recipe's)")
  parser.add_argument("--finetune_steps", type=int, default=None,
                      help="fine-tuning steps per row (default: the recipe's)")
  parser.add_argument("--ict_from", choices=("random", "bert"), default="random",
                      help="what ICT's towers start from, as the recipe's --ict_from")
  add_cell_flags(parser, DEFAULT_CELLS)
  args = parser.parse_args()
  toy_bert, cells = parse_cell_flags(parser, args)
  rows = run(os.path.abspath(args.out), tuple(args.only), seeds=tuple(args.seeds),
             pretrain_steps=args.pretrain_steps, finetune_steps=args.finetune_steps,
             toy_bert=toy_bert, ict_from_bert=args.ict_from == "bert", cells=cells)
  text = table(rows) + "\n\n" + directions(rows)
  print("\n" + text)
  if args.write:
    steps = lambda n: "the recipe's" if n is None else str(n)
    body = (
        "Toy world (gin_configs/experiments/toy_*.gin), every row measured "
        f"with seeds {', '.join(map(str, args.seeds))} by `python bench/ablations.py --write` "
        f"({sum(s['minutes'] for r in rows.values() for s in r):.0f} minutes of runs in all; "
        "the cells are kept in bench/results/ablations/ with their commit and date). Each row "
        f"repeats pretraining ({steps(args.pretrain_steps)} steps), the frozen fine-tuning "
        f"index, fine-tuning ({steps(args.finetune_steps)} steps) and evaluation with one "
        "change; all rows of a seed but the last share one ICT warm start. "
        "Cells: mean ± standard deviation over the seeds. Zero-shot recall@5: an answer in the "
        "top 5 blocks the pretrained retriever finds for a toy QA dev question (before "
        "fine-tuning). Masked-span accuracy: masked salient-span wordpieces predicted exactly "
        "by REALM's marginal at the last pretraining checkpoint (for the random-span and "
        "random-token rows, on their own kind of masks). Retrieval utility is undefined "
        "without the null document.\n\n" + text)
    report.write_section("Ablations on the toy world (paper Table 2)", body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
