"""Top-k attention in Triton: each query's softmax over its own gathered keys, forward and backward.

What it computes (``attnlib/topk.py``): for query ``t`` of head ``(b, h)`` and its selected keys
``S_t = {indices[b, 0, t, i] >= 0}`` (shared by the heads), ``o_t = sum_{s in S_t} exp(s_ts - lse_t) v_s``
with ``s_ts = scale q_t . k_s`` and ``lse_t = log sum_{s in S_t} exp(s_ts)``.

Why no ``tl.dot``. Every (query, head) has its own key set, and in the house layout ``[B, H, T, D]``
every head its own keys: a selected key row is read for one (query, head) and used once. The work is
a batch of matrix-vector products -- ``k`` dot products of length ``D``, then a ``k``-term weighted sum
of value rows -- with nothing for a tensor core to reuse, and it is bound by the gathered reads
(``k (D + Dv)`` elements per query and head), not by arithmetic. So the products are elementwise
multiplies and ``tl.sum`` reductions in float32, on the CUDA cores, in every dtype.

Forward -- grid ``(Tq, B * H)``: one program per (query, head). It walks the query's ``n`` slots in
blocks of ``BLOCK_N``: loads the indices, gathers the key rows ``[BLOCK_N, BLOCK_D]`` and value rows
``[BLOCK_N, BLOCK_DV]`` of the valid slots (index ``>= 0``: masked loads, ``other=0``, so a padded slot
or an unselected key is never read, whatever ``k`` or ``v`` hold there), scores them (``-inf`` on
invalid slots, by ``tl.where`` before anything is multiplied with them) and folds them into the
running max, sum and value sum of the online softmax (base 2, as ``common/online_softmax.py``).
It writes ``o`` and the natural-log ``lse`` (float32). A NaN or inf inside ``S_t`` makes row ``t`` NaN,
as in the reference -- a row whose selected logits are all ``-inf`` too (``o`` NaN, ``lse = -inf``); a
row with no valid slot (never produced by the selection) is empty: ``o = 0`` and ``lse = -inf``.

Backward -- grid ``(Tq, B * H)``, one kernel. With ``P = exp(s - lse)`` recomputed from the saved LSE,
``dP = dO . v_s`` and ``delta_t = dO_t . o_t - dlse_t`` (``online_softmax.backward_delta``),
``dS = P (dP - delta)``; the program keeps ``dq_t = scale sum_s dS_ts k_s`` in registers and
*scatters* ``scale dS_ts q_t`` into ``dk[s]`` and ``P_ts dO_t`` into ``dv[s]`` with float32 atomic adds
(masked to the valid slots). Why atomics: the transpose of the selection -- for each key, the
queries that chose it -- is as irregular as the selection itself (a few keys, attention sinks, are
chosen by nearly every query, most by few), so a gather-by-key backward would need a sort of the
``B Tq k`` pairs and would hand one program nearly all the work; the atomics spread it over the
query programs, and contention is only on the popular keys. The price: the summation order of
``dk``, ``dv`` varies from run to run (not bitwise deterministic), and two float32 ``[B, H, Tk, D]``
buffers, cast to the inputs' dtype at the end.

Tiles. ``BLOCK_D``, ``BLOCK_DV`` cover the head dims (powers of two, up to 256); ``BLOCK_N`` slots per
step so that a gathered tile holds 2048 elements per operand (32 slots at D <= 64, 16 at 128; at D = 256
the floor of 16 slots, 4096; at most the next power of two of ``n``), over 8 warps: 8 (16) registers per
thread for each float32 tile (the backward also holds the 64-bit pointer tiles of its two atomic adds). There is no
shared-memory tile to size (no product is staged: 0.5-4 KB of reduction scratch), so the same launch
fits a T4's 64 KB and every larger GPU. Under the interpreter ``BLOCK_N = 4``, so small CPU tests cross
several slot blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import launch
from ..common.online_softmax import LN2, LOG2E, backward_delta


@triton.jit
def _gather_rows(base, idx, valid, offs_c, stride_t, stride_c, C):
    """Rows ``idx`` of the ``[T, C]`` matrix at ``base``, float32 ``[BLOCK_N, BLOCK_C]``; invalid slots and
    columns past ``C`` are never read (zeros)."""
    safe = tl.where(valid, idx, 0)
    ptrs = base + safe[:, None] * stride_t + offs_c[None, :] * stride_c
    return tl.load(ptrs, mask=valid[:, None] & (offs_c[None, :] < C), other=0.0).to(tl.float32)


@triton.jit
def _slots(IDX_row, stride_is, start, offs_n, N_SEL, T_K):
    """The indices of slots ``start + offs_n`` and which of them name a key (``-1`` and past ``n``: none)."""
    slot = start + offs_n
    idx = tl.load(IDX_row + slot * stride_is, mask=slot < N_SEL, other=-1)
    return idx, (idx >= 0) & (idx < T_K)


@triton.jit
def _topk_attn_fwd_kernel(Q, K, V, IDX, O, LSE,
                          stride_qb, stride_qh, stride_qt, stride_qd,
                          stride_kb, stride_kh, stride_kt, stride_kd,
                          stride_vb, stride_vh, stride_vt, stride_vd,
                          stride_ib, stride_it, stride_is,
                          stride_ob, stride_oh, stride_ot, stride_od,
                          H, T_Q, T_K, N_SEL, D, DV, qk_scale,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + b * stride_qb + h * stride_qh + t * stride_qt + offs_d * stride_qd, mask=offs_d < D,
                other=0.0).to(tl.float32)
    K_base = K + b * stride_kb + h * stride_kh
    V_base = V + b * stride_vb + h * stride_vh
    IDX_row = IDX + b * stride_ib + t * stride_it

    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), dtype=tl.float32), 0)    # scalars: max, sum; no key yet
    l_i = tl.sum(tl.zeros([BLOCK_N], dtype=tl.float32), 0)
    n_keys = tl.sum(tl.zeros([BLOCK_N], dtype=tl.int32), 0)                   # valid slots seen
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for start in range(0, N_SEL, BLOCK_N):
        idx, valid = _slots(IDX_row, stride_is, start, offs_n, N_SEL, T_K)
        k = _gather_rows(K_base, idx, valid, offs_d, stride_kt, stride_kd, D)             # [BLOCK_N, BLOCK_D]
        s = tl.where(valid, tl.sum(k * q[None, :], 1) * qk_scale, float("-inf"))        # base-2 logits
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)                             # no valid slot yet
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref)                                                           # 0 on invalid slots
        v = _gather_rows(V_base, idx, valid, offs_dv, stride_vt, stride_vd, DV)          # [BLOCK_N, BLOCK_DV]
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        m_i = m_new
        n_keys += tl.sum(valid.to(tl.int32), 0)

    # l = 0: no valid slot (empty: o = 0) or every selected logit -inf from a non-finite input (o NaN,
    # inf - inf as in the definition); lse = -inf either way, +inf with a +inf logit.
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = tl.where(empty & (n_keys > 0), float("nan"), acc / l_safe)
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    tl.store(O + b * stride_ob + h * stride_oh + t * stride_ot + offs_dv * stride_od,
             o.to(O.dtype.element_ty), mask=offs_dv < DV)
    tl.store(LSE + pid_bh * T_Q + t, tl.where(m_i == float("inf"), float("inf"), lse))


@triton.jit
def _topk_attn_bwd_kernel(Q, K, V, IDX, DO, LSE, DELTA, DQ, DK, DV_OUT,
                          stride_qb, stride_qh, stride_qt, stride_qd,
                          stride_kb, stride_kh, stride_kt, stride_kd,
                          stride_vb, stride_vh, stride_vt, stride_vd,
                          stride_ib, stride_it, stride_is,
                          stride_dob, stride_doh, stride_dot, stride_dod,
                          stride_dqb, stride_dqh, stride_dqt, stride_dqd,
                          stride_dkb, stride_dkh, stride_dkt, stride_dkd,
                          stride_dvb, stride_dvh, stride_dvt, stride_dvd,
                          H, T_Q, T_K, N_SEL, D, DV, qk_scale, sm_scale,
                          BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    dmask = offs_d < D
    dvmask = offs_dv < DV
    q = tl.load(Q + b * stride_qb + h * stride_qh + t * stride_qt + offs_d * stride_qd, mask=dmask,
                other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_dob + h * stride_doh + t * stride_dot + offs_dv * stride_dod, mask=dvmask,
                 other=0.0).to(tl.float32)
    lse2 = tl.load(LSE + pid_bh * T_Q + t) * LOG2E          # +inf on a row with no key: P = 0 there
    delta = tl.load(DELTA + pid_bh * T_Q + t)
    K_base = K + b * stride_kb + h * stride_kh
    V_base = V + b * stride_vb + h * stride_vh
    DK_base = DK + b * stride_dkb + h * stride_dkh
    DV_base = DV_OUT + b * stride_dvb + h * stride_dvh
    IDX_row = IDX + b * stride_ib + t * stride_it

    dq = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, N_SEL, BLOCK_N):
        idx, valid = _slots(IDX_row, stride_is, start, offs_n, N_SEL, T_K)
        k = _gather_rows(K_base, idx, valid, offs_d, stride_kt, stride_kd, D)
        v = _gather_rows(V_base, idx, valid, offs_dv, stride_vt, stride_vd, DV)
        s = tl.where(valid, tl.sum(k * q[None, :], 1) * qk_scale, float("-inf"))
        p = tl.exp2(s - lse2)                                                            # 0 on invalid slots
        dp = tl.sum(v * do[None, :], 1)
        ds = tl.where(valid, p * (dp - delta), 0.0)
        dq += tl.sum(ds[:, None] * k, 0)
        safe = tl.where(valid, idx, 0)
        tl.atomic_add(DK_base + safe[:, None] * stride_dkt + offs_d[None, :] * stride_dkd,
                      (ds * sm_scale)[:, None] * q[None, :], mask=valid[:, None] & dmask[None, :], sem="relaxed")
        tl.atomic_add(DV_base + safe[:, None] * stride_dvt + offs_dv[None, :] * stride_dvd,
                      p[:, None] * do[None, :], mask=valid[:, None] & dvmask[None, :], sem="relaxed")
    tl.store(DQ + b * stride_dqb + h * stride_dqh + t * stride_dqt + offs_d * stride_dqd,
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=dmask)


GATHER_ELEMENTS = 2048      # elements of one gathered [BLOCK_N, BLOCK_D] operand tile (8 warps: 8 per thread)
MAX_SLOTS = 128             # slot block cap: a wider block only adds masked lanes for n <= 128
INTERPRET_SLOTS = 4
NUM_WARPS = 8               # both kernels (with 4, ptxas spilled 4 B in the bf16 forward at D = 128 on sm_89;
                            # with 4096-element tiles, 8 warps spilled 4 B there in fp16)


def slot_block(n: int, D: int, Dv: int) -> int:
    """``BLOCK_N`` on a GPU: slots per step (see the module docstring)."""
    width = max(launch.head_block(D), launch.head_block(Dv))
    return max(16, min(GATHER_ELEMENTS // width, MAX_SLOTS, triton.next_power_of_2(max(n, 1))))


def _tiles(q, v, n: int) -> dict:
    D, DV = q.shape[3], v.shape[3]
    # One candidate (the slot block fixes nothing but the step): launch.choose, as every launch.
    slots = launch.choose([triton.Config({"BLOCK_N": slot_block(n, D, DV)}, num_warps=NUM_WARPS)], {}, q.device,
                          interpret=dict(BLOCK_N=INTERPRET_SLOTS))
    return dict(slots, BLOCK_D=launch.head_block(D), BLOCK_DV=launch.head_block(DV), num_warps=NUM_WARPS)


def topk_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *,
                           scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o [B, H, Tq, Dv] in q's dtype, lse [B, H, Tq] float32)``. Inputs validated by ``attnlib.topk``;
    ``indices [B, 1, Tq, n]`` (int64 or int32, ``-1`` = empty slot, shared by the heads)."""
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    n = indices.shape[3]
    launch.require_launchable(q, D, DV)
    o = torch.empty(B, H, T_Q, DV, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    if B * H * T_Q == 0:
        return o, lse
    _topk_attn_fwd_kernel[(T_Q, B * H)](
        q, k, v, indices, o, lse,
        *q.stride(), *k.stride(), *v.stride(), indices.stride(0), indices.stride(2), indices.stride(3), *o.stride(),
        H, T_Q, T_K, n, D, DV, scale * LOG2E.value, **_tiles(q, v, n))
    return o, lse


def topk_attention_backward(q, k, v, indices, o, lse, do, dlse, *, scale: float):
    """Gradients ``(dq, dk, dv)`` of :func:`topk_attention_forward` in the inputs' dtypes, for the
    gradients ``do`` on ``o`` and ``dlse`` (or ``None``) on ``lse``. ``dk``, ``dv`` are summed in float32
    with atomic adds (their order, hence their last bits, may vary from run to run)."""
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    n = indices.shape[3]
    launch.require_launchable(q, D, DV)
    dk32 = torch.zeros(B, H, T_K, D, device=q.device, dtype=torch.float32)
    dv32 = torch.zeros(B, H, T_K, DV, device=q.device, dtype=torch.float32)
    dq = torch.empty_like(q)
    if B * H * T_Q == 0:
        return dq, dk32.to(k.dtype), dv32.to(v.dtype)
    if dlse is not None:
        # A row with no key depends on no score: whatever the loss on its lse (-inf), no gradient.
        dlse = torch.where(torch.isneginf(lse), torch.zeros_like(dlse), dlse)
    delta = backward_delta(o, do, dlse)
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse).contiguous()
    _topk_attn_bwd_kernel[(T_Q, B * H)](
        q, k, v, indices, do, lse, delta, dq, dk32, dv32,
        *q.stride(), *k.stride(), *v.stride(), indices.stride(0), indices.stride(2), indices.stride(3),
        *do.stride(), *dq.stride(), *dk32.stride(), *dv32.stride(),
        H, T_Q, T_K, n, D, DV, scale * LOG2E.value, scale, **_tiles(q, v, n))
    return dq, dk32.to(k.dtype), dv32.to(v.dtype)


__all__ = ["slot_block", "topk_attention_backward", "topk_attention_forward"]
