"""Per-chunk outputs and their gradients, parallel over chunks. Given each chunk's starting state
``h_c [D, Dv]`` (from ``chunk_state.py``) nothing here depends on any other chunk.

Notation as in ``chunk_state.py``; ``v`` is the chunk's ``v_new`` (delta rule) or ``V`` (linear
attention); ``Gamma_ij = exp(G_i - G_j)`` inside the chunk (1 without gates); ``M`` the causal mask
with the diagonal; ``P = scale (Q K^T . Gamma . M)``, the score tile, accumulated in float32.

* ``_fwd_o_kernel``, grid ``(cdiv(Dv, BLOCK_DV), chunks, B * H)``:
  ``O = scale (Q h_c) . exp(G) + P v``, walking ``D`` in ``BLOCK_D`` tiles for both ``Q h_c`` and
  ``Q K^T``. With ``FINAL`` it reads one state for all chunks and skips the intra-chunk term
  (non-causal linear attention, ``O = scale Q h_T``); the state's strides are arguments, so the same
  kernel multiplies any rows by any per-head matrix (the non-causal backward uses it for ``dQ, dK, dV``).
* ``_bwd_dv_local_kernel``, same grid: ``dv_local = P^T dO``, the gradient of ``v`` through this
  chunk's own outputs.
* ``_bwd_dqk_kernel``, grid ``(cdiv(D, BLOCK_D), chunks, B * H)``: one program owns ``BLOCK_D`` key
  columns of one chunk. It holds float32 accumulators ``dQ, dK (, dW) [CHUNK, BLOCK_D]`` and
  ``dP = dO v^T [CHUNK, CHUNK]`` and loops over the value tiles, reading ``v, dO`` and the
  ``[BLOCK_D, BLOCK_DV]`` tiles of ``h_c, dh = dL/dh_{c+1}`` (and ``dv_new``); it loads its
  ``Q, K [CHUNK, BLOCK_D]`` columns only after that loop, so they are not live during it:

      dQ = scale (dO h_c^T) . exp(G) + (dP . scale Gamma . M) K
      dK = (v dh^T) . e + (dP . scale Gamma . M)^T Q                 (e_t = exp(g_last - G_t))
      dW = -dv_new h_c^T                                             (delta rule: v_new = U - W h_c)
      dG = rowsum(dQ_state . Q) - rowsum(dK_state . K) + rowsum(dP . P) - colsum(dP . P)
           + [t = last] (exp(g_last) sum(h_c . dh) + sum(dK_state . K))

  (``dQ_state``/``dK_state`` are the first terms of ``dQ``/``dK``). ``dG`` is the gradient of the
  chunk-local gate cumsum; every term is a sum over key columns (``P`` is linear in ``Q K^T``), so each
  key tile writes its part to ``[cdiv(D, BLOCK_D), B, H, T]`` float32, and the WY backward adds the
  parts (``../delta/wy.py``). When ``BLOCK_D`` covers ``D`` the value tiles' ``dP`` is formed once per
  chunk; narrower key tiles trade that recomputation for registers (the autotuner chooses).

Precision (``precision.py``): products with ``h``, ``dh`` or a score tile take ``WIDE`` operands,
products of inputs (``Q K^T``, ``dO v^T``) the input dtype. Outputs are written in the inputs' dtype.
Rows past ``T`` load as zero and are not stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .chunk_tiles import chunk_gates, chunk_rows, decay_to_end, gate_ratio, load_chunk, store_chunk
from .launch import autotuned, choose, chunk_invariants, forced, head_block, interpret_config, num_chunks, pruner
from .precision import dot, io_dtype, wide_dtype

# Non-finite inputs. A product with a causal or triangular tile multiplies the entries the mask removes
# by 0, and 0 * NaN = 0 * inf = NaN: a bad row j would reach the rows the recurrence never lets it touch
# (rows before j, other value columns). So the operand beside the mask enters the product through
# ``finite_part`` and the rows that do see a bad entry are marked by adding ``nonfinite_seen`` (0 or NaN),
# as ``attnlib._numerics.split_nonfinite`` does for the references. ``x * 0 == 0`` is the finiteness test.

@triton.jit
def finite_part(x):
    """``x`` with its NaN and +-inf entries replaced by 0."""
    return tl.where(x * 0 == 0, x, 0.0)


@triton.jit
def first_nonfinite(x):
    """``[N]``: the first row of each column of ``x [ROWS, N]`` holding a NaN or inf; ``ROWS`` if none."""
    rows = tl.arange(0, x.shape[0])[:, None]
    return tl.min(tl.where(x * 0 == 0, x.shape[0], rows), axis=0)


@triton.jit
def last_nonfinite(x):
    """``[N]``: the last row of each column of ``x [ROWS, N]`` holding a NaN or inf; -1 if none."""
    rows = tl.arange(0, x.shape[0])[:, None]
    return tl.max(tl.where(x * 0 == 0, -1, rows), axis=0)


@triton.jit
def nonfinite_seen(x, REVERSE: tl.constexpr):
    """Float32, per entry of ``x [ROWS, N]``: NaN if column ``n`` of ``x`` is non-finite in some row at or
    before this one (``REVERSE``: at or after), 0 otherwise -- the rows a causal (anti-causal) product
    lets it reach."""
    rows = tl.arange(0, x.shape[0])[:, None]
    if REVERSE:
        seen = rows <= last_nonfinite(x)[None, :]
    else:
        seen = rows >= first_nonfinite(x)[None, :]
    return tl.where(seen, float("nan"), 0.0)


@triton.jit
def _fwd_o_kernel(Q, K, V, Hs, G, O,
                  stride_hbh, stride_hc, stride_hd, stride_hv,
                  T, D, DV, scale,
                  CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                  FINAL: tl.constexpr, GATED: tl.constexpr, IO: tl.constexpr, WIDE: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_c, _, t, tmask, _ = chunk_rows(c, T, D, CHUNK, BLOCK_D)
    offs_v = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    vmask = offs_v < DV
    kv = tmask[:, None] & vmask[None, :]
    o = tl.zeros([CHUNK, BLOCK_DV], dtype=tl.float32)
    s = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    h_base = Hs + bh * stride_hbh + c * stride_hc
    for k0 in range(0, D, BLOCK_D):
        offs_k = k0 + tl.arange(0, BLOCK_D)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        q = load_chunk(Q, bh, T, t, offs_k, D, kd)
        h = tl.load(h_base + offs_k[:, None] * stride_hd + offs_v[None, :] * stride_hv,
                    mask=(offs_k < D)[:, None] & vmask[None, :], other=0.0)
        o += dot(q, h, WIDE)                                                       # Q h_c
        if not FINAL:
            s += dot(q, tl.trans(load_chunk(K, bh, T, t, offs_k, D, kd)), IO)       # Q K^T
    if not FINAL:
        mask = (offs_c[:, None] >= offs_c[None, :]) & tmask[:, None]              # rows past T: no exp(+big)
        s = tl.where(mask, s, 0.0)                      # selected, not multiplied: a bad key's column is NaN
        if GATED:
            g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
            o = o * tl.exp(g)[:, None]
            s = s * gate_ratio(g[:, None], g[None, :], mask)                       # finite 0 off the mask
        v = load_chunk(V, bh, T, t, offs_v, DV, kv)
        o += dot(s, finite_part(v), WIDE) + nonfinite_seen(v, False)              # + (Q K^T . Gamma . M) v
    store_chunk(O, (o * scale).to(O.dtype.element_ty), bh, T, t, offs_v, DV, kv)


@triton.jit
def _bwd_dv_local_kernel(Q, K, G, DO, DV_OUT, T, D, DV, scale,
                         CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                         GATED: tl.constexpr, IO: tl.constexpr, WIDE: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_c, _, t, tmask, _ = chunk_rows(c, T, D, CHUNK, BLOCK_D)
    offs_v = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    kv = tmask[:, None] & (offs_v < DV)[None, :]
    st = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)                               # P^T: rows j, columns i
    for k0 in range(0, D, BLOCK_D):
        offs_k = k0 + tl.arange(0, BLOCK_D)
        kd = tmask[:, None] & (offs_k < D)[None, :]
        st += dot(load_chunk(K, bh, T, t, offs_k, D, kd), tl.trans(load_chunk(Q, bh, T, t, offs_k, D, kd)), IO)
    mask = (offs_c[:, None] <= offs_c[None, :]) & tmask[None, :]                  # j <= i < T
    st = tl.where(mask, st, 0.0)
    if GATED:
        g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
        st = st * gate_ratio(g[None, :], g[:, None], mask)
    do = load_chunk(DO, bh, T, t, offs_v, DV, kv)
    dv = (dot(st, finite_part(do), WIDE) + nonfinite_seen(do, True)) * scale
    store_chunk(DV_OUT, dv.to(DV_OUT.dtype.element_ty), bh, T, t, offs_v, DV, kv)


@triton.jit
def _bwd_dqk_kernel(Q, K, V, Hs, DHs, DVNEW, G, DO, DQ, DK, DW, DG,
                    T, D, DV, NT, scale,
                    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                    DELTA_RULE: tl.constexpr, GATED: tl.constexpr, NEED_DK: tl.constexpr,
                    IO: tl.constexpr, WIDE: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    c = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_c, _, t, tmask, _ = chunk_rows(c, T, D, CHUNK, BLOCK_D)
    offs_k = tl.program_id(0) * BLOCK_D + tl.arange(0, BLOCK_D)                  # this program's key columns
    kmask = offs_k < D
    kd = tmask[:, None] & kmask[None, :]
    dq = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)
    dk = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)
    dw = tl.zeros([CHUNK, BLOCK_D], dtype=tl.float32)
    dp = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
    hdh = tl.zeros([BLOCK_D], dtype=tl.float32)                                  # for sum(h_c . dh)
    h_base = (bh * NT + c) * D * DV
    for v0 in range(0, DV, BLOCK_DV):
        offs_v = v0 + tl.arange(0, BLOCK_DV)
        vmask = offs_v < DV
        kv = tmask[:, None] & vmask[None, :]
        hm = kmask[:, None] & vmask[None, :]
        v = load_chunk(V, bh, T, t, offs_v, DV, kv)
        do = load_chunk(DO, bh, T, t, offs_v, DV, kv)
        h = tl.load(Hs + h_base + offs_k[:, None] * DV + offs_v[None, :], mask=hm, other=0.0)
        dp += dot(do, tl.trans(v), IO)
        dq += dot(do, tl.trans(h), WIDE)
        if NEED_DK:
            dh = tl.load(DHs + h_base + offs_k[:, None] * DV + offs_v[None, :], mask=hm, other=0.0)
            dk += dot(v, tl.trans(dh), WIDE)
            if DELTA_RULE:
                dw -= dot(load_chunk(DVNEW, bh, T, t, offs_v, DV, kv), tl.trans(h), WIDE)
            if GATED:
                hdh += tl.sum(h.to(tl.float32) * dh.to(tl.float32), axis=1)
    q = load_chunk(Q, bh, T, t, offs_k, D, kd)                                   # loaded after the loop:
    k = load_chunk(K, bh, T, t, offs_k, D, kd)                                   # not live during it
    # dP . M multiplies K (rows l <= i) and its transpose Q (rows i >= l): their finite parts, and on the
    # rare branch the rows that see a bad entry set NaN below (fewer registers than an unconditional mark).
    k_bad = first_nonfinite(k)
    q_bad = last_nonfinite(q)
    any_bad = (tl.min(k_bad, axis=0) < CHUNK) | (tl.max(q_bad, axis=0) >= 0)
    if any_bad:
        q = finite_part(q)
        k = finite_part(k)
    mask = (offs_c[:, None] >= offs_c[None, :]) & tmask[:, None]
    dq = dq * scale
    if GATED:
        g, g_last = chunk_gates(G, bh, T, c, t, tmask, CHUNK)
        last = tl.minimum(c * CHUNK + CHUNK, T) - 1
        dq = dq * tl.exp(g)[:, None]
        ds = tl.where(mask, dp * scale, 0.0) * gate_ratio(g[:, None], g[None, :], mask)   # dP . scale Gamma . M
        dg = tl.sum(dq * q.to(tl.float32), axis=1)
        if NEED_DK:
            dk = dk * decay_to_end(g, g_last, tmask)[:, None]
            dk_k = tl.sum(dk * k.to(tl.float32), axis=1)
            r = tl.where(mask, ds * dot(q, tl.trans(k), IO), 0.0)                  # dP . P, this key tile's part
            dg += tl.sum(r, axis=1) - tl.sum(r, axis=0) - dk_k
            dg += tl.where(t == last, tl.sum(dk_k, axis=0) + tl.exp(g_last) * tl.sum(hdh, axis=0), 0.0)
            tl.store(DG + (tl.program_id(0) * tl.num_programs(2) + bh) * T + t, dg, mask=tmask)
    else:
        ds = tl.where(mask, dp * scale, 0.0)
    dq += dot(ds, k, WIDE)
    if any_bad:
        dq = tl.where(offs_c[:, None] >= k_bad[None, :], float("nan"), dq)
    store_chunk(DQ, dq.to(DQ.dtype.element_ty), bh, T, t, offs_k, D, kd)
    if NEED_DK:
        dk += dot(tl.trans(ds), q, WIDE)
        if any_bad:
            dk = tl.where(offs_c[:, None] <= q_bad[None, :], float("nan"), dk)
        store_chunk(DK, dk.to(DK.dtype.element_ty), bh, T, t, offs_k, D, kd)
        if DELTA_RULE:
            store_chunk(DW, dw.to(DW.dtype.element_ty), bh, T, t, offs_k, D, kd)


# ----------------------------------------------------------------------------- tiles and autotuning
# Candidates (BLOCK_D, BLOCK_DV, warps, stages); the last of each list is the small fallback. Every
# program holds [CHUNK, CHUNK] and [CHUNK, BLOCK_*] float32 accumulators; its streamed tiles are
# pipelined ``stages`` deep.

def _cfgs(shapes):
    return [triton.Config({"BLOCK_D": bk, "BLOCK_DV": bv}, num_warps=w, num_stages=s) for bk, bv, w, s in shapes]


OUTPUT_CONFIGS = _cfgs([(64, 64, 4, 2), (64, 64, 8, 3), (128, 64, 8, 2), (64, 128, 8, 2), (32, 64, 4, 2),
                        (32, 32, 4, 2)])
# The dq/dk kernel's key tile is the wrapper's (``dqk_key_block``): its candidates tune the rest.
DQK_CONFIGS = [triton.Config({"BLOCK_DV": bv}, num_warps=w, num_stages=s) for bv, w, s in
               [(64, 4, 2), (64, 8, 2), (32, 4, 2), (32, 8, 2), (32, 8, 1)]]
# Measured spills, {target family: {launch.config_key: narrowest head block that spilled}}, one table per
# autotuned launch (scripts/kernel_report.py compiles every candidate for sm_80, sm_89 and sm_90).
FWD_O_SPILLS = {"sm80": {}, "sm89": {}, "sm90": {}}
DV_LOCAL_SPILLS = {"sm80": {}, "sm89": {}, "sm90": {}}
DQK_SPILLS = {"sm80": {(64, 4, 2): 64, (32, 8, 2): 64}, "sm89": {(64, 4, 2): 64, (32, 8, 2): 64},
              "sm90": {(64, 4, 2): 64, (32, 4, 2): 64}}
# The dq/dk kernel's key tile (``dqk_key_block``), chosen by ``launch.choose`` like every fixed tile: 64,
# except where it spilled in every DQK candidate at any head (sm_80/sm_89: ``mma.sync`` holds the operands
# in registers), listed at head block 0 (by its launch.config_key: tile, warps, stages).
DQK_KEY_CONFIGS = [triton.Config({"BLOCK_D": bk}, num_warps=4, num_stages=3) for bk in (64, 32)]
DQK_KEY_SPILLS = {"sm80": {(64, 4, 3): 0}, "sm89": {(64, 4, 3): 0}, "sm90": {}}


def _smem(cfg, args):
    bk = cfg.kwargs.get("BLOCK_D", args.get("BLOCK_D"))
    bv, c, es = cfg.kwargs["BLOCK_DV"], args["CHUNK"], args["Q"].element_size()
    streamed = c * (2 * bk + 2 * bv) * es + bk * bv * 4               # two key-like, two value-like tiles, h
    return max(cfg.num_stages, 1) * streamed + c * c * 4


def _width(args):
    return max(head_block(args["D"]), head_block(args["DV"]))


_fwd_o = autotuned(_fwd_o_kernel, OUTPUT_CONFIGS, ["D", "DV", "CHUNK", "FINAL", "GATED"],
                   pruner(_smem, FWD_O_SPILLS, _width, "Q"), name="chunk_o._fwd_o")
_dv_local = autotuned(_bwd_dv_local_kernel, OUTPUT_CONFIGS, ["D", "DV", "CHUNK", "GATED"],
                      pruner(_smem, DV_LOCAL_SPILLS, _width, "Q"), name="chunk_o._dv_local")
_dqk = autotuned(_bwd_dqk_kernel, DQK_CONFIGS, ["D", "DV", "CHUNK", "DELTA_RULE", "GATED", "NEED_DK"],
                 pruner(_smem, DQK_SPILLS, _width, "Q"), name="chunk_o._dqk")


def _interpret_tiles(configs, D, DV, block_k, block_v):
    return interpret_config(configs, BLOCK_D=block_k or head_block(D), BLOCK_DV=block_v or head_block(DV))


def chunk_fwd_o(q, k, v, h, *, G=None, scale: float, chunk_size: int, out_dtype=None, final: bool = False,
                block_k=None, block_v=None):
    """``O = scale ((Q h_c) . exp(G) + (Q K^T . Gamma . M) v)`` per chunk.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; ``h``: the per-chunk states ``[B, H, NT, D, Dv]``, or
    with ``final=True`` one matrix per head given as ``S [B, H, Dv, D]`` (then ``O = scale Q S^T`` and
    ``k, v, G`` are unused). Returns ``o [B, H, T, Dv]`` in ``out_dtype`` (default q's).
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
        strides = (DV * D, 0, 1, D)                                      # h[d, v] = S[v, d]
    else:
        NT = h.shape[2]
        strides = (NT * D * DV, D * DV, DV, 1)
    grid = lambda meta: (triton.cdiv(DV, meta["BLOCK_DV"]), num_chunks(T, chunk_size), B * H)  # noqa: E731
    _fwd_o[grid](q, k, v, h, G, o, *strides, T, D, DV, float(scale),
                 CHUNK=chunk_size, FINAL=final, GATED=G is not None, IO=io_dtype(q.dtype),
                 WIDE=wide_dtype(q.dtype), **_interpret_tiles(OUTPUT_CONFIGS, D, DV, block_k, block_v))
    return o


def chunk_bwd_dv_local(q, k, do, *, G=None, scale: float, chunk_size: int, block_k=None, block_v=None):
    """``dv_local = scale (Q K^T . Gamma . M)^T dO`` per chunk, ``[B, H, T, Dv]`` in q's dtype."""
    B, H, T, D = q.shape
    DV = do.shape[-1]
    dv = torch.empty(B, H, T, DV, device=q.device, dtype=q.dtype)
    if dv.numel() == 0:
        return dv
    grid = lambda meta: (triton.cdiv(DV, meta["BLOCK_DV"]), num_chunks(T, chunk_size), B * H)  # noqa: E731
    _dv_local[grid](q, k, G, do, dv, T, D, DV, float(scale), CHUNK=chunk_size, GATED=G is not None,
                    IO=io_dtype(q.dtype), WIDE=wide_dtype(q.dtype),
                    **_interpret_tiles(OUTPUT_CONFIGS, D, DV, block_k, block_v))
    return dv


def dqk_key_block(D: int, device: torch.device) -> int:
    """Key columns per program of the dq/dk kernel: 64 on Hopper, 32 on sm_80/sm_89, where ``mma.sync``
    holds its operands in registers and the four accumulators (``dQ, dK, dW [CHUNK, 64]``, ``dP``)
    spilled in every candidate; never more than the head. Narrower tiles recompute ``dP = dO v^T``
    once per tile. Chosen here, not by the autotuner, because the gates' gradient is written in one
    part per key tile, and the buffer of parts is allocated before the launch. Under the interpreter 64,
    as on Hopper."""
    tiles = choose(DQK_KEY_CONFIGS, {}, device, spills=DQK_KEY_SPILLS, width=lambda args: 0,
                   interpret=dict(BLOCK_D=64))
    return min(tiles["BLOCK_D"], head_block(D))


def chunk_bwd_dqk(q, k, v, h, do, *, dh=None, dvnew=None, G=None, scale: float, chunk_size: int,
                  delta_rule: bool = False, block_v=None, block_k=None):
    """``dQ`` (and, when ``dh`` is given, ``dK``, ``dW`` for the delta rule and the parts of ``dG`` with
    gates). ``v``: the chunk values (``v_new`` for the delta rule); ``h``/``dh``: ``[B, H, NT, D, Dv]``;
    ``dvnew``: ``[B, H, T, Dv]`` (delta rule). Returns ``(dq, dk, dw, dG_parts)`` -- the first three in
    q's dtype, ``dG_parts [NK, B, H, T]`` float32 (one part per key tile, summed by the WY backward) --
    None where not computed. ``block_v``/``block_k`` force the tile widths (interpreter tests).
    """
    B, H, T, D = q.shape
    DV = v.shape[-1]
    NT = num_chunks(T, chunk_size)
    need_dk = dh is not None
    # A forced candidate (launch.forcing) may carry the key tile: the parts of dG are laid out by it.
    BLOCK_D = block_k or forced("chunk_o._dqk").get("BLOCK_D") or dqk_key_block(D, q.device)
    dq = torch.empty(B, H, T, D, device=q.device, dtype=q.dtype)
    dk = torch.empty_like(dq) if need_dk else None
    dw = torch.empty_like(dq) if need_dk and delta_rule else None
    dG_parts = (torch.empty(triton.cdiv(D, BLOCK_D), B, H, T, device=q.device, dtype=torch.float32)
                if need_dk and G is not None else None)
    if dq.numel() == 0:
        return dq, dk, dw, dG_parts
    tiles = interpret_config(DQK_CONFIGS, BLOCK_DV=block_v or head_block(DV))
    grid = lambda meta: (triton.cdiv(D, BLOCK_D), NT, B * H)  # noqa: E731
    _dqk[grid](q, k, v, h, dh, dvnew, G, do, dq, dk, dw, dG_parts, T, D, DV, NT, float(scale),
               CHUNK=chunk_size, BLOCK_D=BLOCK_D, DELTA_RULE=delta_rule, GATED=G is not None, NEED_DK=need_dk,
               IO=io_dtype(q.dtype), WIDE=wide_dtype(q.dtype), **tiles)
    return dq, dk, dw, dG_parts
