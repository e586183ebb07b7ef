"""attnlib's import graph, read from the source (ast, nothing imported; ``attnlib._provenance`` reads
it): no module may import itself through others, and the operators and kernels never reach for the
labs' code.

A cycle works at runtime only as long as the import order happens to suit it (``grassmann`` and its
kernel once imported each other through a function-level import), so every import counts: at the top
of a module, inside a function, under ``TYPE_CHECKING``. Importing ``a.b.c`` also runs the ``__init__``
of ``a.b``, so those packages are edges too (except the importer's own ancestors, which are running
already).

The layers: the operator modules (``attnlib/*.py``) and ``attnlib/kernels/**`` are the library; the
experiments (``attnlib.experiments``), figures (``attnlib.widgets``) and exercises
(``attnlib.exercises``) are built on it, never the other way round; the exercises are built on the
experiments, which never import them. A package ``__init__`` may re-export whatever it likes.

The graph is read from import statements, so a module loaded by name (``importlib.import_module``,
``__import__``) would be an edge it cannot see: none is allowed but the one command that re-makes a
committed run from the experiment it names (:data:`DYNAMIC_IMPORTS`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from attnlib._provenance import graph, modules, within

LAB_LAYERS = ("attnlib.experiments", "attnlib.widgets", "attnlib.exercises")
# (module, function) allowed to load a module by name: `rerun` re-makes a committed run (a command, run
# by `make artifacts`) from the experiment its record names
DYNAMIC_IMPORTS = {("attnlib.experiments.lab_runs", "rerun")}


def _graph() -> dict[str, set[str]]:
    """attnlib's import graph (``attnlib._provenance`` reads it; it also stamps committed results with it)."""
    return graph(("attnlib",))


def _modules() -> dict[str, Path]:
    return modules(("attnlib",))


_within = within


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one (Tarjan), each as a closed path: the
    shortest one through the component's first module, so the message names modules that import each other."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in comps:                          # the shortest way back to the component's first module (BFS)
        start = min(comp)
        came_from, frontier = {}, [start]
        while start not in came_from:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w not in came_from:
                        came_from[w] = v
                        nxt.append(w)
            frontier = nxt
        path = [start]
        while path[-1] != start or len(path) == 1:
            path.append(came_from[path[-1]])
        cycles.append(path[::-1])
    return cycles


def test_the_graph_sees_the_modules_and_their_imports():
    """The parser itself: it finds the packages and follows relative imports (or the tests below pass vacuously)."""
    graph = _graph()
    for mod in ("attnlib", "attnlib.grassmann", "attnlib.kernels.grassmann", "attnlib.experiments"):
        assert mod in graph
    assert "attnlib._validate" in graph["attnlib.grassmann"]                       # `from . import _validate`
    assert "attnlib.kernels.grassmann" in graph["attnlib.grassmann"]               # a function-level import
    assert "attnlib.kernels" in graph["attnlib.grassmann"]                         # its package runs first
    assert "attnlib.kernels.common.launch" in graph["attnlib.kernels.grassmann.plucker_fused"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycles_among_attnlib_modules():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (each module imports the next):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def _is_operator_or_kernel(name: str, path: Path) -> bool:
    if _within(name, "attnlib.kernels"):
        return True
    parts = name.split(".")
    return len(parts) == 2 and path.name != "__init__.py"


def test_operators_and_kernels_do_not_import_experiments_or_widgets():
    known = _modules()
    graph = _graph()
    bad = [f"{name} imports {dep}" for name, deps in sorted(graph.items()) if _is_operator_or_kernel(name, known[name])
           for dep in sorted(deps) if any(_within(dep, layer) for layer in LAB_LAYERS)]
    assert not bad, "the library must not depend on the labs' code:\n" + "\n".join(bad)


def test_the_experiments_and_figures_never_import_the_exercises():
    graph = _graph()
    bad = [f"{name} imports {dep}" for name, deps in sorted(graph.items())
           if _within(name, "attnlib.experiments") or _within(name, "attnlib.widgets")
           for dep in sorted(deps) if _within(dep, "attnlib.exercises")]
    assert not bad, "the exercises sit on top of the experiments:\n" + "\n".join(bad)


def _dynamic_imports(source: str) -> list[str]:
    """The functions of a module (``<module>`` for its top level) that load a module by name
    (``importlib.import_module``, ``__import__``)."""
    found = set()

    def visit(node, where):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Call):
                f = child.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in ("import_module", "__import__"):
                    found.add(where)
            visit(child, where)
    visit(ast.parse(source), "<module>")
    return sorted(found)


def test_every_import_is_a_statement_the_graph_can_read():
    assert _dynamic_imports("import importlib\ndef f(m):\n    return importlib.import_module(m)\n") == ["f"]
    assert _dynamic_imports("mod = __import__('x')\n") == ["<module>"]
    found = {(name, fn) for name, path in _modules().items() for fn in _dynamic_imports(path.read_text())}
    assert found <= DYNAMIC_IMPORTS, f"modules loaded by name, invisible to the import graph: {found - DYNAMIC_IMPORTS}"
