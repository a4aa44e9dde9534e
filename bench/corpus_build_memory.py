r"""Peak memory and throughput of the corpus build (REALM_SPEC 24: the build must stream).

  python bench/corpus_build_memory.py --num_docs 100000

Writes N synthetic Wikipedia-like articles to a JSONL file (streamed: they are never all in
memory), then builds a BlockStore from it in a fresh subprocess, so the figures are those of the
build alone: peak RSS (ru_maxrss) before and after the build, documents/s, MB of text/s, blocks.
Articles have 4-40 sentences of 6-30 words drawn from the vocabulary's whole words (about
2 blocks of 288 wordpieces each, like English Wikipedia's 13.35M blocks from ~6M articles).
Peak RSS should not grow with N: compare --num_docs 10000 and 100000.
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
  from realm_jax.data import corpus  # noqa: E402
  from realm_jax.data import vocab as vocab_lib  # noqa: E402

  vocab_lib.default_vocabulary()
  baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  start = time.perf_counter()
  report = corpus.build_block_store(corpus.JsonlSource(jsonl), dest,
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
  parser.add_argument("--num_docs", type=int, default=100_000)
  parser.add_argument("--max_block_len", type=int, default=288)
  parser.add_argument("--workdir", default=None, help="Default: a temporary directory.")
  parser.add_argument("--child", nargs=2, metavar=("JSONL", "DEST"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args.child[0], args.child[1], args.max_block_len)
    return

  workdir = args.workdir or tempfile.mkdtemp(prefix="corpus_bench_")
  os.makedirs(workdir, exist_ok=True)
  jsonl = os.path.join(workdir, f"synthetic_{args.num_docs}.jsonl")
  dest = os.path.join(workdir, f"store_{args.num_docs}")
  try:
    if not os.path.exists(jsonl):
      size = write_synthetic_jsonl(jsonl, args.num_docs)
      print(f"wrote {args.num_docs:,} synthetic documents ({size / 1e6:.1f} MB) to {jsonl}",
            file=sys.stderr)
    shutil.rmtree(dest, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--max_block_len", str(args.max_block_len),
         "--child", jsonl, dest], check=True, capture_output=True, text=True)
    print(result.stdout.strip())
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
  main()
