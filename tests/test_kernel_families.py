"""Every kernel package declares what it launches (its ``FAMILY``), and every kernel it holds is in it:
the record the compile checks are built from (``benchmarks/_register_runs.py``,
``scripts/kernel_resources.py``), so that a kernel package added with its mechanism is compiled for every
target without an edit to them, and a kernel left out of its family fails here, by name.

Read from the source (which ``@triton.jit`` functions are kernels: those the wrappers launch, named
``*_kernel``; helpers inlined into them are not) and from the committed compile runs
(``benchmarks/results/kernel_registers_cache.json``: which kernels each family's workloads launched).
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import attnlib.kernels
from attnlib.kernels.common.family import TILES, KernelFamily
from attnlib.mechanisms import REGISTRY, Mechanism, kernel_families
from benchmarks import _register_runs as kr

KERNELS = Path(attnlib.kernels.__file__).parent


def _is_jit(decorator: ast.expr) -> bool:
    """``@triton.jit``, ``@jit`` or either called with options (``@triton.jit(do_not_specialize=...)``)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return ast.unparse(target).split(".")[-1] == "jit"


def jit_kernels(source: str) -> set[str]:
    """The ``@triton.jit`` functions of ``source`` named ``*_kernel`` (what a wrapper launches; the helpers
    inlined into kernels are named otherwise, and the compile checks see kernels by these names)."""
    return {node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel")
            and any(_is_jit(d) for d in node.decorator_list)}


def kernels_in_repository() -> dict[str, set[str]]:
    """Each kernel package's kernels as its source defines them, ``common`` apart."""
    return {p.name: set().union(*(jit_kernels(f.read_text()) for f in p.rglob("*.py")))
            for p in sorted(KERNELS.iterdir()) if p.is_dir() and (p / "__init__.py").exists()}


def test_every_kernel_package_belongs_to_a_mechanism_and_declares_its_family():
    packages = {m.name for m in pkgutil.iter_modules(attnlib.kernels.__path__) if m.ispkg} - {"common"}
    assert packages == {m.kernels for m in REGISTRY.values()}, "a kernel package no mechanism names, or the reverse"
    for family in kernel_families():
        assert isinstance(family, KernelFamily) and family.tiles in TILES
        assert len(set(family.kernels)) == len(family.kernels), family.package


def kernels_outside_their_family(source: dict[str, set[str]], families: dict[str, set[str]]) -> list[str]:
    """The kernels of ``source`` (package -> kernels it defines) that no family names as it should: a
    package's own kernels in its family; ``common``'s in some family; and any name a family gives that no
    source defines."""
    missing = [f"{package}.{k}" for package, defined in source.items() if package != "common"
               for k in sorted(defined - families.get(package, set()))]
    named = set().union(*families.values())
    missing += [f"common.{k}" for k in sorted(source.get("common", set()) - named)]
    missing += [f"(named only) {k}" for k in sorted(named - set().union(*source.values()))]
    return missing


def test_every_kernel_of_the_repository_is_in_a_family():
    families = {f.package: set(f.kernels) for f in kernel_families()}
    assert kernels_outside_their_family(kernels_in_repository(), families) == []


def test_a_kernel_left_out_of_its_family_is_found():
    planted = ("import triton\n@triton.jit\ndef _planted_kernel(X):\n    pass\n"
               "@triton.jit(do_not_specialize=['T'])\ndef _options_kernel(X, T):\n    pass\n"
               "@triton.jit\ndef helper(x):\n    pass\n")
    assert jit_kernels(planted) == {"_planted_kernel", "_options_kernel"}
    source = kernels_in_repository()
    families = {f.package: set(f.kernels) for f in kernel_families()}
    flash = families["flash"]
    dropped = {**families, "flash": flash - {"_flash_fwd_kernel"}}
    assert kernels_outside_their_family(source, dropped) == ["flash._flash_fwd_kernel"]
    common_dropped = {p: k - {"softmax_bwd_preprocess_kernel"} for p, k in families.items()}
    assert kernels_outside_their_family(source, common_dropped) == ["common.softmax_bwd_preprocess_kernel"]
    renamed = {**families, "flash": flash | {"_no_such_kernel"}}
    assert kernels_outside_their_family(source, renamed) == ["(named only) _no_such_kernel"]


def test_a_mechanism_whose_kernel_package_declares_no_family_fails_by_name(monkeypatch):
    softmax = REGISTRY["softmax"]
    planted = Mechanism("planted", "planted", softmax.operator, softmax.reference, kernels="common",
                        benchmark="attention")
    monkeypatch.setitem(REGISTRY, "planted", planted)
    with pytest.raises(TypeError, match="attnlib.kernels.common must declare FAMILY"):
        kernel_families()


def test_each_family_is_compiled_and_its_workloads_launch_exactly_its_kernels():
    """In the committed compile runs, the launches each family's workloads made are of exactly the family's
    kernels (the segmented linear forward's at D <= 128 only, which the ``head`` runs do not reach: they are
    compiled in the kernel report at the benchmark shapes, ``tests/test_kernel_report.py``)."""
    from .test_kernel_registers import compiled_resources

    rows = compiled_resources(*kr.CHECKED_RUNS)
    for family in kernel_families():
        names = set(family.workload_names())
        launched = {r["kernel"] for r in rows if names & set(r["used_by"])}
        want = set(family.kernels) - ({k for k in family.kernels if k.startswith("_segment_")}
                                      if family.tiles == "head" else set())
        assert launched == want, (family.package, sorted(launched ^ want))
