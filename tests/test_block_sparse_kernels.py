"""The block-sparse kernels (forward and backward over the visited blocks) through Triton's interpreter,
fp32, small odd shapes, against the float64 reference -- every gradient included (dq, dk, dv, via lse).

Tolerance: relative RMS error 1e-5 (measured errors sit near 3e-7).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import _backend
from attnlib.kernels.block_sparse import visit_lists
from attnlib.sparse import block_sparse_attention, block_sparse_attention_reference, n_blocks

from .conftest import rel_rms

pytestmark = pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")

TOL = 1e-5
BS = 16


def _inputs(B, H, T, D, Dv, density, seed, bs=BS):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    nb = n_blocks(T, bs)
    mask = torch.rand(H, nb, nb, generator=g) < density
    w_o = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    w_lse = torch.randn(B, H, T, generator=g, dtype=torch.float64)
    return q, k, v, mask, w_o, w_lse


def _run(q, k, v, mask, w_o, w_lse, *, causal, backend, dtype, bs=BS):
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    if backend == "reference":
        o, lse = block_sparse_attention_reference(q, k, v, mask, block_size=bs, scale=q.shape[-1] ** -0.5,
                                                  causal=causal)
    else:
        o, lse = block_sparse_attention(q, k, v, mask, block_size=bs, causal=causal, return_lse=True,
                                        backend="triton")
    seen = torch.isfinite(lse)                    # rows that visit no key have lse = -inf
    (o * w_o.to(dtype)).sum().add((torch.where(seen, lse, 0) * w_lse.to(lse.dtype)).sum()).backward()
    return o, torch.where(seen, lse, 0), q.grad, k.grad, v.grad


def _assert_matches_reference(q, k, v, mask, w_o, w_lse, causal, bs=BS):
    got = _run(q, k, v, mask, w_o, w_lse, causal=causal, backend="triton", dtype=torch.float32, bs=bs)
    want = _run(q, k, v, mask, w_o, w_lse, causal=causal, backend="reference", dtype=torch.float64, bs=bs)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        if b.numel() and b.norm() > 0:
            assert rel_rms(a, b) < TOL, f"{name}: rel RMS {rel_rms(a, b):.2e}"
        else:
            assert torch.all(a == 0), name


@pytest.mark.parametrize("B,T,D,Dv,causal,density", [
    (2, 17, 8, 5, True, 0.5),
    (1, 70, 24, 40, False, 0.4),     # some query blocks visit nothing
    (1, 1, 8, 8, True, 1.0),
    (1, 70, 24, 12, True, 0.5),
    (2, 48, 8, 24, False, 0.3),      # T a multiple of the block
    (1, 33, 24, 24, False, 1.0),     # the full mask: dense attention
])
def test_forward_and_every_gradient_match_the_float64_reference(B, T, D, Dv, causal, density):
    _assert_matches_reference(*_inputs(B, 2, T, D, Dv, density, seed=T + D), causal)


@pytest.mark.parametrize("bs,causal", [(32, True), (64, False)])
def test_blocks_wider_than_the_kernel_tile(bs, causal):
    """The kernels' tiles divide the mask's block (16 under the interpreter): several tiles per block,
    the causal diagonal inside a block, and a block cut short by T."""
    _assert_matches_reference(*_inputs(1, 2, 90, 8, 12, 0.6, seed=bs, bs=bs), causal, bs=bs)


def test_value_dim_zero_gives_the_right_lse_and_its_gradients():
    _assert_matches_reference(*_inputs(1, 2, 40, 8, 0, 0.5, seed=1), causal=False)


def test_empty_batch_forward_and_backward():
    q, k, v = (torch.randn(0, 2, 20, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 2, 2, dtype=torch.bool)
    o = block_sparse_attention(q, k, v, mask, block_size=BS, backend="triton", causal=False)
    o.sum().backward()
    assert o.shape == (0, 2, 20, 8) and k.grad.shape == k.shape


def test_unvisited_blocks_get_zero_gradient_and_are_never_loaded():
    """Poison the keys and values of a block nobody visits with NaN: the backward never reads them
    (all gradients finite) and gives them exactly zero gradient."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 48, 16, generator=g) for _ in range(3))
    k[..., 16:32, :] = float("nan")
    v[..., 16:32, :] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    mask[0, :, 1] = False
    o = block_sparse_attention(q, k, v, mask, block_size=BS, backend="triton", causal=False)
    o.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.all(k.grad[..., 16:32, :] == 0) and torch.all(v.grad[..., 16:32, :] == 0)


@settings(max_examples=20, deadline=None)
@given(H=st.integers(1, 3), nq=st.integers(1, 6), nk=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_visit_lists_list_exactly_the_visited_blocks_in_order(H, nq, nk, seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(H, nq, nk, generator=g) < 0.5
    for m in (mask, mask.transpose(-1, -2)):
        counts, indices = visit_lists(m)
        assert counts.dtype == indices.dtype == torch.int32
        for h in range(m.shape[0]):
            for i in range(m.shape[1]):
                listed = indices[h, i, : counts[h, i]].tolist()
                assert listed == torch.nonzero(m[h, i]).flatten().tolist()


def test_visit_lists_need_no_host_synchronisation():
    """On the meta device every value is unknown: any .item() or bool(tensor) would raise."""
    counts, indices = visit_lists(torch.zeros(2, 5, 7, dtype=torch.bool, device="meta"))
    assert counts.shape == (2, 5) and indices.shape == (2, 5, 7)


@pytest.mark.parametrize("causal", [False, True])
def test_rows_that_visit_nothing_get_no_gradient_and_no_nan(causal):
    """Query block 1 visits nothing; query block 0 visits key block 1 only, which causality empties."""
    q, k, v, _, w_o, w_lse = _inputs(1, 1, 40, 8, 8, 0.0, seed=7)
    mask = torch.zeros(1, 3, 3, dtype=torch.bool)
    mask[0, 0, 1] = True
    mask[0, 2, :] = True
    _assert_matches_reference(q, k, v, mask, w_o, w_lse, causal)
    o, lse = block_sparse_attention(q.float(), k.float(), v.float(), mask, block_size=BS, causal=causal,
                                    return_lse=True, backend="triton")
    assert torch.isneginf(lse[..., 16:32]).all() and torch.isneginf(lse[..., :16]).all() == causal


def test_no_queries_give_zero_key_and_value_gradients():
    q = torch.randn(1, 2, 0, 8, requires_grad=True)
    k, v = (torch.randn(1, 2, 20, 8, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 0, 2, dtype=torch.bool)
    o = block_sparse_attention(q, k, v, mask, block_size=BS, backend="triton", causal=False)
    o.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))
