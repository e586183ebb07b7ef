"""Every kernel, compiled without a GPU for the GPUs a reader has -- sm_80 (A100), sm_89 (L4), sm_90 (H100)
-- at the launch configurations the wrappers choose there (for an autotuned kernel: every candidate its
pruning hook keeps), fits the target's shared memory and spills no registers.

ptxas reports spill stores/loads when a kernel's live tiles need more than 255 registers per thread; a
spill goes through local memory (L1/L2) on every use, and a kernel that needs more shared memory than
the device has fails to launch -- neither of which Triton's interpreter can see. The benchmark shapes
(D = 64 and 128) are checked for the four attention ops by ``tests/test_kernel_report.py``; this file
checks every kernel package, grouped by how its tiles are chosen (``KernelFamily.tiles``; the runs are
built from the packages' records in ``benchmarks/_register_runs.py``): the chunked kernels at the widest
head they take (D = 256); the flash, block-sparse and sliding-window kernels at D = 64, 128 and 256 (up to
the widest head each takes) in both backward forms, both causalities, on sm_90 through tensor descriptors
and through pointers; and the kernels whose wrappers fix their tiles (top-k's indexer and attention,
ANNA's hashing, scan and gather, the fused Grassmann projection) at D = 64, 128 and 256. The counts come from
``scripts/kernel_resources.py --checked-runs`` (``ptxas -v``, about 12 CPU-minutes), committed in
``benchmarks/results/kernel_registers_cache.json`` with the inputs
they were made from (``benchmarks/_artifacts.py``). Nothing here compiles: a test reads the committed
counts when they are of this code and these versions, and fails at once, naming the command that makes
them again, when they are not -- so a kernel that spills or overflows still cannot land."""

import os

import pytest

from benchmarks import _artifacts as artifacts
from benchmarks import _register_runs as kr

from ._kernel_inputs import known_spill

REGISTERS = artifacts.BY_NAME["register counts"]


def compiled_resources(*names: str) -> list[dict]:
    """The rows of these runs of ``scripts/kernel_resources.py`` (``benchmarks/_register_runs.py``), read from
    the committed ``benchmarks/results/kernel_registers_cache.json``; skipped where sm_90 cannot be
    compiled (the rows would be of a compiler this machine does not have), failed at once when the file
    is not of this code and these versions."""
    try:
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401

        if not os.path.exists(knobs.nvidia.ptxas.path):
            raise FileNotFoundError(knobs.nvidia.ptxas.path)
    except Exception as exc:  # noqa: BLE001 - a triton without its CUDA backend or ptxas cannot compile for sm_90
        pytest.skip(f"triton's CUDA backend or ptxas is not available: {exc}")
    cache = artifacts.committed(REGISTERS)
    why = artifacts.staleness(REGISTERS, cache)
    if why:
        pytest.fail(artifacts.stale_message(REGISTERS, why), pytrace=False)
    rows = []
    for name in names:
        run = cache["runs"].get(name)
        assert run is not None and run["args"] == kr.CHECKED_RUNS[name], (
            f"run {name!r} is not in {REGISTERS.path} as it is listed now: `{REGISTERS.shell()}`")
        rows += run["rows"]
    return rows


def test_chunked_kernels_at_d256_fit_and_spill_no_registers_on_every_target():
    """Linear attention (causal, non-causal), the delta rule, the gated delta rule and its dq-only backward
    at D = 256 in bf16: every launch -- every kept candidate -- on sm_80, sm_89 and sm_90."""
    from attnlib.kernels.common.launch import SHARED_MEMORY

    rows = compiled_resources(*(f"head D256 sm_{sm}" for sm in kr.SMS))
    for sm in kr.SMS:
        mine = [r for r in rows if r["sm"] == sm]
        # at D = 256 linear attention's causal forward is the two-pass form (state pass, then outputs): the
        # segmented forward's kernels run at D <= 128 only (compiled in the report at the benchmark shapes)
        segmented = {k for k in kr.kernels("head") if k.startswith("_segment_")}
        launched = {r["kernel"] for r in mine}
        assert launched == set(kr.kernels("head")) - segmented, (sm, sorted(launched))
        limit = SHARED_MEMORY[(sm // 10, sm % 10)]
        bad = [(r["kernel"], r["flags"], r["block_v"], r["num_warps"], r["num_stages"], r["spill_store_bytes"],
                r["shared_bytes"]) for r in mine
               if ((r["spill_store_bytes"] or r["spill_load_bytes"])
                   and not known_spill(sm, r["kernel"], r["flags"], max(r["spill_store_bytes"], r["spill_load_bytes"])))
               or not 0 < r["shared_bytes"] <= limit]
        assert not bad, (sm, bad)
        assert all(0 < r["registers"] <= 255 for r in mine)


def _autotuned_blocks() -> dict[str, tuple[str, int]]:
    """The autotuned launches of the ``blocks`` families (``launch.TUNED``): name -> (kernel, widest head)."""
    from attnlib.kernels.common import launch
    from attnlib.mechanisms import kernel_families

    widest: dict[str, int] = {}
    for f in kernel_families():
        if f.tiles == "blocks":
            for k in f.kernels:                     # a kernel several families launch: the widest head of any
                widest[k] = max(widest.get(k, 0), f.max_head_dim)
    return {name: (kernel, widest[kernel]) for name, kernel in launch.TUNED_KERNEL.items() if kernel in widest}


# The autotuned kernels of the blocks families (flash's and the sliding window's): on sm_90 they load through
# tensor descriptors; block-sparse's kernels, whose tiles the wrapper halves to fit, through pointers.
DESCRIPTOR_KERNELS = {kernel for kernel, _ in _autotuned_blocks().values()}
# The softmax backward's preprocessing (a row sum of dO * O, per query row): no causality, no product.
PREPROCESS = "softmax_bwd_preprocess_kernel"
# Shared memory per block (the opt-in maximum) of the GPU each target stands for: A100, L4, H100.
SHARED_BYTES = {80: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}


def _tile(row):
    flags = dict(f.split("=") for f in row["flags"] if "=" in f)
    return (row["kernel"], "ATOMIC_DQ" in row["flags"], "CAUSAL" in row["flags"], int(flags["BLOCK_M"]),
            int(flags["BLOCK_N"]), row["num_warps"], row["num_stages"])


def _kept(family: str, limit: int) -> set:
    """What the pruning hooks of the blocks families' autotuned launches keep on a device of this family and
    shared memory, at D = 64, 128, 256 (up to each family's widest head) in half precision, as ``_tile``
    keys (both causalities)."""
    import torch

    from attnlib.kernels.common import launch

    kept = set()
    saved = launch.shared_memory_limit, launch.target_family
    launch.shared_memory_limit, launch.target_family = (lambda device: limit), (lambda device: family)
    try:
        for d in (64, 128, 256):
            x = torch.empty(0, dtype=torch.float16)
            args = {"O": x, "DK": x, "DQ": x, "LSE": x, "BLOCK_D": d, "BLOCK_DV": d}
            for name, (kernel, widest) in _autotuned_blocks().items():
                if d > widest:
                    continue
                configs, prune = launch.TUNED[name]
                fused = name.rpartition(".")[2] == "_fused"         # the backward adding dQ atomically
                kept |= {(kernel, fused, causal, *launch.config_key(c)) for c in prune(configs, args)
                         for causal in (False, True)}
    finally:
        launch.shared_memory_limit, launch.target_family = saved
    return kept


def test_flash_autotune_candidates_fit_and_spill_no_registers_on_every_target():
    """Every configuration the flash autotuners may pick -- what their pruning hooks keep for the device --
    at D = 64, 128 and 256, both backward forms (two-kernel and fused), compiles without spills and within
    the shared memory of the target: sm_80 (A100), sm_89 (L4) and sm_90 (H100), on sm_90 both through
    tensor descriptors (TMA) and through pointers (their fallback); so does every candidate the
    sliding-window kernels keep (flash's, by their own hooks); so do the block-sparse kernels at the tiles
    their wrappers choose for the device (mask blocks of 128). To stay quick, a candidate kept at
    several widths is compiled at the widest only (``--widest-only``: no configuration needed fewer
    registers at a narrower head), and each run takes one causality and dtype: bf16 and fp16 give the
    same registers, causal and non-causal within a few registers and the same spills, in the full
    measurement (``scripts/kernel_report.py --spill-tables``) behind the tables."""
    from attnlib.kernels.common.launch import SHARED_MEMORY

    runs = {"blocks sm_80 bf16 causal": (80, "bf16", ()), "blocks sm_89 fp16 non-causal": (89, "fp16", ()),
            "blocks sm_90 bf16 causal": (90, "bf16", ()),
            "blocks sm_90 fp16 non-causal pointers": (90, "fp16", ("--no-tma",))}
    assert all((sm, dt) == (int(kr.CHECKED_RUNS[n][kr.CHECKED_RUNS[n].index("--sm") + 1]),
                            kr.CHECKED_RUNS[n][kr.CHECKED_RUNS[n].index("--dtypes") + 1])
               and ("--no-tma" in kr.CHECKED_RUNS[n]) == bool(x) for n, (sm, dt, x) in runs.items())
    rows = compiled_resources(*runs)
    for sm, dt, x in runs.values():
        mine = [r for r in rows if r["sm"] == sm and r["dtype"] == dt]
        causal = dt == "bf16"
        assert mine and all(("CAUSAL" in r["flags"]) == causal for r in mine if r["kernel"] != PREPROCESS)
        # Descriptors on sm_90 (the backward's up to D = 128), never elsewhere nor in the block-sparse kernels.
        assert {r["kernel"] for r in mine} == set(kr.kernels("blocks")), sm
        assert all(r["tma"] == (sm == 90 and not x and r["kernel"] in DESCRIPTOR_KERNELS and
                                ("_fwd_" in r["kernel"] or r["D"] <= 128))
                   for r in mine), sm
        assert {r["mma"] for r in mine if r["kernel"] != PREPROCESS} == \
            ({"wgmma", "mma.sync"} if sm == 90 else {"mma.sync"}), sm
        family = "sm90" if sm == 90 else "sm80" if sm == 80 else "sm89"
        limit = SHARED_MEMORY[(sm // 10, sm % 10)]
        assert limit == SHARED_BYTES[sm]
        assert {_tile(r) for r in mine if r["kernel"] in DESCRIPTOR_KERNELS} == \
            {t for t in _kept(family, limit) if t[2] == causal}
        bad = [(r["kernel"], r["flags"], r["D"], r["spill_store_bytes"], r["shared_bytes"]) for r in mine
               if r["spill_store_bytes"] or r["spill_load_bytes"] or r["shared_bytes"] > limit]
        assert not bad, (sm, bad)
        assert all(0 < r["registers"] <= 255 for r in mine)


def test_fixed_tile_kernels_fit_and_spill_no_registers_on_every_target():
    """The kernels whose wrappers fix their tiles for the device (the ``fixed`` families: top-k's lightning
    indexer and gathered attention, ANNA's hashing, scan and gather, the fused Grassmann projection) at
    D = 64, 128 and 256 in bf16 and fp16 (up to the widest head each takes), on sm_80, sm_89 and sm_90:
    every kernel of those families compiled, within the target's shared memory, no spill. The index
    products reach the tensor cores (mma.sync; wgmma on sm_90 where the tile has 64 rows); the top-k
    attention's gathered rows use none (a matrix-vector product per query and head:
    ``attnlib/kernels/topk/attention.py``), nor do ANNA's hashes (exact float32 products: the bucket must be
    the reference's). float32 is not checked: its exact products run on the CUDA cores, and three of top-k's
    launches spill 4-8 bytes."""
    from attnlib.kernels.common.launch import SHARED_MEMORY

    rows = compiled_resources(*(f"fixed sm_{sm}" for sm in kr.SMS))
    for sm in kr.SMS:
        mine = [r for r in rows if r["sm"] == sm]
        assert {r["kernel"] for r in mine} == set(kr.kernels("fixed")), sm
        limit = SHARED_MEMORY[(sm // 10, sm % 10)]
        bad = [(r["kernel"], r["flags"], r["D"], r["dtype"], r["spill_store_bytes"], r["shared_bytes"]) for r in mine
               if r["spill_store_bytes"] or r["spill_load_bytes"] or r["shared_bytes"] > limit]
        assert not bad, (sm, bad)
        assert all(0 < r["registers"] <= 255 for r in mine)
        index_mma = {r["mma"] for r in mine if r["kernel"].startswith("_index")}
        assert index_mma == ({"wgmma", "mma.sync"} if sm == 90 else {"mma.sync"}), (sm, index_mma)
        assert {r["mma"] for r in mine if r["kernel"].startswith(("_topk", "_simhash", "_crosspolytope"))} == \
            {"fma"}, sm
