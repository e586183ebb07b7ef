"""Chunkwise DeltaNet / Gated DeltaNet forward in Triton (the WY / UT form).

Tiling. The grid is ``(B * H, cdiv(Dv, BLOCK_DV))``. One program owns one (batch, head) and a slice
of ``BLOCK_DV`` rows of the state ``S [Dv, D]`` -- the rows of ``S`` evolve independently (row ``i``
only ever sees ``v[:, i]``), so splitting ``Dv`` across programs needs no communication. The state
slice ``[BLOCK_DV, BLOCK_D]`` lives in registers, in float32, for the whole sequence; the program walks
the chunks of ``CHUNK`` tokens in order and for each one

    1. loads ``K, Q [CHUNK, BLOCK_D]``, ``V [CHUNK, BLOCK_DV]``, ``beta`` (and ``g``) ``[CHUNK]``;
    2. builds ``A = tril(diag(beta)(K K^T . Gamma), -1)`` ``[CHUNK, CHUNK]`` (``Gamma_tj = exp(G_t - G_j)``,
       ``G`` the within-chunk cumulative sum of ``g``);
    3. solves ``(I + A) T = diag(beta)`` by forward substitution, one row per step: row ``i`` of ``T`` is
       ``beta_i e_i - sum_{j<i} A_ij T_j``, applied to the whole tile with a ``tl.where`` on the row
       index (rows not yet solved hold zeros, and ``A_ij = 0`` for ``j >= i``);
    4. forms ``W = T diag(gamma) K``, ``U' = T V - W S^T`` and writes ``O = diag(gamma) Q S^T +
       (Q K^T . Gamma . M) U'`` -- the only thing that goes back to memory besides the final state;
    5. updates ``S <- gamma_C S + U'^T diag(gamma_C / gamma) K``.

Every product is a ``tl.dot`` with float32 accumulation; ``T`` and the state never leave the
program. Tokens past ``T`` (the ragged last chunk) load as ``k = v = q = 0``, ``beta = g = 0``, which
makes them identity steps. Head dims are padded to powers of two (at least 16, ``tl.dot``'s minimum)
with masked loads. The sequential walk over chunks is the price of the simple design: parallelism
is ``B * H * cdiv(Dv, BLOCK_DV)`` programs (fla instead precomputes ``T, W, U`` for all chunks in
parallel and keeps only the state pass sequential).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._backend import INTERPRET


@triton.jit
def _delta_chunk_fwd_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, s0_ptr, o_ptr, sT_ptr,
    stride_qb, stride_qh, stride_qt, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_vb, stride_vh, stride_vt, stride_vd,
    stride_bb, stride_bh, stride_bt,
    stride_gb, stride_gh, stride_gt,
    stride_ob, stride_oh, stride_ot, stride_od,
    H, T, D, DV, scale,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    GATED: tl.constexpr, HAS_S0: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H

    offs_c = tl.arange(0, CHUNK)                       # token within chunk (rows)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = pid_v * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dmask = offs_d < D
    vmask = offs_v < DV
    row = offs_c[:, None]                              # [C, 1]
    col = offs_c[None, :]                              # [1, C]
    strict_lower = row > col
    lower = row >= col
    eye = tl.where(row == col, 1.0, 0.0)

    # State slice S[offs_v, :] in float32 registers; state tensors are contiguous [B, H, DV, D].
    s_off = pid_bh * DV * D + offs_v[:, None] * D + offs_d[None, :]
    s_mask = vmask[:, None] & dmask[None, :]
    if HAS_S0:
        S = tl.load(s0_ptr + s_off, mask=s_mask, other=0.0).to(tl.float32)
    else:
        S = tl.zeros([BLOCK_DV, BLOCK_D], dtype=tl.float32)

    q_base = q_ptr + b * stride_qb + h * stride_qh
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    o_base = o_ptr + b * stride_ob + h * stride_oh

    for start in range(0, T, CHUNK):
        t_idx = start + offs_c
        tmask = t_idx < T
        kd_mask = tmask[:, None] & dmask[None, :]
        kv_mask = tmask[:, None] & vmask[None, :]
        k = tl.load(k_base + t_idx[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                    mask=kd_mask, other=0.0).to(tl.float32)                          # [C, BD]
        q = tl.load(q_base + t_idx[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                    mask=kd_mask, other=0.0).to(tl.float32) * scale                  # [C, BD]
        v = tl.load(v_base + t_idx[:, None] * stride_vt + offs_v[None, :] * stride_vd,
                    mask=kv_mask, other=0.0).to(tl.float32)                          # [C, BDV]
        beta = tl.load(beta_ptr + b * stride_bb + h * stride_bh + t_idx * stride_bt,
                       mask=tmask, other=0.0).to(tl.float32)                         # [C]

        kk = tl.dot(k, tl.trans(k), input_precision=PRECISION)                       # K K^T
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)                       # Q K^T
        if GATED:
            gl = tl.load(g_ptr + b * stride_gb + h * stride_gh + t_idx * stride_gt,
                         mask=tmask, other=0.0).to(tl.float32)
            # G_t = sum_{r <= t} g_r, as a masked row reduction (no scan needed).
            G = tl.sum(tl.where(lower, gl[None, :], 0.0), axis=1)                    # [C]
            gamma = tl.exp(G)
            G_end = tl.sum(gl, axis=0)
            Gamma = tl.exp(tl.where(lower, G[:, None] - G[None, :], float("-inf")))   # 0 above diag
            kk = kk * Gamma
            qk = qk * Gamma
        A = tl.where(strict_lower, beta[:, None] * kk, 0.0)

        # Forward substitution for T = (I + A)^{-1} diag(beta), row by row.
        Tm = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
        for i in range(CHUNK):
            a_i = tl.sum(tl.where(row == i, A, 0.0), axis=0)                        # A[i, :]
            b_i = tl.sum(tl.where(offs_c == i, beta, 0.0), axis=0)                  # beta_i
            t_i = b_i * tl.sum(tl.where(row == i, eye, 0.0), axis=0) \
                - tl.sum(a_i[:, None] * Tm, axis=0)                                 # row i of T
            Tm = tl.where(row == i, t_i[None, :], Tm)

        if GATED:
            Wk = tl.dot(Tm, k * gamma[:, None], input_precision=PRECISION)           # W = T diag(g) K
        else:
            Wk = tl.dot(Tm, k, input_precision=PRECISION)                           # W = T K
        U = tl.dot(Tm, v, input_precision=PRECISION) \
            - tl.dot(Wk, tl.trans(S), input_precision=PRECISION)                    # U' = TV - W S^T
        qs = tl.dot(q, tl.trans(S), input_precision=PRECISION)                      # Q S^T
        if GATED:
            qs = qs * gamma[:, None]
        else:
            qk = tl.where(lower, qk, 0.0)
        o = qs + tl.dot(qk, U, input_precision=PRECISION)
        tl.store(o_base + t_idx[:, None] * stride_ot + offs_v[None, :] * stride_od,
                 o.to(o_ptr.dtype.element_ty), mask=kv_mask)

        if GATED:
            k_end = k * tl.exp(G_end - G)[:, None]
            S = S * tl.exp(G_end) + tl.dot(tl.trans(U), k_end, input_precision=PRECISION)
        else:
            S = S + tl.dot(tl.trans(U), k, input_precision=PRECISION)

    tl.store(sT_ptr + s_off, S, mask=s_mask)


def delta_rule_chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                             g: torch.Tensor | None = None, *, scale: float, chunk_size: int = 64,
                             initial_state: torch.Tensor | None = None, block_dv: int | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. Inputs already validated by ``attnlib.delta_rule``.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``, ``beta, g: [B, H, T]``, any strides.
    Returns ``(o [B, H, T, Dv] in q's dtype, S_T [B, H, Dv, D] float32)``.
    """
    if q.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1")
    B, H, T, D = q.shape
    DV = v.shape[-1]
    if max(D, DV) > 256:
        raise ValueError(f"the Triton kernel supports head dims up to 256; got D={D}, Dv={DV} "
                         "(use backend='torch')")
    o = torch.empty(B, H, T, DV, device=q.device, dtype=q.dtype)
    sT = torch.empty(B, H, DV, D, device=q.device, dtype=torch.float32)
    if initial_state is not None:
        s0 = initial_state.to(torch.float32).contiguous()
    else:
        s0 = sT                                              # never read (HAS_S0=False)
    if B * H == 0:
        return o, sT
    if T == 0:
        sT.copy_(s0) if initial_state is not None else sT.zero_()
        return o, sT
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_DV = block_dv or min(max(16, triton.next_power_of_2(DV)), 64)
    gg = g if g is not None else beta                        # placeholder pointer when not gated
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (B * H, triton.cdiv(DV, BLOCK_DV))
    _delta_chunk_fwd_kernel[grid](
        q, k, v, beta, gg, s0, o, sT,
        *q.stride(), *k.stride(), *v.stride(), *beta.stride(), *gg.stride(), *o.stride(),
        H, T, D, DV, scale,
        CHUNK=chunk_size, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV,
        GATED=g is not None, HAS_S0=initial_state is not None, PRECISION=precision,
        num_warps=8 if BLOCK_D * BLOCK_DV >= 128 * 64 else 4,
    )
    return o, sT
