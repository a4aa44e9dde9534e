"""bench/accelerator.py: its device directories, the rehearsal command per batch size, the step
table on hand-worked numbers and the budget that decides which parts start."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from bench import accelerator  # noqa: E402  pylint: disable=wrong-import-position


def test_a_device_names_its_cells_directory():
  assert accelerator.slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
  assert accelerator.slug("???") == "device"


def test_the_rehearsal_runs_base_in_bfloat16_and_tiny_for_the_smoke():
  cmd = accelerator.rehearsal_args(32, "/o/b32.json", "/o/b32", 120, 100_000, smoke=False)
  assert cmd[1].endswith("bench/paper_rehearsal.py")
  flags = dict(zip(cmd[2::2], cmd[3::2]))
  assert flags == {"--work": "/o/b32", "--json": "/o/b32.json", "--batch_size": "32",
                   "--seconds": "120", "--dtype": "bfloat16", "--blocks": "100000"}
  smoke = accelerator.rehearsal_args(2, "/o/j", "/o/w", 60, 100_000, smoke=True)
  assert smoke[smoke.index("--size") + 1] == "tiny"
  assert smoke[smoke.index("--blocks") + 1] == "2000"
  assert smoke[smoke.index("--log_every") + 1] == "2"


def test_the_step_table():
  rows = [{"batch_size": 8, "compute_s": 0.5, "wall_s": 0.8, "mfu": 0.21},
          {"batch_size": 64, "compute_s": None}]
  assert accelerator.step_table(rows).splitlines()[2:] == [
      "| 8 | 0.500 | 0.800 | 10.0 | 21% |", "| 64 | - | - | - | - |"]


def test_the_smoke_gets_a_cpus_budget_and_batches_unless_they_are_given():
  assert accelerator.parse_args([]).budget_s == 520.0
  assert tuple(accelerator.parse_args([]).batch_sizes) == (8, 32, 64)
  smoke = accelerator.parse_args(["--smoke"])
  assert (smoke.budget_s, tuple(smoke.batch_sizes)) == (1500.0, (2, 4, 8))
  given = accelerator.parse_args(["--smoke", "--budget_s", "300", "--batch_sizes", "16"])
  assert (given.budget_s, given.batch_sizes) == (300.0, [16])


def test_a_part_starts_only_with_its_time_left(capsys):
  budget = accelerator.Budget(100.0)
  assert budget.allows("step") and not budget.allows("curve")
  assert "curve: skipped" in capsys.readouterr().out


def test_a_rehearsals_step_row_is_the_figure_its_own_table_prints(capsys):
  """A kept tiny rehearsal (batch 2, on a CPU): the row read from its JSON gives the seconds and
  the MFU that bench/paper_rehearsal.py's own table prints for the step alone."""
  from bench import paper_rehearsal  # pylint: disable=import-outside-toplevel
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                      "paper_rehearsal_tiny_cpu.json")
  paper_rehearsal.main(["--from_json", path])
  alone = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("| alone |"))
  row = accelerator.step_row(path)
  assert row["batch_size"] == 2
  # | alone | steps | compute s/step | wall s/step | examples/s | MFU |
  cells = [c.strip() for c in alone.strip("|").split("|")]
  assert accelerator.step_table([row]).splitlines()[2] == (
      f"| 2 | {cells[2]} | {cells[3]} | {cells[4]} | {cells[5]} |")
