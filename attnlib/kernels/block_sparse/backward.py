"""Block-sparse attention backward in Triton: the flash backward restricted to the visited blocks.

The same three launches as the dense backward (``attnlib/kernels/flash/backward.py``), with the
same tile loops (``attnlib/kernels/common/online_softmax.py``: ``dkdv_over_queries``, ``dq_over_keys``):

1. ``delta_i = rowsum(dO * O)_i - dlse_i`` over query blocks.
2. dK, dV -- grid ``(cdiv(Tk, BLOCK_N), B * H)``: one program owns ``BLOCK_N`` keys (inside key block
   ``J``) of one (batch, head), keeps ``k``, ``v`` and the fp32 ``dk``, ``dv`` in registers, and walks
   *only the query blocks that visit J* -- the transposed lists ``counts_T[h, J]``,
   ``indices_T[h, J, :]``, built by the same torch sort on ``block_mask.transpose(-1, -2)``, on the
   device, with no host synchronisation -- each in ``BLOCK_M``-row tiles.
3. dQ -- grid ``(cdiv(Tq, BLOCK_M), B * H)``: one program owns ``BLOCK_M`` queries (inside query block
   ``I``) and walks the key blocks ``I`` visits (the forward's lists) in ``BLOCK_N``-key tiles.

As in the forward, the tiles divide the mask's block size ``BS`` (asserted at compile time; any ``BS`` up to
1024 launches). They are fixed per head width, with narrower dQ key tiles on sm_86/sm_89
(:func:`dq_tiles`), and shrunk where the device's shared memory is short (``forward.fit_tiles``). Tiles
past the ends or wholly on the far side of the causal diagonal are skipped.

Every tile is masked (causal diagonal; ragged tails): masked pairs get ``P = dS = 0`` by ``tl.where``,
whatever q, k, v hold there (``online_softmax.dkdv_tile``, ``dq_tile``). Rows that visit no
key have ``lse = -inf``; the wrapper hands the kernels ``+inf`` for them, so their ``P`` is 0 and they
contribute no gradient -- as in the reference, where such a row depends on no score.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import launch
from ..common import online_softmax as softmax
from ..common.online_softmax import (
    dkdv_over_queries,
    dkdv_program_init,
    dq_over_keys,
    dq_program_init,
    no_bad,
    poison_rows,
)
from ..common.precision import softmax_precision
from ..common.tiles import program_tile, store_tile
from ..flash.backward import bwd_smem
from .forward import STAGES, check_block_size, fit_tiles, tile, tiles_divide_block, visit_lists


@triton.jit
def _block_sparse_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV_OUT, COUNTS_T, INDICES_T,
                                  stride_qb, stride_qh, stride_qt, stride_qd,
                                  stride_kb, stride_kh, stride_kt, stride_kd,
                                  stride_vb, stride_vh, stride_vt, stride_vd,
                                  stride_dob, stride_doh, stride_dot, stride_dod,
                                  stride_dkb, stride_dkh, stride_dkt, stride_dkd,
                                  stride_dvb, stride_dvh, stride_dvt, stride_dvd,
                                  stride_ch, stride_cn, stride_ih, stride_in, stride_it,
                                  H, T_Q, T_K, D, DV, qk_scale, sm_scale,
                                  BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                                  CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    tiles_divide_block(BS, BLOCK_M, BLOCK_N)
    pid_bh, b, h, start_n, offs_n, offs_mb, offs_d, offs_dv = program_tile(H, BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DV)
    k_block = start_n // BS

    k, v, dk, dv = dkdv_program_init(K + b * stride_kb + h * stride_kh, V + b * stride_vb + h * stride_vh, b, h,
                                     start_n, offs_n, offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd,
                                     T_K, D, DV, TMA=False)
    Q_base = Q + b * stride_qb + h * stride_qh
    DO_base = DO + b * stride_dob + h * stride_doh

    n_visit = tl.load(COUNTS_T + h * stride_ch + k_block * stride_cn)
    idx_base = INDICES_T + h * stride_ih + k_block * stride_in
    for t in range(0, n_visit):
        block_start = tl.load(idx_base + t * stride_it) * BS      # a query block that visits this key block
        lo = block_start
        if CAUSAL:
            lo = tl.maximum(lo, (start_n // BLOCK_M) * BLOCK_M)     # rows before every key: nothing to add
        dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, b, h, LSE + pid_bh * T_Q, DELTA + pid_bh * T_Q,
                                   None, lo, tl.minimum(block_start + BS, T_Q), offs_n, offs_mb, offs_d, offs_dv,
                                   stride_qt, stride_qd, stride_dot, stride_dod, 0, 0, T_Q, T_K, D, DV, qk_scale,
                                   sm_scale, BLOCK_M=BLOCK_M, MASK_T=True, MASK_CAUSAL=CAUSAL, EVEN_D=False,
                                   PRECISION=PRECISION, TMA=False, ATOMIC_DQ=False)

    store_tile(DK + b * stride_dkb + h * stride_dkh, dk * sm_scale, offs_n, offs_d, stride_dkt, stride_dkd, T_K, D)
    store_tile(DV_OUT + b * stride_dvb + h * stride_dvh, dv, offs_n, offs_dv, stride_dvt, stride_dvd, T_K, DV)


@triton.jit
def _block_sparse_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, COUNTS, INDICES,
                                stride_qb, stride_qh, stride_qt, stride_qd,
                                stride_kb, stride_kh, stride_kt, stride_kd,
                                stride_vb, stride_vh, stride_vt, stride_vd,
                                stride_dob, stride_doh, stride_dot, stride_dod,
                                stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                                stride_ch, stride_cm, stride_ih, stride_im, stride_it,
                                H, T_Q, T_K, D, DV, qk_scale, sm_scale,
                                BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                                CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    tiles_divide_block(BS, BLOCK_M, BLOCK_N)
    pid_bh, b, h, start_m, offs_m, offs_nb, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    q_block = start_m // BS

    q, do, lse2, delta, dq = dq_program_init(Q + b * stride_qb + h * stride_qh, DO + b * stride_dob + h * stride_doh,
                                             b, h, LSE + pid_bh * T_Q, DELTA + pid_bh * T_Q, start_m, offs_m, offs_d,
                                             offs_dv, stride_qt, stride_qd, stride_dot, stride_dod, T_Q, D, DV,
                                             TMA=False)
    K_base = K + b * stride_kb + h * stride_kh
    V_base = V + b * stride_vb + h * stride_vh
    n_visit = tl.load(COUNTS + h * stride_ch + q_block * stride_cm)
    idx_base = INDICES + h * stride_ih + q_block * stride_im
    bad = no_bad(BLOCK_D)
    for t in range(0, n_visit):
        block_start = tl.load(idx_base + t * stride_it) * BS
        hi = tl.minimum(block_start + BS, T_K)
        if CAUSAL:
            hi = tl.minimum(hi, start_m + BLOCK_M)                  # keys after every row: nothing to add
        dq, bad = dq_over_keys(dq, bad, q, do, lse2, delta, K_base, V_base, b, h, block_start, hi, offs_m, offs_nb,
                               offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale,
                               BLOCK_N=BLOCK_N, MASK_T=True, MASK_CAUSAL=CAUSAL, EVEN_D=False, PRECISION=PRECISION,
                               TMA=False)

    dq = poison_rows(dq * sm_scale, bad, offs_m)
    store_tile(DQ + b * stride_dqb + h * stride_dqh, dq, offs_m, offs_d, stride_dqt, stride_dqd, T_Q, D)


def dq_tiles(block_size: int, width: int, device: torch.device) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)`` of the dQ launch (4 warps): 64 query rows against 32-key tiles (halved for
    heads wider than 128). On sm_86/sm_89 at head widths 65..128 the key tiles are 16: with 32, ptxas
    spilled 12 B there (non-causal; 4 B with 8 warps), with 16 it needs 168-175 registers. Wider than 128,
    16 x 16: 32 x 16 spilled 28 B on sm_90 (causal) once the causal tiles set non-finite operands aside."""
    if width > 128:
        return tile(block_size, 16, 128), tile(block_size, 16, 128)
    bn = 16 if launch.target_family(device) == "sm89" and 64 < width <= 128 else 32
    return tile(block_size, 64, width), tile(block_size, bn, width)


def block_sparse_attention_backward(q, k, v, o, lse, do, dlse, block_mask, *, block_size: int, scale: float,
                                    causal: bool):
    """Gradients ``(dq, dk, dv)`` of :func:`block_sparse_attention_forward`, in the inputs' dtypes.

    ``lse``: the forward's fp32 ``[B, H, Tq]`` (``-inf`` on rows that visit no key); ``dlse``: the
    gradient on the returned LSE, or ``None``.
    """
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    launch.require_launchable(q, D, DV)
    check_block_size(block_size)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if B * H * T_Q == 0:
        return dq, dk.zero_(), dv.zero_()         # no query: keys and values get no gradient
    if DV == 0:
        zero = v.new_zeros(1)
        dq, dk, _ = block_sparse_attention_backward(
            q, k, zero.expand(B, H, T_K, 1), zero.expand(B, H, T_Q, 1), lse, zero.expand(B, H, T_Q, 1), dlse,
            block_mask, block_size=block_size, scale=scale, causal=causal)
        return dq, dk, dv
    if dlse is not None:
        # Rows with no visited key depend on no score: whatever the loss on their lse (-inf), no gradient.
        dlse = torch.where(torch.isneginf(lse), torch.zeros_like(dlse), dlse)
    delta = softmax.backward_delta(o, do, dlse)
    # P = exp(s - lse) must be 0 on rows that visit nothing: +inf there instead of -inf (no NaN).
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse).contiguous()
    counts, indices = visit_lists(block_mask)
    counts_t, indices_t = visit_lists(block_mask.transpose(-1, -2))
    width = max(D, DV)
    meta = dict(BS=block_size, BLOCK_D=launch.head_block(D), BLOCK_DV=launch.head_block(DV), CAUSAL=causal,
                PRECISION=softmax_precision(q.dtype), num_stages=STAGES)
    tiles = dict(DK=dk, DQ=dq, LSE=lse, BLOCK_D=meta["BLOCK_D"], BLOCK_DV=meta["BLOCK_DV"])
    sizes = (H, T_Q, T_K, D, DV, scale * softmax.LOG2E.value, scale)
    # dK/dV: wide resident key tiles, narrow streamed query tiles; dQ: the mirror image (as in flash).
    bm, bn = fit_tiles(tile(block_size, 32, width), tile(block_size, 64, width), bwd_smem("kv", "DK"), tiles, q.device)
    _block_sparse_bwd_dkdv_kernel[(triton.cdiv(T_K, bn), B * H)](
        q, k, v, do, lse, delta, dk, dv, counts_t, indices_t,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        *counts_t.stride(), *indices_t.stride(), *sizes, BLOCK_M=bm, BLOCK_N=bn,
        num_warps=8 if bn * width > 64 * 64 else 4, **meta)     # 4 warps spill k, v, dk, dv at D = 128
    bm, bn = fit_tiles(*dq_tiles(block_size, width, q.device), bwd_smem("q", "DQ"), tiles, q.device)
    _block_sparse_bwd_dq_kernel[(triton.cdiv(T_Q, bm), B * H)](
        q, k, v, do, lse, delta, dq, counts, indices,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        *counts.stride(), *indices.stride(), *sizes, BLOCK_M=bm, BLOCK_N=bn, num_warps=4, **meta)
    return dq, dk, dv


__all__ = ["block_sparse_attention_backward"]
