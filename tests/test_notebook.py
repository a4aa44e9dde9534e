"""The Colab demo notebook (notebooks/realm_toy_demo.ipynb): committed without outputs, and it
runs end to end on a CPU at toy scale (every stage through the real entry points, then a
question answered with its evidence table).

Needs the test extra's notebook tooling (nbformat, nbclient, ipykernel for the python3 kernel).
"""

import os
import pathlib
import re
import shutil
import time

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra: pip install -e '.[test]'")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO_ROOT / "notebooks" / "realm_toy_demo.ipynb"
CELL_TIMEOUT_S = 900  # per cell; the whole notebook takes a few minutes on 2 busy cores
EVIDENCE_COLUMNS = ("rank", "title", "retrieval score", "has answer", "snippet")


def _read():
  return nbformat.read(str(NOTEBOOK), as_version=4)


def _text(output) -> str:
  """The text of one cell output (stream, or the text/plain of a result/display)."""
  if output.get("output_type") == "stream":
    return output.get("text", "")
  if output.get("output_type") == "error":
    return "\n".join(output.get("traceback", []))
  return output.get("data", {}).get("text/plain", "")


def test_notebook_is_committed_without_outputs():
  notebook = _read()
  nbformat.validate(notebook)
  code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
  assert code_cells
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type != "code":
      continue
    assert cell.outputs == [], f"cell {index} has outputs: clear them before committing"
    assert cell.execution_count is None, (
        f"cell {index} has execution_count {cell.execution_count}: clear outputs before "
        f"committing")
  assert notebook.metadata.get("kernelspec", {}).get("name") == "python3"


def test_notebook_runs_on_cpu(private_cache, tmp_path):
  nbclient = pytest.importorskip("nbclient", reason="the test extra: pip install -e '.[test]'")
  # A temporary copy, so nothing the run writes lands next to the committed notebook.
  copy = tmp_path / NOTEBOOK.name
  shutil.copyfile(NOTEBOOK, copy)
  notebook = nbformat.read(str(copy), as_version=4)

  # The kernel is a subprocess: give it the private toy-world cache explicitly, and the single
  # CPU device and default XLA build of a user's machine (not the 8 simulated devices and the
  # cheap build of tests/conftest.py: the notebook runs more steps than it compiles), also on a
  # machine with an accelerator.
  env = dict(os.environ)
  env["REALM_JAX_CACHE"] = str(private_cache)
  env["TMPDIR"] = str(tmp_path)  # the notebook's temporary run directory: under tmp_path
  env["XLA_FLAGS"] = env["REALM_JAX_TEST_USER_XLA_FLAGS"]
  env["JAX_PLATFORMS"] = "cpu"
  client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                   allow_errors=False,
                                   resources={"metadata": {"path": str(tmp_path)}})
  start = time.monotonic()
  client.execute(env=env)  # raises CellExecutionError (with the traceback) if a cell fails
  print(f"\nnotebook executed in {time.monotonic() - start:.0f}s")

  texts = []
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type != "code":
      continue
    assert cell.execution_count is not None, f"cell {index} did not run"
    for output in cell.get("outputs", []):
      assert output.get("output_type") != "error", f"cell {index} errored:\n{_text(output)}"
      texts.append(_text(output))
  text = "\n".join(texts)

  assert "JAX backend: cpu" in text and "using the CPU scale" in text
  # The toy world was generated in the private cache, not the user's.
  assert str(private_cache) in text
  assert f"run directory: {tmp_path}" in text
  # Every stage ran through its entry point.
  for entry_point in ("train", "build_index"):
    assert f"==> realm_jax.{entry_point} finished in" in text
  assert text.count("==> realm_jax.train finished in") == 3
  assert text.count("==> realm_jax.build_index finished in") == 2
  # The evidence table: a header with every column, then one row per block the reader read.
  header = next((line for line in text.splitlines()
                 if all(column in line for column in EVIDENCE_COLUMNS)), None)
  assert header is not None, f"no evidence table header with {EVIDENCE_COLUMNS}"
  rows = re.findall(r"^\s+\d+[* ]  .+ -?\d+\.\d{3}  (?:yes|no|-)", text, flags=re.MULTILINE)
  assert len(rows) >= 2 * 5, f"expected 5 evidence rows per question, found {len(rows)}"
  assert sum("*" in row.split()[0] for row in rows) == 2  # the answer block, once per question
  # An answer was predicted for the test question and for the free-text question.
  answers = re.findall(r"^predicted answer:\s+(['\"])(.*?)\1", text, flags=re.MULTILINE)
  assert len(answers) == 2, f"predicted answers printed: {answers}"
  assert "reference answers:" in text
  assert "What did Obern Jaernrae do for a living?" in text
