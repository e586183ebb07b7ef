"""Top-k attention with a lightning indexer: the reference against dense softmax attention and an
independent transport solver, the selection's rules, the masked positions, gradients, the indexer's
KL loss, and the error messages. The kernels are tested against these references in
tests/test_topk_kernels.py."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import eot
from attnlib.attention import softmax_attention_reference
from attnlib.metrics import rel_rms
from attnlib.topk import (
    index_scores,
    index_scores_reference,
    indexer_kl_loss,
    selection_mask,
    topk_attention,
    topk_attention_reference,
    topk_select,
)

F64 = torch.float64


def _inputs(B=1, H=2, T=9, D=4, Dv=None, H_I=3, d_I=5, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=g, dtype=F64).to(dtype) for _ in range(2))
    v = torch.randn(B, H, T, Dv or D, generator=g, dtype=F64).to(dtype)
    iq = torch.randn(B, H_I, T, d_I, generator=g, dtype=F64).to(dtype)
    ik = torch.randn(B, 1, T, d_I, generator=g, dtype=F64).to(dtype)
    iw = torch.randn(B, H_I, T, generator=g, dtype=F64).to(dtype)
    return q, k, v, iq, ik, iw


def _dense_probs(q, k, scale, causal):
    """Chapter 1's plan, from the dense reference's dual potential: P = exp(s - lse) (v plays no part)."""
    _, lse = softmax_attention_reference(q, k, k, scale=scale, causal=causal)
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        T = q.shape[2]
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    return torch.exp(s - lse.unsqueeze(-1))


# ----------------------------------------------------------------------------- the equations

def test_index_scores_match_the_formula_written_as_loops():
    _, _, _, iq, ik, iw = _inputs(B=2, T=6)
    I = index_scores(iq, ik, iw)
    want = torch.zeros(2, 1, 6, 6, dtype=F64)
    for b in range(2):
        for t in range(6):
            for s in range(6):
                want[b, 0, t, s] = sum(iw[b, j, t] * torch.relu(iq[b, j, t] @ ik[b, 0, s]) for j in range(3))
    assert I.shape == (2, 1, 6, 6) and rel_rms(I, want) < 1e-14


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_dense_softmax_with_minus_inf_outside_the_selection_forward_and_backward(causal):
    q, k, v, iq, ik, iw = _inputs(B=2, H=2, T=11, D=3, Dv=5, seed=1)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    o, idx = topk_attention(q, k, v, iq, ik, iw, top_k=4, causal=causal, return_indices=True)
    keep = selection_mask(idx, 11)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(3)
    want = torch.softmax(s.masked_fill(~keep, -math.inf), -1) @ v
    assert rel_rms(o, want) < 1e-14
    g = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), g)
    wants = torch.autograd.grad(want, (q, k, v), g)
    for got, exp in zip(grads, wants):
        assert rel_rms(got, exp) < 1e-13


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 20), extra=st.integers(0, 5), causal=st.booleans(), seed=st.integers(0, 10_000))
def test_top_k_at_least_the_length_equals_softmax_attention(T, extra, causal, seed):
    q, k, v, iq, ik, iw = _inputs(B=2, H=3, T=T, D=4, Dv=6, seed=seed)
    o = topk_attention(q, k, v, iq, ik, iw, top_k=T + extra, causal=causal)
    assert rel_rms(o, attnlib.softmax_attention(q, k, v, causal=causal, backend="torch")) < 1e-14


def test_causal_rows_with_fewer_visible_keys_than_k_take_all_of_them_and_pad_with_minus_one():
    I = torch.randn(1, 1, 6, 6, dtype=F64)
    idx = topk_select(I, 3, causal=True)
    assert idx.shape == (1, 1, 6, 3)
    for t in range(3):                                                             # rows 0..2 see 1..3 keys
        row = idx[0, 0, t].tolist()
        assert sorted(x for x in row if x >= 0) == list(range(t + 1)) and row.count(-1) == 2 - t
    assert torch.equal(selection_mask(idx, 6).sum(-1), torch.tensor([[[1, 2, 3, 3, 3, 3]]]))


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 25), top_k=st.integers(1, 30), causal=st.booleans(), ties=st.booleans(),
       seed=st.integers(0, 10_000))
def test_the_selection_is_the_top_k_visible_keys_of_each_row(T, top_k, causal, ties, seed):
    g = torch.Generator().manual_seed(seed)
    I = torch.randn(2, 1, T, T, generator=g, dtype=F64)
    if ties:
        I = I.round()                                                              # many equal scores
    idx = topk_select(I, top_k, causal=causal)
    for b in range(2):
        for t in range(T):
            visible = list(range(t + 1 if causal else T))
            row = [s for s in idx[b, 0, t].tolist() if s >= 0]
            assert len(row) == len(set(row)) == min(top_k, len(visible)) and set(row) <= set(visible)
            scores = [I[b, 0, t, s].item() for s in row]
            assert scores == sorted(scores, reverse=True)                         # highest first
            rest = [I[b, 0, t, s].item() for s in visible if s not in row]
            assert not rest or min(scores) >= max(rest)                           # nothing better left out
            for s in visible:                                                     # ties: earlier key first
                if s not in row and I[b, 0, t, s] == min(scores):
                    assert all(r < s for r in row if I[b, 0, t, r] == min(scores))


def test_selection_takes_the_highest_visible_scores_highest_first():
    I = torch.tensor([[[[0.0, 9, 9, 9], [1, 5, 9, 9], [4, 2, 7, 9], [3, 8, 1, 6]]]], dtype=F64)
    assert topk_select(I, 2, causal=True).tolist() == [[[[0, -1], [1, 0], [2, 0], [1, 3]]]]
    assert topk_select(I, 2, causal=False).tolist() == [[[[1, 2], [2, 3], [3, 2], [1, 3]]]]


def test_ties_go_to_the_earlier_key_and_the_selection_is_deterministic():
    I = torch.zeros(1, 1, 7, 7, dtype=F64)
    idx = topk_select(I, 3, causal=True)
    assert idx[0, 0, 6].tolist() == [0, 1, 2] and idx[0, 0, 4].tolist() == [0, 1, 2]
    I[0, 0, 6, 5] = I[0, 0, 6, 3] = 1.0
    assert topk_select(I, 3, causal=True)[0, 0, 6].tolist() == [3, 5, 0]
    assert torch.equal(topk_select(I, 3, causal=True), topk_select(I.clone(), 3, causal=True))


def test_nan_index_scores_count_as_minus_inf():
    I = torch.tensor([[[[float("nan"), -1e30, 2.0, -math.inf]]]], dtype=F64)
    assert topk_select(I, 3, causal=False).tolist() == [[[[2, 1, 0]]]]         # NaN ties -inf; earlier first


def test_top_k_one_returns_the_value_of_the_best_indexed_key():
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=8, seed=3)
    o = topk_attention(q, k, v, iq, ik, iw, top_k=1, causal=True)
    I = index_scores(iq, ik, iw).masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -math.inf)
    best = I[0, 0].argmax(-1)
    assert torch.equal(o[0], v[0][:, best])


# ----------------------------------------------------------------------------- the transport reading

@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 30), seed=st.integers(0, 10_000), spread=st.floats(0.1, 8.0))
def test_restricting_a_plan_and_renormalising_moves_it_by_exactly_twice_the_mass_left_out(n, seed, spread):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(spread * torch.randn(n, generator=g, dtype=F64), -1)
    S = torch.rand(n, generator=g) < 0.5
    S[torch.randint(n, (1,), generator=g)] = True
    pS = p[S].sum()
    p_tilde = torch.where(S, p / pS, torch.zeros_like(p))
    assert abs((p - p_tilde).abs().sum() - 2 * (1 - pS)) < 1e-14


@pytest.mark.parametrize("causal", [False, True])
def test_output_error_is_at_most_twice_the_missed_mass_times_the_largest_value(causal):
    q, k, v, iq, ik, iw = _inputs(B=2, H=2, T=13, D=4, Dv=3, seed=4)
    scale = 0.7
    o, idx = topk_attention(q, k, v, iq, ik, iw, top_k=5, causal=causal, scale=scale, return_indices=True)
    p = _dense_probs(q, k, scale, causal)
    keep = selection_mask(idx, 13)
    pS = (p * keep).sum(-1)                                                        # [B, H, T]
    p_tilde = torch.where(keep, p / pS.unsqueeze(-1), 0.0)
    assert torch.allclose((p - p_tilde).abs().sum(-1), 2 * (1 - pS), atol=1e-14)
    assert rel_rms(o, p_tilde @ v) < 1e-14
    err = (o - softmax_attention_reference(q, k, v, scale=scale, causal=causal)[0]).norm(dim=-1)
    bound = 2 * (1 - pS) * v.norm(dim=-1).amax(-1, keepdim=True)
    assert (err <= bound + 1e-14).all()
    assert (1 - pS).max() > 0.05                                    # the bound is exercised, not vacuous


def test_the_restricted_plan_is_the_one_sided_entropic_plan_on_the_selected_support():
    """eot.solve_one_sided (Newton on the row multiplier, no softmax) on the selected columns only."""
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=10, D=4, seed=5)
    scale = 0.5
    o, lse, idx = topk_attention(q, k, v, iq, ik, iw, top_k=4, causal=False, scale=scale,
                                 return_lse=True, return_indices=True)
    k_sel = k[:, :, idx[0, 0]]                                                     # [1, H, T, 4, D]
    C = -torch.einsum("bhtd,bhtnd->bhtn", q, k_sel)                                # cost -q.k, eps = 1/scale
    P = eot.solve_one_sided(C.reshape(-1, 1, 4), 1 / scale).reshape(C.shape)
    probs = torch.exp(-scale * C - lse.unsqueeze(-1))
    assert (P - probs).abs().max() < 1e-13
    assert rel_rms(o, torch.einsum("bhtn,bhtnd->bhtd", P, v[:, :, idx[0, 0]])) < 1e-13


# ----------------------------------------------------------------------------- causality and masked positions

@pytest.mark.parametrize("t", [0, 4, 9])
def test_changing_keys_values_and_index_keys_after_t_leaves_rows_up_to_t_bit_identical(t):
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=12, seed=6, dtype=torch.float32)
    o = topk_attention(q, k, v, iq, ik, iw, top_k=3, causal=True)
    k2, v2, ik2 = k.clone(), v.clone(), ik.clone()
    k2[:, :, t + 1:] = 1e3 * torch.randn_like(k2[:, :, t + 1:])
    v2[:, :, t + 1:] = float("nan")
    ik2[:, :, t + 1:] = 1e3
    o2 = topk_attention(q, k2, v2, iq, ik2, iw, top_k=3, causal=True)
    assert torch.equal(o[:, :, :t + 1], o2[:, :, :t + 1])


@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_a_non_finite_value_outside_the_selected_set_does_not_leak(fill):
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=10, seed=7)
    o, idx = topk_attention(q, k, v, iq, ik, iw, top_k=3, causal=False, return_indices=True)
    seen = selection_mask(idx, 10)[0, 0]                                          # [T, T]: row t selects s
    for j in range(10):
        v2, k2 = v.clone(), k.clone()
        v2[:, :, j], k2[:, :, j] = fill, fill
        o2 = topk_attention(q, k2, v2, iq, ik, iw, top_k=3, causal=False)
        rows = ~seen[:, j]                                                         # rows that do not select j
        assert rows.any() and torch.equal(o[:, :, rows], o2[:, :, rows])


def test_a_non_finite_value_inside_the_selected_set_makes_exactly_those_rows_nan():
    q, k, v, iq, ik, iw = _inputs(B=1, H=1, T=10, seed=8)
    _, idx = topk_attention(q, k, v, iq, ik, iw, top_k=3, return_indices=True, causal=True)
    v[:, :, 4] = float("nan")
    o = topk_attention(q, k, v, iq, ik, iw, top_k=3, causal=True)
    sees = selection_mask(idx, 10)[0, 0, :, 4]
    assert torch.equal(torch.isnan(o[0, 0]).any(-1), sees)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_logits_of_1e4_stay_finite(dtype):
    T, D = 12, 8
    q, k, v, iq, ik, iw = _inputs(B=1, H=1, T=T, D=D, seed=9, dtype=dtype)
    q, k = torch.zeros_like(q), torch.zeros_like(k)
    q[0, 0, 7, 0] = 100.0
    k[0, 0, 3, 0] = 100.0                                                          # scale 1: score 1e4
    o = topk_attention(q, k, v, iq, ik, iw, top_k=T, scale=1.0, causal=True)
    assert torch.isfinite(o).all() and o.dtype == dtype
    assert torch.equal(o[0, 0, 7], v[0, 0, 3])


def test_length_zero_length_one_and_empty_batch():
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=0)
    o, lse, idx = topk_attention(q, k, v, iq, ik, iw, top_k=4, return_lse=True, return_indices=True, causal=True)
    assert o.shape == (1, 2, 0, 4) and lse.shape == (1, 2, 0) and idx.shape == (1, 1, 0, 0)
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=1)
    for causal in (False, True):
        assert torch.equal(topk_attention(q, k, v, iq, ik, iw, top_k=5, causal=causal), v)
    q, k, v, iq, ik, iw = _inputs(B=0, H=2, T=6)
    o, idx = topk_attention(q, k, v, iq, ik, iw, top_k=2, return_indices=True, causal=True)
    assert o.shape == (0, 2, 6, 4) and idx.shape == (0, 1, 6, 2)


def test_no_value_is_read_back_to_the_host_off_the_cpu():
    """Meta tensors have no values: any .item()/bool() on them raises."""
    q, k, v, iq, ik, iw = (x.to("meta") for x in _inputs(B=1, H=2, T=7))
    o = topk_attention(q, k, v, iq, ik, iw, top_k=3, causal=True)
    assert o.shape == (1, 2, 7, 4)
    I = index_scores(iq, ik, iw)
    indexer_kl_loss(torch.empty(1, 2, 7, 7, dtype=F64, device="meta"), I, topk_select(I, 3, causal=True), causal=True)


# ----------------------------------------------------------------------------- counted work

@pytest.mark.parametrize("Tk", [50, 200])
def test_counted_flops_attention_grows_with_queries_times_k_and_the_indexer_with_every_pair(Tk):
    """torch.utils.flop_counter on the references: the attention reads k keys per query whatever Tk
    is (O(L k)); the indexer's products cost 2 H_I d_I FLOPs per pair (O(L^2))."""
    from torch.utils.flop_counter import FlopCounterMode
    B, H, Tq, D, Dv, n, H_I, d_I = 2, 3, 50, 8, 5, 4, 7, 6
    q, k, v = torch.randn(B, H, Tq, D), torch.randn(B, H, Tk, D), torch.randn(B, H, Tk, Dv)
    idx = torch.randint(0, Tk, (B, 1, Tq, n), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as attention:
        topk_attention_reference(q, k, v, idx, scale=1.0)
    assert attention.get_total_flops() == 2 * B * H * Tq * n * (D + Dv)
    with FlopCounterMode(display=False) as indexer:
        index_scores_reference(torch.randn(B, H_I, Tq, d_I), torch.randn(B, 1, Tk, d_I), torch.randn(B, H_I, Tq))
    assert indexer.get_total_flops() == B * Tq * Tk * (2 * H_I * d_I)


# ----------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_in_float64_on_small_odd_shapes(causal):
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=5, D=3, Dv=2, seed=10)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: topk_attention(a, b, c, iq, ik, iw, top_k=3, causal=causal),
                                    (q, k, v))


def test_the_indexer_gets_no_gradient_through_the_attention_and_one_through_its_loss():
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=7, seed=11)
    iq, ik, iw, q = (x.requires_grad_() for x in (iq, ik, iw, q))
    o = topk_attention(q, k, v, iq, ik, iw, top_k=3, causal=True)
    o.sum().backward()
    assert q.grad is not None and iq.grad is None and ik.grad is None and iw.grad is None
    p = _dense_probs(q.detach(), k, 0.5, True)
    indexer_kl_loss(p, index_scores(iq, ik, iw), causal=True).sum().backward()
    assert all(x.grad is not None and x.grad.abs().sum() > 0 for x in (iq, ik, iw))


def test_gradcheck_of_the_kl_loss_in_the_index_scores():
    g = torch.Generator().manual_seed(12)
    p = torch.rand(1, 2, 6, 6, generator=g, dtype=F64)
    I = torch.randn(1, 1, 6, 6, generator=g, dtype=F64, requires_grad=True)
    sel = topk_select(I.detach(), 3, causal=True)
    for selected in (None, sel):
        assert torch.autograd.gradcheck(lambda x, s=selected: indexer_kl_loss(p, x, s, causal=True), (I,))


# ----------------------------------------------------------------------------- the indexer's loss

def _teacher(seed=13, B=2, H=3, T=8):
    """Causal attention weights of H heads, and p: their sum over heads, L1-normalised."""
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(B, H, T, T, generator=g, dtype=F64).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf), -1)
    p = w.sum(1, keepdim=True)
    return w, p / p.sum(-1, keepdim=True)


def test_kl_loss_is_zero_when_softmax_of_the_index_scores_is_the_target_and_positive_otherwise():
    w, p = _teacher()
    garbage = torch.triu(torch.full((8, 8), 123.0, dtype=F64), 1)                 # above the diagonal: ignored
    I = torch.log(p).nan_to_num(neginf=0.0) + garbage + torch.arange(8.0, dtype=F64)[:, None]  # + row shifts
    assert indexer_kl_loss(w, I, causal=True).abs().max() < 1e-14
    I_other = I + 0.3 * torch.randn(I.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    kl = indexer_kl_loss(w, I_other, causal=True)
    assert kl.shape == (2, 8) and (kl[:, 1:] > 1e-6).all() and kl[:, 0].abs().max() < 1e-15   # row 0: one key


def test_dense_kl_loss_matches_torch_kl_div():
    w, p = _teacher(seed=14)
    I = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(2), dtype=F64)
    log_q = torch.log_softmax(I.masked_fill(~torch.ones(8, 8, dtype=torch.bool).tril(), -math.inf), -1)
    log_q = log_q.masked_fill(torch.isneginf(log_q), 0.0)                  # where p = 0: kl_div's 0 * -inf is NaN
    want = torch.nn.functional.kl_div(log_q, p, reduction="none").sum(-1).squeeze(1)
    assert rel_rms(indexer_kl_loss(w, I, causal=True), want) < 1e-14


def test_sparse_kl_loss_is_the_kl_between_the_renormalised_restrictions_to_the_selected_set():
    w, p = _teacher(seed=15)
    I = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    sel = topk_select(I, 3, causal=True)
    got = indexer_kl_loss(w, I, sel, causal=True)
    for b in range(2):
        for t in range(8):
            S = [s for s in sel[b, 0, t].tolist() if s >= 0]
            pS = p[b, 0, t, S] / p[b, 0, t, S].sum()
            qS = torch.softmax(I[b, 0, t, S], -1)
            assert abs(got[b, t] - (pS * torch.log(pS / qS)).sum()) < 1e-14
    everything = indexer_kl_loss(w, I, causal=True)
    assert indexer_kl_loss(w, I, topk_select(I, 8, causal=True), causal=True).sub(everything).abs().max() < 1e-14


def test_sparse_kl_loss_of_a_row_with_no_target_mass_on_its_selection_is_zero():
    w = torch.zeros(1, 1, 3, 3, dtype=F64)
    w[0, 0, :, 0] = 1.0                                                            # all mass on key 0
    I = torch.tensor([[[[0.0, 0, 0], [0, 5, 0], [0, 1, 5]]]], dtype=F64)
    kl = indexer_kl_loss(w, I, topk_select(I, 1, causal=True), causal=True)
    assert kl.tolist() == [[0.0, 0.0, 0.0]]


def test_kl_loss_refuses_selections_out_of_range_and_infinite_weights():
    w, _ = _teacher(seed=15)
    I = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    sel = topk_select(I, 3, causal=True)
    for bad in (8, -2, 100):                      # Tk and below -1 once became an empty slot silently
        wrong = sel.clone()
        wrong[1, 0, 5, 1] = bad
        with pytest.raises(ValueError, match=r"selected must hold key indices in \[0, 7\] or -1"):
            indexer_kl_loss(w, I, wrong, causal=True)
    inf = w.clone()
    inf[0, 1, 4, 2] = float("inf")                # once zeroed that row's loss, and so its gradient
    with pytest.raises(ValueError, match="attention_weights has negative, infinite or NaN"):
        indexer_kl_loss(inf, I, causal=True)


# ----------------------------------------------------------------------------- bad inputs

def _args(**bad):
    q, k, v, iq, ik, iw = _inputs(B=2, H=2, T=10, D=4, dtype=torch.float32)
    args = dict(q=q, k=k, v=v, index_q=iq, index_k=ik, index_w=iw, top_k=3, causal=True)
    args.update(bad)
    return args


@pytest.mark.parametrize("bad, err, match", [
    (dict(top_k=0), ValueError, r"top_k must be >= 1; got 0"),
    (dict(top_k=-2), ValueError, r"top_k must be >= 1"),
    (dict(top_k=2.0), TypeError, r"top_k must be an int; got float"),
    (dict(top_k=True), TypeError, r"top_k must be an int; got bool"),
    (dict(k=torch.randn(2, 2, 10, 5)), ValueError, r"k has shape \(2, 2, 10, 5\); expected \(2, 2, \*, 4\)"),
    (dict(q=torch.randn(2, 10, 4)), ValueError, r"q has shape \(2, 10, 4\) \(3 dims\); expected 4 dims"),
    (dict(v=torch.randn(2, 2, 10, 4, dtype=torch.float64)), TypeError, r"v has dtype float64; expected float32"),
    (dict(q=torch.randint(0, 3, (2, 2, 10, 4))), TypeError, r"q has dtype int64"),
    (dict(index_q=torch.randn(2, 3, 9, 5)), ValueError, r"index_q has shape \(2, 3, 9, 5\); expected \(2, 3, 10, 5\)"),
    (dict(index_q=torch.randn(3, 3, 10, 5)), ValueError, r"index_q has shape \(3, 3, 10, 5\); expected \(2, 3"),
    (dict(index_q=torch.randn(2, 0, 10, 5), index_w=torch.randn(2, 0, 10)), ValueError, r"index_q .* index head"),
    (dict(index_k=torch.randn(2, 3, 10, 5)), ValueError, r"index_k has shape \(2, 3, 10, 5\); expected \(2, 1, 10"),
    (dict(index_k=torch.randn(2, 1, 10, 6)), ValueError, r"index_k has shape .* expected \(2, 1, 10, 5\)"),
    (dict(index_w=torch.randn(2, 3, 9)), ValueError, r"index_w has shape \(2, 3, 9\); expected \(2, 3, 10\)"),
    (dict(index_w=torch.randn(2, 3, 10, 1)), ValueError, r"index_w has shape .* \(4 dims\); expected 3 dims"),
    (dict(index_k=torch.randn(2, 1, 10, 5, dtype=torch.float64)), TypeError,
     r"index_k has dtype float64; expected float32 to match index_q"),
    (dict(index_q=[1.0]), TypeError, r"index_q must be a torch.Tensor"),
    (dict(causal="yes"), TypeError, r"causal must be a bool \(True or False\); got str 'yes'"),
    (dict(return_lse=1), TypeError, r"return_lse must be a bool"),
    (dict(return_indices="no"), TypeError, r"return_indices must be a bool"),
    (dict(scale=0.0), ValueError, r"scale must be a finite number > 0; got 0.0"),
    (dict(scale=float("inf")), ValueError, r"scale must be a finite number > 0"),
    (dict(backend="cuda"), ValueError, r"backend must be one of"),
    (dict(q=torch.randn(2, 2, 10, 257), k=torch.randn(2, 2, 10, 257), v=torch.randn(2, 2, 10, 4), backend="triton"),
     ValueError, r"top-k attention kernel takes head dims up to 256; got D=257, Dv=4"),
    (dict(k=torch.randn(2, 2, 12, 4), v=torch.randn(2, 2, 12, 4)), ValueError,
     r"causal attention needs as many queries as keys"),
])
def test_bad_inputs_raise_errors_naming_the_argument(bad, err, match):
    with pytest.raises(err, match=match):
        topk_attention(**_args(**bad))


def test_index_tensors_on_another_device_than_q_are_named():
    args = _args(index_q=torch.randn(2, 3, 10, 5, device="meta"), index_k=torch.randn(2, 1, 10, 5, device="meta"),
                 index_w=torch.randn(2, 3, 10, device="meta"))
    with pytest.raises(ValueError, match=r"index_q is on meta; expected cpu to match q"):
        topk_attention(**args)


def test_the_indexer_may_run_in_another_float_dtype_than_the_attention():
    args = _args()
    for name in ("index_q", "index_k", "index_w"):
        args[name] = args[name].half()
    assert topk_attention(**args).dtype == torch.float32


def test_non_causal_cross_attention_with_more_keys_than_queries():
    q, k, v, iq, ik, iw = _inputs(B=1, H=2, T=13, seed=16)
    q, iq, iw = q[:, :, :5], iq[:, :, :5], iw[:, :, :5]
    o, idx = topk_attention(q, k, v, iq, ik, iw, top_k=4, causal=False, return_indices=True)
    assert o.shape == (1, 2, 5, 4) and idx.shape == (1, 1, 5, 4) and (idx >= 0).all()
    assert rel_rms(o, topk_attention_reference(q, k, v, idx, scale=0.5)[0]) == 0


@pytest.mark.parametrize("call, err, match", [
    (lambda I: topk_select(I, 0, causal=True), ValueError, r"top_k must be >= 1"),
    (lambda I: topk_select(I[0], 2, causal=True), ValueError, r"I has shape \(1, 6, 6\) \(3 dims\); expected 4 dims"),
    (lambda I: topk_select(I.expand(1, 2, 6, 6), 2, causal=True), ValueError,
     r"I has shape \(1, 2, 6, 6\); expected \(B, 1"),
    (lambda I: topk_select(I[..., :5], 2, causal=True), ValueError, r"causal selection needs as many queries as keys"),
    (lambda I: topk_select(I, 2, causal=None), TypeError, r"causal must be a bool"),
    (lambda I: indexer_kl_loss(torch.rand(1, 2, 6, 5, dtype=F64), I, causal=True), ValueError,
     r"attention_weights has shape \(1, 2, 6, 5\); expected \(1, H >= 1, 6, 6\)"),
    (lambda I: indexer_kl_loss(-torch.rand(1, 2, 6, 6, dtype=F64), I, causal=True), ValueError,
     r"attention_weights has negative"),
    (lambda I: indexer_kl_loss(torch.rand(1, 2, 6, 6, dtype=F64), I, topk_select(I, 2, causal=True).int(),
                               causal=True), TypeError,
     r"selected must be an int64 tensor"),
    (lambda I: indexer_kl_loss(torch.rand(1, 2, 6, 6, dtype=F64), I, topk_select(I, 2, causal=True)[:, :, :4],
                               causal=True), ValueError,
     r"selected has shape \(1, 1, 4, 2\); expected \(1, 1, 6, n <= 6\)"),
    (lambda I: index_scores(I, I, I), ValueError, r"index_w has shape \(1, 1, 6, 6\) \(4 dims\)"),
    (lambda I: index_scores(I[..., :1].float().expand(1, 1, 6, 257), I[..., :1].float().expand(1, 1, 6, 257),
                            I[..., 0].float(), backend="triton"), ValueError,
     r"index-score kernel takes index head dims up to 256"),
    (lambda I: selection_mask(topk_select(I, 2, causal=True), -1), ValueError, r"n_keys must be >= 0"),
])
def test_helpers_bad_inputs_raise_errors_naming_the_argument(call, err, match):
    with pytest.raises(err, match=match):
        call(torch.randn(1, 1, 6, 6, dtype=F64))


def test_the_reference_is_named_for_its_op_and_only_operators_are_exported():
    assert callable(index_scores_reference) and callable(topk_attention_reference)
    for name in ("topk_attention", "index_scores", "topk_select", "indexer_kl_loss"):
        assert name in attnlib.__all__ and getattr(attnlib, name) is not None
