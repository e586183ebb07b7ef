"""Backend choice, in one place.

Every public op takes ``backend="auto" | "torch" | "triton"``:

* ``"torch"``  -- the reference: plain PyTorch that reads like the book's equations.
* ``"triton"`` -- the kernel. On CUDA tensors it is compiled for the GPU; on CPU tensors it runs
  through Triton's interpreter, which is only possible when ``TRITON_INTERPRET=1`` was set before
  the kernels were defined (Triton reads the variable when ``@triton.jit`` decorates a function,
  so set it before importing attnlib).
* ``"auto"``   -- the kernel on CUDA tensors (when Triton is installed), the reference elsewhere.
"""

from __future__ import annotations

import importlib.util
import os

import torch

BACKENDS = ("auto", "torch", "triton")

# Read once, at import: this is the value the kernels' @triton.jit decorators will see, because
# attnlib.kernels is imported lazily, but always after this module. Changing the variable later
# does not turn already-decorated kernels into interpreted ones.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """Return ``"torch"`` or ``"triton"`` for an op whose inputs live where ``x`` lives."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if backend == "torch":
        return "torch"
    if backend == "auto":
        return "triton" if (x.is_cuda and triton_installed()) else "torch"
    # backend == "triton": say exactly what is missing.
    if not triton_installed():
        raise ValueError("backend='triton' needs the triton package (pip install triton); "
                         "use backend='torch' for the reference")
    if x.is_cuda:
        return "triton"
    if x.device.type == "cpu":
        if not INTERPRET:
            raise ValueError(
                "backend='triton' on CPU tensors runs through Triton's interpreter, which must be "
                "enabled before attnlib is imported: set TRITON_INTERPRET=1 in the environment "
                "(e.g. `TRITON_INTERPRET=1 python ...`), or move the tensors to a CUDA device, "
                "or use backend='torch'")
        return "triton"
    raise ValueError(f"backend='triton' supports CUDA tensors (or CPU tensors under "
                     f"TRITON_INTERPRET=1); got tensors on {x.device}")
