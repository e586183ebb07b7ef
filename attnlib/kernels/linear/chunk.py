"""Chunked linear attention, forward and backward: the delta rule's skeleton without the WY part.

    causal:      o_t = scale S_t q_t,  S_t = S_0 + sum_{j<=t} v_j k_j^T      (S: [Dv, D])
    non-causal:  o_t = scale S_T q_t

(``q, k`` already feature-mapped by ``attnlib.linear``; a normalised call has appended a ones column
to ``v``, so the normaliser rides along as one more value column.)

Forward, causal: ``segments.py`` -- the sequence cut into segments whose state sums are formed in
parallel and scanned, then one fused pass per segment that keeps the state in registers and writes
only ``o`` (one launch when a single segment gives the GPU enough programs). Heads wider than 128: the
two-pass form, ``chunk_fwd_h`` (every chunk's state) then ``chunk_fwd_o``.

Non-causal: the state pass without storing ``h_c``, then ``O = scale Q S_T^T`` by the same output
kernel reading one state for every chunk.

Backward, causal -- four launches (``h_c`` is recomputed, not saved): ``chunk_fwd_h``
(``common/chunk_state.py``: grid ``(D tiles x Dv tiles, B*H)``, sequential over chunks, writes every
chunk's starting state, bfloat16 for half inputs); ``chunk_bwd_dv_local`` (``scale (Q K^T . M)^T dO`` per
chunk); the reverse state pass ``chunk_bwd_dh`` (``dh`` per chunk, ``dS_0``, and ``dV = dv_local + K dh``);
and ``chunk_bwd_dqk`` (``dQ, dK`` per chunk). Non-causal: ``dh_T = dS_T^T + scale Q^T dO`` by the forward
state pass run on ``(Q, dO)``, then ``dQ = scale dO S_T``, ``dK = V dh_T^T``, ``dV = K dh_T`` by the
output kernel in its one-state mode.
"""

from __future__ import annotations

import torch

from ..common.chunk_o import chunk_bwd_dqk, chunk_bwd_dv_local, chunk_fwd_o
from ..common.chunk_state import chunk_bwd_dh, chunk_fwd_h
from ..common.launch import check_chunk, require_launchable
from .segments import linear_segments_forward

# The segmented forward holds a [D, BLOCK_DV] state and [CHUNK, D] tiles in one program: at D = 256 that
# spilled registers on sm_89 in every tile shape measured (``segments.py``), so wider heads take the
# two-pass form of the backward's state pass and the output kernel.
SEGMENTED_MAX_HEAD = 128


def linear_chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         initial_state: torch.Tensor | None = None, *, scale: float, causal: bool,
                         chunk_size: int, out_dtype: torch.dtype | None = None, output_final_state: bool,
                         segments: int | None = None, block_k: int | None = None, block_v: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]`` (one dtype), ``initial_state: [B, H, Dv, D]`` or None.

    Returns ``(o [B, H, T, Dv] in out_dtype (default q's), S_T [B, H, Dv, D] float32, or None when not
    output_final_state)``. ``segments`` (causal) forces the number of sequence segments processed in
    parallel (``segments.py``); ``block_k``/``block_v`` force tile widths (tests split D and Dv with them
    under the interpreter).
    """
    require_launchable(q, q.shape[-1], v.shape[-1])
    check_chunk(chunk_size)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    tiles = dict(block_k=block_k, block_v=block_v)
    if causal and max(q.shape[-1], v.shape[-1]) <= SEGMENTED_MAX_HEAD:
        return linear_segments_forward(q, k, v, initial_state, scale=scale, chunk_size=chunk_size,
                                       out_dtype=out_dtype, output_final_state=output_final_state,
                                       segments=segments, block_v=block_v)
    if causal:                                   # wider heads: the state pass splits D, the outputs read it
        hs, _, S = chunk_fwd_h(k, v, initial_state=initial_state, chunk_size=chunk_size, scale=1.0,
                               output_final_state=output_final_state, **tiles)
        return chunk_fwd_o(q, k, v, hs, scale=scale, chunk_size=chunk_size, out_dtype=out_dtype, **tiles), S
    # Every output reads S_T, so it is formed whether or not the caller keeps it.
    _, _, S = chunk_fwd_h(k, v, initial_state=initial_state, chunk_size=chunk_size, scale=1.0, store_h=False,
                          output_final_state=True, **tiles)
    o = chunk_fwd_o(q, None, None, S, scale=scale, chunk_size=chunk_size, out_dtype=out_dtype, final=True,
                    **tiles)
    return o, S


def linear_chunk_backward(q, k, v, initial_state, do, dS, *, scale: float, causal: bool, chunk_size: int,
                          need_state_grad: bool = True, block_k: int | None = None, block_v: int | None = None):
    """Gradients of ``linear_chunk_forward``: ``(dq, dk, dv, dS0)``, the first three in the inputs' dtype,
    ``dS0`` float32 (None when ``need_state_grad`` is False). ``do: [B, H, T, Dv]``, ``dS: [B, H, Dv, D]``
    or None."""
    require_launchable(q)
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    tiles = dict(block_k=block_k, block_v=block_v)
    if causal:
        hs, _, _ = chunk_fwd_h(k, v, initial_state=initial_state, chunk_size=chunk_size, scale=1.0,
                               output_final_state=False, **tiles)
        dvl = chunk_bwd_dv_local(q, k, do, scale=scale, chunk_size=chunk_size, **tiles)
        dhs, dv, dS0 = chunk_bwd_dh(q, k, do, dvl, dS=dS, chunk_size=chunk_size, scale=scale,
                                    need_state_grad=need_state_grad, block_v=block_v)
        dq, dk, _, _ = chunk_bwd_dqk(q, k, v, hs, do, dh=dhs, scale=scale, chunk_size=chunk_size, **tiles)
        return dq, dk, dv, dS0
    # Non-causal: every output reads S_T, so dL/dS_T = dS + scale dO^T Q (one sum over time).
    _, _, S = chunk_fwd_h(k, v, initial_state=initial_state, chunk_size=chunk_size, scale=1.0, store_h=False,
                          output_final_state=True, **tiles)
    _, _, dST = chunk_fwd_h(q, do, initial_state=dS, chunk_size=chunk_size, scale=scale, store_h=False,
                            output_final_state=True, **tiles)
    dq = chunk_fwd_o(do, None, None, S.transpose(-1, -2), scale=scale, chunk_size=chunk_size, final=True,
                     **tiles)                                                    # scale dO S
    dk = chunk_fwd_o(v, None, None, dST.transpose(-1, -2), scale=1.0, chunk_size=chunk_size, out_dtype=k.dtype,
                     final=True, **tiles)                                        # V dS_T
    dv = chunk_fwd_o(k, None, None, dST, scale=1.0, chunk_size=chunk_size, out_dtype=v.dtype, final=True,
                     **tiles)
    return dq, dk, dv, (dST if need_state_grad else None)
