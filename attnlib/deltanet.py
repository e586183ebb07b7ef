"""DeltaNet and Gated DeltaNet -- chapter 4's operator.

The state is a matrix ``S_t: [Dv, D]`` per (batch, head). Each token rewrites it by one step of
gradient descent on the regression loss ``1/2 ||S k_t - v_t||^2`` with learning rate ``beta_t``
(the *delta rule*), after an optional decay ``alpha_t = exp(g_t)`` (Gated DeltaNet):

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,        o_t = S_t (scale * q_t).

Three ways to compute the same outputs, selected by ``mode`` (each a reference below, named
``delta_rule_<mode>_reference``; the modes in the same order as linear attention's):

* ``"parallel"``  -- the whole sequence as one chunk: Su's closed form
  ``O = (Q K^T . M)(I + diag(beta)(K K^T . M^-))^{-1} diag(beta) V`` (with the decay mask Gamma
  in place of the causal masks when gated). Cost ``O(T^2 D + T^3)``: for checking, not for speed.
* ``"recurrent"`` -- the loop above, token by token: the definition.
* ``"chunk"``     -- the WY / UT form: per chunk of ``C`` tokens one ``C x C`` unit-lower-triangular
  solve ``T = (I + tril(diag(beta)(K K^T . Gamma), -1))^{-1} diag(beta)``, then matrix products;
  the state is carried across chunks. Cost ``O(T C D + T D^2)``.

``M`` is the causal mask including the diagonal, ``M^-`` the strict one; with ``gamma_t`` the
product of the decays up to ``t``, ``Gamma_tj = gamma_t / gamma_j`` for ``j <= t``.

Stability: ``I - beta k k^T`` has eigenvalue ``1 - beta ||k||^2`` along ``k`` and 1 elsewhere, so with
unit-norm keys ``beta`` in ``[0, 2]`` keeps every eigenvalue in ``[-1, 1]``; ``beta > 2`` (or keys with
``beta ||k||^2 > 2``) makes the state grow geometrically. :func:`delta_rule` refuses ``beta`` outside
``[0, 2]``; it does not normalise keys (as in fla, that is the model's job -- chapter 4's lab shows
what happens when it is not done).

Masked positions. On the PyTorch paths of :func:`delta_rule` a position ``j > t`` contributes exactly
nothing to ``o_t``, even when ``q, k, v, beta`` or ``g`` hold NaN or inf there (e.g. uninitialised
right padding): the recurrence never lets it, and for the chunk and parallel forms, which multiply
masked positions by 0, the dispatch hands them the inputs' finite part and marks NaN what the
recurrence would have made NaN (``_finite_with_poison``). The references themselves are the bare
algorithms. The Triton kernel
multiplies within a chunk, so there a non-finite entry reaches the rows of its own chunk that precede
it (not earlier chunks): pad with zeros.
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._backend import KERNEL_CHUNKS, MAX_HEAD_DIM, choose_backend
from ._numerics import acc_dtype

MODES = ("parallel", "recurrent", "chunk")
KERNEL_CHUNK_SIZES = KERNEL_CHUNKS      # the chunk sizes the chunked kernels run


# --------------------------------------------------------------------------------------------------
# References: plain PyTorch, in the book's notation. Inputs are assumed valid (see delta_rule).
# --------------------------------------------------------------------------------------------------

def delta_rule_recurrent_reference(q, k, v, beta, g=None, *, scale: float, initial_state=None):
    """The definition, token by token.  ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``,
    ``beta, g: [B, H, T]``, ``initial_state: [B, H, Dv, D]`` or None.

    Computes in float32 (float64 for float64 inputs). Returns ``(o [B, H, T, Dv], S_T [B, H, Dv, D])``.
    """
    acc = acc_dtype(q.dtype)
    q, k, v, beta = (t.to(acc) for t in (q, k, v, beta))
    B, H, T, D = q.shape
    S = (torch.zeros(B, H, v.shape[-1], D, dtype=acc, device=q.device) if initial_state is None
         else initial_state.to(acc).clone())
    o = []
    for t in range(T):
        k_t, v_t, b_t = k[:, :, t], v[:, :, t], beta[:, :, t, None]
        if g is not None:
            S = S * torch.exp(g[:, :, t].to(acc))[..., None, None]                  # forget: alpha_t S
        err = v_t - (S @ k_t.unsqueeze(-1)).squeeze(-1)                              # v_t - S k_t, [B,H,Dv]
        S = S + (b_t * err).unsqueeze(-1) * k_t.unsqueeze(-2)                        # delta rule
        o.append((S @ (scale * q[:, :, t]).unsqueeze(-1)).squeeze(-1))               # o_t = S_t q_t
    o = torch.stack(o, dim=2) if T else q.new_zeros(B, H, 0, v.shape[-1])
    return o, S


def _within_chunk_decay(g_chunk):
    """``g_chunk: [..., C]`` -> ``(G [..., C], Gamma [..., C, C])`` with ``G_t = sum_{r<=t} g_r``
    (``log gamma_t``) and ``Gamma_tj = exp(G_t - G_j)`` for ``j <= t``, 0 above the diagonal."""
    G = g_chunk.cumsum(-1)
    C = G.shape[-1]
    diff = G[..., :, None] - G[..., None, :]
    lower = torch.ones(C, C, dtype=torch.bool, device=G.device).tril()
    Gamma = torch.exp(diff.masked_fill(~lower, float("-inf")))
    return G, Gamma


def ut_transform(k, beta, g=None):
    """The UT transform of a chunk.  ``k: [..., C, D]``, ``beta, g: [..., C]``.

    Returns ``(T [..., C, C], Gamma [..., C, C] or None, G [..., C] or None)``
    with ``T = (I + tril(diag(beta)(K K^T . Gamma), -1))^{-1} diag(beta)`` --
    one unit-lower-triangular solve (forward substitution). Then
    ``W = T diag(gamma) K`` and ``U = T V`` are the WY factors: the chunk's net
    effect is ``S_end = gamma_C S0 + (U - W S0^T)^T diag(gamma_C / gamma) K``.
    """
    C = k.shape[-2]
    A = k @ k.transpose(-1, -2)
    Gamma = G = None
    if g is not None:
        G, Gamma = _within_chunk_decay(g)
        A = A * Gamma
    # tril selects: what lies above is never read
    A = torch.tril(beta.unsqueeze(-1) * A, diagonal=-1)
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    T = torch.linalg.solve_triangular(eye + A, torch.diag_embed(beta),
                                      upper=False, unitriangular=True)
    return T, Gamma, G


def _finite_with_poison(k, v, beta, g):
    """The chunk and parallel forms multiply masked positions by 0 (triangular products), and
    0 * NaN is NaN: a junk entry at position ``j`` (uninitialised padding, say) would reach rows
    ``t < j`` that the recurrence never lets it touch. So they run on finite inputs -- ``k, v, beta,
    g`` with non-finite entries set to 0 -- and add ``poison [B, H, T, Dv]`` to the outputs: NaN from
    the first junk ``k_j``, ``beta_j`` or ``g_j`` on (the recurrence mixes it into every row of ``S``),
    and in column ``d`` from the first junk ``v_jd`` on (it reaches only row ``d`` of ``S``); 0 elsewhere.
    (A junk ``q_t`` needs nothing: it only ever meets row ``t``.)
    """
    gate = (k * 0).sum(-1) + beta * 0 + (0 if g is None else g * 0)             # [B, H, T]: NaN where junk
    poison = (v * 0 + gate.unsqueeze(-1)).cumsum(-2)                             # carried down the rows
    clean = [None if x is None else torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0) for x in (k, v, beta, g)]
    return (*clean, poison)


def _poison_state(S, poison):
    """The final state met what the last row met: row ``d`` of ``S`` is NaN where ``poison_{T, d}`` is."""
    return S if poison.shape[-2] == 0 else S + poison[..., -1, :, None]


def delta_rule_chunk_reference(q, k, v, beta, g=None, *, scale: float, chunk_size: int = 64,
                               initial_state=None):
    """The chunkwise (WY / UT) form.  Shapes as :func:`delta_rule_recurrent_reference`.

    The sequence is padded to a multiple of ``C = chunk_size`` with ``k = v = q = 0``, ``beta = 0``,
    ``g = 0``: a padded step is the identity on the state (a chunk longer than the sequence is cut
    to its length: one chunk). All chunks' ``T, W, U`` are computed at once (they do not depend on
    the state); then one sequential pass carries ``S`` across chunks:

        U' = U - W S0^T
        O  = diag(gamma) Q S0^T + (Q K^T . Gamma . M) U'
        S  = gamma_C S0 + U'^T diag(gamma_C / gamma) K

    Inputs are taken finite: :func:`delta_rule` hands this their finite part (:func:`_finite_with_poison`).
    """
    acc = acc_dtype(q.dtype)
    B, H, T, D = q.shape
    Dv = v.shape[-1]
    C = min(chunk_size, max(T, 1))
    n = max(1, -(-T // C))
    pad = n * C - T

    def chunks(x, fill=0.0):
        x = x.to(acc)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad), value=fill)
        return x.reshape(B, H, n, C, *x.shape[3:])

    qc, kc, vc, bc = chunks(q) * scale, chunks(k), chunks(v), chunks(beta)
    gc = chunks(g) if g is not None else None
    Tm, Gamma, G = ut_transform(kc, bc, gc)                         # [B,H,n,C,C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if gc is None:
        Wk = Tm @ kc                                                # W = T K
        P = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0)   # Q K^T . M
        Qs, Kend, dec = qc, kc, None
    else:
        gamma = torch.exp(G)                                        # [B,H,n,C]
        Wk = Tm @ (gamma.unsqueeze(-1) * kc)                        # W = T diag(gamma) K
        P = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0) * Gamma   # Q K^T . Gamma . M
        Qs = gamma.unsqueeze(-1) * qc                               # diag(gamma) Q
        Kend = torch.exp(G[..., -1:] - G).unsqueeze(-1) * kc        # diag(gamma_C / gamma) K
        dec = gamma[..., -1]                                        # gamma_C per chunk, [B,H,n]
    U = Tm @ vc                                                     # U = T V
    S = (torch.zeros(B, H, Dv, D, dtype=acc, device=q.device) if initial_state is None
         else initial_state.to(acc).clone())
    outs = []
    for i in range(n):
        St = S.transpose(-1, -2)                                    # S0^T, [B,H,D,Dv]
        Ui = U[:, :, i] - Wk[:, :, i] @ St                          # U' = U - W S0^T
        outs.append(Qs[:, :, i] @ St + P[:, :, i] @ Ui)
        S_dec = S if dec is None else dec[:, :, i, None, None] * S
        S = S_dec + Ui.transpose(-1, -2) @ Kend[:, :, i]
    o = torch.stack(outs, dim=2).reshape(B, H, n * C, Dv)[:, :, :T]
    return o, S


def delta_rule_parallel_reference(q, k, v, beta, g=None, *, scale: float, initial_state=None):
    """The whole-sequence closed form (Su's table entry), one ``T x T`` triangular solve:

        O = (Q K^T . Gamma . M) (I + diag(beta)(K K^T . Gamma . M^-))^{-1} diag(beta) (V - diag(gamma) K S0^T)
            + diag(gamma) Q S0^T

    which for ``g = None`` and ``S0 = 0`` is ``(Q K^T . M)(I + diag(beta)(K K^T . M^-))^{-1} diag(beta) V``.
    It is the chunk form with a single chunk of length T. Memory and time ``O(T^2 D + T^3)``.
    Inputs are taken finite, as for :func:`delta_rule_chunk_reference`.
    """
    T = q.shape[2]
    if T == 0:
        return delta_rule_recurrent_reference(q, k, v, beta, g, scale=scale, initial_state=initial_state)
    acc = acc_dtype(q.dtype)
    kk, vv, bb, gg = k.to(acc), v.to(acc), beta.to(acc), None if g is None else g.to(acc)
    qs = q.to(acc) * scale
    Tm, Gamma, G = ut_transform(kk, bb, gg)
    M = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    B, H, _, D = q.shape
    S0 = (torch.zeros(B, H, v.shape[-1], D, dtype=acc, device=q.device) if initial_state is None
          else initial_state.to(acc))
    P = (qs @ kk.transpose(-1, -2)).masked_fill(~M, 0.0)
    if gg is None:
        gamma = torch.ones(B, H, T, dtype=acc, device=q.device)
    else:
        gamma = torch.exp(G)
        P = P * Gamma
    U = Tm @ (vv - gamma.unsqueeze(-1) * (kk @ S0.transpose(-1, -2)))
    o = gamma.unsqueeze(-1) * (qs @ S0.transpose(-1, -2)) + P @ U
    decay_end = torch.exp(G[..., -1:] - G) if gg is not None else torch.ones_like(gamma)
    S = gamma[..., -1, None, None] * S0 + U.transpose(-1, -2) @ (decay_end.unsqueeze(-1) * kk)
    return o, S


# --------------------------------------------------------------------------------------------------
# Validation and the public functions.
# --------------------------------------------------------------------------------------------------

def _check_gate(name, x, B, H, T, ref):
    _validate.check_tensor(name, x, ndim=3)
    if tuple(x.shape) != (B, H, T):
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected ({B}, {H}, {T}) [batch, heads, time] "
                         f"to match q")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device}; expected {ref.device} to match q")


def _check_gate_values(beta, g):
    """``beta in [0, 2]``, ``g <= 0``, all finite. Reads the values: see :func:`_validate.checks_values`."""
    if beta.numel() and _validate.checks_values(beta):
        if not bool(torch.isfinite(beta).all()):
            raise ValueError("beta has non-finite entries; expected finite learning rates in [0, 2]")
        lo, hi = float(beta.detach().min()), float(beta.detach().max())
        if lo < 0 or hi > 2:
            raise ValueError(
                f"beta has entries in [{lo:.4g}, {hi:.4g}]; expected beta in [0, 2] -- beyond 2 the "
                "transition I - beta k k^T has an eigenvalue below -1 and the state diverges "
                "(use delta_rule_recurrent_reference directly to study that on purpose)")
    if g is not None and g.numel() and _validate.checks_values(g):
        if not bool(torch.isfinite(g).all()):
            raise ValueError("g has non-finite entries; expected finite log-decays g <= 0")
        top = float(g.detach().max())
        if top > 0:
            raise ValueError(f"g has a positive entry ({top:.4g}); g is the log of the decay "
                             "alpha = exp(g) in (0, 1], so expected g <= 0")


def _check_delta_inputs(q, k, v, beta, g, initial_state):
    """Shapes, dtypes and devices always; the values of beta and g where that is free (CPU tensors)
    or requested (``ATTNLIB_CHECK_VALUES=1``) -- see :mod:`attnlib._validate`."""
    B, H, Tq, Tk, D, Dv = _validate.check_qkv(q, k, v, same_length=True)
    if Dv == 0:
        raise ValueError(f"v has shape {tuple(v.shape)}; expected a value dimension of at least 1")
    _check_gate("beta", beta, B, H, Tq, q)
    if g is not None:
        _check_gate("g", g, B, H, Tq, q)
    if initial_state is not None:
        _validate.check_state("initial_state", initial_state, q=q, shape=(B, H, Dv, D), layout="(B, H, Dv, D)")
    _check_gate_values(beta, g)
    return B, H, Tq, D, Dv


class _TritonDeltaRule(torch.autograd.Function):
    """Forward and backward by the chunked kernels (``kernels/delta/``). Only the inputs are saved: the
    backward recomputes the WY factors and the per-chunk states from them, and returns a gradient for
    exactly the inputs that require one (only ``q``: the cheap path, no reverse state pass)."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, initial_state, scale, chunk_size, output_final_state):
        from .kernels.delta import delta_rule_chunk_forward
        o, S = delta_rule_chunk_forward(q, k, v, beta, g, scale=scale, chunk_size=chunk_size,
                                        initial_state=initial_state, output_final_state=output_final_state)
        ctx.save_for_backward(q, k, v, beta, g, initial_state)
        ctx.scale, ctx.chunk_size = scale, chunk_size
        ctx.set_materialize_grads(False)        # an unused output's gradient: None, not a zero-filled tensor
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        from .kernels.delta import delta_rule_chunk_backward
        q, k, v, beta, g, S0 = ctx.saved_tensors
        need = ctx.needs_input_grad[:6]
        if not any(need):
            return (None,) * 9
        if do is None:                          # a loss on the final state alone
            do = q.new_zeros(*q.shape[:-1], v.shape[-1])
        grads = delta_rule_chunk_backward(q, k, v, beta, g, S0, do, dS, scale=ctx.scale, chunk_size=ctx.chunk_size,
                                          only_dq=not any(need[1:]), need_state_grad=need[5])
        res = [gr.to(t.dtype) if n and gr is not None else None
               for gr, t, n in zip(grads, (q, k, v, beta, g, S0), need)]
        return (*res, None, None, None)


def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
               g: torch.Tensor | None = None, scale: float | None = None, mode: str = "chunk",
               chunk_size: int = 64, initial_state: torch.Tensor | None = None,
               output_final_state: bool = False, backend: str = "auto"):
    """DeltaNet (``g=None``) and Gated DeltaNet.

    ``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, ``o_t = S_t (scale q_t)``,
    ``alpha_t = exp(g_t)``.

    Args:
        q, k: ``[B, H, T, D]``.  v: ``[B, H, T, Dv]``.  beta: ``[B, H, T]`` in ``[0, 2]``.
        g: ``[B, H, T]``, the log-decay (``<= 0``); None for plain DeltaNet.
        scale: multiplies q; None means ``1 / sqrt(D)``.
        mode: ``"parallel"`` | ``"recurrent"`` | ``"chunk"`` -- same outputs, different algorithms
            (see the module docstring). The Triton kernel implements ``"chunk"``.
        chunk_size: ``C`` for ``mode="chunk"``, a power of two in ``[1, 4096]`` (as for
            :func:`attnlib.linear_attention`); the Triton kernel takes 16, 32 or 64.
        initial_state: ``[B, H, Dv, D]``, float32 (float64 for float64 inputs) -- e.g. a previous
            call's final state; the computation continues from it exactly.
        output_final_state: also return ``S_T [B, H, Dv, D]`` (float32; float64 for float64 inputs),
            a new tensor even when ``T = 0``.
        backend: ``"auto"`` (the chunk kernel where it applies: CUDA, fp16/bf16/fp32,
            ``mode="chunk"``, chunk 16..64, head dims up to 256; the reference otherwise), ``"torch"``
            or ``"triton"``.

    Checks: shapes, dtypes and devices always; the values of ``beta`` (finite, in ``[0, 2]``) and ``g``
    (finite, ``<= 0``) on CPU tensors, and on GPU tensors only with ``ATTNLIB_CHECK_VALUES=1``
    (reading them there would synchronise the device on every call).

    Keys are used as given: the update is stable when ``beta_t ||k_t||^2 <= 2`` (normalise keys).
    Half-precision inputs are computed with a float32 state. Returns ``o [B, H, T, Dv]`` in q's dtype,
    or ``(o, S_T)``.
    """
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    chunk_size = _validate.check_chunk_size(chunk_size)
    _validate.check_bool("output_final_state", output_final_state)
    B, H, T, D, Dv = _check_delta_inputs(q, k, v, beta, g, initial_state)
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    why_not = (f"the kernel implements mode='chunk'; got mode={mode!r}" if mode != "chunk"
               else f"the kernel takes chunk_size in {KERNEL_CHUNKS}; got {chunk_size}"
               if chunk_size not in KERNEL_CHUNKS
               else f"the kernel takes head dims up to {MAX_HEAD_DIM}; got D={D}, Dv={Dv}" if max(D, Dv) > MAX_HEAD_DIM
               else None)
    which = choose_backend(backend, q, why_not=why_not)
    if which == "triton":
        o, S = _TritonDeltaRule.apply(q, k, v, beta, g, initial_state, scale, chunk_size, output_final_state)
    elif mode == "recurrent":
        o, S = delta_rule_recurrent_reference(q, k, v, beta, g, scale=scale, initial_state=initial_state)
    else:
        # The chunk and parallel forms multiply masked positions by 0, and 0 * NaN is NaN: they get the
        # inputs' finite part, and the outputs are marked NaN where the recurrence would have made them so.
        acc = acc_dtype(q.dtype)
        kf, vf, bf, gf, poison = _finite_with_poison(k.to(acc), v.to(acc), beta.to(acc),
                                                     None if g is None else g.to(acc))
        if mode == "chunk":
            o, S = delta_rule_chunk_reference(q, kf, vf, bf, gf, scale=scale, chunk_size=chunk_size,
                                              initial_state=initial_state)
        else:
            o, S = delta_rule_parallel_reference(q, kf, vf, bf, gf, scale=scale, initial_state=initial_state)
        o, S = o + poison, _poison_state(S, poison)
    o = o.to(q.dtype)
    if output_final_state and initial_state is not None and S.data_ptr() == initial_state.data_ptr():
        S = S.clone()                        # T = 0: a new tensor, never the caller's state itself
    return (o, S) if output_final_state else o


def delta_rule_decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, *,
                           g: torch.Tensor | None = None, initial_state: torch.Tensor | None = None,
                           scale: float | None = None):
    """One token of generation, shaped as :func:`delta_rule` with ``T = 1`` (as
    :func:`attnlib.linear_attention_decode_step`).

    Args:
        q, k: ``[B, H, 1, D]`` -- this token's query and key.  v: ``[B, H, 1, Dv]``.
        beta, g: ``[B, H, 1]`` (``g`` None for plain DeltaNet).
        initial_state: ``[B, H, Dv, D]`` float32 (float64 for float64 inputs), or None for the first
            token (the state before this token; the step returns the one after it).
        scale: multiplies q; None means ``1 / sqrt(D)``.

    Returns ``(o [B, H, 1, Dv] in q's dtype, new_state [B, H, Dv, D])``: the same update as
    :func:`delta_rule` -- ``S = alpha S (I - beta k k^T) + beta v k^T``, ``o = S q`` -- costing
    ``O(D Dv)`` per token whatever the position: the state replaces the KV cache.
    """
    B, H, T, D, Dv = _check_delta_inputs(q, k, v, beta, g, initial_state)
    if T != 1:
        raise ValueError(f"q has shape {tuple(q.shape)}; the decode step takes one token: expected "
                         f"[B, H, 1, D]")
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    o, S = delta_rule_recurrent_reference(q, k, v, beta, g, scale=scale, initial_state=initial_state)
    return o.to(q.dtype), S


def huber_delta_rule_recurrent(q, k, v, beta, *, delta: float, scale: float, initial_state=None,
                               output_final_state: bool = False):
    """A delta rule for the Huber loss, token by token.

    One gradient step on ``sum_i huber_delta((S k_t - v_t)_i)`` is ``S += beta_t clip(v_t - S k_t, -delta,
    delta) k_t^T``: errors larger than ``delta`` move the state by at most ``beta delta`` per component,
    so one corrupted value cannot wipe the memory. For ``delta -> inf`` it is the delta rule. The clip
    makes the update nonlinear in ``S``: there is no WY / chunk form, only this loop.
    Shapes as :func:`delta_rule_recurrent_reference`; returns ``o`` (and ``S_T`` with ``output_final_state``).
    """
    acc = acc_dtype(q.dtype)
    q, k, v, beta = (t.to(acc) for t in (q, k, v, beta))
    B, H, T, D = q.shape
    S = (torch.zeros(B, H, v.shape[-1], D, dtype=acc, device=q.device) if initial_state is None
         else initial_state.to(acc).clone())
    o = []
    for t in range(T):
        k_t, v_t, b_t = k[:, :, t], v[:, :, t], beta[:, :, t, None]
        err = (v_t - (S @ k_t.unsqueeze(-1)).squeeze(-1)).clamp(-delta, delta)    # clip(v_t - S k_t)
        S = S + (b_t * err).unsqueeze(-1) * k_t.unsqueeze(-2)
        o.append((S @ (scale * q[:, :, t]).unsqueeze(-1)).squeeze(-1))
    o = torch.stack(o, dim=2) if T else q.new_zeros(B, H, 0, v.shape[-1])
    return (o, S) if output_final_state else o


def implied_weights(q, k, beta, g=None) -> torch.Tensor:
    """The ``[T, T]`` weights the (gated) delta rule puts on the values, for one head: the matrix ``W``
    with ``o = W v`` for every ``v``. Computed by the definition, :func:`delta_rule_recurrent_reference`
    applied to ``v = I_T`` (``scale = 1``): row ``t`` holds the coefficients of ``o_t = S_t q_t = sum_j
    w_tj v_j``. In closed form ``W = (QK^T . Gamma . M)(I + diag(beta)(KK^T . Gamma . M^-))^{-1} diag(beta)``
    with ``Gamma_tj = prod_{j < r <= t} alpha_r`` (all ones without a gate).

    ``q, k: [T, D]``; ``beta``: a number or ``[T]``; ``g``: the log-decay ``log alpha``, a number or
    ``[T]``, or None for plain DeltaNet. Returns float64. The weights are signed and their rows need not
    sum to one: not a transport plan (chapter 4).
    """
    q = torch.as_tensor(q, dtype=torch.float64)
    k = torch.as_tensor(k, dtype=torch.float64)
    if q.dim() != 2 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [T, D] (one head); got {tuple(q.shape)} and {tuple(k.shape)}")
    T = q.shape[0]
    b = torch.as_tensor(beta, dtype=torch.float64).expand(T)[None, None]
    gg = None if g is None else torch.as_tensor(g, dtype=torch.float64).expand(T)[None, None]
    eye = torch.eye(T, dtype=torch.float64)[None, None]
    o, _ = delta_rule_recurrent_reference(q[None, None], k[None, None], eye, b, gg, scale=1.0)
    return o[0, 0]
