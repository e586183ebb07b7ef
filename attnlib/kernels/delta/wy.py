"""The WY (UT) representation of a chunk of delta-rule steps, forward and backward. Everything here
is independent per chunk: the grid of every kernel is ``(chunks, B * H)``.

Per chunk (rows ``K [C, D]``, ``V [C, Dv]``, ``beta [C]``, chunk-local gate cumsum ``G [C]``,
``gamma = exp(G)``, ``Gamma_ij = exp(G_i - G_j)``):

    A  = strictly_lower(diag(beta) (K K^T . Gamma))        _kkt_kernel     -> A  [B, H, T, C] float32
    Ai = (I + A)^{-1}                                       ../common/solve_tril.py
    W  = Ai (beta gamma . K),   U = Ai (beta . V)           _w_u_kernel     -> W [B, H, T, D], U [B, H, T, Dv]

``_kkt_kernel``: one program loads ``K [CHUNK, BLOCK_D]`` (all of D), forms ``K K^T`` with one ``tl.dot``
(fp32 accumulation), scales and masks it and writes the ``[CHUNK, CHUNK]`` tile.
``_w_u_kernel``: one program loads ``Ai [CHUNK, CHUNK]`` and ``K``, writes ``W``, then loops over
``BLOCK_V``-wide value tiles writing ``U``.

Backward (``_wy_bwd_kernel``), given ``dW`` and ``dU`` (= the gradient of ``v_new = U - W h``):

    dV    = beta . (Ai^T dU)
    dK   += beta gamma . (Ai^T dW) + M' K + M'^T K,       M' = beta . dA . Gamma (strict)
    dbeta = rowsum((Ai^T dU) . V) + rowsum((Ai^T dW) . gamma K) + rowsum(dA . Gamma . K K^T)
    dG   += rowsum((Ai^T dW) . beta gamma K) + rowsum(dA . A) - colsum(dA . A)
    with dAi = dW (beta gamma K)^T + dU (beta V)^T  and  dA = -(Ai^T dAi Ai^T), strictly lower.

One program per chunk holds only ``[CHUNK, CHUNK]`` float32 tiles across its loops -- ``Ai``, the
accumulators ``dAi`` and ``K K^T``, then ``dA`` -- and walks ``D`` in ``BLOCK_K``-wide key tiles (on a
GPU at most 64 and at most the chunk, ``launch.key_block``): (1) key tiles: ``dAi = dW (beta gamma
K)^T``, ``K K^T`` and the ``Ai^T dW`` parts of ``dbeta``, ``dG``; (2) value tiles: ``dV`` and the ``dU``
part of ``dAi``; (3) key tiles again: ``dK``, recomputing ``Ai^T dW`` rather than holding it, added into
the tensor the output backward wrote (the same program owns those rows: no atomics), as is ``dG``.
Holding ``K``, ``dW``, ``Ai^T dW`` and ``dK`` for all of ``D`` at once spilled registers
(``scripts/kernel_resources.py``); so did 4 warps at chunk 64 (8 are launched there). All products with
``Ai`` or gradients run in float32 (tf32 on a GPU for half inputs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.chunk_tiles import chunk_rows, gate_ratio, load_chunk, store_chunk
from ..common.launch import dim_block, key_block, num_chunks, precisions, stages, value_block, warps


@triton.jit
def _kkt_kernel(K, BETA, G, A, T, D,
                CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, GATED: tl.constexpr, PIN: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    offs_c, offs_d, t, tmask, kd = chunk_rows(tl.program_id(0), T, D, CHUNK, BLOCK_D)
    k = load_chunk(K, bh, T, t, offs_d, D, kd)
    beta = tl.load(BETA + bh * T + t, mask=tmask, other=0.0).to(tl.float32)
    a = tl.dot(k, tl.trans(k), input_precision=PIN)                           # K K^T, fp32
    strict = (offs_c[:, None] > offs_c[None, :]) & tmask[:, None]
    if GATED:
        g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
        a = a * gate_ratio(g[:, None], g[None, :], strict)
    a = tl.where(strict, a * beta[:, None], 0.0)
    store_chunk(A, a, bh, T, t, offs_c, CHUNK, tmask[:, None])


@triton.jit
def _chunk_ai_beta_k(Ai, BETA, K, bh, T, D, t, tmask, offs_c, offs_d, kd, CHUNK: tl.constexpr):
    """A chunk's ``(I + A)^{-1}`` tile ``[CHUNK, CHUNK]``, its ``beta [CHUNK]`` and ``K [CHUNK, BLOCK_D]``,
    float32 (0 past ``T``): what the W/U recomputation starts from."""
    ai = load_chunk(Ai, bh, T, t, offs_c, CHUNK, tmask[:, None])
    beta = tl.load(BETA + bh * T + t, mask=tmask, other=0.0).to(tl.float32)
    k = load_chunk(K, bh, T, t, offs_d, D, kd).to(tl.float32)
    return ai, beta, k


@triton.jit
def _w_u_kernel(K, V, BETA, G, Ai, W, U, T, D, DV,
                CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                GATED: tl.constexpr, P32: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    offs_c, offs_d, t, tmask, kd = chunk_rows(tl.program_id(0), T, D, CHUNK, BLOCK_D)
    ai, beta, k = _chunk_ai_beta_k(Ai, BETA, K, bh, T, D, t, tmask, offs_c, offs_d, kd, CHUNK)
    kb = k * beta[:, None]
    if GATED:
        g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
        kb = kb * tl.exp(g)[:, None]
    w = tl.dot(ai, kb, input_precision=P32)
    store_chunk(W, w.to(W.dtype.element_ty), bh, T, t, offs_d, D, kd)
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        v = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
        u = tl.dot(ai, v * beta[:, None], input_precision=P32)
        store_chunk(U, u.to(U.dtype.element_ty), bh, T, t, offs_v, DV, kv)


@triton.jit
def _wy_bwd_kernel(K, V, BETA, G, Ai, DW, DU, DK, DV_OUT, DBETA, DG, T, D, DV,
                   CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                   GATED: tl.constexpr, P32: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    offs_c, _, t, tmask, _ = chunk_rows(tl.program_id(0), T, D, CHUNK, BLOCK_K)
    strict = (offs_c[:, None] > offs_c[None, :]) & tmask[:, None]
    ait = tl.trans(load_chunk(Ai, bh, T, t, offs_c, CHUNK, tmask[:, None]))
    beta = tl.load(BETA + bh * T + t, mask=tmask, other=0.0).to(tl.float32)
    bg = beta                                                                     # beta gamma, per row
    if GATED:
        g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
        bg = beta * tl.exp(g)
    dai = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    kk = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    dbeta = tl.zeros([CHUNK], dtype=tl.float32)
    # 1. Key tiles: dAi = dW (beta gamma K)^T, K K^T, and the Ai^T dW parts of dbeta and dG.
    for k0 in range(0, D, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        k = load_chunk(K, bh, T, t, offs_k, D, kd).to(tl.float32)
        dw = load_chunk(DW, bh, T, t, offs_k, D, kd)
        dai += tl.dot(dw, tl.trans(k * bg[:, None]), input_precision=P32)
        kk += tl.dot(k, tl.trans(k), input_precision=P32)
        dbeta += tl.sum(tl.dot(ait, dw, input_precision=P32) * k, axis=1)        # rowsum((Ai^T dW) . K)
    dg = dbeta * bg                                                               # rowsum((Ai^T dW) . beta gamma K)
    if GATED:
        dbeta = dbeta * tl.exp(g)                                                 # rowsum((Ai^T dW) . gamma K)
    # 2. Value tiles: dV = beta . (Ai^T dU), dAi += dU (beta V)^T.
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        v = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
        du = load_chunk(DU, bh, T, t, offs_v, DV, kv)
        dai += tl.dot(du, tl.trans(v * beta[:, None]), input_precision=P32)    # + dU (beta V)^T
        tu = tl.dot(ait, du, input_precision=P32)                               # Ai^T dU
        store_chunk(DV_OUT, tu * beta[:, None], bh, T, t, offs_v, DV, kv)
        dbeta += tl.sum(tu * v, axis=1)
    da = -tl.dot(ait, tl.dot(dai, ait, input_precision=P32), input_precision=P32)
    da = tl.where(strict, da, 0.0)
    if GATED:
        da = da * gate_ratio(g[:, None], g[None, :], strict)                    # dA . Gamma
    dbeta += tl.sum(da * kk, axis=1)
    tl.store(DBETA + bh * T + t, dbeta, mask=tmask)
    m = da * beta[:, None]
    if GATED:
        r = m * kk                                                                # dA . A
        dg += tl.sum(r, axis=1) - tl.sum(r, axis=0)
        dg += tl.load(DG + bh * T + t, mask=tmask, other=0.0)
        tl.store(DG + bh * T + t, dg, mask=tmask)
    # 3. Key tiles again: dK += beta gamma . (Ai^T dW) + M' K + M'^T K (Ai^T dW recomputed, not held).
    for k0 in range(0, D, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        k = load_chunk(K, bh, T, t, offs_k, D, kd).to(tl.float32)
        dw = load_chunk(DW, bh, T, t, offs_k, D, kd)
        dk = load_chunk(DK, bh, T, t, offs_k, D, kd)
        dk += tl.dot(ait, dw, input_precision=P32) * bg[:, None]
        dk += tl.dot(m, k, input_precision=P32) + tl.dot(tl.trans(m), k, input_precision=P32)
        store_chunk(DK, dk, bh, T, t, offs_k, D, kd)


def chunk_scaled_dot_kkt(k, beta, G, chunk_size: int) -> torch.Tensor:
    """``A = strictly_lower(diag(beta)(K K^T . Gamma))`` per chunk: float32 ``[B, H, T, CHUNK]``."""
    B, H, T, D = k.shape
    A = torch.empty(B, H, T, chunk_size, device=k.device, dtype=torch.float32)
    if A.numel() == 0:
        return A
    pin, _ = precisions(k.dtype)
    BLOCK_D = dim_block(D)
    _kkt_kernel[(num_chunks(T, chunk_size), B * H)](k, beta, G if G is not None else A, A, T, D,
                                                    CHUNK=chunk_size, BLOCK_D=BLOCK_D, GATED=G is not None,
                                                    PIN=pin, num_warps=warps(chunk_size, BLOCK_D),
                                                    num_stages=stages(k.device))
    return A


def recompute_w_u(k, v, beta, G, Ai, chunk_size: int, out_dtype=None, block_v=None):
    """``W = Ai (beta gamma . K)``, ``U = Ai (beta . V)`` per chunk, in ``out_dtype`` (default k's)."""
    B, H, T, D = k.shape
    DV = v.shape[-1]
    dt = out_dtype or k.dtype
    w = torch.empty(B, H, T, D, device=k.device, dtype=dt)
    u = torch.empty(B, H, T, DV, device=k.device, dtype=dt)
    if B * H * T == 0:
        return w, u
    _, p32 = precisions(k.dtype)
    BLOCK_D = dim_block(D)
    _w_u_kernel[(num_chunks(T, chunk_size), B * H)](
        k, v, beta, G if G is not None else Ai, Ai, w, u, T, D, DV,
        CHUNK=chunk_size, BLOCK_D=BLOCK_D, BLOCK_V=value_block(DV, D, k.device, block_v), GATED=G is not None,
        P32=p32, num_warps=warps(chunk_size, BLOCK_D), num_stages=stages(k.device))
    return w, u


def wy_backward(k, v, beta, G, Ai, dw, du, dk, dG, chunk_size: int, block_v=None, block_k=None):
    """Backward of ``recompute_w_u`` and ``chunk_scaled_dot_kkt`` through ``Ai``. Adds into ``dk`` (and
    ``dG``) in place; returns ``(dv, dbeta)``, float32. ``block_v``/``block_k`` force the tile widths."""
    B, H, T, D = k.shape
    DV = v.shape[-1]
    dv = torch.empty(B, H, T, DV, device=k.device, dtype=torch.float32)
    dbeta = torch.empty(B, H, T, device=k.device, dtype=torch.float32)
    if B * H * T == 0:
        return dv, dbeta
    _, p32 = precisions(k.dtype)
    BLOCK_K = key_block(D, k.device, block_k, widest=min(64, chunk_size))   # 64 at chunk 32 spilled (D 256)
    _wy_bwd_kernel[(num_chunks(T, chunk_size), B * H)](
        k, v, beta, G if G is not None else dbeta, Ai, dw, du, dk, dv, dbeta, dG if dG is not None else dbeta,
        T, D, DV, CHUNK=chunk_size, BLOCK_K=BLOCK_K, BLOCK_V=value_block(DV, D, k.device, block_v),
        GATED=G is not None, P32=p32, num_stages=1,                      # see launch.kernel_chunk
        num_warps=8 if chunk_size >= 64 else 4)   # 4 warps at chunk 64 spill: scripts/kernel_resources.py
    return dv, dbeta
