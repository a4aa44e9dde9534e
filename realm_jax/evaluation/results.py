"""What every mode of `python -m realm_jax.evaluate` leaves behind, written one way: the metrics
JSON (the mode, what was evaluated, the metrics), for mode "qa" the predictions JSON lines
beside it, each renamed into place, and one summary line on stdout:

  evaluate: <what was evaluated>: <metrics>; [predictions <path>, ]metrics <path>

Without an output path the files are `<run>/predictions/<stem>.jsonl` and `<stem>.metrics.json`,
the stem naming the task, the split and the checkpoint or index (`output_paths`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Sequence

from realm_jax import fileio
from realm_jax.evaluation import metrics as metrics_lib

__all__ = ["PREDICTIONS_DIR", "PROG", "Result", "file_stem", "output_paths", "write",
           "write_predictions_jsonl"]

PROG = "evaluate"  # the command; it leads every line an evaluation prints
PREDICTIONS_DIR = "predictions"


@dataclasses.dataclass(frozen=True)
class Result:
  """One evaluation, as a mode hands it to `write`.

  Attributes:
    mode: "qa", "retrieval" or "bm25" (the metrics JSON's "mode").
    stem: the files' name without an output path (`file_stem`).
    fields: what was evaluated (run_dir, task, split, checkpoint, index...): the JSON's keys
      besides "mode", "predictions" and "metrics".
    metrics: the metrics (the JSON's "metrics").
    summary: what was evaluated, in words: the summary line before its metrics.
    predictions: one dict per question (`qa.evaluate`'s), written as JSON lines and named by
      the JSON's "predictions"; None: no predictions file.
  """

  mode: str
  stem: str
  fields: Mapping[str, Any]
  metrics: Mapping[str, Any]
  summary: str
  predictions: Optional[Sequence[dict]] = None


def file_stem(mode: str, task: str, split: str, step: Optional[int] = None) -> str:
  """The files' name of an evaluation: `<task>_<split>_step<checkpoint>` (mode "qa"),
  `<task>_<split>_retrieval_index<index>` or `<task>_<split>_bm25`."""
  return {"qa": f"{task}_{split}_step{step}", "retrieval": f"{task}_{split}_retrieval_index{step}",
          "bm25": f"{task}_{split}_bm25"}[mode]


def output_paths(output: Optional[str], run_dir: Optional[str], stem: str) -> tuple[str, str]:
  """(predictions JSONL, metrics JSON): `output` or `<run_dir>/predictions/<stem>.jsonl`, and
  the same path with `.metrics.json` in place of `.jsonl`."""
  predictions = output or os.path.join(run_dir, PREDICTIONS_DIR, f"{stem}.jsonl")
  base = predictions[:-len(".jsonl")] if predictions.endswith(".jsonl") else predictions
  return predictions, base + ".metrics.json"


def write(result: Result, output: Optional[str], run_dir: Optional[str]) -> str:
  """Writes the predictions (if any), then the metrics JSON that names them, prints the
  summary line and returns the metrics JSON's path.

  `output`: the predictions path (the metrics beside it, .metrics.json); None: under
  `<run_dir>/predictions/` (`run_dir` is None only with `output`).
  """
  predictions_path, metrics_path = output_paths(output, run_dir, result.stem)
  record = {"mode": result.mode, **result.fields}
  written = []
  if result.predictions is not None:
    write_predictions_jsonl(predictions_path, result.predictions)
    record["predictions"] = os.path.abspath(predictions_path)
    written.append(f"predictions {predictions_path}")
  record["metrics"] = dict(result.metrics)
  fileio.write_json_atomically(metrics_path, record)
  written.append(f"metrics {metrics_path}")
  print(f"{PROG}: {result.summary}: {metrics_lib.format_metrics(record['metrics'])}; "
        f"{', '.join(written)}", flush=True)
  return metrics_path


def write_predictions_jsonl(path: str, predictions: Sequence[dict]) -> None:
  """Writes predictions as JSON lines, `{"question", "prediction"}` first (the authors' format,
  read by ORQA's `evaluate_predictions.py`), then the evidence fields; renamed into place, so a
  crash leaves no half-written file. ValueError names a prediction lacking either key."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      for i, prediction in enumerate(predictions):
        missing = [k for k in ("question", "prediction") if k not in prediction]
        if missing:
          raise ValueError(f"prediction {i} lacks {missing}; got keys {sorted(prediction)}")
        record = {"question": prediction["question"], "prediction": prediction["prediction"]}
        record.update({k: v for k, v in prediction.items() if k not in record})
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
