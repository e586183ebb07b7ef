"""The repository's import graph, read from the source (ast, nothing imported; ``attnbook._provenance`` reads
it), over its three packages: ``attnlib`` (the library a user of the kernels installs), ``attnbook`` (the
book's code) and ``benchmarks``. No module may import itself through others, and every edge runs down the
layers (:data:`LAYERS`): the operators and kernels never reach for the book's code, the experiments never
for the figures, the exercises or the lab.

A cycle works at runtime only as long as the import order happens to suit it (``grassmann`` and its
kernel once imported each other through a function-level import), so every import counts: at the top
of a module, inside a function, under ``TYPE_CHECKING``. Importing ``a.b.c`` also runs the ``__init__``
of ``a.b``, so those packages are edges too (except the importer's own ancestors, which are running
already).

The graph is read from import statements, so a module loaded by name (``importlib.import_module``,
``__import__``) would be an edge it cannot see: none is allowed, in the packages or in the scripts, but
three listed with their reasons (:data:`DYNAMIC_IMPORTS`).
"""

from __future__ import annotations

import ast
from pathlib import Path

from attnbook._provenance import PACKAGES, ROOT, graph, modules, within

# Bottom to top: a module may import its own layer's modules and those of the layers below, never above.
LAYERS = (
    "attnlib",                   # the operators and their kernels
    "attnbook._provenance",      # the stamps of committed results (imports nothing of the book)
    "attnbook.mechanisms",       # where the book shows each of the library's mechanisms
    "attnbook.experiments",      # what the labs measure
    "attnbook.widgets",          # the figures: draw what the experiments return
    "attnbook.exercises",        # the exercises and their checker
    "attnbook.lab_runs",         # committed training runs of the experiments
    "attnbook.lab",              # a lab's set-up and checks
    "benchmarks",                # the benchmarks and the committed results' checks
)
# (file, function) allowed to load a module by name, and why the graph misses no edge by it
DYNAMIC_IMPORTS = {
    # the versions of the packages a benchmark ran with (torch, triton, fla, attnlib): each already imported
    ("benchmarks/_common.py", "versions"),
    # a compile worker finds a kernel by the "module:qualname" its parent recorded from an imported module
    ("benchmarks/kernel_report/compile.py", "resolve_kernel"),
    # a mechanism's record names its kernel package, imported on demand (Triton is optional); both ends are in
    # attnlib's layer, and tests/test_kernel_families.py checks that every kernel package is named by a record
    ("attnlib/mechanisms.py", "kernel_family"),
}


def layer(name: str) -> int:
    """The index in :data:`LAYERS` of the module ``name``; the bare ``attnbook`` package (a docstring) is the
    book's lowest layer."""
    for i, prefix in enumerate(LAYERS):
        if within(name, prefix):
            return i
    if name == "attnbook":
        return 1
    raise AssertionError(f"{name} is in no layer: add its package to LAYERS")


def _graph() -> dict[str, set[str]]:
    """The repository's import graph (``attnbook._provenance`` reads it; it also stamps committed results with it)."""
    return graph(PACKAGES)


def _modules() -> dict[str, Path]:
    return modules(PACKAGES)


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
    for mod in ("attnlib", "attnlib.grassmann", "attnlib.kernels.grassmann", "attnbook.experiments", "attnbook.lab",
                "benchmarks._artifacts"):
        assert mod in graph
    assert "attnlib._validate" in graph["attnlib.grassmann"]                       # `from . import _validate`
    assert "attnlib.kernels.grassmann" in graph["attnlib.grassmann"]               # a function-level import
    assert "attnlib.kernels" in graph["attnlib.grassmann"]                         # its package runs first
    assert "attnlib.kernels.common.launch" in graph["attnlib.kernels.grassmann.plucker_fused"]
    assert "attnbook.lab_runs" in graph["attnbook.lab"]                            # `from . import lab_runs`
    assert "attnbook.experiments.mqar" in graph["attnbook.lab_runs"]               # the runs' experiments
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_every_module_of_the_three_packages_has_a_layer():
    assert PACKAGES == ("attnlib", "attnbook", "benchmarks")
    for name in _modules():
        layer(name)


def test_no_import_cycles_among_the_repository_modules():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles (each module imports the next):\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def test_every_import_runs_down_the_layers():
    """The operators and kernels never import the book; the experiments never the figures, exercises or lab;
    the figures never the exercises; nothing of the book imports the benchmarks."""
    bad = [f"{name} ({LAYERS[layer(name)]}) imports {dep} ({LAYERS[layer(dep)]})"
           for name, deps in sorted(_graph().items()) for dep in sorted(deps) if layer(dep) > layer(name)]
    assert not bad, "imports up the layers:\n" + "\n".join(bad)


def test_the_layer_rule_flags_an_import_up_the_layers():
    assert layer("attnlib.kernels.flash.forward") < layer("attnbook.experiments.needle.argument")
    assert layer("attnbook.experiments.byte_model") < layer("attnbook.lab")
    assert layer("attnbook.widgets.eot") < layer("attnbook.exercises.ch01")


def test_the_library_holds_no_book_code():
    """What a user of the kernels installs (``attnlib/pyproject.toml``) is attnlib's own directory: its
    package list is exactly attnlib's packages, and none of its modules is the book's."""
    import tomllib

    meta = tomllib.loads((ROOT / "attnlib" / "pyproject.toml").read_text())
    listed = set(meta["tool"]["setuptools"]["packages"])
    found = {name for name, path in modules(("attnlib",)).items() if path.name == "__init__.py"}
    assert listed == found, f"attnlib/pyproject.toml lists {sorted(listed ^ found)} wrongly (listed {sorted(listed)})"
    assert meta["tool"]["setuptools"]["package-dir"] == {"attnlib": "."}
    assert set(meta["project"]["dependencies"]) == {"torch>=2.4"}


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
    files = [*_modules().values(), *sorted((ROOT / "scripts").glob("*.py"))]
    found = {(path.relative_to(ROOT).as_posix(), fn) for path in files for fn in _dynamic_imports(path.read_text())}
    assert found <= DYNAMIC_IMPORTS, f"modules loaded by name, invisible to the import graph: {found - DYNAMIC_IMPORTS}"
