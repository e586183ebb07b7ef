"""Chapter 7's top-k experiments: the transport reading against chapter 1's solver, the blind needle
against chapter 2's closed form, the indexer's training, and the cost on counted work."""


import pytest
import torch

from attnbook.experiments import needle
from attnbook.experiments import topk as xt
from attnlib import topk


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- the transport reading -----------------------------------------------------------------------

@pytest.mark.parametrize("seed,top_k", [(0, 1), (1, 4), (2, 9), (3, 30)])
def test_restricted_plan_is_the_eot_plan_on_its_support_and_loses_twice_the_missing_mass(seed, top_k):
    g = _gen(seed)
    T = 24
    q, k, v = xt.random_rows(T, 8, generator=g)
    iq, ik, iw = xt.noisy_indexer(q, k, n_heads=3, noise=1.0, generator=g)
    idx = topk.topk_select(topk.index_scores(iq, ik, iw), top_k, causal=True)
    r = xt.transport_reading(q, k, v, idx)
    assert r["eot_gap"].max() < 1e-10                     # chapter 1's Newton solver on S, no softmax
    assert r["operator_gap"].max() < 1e-12                # the operator computes that plan
    assert torch.allclose(r["l1"], 2 * (1 - r["mass"]), atol=1e-13, rtol=0)
    assert (r["output_error"] <= r["bound"] + 1e-12).all()
    if top_k < T - 1:
        assert r["mass"][-1] < 1                          # the last row really lost something


def test_tight_values_attain_the_bound():
    g = _gen(4)
    T = 16
    q, k, _ = xt.random_rows(T, 4, generator=g)
    idx = topk.topk_select(-topk.index_scores(*xt.noisy_indexer(q, k, n_heads=2, noise=0.1, generator=g)), 3,
                           causal=True)
    mask = topk.selection_mask(idx, T)[0, 0]
    v = xt.tight_values(mask[T - 1], torch.randn(5, generator=g, dtype=torch.float64))
    r = xt.transport_reading(q, k, v[None, None], idx)
    assert r["mass"][T - 1] < 0.9
    assert r["output_error"][T - 1] == pytest.approx(float(r["bound"][T - 1]), rel=1e-12)


def test_eot_plan_on_support_is_zero_off_it_and_matches_softmax_on_it():
    g = _gen(5)
    c = torch.randn(7, generator=g, dtype=torch.float64)
    support = torch.tensor([True, False, True, True, False, False, True])
    plan = xt.eot_plan_on_support(c, support, 0.5)
    assert (plan[~support] == 0).all()
    assert torch.allclose(plan[support], torch.softmax(-c[support] / 0.5, 0), atol=1e-12)


def test_mechanism_map_loses_less_mass_as_k_grows_and_none_at_k_equal_T():
    m = xt.mechanism_map(12, 4, [1, 3, 12], generator=_gen(0))
    means = [float(x.mean()) for x in m["lost"]]
    assert means[0] >= means[1] >= means[2] and means[2] < 1e-12
    assert torch.isnan(m["scores"][0, 1]) and not torch.isnan(m["scores"][1, 0])
    for R, mask in zip(m["restricted"], m["masks"]):
        assert torch.allclose(R.sum(-1), torch.ones(12, dtype=torch.float64)) and (R[~mask] == 0).all()


# --- the needle the indexer cannot see --------------------------------------------------------------

@pytest.mark.parametrize("M", [0.5, 3.0, 12.0, 40.0])
def test_hidden_needle_matches_chapter_2s_closed_form_and_tends_to_2(M):
    r = xt.blind_needle(32, M, 8, generator=_gen(1))
    assert r["needle_score"] == 0.0 and r["lowest_haystack_score"] > 0 and not r["selected_needle"]
    assert r["error"] == pytest.approx(needle.uniform_miss_error(32, 8, M), abs=1e-12)
    if M >= 40:
        assert r["error"] > 2 - 1e-12


def test_visible_needle_is_fetched():
    r = xt.blind_needle(32, 40.0, 8, hide=False, generator=_gen(1))
    assert r["selected_needle"] and r["error"] < 1e-9


def test_blind_needle_refuses_a_k_that_keeps_every_key():
    with pytest.raises(ValueError, match="must leave one out"):
        xt.blind_needle(8, 1.0, 8, generator=_gen(0))
    assert not xt.blind_needle(8, 40.0, 7, generator=_gen(0))["selected_needle"]     # k = T - 1 still misses it
    with pytest.raises(TypeError, match="torch.Generator"):
        xt.blind_needle(8, 1.0, 2, generator=0)


@pytest.mark.parametrize("seed,M", [(0, 4.0), (1, 30.0), (2, 80.0), (3, 8.0), (4, 16.0), (5, 64.0)])
def test_signed_indexer_needle_placed_lowest_is_missed_whatever_the_weights_signs(seed, M):
    r = xt.signed_indexer_needle(64, M, 16, generator=_gen(seed))
    assert r["null_dim"] == 128 - 64                       # 64 index queries leave 64 of 128 dims unseen
    assert r["needle_score"] < r["lowest_haystack_score"] and r["n_above"] == 63
    assert not r["selected_needle"]
    assert r["error"] == pytest.approx(needle.uniform_miss_error(64, 16, M), abs=1e-12)


@pytest.mark.parametrize("seed", range(8))
def test_signed_indexer_needle_scoring_zero_is_missed_exactly_when_k_keys_score_above_it(seed):
    r = xt.signed_indexer_needle(64, 40.0, 16, place="zero", generator=_gen(seed))
    assert float(r["head_products"].max()) == pytest.approx(-1.0, abs=1e-9)   # every ReLU is 0 ...
    assert r["needle_score"] == 0.0                                           # ... whatever the signs
    assert r["selected_needle"] == (r["n_above"] < 16)


def test_signed_indexer_needle_scoring_zero_is_sometimes_selected():
    # with signed weights a row whose weights lean negative scores most keys below 0: the zero key is fetched
    picked = [xt.signed_indexer_needle(64, 40.0, 16, place="zero", generator=_gen(s))["selected_needle"]
              for s in range(8)]
    assert any(picked) and not all(picked)


def test_signed_indexer_needle_checks_its_arguments():
    with pytest.raises(ValueError, match="d_index"):
        xt.signed_indexer_needle(16, 1.0, 4, n_index_heads=8, d_index=8, generator=_gen(0))
    with pytest.raises(ValueError, match="place"):
        xt.signed_indexer_needle(16, 1.0, 4, place="null", generator=_gen(0))


def test_shared_selection_costs_nothing_for_identical_heads_and_hurts_the_worst_head_otherwise():
    task = dict(content_dim=8, n_planted=4, tail=0.6, beta=4.0)
    same = xt.shared_selection_loss(xt.head_plans(4, 24, 4, common=1.0, generator=_gen(0), **task), [2, 6],
                                    first_row=12)
    assert same["shared"] == pytest.approx(same["own"], abs=1e-6)          # float32 plans
    assert same["worst_head"] == pytest.approx(same["shared"], abs=1e-6)
    plans = xt.head_plans(4, 24, 4, common=0.0, generator=_gen(0), **task)
    assert torch.allclose(plans.sum(-1), torch.ones(4, 4, 24, dtype=plans.dtype))      # still plans
    apart = xt.shared_selection_loss(plans, [2, 6, 24], first_row=12)
    for w, s, o in zip(apart["worst_head"], apart["shared"], apart["own"]):
        assert w <= s + 1e-12 and s <= o + 1e-12         # per-head top-k beats any shared one on average
    assert apart["worst_head"][0] < apart["own"][0] - 0.1
    assert apart["shared"][-1] == pytest.approx(1.0)          # k = T keeps every key


def test_shared_selection_mean_over_heads_is_the_average_plans_mass():
    plans = xt.head_plans(2, 16, 3, common=0.3, generator=_gen(5), content_dim=8, n_planted=3)
    mask = topk.selection_mask(topk.topk_select(plans.mean(1, keepdim=True), 5, causal=True), 16)
    by_head = (plans * mask).sum(-1)[..., 8:].mean()
    assert xt.shared_selection_loss(plans, [5], first_row=8)["shared"][0] == pytest.approx(float(by_head))


def test_head_plans_refuses_a_common_share_outside_0_1():
    with pytest.raises(ValueError, match="common"):
        xt.head_plans(1, 8, 2, common=1.5, generator=_gen(0))


# --- the trained indexer ------------------------------------------------------------------------------

def test_planted_task_is_causal_and_puts_mass_on_the_needles():
    task = xt.planted_task(4, 32, content_dim=16, n_planted=4, beta=6.0, tail=0.6, generator=_gen(0))
    assert torch.allclose(task.plan.sum(-1), torch.ones(4, 1, 32))
    assert (task.plan[0, 0].triu(1) == 0).all() and not task.planted[:, range(32), range(32)].any()
    on_needles = (task.plan[:, 0] * task.planted).sum(-1)[:, 8:]
    assert on_needles.mean() > 0.5                         # the needles dominate the rows that have them


def test_planted_task_and_indexer_depend_only_on_the_generator():
    a = xt.planted_task(2, 16, generator=_gen(3))
    b = xt.planted_task(2, 16, generator=_gen(3))
    assert torch.equal(a.states, b.states) and torch.equal(a.plan, b.plan)
    ia, ib = (xt.Indexer(10, 2, 4, generator=_gen(9)) for _ in range(2))
    assert all(torch.equal(p, r) for p, r in zip(ia.parameters(), ib.parameters()))


def test_trained_indexer_beats_untrained_and_stays_below_the_oracle():
    res = xt.recall_grid([(2, 8)], [2, 8], [0], T=32, batch=4, task=dict(content_dim=8, n_planted=4),
                         dense_steps=60, sparse_steps=20, lr=1e-2)
    trained, untrained, oracle = res["trained"][0, 0], res["untrained"][0, 0], res["oracle"][0]
    assert (trained > untrained + 0.1).all()
    assert (trained <= oracle + 1e-6).all()               # the teacher's own top-k holds the most mass
    assert (trained[1:] >= trained[:-1]).all()            # nested selections


def test_sparse_stage_trains_only_on_the_selected_set():
    # With top_k = 1 the restricted KL is over one key, where both distributions are 1: the loss is
    # exactly 0 whatever the teacher puts elsewhere -- the sparse stage sees the selected set only.
    ix = xt.Indexer(6, 1, 2, generator=_gen(0))
    task = xt.planted_task(2, 8, content_dim=2, n_planted=1, generator=_gen(1))
    losses = xt.train_indexer(ix, lambda: task, dense_steps=0, sparse_steps=3, top_k=1)
    assert losses == [0.0, 0.0, 0.0]


# --- cost -------------------------------------------------------------------------------------------

def test_per_pair_flops_match_the_formulas_for_deepseek_v32_in_both_mla_forms():
    c = xt.per_pair_flops()
    cfg = xt.DEEPSEEK_V32
    assert c["indexer"] == 2 * cfg["index_n_heads"] * cfg["index_head_dim"] == 16_384
    assert c["mqa"] == 2 * cfg["n_heads"] * (2 * cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) == 278_528
    assert c["mha"] == 2 * cfg["n_heads"] * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] + cfg["v_head_dim"]) \
        == 81_920
    assert c["r_I_mqa"] == pytest.approx(1 / 17) and c["r_I_mha"] == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="mode"):
        xt.mla_dims(cfg, "gqa")


def test_topk_attention_is_linear_in_L_and_independent_of_k_squared():
    a = xt.topk_attention_flops(256, 256, 16, 2, 8, 8)
    b = xt.topk_attention_flops(512, 512, 16, 2, 8, 8)
    c = xt.topk_attention_flops(512, 512, 32, 2, 8, 8)
    assert b == 2 * a and c == 2 * b == 2 * 2 * 512 * 32 * (8 + 8)   # 2 B H Tq k (D + Dv)
    assert xt.attention_flops(512, 512, 2, 8, 8) == 4 * xt.attention_flops(256, 256, 2, 8, 8)


def test_break_even_length_is_where_counted_decode_costs_meet():
    r = xt.per_pair_flops()["r_I_mqa"]
    T_star = xt.break_even_length(2048, r)
    assert T_star == pytest.approx(2176)
    at = xt.decode_flops(round(T_star))
    assert at["dense"] == at["sparse"]
    below, above = xt.decode_flops(2100), xt.decode_flops(2300)
    assert below["dense"] < below["sparse"] and above["dense"] > above["sparse"]
    with pytest.raises(ValueError, match="ratio"):
        xt.break_even_length(10, 1.0)


def test_prefill_break_even_against_mha_is_where_the_per_query_costs_meet():
    c = xt.per_pair_flops()
    T_star = xt.prefill_break_even(2048, dense=c["mha"], sparse=c["mqa"], indexer=c["indexer"])
    assert T_star == pytest.approx(278_528 * 2048 / (81_920 - 16_384)) and T_star == pytest.approx(8704)
    dense, sparse = c["mha"] * T_star, c["indexer"] * T_star + c["mqa"] * 2048
    assert dense == pytest.approx(sparse)
    same = xt.prefill_break_even(2048, dense=c["mqa"], sparse=c["mqa"], indexer=c["indexer"])
    assert same == pytest.approx(xt.break_even_length(2048, c["r_I_mqa"]))
    with pytest.raises(ValueError, match="indexer"):
        xt.prefill_break_even(8, dense=1.0, sparse=1.0, indexer=1.0)


def test_cache_grows_by_the_index_key_at_its_stored_precision():
    c = xt.cache_bytes_per_token()
    assert c["dense"] == 576 * 2 and c["topk"] - c["dense"] == 128 + 4      # FP8 key and a float32 scale
    assert c["topk"] / c["dense"] == pytest.approx(1 + 132 / 1152)


def test_decode_bytes_read_every_latent_row_densely_and_every_index_key_sparsely():
    b = xt.decode_bytes(1000)                         # below k: the top-k layer reads every row and the keys
    assert b["dense"] == 1000 * 1152 and b["sparse"] == 1000 * (132 + 1152)
    b = xt.decode_bytes(131_072)
    assert b["sparse"] == 131_072 * 132 + 2048 * 1152
    assert xt.decode_bytes(131_072, sparse_latent=656)["sparse"] == 131_072 * 132 + 2048 * 656


# --- the figures --------------------------------------------------------------------------------------

def test_mechanism_map_figure_steps_over_k_and_outlines_the_chosen_keys():
    from attnbook.widgets.topk import mechanism_map_figure
    m = xt.mechanism_map(32, 8, [1, 2, 4, 8, 16, 32], generator=_gen(0))
    fig = mechanism_map_figure(m["plan"], m["scores"], m["ks"], m["restricted"], m["lost"], masks=m["masks"],
                               active=2)
    assert fig.layout.meta == {"mechanism_map": "top-k attention with a lightning indexer"}
    assert len(fig.frames) == len(fig.layout.sliders[0].steps) == 6
    for fr, R, lost, mask in zip(fig.frames, m["restricted"], m["lost"], m["masks"]):
        assert list(fr.traces) == [1, 3, 4, 5]
        assert abs(fr.data[0].z - R.numpy()).max() < 1e-4 and abs(fr.data[1].x - lost.numpy()).max() < 1e-4
        # one outlined square (five corners and a break) per chosen key, on both plans
        for outline in fr.data[2:]:
            assert len(outline.x) == 6 * int(mask.sum())
        assert fr.layout.yaxis.range is not None and fr.layout.xaxis4.range is not None
    assert fig.data[4].xaxis == "x" and fig.data[5].xaxis == "x2"          # over softmax's and the top-k plan
    assert fig.layout.title.subtitle.font.size >= 11
    assert len(fig.to_json()) < 300_000
    with pytest.raises(ValueError, match="one restricted plan"):
        mechanism_map_figure(m["plan"], m["scores"], m["ks"][:2], m["restricted"], m["lost"])
