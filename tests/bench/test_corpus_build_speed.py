"""bench/corpus_build_speed.py: the first build taken from git runs as an old build, and the
table's ratios on hand-made figures (the builds' equality is tests/data/test_corpus.py's)."""

import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

from bench import corpus_build_speed as speed  # noqa: E402


def _figures(seconds):
  return {"seconds": seconds, "documents": 100, "blocks": 150, "store_id": "s",
          "parent_cpu_s": seconds, "workers_cpu_s": seconds}


def test_the_table_gives_each_build_against_both_older_builds():
  runs = speed.configs([2], rust=False, first_tree="/old")
  assert [label for label, _, _ in runs] == [speed.FIRST_LABEL, speed.BEFORE,
                                             "cached, 1 process", "cached, 2 workers"]
  assert runs[0][1] == "tree:/old"
  seconds = {speed.FIRST_LABEL: 40.0, speed.BEFORE: 16.0, "cached, 1 process": 5.0,
             "cached, 2 workers": 4.0}
  result = {"name": "toy", "megabytes": 8.0, "runs": runs,
            "best": {label: _figures(s) for label, s in seconds.items()}}
  rows = {line.split(" | ")[0][2:]: line for line in
          speed._markdown([result], None, 288, 1).splitlines() if line.startswith("| ")}
  # 2 workers: 8 MB in 4 s = 2.00 MB/s; 16 / 4 = 4.0x the Python tokenizer; 40 / 4 = 10.0x.
  assert rows["cached, 2 workers"] == "| cached, 2 workers | 4.00 | 25 | 2.00 | 4.0x | 10.0x |"
  assert rows[speed.FIRST_LABEL].endswith("| 0.20 | 0.4x | 1.0x |")


def test_without_the_first_build_the_table_has_one_ratio_column():
  runs = speed.configs([2], rust=False)
  result = {"name": "toy", "megabytes": 8.0, "runs": runs,
            "best": {label: _figures(8.0) for label, _, _ in runs}}
  header = [line for line in speed._markdown([result], None, 288, 1).splitlines()
            if line.startswith("| configuration")]
  assert header == ["| configuration | seconds | documents/s | MB/s | vs python tokenizer |"]


def test_a_commit_missing_from_the_clone_leaves_the_row_out(tmp_path, capsys):
  assert speed.extract_build("0" * 40, str(tmp_path)) is None
  assert "is not in this clone" in capsys.readouterr().err


def test_the_first_build_runs_from_its_own_tree(tmp_path):
  """The extracted package is the one the child imports (a marker in the tree's corpus
  module shows it), and the old build's keyword arguments are the ones passed."""
  tree = tmp_path / "old"
  (tree / "realm_jax" / "data").mkdir(parents=True)
  (tree / "realm_jax" / "__init__.py").write_text("")
  (tree / "realm_jax" / "data" / "__init__.py").write_text("")
  (tree / "realm_jax" / "data" / "vocab.py").write_text("")
  (tree / "realm_jax" / "data" / "corpus.py").write_text(
      "import types\n"
      "class JsonlSource:\n"
      "  def __init__(self, path):\n    self.path = path\n"
      "def build_block_store(source, dest, *, max_block_len):\n"
      "  return types.SimpleNamespace(counts={'documents_read': max_block_len},\n"
      "                               num_blocks=0, store_id=source.path + ' ' + dest)\n")
  result = subprocess.run(
      [sys.executable, os.path.join(REPO_ROOT, "bench", "corpus_build_speed.py"),
       "--max_block_len", "77", "--child", "in.jsonl", "out", f"tree:{tree}", "1"],
      check=True, capture_output=True, text=True, cwd=str(tmp_path))
  assert '"store_id": "in.jsonl out"' in result.stdout
  assert '"documents": 77' in result.stdout
