"""Chunked linear attention, forward and backward: the delta rule's skeleton without the WY part.

    causal:      o_t = scale S_t q_t,  S_t = S_0 + sum_{j<=t} v_j k_j^T      (S: [Dv, D])
    non-causal:  o_t = scale S_T q_t

(``q, k`` already feature-mapped by ``attnlib.linear``; a normalised call has appended a ones column
to ``v``, so the normaliser rides along as one more value column.)

Forward, causal -- two launches:

1. ``chunk_fwd_h`` (``common/chunk_state.py``): grid ``(Dv tiles, B*H)``, sequential over chunks,
   writes every chunk's starting state ``h_c`` (float32) and the final state;
2. ``chunk_fwd_o`` (``common/chunk_o.py``): grid ``(Dv tiles, chunks, B*H)``,
   ``O_c = scale (Q_c h_c + (Q_c K_c^T . M) V_c)`` with a float32 score tile.

Non-causal: the state pass without storing ``h_c``, then ``O = scale Q S_T^T`` by the same output
kernel reading one state for every chunk.

Backward, causal -- four launches (``h_c`` is recomputed, not saved):
``chunk_fwd_h`` again; ``chunk_bwd_dv_local`` (``scale (Q K^T . M)^T dO`` per chunk); the reverse
state pass ``chunk_bwd_dh`` (``dh`` per chunk, ``dS_0``, and ``dV = dv_local + K dh``); and
``chunk_bwd_dqk`` (``dQ, dK`` per chunk). Non-causal: ``dh_T = dS_T^T + scale Q^T dO`` by the forward
state pass run on ``(Q, dO)``, then ``dQ = scale dO S_T``, ``dK = V dh_T^T``, ``dV = K dh_T`` by the
output kernel in its one-state mode.

The chunk is ``chunk_size`` capped at 64 (32 for D > 128): see ``common/launch.kernel_chunk``.
"""

from __future__ import annotations

import torch

from ..common.chunk_o import chunk_bwd_dqk, chunk_bwd_dv_local, chunk_fwd_o
from ..common.chunk_state import chunk_bwd_dh, chunk_fwd_h
from ..common.launch import check_chunk, check_dims, kernel_chunk, require_device


def linear_chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         initial_state: torch.Tensor | None = None, *, scale: float = 1.0,
                         causal: bool = True, chunk_size: int = 64, out_dtype: torch.dtype | None = None,
                         block_v: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]`` (one dtype), ``initial_state: [B, H, Dv, D]`` or None.

    Returns ``(o [B, H, T, Dv] in out_dtype (default q's), S_T [B, H, Dv, D] float32)``. ``block_v``
    forces the width of the value tiles (tests split Dv with it under the interpreter).
    """
    require_device(q)
    check_chunk(chunk_size)
    check_dims(q.shape[-1], v.shape[-1])
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    chunk_size = kernel_chunk(chunk_size, q.shape[-1])
    bv = dict(block_v=block_v)
    hs, _, S = chunk_fwd_h(k, v, initial_state=initial_state, chunk_size=chunk_size, store_h=causal, **bv)
    if causal:
        o = chunk_fwd_o(q, k, v, hs, scale=scale, chunk_size=chunk_size, out_dtype=out_dtype, **bv)
    else:
        o = chunk_fwd_o(q, None, None, S, scale=scale, chunk_size=chunk_size, out_dtype=out_dtype, final=True,
                        **bv)
    return o, S


def linear_chunk_backward(q, k, v, initial_state, do, dS, *, scale: float = 1.0, causal: bool = True,
                          chunk_size: int = 64, need_state_grad: bool = True, block_v: int | None = None):
    """Gradients of ``linear_chunk_forward``: ``(dq, dk, dv, dS0)`` in float32 (``dS0`` None when
    ``need_state_grad`` is False). ``do: [B, H, T, Dv]``, ``dS: [B, H, Dv, D]`` or None. ``block_v``
    forces the width of the value tiles and of the dq/dk kernel's key tiles."""
    require_device(q)
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    chunk_size = kernel_chunk(chunk_size, q.shape[-1])
    bv = dict(block_v=block_v)
    if causal:
        hs, _, _ = chunk_fwd_h(k, v, initial_state=initial_state, chunk_size=chunk_size, **bv)
        dvl = chunk_bwd_dv_local(q, k, do, scale=scale, chunk_size=chunk_size, **bv)
        dhs, dv, dS0 = chunk_bwd_dh(q, k, do, dvl, dS=dS, chunk_size=chunk_size, scale=scale,
                                    need_dh0=need_state_grad, **bv)
        dq, dk, _, _ = chunk_bwd_dqk(q, k, v, hs, do, dh=dhs, scale=scale, chunk_size=chunk_size, block_k=block_v,
                                     **bv)
        return dq, dk, dv, dS0
    # Non-causal: every output reads S_T, so dL/dS_T = dS + scale dO^T Q (one sum over time).
    _, _, S = chunk_fwd_h(k, v, initial_state=initial_state, chunk_size=chunk_size, store_h=False)
    _, _, dST = chunk_fwd_h(q, do, initial_state=dS, chunk_size=chunk_size, scale=scale, store_h=False)
    f32 = torch.float32
    dq = chunk_fwd_o(do, None, None, S.transpose(-1, -2), scale=scale, chunk_size=chunk_size,
                     out_dtype=f32, final=True)                                  # scale dO S
    dk = chunk_fwd_o(v, None, None, dST.transpose(-1, -2), scale=1.0, chunk_size=chunk_size,
                     out_dtype=f32, final=True)                                  # V dS_T
    dv = chunk_fwd_o(k, None, None, dST, scale=1.0, chunk_size=chunk_size, out_dtype=f32, final=True)
    return dq, dk, dv, (dST if need_state_grad else None)
