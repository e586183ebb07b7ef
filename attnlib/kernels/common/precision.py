"""The dtypes of every kernel's matrix products: one choice, made here, for every op.

* **float32 inputs**: every product is exact IEEE float32 (``input_precision="ieee"``: no tf32). On a GPU
  that runs on the CUDA cores (FMA), not the tensor cores -- float32 is the correctness path.
* **float16 / bfloat16 inputs**: every ``tl.dot`` takes 16-bit operands and accumulates in float32 in
  registers, which is what the tensor cores do (``mma.sync m16n8k16`` on sm_80/sm_89, ``wgmma`` on
  sm_90). Two operand dtypes:

  - ``IO``, the input dtype: products of inputs and of quantities the inputs bound (``Q K^T``,
    ``K K^T``, the WY factors, softmax probabilities in [0, 1]);
  - ``WIDE``, bfloat16 for both half dtypes: products with a quantity whose size the inputs do not
    bound -- a chunked kernel's state ``h`` and its gradient ``dh``, an unnormalised score tile ``Q K^T``.
    bfloat16 has float32's exponent range: a linear-attention state is a sum over the whole sequence
    and exceeds float16's 65504 (``tests/test_linear_kernels.py`` builds one that does), so for
    float16 inputs these operands are rounded to bfloat16, and stored in it, rather than overflow.

Where float16 loses its precision: in ``WIDE``. The chunked linear-attention kernel in float16 is 5.8e-3
from float64 (relative RMS, output and gradients, T = 1024, D = 64, chunk 64:
``tests/test_linear_half_precision.py``), bfloat16's 8-bit significand rather than float16's 11. With tf32
operands for float16's ``WIDE`` products instead -- float32's range, float16's significand, and every
float16 number is a tf32 number -- the same run gives 2.9e-4 (measured through the interpreter with
the operands rounded to tf32 as the tensor cores round them). That costs those products half the
float16 tensor-core rate (tf32 on A100 and H100), float32 tiles in shared memory, and a float32 state in
memory; it is not taken until a GPU has measured that cost.

``dot`` is the one place that casts the operands and calls ``tl.dot``. Under Triton's interpreter a
bfloat16 ``tl.dot`` returns garbage (numpy has no bfloat16 product; measured with Triton 3.7.1), so
there the operands are rounded to bfloat16 and multiplied in float32 -- the same products, since a
product of two bfloat16 numbers is exact in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import INTERPRET

_EMULATE_BF16 = tl.constexpr(INTERPRET)

_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def io_dtype(dtype: torch.dtype):
    """The Triton dtype of the products of inputs (``IO``) for inputs of ``dtype``."""
    return _TL[dtype]


def wide_dtype(dtype: torch.dtype):
    """The Triton dtype of the products with unbounded quantities (``WIDE``) for inputs of ``dtype``."""
    return tl.float32 if dtype == torch.float32 else tl.bfloat16


def wide_storage(dtype: torch.dtype) -> torch.dtype:
    """The torch dtype in which states and their gradients are stored for inputs of ``dtype``."""
    return torch.float32 if dtype == torch.float32 else torch.bfloat16


def softmax_precision(dtype: torch.dtype) -> str:
    """``input_precision`` of the softmax kernels' products: exact for float32 inputs; for half inputs
    the operands are 16-bit and the argument is unused."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def dot(a, b, DT: tl.constexpr):
    """``a @ b`` with both operands rounded to ``DT`` and a float32 result (``DT`` float32: exact)."""
    if DT == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    a = a.to(DT)
    b = b.to(DT)
    if _EMULATE_BF16 and DT == tl.bfloat16:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


__all__ = ["dot", "io_dtype", "softmax_precision", "wide_dtype", "wide_storage"]
