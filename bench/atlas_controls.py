r"""Why the Atlas bench's objective rows lose retrieval: controls that train the question tower
against the frozen index with a target right by construction (over the K read blocks, or over
the beam's first 100), and with a tenth of the learning rate, beside the bench's own rows.

  python bench/atlas_controls.py [--out /tmp/atlas_bench] [--seeds 2] [--only ROW ...] [--write]
      [--kept_only]

Every row is a FiD fine-tuning on all toy QA training questions from the seed's REALM
pretraining, against the frozen index built from it, in bench/atlas.py's `--out` (whose
`python bench/atlas.py --seeds S` makes the seed's ICT and pretraining first):

  fid     the reference, the bench's FiD row with its question tower frozen: its kept cell's
          test EM and recall alone (it trains no question tower, so logs no shares)
  adist, emdr2, pdist, loop, and each with _lr_0.1
          the bench's objective rows (experiments/atlas_toy_finetune.gin), the question tower
          at the reader's learning rate (5e-4, which the fresh decoder needs) or at a tenth
          (`FinetuneJob.retriever_lr_scale=0.1`, near Atlas's 4e-5 for both towers), read from
          their runs when bench/atlas.py has made them: nothing is trained here for them
  answer_blocks
          the control objective (`retriever_objective='answer_blocks'`, realm_jax/models/
          fid_qa.py): PDist's KL towards the uniform distribution over the read blocks that hold
          an answer string, a target that no reader has to learn
  answer_blocks_beam
          the control scoring the first 100 blocks of the beam, not only the 5 read
          (`answer_blocks_beam.objective_beam=100`, the whole toy beam): whether seeing only
          the read blocks is what loses retrieval
  answer_blocks_beam_read_targets
          the same 100 blocks scored, but only the 5 read can be targets
          (`answer_blocks_beam.targets_in_read_blocks=True`): the questions trained and their
          targets are answer_blocks', the other 95 blocks only negatives; whether what keeps
          retrieval is the other blocks' scores or the targets they add
  answer_blocks_lr_0.1
          the control with the question tower at a tenth of the reader's learning rate, as the
          bench's _lr_0.1 rows

Columns: test EM and test recall@5 after fine-tuning (the checkpoint dev picked); and from the
training log, the means over the first and the last 100 steps of `train/reader_any_correct`
(the share of training questions with an answer's block among the 5 read, retrieved by the
live question tower: recall@5 as training goes), `train/retriever_top_answer` (the share whose
retriever's top block holds an answer) and `train/target_top_answer` (the same for the
objective's target); and how many distinct blocks the test questions' top blocks are (of the
1,000 questions' predictions: how far the question tower collapsed towards a few blocks). The
zero-shot recall@5 they all start from is the bench's (its `recall@5_zero_shot`). A target
that picks answer blocks less often than the retriever does teaches the retriever to miss; a
control that keeps its recall with a perfect target says the optimisation itself is not what
loses it.

Cells are kept in bench/results/atlas_controls/seed<s>_<row>.json with bench/atlas.py's FiD
fingerprint (the bench's rows' cells too: their training logs do not outlive `--out`);
`--kept_only` makes nothing and reads them alone, without the seed's runs.
`--write` puts the table into the section "Atlas's objectives against the frozen index:
controls" of bench/docs/benchmarks.md; what it isolates is read in docs/results.md (Atlas).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import atlas  # noqa: E402  pylint: disable=wrong-import-position
from bench import fid_copying  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import checkpoints  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax import recipe as recipe_lib  # noqa: E402  pylint: disable=wrong-import-position

PROG = "atlas_controls"
SECTION = atlas.CONTROLS_SECTION
DEFAULT_CELLS = os.path.join(REPO, "bench", "results", "atlas_controls")
DEFAULT_SEEDS = (2,)
# The logged shares, each averaged over the first and the last this many steps.
WINDOW = atlas.AGREEMENT_WINDOW
LOGGED = ("reader_any_correct", "retriever_top_answer", "target_top_answer")
CONTROLS = (
    atlas.Row("answer_blocks", "answer blocks (control)", "fid", atlas.ATLAS_GIN,
              "answer_blocks"),
    atlas.Row("answer_blocks_beam", "answer blocks (control) over the beam's first 100 blocks",
              "fid", atlas.ATLAS_GIN, "answer_blocks",
              bindings=("answer_blocks_beam.objective_beam=100",)),
    atlas.Row("answer_blocks_beam_read_targets",
              "answer blocks (control) over the beam's first 100 blocks, targets among the 5 "
              "read", "fid", atlas.ATLAS_GIN, "answer_blocks",
              bindings=("answer_blocks_beam.objective_beam=100",
                        "answer_blocks_beam.targets_in_read_blocks=True")),
    atlas.Row("answer_blocks_lr_0.1", "answer blocks (control), question tower at lr x 0.1",
              "fid", atlas.ATLAS_GIN, "answer_blocks", bindings=(atlas.SLOW,)),
)
REFERENCE = "fid"
ROWS = (atlas.ROW_BY_NAME[REFERENCE],
        *(atlas.ROW_BY_NAME[o] for o in (*atlas.OBJECTIVES, *atlas.SLOW_OBJECTIVES)), *CONTROLS)
CONTROL_NAMES = tuple(row.name for row in CONTROLS)


def first_window_mean(values: Mapping[int, float], window: int = WINDOW) -> Optional[float]:
  """The mean of a logged scalar over its first `window` steps (steps <= first + window - 1);
  None when nothing was logged."""
  if not values:
    return None
  first = min(values)
  return float(np.mean([v for step, v in values.items() if step < first + window]))


def logged_shares(run_dir: str) -> dict[str, Optional[float]]:
  """{"<scalar>_first", "<scalar>_last": its mean over the first and the last `WINDOW` steps}
  of each `LOGGED` scalar of a finished FiD run's training log."""
  scalars = recipe_lib.read_scalars(os.path.join(run_dir, "tensorboard"))
  out = {}
  for name in LOGGED:
    values = scalars.get(f"train/{name}", {})
    out[f"{name}_first"] = first_window_mean(values)
    out[f"{name}_last"] = atlas.last_window_mean(values, WINDOW)
  return out


def distinct_top_blocks(predictions: str) -> int:
  """How many distinct blocks are the first of the questions' retrieved blocks in an
  evaluation's predictions (`python -m realm_jax.evaluate`'s JSONL)."""
  return len({record["block_ids"][0] for record in fid_copying.read_predictions(predictions)
              if record["block_ids"]})


def run_figures(layout: atlas.Layout, row: str) -> dict:
  """What a finished run of `row` (all questions) adds to its cell: `logged_shares` and
  `distinct_top_blocks` of its test predictions."""
  return {**logged_shares(layout.run_dir(row, atlas.ALL)),
          "distinct_top_blocks": distinct_top_blocks(layout.eval_output(row, atlas.ALL))}


def cell_path(cells: str, seed: int, row: str) -> str:
  return os.path.join(cells, f"seed{seed}_{row}.json")


def _bench_row(row: atlas.Row, seed: int, layout: atlas.Layout, fid_fingerprint: str,
               bench_cells: str) -> Optional[dict]:
  """One of the bench's objective rows from its finished run and its kept cell, or None (said)
  when bench/atlas.py has not made both, or its run predates the logged shares."""
  run_dir = layout.run_dir(row.name, atlas.ALL)
  kept = ablations.load_cell(atlas.cell_path(bench_cells, seed, row.name, atlas.ALL),
                             fid_fingerprint)
  if kept is None or not checkpoints.training_done(run_dir):
    print(f"{PROG}: seed {seed}: {row.label}: no finished run of bench/atlas.py in {run_dir} "
          "with its kept cell; left out", flush=True)
    return None
  figures = run_figures(layout, row.name)
  if figures["target_top_answer_last"] is None:
    print(f"{PROG}: seed {seed}: {row.label}: {run_dir} logged no train/target_top_answer "
          "(made before it was logged); left out", flush=True)
    return None
  return {atlas.EM: kept[atlas.EM], atlas.RECALL: kept[atlas.RECALL],
          atlas.RECALL_TUNED: kept[atlas.RECALL_TUNED], "qa_checkpoint": kept["qa_checkpoint"],
          "pretraining": kept["pretraining"], **figures}


def check_pretraining(layout: atlas.Layout, recipe_fingerprint: str) -> None:
  """Raises SystemExit (one line) unless the seed's REALM pretraining is finished in `--out`
  and was made there by bench/atlas.py for this code's gins (its claim's fingerprint)."""
  pretrain = os.path.join(layout.realm, "pretrain")
  marker = os.path.normpath(layout.seed_out) + ".fingerprint"
  made_for = open(marker, encoding="utf-8").read().strip() if os.path.exists(marker) else None
  if not checkpoints.training_done(pretrain) or made_for != recipe_fingerprint:
    seed = os.path.basename(os.path.normpath(layout.seed_out))[len("seed"):]
    raise SystemExit(f"{PROG}: {pretrain}: no finished REALM pretraining of these gins; make it "
                     f"first: python bench/atlas.py --out {os.path.dirname(layout.seed_out)} "
                     f"--seeds {seed}")


def run(out: str, seeds: Sequence[int], settings: atlas.Settings, cells: str,
        bench_cells: str, only: Sequence[str] = (), make: bool = True
        ) -> dict[str, dict[int, dict]]:
  """{row: {seed: cell}} of every row (or of those in `only`) made, read or kept (module
  docstring); with `make` False, of the kept cells alone."""
  prints = atlas.settings_fingerprints(settings)
  fid_fingerprint = prints["fid"]
  settings = settings._replace(fid_fingerprint=fid_fingerprint)
  results: dict[str, dict[int, dict]] = {}
  for seed in seeds:
    layout = atlas.Layout(os.path.join(out, f"seed{seed}"))
    shared = None  # the seed's runs are needed only for a cell that is not kept
    for row in ROWS:
      if only and row.name not in only:
        continue
      if row.name == REFERENCE:  # bench/atlas.py keeps it; nothing is read from its run
        kept = ablations.load_cell(atlas.cell_path(bench_cells, seed, row.name, atlas.ALL),
                                   fid_fingerprint)
        if kept is not None:
          results.setdefault(row.name, {})[seed] = kept
        continue
      path = cell_path(cells, seed, row.name)
      cell = ablations.load_cell(path, fid_fingerprint)
      if cell is not None:
        print(f"{PROG}: seed {seed}: {row.label}: kept in {path}", flush=True)
      elif not make:
        continue
      else:
        if shared is None:
          check_pretraining(layout, prints["recipe"])
          shared = atlas._recipe(layout.shared, settings)  # pylint: disable=protected-access
        if row.name in CONTROL_NAMES:
          cell = atlas.make_cell(row, atlas.ALL, seed, layout, shared, settings)
          cell.update(run_figures(layout, row.name))
        else:
          cell = _bench_row(row, seed, layout, fid_fingerprint, bench_cells)
          if cell is None:
            continue
        ablations.save_cell(path, cell, fid_fingerprint)
      results.setdefault(row.name, {})[seed] = cell
  return results


def _value(by_seed: Mapping[int, dict], key: str) -> str:
  digits = 0 if key == "distinct_top_blocks" else 3
  return ablations.mean_sd_cell([cell.get(key) for cell in by_seed.values()], digits)


COLUMNS = ((atlas.EM, "test EM"), (atlas.RECALL_TUNED, "test recall@5 after"),
           ("reader_any_correct_first", "training recall@5, first 100 steps"),
           ("reader_any_correct_last", "last 100 steps"),
           ("retriever_top_answer_first", "retriever's top block holds an answer, first 100"),
           ("retriever_top_answer_last", "last 100"),
           ("target_top_answer_first", "target's top block holds an answer, first 100"),
           ("target_top_answer_last", "last 100"),
           ("distinct_top_blocks", "distinct top blocks, 1,000 test questions"))


def table(results: Mapping[str, Mapping[int, dict]]) -> str:
  """A row per measured row (ROWS' order): mean ± sample standard deviation over its seeds."""
  lines = ["| row | " + " | ".join(title for _, title in COLUMNS) + " | seeds |",
           "|---" * (len(COLUMNS) + 2) + "|"]
  for row in ROWS:
    by_seed = results.get(row.name)
    if by_seed:
      lines.append(f"| {row.label} | " + " | ".join(_value(by_seed, k) for k, _ in COLUMNS)
                   + f" | {', '.join(map(str, sorted(by_seed)))} |")
  return "\n".join(lines)


def markdown(results: Mapping[str, Mapping[int, dict]], seeds: Sequence[int],
             only: Sequence[str] = ()) -> str:
  zero_shot = sorted({round(cell[atlas.RECALL], 3) for by_seed in results.values()
                      for cell in by_seed.values() if ablations.finite(cell.get(atlas.RECALL))})
  return "\n\n".join([
      f"`python bench/atlas_controls.py --seeds {' '.join(map(str, seeds))}"
      + (f" --only {' '.join(only)}" if only else "") + " --write` (its "
      "module docstring says what each row and column is; the cells are kept in "
      "bench/results/atlas_controls/). Every row fine-tunes the FiD reader on all 2,000 toy QA "
      "training questions from the seed's REALM pretraining, with its question tower trained "
      "against the frozen index built from it; EM and recall on toy QA test, at the checkpoint "
      "dev picked. Zero-shot test recall@5 of that index: "
      f"{', '.join(f'{r:.3f}' for r in zero_shot) or 'n/a'}. One run per row and seed: a "
      "probe of why retrieval is lost, read beside the noise of the bench's paired seeds, "
      "not a paired comparison of its own.",
      table(results)])


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog="bench/atlas_controls.py", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=atlas.DEFAULT_OUT,
                      help="bench/atlas.py's --out, holding the seeds' pretraining and the "
                           "bench's runs (default %(default)s)")
  parser.add_argument("--seeds", nargs="+", type=int, default=list(DEFAULT_SEEDS),
                      help=f"seeds (default: {' '.join(map(str, DEFAULT_SEEDS))})")
  parser.add_argument("--only", nargs="*", default=(), choices=[row.name for row in ROWS],
                      metavar="ROW", help="only these rows (of: %(choices)s)")
  parser.add_argument("--bench_cells", default=atlas.DEFAULT_CELLS,
                      help="bench/atlas.py's kept cells (default: "
                           f"{os.path.relpath(atlas.DEFAULT_CELLS, REPO)})")
  parser.add_argument("--write", action="store_true",
                      help=f"write the table into the section {SECTION!r} of "
                      "bench/docs/benchmarks.md")
  parser.add_argument("--kept_only", action="store_true",
                      help="make nothing: read the kept cells alone")
  ablations.add_cell_flags(parser, DEFAULT_CELLS)
  args = parser.parse_args(argv)
  # Before parse_cell_flags moves to the repository root.
  args.out, args.bench_cells = os.path.abspath(args.out), os.path.abspath(args.bench_cells)
  args.toy_bert, args.cells = ablations.parse_cell_flags(parser, args)
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  settings = atlas.Settings(store=realm_jax_tasks.toy_block_store_dir(), toy_bert=args.toy_bert)
  results = run(args.out, tuple(args.seeds), settings, args.cells, args.bench_cells,
                tuple(args.only), make=not args.kept_only)
  body = markdown(results, args.seeds, args.only)
  print("\n" + body, flush=True)
  if args.write:
    report.write_section(SECTION, body)
  return 0


if __name__ == "__main__":
  sys.exit(main())
