r"""Fine-tuning noise question by question: how two fine-tunings of one pretraining disagree.

  python bench/finetune_noise.py --out /tmp/abl6 [--seeds 0 1 2 3 4] [--write]

`bench/ablations.py` fine-tunes the REALM row's pretraining twice per seed, with fine-tuning
seeds s and s + 1000 (the rows "REALM" and "REALM fine-tuned again"), and evaluates both on the
same toy QA test questions. Their EM difference is the bench's fine-tuning noise. This script
reads the two runs' test predictions from the bench's runs directory (`--out`; the cells keep
only the EM) and splits that noise into what each question does: the questions only one of the
two gets right, and the standard error of the paired difference over the questions,
sqrt(sum_q (d_q - mean d)^2 / (n (n - 1))) with d_q = correct_a(q) - correct_b(q). When the
seed-to-seed spread of the EM difference is about this standard error, the noise is the test
set's size meeting two models that disagree on some questions, and more test questions (or
more fine-tunings per row) shrink it as one over their square root; a spread much larger than
it would be the fine-tuning itself landing in better or worse places. Comparisons between rows
(REALM against the ORQA-style baseline, ...) are read the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import report  # noqa: E402  pylint: disable=wrong-import-position

# (label, predictions file under <out>/seed<s>/realm/eval/) of the fine-tunings of REALM's
# pretraining the ablation bench makes.
FINETUNINGS = (("REALM", "toy_qa_test.jsonl"),
               ("REALM fine-tuned again", "toy_qa_realm_refit_test.jsonl"),
               ("ORQA-style baseline", "toy_qa_orqa_test.jsonl"))
PAIRS = ((0, 1), (0, 2))


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


def paired(a: dict[str, bool], b: dict[str, bool]) -> dict:
  """The paired comparison of two runs on the questions both answered: EM of each, the
  questions only one gets right, the mean difference and its standard error over questions."""
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


def table(out: str, seeds: Sequence[int]) -> tuple[str, list[int]]:
  """The markdown table over the seeds whose predictions exist, and those seeds."""
  lines = ["| comparison | seed | EM (first, second) | only the first right | only the second "
           "right | difference | its standard error over questions |", "|---|---|---|---|---|---|---|"]
  found, spreads, disagreements = [], {}, []
  for seed in seeds:
    directory = os.path.join(out, f"seed{seed}", "realm", "eval")
    paths = [os.path.join(directory, name) for _, name in FINETUNINGS]
    if not all(os.path.exists(p) for p in paths):
      continue
    found.append(seed)
    runs = [read_correct(p) for p in paths]
    for i, j in PAIRS:
      label = f"{FINETUNINGS[j][0]} minus {FINETUNINGS[i][0]}"
      r = paired(runs[j], runs[i])
      spreads.setdefault(label, []).append((r["difference"], r["question_se"]))
      if (i, j) == PAIRS[0]:  # the two fine-tunings of one pretraining
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
  return "\n".join(lines) + ("\n\n" + "\n".join(summary) if summary else ""), found


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", required=True, help="bench/ablations.py's runs directory (--out)")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
  parser.add_argument("--write", action="store_true", help="write bench/docs/benchmarks.md")
  args = parser.parse_args()
  text, found = table(args.out, args.seeds)
  if not found:
    print(f"finetune_noise: no seed of {args.seeds} has the three fine-tunings' test predictions "
          f"under {args.out}/seed<s>/realm/eval", file=sys.stderr)
    return 1
  print(text)
  if args.write:
    report.write_section(
        "Fine-tuning noise, question by question (toy world)",
        f"`python bench/finetune_noise.py --out <the ablation bench's --out> --write` (seeds "
        f"{', '.join(map(str, found))}: those whose runs were still on disk). The ablation "
        "bench's fine-tunings of one seed's REALM pretraining, evaluated on the same 1,000 toy "
        "QA test questions: REALM (fine-tuning seed s), REALM fine-tuned again (seed s + 1000) "
        "and the ORQA-style baseline (the ICT retriever and the toy BERT reader). The standard "
        "error over questions is that of the paired difference, "
        "sqrt(sum_q (d_q - mean d)^2 / (n (n - 1))); the script's docstring says how to read it."
        "\n\n" + text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
