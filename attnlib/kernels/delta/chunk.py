"""Chunked DeltaNet and Gated DeltaNet, forward and backward, decomposed as the field does (fla's
``chunk_delta_rule``), with fewer launches: only the state pass is sequential over chunks; all else is
parallel over (chunks x batch * heads).

    S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,      o_t = scale S_t q_t

Forward (``G`` = chunk-local cumsum of ``g``; ``h_c = S^T`` before chunk ``c``) -- three launches:

1. ``wy_forward``   (wy.py)                  G; A = strict(diag(beta)(K K^T . Gamma)) and its inverse
                                             in registers; W = Ai (beta gamma K), U = Ai (beta V)   (chunks, B*H)
2. ``chunk_fwd_h``  (common/chunk_state.py)  h_c, v_new = U - W h_c, S_T          (Dv tiles, B*H), sequential
3. ``chunk_fwd_o``  (common/chunk_o.py)      O = scale ((Q h_c) . gamma + (Q K^T . Gamma . M) v_new)

Nothing is saved for the backward but the inputs. The backward reruns steps 1 and 2, then:

4. ``chunk_bwd_dv_local``  scale (Q K^T . Gamma . M)^T dO                         (Dv tiles, chunks, B*H)
5. ``chunk_bwd_dh``        reverse state pass: dh per chunk, dv_new, dS_0          (Dv tiles, B*H), sequential
6. ``chunk_bwd_dqk``       dQ, dK (outputs and state), dW = -dv_new h_c^T, parts of dG  (D tiles, chunks, B*H)
7. ``wy_backward``         dV, dbeta, the WY parts of dK, and dg (the reverse scan)   (chunks, B*H)

When only ``q`` needs a gradient, steps 4, 5 and 7 are skipped (``dQ`` needs only ``h_c`` and ``v_new``).
fla's decomposition has five launches forward (the products ``K K^T``, the triangular solve and ``W, U``
apart, with ``A`` written in float32 and read back) and keeps the triangular inverse for the backward.
"""

from __future__ import annotations

import torch

from ..common.chunk_o import chunk_bwd_dqk, chunk_bwd_dv_local, chunk_fwd_o
from ..common.chunk_state import chunk_bwd_dh, chunk_fwd_h
from ..common.launch import check_chunk, require_launchable
from .wy import wy_backward, wy_forward


def delta_rule_chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                             g: torch.Tensor | None = None, *, scale: float, chunk_size: int,
                             initial_state: torch.Tensor | None = None, output_final_state: bool,
                             block_k: int | None = None, block_v: int | None = None):
    """``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``, ``beta, g: [B, H, T]``, ``initial_state: [B, H, Dv, D]``.

    Returns ``(o [B, H, T, Dv] in q's dtype, S_T [B, H, Dv, D] float32 or None)``. ``block_k``/``block_v``
    force tile widths (tests split D and Dv with them under the interpreter).
    """
    require_launchable(q, q.shape[-1], v.shape[-1])
    check_chunk(chunk_size)
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    g = g.contiguous() if g is not None else None
    tiles = dict(block_k=block_k, block_v=block_v)
    w, u, G = wy_forward(k, v, beta, g, chunk_size=chunk_size, **tiles)
    hs, vnew, S = chunk_fwd_h(k, u, w=w, G=G, initial_state=initial_state, chunk_size=chunk_size, scale=1.0,
                              output_final_state=output_final_state, block_v=block_v)
    o = chunk_fwd_o(q, k, vnew, hs, G=G, scale=scale, chunk_size=chunk_size, **tiles)
    return o, S


def delta_rule_chunk_backward(q, k, v, beta, g, initial_state, do, dS, *, scale: float, chunk_size: int,
                              only_dq: bool = False, need_state_grad: bool = True, block_k: int | None = None,
                              block_v: int | None = None):
    """Gradients ``(dq, dk, dv, dbeta, dg, dS0)``, each in its input's dtype (``dS0`` float32; ``dg`` None
    without gates; everything but ``dq`` None with ``only_dq``; ``dS0`` None unless ``need_state_grad``)."""
    require_launchable(q)
    q, k, v, beta, do = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(), do.contiguous()
    g = g.contiguous() if g is not None else None
    tiles = dict(block_k=block_k, block_v=block_v)
    w, u, G = wy_forward(k, v, beta, g, chunk_size=chunk_size, **tiles)
    hs, vnew, _ = chunk_fwd_h(k, u, w=w, G=G, initial_state=initial_state, chunk_size=chunk_size, scale=1.0,
                              output_final_state=False, block_v=block_v)
    if only_dq:
        dq, _, _, _ = chunk_bwd_dqk(q, k, vnew, hs, do, G=G, scale=scale, chunk_size=chunk_size, delta_rule=True,
                                    **tiles)
        return dq, None, None, None, None, None
    dvl = chunk_bwd_dv_local(q, k, do, G=G, scale=scale, chunk_size=chunk_size, **tiles)
    dhs, dvnew, dS0 = chunk_bwd_dh(q, k, do, dvl, w=w, G=G, dS=dS, chunk_size=chunk_size, scale=scale,
                                   need_state_grad=need_state_grad, block_v=block_v)
    dq, dk, dw, dG_parts = chunk_bwd_dqk(q, k, vnew, hs, do, dh=dhs, dvnew=dvnew, G=G, scale=scale,
                                         chunk_size=chunk_size, delta_rule=True, **tiles)
    dv, dbeta, dg = wy_backward(k, v, beta, G, dw, dvnew, dk, dG_parts, g_dtype=g.dtype if g is not None else None,
                                chunk_size=chunk_size, **tiles)
    return dq, dk, dv, dbeta, dg, dS0
