"""The softmax, block-sparse and sliding-window kernels compile for an NVIDIA GPU (sm_90), checked on the CPU.

The interpreter runs kernels as numpy code and accepts things the GPU compiler refuses (a plain global
float read inside a kernel, for one); this compiles each kernel, through Triton's real pipeline and its
bundled ptxas, in a subprocess with the interpreter off. No GPU is needed; nothing runs."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_softmax_and_block_sparse_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "_compile_kernels_for_gpu.py")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
