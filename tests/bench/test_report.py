"""bench/report.py: a section is replaced in place, appended when new, kept with its stamp when
its body is unchanged, and an accelerator's figures get their own section beside the CPU's
(hand-written documents)."""

import datetime
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from bench import report  # noqa: E402


def _stamp(where: str) -> str:
  return f"_{datetime.date.today().isoformat()}, {where}._"


def test_a_section_is_replaced_in_place_and_a_new_one_appended(tmp_path):
  path = tmp_path / "benchmarks.md"
  path.write_text("# Benchmarks\n\n## Search\n\nold figures\n\n## Corpus build\n\nkept\n")
  report.write_section("Search", "new figures", str(path))
  report.write_section("Toy training steps", "steps", str(path))
  machine = report.machine()
  assert path.read_text() == (
      f"# Benchmarks\n\n## Search\n\n{_stamp(machine)}\n\nnew figures\n\n## Corpus build\n\n"
      f"kept\n\n## Toy training steps\n\n{_stamp(machine)}\n\nsteps\n")


def test_an_accelerator_section_stands_beside_the_cpu_one(tmp_path):
  path = tmp_path / "benchmarks.md"
  path.write_text("# Benchmarks\n\n## Search\n\ncpu figures\n")
  report.write_section("Search", "gpu figures", str(path), accelerator="NVIDIA H100")
  report.write_section("Search", "gpu figures, again", str(path), accelerator="NVIDIA H100")
  where = f"NVIDIA H100; host {report.machine()}"
  assert path.read_text() == (
      "# Benchmarks\n\n## Search\n\ncpu figures\n\n## Search (NVIDIA H100)\n\n"
      f"{_stamp(where)}\n\ngpu figures, again\n")


def test_a_section_written_from_kept_figures_names_the_host_that_measured(tmp_path):
  path = tmp_path / "benchmarks.md"
  report.write_section("Rehearsal", "figures", str(path), accelerator="NVIDIA H100",
                       host="16 cores, 125 GiB")
  assert "## Rehearsal (NVIDIA H100)\n\n" + _stamp("NVIDIA H100; host 16 cores, 125 GiB") \
      in path.read_text()


def test_a_section_written_again_with_the_same_body_keeps_its_stamp(tmp_path):
  path = tmp_path / "benchmarks.md"
  document = ("# Benchmarks\n\n## Search\n\n_2026-01-02, another machine._\n\nfigures\n\n"
              "## Corpus build\n\n_2026-01-03, a third machine._\n\nkept\n")
  path.write_text(document)
  report.write_section("Search", "figures\n", str(path))
  assert path.read_text() == document
  report.write_section("Search", "new figures", str(path))
  assert path.read_text() == document.replace(
      "_2026-01-02, another machine._\n\nfigures", f"{_stamp(report.machine())}\n\nnew figures")
