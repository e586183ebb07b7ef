"""The lightning indexer's scores in Triton, forward and backward, without the per-head scores.

What it computes (``attnlib/topk.py``): ``I[b, 0, t, s] = sum_j w[b, j, t] ReLU(qI[b, j, t] . kI[b, 0, s])``.
The reference builds the ``[B, H_I, Tq, Tk]`` per-head scores and sums them; here they live one
``[BLOCK_M, BLOCK_N]`` tile at a time in registers and only ``I`` (float32) is written.

Forward -- grid ``(cdiv(Tq, BLOCK_M), cdiv(Tk, BLOCK_N), B)``. A program owns one (query tile, key tile)
of one sequence. It loads the shared index-key tile once (one key per token: the MQA shape, so the
same ``kI`` tile serves every index head) and loops over the ``H_I`` heads: per head one ``tl.dot`` of
the head's query tile with it, the ReLU, the head's weight per row, summed into a float32 accumulator.
With ``CAUSAL`` (``topk_attention``'s own call, never the public :func:`index_scores`) a tile wholly
above the diagonal (every key after every query of the tile) does no product and writes ``-inf``:
the causal selection treats every key ``s > t`` as ``-inf`` whatever its score, so the indices are the
reference's. Tiles crossing the diagonal are computed in full (the selection masks their upper part).

ReLU is ``where(x < 0, 0, x)``: a NaN product stays NaN, as ``torch.relu`` keeps it.

Backward -- two kernels, recomputing the per-head products tile by tile from the inputs (nothing but
``I``'s inputs is saved). With ``g_jts = dI_ts 1[x_jts > 0]`` (``x_jts = qI_jt . kI_s``, the ReLU's
derivative taken as 0 at 0 and at NaN, like torch's):

    dw_jt = sum_s dI_ts ReLU(x_jts),    dqI_jt = w_jt sum_s g_jts kI_s,    dkI_s = sum_j sum_t w_jt g_jts qI_jt.

1. dqI and dw -- grid ``(cdiv(Tq, BLOCK_M), H_I, B)``: one program owns a query tile of one head and walks
   every key tile (``dI`` read once per head).
2. dkI -- grid ``(cdiv(Tk, BLOCK_N), B)``: one program owns a key tile, keeps its float32 ``dkI`` in
   registers and walks every (head, query tile): the sum over heads and queries happens in registers,
   with no atomics, so the result is the same bits on every run. Its parallelism is ``cdiv(Tk, BLOCK_N) B``
   programs, each ``H_I cdiv(Tq, BLOCK_M)`` steps long: with 64-key tiles, fewer programs than an H100
   has SMs (132) below ``B Tk = 8448`` -- the price of summing without atomics.

Neither backward kernel skips the causal upper triangle: :func:`index_scores` has no mask, and a loss
may put gradient there (``indexer_kl_loss(causal=True)`` puts exactly 0, which costs the products but
changes nothing).

Precision (``common/precision.py``). ``qI kI^T`` is a product of inputs (``IO``: the inputs' dtype,
exact IEEE float32 for float32). ``g`` carries ``dI``, whose size the inputs do not bound: its products
(``g kI``, ``g^T qI``) take ``WIDE`` operands (bfloat16 for half inputs, float32 for float32).

Tiles. ``BLOCK_D`` covers ``d_I`` (a power of two, up to 256). ``BLOCK_M = BLOCK_N`` = 64 in half
precision (32 for the backward at ``d_I > 128``), 32 or 16 in float32 (:func:`gpu_tile`: in half
precision no launch spills on sm_80, sm_89, sm_90; in float32 a few spill 4-8 B), halved (the wider
first) until the tiles fit the device's shared memory (:func:`fit`; a T4's 64 KB included); 16 under
the interpreter, so small CPU tests cross several tiles. On sm_75, where the backend rule never takes
a kernel, the forward compiles in every dtype but the half-precision backward does not: its ``WIDE``
operands are bfloat16, which sm_75 lacks (as in the chunked kernels).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import launch
from ..common.precision import dot, io_dtype, wide_dtype


@triton.jit
def _index_scores_fwd_kernel(QI, KI, W, I_OUT,
                             stride_qb, stride_qh, stride_qt, stride_qd,
                             stride_kb, stride_kt, stride_kd,
                             stride_wb, stride_wh, stride_wt,
                             stride_ib, stride_it, stride_is,
                             H_I, T_Q, T_K, D,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                             CAUSAL: tl.constexpr, IO: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    start_n = tl.program_id(1) * BLOCK_N
    b = tl.program_id(2)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # 64-bit offsets into I: a [T, T] score matrix passes 2^31 elements at T = 46341.
    out = I_OUT + b.to(tl.int64) * stride_ib + offs_m.to(tl.int64)[:, None] * stride_it + offs_n[None, :] * stride_is
    out_mask = (offs_m[:, None] < T_Q) & (offs_n[None, :] < T_K)
    above = start_n < 0                                        # a scalar bool (False), typed as the test below
    if CAUSAL:
        above = start_n >= start_m + BLOCK_M                   # every key of the tile after every query
    if above:
        # The causal selection treats these keys as -inf whatever their score: no product.
        tl.store(out, tl.full([BLOCK_M, BLOCK_N], float("-inf"), dtype=tl.float32), mask=out_mask)
    else:
        # The shared index keys, transposed [BLOCK_D, BLOCK_N]: loaded once, used by every head.
        kT = tl.load(KI + b * stride_kb + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd,
                     mask=(offs_n[None, :] < T_K) & (offs_d[:, None] < D), other=0.0)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        q_rows = QI + b * stride_qb + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
        q_mask = (offs_m[:, None] < T_Q) & (offs_d[None, :] < D)
        w_rows = W + b * stride_wb + offs_m * stride_wt
        for j in range(0, H_I):
            q = tl.load(q_rows + j * stride_qh, mask=q_mask, other=0.0)
            w = tl.load(w_rows + j * stride_wh, mask=offs_m < T_Q, other=0.0).to(tl.float32)
            x = dot(q, kT, IO)
            acc += w[:, None] * tl.where(x < 0.0, 0.0, x)          # ReLU that keeps NaN, as torch.relu
        tl.store(out, acc, mask=out_mask)


@triton.jit
def _index_scores_bwd_dq_kernel(QI, KI, W, DI, DQ, DW,
                                stride_qb, stride_qh, stride_qt, stride_qd,
                                stride_kb, stride_kt, stride_kd,
                                stride_wb, stride_wh, stride_wt,
                                stride_gb, stride_gt, stride_gs,
                                stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                                stride_dwb, stride_dwh, stride_dwt,
                                T_Q, T_K, D,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                IO: tl.constexpr, WIDE: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    j = tl.program_id(1)
    b = tl.program_id(2)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = offs_m < T_Q
    q_mask = row_mask[:, None] & (offs_d[None, :] < D)
    q = tl.load(QI + b * stride_qb + j * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                mask=q_mask, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dw = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, T_K, BLOCK_N):
        offs_n = start_n + offs_n0
        k = tl.load(KI + b * stride_kb + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                    mask=(offs_n[:, None] < T_K) & (offs_d[None, :] < D), other=0.0)        # [BLOCK_N, BLOCK_D]
        g = tl.load(DI + b.to(tl.int64) * stride_gb + offs_m.to(tl.int64)[:, None] * stride_gt
                    + offs_n[None, :] * stride_gs,
                    mask=row_mask[:, None] & (offs_n[None, :] < T_K), other=0.0).to(tl.float32)
        x = dot(q, tl.trans(k), IO)                                                          # [BLOCK_M, BLOCK_N]
        dw += tl.sum(g * tl.where(x < 0.0, 0.0, x), 1)
        g = tl.where(x > 0.0, g, 0.0)
        dq += dot(g, k, WIDE)
    w = tl.load(W + b * stride_wb + j * stride_wh + offs_m * stride_wt, mask=row_mask, other=0.0).to(tl.float32)
    dq = dq * w[:, None]
    tl.store(DQ + b * stride_dqb + j * stride_dqh + offs_m[:, None] * stride_dqt + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=q_mask)
    tl.store(DW + b * stride_dwb + j * stride_dwh + offs_m * stride_dwt, dw.to(DW.dtype.element_ty), mask=row_mask)


@triton.jit
def _index_scores_bwd_dk_kernel(QI, KI, W, DI, DK,
                                stride_qb, stride_qh, stride_qt, stride_qd,
                                stride_kb, stride_kt, stride_kd,
                                stride_wb, stride_wh, stride_wt,
                                stride_gb, stride_gt, stride_gs,
                                stride_dkb, stride_dkt, stride_dkd,
                                H_I, T_Q, T_K, D,
                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                IO: tl.constexpr, WIDE: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    b = tl.program_id(1)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    k_mask = (offs_n[:, None] < T_K) & (offs_d[None, :] < D)
    k = tl.load(KI + b * stride_kb + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=k_mask,
                other=0.0)                                                                   # [BLOCK_N, BLOCK_D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for j in range(0, H_I):
        for start_m in range(0, T_Q, BLOCK_M):
            offs_m = start_m + offs_m0
            row_mask = offs_m < T_Q
            q = tl.load(QI + b * stride_qb + j * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                        mask=row_mask[:, None] & (offs_d[None, :] < D), other=0.0)           # [BLOCK_M, BLOCK_D]
            w = tl.load(W + b * stride_wb + j * stride_wh + offs_m * stride_wt, mask=row_mask,
                        other=0.0).to(tl.float32)
            gT = tl.load(DI + b.to(tl.int64) * stride_gb + offs_m.to(tl.int64)[None, :] * stride_gt
                         + offs_n[:, None] * stride_gs,
                         mask=row_mask[None, :] & (offs_n[:, None] < T_K), other=0.0).to(tl.float32)
            xT = dot(k, tl.trans(q), IO)                                                     # [BLOCK_N, BLOCK_M]
            gT = tl.where(xT > 0.0, gT * w[None, :], 0.0)
            dk += dot(gT, q, WIDE)
    tl.store(DK + b * stride_dkb + offs_n[:, None] * stride_dkt + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=k_mask)


STAGES = 2          # software-pipelining stages of every indexer launch
INTERPRET_TILE = 16


def gpu_tile(block_d: int, elem: int, backward: bool) -> int:
    """``BLOCK_M = BLOCK_N`` on a GPU before the shared-memory fit. Half precision: 64, 32 for the
    backward at ``d_I > 128``. float32 (exact IEEE products on the CUDA cores, the correctness path):
    32 up to ``d_I = 64``, 16 above. Compiled for sm_80, sm_89 and sm_90 (``scripts/kernel_resources.py
    --workloads topk``): 64 x 64 float32 tiles spilled kilobytes, the half-precision backward at
    ``d_I = 256`` with 64 x 64 tiles 4-96 B."""
    if elem == 2:
        return 32 if backward and block_d > 128 else 64
    return 32 if block_d <= 64 else 16


def tiles_smem(bm: int, bn: int, block_d: int, elem: int) -> int:
    """Shared memory of one indexer launch: ``STAGES`` buffered query tiles and key tiles (each
    ``[tile, BLOCK_D]``, in the inputs' dtype) plus one float32 ``[BLOCK_M, BLOCK_N]`` tile for the
    products of ``dI`` (the backward's; the forward needs less), plus ``launch.SMEM_MARGIN``."""
    return elem * block_d * (STAGES * bm + STAGES * bn) + 4 * bm * bn + launch.SMEM_MARGIN


def fit(block_d: int, elem: int, device: torch.device, *, backward: bool = False) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)``: :func:`gpu_tile` square (16 under the interpreter), the wider halved until
    :func:`tiles_smem` fits ``device`` (never below 16, ``tl.dot``'s minimum) -- candidates chosen by
    ``launch.choose``, the rule every launch follows."""
    g = gpu_tile(block_d, elem, backward)
    tiles = launch.choose(launch.halvings(g, g, first="N", num_stages=STAGES), {}, device,
                          smem=lambda cfg, _: tiles_smem(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], block_d, elem),
                          interpret=dict(BLOCK_M=INTERPRET_TILE, BLOCK_N=INTERPRET_TILE))
    return tiles["BLOCK_M"], tiles["BLOCK_N"]


def _warps(bm: int, bn: int, block_d: int, backward: bool) -> int:
    """8 warps for 64 x 64 tiles in the backward (whose programs keep a float32 ``[tile, BLOCK_D]``
    gradient besides the tiles: 4 warps spilled 8 B at ``d_I = 64`` on sm_80/sm_89, 180 B at 128 on
    sm_90) and in the forward above ``d_I = 128``; 4 otherwise."""
    wide = backward or block_d > 128
    return 8 if wide and bm * bn >= 64 * 64 else 4


def index_scores_forward(index_q: torch.Tensor, index_k: torch.Tensor, index_w: torch.Tensor, *,
                         causal: bool) -> torch.Tensor:
    """``I [B, 1, Tq, Tk]`` float32. Inputs validated by ``attnlib.topk`` (one dtype: float16, bfloat16 or
    float32; ``d_I <= 256``). ``causal``: tiles wholly above the diagonal hold ``-inf`` instead of their
    scores (for the causal selection only, which never reads them)."""
    B, H_I, T_Q, D = index_q.shape
    T_K = index_k.shape[2]
    launch.require_launchable(index_q, D)
    out = torch.empty(B, 1, T_Q, T_K, device=index_q.device, dtype=torch.float32)
    if out.numel() == 0:
        return out
    block_d = launch.head_block(D)
    bm, bn = fit(block_d, index_q.element_size(), index_q.device)
    grid = (triton.cdiv(T_Q, bm), triton.cdiv(T_K, bn), B)
    _index_scores_fwd_kernel[grid](
        index_q, index_k, index_w, out,
        *index_q.stride(), index_k.stride(0), index_k.stride(2), index_k.stride(3), *index_w.stride(),
        out.stride(0), out.stride(2), out.stride(3),
        H_I, T_Q, T_K, D,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, CAUSAL=causal, IO=io_dtype(index_q.dtype),
        num_warps=_warps(bm, bn, block_d, False), num_stages=STAGES)
    return out


def index_scores_backward(index_q: torch.Tensor, index_k: torch.Tensor, index_w: torch.Tensor,
                          dI: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients ``(d index_q, d index_k, d index_w)`` of :func:`index_scores_forward` (non-causal) for
    the gradient ``dI [B, 1, Tq, Tk]`` on its output (any float dtype, any strides), in the inputs' dtype."""
    B, H_I, T_Q, D = index_q.shape
    T_K = index_k.shape[2]
    launch.require_launchable(index_q, D)
    dq, dk, dw = torch.empty_like(index_q), torch.empty_like(index_k), torch.empty_like(index_w)
    if B * T_Q == 0 or T_K == 0:
        return dq.zero_(), dk.zero_(), dw.zero_()        # no pair: no score depends on anything
    block_d = launch.head_block(D)
    bm, bn = fit(block_d, index_q.element_size(), index_q.device, backward=True)
    precision = dict(IO=io_dtype(index_q.dtype), WIDE=wide_dtype(index_q.dtype))
    strides = (*index_q.stride(), index_k.stride(0), index_k.stride(2), index_k.stride(3), *index_w.stride(),
               dI.stride(0), dI.stride(2), dI.stride(3))
    _index_scores_bwd_dq_kernel[(triton.cdiv(T_Q, bm), H_I, B)](
        index_q, index_k, index_w, dI, dq, dw, *strides, *dq.stride(), *dw.stride(), T_Q, T_K, D,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, **precision,
        num_warps=_warps(bm, bn, block_d, True), num_stages=STAGES)
    _index_scores_bwd_dk_kernel[(triton.cdiv(T_K, bn), B)](
        index_q, index_k, index_w, dI, dk, *strides, dk.stride(0), dk.stride(2), dk.stride(3), H_I, T_Q, T_K, D,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, **precision,
        num_warps=_warps(bm, bn, block_d, True), num_stages=STAGES)
    return dq, dk, dw


__all__ = ["fit", "index_scores_backward", "index_scores_forward", "tiles_smem"]
