"""Flash-attention forward in Triton: one pass over the keys, online softmax, LSE written out.

Tiling. The grid is ``(cdiv(Tq, BLOCK_M), B * H)``: one program owns ``BLOCK_M`` query rows of one
(batch, head). Its ``q`` tile ``[BLOCK_M, D]`` stays in registers; it walks the keys in tiles of
``BLOCK_N``, and for each tile computes the scores ``s = q k^T`` ``[BLOCK_M, BLOCK_N]`` and folds them
into three running quantities per row:

    m_i  -- the running max of the scores seen so far (base-2 units),
    l_i  -- the running sum of exp2(s - m_i),
    acc  -- the running sum of exp2(s - m_i) v_j, ``[BLOCK_M, Dv]``.

When a new tile raises the max from ``m`` to ``m'``, old sums are rescaled by ``exp2(m - m')``.
At the end ``o = acc / l`` and ``lse = (m + log2 l) * ln 2`` -- the log-sum-exp of the row, i.e.
chapter 1's dual potential, computed as a streaming reduction. Only ``o`` and ``lse`` go back to
memory: the ``[T, T]`` plan never exists.

The key loop runs in two stages so that the inner loop of the common case has no masks:
  * unmasked tiles: every key is valid for every row of the program
    (non-causal: all full tiles; causal: the tiles strictly left of the diagonal block);
  * masked tiles: the ragged tail ``Tk % BLOCK_N`` and, when causal, the diagonal block.
Causal masking is top-left aligned with ``Tq == Tk`` (query i sees keys j <= i), as in SDPA.

Scores are scaled by ``scale * log2(e)`` so that ``exp2`` (one instruction) replaces ``exp``.
Head dims that are not powers of two are padded to ``BLOCK_D`` with masked loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._backend import INTERPRET

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def _fold_key_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, offs_m, offs_n, offs_d, offs_dv,
                   stride_kt, stride_vt, T_K, D, DV, qk_scale,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                   PRECISION: tl.constexpr):
    """Fold keys ``start_n .. start_n + BLOCK_N`` into the running (acc, l, m) of a query tile."""
    offs_kn = start_n + offs_n
    if MASKED:
        kmask = (offs_kn[None, :] < T_K) & (offs_d[:, None] < D)
        vmask = (offs_kn[:, None] < T_K) & (offs_dv[None, :] < DV)
        k = tl.load(k_ptrs + start_n * stride_kt, mask=kmask, other=0.0)      # [BLOCK_D, BLOCK_N]
        v = tl.load(v_ptrs + start_n * stride_vt, mask=vmask, other=0.0)      # [BLOCK_N, BLOCK_DV]
    elif EVEN_D:
        k = tl.load(k_ptrs + start_n * stride_kt)
        v = tl.load(v_ptrs + start_n * stride_vt)
    else:
        k = tl.load(k_ptrs + start_n * stride_kt, mask=offs_d[:, None] < D, other=0.0)
        v = tl.load(v_ptrs + start_n * stride_vt, mask=offs_dv[None, :] < DV, other=0.0)

    s = tl.dot(q, k, input_precision=PRECISION) * qk_scale                    # base-2 logits
    if MASKED:
        valid = offs_kn[None, :] < T_K
        if CAUSAL:
            valid = valid & (offs_kn[None, :] <= offs_m[:, None])
        s = tl.where(valid, s, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(s, 1))
    # A row with no valid key yet keeps m = -inf; subtracting 0 instead keeps exp2 at 0, not NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE,
                      stride_qb, stride_qh, stride_qt, stride_qd,
                      stride_kb, stride_kh, stride_kt, stride_kd,
                      stride_vb, stride_vh, stride_vt, stride_vd,
                      stride_ob, stride_oh, stride_ot, stride_od,
                      stride_lb, stride_lh, stride_lt,
                      H, T_Q, T_K, D, DV, qk_scale,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < T_Q) & (offs_d[None, :] < D), other=0.0)
    # k is read transposed, [BLOCK_D, BLOCK_N], so that s = q @ k needs no in-register transpose.
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[None, :] * stride_kt + offs_d[:, None] * stride_kd
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_dv[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    if CAUSAL:
        full_end = start_m                                  # tiles wholly left of the diagonal
        masked_end = tl.minimum(start_m + BLOCK_M, T_K)     # the diagonal tile(s)
    else:
        full_end = (T_K // BLOCK_N) * BLOCK_N
        masked_end = T_K

    for start_n in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _fold_key_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, offs_m, offs_n,
                                       offs_d, offs_dv, stride_kt, stride_vt, T_K, D, DV, qk_scale,
                                       MASKED=False, CAUSAL=CAUSAL, EVEN_D=EVEN_D, PRECISION=PRECISION)
    for start_n in range(full_end, masked_end, BLOCK_N):
        acc, l_i, m_i = _fold_key_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, offs_m, offs_n,
                                       offs_d, offs_dv, stride_kt, stride_vt, T_K, D, DV, qk_scale,
                                       MASKED=True, CAUSAL=CAUSAL, EVEN_D=EVEN_D, PRECISION=PRECISION)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                 # only padded rows (>= T_Q) have l = 0
    o = acc / l_safe[:, None]
    lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453      # natural-log LSE of the scaled scores

    o_ptrs = O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_dv[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=(offs_m[:, None] < T_Q) & (offs_dv[None, :] < DV))
    tl.store(LSE + b * stride_lb + h * stride_lh + offs_m * stride_lt, lse, mask=offs_m < T_Q)


# Bytes of shared memory the tiles may take: the q tile plus ``stages`` buffered (k, v) tiles. Hopper
# offers 227 KiB per block and Ampere 163 KiB; leave room for the layout conversions Triton adds.
_SMEM_BUDGET = 128 * 1024


def _pick_blocks(D: int, elem_bytes: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Small tiles under the interpreter (it is slow and
    numpy-backed); on a GPU the Triton tutorial's shapes, shrunk until the tiles fit in shared memory
    (wide heads such as D=256, and float32, would otherwise fail to launch with OutOfResources)."""
    if device.type != "cuda":
        return 32, 16, 4, 1
    bm, bn, warps, stages = (128, 64, 4, 3) if D <= 64 else (128, 64, 8, 3)
    bd = max(16, triton.next_power_of_2(D))

    def smem(bm, bn, stages):
        return elem_bytes * (bm * bd + stages * bn * 2 * bd)

    while smem(bm, bn, stages) > _SMEM_BUDGET:
        if bn > 32:
            bn //= 2
        elif bm > 64:
            bm, warps = bm // 2, 4
        elif stages > 1:
            stages -= 1
        else:
            break
    return bm, bn, warps, stages


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                            causal: bool, block_m: int | None = None, block_n: int | None = None,
                            num_warps: int | None = None, num_stages: int | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. Inputs already validated by ``attnlib.softmax_attention``.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; any strides. Returns ``(o, lse float32)``.
    """
    if q.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1")
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    if max(D, DV) > 256:
        raise ValueError(f"the Triton kernel supports head dims up to 256; got D={D}, Dv={DV} "
                         "(use backend='torch')")
    o = torch.empty(B, H, T_Q, DV, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    if o.numel() == 0:
        lse.zero_()
        return o, lse
    BM, BN, warps, stages = _pick_blocks(max(D, DV), q.element_size(), q.device)
    # Explicit tiles override the defaults (benchmarks/tune_flash.py sweeps them).
    BM, BN = block_m or BM, block_n or BN
    warps, stages = num_warps or warps, num_stages or stages
    if causal and BM % BN:
        raise ValueError(f"causal tiling needs BLOCK_M a multiple of BLOCK_N; got {BM}, {BN}")
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_DV = max(16, triton.next_power_of_2(DV))
    precision = "ieee" if q.dtype == torch.float32 else "tf32"   # exact fp32 products; tf32 unused for half
    grid = (triton.cdiv(T_Q, BM), B * H)
    _flash_fwd_kernel[grid](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        H, T_Q, T_K, D, DV, scale * LOG2E,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV,
        CAUSAL=causal, EVEN_D=(D == BLOCK_D and DV == BLOCK_DV), PRECISION=precision,
        num_warps=warps, num_stages=stages,
    )
    return o, lse


__all__ = ["flash_attention_forward"]
