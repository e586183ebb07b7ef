"""The top-k kernels -- the fused index scores and the gathered-key attention, forward and backward --
through Triton's interpreter, fp32, small odd shapes, against the float64 references: every gradient
(q, k, v through ``o`` and ``lse``; index_q, index_k, index_w through the indexer's KL loss), padded
slots, NaN and inf outside the selection leaking nowhere, empty inputs, causal rows with fewer visible
keys than slots.

Tolerance: relative RMS error 1e-5 (measured errors sit near 1e-7 to 3e-7).
"""

import math

import pytest
import torch

from attnlib import _backend
from attnlib.attention import softmax_attention_reference
from attnlib.metrics import rel_rms
from attnlib.topk import (
    _TritonTopkAttention,
    index_scores,
    index_scores_reference,
    indexer_kl_loss,
    topk_attention,
    topk_attention_reference,
    topk_select,
)

pytestmark = pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")

TOL = 1e-5
F32, F64 = torch.float32, torch.float64


def _inputs(B=1, H=2, T=9, D=16, Dv=None, H_I=3, d_I=24, Tk=None, seed=0):
    """float64 ``q, k, v, index_q, index_k, index_w`` (``Tk`` keys, ``T`` queries)."""
    g = torch.Generator().manual_seed(seed)
    Tk = T if Tk is None else Tk

    def x(*shape):
        return torch.randn(*shape, generator=g, dtype=F64)

    return x(B, H, T, D), x(B, H, Tk, D), x(B, H, Tk, Dv or D), x(B, H_I, T, d_I), x(B, 1, Tk, d_I), x(B, H_I, T)


def _close(name, got, want, tol=TOL):
    assert got.shape == want.shape, (name, got.shape, want.shape)
    if want.numel() and want.norm() > 0:
        assert rel_rms(got.to(F64), want) < tol, f"{name}: rel RMS {rel_rms(got.to(F64), want):.2e}"
    else:
        assert torch.all(got == 0), name


# ----------------------------------------------------------------------------- the index scores

@pytest.mark.parametrize("B,H_I,T,Tk,d_I", [
    (2, 3, 37, 37, 24),
    (1, 1, 7, 7, 5),
    (1, 3, 1, 1, 24),
    (2, 2, 20, 37, 40),      # cross: more keys than queries, several key tiles
])
def test_index_scores_and_their_gradients_match_the_float64_reference(B, H_I, T, Tk, d_I):
    _, _, _, iq, ik, iw = _inputs(B=B, T=T, Tk=Tk, H_I=H_I, d_I=d_I, seed=T + d_I)
    w_out = torch.randn(B, 1, T, Tk, generator=torch.Generator().manual_seed(1), dtype=F64)
    got_in = [t.float().requires_grad_() for t in (iq, ik, iw)]
    want_in = [t.clone().requires_grad_() for t in (iq, ik, iw)]
    got = index_scores(*got_in, backend="triton")
    want = index_scores_reference(*want_in)
    assert got.dtype == F32
    _close("I", got, want)
    (got * w_out.float()).sum().backward()
    (want * w_out).sum().backward()
    for name, a, b in zip(("d index_q", "d index_k", "d index_w"), got_in, want_in):
        _close(name, a.grad, b.grad)


def test_the_indexer_trained_by_its_kl_loss_gets_the_reference_gradients():
    """The use the backward exists for: ``indexer_kl_loss`` on the kernel's scores, dense warm-up and
    sparse stage (the loss puts exactly 0 gradient above the diagonal)."""
    q, k, _, iq, ik, iw = _inputs(B=2, T=37, seed=3)
    p = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(~torch.ones(37, 37, dtype=torch.bool).tril(), -math.inf),
                      -1)
    for sparse in (False, True):
        grads = []
        for backend, dtype in (("triton", F32), ("torch", F64)):
            inputs = [t.detach().to(dtype).clone().requires_grad_() for t in (iq, ik, iw)]
            I = index_scores(*inputs, backend=backend)
            selected = topk_select(index_scores_reference(iq, ik, iw), 5, causal=True) if sparse else None
            indexer_kl_loss(p.to(dtype), I, selected, causal=True).sum().backward()
            grads.append([t.grad for t in inputs])
        for name, a, b in zip(("d index_q", "d index_k", "d index_w"), *grads):
            _close(f"{name} (sparse={sparse})", a, b)


def test_the_causal_index_kernel_skips_the_upper_tiles_and_selects_as_the_reference():
    from attnlib.kernels.topk import index_scores_forward
    _, _, _, iq, ik, iw = _inputs(B=2, T=37, seed=4)
    full = index_scores_forward(iq.float(), ik.float(), iw.float(), causal=False)
    causal = index_scores_forward(iq.float(), ik.float(), iw.float(), causal=True)
    lower = torch.ones(37, 37, dtype=torch.bool).tril()
    assert torch.equal(causal[..., lower], full[..., lower])
    # 16 x 16 tiles under the interpreter: the tiles wholly above the diagonal hold -inf, no score.
    tile_above = (torch.arange(37)[None, :] // 16) > (torch.arange(37)[:, None] // 16)
    assert torch.isneginf(causal[..., tile_above]).all() and torch.isfinite(causal[..., ~tile_above]).all()
    want = topk_select(index_scores_reference(iq, ik, iw), 5, causal=True)
    assert torch.equal(topk_select(causal, 5, causal=True), want) and torch.equal(topk_select(full, 5, causal=True),
                                                                                  want)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")    # numpy's NaN, interpreted
def test_non_finite_index_inputs_spread_as_in_the_reference():
    """NaN in one index key: its column of scores is NaN, in the kernel as in the reference (ReLU keeps
    NaN); an inf weight gives inf or NaN exactly where the reference does."""
    _, _, _, iq, ik, iw = _inputs(B=1, T=20, seed=5)
    ik[0, 0, 7, 3] = math.nan
    iw[0, 1, 4] = math.inf
    got = index_scores(iq.float(), ik.float(), iw.float(), backend="triton")
    want = index_scores_reference(iq, ik, iw)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(torch.isinf(got), torch.isinf(want))
    fin = torch.isfinite(want)
    assert rel_rms(got[fin].double(), want[fin]) < TOL


# ----------------------------------------------------------------------------- the attention

def _attend(q, k, v, iq, ik, iw, w_o, w_lse, *, top_k, causal, backend, dtype):
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    o, lse, idx = topk_attention(q, k, v, iq.to(dtype), ik.to(dtype), iw.to(dtype), top_k=top_k, causal=causal,
                                 return_lse=True, return_indices=True, backend=backend)
    (o * w_o.to(dtype)).sum().add((lse * w_lse.to(lse.dtype)).sum()).backward()
    return idx, (o, lse, q.grad, k.grad, v.grad)


@pytest.mark.parametrize("B,H,T,D,Dv,top_k,causal", [
    (2, 2, 37, 16, 16, 5, True),
    (1, 3, 37, 40, 24, 1, True),
    (1, 2, 23, 40, 40, 30, True),     # top_k >= T: dense causal attention
    (2, 1, 7, 16, 5, 5, True),        # rows 0..3 see fewer keys than slots: padded with -1
    (1, 2, 1, 16, 16, 3, True),       # T = 1
    (2, 2, 37, 24, 16, 5, False),
    (1, 2, 7, 40, 16, 7, False),      # top_k == T, non-causal
])
def test_forward_and_every_gradient_match_the_float64_reference(B, H, T, D, Dv, top_k, causal):
    q, k, v, iq, ik, iw = _inputs(B=B, H=H, T=T, D=D, Dv=Dv, seed=T + D + top_k)
    g = torch.Generator().manual_seed(2)
    w_o, w_lse = torch.randn(B, H, T, Dv, generator=g, dtype=F64), torch.randn(B, H, T, generator=g, dtype=F64)
    idx, got = _attend(q, k, v, iq, ik, iw, w_o, w_lse, top_k=top_k, causal=causal, backend="triton", dtype=F32)
    idx64, want = _attend(q, k, v, iq, ik, iw, w_o, w_lse, top_k=top_k, causal=causal, backend="torch", dtype=F64)
    assert torch.equal(idx, idx64)
    if causal and top_k > 1 and T > 1:
        assert (idx < 0).any()                     # early rows have padded slots
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert torch.isfinite(a).all(), name
        _close(name, a, b)


def test_causal_rows_with_fewer_visible_keys_than_slots_are_dense_causal_attention():
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=23, D=40, seed=6)
    o = topk_attention(q.float(), k.float(), v.float(), iq.float(), ik.float(), iw.float(), top_k=30,
                       backend="triton", causal=True)
    _close("o", o, softmax_attention_reference(q, k, v, scale=40 ** -0.5, causal=True)[0])


def test_padded_slots_anywhere_in_a_row_select_nothing():
    """Hand-made selections: -1 in the middle and at the start of rows, keys in any order."""
    q, k, v, *_ = _inputs(B=2, H=2, T=11, D=16, Dv=24, seed=7)
    g = torch.Generator().manual_seed(8)
    idx = torch.stack([row[torch.randperm(11, generator=g)[:6]] for row in torch.arange(11).expand(22, 11)]
                      ).view(2, 1, 11, 6)
    drop = torch.rand(2, 1, 11, 6, generator=g) < 0.4
    drop[..., 2] = False                            # every row keeps a key
    idx = torch.where(drop, torch.full_like(idx, -1), idx)
    got_in = [t.float().requires_grad_() for t in (q, k, v)]
    want_in = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = _TritonTopkAttention.apply(*got_in, idx, 0.3)
    ro, rlse = topk_attention_reference(*want_in, idx, scale=0.3)
    _close("o", o, ro)
    _close("lse", lse, rlse)
    (o.square().sum() + lse.sum()).backward()
    (ro.square().sum() + rlse.sum()).backward()
    for name, a, b in zip(("dq", "dk", "dv"), got_in, want_in):
        _close(name, a.grad, b.grad)


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
def test_non_finite_keys_and_values_outside_the_selection_leak_nowhere(poison):
    """k and v hold ``poison`` at every key that no query selects and at key 0 when no query selects it
    (where the reference points its padded slots): outputs and gradients are those of clean inputs,
    and the poisoned keys get exactly zero gradient."""
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=29, D=16, seed=9)
    idx = topk_select(index_scores_reference(iq, ik, iw), 3, causal=True)
    chosen = torch.zeros(29, dtype=torch.bool)
    chosen[idx[idx >= 0]] = True
    assert (~chosen).sum() >= 3
    kp, vp = k.clone(), v.clone()
    kp[:, :, ~chosen] = poison
    vp[:, :, ~chosen] = poison
    results = []
    for kk, vv in ((k, v), (kp, vp)):
        inputs = [t.float().requires_grad_() for t in (q, kk, vv)]
        o, lse = topk_attention(*inputs, iq.float(), ik.float(), iw.float(), top_k=3, return_lse=True,
                                backend="triton", causal=True)
        (o.sum() + lse.sum()).backward()
        results.append((o, lse, *(t.grad for t in inputs)))
    for name, clean, dirty in zip(("o", "lse", "dq", "dk", "dv"), *results):
        assert torch.isfinite(dirty).all(), name
        assert torch.equal(clean, dirty), name    # the poisoned rows are never read: the same bits
    assert torch.all(results[1][3][:, :, ~chosen] == 0) and torch.all(results[1][4][:, :, ~chosen] == 0)


def test_a_non_finite_value_inside_the_selection_makes_only_its_rows_nan():
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=17, D=16, seed=10)
    v[0, 1, 4, 2] = math.nan
    args = [t.float() for t in (q, k, v, iq, ik, iw)]
    o, idx = topk_attention(*args, top_k=4, return_indices=True, backend="triton", causal=True)
    ro = topk_attention(*args, top_k=4, backend="torch", causal=True)
    assert torch.equal(torch.isnan(o), torch.isnan(ro))
    rows = (idx[0, 0] == 4).any(-1)
    assert torch.isnan(o[0, 1, rows]).any(-1).all() and not torch.isnan(o[0, 0]).any()
    assert not torch.isnan(o[0, 1, ~rows]).any()


@pytest.mark.parametrize("B,T", [(0, 5), (2, 0)])
def test_empty_batches_and_sequences_match_the_public_reference(B, T):
    q, k, v, iq, ik, iw = (t.float().requires_grad_() for t in _inputs(B=B, T=T, seed=11))
    o, lse, idx = topk_attention(q, k, v, iq, ik, iw, top_k=3, return_lse=True, return_indices=True,
                                 backend="triton", causal=True)
    ro, rlse, ridx = topk_attention(q, k, v, iq, ik, iw, top_k=3, return_lse=True, return_indices=True,
                                    backend="torch", causal=True)
    assert o.shape == ro.shape and lse.shape == rlse.shape and idx.shape == ridx.shape
    (o.sum() + lse.sum()).backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    I = index_scores(iq, ik, iw, backend="triton")
    assert I.shape == (B, 1, T, T)
    I.sum().backward()
    assert iq.grad.shape == iq.shape and torch.all(iq.grad == 0)


def test_an_indexer_in_float64_feeds_the_attention_kernel_through_the_reference_scores():
    """The indexer's dtype may differ from the attention's: float64 index inputs (no kernel) beside fp32
    attention (the kernel) select with the reference scores."""
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=19, D=16, seed=12)
    o, idx = topk_attention(q.float(), k.float(), v.float(), iq, ik, iw, top_k=4, return_indices=True,
                            backend="triton", causal=True)
    assert torch.equal(idx, topk_select(index_scores_reference(iq, ik, iw), 4, causal=True))
    _close("o", o, topk_attention_reference(q, k, v, idx, scale=0.25)[0])


def test_the_attention_output_gives_the_indexer_no_gradient():
    q, k, v, iq, ik, iw = (t.float().requires_grad_() for t in _inputs(B=1, T=13, seed=13))
    topk_attention(q, k, v, iq, ik, iw, top_k=4, backend="triton", causal=True).sum().backward()
    assert iq.grad is None and ik.grad is None and iw.grad is None
    assert q.grad is not None and k.grad is not None and v.grad is not None


def test_auto_takes_the_reference_on_the_cpu():
    """The backend rule: on CPU tensors ``auto`` is the reference (the kernels are for CUDA devices)."""
    q, k, v, iq, ik, iw = (t.float() for t in _inputs(B=1, T=13, seed=14))
    assert torch.equal(topk_attention(q, k, v, iq, ik, iw, top_k=4, causal=True),
                       topk_attention(q, k, v, iq, ik, iw, top_k=4, backend="torch", causal=True))
