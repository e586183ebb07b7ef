"""Test set-up. Triton's interpreter must be switched on before attnlib defines its kernels, so
it is set here, before any test module imports attnlib (CPU tests run the kernels through it)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS error ``||a - b|| / ||b||`` in float64 (the tolerance measure used throughout)."""
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.fixture
def rel_err():
    return rel_rms
