"""Chunkwise linear-attention forward in Triton: the state in registers, one pass over time.

What it computes (inputs already mapped by the feature map, see ``attnlib.linear``; ``q`` is
multiplied by ``scale`` as its tiles are loaded):

    causal:      o_t = S_t q_t,  S_t = S_0 + sum_{j<=t} v_j k_j^T        (S: [Dv, D])
    non-causal:  o_t = S_T q_t

Tiling. The grid is ``(cdiv(Dv, BLOCK_V), B * H)``: one program owns one (batch, head) and a slice
of ``BLOCK_V`` value columns, and walks time in chunks of ``CHUNK`` rows. It keeps the transposed
state ``h = S^T`` as a ``[BLOCK_K, BLOCK_V]`` float32 tile in registers for the whole sequence
(``BLOCK_K`` covers all of ``D``, padded to a power of two). For chunk ``c`` with rows
``Q_c [CHUNK, D]``, ``K_c``, ``V_c [CHUNK, BLOCK_V]`` it does three matrix products:

    A   = Q_c K_c^T, masked to j <= t inside the chunk     [CHUNK, CHUNK]   (intra-chunk scores)
    O_c = Q_c h + A V_c                                    [CHUNK, BLOCK_V] (old state + this chunk)
    h  += K_c^T V_c                                        [BLOCK_K, BLOCK_V] (write the chunk in)

so every product is a ``tl.dot`` and the ``[T, T]`` score matrix never exists. The non-causal case
runs two passes: the first sums ``h`` over all chunks, the second reads ``O_c = Q_c h``.

Precision. Products of half-precision inputs accumulate in float32, and the state is always float32:
over a long sequence it is a sum of thousands of outer products, whose entries can exceed the
float16 range. For the same reason ``Q_c h`` is a float32 product (tf32 tensor cores for half
inputs on a GPU; exact fp32 for fp32 inputs). ``A`` is cast to the value dtype for ``A V_c``.

Ragged edges: the last chunk is masked (``t < T``; masked keys and values load as zero and add
nothing to ``h``), and head dims that are not powers of two are padded with masked loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._backend import INTERPRET


@triton.jit
def _linear_chunk_fwd_kernel(Q, K, V, H0, O, HT,
                             stride_qb, stride_qh, stride_qt, stride_qd,
                             stride_kb, stride_kh, stride_kt, stride_kd,
                             stride_vb, stride_vh, stride_vt, stride_vd,
                             stride_ob, stride_oh, stride_ot, stride_od,
                             stride_sb, stride_sh, stride_sv, stride_sk,
                             H, T, D, DV, scale,
                             CHUNK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr,
                             CAUSAL: tl.constexpr, USE_H0: tl.constexpr, STORE_HT: tl.constexpr,
                             STATE_PRECISION: tl.constexpr, PRECISION: tl.constexpr):
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h_idx = pid_bh % H
    offs_c = tl.arange(0, CHUNK)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask_d = offs_k < D
    vmask_d = offs_v < DV

    q_base = Q + b * stride_qb + h_idx * stride_qh
    k_base = K + b * stride_kb + h_idx * stride_kh
    v_base = V + b * stride_vb + h_idx * stride_vh
    o_base = O + b * stride_ob + h_idx * stride_oh
    # h = S^T: element (d, e) is S[e, d]; the state tensors in memory are [B, H, Dv, D].
    s_offs = offs_v[None, :] * stride_sv + offs_k[:, None] * stride_sk
    s_mask = kmask_d[:, None] & vmask_d[None, :]

    h = tl.zeros([BLOCK_K, BLOCK_V], dtype=tl.float32)
    if USE_H0:
        h += tl.load(H0 + b * stride_sb + h_idx * stride_sh + s_offs, mask=s_mask, other=0.0)

    n_chunks = tl.cdiv(T, CHUNK)
    if CAUSAL:
        for c in range(0, n_chunks):
            t = c * CHUNK + offs_c
            tmask = t < T
            q = tl.load(q_base + t[:, None] * stride_qt + offs_k[None, :] * stride_qd,
                        mask=tmask[:, None] & kmask_d[None, :], other=0.0)          # [CHUNK, BLOCK_K]
            q = (q * scale).to(Q.dtype.element_ty)
            kt = tl.load(k_base + t[None, :] * stride_kt + offs_k[:, None] * stride_kd,
                         mask=tmask[None, :] & kmask_d[:, None], other=0.0)         # [BLOCK_K, CHUNK]
            v = tl.load(v_base + t[:, None] * stride_vt + offs_v[None, :] * stride_vd,
                        mask=tmask[:, None] & vmask_d[None, :], other=0.0)          # [CHUNK, BLOCK_V]
            a = tl.dot(q, kt, input_precision=PRECISION)                             # fp32 scores
            a = tl.where(offs_c[:, None] >= offs_c[None, :], a, 0.0)                 # j <= t
            o = tl.dot(q.to(tl.float32), h, input_precision=STATE_PRECISION)         # old state
            o += tl.dot(a.to(v.dtype), v, input_precision=PRECISION)                 # this chunk
            tl.store(o_base + t[:, None] * stride_ot + offs_v[None, :] * stride_od,
                     o.to(O.dtype.element_ty), mask=tmask[:, None] & vmask_d[None, :])
            h += tl.dot(kt, v, input_precision=PRECISION)                            # S += V^T K
    else:
        for c in range(0, n_chunks):
            t = c * CHUNK + offs_c
            tmask = t < T
            kt = tl.load(k_base + t[None, :] * stride_kt + offs_k[:, None] * stride_kd,
                         mask=tmask[None, :] & kmask_d[:, None], other=0.0)
            v = tl.load(v_base + t[:, None] * stride_vt + offs_v[None, :] * stride_vd,
                        mask=tmask[:, None] & vmask_d[None, :], other=0.0)
            h += tl.dot(kt, v, input_precision=PRECISION)
        for c in range(0, n_chunks):
            t = c * CHUNK + offs_c
            tmask = t < T
            q = tl.load(q_base + t[:, None] * stride_qt + offs_k[None, :] * stride_qd,
                        mask=tmask[:, None] & kmask_d[None, :], other=0.0)
            o = tl.dot(q.to(tl.float32) * scale, h, input_precision=STATE_PRECISION)
            tl.store(o_base + t[:, None] * stride_ot + offs_v[None, :] * stride_od,
                     o.to(O.dtype.element_ty), mask=tmask[:, None] & vmask_d[None, :])

    if STORE_HT:
        tl.store(HT + b * stride_sb + h_idx * stride_sh + s_offs, h, mask=s_mask)


def _pick_blocks(D: int, Dv: int, device: torch.device) -> tuple[int, int]:
    """(BLOCK_V, num_warps). Under the interpreter one program takes all of Dv (fewer programs run
    faster in numpy); on a GPU 64-wide slices give B * H * Dv / 64 programs."""
    full = max(16, triton.next_power_of_2(Dv))
    if device.type != "cuda":
        return full, 4
    return min(64, full), (8 if D > 64 else 4)             # a [D, 64] fp32 state tile: more warps for D > 64


def linear_chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         initial_state: torch.Tensor | None = None, *, scale: float = 1.0,
                         causal: bool = True,
                         chunk_size: int = 64, out_dtype: torch.dtype | None = None,
                         block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. Inputs validated by ``attnlib.linear_attention``.

    ``q, k: [B, H, T, D]`` (already feature-mapped), ``v: [B, H, T, Dv]``, any strides,
    one dtype among float16/bfloat16/float32; ``initial_state: [B, H, Dv, D]`` float32 or None.
    ``scale`` multiplies each loaded ``q`` tile (so an identity map needs no extra pass over ``q``).
    Returns ``(o [B, H, T, Dv] in out_dtype (default q's), S_T [B, H, Dv, D] float32)``.
    """
    if q.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1")
    B, H, T, D = q.shape
    DV = v.shape[-1]
    if D > 256 or DV > 256:
        raise ValueError(f"the Triton kernel supports D and Dv up to 256; got D={D}, Dv={DV} "
                         "(use backend='torch')")
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two >= 16 for the kernel; got {chunk_size}")
    o = torch.empty(B, H, T, DV, device=q.device, dtype=out_dtype or q.dtype)
    S = torch.empty(B, H, DV, D, device=q.device, dtype=torch.float32)
    if B * H == 0 or DV == 0:
        return o, S.zero_()
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32).contiguous()
    BLOCK_V, warps = _pick_blocks(D, DV, q.device)
    BLOCK_V = block_v or BLOCK_V
    BLOCK_K = max(16, triton.next_power_of_2(D))
    fp32 = q.dtype == torch.float32
    precision = "ieee" if fp32 else "tf32"                      # unused for half dots
    state_precision = "ieee" if fp32 else "tf32"                # half inputs: tf32 state read
    grid = (triton.cdiv(DV, BLOCK_V), B * H)
    h0 = initial_state if initial_state is not None else S      # dummy pointer when unused
    _linear_chunk_fwd_kernel[grid](
        q, k, v, h0, o, S,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *S.stride(),
        H, T, D, DV, float(scale),
        CHUNK=chunk_size, BLOCK_K=BLOCK_K, BLOCK_V=BLOCK_V,
        CAUSAL=causal, USE_H0=initial_state is not None, STORE_HT=True,
        STATE_PRECISION=state_precision, PRECISION=precision,
        num_warps=warps, num_stages=1 if q.device.type != "cuda" else 2,
    )
    return o, S


__all__ = ["linear_chunk_forward"]
