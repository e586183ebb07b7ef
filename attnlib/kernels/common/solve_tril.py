"""``(I + A)^{-1}`` of a chunk's strictly lower-triangular ``A``, in registers, inside the kernel that
formed ``A`` (``../delta/wy.py``): the matrix never goes to memory.

``A`` is a ``[C, C]`` float32 tile (``C`` = 16, 32 or 64). Two steps, both on the whole tile:

1. **Diagonal blocks, by forward substitution.** The tile is viewed as ``[C/16, 16, C/16, 16]`` and its
   ``C/16`` diagonal 16 x 16 blocks ``N_b`` are taken out as one ``[C/16, 16, 16]`` tensor. Their
   inverses ``L_b = (I + N_b)^{-1}`` are built row by row, all blocks at once,

       L_b[i, :] = e_i - sum_{j < i} N_b[i, j] L_b[j, :],          i = 1 .. 15,

   in float32 vector arithmetic (exact to rounding: the inverse feeds every later product of the
   chunk), then placed back on the diagonal of a ``[C, C]`` tile ``X``, zero elsewhere.
2. **Merging neighbours, by matrix products.** If ``X`` holds the inverses of the diagonal blocks of
   side ``s``, then with ``A_s`` = the part of ``A`` in the lower-left ``s`` x ``s`` block of each
   ``2s`` x ``2s`` diagonal block,

       X <- X - X A_s X          since  [[L11, 0], [L21, L22]]^{-1} = [[X11, 0], [-X22 L21 X11, X22]],

   and ``X`` holds the inverses of the ``2s`` blocks. ``log2(C / 16)`` levels (one at ``C = 32``, two at
   64), each two ``C x C x C`` products on the tensor cores, operands in ``DT`` (``precision.py``).

All the work above the 16 x 16 blocks is matrix products, as in fla's ``solve_tril``; here it stays in
the registers of the program that owns the chunk.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .precision import dot


@triton.jit
def tril_inverse(a, C: tl.constexpr, DT: tl.constexpr):
    """``(I + a)^{-1}`` for a strictly lower-triangular float32 ``[C, C]`` tile ``a``; float32 result.
    ``a`` must be finite: the merging products multiply it by the zeros of ``x``, and a NaN in row ``j``
    would reach the rows before ``j`` (the WY kernels pass the inputs' finite part: ``../delta/wy.py``)."""
    DIAG: tl.constexpr = 16             # the forward-substituted block: tl.dot's smallest tile side
    tl.static_assert(C % 16 == 0, "the chunk must be a multiple of 16")
    NB: tl.constexpr = C // DIAG
    blk = tl.arange(0, NB)
    r16 = tl.arange(0, DIAG)
    same = blk[:, None] == blk[None, :]
    # 1. The diagonal blocks N_b = a[b*16:(b+1)*16, b*16:(b+1)*16], as [NB, 16, 16], inverted together.
    n = tl.sum(tl.where(same[:, None, :, None], tl.reshape(a, (NB, DIAG, NB, DIAG)), 0.0), axis=2)
    li = tl.broadcast_to(tl.where(r16[:, None] == r16[None, :], 1.0, 0.0)[None, :, :], (NB, DIAG, DIAG))
    for i in tl.static_range(1, DIAG):
        n_i = tl.sum(tl.where((r16 == i)[None, :, None], n, 0.0), axis=1)            # row i of every block
        n_i = tl.where((r16 < i)[None, :], n_i, 0.0)
        row = tl.where((r16 == i)[None, :], 1.0, 0.0) - tl.sum(n_i[:, :, None] * li, axis=1)
        li = tl.where((r16 == i)[None, :, None], row[:, None, :], li)
    x = tl.reshape(tl.where(same[:, None, :, None], li[:, :, None, :], 0.0), (C, C))
    # 2. Merge neighbouring blocks: side 16 -> 32 -> ... -> C.
    r = tl.arange(0, C)
    for level in tl.static_range(0, 3):
        if (DIAG << level) < C:
            pair_r, pair_c = r[:, None] // (2 * DIAG << level), r[None, :] // (2 * DIAG << level)
            lower_left = ((pair_r == pair_c) & ((r[:, None] // (DIAG << level)) % 2 == 1)
                          & ((r[None, :] // (DIAG << level)) % 2 == 0))
            x = x - dot(dot(x, tl.where(lower_left, a, 0.0), DT), x, DT)
    return x


__all__ = ["tril_inverse"]
