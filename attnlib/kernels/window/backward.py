"""Sliding-window attention backward in Triton: flash's FlashAttention-2 backward (two launches, the
deterministic form) over the band's tiles only (``attnlib/kernels/flash/backward.py``; the walk:
``band.py``).

``delta_i = rowsum(dO * O)_i - dlse_i`` first (``online_softmax.backward_delta``), then

* dK, dV -- grid ``(cdiv(T, BLOCK_N), B * H)``: a program owns ``BLOCK_N`` keys and walks the query
  tiles whose rows see them (rows ``j <= i < j + window``, or ``j - window < i < j + window``): the inner
  tiles with flash's unmasked loop (``dkdv_over_queries``), the edge tiles with ``dkdv_tile``'s band
  mask (``MASK_BAND``; pairs off the band get ``P = dS = 0`` by selection, and ``dS^T q`` takes q's
  finite part -- a row whose q is not finite has ``dS`` NaN on every pair it sees, so nothing is lost);
* dQ -- grid ``(cdiv(T, BLOCK_M), B * H)``: a program owns ``BLOCK_M`` queries and walks the key tiles
  of their band, as the forward: inner tiles by ``dq_over_keys``, edge tiles by ``dq_tile`` with the band
  mask and k's finite part in ``dS K``, the dQ accumulator starting NaN at the entries of exactly the
  rows whose band holds a non-finite k there (``band.seen_not_finite``).

No atomics: every dK, dV and dQ row is summed by one program in a fixed order. Loads, tiles and
autotuning as flash's backward (descriptors on sm_90 up to ``TMA_MAX_HEAD``; flash's candidates and
pruning hooks, see :data:`_DKDV_CONFIGS`; fixed small tiles under the interpreter).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import WINDOW_MAX_HEAD_DIM
from ..common import launch
from ..common import online_softmax as softmax
from ..common.online_softmax import (
    dkdv_over_queries,
    dkdv_program_init,
    dkdv_tile,
    dq_over_keys,
    dq_program_init,
    dq_tile,
    head_base,
    load_row_stats,
    load_rows,
    no_bad,
)
from ..common.precision import softmax_precision
from ..common.tiles import program_tile, store_tile
from ..flash import backward as flash_bwd
from ..flash.backward import BWD_BLOCKS, TMA_MAX_HEAD
from ..flash.forward import launch_tiles, length_bucket, spill_width
from .band import band_tiles, clamp_window, edge_tile, merged_spills, seen_not_finite, window_bucket
from .forward import same_shapes


@triton.jit
def _window_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV_OUT,
                            stride_qb, stride_qh, stride_qt, stride_qd,
                            stride_kb, stride_kh, stride_kt, stride_kd,
                            stride_vb, stride_vh, stride_vt, stride_vd,
                            stride_dob, stride_doh, stride_dot, stride_dod,
                            stride_dkb, stride_dkh, stride_dkt, stride_dkd,
                            stride_dvb, stride_dvh, stride_dvt, stride_dvd,
                            H, T, D, DV, window, qk_scale, sm_scale, T_BUCKET, W_BUCKET,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                            CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
                            TMA: tl.constexpr):
    pid_bh, b, h, start_n, offs_n, offs_mb, offs_d, offs_dv = program_tile(H, BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DV)

    k, v, dk, dv = dkdv_program_init(head_base(K, b, h, stride_kb, stride_kh, TMA),
                                     head_base(V, b, h, stride_vb, stride_vh, TMA), b, h, start_n, offs_n, offs_d,
                                     offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T, D, DV, TMA=TMA)
    Q_base = head_base(Q, b, h, stride_qb, stride_qh, TMA)
    DO_base = head_base(DO, b, h, stride_dob, stride_doh, TMA)
    lse_ptr = LSE + pid_bh * T                     # LSE and DELTA: contiguous [B, H, T] fp32
    delta_ptr = DELTA + pid_bh * T

    # Rows i that see key j: j - (window - 1 when not causal, else 0) <= i <= j + window - 1.
    lo, edge_end, full_end, hi, n_edge = band_tiles(start_n, 0 if CAUSAL else window - 1, window - 1, T, BLOCK_N,
                                                    BLOCK_M)
    # Inner query tiles: every row sees every key of the program, no mask (flash's loop).
    dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, b, h, lse_ptr, delta_ptr, None, edge_end, full_end,
                               offs_n, offs_mb, offs_d, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod, 0, 0,
                               T, T, D, DV, qk_scale, sm_scale, BLOCK_M=BLOCK_M, MASK_T=False, MASK_CAUSAL=False,
                               EVEN_D=EVEN_D, PRECISION=PRECISION, TMA=TMA, ATOMIC_DQ=False)
    # Edge query tiles, both ends: the band mask (and past T).
    for t in range(0, n_edge):
        start_m = edge_tile(t, lo, edge_end, full_end, BLOCK_M)
        offs_m = start_m + offs_mb
        q = load_rows(Q_base, b, h, start_m, offs_mb, offs_d, stride_qt, stride_qd, T, D, MASK_T=True,
                      EVEN_C=EVEN_D, TMA=TMA)
        do = load_rows(DO_base, b, h, start_m, offs_mb, offs_dv, stride_dot, stride_dod, T, DV, MASK_T=True,
                       EVEN_C=EVEN_D, TMA=TMA)
        lse2, delta = load_row_stats(lse_ptr, delta_ptr, offs_m, T, MASK_T=True)
        dk, dv, _ = dkdv_tile(dk, dv, k, v, q, do, lse2, delta, offs_m, offs_n, qk_scale, T, T, MASK_T=True,
                              MASK_CAUSAL=CAUSAL, MASK_KEYS=False, PRECISION=PRECISION, window=window,
                              MASK_BAND=True)

    store_tile(DK + b * stride_dkb + h * stride_dkh, dk * sm_scale, offs_n, offs_d, stride_dkt, stride_dkd, T, D)
    store_tile(DV_OUT + b * stride_dvb + h * stride_dvh, dv, offs_n, offs_dv, stride_dvt, stride_dvd, T, DV)


@triton.jit
def _window_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                          stride_qb, stride_qh, stride_qt, stride_qd,
                          stride_kb, stride_kh, stride_kt, stride_kd,
                          stride_vb, stride_vh, stride_vt, stride_vd,
                          stride_dob, stride_doh, stride_dot, stride_dod,
                          stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                          H, T, D, DV, window, qk_scale, sm_scale, T_BUCKET, W_BUCKET,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                          CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr):
    pid_bh, b, h, start_m, offs_m, offs_nb, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)

    K_base = head_base(K, b, h, stride_kb, stride_kh, TMA)
    V_base = head_base(V, b, h, stride_vb, stride_vh, TMA)
    # Keys j reached by row i, as in the forward.
    lo, edge_end, full_end, hi, n_edge = band_tiles(start_m, window - 1, 0 if CAUSAL else window - 1, T, BLOCK_M,
                                                    BLOCK_N)
    # dq starts NaN where a row's band holds a non-finite k that the edge tiles' dS K sets aside (before the
    # program's tiles are loaded, as in the forward).
    dq = seen_not_finite(K_base, b, h, lo, edge_end, full_end, n_edge, offs_m, offs_nb, offs_d, stride_kt, stride_kd,
                         T, D, window, BLOCK_M=BLOCK_M, BLOCK_C=BLOCK_D, BLOCK_WALK=BLOCK_N, CAUSAL=CAUSAL,
                         EVEN_C=EVEN_D, TMA=TMA)
    q, do, lse2, delta, _ = dq_program_init(head_base(Q, b, h, stride_qb, stride_qh, TMA),
                                            head_base(DO, b, h, stride_dob, stride_doh, TMA), b, h,
                                            LSE + pid_bh * T, DELTA + pid_bh * T, start_m, offs_m, offs_d, offs_dv,
                                            stride_qt, stride_qd, stride_dot, stride_dod, T, D, DV, TMA=TMA)
    dq, _ = dq_over_keys(dq, no_bad(BLOCK_D), q, do, lse2, delta, K_base, V_base, b, h, edge_end, full_end, offs_m,
                         offs_nb, offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T, D, DV, qk_scale,
                         BLOCK_N=BLOCK_N, MASK_T=False, MASK_CAUSAL=False, EVEN_D=EVEN_D, PRECISION=PRECISION,
                         TMA=TMA)
    for t in range(0, n_edge):
        start_n = edge_tile(t, lo, edge_end, full_end, BLOCK_N)
        k = load_rows(K_base, b, h, start_n, offs_nb, offs_d, stride_kt, stride_kd, T, D, MASK_T=True,
                      EVEN_C=EVEN_D, TMA=TMA)
        v = load_rows(V_base, b, h, start_n, offs_nb, offs_dv, stride_vt, stride_vd, T, DV, MASK_T=True,
                      EVEN_C=EVEN_D, TMA=TMA)
        dq = dq_tile(dq, q, do, lse2, delta, k, v, offs_m, start_n + offs_nb, qk_scale, T, MASK_T=True,
                     MASK_CAUSAL=CAUSAL, PRECISION=PRECISION, window=window, MASK_BAND=True)

    store_tile(DQ + b * stride_dqb + h * stride_dqh, dq * sm_scale, offs_m, offs_d, stride_dqt, stride_dqd, T, D)


# Flash's two-kernel candidates and shared-memory estimates, by import: the dK/dV program holds flash's
# k, v and fp32 dk, dv and streams the same q, dO tiles and row statistics, its edge step flash's
# ``dkdv_tile`` with one more mask term (``MASK_BAND``); the dQ program holds flash's q, dO, dq, its edge
# step likewise, and the pass that finds non-finite keys runs before the loop. The same tiles pass through
# shared memory. SPILLS: flash's plus the window kernels' own, measured as the forward's
# (``forward._WINDOW_FWD_SPILLS``; the kernels stop at D = 128, ``WINDOW_MAX_HEAD_DIM``, so no entry is
# for wider heads): the one-stage dK/dV tile 16 x 32 on sm_90 (4-8 B, from D = 128); at D = 128 the
# 8-warp, 2-stage 16 x 32 dK/dV tile on sm_80 (4 B) and sm_89 (8 B); in every combination of dtype,
# causality and load path at D = 64 and 128, dQ's 64 x 16 on sm_80 (4 B at 64), 32 x 16 on sm_89 (4 B at
# 128) and the one-stage 16 x 16 by descriptors on sm_90 (8 B at 64).
_WINDOW_DKDV_SPILLS = {"sm80": {(16, 32, 8, 2): 128}, "sm89": {(16, 32, 8, 2): 128}, "sm90": {(16, 32, 4, 1): 128}}
_WINDOW_DQ_SPILLS = {"sm80": {(64, 16, 4, 3): 64}, "sm89": {(32, 16, 4, 1): 128}, "sm90": {(16, 16, 4, 1): 64}}
_DKDV_CONFIGS = same_shapes(flash_bwd._DKDV_CONFIGS, BWD_BLOCKS)
_DQ_CONFIGS = same_shapes(flash_bwd._DQ_CONFIGS, BWD_BLOCKS)
_DKDV_SPILLS = merged_spills(flash_bwd._DKDV_SPILLS, _WINDOW_DKDV_SPILLS)
_DQ_SPILLS = merged_spills(flash_bwd._DQ_SPILLS, _WINDOW_DQ_SPILLS)
_prune_dkdv = launch.pruner(flash_bwd.bwd_smem("kv", "DK"), _DKDV_SPILLS, spill_width("DK"), "LSE")
_prune_dq = launch.pruner(flash_bwd.bwd_smem("q", "DQ"), _DQ_SPILLS, spill_width("DQ"), "LSE")
_KEY = ["T_BUCKET", "W_BUCKET", "D", "DV", "CAUSAL"]
_dkdv = launch.autotuned(_window_bwd_dkdv_kernel, _DKDV_CONFIGS, _KEY, _prune_dkdv, name="window.backward._dkdv")
_dq = launch.autotuned(_window_bwd_dq_kernel, _DQ_CONFIGS, _KEY, _prune_dq, name="window.backward._dq")

INTERPRET_DKDV = dict(BLOCK_M=16, BLOCK_N=16)
INTERPRET_DQ = dict(BLOCK_M=16, BLOCK_N=16)


def sliding_window_backward(q, k, v, o, lse, do, dlse, *, window: int, scale: float, causal: bool):
    """Gradients ``(dq, dk, dv)`` of :func:`sliding_window_forward`'s ``(o, lse)``, in the inputs' dtypes.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``, ``o, do: [B, H, T, Dv]``, ``lse``: the forward's float32
    ``[B, H, T]``; ``dlse``: the gradient on the returned LSE, or ``None``. Deterministic (no atomics).
    """
    B, H, T, D = q.shape
    DV = v.shape[3]
    launch.require_launchable(q, D, DV, limit=WINDOW_MAX_HEAD_DIM)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if B * H * T == 0:
        return torch.empty_like(q), dk.zero_(), dv.zero_()
    if DV == 0:
        # Only the LSE carries a gradient: one zero value column stands in for v (as in the forward).
        zero = v.new_zeros(1)
        dq, dk, _ = sliding_window_backward(q, k, zero.expand(B, H, T, 1), zero.expand(B, H, T, 1), lse,
                                            zero.expand(B, H, T, 1), dlse, window=window, scale=scale, causal=causal)
        return dq, dk, dv
    window = clamp_window(window, T)
    delta = softmax.backward_delta(o, do, dlse)
    lse = lse.contiguous()
    BLOCK_D, BLOCK_DV = launch.head_block(D), launch.head_block(DV)
    tma = max(D, DV) <= TMA_MAX_HEAD and launch.tma_device(q.device) and launch.tma_compatible(q, k, v, do)
    inputs = launch.head_descriptors(tma, q, k, v, do)
    common = dict(BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, CAUSAL=causal, EVEN_D=(D == BLOCK_D and DV == BLOCK_DV),
                  PRECISION=softmax_precision(q.dtype), TMA=tma)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    sizes = (H, T, D, DV, window, scale * softmax.LOG2E.value, scale, length_bucket(T), window_bucket(window))
    dq = torch.empty_like(q)
    launch_tiles(_dkdv, lambda meta: (triton.cdiv(T, meta["BLOCK_N"]), B * H),
                 [*inputs, lse, delta, dk, dv, *strides, *dk.stride(), *dv.stride(), *sizes],
                 common, INTERPRET_DKDV, BWD_BLOCKS)
    launch_tiles(_dq, lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H),
                 [*inputs, lse, delta, dq, *strides, *dq.stride(), *sizes], common, INTERPRET_DQ, BWD_BLOCKS)
    return dq, dk, dv


__all__ = ["sliding_window_backward"]
