r"""Merged export of a parameter-efficient fine-tuning run's checkpoint (FinetuneJob.peft).

  python -m realm_jax.export_peft <run>/checkpoints/<step> <out_run_dir>

A PEFT checkpoint holds only its trained parameters and names its hash-checked base
(realm_jax.checkpoints). This writes `<out_run_dir>/checkpoints/<step>`, an ordinary checkpoint
of the full model with LoRA merged into the kernels; evaluate it with the run's index:

  python -m realm_jax.evaluate --gin_file=gin_configs/experiments/toy_eval.gin \
    --gin.RUN_DIR="'<out_run_dir>'" --gin.evaluate_main.index_run_dir="'<run>'"

Exit status: 0 written, 1 an error (one line: no such checkpoint, its base gone or changed),
2 bad flags, 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from realm_jax import gin_utils

PROG = "export_peft"


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(prog=f"python -m realm_jax.{PROG}", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("checkpoint", help="the checkpoint step directory to export")
  parser.add_argument("out_run_dir", help="the run directory the merged checkpoint goes to")
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  gin_utils.setup_logging()

  def export() -> int:
    from realm_jax import checkpoints  # pylint: disable=g-import-not-at-top
    step_dir = checkpoints.export_merged(args.checkpoint, args.out_run_dir)
    print(f"{PROG}: wrote {step_dir} (merged from {args.checkpoint})", flush=True)
    return 0

  return gin_utils.run_command(PROG, export, interrupted="the export may be incomplete: run "
                               "it again")


if __name__ == "__main__":
  gin_utils.exit_process(main(), PROG)
