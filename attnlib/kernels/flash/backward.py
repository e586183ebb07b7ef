"""Flash-attention backward in Triton (FlashAttention-2's decomposition): no ``[T, T]`` matrix, ever.

What the forward saved: ``o`` and the row LSE. With ``P = exp(s - lse)`` recomputed tile by tile,

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dQ = scale * dS K,   dK = scale * dS^T Q,

where ``delta_i = rowsum(dO * O)_i - dlse_i`` (the loss's gradient on the returned LSE folded in: it
enters ``dS`` as ``+ P * dlse``). First ``delta``, a small kernel over query blocks
(``attnlib/kernels/common/online_softmax.py``); then one of two forms.

Deterministic (the default), two launches:

* dK, dV -- grid ``(cdiv(Tk, BLOCK_N), B * H)``: one program owns ``BLOCK_N`` keys of one
  (batch, head). Its ``k``, ``v`` tiles and the fp32 accumulators ``dk [BLOCK_N, D]``,
  ``dv [BLOCK_N, Dv]`` stay in registers while it walks the query blocks of ``BLOCK_M`` rows
  (loading ``q``, ``dO``, ``lse``, ``delta`` of each), recomputing ``P^T`` in the transposed layout
  ``[BLOCK_N, BLOCK_M]``. It writes ``dk * scale`` and ``dv`` once, at the end.
* dQ -- grid ``(cdiv(Tq, BLOCK_M), B * H)``: one program owns ``BLOCK_M`` queries, keeps ``q``, ``dO``,
  ``lse``, ``delta`` and the accumulator ``dq [BLOCK_M, D]`` in registers, walks the key blocks, and
  writes ``dq * scale`` once. Every dQ row is summed by one program in a fixed order: the same bits on
  every run, and no float32 scratch copy of dQ -- at the price of computing ``P`` and ``dS`` twice.

Fused (``deterministic=False``), one launch: the dK/dV kernel with ``ATOMIC_DQ``, which also adds each
step's ``scale * dS K [BLOCK_M, D]`` to a zeroed float32 ``[B, H, Tq, D]`` buffer with ``tl.atomic_add``
(cast to the inputs' dtype at the end). ``P`` and ``dS`` are computed once; the order in which key
programs add to a dQ row varies, so dQ may differ in its last bits from run to run.

Both loops are staged like the forward's: for causal attention the blocks on the diagonal are a
masked stage of their own and the others need no mask; for ragged lengths only the last block is
masked. A masked pair -- past either end, or key after query -- gets ``P = dS = 0`` by ``tl.where``,
whatever q, k, v, the lse or delta hold there (``online_softmax.dkdv_tile``, ``dq_tile``).
The diagonal stage starts on a tile boundary only if ``BLOCK_M`` divides ``BLOCK_N`` in the dK/dV
kernel and ``BLOCK_N`` divides ``BLOCK_M`` in the dQ kernel: each asserts it at compile time.

Loads, tiles: as in the forward (``forward.py``): tensor descriptors (TMA) for q, k, v and dO on sm_90
where Triton and the strides allow it, up to head dims of 128 (:data:`TMA_MAX_HEAD`), pointers
elsewhere; candidates autotuned on a GPU among those
``launch.pruner`` keeps for the device (shared memory by :func:`bwd_smem`, spills by the per-target
tables below; keyed like the forward), fixed and small under the interpreter.
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
    head_base,
    no_bad,
    poison_rows,
)
from ..common.precision import softmax_precision
from ..common.tiles import program_tile, store_tile
from .forward import configs, launch_tiles, length_bucket, spill_width


@triton.jit
def _flash_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV_OUT, DQ,
                           stride_qb, stride_qh, stride_qt, stride_qd,
                           stride_kb, stride_kh, stride_kt, stride_kd,
                           stride_vb, stride_vh, stride_vt, stride_vd,
                           stride_dob, stride_doh, stride_dot, stride_dod,
                           stride_dkb, stride_dkh, stride_dkt, stride_dkd,
                           stride_dvb, stride_dvh, stride_dvt, stride_dvd,
                           stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                           H, T_Q, T_K, D, DV, qk_scale, sm_scale, T_BUCKET,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                           CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
                           TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    if CAUSAL:
        tl.static_assert(BLOCK_N % BLOCK_M == 0, "causal dK/dV: BLOCK_M must divide BLOCK_N (the diagonal "
                                                 "stage starts at the program's first key)")
    pid_bh, b, h, start_n, offs_n, offs_mb, offs_d, offs_dv = program_tile(H, BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DV)

    k, v, dk, dv = dkdv_program_init(head_base(K, b, h, stride_kb, stride_kh, TMA),
                                     head_base(V, b, h, stride_vb, stride_vh, TMA), b, h, start_n, offs_n, offs_d,
                                     offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, TMA=TMA)
    Q_base = head_base(Q, b, h, stride_qb, stride_qh, TMA)
    DO_base = head_base(DO, b, h, stride_dob, stride_doh, TMA)
    lse_ptr = LSE + pid_bh * T_Q                     # LSE and DELTA: contiguous [B, H, Tq] fp32
    delta_ptr = DELTA + pid_bh * T_Q
    DQ_base = DQ                                     # None unless ATOMIC_DQ
    if ATOMIC_DQ:
        DQ_base = DQ + b * stride_dqb + h * stride_dqh

    full_end = (T_Q // BLOCK_M) * BLOCK_M
    lo = 0
    if CAUSAL:
        # The query blocks on this key block's diagonal (queries before start_n see none of its keys).
        lo = tl.minimum(start_n + BLOCK_N, T_Q)
        dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, b, h, lse_ptr, delta_ptr, DQ_base, start_n, lo,
                                   offs_n, offs_mb, offs_d, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod,
                                   stride_dqt, stride_dqd, T_Q, T_K, D, DV, qk_scale, sm_scale, BLOCK_M=BLOCK_M,
                                   MASK_T=True, MASK_CAUSAL=True, EVEN_D=EVEN_D, PRECISION=PRECISION, TMA=TMA,
                                   ATOMIC_DQ=ATOMIC_DQ)
    # Full query blocks below the diagonal (or all of them): no masks.
    dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, b, h, lse_ptr, delta_ptr, DQ_base, lo, full_end,
                               offs_n, offs_mb, offs_d, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod,
                               stride_dqt, stride_dqd, T_Q, T_K, D, DV, qk_scale, sm_scale, BLOCK_M=BLOCK_M,
                               MASK_T=False, MASK_CAUSAL=False, EVEN_D=EVEN_D, PRECISION=PRECISION, TMA=TMA,
                               ATOMIC_DQ=ATOMIC_DQ)
    # The ragged last query block.
    dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, b, h, lse_ptr, delta_ptr, DQ_base,
                               tl.maximum(lo, full_end), T_Q, offs_n, offs_mb, offs_d, offs_dv, stride_qt, stride_qd,
                               stride_dot, stride_dod, stride_dqt, stride_dqd, T_Q, T_K, D, DV, qk_scale, sm_scale,
                               BLOCK_M=BLOCK_M, MASK_T=True, MASK_CAUSAL=False, EVEN_D=EVEN_D, PRECISION=PRECISION,
                               TMA=TMA, ATOMIC_DQ=ATOMIC_DQ)

    store_tile(DK + b * stride_dkb + h * stride_dkh, dk * sm_scale, offs_n, offs_d, stride_dkt, stride_dkd, T_K, D)
    store_tile(DV_OUT + b * stride_dvb + h * stride_dvh, dv, offs_n, offs_dv, stride_dvt, stride_dvd, T_K, DV)


@triton.jit
def _flash_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
                         stride_qb, stride_qh, stride_qt, stride_qd,
                         stride_kb, stride_kh, stride_kt, stride_kd,
                         stride_vb, stride_vh, stride_vt, stride_vd,
                         stride_dob, stride_doh, stride_dot, stride_dod,
                         stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                         H, T_Q, T_K, D, DV, qk_scale, sm_scale, T_BUCKET,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                         CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr):
    if CAUSAL:
        tl.static_assert(BLOCK_M % BLOCK_N == 0, "causal dQ: BLOCK_N must divide BLOCK_M (the diagonal stage "
                                                 "starts at the program's first row)")
    pid_bh, b, h, start_m, offs_m, offs_nb, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)

    q, do, lse2, delta, dq = dq_program_init(head_base(Q, b, h, stride_qb, stride_qh, TMA),
                                             head_base(DO, b, h, stride_dob, stride_doh, TMA), b, h,
                                             LSE + pid_bh * T_Q, DELTA + pid_bh * T_Q, start_m, offs_m, offs_d,
                                             offs_dv, stride_qt, stride_qd, stride_dot, stride_dod, T_Q, D, DV,
                                             TMA=TMA)
    K_base = head_base(K, b, h, stride_kb, stride_kh, TMA)
    V_base = head_base(V, b, h, stride_vb, stride_vh, TMA)
    if CAUSAL:
        full_end = start_m                                  # key blocks wholly left of the diagonal
        masked_end = tl.minimum(start_m + BLOCK_M, T_K)
    else:
        full_end = (T_K // BLOCK_N) * BLOCK_N
        masked_end = T_K
    dq, bad = dq_over_keys(dq, no_bad(BLOCK_D), q, do, lse2, delta, K_base, V_base, b, h, 0, full_end, offs_m,
                           offs_nb, offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale,
                           BLOCK_N=BLOCK_N, MASK_T=False, MASK_CAUSAL=False, EVEN_D=EVEN_D, PRECISION=PRECISION,
                           TMA=TMA)
    dq, bad = dq_over_keys(dq, bad, q, do, lse2, delta, K_base, V_base, b, h, full_end, masked_end, offs_m, offs_nb,
                           offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale,
                           BLOCK_N=BLOCK_N, MASK_T=True, MASK_CAUSAL=CAUSAL, EVEN_D=EVEN_D, PRECISION=PRECISION,
                           TMA=TMA)

    dq = poison_rows(dq * sm_scale, bad, offs_m)
    store_tile(DQ + b * stride_dqb + h * stride_dqh, dq, offs_m, offs_d, stride_dqt, stride_dqd, T_Q, D)


def bwd_smem(resident: str, out: str, fused: bool = False):
    """Shared memory of a candidate: ``num_stages`` buffers of the streamed tiles (rows x (D + Dv) in the
    inputs' dtype) plus the resident tiles (k, v for dK/dV; q, dO for dQ), plus
    ``launch.SMEM_MARGIN`` -- and for dK/dV the streamed rows' fp32 LSE and delta and one more
    ``[BLOCK_M, D]`` tile (the transposed copy of q that a one-stage sm_80 launch keeps); for the fused
    kernel on sm_90 a float32 ``[BLOCK_M, D]`` tile, the dQ term on its way to the atomics, and one more
    k tile, the dQ product's operand (wgmma reads it from shared memory: again, when k came by pointer).
    ``out``: an output argument in the inputs' dtype. Compiled for sm_80, sm_89 and sm_90 at D = 64, 128,
    256, Triton allocated at most this for every candidate."""

    def smem(cfg, args) -> int:
        e, bd, width = args[out].element_size(), args["BLOCK_D"], args["BLOCK_D"] + args["BLOCK_DV"]
        bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
        if resident == "q":
            return e * width * (bm + cfg.num_stages * bn) + launch.SMEM_MARGIN
        total = e * width * (bn + cfg.num_stages * bm) + cfg.num_stages * bm * 8 + e * bm * bd + launch.SMEM_MARGIN
        # launch.keep names the target it prunes for (a listing for another GPU than this one).
        wgmma = (args.get("TARGET") or launch.target_family(args["LSE"].device)) == "sm90"
        return total + ((4 * bm + e * bn) * bd if fused and wgmma else 0)

    return smem


# The backward reads its tiles through descriptors only up to this head width. At D = 256 its tiles are
# narrow (BLOCK_M 16 or 32: too few rows for wgmma, so mma.sync) and through descriptors every dK/dV
# candidate that fits spilled registers on sm_90 (100 B to 12 KB), while the pointer path had two that
# did not (16 x 32 with 8 warps: 172 registers; 16 x 16: 170).
TMA_MAX_HEAD = 128

# The box of each descriptor argument (the same in every backward kernel).
BWD_BLOCKS = {"Q": ("BLOCK_M", "BLOCK_D"), "K": ("BLOCK_N", "BLOCK_D"), "V": ("BLOCK_N", "BLOCK_DV"),
              "DO": ("BLOCK_M", "BLOCK_DV")}

# dK/dV: narrow query blocks streamed past wide resident key blocks (BLOCK_M divides BLOCK_N); dQ: the
# mirror image. Among them the Triton tutorial's Hopper choice (32 x 128 and 128 x 32, 4 warps). The
# fused kernel takes the dK/dV tiling (it also holds a [BLOCK_M, D] fp32 dQ term per step). At D = 256
# a resident [32, 256] k, v and their fp32 gradients need 8 warps not to spill (16 x 32, 8 warps). Each
# list ends with its fallback, one stage of 16 x 16 tiles: it fits every device, float32 at D = 256 on
# an L4 included.
_DKDV_SHAPES = [(32, 128, 8, 3), (32, 128, 4, 3), (32, 64, 8, 3), (64, 128, 8, 2), (16, 64, 4, 3), (16, 32, 8, 2),
                (16, 32, 4, 1), (16, 16, 4, 1)]
_DKDV_CONFIGS = configs(_DKDV_SHAPES, BWD_BLOCKS)
_FUSED_CONFIGS = configs(_DKDV_SHAPES, BWD_BLOCKS)
_DQ_CONFIGS = configs([(128, 32, 8, 3), (128, 32, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (64, 16, 4, 3),
                       (32, 16, 4, 1), (16, 16, 4, 1)], BWD_BLOCKS)

# Register spills measured with ptxas -v at D = 64, 128, 256, as the forward's (``forward._FWD_SPILLS``):
# configuration -> the narrowest head block at which it spilled, per target family.
# dK/dV holds k, v and the fp32 dk, dv [BLOCK_N, D] for the whole program: 32 x 128 with 4 warps spills
# at D = 64 (44-48 B) everywhere; on sm_80/sm_89 so do 64 x 128 (32-36 B) and 16 x 64 (12 B), and the
# 8-warp 32 x 128 at D = 128 (12-164 B), as 64 x 128 does on sm_90 (140 B); at D = 256 every candidate
# with 64 keys or more spills (4 B to 54 KB), leaving 16 x 32 with 8 warps (170-175 registers) and the
# one-stage tiles.
_DKDV_SPILLS = {
    "sm80": {(16, 64, 4, 3): 64, (32, 64, 8, 3): 256, (32, 128, 4, 3): 64, (32, 128, 8, 3): 128, (64, 128, 8, 2): 64},
    "sm89": {(16, 64, 4, 3): 64, (32, 64, 8, 3): 256, (32, 128, 4, 3): 64, (32, 128, 8, 3): 128, (64, 128, 8, 2): 64},
    "sm90": {(16, 64, 4, 3): 256, (32, 64, 8, 3): 256, (32, 128, 4, 3): 64, (32, 128, 8, 3): 256,
             (64, 128, 8, 2): 128},
}
# dQ holds q, dO and the fp32 dq [BLOCK_M, D]: 128 x 32 with 4 warps spills at D = 128 (40-160 B)
# everywhere; on sm_80/sm_89 its 8-warp twin spills 4 B at D = 64 (non-causal) and 128 x 64 8-72 B at
# D = 128, on sm_89 64 x 32 4 B at D = 128 (non-causal), on sm_90 128 x 64 112 B at D = 256 (pointers).
_DQ_SPILLS = {
    "sm80": {(128, 32, 4, 3): 64, (128, 32, 8, 3): 64, (128, 64, 8, 2): 128},
    "sm89": {(64, 32, 4, 3): 128, (128, 32, 4, 3): 64, (128, 32, 8, 3): 64, (128, 64, 8, 2): 128},
    "sm90": {(64, 32, 4, 3): 256, (128, 32, 4, 3): 128, (128, 64, 8, 2): 256},
}
# The fused kernel holds the dK/dV program's tiles and a [BLOCK_M, D] fp32 dQ term per step, and spills
# where dK/dV does and more: at D = 64 also 64 x 128 on sm_90 (8 B) and the one-stage 16 x 32 (20 B),
# at D = 128 16 x 64 on sm_80 (8 B) and 32 x 64 on sm_89 (8 B). At D = 256 the one-stage 16 x 16 is
# left everywhere (180-240 registers), with the 8-warp 16 x 32 on sm_89 and sm_90 (176-188 registers);
# on sm_80 that one spilled 8 B at D = 64 (causal) though not wider, and the table keeps the narrowest.
_FUSED_SPILLS = {
    "sm80": {(16, 32, 4, 1): 256, (16, 32, 8, 2): 64, (16, 64, 4, 3): 128, (32, 64, 8, 3): 256, (32, 128, 4, 3): 64,
             (32, 128, 8, 3): 128, (64, 128, 8, 2): 64},
    "sm89": {(16, 32, 4, 1): 256, (16, 64, 4, 3): 256, (32, 64, 8, 3): 128, (32, 128, 4, 3): 64,
             (32, 128, 8, 3): 128, (64, 128, 8, 2): 64},
    "sm90": {(16, 32, 4, 1): 64, (16, 32, 8, 2): 128, (16, 64, 4, 3): 128, (32, 64, 8, 3): 128, (32, 128, 4, 3): 64,
             (32, 128, 8, 3): 128, (64, 128, 8, 2): 64},
}

_KEY = ["T_BUCKET", "D", "DV", "CAUSAL"]
_prune_dkdv = launch.pruner(bwd_smem("kv", "DK"), _DKDV_SPILLS, spill_width("DK"), "LSE")
_prune_fused = launch.pruner(bwd_smem("kv", "DK", fused=True), _FUSED_SPILLS, spill_width("DK"), "LSE")
_prune_dq = launch.pruner(bwd_smem("q", "DQ"), _DQ_SPILLS, spill_width("DQ"), "LSE")
_dkdv = launch.autotuned(_flash_bwd_dkdv_kernel, _DKDV_CONFIGS, _KEY, _prune_dkdv, name="flash.backward._dkdv")
# The fused kernel adds into DQ: the autotuner zeroes it before each timed run and before the real one.
_fused = launch.autotuned(_flash_bwd_dkdv_kernel, _FUSED_CONFIGS, _KEY, _prune_fused, reset_to_zero=["DQ"],
                          name="flash.backward._fused")
_dq = launch.autotuned(_flash_bwd_dq_kernel, _DQ_CONFIGS, _KEY, _prune_dq, name="flash.backward._dq")

INTERPRET_DKDV = dict(BLOCK_M=16, BLOCK_N=32)
INTERPRET_DQ = dict(BLOCK_M=32, BLOCK_N=16)


def flash_attention_backward(q, k, v, o, lse, do, dlse, *, scale: float, causal: bool, deterministic: bool = True):
    """Gradients ``(dq, dk, dv)`` of the flash forward, in the inputs' dtypes.

    ``q, k: [B, H, T, D]``, ``v: [B, H, Tk, Dv]``, ``o, do: [B, H, Tq, Dv]``, ``lse``: the forward's
    contiguous fp32 ``[B, H, Tq]``; ``dlse``: the gradient on the returned LSE, or ``None``.
    ``deterministic``: the two-kernel form (True) or the fused one with float32 atomics on dQ (False).
    """
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    launch.require_launchable(q, D, DV)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if B * H * T_Q == 0:
        return torch.empty_like(q), dk.zero_(), dv.zero_()      # no query: keys and values get no gradient
    if DV == 0:
        # Only the LSE carries a gradient: one zero value column stands in for v (as in the forward).
        zero = v.new_zeros(1)
        dq, dk, _ = flash_attention_backward(q, k, zero.expand(B, H, T_K, 1), zero.expand(B, H, T_Q, 1), lse,
                                             zero.expand(B, H, T_Q, 1), dlse, scale=scale, causal=causal,
                                             deterministic=deterministic)
        return dq, dk, dv
    delta = softmax.backward_delta(o, do, dlse)
    lse = lse.contiguous()
    BLOCK_D, BLOCK_DV = launch.head_block(D), launch.head_block(DV)
    tma = max(D, DV) <= TMA_MAX_HEAD and launch.tma_device(q.device) and launch.tma_compatible(q, k, v, do)
    inputs = launch.head_descriptors(tma, q, k, v, do)
    common = dict(BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, CAUSAL=causal, EVEN_D=(D == BLOCK_D and DV == BLOCK_DV),
                  PRECISION=softmax_precision(q.dtype), TMA=tma)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    sizes = (H, T_Q, T_K, D, DV, scale * softmax.LOG2E.value, scale, length_bucket(max(T_Q, T_K)))
    over_keys = lambda meta: (triton.cdiv(T_K, meta["BLOCK_N"]), B * H)  # noqa: E731
    if deterministic:
        dq = torch.empty_like(q)
        launch_tiles(_dkdv, over_keys, [*inputs, lse, delta, dk, dv, None, *strides, *dk.stride(), *dv.stride(),
                                        0, 0, 0, 0, *sizes],
                     dict(common, ATOMIC_DQ=False), INTERPRET_DKDV, BWD_BLOCKS)
        launch_tiles(_dq, lambda meta: (triton.cdiv(T_Q, meta["BLOCK_M"]), B * H),
                     [*inputs, lse, delta, dq, *strides, *dq.stride(), *sizes], common, INTERPRET_DQ, BWD_BLOCKS)
        return dq, dk, dv
    dq32 = torch.zeros(B, H, T_Q, D, device=q.device, dtype=torch.float32)
    launch_tiles(_fused, over_keys, [*inputs, lse, delta, dk, dv, dq32, *strides, *dk.stride(), *dv.stride(),
                                     *dq32.stride(), *sizes],
                 dict(common, ATOMIC_DQ=True), INTERPRET_DKDV, BWD_BLOCKS)
    return dq32.to(q.dtype), dk, dv


__all__ = ["flash_attention_backward"]
