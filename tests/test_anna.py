"""ANNA (chapter 5): the sort-and-segment reference against the dense definition, the identities
the weights must satisfy, the hash families, and bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import anna_attention
from attnlib.anna import (
    anna_attention_reference,
    anna_collision_counts,
    anna_weights_from_counts,
    lsh_codes,
    lsh_projections,
    max_n_bits,
    simhash_collision_probability,
    table_collision_probability,
)

F64 = dict(dtype=torch.float64)


def _qkv(B, H, Tq, Tk, D, Dv, seed, noise=0.5):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, Tk, D, generator=g, **F64)
    # queries near some keys, so that buckets are shared and rows are rarely all empty
    base = k[:, :, torch.randint(0, max(Tk, 1), (Tq,), generator=g)] if Tk else torch.zeros(B, H, Tq, D, **F64)
    q = base + noise * torch.randn(B, H, Tq, D, generator=g, **F64)
    v = torch.randn(B, H, Tk, Dv, generator=g, **F64)
    return q, k, v


def _dense(q, k, v, *, n_tables, n_bits, family, seed, causal):
    """The definition: m_ij = #tables where q_i and k_j collide; w = m / row sum; o = w v."""
    proj = lsh_projections(family, n_tables, n_bits, q.shape[-1], seed)
    w = anna_weights_from_counts(anna_collision_counts(lsh_codes(q, proj, family), lsh_codes(k, proj, family),
                                                       causal=causal))
    return w @ v.double(), w


@settings(max_examples=30, deadline=None)
@given(Tq=st.integers(1, 30), Tk=st.integers(1, 30), D=st.integers(1, 9), Dv=st.integers(1, 6),
       n_tables=st.integers(1, 5), n_bits=st.integers(1, 4), family=st.sampled_from(["simhash", "crosspolytope"]),
       causal=st.booleans(), seed=st.integers(0, 2**31))
def test_reference_equals_dense_definition(Tq, Tk, D, Dv, n_tables, n_bits, family, causal, seed):
    if causal:
        Tk = Tq
    n_bits = min(n_bits, max_n_bits(family, D))
    q, k, v = _qkv(2, 1, Tq, Tk, D, Dv, seed % 1000)
    o, w = anna_attention(q, k, v, n_tables=n_tables, n_bits=n_bits, family=family, seed=seed, causal=causal,
                          return_weights=True, backend="torch")
    o_def, w_def = _dense(q, k, v, n_tables=n_tables, n_bits=n_bits, family=family, seed=seed, causal=causal)
    assert torch.allclose(o, o_def, atol=1e-12)
    assert torch.equal(w, w_def)
    assert torch.allclose(o, w @ v, atol=1e-12)                                  # output = weights @ v


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 40), n_tables=st.integers(1, 6), n_bits=st.integers(1, 6), causal=st.booleans(),
       seed=st.integers(0, 10_000))
def test_weights_are_row_stochastic_or_empty_and_nonnegative(T, n_tables, n_bits, causal, seed):
    q, k, v = _qkv(1, 2, T, T, 6, 3, seed, noise=1.0)
    _, w = anna_attention(q, k, v, n_tables=n_tables, n_bits=n_bits, seed=seed, causal=causal, return_weights=True)
    rows = w.sum(-1)
    assert (w >= 0).all()
    assert torch.all(((rows - 1).abs() < 1e-12) | (rows == 0))
    if causal:
        assert torch.equal(w, w.tril())                                         # nothing from the future


def test_empty_rows_give_zero_output_and_full_collision_gives_the_mean():
    q = torch.tensor([[[[1.0, 0.0], [-1.0, 0.0]]]], **F64)
    k = torch.tensor([[[[1.0, 0.01], [0.9, -0.01]]]], **F64)
    v = torch.tensor([[[[2.0], [4.0]]]], **F64)
    o, w = anna_attention(q, k, v, n_tables=1, n_bits=30, seed=3, return_weights=True, causal=False)
    # with 30 bits the opposite query shares no bucket; the near one shares all or none
    assert torch.equal(o[0, 0, 1], torch.zeros(1, **F64)) and w[0, 0, 1].sum() == 0
    # identical inputs collide in every table: the output is the plain mean of the values
    same = k[:, :, :1].expand(1, 1, 2, 2)
    o_same = anna_attention(same, same, v, n_tables=3, n_bits=8, causal=False)
    assert torch.allclose(o_same, torch.full_like(o_same, 3.0))


def test_multiplicity_counts_a_key_once_per_table_it_collides_in():
    q, k, v = _qkv(1, 1, 12, 12, 4, 2, 1, noise=0.6)
    proj = lsh_projections("simhash", 6, 2, 4, 5)
    m = anna_collision_counts(lsh_codes(q, proj, "simhash"), lsh_codes(k, proj, "simhash"), causal=False)
    assert m.max() > 1, "the instance should have a key colliding in several tables"
    _, w = anna_attention(q, k, v, n_tables=6, n_bits=2, seed=5, return_weights=True, causal=False)
    nz = m.sum(-1) > 0
    assert torch.allclose(w[nz], (m.double() / m.sum(-1, keepdim=True))[nz])


@settings(max_examples=15, deadline=None)
@given(T=st.integers(2, 30), seed=st.integers(0, 10_000), family=st.sampled_from(["simhash", "crosspolytope"]))
def test_noncausal_output_is_invariant_to_permuting_the_keys(T, seed, family):
    q, k, v = _qkv(1, 2, T, T, 5, 3, seed)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(seed))
    o = anna_attention(q, k, v, n_tables=3, n_bits=2, family=family, seed=seed, causal=False)
    o_p = anna_attention(q, k[:, :, perm], v[:, :, perm], n_tables=3, n_bits=2, family=family, seed=seed, causal=False)
    assert torch.allclose(o, o_p, atol=1e-12)


def test_causal_row_i_equals_noncausal_on_the_prefix():
    q, k, v = _qkv(1, 1, 25, 25, 4, 3, 7)
    o = anna_attention(q, k, v, n_tables=4, n_bits=2, seed=1, causal=True)
    for i in (0, 5, 24):
        o_i = anna_attention(q[:, :, i:i + 1], k[:, :, :i + 1], v[:, :, :i + 1], n_tables=4, n_bits=2, seed=1,
                             causal=False)
        assert torch.allclose(o[:, :, i], o_i[:, :, 0], atol=1e-12)


def test_same_seed_same_hashes_and_different_seed_different_hashes():
    x = torch.randn(1, 1, 50, 8, generator=torch.Generator().manual_seed(0), **F64)
    for fam in ("simhash", "crosspolytope"):
        a = lsh_codes(x, lsh_projections(fam, 4, 3, 8, 11), fam)
        b = lsh_codes(x.float(), lsh_projections(fam, 4, 3, 8, 11), fam)
        c = lsh_codes(x, lsh_projections(fam, 4, 3, 8, 12), fam)
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_codes_are_in_range():
    x = torch.randn(2, 1, 40, 6, generator=torch.Generator().manual_seed(0), **F64)
    assert lsh_codes(x, lsh_projections("simhash", 3, 5, 6, 0), "simhash").max() < 2**5
    assert lsh_codes(x, lsh_projections("crosspolytope", 3, 2, 6, 0), "crosspolytope").max() < 12**2


def test_simhash_collision_rate_matches_one_minus_theta_over_pi():
    g = torch.Generator().manual_seed(0)
    D, n = 16, 4000
    x = torch.nn.functional.normalize(torch.randn(n, D, generator=g, **F64), dim=-1)
    theta = math.pi / 3
    u = torch.nn.functional.normalize(torch.randn(n, D, generator=g, **F64), dim=-1)
    u = torch.nn.functional.normalize(u - (u * x).sum(-1, keepdim=True) * x, dim=-1)
    y = math.cos(theta) * x + math.sin(theta) * u
    proj = lsh_projections("simhash", 1, 1, D, 1)
    same = (lsh_codes(x[None, None], proj, "simhash") == lsh_codes(y[None, None], proj, "simhash")).double().mean()
    p = simhash_collision_probability(theta).item()
    assert abs(same.item() - p) < 4 * math.sqrt(p * (1 - p) / n)
    assert table_collision_probability(0.5, 2, 1).item() == 0.25


def test_length_zero_one_and_empty_batch():
    for (B, Tq, Tk) in [(1, 0, 0), (0, 3, 3), (1, 1, 1), (2, 3, 0), (1, 0, 4)]:
        q, k, v = (torch.randn(B, 2, Tq, 4), torch.randn(B, 2, Tk, 4), torch.randn(B, 2, Tk, 3))
        o = anna_attention(q, k, v, n_tables=2, n_bits=3, causal=False)
        assert o.shape == (B, 2, Tq, 3) and torch.isfinite(o).all()
        if Tk == 0:
            assert (o == 0).all()
    q = torch.randn(1, 1, 1, 4)
    o = anna_attention(q, q, torch.ones(1, 1, 1, 2), n_tables=1, n_bits=30, causal=True)
    assert torch.equal(o, torch.ones(1, 1, 1, 2))                # a single token sees itself


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_inputs_match_float64_on_the_same_buckets(dtype):
    q, k, v = _qkv(1, 2, 33, 33, 8, 5, 0)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    o = anna_attention(q, k, v, n_tables=3, n_bits=3, seed=2, causal=False)
    o64 = anna_attention(q.double(), k.double(), v.double(), n_tables=3, n_bits=3, seed=2, causal=False)
    assert o.dtype == dtype
    assert torch.allclose(o.double(), o64, atol=2e-2 if dtype != torch.float32 else 1e-6)


def test_reference_holds_no_T_by_T_tensor():
    """Memory O(l T Dv): run at a length whose T x T float64 matrix would need 32 GB."""
    T = 65536
    q = torch.randn(1, 1, T, 4)
    o = anna_attention_reference(q, q, torch.randn(1, 1, T, 2), lsh_projections("simhash", 2, 8, 4, 0),
                                 family="simhash", causal=True)
    assert o.shape == (1, 1, T, 2) and torch.isfinite(o).all()


def test_bad_inputs_raise_clear_errors():
    q, k, v = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 3)
    ok = dict(n_tables=2, n_bits=3, causal=False)
    with pytest.raises(ValueError, match=r"n_tables must be in \[1, 4096\]; got 0"):
        anna_attention(q, k, v, n_tables=0, n_bits=3, causal=False)
    with pytest.raises(TypeError, match="n_tables must be an int"):
        anna_attention(q, k, v, n_tables=2.0, n_bits=3, causal=False)
    with pytest.raises(ValueError, match=r"n_bits must be in \[1, 30\]; got 31"):
        anna_attention(q, k, v, n_tables=2, n_bits=31, causal=False)
    with pytest.raises(ValueError, match="n_bits must be in .*cross-polytope"):
        anna_attention(q, k, v, n_tables=2, n_bits=25, family="crosspolytope", causal=False)
    with pytest.raises(ValueError, match="family must be one of"):
        anna_attention(q, k, v, family="minhash", **ok)
    with pytest.raises(TypeError, match="seed must be an int"):
        anna_attention(q, k, v, seed=1.5, **ok)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 18446744073709551615\]; got -1"):
        anna_attention(q, k, v, seed=-1, **ok)
    with pytest.raises(ValueError, match="as many queries as keys"):
        anna_attention(q, k[:, :, :5], v[:, :, :5], **{**ok, "causal": True})
    with pytest.raises(ValueError, match="k has shape"):
        anna_attention(q, k[..., :3], v, **ok)
    with pytest.raises(ValueError, match="v has shape"):
        anna_attention(q, k, v[:, :, :5], **ok)
    with pytest.raises(TypeError, match="dtype"):
        anna_attention(q, k.double(), v, **ok)
    with pytest.raises(ValueError, match="return_weights=True builds the Tq x Tk"):
        big = torch.randn(1, 1, 5000, 2)
        anna_attention(big, big, big, return_weights=True, **ok)
    with pytest.raises(RuntimeError, match="not differentiable.*softmax"):
        anna_attention(q.requires_grad_(), k, v, **ok)
    with torch.no_grad():                                  # evaluation of a trained surrogate is fine
        anna_attention(q, k, v, **ok)
    with pytest.raises(ValueError, match="backend must be one of"):
        anna_attention(q.detach(), k, v, backend="cuda", **ok)
    wide = torch.randn(1, 1, 4, 130)
    with pytest.raises(ValueError, match="takes D up to 128; got D=130"):
        anna_attention(wide, wide, wide, family="crosspolytope", backend="triton", n_tables=1, n_bits=2, causal=False)


# ---------------------------------------------------------------------------- chapter 5's tasks

def test_match2_labels_follow_the_definition():
    from attnbook.experiments.anna import match2
    x, y = match2(50, N=32, M=37, seed=3)
    assert x.shape == y.shape == (50, 32) and x.min() >= 0 and x.max() < 37
    for s in range(50):
        xs = x[s].tolist()
        want = [int(any((a + b) % 37 == 0 for b in xs)) for a in xs]
        assert y[s].tolist() == want


def _khop_by_the_generators_loop(xs, k, blank):
    """The public generator's loop: from index i, find the last earlier occurrence of the current
    character, answer the character after it, continue from there."""
    out = []
    for i in range(len(xs)):
        idx = i
        for _ in range(k):
            prev = [j for j in range(idx) if xs[j] == xs[idx]]
            if not prev:
                idx = -1
                break
            idx = prev[-1] + 1
        out.append(blank if idx < 0 else xs[idx])
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_khop_induction_labels_follow_the_definition_and_adjacent_tokens_differ(k):
    from attnbook.experiments.anna import khop_induction
    x, y = khop_induction(20, N=40, k=k, alphabet=4, seed=k)
    assert (x[:, 1:] != x[:, :-1]).all()
    for s in range(20):
        assert y[s].tolist() == _khop_by_the_generators_loop(x[s].tolist(), k, blank=4)
    assert (y[:, 0] == 4).all()                         # the first token has no earlier match


def test_tasks_reject_bad_sizes():
    from attnbook.experiments.anna import khop_induction, match2
    with pytest.raises(ValueError, match="match2 needs"):
        match2(4, N=0)
    with pytest.raises(ValueError, match="khop_induction needs"):
        khop_induction(4, alphabet=1)


def test_anna_conditions_read_off_the_weights_equal_the_collision_criterion():
    from attnbook.experiments.anna import anna_conditions, planted_instance
    inst = planted_instance(16, 64, 16, theta_near=math.pi / 10, n_near=2, c=2.0, seed=0)
    for n_tables, n_bits in [(1, 4), (8, 10), (32, 16)]:
        res = anna_conditions(inst, n_tables, n_bits, seed=1)
        assert res["agree"] and res["both"] == res["both_by_counts"]


def test_surrogate_trains_and_is_evaluated_with_softmax_or_anna():
    from attnbook.experiments.anna import SURROGATES, error_rate, train_surrogate
    for task in ("match2", "induction"):
        for surrogate in SURROGATES:
            model = train_surrogate(task, steps=3, seed=0, d=16, batch=4, surrogate=surrogate,
                                    N=12 if task == "induction" else None)
            kw = dict(n=8, seed=1, N=12 if task == "induction" else None)
            n_layers = len(model.attn)
            e_soft = error_rate(model, task, **kw)
            e_anna = error_rate(model, task, anna=[(2, 3, 5)] * n_layers, **kw)
            assert 0 <= e_soft <= 1 and 0 <= e_anna <= 1
            assert model.training                                      # evaluation restores the mode
    with pytest.raises(RuntimeError, match="not differentiable"):      # the layer refuses to train through ANNA
        layer = model.attn[0]
        layer(torch.randn(2, 12, 16), anna=(2, 3, 5))
    with pytest.raises(ValueError, match="surrogate must be one of"):
        train_surrogate("match2", steps=1, seed=0, surrogate="cosine")


@given(st.integers(0, 2**31 - 1), st.integers(1, 8))
@settings(max_examples=25, deadline=None)
def test_simhash_limit_surrogate_is_the_many_table_limit_of_anna(seed, z):
    """softmax of the surrogate's logits = p(theta)^z normalised per row: the weights ANNA tends to as
    l -> infinity (chapter 5, "Many tables")."""
    from attnbook.experiments.anna import surrogate_logits
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(5, 7, generator=g, **F64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(9, 7, generator=g, **F64), dim=-1)
    w = torch.softmax(surrogate_logits(q, k, "simhash_limit", n_bits=z), -1)
    p = simhash_collision_probability(torch.arccos((q @ k.T).clamp(-1, 1)), z)
    assert torch.allclose(w, p / p.sum(-1, keepdim=True), rtol=1e-6, atol=1e-12)


def test_simhash_limit_surrogate_has_finite_gradients_at_identical_and_opposite_vectors():
    from attnbook.experiments.anna import surrogate_logits
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], **F64, requires_grad=True)
    k = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], **F64)
    surrogate_logits(q, k, "simhash_limit", n_bits=4).sum().backward()
    assert torch.isfinite(q.grad).all()


def test_partner_geometry_reads_a_model_whose_queries_are_their_partners_keys():
    from attnbook.experiments.anna import TinyModel, match2_partner_geometry
    M, d = 37, 40
    model = TinyModel(M, 2, d, 1, causal=False, max_len=32)
    with torch.no_grad():
        model.emb.weight.copy_(torch.eye(M, d))
        perm = (-torch.arange(M)) % M                                 # q(a) = e_a, k(b) = e_{-b}: partners coincide
        model.attn[0].wq.weight.copy_(torch.eye(d))
        wk = torch.zeros(d, d)
        wk[perm, torch.arange(M)] = 1.0
        model.attn[0].wk.weight.copy_(wk)
    geo = match2_partner_geometry(model)
    assert torch.allclose(geo["partner_cos"], torch.ones(M)) and geo["max_other_cos"].abs().max() < 1e-6


def test_reproduction_summary_means_over_seeds_and_figure_has_one_frame_per_surrogate():
    from attnbook.experiments.anna import summarise_reproduction
    from attnbook.widgets.anna import reproduction_figure
    rows = [dict(surrogate=s, seed=i, surrogate_error=0.1 * i, anna_error=[[0.5, 0.4], [0.3, 0.2 + 0.1 * i]],
                 partner_cos_mean=0.9, max_other_cos_mean=0.3)
            for s in ("softmax", "simhash_limit") for i in range(3)]
    summ = summarise_reproduction({"rows": rows})
    s = summ["softmax"]
    assert s["n_seeds"] == 3 and s["surrogate_error"][0] == pytest.approx(0.1)
    assert torch.allclose(s["anna_error_mean"], torch.tensor([[0.5, 0.4], [0.3, 0.3]], **F64))
    # best z per l is taken per seed, then averaged: l=2 gives min(0.3, 0.2 + 0.1 i) = 0.2, 0.3, 0.3
    assert torch.allclose(s["best_z_error_mean"], torch.tensor([0.4, 0.8 / 3], **F64))
    fig = reproduction_figure(summ, [[32, 4], [64, 8]], [1, 2])
    assert len(fig.frames) == 2 and len(fig.layout.sliders[0].steps) == 2
    assert fig.data[0].x == ("32/4", "64/8")
    for r in rows:                                                   # with the limit: a point at l = ∞
        r["limit_error"] = [0.25, 0.125]
    summ = summarise_reproduction({"rows": rows})
    fig = reproduction_figure(summ, [8, 16], [1, 2], show_zs=[2])
    assert fig.data[0].x == ("8", "16", "∞") and fig.data[0].y[-1] == pytest.approx(0.125)
    assert len(fig.frames[0].data) == 2                              # one z line and the stand-in's own
    with pytest.raises(ValueError, match="show_zs must be a subset"):
        reproduction_figure(summ, [8, 16], [1, 2], show_zs=[3])


def test_plan_figure_has_one_frame_per_setting_and_anna_rows_sum_to_one_or_zero():
    from attnbook.experiments.anna import anna_plans
    from attnbook.widgets.anna import anna_plan_figure, conditions_heatmap
    g = torch.Generator().manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(9, 5, generator=g, **F64), dim=-1)
    q = torch.nn.functional.normalize(k[:7] + 0.3 * torch.randn(7, 5, generator=g, **F64), dim=-1)
    settings = [(l, z) for z in (2, 8) for l in (1, 4, 16)]
    fig = anna_plan_figure(anna_plans(q, k, settings, seed=3), active=1)
    # one l slider per z and one row of z buttons per l; only the pair shown (l = 4, z = 2) is visible
    assert [len(s.steps) for s in fig.layout.sliders] == [3, 3]
    assert [len(m.buttons) for m in fig.layout.updatemenus] == [2, 2, 2]
    assert [s.visible for s in fig.layout.sliders] == [True, False]
    assert [m.visible for m in fig.layout.updatemenus] == [False, True, False]
    assert all(abs(r - 1) < 1e-9 for r in fig.data[1].x)                 # softmax's row sums
    for b, z in enumerate((2, 8)):
        for a, (step, l) in enumerate(zip(fig.layout.sliders[b].steps, (1, 4, 16))):
            assert step.args[1]["title"]["text"].startswith(f"ANNA: l = {l} tables of z = {z} ")
            assert step.args[1][f"updatemenus[{a}].active"] == b          # the z buttons it shows
            anna_rows = step.args[0]["x"][1]                               # ANNA's row-sum bars
            assert all(abs(r - 1) < 1e-9 or r == 0 for r in anna_rows)
            button = fig.layout.updatemenus[a].buttons[b]
            assert button.args[1][f"sliders[{b}].active"] == a          # the l slider it shows
            assert list(button.args[0]["x"][1]) == list(anna_rows)
    with pytest.raises(ValueError, match="each .n_tables, n_bits. pair of a grid"):
        anna_plan_figure(anna_plans(q, k, [(1, 2), (4, 8)], seed=3))
    with pytest.raises(ValueError, match="settings must hold"):
        anna_plans(q, k, [])
    with pytest.raises(ValueError, match="plans must hold"):
        anna_plan_figure([])
    assert [list(r) for r in conditions_heatmap([1, 2], [3], [[0.5], [1.0]]).data[0].z] == [[0.5], [1.0]]


def test_plan_explorer_redraws_anna_panels_when_a_slider_moves():
    from attnbook.experiments.anna import anna_plan_at
    from attnbook.experiments.weights import anna_weights
    from attnbook.widgets.anna import anna_plan_explorer
    g = torch.Generator().manual_seed(1)
    k = torch.nn.functional.normalize(torch.randn(6, 4, generator=g, **F64), dim=-1)
    box = anna_plan_explorer(anna_plan_at(k, k), seed=2)
    l_slider, z_slider, _ = box.children[0].children
    fig = box.children[1]
    z_slider.value = 1
    want = anna_weights(k, k, 4, 1, seed=2).numpy()
    assert torch.allclose(torch.tensor([list(r) for r in fig.data[3].z], **F64), torch.from_numpy(want.copy()))


def _match2_model_and_sequences(n, seed=0):
    from attnbook.experiments.anna import match2, train_surrogate
    model = train_surrogate("match2", steps=2, seed=seed, d=16, batch=4, surrogate="simhash_limit", n_bits=3)
    x, y = match2(n, 32, model.emb.num_embeddings, seed=seed + 1)
    return model, x, y


def _unit_qk(model, x):
    with torch.no_grad():
        return model.attn[0].unit_qk(model.embed(x))


def test_partner_mass_of_the_simhash_limit_plan_equals_a_dense_definition_and_anna_at_many_tables():
    """The served plan's partner mass, against (a) softmax(z log(1 - theta / pi)) built here from the
    model's unit q, k and a partner mask written here, and (b) ANNA's own weights at l = 4096 tables
    on the same vectors (the plan is their l -> infinity limit)."""
    from attnbook.experiments.anna import match2_partner_mass
    z, n = 3, 6
    model, x, y = _match2_model_and_sequences(n)
    M = model.emb.num_embeddings
    served = match2_partner_mass(model, n=n, seed=1, plan="simhash_limit", n_bits=z)
    q, k = (t.double() for t in _unit_qk(model, x))                            # [n, 1, 32, d]
    theta = torch.arccos((q @ k.transpose(-1, -2)).clamp(-1, 1))[:, 0]         # [n, i, j]
    w_limit = torch.softmax(z * torch.log(1 - theta / math.pi), -1)
    is_partner = torch.zeros(n, 32, 32, dtype=torch.bool)
    for s_ in range(n):
        for i in range(32):
            for j in range(32):
                is_partner[s_, i, j] = (int(x[s_, i]) + int(x[s_, j])) % M == 0
    has = y.bool()

    def mass(w):
        return ((w * is_partner).sum(-1)[has].sum() / has.sum()).item()

    assert 0 < served < 1 and abs(served - mass(w_limit)) < 1e-4
    _, w_anna = anna_attention(q, k, torch.zeros(n, 1, 32, 1, **F64), n_tables=4096, n_bits=z, seed=5,
                               return_weights=True, causal=False)
    assert abs(mass(w_anna[:, 0]) - mass(w_limit)) < 2e-3                     # measured: 2.3e-4 of 0.044
    with pytest.raises(ValueError, match="plan must be"):
        match2_partner_mass(model, n=2, seed=1, plan="sparse")


def test_layer_served_the_many_table_limit_attends_with_normalised_collision_probabilities():
    """``anna=(math.inf, z, None)`` serves p(theta)^z / sum_j p(theta)^z, built here from the angles,
    causal rows cut at the diagonal."""
    from attnbook.experiments.anna import SurrogateLayer
    torch.manual_seed(0)
    for causal in (False, True):
        layer = SurrogateLayer(8, causal=causal).double()
        h = torch.randn(2, 7, 8, **F64)
        with torch.no_grad():
            got = layer(h, anna=(math.inf, 5, None))
            q, k = layer.unit_qk(h)
            p = (1 - torch.arccos((q @ k.transpose(-1, -2)).clamp(-1, 1)) / math.pi) ** 5
            if causal:
                p = p.tril()
            want = ((p / p.sum(-1, keepdim=True)) @ layer.wv(h)[:, None])[:, 0]
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)


def test_best_cell_error_searches_only_the_cells_inside_the_bounds():
    from attnbook.experiments.anna import best_cell_error
    grid = lambda d: [[0.9, 0.5 + d], [0.4, 0.1 + d]]                     # noqa: E731  ls [8, 64] x zs [2, 16]
    doc = {"config": {"ls": [8, 64], "zs": [2, 16]},
           "rows": [dict(surrogate="softmax", anna_error=grid(d)) for d in (0.0, 0.2)]}
    assert best_cell_error(doc, "softmax") == pytest.approx((0.2, 0.02 ** 0.5))     # bests 0.1, 0.3: sample std
    assert best_cell_error(doc, "softmax", max_l=16)[0] == pytest.approx(0.6)      # l = 8 only: 0.5, 0.7
    assert best_cell_error(doc, "softmax", max_z=6)[0] == pytest.approx(0.4)       # z = 2 only
    doc2 = {"config": {"ls": [[32, 4], [256, 256]], "zs": [2]},
            "rows": [dict(surrogate="softmax", anna_error=[[0.3], [0.1]])]}
    assert best_cell_error(doc2, "softmax", max_l=(96, 32)) == (0.3, 0.0)
    with pytest.raises(ValueError, match="no grid cell"):
        best_cell_error(doc, "softmax", max_l=4)

@pytest.mark.parametrize("n_tables,n_bits", [(3, 2), (64, 8)])
def test_match2_anna_weights_counted_per_symbol_equal_anna_on_the_sequences(n_tables, n_bits):
    from attnbook.experiments.anna import match2_anna_weights
    model, x, _ = _match2_model_and_sequences(5, seed=2)
    w = match2_anna_weights(model, x, n_tables, n_bits, seed=7)
    q, k = _unit_qk(model, x)
    _, w_op = anna_attention(q, k, torch.zeros(5, 1, 32, 1), n_tables=n_tables, n_bits=n_bits, seed=7,
                             return_weights=True, causal=False)
    assert w.shape == w_op.shape == (5, 1, 32, 32)
    assert (w.double() - w_op).abs().max() < 1e-6                             # float32 vs float64 rounding
    assert (w_op.sum(-1) > 0).any()


@pytest.mark.parametrize("n_tables,n_bits", [(3, 2), (64, 8)])
def test_match2_set_weighting_is_uniform_over_the_keys_that_collide_in_some_table(n_tables, n_bits):
    """``weighting="set"``: the keys with a non-zero weight in ANNA's own (count) weights, each weighted
    alike -- built here from ``anna_attention`` on the sequences; rows with no collision stay zero."""
    from attnbook.experiments.anna import anna_error_grid, match2_anna_weights
    model, x, _ = _match2_model_and_sequences(5, seed=3)
    w_set = match2_anna_weights(model, x, n_tables, n_bits, seed=11, weighting="set")
    q, k = _unit_qk(model, x)
    _, w_op = anna_attention(q, k, torch.zeros(5, 1, 32, 1), n_tables=n_tables, n_bits=n_bits, seed=11,
                             return_weights=True, causal=False)
    hit = (w_op > 0).double()
    expected = hit / hit.sum(-1, keepdim=True).clamp_min(1)
    assert (w_set.double() - expected).abs().max() < 1e-6
    assert torch.equal(w_set > 0, w_op > 0)                                    # the same support
    if n_tables > 1:                                                           # some key collides twice
        assert not torch.allclose(w_set.double(), w_op, atol=1e-6)
    with pytest.raises(ValueError, match="weighting"):
        match2_anna_weights(model, x, 2, 2, seed=0, weighting="uniform")
    with pytest.raises(ValueError, match="match2 only"):
        anna_error_grid(model, "induction", [4], [2], n=2, seed=0, weighting="set")


# ---------------------------------------------------------------------------- a value reaches its bucket only

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    not __import__("attnlib")._backend.INTERPRET, reason="the kernels on the CPU need TRITON_INTERPRET=1"))]


def _leak_instance(T=40, D=8, Dv=4, seed=0):
    """float32 q near k (so buckets are shared), T spanning several kernel tiles: two full tiles of 16 rows
    (the interpreter's) and a ragged one, so that a bucket's running sum crosses tile boundaries."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 2, T, D, generator=g)
    q = k + 0.5 * torch.randn(1, 2, T, D, generator=g)
    return q, k, torch.randn(1, 2, T, Dv, generator=g)


def _support(q, k, *, n_tables, n_bits, seed, causal=False):
    """``m_ij > 0`` from the dense definition: ``[B, H, Tq, Tk]`` bool."""
    proj = lsh_projections("simhash", n_tables, n_bits, q.shape[-1], seed)
    return anna_collision_counts(lsh_codes(q, proj, "simhash"), lsh_codes(k, proj, "simhash"), causal=causal) > 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fill", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("causal", [False, True])
def test_a_nonfinite_value_reaches_exactly_the_rows_that_collide_with_it(backend, fill, causal):
    q, k, v = _leak_instance()
    kw = dict(n_tables=4, n_bits=3, seed=1, causal=causal, backend=backend)
    clean = anna_attention(q, k, v, **kw)
    sees = _support(q, k, n_tables=4, n_bits=3, seed=1, causal=causal)
    T = q.shape[2]
    for j in (0, 17, 33, T - 1):                 # the first row, inside the second tile, the ragged one, the last
        vb = v.clone()
        vb[:, :, j, 1] = fill
        o = anna_attention(q, k, vb, **kw)
        reached = ~torch.isfinite(o[..., 1])
        assert torch.equal(reached, sees[..., j]), j
        assert 0 < int(reached.sum()) < reached.numel() or (causal and j == T - 1)
        untouched = ~sees[..., j]
        assert torch.equal(o[untouched], clean[untouched]), j                   # bit for bit
        assert torch.equal(o[..., [0, 2, 3]], clean[..., [0, 2, 3]])            # other columns never met it


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fill", [1e30, float("nan"), float("inf")])
def test_causal_outputs_before_t0_are_bit_identical_whatever_v_holds_from_t0_on(backend, fill):
    q, k, v = _leak_instance()
    kw = dict(n_tables=5, n_bits=2, seed=3, causal=True, backend=backend)
    clean = anna_attention(q, k, v, **kw)
    for t0 in (1, 16, 30, 39):                   # in the first tile, at a tile boundary, inside one, the last row
        vb = v.clone()
        vb[:, :, t0:] = fill
        o = anna_attention(q, k, vb, **kw)
        assert torch.equal(o[:, :, :t0], clean[:, :, :t0]), t0


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_outlier_value_leaves_the_rows_that_do_not_collide_with_it_bit_identical(backend):
    q, k, v = _leak_instance()
    kw = dict(n_tables=4, n_bits=3, seed=1, causal=False, backend=backend)
    clean = anna_attention(q, k, v, **kw)
    sees = _support(q, k, n_tables=4, n_bits=3, seed=1)
    for j in (3, 33):
        vb = v.clone()
        vb[:, :, j] = 1e5
        o = anna_attention(q, k, vb, **kw)
        assert torch.equal(o[~sees[..., j]], clean[~sees[..., j]])
        assert (o[sees[..., j]] != clean[sees[..., j]]).any(-1).all()


# ---------------------------------------------------------------------------- NaN or inf in q or k

@pytest.mark.parametrize("which", ["q", "k"])
def test_a_nonfinite_query_or_key_raises_where_values_are_checked(which):
    q, k, v = _leak_instance(T=8)
    bad = (q if which == "q" else k).clone()
    bad[0, 1, 5, 2] = float("nan")
    args = (bad, k, v) if which == "q" else (q, bad, v)
    with pytest.raises(ValueError, match=rf"{which} has a non-finite entry at \[batch, head, time\] = \[0, 1, 5\]"):
        anna_attention(*args, n_tables=2, n_bits=3, causal=False)


# The interpreter runs tl.dot through NumPy, which warns on inf * 0 (the result is NaN either way).
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
def test_unchecked_a_nonfinite_key_collides_with_nothing_and_a_nonfinite_query_row_is_nan(backend, fill, monkeypatch,
                                                                                        rel_err):
    """Off the CPU values are not read (no host sync): a key with no direction drops out -- the output is
    that of the sequence without it -- and a query with none gets a NaN row; no other row changes."""
    from attnlib import _validate
    monkeypatch.setattr(_validate, "checks_values", lambda x: False)      # as for a GPU tensor
    q, k, v = _leak_instance()
    kw = dict(n_tables=4, n_bits=3, seed=1, causal=False, backend=backend)
    j = 21
    kb = k.clone()
    kb[:, :, j, 0] = fill
    o, w = anna_attention(q, kb, v, return_weights=True, **kw)
    keep = [t for t in range(q.shape[2]) if t != j]
    o_without, w_without = anna_attention(q, k[:, :, keep], v[:, :, keep], return_weights=True, **kw)
    assert torch.equal(w[..., j], torch.zeros_like(w[..., j])) and torch.equal(w[..., keep], w_without)
    if backend == "torch":
        assert torch.equal(o, o_without)
    else:                                    # the kernel's tiles move with the sorted positions: rounding only
        assert rel_err(o, o_without) < 1e-6
    qb = q.clone()
    qb[:, :, j, 0] = fill
    o, w = anna_attention(qb, k, v, return_weights=True, **kw)
    clean, w_clean = anna_attention(q, k, v, return_weights=True, **kw)
    assert torch.isnan(o[:, :, j]).all() and torch.isnan(w[:, :, j]).all()
    assert torch.equal(o[:, :, keep], clean[:, :, keep]) and torch.equal(w[:, :, keep], w_clean[:, :, keep])


def test_a_numpy_or_torch_integer_seed_is_the_same_seed():
    q, k, v = _qkv(1, 1, 12, 12, 8, 8, 0)
    kw = dict(n_tables=4, n_bits=2, causal=False)
    ref = anna_attention(q, k, v, seed=3, **kw)
    for seed in (np.int64(3), np.uint8(3), torch.tensor(3)):
        assert torch.equal(anna_attention(q, k, v, seed=seed, **kw), ref), type(seed)
    anna_attention(q, k, v, seed=2**64 - 1, **kw)                      # torch's largest seed
    for bad in (2**64, -1):
        with pytest.raises(ValueError, match="seed must be in"):
            anna_attention(q, k, v, seed=bad, **kw)
