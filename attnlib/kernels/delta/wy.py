"""The WY (UT) representation of a chunk of delta-rule steps, forward and backward, one kernel each.
Everything here is independent per chunk: the grid of both kernels is ``(chunks, B * H)``.

Per chunk (rows ``K [C, D]``, ``V [C, Dv]``, ``beta [C]``, log-gates ``g [C]``, their chunk-local cumsum
``G``, ``gamma = exp(G)``, ``Gamma_ij = exp(G_i - G_j)``):

    A  = strictly_lower(diag(beta) (K K^T . Gamma))
    Ai = (I + A)^{-1}
    W  = Ai (beta gamma . K),   U = Ai (beta . V)

``_wy_fwd_kernel`` does all of it in one program per chunk: it scans the gates into ``G`` (stored: the
later kernels read it), accumulates ``K K^T`` over key tiles of ``BLOCK_D`` columns, inverts ``I + A`` in
registers (``../common/solve_tril.py``), and writes ``W`` (key tiles) and ``U`` (value tiles of
``BLOCK_DV``). ``A`` and ``Ai`` never reach memory, and nothing is saved for the backward but the
inputs: the backward runs this kernel again (it needs ``W, U`` and ``G``), which costs one ``K K^T`` and a
solve per chunk and saves writing, and twice reading, a ``[T, C]`` matrix.

Backward (``_wy_bwd_kernel``), given ``dW`` and ``dU`` (= the gradient of ``v_new = U - W h``):

    dV    = beta . (Ai^T dU)
    dK   += beta gamma . (Ai^T dW) + M' K + M'^T K,       M' = beta . dA . Gamma (strict)
    dbeta = rowsum((Ai^T dU) . V) + rowsum((Ai^T dW) . gamma K) + rowsum(dA . Gamma . K K^T)
    dG   += rowsum((Ai^T dW) . beta gamma K) + rowsum(dA . A) - colsum(dA . A)
    with dAi = dW (beta gamma K)^T + dU (beta V)^T  and  dA = -(Ai^T dAi Ai^T), strictly lower.

One program per chunk: (0) key tiles: ``K K^T``, then ``Ai`` in registers, as in the forward;
(1) key tiles: ``dAi = dW (beta gamma K)^T`` and the ``Ai^T dW`` parts of ``dbeta``, ``dG``; (2) value
tiles: ``dV`` and the ``dU`` part of ``dAi``; then ``dA`` and, with ``K K^T`` formed again rather than
held through (1) and (2), the rest of ``dbeta`` and ``dG``; (3) key tiles again: ``dK``, recomputing
``Ai^T dW`` rather than holding it, added into the tensor the output backward wrote (the same program
owns those rows: no atomics). With gates it then adds the output backward's parts of ``dG`` (one per key tile of that
kernel) and turns ``dG`` into ``dg`` by the reverse cumsum inside the chunk -- the gradient of the
forward scan -- so no other launch touches the gates.

Precision (``../common/precision.py``): ``K K^T`` and every product with ``Ai`` or a gradient take
operands in the input dtype (all bounded by the inputs for normalised keys: ``|Ai| <= 2`` for
``beta <= 2``); the inverse's 16 x 16 blocks are forward-substituted in float32. Float32 inputs: exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.chunk_o import finite_part, first_nonfinite, last_nonfinite, nonfinite_seen
from ..common.chunk_tiles import chunk_rows, gate_ratio, load_chunk, store_chunk
from ..common.launch import autotuned, chunk_invariants, head_block, interpret_config, num_chunks, pruner
from ..common.precision import dot, io_dtype
from ..common.solve_tril import tril_inverse


@triton.jit
def _chunk_kkt(K, bh, T, D, t, tmask, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, IO: tl.constexpr):
    """``(K K^T, bad)`` of one chunk over key tiles of ``BLOCK_D``: ``K K^T`` of the keys' finite part,
    float32 ``[CHUNK, CHUNK]`` (0 past ``T``), and ``bad [CHUNK]``, NaN in the rows whose key is not finite."""
    kk = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    bad = tl.zeros([CHUNK], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_D):
        offs_k = k0 + tl.arange(0, BLOCK_D)
        k = load_chunk(K, bh, T, t, offs_k, D, tmask[:, None] & (offs_k < D)[None, :])
        bad += tl.sum((k * 0).to(tl.float32), axis=1)
        k = finite_part(k)
        kk += dot(k, tl.trans(k), IO)
    return kk, bad


@triton.jit
def _chunk_inverse(K, BETA, g, bh, T, D, t, tmask, offs_c,
                   CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, GATED: tl.constexpr, IO: tl.constexpr):
    """``(Ai, beta, beta gamma, bad)`` of one chunk whose gate cumsum is ``g [CHUNK]`` (``GATED``), all of
    the inputs' finite part: ``Ai = (I + A)^{-1}`` float32 ``[CHUNK, CHUNK]`` (identity rows past ``T``),
    ``beta`` and ``beta gamma`` float32 ``[CHUNK]``; ``bad [CHUNK]`` is NaN in the rows whose key or
    ``beta`` is not finite, 0 elsewhere."""
    a, bad = _chunk_kkt(K, bh, T, D, t, tmask, CHUNK, BLOCK_D, IO)
    beta = tl.load(BETA + bh * T + t, mask=tmask, other=0.0).to(tl.float32)
    bad += beta * 0
    beta = finite_part(beta)
    strict = (offs_c[:, None] > offs_c[None, :]) & tmask[:, None]
    bg = beta
    if GATED:
        a = a * gate_ratio(g[:, None], g[None, :], strict)
        bg = beta * tl.exp(g)
    a = tl.where(strict, a * beta[:, None], 0.0)
    return tril_inverse(a, CHUNK, IO), beta, bg, bad


@triton.jit
def _upper_product(ait, x, offs_c, IO: tl.constexpr):
    """``Ai^T x`` for the upper-triangular ``Ai^T``: ``x``'s finite part in the product, and each row that
    reads a bad entry of ``x`` (rows at or before it) set NaN, on the rare branch (``../common/chunk_o.py``)."""
    last = last_nonfinite(x)
    y = dot(ait, finite_part(x), IO)
    if tl.max(last, axis=0) >= 0:
        y = tl.where(offs_c[:, None] <= last[None, :], float("nan"), y)
    return y


@triton.jit
def _wy_fwd_kernel(K, V, BETA, GLOG, G, W, U, T, D, DV,
                   CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   GATED: tl.constexpr, IO: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    bh = tl.program_id(1).to(tl.int64)
    offs_c, _, t, tmask, _ = chunk_rows(tl.program_id(0), T, D, CHUNK, BLOCK_D)
    g = tl.zeros([CHUNK], dtype=tl.float32)
    bad_gate = tl.zeros([CHUNK], dtype=tl.float32)
    if GATED:                                  # the chunk-local scan of the log-gates, for every later kernel
        glog = tl.load(GLOG + bh * T + t, mask=tmask, other=0.0).to(tl.float32)
        bad_gate = glog * 0
        g = tl.cumsum(finite_part(glog), axis=0)
        tl.store(G + bh * T + t, g, mask=tmask)
    # Ai, W and U of the inputs' finite part (a bad row inside the triangular products would reach the
    # rows before it), then the rows from the first bad key, beta or gate on made NaN -- in U also the
    # columns from a bad value on -- as the recurrence makes the state: v_new = U - W h carries it on.
    ai, beta, bg, bad = _chunk_inverse(K, BETA, g, bh, T, D, t, tmask, offs_c, CHUNK, BLOCK_D, GATED, IO)
    first = tl.min(tl.where(bad + bad_gate == 0, CHUNK, offs_c), axis=0)          # the first bad row, or CHUNK
    for k0 in range(0, D, BLOCK_D):
        offs_k = k0 + tl.arange(0, BLOCK_D)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        k = finite_part(load_chunk(K, bh, T, t, offs_k, D, kd))
        w = dot(ai, k * bg[:, None], IO)
        if first < CHUNK:                      # the rare branch: fewer registers than an unconditional mark
            w = tl.where(offs_c[:, None] >= first, float("nan"), w)
        store_chunk(W, w.to(W.dtype.element_ty), bh, T, t, offs_k, D, kd)
    for v0 in range(0, DV, BLOCK_DV):
        offs_v = v0 + tl.arange(0, BLOCK_DV)
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        v = load_chunk(V, bh, T, t, offs_v, DV, kv)
        first_v = tl.minimum(first_nonfinite(v), first)
        u = dot(ai, finite_part(v) * beta[:, None], IO)
        if tl.min(first_v, axis=0) < CHUNK:
            u = tl.where(offs_c[:, None] >= first_v[None, :], float("nan"), u)
        store_chunk(U, u.to(U.dtype.element_ty), bh, T, t, offs_v, DV, kv)


@triton.jit
def _wy_bwd_kernel(K, V, BETA, G, DW, DU, DK, DV_OUT, DBETA, DG_PARTS, DG_OUT, T, D, DV, N_PARTS,
                   CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   GATED: tl.constexpr, IO: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    bh = tl.program_id(1).to(tl.int64)
    offs_c, _, t, tmask, _ = chunk_rows(tl.program_id(0), T, D, CHUNK, BLOCK_D)
    strict = (offs_c[:, None] > offs_c[None, :]) & tmask[:, None]
    g = tl.zeros([CHUNK], dtype=tl.float32)
    if GATED:
        g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
    ait = tl.trans(_chunk_inverse(K, BETA, g, bh, T, D, t, tmask, offs_c, CHUNK, BLOCK_D, GATED, IO)[0])
    beta = tl.load(BETA + bh * T + t, mask=tmask, other=0.0).to(tl.float32)
    bg = beta
    if GATED:
        bg = beta * tl.exp(g)
    dai = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    dbeta = tl.zeros([CHUNK], dtype=tl.float32)
    # 1. Key tiles: dAi = dW (beta gamma K)^T, and the Ai^T dW parts of dbeta and dG.
    for k0 in range(0, D, BLOCK_D):
        offs_k = k0 + tl.arange(0, BLOCK_D)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        k = load_chunk(K, bh, T, t, offs_k, D, kd).to(tl.float32)
        dw = load_chunk(DW, bh, T, t, offs_k, D, kd)
        dai += dot(dw, tl.trans(k * bg[:, None]), IO)
        tw = _upper_product(ait, dw, offs_c, IO)                                   # Ai^T dW
        dbeta += tl.sum(tw * k, axis=1)                                            # rowsum((Ai^T dW) . K)
    dg = dbeta * bg                                                               # rowsum((Ai^T dW) . beta gamma K)
    if GATED:
        dbeta = dbeta * tl.exp(g)                                                 # rowsum((Ai^T dW) . gamma K)
    # 2. Value tiles: dV = beta . (Ai^T dU), dAi += dU (beta V)^T.
    for v0 in range(0, DV, BLOCK_DV):
        offs_v = v0 + tl.arange(0, BLOCK_DV)
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        v = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
        du = load_chunk(DU, bh, T, t, offs_v, DV, kv)
        dai += dot(du, tl.trans(v * beta[:, None]), IO)                             # + dU (beta V)^T
        tu = _upper_product(ait, du, offs_c, IO)                                   # Ai^T dU
        store_chunk(DV_OUT, (tu * beta[:, None]).to(DV_OUT.dtype.element_ty), bh, T, t, offs_v, DV, kv)
        dbeta += tl.sum(tu * v, axis=1)
    # dA = -(Ai^T dAi Ai^T) by two triangular products: entry (m, l) of dAi Ai^T reads dAi[m, n <= l], entry
    # (i, l) of Ai^T X reads X[m >= i, l] -- the finite parts in the products, what each entry reads marked.
    x = dot(finite_part(dai), ait, IO)
    if tl.max(tl.max(tl.where(dai * 0 == 0, 0, 1), axis=1), axis=0) > 0:      # the rare branch: mark them
        x += tl.trans(nonfinite_seen(tl.trans(dai), False))
    da = -_upper_product(ait, x, offs_c, IO)
    da = tl.where(strict, da, 0.0)
    if GATED:
        da = da * gate_ratio(g[:, None], g[None, :], strict)                      # dA . Gamma
    # K K^T once more (from L2) rather than held through the loops: one [CHUNK, CHUNK] tile fewer
    # live, which is what keeps the sm_80 / sm_89 compilations (operands in registers) from spilling.
    kk = _chunk_kkt(K, bh, T, D, t, tmask, CHUNK, BLOCK_D, IO)[0]
    dbeta += tl.sum(da * kk, axis=1)
    tl.store(DBETA + bh * T + t, dbeta.to(DBETA.dtype.element_ty), mask=tmask)
    m = tl.where(strict, da * beta[:, None], 0.0)                                 # a bad beta: its row only
    if GATED:
        r = m * kk                                                                # dA . A
        dg += tl.sum(r, axis=1) - tl.sum(r, axis=0)
        for p in range(0, N_PARTS):                                               # the output backward's parts
            dg += tl.load(DG_PARTS + (p * tl.num_programs(1) + bh) * T + t, mask=tmask, other=0.0)
        tl.store(DG_OUT + bh * T + t, tl.cumsum(dg, axis=0, reverse=True).to(DG_OUT.dtype.element_ty),
                 mask=tmask)                                                      # dg: the scan's gradient
    # 3. Key tiles again: dK += beta gamma . (Ai^T dW) + M' K + M'^T K (Ai^T dW recomputed, not held).
    for k0 in range(0, D, BLOCK_D):
        offs_k = k0 + tl.arange(0, BLOCK_D)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        k = load_chunk(K, bh, T, t, offs_k, D, kd)
        dk = load_chunk(DK, bh, T, t, offs_k, D, kd).to(tl.float32)
        dw = load_chunk(DW, bh, T, t, offs_k, D, kd)
        dk += _upper_product(ait, dw, offs_c, IO) * bg[:, None]
        dk += dot(m, finite_part(k), IO) + dot(tl.trans(m), finite_part(k), IO)   # M' strictly lower, M'^T upper
        if (tl.min(first_nonfinite(k), axis=0) < CHUNK):
            dk += nonfinite_seen(k, False) + nonfinite_seen(k, True)
        store_chunk(DK, dk.to(DK.dtype.element_ty), bh, T, t, offs_k, D, kd)


# ----------------------------------------------------------------------------- tiles and autotuning
# Candidates (BLOCK_D, BLOCK_DV, warps, stages); the last is the small fallback. A program holds a few
# [CHUNK, CHUNK] float32 tiles (K K^T, Ai, dAi) for its whole life and streams [CHUNK, BLOCK_*] tiles.
WY_CONFIGS = [triton.Config({"BLOCK_D": bk, "BLOCK_DV": bv}, num_warps=w, num_stages=s) for bk, bv, w, s in
              [(64, 64, 4, 2), (64, 64, 8, 2), (128, 128, 8, 2), (32, 32, 4, 2), (32, 32, 4, 1)]]
# Measured spills, {target family: {launch.config_key: narrowest head block that spilled}}, one table per
# autotuned launch (scripts/kernel_report.py compiles every candidate for sm_80, sm_89 and sm_90).
WY_FWD_SPILLS = {"sm80": {(128, 128, 8, 2): 64, (32, 32, 4, 1): 64}, "sm89": {}, "sm90": {}}
WY_BWD_SPILLS = {
    "sm80": {(64, 64, 4, 2): 64, (64, 64, 8, 2): 64, (128, 128, 8, 2): 64},
    "sm89": {(64, 64, 4, 2): 64, (64, 64, 8, 2): 64, (128, 128, 8, 2): 64},
    "sm90": {(64, 64, 4, 2): 64, (128, 128, 8, 2): 64},
}


def _smem(cfg, args):
    bk, bv, c, es = cfg.kwargs["BLOCK_D"], cfg.kwargs["BLOCK_DV"], args["CHUNK"], args["K"].element_size()
    return max(cfg.num_stages, 1) * c * 2 * max(bk, bv) * es + 3 * c * c * 4


def _width(args):
    return max(head_block(args["D"]), head_block(args["DV"]))


_KEY = ["D", "DV", "CHUNK", "GATED"]
_wy_fwd = autotuned(_wy_fwd_kernel, WY_CONFIGS, _KEY, pruner(_smem, WY_FWD_SPILLS, _width, "K"),
                    name="wy._wy_fwd")
_wy_bwd = autotuned(_wy_bwd_kernel, WY_CONFIGS, _KEY, pruner(_smem, WY_BWD_SPILLS, _width, "K"),
                    name="wy._wy_bwd")


def _tiles(D, DV, block_k, block_v):
    return interpret_config(WY_CONFIGS, BLOCK_D=block_k or head_block(D), BLOCK_DV=block_v or head_block(DV))


def wy_forward(k, v, beta, g, *, chunk_size: int, block_k=None, block_v=None):
    """``(W, U, G)`` per chunk: ``W = Ai (beta gamma . K)``, ``U = Ai (beta . V)`` in k's dtype, and ``G``,
    the chunk-local cumsum of ``g [B, H, T]`` (float32; None without gates)."""
    B, H, T, D = k.shape
    DV = v.shape[-1]
    w = torch.empty(B, H, T, D, device=k.device, dtype=k.dtype)
    u = torch.empty(B, H, T, DV, device=k.device, dtype=k.dtype)
    G = torch.empty(B, H, T, device=k.device, dtype=torch.float32) if g is not None else None
    if B * H * T == 0:
        return w, u, G
    _wy_fwd[(num_chunks(T, chunk_size), B * H)](
        k, v, beta, g, G, w, u, T, D, DV, CHUNK=chunk_size, GATED=g is not None, IO=io_dtype(k.dtype),
        **_tiles(D, DV, block_k, block_v))
    return w, u, G


def wy_backward(k, v, beta, G, dw, du, dk, dG_parts, *, g_dtype=None, chunk_size: int, block_k=None,
                block_v=None):
    """Backward of :func:`wy_forward` through ``Ai``. Adds into ``dk`` in place; returns
    ``(dv, dbeta, dg)`` in the dtypes of ``v``, ``beta`` and ``g`` (``g_dtype``; ``dg`` None without gates).
    ``dG_parts [NK, B, H, T]``: the output backward's parts of the gradient of ``G``."""
    B, H, T, D = k.shape
    DV = v.shape[-1]
    dv = torch.empty(B, H, T, DV, device=k.device, dtype=v.dtype)
    dbeta = torch.empty(B, H, T, device=k.device, dtype=beta.dtype)
    dg = torch.empty(B, H, T, device=k.device, dtype=g_dtype) if G is not None else None
    if B * H * T == 0:
        return dv, dbeta, dg
    _wy_bwd[(num_chunks(T, chunk_size), B * H)](
        k, v, beta, G, dw, du, dk, dv, dbeta, dG_parts, dg, T, D, DV,
        dG_parts.shape[0] if dG_parts is not None else 0,
        CHUNK=chunk_size, GATED=G is not None, IO=io_dtype(k.dtype), **_tiles(D, DV, block_k, block_v))
    return dv, dbeta, dg
