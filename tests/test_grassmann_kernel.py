"""Chapter 6's fused Triton kernel (through the interpreter on CPU) against the reference, forward
and backward: small odd shapes, r not a power of two, offsets beyond the sequence."""

import pytest
import torch

from attnlib.grassmann import CausalGrassmannMixing, n_pairs, plucker_projection

from .conftest import rel_rms

CASES = [  # (B, L, r, d, offsets)
    (2, 13, 5, 20, (1, 2, 4)),
    (1, 40, 6, 33, (1, 2, 4, 8, 12, 16, 50)),      # one offset >= L
    (2, 17, 3, 16, (1, 3)),
    (1, 21, 7, 70, (2, 5)),                        # d spans two BLOCK_D slices
]


def _inputs(B, L, r, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, L, r, generator=g).requires_grad_(True)
    W = torch.randn(d, n_pairs(r), generator=g).requires_grad_(True)
    return z, W


@pytest.mark.parametrize("B,L,r,d,offsets", CASES)
def test_kernel_matches_reference_forward_and_gradients(B, L, r, d, offsets):
    z, W = _inputs(B, L, r, d)
    outs = {}
    for backend in ("triton", "torch"):
        g = plucker_projection(z, W, offsets, backend=backend)
        dg = torch.randn(g.shape, generator=torch.Generator().manual_seed(1))
        outs[backend] = (g, *torch.autograd.grad(g, (z, W), dg))
    for got, ref in zip(outs["triton"], outs["torch"]):
        assert rel_rms(got, ref) < 1e-5


def test_length_one_and_all_offsets_beyond_the_sequence_give_zeros_and_zero_gradients():
    for L, offsets in ((1, (1, 2)), (5, (5, 9))):
        z, W = _inputs(1, L, 6, 17)
        g = plucker_projection(z, W, offsets, backend="triton")
        assert torch.equal(g, torch.zeros_like(g))
        dz, dW = torch.autograd.grad(g.sum(), (z, W))
        assert torch.equal(dz, torch.zeros_like(dz)) and torch.equal(dW, torch.zeros_like(dW))


def test_kernel_matches_reference_on_a_zero_vector_and_is_finite_on_parallel_ones():
    z, W = _inputs(1, 6, 4, 16)
    with torch.no_grad():
        z[0, 2] = 0.0                                   # p = 0 exactly: both give a zero row
    out = {}
    for backend in ("triton", "torch"):
        g = plucker_projection(z, W, (1, 2), backend=backend)
        out[backend] = (g, *torch.autograd.grad(g.square().sum(), (z, W)))
    for got, ref in zip(out["triton"], out["torch"]):
        assert torch.isfinite(got).all() and rel_rms(got, ref) < 1e-5
    # Exactly parallel vectors: ||p|| is rounding noise, and p / max(||p||, eps) is the direction of
    # that noise in either implementation (eps is absolute). Only finiteness is promised.
    with torch.no_grad():
        z[0, 4] = 3 * z[0, 3]
    g = plucker_projection(z, W, (1, 2), backend="triton")
    assert all(torch.isfinite(x).all() for x in (g, *torch.autograd.grad(g.square().sum(), (z, W))))


def test_layer_trains_identically_through_the_kernel():
    torch.manual_seed(0)
    layer = CausalGrassmannMixing(20, reduced_dim=5, offsets=(1, 2, 4), backend="torch")
    h = torch.randn(2, 15, 20)
    grads = {}
    for backend in ("triton", "torch"):
        layer.backend = backend
        layer.zero_grad()
        layer(h).square().mean().backward()
        grads[backend] = [p.grad.clone() for p in layer.parameters()]
    # One relative error over all parameters: some gradients are ~1e-7 (e.g. the reduction's
    # bias, which the normalised coordinates barely see) and hold only rounding noise on their own.
    flat = {k: torch.cat([x.flatten() for x in v]) for k, v in grads.items()}
    assert rel_rms(flat["triton"], flat["torch"]) < 1e-5
