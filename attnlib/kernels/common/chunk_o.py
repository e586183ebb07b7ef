"""Per-chunk outputs and their gradients, parallel over chunks. Given each chunk's starting state
``h_c [D, Dv]`` (from ``chunk_state.py``) nothing here depends on any other chunk.

Notation as in ``chunk_state.py``; ``v`` is the chunk's ``v_new`` (delta rule) or ``V`` (linear
attention); ``Gamma_ij = exp(G_i - G_j)`` inside the chunk (1 without gates); ``M`` the causal mask
with the diagonal; ``P = scale (Q K^T . Gamma . M)``, the score tile, always float32.

* ``_fwd_o_kernel``, grid ``(cdiv(Dv, BLOCK_V), chunks, B * H)``:
  ``O = scale (Q h_c) . exp(G) + P v``. With ``FINAL`` it reads one state for all chunks and skips the
  intra-chunk term (non-causal linear attention, ``O = scale Q h_T``); the state's strides are
  arguments, so the same kernel multiplies any rows by any per-head matrix (the non-causal backward
  uses it for ``dQ, dK, dV``).
* ``_bwd_dv_local_kernel``, same grid: ``dv_local = P^T dO``, the gradient of ``v`` through this
  chunk's own outputs.
* ``_bwd_dqk_kernel``, grid ``(cdiv(D, BLOCK_K), chunks, B * H)``: one program owns ``BLOCK_K`` key
  columns (at most 64 on a GPU, ``launch.key_block``) of one chunk. It holds float32 accumulators
  ``dQ, dK (, dW) [CHUNK, BLOCK_K]`` and ``dP = dO v^T [CHUNK, CHUNK]`` (every key tile recomputes
  ``dP``: it needs all of ``Dv`` but no key column) and loops over the value tiles, reading
  ``v, dO`` and the ``[BLOCK_K, BLOCK_V]`` tiles of ``h_c, dh = dL/dh_{c+1}`` (and ``dv_new``); it
  loads its ``Q, K [CHUNK, BLOCK_K]`` columns only after that loop, so they are not live during it:

      dQ = scale (dO h_c^T) . exp(G) + (dP . scale Gamma . M) K
      dK = (v dh^T) . e + (dP . scale Gamma . M)^T Q                 (e_t = exp(g_last - G_t))
      dW = -dv_new h_c^T                                             (delta rule: v_new = U - W h_c)
      dG = rowsum(dQ_state . Q) - rowsum(dK_state . K) + rowsum(dP . P) - colsum(dP . P)
           + [t = last] (exp(g_last) sum(h_c . dh) + sum(dK_state . K))

  (``dQ_state``/``dK_state`` are the first terms of ``dQ``/``dK``). ``dG`` is the gradient of the
  chunk-local gate cumsum; the gradient of ``g`` is its reverse cumsum (``cumsum.py``). Every term of
  ``dG`` is a sum over key columns (``P`` is linear in ``Q K^T``), so each key tile writes its part to
  ``[cdiv(D, BLOCK_K), B, H, T]`` and the wrapper adds the parts. Splitting ``D`` keeps fewer float32
  tiles live: holding all of ``D = 128`` spilled registers (``scripts/kernel_resources.py``).

Rows past ``T`` load as zero and are not stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_tiles import chunk_gates, chunk_rows, decay_to_end, gate_ratio, load_chunk, store_chunk
from .launch import dim_block, key_block, num_chunks, precisions, stages, value_block, warps


@triton.jit
def _fwd_o_kernel(Q, K, V, Hs, G, O,
                  stride_hbh, stride_hc, stride_hd, stride_hv,
                  T, D, DV, scale,
                  CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                  FINAL: tl.constexpr, GATED: tl.constexpr, PIN: tl.constexpr, P32: tl.constexpr):
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_c, offs_d, t, tmask, kd = chunk_rows(c, T, D, CHUNK, BLOCK_D)
    offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = offs_v < DV
    kv = tmask[:, None] & vmask[None, :]
    q = load_chunk(Q, bh, T, t, offs_d, D, kd)
    h = tl.load(Hs + bh * stride_hbh + c * stride_hc + offs_d[:, None] * stride_hd + offs_v[None, :] * stride_hv,
                mask=(offs_d < D)[:, None] & vmask[None, :], other=0.0).to(tl.float32)
    o = tl.dot(q.to(tl.float32), h, input_precision=P32)                        # Q h_c, [CHUNK, BLOCK_V]
    if not FINAL:
        k = load_chunk(K, bh, T, t, offs_d, D, kd)
        s = tl.dot(q, tl.trans(k), input_precision=PIN)                          # fp32 scores
        mask = (offs_c[:, None] >= offs_c[None, :]) & tmask[:, None]              # rows past T: no exp(+big)
        if GATED:
            g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
            o = o * tl.exp(g)[:, None]
            s = s * gate_ratio(g[:, None], g[None, :], mask)
        else:
            s = tl.where(mask, s, 0.0)
        v = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
        o += tl.dot(s, v, input_precision=P32)                                  # the score tile stays fp32
    store_chunk(O, (o * scale).to(O.dtype.element_ty), bh, T, t, offs_v, DV, kv)


@triton.jit
def _bwd_dv_local_kernel(Q, K, G, DO, DV_OUT, T, D, DV, scale,
                         CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                         GATED: tl.constexpr, PIN: tl.constexpr, P32: tl.constexpr):
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_c, offs_d, t, tmask, kd = chunk_rows(c, T, D, CHUNK, BLOCK_D)
    offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    kv = tmask[:, None] & (offs_v < DV)[None, :]
    q = load_chunk(Q, bh, T, t, offs_d, D, kd)
    k = load_chunk(K, bh, T, t, offs_d, D, kd)
    st = tl.dot(k, tl.trans(q), input_precision=PIN)                             # P^T: rows j, columns i
    mask = (offs_c[:, None] <= offs_c[None, :]) & tmask[None, :]                 # j <= i < T
    if GATED:
        g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
        st = st * gate_ratio(g[None, :], g[:, None], mask)
    else:
        st = tl.where(mask, st, 0.0)
    do = load_chunk(DO, bh, T, t, offs_v, DV, kv).to(tl.float32)
    store_chunk(DV_OUT, tl.dot(st, do, input_precision=P32) * scale, bh, T, t, offs_v, DV, kv)


@triton.jit
def _bwd_dqk_kernel(Q, K, V, Hs, DHs, DVNEW, G, DO, DQ, DK, DW, DG,
                    T, D, DV, NT, scale,
                    CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                    DELTA: tl.constexpr, GATED: tl.constexpr, NEED_DK: tl.constexpr, P32: tl.constexpr):
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_c, _, t, tmask, _ = chunk_rows(c, T, D, CHUNK, BLOCK_K)
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)                  # this program's key columns
    kmask = offs_k < D
    kd = tmask[:, None] & kmask[None, :]
    dq = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
    dk = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
    dw = tl.zeros([CHUNK, BLOCK_K], dtype=tl.float32)
    dp = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    hdh = tl.zeros([BLOCK_K], dtype=tl.float32)                                  # for sum(h_c . dh)
    h_base = (bh * NT + c) * D * DV
    for v0 in range(0, DV, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        vmask = offs_v < DV
        kv = tmask[:, None] & vmask[None, :]
        hm = kmask[:, None] & vmask[None, :]
        v = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
        do = load_chunk(DO, bh, T, t, offs_v, DV, kv).to(tl.float32)
        h = tl.load(Hs + h_base + offs_k[:, None] * DV + offs_v[None, :], mask=hm, other=0.0)
        dp += tl.dot(do, tl.trans(v), input_precision=P32)
        dq += tl.dot(do, tl.trans(h), input_precision=P32)
        if NEED_DK:
            dh = tl.load(DHs + h_base + offs_k[:, None] * DV + offs_v[None, :], mask=hm, other=0.0)
            dk += tl.dot(v, tl.trans(dh), input_precision=P32)
            if DELTA:
                dvn = load_chunk(DVNEW, bh, T, t, offs_v, DV, kv)
                dw -= tl.dot(dvn, tl.trans(h), input_precision=P32)
            if GATED:
                hdh += tl.sum(h * dh, axis=1)
    q = load_chunk(Q, bh, T, t, offs_k, D, kd).to(tl.float32)                    # loaded after the loop:
    k = load_chunk(K, bh, T, t, offs_k, D, kd).to(tl.float32)                    # not live during it
    mask = (offs_c[:, None] >= offs_c[None, :]) & tmask[:, None]
    dq = dq * scale
    if GATED:
        g, g_last = chunk_gates(G, bh, T, c, t, tmask, CHUNK)
        last = tl.minimum(c * CHUNK + CHUNK, T) - 1
        dq = dq * tl.exp(g)[:, None]
        ds = dp * gate_ratio(g[:, None], g[None, :], mask) * scale               # dP . scale Gamma . M
        dg = tl.sum(dq * q, axis=1)
        if NEED_DK:
            dk = dk * decay_to_end(g, g_last, tmask)[:, None]
            dk_k = tl.sum(dk * k, axis=1)
            r = ds * tl.dot(q, tl.trans(k), input_precision=P32)                # dP . P, this key tile's part
            dg += tl.sum(r, axis=1) - tl.sum(r, axis=0) - dk_k
            dg += tl.where(t == last, tl.sum(dk_k, axis=0) + tl.exp(g_last) * tl.sum(hdh, axis=0), 0.0)
            tl.store(DG + (tl.program_id(0) * tl.num_programs(2) + bh) * T + t, dg, mask=tmask)
    else:
        ds = tl.where(mask, dp * scale, 0.0)
    dq += tl.dot(ds, k, input_precision=P32)
    store_chunk(DQ, dq, bh, T, t, offs_k, D, kd)
    if NEED_DK:
        dk += tl.dot(tl.trans(ds), q, input_precision=P32)
        store_chunk(DK, dk, bh, T, t, offs_k, D, kd)
        if DELTA:
            store_chunk(DW, dw, bh, T, t, offs_k, D, kd)


def _grid_v(DV, D, T, chunk, BH, dev, block_v=None):
    BLOCK_V = value_block(DV, D, dev, block_v)
    return BLOCK_V, (triton.cdiv(DV, BLOCK_V), num_chunks(T, chunk), BH)


def chunk_fwd_o(q, k, v, h, *, G=None, scale: float, chunk_size: int, out_dtype=None, final: bool = False,
                block_v=None):
    """``O = scale ((Q h_c) . exp(G) + (Q K^T . Gamma . M) v)`` per chunk.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; ``h``: the per-chunk states ``[B, H, NT, D, Dv]``
    float32, or with ``final=True`` one matrix per head given as ``S [B, H, Dv, D]`` (then
    ``O = scale Q S^T`` and ``k, v, G`` are unused). Returns ``o [B, H, T, Dv]`` in ``out_dtype``.
    """
    B, H, T, D = q.shape
    DV = h.shape[-2] if final else v.shape[-1]
    o = torch.empty(B, H, T, DV, device=q.device, dtype=out_dtype or q.dtype)
    if o.numel() == 0:
        return o
    if D == 0:
        return o.zero_()
    if final:
        h = h.contiguous()
        strides = (DV * D, 0, 1, D)                              # h[d, v] = S[v, d]
    else:
        NT = h.shape[2]
        strides = (NT * D * DV, D * DV, DV, 1)
    BLOCK_V, grid = _grid_v(DV, D, T, chunk_size, B * H, q.device, block_v)
    BLOCK_D = dim_block(D)
    pin, p32 = precisions(q.dtype)
    _fwd_o_kernel[grid](q, k if k is not None else q, v if v is not None else q, h,
                        G if G is not None else h, o, *strides, T, D, DV, float(scale),
                        CHUNK=chunk_size, BLOCK_D=BLOCK_D, BLOCK_V=BLOCK_V, FINAL=final,
                        GATED=G is not None, PIN=pin, P32=p32,
                        num_warps=warps(chunk_size, max(BLOCK_D, BLOCK_V)), num_stages=stages(q.device))
    return o


def chunk_bwd_dv_local(q, k, do, *, G=None, scale: float, chunk_size: int, block_v=None):
    """``dv_local = scale (Q K^T . Gamma . M)^T dO`` per chunk, float32 ``[B, H, T, Dv]``."""
    B, H, T, D = q.shape
    DV = do.shape[-1]
    dv = torch.empty(B, H, T, DV, device=q.device, dtype=torch.float32)
    if dv.numel() == 0:
        return dv
    BLOCK_V, grid = _grid_v(DV, D, T, chunk_size, B * H, q.device, block_v)
    pin, p32 = precisions(q.dtype)
    _bwd_dv_local_kernel[grid](q, k, G if G is not None else dv, do, dv, T, D, DV, float(scale),
                               CHUNK=chunk_size, BLOCK_D=dim_block(D), BLOCK_V=BLOCK_V, GATED=G is not None,
                               PIN=pin, P32=p32, num_warps=warps(chunk_size, dim_block(D)),
                               num_stages=stages(q.device))
    return dv


def chunk_bwd_dqk(q, k, v, h, do, *, dh=None, dvnew=None, G=None, scale: float, chunk_size: int,
                  delta: bool = False, block_v=None, block_k=None):
    """``dQ`` (and, when ``dh`` is given, ``dK``, ``dW`` for the delta rule and ``dG`` with gates), float32.

    ``v``: the chunk values (``v_new`` for the delta rule); ``h``/``dh``: ``[B, H, NT, D, Dv]`` float32;
    ``dvnew``: ``[B, H, T, Dv]`` float32 (delta rule). Returns ``(dq, dk, dw, dG)`` (None where not computed).
    ``block_v``/``block_k`` force the tile widths.
    """
    B, H, T, D = q.shape
    DV = v.shape[-1]
    NT = num_chunks(T, chunk_size)
    need_dk = dh is not None
    f32 = dict(device=q.device, dtype=torch.float32)
    BLOCK_K = key_block(D, q.device, block_k)
    NK = triton.cdiv(D, BLOCK_K)
    dq = torch.empty(B, H, T, D, **f32)
    dk = torch.empty(B, H, T, D, **f32) if need_dk else None
    dw = torch.empty(B, H, T, D, **f32) if need_dk and delta else None
    dG_parts = torch.empty(NK, B, H, T, **f32) if need_dk and G is not None else None   # one per key tile
    if dq.numel() == 0:
        return dq, dk, dw, (dG_parts.sum(0) if dG_parts is not None else None)
    BLOCK_V = value_block(DV, D, q.device, block_v)
    _, p32 = precisions(q.dtype)
    dummy = dq
    _bwd_dqk_kernel[(NK, NT, B * H)](
        q, k, v, h, dh if dh is not None else dummy, dvnew if dvnew is not None else dummy,
        G if G is not None else dummy, do, dq, dk if dk is not None else dummy,
        dw if dw is not None else dummy, dG_parts if dG_parts is not None else dummy,
        T, D, DV, NT, float(scale),
        CHUNK=chunk_size, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V, DELTA=delta, GATED=G is not None,
        NEED_DK=need_dk, P32=p32, num_stages=1,                                      # see launch.kernel_chunk
        num_warps=8 if chunk_size >= 64 and need_dk else 4)   # 4 spill there: scripts/kernel_resources.py
    dG = None
    if dG_parts is not None:
        dG = dG_parts.select(0, 0) if NK == 1 else dG_parts.sum(0)                        # the key tiles' parts of dG
    return dq, dk, dw, dG
