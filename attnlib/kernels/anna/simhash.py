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


@triton.jit
def _simhash_codes_kernel(X, A, CODE,
                          stride_xb, stride_xh, stride_xt, stride_xd,
                          stride_al, stride_ad, stride_az,
                          stride_cb, stride_ch, stride_cl, stride_ct,
                          H, T, D, Z,
                          BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Z: tl.constexpr):
    pid_t = tl.program_id(0)
    table = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = pid_bh // H
    h = pid_bh % H
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    offs_z = tl.arange(0, BLOCK_Z)
    tmask, dmask, zmask = offs_t < T, offs_d < D, offs_z < Z

    x = tl.load(X + b * stride_xb + h * stride_xh + offs_t[:, None] * stride_xt + offs_d[None, :] * stride_xd,
                mask=tmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)         # [BLOCK_T, BLOCK_D]
    a = tl.load(A + table * stride_al + offs_d[:, None] * stride_ad + offs_z[None, :] * stride_az,
                mask=dmask[:, None] & zmask[None, :], other=0.0)                       # [BLOCK_D, BLOCK_Z]
    p = tl.dot(x, a, input_precision="ieee")                                            # projections
    bits = ((p > 0) & zmask[None, :]).to(tl.int64)
    code = tl.sum(bits << offs_z[None, :].to(tl.int64), axis=1)                         # [BLOCK_T]
    tl.store(CODE + b * stride_cb + h * stride_ch + table * stride_cl + offs_t * stride_ct, code, mask=tmask)


def simhash_codes(x: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    """Bucket keys of ``x [B, H, T, D]`` under ``planes [l, D, z]``: int64 ``[B, H, l, T]``."""
    B, H, T, D = x.shape
    n_tables, _, Z = planes.shape
    a = planes.to(device=x.device, dtype=torch.float32).contiguous()
    code = torch.empty(B, H, n_tables, T, dtype=torch.int64, device=x.device)
    if code.numel() == 0:
        return code
    BLOCK_T = 16 if x.device.type != "cuda" else 64
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_Z = max(16, triton.next_power_of_2(Z))
    grid = (triton.cdiv(T, BLOCK_T), n_tables, B * H)
    _simhash_codes_kernel[grid](x, a, code, *x.stride(), *a.stride(), *code.stride(), H, T, D, Z,
                                BLOCK_T=BLOCK_T, BLOCK_D=BLOCK_D, BLOCK_Z=BLOCK_Z)
    return code
