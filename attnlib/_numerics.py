"""Numerics the references share, written once: the accumulation dtype and the masked product.

The masked products exist because a matrix product cannot ignore a position by multiplying it by 0:
``0 * NaN`` is NaN (and so is ``0 * inf``). Uninitialised right padding, say, would then reach every
row, including the rows the mask says cannot see it. The library therefore never trusts a 0 to
hide a value: it selects (``torch.where``, ``masked_fill``, ``tril``), multiplies finite values only,
and marks NaN exactly the outputs that did see a non-finite value. ``split_nonfinite`` does it for
causal masks at the cost of a running sum (the public functions hand the references its finite part
and add its poison); ``masked_matmul`` for any mask at the cost of a second product.
"""

from __future__ import annotations

import torch


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the references accumulate in: float64 for float64 inputs, float32 for the rest
    (half-precision sums of thousands of terms overflow or lose their small terms)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def split_nonfinite(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(b with its non-finite entries set to 0, poison)`` for ``b: [..., N, K]``, where ``poison_id``
    is NaN if some ``j <= i`` has a non-finite ``b_jd`` -- what a causal reader of row ``i`` has met --
    and 0 otherwise. ``tril(a) @ b_finite + poison`` is then the causal product with nothing from
    above the diagonal; adding 0 changes no value.
    """
    poison = (b * 0).cumsum(-2)                       # 0 * NaN = 0 * inf = NaN, carried down the rows
    return torch.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0), poison


def masked_matmul(a: torch.Tensor, keep: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``out_id = sum_{j: keep_ij} a_ij b_jd`` -- ``a @ b`` in which the positions outside ``keep``
    contribute exactly zero, whatever ``a`` and ``b`` hold there.

    ``a: [..., M, N]``, ``keep: [..., M, N]`` bool (broadcast against ``a``), ``b: [..., N, K]``.
    Non-finite entries of ``b`` that a row *does* see make that row's entry NaN (the sum of a
    non-finite term is not a number we can trust); the others never touch it. Costs one extra
    product of the same size (the count of non-finite entries each row sees).
    """
    finite = torch.isfinite(b)
    out = a.masked_fill(~keep, 0) @ torch.where(finite, b, torch.zeros_like(b))
    sees_nonfinite = keep.to(out.dtype) @ (~finite).to(out.dtype)     # counts: 0/1 products, exact
    return torch.where(sees_nonfinite > 0, torch.full_like(out, float("nan")), out)
