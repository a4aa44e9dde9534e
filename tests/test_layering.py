"""The package layering has no import cycle: data < models < checkpoints < index < batches <
the seqio tasks (realm_jax_tasks) < evaluation / training < jobs < the command modules < the
launcher (realm_jax_launch) (docs/architecture.md, "Layers"); the benches (`bench/`, the
experiments) sit above all of it: the framework never imports them, and they have no cycle.

Every `import` and `from ... import` of the source counts, including the ones inside functions
(a lazy import is still a dependency). The two plugin distributions, `realm_jax_tasks` (tasks/)
and `realm_jax_launch` (launch/), are one unit each in the graph.
"""

import ast
import os
import pathlib

import realm_jax

PACKAGE_DIR = pathlib.Path(realm_jax.__file__).parent
# The plugin distributions beside the package (setup.py's package_dir), each one unit.
PACKAGES = {"realm_jax": PACKAGE_DIR, "realm_jax_tasks": PACKAGE_DIR.parent / "tasks",
            "realm_jax_launch": PACKAGE_DIR.parent / "launch"}
UNITS = {name: (root, name != "realm_jax") for name, root in PACKAGES.items()}
BENCH_DIR = PACKAGE_DIR.parent / "bench"


def _unit(module: str, roots: dict[str, tuple[pathlib.Path, bool]]):
  """The layering unit of a module name: `<package>.<subpackage or top-level module>`, or the
  whole package for one counted as a single unit (a plugin); None outside the packages."""
  parts = module.split(".")
  if parts[0] not in roots:
    return None
  root, whole = roots[parts[0]]
  if whole:
    return parts[0]
  if len(parts) < 2:
    return None
  head = root / parts[1]
  if head.is_dir() or head.with_suffix(".py").exists():
    return f"{parts[0]}.{parts[1]}"
  return None


def import_graph(root: pathlib.Path, package: str | None = None, *,
                 others: dict[str, tuple[pathlib.Path, bool]] | None = None
                 ) -> dict[str, dict[str, list[str]]]:
  """{unit: {imported unit: [files that import it]}} of the package at `root` (imported as
  `package`, default its directory's name); `others`: {package: (root, whole)} of the other
  packages whose imports count, `whole` when one counts as a single unit."""
  package = package or root.name
  roots = dict(others or {})
  roots.setdefault(package, (root, False))
  graph: dict[str, dict[str, list[str]]] = {}
  for path in sorted(root.rglob("*.py")):
    relative = path.relative_to(root).with_suffix("")
    source = _unit(".".join((package, *relative.parts)), roots)
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
        target = _unit(name, roots)
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


def test_realm_jax_and_its_plugins_have_no_import_cycle():
  # Each plugin distribution counts as one unit: the seqio tasks sit above the batches they
  # build examples with, the launcher above everything it starts.
  graph: dict[str, dict[str, list[str]]] = {}
  for package, root in PACKAGES.items():
    for source, targets in import_graph(root, package, others=UNITS).items():
      for target, files in targets.items():
        graph.setdefault(source, {}).setdefault(target, []).extend(files)
  # The walk sees the layering it should (a broken walk would find no cycle either).
  assert "realm_jax.models" in graph["realm_jax.batches"]
  assert "realm_jax.checkpoints" in graph["realm_jax.index"]
  assert "realm_jax.batches" in graph["realm_jax.jobs"]
  assert "realm_jax.batches" in graph["realm_jax_tasks"]
  assert "realm_jax_tasks" in graph["realm_jax.jobs"]
  assert "realm_jax.progress" in graph["realm_jax_launch"]
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


def test_the_framework_never_imports_the_benches():
  graph: dict[str, dict[str, list[str]]] = {}
  for package, root in PACKAGES.items():
    graph.update(import_graph(root, package, others={**UNITS, "bench": (BENCH_DIR, True)}))
  assert "realm_jax.pipeline" in graph["realm_jax.recipe"]  # the walk sees the framework's imports
  importers = sorted({file for targets in graph.values() for file in targets.get("bench", [])})
  assert not importers, f"the framework imports the benches: {', '.join(importers)}"


def test_the_benches_have_no_import_cycle():
  graph = import_graph(BENCH_DIR, "bench")
  assert "bench.ablations" in graph["bench.compute_curve"]  # the walk sees the benches' imports
  assert "bench.atlas" in graph["bench.fid_copying"]
  cycle = find_cycle(graph)
  assert cycle is None, f"import cycle among the benches: {_describe(graph, cycle)}"
