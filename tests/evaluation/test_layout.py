"""Where evaluation lives: `python -m realm_jax.evaluate` only reads, checks and dispatches (every
loop over questions, queries and batches is in `realm_jax.evaluation`), every mode writes its
files through `results.write`, and the seqio tasks' plugin does not import the evaluation."""

import ast
import pathlib

import realm_jax

PACKAGE_DIR = pathlib.Path(realm_jax.__file__).parent
COMMAND = PACKAGE_DIR / "evaluate.py"
TASKS_DIR = PACKAGE_DIR.parent / "tasks"


def _tree(path: pathlib.Path) -> ast.AST:
  return ast.parse(path.read_text(encoding="utf-8"))


def _attribute_calls(tree: ast.AST, module: str) -> set[str]:
  """The names called as `<module>.<name>(...)` in `tree`."""
  return {node.func.attr for node in ast.walk(tree)
          if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name) and node.func.value.id == module}


def _imported_modules(tree: ast.AST) -> set[str]:
  """Every module an import names, the ones inside functions too."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_the_command_holds_no_loop():
  loops = [f"line {node.lineno}" for node in ast.walk(_tree(COMMAND))
           if isinstance(node, (ast.For, ast.AsyncFor, ast.While))]
  assert not loops, f"realm_jax/evaluate.py loops at {loops}: loops belong in evaluation/"


def test_the_command_runs_one_function_per_mode_and_writes_through_results():
  tree = _tree(COMMAND)
  runs = {name for name in _attribute_calls(tree, "modes") if name.startswith("run_")}
  assert runs == {"run_qa", "run_retrieval", "run_bm25", "run_questions"}
  assert "write" in _attribute_calls(tree, "results")


def test_only_the_result_writer_writes_an_evaluations_files():
  """The metrics JSON and the predictions JSONL of every mode come from `results`."""
  for path in [COMMAND, *sorted((PACKAGE_DIR / "evaluation").glob("*.py"))]:
    if path.name in ("results.py", "retro.py"):  # retro.py: its own command's --out file
      continue
    calls = [node.func for node in ast.walk(_tree(path)) if isinstance(node, ast.Call)]
    writes = [f"{func.attr}()" for func in calls if isinstance(func, ast.Attribute)
              and func.attr in ("write_json_atomically", "write_predictions_jsonl", "dump")]
    writes += ["open()" for func in calls if isinstance(func, ast.Name) and func.id == "open"]
    assert not writes, (path.name, writes)


def test_the_tasks_plugin_does_not_import_the_evaluation():
  """realm_jax_tasks sits under the evaluation (which reads its tasks): the metric functions it
  names come from `realm_jax.data.answer_match`."""
  paths = sorted(TASKS_DIR.glob("*.py"))
  assert paths
  for path in paths:
    imported = _imported_modules(_tree(path))
    assert not [name for name in imported if name.startswith("realm_jax.evaluation")], (
        path.name, imported)


def test_the_tasks_name_the_same_metric_functions_the_evaluation_recognises():
  # Registers the tasks (imported here: TensorFlow, which the other tests of this file skip).
  import realm_jax_tasks  # pylint: disable=import-outside-toplevel,unused-import
  from realm_jax.batches import seqio_batches  # pylint: disable=import-outside-toplevel
  from realm_jax.data import answer_match  # pylint: disable=import-outside-toplevel
  from realm_jax.evaluation import metrics  # pylint: disable=import-outside-toplevel
  from realm_jax.evaluation import tasks  # pylint: disable=import-outside-toplevel
  assert tasks.task_kind(seqio_batches.get_task("toy_qa")) == "qa"
  assert list(seqio_batches.get_task("curated_trec").metric_fns) == [
      metrics.curated_trec_regex_match]
  assert answer_match.answers_are_regex(seqio_batches.get_task("curated_trec"))
  assert not answer_match.answers_are_regex(seqio_batches.get_task("nq_open"))
