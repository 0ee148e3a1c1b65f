"""No import cycles in ``service/``, ``workers/`` or ``planner/`` (after Ray Train's
``python/ray/train/v2/tests/test_circular_imports.py``, but static, so every edge counts).

The graph is read from the source with ``ast``: an edge for every ``import`` and ``from ... import``
anywhere in a module, function-level imports and ``if TYPE_CHECKING:`` blocks included (a lazy import
only hides a cycle until the day someone moves it to the top). ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. A cycle is a strongly connected component of more
than one module; the failure names every module of each and the edges inside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "workers", "planner")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, wherever in the file the import stands."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else base)
    edges: set[str] = set()
    for target in targets:  # the longest prefix that is a project module
        parts = target.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in modules:
                if prefix != name:
                    edges.add(prefix)
                break
    return edges


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_are_edges() -> None:
    graph = import_graph()
    # ``orthoplex cluster up`` imports the testbed inside the command's function only
    assert "workers.testbed.cluster_up" in graph["service.cli.runtime"]
    assert len(graph) > 150  # every module of the three packages is read


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    detail = "\n".join(f"{c}: " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in found)
    assert not found, f"import cycles:\n{detail}"
