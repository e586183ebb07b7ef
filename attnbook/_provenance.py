"""What a committed result was made from: the repository files its code executes, and the versions.

A result that takes minutes to make is committed (the kernel report and the register counts in
``benchmarks/results/``, a lab's training run) and stamped with its inputs (:func:`stamp`): the sha256 of
the code of every repository file that the code making it executes -- the entry file and the closure of its imports
(:func:`closure`) -- and the versions of the packages that change it. Making it again from the same
stamp gives the same result, so a reader of the result compares stamps instead of recomputing it, and
:func:`staleness` says what changed when they differ.

The closure is read from the source (``ast``, nothing imported), as ``tests/test_import_graph.py`` reads
attnlib's import graph with the same functions: every import counts -- at the top of a module, inside a
function, under ``TYPE_CHECKING`` -- and importing ``a.b.c`` also runs the ``__init__`` of ``a`` and
``a.b``, so those packages are edges too (except the importer's own ancestors, which are running
already).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("attnlib", "attnbook", "benchmarks")   # the repository's importable packages (the two pyproject.toml)
# The stamping itself: code that imports these to stamp a result does not make the result with them.
MACHINERY = ("attnbook._provenance", "benchmarks._artifacts")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Every module of these packages, by dotted name."""
    return {module_name(p): p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))}


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@functools.lru_cache(maxsize=4096)
def _read(path: Path, version: tuple[int, int]) -> tuple[tuple, str]:
    """What a stamp reads of ``path``, parsed once per version of the file (its ``(mtime_ns, size)``): its import
    statements as ``(level, module, names)`` (``level`` None for ``import x``), and the sha256 of its code
    -- the syntax tree without docstrings (``ast.dump``, which leaves out line numbers). Comments,
    docstrings, line breaks and layout change no result, so a file rewrapped to fit a page keeps its
    digest; any change to what runs (a name, a constant, an operator) gives another."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    statements = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            statements.append((None, None, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            statements.append((node.level, node.module, tuple(a.name for a in node.names)))
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tuple(statements), hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def _version_of(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_mtime_ns, st.st_size


def _statements(path: Path) -> tuple:
    return _read(path, _version_of(path))[0]


def code_digest(path: Path) -> str:
    """The sha256 of what a Python file executes (see :func:`_read`)."""
    return _read(path, _version_of(path))[1]


def imports(name: str, path: Path, known: dict[str, Path], skip: tuple[str, ...] = ()) -> set[str]:
    """The known modules that importing ``name`` (the file ``path``) executes by its own import statements.
    A script outside the packages is read with ``name=""`` (it has no package of its own); an import of a
    module in ``skip`` is not followed (nor are the packages above it counted for it)."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]          # the package relative imports start from
    targets: set[str] = set()
    for level, module, names in _statements(path):
        if level is None:                                       # `import a.b, c`
            targets.update(names)
            continue
        if level:
            base_parts = here.split(".")[:len(here.split(".")) - (level - 1)]
            base = ".".join(base_parts + ([module] if module else []))
        else:
            base = module or ""
        for a in names:
            sub = f"{base}.{a}"
            targets.add(sub if sub in known else base)          # `from pkg import submodule` runs it
    edges = set()
    for t in targets:
        while t and t not in known:                             # `import attnlib.x.f`: the module part
            t = t.rpartition(".")[0]
        if not t or t in skip:
            continue
        parts = t.split(".")
        for k in range(1, len(parts) + 1):                      # the packages above the target run first
            mod = ".".join(parts[:k])
            if mod in known and not (mod != t and name and within(name, mod)) and mod != name:
                edges.add(mod)
    return edges


def graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    known = modules(packages)
    return {name: imports(name, path, known) for name, path in known.items()}


def closure(entry: Path, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """The files of the repository that running ``entry`` (a script, or a module's file) executes: ``entry``
    itself and every module of ``packages`` it imports, directly or through others, less the stamping
    machinery (:data:`MACHINERY`); sorted, ``entry`` included."""
    known = modules(packages)
    seen: set[str] = set()
    name = module_name(entry) if entry.relative_to(ROOT).parts[0] in packages else ""
    todo = sorted(imports(name, entry, known, MACHINERY))
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        todo += sorted(imports(mod, known[mod], known, MACHINERY) - seen)
    return sorted({entry, *(known[m] for m in seen)})


def _version(pkg: str) -> str:
    """The release of ``pkg`` installed here, without a local build tag (torch's ``+cpu`` or ``+cu130``: the
    same release's CPU and CUDA builds make the same compile results and CPU runs); ``-`` if absent."""
    try:
        return importlib.metadata.version(pkg).split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "-"


def stamp(entry: Path, packages: tuple[str, ...] = ()) -> dict:
    """The inputs of what ``entry`` makes: ``{"inputs": {"files": {path: sha256}, "versions": {...}},
    "inputs_sha256": ...}`` -- the code of every repository file it executes (:func:`code_digest`), and the
    versions of ``packages`` and of Python (two minor versions of Python may order or round differently)."""
    files = {p.relative_to(ROOT).as_posix(): code_digest(p) for p in closure(entry)}
    versions = {pkg: _version(pkg) for pkg in packages}
    versions["python"] = f"{sys.version_info[0]}.{sys.version_info[1]}"
    inputs = {"files": files, "versions": versions}
    return {"inputs": inputs, "inputs_sha256": hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()}


def staleness(result: dict | None, now: dict) -> list[str]:
    """Why a result stamped as ``result`` is not what making it now (stamp ``now``) would give: the files
    changed, read or no longer read, and the versions that differ. Empty when it is current."""
    if result is None:
        return ["it is missing"]
    if result.get("inputs_sha256") == now["inputs_sha256"]:
        return []
    then = result.get("inputs") or {}
    if not then:
        return ["it carries no record of its inputs (made before they were recorded)"]
    why = []
    old_files, new_files = then.get("files", {}), now["inputs"]["files"]
    changed = sorted(f for f in new_files if f in old_files and old_files[f] != new_files[f])
    added, removed = sorted(set(new_files) - set(old_files)), sorted(set(old_files) - set(new_files))
    for label, names in (("changed", changed), ("now read", added), ("no longer read", removed)):
        if names:
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            why.append(f"{label}: {shown}")
    for pkg, version in now["inputs"]["versions"].items():
        if then.get("versions", {}).get(pkg) != version:
            why.append(f"{pkg} {then.get('versions', {}).get(pkg, '?')} -> {version}")
    return why or ["its inputs hash differs"]
