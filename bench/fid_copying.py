r"""Where the Atlas bench's answers come from: copied from a retrieved block, or not.

  python bench/fid_copying.py --out /tmp/atlas_bench [--seeds 0 1 2] [--rows extractive fid]
      [--sizes all] [--write]
  python bench/fid_copying.py --world wiki [--seeds 0 3] [--rows extractive fid closed_book]
      [--write]

`bench/atlas.py` keeps each cell's EM; its runs leave their test predictions under its `--out`
(`python -m realm_jax.evaluate`'s JSONL: the prediction and the question's retrieved blocks).
This reads them with the toy BlockStore and reports, for each row, size and seed:

- EM on toy QA test;
- copied: the share of predictions found, after EM's normalisation
  (`answer_match.normalize_answer`), as whole words in the title or body of one of the
  question's retrieved blocks, and that share among the wrong predictions;
- EM on the questions that ask for a year ("When ...", "In what year ...") and on the others;
- answer read: the share of questions with a reference answer in one of the blocks the reader
  read (DPR's `has_answer` on its title and body: what reading alone could reach), and EM
  among those questions (how often the reader names an answer it was given).

REALM's extractive reader predicts a span of a block, so it copies by construction (a span cut
at a wordpiece inside a word, or differing by a character the tokenizer drops, is the rare
exception). A generative reader's wrong answers that are not copied are tokens put together by
its decoder (the toy's mix the copy head's copies with generated wordpieces).

Each (row, size, seed) read is kept in bench/results/fid_copying/ with bench/atlas.py's
fingerprint of its row, so that the table outlives `--out` (a later session's runs of the other
seeds add to it); one whose predictions are not on disk and not kept is left out, and the
script says which.

The wiki world (`--world wiki`): `bench/atlas.py --world wiki`'s rows (extractive, fid,
closed_book, all questions) from their runs under bench/wiki_runs.py's directory (default
/tmp/realm_wiki_runs), read with the wiki BlockStore there; summaries kept in
bench/results/fid_copying_wiki/, section "Where the Atlas bench's answers come from (wiki
world)".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Iterable, Mapping, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import ablations  # noqa: E402  pylint: disable=wrong-import-position
from bench import atlas  # noqa: E402  pylint: disable=wrong-import-position
from bench import report  # noqa: E402  pylint: disable=wrong-import-position
from bench import wiki_runs  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import answer_match  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.evaluation import metrics  # noqa: E402  pylint: disable=wrong-import-position

SECTIONS = {"toy": atlas.COPYING_SECTION,
            "wiki": "Where the Atlas bench's answers come from (wiki world)"}
DEFAULT_CELLS = {world: os.path.join(REPO, "bench", "results", name)
                 for world, name in (("toy", "fid_copying"), ("wiki", "fid_copying_wiki"))}
DEFAULT_ROWS = {"toy": ("extractive", "fid"), "wiki": atlas.WIKI_ROWS}
YEAR_QUESTION_STARTS = ("when ", "in what year ", "what year ")


def is_year_question(question: str) -> bool:
  """Whether a toy QA question asks for a year (its answers are a date or a year)."""
  return question.lower().startswith(YEAR_QUESTION_STARTS)


def copied(prediction: str, texts: Iterable[str]) -> bool:
  """Whether the normalised prediction is a run of whole words of one normalised text."""
  answer = answer_match.normalize_answer(prediction)
  return bool(answer) and any(
      f" {answer} " in f" {answer_match.normalize_answer(text)} " for text in texts)


def read_predictions(path: str) -> list[dict]:
  """The records of one predictions file, each with question, answers, prediction, correct and
  block_ids."""
  records = []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      try:
        record = json.loads(line)
        answers = record["answers"]
        if not isinstance(answers, list) or not answers:
          raise TypeError(f"answers: a non-empty list, got {answers!r}")
        records.append({"question": str(record["question"]),
                        "answers": [str(a) for a in answers],
                        "prediction": str(record["prediction"]),
                        "correct": bool(record["correct"]),
                        "block_ids": [int(b) for b in record["block_ids"]]})
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: record {number}: {e!r}") from e
  if not records:
    raise ValueError(f"{path}: no predictions")
  return records


def summarize(records: Sequence[Mapping], block_text: Callable[[int], str]) -> dict:
  """EM, the copied shares and EM by question kind of one run's predictions. `block_text`:
  block id -> its title and body (ids < 0, padding or the null document, are skipped)."""
  def share(values: list[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")
  texts = [[block_text(b) for b in r["block_ids"] if b >= 0] for r in records]
  is_copied = [copied(r["prediction"], read) for r, read in zip(records, texts)]
  answer_read = [any(metrics.has_answer(text, r["answers"]) for text in read)
                 for r, read in zip(records, texts)]
  correct = [r["correct"] for r in records]
  year = [is_year_question(r["question"]) for r in records]
  # A reader that read no block (the closed book) copies nothing by definition: n/a, not 0%.
  read_blocks = any(b >= 0 for r in records for b in r["block_ids"])
  nan = float("nan")
  return {"questions": len(records), "em": share(correct),
          "copied": share(is_copied) if read_blocks else nan,
          "copied_wrong": (share([c for c, ok in zip(is_copied, correct) if not ok])
                           if read_blocks else nan),
          "year_questions": sum(year),
          "em_year": share([ok for ok, y in zip(correct, year) if y]),
          "em_other": share([ok for ok, y in zip(correct, year) if not y]),
          "answer_read": share(answer_read) if read_blocks else nan,
          "em_answer_read": share([ok for ok, a in zip(correct, answer_read) if a])}


def predictions_path(out: str, seed: int, row: str, size: str, world: str = "toy") -> str:
  """Where bench/atlas.py's run of (row, size) leaves its test predictions (`world`: "toy", or
  "wiki" with `out` bench/wiki_runs.py's directory)."""
  from realm_jax import recipe as recipe_lib  # pylint: disable=import-outside-toplevel
  layout = (atlas.WikiLayout(wiki_runs.seed_dir(out, seed)) if world == "wiki"
            else atlas.Layout(os.path.join(out, f"seed{seed}")))
  if row == "extractive" and world == "wiki":  # the wiki recipe's default slot: "realm"
    return os.path.join(layout.realm, "eval", f"realm_{atlas.EVAL_SPLIT}.jsonl")
  if row == "extractive":  # the seed's REALM recipe evaluates its fine-tunings in realm/eval
    slot = atlas.recipe_kwargs(atlas.ROW_BY_NAME[row], size, seed).get(
        "finetune_name", recipe_lib.DEFAULT_FINETUNE_NAME)
    return os.path.join(layout.realm, "eval",
                        f"{recipe_lib.qa_eval_name(slot)}_{atlas.EVAL_SPLIT}.jsonl")
  return layout.eval_output(row, size)


def cell_path(cells: str, seed: int, row: str, size: str) -> str:
  return os.path.join(cells, f"seed{seed}_{row}_{size}.json")


def row_fingerprints(rows: Sequence[str], store: str, toy_bert: str | None,
                     world: str = "toy") -> dict[str, str]:
  """{row: bench/atlas.py's fingerprint of the row's cells, made with its default settings}:
  what a kept summary was read from."""
  if world == "wiki":
    return {row: atlas.wiki_fingerprint(row) for row in rows}
  prints = atlas.settings_fingerprints(atlas.Settings(store=store, toy_bert=toy_bert))
  return {row: atlas.row_fingerprint(row, prints) for row in rows}


def collect(out: str, rows: Sequence[str], sizes: Sequence[str], seeds: Sequence[int],
            block_text: Callable[[int], str], cells: str, prints: Mapping[str, str],
            world: str = "toy") -> tuple[dict[tuple[str, str, int], dict], list[str]]:
  """({(row, size, seed): summary}, what is missing): each read from its predictions in `out`
  (and kept) or, when they are gone, from its kept summary of the same fingerprint."""
  summaries, missing = {}, []
  for row in rows:
    for size in sizes:
      for seed in seeds:
        path = predictions_path(out, seed, row, size, world)
        kept_path = cell_path(cells, seed, row, size)
        kept = ablations.load_cell(kept_path, prints[row])
        if os.path.exists(path):
          summary = summarize(read_predictions(path), block_text)
          # Kept again only when it changed: a cell read back keeps its commit and date.
          as_kept = json.dumps(summary, sort_keys=True)  # NaN too compares equal as text
          if kept is None or json.dumps(kept, sort_keys=True) != as_kept:
            ablations.save_cell(kept_path, summary, prints[row])
          summaries[(row, size, seed)] = summary
        elif kept is not None:
          summaries[(row, size, seed)] = kept
        else:
          missing.append(f"{row} {size} seed {seed} ({path})")
  return summaries, missing


def _over_seeds(by_seed: Mapping[int, dict], key: str, scale: float = 1.0,
                digits: int = 3) -> str:
  """Summaries kept before a column existed count as undefined (n/a) in it."""
  return ablations.mean_sd_cell([s.get(key, float("nan")) * scale for s in by_seed.values()],
                                digits)


def table(summaries: Mapping[tuple[str, str, int], dict]) -> str:
  """One markdown line per (row, size): mean ± sample standard deviation over its seeds (n/a
  where undefined), in the order first read."""
  by_cell: dict[tuple[str, str], dict[int, dict]] = {}
  for (row, size, seed), s in summaries.items():
    by_cell.setdefault((row, size), {})[seed] = s
  years = sorted({s["year_questions"] for s in summaries.values()})
  lines = ["| row | questions | test EM | copied from a retrieved block (%) | copied, among "
           f"the wrong (%) | EM, year questions ({', '.join(map(str, years))}) | EM, other "
           "questions | answer in a read block (%) | EM, answer in a read block | seeds |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for (row, size), by_seed in by_cell.items():
    lines.append(f"| {row} | {size} | {_over_seeds(by_seed, 'em')} | "
                 f"{_over_seeds(by_seed, 'copied', 100, 1)} | "
                 f"{_over_seeds(by_seed, 'copied_wrong', 100, 1)} | "
                 f"{_over_seeds(by_seed, 'em_year')} | {_over_seeds(by_seed, 'em_other')} | "
                 f"{_over_seeds(by_seed, 'answer_read', 100, 1)} | "
                 f"{_over_seeds(by_seed, 'em_answer_read')} | "
                 f"{', '.join(map(str, sorted(by_seed)))} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--world", choices=("toy", "wiki"), default="toy",
                      help="the toy world's Atlas bench (default) or its wiki-world rows")
  parser.add_argument("--out", default=None,
                      help="bench/atlas.py's --out (required for the toy world; the wiki "
                           f"world's default: {wiki_runs.DEFAULT_OUT})")
  parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
  parser.add_argument("--rows", nargs="+", default=None,
                      help="bench/atlas.py row names (default: extractive fid; the wiki "
                           "world's: extractive fid closed_book)")
  parser.add_argument("--sizes", nargs="+", default=["all"],
                      help="training questions: 64, 256 or all (default: all; the wiki world "
                           "has all only)")
  parser.add_argument("--write", action="store_true",
                      help="write the world's section of bench/docs/benchmarks.md: "
                           + " / ".join(map(repr, SECTIONS.values())))
  ablations.add_cell_flags(parser, DEFAULT_CELLS["toy"])
  args = parser.parse_args(argv)
  world = args.world
  if world == "toy" and args.out is None:
    parser.error("--out: bench/atlas.py's --out (required for the toy world)")
  if world == "wiki" and args.sizes != ["all"]:
    parser.error("--sizes: the wiki world's rows train on all questions")
  rows = tuple(args.rows or DEFAULT_ROWS[world])
  if args.cells == DEFAULT_CELLS["toy"]:  # --cells not given: the world's own
    args.cells = DEFAULT_CELLS[world]
  out = os.path.abspath(args.out or wiki_runs.DEFAULT_OUT)  # before parse_cell_flags' chdir
  toy_bert, cells = ablations.parse_cell_flags(parser, args)
  from realm_jax.data import block_store as block_store_lib  # pylint: disable=import-outside-toplevel
  if world == "wiki":
    store_dir = os.path.join(out, "store")
  else:
    import realm_jax_tasks  # pylint: disable=import-outside-toplevel
    store_dir = realm_jax_tasks.toy_block_store_dir()
  store = block_store_lib.BlockStore.open(store_dir, verify="fast")
  def block_text(block_id: int) -> str:
    return f"{store.title(block_id)} {store.body(block_id)}"
  summaries, missing = collect(out, rows, args.sizes, args.seeds, block_text, cells,
                               row_fingerprints(rows, store_dir, toy_bert, world), world)
  for line in missing:
    print(f"fid_copying: no predictions for {line}", file=sys.stderr)
  if not summaries:
    print("fid_copying: nothing to report", file=sys.stderr)
    return 1
  command = (f"python bench/fid_copying.py --world wiki --seeds {' '.join(map(str, args.seeds))}"
             if world == "wiki" else
             f"python bench/fid_copying.py --out <bench/atlas.py's --out> --seeds "
             f"{' '.join(map(str, args.seeds))} --rows {' '.join(rows)} --sizes "
             f"{' '.join(args.sizes)}")
  body = (f"`{command}` (its module docstring says what each column counts).\n\n"
          + table(summaries))
  print(body)
  if args.write:
    # Stamped with the machines its kept summaries were read on, not only this one.
    cells_by_seed = {seed: [cell_path(cells, seed, row, size) for row, size, s in summaries
                            if s == seed] for seed in args.seeds}
    report.write_section(SECTIONS[world], body, host=ablations.cells_machines(cells_by_seed))
  return 0


if __name__ == "__main__":
  sys.exit(main())
