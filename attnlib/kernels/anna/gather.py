"""ANNA's output in Triton: each query gathers its buckets' value sums from every table.

What it computes, given per (batch, head, table) the prefix sums ``P [Tk + 1, Dv]`` of the values in
bucket-sorted order and each query's segment ``[lo, hi)`` of that order:

    o_i = sum_t (P_t[hi_ti] - P_t[lo_ti])  /  max(1, sum_t (hi_ti - lo_ti))

(a query with no collision, ``hi = lo`` in every table, gets 0). The same kernel serves the causal
form: there ``hi`` stops at the query's own time inside its bucket.

Tiling. The grid is ``(cdiv(Tq, BLOCK_T), B * H)``: one program owns ``BLOCK_T`` queries of one
(batch, head) and all ``Dv`` value columns (``BLOCK_V``, padded to a power of two). It loops over the
tables; per table it loads the ``BLOCK_T`` pairs ``(lo, hi)``, gathers the two rows of ``P`` each query
points at (``[BLOCK_T, BLOCK_V]`` each, a scattered read of whole rows) and adds their difference to a
float32 accumulator in registers, the counts to a second one. After the last table it divides and
writes the tile once, in the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _anna_gather_kernel(P, LO, HI, O,
                        stride_pb, stride_ph, stride_pl, stride_pt, stride_pv,
                        stride_sb, stride_sh, stride_sl, stride_st,
                        stride_ob, stride_oh, stride_ot, stride_ov,
                        H, T, DV, N_TABLES,
                        BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_v = tl.arange(0, BLOCK_V)
    tmask, vmask = offs_t < T, offs_v < DV
    m2 = tmask[:, None] & vmask[None, :]

    acc = tl.zeros([BLOCK_T, BLOCK_V], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
    for table in range(0, N_TABLES):
        s_base = b * stride_sb + h * stride_sh + table * stride_sl + offs_t * stride_st
        lo = tl.load(LO + s_base, mask=tmask, other=0)
        hi = tl.load(HI + s_base, mask=tmask, other=0)
        p_base = P + b * stride_pb + h * stride_ph + table * stride_pl + offs_v[None, :] * stride_pv
        p_hi = tl.load(p_base + hi[:, None] * stride_pt, mask=m2, other=0.0)
        p_lo = tl.load(p_base + lo[:, None] * stride_pt, mask=m2, other=0.0)
        acc += p_hi - p_lo
        cnt += (hi - lo).to(tl.float32)
    o = acc / tl.maximum(cnt, 1.0)[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_t[:, None] * stride_ot + offs_v[None, :] * stride_ov,
             o.to(O.dtype.element_ty), mask=m2)


def anna_gather(prefix: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``prefix [B, H, l, Tk + 1, Dv]`` float32, ``lo, hi [B, H, l, Tq]`` int64 -> ``o [B, H, Tq, Dv]``."""
    B, H, n_tables, _, Dv = prefix.shape
    Tq = lo.shape[-1]
    o = torch.empty(B, H, Tq, Dv, dtype=out_dtype, device=prefix.device)
    if o.numel() == 0:
        return o
    BLOCK_T = 16 if prefix.device.type != "cuda" else 64
    BLOCK_V = max(16, triton.next_power_of_2(Dv))
    grid = (triton.cdiv(Tq, BLOCK_T), B * H)
    _anna_gather_kernel[grid](prefix, lo, hi, o, *prefix.stride(), *lo.stride(), *o.stride(),
                              H, Tq, Dv, n_tables, BLOCK_T=BLOCK_T, BLOCK_V=BLOCK_V)
    return o
