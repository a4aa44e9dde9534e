r"""What only an accelerator measures, in one call of the lent device: the script it runs.

  python bench/accelerator.py [--budget_s 520] [--write]     # on a GPU, in one call
  python bench/accelerator.py --smoke                        # the script, on a CPU (1500 s)

Two parts, in this order, each started only while its share of --budget_s is left (a part it
skips is named, with the time that was left):

  1. The bfloat16 REALM train step against the bfloat16 matmul peak measured in the same run,
     at the batch sizes a user would use (--batch_sizes, default 8 32 64): bench/paper_rehearsal.py
     per batch size (BERT-base, --blocks synthetic blocks), each run's figures kept as JSON and
     its MFU read from them (`paper_rehearsal.analyse`: the compiled step alone, before the
     first refresh).
  2. The wiki world's compute curve past what the CPU reaches: bench/compute_curve.py --world
     wiki --multiples 16 64, seed by seed while time is left (every finished cell is kept, in
     bench/results/compute_curve/<device>/, apart from the CPU's: cells pair only on one
     machine).

--write replaces the script's sections of bench/docs/benchmarks.md, each named after the device.
--smoke runs both parts at a tiny size wherever it is (paper_rehearsal --size tiny on 2,000
blocks at batches 2, 4 and 8; compute_curve --smoke), writes nothing and keeps its cells under
--out, so that the device's minutes go to measuring.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import report  # noqa: E402  pylint: disable=wrong-import-position

STEP_SECTION = "bfloat16 REALM train step against the matmul peak"
CURVE_SECTION = "REALM against the ORQA-style baseline as pretraining grows (wiki world)"
DEFAULT_BATCH_SIZES = (8, 32, 64)
# The smoke's: a bfloat16 step of batch 64 took over a minute on a busy 2-core CPU.
SMOKE_BATCH_SIZES = (2, 4, 8)
DEFAULT_MULTIPLES = (16, 64)
DEFAULT_SEEDS = (0, 1, 2)
# Seconds of the budget each part needs to start: a rehearsal run, a compute-curve cell.
PART_SECONDS = {"step": 90.0, "curve": 120.0}
DEVICE_BUDGET_S = 520.0
# A CPU compiles and steps slower than a device: on a busy 2-core CPU, 520 s gave the smoke's
# rehearsals 40 s each, too few for a first trainer record.
SMOKE_BUDGET_S = 1500.0


def slug(device: str) -> str:
  """A directory name for a device kind ("NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3")."""
  return re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_") or "device"


def device_kind() -> str:
  import jax  # pylint: disable=import-outside-toplevel
  return jax.devices()[0].device_kind


def rehearsal_args(batch_size: int, json_path: str, work: str, seconds: float, blocks: int,
                   smoke: bool) -> list[str]:
  """bench/paper_rehearsal.py's command line for one batch size."""
  # The smoke: checkpoints every 30 steps and a record every 2, so that a slow CPU still gives
  # the analysis its 3 records.
  size = (["--size", "tiny", "--blocks", "2000", "--matmul_n", "256", "--checkpoint_every", "30",
           "--log_every", "2"] if smoke else ["--blocks", str(blocks)])
  return [sys.executable, os.path.join(REPO, "bench", "paper_rehearsal.py"), "--work", work,
          "--json", json_path, "--batch_size", str(batch_size), "--seconds", str(int(seconds)),
          "--dtype", "bfloat16", *size]


def step_row(json_path: str) -> dict:
  """Batch size, seconds per step and MFU of the step alone, from a rehearsal's JSON."""
  from bench import paper_rehearsal  # pylint: disable=import-outside-toplevel
  with open(json_path, encoding="utf-8") as f:
    r = json.load(f)
  args = paper_rehearsal.args_from_json(r)
  try:
    a = paper_rehearsal.analyse(r, args)
  except SystemExit as e:  # too few trainer records: the run stopped before it stepped enough
    print(f"accelerator: {json_path}: {e}", flush=True)
    return {"batch_size": args.batch_size, "device": r["device_kind"],
            "peak": r["peak"]["flops_per_s"], "compute_s": None}
  alone = a["alone"]
  compute_s = alone.get("compute_s")
  peak = r["peak"]["flops_per_s"]
  return {"batch_size": args.batch_size, "device": r["device_kind"], "peak": peak,
          "step_flops": a["step_flops"], "compute_s": compute_s, "wall_s": alone.get("wall_s"),
          "mfu": None if compute_s is None else a["step_flops"] / compute_s / peak}


def step_table(rows: Sequence[dict]) -> str:
  lines = ["| batch | compute s/step | wall s/step | examples/s (wall) | MFU (compute) |",
           "|---|---|---|---|---|"]
  for row in rows:
    if row["compute_s"] is None:
      lines.append(f"| {row['batch_size']} | - | - | - | - |")
      continue
    lines.append(f"| {row['batch_size']} | {row['compute_s']:.3f} | {row['wall_s']:.3f} | "
                 f"{row['batch_size'] / row['wall_s']:.1f} | {100 * row['mfu']:.0f}% |")
  return "\n".join(lines)


class Budget:
  """Seconds left of --budget_s, and whether a part may start."""

  def __init__(self, seconds: float):
    self.end = time.monotonic() + seconds

  def left(self) -> float:
    return self.end - time.monotonic()

  def allows(self, part: str) -> bool:
    if self.left() >= PART_SECONDS[part]:
      return True
    print(f"accelerator: {part}: skipped, {self.left():.0f}s left (needs "
          f"{PART_SECONDS[part]:.0f}s)", flush=True)
    return False


def run_child(cmd: list[str], timeout: float) -> int:
  """A part's process, stopped (SIGTERM, then its kept results stand) when its time is up."""
  print("accelerator: " + " ".join(cmd[1:]), flush=True)
  child = subprocess.Popen(cmd, cwd=REPO)
  try:
    return child.wait(timeout=max(1.0, timeout))
  except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
    child.terminate()
    if isinstance(e, KeyboardInterrupt):  # this script stopped (SIGINT, SIGTERM): so is its part
      child.wait(timeout=60)
      raise
    try:
      return child.wait(timeout=30)
    except subprocess.TimeoutExpired:
      child.kill()
      return child.wait()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--budget_s", type=float, default=None,
                      help=f"seconds for both parts (default {DEVICE_BUDGET_S:.0f}: a 9-minute "
                           f"call with room to write; {SMOKE_BUDGET_S:.0f} with --smoke)")
  parser.add_argument("--out", default="/tmp/realm_accelerator",
                      help="run directories and the rehearsals' JSON (default %(default)s)")
  parser.add_argument("--batch_sizes", nargs="+", type=int, default=None,
                      help=f"default {' '.join(map(str, DEFAULT_BATCH_SIZES))}; with --smoke "
                           f"{' '.join(map(str, SMOKE_BATCH_SIZES))}")
  parser.add_argument("--blocks", type=int, default=100_000,
                      help="synthetic blocks of each rehearsal (default %(default)s)")
  parser.add_argument("--multiples", nargs="+", type=int, default=DEFAULT_MULTIPLES,
                      help="compute-curve lengths, multiples of the wiki recipe's 200 steps")
  parser.add_argument("--seeds", nargs="+", type=int, default=DEFAULT_SEEDS)
  parser.add_argument("--parts", nargs="+", choices=("step", "curve"), default=("step", "curve"),
                      help="which parts to run (default: both, in this order)")
  parser.add_argument("--smoke", action="store_true",
                      help="both parts at a tiny size, on any machine; nothing written")
  parser.add_argument("--write", action="store_true",
                      help="write the script's sections of bench/docs/benchmarks.md")
  args = parser.parse_args(argv)
  if args.smoke and args.write:
    parser.error("--smoke writes nothing")
  if args.budget_s is None:
    args.budget_s = SMOKE_BUDGET_S if args.smoke else DEVICE_BUDGET_S
  if args.batch_sizes is None:
    args.batch_sizes = SMOKE_BATCH_SIZES if args.smoke else DEFAULT_BATCH_SIZES
  return args


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = parse_args(argv)
  signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop the running part too
  budget = Budget(args.budget_s)
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  device = device_kind()
  print(f"accelerator: {device}, {args.budget_s:.0f}s", flush=True)

  # 1. The bfloat16 step against the peak, a rehearsal per batch size.
  share = args.budget_s * (0.35 if "curve" in args.parts else 1.0) / len(args.batch_sizes)
  step_rows = []
  for batch_size in args.batch_sizes if "step" in args.parts else ():
    if not budget.allows("step"):
      break
    json_path = os.path.join(out, f"rehearsal_b{batch_size}.json")
    work = os.path.join(out, f"rehearsal_b{batch_size}")
    seconds = min(share, budget.left() - (PART_SECONDS["curve"] if "curve" in args.parts else 0))
    run_child(rehearsal_args(batch_size, json_path, work, seconds - 20, args.blocks,
                             args.smoke), seconds)
    if os.path.exists(json_path):
      step_rows.append(step_row(json_path))
  steps = step_table(step_rows)
  print("\n" + steps + "\n", flush=True)

  # 2. The wiki world's compute curve, as many cells as fit.
  cells = os.path.join(out, "cells") if args.smoke else os.path.join(
      REPO, "bench", "results", "compute_curve", slug(device))
  curve_cmd = [sys.executable, os.path.join(REPO, "bench", "compute_curve.py"), "--world",
               "wiki", "--out", os.path.join(out, "compute_curve"), "--cells", cells]
  for multiple in args.multiples if "curve" in args.parts else ():
    for seed in args.seeds:
      if not budget.allows("curve"):
        break
      run_child(curve_cmd + ["--multiples", str(multiple), "--seeds", str(seed),
                             *(["--smoke"] if args.smoke else [])], budget.left())
  kept = sorted(glob.glob(os.path.join(cells, "wiki_*", "seed*.json")))
  print(f"accelerator: {len(kept)} compute-curve cell(s) kept in {cells}", flush=True)
  if kept:
    subprocess.run(curve_cmd + ["--report_only", "--multiples", *map(str, args.multiples),
                                "--seeds", *map(str, args.seeds),
                                *(["--smoke"] if args.smoke else [])], cwd=REPO, check=False)

  if args.write and step_rows:
    report.write_section(
        STEP_SECTION, "`python bench/accelerator.py --write`: bench/paper_rehearsal.py per batch "
        f"size (BERT-base, bfloat16 compute, {args.blocks:,} synthetic blocks); the matmul peak "
        f"measured in each run ({step_rows[0]['peak'] / 1e12:.1f} TFLOP/s in the first). MFU: "
        "the compiled step alone, before the builder's first refresh.\n\n" + steps,
        accelerator=device)
  if args.write and kept:
    subprocess.run(curve_cmd + ["--report_only", "--write", "--multiples",
                                *map(str, args.multiples), "--seeds", *map(str, args.seeds)],
                   cwd=REPO, check=False)
  return 0


if __name__ == "__main__":
  sys.exit(main())
