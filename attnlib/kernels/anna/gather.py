"""ANNA's output in Triton: each query gathers its buckets' value sums from every table.

What it computes, given per (batch, head, table) the segmented scan ``S [Tk, Dv]`` of the values in
bucket-sorted order (``scan.anna_segmented_scan``: ``S[p]`` sums ``p``'s bucket from its start to ``p``)
and each query's segment ``[lo, hi)`` of that order:

    o_i = sum_{t: hi_ti > lo_ti} S_t[hi_ti - 1]  /  max(1, sum_t (hi_ti - lo_ti))

(a query with no collision, ``hi = lo`` in every table, gets 0). ``S_t[hi - 1]`` is the sum of the
segment ``[lo, hi)`` because ``lo`` is a bucket start: one entry read per table, nothing subtracted.
The same kernel serves the causal form: there ``hi`` stops at the query's own time inside its bucket.

Tiling. The grid is ``(cdiv(Tq, BLOCK_T), B * H)``: one program owns ``BLOCK_T`` queries of one
(batch, head) and all ``Dv`` value columns (``BLOCK_DV``, padded to a power of two). It loops over the
tables; per table it loads the ``BLOCK_T`` pairs ``(lo, hi)``, gathers the row ``S[hi - 1]`` of each
query that collides in that table (``[BLOCK_T, BLOCK_DV]``, a scattered read of whole rows; the others
load nothing, masked to 0) and adds it to a float32 accumulator in registers, the counts to a second
one. After the last table it divides and writes the tile once, in the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import launch

# The row tile, warps and stages on a GPU: spill-free on sm_80, sm_89 and sm_90 at Dv = 64 to 256
# (scripts/kernel_resources.py); 64 rows on 4 warps spilled 16 B on sm_90 at Dv = 256.
GATHER_CONFIG = triton.Config({"BLOCK_T": 32}, num_warps=8, num_stages=3)


@triton.jit
def _anna_gather_kernel(S, LO, HI, O,
                        stride_sb, stride_sh, stride_sl, stride_st, stride_sv,
                        stride_ib, stride_ih, stride_il, stride_it,
                        stride_ob, stride_oh, stride_ot, stride_ov,
                        H, T, DV, N_TABLES,
                        BLOCK_T: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_v = tl.arange(0, BLOCK_DV)
    tmask, vmask = offs_t < T, offs_v < DV

    acc = tl.zeros([BLOCK_T, BLOCK_DV], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
    for table in range(0, N_TABLES):
        i_base = b * stride_ib + h * stride_ih + table * stride_il + offs_t * stride_it
        lo = tl.load(LO + i_base, mask=tmask, other=0)
        hi = tl.load(HI + i_base, mask=tmask, other=0)
        hit = tmask & (hi > lo)
        s_base = S + b * stride_sb + h * stride_sh + table * stride_sl + offs_v[None, :] * stride_sv
        acc += tl.load(s_base + (hi - 1)[:, None] * stride_st, mask=hit[:, None] & vmask[None, :], other=0.0)
        cnt += (hi - lo).to(tl.float32)
    o = acc / tl.maximum(cnt, 1.0)[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_t[:, None] * stride_ot + offs_v[None, :] * stride_ov,
             o.to(O.dtype.element_ty), mask=tmask[:, None] & vmask[None, :])


def anna_gather(scan: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``scan [B, H, l, Tk, Dv]`` float32, ``lo, hi [B, H, l, Tq]`` int64 -> ``o [B, H, Tq, Dv]``."""
    B, H, n_tables, _, Dv = scan.shape
    Tq = lo.shape[-1]
    o = torch.empty(B, H, Tq, Dv, dtype=out_dtype, device=scan.device)
    if o.numel() == 0:
        return o
    launch.require_launchable(scan, Dv)
    lo, hi = lo.contiguous(), hi.contiguous()
    tiles = launch.choose([GATHER_CONFIG], {}, scan.device, interpret=dict(BLOCK_T=launch.MIN_DOT))
    BLOCK_DV = launch.head_block(Dv)                 # every value column in one program
    grid = (triton.cdiv(Tq, tiles["BLOCK_T"]), B * H)
    _anna_gather_kernel[grid](scan, lo, hi, o, *scan.stride(), *lo.stride(), *o.stride(),
                              H, Tq, Dv, n_tables, BLOCK_DV=BLOCK_DV, **tiles)
    return o
