"""The inverse of every chunk's unit-lower-triangular matrix ``I + A`` (``A`` strictly lower), by blocks.

``A: [B, H, T, CHUNK]`` holds, for each chunk, its ``CHUNK x CHUNK`` strictly-lower matrix row by row
(row ``t`` of the sequence, column ``j`` inside its chunk). The result ``Ai`` has the same layout and
holds ``(I + A)^{-1}`` for each chunk, in float32.

Two kernels, both parallel over (row blocks x B * H):

1. ``_diag16_kernel``, grid ``(cdiv(T, 16), B * H)``: one program inverts one 16 x 16 diagonal block
   ``L = I + N`` in registers by forward substitution on its 16 rows,
   ``Li[i, :] = e_i - sum_{j<i} N[i, j] Li[j, :]`` (a 16-wide vector update per row).
2. ``_merge_kernel``, grid ``(cdiv(T, 2 S), B * H)``, launched for ``S = 16, 32, ..., CHUNK / 2``:
   one program takes two neighbouring diagonal blocks of side ``S`` whose inverses ``X11, X22`` the
   previous level wrote, and fills in the off-diagonal block of their ``2S x 2S`` inverse,

       [[L11, 0], [L21, L22]]^{-1} = [[X11, 0], [-X22 L21 X11, X22]],

   with two ``S x S`` matrix products (``L21`` is read from ``A``). After ``log2(CHUNK / 16)``
   levels the whole chunk is inverted; all the work above the 16 x 16 blocks is matmuls.

The products run in exact float32 ("ieee"): the inverse feeds every later step of the chunk.
Rows past ``T`` load as zero and are not stored; blocks above the diagonal stay zero (``Ai`` is
allocated zeroed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DIAG_SIZE = 16
DIAG = tl.constexpr(DIAG_SIZE)                  # a constexpr global: compiled kernels accept no other


@triton.jit
def _diag16_kernel(A, Ai, T, CHUNK: tl.constexpr):
    blk = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    r = tl.arange(0, DIAG)
    rows = blk * DIAG + r
    col0 = (blk * DIAG) % CHUNK                                    # the block's first column in its chunk
    rmask = rows < T
    offs = (bh * T + rows[:, None]) * CHUNK + col0 + r[None, :]
    n = tl.load(A + offs, mask=rmask[:, None], other=0.0).to(tl.float32)
    n = tl.where(r[:, None] > r[None, :], n, 0.0)                  # strictly lower part only
    li = tl.where(r[:, None] == r[None, :], 1.0, 0.0)              # row 0 of the inverse is e_0
    for i in range(1, DIAG):
        n_i = tl.sum(tl.where(r[:, None] == i, n, 0.0), axis=0)    # N[i, :] (zero for j >= i)
        row_i = tl.where(r == i, 1.0, 0.0) - tl.sum(n_i[:, None] * li, axis=0)
        li = tl.where(r[:, None] == i, row_i[None, :], li)
    tl.store(Ai + offs, li, mask=rmask[:, None])


@triton.jit
def _merge_kernel(A, Ai, T, CHUNK: tl.constexpr, S: tl.constexpr):
    pair = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    r = tl.arange(0, S)
    top = pair * 2 * S + r                                         # rows of the upper block
    bot = top + S                                                  # rows of the lower block
    col0 = (pair * 2 * S) % CHUNK
    tmask, bmask = top < T, bot < T
    x11 = tl.load(Ai + (bh * T + top[:, None]) * CHUNK + col0 + r[None, :], mask=tmask[:, None], other=0.0)
    x22 = tl.load(Ai + (bh * T + bot[:, None]) * CHUNK + col0 + S + r[None, :], mask=bmask[:, None], other=0.0)
    l21 = tl.load(A + (bh * T + bot[:, None]) * CHUNK + col0 + r[None, :], mask=bmask[:, None], other=0.0)
    x21 = -tl.dot(x22, tl.dot(l21.to(tl.float32), x11, input_precision="ieee"), input_precision="ieee")
    tl.store(Ai + (bh * T + bot[:, None]) * CHUNK + col0 + r[None, :], x21, mask=bmask[:, None])


def solve_tril(A: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``A: [B, H, T, CHUNK]`` strictly lower per chunk -> ``(I + A)^{-1}`` per chunk, float32, same layout."""
    B, H, T, C = A.shape
    assert C == chunk_size and C >= DIAG_SIZE and C & (C - 1) == 0, (C, chunk_size)
    Ai = torch.zeros(B, H, T, C, device=A.device, dtype=torch.float32)
    if Ai.numel() == 0:
        return Ai
    A = A.contiguous()
    _diag16_kernel[(triton.cdiv(T, DIAG_SIZE), B * H)](A, Ai, T, CHUNK=C)
    s = DIAG_SIZE
    while s < C:
        _merge_kernel[(triton.cdiv(T, 2 * s), B * H)](A, Ai, T, CHUNK=C, S=s)
        s *= 2
    return Ai
