r"""What retrieval can add to REALM pretraining on a corpus: are its masked spans stated elsewhere?

  python bench/world_statistics.py --store DIR [--records FILE | --annotator NAME]
      [--index RUN/index/STEP] [--queries 1000] [--k 8] [--json]

REALM pretrains with X = Z and excludes the query's own block from the candidates, so a masked
name or date can only be recovered from a block of *another* article that states it. For a
BlockStore (`--store`) and the pretraining records X (`--records`: the REALM release's
precomputed-span schema, JSON lines or TFRecords; without it X is the store's own blocks,
annotated with `--annotator`, as the pretraining task does for X = Z) this prints
(`realm_jax.data.world_statistics`):

  * the share of X's wordpieces inside salient spans, and of its sentences holding one;
  * the share of the masked spans (what salient-span masking draws) whose words another
    article's block states, of the sentences with a span where some span is, and how many
    other articles state a span (at most 4 counted); a warning when the span share is below 30%;
  * with `--index` (a published index, `<run>/index/<step>`, searched with the query tower of
    the checkpoint it was built from): the share of the first `--queries` masked queries whose
    top `--k` blocks, own block excluded, hold another article's block stating the span.

A span is stated when its words, normalised as answers are (lower case, punctuation and
articles dropped), are consecutive whole words of the block's normalised body. `--json` prints
the figures as one JSON object instead of the Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from realm_jax import progress as progress_lib  # noqa: E402  pylint: disable=wrong-import-position
# pylint: disable-next=wrong-import-position
from realm_jax.data import block_store as block_store_lib  # noqa: E402
from realm_jax.data import salient_spans  # noqa: E402  pylint: disable=wrong-import-position
# pylint: disable-next=wrong-import-position
from realm_jax.data import world_statistics as world_lib  # noqa: E402


def load_retriever(index_dir: str):
  """An `IndexRetriever` over a published index, with the query tower of the checkpoint the
  index was built from (REALM_SPEC 21: the one its documents were embedded with).

  Args:
    index_dir: `<run>/index/<step>`.

  Returns:
    A `realm_jax.index.retrieval.IndexRetriever`.

  Raises:
    CheckpointError: the checkpoint the index was built from cannot be found.
  """
  # The index and model layers load JAX: imported only when an index is searched.
  from realm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  from realm_jax.index import retrieval  # pylint: disable=import-outside-toplevel
  from realm_jax.index import store as store_lib  # pylint: disable=import-outside-toplevel
  loaded = store_lib.load_index(index_dir, verify=False)
  run_dir = os.path.dirname(os.path.dirname(os.path.abspath(index_dir)))
  step_dir = retrieval.index_checkpoint_dir(run_dir, loaded)
  params, config, _ = checkpoints.restore_checkpoint_dir(step_dir)
  return retrieval.IndexRetriever(loaded, params, config)


def _timed(what: str, fn, *args, **kwargs):
  """fn(*args, progress=..., **kwargs), with progress lines on stderr every few seconds when it
  takes longer than that, and then the time it took."""
  throttle = progress_lib.Throttle()
  start = time.monotonic()
  result = fn(*args, progress=throttle, **kwargs)
  elapsed = time.monotonic() - start
  if elapsed >= throttle.interval_s:  # a quick step shows no progress line, only its time
    throttle.finish()
  print(f"{what}: {progress_lib.format_duration(elapsed)}", file=sys.stderr)
  return result


def statistics(store_dir: str, records_path: str | None = None, *, annotator: str = "union",
               index_dir: str | None = None, num_queries: int = 1000,
               k: int = world_lib.NUM_CANDIDATES,
               max_span_words: int = world_lib.MAX_SPAN_WORDS) -> dict:
  """The figures of one corpus, as the JSON object `--json` prints."""
  store = block_store_lib.BlockStore.open(store_dir, verify="fast")
  if records_path is not None:
    records = list(salient_spans.read_precomputed(records_path))
  else:
    records = list(salient_spans.annotate_blocks(store, annotator))
  share = _timed("salient share", world_lib.salient_share, records)
  redundancy = _timed("span redundancy", world_lib.span_redundancy, store, records,
                      max_span_words=max_span_words)
  out = {
      "store": store_dir, "records": records_path or f"the store's blocks ({annotator})",
      "blocks": store.num_blocks, "num_records": len(records),
      "wordpieces": share.wordpieces, "salient_wordpiece_share": share.wordpiece_fraction,
      "sentences": share.sentences, "salient_sentence_share": share.sentence_fraction,
      "redundancy": {"spans": redundancy.spans, "span_share": redundancy.span_share,
                     "long_spans": redundancy.long_spans, "sentences": redundancy.sentences,
                     "sentence_share": redundancy.sentence_share,
                     "mean_other_articles": redundancy.mean_other_articles,
                     "max_articles": redundancy.max_articles,
                     "max_span_words": redundancy.max_span_words},
      "warning": world_lib.warning_line(redundancy),
  }
  if index_dir is not None:
    retrieved = _timed("retrieval", world_lib.retrieved_statement_share, store, records,
                       load_retriever(index_dir), num_queries=num_queries, k=k)
    out["retrieval"] = {"index": index_dir, "queries": retrieved.queries, "k": retrieved.k,
                        "share": retrieved.share}
  return out


def table(figures: dict) -> str:
  """The figures as a Markdown table, the warning line below it."""
  r = figures["redundancy"]
  rows = [
      ("wordpieces of X inside salient spans",
       f"{figures['salient_wordpiece_share']:.1%} of {figures['wordpieces']:,}"),
      ("sentences of X holding a salient span",
       f"{figures['salient_sentence_share']:.1%} of {figures['sentences']:,}"),
      ("masked spans stated in another article's block",
       f"{r['span_share']:.1%} of {r['spans']:,}"
       + (f" ({r['long_spans']:,} longer than {r['max_span_words']} words, not looked for)"
          if r["long_spans"] else "")),
      ("sentences with a span where some span is stated in another article",
       f"{r['sentence_share']:.1%} of {r['sentences']:,}"),
      (f"other articles stating a masked span (mean, at most {r['max_articles']} counted)",
       f"{r['mean_other_articles']:.2f}"),
  ]
  if "retrieval" in figures:
    q = figures["retrieval"]
    rows.append((f"masked queries whose top {q['k']} (own block excluded) hold another "
                 f"article's block stating the span", f"{q['share']:.1%} of {q['queries']:,}"))
  lines = [f"{figures['blocks']:,} blocks of {figures['store']}; X: {figures['records']}, "
           f"{figures['num_records']:,} records", "", "| statistic | value |", "|---|---|"]
  lines += [f"| {name} | {value} |" for name, value in rows]
  return "\n".join(lines + ["", figures["warning"]])


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--store", required=True, help="the knowledge corpus Z, a BlockStore "
                      "directory (python -m realm_jax.build_corpus)")
  parser.add_argument("--records", default=None,
                      help="pretraining records X in the precomputed-span schema (.jsonl, "
                           ".tfrecord, optionally .gz); default: the store's own blocks (X = Z)")
  parser.add_argument("--annotator", default="union",
                      choices=sorted(salient_spans.ANNOTATORS),
                      help="salient spans of the store's blocks when there is no --records "
                           "(default: union, the pretraining task's)")
  parser.add_argument("--index", default=None,
                      help="a published index of this store, <run>/index/<step>: also measure "
                           "what its retriever fetches (needs the checkpoint it was built from)")
  parser.add_argument("--queries", type=int, default=1000,
                      help="masked queries searched with --index (default: 1000)")
  parser.add_argument("--k", type=int, default=world_lib.NUM_CANDIDATES,
                      help="candidates per query, own block excluded (default: REALM's 8)")
  parser.add_argument("--max_span_words", type=int, default=world_lib.MAX_SPAN_WORDS,
                      help="longer spans are not looked for and count as not stated "
                           f"(default: {world_lib.MAX_SPAN_WORDS})")
  parser.add_argument("--json", action="store_true", help="print one JSON object instead of "
                      "the Markdown table")
  args = parser.parse_args(argv)
  figures = statistics(args.store, args.records, annotator=args.annotator,
                       index_dir=args.index, num_queries=args.queries, k=args.k,
                       max_span_words=args.max_span_words)
  print(json.dumps(figures, indent=2) if args.json else table(figures))
  return 0


if __name__ == "__main__":
  sys.exit(main())
