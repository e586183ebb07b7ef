"""The causal linear-attention forward, parallel over the sequence: the state is a sum, so it can be
summed in pieces.

Cut the sequence into ``NS`` segments of ``SEG`` chunks. With ``dS_s = sum_{j in segment s} v_j k_j^T``
(as ``h = S^T``: ``K_s^T V_s``), the state entering segment ``s`` is ``h_s = S_0^T + sum_{s' < s} dS_s'``. Three
launches, the first two only when ``NS > 1``:

1. ``_segment_sum_kernel``, grid ``(D tiles x Dv tiles, NS, B * H)``: ``dS_s`` for every segment at once,
   written float32 ``[B, H, NS, D, Dv]``.
2. ``_segment_scan_kernel``, grid ``(D tiles x Dv tiles, B * H)``: walks the ``NS`` segments, replacing
   each ``dS_s`` by the state entering segment ``s`` (in place).
3. ``_segment_output_kernel``, grid ``(Dv tiles, NS, B * H)``: one program per segment and value tile
   keeps its ``[D, BLOCK_DV]`` slice of the state in float32 registers and walks the segment's chunks,

       O_c = scale (Q_c h + (Q_c K_c^T . M) V_c),      h <- h + K_c^T V_c,

   and the last segment's programs write the final state.

The per-chunk states never reach memory: the forward reads ``q, k, v`` (``k, v`` twice when ``NS > 1``)
and writes ``o``, where the two-pass form (``chunk_fwd_h`` then ``chunk_fwd_o``, as in fla) also writes
and reads a ``[D, Dv]`` state per chunk -- at D = Dv = 128 and chunk 64, in bfloat16, that is twice the
bytes of ``k``, written once and read once.

Heads up to 128 wide: at D = 256 the output program's ``[D, BLOCK_DV]`` state and ``[CHUNK, D]`` tiles
spilled registers on sm_89 in every tile shape measured, so ``linear/chunk.py`` takes the two-pass
form there (its state pass splits ``D``).

``NS`` is chosen so that the output kernel has about two programs per streaming multiprocessor of the
device, with segments of at least 16 chunks (:func:`segment_count`). On an H100 (132 multiprocessors),
at chunk 64: B4 H16 T4096 D128 gets 3 segments (64 heads x 2 value tiles x 3 = 384 programs), and
B1 H8 T65536 D128 gets 17 (8 heads x 2 x 17 = 272) -- where a single state pass would walk 1024 chunks
in 16 programs. Fewer segments read ``k, v`` less; more
segments give a device with few (batch, head) pairs something to do -- the sequential walk over 1024
chunks of one head is what a single state pass costs at T65536.

Precision as everywhere (``../common/precision.py``): the products with the state and the score tile
take ``WIDE`` operands (bfloat16 for half inputs), the others the input dtype; the segment sums and
states between launches are float32 (they are few).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.chunk_o import finite_part, first_nonfinite
from ..common.chunk_tiles import load_chunk, store_chunk
from ..common.launch import autotuned, chunk_invariants, head_block, interpret_config, num_chunks, pruner, sm_count
from ..common.precision import dot, io_dtype, wide_dtype


@triton.jit
def _tile(pid, D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    nv = tl.cdiv(DV, BLOCK_DV)
    offs_k = (pid // nv) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_v = (pid % nv) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    return offs_k, offs_v, (offs_k < D)[:, None] & (offs_v < DV)[None, :]


@triton.jit
def _segment_sum_kernel(K, V, DS, T, D, DV, NT, SEG,
                        CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, IO: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    s = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_k, offs_v, hmask = _tile(tl.program_id(0), D, DV, BLOCK_D, BLOCK_DV)
    acc = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    for c in range(s * SEG, tl.minimum(s * SEG + SEG, NT)):
        t = c * CHUNK + tl.arange(0, CHUNK)
        tmask = t < T
        k = load_chunk(K, bh, T, t, offs_k, D, tmask[:, None] & (offs_k < D)[None, :])
        v = load_chunk(V, bh, T, t, offs_v, DV, tmask[:, None] & (offs_v < DV)[None, :])
        acc += dot(tl.trans(k), v, IO)                                             # K_c^T V_c
    tl.store(DS + ((bh * tl.num_programs(1) + s) * D + offs_k[:, None]) * DV + offs_v[None, :], acc, mask=hmask)


@triton.jit
def _segment_scan_kernel(DS, H0, NS, D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, USE_H0: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)
    offs_k, offs_v, hmask = _tile(tl.program_id(0), D, DV, BLOCK_D, BLOCK_DV)
    s_offs = bh * DV * D + offs_v[None, :] * D + offs_k[:, None]                   # a [B, H, Dv, D] state
    h = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    if USE_H0:
        h += tl.load(H0 + s_offs, mask=hmask, other=0.0).to(tl.float32)
    for s in range(0, NS):
        ptrs = DS + ((bh * NS + s) * D + offs_k[:, None]) * DV + offs_v[None, :]
        d = tl.load(ptrs, mask=hmask, other=0.0)
        tl.store(ptrs, h, mask=hmask)                                             # the state entering segment s
        h += d


@triton.jit
def _segment_output_kernel(Q, K, V, STARTS, O, HT,
                           stride_sbh, stride_ss, stride_sd, stride_sv,
                           T, D, DV, NT, SEG, scale,
                           CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                           USE_START: tl.constexpr, STORE_HT: tl.constexpr, IO: tl.constexpr, WIDE: tl.constexpr):
    chunk_invariants(CHUNK, BLOCK_D, BLOCK_DV)
    s = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    offs_v = tl.program_id(0) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    hmask = (offs_d < D)[:, None] & (offs_v < DV)[None, :]
    offs_c = tl.arange(0, CHUNK)
    causal = offs_c[:, None] >= offs_c[None, :]
    h = tl.zeros([BLOCK_D, BLOCK_DV], dtype=tl.float32)
    if USE_START:
        h += tl.load(STARTS + bh * stride_sbh + s * stride_ss + offs_d[:, None] * stride_sd
                     + offs_v[None, :] * stride_sv, mask=hmask, other=0.0).to(tl.float32)
    for c in range(s * SEG, tl.minimum(s * SEG + SEG, NT)):
        t = c * CHUNK + offs_c
        tmask = t < T
        kd = tmask[:, None] & (offs_d < D)[None, :]
        kv = tmask[:, None] & (offs_v < DV)[None, :]
        q = load_chunk(Q, bh, T, t, offs_d, D, kd)
        k = load_chunk(K, bh, T, t, offs_d, D, kd)
        v = load_chunk(V, bh, T, t, offs_v, DV, kv)
        # Only v's finite part enters the products (chunk_o.py: 0 * NaN above the diagonal); the rows from a
        # column's first bad value on, and the state's column from then on, are set NaN instead, on the rare
        # branch: one v tile live, and no mark on the common path -- this program is at the register limit
        # (sm_80, D = 128, fp16, BLOCK_DV 64 with 8 warps: 255 registers before any of it).
        bad = first_nonfinite(v)
        any_bad = tl.min(bad, axis=0) < CHUNK
        if any_bad:
            v = finite_part(v)
        scores = tl.where(causal, dot(q, tl.trans(k), IO), 0.0)                   # Q K^T . M
        o = dot(q, h, WIDE) + dot(scores, v, WIDE)
        if any_bad:
            o = tl.where(offs_c[:, None] >= bad[None, :], float("nan"), o)
        store_chunk(O, (o * scale).to(O.dtype.element_ty), bh, T, t, offs_v, DV, kv)
        h += dot(tl.trans(k), v, IO)                                               # h <- h + K^T V
        if any_bad:
            h = tl.where(bad[None, :] < CHUNK, float("nan"), h)
    if STORE_HT:
        if s == tl.num_programs(1) - 1:
            tl.store(HT + bh * DV * D + offs_v[None, :] * D + offs_d[:, None], h, mask=hmask)


# ----------------------------------------------------------------------------- tiles and autotuning
# Candidates; the last is the small fallback. The output program holds a [D, BLOCK_DV] float32 state,
# a [CHUNK, CHUNK] score tile and a [CHUNK, BLOCK_DV] output tile; it streams q, k [CHUNK, D] and v.
OUTPUT_CONFIGS = [triton.Config({"BLOCK_DV": bv}, num_warps=w, num_stages=s) for bv, w, s in
                  [(64, 8, 2), (64, 4, 2), (32, 4, 2), (32, 8, 2), (128, 8, 2), (32, 8, 1)]]
SUM_CONFIGS = [triton.Config({"BLOCK_D": bk, "BLOCK_DV": bv}, num_warps=w, num_stages=s) for bk, bv, w, s in
               [(64, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 2), (32, 32, 4, 1)]]
# Measured spills, {target family: {launch.config_key: narrowest head block that spilled}}, one table per
# autotuned launch (scripts/kernel_report.py compiles every candidate for sm_80, sm_89 and sm_90).
OUTPUT_SPILLS = {
    "sm80": {(32, 4, 2): 128, (32, 8, 1): 256, (32, 8, 2): 256, (64, 4, 2): 128, (64, 8, 2): 128, (128, 8, 2): 64},
    "sm89": {(32, 4, 2): 128, (32, 8, 1): 256, (32, 8, 2): 256, (64, 4, 2): 64, (64, 8, 2): 64, (128, 8, 2): 128},
    "sm90": {(64, 4, 2): 256, (128, 8, 2): 128},
}
SUM_SPILLS = {"sm80": {}, "sm89": {}, "sm90": {}}
OUTPUT_BLOCK_V = 64          # the value tile assumed when choosing the number of segments
MIN_SEGMENT_CHUNKS = 16      # a segment's state (written, scanned, read: 3 x 4 D Dv bytes) stays a few
                             # per cent of its rows' traffic from 16 chunks of 64 rows on (D = Dv = 128)


def _output_smem(cfg, args):
    bd, bv, c, es = args["BLOCK_D"], cfg.kwargs["BLOCK_DV"], args["CHUNK"], args["Q"].element_size()
    return max(cfg.num_stages, 1) * c * (2 * bd + bv) * es + bd * bv * 2 + c * c * 4


def _sum_smem(cfg, args):
    bk, bv, c, es = cfg.kwargs["BLOCK_D"], cfg.kwargs["BLOCK_DV"], args["CHUNK"], args["K"].element_size()
    return max(cfg.num_stages, 1) * c * (bk + bv) * es


def _width(args):
    return max(head_block(args["D"]), head_block(args["DV"]))


_output = autotuned(_segment_output_kernel, OUTPUT_CONFIGS, ["D", "DV", "CHUNK", "USE_START"],
                    pruner(_output_smem, OUTPUT_SPILLS, _width, "Q"), name="segments._output")
_sum = autotuned(_segment_sum_kernel, SUM_CONFIGS, ["D", "DV", "CHUNK"], pruner(_sum_smem, SUM_SPILLS, _width, "K"),
                 name="segments._sum")


def segment_count(T: int, chunk_size: int, BH: int, DV: int, device: torch.device) -> int:
    """Segments for the output kernel to have about two programs per streaming multiprocessor, each
    at least :data:`MIN_SEGMENT_CHUNKS` chunks long (one segment under the interpreter, whose device
    has one multiprocessor)."""
    programs = BH * triton.cdiv(DV, OUTPUT_BLOCK_V)
    wanted = triton.cdiv(2 * sm_count(device), max(programs, 1))
    NT = num_chunks(T, chunk_size)
    ns = max(1, min(wanted, NT // MIN_SEGMENT_CHUNKS))
    return num_chunks(NT, triton.cdiv(NT, ns)) if NT else 1


def linear_segments_forward(q, k, v, initial_state=None, *, scale: float, chunk_size: int, out_dtype=None,
                            output_final_state: bool, segments: int | None = None, block_v: int | None = None):
    """The causal forward. ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``, ``initial_state: [B, H, Dv, D]``.
    Returns ``(o [B, H, T, Dv] in out_dtype (default q's), S_T [B, H, Dv, D] float32 or None)``.
    ``segments`` forces the number of segments (tests use it under the interpreter)."""
    B, H, T, D = q.shape
    DV = v.shape[-1]
    dev = q.device
    o = torch.empty(B, H, T, DV, device=dev, dtype=out_dtype or q.dtype)
    S = torch.empty(B, H, DV, D, device=dev, dtype=torch.float32) if output_final_state else None
    h0 = initial_state.contiguous() if initial_state is not None else None
    NT = num_chunks(T, chunk_size)
    if B * H == 0 or DV == 0 or NT == 0 or D == 0:
        if S is not None:
            S.copy_(h0) if h0 is not None else S.zero_()
        return o.zero_(), S
    NS = segments or segment_count(T, chunk_size, B * H, DV, dev)
    SEG = triton.cdiv(NT, NS)
    NS = triton.cdiv(NT, SEG)
    io, wide = io_dtype(q.dtype), wide_dtype(q.dtype)
    if NS == 1:
        starts, strides = h0, (DV * D, 0, 1, D)                       # the initial state, [Dv, D] per head
    else:
        starts = torch.empty(B, H, NS, D, DV, device=dev, dtype=torch.float32)
        sum_tiles = interpret_config(SUM_CONFIGS, BLOCK_D=head_block(D), BLOCK_DV=head_block(DV))
        _sum[lambda m: (triton.cdiv(D, m["BLOCK_D"]) * triton.cdiv(DV, m["BLOCK_DV"]), NS, B * H)](
            k, v, starts, T, D, DV, NT, SEG, CHUNK=chunk_size, IO=io, **sum_tiles)
        BK, BV = min(64, head_block(D)), min(64, head_block(DV))
        _segment_scan_kernel[(triton.cdiv(D, BK) * triton.cdiv(DV, BV), B * H)](
            starts, h0, NS, D, DV, BLOCK_D=BK, BLOCK_DV=BV, USE_H0=h0 is not None)
        strides = (NS * D * DV, D * DV, DV, 1)
    tiles = interpret_config(OUTPUT_CONFIGS, BLOCK_DV=block_v or head_block(DV))
    _output[lambda m: (triton.cdiv(DV, m["BLOCK_DV"]), NS, B * H)](
        q, k, v, starts, o, S, *strides, T, D, DV, NT, SEG, float(scale),
        CHUNK=chunk_size, BLOCK_D=head_block(D), USE_START=starts is not None, STORE_HT=output_final_state,
        IO=io, WIDE=wide, **tiles)
    return o, S
