"""ANNA's bucket sums in Triton: a segmented scan of the values in each table's bucket-sorted order.

What it computes, per (batch, head, table), given the sort ``perm [Tk]`` of the keys by bucket and
``start [Tk]`` (the sorted position where each sorted key's bucket begins):

    S[p] = sum_{start[p] <= r <= p} v[perm[r]]                        (float32, [Tk, Dv])

a running sum restarted at every bucket start. A query whose segment of the sorted order is
``[lo, hi)`` reads its bucket's sum (causal: of the bucket's keys up to its time) at ``S[hi - 1]``
(``gather.anna_gather``): one entry, no difference of two running sums, so a value reaches only the
queries that share its bucket, and a NaN, inf or huge value in one bucket leaves the others' bits alone.

Tiling. The grid is ``(cdiv(Dv, BLOCK_DV), B * H * l)``: one program owns one (batch, head, table) and
``BLOCK_DV`` value columns, and walks the sorted order in tiles of ``BLOCK_T`` rows. Per tile it gathers
the rows ``v[perm]`` (a scattered read of whole rows), scans them with ``tl.associative_scan`` under
the segmented-sum operator ``(a, fa) + (b, fb) = (b if fb else a + b, fa | fb)`` (``fb``: a bucket
starts at ``b``), adds the carry -- the running sum of the bucket still open at the tile's first row --
to the rows whose bucket began before the tile (selected with ``tl.where``, never multiplied by a 0
mask), and stores the tile. The carry is the tile's last row. Memory ``O(l Tk Dv)``, one pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import launch


@triton.jit
def _segmented_sum(a, a_starts, b, b_starts):
    """The segmented-sum operator: a bucket start in the right operand discards the left one. The flags
    are int32 0/1 (not int1) so that the scan carries a plain integer next to the values."""
    return tl.where(b_starts != 0, b, a + b), a_starts | b_starts


@triton.jit
def _anna_segmented_scan_kernel(V, PERM, START, S,
                                stride_vb, stride_vh, stride_vt, stride_vv,
                                stride_pb, stride_ph, stride_pl, stride_pt,
                                stride_sb, stride_sh, stride_sl, stride_st, stride_sv,
                                H, L, T, DV,
                                BLOCK_T: tl.constexpr, BLOCK_DV: tl.constexpr):
    pid_v = tl.program_id(0)
    pid = tl.program_id(1)                                   # (b * H + h) * L + table
    table = pid % L
    b = pid // L // H
    h = pid // L % H
    offs_v = pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)
    vmask = offs_v < DV
    idx_base = b * stride_pb + h * stride_ph + table * stride_pl
    v_base = V + b * stride_vb + h * stride_vh + offs_v[None, :] * stride_vv
    s_base = S + b * stride_sb + h * stride_sh + table * stride_sl + offs_v[None, :] * stride_sv

    carry = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for t0 in range(0, T, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < T
        m2 = tmask[:, None] & vmask[None, :]
        perm = tl.load(PERM + idx_base + offs_t * stride_pt, mask=tmask, other=0)
        start = tl.load(START + idx_base + offs_t * stride_pt, mask=tmask, other=0)
        x = tl.load(v_base + perm[:, None] * stride_vt, mask=m2, other=0.0).to(tl.float32)
        starts = tl.broadcast_to((start == offs_t).to(tl.int32)[:, None], (BLOCK_T, BLOCK_DV))
        y, _ = tl.associative_scan((x, starts), 0, _segmented_sum)
        y = tl.where((start < t0)[:, None], y + carry[None, :], y)   # continues the bucket open at t0
        tl.store(s_base + offs_t[:, None] * stride_st, y, mask=m2)
        is_last = (offs_t == t0 + BLOCK_T - 1)[:, None]
        carry = tl.sum(tl.where(is_last, y, 0.0), axis=0)


def anna_segmented_scan(v: torch.Tensor, perm: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """``v [B, H, Tk, Dv]``, ``perm, start [B, H, l, Tk]`` int64 -> ``S [B, H, l, Tk, Dv]`` float32."""
    B, H, n_tables, Tk = perm.shape
    Dv = v.shape[-1]
    S = torch.empty(B, H, n_tables, Tk, Dv, dtype=torch.float32, device=v.device)
    if S.numel() == 0:
        return S
    launch.require_launchable(v, Dv)
    perm, start = perm.contiguous(), start.contiguous()
    BLOCK_T = launch.choose([triton.Config({"BLOCK_T": 128})], {}, v.device,
                            interpret=dict(BLOCK_T=launch.MIN_DOT))["BLOCK_T"]
    BLOCK_DV = min(64, launch.head_block(Dv))
    grid = (triton.cdiv(Dv, BLOCK_DV), B * H * n_tables)
    _anna_segmented_scan_kernel[grid](v, perm, start, S, *v.stride(), *perm.stride(), *S.stride(),
                                      H, n_tables, Tk, Dv, BLOCK_T=BLOCK_T, BLOCK_DV=BLOCK_DV)
    return S
