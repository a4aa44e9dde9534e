r"""Builds the knowledge corpus Z as a BlockStore (REALM_SPEC 7, 24).

  python -m realm_jax.build_corpus --source jsonl --input wiki.jsonl --out /data/z/blocks
  python -m realm_jax.build_corpus --source tfds --input wikipedia/20230601.en \
      --split train --tfds_data_dir ~/tensorflow_datasets --out /data/z/blocks
  python -m realm_jax.build_corpus --source realm \
      --input 'retrieval_corpus/docs.tfr.gz-*-of-*' --out /data/z/blocks

Documents are tokenised in `--workers` processes; one writer keeps their order, so the store is
the same whatever the number of workers. Progress goes to stderr, the summary to stdout. Bad
input stops with a one-line error (`--on_error raise`, the default) or is counted
(`--on_error skip`); empty, duplicate and over-long-title documents are always counted skips.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Optional, Sequence

from realm_jax import gin_utils
from realm_jax.data import block_store as block_store_lib
from realm_jax.data import corpus_build
from realm_jax.data import sources as sources_lib


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m realm_jax.build_corpus",
      description="Build a REALM knowledge-corpus BlockStore from documents.")
  parser.add_argument("--source", required=True, choices=("jsonl", "tfds", "realm"),
                      help="jsonl: {\"title\", \"text\"} per line; tfds: a TFDS name with "
                      "title/text features; realm: REALM retrieval-corpus TFRecords (file or "
                      "glob) or an ORQA blocks directory (each record one block).")
  parser.add_argument("--input", required=True, help="JSONL path, TFDS name or TFRecord glob.")
  parser.add_argument("--out", required=True, help="Output BlockStore directory.")
  parser.add_argument("--max_block_len", type=int, default=block_store_lib.DEFAULT_MAX_BLOCK_LEN,
                      help="Wordpieces per block including [CLS]/[SEP]/[SEP] (REALM: 288).")
  parser.add_argument("--max_title_len", type=int, default=None,
                      help="Longer titles skip the document (default min(64, max_block_len-4)).")
  parser.add_argument("--on_error", choices=("raise", "skip"), default="raise",
                      help="Malformed records: stop with an error, or count and skip them.")
  parser.add_argument("--limit", type=int, default=None,
                      help="Read at most this many input records.")
  parser.add_argument("--split", default="train", help="TFDS split (--source tfds).")
  parser.add_argument("--tfds_data_dir", default=None, help="TFDS data_dir (--source tfds).")
  parser.add_argument("--record_token_ids", choices=("verify", "ours"), default="verify",
                      help="REALM records with token ids: a mismatch with our tokenisation is "
                      "an error (verify) or is counted and ours kept (ours).")
  parser.add_argument("--overwrite", action="store_true",
                      help="Replace an existing --out BlockStore (never anything else).")
  parser.add_argument("--progress_every", type=float, default=5.0,
                      help="Seconds between progress lines on stderr.")
  parser.add_argument("--workers", type=int, default=corpus_build.default_workers(),
                      help="Processes that tokenise documents (default: the cores this process "
                      "may use); the store is byte for byte that of --workers 1.")
  return parser.parse_args(argv)


def _describe_error(args: argparse.Namespace, error: BaseException) -> str:
  """The one line `build_corpus: error: ...` says about `error` (after `gin_utils.run_command`)."""
  if isinstance(error, (sources_lib.CorpusInputError, block_store_lib.BlockStoreError, ValueError)):
    hint = ("; rerun with --on_error skip to count and skip such records"
            if getattr(error, "record", None) is not None else "")
    return f"{error}{hint}"
  if isinstance(error, OSError):  # e.g. a read-only --out: one line naming the path
    out = os.path.abspath(args.out)
    failed = os.path.abspath(str(error.filename)) if error.filename else None
    if failed and (failed.startswith(out) or out.startswith(failed + os.sep)):
      # The store is written into <out>.staging-... next to it (its parents made first), then
      # renamed: say it was --out, whichever of these paths failed.
      return f"cannot write --out {args.out}: {error.strerror} ({error.filename})"
    return str(error)
  return f"{type(error).__name__}: {gin_utils.one_line(error)}"


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)

  def progress(p: corpus_build.BuildProgress) -> None:
    print(f"build_corpus: {p.line()}", file=sys.stderr, flush=True)

  def build() -> int:
    source = sources_lib.make_source(args.source, args.input, split=args.split,
                                     data_dir=args.tfds_data_dir)
    report = corpus_build.build_block_store(
        source, args.out, max_block_len=args.max_block_len, max_title_len=args.max_title_len,
        on_error=args.on_error, limit=args.limit, record_token_ids=args.record_token_ids,
        overwrite=args.overwrite, progress=progress, progress_interval_s=args.progress_every,
        workers=args.workers)
    print("\n".join(report.summary_lines()), flush=True)
    return 0

  return gin_utils.run_command(
      "build_corpus", build, interrupted="nothing was written to --out",
      expected=(sources_lib.CorpusInputError, block_store_lib.BlockStoreError, ValueError, OSError),
      describe=functools.partial(_describe_error, args))


if __name__ == "__main__":
  gin_utils.exit_process(main(), "build_corpus")
