"""Block-sparse softmax attention -- chapter 2's "inspected set", made concrete.

Split queries and keys into blocks of ``bs`` positions (the last block may be short). A boolean
``block_mask [H, nQ, nK]`` with ``nQ = cdiv(Tq, bs)``, ``nK = cdiv(Tk, bs)`` says which key blocks each
query block visits. With ``S_i`` the keys visited by query ``i`` (and, when causal, ``j <= i``),

    o_i = sum_{j in S_i} exp(s_ij - lse_i) v_j,      lse_i = log sum_{j in S_i} exp(s_ij),

the exact softmax *restricted to* ``S_i``: every score in ``S_i`` is computed, none outside it.
Chapter 2 plants its needle outside ``S_i``.

Empty rows. A query whose ``S_i`` is empty gets ``o_i = 0`` and ``lse_i = -inf`` (the log of an empty
sum), in the reference and in the kernel alike -- never NaN. A query whose ``S_i`` is not empty but
whose scores there are all ``-inf`` (an infinite input) is not empty: ``o_i`` is NaN (``exp(-inf - (-inf))``)
and ``lse_i = -inf``, on both backends, so that a non-finite input never comes out as a 0.

Masked positions. A key outside ``S_i`` contributes exactly nothing to row ``i``, even when ``k`` or
``v`` hold NaN or inf there. In the reference the scores are masked with ``masked_fill`` and ``P V``
with :func:`attnlib._numerics.masked_matmul`, never multiplied by a 0 mask (its autograd backward,
though, multiplies a masked pair's zero gradient by ``q`` or ``k``: an infinite ``q_i`` reaches the
``dk`` of keys row ``i`` does not see). The kernel never loads a block that ``block_mask`` does not
visit, and inside a visited block that the causal diagonal cuts it selects (``tl.where``) rather than
multiplies by 0, forward and backward (``attnlib/kernels/common/online_softmax.py``).
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._backend import MAX_HEAD_DIM, choose_backend
from ._numerics import acc_dtype, masked_matmul


def n_blocks(T: int, block_size: int) -> int:
    """``cdiv(T, block_size)``: the number of blocks of ``T`` positions (the last may be short)."""
    return -(-T // block_size)


def expand_block_mask(block_mask: torch.Tensor, block_size: int, Tq: int, Tk: int) -> torch.Tensor:
    """``[H, nQ, nK]`` block mask -> ``[H, Tq, Tk]`` position mask (the tail blocks cut to length)."""
    m = block_mask.repeat_interleave(block_size, dim=-2).repeat_interleave(block_size, dim=-1)
    return m[..., :Tq, :Tk]


def _check_block_mask(block_mask, *, H: int, Tq: int, Tk: int, block_size: int, device) -> None:
    if not isinstance(block_mask, torch.Tensor):
        raise TypeError(f"block_mask must be a torch.Tensor of dtype bool; got {type(block_mask).__name__}")
    if block_mask.dtype != torch.bool:
        raise TypeError(f"block_mask has dtype {str(block_mask.dtype).replace('torch.', '')}; "
                        "expected bool (True = the query block visits the key block)")
    want = (H, n_blocks(Tq, block_size), n_blocks(Tk, block_size))
    if tuple(block_mask.shape) != want:
        raise ValueError(f"block_mask has shape {tuple(block_mask.shape)}; expected {want} = "
                         f"[H, cdiv(Tq={Tq}, {block_size}), cdiv(Tk={Tk}, {block_size})]")
    if block_mask.device != device:
        raise ValueError(f"block_mask is on {block_mask.device}; expected {device} to match q")


def block_sparse_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                     block_mask: torch.Tensor, *, block_size: int, scale: float,
                                     causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition, in plain PyTorch (it builds the ``[T, T]`` scores: a reference, not a fast path).

    Computes in float32 (float64 for float64 inputs). Returns ``(o [B, H, Tq, Dv] in q's dtype,
    lse [B, H, Tq])``; rows with no visited key give ``o = 0``, ``lse = -inf``.
    """
    acc = acc_dtype(q.dtype)
    Tq, Tk = q.shape[2], k.shape[2]
    keep = expand_block_mask(block_mask, block_size, Tq, Tk)                   # [H, Tq, Tk]
    if causal:
        keep = keep & torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril()
    s = scale * (q.to(acc) @ k.to(acc).transpose(-1, -2))                      # [B, H, Tq, Tk]
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                           # -inf on empty rows
    # Only a row with no key is empty; one whose logits are all -inf (a non-finite input) stays NaN.
    empty = ~keep.any(-1)
    lse_safe = torch.where(empty, torch.zeros_like(lse), lse)
    p = torch.exp(s - lse_safe.unsqueeze(-1))                                  # empty rows: all 0
    o = masked_matmul(p, keep, v.to(acc))                                      # only j in S_i, even NaN
    return o.to(q.dtype), lse


class _TritonBlockSparseAttention(torch.autograd.Function):
    """Forward and backward: the Triton block-sparse kernels, which touch the visited blocks only.

    The backward is the flash backward restricted to the visited set (``P`` recomputed from the saved
    LSE; dK/dV per key block over the query blocks that visit it, dQ per query block over its visited
    key blocks); a loss on the returned ``lse`` is folded into the baseline as in the dense kernel.
    """

    @staticmethod
    def forward(ctx, q, k, v, block_mask, block_size, scale, causal):
        from .kernels.block_sparse import block_sparse_attention_forward
        o, lse = block_sparse_attention_forward(q, k, v, block_mask, block_size=block_size, scale=scale,
                                                causal=causal)
        ctx.save_for_backward(q, k, v, o, lse, block_mask)
        ctx.block_size, ctx.scale, ctx.causal = block_size, scale, causal
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        from .kernels.block_sparse import block_sparse_attention_backward
        q, k, v, o, lse, block_mask = ctx.saved_tensors
        dq, dk, dv = block_sparse_attention_backward(q, k, v, o, lse, do, dlse, block_mask,
                                                     block_size=ctx.block_size, scale=ctx.scale,
                                                     causal=ctx.causal)
        return dq, dk, dv, None, None, None, None


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           block_mask: torch.Tensor, *, block_size: int, scale: float | None = None,
                           causal: bool, return_lse: bool = False, backend: str = "auto"):
    """Softmax attention over the visited key blocks only.

    Args:
        q: ``[B, H, Tq, D]``.  k: ``[B, H, Tk, D]``.  v: ``[B, H, Tk, Dv]``.
        block_mask: ``[H, cdiv(Tq, block_size), cdiv(Tk, block_size)]`` bool; ``True`` = visit.
            Shared across the batch. Any ``T`` works: the tail block is masked.
        block_size: positions per block, a power of two in ``[1, 1024]`` (the Triton kernel needs
            ``>= 16``).
        scale: multiplies ``q . k``; ``None`` means ``1 / sqrt(D)``.
        causal: additionally keep only ``j <= i`` (needs ``Tq == Tk``).
        return_lse: also return ``lse [B, H, Tq]`` (``-inf`` for rows that visit no key).
        backend: ``"auto"`` | ``"torch"`` | ``"triton"``. The kernel skips unvisited blocks: its cost
            is proportional to ``block_mask.sum()``, in the forward and the backward alike.

    Returns:
        ``o [B, H, Tq, Dv]`` (zeros on rows with no visited key), or ``(o, lse)``.
    """
    _validate.check_bool("causal", causal)
    _validate.check_bool("return_lse", return_lse)
    B, H, Tq, Tk, D, Dv = _validate.check_qkv(q, k, v, same_length=causal)
    _validate.check_power_of_two("block_size", block_size, lo=1, hi=1024)
    _check_block_mask(block_mask, H=H, Tq=Tq, Tk=Tk, block_size=block_size, device=q.device)
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    why_not = (f"the kernel needs block_size >= 16 (tl.dot tiles); got {block_size}" if block_size < 16
               else f"the kernel takes head dims up to {MAX_HEAD_DIM}; got D={D}, Dv={Dv}" if max(D, Dv) > MAX_HEAD_DIM
               else None)
    if choose_backend(backend, q, why_not=why_not) == "triton":
        o, lse = _TritonBlockSparseAttention.apply(q, k, v, block_mask, block_size, scale, causal)
    else:
        o, lse = block_sparse_attention_reference(q, k, v, block_mask, block_size=block_size,
                                                  scale=scale, causal=causal)
    return (o, lse) if return_lse else o


__all__ = ["block_sparse_attention", "block_sparse_attention_reference", "expand_block_mask",
           "n_blocks"]
