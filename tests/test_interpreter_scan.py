"""The tests' interpreter scan (``tests/_interpreter.py``) gives Triton's own generic scan's numbers, bit
for bit, inside a kernel: ANNA's segmented sum (a value and a flag) and a non-commutative combine
(composition of affine maps, where an order mistake shows), along either axis of a tile, forwards and
reversed."""

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from attnlib.kernels.anna.scan import _segmented_sum


@triton.jit
def _affine(a, b, c, d):
    """(x -> a x + b), then (x -> c x + d): the map x -> c (a x + b) + d."""
    return c * a, c * b + d


@triton.jit
def _scan_kernel(X, F, Y, G, M: tl.constexpr, N: tl.constexpr, AXIS: tl.constexpr, REVERSE: tl.constexpr,
                 AFFINE: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    x, f = tl.load(X + offs), tl.load(F + offs)
    if AFFINE:
        y, g = tl.associative_scan((x, f), AXIS, _affine, reverse=REVERSE)
    else:
        y, g = tl.associative_scan((x, f), AXIS, _segmented_sum, reverse=REVERSE)
    tl.store(Y + offs, y)
    tl.store(G + offs, g)


def _run(x, f, axis, reverse, affine):
    y, g = torch.empty_like(x), torch.empty_like(f)
    _scan_kernel[(1,)](x, f, y, g, M=x.shape[0], N=x.shape[1], AXIS=axis, REVERSE=reverse, AFFINE=affine)
    return y, g


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("affine", [False, True])
def test_the_scan_by_step_equals_tritons_element_by_element_scan(axis, reverse, affine, monkeypatch):
    if not hasattr(interpreter.ScanOps, "triton_generic_scan"):
        pytest.skip("Triton's interpreter is off: the kernels compile, nothing is patched")
    g = torch.Generator().manual_seed(3 * axis + 2 * reverse + affine)
    if affine:          # slopes near 1, so that 16 compositions stay finite
        x, f = 0.5 + torch.rand(16, 8, generator=g), torch.randn(16, 8, generator=g)
    else:
        x, f = torch.randn(16, 8, generator=g) * 1e3, (torch.rand(16, 8, generator=g) < 0.3).to(torch.int32)
    ours = _run(x, f, axis, reverse, affine)
    monkeypatch.setattr(interpreter.ScanOps, "generic_scan", interpreter.ScanOps.triton_generic_scan)
    theirs = _run(x, f, axis, reverse, affine)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert not torch.equal(ours[0 if not affine else 1], x if not affine else f)   # the scan did something
