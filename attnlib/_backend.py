"""Backend choice: one rule for every op.

Every public op takes ``backend="auto" | "torch" | "triton"``:

* ``"torch"``  -- the reference: plain PyTorch that reads like the book's equations.
* ``"triton"`` -- the kernel. On CUDA tensors it is compiled for the GPU; on CPU tensors it runs
  through Triton's interpreter, which is only possible when ``TRITON_INTERPRET=1`` was set before
  the kernels were defined (Triton reads the variable when ``@triton.jit`` decorates a function,
  so set it before importing attnlib). Where the kernel does not apply to a call, a clear error.
* ``"auto"``   -- **the kernel where it applies, the PyTorch path otherwise.** The kernel applies when
  the tensors are on a CUDA device of compute capability 8.0 or newer (Ampere on), Triton is
  installed, the dtype is float16, bfloat16 or float32, and the op's own condition holds (its mode,
  chunk or block size, head dims...). Where it does not, ``auto`` runs PyTorch: the reference, or for
  softmax attention on a GPU, PyTorch's own fused kernel (SDPA).

Why capability 8.0: on sm_75 (the T4 of Colab's free tier) Triton lowers ``tl.dot`` to plain FMA
instructions -- no tensor core, in any dtype -- while cuBLAS and SDPA do use the T4's fp16 tensor
cores. A Triton kernel there is the slowest path the GPU has, so ``auto`` does not take it and
``backend="triton"`` says why.

Each op states its own condition as a reason the kernel does *not* apply (``None`` when it does) and
hands it to :func:`choose_backend`; the decision itself is :func:`decide`, a pure function of the
device type, its compute capability, the dtype and that reason, so it is tested without a GPU.
"""

from __future__ import annotations

import importlib.util
import os

import torch

BACKENDS = ("auto", "torch", "triton")
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The oldest GPU on which Triton's tl.dot reaches tensor cores (mma.sync from sm_80; sm_75 gets FMA).
MIN_CAPABILITY = (8, 0)
# The kernels' size limits, here rather than in kernels/common/launch.py (which re-exports them) so that
# the ops can state them without importing Triton: one tile holds a whole head row (beyond 256 the
# registers spill), and the chunked kernels run chunks of 16, 32 or 64 rows (the triangular solve works
# on 16-blocks; wider chunks spill).
MAX_HEAD_DIM = 256
KERNEL_CHUNKS = (16, 32, 64)
# The sliding-window kernels stop at 128: at 256 every forward tiling spills registers on sm_90 (4-280 B,
# through descriptors and pointers, flash's 32 x 16 fallback included: scripts/kernel_resources.py).
WINDOW_MAX_HEAD_DIM = 128
# ANNA's cross-polytope hashing kernel: the widest head it is compiled and checked at (spill-free on sm_80,
# sm_89 and sm_90 at 64 and 128); wider heads take the reference.
CROSSPOLYTOPE_MAX_HEAD_DIM = 128

# Read once, at import: this is the value the kernels' @triton.jit decorators will see, because
# attnlib.kernels is imported lazily, but always after this module. Changing the variable later
# does not turn already-decorated kernels into interpreted ones.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def too_old(capability: tuple[int, int] | None) -> str | None:
    """Why a CUDA device of this compute capability does not get the Triton kernels (None: it does)."""
    if capability is None or tuple(capability) >= MIN_CAPABILITY:
        return None
    major, minor = capability
    return (f"this GPU is sm_{major}{minor}, where Triton emits no tensor-core instruction for tl.dot (FMA "
            f"only; tensor cores from sm_{MIN_CAPABILITY[0]}{MIN_CAPABILITY[1]}), while PyTorch's cuBLAS and "
            "SDPA paths use this GPU's tensor cores")


def decide(backend: str, *, device_type: str, dtype: torch.dtype, why_not: str | None,
           triton_available: bool, interpret: bool, capability: tuple[int, int] | None = None) -> str:
    """The rule, as a pure function. Returns ``"torch"`` or ``"triton"``, or raises.

    ``why_not`` is the op's reason its kernel does not apply to this call (``None``: it applies);
    ``capability`` the CUDA device's ``(major, minor)`` (``None`` for other devices).
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}")
    if backend == "torch":
        return "torch"
    dtype_ok = dtype in KERNEL_DTYPES
    if device_type == "cuda" and why_not is None:
        why_not = too_old(capability)
    if backend == "auto":
        applies = device_type == "cuda" and triton_available and dtype_ok and why_not is None
        return "triton" if applies else "torch"
    # backend == "triton": say exactly why it cannot run, if it cannot.
    if not dtype_ok:
        raise TypeError(f"the inputs have dtype {_dtype_name(dtype)}; the Triton kernel takes float16, "
                        "bfloat16 or float32 (use backend='torch', or 'auto', which falls back to it)")
    if why_not is not None:
        raise ValueError(f"backend='triton' does not apply here: {why_not} (use backend='torch', or "
                         "'auto', which falls back to the reference)")
    if not triton_available:
        raise ValueError("backend='triton' needs the triton package (pip install triton); "
                         "use backend='torch' for the reference")
    if device_type == "cuda":
        return "triton"
    if device_type == "cpu":
        if not interpret:
            raise ValueError(
                "backend='triton' on CPU tensors runs through Triton's interpreter, which must be "
                "enabled before attnlib is imported: set TRITON_INTERPRET=1 in the environment "
                "(e.g. `TRITON_INTERPRET=1 python ...`), or move the tensors to a CUDA device, "
                "or use backend='torch'")
        return "triton"
    raise ValueError(f"backend='triton' supports CUDA tensors (or CPU tensors under "
                     f"TRITON_INTERPRET=1); got tensors on {device_type}")


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """``(major, minor)`` of a CUDA device, None for any other (read from torch, which caches it)."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def choose_backend(backend: str, x: torch.Tensor, *, why_not: str | None = None) -> str:
    """Apply :func:`decide` to an op whose inputs live where ``x`` lives and have its dtype."""
    return decide(backend, device_type=x.device.type, dtype=x.dtype, why_not=why_not,
                  triton_available=triton_installed(), interpret=INTERPRET, capability=cuda_capability(x.device))
