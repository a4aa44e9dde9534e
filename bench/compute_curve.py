r"""REALM minus the ORQA-style baseline as pretraining grows: the compute curve.

  python bench/compute_curve.py [--multiples 1 4 16] [--seeds 0 1 2] [--report_only] [--write]

The paper pretrains 200k steps at batch 512; the toy recipe 400 steps at batch 8, where REALM ties
the ORQA-style baseline. This bench moves pretraining compute alone: for each multiple m of the
toy recipe's pretraining (400 steps), REALM's row of bench/ablations.py is made with 400 x m
steps, and the ORQA-style baseline beside it from the same seed's ICT warm start; the warm start,
fine-tuning and evaluation are the recipe's at every length. Each cell is one of
bench/ablations.py's (`ablations.run`, rows "realm" and "orqa"), kept per length in
`bench/results/compute_curve/toy_<steps>/` and reused; the 1x cells are the Table 2 bench's own
(bench/results/ablations/), the same runs. Seeds: those asked for at every length, and 0-4 at 1x.

Per length: REALM minus the baseline, paired by seed (mean ± standard error, each seed's value,
whether every seed agrees), on test EM and on zero-shot test recall@5, and REALM's retrieval
utility and masked-span accuracy at its last pretraining checkpoint (mean ± standard deviation).
A cell is made in about 4 + 4m minutes on 2 cores (a 16x REALM pretraining is about an hour); run
it in the background: every finished cell is kept, and a stopped run resumes from the cells and
the runs under --out.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position

TOY_STEPS = 400  # experiments/toy_pretrain.gin's NUM_STEPS: the 1x of the axis
DEFAULT_MULTIPLES = (1, 4, 16)
DEFAULT_SEEDS = (0, 1, 2)
ONE_X_SEEDS = (0, 1, 2, 3, 4)
ROWS = ("realm", "orqa")
CELLS = os.path.join(REPO, "bench", "results", "compute_curve")
SECTION = "REALM against the ORQA-style baseline as pretraining grows (toy world)"


def steps_of(multiple: int) -> int:
  return TOY_STEPS * multiple


def cells_dir(multiple: int, cells: str = CELLS) -> str:
  """Where a length's cells are kept: the Table 2 bench's at 1x (the same rows and runs), else
  `<cells>/toy_<steps>`."""
  return ablations.DEFAULT_CELLS if multiple == 1 else os.path.join(cells,
                                                                    f"toy_{steps_of(multiple)}")


def seeds_at(multiple: int, seeds: Sequence[int]) -> tuple[int, ...]:
  """The seeds of one length: those asked for, and 0-4 at 1x."""
  return tuple(sorted(set(seeds) | (set(ONE_X_SEEDS) if multiple == 1 else set())))


def pretrain_steps_option(multiple: int) -> Optional[int]:
  """`ablations.run`'s pretrain_steps: None (the recipe's) at 1x, so its cells are Table 2's."""
  return None if multiple == 1 else steps_of(multiple)


def kept_rows(multiple: int, seeds: Sequence[int], toy_bert: Optional[str],
              cells: str = CELLS) -> dict[str, dict[int, dict]]:
  """{row: {seed: cell}} of the kept, current cells of one length (nothing is made)."""
  from realm_jax import toy_bert as toy_bert_lib  # pylint: disable=import-outside-toplevel
  options = ablations.cell_options(
      toy_bert_sha256=toy_bert_lib.weights_sha256(toy_bert) if toy_bert else None,
      ict_from_bert=False, pretrain_steps=pretrain_steps_option(multiple), finetune_steps=None)
  rows: dict[str, dict[int, dict]] = {}
  for name in ROWS:
    fingerprint = ablations.row_fingerprint(ablations.ROW_BY_NAME[name], options)
    for seed in seeds:
      path = os.path.join(cells_dir(multiple, cells), f"seed{seed}_{name}.json")
      cell = ablations.load_cell(path, fingerprint)
      if cell is not None:
        rows.setdefault(name, {})[seed] = cell
  return rows


def make_rows(multiple: int, seeds: Sequence[int], out: str, toy_bert: Optional[str],
              cells: str = CELLS) -> dict[str, dict[int, dict]]:
  """{row: {seed: cell}} of one length, its missing cells made (`ablations.run`)."""
  return ablations.run(os.path.join(out, f"toy_{steps_of(multiple)}"), ROWS, seeds=tuple(seeds),
                       pretrain_steps=pretrain_steps_option(multiple), finetune_steps=None,
                       toy_bert=toy_bert, cells=cells_dir(multiple, cells))


def curve_line(multiple: int, rows: Mapping[str, Mapping[int, dict]]) -> list[str]:
  """One length's row of the table: steps, seeds, REALM - baseline on EM and recall@5, REALM's
  utility and masked-span accuracy."""
  cells = []
  for key in (ablations.EM, ablations.RECALL):
    pair = ablations.paired(rows, "realm", "orqa", key)
    if pair is None:
      cells.append("n/a")
      continue
    seeds, difference = pair
    agree = "; every seed agrees" if difference.all_agree and len(seeds) > 1 else ""
    cells.append(ablations.format_difference(seeds, difference) + agree)
  realm = rows.get("realm", {})
  for key in ("retrieval_utility", "mlm_accuracy"):
    cells.append(ablations.mean_sd_cell([cell.get(key) for cell in realm.values()]))
  return [f"{steps_of(multiple):,} ({multiple}x)", str(len(realm)), *cells]


def table(rows_by_multiple: Mapping[int, Mapping[str, Mapping[int, dict]]]) -> str:
  header = ["pretraining steps", "REALM seeds", "REALM - baseline, test EM",
            "REALM - baseline, zero-shot test recall@5", "REALM's retrieval utility",
            "REALM's masked-span accuracy"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for multiple in sorted(rows_by_multiple):
    lines.append("| " + " | ".join(curve_line(multiple, rows_by_multiple[multiple])) + " |")
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--multiples", nargs="+", type=int, default=DEFAULT_MULTIPLES,
                      help="pretraining lengths as multiples of the toy recipe's 400 steps "
                           "(default: %(default)s)")
  parser.add_argument("--seeds", nargs="+", type=int, default=DEFAULT_SEEDS,
                      help="seeds at every length (default: %(default)s; 0-4 at 1x as well)")
  parser.add_argument("--out", default="/tmp/realm_compute_curve",
                      help="run directories (default %(default)s)")
  parser.add_argument("--cells", default=CELLS,
                      help="where the cells of lengths past 1x are kept (default: "
                           f"{os.path.relpath(CELLS, REPO)})")
  parser.add_argument("--report_only", action="store_true",
                      help="make nothing: the table of the kept cells")
  parser.add_argument("--write", action="store_true",
                      help=f"write the table into docs/benchmarks.md ({SECTION!r})")
  args = parser.parse_args()
  if any(m < 1 for m in args.multiples):
    parser.error("--multiples: positive integers")
  from realm_jax import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  toy_bert = recipe_lib.toy_bert_dir("shipped")
  cells = os.path.abspath(args.cells)
  os.chdir(REPO)  # the recipe's children run from the repository root
  rows_by_multiple = {}
  for multiple in sorted(set(args.multiples)):
    seeds = seeds_at(multiple, args.seeds)
    rows_by_multiple[multiple] = (kept_rows(multiple, seeds, toy_bert, cells) if args.report_only
                                  else make_rows(multiple, seeds, os.path.abspath(args.out),
                                                 toy_bert, cells))
  text = table(rows_by_multiple)
  print("\n" + text)
  if args.write:
    machines = ablations.cells_machines({
        seed: [os.path.join(cells_dir(m, cells), f"seed{seed}_{name}.json") for name in ROWS]
        for m in rows_by_multiple for seed in seeds_at(m, args.seeds)})
    body = (f"Toy world, `python bench/compute_curve.py --write` on {machines}: REALM's row of "
            "bench/ablations.py pretrained for 1x, 4x and 16x the recipe's 400 steps, the "
            "ORQA-style baseline beside it from the same seed's ICT warm start; the warm start, "
            "fine-tuning and evaluation are the recipe's at every length. Differences are REALM "
            "minus the baseline, paired by seed: mean ± standard error (each seed's value). EM "
            "and zero-shot recall@5 on toy QA test; fine-tuning picks its checkpoint on dev.\n\n"
            + text)
    report.write_section(SECTION, body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
