r"""A training process for the resume and multi-host tests (and shared test helpers).

  python tests/training/train_child.py --run_dir RUN --num_steps 20 --devices 1 \
      [--mesh 1,1] [--checkpoint_every 5] [--pause_before_step 11] [--dump final.npz] \
      [--metrics metrics.jsonl] [--num_layers 2] \
      [--coordinator 127.0.0.1:PORT --num_processes 2 --process_id 0]

Trains the tiny ICT model with `realm_jax.training.trainer.train` on deterministic synthetic
batches (global batch `--batch`; in a multi-host run each process feeds its contiguous half).
`--pause_before_step S` makes a hook sleep at the boundary before step S (after step S-1 and
its checkpoint have been handed to the writer), so a test can `kill -9` it there. `--dump`
writes the final parameters and optimizer state (every leaf, keyed by its tree path) to an
.npz; `--metrics` writes one JSON line per logged step (process-local). Prints
`CHILD DONE <step>` at the end.

Imported by the tests for `ict_batches` and `child_env`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VOCAB_SIZE = 60


def child_env(devices: int, cache_dir: str | None = None) -> dict:
  """Environment of a child process: `devices` fake CPU devices, the test session's other XLA
  flags (tests/conftest.py: the cheap build) and, if given, a persistent compilation cache
  shared by the children (identical programs are compiled once)."""
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  flags.append(f"--xla_force_host_platform_device_count={devices}")
  env["XLA_FLAGS"] = " ".join(flags)
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
  if cache_dir:
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
  return env


def ict_batch(global_batch: int, seed: int, query_len: int = 6, block_len: int = 10) -> dict:
  """One synthetic ICT batch (NumPy): ids in [1, VOCAB_SIZE), all-ones masks."""
  import numpy as np  # noqa: PLC0415 - keep `import train_child` light
  rng = np.random.default_rng(seed)
  return {
      "query_ids": rng.integers(1, VOCAB_SIZE, (global_batch, query_len)).astype(np.int32),
      "query_mask": np.ones((global_batch, query_len), np.int32),
      "block_ids": rng.integers(1, VOCAB_SIZE, (global_batch, block_len)).astype(np.int32),
      "block_type_ids": np.repeat([[0] * 3 + [1] * (block_len - 3)], global_batch,
                                  0).astype(np.int32),
      "block_mask": np.ones((global_batch, block_len), np.int32),
  }


def ict_batches(num: int, global_batch: int, *, process_index: int = 0,
                num_processes: int = 1, seed: int = 100) -> list[dict]:
  """`num` global batches (batch i from seed + i); this process's contiguous slice of each."""
  per_process = global_batch // num_processes
  rows = slice(process_index * per_process, (process_index + 1) * per_process)
  return [{name: value[rows] for name, value in ict_batch(global_batch, seed + i).items()}
          for i in range(num)]


class JsonlWriter:
  """A clu-style metric writer that appends one JSON line per `write_scalars` call."""

  def __init__(self, path: str):
    self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

  def write_scalars(self, step, scalars):
    self._file.write(json.dumps({"step": int(step), **{k: float(v)
                                                       for k, v in scalars.items()}}) + "\n")
    self._file.flush()

  def flush(self):
    self._file.flush()

  def close(self):
    self._file.close()


def main() -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("--run_dir", required=True)
  parser.add_argument("--num_steps", type=int, required=True)
  parser.add_argument("--checkpoint_every", type=int, default=5)
  parser.add_argument("--keep", type=int, default=2)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--num_layers", type=int, default=2, help="tiny_bert's layers (2)")
  parser.add_argument("--mesh", default="1,1", help="data,model")
  parser.add_argument("--pause_before_step", type=int, default=0)
  parser.add_argument("--dump", default="")
  parser.add_argument("--metrics", default="")
  parser.add_argument("--coordinator", default="")
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  args = parser.parse_args()

  sys.path.insert(0, REPO_ROOT)
  import jax  # noqa: PLC0415 - after the environment is final

  if args.coordinator:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes, process_id=args.process_id)
  import logging  # noqa: PLC0415

  import numpy as np  # noqa: PLC0415

  from realm_jax.models import config as config_lib  # noqa: PLC0415
  from realm_jax.models import realm  # noqa: PLC0415
  from realm_jax.training import optim, partitioning, trainer  # noqa: PLC0415

  logging.basicConfig(level=logging.INFO, format="%(relativeCreated)6d %(name)s: %(message)s",
                      force=True)
  for noisy in ("absl", "orbax", "jax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)

  config = config_lib.RealmConfig(
      bert=config_lib.tiny_bert(vocab_size=VOCAB_SIZE, num_layers=args.num_layers), proj_size=16)
  model = realm.IctModel(config)
  total = 20
  optimizer = optim.bert_optimizer(1e-3, total, warmup_steps=2)
  schedule = optim.bert_learning_rate_schedule(1e-3, total, 2)
  data, model_axis = (int(x) for x in args.mesh.split(","))
  mesh = partitioning.make_mesh(data, model_axis)
  batches = trainer.ListBatches(ict_batches(
      total, args.batch, process_index=jax.process_index(), num_processes=jax.process_count()))

  def pause(step, state):
    del state
    if step == args.pause_before_step:
      print(f"CHILD PAUSED before step {step}", flush=True)
      time.sleep(600)  # The test kills us here.
    return {}

  writer = JsonlWriter(args.metrics or os.devnull)
  state = trainer.train(model, optimizer, batches, run_dir=args.run_dir,
                        num_steps=args.num_steps, mesh=mesh, config=config,
                        checkpoint_every=args.checkpoint_every, keep=args.keep, writer=writer,
                        log_every=1, hooks=[pause], seed=0, learning_rate_fn=schedule)
  writer.close()
  if args.dump and jax.process_index() == 0:
    leaves = jax.tree_util.tree_leaves_with_path({"params": state.params,
                                                  "opt_state": state.opt_state,
                                                  "step": state.step, "rng": state.rng})
    np.savez(args.dump, **{jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf))
                           for path, leaf in leaves})
  print(f"CHILD DONE {int(jax.device_get(state.step))}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
