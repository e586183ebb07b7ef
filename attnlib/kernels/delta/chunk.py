"""Chunked DeltaNet and Gated DeltaNet, forward and backward, decomposed as the field does (fla's
``chunk_delta_rule``): only the state pass is sequential over chunks; all else is parallel over
(chunks x batch * heads).

    S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,      o_t = scale S_t q_t

Forward (``G`` = chunk-local cumsum of ``g``; ``h_c = S^T`` before chunk ``c``):

1. ``chunk_cumsum``          (common/cumsum.py)      G                                 grid (chunks, B*H)
2. ``chunk_scaled_dot_kkt``  (wy.py)                 A = strict(diag(beta)(K K^T . Gamma))  (chunks, B*H)
3. ``solve_tril``            (common/solve_tril.py)  Ai = (I + A)^{-1}: 16x16 blocks, merged upward
4. ``recompute_w_u``         (wy.py)                 W = Ai (beta gamma K), U = Ai (beta V)  (chunks, B*H)
5. ``chunk_fwd_h``           (common/chunk_state.py) h_c, v_new = U - W h_c, S_T    (Dv tiles, B*H), sequential
6. ``chunk_fwd_o``           (common/chunk_o.py)     O = scale ((Q h_c) . gamma + (Q K^T . Gamma . M) v_new)

Saved for the backward: the inputs, ``G`` and ``Ai``. The backward recomputes ``W, U`` (step 4) and
``h_c, v_new`` (step 5), then:

7. ``chunk_bwd_dv_local``  scale (Q K^T . Gamma . M)^T dO                         (Dv tiles, chunks, B*H)
8. ``chunk_bwd_dh``        reverse state pass: dh per chunk, dv_new, dS_0          (Dv tiles, B*H), sequential
9. ``chunk_bwd_dqk``       dQ, dK (outputs and state), dW = -dv_new h_c^T, dG  (D tiles, chunks, B*H)
10. ``wy_backward``        dV, dbeta, and the WY parts of dK, dG                   (chunks, B*H)
11. ``chunk_cumsum(reverse)``  dg from dG

When only ``q`` needs a gradient, steps 7, 8, 10, 11 are skipped (``dQ`` needs only ``h_c`` and ``v_new``).
The chunk is ``chunk_size`` capped at 64 (32 for D > 128): see ``common/launch.kernel_chunk``.
"""

from __future__ import annotations

import torch

from ..common.chunk_o import chunk_bwd_dqk, chunk_bwd_dv_local, chunk_fwd_o
from ..common.chunk_state import chunk_bwd_dh, chunk_fwd_h
from ..common.cumsum import chunk_cumsum
from ..common.launch import check_chunk, check_dims, kernel_chunk, require_device
from ..common.solve_tril import solve_tril
from .wy import chunk_scaled_dot_kkt, recompute_w_u, wy_backward


def delta_rule_chunk_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                             g: torch.Tensor | None = None, *, scale: float, chunk_size: int = 64,
                             initial_state: torch.Tensor | None = None, block_v: int | None = None):
    """``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``, ``beta, g: [B, H, T]``, ``initial_state: [B, H, Dv, D]``.

    Returns ``(o [B, H, T, Dv] in q's dtype, S_T [B, H, Dv, D] float32, saved)`` where ``saved =
    (G, Ai)`` is what :func:`delta_rule_chunk_backward` needs besides the inputs. ``block_v`` forces the
    width of the value tiles (tests split Dv with it under the interpreter).
    """
    require_device(q)
    check_chunk(chunk_size)
    check_dims(q.shape[-1], v.shape[-1])
    q, k, v, beta = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous()
    chunk_size = kernel_chunk(chunk_size, q.shape[-1])
    G = chunk_cumsum(g, chunk_size) if g is not None else None
    Ai = solve_tril(chunk_scaled_dot_kkt(k, beta, G, chunk_size), chunk_size)
    w, u = recompute_w_u(k, v, beta, G, Ai, chunk_size, block_v=block_v)
    hs, vnew, S = chunk_fwd_h(k, u, w=w, G=G, initial_state=initial_state, chunk_size=chunk_size,
                              block_v=block_v)
    o = chunk_fwd_o(q, k, vnew, hs, G=G, scale=scale, chunk_size=chunk_size, block_v=block_v)
    return o, S, (G, Ai)


def delta_rule_chunk_backward(q, k, v, beta, initial_state, saved, do, dS, *, scale: float, chunk_size: int,
                              only_dq: bool = False, need_state_grad: bool = True, block_v: int | None = None):
    """Gradients ``(dq, dk, dv, dbeta, dg, dS0)``, float32 (``dg`` None without gates; everything but
    ``dq`` None with ``only_dq``; ``dS0`` None unless ``need_state_grad``). ``block_v`` forces the width
    of the value tiles and of the key tiles of the kernels that walk ``D`` in tiles."""
    require_device(q)
    G, Ai = saved
    chunk_size = Ai.shape[-1]                                  # the forward's (capped) chunk
    q, k, v, beta, do = q.contiguous(), k.contiguous(), v.contiguous(), beta.contiguous(), do.contiguous()
    bv = dict(block_v=block_v)
    w, u = recompute_w_u(k, v, beta, G, Ai, chunk_size, **bv)
    hs, vnew, _ = chunk_fwd_h(k, u, w=w, G=G, initial_state=initial_state, chunk_size=chunk_size, **bv)
    if only_dq:
        dq, _, _, _ = chunk_bwd_dqk(q, k, vnew, hs, do, G=G, scale=scale, chunk_size=chunk_size, delta=True,
                                    block_k=block_v, **bv)
        return dq, None, None, None, None, None
    dvl = chunk_bwd_dv_local(q, k, do, G=G, scale=scale, chunk_size=chunk_size, **bv)
    dhs, dvnew, dS0 = chunk_bwd_dh(q, k, do, dvl, w=w, G=G, dS=dS, chunk_size=chunk_size, scale=scale,
                                   need_dh0=need_state_grad, **bv)
    dq, dk, dw, dG = chunk_bwd_dqk(q, k, vnew, hs, do, dh=dhs, dvnew=dvnew, G=G, scale=scale,
                                   chunk_size=chunk_size, delta=True, block_k=block_v, **bv)
    dv, dbeta = wy_backward(k, v, beta, G, Ai, dw, dvnew, dk, dG, chunk_size, block_k=block_v, **bv)
    dg = chunk_cumsum(dG, chunk_size, reverse=True) if G is not None else None
    return dq, dk, dv, dbeta, dg, dS0
