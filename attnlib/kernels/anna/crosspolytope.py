"""Cross-polytope bucket keys in Triton: per hash, one matrix product and an arg-max over ±coordinates.

What it computes: for rows ``x [B, H, T, D]`` and the Gaussian matrices ``G_{t,c} [D, D]`` of table ``t``,

    h_c(x) = argmax over the 2D signed coordinates of [x G_{t,c}, -x G_{t,c}]      (in [0, 2D))
    code[b, h, t, i] = sum_{c < z} h_c(x_i) * (2D)^c                                (int64)

Tiling. The grid is ``(cdiv(T, BLOCK_T), n_tables, B * H)``: one program owns ``BLOCK_T`` rows of one
(batch, head) and one table. The row tile ``[BLOCK_T, BLOCK_D]`` is loaded once (``BLOCK_D`` covers all
of ``D``, padded to a power of two >= 16 with masked zero loads); the program then walks the table's
``z`` hashes, and each hash's matrix ``BLOCK_E`` columns at a time: one ``[BLOCK_D, BLOCK_E]`` load, one
``tl.dot`` in exact float32 (``input_precision="ieee"``, so the arg-max sees the same projections as the
reference; the sum over ``D`` is the same whatever the column blocks), the padded columns masked to
``-inf``, and a running arg-max of the positive and of the negated projections. The
digit ``h_c`` is added to the key in registers; one int64 store per row at the end. The op sends ``D > 128`` to
the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import CROSSPOLYTOPE_MAX_HEAD_DIM
from .rows import hash_launch, hash_rows, store_codes

# The row tile, warps and stages on a GPU, and the projection columns per product (BLOCK_E): spill-free on
# sm_80, sm_89 and sm_90 at D = 64 and 128 (scripts/kernel_resources.py). The whole [D, D] matrix per
# product spilled on every target: 8-27 KB per thread at D = 64 with the hashes unrolled, 7-12 KB at
# D = 128 without; 32 columns, 4-12 B at D = 128.
CROSSPOLYTOPE_CONFIG = triton.Config({"BLOCK_T": 32}, num_warps=4, num_stages=3)
COLUMN_BLOCK = 16


@triton.jit
def _crosspolytope_codes_kernel(X, G, CODE,
                                stride_xb, stride_xh, stride_xt, stride_xd,
                                stride_gl, stride_gz, stride_gd, stride_ge,
                                stride_cb, stride_ch, stride_cl, stride_ct,
                                H, T, D,
                                Z: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                                BLOCK_E: tl.constexpr):
    b, h, table, offs_t, offs_d, x = hash_rows(X, stride_xb, stride_xh, stride_xt, stride_xd, H, T, D,
                                               BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D)        # x: [BLOCK_T, BLOCK_D]
    dmask = offs_d < D
    code = tl.zeros([BLOCK_T], dtype=tl.int64)
    place = tl.zeros([BLOCK_T], dtype=tl.int64) + 1          # (2D)^c in int64: it passes 2^31 for large z
    for c in range(Z):
        # The projections BLOCK_E columns at a time, with a running arg-max of each half (a whole [D, D]
        # float32 tile and its [BLOCK_T, D] product spilled: COLUMN_BLOCK's comment).
        best_pos = tl.full([BLOCK_T], float("-inf"), tl.float32)
        best_neg = tl.full([BLOCK_T], float("-inf"), tl.float32)
        i_pos = tl.zeros([BLOCK_T], dtype=tl.int32)
        i_neg = tl.zeros([BLOCK_T], dtype=tl.int32)
        for e0 in range(0, D, BLOCK_E):                      # no block past D: padding alone never wins
            offs_e = e0 + tl.arange(0, BLOCK_E)
            emask = offs_e < D
            g = tl.load(G + table * stride_gl + c * stride_gz + offs_d[:, None] * stride_gd
                        + offs_e[None, :] * stride_ge, mask=dmask[:, None] & emask[None, :], other=0.0)
            p = tl.dot(x, g, input_precision="ieee")                                    # [BLOCK_T, BLOCK_E]
            # padded columns and NaN projections (a row with a NaN: its key is replaced by the caller) never
            # win; a NaN left in would make a whole block NaN, which the interpreter's arg-max refuses
            keep = emask[None, :] & (p == p)
            pos = tl.where(keep, p, float("-inf"))
            neg = tl.where(keep, -p, float("-inf"))
            m_pos, m_neg = tl.max(pos, axis=1), tl.max(neg, axis=1)
            # a later block wins only when strictly larger: the first index among equals, as torch's argmax
            i_pos = tl.where(m_pos > best_pos, e0 + tl.argmax(pos, axis=1), i_pos)
            i_neg = tl.where(m_neg > best_neg, e0 + tl.argmax(neg, axis=1), i_neg)
            best_pos, best_neg = tl.maximum(best_pos, m_pos), tl.maximum(best_neg, m_neg)
        # ties between +p_a and -p_b go to the positive half, as torch's first-index argmax over [p, -p]
        digit = tl.where(best_pos >= best_neg, i_pos, D + i_neg).to(tl.int64)
        code += digit * place
        place = place * 2 * D
    store_codes(CODE, code, b, h, table, offs_t, stride_cb, stride_ch, stride_cl, stride_ct, T)


def crosspolytope_codes(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Bucket keys of ``x [B, H, T, D]`` under ``rotations [l, z, D, D]``: int64 ``[B, H, l, T]``."""
    _, H, T, D = x.shape
    n_tables, Z = rotations.shape[:2]
    code, tiles, BLOCK_D, grid = hash_launch(x, n_tables, CROSSPOLYTOPE_CONFIG, max_dim=CROSSPOLYTOPE_MAX_HEAD_DIM)
    if code.numel() == 0:
        return code
    g = rotations.to(device=x.device, dtype=torch.float32).contiguous()
    _crosspolytope_codes_kernel[grid](x, g, code, *x.stride(), *g.stride(), *code.stride(), H, T, D,
                                      Z=Z, BLOCK_D=BLOCK_D, BLOCK_E=min(BLOCK_D, COLUMN_BLOCK), **tiles)
    return code
