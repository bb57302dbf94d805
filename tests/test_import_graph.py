"""The import graph of the shipped packages, module to module (AST): no cycle, and no module outside
``tests/`` imports ``tests`` (bench/, scripts/ and fakes/ take the live-server harness from fakes/live.py).

Imports inside functions and under ``if TYPE_CHECKING:`` count: they are how a cycle goes soft (the module
graph of top-level statements alone has none, yet ``estimator/shape`` imported ``flops`` in a function
and ``flops`` imports ``shape``).
"""

from __future__ import annotations

from pathlib import Path

import tests.test_import_boundary as boundary
from tests.test_import_boundary import ROOT, imports, module_name, project_packages


def shipped_modules() -> dict[str, Path]:
    packages = project_packages() - {"tests", "bench"}
    return {module_name(path): path for package in sorted(packages) for path in sorted((ROOT / package).rglob("*.py"))}


def module_imports(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports. (A package that imports its own submodules makes no edge back:
    the edges are import statements.)"""
    return imports(path, known) & known - {module_name(path)}


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    known = set(modules)
    return {name: module_imports(path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as ``[a, b, …, a]``, or ``[]``: depth-first search, iterative."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return []


def test_the_shipped_packages_have_no_import_cycle():
    graph = import_graph(shipped_modules())
    assert len(graph) > 300 and sum(map(len, graph.values())) > 1000  # the whole tree was read
    assert find_cycle(graph) == []


def test_the_cycle_finder_sees_soft_cycles(tmp_path, monkeypatch):
    """``a/x.py`` imports ``a.y``; ``a/y.py`` imports ``x`` inside a function, ``a/z.py`` under
    TYPE_CHECKING: both are cycles. ``a/__init__.py`` importing its submodule is none."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("from .x import f\n")
    (tmp_path / "a" / "x.py").write_text("from a.y import f\nfrom . import z\n")
    (tmp_path / "a" / "y.py").write_text("def f():\n    from a import x\n")
    (tmp_path / "a" / "z.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .x import f\n")
    monkeypatch.setattr(boundary, "ROOT", tmp_path)
    paths = {module_name(p): p for p in (tmp_path / "a").glob("*.py")}
    graph = import_graph(paths)
    assert graph == {"a": {"a.x"}, "a.x": {"a.y", "a.z"}, "a.y": {"a.x"}, "a.z": {"a.x"}}
    assert find_cycle(graph) == ["a.x", "a.y", "a.x"]
    graph["a.x"] = {"a.z"}
    assert find_cycle(graph) == ["a.x", "a.z", "a.x"]
    graph["a.x"] = set()
    assert find_cycle(graph) == []


def test_nothing_outside_tests_imports_tests():
    """Function-level imports included: a bench or script that needs the live server takes fakes/live.py."""
    tops = [top for top in sorted(ROOT.iterdir()) if top.is_dir() and top.name != "tests" and top.name[0] != "."]
    paths = [path for top in tops for path in sorted(top.rglob("*.py"))]
    assert {"bench", "scripts", "fakes", "gateway"} <= {path.relative_to(ROOT).parts[0] for path in paths}
    wrong = {f"{path.relative_to(ROOT)}: {name}" for path in paths for name in imports(path)
             if name == "tests" or name.startswith("tests.")}
    assert len(paths) > 350 and not wrong
