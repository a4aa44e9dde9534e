"""The package layering has no import cycle: data < models < checkpoints < index < batches <
evaluation / training < jobs < the command modules (docs/architecture.md, "Layers").

Every `import` and `from ... import` of the source counts, including the ones inside functions
(a lazy import is still a dependency); `realm_jax_tasks`, the plugin that registers the seqio
tasks, is a separate distribution and not part of the graph.
"""

import ast
import os
import pathlib

import realm_jax

PACKAGE_DIR = pathlib.Path(realm_jax.__file__).parent


def _unit(module: str, root: pathlib.Path, package: str):
  """The layering unit of a module name: `<package>.<subpackage or top-level module>`."""
  parts = module.split(".")
  if parts[0] != package or len(parts) < 2:
    return None
  head = root / parts[1]
  if head.is_dir() or head.with_suffix(".py").exists():
    return f"{package}.{parts[1]}"
  return None


def import_graph(root: pathlib.Path) -> dict[str, dict[str, list[str]]]:
  """{unit: {imported unit: [files that import it]}} of the package at `root`."""
  package = root.name
  graph: dict[str, dict[str, list[str]]] = {}
  for path in sorted(root.rglob("*.py")):
    relative = path.relative_to(root.parent).with_suffix("")
    source = _unit(".".join(relative.parts), root, package)
    if source is None:  # the package's own __init__
      continue
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{alias.name}" for alias in node.names]
      elif isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
      else:
        continue
      for name in names:
        target = _unit(name, root, package)
        if target is not None and target != source:
          graph.setdefault(source, {}).setdefault(target, []).append(
              os.path.relpath(path, root.parent))
  return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]):
  """One import cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(unit: str):
    state[unit] = 1
    path.append(unit)
    for target in sorted(graph.get(unit, {})):
      if state.get(target) == 1:
        return path[path.index(target):] + [target]
      if state.get(target) is None:
        cycle = visit(target)
        if cycle:
          return cycle
    path.pop()
    state[unit] = 2
    return None

  for unit in sorted(graph):
    if state.get(unit) is None:
      cycle = visit(unit)
      if cycle:
        return cycle
  return None


def _describe(graph, cycle) -> str:
  return "; ".join(f"{a} -> {b} ({', '.join(sorted(set(graph[a][b]))[:3])})"
                   for a, b in zip(cycle, cycle[1:]))


def test_realm_jax_has_no_package_import_cycle():
  graph = import_graph(PACKAGE_DIR)
  # The walk sees the layering it should (a broken walk would find no cycle either).
  assert "realm_jax.models" in graph["realm_jax.batches"]
  assert "realm_jax.checkpoints" in graph["realm_jax.index"]
  assert "realm_jax.batches" in graph["realm_jax.jobs"]
  cycle = find_cycle(graph)
  assert cycle is None, f"import cycle: {_describe(graph, cycle)}"


def test_the_walk_finds_a_cycle_through_a_lazy_import(tmp_path):
  """A hand-made package: a -> b at module level, b -> c, c -> a inside a function."""
  root = tmp_path / "pkg"
  for sub in ("a", "b", "c"):
    (root / sub).mkdir(parents=True)
    (root / sub / "__init__.py").write_text("")
  (root / "__init__.py").write_text("")
  (root / "a" / "x.py").write_text("from pkg.b import y\n")
  (root / "b" / "y.py").write_text("import pkg.c.z\n")
  (root / "c" / "z.py").write_text("def f():\n  from pkg.a import x\n  return x\n")
  (root / "top.py").write_text("from pkg import a\n")
  graph = import_graph(root)
  assert graph["pkg.top"] == {"pkg.a": ["pkg/top.py"]}
  assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
  (root / "c" / "z.py").write_text("def f():\n  return 1\n")
  assert find_cycle(import_graph(root)) is None
