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
(``attnlib.exercises``) are built on it, never the other way round. ``lab.py`` and ``needle.py`` are
lab code wherever they live (top level or in ``experiments/``), and a package ``__init__`` may
re-export whatever it likes.
"""

from __future__ import annotations

from pathlib import Path

from attnlib._provenance import graph, modules, within

LAB_LAYERS = ("attnlib.experiments", "attnlib.widgets", "attnlib.exercises")
LAB_CODE_AT_TOP = {"lab", "needle"}           # lab code that may still sit beside the operators


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
    return len(parts) == 2 and path.name != "__init__.py" and parts[1] not in LAB_CODE_AT_TOP


def test_operators_and_kernels_do_not_import_experiments_or_widgets():
    known = _modules()
    graph = _graph()
    bad = [f"{name} imports {dep}" for name, deps in sorted(graph.items()) if _is_operator_or_kernel(name, known[name])
           for dep in sorted(deps) if any(_within(dep, layer) for layer in LAB_LAYERS)]
    assert not bad, "the library must not depend on the labs' code:\n" + "\n".join(bad)
