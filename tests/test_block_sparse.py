"""Block-sparse attention: the Triton kernel (through the interpreter) against the reference, and the
reference against dense softmax attention with -inf outside the visited set."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import softmax_attention
from attnlib.sparse import block_sparse_attention, expand_block_mask, n_blocks


def _inputs(B, H, T, D, Dv=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g).to(dtype)
    k = torch.randn(B, H, T, D, generator=g).to(dtype)
    v = torch.randn(B, H, T, Dv or D, generator=g).to(dtype)
    return q, k, v


def _mask(H, T, bs, density, seed=0, diag=True):
    g = torch.Generator().manual_seed(seed)
    nb = n_blocks(T, bs)
    m = torch.rand(H, nb, nb, generator=g) < density
    if diag:
        m |= torch.eye(nb, dtype=torch.bool)
    return m


def test_full_mask_equals_dense_softmax_attention(rel_err):
    q, k, v = _inputs(2, 2, 37, 8)
    full = torch.ones(2, n_blocks(37, 16), n_blocks(37, 16), dtype=torch.bool)
    o = block_sparse_attention(q, k, v, full, block_size=16, backend="torch", causal=False)
    assert rel_err(o, softmax_attention(q, k, v, backend="torch", causal=False)) < 1e-6


def test_reference_equals_dense_with_minus_inf_outside_the_visited_set(rel_err):
    q, k, v = _inputs(1, 3, 45, 8)
    bm = _mask(3, 45, 8, 0.3)
    keep = expand_block_mask(bm, 8, 45, 45)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    want = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v
    o = block_sparse_attention(q, k, v, bm, block_size=8, backend="torch", causal=False)
    assert rel_err(o, want) < 1e-6


@pytest.mark.parametrize("T,D,causal", [(50, 16, False), (77, 20, True), (33, 8, False)])
def test_kernel_matches_reference_on_odd_lengths(T, D, causal, rel_err):
    q, k, v = _inputs(2, 2, T, D, Dv=D + 3, seed=T)
    bm = _mask(2, T, 16, 0.4, seed=T)
    o_ref, lse_ref = block_sparse_attention(q, k, v, bm, block_size=16, causal=causal,
                                            return_lse=True, backend="torch")
    o_tri, lse_tri = block_sparse_attention(q, k, v, bm, block_size=16, causal=causal,
                                            return_lse=True, backend="triton")
    assert rel_err(o_tri, o_ref) < 1e-5
    fin = torch.isfinite(lse_ref)
    assert torch.equal(fin, torch.isfinite(lse_tri))
    assert rel_err(lse_tri[fin], lse_ref[fin]) < 1e-5


def test_kernel_matches_reference_in_fp16(rel_err):
    q, k, v = _inputs(1, 2, 40, 16, dtype=torch.float16)
    bm = _mask(2, 40, 16, 0.5)
    o_ref = block_sparse_attention(q, k, v, bm, block_size=16, backend="torch", causal=False)
    o_tri = block_sparse_attention(q, k, v, bm, block_size=16, backend="triton", causal=False)
    assert rel_err(o_tri, o_ref) < 3e-3


@settings(max_examples=8, deadline=None)
@given(T=st.integers(1, 40), seed=st.integers(0, 10_000), causal=st.booleans())
def test_kernel_matches_reference_for_random_masks(T, seed, causal):
    q, k, v = _inputs(1, 1, T, 16, seed=seed)
    bm = _mask(1, T, 16, 0.5, seed=seed, diag=False)
    o_ref = block_sparse_attention(q, k, v, bm, block_size=16, causal=causal, backend="torch")
    o_tri = block_sparse_attention(q, k, v, bm, block_size=16, causal=causal, backend="triton")
    assert torch.allclose(o_tri, o_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_rows_with_no_visited_key_give_zeros_and_minus_inf_lse(backend):
    q, k, v = _inputs(1, 1, 40, 16)
    bm = torch.zeros(1, 3, 3, dtype=torch.bool)
    bm[0, 0, 1] = True                       # only query block 0 visits anything
    o, lse = block_sparse_attention(q, k, v, bm, block_size=16, return_lse=True, backend=backend, causal=False)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    assert torch.all(o[..., 16:, :] == 0)
    assert torch.all(torch.isneginf(lse[..., 16:]))
    assert torch.isfinite(lse[..., :16]).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_causal_block_above_the_diagonal_only_gives_empty_rows_not_nan(backend):
    q, k, v = _inputs(1, 1, 32, 16)
    bm = torch.tensor([[[False, True], [False, False]]])      # query block 0 -> key block 1 only
    o, lse = block_sparse_attention(q, k, v, bm, block_size=16, causal=True, return_lse=True,
                                    backend=backend)
    assert torch.all(o == 0) and torch.all(torch.isneginf(lse))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_huge_scores_stay_finite(dtype, backend):
    """The needle at M = 1e4: a single score of 1e4 in a row of zeros."""
    T, D = 40, 16
    q = torch.zeros(1, 1, T, D, dtype=dtype)
    k = torch.zeros(1, 1, T, D, dtype=dtype)
    q[0, 0, 5, 0] = 100.0
    k[0, 0, 30, 0] = 100.0                   # scale 1: score 1e4
    v = torch.eye(T, dtype=dtype)[None, None]
    bm = torch.ones(1, 3, 3, dtype=torch.bool)
    o = block_sparse_attention(q, k, v, bm, block_size=16, scale=1.0, backend=backend, causal=False)
    assert torch.isfinite(o).all()
    assert o[0, 0, 5, 30].item() == pytest.approx(1.0, abs=1e-3)


def test_bad_block_masks_and_block_sizes_raise_clear_errors():
    q, k, v = _inputs(1, 2, 40, 8)
    good = torch.ones(2, 3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"block_mask has shape \(2, 2, 2\); expected \(2, 3, 3\)"):
        block_sparse_attention(q, k, v, good[:, :2, :2], block_size=16, causal=False)
    with pytest.raises(TypeError, match="block_mask has dtype float32; expected bool"):
        block_sparse_attention(q, k, v, good.float(), block_size=16, causal=False)
    with pytest.raises(TypeError, match="block_mask must be a torch.Tensor"):
        block_sparse_attention(q, k, v, [[True]], block_size=16, causal=False)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        block_sparse_attention(q, k, v, good, block_size=12, causal=False)
    with pytest.raises(TypeError, match="block_size must be an int"):
        block_sparse_attention(q, k, v, good, block_size=16.0, causal=False)
    with pytest.raises(ValueError, match="block_size >= 16"):
        block_sparse_attention(q, k, v, torch.ones(2, 5, 5, dtype=torch.bool), block_size=8,
                               backend="triton", causal=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        block_sparse_attention(q, k, v, good, block_size=16, backend="cuda", causal=False)


def test_kernel_skips_unvisited_blocks():
    """Poison the keys and values of an unvisited block with NaN: the kernel must never load them."""
    q, k, v = _inputs(1, 1, 48, 16)
    k[..., 16:32, :] = float("nan")
    v[..., 16:32, :] = float("nan")
    bm = torch.ones(1, 3, 3, dtype=torch.bool)
    bm[0, :, 1] = False
    o = block_sparse_attention(q, k, v, bm, block_size=16, backend="triton", causal=False)
    assert torch.isfinite(o).all()
