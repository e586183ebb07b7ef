"""The compile runs behind ``tests/test_kernel_registers.py``: ``scripts/kernel_resources.py``'s arguments for
each, by name, built from the kernel packages' ``FAMILY`` records (``attnlib/kernels/common/family.py``,
found through ``attnlib.mechanisms``), so that a new kernel package is compiled and checked with no edit
here. ``kernel_resources.py --checked-runs`` compiles them into
``benchmarks/results/kernel_registers_cache.json``; the test reads their rows from there. A module of its
own, so that the test can read the list without importing the compile machinery
(``benchmarks.kernel_report`` switches Triton's interpreter off for the process that imports it). Importing
it imports every kernel package (through the records), with the interpreter as the process has it: a
script that compiles imports it after ``benchmarks.kernel_report``.

One group of runs per kind of tiling (``KernelFamily.tiles``):

* ``head`` (the chunked kernels, whose tiles span the head): at the widest head, D = 256, bf16, on each
  target;
* ``blocks`` (autotuned query x key tiles under flash's pruning hooks): D = 64, 128, 256, every candidate
  kept, a candidate kept at several widths compiled at the widest only, one causality and dtype per run
  (bf16 and fp16 give the same registers, causal and non-causal within a few and the same spills), on sm_90
  through tensor descriptors and through pointers;
* ``fixed`` (tiles the wrapper fixes for the device): D = 64, 128, 256 in bf16 and fp16, on each target.
"""

from __future__ import annotations

from attnlib.mechanisms import kernel_families

SMS = (80, 89, 90)


def _families(tiles: str) -> list:
    return [f for f in kernel_families() if f.tiles == tiles]


def kernels(tiles: str) -> tuple[str, ...]:
    """Every kernel the families of this kind of tiling launch, each once."""
    return tuple(dict.fromkeys(k for f in _families(tiles) for k in f.kernels))


def workloads(tiles: str, *, causal: bool | None = None) -> str:
    """The families' workload names (``kernel_resources.py --workloads``), those of one causality if given."""
    names = [n for f in _families(tiles) for n in f.workload_names()]
    if causal is not None:
        names = [n for n in names if n.endswith(" non-causal") != causal]
    return ",".join(names)


def _blocks_run(sm: int, dtype: str, causal: bool, *extra: str) -> list[str]:
    return ["--dims", "64", "128", "256", "--dtypes", dtype, "--widest-only",
            "--workloads", workloads("blocks", causal=causal), "--sm", str(sm), *extra]


# The runs, by name: kernel_resources.py's arguments for each. Compiled together by --checked-runs (about
# 12 CPU-minutes), never by the tests.
CHECKED_RUNS = {
    **{f"head D256 sm_{sm}": ["--dims", "256", "--dtypes", "bf16", "--workloads", workloads("head"),
                              "--sm", str(sm)] for sm in SMS},
    "blocks sm_80 bf16 causal": _blocks_run(80, "bf16", True),
    "blocks sm_89 fp16 non-causal": _blocks_run(89, "fp16", False),
    "blocks sm_90 bf16 causal": _blocks_run(90, "bf16", True),
    "blocks sm_90 fp16 non-causal pointers": _blocks_run(90, "fp16", False, "--no-tma"),
    **{f"fixed sm_{sm}": ["--dims", "64", "128", "256", "--dtypes", "bf16", "fp16",
                          "--workloads", workloads("fixed"), "--sm", str(sm)] for sm in SMS},
}
