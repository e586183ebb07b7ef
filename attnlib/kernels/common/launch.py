"""Launch helpers shared by the chunked kernels: block sizes, dot precisions, the device check.

Not a kernel. Every wrapper in ``common/``, ``linear/`` and ``delta/`` takes contiguous
``[B, H, T, X]`` tensors (``beta``, gates: ``[B, H, T]``) and flattens ``(B, H)`` into one grid
axis, so a kernel addresses row ``t`` of head ``bh`` at ``(bh * T + t) * X``.
"""

from __future__ import annotations

import torch
import triton

from ..._backend import INTERPRET

MAX_HEAD_DIM = 256          # one [CHUNK, BLOCK_D] tile holds all of D: beyond 256 the registers spill
MIN_DOT = 16                # tl.dot needs every tile side >= 16


def require_device(x: torch.Tensor) -> None:
    if x.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1")


def dim_block(n: int) -> int:
    """A power-of-two tile side covering ``n`` (at least 16, tl.dot's minimum)."""
    return max(MIN_DOT, triton.next_power_of_2(max(n, 1)))


def value_block(dv: int, d: int, device: torch.device, override: int | None = None, widest: int = 64) -> int:
    """Width of a value tile. Under the interpreter one tile takes all of Dv (fewer programs run
    faster in numpy); on a GPU ``widest`` columns (64; 32 for the reverse state pass, whose float32
    tiles spilled registers at 64), and 32 when the [D, BV] fp32 state tile would be 256 x 64.
    ``override`` (a power of two >= 16) forces a width: tests use it to split Dv under the interpreter."""
    if override is not None:
        return override
    full = dim_block(dv)
    if device.type != "cuda":
        return full
    return min(32 if d > 128 else widest, full)


def key_block(d: int, device: torch.device, override: int | None = None, widest: int = 64) -> int:
    """Width of a key tile, for the kernels that walk the head dimension ``D`` in tiles (the dq/dk and
    WY backward kernels). On a GPU at most ``widest`` (64) columns: holding all of ``D = 128`` in
    ``[CHUNK, D]`` float32 tiles made ptxas spill registers (``scripts/kernel_resources.py`` counts
    them). Under the interpreter all of ``D`` (fewer, larger numpy operations). ``override`` as in
    :func:`value_block`."""
    if override is not None:
        return override
    full = dim_block(d)
    return full if device.type != "cuda" else min(widest, full)


def warps(*tile_sides: int) -> int:
    """4 warps for small tiles, 8 once the largest product of tile sides reaches 128 x 64."""
    size = 1
    for s in tile_sides:
        size *= s
    return 8 if size >= 128 * 64 else 4


def precisions(dtype: torch.dtype) -> tuple[str, str]:
    """``(input_precision, fp32_precision)`` for tl.dot.

    ``input_precision`` is for products of two loaded inputs (Q K^T, K K^T): exact fp32 ("ieee") for
    fp32 inputs; for half inputs it is unused (half x half runs on tensor cores, fp32 accumulation).
    ``fp32_precision`` is for products with an operand computed in float32 (the state, the score tile,
    the triangular inverse): "ieee" for fp32 inputs, "tf32" for half inputs -- never a cast of the
    state or the scores to float16, whose range (65504) a long sequence's state exceeds.
    """
    exact = dtype == torch.float32
    return ("ieee" if exact else "tf32"), ("ieee" if exact else "tf32")


def num_chunks(T: int, chunk: int) -> int:
    return triton.cdiv(T, chunk)


def check_chunk(chunk_size: int) -> None:
    if chunk_size < 16 or chunk_size > 128 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two in [16, 128] for the kernel; got {chunk_size}")


def kernel_chunk(chunk_size: int, D: int) -> int:
    """The chunk the kernels actually use: ``chunk_size``, capped at 64 rows (32 when D > 128).

    The answer does not depend on the chunk (every chunk size computes the same recurrence), but the
    kernels hold several ``[CHUNK, BLOCK]`` and ``[CHUNK, CHUNK]`` float32 tiles at once: when the
    dq/dk and WY backward kernels held all of ``D``, compiled for sm_90 they needed 131-197 KB of
    shared memory at chunk 64 and D 128 (one pipeline stage), but 262-786 KB at chunk 64 / D 256 or
    chunk 128, beyond the H100's 227 KB (they now walk ``D`` in key tiles: ``scripts/kernel_resources.py``
    reports today's figures). The forward and the backward must use the same chunk (the backward reads
    the forward's per-chunk inverses), so both call this.
    """
    return min(chunk_size, 64, max(MIN_DOT, 64 * 128 // dim_block(D)))


def check_dims(D: int, Dv: int) -> None:
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernel supports D and Dv up to {MAX_HEAD_DIM}; got D={D}, Dv={Dv} "
                         "(use backend='torch')")


def stages(device: torch.device) -> int:
    return 2 if device.type == "cuda" else 1
