"""The chunked backward kernels (and the forward state pass), compiled for an H100 (sm_90) without a GPU
at the launch configuration the wrappers choose, spill no registers at D = 64 and 128 in bfloat16.

ptxas reports spill stores/loads when a kernel's live tiles need more than 255 registers per thread;
a spill goes through local memory (L1/L2) on every use. Holding several ``[CHUNK, D]`` float32 tiles
at once did that (issue 13: up to 656 bytes in the Gated DeltaNet dq/dk kernel at D = 128); the kernels
now walk D in 64-wide key tiles, load inputs where they are used, and launch enough warps. This counts
the bytes from ``ptxas -v`` (``scripts/kernel_resources.py``, in a subprocess with the interpreter off)
and fails if any comes back."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ("_fwd_h_kernel", "_bwd_dh_kernel", "_bwd_dqk_kernel", "_wy_bwd_kernel")


def compiled_resources(kernels, dims, dtypes=("bf16",)):
    """Rows of ``scripts/kernel_resources.py`` for these kernels, or skip where sm_90 cannot be compiled."""
    try:
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401

        if not os.path.exists(knobs.nvidia.ptxas.path):
            raise FileNotFoundError(knobs.nvidia.ptxas.path)
    except Exception as exc:  # noqa: BLE001 - a triton without its CUDA backend or ptxas cannot compile for sm_90
        pytest.skip(f"triton's CUDA backend or ptxas is not available: {exc}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(ROOT / "scripts" / "kernel_resources.py"), "--no-save", "--json-stdout",
           "--kernels", ",".join(kernels), "--dims", *map(str, dims), "--dtypes", *dtypes]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_chunked_kernels_spill_no_registers_up_to_d128_in_bf16():
    rows = compiled_resources(KERNELS, (64, 128))
    # every variant the wrappers launch: linear (causal, non-causal), delta, gated delta, dq only
    assert {r["kernel"] for r in rows} == set(KERNELS) and len(rows) >= 2 * 13, [r["kernel"] for r in rows]
    spilled = [(r["kernel"], r["flags"], r["D"], r["spill_store_bytes"], r["spill_load_bytes"]) for r in rows
               if r["spill_store_bytes"] or r["spill_load_bytes"]]
    assert not spilled, spilled
    assert all(0 < r["registers"] <= 255 for r in rows)
