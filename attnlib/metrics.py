"""How far apart two results are -- the one measure the tests, benchmarks and labs all use."""

from __future__ import annotations

import torch


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS error ``||a - b|| / ||b||`` (Frobenius norms, computed in float64), ``b`` being
    the reference (an all-zero ``b`` divides by ``1e-300`` instead of 0: two zero tensors are 0 apart).
    ``a`` and ``b`` must have the same shape (no broadcasting).

    Reads the result back to the host (a Python float): for checks and reports, not a hot path.
    """
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise TypeError(f"rel_rms takes two tensors; got {type(a).__name__} and {type(b).__name__}")
    if a.shape != b.shape:      # broadcasting would compare a row with a whole matrix, silently
        raise ValueError(f"rel_rms compares tensors of equal shape; got a of shape {tuple(a.shape)} and b of "
                         f"shape {tuple(b.shape)}")
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


__all__ = ["rel_rms"]
