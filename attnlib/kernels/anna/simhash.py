"""SimHash bucket keys in Triton: one matrix product and a bit-pack per tile.

What it computes: for rows ``x [B, H, T, D]`` and the hyperplanes of table ``t``, ``A_t [D, z]``,

    code[b, h, t, i] = sum_{c < z} [ (x_i . A_t[:, c]) > 0 ] * 2^c        (int64)

Tiling. The grid is ``(cdiv(T, BLOCK_T), n_tables, B * H)``: one program owns ``BLOCK_T`` rows of one
(batch, head) and one table. It loads the row tile ``[BLOCK_T, BLOCK_D]`` (``BLOCK_D`` covers all of
``D``, padded to a power of two >= 16 with masked zero loads) and the table's hyperplanes
``[BLOCK_D, BLOCK_Z]`` (``BLOCK_Z >= 16`` for ``tl.dot``; padded columns load as zero and are masked
out of the key), does one ``tl.dot`` in float32 with ``input_precision="ieee"`` (tf32 would round the
projections and flip the signs of near-orthogonal pairs, so the kernel's buckets would differ from
the reference's), compares with zero, shifts each bit to its place and sums along the row: the key
never leaves registers until the single int64 store per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .rows import hash_launch, hash_rows, store_codes

# The row tile, warps and stages on a GPU: spill-free on sm_80, sm_89 and sm_90 at D = 64 to 256
# (scripts/kernel_resources.py); 64 rows on 4 warps spilled 3-6 KB on sm_80 at D >= 128.
SIMHASH_CONFIG = triton.Config({"BLOCK_T": 32}, num_warps=8, num_stages=3)


@triton.jit
def _simhash_codes_kernel(X, A, CODE,
                          stride_xb, stride_xh, stride_xt, stride_xd,
                          stride_al, stride_ad, stride_az,
                          stride_cb, stride_ch, stride_cl, stride_ct,
                          H, T, D, Z,
                          BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Z: tl.constexpr):
    b, h, table, offs_t, offs_d, x = hash_rows(X, stride_xb, stride_xh, stride_xt, stride_xd, H, T, D,
                                               BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D)        # x: [BLOCK_T, BLOCK_D]
    offs_z = tl.arange(0, BLOCK_Z)
    zmask = offs_z < Z
    a = tl.load(A + table * stride_al + offs_d[:, None] * stride_ad + offs_z[None, :] * stride_az,
                mask=(offs_d < D)[:, None] & zmask[None, :], other=0.0)                # [BLOCK_D, BLOCK_Z]
    p = tl.dot(x, a, input_precision="ieee")                                            # projections
    bits = ((p > 0) & zmask[None, :]).to(tl.int64)
    code = tl.sum(bits << offs_z[None, :].to(tl.int64), axis=1)                         # [BLOCK_T]
    store_codes(CODE, code, b, h, table, offs_t, stride_cb, stride_ch, stride_cl, stride_ct, T)


def simhash_codes(x: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    """Bucket keys of ``x [B, H, T, D]`` under ``planes [l, D, z]``: int64 ``[B, H, l, T]``."""
    _, H, T, D = x.shape
    n_tables, _, Z = planes.shape
    code, tiles, BLOCK_D, grid = hash_launch(x, n_tables, SIMHASH_CONFIG)
    if code.numel() == 0:
        return code
    a = planes.to(device=x.device, dtype=torch.float32).contiguous()
    BLOCK_Z = max(16, triton.next_power_of_2(Z))
    _simhash_codes_kernel[grid](x, a, code, *x.stride(), *a.stride(), *code.stride(), H, T, D, Z,
                                BLOCK_D=BLOCK_D, BLOCK_Z=BLOCK_Z, **tiles)
    return code
