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


def jit_kernels(source: str) -> set[str]:
    """The ``@triton.jit`` functions of ``source`` named ``*_kernel`` (what a wrapper launches)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel"):
            if any(ast.unparse(d).endswith("jit") for d in node.decorator_list):
                found.add(node.name)
    return found


def kernels_in_repository() -> dict[str, set[str]]:
    """Each kernel package's kernels as its source defines them, ``common`` apart."""
    return {p.name: set().union(*(jit_kernels(f.read_text()) for f in p.rglob("*.py")))
            for p in sorted(KERNELS.iterdir()) if p.is_dir() and (p / "__init__.py").exists()}


def test_every_kernel_package_is_a_mechanisms_and_declares_its_family():
    packages = {m.name for m in pkgutil.iter_modules(attnlib.kernels.__path__) if m.ispkg} - {"common"}
    assert packages == {m.kernels for m in REGISTRY.values()}, "a kernel package no mechanism names, or the reverse"
    for family in kernel_families():
        assert isinstance(family, KernelFamily) and family.tiles in TILES
        assert len(set(family.kernels)) == len(family.kernels), family.package


def test_every_kernel_of_the_repository_is_in_a_family():
    """A package's own kernels are in its family; ``common``'s are in every family that launches them, and
    each in one at least."""
    source = kernels_in_repository()
    families = {f.package: set(f.kernels) for f in kernel_families()}
    for package, defined in source.items():
        if package == "common":
            continue
        assert defined <= families[package], (package, sorted(defined - families[package]))
    named = set().union(*families.values())
    assert source["common"] <= named, sorted(source["common"] - named)
    assert named <= set().union(*source.values()), sorted(named - set().union(*source.values()))


def test_a_kernel_left_out_of_its_family_is_found():
    planted = "import triton\n@triton.jit\ndef _planted_kernel(X):\n    pass\n@triton.jit\ndef helper(x):\n    pass\n"
    assert jit_kernels(planted) == {"_planted_kernel"}


def test_a_mechanism_whose_kernel_package_declares_no_family_fails_by_name(monkeypatch):
    softmax = REGISTRY["softmax"]
    planted = Mechanism("planted", "planted", softmax.operator, softmax.reference, kernels="common",
                        benchmark="attention")
    monkeypatch.setitem(REGISTRY, "planted", planted)
    with pytest.raises(TypeError, match="attnlib.kernels.common must declare FAMILY"):
        kernel_families()


def test_every_familys_workloads_are_compiled_and_launch_exactly_its_kernels():
    """In the committed compile runs, the launches each family's workloads made are of exactly the family's
    kernels (the segmented linear forward's at D <= 128 only, which the ``head`` runs do not reach: they are
    compiled in the kernel report at the benchmark shapes, ``tests/test_kernel_report.py``)."""
    from .test_kernel_registers import compiled_resources

    rows = compiled_resources(*kr.CHECKED_RUNS)
    for family in kernel_families():
        names = set(family.workloads(64, None, None, 64)) | set(family.workloads(256, None, None, 64))
        launched = {r["kernel"] for r in rows if names & set(r["used_by"])}
        want = set(family.kernels) - ({k for k in family.kernels if k.startswith("_segment_")}
                                      if family.tiles == "head" else set())
        assert launched == want, (family.package, sorted(launched ^ want))
