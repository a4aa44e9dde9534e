r"""A stand-in trainer for the two-process refresh test (not a test module itself).

  python tests/index/standin_trainer.py --run_dir RUN --block_store Z --metrics out.jsonl

Plays the trainer's side of the index-refresh protocol with a tiny retriever and no real
training: saves a step-0 checkpoint (the "warm start"), waits for the builder's first index,
then runs steps that perturb the parameters, save a checkpoint every `--save_every` steps, call
`IndexWatcher.maybe_swap` at every step boundary and log the staleness metrics of every step as
one JSON line. When `--min_refreshes` swaps have happened it saves a last checkpoint, writes
TRAINING_DONE and exits 0; it exits 1 if that does not happen within `--timeout` seconds.
Nothing assumes a speed: the loop runs until the builder has delivered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

from realm_jax.data.block_store import BlockStore  # noqa: E402
from realm_jax.index import retrieval  # noqa: E402
from realm_jax.index import store as store_lib  # noqa: E402
from realm_jax.index import swap  # noqa: E402
from realm_jax.models import config as config_lib  # noqa: E402
from realm_jax.models.retriever import RealmRetriever  # noqa: E402
from realm_jax import checkpoints as ckpt  # noqa: E402

CONFIG = config_lib.RealmConfig(bert=config_lib.tiny_bert(vocab_size=30522))


def random_params(seed: int = 0):
  """Tiny retriever params of the right shapes (no init run: it is slow on a small CPU)."""
  q = np.ones((1, 8), np.int32)
  c = np.ones((1, 2, 8), np.int32)
  shapes = jax.eval_shape(lambda: nn.unbox(
      RealmRetriever(CONFIG).init(jax.random.PRNGKey(0), q, q, q, c, c, c)))["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0, 0.05, s.shape).astype(s.dtype), shapes)


def main() -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", required=True)
  parser.add_argument("--block_store", required=True)
  parser.add_argument("--metrics", required=True, help="JSONL file, one line per step")
  parser.add_argument("--save_every", type=int, default=4)
  parser.add_argument("--min_refreshes", type=int, default=3)
  parser.add_argument("--step_seconds", type=float, default=0.05)
  parser.add_argument("--timeout", type=float, default=120.0)
  parser.add_argument("--keep", type=int, default=3, help="checkpoints kept, as the trainer's")
  parser.add_argument("--query_tower", action="store_true",
                      help="load each index with the trainer's loader (retrieval.make_index_loader:"
                           " the index plus the query tower it was built with)")
  args = parser.parse_args()

  deadline = time.monotonic() + args.timeout
  blocks = BlockStore.open(args.block_store, verify=False)
  params = random_params()
  rng = np.random.default_rng(1)
  ckpt.save_checkpoint(args.run_dir, 0, {"retriever": params}, config=CONFIG, keep=args.keep)
  # REALM_SPEC 22: training retrieves from its first step, so wait for the first index.
  while store_lib.latest_index_step(args.run_dir) is None:
    if time.monotonic() > deadline:
      print("standin_trainer: no first index before the timeout", file=sys.stderr)
      return 1
    time.sleep(0.05)

  load_fn = retrieval.make_index_loader(args.run_dir, CONFIG) if args.query_tower else None
  watcher = swap.IndexWatcher(args.run_dir, check_every_steps=1, load_fn=load_fn,
                              block_store_id=blocks.store_id, num_blocks=blocks.num_blocks,
                              dim=CONFIG.proj_size)
  watcher.start()
  step = 0
  with open(args.metrics, "w", encoding="utf-8") as log_file, watcher:
    while watcher.refreshes < args.min_refreshes:
      if time.monotonic() > deadline:
        print(f"standin_trainer: only {watcher.refreshes} refreshes before the timeout",
              file=sys.stderr)
        return 1
      step += 1
      watcher.maybe_swap(step)  # the step boundary
      time.sleep(args.step_seconds)  # "the train step"
      # A "gradient update": the document embeddings change, so every index differs.
      params = jax.tree.map(lambda p: p + rng.normal(0, 0.01, p.shape).astype(p.dtype), params)
      # Whether the checkpoint the current index was built from still exists.
      record = {"step": step, **watcher.metrics(step)}
      record["checkpoint_present"] = os.path.isdir(ckpt.checkpoint_path(
          args.run_dir, int(record["retrieval/index_step"])))
      log_file.write(json.dumps(record) + "\n")
      log_file.flush()
      if step % args.save_every == 0:
        ckpt.save_checkpoint(args.run_dir, step, {"retriever": params}, config=CONFIG,
                             keep=args.keep)
  step += 1
  ckpt.save_checkpoint(args.run_dir, step, {"retriever": params}, config=CONFIG, keep=args.keep)
  ckpt.mark_training_done(args.run_dir)
  print(f"standin_trainer: done at step {step} after {watcher.refreshes} refreshes", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
