"""docs/architecture.md's module map names every module in its own directory and every gin file,
and every dotted `realm_jax` path written in the code, the docs, the gins and the notebook
resolves to a module or an attribute."""

import importlib
import pathlib
import re

import gin
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# Top-level directories of the map whose Python files it must name.
MAPPED_PACKAGES = ("realm_jax", "tasks", "launch")
DOTTED = re.compile(r"\brealm_jax(?:_tasks|_launch)?(?:\.[A-Za-z_]\w*)+(?![\w/])")
# On-disk format names (manifests' "format"), which read like dotted paths but name formats.
FORMAT_MODULES = ("realm_jax.data.block_store", "realm_jax.index.chunks", "realm_jax.index.store",
                  "realm_jax.checkpoints")


def module_map() -> str:
  """The code block of docs/architecture.md that maps the repository."""
  return (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").split("```")[1]


def named_by_directory(tree: str) -> dict[str, set[str]]:
  """{directory (as "realm_jax/data"): every `*.py` and `*.gin` name its part of the map
  mentions}. A line at indentation 0 opens a top-level directory (`realm_jax/`, `tasks/`,
  `gin_configs/runs/`...), one at indentation 2 naming `<sub>/` opens a subpackage, and one at
  indentation 2 naming a file closes it; deeper lines continue the entry above them."""
  named: dict[str, set[str]] = {}
  top = sub = None
  for line in tree.splitlines():
    if not line.strip():
      continue
    indent = len(line) - len(line.lstrip())
    first = line.split()[0]
    if indent == 0:
      top, sub = first.rstrip("/"), None
    elif indent == 2 and top == "realm_jax":
      sub = first.rstrip("/") if first.endswith("/") else None
    directory = top if sub is None else f"{top}/{sub}"
    names = re.findall(r"[\w]+\.(?:py|gin)\b", line) + re.findall(r"\b\w+\b", line)
    named.setdefault(directory, set()).update(names)
  return named


def test_the_map_names_every_module_in_its_own_directory():
  named = named_by_directory(module_map())
  missing = []
  for package in MAPPED_PACKAGES:
    for path in sorted((REPO / package).rglob("*.py")):
      if path.name == "__init__.py":
        continue
      directory = path.parent.relative_to(REPO).as_posix()
      if path.name not in named.get(directory, set()):
        missing.append(path.relative_to(REPO).as_posix())
  assert not missing, f"docs/architecture.md's map does not name: {missing}"


def test_the_map_names_every_gin_file():
  named = named_by_directory(module_map())
  missing = []
  for path in sorted((REPO / "gin_configs").rglob("*.gin")):
    directory = path.parent.relative_to(REPO).as_posix()
    if path.stem not in named.get(directory, set()):
      missing.append(path.relative_to(REPO).as_posix())
  assert not missing, f"docs/architecture.md's map does not name: {missing}"


def test_the_map_reader_on_a_hand_made_map():
  tree = ("realm_jax/\n"
          "  fileio.py        helpers\n"
          "  data/            host text\n"
          "    vocab.py       WordPiece\n"
          "                   continued: sentences.py is named here too\n"
          "  checkpoints.py   run directories\n"
          "gin_configs/runs/    mlm, ict\n")
  named = named_by_directory(tree)
  assert {"vocab.py", "sentences.py"} <= named["realm_jax/data"]
  assert "checkpoints.py" in named["realm_jax"] and "checkpoints.py" not in named["realm_jax/data"]
  assert {"mlm", "ict"} <= named["gin_configs/runs"]


def _resolves(dotted: str) -> bool:
  """Whether `dotted` is a module, or an attribute path under the longest importable module."""
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    try:
      # A module imported for the first time registers its gin configurables, which a config
      # locked by an earlier test in this process would refuse.
      with gin.unlock_config():
        obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    for attr in parts[i:]:
      if not hasattr(obj, attr):
        return False
      obj = getattr(obj, attr)
    return True
  return False


def _written_paths() -> dict[str, list[str]]:
  """{dotted path: files that write it} over the code, docs, gins and notebooks."""
  formats = {importlib.import_module(m).FORMAT_NAME for m in FORMAT_MODULES}
  found: dict[str, list[str]] = {}
  for pattern in ("realm_jax/**/*.py", "tasks/**/*.py", "launch/**/*.py", "bench/*.py",
                  "tests/**/*.py", "docs/**/*.md", "bench/docs/*.md", "bench/README.md", "README.md",
                  "gin_configs/**/*.gin",
                  "notebooks/*.ipynb"):
    for path in sorted(REPO.glob(pattern)):
      if path == pathlib.Path(__file__).resolve():  # its own examples name nothing on purpose
        continue
      text = path.read_text(encoding="utf-8")
      for match in DOTTED.finditer(text):
        if match.group() not in formats:
          found.setdefault(match.group(), []).append(path.relative_to(REPO).as_posix())
  return found


def test_the_path_pattern_on_hand_made_text():
  text = ("see `realm_jax.batches.qa_batches.build_open_qa_batch`, realm_jax_tasks.toy and "
          "realm_jax.toy_world/v2/seed (a seed string), realm_jax_launch.local.")
  assert [m.group() for m in DOTTED.finditer(text)] == [
      "realm_jax.batches.qa_batches.build_open_qa_batch", "realm_jax_tasks.toy",
      "realm_jax_launch.local"]
  assert _resolves("realm_jax.batches.qa_batches.build_open_qa_batch")
  assert not _resolves("realm_jax.models.qa_batches.build_open_qa_batch")
  assert not _resolves("realm_jax.data.block_store.no_such_function")


@pytest.mark.filterwarnings("ignore")
def test_every_dotted_path_written_resolves():
  unresolved = {path: files for path, files in _written_paths().items()
                if not _resolves(path)}
  assert not unresolved, f"dotted paths that name nothing: {unresolved}"
