"""State capacity without training (attnbook.experiments.recall, chapter 7): store N key--value pairs in
one pass, read the stored keys back. Softmax keeps every pair; Hebbian (linear attention) superposes;
the delta rule overwrites -- and wins only where there is something to overwrite."""

import pytest
import torch

from attnbook.experiments.recall import associative_recall, recall_vs_pairs

SEEDS = range(5)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def test_softmax_recalls_every_pair_in_every_regime():
    for keys, counts, dim in (("random", [1, 16, 64, 256], 64), ("orthonormal", [1, 5, 16], 16)):
        out = recall_vs_pairs(counts, dim, generator=_gen(0), trials=2, rules=("softmax",), keys=keys)
        for regime, by_rule in out.items():
            assert torch.equal(by_rule["softmax"], torch.ones(len(counts), 2)), (keys, regime)


def test_orthonormal_keys_up_to_dim_are_recalled_exactly_by_hebbian_and_delta():
    for n in (1, 5, 16):
        for rule in ("linear", "delta"):
            acc, err = associative_recall(n, 16, rule=rule, keys="orthonormal", trials=3, generator=_gen(n))
            assert acc == 1.0 and err < 1e-24, (rule, n, acc, err)


def test_overwritten_orthonormal_key_is_a_tie_for_hebbian_and_exact_for_delta():
    # S k_i = v_old + v_new exactly: equally near both, so a miss; the delta rule replaces v_old.
    n, ow = 12, 5
    acc_lin, _ = associative_recall(n, 16, rule="linear", keys="orthonormal", overwrites=ow, generator=_gen(1))
    acc_del, err_del = associative_recall(n, 16, rule="delta", keys="orthonormal", overwrites=ow,
                                          generator=_gen(1))
    assert acc_lin == pytest.approx(1 - ow / n, abs=1e-12)
    assert acc_del == 1.0 and err_del < 1e-24


def test_with_overwrites_the_delta_rule_beats_hebbian_by_a_margin_on_every_seed():
    for seed in SEEDS:
        out = recall_vs_pairs([16, 32], 64, generator=_gen(seed), trials=4, rules=("linear", "delta"),
                              regimes=("overwrites",))["overwrites"]
        gain = (out["delta"] - out["linear"]).mean(dim=1)              # measured 0.24 .. 0.31
        assert (gain > 0.15).all(), (seed, gain.tolist())


def test_with_distinct_random_keys_the_delta_rule_never_wins():
    # One pass over distinct random keys: equal (both exact) well below d_k, Hebbian ahead from d_k on;
    # the quick check: d_k = 64, N = 256, Hebbian 0.76, delta rule 0.27.
    out = recall_vs_pairs([16, 64, 256], 64, generator=_gen(0), trials=5, rules=("linear", "delta"),
                          regimes=("distinct",))["distinct"]
    lin, dlt = out["linear"].mean(dim=1), out["delta"].mean(dim=1)
    assert lin[0] == dlt[0] == 1.0
    assert (lin[1:] >= dlt[1:]).all()
    assert abs(lin[2] - 0.76) < 0.05 and abs(dlt[2] - 0.27) < 0.05, (lin.tolist(), dlt.tolist())


def test_hebbian_crosstalk_has_its_closed_form_size():
    # S k_i - v_i = sum_{j != i} v_j (k_j . k_i); E (k_j . k_i)^2 = 1 / d_k for random unit keys, so
    # E |noise|^2 = (N - 1) / d_k (per coordinate (N - 1) / d_k^2 here, d_v = d_k). Measured within 5%.
    for n, d in ((128, 64), (256, 32)):
        for seed in (0, 1):
            _, err = associative_recall(n, d, trials=8, generator=_gen(seed))
            assert abs(err / ((n - 1) / d) - 1) < 0.1, (n, d, seed, err)


def test_the_same_generator_state_gives_the_same_curves():
    a = recall_vs_pairs([8, 40], 16, generator=_gen(3), trials=2)
    b = recall_vs_pairs([8, 40], 16, generator=_gen(3), trials=2)
    assert all(torch.equal(a[r][m], b[r][m]) for r in a for m in a[r])
    assert set(a) == {"distinct", "overwrites"} and set(a["distinct"]) == {"softmax", "linear", "delta"}


@pytest.mark.parametrize("call, error, match", [
    (lambda: associative_recall(0, 8), ValueError, "num_pairs must be >= 1"),
    (lambda: associative_recall(4, 0), ValueError, "dim must be >= 1"),
    (lambda: associative_recall(4, 8, rule="hopfield"), ValueError, "rule must be one of"),
    (lambda: associative_recall(4, 8, keys="sparse"), ValueError, "keys must be one of"),
    (lambda: associative_recall(9, 8, keys="orthonormal"), ValueError, "needs num_pairs <= dim"),
    (lambda: associative_recall(4, 8, softmax_scale=0.0), ValueError, "softmax_scale must be"),
    (lambda: associative_recall(4, 8, generator=0), TypeError, "generator must be a torch.Generator"),
    (lambda: recall_vs_pairs([4, 0], 8, generator=_gen(0)), ValueError, r"pair_counts\[i\] must be >= 1"),
    (lambda: recall_vs_pairs([], 8, generator=_gen(0)), ValueError, "pair_counts must name"),
    (lambda: recall_vs_pairs([4], 0, generator=_gen(0)), ValueError, "dim must be >= 1"),
    (lambda: recall_vs_pairs([4], 8, generator=_gen(0), trials=0), ValueError, "trials must be >= 1"),
    (lambda: recall_vs_pairs([4], 8, generator=0), TypeError, "generator must be a torch.Generator"),
    (lambda: recall_vs_pairs([4], 8, generator=_gen(0), rules=("gla",)), ValueError, "rules must be"),
    (lambda: recall_vs_pairs([4], 8, generator=_gen(0), rules="linear"), ValueError, "rules must be"),
    (lambda: recall_vs_pairs([4], 8, generator=_gen(0), regimes=()), ValueError, "regimes must be"),
    (lambda: recall_vs_pairs([4], 8, generator=_gen(0), overwrite_fraction=0), ValueError,
     "overwrite_fraction must be"),
])
def test_bad_arguments_are_refused_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call()
