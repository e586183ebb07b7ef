"""The sequential passes over chunks -- forward (the state) and reverse (its gradient). The only loops
over time in the chunked kernels; everything in them is a matrix product.

Notation: ``h_c = S^T`` before chunk ``c`` (``[D, Dv]``), ``G`` the chunk-local cumsum of the log-gates,
``g_last`` its value at the chunk's last valid row, ``e_t = exp(g_last - G_t)``.

Forward (``_fwd_h_kernel``), per chunk ``c`` with rows ``K_c [C, D]`` and the chunk's values:

    store h_c                                              (each chunk's starting state)
    v_new = U_c - W_c h_c        (delta rule: WY factors)   or   V_c        (linear attention)
    h_{c+1} = exp(g_last) h_c + scale (K_c . e)^T v_new

Reverse (``_bwd_dh_kernel``), with ``dh = dL/dh_{c+1}`` (starts at ``dS_T^T``) and ``dv_local`` the
gradient of ``v_new`` through the chunk's own outputs (see ``chunk_o.py``):

    store dh                                               (dL/dh_{c+1}, read by the dq/dk kernel)
    dv_new = dv_local + e . (K_c dh)                       (the full gradient of v_new; for linear
                                                            attention this *is* dV)
    dh <- exp(g_last) dh + Q_c^T (scale exp(G) . dO_c) - W_c^T dv_new

and at the end ``dh = dL/dh_0``.

Tiling. The columns of ``h`` evolve independently, and for linear attention so do its rows: a program
owns a ``[BLOCK_D, BLOCK_DV]`` tile of one (batch, head)'s ``h`` and keeps it in float32 registers for the
whole sequence, walking the chunks in order (reverse order for the gradient). The grid is
``(cdiv(D, BLOCK_D) * cdiv(Dv, BLOCK_DV), B * H)``. Linear attention may split the key dimension; the
delta rule may not (``v_new = U - W h`` needs every row of ``h``), nor may the reverse pass (``K dh`` needs
them too): there ``BLOCK_D`` covers ``D``. With few (batch, head) pairs and a long sequence -- B1 H8
T65536 has 8 -- the split is what gives the GPU enough programs: the autotuner's key holds the
power-of-two bucket of ``B * H`` so that it tunes the split per bucket.

Precision (``precision.py``): ``h`` and ``dh`` are stored, and enter products, in ``WIDE`` (float32 for
float32 inputs, bfloat16 for half inputs: a long sequence's state exceeds float16's range);
the other operands in the input dtype. The running tile stays float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_tiles import chunk_gates, chunk_rows, decay_to_end, load_chunk, store_chunk
from .launch import autotuned, chunk_invariants, head_block, interpret_config, num_chunks, pruner
from .precision import dot, io_dtype, wide_dtype, wide_storage


@triton.jit
def _state_tile(pid, bh, D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """``(offs_k, offs_v, hmask, s_offs)`` of the ``[BLOCK_D, BLOCK_DV]`` tile of ``h = S^T`` that program
    ``pid`` of its (batch, head) owns: ``s_offs`` addresses it in a ``[B, H, Dv, D]`` state."""
    nv = tl.cdiv(DV, BLOCK_DV)
    offs_k = (pid // nv) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_v = (pid % nv) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    hmask = (offs_k < D)[:, None] & (offs_v < DV)[None, :]
    return offs_k, offs_v, hmask, bh * DV * D + offs_v[None, :] * D + offs_k[:, None]


@triton.jit
def _store_state(Hs, h, bh, NT, c, offs_k, offs_v, D, DV, hmask):
    """Store the tile ``h`` of chunk ``c`` in the per-chunk states ``[B, H, NT, D, Dv]``."""
    tl.store(Hs + ((bh * NT + c) * D + offs_k[:, None]) * DV + offs_v[None, :], h.to(Hs.dtype.element_ty),
             mask=hmask)


@triton.jit
def _fwd_h_kernel(K, V, W, G, H0, Hs, VNEW, HT,
                  T, D, DV, NT, scale, BH_BUCKET,
                  CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  DELTA_RULE: tl.constexpr, GATED: tl.constexpr, USE_H0: tl.constexpr,
                  STORE_H: tl.constexpr, STORE_HT: tl.constexpr, IO: tl.constexpr, WIDE: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    bh = tl.program_id(1).to(tl.int64)
    offs_k, offs_v, hmask, s_offs = _state_tile(tl.program_id(0), bh, D, DV, BLOCK_D, BLOCK_DV)
    h = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    if USE_H0:
        h += tl.load(H0 + s_offs, mask=hmask, other=0.0).to(tl.float32)
    for c in range(0, NT):
        if STORE_H:
            _store_state(Hs, h, bh, NT, c, offs_k, offs_v, D, DV, hmask)
        _, _, t, tmask, _ = chunk_rows(c, T, D, CHUNK, BLOCK_D)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        k = load_chunk(K, bh, T, t, offs_k, D, kd)
        if DELTA_RULE:                                         # BLOCK_D covers D: v_new needs all of h
            w = load_chunk(W, bh, T, t, offs_k, D, kd)
            u = load_chunk(V, bh, T, t, offs_v, DV, kv).to(tl.float32)
            v = (u - dot(w, h, WIDE)).to(VNEW.dtype.element_ty)                  # v_new = U - W h
            store_chunk(VNEW, v, bh, T, t, offs_v, DV, kv)
        else:
            v = load_chunk(V, bh, T, t, offs_v, DV, kv)
        if GATED:
            g, g_last = chunk_gates(G, bh, T, c, t, tmask, CHUNK)
            k = k * decay_to_end(g, g_last, tmask)[:, None]
            h = h * tl.exp(g_last)
        h += dot(tl.trans(k), v, IO) * scale                                    # h += (K . e)^T v_new
    if STORE_HT:
        tl.store(HT + s_offs, h, mask=hmask)


@triton.jit
def _bwd_dh_kernel(Q, K, W, G, DO, DVL, DHT, DHs, DVNEW, DH0,
                   T, D, DV, NT, scale, BH_BUCKET,
                   CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   DELTA_RULE: tl.constexpr, GATED: tl.constexpr, USE_DHT: tl.constexpr,
                   STORE_DH0: tl.constexpr, IO: tl.constexpr, WIDE: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    bh = tl.program_id(1).to(tl.int64)
    offs_k, offs_v, hmask, s_offs = _state_tile(tl.program_id(0), bh, D, DV, BLOCK_D, BLOCK_DV)
    dh = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    if USE_DHT:
        dh += tl.load(DHT + s_offs, mask=hmask, other=0.0).to(tl.float32)
    for i in range(0, NT):
        c = NT - 1 - i
        _store_state(DHs, dh, bh, NT, c, offs_k, offs_v, D, DV, hmask)
        _, _, t, tmask, _ = chunk_rows(c, T, D, CHUNK, BLOCK_D)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        # Each [CHUNK, BLOCK_D] input is loaded where it is used, and the gates scale the narrower
        # [CHUNK, BLOCK_DV] side: fewer tiles live at once.
        kdh = dot(load_chunk(K, bh, T, t, offs_k, D, kd), dh, WIDE)                   # K dh
        do = load_chunk(DO, bh, T, t, offs_v, DV, kv).to(tl.float32) * scale
        if GATED:
            g, g_last = chunk_gates(G, bh, T, c, t, tmask, CHUNK)
            kdh = kdh * decay_to_end(g, g_last, tmask)[:, None]
            dh = dh * tl.exp(g_last)
            do = do * tl.where(tmask, tl.exp(g), 0.0)[:, None]
        dv = (load_chunk(DVL, bh, T, t, offs_v, DV, kv).to(tl.float32) + kdh).to(DVNEW.dtype.element_ty)
        store_chunk(DVNEW, dv, bh, T, t, offs_v, DV, kv)                           # dv_new = dv_local + (K.e) dh
        dh += dot(tl.trans(load_chunk(Q, bh, T, t, offs_k, D, kd)), do, IO)        # + scale (Q.gamma)^T dO
        if DELTA_RULE:
            dh -= dot(tl.trans(load_chunk(W, bh, T, t, offs_k, D, kd)), dv, IO)    # - W^T dv_new
    if STORE_DH0:
        tl.store(DH0 + s_offs, dh, mask=hmask)


# ----------------------------------------------------------------------------- tiles and autotuning
# Candidates (BLOCK_D, BLOCK_DV, warps, stages). The state tile is float32 in registers: [BLOCK_D, BLOCK_DV]
# over the program's threads; the streamed [CHUNK, BLOCK_D] and [CHUNK, BLOCK_DV] tiles are pipelined
# through shared memory ``stages`` deep. The last candidate of each list is the small fallback.

def _cfg(bk, bv, w, s):
    return triton.Config({"BLOCK_D": bk, "BLOCK_DV": bv} if bk else {"BLOCK_DV": bv}, num_warps=w, num_stages=s)


FWD_H_SPLIT_CONFIGS = [_cfg(bk, bv, w, s) for bk, bv, w, s in
                       [(64, 64, 4, 2), (64, 64, 8, 2), (128, 64, 8, 2), (64, 32, 4, 2), (32, 32, 4, 2),
                        (32, 32, 4, 1)]]
# The delta rule's forward and every reverse pass: BLOCK_D is the whole head (the wrapper passes it).
FULL_K_CONFIGS = [_cfg(0, bv, w, s) for bv, w, s in
                  [(64, 8, 2), (64, 4, 2), (32, 4, 2), (32, 8, 2), (16, 4, 2), (16, 8, 1)]]
# Measured spills, {target family: {launch.config_key: narrowest head block that spilled}}, one table per
# autotuned launch (scripts/kernel_report.py compiles every candidate for sm_80, sm_89 and sm_90).
FWD_H_SPLIT_SPILLS = {"sm80": {(128, 64, 8, 2): 64}, "sm89": {(128, 64, 8, 2): 64}, "sm90": {}}
FWD_H_FULL_SPILLS = {
    "sm80": {(32, 4, 2): 256, (64, 4, 2): 256, (64, 8, 2): 256},
    "sm89": {(32, 4, 2): 256, (64, 4, 2): 256, (64, 8, 2): 256},
    "sm90": {(32, 4, 2): 256, (64, 4, 2): 256, (64, 8, 2): 256},
}
BWD_DH_SPILLS = {
    "sm80": {(16, 4, 2): 256, (32, 4, 2): 128, (32, 8, 2): 256, (64, 4, 2): 64, (64, 8, 2): 256},
    "sm89": {(16, 4, 2): 64, (32, 4, 2): 128, (32, 8, 2): 256, (64, 4, 2): 64, (64, 8, 2): 128},
    "sm90": {(32, 4, 2): 256, (64, 4, 2): 256, (64, 8, 2): 256},
}


def _smem(streamed_k: int, streamed_v: int):
    """A shared-memory estimate: ``stages`` buffers of the streamed tiles (``streamed_k`` of
    ``[CHUNK, BLOCK_D]``, ``streamed_v`` of ``[CHUNK, BLOCK_DV]``), plus the state tile staged for a product."""
    def smem(cfg, args):
        bk = cfg.kwargs.get("BLOCK_D", args.get("BLOCK_D"))
        bv, c, es = cfg.kwargs["BLOCK_DV"], args["CHUNK"], args["K"].element_size()
        per_stage = c * (streamed_k * bk + streamed_v * bv) * es
        return max(cfg.num_stages, 1) * per_stage + bk * bv * 4 + c * max(bk, bv) * 4
    return smem


def _width(args):
    return max(head_block(args["D"]), head_block(args["DV"]))


_KEY = ["D", "DV", "CHUNK", "DELTA_RULE", "GATED", "BH_BUCKET"]
_fwd_h_split = autotuned(_fwd_h_kernel, FWD_H_SPLIT_CONFIGS, _KEY,
                         pruner(_smem(1, 1), FWD_H_SPLIT_SPILLS, _width, "K"), name="chunk_state._fwd_h_split")
_fwd_h_full = autotuned(_fwd_h_kernel, FULL_K_CONFIGS, _KEY, pruner(_smem(2, 2), FWD_H_FULL_SPILLS, _width, "K"),
                        name="chunk_state._fwd_h_full")
_bwd_dh = autotuned(_bwd_dh_kernel, FULL_K_CONFIGS, _KEY, pruner(_smem(3, 3), BWD_DH_SPILLS, _width, "Q"),
                    name="chunk_state._bwd_dh")


def _bh_bucket(n: int) -> int:
    return triton.next_power_of_2(max(n, 1))


def chunk_fwd_h(k, v, *, w=None, G=None, initial_state=None, chunk_size: int, scale: float,
                store_h: bool = True, output_final_state: bool, block_k=None, block_v=None):
    """The forward state pass.

    ``k: [B, H, T, D]``; ``v: [B, H, T, Dv]`` (the values, or ``U`` when ``w`` is given);
    ``w: [B, H, T, D]`` or None (linear attention); ``G: [B, H, T]`` float32 chunk-local gate cumsum
    or None; ``initial_state: [B, H, Dv, D]`` or None.
    Returns ``(h [B, H, NT, D, Dv] in WIDE or None, v_new [B, H, T, Dv] in k's dtype or None,
    S_T [B, H, Dv, D] float32 or None)``. ``block_k``/``block_v`` force tile widths (interpreter tests).
    """
    B, H, T, D = k.shape
    DV = v.shape[-1]
    NT = num_chunks(T, chunk_size)
    dev = k.device
    S = torch.empty(B, H, DV, D, device=dev, dtype=torch.float32) if output_final_state else None
    hs = torch.empty(B, H, NT, D, DV, device=dev, dtype=wide_storage(k.dtype)) if store_h else None
    vnew = torch.empty(B, H, T, DV, device=dev, dtype=k.dtype) if w is not None else None
    if B * H == 0 or DV == 0 or D == 0:
        if S is not None:
            S.copy_(initial_state) if initial_state is not None else S.zero_()
        return hs, vnew, S
    initial_state = initial_state.contiguous() if initial_state is not None else None
    delta_rule = w is not None
    launch = _fwd_h_full if delta_rule else _fwd_h_split
    configs = FULL_K_CONFIGS if delta_rule else FWD_H_SPLIT_CONFIGS
    fixed = dict(BLOCK_D=head_block(D)) if delta_rule else {}
    tiles = interpret_config(configs, BLOCK_D=block_k or head_block(D), BLOCK_DV=block_v or head_block(DV))
    if delta_rule:
        tiles.pop("BLOCK_D", None)
    grid = lambda meta: (triton.cdiv(D, meta["BLOCK_D"]) * triton.cdiv(DV, meta["BLOCK_DV"]), B * H)  # noqa: E731
    launch[grid](k, v, w, G, initial_state, hs, vnew, S, T, D, DV, NT, float(scale), _bh_bucket(B * H),
                 CHUNK=chunk_size, DELTA_RULE=delta_rule, GATED=G is not None, USE_H0=initial_state is not None,
                 STORE_H=store_h, STORE_HT=output_final_state, IO=io_dtype(k.dtype), WIDE=wide_dtype(k.dtype),
                 **fixed, **tiles)
    return hs, vnew, S


def chunk_bwd_dh(q, k, do, dv_local, *, w=None, G=None, dS=None, chunk_size: int, scale: float,
                 need_state_grad: bool = True, block_v=None):
    """The reverse state pass.

    ``q, k, w: [B, H, T, D]``; ``do: [B, H, T, Dv]``; ``dv_local: [B, H, T, Dv]`` (q's dtype);
    ``dS: [B, H, Dv, D]`` (gradient of the final state) or None.
    Returns ``(dh [B, H, NT, D, Dv] in WIDE (dL/dh_{c+1}), dv_new [B, H, T, Dv] in q's dtype,
    dS0 [B, H, Dv, D] float32 or None)``.
    """
    B, H, T, D = q.shape
    DV = do.shape[-1]
    NT = num_chunks(T, chunk_size)
    dev = q.device
    dhs = torch.empty(B, H, NT, D, DV, device=dev, dtype=wide_storage(q.dtype))
    dvnew = torch.empty(B, H, T, DV, device=dev, dtype=q.dtype)
    dS0 = torch.empty(B, H, DV, D, device=dev, dtype=torch.float32) if need_state_grad else None
    if B * H == 0 or DV == 0 or D == 0:
        if dS0 is not None:
            dS0.copy_(dS) if dS is not None else dS0.zero_()
        return dhs.zero_(), dvnew.zero_(), dS0
    dS = dS.contiguous() if dS is not None else None          # autograd hands S.sum()'s gradient as a stride-0 view
    tiles = interpret_config(FULL_K_CONFIGS, BLOCK_DV=block_v or head_block(DV))
    grid = lambda meta: (triton.cdiv(DV, meta["BLOCK_DV"]), B * H)  # noqa: E731
    _bwd_dh[grid](q, k, w, G, do, dv_local, dS, dhs, dvnew, dS0, T, D, DV, NT, float(scale), _bh_bucket(B * H),
                  CHUNK=chunk_size, BLOCK_D=head_block(D), DELTA_RULE=w is not None, GATED=G is not None,
                  USE_DHT=dS is not None, STORE_DH0=need_state_grad, IO=io_dtype(q.dtype), WIDE=wide_dtype(q.dtype),
                  **tiles)
    return dhs, dvnew, dS0
