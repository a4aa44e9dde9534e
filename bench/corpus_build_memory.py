r"""Peak memory and throughput of the corpus build (REALM_SPEC 24: the build must stream).

  python bench/corpus_build_memory.py            # 10k and 100k documents, writes docs

Writes N synthetic Wikipedia-like articles to a JSONL file (streamed: they are never all in
memory), then builds a BlockStore from it in a fresh subprocess, so the figures are those of the
build alone: peak RSS (ru_maxrss) before and after the build, documents/s, MB of text/s, blocks.
Articles have 4-40 sentences of 6-30 words drawn from the vocabulary's whole words (about
2 blocks of 288 wordpieces each, like English Wikipedia's 13.35M blocks from ~6M articles).
Peak RSS must not grow with N: the peer in the same run is the build of 10x fewer documents,
and the table reports the ratio of the peaks (the section "Corpus build" of
bench/docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_synthetic_jsonl(path: str, num_docs: int, seed: int = 0) -> int:
  """Writes `num_docs` synthetic articles; returns the file size in bytes."""
  sys.path.insert(0, REPO_ROOT)
  from realm_jax.data import vocab as vocab_lib  # noqa: E402

  vocab = vocab_lib.default_vocabulary()
  words = [t for t in vocab.tokens[1996:] if t.isalpha() and not t.startswith("##")]
  rng = random.Random(seed)
  with open(path, "w", encoding="utf-8") as f:
    for i in range(num_docs):
      sentences = []
      for _ in range(rng.randint(4, 40)):
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(6, 30)))
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".!?"))
      title = " ".join(rng.choice(words).capitalize() for _ in range(rng.randint(1, 4)))
      f.write(json.dumps({"title": f"{title} {i}", "text": " ".join(sentences)}) + "\n")
  return os.path.getsize(path)


def child(jsonl: str, dest: str, max_block_len: int) -> None:
  """Runs in the subprocess: builds the store and prints one JSON line of figures."""
  sys.path.insert(0, REPO_ROOT)
  from realm_jax.data import corpus_build  # noqa: E402
  from realm_jax.data import sources as sources_lib  # noqa: E402
  from realm_jax.data import vocab as vocab_lib  # noqa: E402

  vocab_lib.default_vocabulary()
  baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  start = time.perf_counter()
  report = corpus_build.build_block_store(sources_lib.JsonlSource(jsonl), dest,
                                          max_block_len=max_block_len, on_error="raise")
  seconds = time.perf_counter() - start
  peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  store_bytes = sum(os.path.getsize(os.path.join(dest, f)) for f in os.listdir(dest))
  print(json.dumps({
      "documents": report.counts["documents_read"],
      "blocks": report.num_blocks,
      "oversize_sentences": report.counts["oversize_sentences"],
      "seconds": round(seconds, 1),
      "documents_per_s": round(report.counts["documents_read"] / seconds, 1),
      "blocks_per_s": round(report.num_blocks / seconds, 1),
      "input_mb_per_s": round(os.path.getsize(jsonl) / seconds / 1e6, 2),
      "rss_before_build_mb": round(baseline_kb / 1024, 1),
      "peak_rss_mb": round(peak_kb / 1024, 1),
      "store_mb": round(store_bytes / 1e6, 1),
  }))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--num_docs", type=int, nargs="+", default=[10_000, 100_000])
  parser.add_argument("--no_write", action="store_true", help="do not update docs")
  parser.add_argument("--max_block_len", type=int, default=288)
  parser.add_argument("--workdir", default=None, help="Default: a temporary directory.")
  parser.add_argument("--child", nargs=2, metavar=("JSONL", "DEST"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args.child[0], args.child[1], args.max_block_len)
    return

  workdir = args.workdir or tempfile.mkdtemp(prefix="corpus_bench_")
  os.makedirs(workdir, exist_ok=True)
  results = []
  try:
    for num_docs in args.num_docs:
      results.append(_measure(workdir, num_docs, args.max_block_len))
      print(json.dumps(results[-1]), flush=True)
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  if not args.no_write:
    sys.path.insert(0, REPO_ROOT)
    from bench import report  # noqa: E402
    report.write_section("Corpus build", _markdown(results, args.max_block_len))


def _measure(workdir: str, num_docs: int, max_block_len: int) -> dict:
  jsonl = os.path.join(workdir, f"synthetic_{num_docs}.jsonl")
  dest = os.path.join(workdir, f"store_{num_docs}")
  if not os.path.exists(jsonl):
    size = write_synthetic_jsonl(jsonl, num_docs)
    print(f"wrote {num_docs:,} synthetic documents ({size / 1e6:.1f} MB) to {jsonl}",
          file=sys.stderr)
  shutil.rmtree(dest, ignore_errors=True)
  result = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--max_block_len", str(max_block_len),
       "--child", jsonl, dest], check=True, capture_output=True, text=True)
  shutil.rmtree(dest, ignore_errors=True)
  return json.loads(result.stdout.strip().splitlines()[-1])


def _markdown(results: list[dict], max_block_len: int) -> str:
  rows = ["| documents | blocks | seconds | documents/s | input MB/s | RSS before build (MB) "
          "| peak RSS (MB) | store (MB) |", "|---|---|---|---|---|---|---|---|"]
  for r in results:
    rows.append(f"| {r['documents']:,} | {r['blocks']:,} | {r['seconds']} | "
                f"{r['documents_per_s']} | {r['input_mb_per_s']} | {r['rss_before_build_mb']} | "
                f"{r['peak_rss_mb']} | {r['store_mb']} |")
  small, large = results[0], results[-1]
  ratio = large["peak_rss_mb"] / small["peak_rss_mb"]
  return (f"`python bench/corpus_build_memory.py`: synthetic Wikipedia-like articles (4-40 "
          f"sentences) -> BlockStore with max_block_len {max_block_len}, one process, each build "
          f"in a fresh subprocess.\n\n" + "\n".join(rows) +
          f"\n\nPeak RSS, {large['documents']:,} vs {small['documents']:,} documents: "
          f"**{ratio:.2f}x** for {large['documents'] / small['documents']:.0f}x the input: the "
          "build streams. What grows is the duplicate-detection table (8-24 bytes per document) "
          "and the tokenizer's tables of parts and words already tokenised (bounded: "
          "`vocab.MAX_CACHED_KEYS` each). Throughput by tokenizer backend and number of worker "
          "processes: the section \"Corpus build speed\" (bench/corpus_build_speed.py).")


if __name__ == "__main__":
  main()
