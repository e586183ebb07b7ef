"""Sliding-window attention -- softmax attention over the last ``window`` keys (chapter 2's local band).

For one head, query ``i`` sees the keys ``j`` with ``i - window < j <= i`` (causal: ``window`` keys, itself
included) or ``|i - j| < window`` (not causal: up to ``2 window - 1`` keys), and

    o_i = sum_j P_ij v_j,   P_ij = exp(s_ij - lse_i) on the band, 0 off it,   s_ij = scale * q_i . k_j.

In chapter 1's terms ``P`` is still the exact optimal plan of a one-sided entropic transport problem: the
cost is infinite off the band, so the plan is softmax restricted to the band's support. What the window
changes is the support, not the transport: a key outside it gets exactly nothing, however well it
matches -- chapter 2's needle, planted farther back than ``window``, is the input on which this fails.
With ``window >= T`` it is causal (or full) softmax attention.

Cost: ``O(T window D)`` work and a cache of ``window`` keys per head at decode, against ``O(T^2 D)``
and a cache of ``T``. Masked positions contribute exactly nothing: a non-finite key or value off a row's
band never reaches that row (the PyTorch path multiplies through :func:`attnlib._numerics.masked_matmul`,
the kernel selects rather than multiplies by 0). A row's band is never empty (it holds key ``i``).
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._backend import WINDOW_MAX_HEAD_DIM, choose_backend
from ._numerics import acc_dtype, masked_matmul


def band(Tq: int, Tk: int, window: int, *, causal: bool, device=None) -> torch.Tensor:
    """``keep [Tq, Tk]`` bool: key ``j`` is on row ``i``'s band (``i - window < j <= i``, or
    ``|i - j| < window`` when not causal)."""
    i = torch.arange(Tq, device=device)[:, None]
    j = torch.arange(Tk, device=device)[None, :]
    keep = j > i - window
    return keep & (j <= i) if causal else keep & (j < i + window)


class _BandScores(torch.autograd.Function):
    """``q @ k^T`` on the band, ``-inf`` off it, whose backward multiplies through ``masked_matmul`` too:
    autograd's own ``dq = dS @ k`` would carry a non-finite key off a row's band into that row's dq through
    a 0 weight (``0 * inf`` is NaN), and ``dk = dS^T @ q`` a non-finite query into keys it does not see."""

    @staticmethod
    def forward(ctx, q, k, keep):
        ctx.save_for_backward(q, k, keep)
        return (q @ k.transpose(-1, -2)).masked_fill(~keep, float("-inf"))

    @staticmethod
    def backward(ctx, ds):
        q, k, keep = ctx.saved_tensors
        return masked_matmul(ds, keep, k), masked_matmul(ds.transpose(-1, -2), keep.transpose(-1, -2), q), None


def sliding_window_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int,
                                       scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, in plain PyTorch: the scores masked to the band, their softmax, its product with
    ``v``. ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; computes in float32 (float64 for float64).
    Returns ``(o [B, H, T, Dv] in q's dtype, lse [B, H, T])``. Inputs are taken as valid."""
    acc = acc_dtype(q.dtype)
    keep = band(q.shape[-2], k.shape[-2], window, causal=causal, device=q.device)
    s = scale * _BandScores.apply(q.to(acc), k.to(acc), keep)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return masked_matmul(p, keep, v.to(acc)).to(q.dtype), lse


class _TritonWindow(torch.autograd.Function):
    """Forward: the flash kernel walking only the key tiles of each query tile's band. Backward: its
    FlashAttention-2 kernels over the same tiles, from the saved LSE (``attnlib/kernels/window``)."""

    @staticmethod
    def forward(ctx, q, k, v, window, scale, causal):
        from .kernels.window import sliding_window_forward
        o, lse = sliding_window_forward(q, k, v, window=window, scale=scale, causal=causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.window, ctx.scale, ctx.causal = window, scale, causal
        ctx.set_materialize_grads(False)
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        from .kernels.window import sliding_window_backward
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:
            do = torch.zeros_like(o)
        dq, dk, dv = sliding_window_backward(q, k, v, o, lse, do, dlse, window=ctx.window, scale=ctx.scale,
                                             causal=ctx.causal)
        return dq, dk, dv, None, None, None


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int,
                             scale: float | None = None, causal: bool, return_lse: bool = False,
                             backend: str = "auto"):
    """Softmax attention over a band of ``window`` keys.

    Args:
        q, k: ``[B, H, T, D]``.  v: ``[B, H, T, Dv]`` (queries and keys of one sequence: ``Tq == Tk``).
        window: the band's width, an int ``>= 1``: causal, query ``i`` sees keys ``i - window < j <= i``;
            not causal, ``|i - j| < window``. ``window >= T`` is softmax attention.
        scale: multiplies ``q . k``; ``None`` means ``1 / sqrt(D)``.
        causal: keep only ``j <= i`` as well.
        return_lse: also return ``lse [B, H, T]``, each row's log-sum-exp over its band.
        backend: ``"auto"`` (the Triton kernel where it applies: a CUDA GPU of capability 8.0 or newer,
            fp16/bf16/fp32, head dims up to 128; otherwise the reference), ``"torch"`` or ``"triton"``.

    Returns:
        ``o [B, H, T, Dv]`` in the inputs' dtype, or ``(o, lse)``.
    """
    _validate.check_bool("causal", causal)
    _validate.check_bool("return_lse", return_lse)
    B, H, Tq, Tk, D, Dv = _validate.check_qkv(q, k, v, same_length=True)
    window = _validate.check_int("window", window, lo=1)
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    why_not = (f"the sliding-window kernel takes head dims up to {WINDOW_MAX_HEAD_DIM} (wider, its forward spills "
               f"registers on sm_90); got D={D}, Dv={Dv}" if max(D, Dv) > WINDOW_MAX_HEAD_DIM else None)
    which = choose_backend(backend, q, why_not=why_not)
    if which == "triton":
        o, lse = _TritonWindow.apply(q, k, v, window, scale, causal)
    else:
        o, lse = sliding_window_attention_reference(q, k, v, window=window, scale=scale, causal=causal)
    return (o, lse) if return_lse else o
