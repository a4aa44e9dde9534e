r"""The index-builder job: follows a training run and publishes fresh indexes (REALM_SPEC 20-22).

  python -m realm_jax.build_index --gin_file=gin_configs/runs/build_index.gin \
      --gin.RUN_DIR="'/runs/realm'" --gin.BLOCK_STORE="'/data/z/blocks'" [--once]

Gin binds only `build_index_main`; `--once` builds one index and exits. One line per published
index goes to stdout, progress to stderr. Exit status: 0 done (training finished and its last
checkpoint indexed, or `--once`), 1 a runtime error, 2 a configuration error or another builder
holding the run directory, 130 or 143 interrupted (nothing partial is ever published).
Multi-host: one builder per host (`realm_jax.index.builder` splits the blocks).
"""

from __future__ import annotations

import contextlib
from typing import Any, Mapping, Optional

import gin

from realm_jax import fileio
from realm_jax import gin_utils
from realm_jax.data.block_store import BlockStore, BlockStoreError
from realm_jax.gin_utils import ConfigError

PROG = "build_index"


# Runtime errors that explain themselves: CheckpointError, BlockStoreError, IndexLoadError...
@gin_utils.command(
    PROG, doc=__doc__, example_gin="gin_configs/runs/build_index.gin",
    interrupted="nothing partial was published",
    booleans={"once": "Build one index and exit (overrides the gin binding)."},
    expected=(ValueError, OSError, BlockStoreError))
def build_index_main(run_dir: str = gin.REQUIRED, block_store: str = gin.REQUIRED,
                     checkpoint_dir: Optional[str] = None, once: bool = False,
                     poll_seconds: float = 10.0, keep: int = 3, dtype: str = "float32",
                     batch_size: int = 128, length_bucket: int = 32, scann: bool = False,
                     scann_options: Optional[Mapping[str, Any]] = None,
                     verify_block_store: Any = "fast") -> int:
  """Runs the index builder (the only gin-configurable function of this job).

  Args:
    run_dir: the training run directory (reads `checkpoints/`, writes `index/`).
    block_store: the BlockStore directory to embed.
    checkpoint_dir: a checkpoint step directory (e.g. the ICT run's `checkpoints/<step>`) for
      the first index, published as step 0 when the run has none.
    once: build one index (newest checkpoint, or `checkpoint_dir`) and exit.
    poll_seconds: seconds between looks at `checkpoints/` when idle.
    keep: published indexes to keep (at least 2 while a trainer runs).
    dtype: "float32" or "bfloat16" embeddings.
    batch_size: blocks per jitted call over all local devices.
    length_bucket: embed each batch at the smallest multiple of this many wordpieces that holds
      its longest block (only padding is cut); 0: always the full block length.
    scann: also build ScaNN artifacts into each index.
    scann_options: `build_scann_artifacts` knobs (num_leaves, num_leaves_to_search,
      training_sample_size, dims_per_block, anisotropic_quantization_threshold, reorder).
    verify_block_store: BlockStore.open's `verify`: "fast" (sizes), True (sha256 of every
      file, reads the whole store) or False.

  Returns:
    The process exit status (0).
  """
  # Heavy imports here, not at module top: `--help` and config errors stay instant.
  import jax  # pylint: disable=g-import-not-at-top
  from realm_jax.index import builder  # pylint: disable=g-import-not-at-top
  from realm_jax.index import store as store_lib  # pylint: disable=g-import-not-at-top

  # Settings the builder would refuse only after waiting for a checkpoint: refused now.
  try:
    builder.check_length_bucket(length_bucket)
  except ValueError as e:
    raise ConfigError(f"build_index_main.{e}") from e
  if dtype not in builder.INDEX_DTYPES:
    raise ConfigError(f"build_index_main.dtype={dtype!r}: expected "
                      f"{' or '.join(map(repr, builder.INDEX_DTYPES))}")
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ConfigError(f"build_index_main.batch_size={batch_size!r}: expected an int >= 1")
  store = BlockStore.open(block_store, verify=verify_block_store)

  def announce(path: str) -> None:
    manifest = store_lib.load_index(path, verify=False).manifest
    print(f"{PROG}: published index step {manifest['step']} at {path} "
          f"({manifest['num_blocks']} x {manifest['dim']} {manifest['dtype']}, "
          f"{manifest['build_seconds']:.1f}s)", flush=True)

  # One builder per run directory (it publishes and prunes `index/`); other hosts share the lock.
  with (fileio.run_dir_lock(run_dir, "builder") if jax.process_index() == 0
        else contextlib.nullcontext()):
    published = builder.follow(
        run_dir, store=store, poll_seconds=poll_seconds, once=once,
        checkpoint_dir=checkpoint_dir, keep=keep, dtype=dtype, batch_size=batch_size,
        length_bucket=length_bucket, scann=scann, scann_options=scann_options,
        on_publish=announce)
  print(f"{PROG}: done ({len(published)} index(es) published in this run; newest: "
        f"{store_lib.latest_index_step(run_dir)})", flush=True)
  return 0


main = build_index_main.main  # python -m realm_jax.build_index; returns the exit status


if __name__ == "__main__":
  gin_utils.exit_process(main(), PROG)
