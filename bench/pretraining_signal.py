r"""Does a masked pretraining sentence find the document that states its masked span?

  python bench/pretraining_signal.py --index RUN/index/STEP [--queries 1000] [--k 8]

REALM's retriever learns from how much each retrieved block helps the encoder predict the
masked span (retrieval utility), and a block helps only when it states the span. For the first
`--queries` passages of the toy world's pretraining text X, each with one salient span masked
as REALM pretraining masks it (`masking.make_masked_query`, REALM's query length), this counts
how often a block of the passage's own document, the one that states its facts (X states them
in other words), is among the `--k` blocks the index's query tower ranks first (REALM
pretraining reads 8), and how often it is first. Run it on a pretraining run's indexes: its
first (`<run>/index/0`, the ICT retriever) and its last.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# pylint: disable-next=wrong-import-position
from bench import world_statistics as world_bench  # noqa: E402
# pylint: disable-next=wrong-import-position
from realm_jax.data import block_store as block_store_lib  # noqa: E402
from realm_jax.data import salient_spans  # noqa: E402  pylint: disable=wrong-import-position
from realm_jax.data import toy_world  # noqa: E402  pylint: disable=wrong-import-position
# pylint: disable-next=wrong-import-position
from realm_jax.data import world_statistics as world_lib  # noqa: E402


def masked_queries(num_queries: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
  """(query_ids, query_mask [N, QUERY_LEN], titles) of the first passages of the toy world's X
  that give a salient-span query, passage i masked with rng seed i
  (`world_statistics.masked_span_queries`)."""
  path = os.path.join(toy_world.toy_world_dir(), toy_world.PRETRAIN_FILE)
  queries = world_lib.masked_span_queries(salient_spans.read_precomputed(path),
                                          num_queries=num_queries)
  return (np.stack([q.query.query_ids for q in queries]),
          np.stack([q.query.query_mask for q in queries]), [q.title for q in queries])


def own_document_ranks(index_dir: str, num_queries: int, k: int) -> dict[str, float]:
  """{"in_top_k", "first", "queries"}: how often a block of the passage's own document is among
  the top `k` of the index (its own query tower, as pretraining searches), and first."""
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel
  retriever = world_bench.load_retriever(index_dir)
  store = block_store_lib.BlockStore.open(realm_jax_tasks.toy_block_store_dir(), verify="fast")
  query_ids, query_mask, titles = masked_queries(num_queries)
  _, block_ids = retriever.retrieve(query_ids, query_mask, k=k)  # [N, k]
  retrieved = [[store.title(int(b)) for b in row] for row in block_ids]
  return {"in_top_k": float(np.mean([t in row for t, row in zip(titles, retrieved)])),
          "first": float(np.mean([t == row[0] for t, row in zip(titles, retrieved)])),
          "queries": len(titles)}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--index", required=True, help="a published index, <run>/index/<step>")
  parser.add_argument("--queries", type=int, default=1000, help="masked passages of X")
  parser.add_argument("--k", type=int, default=8, help="blocks retrieved per query")
  args = parser.parse_args()
  result = own_document_ranks(args.index, args.queries, args.k)
  print(f"{args.index}: of {result['queries']} masked passages of the toy world's X, "
        f"{result['in_top_k']:.3f} find a block of their own document in the top {args.k}, "
        f"{result['first']:.3f} first")
  return 0


if __name__ == "__main__":
  sys.exit(main())
