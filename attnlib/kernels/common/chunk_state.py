"""The sequential pass over chunks -- forward (the state) and reverse (its gradient). The only loop
over time in the chunked kernels; everything in it is a matrix product.

Notation: ``h_c = S^T`` before chunk ``c`` (``[D, Dv]``, float32), ``G`` the chunk-local cumsum of the
log-gates, ``g_last`` its value at the chunk's last valid row, ``e_t = exp(g_last - G_t)``.

Forward (``_fwd_h_kernel``), per chunk ``c`` with rows ``K_c [C, D]`` and the chunk's values:

    store h_c                                              (each chunk's starting state, float32)
    v_new = U_c - W_c h_c        (delta rule: WY factors)   or   V_c        (linear attention)
    h_{c+1} = exp(g_last) h_c + scale (K_c . e)^T v_new

Reverse (``_bwd_dh_kernel``), with ``dh = dL/dh_{c+1}`` (starts at ``dS_T^T``) and ``dv_local`` the
gradient of ``v_new`` through the chunk's own outputs (see ``chunk_o.py``):

    store dh                                               (dL/dh_{c+1}, used by the dq/dk kernel)
    dv_new = dv_local + e . (K_c dh)                       (the full gradient of v_new; for linear
                                                            attention this *is* dV)
    dh <- exp(g_last) dh + Q_c^T (scale exp(G) . dO_c) - W_c^T dv_new

and at the end ``dh = dL/dh_0``.

Tiling. The grid is ``(cdiv(Dv, BLOCK_V), B * H)``: one program owns one (batch, head) and a slice of
``BLOCK_V`` value columns -- the columns of ``h`` evolve independently -- and keeps its
``[BLOCK_D, BLOCK_V]`` float32 tile of ``h`` (or ``dh``) in registers for the whole sequence, walking
the chunks in order (reverse order for the gradient). ``BLOCK_D`` covers all of ``D``. Per chunk it
loads ``[CHUNK, BLOCK_D]`` tiles of ``K`` (``Q``, ``W``) and ``[CHUNK, BLOCK_V]`` tiles of the values and
writes one ``[BLOCK_D, BLOCK_V]`` tile of ``h`` (or ``dh``) and, for the delta rule, one
``[CHUNK, BLOCK_V]`` tile of ``v_new`` (or ``dv_new``). The reverse pass loads each ``[CHUNK, BLOCK_D]``
tile where it is used, applies the gates to the narrower ``[CHUNK, BLOCK_V]`` side, and on a GPU takes
32 value columns (8 warps from D = 128): with 64, or with every input loaded up front, ptxas spilled
registers (``scripts/kernel_resources.py``). Products with ``h`` run in float32 (tf32 on a GPU for
half inputs): the state of a long sequence exceeds float16's range.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_tiles import (
    chunk_gates,
    chunk_rows,
    decay_to_end,
    initial_state,
    load_chunk,
    state_offsets,
    store_chunk,
    store_chunk_state,
)
from .launch import dim_block, num_chunks, precisions, stages, value_block, warps


@triton.jit
def _fwd_h_kernel(K, V, W, G, H0, Hs, VNEW, HT,
                  T, D, DV, NT, scale,
                  CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                  DELTA: tl.constexpr, GATED: tl.constexpr, USE_H0: tl.constexpr,
                  STORE_H: tl.constexpr, STORE_HT: tl.constexpr, P32: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    # States in memory are S = h^T, [B, H, Dv, D]; per-chunk states Hs are h, [B, H, NT, D, Dv].
    offs_d, offs_v, hmask, s_offs = state_offsets(tl.program_id(0), bh, D, DV, BLOCK_D, BLOCK_V)
    h = initial_state(H0, s_offs, hmask, BLOCK_D, BLOCK_V, USE=USE_H0)
    for c in range(0, NT):
        if STORE_H:
            store_chunk_state(Hs, h, bh, NT, c, offs_d, offs_v, D, DV, hmask)
        _, _, t, tmask, kd = chunk_rows(c, T, D, CHUNK, BLOCK_D)
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        k = load_chunk(K, bh, T, t, offs_d, D, kd).to(tl.float32)
        if DELTA:
            w = load_chunk(W, bh, T, t, offs_d, D, kd).to(tl.float32)
            u = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
            v = (u - tl.dot(w, h, input_precision=P32)).to(VNEW.dtype.element_ty)   # v_new = U - W h
            store_chunk(VNEW, v, bh, T, t, offs_v, DV, kv)
            v = v.to(tl.float32)
        else:
            v = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
        if GATED:
            g, g_last = chunk_gates(G, bh, T, c, t, tmask, CHUNK)
            k = k * decay_to_end(g, g_last, tmask)[:, None]
            h = h * tl.exp(g_last)
        h += tl.dot(tl.trans(k), v, input_precision=P32) * scale               # h += (K . e)^T v_new
    if STORE_HT:
        tl.store(HT + s_offs, h, mask=hmask)


@triton.jit
def _bwd_dh_kernel(Q, K, W, G, DO, DVL, DHT, DHs, DVNEW, DH0,
                   T, D, DV, NT, scale,
                   CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_V: tl.constexpr,
                   DELTA: tl.constexpr, GATED: tl.constexpr, USE_DHT: tl.constexpr,
                   STORE_DH0: tl.constexpr, P32: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    offs_d, offs_v, hmask, s_offs = state_offsets(tl.program_id(0), bh, D, DV, BLOCK_D, BLOCK_V)
    dh = initial_state(DHT, s_offs, hmask, BLOCK_D, BLOCK_V, USE=USE_DHT)
    for i in range(0, NT):
        c = NT - 1 - i
        store_chunk_state(DHs, dh, bh, NT, c, offs_d, offs_v, D, DV, hmask)
        _, _, t, tmask, kd = chunk_rows(c, T, D, CHUNK, BLOCK_D)
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        # Each [CHUNK, BLOCK_D] input is loaded where it is used and dies there, and the gates scale
        # the narrower [CHUNK, BLOCK_V] side: fewer tiles live at once (ptxas spilled otherwise).
        k = load_chunk(K, bh, T, t, offs_d, D, kd).to(tl.float32)
        kdh = tl.dot(k, dh, input_precision=P32)                                 # K dh
        if GATED:
            g, g_last = chunk_gates(G, bh, T, c, t, tmask, CHUNK)
            kdh = kdh * decay_to_end(g, g_last, tmask)[:, None]
            dh = dh * tl.exp(g_last)
        dv = load_chunk(DVL, bh, T, t, offs_v, DV, kv) + kdh                     # dv_new = dv_local + (K.e) dh
        store_chunk(DVNEW, dv, bh, T, t, offs_v, DV, kv)
        do = load_chunk(DO, bh, T, t, offs_v, DV, kv).to(tl.float32) * scale
        if GATED:
            do = do * tl.where(tmask, tl.exp(g), 0.0)[:, None]
        q = load_chunk(Q, bh, T, t, offs_d, D, kd).to(tl.float32)
        dh += tl.dot(tl.trans(q), do, input_precision=P32)                        # + scale (Q.gamma)^T dO
        if DELTA:
            w = load_chunk(W, bh, T, t, offs_d, D, kd).to(tl.float32)
            dh -= tl.dot(tl.trans(w), dv, input_precision=P32)                  # - W^T dv_new
    if STORE_DH0:
        tl.store(DH0 + s_offs, dh, mask=hmask)


def chunk_fwd_h(k, v, *, w=None, G=None, initial_state=None, chunk_size: int, scale: float = 1.0,
                store_h: bool = True, vnew_dtype=None, block_v=None):
    """The forward state pass.

    ``k: [B, H, T, D]``; ``v: [B, H, T, Dv]`` (the values, or ``U`` when ``w`` is given);
    ``w: [B, H, T, D]`` or None (linear attention); ``G: [B, H, T]`` float32 chunk-local gate cumsum
    or None; ``initial_state: [B, H, Dv, D]`` or None.
    Returns ``(h [B, H, NT, D, Dv] float32 or None, v_new [B, H, T, Dv] or None, S_T [B, H, Dv, D] float32)``.
    """
    B, H, T, D = k.shape
    DV = v.shape[-1]
    NT = num_chunks(T, chunk_size)
    dev = k.device
    S = torch.empty(B, H, DV, D, device=dev, dtype=torch.float32)
    hs = torch.empty(B, H, NT, D, DV, device=dev, dtype=torch.float32) if store_h else None
    vnew = torch.empty(B, H, T, DV, device=dev, dtype=vnew_dtype or v.dtype) if w is not None else None
    if B * H == 0 or DV == 0 or D == 0:
        return hs, vnew, S.zero_()
    h0 = initial_state.to(torch.float32).contiguous() if initial_state is not None else None
    BLOCK_D, BLOCK_V = dim_block(D), value_block(DV, D, dev, block_v)
    _, p32 = precisions(k.dtype)
    dummy = S
    _fwd_h_kernel[(triton.cdiv(DV, BLOCK_V), B * H)](
        k, v, w if w is not None else k, G if G is not None else dummy, h0 if h0 is not None else dummy,
        hs if hs is not None else dummy, vnew if vnew is not None else dummy, S,
        T, D, DV, NT, float(scale),
        CHUNK=chunk_size, BLOCK_D=BLOCK_D, BLOCK_V=BLOCK_V, DELTA=w is not None, GATED=G is not None,
        USE_H0=h0 is not None, STORE_H=store_h, STORE_HT=True, P32=p32,
        num_warps=warps(BLOCK_D, BLOCK_V), num_stages=stages(dev))
    return hs, vnew, S


def chunk_bwd_dh(q, k, do, dv_local, *, w=None, G=None, dS=None, chunk_size: int, scale: float,
                 need_dh0: bool = True, block_v=None):
    """The reverse state pass.

    ``q, k, w: [B, H, T, D]``; ``do: [B, H, T, Dv]``; ``dv_local: [B, H, T, Dv]`` float32;
    ``dS: [B, H, Dv, D]`` (gradient of the final state) or None.
    Returns ``(dh [B, H, NT, D, Dv] float32 (dL/dh_{c+1}), dv_new [B, H, T, Dv] float32,
    dS0 [B, H, Dv, D] float32 or None)``.
    """
    B, H, T, D = q.shape
    DV = do.shape[-1]
    NT = num_chunks(T, chunk_size)
    dev = q.device
    dhs = torch.empty(B, H, NT, D, DV, device=dev, dtype=torch.float32)
    dvnew = torch.empty(B, H, T, DV, device=dev, dtype=torch.float32)
    dS0 = torch.empty(B, H, DV, D, device=dev, dtype=torch.float32) if need_dh0 else None
    if B * H == 0 or DV == 0 or D == 0:
        return dhs, dvnew.zero_(), dS0.zero_() if dS0 is not None else None
    dS = dS.to(torch.float32).contiguous() if dS is not None else None
    BLOCK_D, BLOCK_V = dim_block(D), value_block(DV, D, dev, block_v, widest=32)
    _, p32 = precisions(q.dtype)
    dummy = dhs
    _bwd_dh_kernel[(triton.cdiv(DV, BLOCK_V), B * H)](
        q, k, w if w is not None else k, G if G is not None else dummy, do, dv_local,
        dS if dS is not None else dummy, dhs, dvnew, dS0 if dS0 is not None else dummy,
        T, D, DV, NT, float(scale),
        CHUNK=chunk_size, BLOCK_D=BLOCK_D, BLOCK_V=BLOCK_V, DELTA=w is not None, GATED=G is not None,
        USE_DHT=dS is not None, STORE_DH0=need_dh0, P32=p32,
        num_warps=8 if BLOCK_D >= 128 else 4, num_stages=stages(dev))   # 4 at D 128 spill: scripts/kernel_resources.py
    return dhs, dvnew, dS0
