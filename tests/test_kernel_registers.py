"""The chunked backward kernels (and the forward state pass), compiled for an H100 (sm_90) without a GPU
at the launch configuration the wrappers choose, spill no registers at D = 64 and 128 in bfloat16; nor
does any autotuning candidate of the flash forward and backward that the pruning hooks keep.

ptxas reports spill stores/loads when a kernel's live tiles need more than 255 registers per thread;
a spill goes through local memory (L1/L2) on every use. Holding several ``[CHUNK, D]`` float32 tiles
at once did that (issue 13: up to 656 bytes in the Gated DeltaNet dq/dk kernel at D = 128); the kernels
now walk D in 64-wide key tiles, load inputs where they are used, and launch enough warps. This counts
the bytes from ``ptxas -v`` (``scripts/kernel_resources.py``, in a subprocess with the interpreter off)
and fails if any comes back."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("_fwd_h_kernel", "_bwd_dh_kernel", "_bwd_dqk_kernel", "_wy_bwd_kernel")


def compiled_resources(kernels, dims, dtypes=("bf16",), extra=(), more_runs=()):
    """Rows of ``scripts/kernel_resources.py`` for these kernels, or skip where sm_90 cannot be compiled.
    ``extra``: more arguments to the script; ``more_runs``: further ``(kernels, dims, dtypes, extra)``, run
    at the same time in their own processes (each compile is single-threaded)."""
    try:
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401

        if not os.path.exists(knobs.nvidia.ptxas.path):
            raise FileNotFoundError(knobs.nvidia.ptxas.path)
    except Exception as exc:  # noqa: BLE001 - a triton without its CUDA backend or ptxas cannot compile for sm_90
        pytest.skip(f"triton's CUDA backend or ptxas is not available: {exc}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    runs = [(kernels, dims, dtypes, extra), *more_runs]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "scripts" / "kernel_resources.py"), "--no-save",
                               "--json-stdout", "--kernels", ",".join(k), "--dims", *map(str, d), "--dtypes", *t, *x],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for k, d, t, x in runs]
    rows = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        rows += json.loads(out.strip().splitlines()[-1])
    return rows


@functools.cache
def chunked_rows() -> tuple:
    """The chunked kernels at D = 64, 128, 256 in bf16, compiled once per test session: this file checks
    their registers at D <= 128, ``test_kernel_resources.py`` their shared memory at D >= 128."""
    return tuple(compiled_resources(KERNELS, (64, 128, 256)))


def test_chunked_kernels_spill_no_registers_up_to_d128_in_bf16():
    rows = [r for r in chunked_rows() if r["D"] <= 128]
    # every variant the wrappers launch: linear (causal, non-causal), delta, gated delta, dq only
    assert {r["kernel"] for r in rows} == set(KERNELS) and len(rows) >= 2 * 13, [r["kernel"] for r in rows]
    spilled = [(r["kernel"], r["flags"], r["D"], r["spill_store_bytes"], r["spill_load_bytes"]) for r in rows
               if r["spill_store_bytes"] or r["spill_load_bytes"]]
    assert not spilled, spilled
    assert all(0 < r["registers"] <= 255 for r in rows)


FLASH = ("_flash_fwd_kernel", "_flash_bwd_dkdv_kernel", "_flash_bwd_dq_kernel")


def _tile(row):
    flags = dict(f.split("=") for f in row["flags"] if "=" in f)
    return (row["kernel"], "CAUSAL" in row["flags"], int(flags["BLOCK_M"]), int(flags["BLOCK_N"]), row["num_warps"],
            row["num_stages"])


def test_flash_autotune_candidates_spill_no_registers_up_to_d128_in_fp16_and_bf16():
    """Every configuration the flash autotuners may pick at D = 64 or 128 (what their pruning hooks keep),
    causal in bf16 and non-causal in fp16, compiles without spills. To stay quick, a candidate kept at
    both widths is compiled at 128 only (``--widest-only``), and each dtype takes one causality: in the
    saved report (``benchmarks/results/kernel_resources.json``, every flash row) fp16 and bf16 give the
    same registers and spills, and no configuration needed fewer registers at 128 than at 64."""
    import torch

    from attnlib.kernels.flash import backward as bwd
    from attnlib.kernels.flash import forward as fwd

    quick = ("--widest-only", "--workloads")
    rows = compiled_resources(FLASH, (64, 128), ("bf16",), (*quick, "flash"),
                              [(FLASH, (64, 128), ("fp16",), (*quick, "flash non-causal"))])
    assert {(r["dtype"], "CAUSAL" in r["flags"]) for r in rows} == {("bf16", True), ("fp16", False)}
    spilled = [(r["kernel"], r["flags"], r["D"], r["dtype"], r["spill_store_bytes"], r["spill_load_bytes"])
               for r in rows if r["spill_store_bytes"] or r["spill_load_bytes"]]
    assert not spilled, spilled
    assert all(0 < r["registers"] <= 255 for r in rows)
    kept = set()
    for d in (64, 128):
        args = {"Q": torch.empty(0, dtype=torch.float16), "BLOCK_D": d, "BLOCK_DV": d}
        for kernel, configs, prune in [("_flash_fwd_kernel", fwd._FWD_CONFIGS, fwd._prune_fwd),
                                       ("_flash_bwd_dkdv_kernel", bwd._DKDV_CONFIGS, bwd._pruner("kv")),
                                       ("_flash_bwd_dq_kernel", bwd._DQ_CONFIGS, bwd._pruner("q"))]:
            kept |= {(kernel, causal, *fwd.config_key(c)) for c in prune(configs, args, BLOCK_D=d, BLOCK_DV=d)
                     for causal in (False, True)}
    assert {_tile(r) for r in rows} == kept
