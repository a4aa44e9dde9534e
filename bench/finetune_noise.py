r"""Fine-tuning noise question by question: how two fine-tunings of one pretraining disagree.

  python bench/finetune_noise.py [--out /tmp/realm_ablations] [--seeds 0 1 2 3 4] [--write]

`bench/ablations.py` fine-tunes each seed's REALM pretraining twice (the rows "REALM" and
"REALM fine-tuned again") and fine-tunes the ORQA-style baseline, all evaluated on the same toy
QA test questions, and keeps only their EM. This reads their test predictions from its runs
directory (`--out`) and compares them question by question; each seed's comparisons are kept in
bench/results/finetune_noise/ with the ablation rows' fingerprint, so the table outlives `--out`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from typing import Mapping, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import recipe as recipe_lib  # noqa: E402  pylint: disable=wrong-import-position

SECTION = "Fine-tuning noise, question by question (toy world)"
DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "finetune_noise")
# The ablation rows whose predictions are compared: (row, label).
RUNS = (("realm", "REALM"), ("realm_refit", "REALM fine-tuned again"),
        ("orqa", "ORQA-style baseline"))
# (first, second): each comparison is the first run minus the second ("first minus second").
PAIRS = (("realm_refit", "realm"), ("orqa", "realm"))
LABELS = dict(RUNS)


def read_correct(path: str) -> dict[str, bool]:
  """{question: correct} of one predictions file (`python -m realm_jax.evaluate`'s JSONL)."""
  out = {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      try:
        record = json.loads(line)
        out[record["question"]] = bool(record["correct"])
      except (ValueError, KeyError) as e:
        raise ValueError(f"{path}: record {number}: {e}") from e
  return out


def paired(a: Mapping[str, bool], b: Mapping[str, bool]) -> dict:
  """The paired comparison of two runs on the questions both answered: EM of each, the
  questions only one gets right, the mean difference and its standard error over questions,
  sqrt(sum_q (d_q - mean d)^2 / (n (n - 1))) with d_q = correct_a(q) - correct_b(q)."""
  questions = sorted(set(a) & set(b))
  n = len(questions)
  if n < 2:
    raise ValueError(f"{n} question(s) in common: nothing to compare")
  d = [int(a[q]) - int(b[q]) for q in questions]
  mean = sum(d) / n
  se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
  return {"questions": n, "em_a": sum(a[q] for q in questions) / n,
          "em_b": sum(b[q] for q in questions) / n, "only_a": d.count(1), "only_b": d.count(-1),
          "difference": mean, "question_se": se}


def sample_sd(values: Sequence[float]) -> float:
  mean = sum(values) / len(values)
  return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def predictions_path(out: str, seed: int, row: str) -> str:
  """Where bench/ablations.py's fine-tuning `row` of the seed's REALM pretraining leaves its test
  predictions (the ORQA-style baseline's evaluation is kept beside them)."""
  slot = ablations.finetune_slot("finetune" if row == ablations.BASE else row, None)
  return os.path.join(out, f"seed{seed}", ablations.BASE, "eval",
                      f"{recipe_lib.qa_eval_name(slot)}_{ablations.EVAL_SPLIT}.jsonl")


def cells_fingerprint(toy_bert: str | None) -> str:
  """The fingerprint of this bench's cells: that of the three ablation rows it reads, made with
  the ablation bench's default settings from `toy_bert`."""
  options = ablations.toy_cell_options(toy_bert=toy_bert, ict_from_bert=False,
                                       pretrain_steps=None, finetune_steps=None)
  prints = [ablations.row_fingerprint(ablations.ROW_BY_NAME[row], options) for row, _ in RUNS]
  return hashlib.sha256("\n".join(prints).encode()).hexdigest()


def seed_comparisons(out: str, seed: int) -> dict[str, dict] | None:
  """{first row: `paired(first, second)`} of one seed's predictions, None when one is missing."""
  paths = {row: predictions_path(out, seed, row) for row, _ in RUNS}
  if not all(os.path.exists(p) for p in paths.values()):
    return None
  correct = {row: read_correct(path) for row, path in paths.items()}
  return {first: paired(correct[first], correct[second]) for first, second in PAIRS}


def collect(out: str, seeds: Sequence[int], cells: str, fingerprint: str
            ) -> tuple[dict[int, dict[str, dict]], list[int]]:
  """({seed: comparisons}, the seeds with neither predictions nor a kept cell): each read from
  its predictions under `out` (and kept) or, when they are gone, from its kept cell."""
  found, missing = {}, []
  for seed in seeds:
    path = os.path.join(cells, f"seed{seed}.json")
    kept = ablations.load_cell(path, fingerprint)
    made = seed_comparisons(out, seed)
    if made is not None:
      # Kept again only when it changed: a cell read back keeps its commit and date.
      if kept is None or json.dumps(kept, sort_keys=True) != json.dumps(made, sort_keys=True):
        ablations.save_cell(path, made, fingerprint)
      found[seed] = made
    elif kept is not None:
      found[seed] = kept
    else:
      missing.append(seed)
  return found, missing


def table(by_seed: Mapping[int, Mapping[str, dict]]) -> str:
  """The markdown table of every seed's comparisons and the summary lines under it."""
  lines = ["| comparison | seed | EM (first, second) | only the first right | only the second "
           "right | difference | its standard error over questions |",
           "|---|---|---|---|---|---|---|"]
  spreads: dict[str, list[tuple[float, float]]] = {}
  disagreements = []
  for seed in sorted(by_seed):
    for first, second in PAIRS:
      r = by_seed[seed][first]
      label = f"{LABELS[first]} minus {LABELS[second]}"
      spreads.setdefault(label, []).append((r["difference"], r["question_se"]))
      if (first, second) == PAIRS[0]:  # the two fine-tunings of one pretraining
        disagreements.append((r["only_a"] + r["only_b"], r["questions"]))
      lines.append(f"| {label} | {seed} | {r['em_a']:.3f}, {r['em_b']:.3f} | {r['only_a']} | "
                   f"{r['only_b']} | {r['difference']:+.3f} | {r['question_se']:.4f} |")
  summary = []
  for label, values in spreads.items():
    if len(values) > 1:
      summary.append(f"- {label}: the differences' standard deviation over seeds "
                     f"{sample_sd([d for d, _ in values]):.4f}, the mean standard error over "
                     f"questions {sum(s for _, s in values) / len(values):.4f}")
  if disagreements:
    low, high = min(d for d, _ in disagreements), max(d for d, _ in disagreements)
    summary.append(f"- the two fine-tunings of one pretraining disagree on {low} to {high} of "
                   f"{disagreements[0][1]:,} questions: a paired standard error of about "
                   f"sqrt(disagreements) / n, which falls only with more questions or more "
                   f"fine-tunings per row")
  return "\n".join(lines) + ("\n\n" + "\n".join(summary) if summary else "")


def section(seeds: Sequence[int], text: str) -> str:
  return (
      f"`python bench/finetune_noise.py --write` (seeds {', '.join(map(str, seeds))}; cells in "
      "bench/results/finetune_noise/, read from `bench/ablations.py --only realm realm_refit "
      "orqa`'s runs). The ablation bench's fine-tunings of one seed's REALM pretraining, "
      "evaluated on the same 1,000 toy QA test questions: REALM (fine-tuning seed s), REALM "
      f"fine-tuned again (seed s + {ablations.REFIT_SEED_OFFSET}) and the ORQA-style baseline "
      "(the ICT retriever and the toy BERT reader). Each difference is the first run minus the "
      "second, with the standard error of the paired difference over questions. When the "
      "seed-to-seed spread of a difference is about that standard error, the noise is the test "
      "set's size meeting two models that disagree on some questions, and more questions or "
      "more fine-tunings per row shrink it as one over their square root; a spread much larger "
      "would be the fine-tuning itself landing in better or worse places.\n\n" + text)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=ablations.DEFAULT_OUT,
                      help="bench/ablations.py's runs directory (default %(default)s)")
  parser.add_argument("--seeds", type=int, nargs="+", default=list(ablations.DEFAULT_SEEDS))
  parser.add_argument("--write", action="store_true", help="write bench/docs/benchmarks.md")
  ablations.add_cell_flags(parser, DEFAULT_CELLS)
  args = parser.parse_args(argv)
  toy_bert, cells = ablations.parse_cell_flags(parser, args)
  by_seed, missing = collect(os.path.abspath(args.out), args.seeds, cells,
                             cells_fingerprint(toy_bert))
  for seed in missing:
    print(f"finetune_noise: seed {seed}: no kept cell and not the three fine-tunings' test "
          f"predictions (e.g. {predictions_path(args.out, seed, 'realm')}); make them with "
          f"python bench/ablations.py --only realm realm_refit orqa --seeds {seed} --cells "
          "<a directory of its own>", file=sys.stderr)
  if not by_seed:
    return 1
  text = table(by_seed)
  print(text)
  if args.write:
    host = ablations.cells_machines({s: [os.path.join(cells, f"seed{s}.json")] for s in by_seed})
    report.write_section(SECTION, section(sorted(by_seed), text), host=host)
  return 0


if __name__ == "__main__":
  sys.exit(main())
