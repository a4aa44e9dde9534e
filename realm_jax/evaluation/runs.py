"""What an evaluation of a run directory reads and writes there: the checkpoint it evaluates
(the best one recorded in `best.json`, else the newest) and where its predictions and metrics go
(`<run>/predictions/`)."""

from __future__ import annotations

import os
from typing import Optional

__all__ = ["PREDICTIONS_DIR", "choose_checkpoint", "output_paths"]

PREDICTIONS_DIR = "predictions"


def choose_checkpoint(run_dir: str, checkpoint_step: Optional[int]) -> tuple[Optional[int], str]:
  """The checkpoint step to evaluate and why it was chosen.

  `checkpoint_step` if given; else the best one recorded by the trainer in `<run>/best.json`
  (its metric, e.g. eval exact match) when that checkpoint still exists; else the newest.

  Returns:
    (step or None when the run has no finished checkpoint, a description such as
    "best by eval/exact_match=0.41 in best.json", "latest" or "as asked").
  """
  from realm_jax import checkpoints as ckpt_lib  # pylint: disable=g-import-not-at-top
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


def output_paths(output: Optional[str], run_dir: str, stem: str) -> tuple[str, str]:
  """(predictions JSONL, metrics JSON): `output` or `<run_dir>/predictions/<stem>.jsonl`, and
  the same path with `.metrics.json` in place of `.jsonl`."""
  predictions = output or os.path.join(run_dir, PREDICTIONS_DIR, f"{stem}.jsonl")
  base = predictions[:-len(".jsonl")] if predictions.endswith(".jsonl") else predictions
  return predictions, base + ".metrics.json"
