r"""Exact on-device search vs ScaNN: time, queries/s and recall@8 (REALM_SPEC 23).

  python bench/search.py                                  # 100k and 1M blocks, writes docs
  python bench/search.py --sizes 100000 --data normal     # one size, random-normal blocks
  python bench/search.py --quick                          # 20k blocks, seconds, no docs

For each corpus size N, a [N, 128] float32 matrix of block embeddings (default "clustered":
points around 1,000 random centres, queries near random blocks, as a question lands near its
answer's block; "normal": i.i.d. normal blocks and queries, the worst case for a partitioning
index) and 512 queries:

* exact search (`ExactSearcher`, all local devices, the default 512-query batch): jit warmed,
  median wall time of a few runs, queries/s; its peer, timed alternately in the same run, is the
  bare score matmul over the same sharded matrix (the floor for any exact search) and its GFLOP/s;
* ScaNN (`ScannSearcher`, ORQA's tree sizes capped by sqrt(N): 1000 leaves / 100 searched at
  1M, `score_ah(2)`, anisotropic threshold 0.2), with reordering off (as ORQA) and on (100
  candidates re-scored exactly): build time, queries/s with ScaNN's single-threaded
  `search_batched` and its thread pool (`search_batched_parallel`), recall@8 against the exact
  top-8 of the same run, and qps relative to exact search in the same run.

Writes the section "Search" of bench/docs/benchmarks.md (not with --quick or --no_write). On a GPU
or TPU host the exact figures are for that accelerator (jax.default_backend() is printed); ScaNN
always runs on the host CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from realm_jax.index import search  # noqa: E402

K = 8
REORDER = 100
NUM_CENTRES = 1000


def make_data(num_docs: int, dim: int, num_queries: int, kind: str,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Block embeddings [num_docs, dim] and queries [num_queries, dim], float32."""
  rng = np.random.default_rng(seed)
  if kind == "normal":
    docs = rng.standard_normal((num_docs, dim), dtype=np.float32)
    queries = rng.standard_normal((num_queries, dim), dtype=np.float32)
    return docs, queries
  centres = rng.standard_normal((NUM_CENTRES, dim), dtype=np.float32)  # [centres, dim]
  # Built in place, chunk by chunk, so the 1M case needs one [N, dim] buffer, not three.
  docs = np.empty((num_docs, dim), np.float32)
  for start in range(0, num_docs, 100_000):
    stop = min(start + 100_000, num_docs)
    assign = rng.integers(0, NUM_CENTRES, size=stop - start)
    docs[start:stop] = centres[assign]
    docs[start:stop] += 0.5 * rng.standard_normal((stop - start, dim), dtype=np.float32)
  # A question lands near (not on) its answer's block.
  queries = docs[rng.integers(0, num_docs, size=num_queries)]
  queries = queries + 0.5 * rng.standard_normal((num_queries, dim), dtype=np.float32)
  return docs, queries.astype(np.float32)


def timed(fn, repeats: int) -> float:
  """Median wall seconds of `repeats` calls after one warm-up call."""
  fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def timed_pair(fn_a, fn_b, repeats: int) -> tuple[float, float]:
  """Median wall seconds of two functions timed alternately, after one warm-up call each."""
  fn_a()
  fn_b()
  times_a, times_b = [], []
  for _ in range(repeats):
    for fn, times in ((fn_a, times_a), (fn_b, times_b)):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
  return statistics.median(times_a), statistics.median(times_b)


def measure(num_docs: int, dim: int, num_queries: int, kind: str, repeats: int) -> dict:
  docs, queries = make_data(num_docs, dim, num_queries, kind)
  result = {"num_docs": num_docs, "dim": dim, "num_queries": num_queries, "data": kind,
            "repeats": repeats}

  exact = search.ExactSearcher(docs)
  # Peer: the score matmul alone, [queries, docs] float32 written to device memory and nothing
  # else (no top-k, no merge, no host transfer): what any exact search must at least pay.
  matmul = jax.jit(lambda q, e: jnp.einsum("qd,nd->qn", q, e, precision="highest",
                                           preferred_element_type=jnp.float32))
  queries_on_device = jax.device_put(queries, exact.query_sharding)
  # Interleaved, so that load from other processes on a shared machine hits both alike.
  exact_seconds, matmul_seconds = timed_pair(
      lambda: exact.search(queries, K),
      lambda: matmul(queries_on_device, exact.embeddings).block_until_ready(), repeats)
  _, exact_ids = exact.search(queries, K)
  result.update(
      exact_seconds=round(exact_seconds, 4),
      exact_qps=round(num_queries / exact_seconds, 1),
      matmul_seconds=round(matmul_seconds, 4),
      matmul_gflops=round(2 * num_queries * num_docs * dim / matmul_seconds / 1e9, 1),
      exact_devices=exact.num_shards)
  del exact

  result["scann"] = []
  search._import_scann()  # pylint: disable=protected-access  (TensorFlow's import is no build time)
  for reorder in (0, REORDER):
    start = time.perf_counter()
    scann = search.ScannSearcher.build(docs, reorder=reorder)
    build_seconds = time.perf_counter() - start
    serial_seconds = timed(lambda: scann.search(queries, K), repeats)  # pylint: disable=cell-var-from-loop
    scann.parallel = True
    parallel_seconds = timed(lambda: scann.search(queries, K), repeats)  # pylint: disable=cell-var-from-loop
    _, ids = scann.search(queries, K)
    row = {
        "reorder": reorder,
        "num_leaves": scann.params["num_leaves"],
        "num_leaves_to_search": scann.params["num_leaves_to_search"],
        "build_seconds": round(build_seconds, 1),
        "qps": round(num_queries / serial_seconds, 1),
        "qps_parallel": round(num_queries / parallel_seconds, 1),
        "recall_at_8": round(search.recall_at_k(ids, exact_ids, K), 4),
    }
    result["scann"].append(row)
    print(json.dumps({"num_docs": num_docs, "scann": row}), file=sys.stderr, flush=True)
    del scann
  return result


def markdown(results: list[dict], backend: str, device_kind: str,
             load: tuple[float, float]) -> str:
  first = results[0]
  lines = [
      f"`python bench/search.py --sizes {' '.join(str(r['num_docs']) for r in results)}` "
      f"({first['data']} data, dim {first['dim']}, {first['num_queries']} queries, top-{K}). "
      f"Exact search on JAX backend `{backend}` ({device_kind}, {first['exact_devices']} "
      "device(s), default query batch 512, float32 with `precision=highest`); ScaNN on the host "
      f"CPU. Times are medians of {first['repeats']} warm runs; 1-minute load average "
      f"{load[0]:.1f} before, {load[1]:.1f} after.",
      "",
      f"| blocks | exact: s / {first['num_queries']} queries | exact qps | score matmul alone (s) "
      "| matmul GFLOP/s | exact / matmul time |",
      "|---|---|---|---|---|---|",
  ]
  for r in results:
    lines.append(f"| {r['num_docs']:,} | {r['exact_seconds']} | {r['exact_qps']:,} | "
                 f"{r['matmul_seconds']} | {r['matmul_gflops']} | "
                 f"{r['exact_seconds'] / r['matmul_seconds']:.2f}x |")
  lines += [
      "",
      "| blocks | ScaNN reorder | leaves (searched) | build (s) | qps (1 thread) | qps (pool) "
      "| recall@8 vs exact | qps / exact qps (1 thread, pool) |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    for s in r["scann"]:
      lines.append(
          f"| {r['num_docs']:,} | {s['reorder'] or 'off (ORQA)'} | {s['num_leaves']} "
          f"({s['num_leaves_to_search']}) | {s['build_seconds']} | {s['qps']:,} | "
          f"{s['qps_parallel']:,} | {s['recall_at_8']:.3f} | "
          f"{s['qps'] / r['exact_qps']:.2g}x, {s['qps_parallel'] / r['exact_qps']:.2g}x |")
  last = results[-1]
  off, on = last["scann"][0], last["scann"][1]
  per_block = last["exact_seconds"] / last["num_docs"]
  if last["num_docs"] >= 13_353_718:
    realm_scale = "REALM's 13.35M blocks are within the measured sizes"
  else:
    realm_scale = (f"linear in the corpus, it would take about {per_block * 13_353_718:.2g} s per "
                   f"{last['num_queries']} queries over REALM's 13.35M blocks on this backend")

  def speed(ratio: float) -> str:
    return (f"{ratio:.2g}x faster than" if ratio >= 1
            else f"{ratio:.2g}x the speed of (slower than)")

  lines += [
      "",
      f"Exact search costs {last['exact_seconds'] / last['matmul_seconds']:.2f}x its score "
      f"matmul at {last['num_docs']:,} blocks (the rest is top-k, the merge and the transfer of "
      f"the answers); {realm_scale}. At {last['num_docs']:,} blocks ScaNN with ORQA's "
      f"settings (no reordering) is {speed(off['qps'] / last['exact_qps'])} exact search "
      f"single-threaded ({off['qps_parallel'] / last['exact_qps']:.2g}x with its thread pool) "
      f"and finds only {off['recall_at_8']:.0%} of the exact top-8 on this data; re-scoring "
      f"{REORDER} candidates exactly brings recall@8 to {on['recall_at_8']:.1%} at "
      f"{on['qps'] / last['exact_qps']:.2g}x the speed of exact search (single-threaded). "
      "Recall depends on the data: "
      + ("these are synthetic clusters, not trained REALM embeddings (`--data normal`, i.i.d. "
         "blocks, is the hard case)." if first["data"] == "clustered" else
         "i.i.d. normal blocks have no structure for the tree to use, the worst case."),
  ]
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
  parser.add_argument("--dim", type=int, default=128)
  parser.add_argument("--num_queries", type=int, default=512)
  parser.add_argument("--data", choices=("clustered", "normal"), default="clustered")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
  parser.add_argument("--quick", action="store_true",
                      help="20k blocks, 128 queries, 2 repeats; implies --no_write")
  parser.add_argument("--no_write", action="store_true", help="do not update docs")
  args = parser.parse_args()
  if args.quick:
    args.sizes, args.num_queries, args.repeats, args.no_write = [20_000], 128, 2, True

  backend = jax.default_backend()
  device_kind = jax.devices()[0].device_kind
  print(f"JAX backend {backend} ({device_kind}), {len(jax.local_devices())} local device(s)",
        file=sys.stderr)
  results = []
  load_before = os.getloadavg()[0]
  for num_docs in args.sizes:
    results.append(measure(num_docs, args.dim, args.num_queries, args.data, args.repeats))
    print(json.dumps(results[-1]), flush=True)
  load = (load_before, os.getloadavg()[0])
  text = markdown(results, backend, device_kind, load)
  print(text)
  if not args.no_write:
    from bench import report  # noqa: E402  pylint: disable=g-import-not-at-top
    report.write_section("Search", text,
                         accelerator=None if backend == "cpu" else device_kind)


if __name__ == "__main__":
  main()
