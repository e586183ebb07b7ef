"""The heaviest chunked backward kernels, compiled for an H100 (sm_90) without a GPU, fit its shared
memory at the launch configuration the wrappers choose. The interpreter cannot see this: a kernel
that needs more than 227 KB of shared memory compiles, runs through the interpreter, and then fails
to launch on the GPU. Compilation runs in a subprocess with the interpreter off (tests/conftest.py
turns it on for this process)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
H100_SHARED_BYTES = 232448                    # 227 KB per block, the sm_90 opt-in maximum

SCRIPT = r"""
import json, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnlib.kernels.common import chunk_o, launch
from attnlib.kernels.delta import wy

cuda = torch.device("cuda")                   # a device object only: nothing runs on it
out = []
for D in (128, 256):
    C = launch.kernel_chunk(64, D)
    BD, BV = launch.dim_block(D), launch.value_block(D, D, cuda)
    for kern, consts in ((chunk_o._bwd_dqk_kernel, dict(DELTA=True, GATED=True, NEED_DK=True)),
                         (wy._wy_bwd_kernel, dict(GATED=True))):
        consts = dict(CHUNK=C, BLOCK_D=BD, BLOCK_V=BV, P32="tf32", **consts)
        sig = {p.name: "constexpr" if p.is_constexpr else
               ("fp32" if p.name == "scale" else "i32") if p.name in ("T", "D", "DV", "NT", "scale") else
               ("*bf16" if p.name in ("Q", "K", "V", "DO", "BETA") else "*fp32") for p in kern.params}
        ck = triton.compile(ASTSource(fn=kern, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": launch.warps(C, BD), "num_stages": 1})
        out.append({"kernel": kern.fn.__name__, "D": D, "chunk": C, "shared": ck.metadata.shared})
print(json.dumps(out))
"""


def test_backward_kernels_fit_h100_shared_memory():
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a triton without its CUDA backend cannot compile for sm_90
        pytest.skip(f"triton's CUDA backend is not available: {exc}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=600)
    if res.returncode != 0 and "ptxas" in res.stderr.lower() and "not found" in res.stderr.lower():
        pytest.skip("ptxas is not available")
    assert res.returncode == 0, res.stderr[-3000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(rows) == 4
    for r in rows:
        assert 0 < r["shared"] <= H100_SHARED_BYTES, r
