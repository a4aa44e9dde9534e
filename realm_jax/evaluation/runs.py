"""Which checkpoint of a run directory an evaluation reads: the best one recorded in
`best.json`, else the newest, and whether it is of the evaluated model's size."""

from __future__ import annotations

from typing import Any, Optional

from realm_jax import checkpoints as ckpt_lib
from realm_jax import gin_utils
from realm_jax.gin_utils import ConfigError

__all__ = ["checkpoint_metadata", "choose_checkpoint"]


def choose_checkpoint(run_dir: str, checkpoint_step: Optional[int]) -> tuple[Optional[int], str]:
  """The checkpoint step to evaluate and why it was chosen.

  `checkpoint_step` if given; else the best one recorded by the trainer in `<run>/best.json`
  (its metric, e.g. eval exact match) when that checkpoint still exists; else the newest.

  Returns:
    (step or None when the run has no finished checkpoint, a description such as
    "best by eval/exact_match=0.41 in best.json", "latest" or "as asked").
  """
  steps = ckpt_lib.list_checkpoint_steps(run_dir)
  if checkpoint_step is not None:
    return int(checkpoint_step), "as asked"
  best = ckpt_lib.read_best(run_dir)
  if best is not None and int(best.get("step", -1)) in steps:
    return int(best["step"]), (f"best by {best.get('metric')}={float(best.get('value')):.4g} "
                               f"in {ckpt_lib.BEST_FILE}")
  if not steps:
    return None, "none"
  why = "latest"
  if best is not None:
    why += f" ({ckpt_lib.BEST_FILE} names step {best.get('step')}, which no longer exists)"
  return steps[-1], why


def checkpoint_metadata(step_dir: str, config: Any, where: str) -> dict:
  """The metadata of a checkpoint step directory; ConfigError (`where` and both sizes) when it
  is of another model size than `config`."""
  metadata = ckpt_lib.read_metadata(step_dir)
  try:
    ckpt_lib.checkpoint_config(step_dir, metadata, config)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(f"{where}: {gin_utils.one_line(e)}") from e
  return metadata
