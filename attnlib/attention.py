"""Softmax attention -- chapter 1's operator.

For one head, with scores ``s_ij = scale * q_i . k_j`` (and ``s_ij = -inf`` above the diagonal when
causal), the output is ``o_i = sum_j P_ij v_j`` with ``P_ij = exp(s_ij - lse_i)`` and

    lse_i = log sum_j exp(s_ij).

Chapter 1 reads ``P`` as the unique optimal plan of a one-sided entropic transport problem with
cost ``C = -s / scale`` and regulariser ``eps = 1 / scale``, and ``lse`` as (minus, per unit eps) its
dual potential: the one number per row that the flash kernel keeps.

Masked positions. With ``causal=True`` a key ``j > i`` contributes exactly nothing to row ``i`` on the
PyTorch path of :func:`softmax_attention`, even when ``k`` or ``v`` hold NaN or inf there (e.g.
uninitialised right padding): the reference masks the scores with ``masked_fill``, and the dispatch
hands it ``v``'s finite part and marks NaN exactly the rows that saw a non-finite value
(:func:`attnlib._numerics.split_nonfinite`), since ``P V`` would multiply them by a 0 weight and
``0 * NaN`` is NaN. The reference itself is the bare equation. The flash kernel skips the blocks above
the diagonal (never loads them) and inside the diagonal block selects rather than multiplies by 0, so
a non-finite ``q``, ``k`` or ``v`` reaches exactly the rows (and, backward, the gradients) that see it.
The PyTorch path's autograd backward multiplies a masked pair's zero gradient by ``q`` or ``k``, so
there an infinite ``q_i`` reaches the ``dk`` of keys after ``i``.

Non-finite logits. A row whose logits are all ``-inf`` (from an infinite ``q`` or ``k``) is
``exp(-inf - (-inf))``: ``o`` is NaN and ``lse = -inf`` in the kernel and the reference alike, never a
silent 0. A row with no
key at all cannot occur here (causal row ``i`` sees key ``i``; ``Tk = 0`` is refused).
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._backend import MAX_HEAD_DIM, choose_backend
from ._numerics import acc_dtype, split_nonfinite


def softmax_attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    scale: float, causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, in plain PyTorch.  ``q, k: [B, H, T, D]``,
    ``v: [B, H, T, Dv]``.

    Computes in float32 (float64 for float64 inputs) so that half-precision
    inputs with huge logits stay finite. Returns
    ``(o [B, H, Tq, Dv] in q's dtype, lse [B, H, Tq] in float32/64)``.
    Inputs are taken as valid: :func:`softmax_attention` checks them and then
    calls this.
    """
    acc = acc_dtype(q.dtype)
    s = scale * (q.to(acc) @ k.to(acc).transpose(-1, -2))    # [B, H, Tq, Tk]
    if causal:
        Tq, Tk = s.shape[-2:]
        # keep[i, j] = (j <= i)
        keep = torch.ones(Tq, Tk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                          # [B, H, Tq]
    p = torch.exp(s - lse.unsqueeze(-1))                      # rows sum to 1
    return (p @ v.to(acc)).to(q.dtype), lse


class _TritonAttention(torch.autograd.Function):
    """Forward: the Triton flash kernel. Backward: the Triton FlashAttention-2 kernels, from the saved LSE.

    The backward recomputes ``P = exp(s - lse)`` tile by tile (no second softmax: the dual potential is
    all it needs, and no ``[T, T]`` matrix is ever stored) and applies ``dS = P * (dP - delta)`` with
    ``delta_i = sum_j P_ij dP_ij = do_i . o_i`` -- chapter 1's "advantage with a baseline" form of the
    softmax gradient. A loss on the returned ``lse`` adds ``P_ij dlse_i`` to ``dS``: the kernels fold it
    into the baseline, ``delta_i - dlse_i``. ``deterministic`` picks the backward's form: two kernels
    (dK/dV, then dQ; the same bits on every run) or one fused kernel that adds dQ with float32 atomics
    (``attnlib/kernels/flash/backward.py``).
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, causal, deterministic):
        from .kernels.flash import flash_attention_forward
        o, lse = flash_attention_forward(q, k, v, scale=scale, causal=causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.scale, ctx.causal, ctx.deterministic = scale, causal, deterministic
        ctx.set_materialize_grads(False)        # no loss on lse (the usual case): None, not a zero-filled tensor
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        from .kernels.flash import flash_attention_backward
        q, k, v, o, lse = ctx.saved_tensors
        if do is None:                          # a loss on lse alone
            do = torch.zeros_like(o)
        dq, dk, dv = flash_attention_backward(q, k, v, o, lse, do, dlse, scale=ctx.scale, causal=ctx.causal,
                                              deterministic=ctx.deterministic)
        return dq, dk, dv, None, None, None


def _why_not_kernel(D: int, Dv: int) -> str | None:
    """The flash kernel's own condition (the dtype and device rule is common to every op)."""
    if max(D, Dv) > MAX_HEAD_DIM:
        return f"the flash kernel takes head dims up to {MAX_HEAD_DIM}; got D={D}, Dv={Dv}"
    return None


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      scale: float | None = None, causal: bool, return_lse: bool = False,
                      backend: str = "auto", deterministic: bool = True):
    """Scaled dot-product softmax attention.

    Args:
        q: ``[B, H, Tq, D]`` queries.  k: ``[B, H, Tk, D]`` keys.  v: ``[B, H, Tk, Dv]`` values.
        scale: multiplies ``q . k``; ``None`` means ``1 / sqrt(D)``.
        causal: query ``i`` sees keys ``j <= i`` (needs ``Tq == Tk``).
        return_lse: also return ``lse [B, H, Tq]``, the natural-log log-sum-exp of each row's
            scaled (masked) scores -- the dual potential of chapter 1. float32 (float64 for float64).
        backend: ``"auto"`` (the kernel where it applies: a CUDA GPU of capability 8.0 or newer,
            fp16/bf16/fp32, head dims up to 256; otherwise PyTorch -- on a GPU its fused
            ``scaled_dot_product_attention`` when ``return_lse`` is False, the reference elsewhere),
            ``"torch"`` (the reference) or ``"triton"``.
        deterministic: the Triton backward's form. True (the default): a dK/dV kernel and a dQ kernel,
            each gradient summed in a fixed order (identical bits on every run). False: one fused kernel
            that computes ``P`` and ``dS`` once and adds dQ with float32 atomics, so dQ may differ in its
            last bits from run to run. The PyTorch paths ignore it.

    Returns:
        ``o [B, H, Tq, Dv]`` in the inputs' dtype, or ``(o, lse)``.
    """
    _validate.check_bool("causal", causal)
    _validate.check_bool("deterministic", deterministic)
    _validate.check_bool("return_lse", return_lse)
    _validate.check_qkv(q, k, v, same_length=causal)
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    which = choose_backend(backend, q, why_not=_why_not_kernel(D, v.shape[-1]))
    if which == "triton":
        o, lse = _TritonAttention.apply(q, k, v, scale, causal, deterministic)
    elif backend == "auto" and q.is_cuda and not return_lse and q.dtype != torch.float64:
        # No kernel of ours here (e.g. a T4): PyTorch's fused attention, which does use its tensor cores
        # and never forms the [T, T] matrix. It returns no LSE, hence the condition.
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    elif not causal:
        o, lse = softmax_attention_reference(q, k, v, scale=scale, causal=False)
    else:
        # P V gives a masked key the weight 0, and 0 * NaN is NaN: a non-finite value at j (uninitialised
        # padding, say) would reach the rows i < j that cannot see it. So the reference gets v's finite
        # part, and the rows that did see a non-finite value are marked NaN.
        v_finite, poison = split_nonfinite(v.to(acc_dtype(q.dtype)))
        o, lse = softmax_attention_reference(q, k, v_finite, scale=scale, causal=True)
        o = o + poison.to(o.dtype)
    return (o, lse) if return_lse else o
