"""Flash-attention backward in Triton (FlashAttention-2's decomposition): no ``[T, T]`` matrix, ever.

What the forward saved: ``o`` and the row LSE. With ``P = exp(s - lse)`` recomputed tile by tile,

    dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),   dQ = scale * dS K,   dK = scale * dS^T Q,

where ``delta_i = rowsum(dO * O)_i - dlse_i`` (the loss's gradient on the returned LSE folded in: it
enters ``dS`` as ``+ P * dlse``). Three launches:

1. ``delta`` -- a small kernel over query blocks (``attnlib/kernels/common/online_softmax.py``).
2. dK, dV -- grid ``(cdiv(Tk, BLOCK_N), B * H)``: one program owns ``BLOCK_N`` keys of one
   (batch, head). Its ``k``, ``v`` tiles and the fp32 accumulators ``dk [BLOCK_N, D]``,
   ``dv [BLOCK_N, Dv]`` stay in registers while it walks the query blocks of ``BLOCK_M`` rows
   (loading ``q``, ``dO``, ``lse``, ``delta`` of each), recomputing ``P^T`` in the transposed layout
   ``[BLOCK_N, BLOCK_M]``. It writes ``dk * scale`` and ``dv`` once, at the end.
3. dQ -- grid ``(cdiv(Tq, BLOCK_M), B * H)``: one program owns ``BLOCK_M`` queries, keeps ``q``, ``dO``,
   ``lse``, ``delta`` and the accumulator ``dq [BLOCK_M, D]`` in registers, walks the key blocks, and
   writes ``dq * scale`` once. A separate kernel rather than atomics on dQ: deterministic, and no
   fp32 scratch copy of dQ.

Both loops are staged like the forward's: for causal attention the blocks on the diagonal are a
masked stage of their own and the others need no mask; for ragged lengths only the last block is
masked (loads past the end read zeros, and rows past ``Tq`` get ``lse = +inf``, hence ``P = 0``).
Causal tiling needs ``BLOCK_N`` a multiple of ``BLOCK_M`` in the dK/dV kernel and ``BLOCK_M`` a multiple
of ``BLOCK_N`` in the dQ kernel, so that the diagonal stage starts on a tile boundary.

Tiles are autotuned on a GPU (configurations pruned to shared memory and, in half precision, to those
that spill no registers at the call's head width; keyed like the forward) and fixed and small under
the interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import INTERPRET
from ..common import online_softmax as softmax
from ..common.online_softmax import dkdv_over_queries, dkdv_program_init, dq_over_keys, dq_program_init
from ..common.tiles import program_tile, store_tile
from .forward import SMEM_BUDGET, check_launchable, length_bucket, precision_for, spills


@triton.jit
def _flash_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV_OUT,
                           stride_qb, stride_qh, stride_qt, stride_qd,
                           stride_kb, stride_kh, stride_kt, stride_kd,
                           stride_vb, stride_vh, stride_vt, stride_vd,
                           stride_dob, stride_doh, stride_dot, stride_dod,
                           stride_dkb, stride_dkh, stride_dkt, stride_dkd,
                           stride_dvb, stride_dvh, stride_dvt, stride_dvd,
                           H, T_Q, T_K, D, DV, qk_scale, sm_scale, T_BUCKET,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                           CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr):
    pid_bh, b, h, start_n, offs_n, offs_mb, offs_d, offs_dv = program_tile(H, BLOCK_N, BLOCK_M, BLOCK_D, BLOCK_DV)

    k, v, dk, dv = dkdv_program_init(K + b * stride_kb + h * stride_kh, V + b * stride_vb + h * stride_vh, offs_n,
                                     offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV)
    Q_base = Q + b * stride_qb + h * stride_qh
    DO_base = DO + b * stride_dob + h * stride_doh
    lse_ptr = LSE + pid_bh * T_Q                     # LSE and DELTA: contiguous [B, H, Tq] fp32
    delta_ptr = DELTA + pid_bh * T_Q

    full_end = (T_Q // BLOCK_M) * BLOCK_M
    lo = 0
    if CAUSAL:
        # The query blocks on this key block's diagonal (queries before start_n see none of its keys).
        lo = tl.minimum(start_n + BLOCK_N, T_Q)
        dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, lse_ptr, delta_ptr, start_n, lo,
                                   offs_n, offs_mb, offs_d, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod,
                                   T_Q, D, DV, qk_scale, BLOCK_M=BLOCK_M, MASK_T=True, MASK_CAUSAL=True,
                                   EVEN_D=EVEN_D, PRECISION=PRECISION)
    # Full query blocks below the diagonal (or all of them): no masks.
    dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, lse_ptr, delta_ptr, lo, full_end,
                               offs_n, offs_mb, offs_d, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod,
                               T_Q, D, DV, qk_scale, BLOCK_M=BLOCK_M, MASK_T=False, MASK_CAUSAL=False,
                               EVEN_D=EVEN_D, PRECISION=PRECISION)
    # The ragged last query block.
    dk, dv = dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, lse_ptr, delta_ptr, tl.maximum(lo, full_end), T_Q,
                               offs_n, offs_mb, offs_d, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod,
                               T_Q, D, DV, qk_scale, BLOCK_M=BLOCK_M, MASK_T=True, MASK_CAUSAL=False,
                               EVEN_D=EVEN_D, PRECISION=PRECISION)

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
                         CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr):
    pid_bh, b, h, start_m, offs_m, offs_nb, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)

    q, do, lse2, delta, dq = dq_program_init(Q + b * stride_qb + h * stride_qh, DO + b * stride_dob + h * stride_doh,
                                             LSE + pid_bh * T_Q, DELTA + pid_bh * T_Q, offs_m, offs_d, offs_dv,
                                             stride_qt, stride_qd, stride_dot, stride_dod, T_Q, D, DV)
    K_base = K + b * stride_kb + h * stride_kh
    V_base = V + b * stride_vb + h * stride_vh
    if CAUSAL:
        full_end = start_m                                  # key blocks wholly left of the diagonal
        masked_end = tl.minimum(start_m + BLOCK_M, T_K)
    else:
        full_end = (T_K // BLOCK_N) * BLOCK_N
        masked_end = T_K
    dq = dq_over_keys(dq, q, do, lse2, delta, K_base, V_base, 0, full_end, offs_m, offs_nb, offs_d, offs_dv,
                      stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale, BLOCK_N=BLOCK_N, MASK_T=False,
                      MASK_CAUSAL=False, EVEN_D=EVEN_D, PRECISION=PRECISION)
    dq = dq_over_keys(dq, q, do, lse2, delta, K_base, V_base, full_end, masked_end, offs_m, offs_nb, offs_d,
                      offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale, BLOCK_N=BLOCK_N,
                      MASK_T=True, MASK_CAUSAL=CAUSAL, EVEN_D=EVEN_D, PRECISION=PRECISION)

    store_tile(DQ + b * stride_dqb + h * stride_dqh, dq * sm_scale, offs_m, offs_d, stride_dqt, stride_dqd, T_Q, D)


def _bwd_smem(cfg, args, resident: str) -> int:
    """Shared memory of the streamed tiles: ``stages`` buffers of the loop's (rows x (D + Dv)) plus the
    resident tiles (k, v for dK/dV; q, dO for dQ)."""
    width = args["BLOCK_D"] + args["BLOCK_DV"]
    bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
    kept, streamed = (bn, bm) if resident == "kv" else (bm, bn)
    return args["Q"].element_size() * width * (kept + cfg.num_stages * streamed)


def _pruner(resident: str):
    """Keep the configurations that fit the shared-memory budget, were not measured to spill registers
    at this head width (``forward.spills``) and, for heads wider than 128, have small tiles."""
    measured = _DKDV_SPILLS if resident == "kv" else _DQ_SPILLS

    def prune(configs, nargs, **kwargs):
        args = {**nargs, **kwargs}
        wide = max(args["BLOCK_D"], args["BLOCK_DV"]) > 128
        keep = [c for c in configs[:-1] if _bwd_smem(c, args, resident) <= SMEM_BUDGET
                and not spills(c, args, measured)
                and not (wide and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 32 * 64)]
        return keep or configs[-1:]           # the last configuration: the fallback (D = 256, float32)
    return prune


def _configs(shapes):
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in shapes]


# dK/dV: narrow query blocks streamed past wide resident key blocks (BLOCK_N a multiple of BLOCK_M);
# dQ: the mirror image. Among them the Triton tutorial's Hopper choice (32 x 128 and 128 x 32, 4 warps).
# The last: the fallback.
_DKDV_CONFIGS = _configs([(32, 128, 8, 3), (32, 128, 4, 3), (32, 64, 8, 3), (64, 128, 8, 2), (16, 64, 4, 3),
                          (16, 32, 4, 1)])
_DQ_CONFIGS = _configs([(128, 32, 8, 3), (128, 32, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3), (64, 16, 4, 3),
                        (32, 16, 4, 1)])

# Register spills measured with ptxas -v for sm_90, fp16 = bf16 (scripts/kernel_resources.py
# --every-config): configuration -> the narrowest head block at which it spills (``forward.spills``).
# dK/dV holds k, v and the fp32 dk, dv [BLOCK_N, D] for the whole program:
#   32 x 128, 4 warps: 220 registers at D = 32, 44 B of spill stores at 64 (causal), 2.1-2.9 KB at 128
#     (its 8-warp twin: 168-175 registers at 64, 239 at 128, no spill);
#   64 x 128, 8 warps, 2 stages: 40-140 B at D = 128;
#   at D = 256 every candidate that fits the budget (32 x 64 8 warps: 260-448 B, 16 x 64: 3.2-4.2 KB;
#     32 x 128 8 warps: 3.2-4.2 KB) -- only the fallback (16 x 32, one stage, 232-237 registers) is left.
_DKDV_SPILLS = {(32, 128, 4, 3): 64, (64, 128, 8, 2): 128, (32, 128, 8, 3): 256, (32, 64, 8, 3): 256,
                (16, 64, 4, 3): 256}
# dQ holds q, dO and the fp32 dq [BLOCK_M, D]: 128 x 32 with 4 warps spills 92-176 B at D = 128 (4.2-4.3 KB
# at 256; 174-180 registers at 64); 128 x 64 (8 warps, 2 stages) 112-148 B at 256.
_DQ_SPILLS = {(128, 32, 4, 3): 128, (128, 64, 8, 2): 256}
_KEY = ["T_BUCKET", "D", "DV", "CAUSAL"]

if INTERPRET:
    _dkdv, _dq = _flash_bwd_dkdv_kernel, _flash_bwd_dq_kernel
else:
    _dkdv = triton.autotune(_DKDV_CONFIGS, key=_KEY, prune_configs_by={"early_config_prune": _pruner("kv")})(
        _flash_bwd_dkdv_kernel)
    _dq = triton.autotune(_DQ_CONFIGS, key=_KEY, prune_configs_by={"early_config_prune": _pruner("q")})(
        _flash_bwd_dq_kernel)

INTERPRET_DKDV = dict(BLOCK_M=16, BLOCK_N=32)
INTERPRET_DQ = dict(BLOCK_M=32, BLOCK_N=16)


def flash_attention_backward(q, k, v, o, lse, do, dlse, *, scale: float, causal: bool):
    """Gradients ``(dq, dk, dv)`` of the flash forward, in the inputs' dtypes.

    ``q, k: [B, H, T, D]``, ``v: [B, H, Tk, Dv]``, ``o, do: [B, H, Tq, Dv]``, ``lse``: the forward's
    contiguous fp32 ``[B, H, Tq]``; ``dlse``: the gradient on the returned LSE, or ``None``.
    """
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    check_launchable(q, D, DV)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if B * H * T_Q == 0:
        return dq, dk.zero_(), dv.zero_()         # no query: keys and values get no gradient
    if DV == 0:
        # Only the LSE carries a gradient: one zero value column stands in for v (as in the forward).
        zero = v.new_zeros(1)
        dq, dk, _ = flash_attention_backward(q, k, zero.expand(B, H, T_K, 1), zero.expand(B, H, T_Q, 1), lse,
                                             zero.expand(B, H, T_Q, 1), dlse, scale=scale, causal=causal)
        return dq, dk, dv
    delta = softmax.backward_delta(o, do, dlse)
    lse = lse.contiguous()
    BLOCK_D, BLOCK_DV = softmax.head_block(D), softmax.head_block(DV)
    common = dict(BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, CAUSAL=causal, EVEN_D=(D == BLOCK_D and DV == BLOCK_DV),
                  PRECISION=precision_for(q.dtype))
    sizes = (H, T_Q, T_K, D, DV, scale * softmax.LOG2E.value, scale, length_bucket(max(T_Q, T_K)))
    _dkdv[lambda meta: (triton.cdiv(T_K, meta["BLOCK_N"]), B * H)](
        q, k, v, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(), *dv.stride(),
        *sizes, **common, **(INTERPRET_DKDV if INTERPRET else {}))
    _dq[lambda meta: (triton.cdiv(T_Q, meta["BLOCK_M"]), B * H)](
        q, k, v, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        *sizes, **common, **(INTERPRET_DQ if INTERPRET else {}))
    return dq, dk, dv


__all__ = ["flash_attention_backward"]
