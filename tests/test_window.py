"""Sliding-window attention, the operator (``attnlib.window``) through its PyTorch path: what the band
means, its limits (``window >= T`` is softmax attention, ``window = 1`` causal returns v), the softmax
over the band (rows sum to one, lse is the log-sum-exp over the band), the non-finite contract (a key
or value off a row's band never reaches it, forward or backward), and the argument checks. The kernels
are tested in ``tests/test_window_kernels.py`` (interpreter) and ``tests/test_gpu.py``."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib._backend import WINDOW_MAX_HEAD_DIM
from attnlib.window import band, sliding_window_attention

F64 = torch.float64


def _qkv(B, H, T, D, Dv, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g, dtype=dtype), torch.randn(B, H, T, D, generator=g, dtype=dtype),
            torch.randn(B, H, T, Dv, generator=g, dtype=dtype))


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 24), D=st.integers(1, 9), Dv=st.integers(1, 9), extra=st.integers(0, 40),
       causal=st.booleans(), seed=st.integers(0, 10_000), scale=st.none() | st.floats(0.05, 4.0))
def test_a_window_at_least_the_length_is_softmax_attention(T, D, Dv, extra, causal, seed, scale):
    q, k, v = _qkv(2, 2, T, D, Dv, seed)
    o, lse = sliding_window_attention(q, k, v, window=T + extra, scale=scale, causal=causal, return_lse=True,
                                      backend="torch")
    o_ref, lse_ref = attnlib.softmax_attention(q, k, v, scale=scale, causal=causal, return_lse=True,
                                               backend="torch")
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_window_one_causal_returns_v_exactly(dtype):
    q, k, v = _qkv(2, 3, 17, 8, 5, seed=1, dtype=dtype)
    o, lse = sliding_window_attention(q, k, v, window=1, causal=True, return_lse=True, backend="torch")
    assert torch.equal(o, v)
    torch.testing.assert_close(lse, (q * k).sum(-1) / math.sqrt(8))     # one key: lse is its score


@pytest.mark.parametrize("window,causal", [(1, False), (3, True), (3, False), (7, True), (11, False)])
def test_rows_sum_to_one_over_the_band_and_lse_is_its_logsumexp(window, causal):
    """With v the identity (one value column per key) o is the row of the plan P: it is 0 off the band
    and sums to 1; lse is the log-sum-exp of the scores over the band alone."""
    T, D = 23, 6
    q, k, _ = _qkv(1, 2, T, D, 1, seed=window)
    eye = torch.eye(T, dtype=F64).expand(1, 2, T, T)
    P, lse = sliding_window_attention(q, k, eye, window=window, causal=causal, return_lse=True, backend="torch")
    keep = band(T, T, window, causal=causal)
    assert torch.equal(P[..., ~keep], torch.zeros_like(P[..., ~keep]))
    torch.testing.assert_close(P.sum(-1), torch.ones(1, 2, T, dtype=F64))
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    want = torch.stack([torch.logsumexp(s[..., i, keep[i]], -1) for i in range(T)], -1)
    torch.testing.assert_close(lse, want)


def test_the_band_holds_its_own_key_and_the_window_nearest_keys():
    for T in (1, 5, 12):
        for window in (1, 2, 4, 20):
            c, nc = band(T, T, window, causal=True), band(T, T, window, causal=False)
            assert bool(c.diagonal().all()) and bool(nc.diagonal().all())           # never an empty row
            assert c.sum(-1).tolist() == [min(i + 1, window) for i in range(T)]
            assert torch.equal(nc, nc.T) and torch.equal(c, nc & c.tril())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_nonfinite_key_or_value_off_the_band_reaches_no_row_and_no_gradient(causal, where, value):
    """Key 4's entry is not finite: the rows whose band misses key 4 are exactly what they are with a finite
    entry there, and so are their dq, and the dk, dv of the keys only such rows see."""
    T, D, window = 19, 5, 3
    q, k, v = _qkv(1, 1, T, D, 4, seed=7)
    bad = {"k": k.clone(), "v": v.clone()}
    bad[where][0, 0, 4, 1] = value
    keep = band(T, T, window, causal=causal)
    sees = keep[:, 4]                                                      # rows whose band holds key 4
    reached = keep[sees].any(0)                                            # keys those rows see
    do = torch.randn(1, 1, T, 4, dtype=F64, generator=torch.Generator().manual_seed(3))
    outs = []
    for kk, vv in ((k, v), (bad["k"], bad["v"])):
        leaves = [t.clone().requires_grad_() for t in (q, kk, vv)]
        o = sliding_window_attention(*leaves, window=window, causal=causal, backend="torch")
        outs.append([o, *torch.autograd.grad(o, leaves, do)])
    (o, dq, dk, dv), (o_bad, dq_bad, dk_bad, dv_bad) = outs
    for a, b, rows in ((o, o_bad, ~sees), (dq, dq_bad, ~sees), (dk, dk_bad, ~reached), (dv, dv_bad, ~reached)):
        assert torch.isfinite(b[0, 0, rows]).all()
        assert torch.equal(a[0, 0, rows], b[0, 0, rows])
    if where == "v":                    # a value reaches every row that sees it (a key's -inf logit may not)
        assert not torch.isfinite(o_bad[0, 0, sees, 1]).any()


def _call(**kw):
    q, k, v = _qkv(1, 1, 6, 4, 4, seed=0)
    args = dict(window=2, causal=True, backend="torch")
    args.update(kw)
    return sliding_window_attention(args.pop("q", q), args.pop("k", k), args.pop("v", v), **args)


@pytest.mark.parametrize("kw,error,match", [
    (dict(window=0), ValueError, r"window must be >= 1; got 0"),
    (dict(window=-3), ValueError, r"window must be >= 1; got -3"),
    (dict(window=1.5), TypeError, r"window must be an int; got float"),
    (dict(window=True), TypeError, r"window must be an int; got bool"),
    (dict(window="4"), TypeError, r"window must be an int; got str"),
    (dict(causal=None), TypeError, r"causal must be a bool"),
    (dict(causal=1), TypeError, r"causal must be a bool"),
    (dict(k=torch.randn(1, 1, 7, 4, dtype=F64), v=torch.randn(1, 1, 7, 4, dtype=F64)), ValueError,
     r"as many queries as keys; q has T=6, k has T=7"),
    (dict(scale=0.0), ValueError, r"scale must be a finite number > 0"),
    (dict(backend="cuda"), ValueError, r"backend"),
])
def test_bad_arguments_raise_an_error_naming_the_argument(kw, error, match):
    with pytest.raises(error, match=match):
        _call(**kw)


def test_causal_has_no_default():
    q, k, v = _qkv(1, 1, 6, 4, 4, seed=0)
    with pytest.raises(TypeError, match="causal"):
        sliding_window_attention(q, k, v, window=2)


def test_a_numpy_or_torch_integer_window_is_an_int():
    o = _call(window=torch.tensor(3))
    torch.testing.assert_close(o, _call(window=3), rtol=0, atol=0)


def test_the_kernel_is_refused_past_the_head_width_it_takes_and_auto_falls_back():
    q = torch.randn(1, 1, 8, WINDOW_MAX_HEAD_DIM + 1)
    with pytest.raises(ValueError, match=f"head dims up to {WINDOW_MAX_HEAD_DIM}.*D={WINDOW_MAX_HEAD_DIM + 1}"):
        sliding_window_attention(q, q, q, window=3, causal=True, backend="triton")
    auto = sliding_window_attention(q, q, q, window=3, causal=True, backend="auto")
    assert torch.equal(auto, sliding_window_attention(q, q, q, window=3, causal=True, backend="torch"))
