"""Chapter 2's claims, one by one: every registered subquadratic algorithm is defeated by its needle,
the closed forms hold, and the fine print (vector-reading algorithms, coins, bounded scores) behaves
as the chapter says."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbook.experiments import needle

T, D = 256, 16


@pytest.fixture(scope="module")
def algos():
    return {name: needle.make(name, T=T, d=D, seed=0) for name in needle.ALGORITHMS}


@pytest.mark.parametrize("name", sorted(needle.ALGORITHMS))
def test_every_algorithm_is_defeated_by_its_needle_at_M_80(name, algos):
    algo = algos[name]
    case = needle.attack(algo, M=80)
    assert case.T == T and case.i != case.j
    assert needle.row_error(algo, case) >= 1.9
    probes = algo.probes(case.q, case.k)
    if probes is not None:                                   # the planted pair was never inspected
        assert not probes[case.i, case.j]


@pytest.mark.parametrize("name", sorted(needle.ALGORITHMS))
def test_the_needle_stays_away_from_the_ends_of_the_row(name, algos):
    """A spike on key 0 or T-1 sits on a figure's axis: every adversary keeps T // 8 keys clear."""
    case = needle.attack(algos[name], M=80)
    assert T // 8 <= case.j <= T - 1 - T // 8


@pytest.mark.parametrize("name", sorted(needle.ALGORITHMS))
def test_every_algorithm_is_subquadratic_in_work(name):
    """Work grows slower than T^2: doubling T twice multiplies it by less than 16 (by ~8 or less)."""
    w = [needle.make(name, T=t, d=D, seed=0).work() for t in (128, 512)]
    assert w[1] / w[0] < 0.8 * 16


@pytest.mark.parametrize("name", ["sliding_window", "strided", "random_keys"])
@pytest.mark.parametrize("M", [0.5, 3.0, 8.0, 40.0])
def test_pattern_error_matches_the_closed_form(name, M, algos):
    algo = algos[name]
    case = needle.attack(algo, M=M)
    n_seen = int(algo.probes()[case.i].sum())
    assert needle.row_error(algo, case) == pytest.approx(needle.uniform_miss_error(T, n_seen, M), abs=1e-5)


def test_exact_row_puts_needle_mass_on_j():
    case = needle.plant(50, 8, 3, 40, 4.0, dtype=torch.float64)
    row = needle.exact_rows(case)[3]
    assert row[40].item() == pytest.approx(needle.needle_mass(50, 4.0), rel=1e-9)
    assert row.sum().item() == pytest.approx(1.0, abs=1e-12)


def test_against_an_all_zero_answer_the_distance_is_one_not_two():
    case = needle.plant(64, 8, 10, 50, 80.0)
    assert needle.exact_rows(case)[10].abs().sum().item() == pytest.approx(1.0)


def test_vector_reading_algorithms_find_the_naive_needle():
    """The fine print: outside the oracle model, the zero-haystack needle is found."""
    idx = needle.make("indexer_topk", T=T, d=D)
    assert needle.row_error(idx, idx.adversary(80.0, hide=False)) < 1e-6
    ns = needle.make("norm_screen", T=T, d=D)
    assert needle.row_error(ns, ns.adversary(80.0, equal_norms=False)) < 1e-6


def test_indexer_blind_pair_has_positive_dot_and_negative_indexed_dot(algos):
    idx = algos["indexer_topk"]
    u, w = idx.blind_pair()
    assert (u @ w).item() > 0.8
    assert ((u @ idx.P) @ (w @ idx.P)).item() < 0


def test_lsh_pair_straddles_every_round(algos):
    lsh = algos["lsh"]
    u, w, cos = lsh.straddling_pair()
    assert cos > 0.9
    assert (lsh.buckets(u[None]) != lsh.buckets(w[None])).all()


def test_random_keys_miss_probability_matches_fresh_coins():
    """Coins not fixed: a pair planted before the coins are tossed survives with P = 1 - s/T."""
    Tn, trials = 64, 200
    hits = 0
    for seed in range(trials):
        algo = needle.make("random_keys", T=Tn, d=8, seed=seed)
        hits += not algo.probes()[Tn // 2, 0]
    p = algo.miss_probability()
    assert abs(hits / trials - p) < 4 * math.sqrt(p * (1 - p) / trials)


def test_performer_variance_formula_and_its_exponential_growth():
    x = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(200_000, 3, generator=g, dtype=torch.float64)
    est = torch.exp(w @ x - x @ x / 2) * torch.exp(w @ x - x @ x / 2)
    assert est.mean().item() == pytest.approx(math.exp(x @ x), rel=1e-2)
    assert (est.var() / est.mean() ** 2).item() == pytest.approx(
        needle.Performer.relative_variance(x, x, 1), rel=0.05)
    assert needle.Performer.relative_variance(4 * x, 4 * x, 64) > 1e3 * needle.Performer.relative_variance(x, x, 64)


def test_bounded_scores_make_features_and_low_rank_accurate(algos):
    small = needle.bounded_case(T, D, 0.05, seed=1)
    large = needle.bounded_case(T, D, 20.0, seed=1)
    for name in ("performer", "linformer"):
        e_small = needle.output_error(algos[name], *small)
        e_large = needle.output_error(algos[name], *large)
        assert e_small < 0.1 and e_large > 5 * e_small


@settings(max_examples=15, deadline=None)
@given(Tn=st.integers(40, 120), M=st.floats(1.0, 50.0), seed=st.integers(0, 1000))
def test_sliding_window_error_formula_holds_for_all_T_and_M(Tn, M, seed):
    algo = needle.make("sliding_window", T=Tn, d=4, seed=seed)
    case = needle.attack(algo, M=M)
    n_seen = int(algo.probes()[case.i].sum())
    assert needle.row_error(algo, case) == pytest.approx(needle.uniform_miss_error(Tn, n_seen, M), abs=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", sorted(needle.ALGORITHMS))
def test_extreme_M_gives_no_nan(name, dtype, algos):
    algo = algos[name]
    case = needle.attack(algo, M=1e4)
    case.q, case.k, case.v = case.q.to(dtype), case.k.to(dtype), case.v.to(dtype)
    assert torch.isfinite(needle.exact_rows(case)).all()
    out = algo.attend(case.q, case.k, case.v)
    assert torch.isfinite(out).all()
    assert needle.row_error(algo, case) >= 1.9


def test_indexer_uses_the_block_sparse_kernel_through_the_interpreter(rel_err):
    a = needle.make("indexer_topk", T=100, d=D, backend="triton")
    b = needle.make("indexer_topk", T=100, d=D, backend="torch")
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(3, 2, 1, 100, D, generator=g)
    assert rel_err(a.attend(q, k, v), b.attend(q, k, v)) < 1e-5


def test_bad_inputs_raise_clear_errors(algos):
    algo = algos["sliding_window"]
    with pytest.raises(ValueError, match="M must be a finite number > 0"):
        needle.attack(algo, M=0)
    with pytest.raises(ValueError, match="M must be a finite number > 0"):
        needle.attack(algo, M=-3.0)
    with pytest.raises(TypeError, match="M must be a number"):
        needle.attack(algo, M="80")
    with pytest.raises(ValueError, match="T must be >= 8"):
        needle.make("strided", T=4, d=D)
    with pytest.raises(ValueError, match="too small to attack"):
        needle.attack(needle.make("sliding_window", T=16, d=D, window=16), M=80)
    with pytest.raises(ValueError, match="unknown algorithm 'flash'"):
        needle.make("flash", T=T)
    with pytest.raises(ValueError, match="built for T=256"):
        algo.attend(*(torch.zeros(1, 1, 100, D) for _ in range(3)))
    with pytest.raises(ValueError, match="rank must be < d"):
        needle.make("indexer_topk", T=T, d=4, rank=4)
    with pytest.raises(ValueError, match="block_size must be a power of two"):
        needle.make("indexer_topk", T=T, d=D, block_size=12)


def test_probe_map_figure_has_a_frame_per_algorithm_with_the_needle_marked(algos):
    from attnbook.widgets import needle as nw
    chosen = [algos["sliding_window"], algos["performer"]]
    fig = nw.probe_map_figure(needle.probe_maps(chosen, M=80.0))
    assert len(fig.frames) == 2 and len(fig.layout.sliders[0].steps) == 2
    window_frame = fig.frames[0]
    z = window_frame.data[0].z
    i, j = window_frame.data[1].y[0], window_frame.data[1].x[0]
    assert z[i][j] == 0 and z[i][i] == 1                    # the needle sits in an unshaded cell
    assert not fig.frames[1].data[0].z.any()                # performer: no exact score
    exact, got = fig.frames[1].data[2].y, fig.frames[1].data[3].y
    assert abs(sum(exact) - 1) < 1e-9 and abs(sum(got) - 1) < 1e-6


def test_explorer_responds_to_the_algorithm_menu():
    pytest.importorskip("ipywidgets")
    from attnbook.widgets import needle as nw
    box = nw.needle_explorer(needle.probe_map_at(d=8), T_values=(64,))
    menu, fig = box.children[0].children[0], box.children[2]
    menu.value = "performer"
    assert fig.layout.title.text.startswith("Performer")          # in words, not the code name
    assert not fig.data[0].z.any()


def test_lsh_adversarial_input_keeps_the_buckets_balanced(algos):
    """A random haystack orthogonal to u: the attack costs LSH no more than random data would."""
    lsh = algos["lsh"]
    case = needle.attack(lsh, M=80.0)
    assert lsh.probes(case.q, case.k).float().mean().item() < 0.3


def test_hidden_indexer_needle_leaves_the_selection_of_the_zero_input(algos):
    idx = algos["indexer_topk"]
    case = idx.adversary(80.0, hide=True)
    zero = torch.zeros(T, D)
    assert torch.equal(idx.block_mask(case.q[0, 0], case.k[0, 0]), idx.block_mask(zero, zero))


def test_plant_rejects_a_haystack_that_touches_row_i():
    hay = torch.randn(32, 4)
    with pytest.raises(ValueError, match="haystack_k must be orthogonal to u"):
        needle.plant(32, 4, 3, 9, 10.0, haystack_k=hay)
    with pytest.raises(ValueError, match=r"the planted pair \(i=3, j=40\) must lie in \[0, 32\)"):
        needle.plant(32, 4, 3, 40, 10.0)


def test_output_error_names_the_mismatched_argument():
    algo = needle.make("sliding_window", T=16, d=8)
    q = k = v = torch.randn(1, 1, 16, 8)
    with pytest.raises(ValueError, match="^v has shape"):
        needle.output_error(algo, q, k, v[:, :, :3])
    with pytest.raises(ValueError, match="^v has shape"):
        needle.output_error(algo, q, k[:, :, :10], v)


def test_algorithm_rows_are_what_row_error_compares():
    from attnbook.experiments import needle
    algo = needle.make("strided", T=36, d=8, seed=1)
    case = needle.attack(algo, M=20.0)
    rows = needle.algorithm_rows(algo, case)
    assert rows.shape == (36, 36) and rows.dtype == torch.float64
    by_hand = float((needle.exact_rows(case)[case.i] - rows[case.i]).abs().sum())
    assert needle.row_error(algo, case) == pytest.approx(by_hand)
