"""Chapter 6's fused Triton kernel (through the interpreter on CPU) against the reference, forward
and backward: small odd shapes, r not a power of two, offsets beyond the sequence."""

import pytest
import torch

from attnlib.grassmann import CausalGrassmannMixing, n_pairs, plucker_projection

from ._grassmann_definition import KINDS, TOL32, definition, degenerate_tokens
from .conftest import rel_rms

CASES = [  # (B, T, r, d, offsets)
    (2, 13, 5, 20, (1, 2, 4)),
    (1, 40, 6, 33, (1, 2, 4, 8, 12, 16, 50)),      # one offset >= T
    (2, 17, 3, 16, (1, 3)),
    (1, 21, 7, 70, (2, 5)),                        # d spans two BLOCK_D slices
]


def _inputs(B, T, r, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, T, r, generator=g).requires_grad_(True)
    W = torch.randn(d, n_pairs(r), generator=g).requires_grad_(True)
    return z, W


@pytest.mark.parametrize("B,T,r,d,offsets", CASES)
def test_kernel_matches_reference_forward_and_gradients(B, T, r, d, offsets):
    z, W = _inputs(B, T, r, d)
    outs = {}
    for backend in ("triton", "torch"):
        g = plucker_projection(z, W, offsets, backend=backend)
        dg = torch.randn(g.shape, generator=torch.Generator().manual_seed(1))
        outs[backend] = (g, *torch.autograd.grad(g, (z, W), dg))
    for got, ref in zip(outs["triton"], outs["torch"]):
        assert rel_rms(got, ref) < 1e-5


def test_length_one_and_all_offsets_beyond_the_sequence_give_zeros_and_zero_gradients():
    for T, offsets in ((1, (1, 2)), (5, (5, 9))):
        z, W = _inputs(1, T, 6, 17)
        g = plucker_projection(z, W, offsets, backend="triton")
        assert torch.equal(g, torch.zeros_like(g))
        dz, dW = torch.autograd.grad(g.sum(), (z, W))
        assert torch.equal(dz, torch.zeros_like(dz)) and torch.equal(dW, torch.zeros_like(dW))


def test_kernel_matches_reference_on_a_zero_vector():
    z, W = _inputs(1, 6, 4, 16)
    with torch.no_grad():
        z[0, 2] = 0.0                                   # p = 0 exactly: both give a zero row
    out = {}
    for backend in ("triton", "torch"):
        g = plucker_projection(z, W, (1, 2), backend=backend)
        out[backend] = (g, *torch.autograd.grad(g.square().sum(), (z, W)))
    for got, ref in zip(out["triton"], out["torch"]):
        assert torch.isfinite(got).all() and rel_rms(got, ref) < 1e-5


@pytest.mark.parametrize("r", [2, 8, 32])
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_on_degenerate_tokens_matches_the_float64_definition(kind, r):
    """Repeated, exactly parallel, nearly parallel (1e-3, 1e-5) and huge/tiny tokens: values, dz and dW
    against the float64 minors (tolerances: ``_grassmann_definition.TOL32``)."""
    z = degenerate_tokens(kind, r, B=1, T=20).requires_grad_(True)
    g = torch.Generator().manual_seed(1)
    W = torch.randn(24, n_pairs(r), generator=g).requires_grad_(True)
    offsets = (1, 2, 4)
    out = plucker_projection(z, W, offsets, backend="triton")
    dg = torch.randn(out.shape, generator=g)
    z64, W64 = z.detach().double().requires_grad_(True), W.detach().double().requires_grad_(True)
    ref = definition(z64, W64, offsets)
    assert rel_rms(out.double(), ref) < TOL32[kind]
    dz, dW = torch.autograd.grad(out, (z, W), dg)
    rdz, rdW = torch.autograd.grad(ref, (z64, W64), dg.double())
    assert rel_rms(dW.double(), rdW) < TOL32[kind]
    if r > 2:                     # for r = 2 p_hat = +-1: the definition's dz is 0, ours is rounding
        assert rel_rms(dz.double(), rdz) < TOL32[kind]


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 3e-3), (torch.bfloat16, 2e-2)])
def test_kernel_in_half_precision_matches_the_float64_definition(dtype, tol):
    """16-bit operands to the products, float32 pairing and accumulation (kernels/common/precision).
    Random tokens: a degenerate pair's dz is ~|W| |dg| / eps by definition, beyond float16's range."""
    z = torch.randn(2, 19, 7, generator=torch.Generator().manual_seed(0)).to(dtype).requires_grad_(True)
    W = torch.randn(40, n_pairs(7), generator=torch.Generator().manual_seed(1)).to(dtype).requires_grad_(True)
    out = plucker_projection(z, W, (1, 2, 4), backend="triton")
    assert out.dtype == dtype
    z64, W64 = z.detach().double().requires_grad_(True), W.detach().double().requires_grad_(True)
    ref = definition(z64, W64, (1, 2, 4))
    assert rel_rms(out.double(), ref) < tol
    dg = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    dz, dW = torch.autograd.grad(out, (z, W), dg)
    rdz, rdW = torch.autograd.grad(ref, (z64, W64), dg.double())
    assert dz.dtype == dW.dtype == dtype
    assert rel_rms(dz.double(), rdz) < 3 * tol and rel_rms(dW.double(), rdW) < 3 * tol


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
