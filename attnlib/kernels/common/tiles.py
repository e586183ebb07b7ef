"""Tile I/O shared by the kernels that flatten ``(batch, head)`` into one grid axis and address their
tensors by strides (flash, block-sparse, ANNA).

Not a kernel: ``@triton.jit`` helpers, inlined into their callers by Triton. :func:`split_bh` recovers
``(b, h)`` from the flattened program index (:func:`program_tile`: with the offsets of the program's
tiles); :func:`load_tile` and :func:`store_tile` move one
``[len(offs_r), len(offs_c)]`` tile between memory and registers with the bounds masks written once --
for the tiles a program loads once and keeps (q; k, v) and the results it writes once at the end.
Tiles streamed inside a loop use ``online_softmax.load_rows``/``load_key_tile`` instead, which rebuild
their pointers from a scalar base on every iteration.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def split_bh(pid_bh, H):
    """``(batch, head)`` of a program that owns one flattened ``b * H + h`` grid index."""
    return pid_bh // H, pid_bh % H


@triton.jit
def program_tile(H, BLOCK_OWN: tl.constexpr, BLOCK_WALK: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DV: tl.constexpr):
    """Where a program of a ``(cdiv(T, BLOCK_OWN), B * H)`` grid stands: ``(pid_bh, b, h, start, offs_own,
    offs_walk, offs_d, offs_dv)`` -- its flattened and split (batch, head), the first of the ``BLOCK_OWN``
    rows it owns and their offsets, the in-tile offsets of the ``BLOCK_WALK`` rows it streams past them,
    and the head-dim offsets of q/k and of v."""
    pid_bh = tl.program_id(1)
    start = tl.program_id(0) * BLOCK_OWN
    return (pid_bh, pid_bh // H, pid_bh % H, start, start + tl.arange(0, BLOCK_OWN), tl.arange(0, BLOCK_WALK),
            tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV))


@triton.jit
def load_tile(base, offs_r, offs_c, stride_r, stride_c, R, C):
    """The ``[len(offs_r), len(offs_c)]`` tile at ``base``, zeros past ``R`` rows and ``C`` columns: the
    tiles a program loads once and keeps (q in the forward and dQ programs, k and v in dK/dV)."""
    ptrs = base + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c
    return tl.load(ptrs, mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0)


@triton.jit
def store_tile(base, x, offs_r, offs_c, stride_r, stride_c, R, C):
    """Store ``x`` (cast to ``base``'s element type) at the tile :func:`load_tile` reads."""
    ptrs = base + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=(offs_r[:, None] < R) & (offs_c[None, :] < C))


__all__ = ["load_tile", "program_tile", "split_bh", "store_tile"]
