"""The labs' experiments (attnlib.experiments): counts are exact, fits recover what they fit, the
recall experiment measures the crosstalk it predicts, and the timing helper returns its spread."""

import math

import pytest
import torch

from attnlib.experiments import linear as xl
from attnlib.experiments.recall import associative_recall


def test_state_bytes_are_constant_while_the_kv_cache_grows():
    assert xl.kv_cache_bytes(1000, D=64) == 1000 * 128 * 2
    assert xl.state_bytes(D=64) == 64 * 64 * 4
    assert xl.kv_cache_bytes(2 * 64 * 64 * 4 // (128 * 2), D=64) == xl.state_bytes(D=64) * 2


def test_counted_flops_follow_the_formulas_4T2D_and_4TD_C_plus_D():
    m = xl.measure_flops([64, 128, 256], [16, 24], heads=2, chunk_size=32)
    for D, row in m.items():
        for T, s, lin in zip(row["T"], row["softmax"], row["linear"]):
            assert s == 2 * 4 * T * T * D
            assert lin == 2 * 4 * T * D * (32 + D)


def test_linear_recall_crosstalk_matches_its_expected_size_and_degrades_past_dim():
    acc_few, _ = associative_recall(4, 64, trials=4)
    assert acc_few == 1.0
    for n, d in ((32, 32), (128, 32), (64, 16)):
        _, err = associative_recall(n, d, trials=8)
        assert abs(err / ((n - 1) / d) - 1) < 0.2            # E|crosstalk|^2 = (N - 1) / D
    acc_many, _ = associative_recall(512, 32, trials=2)
    assert acc_many < 0.5


def test_delta_rule_recall_overwrites_where_linear_attention_superposes():
    acc_lin, _ = associative_recall(8, 32, rule="linear", overwrites=4, trials=4)
    acc_del, _ = associative_recall(8, 32, rule="delta", overwrites=4, trials=4)
    assert acc_del > acc_lin + 0.15


def test_recall_bad_arguments():
    with pytest.raises(ValueError, match="rule must be one of"):
        associative_recall(4, 8, rule="hopfield")
    with pytest.raises(ValueError, match=r"overwrites must be in \[0, 4\] \(at most num_pairs\)"):
        associative_recall(4, 8, overwrites=5)
    with pytest.raises(ValueError, match="num_pairs must be >= 1"):
        associative_recall(0, 8)


def test_power_law_fit_recovers_exponent_and_crossover_is_interpolated():
    T = [64, 128, 256, 512]
    slope, icpt = xl.fit_power_law(T, [3.0 * t ** 2 for t in T])
    assert abs(slope - 2) < 1e-9 and abs(math.exp(icpt) - 3) < 1e-6
    slope, _ = xl.fit_power_law(T, [3.0 * t ** 2 for t in T[:-1]] + [1e9], robust=True)
    assert abs(slope - 2) < 1.0                                  # one wild point cannot drag it far
    # softmax t^2 / 100 vs linear t: equal at t = 100, between 64 and 128
    assert abs(xl.crossover_length(T, [t * t / 100 for t in T], T) - 100) < 1e-6
    assert xl.crossover_length(T, [1, 1, 1, 1], [2, 2, 2, 2]) == math.inf
    assert xl.crossover_length(T, [2, 2, 2, 2], [1, 1, 1, 1]) == 64


def test_measure_scaling_returns_medians_inside_their_quartiles():
    m = xl.measure_scaling([16, 32], [8], heads=1, reps=3)
    row = m[8]
    for name in ("softmax", "linear"):
        assert len(row[name]) == 2
        assert all(a <= b <= c for a, b, c in zip(row[f"{name}_q1"], row[name], row[f"{name}_q3"]))
    with pytest.raises(ValueError, match="reps must be >= 1"):
        xl.measure_scaling([16], [8], reps=0)


def test_cost_model_recovers_its_own_law():
    model = {"a0": 1e-6, "a1": 1e-7, "b0": 1e-4, "b1": 1e-7, "L": 64}
    Ts = [64, 128, 256, 512]
    m = {}
    for D in (16, 32, 64):
        s, lin = xl.model_times(model, Ts, D)
        m[D] = {"T": Ts, "softmax": list(s), "linear": list(lin)}
    fitted = xl.cost_model(m)
    for key in ("a0", "a1", "b0", "b1"):
        assert fitted[key] == pytest.approx(model[key], rel=1e-6)
    assert xl.model_crossover(fitted, 64) > xl.model_crossover(fitted, 16)
    with pytest.raises(ValueError, match="lacks 'linear'"):
        xl.cost_model({16: {"T": [1, 2], "softmax": [1, 2]}})
    with pytest.raises(ValueError, match="measurements is empty"):
        xl.check_measurements({})


def test_count_flops_counts_a_matmul_as_2mnk():
    a, b = torch.zeros(3, 5), torch.zeros(5, 7)
    assert xl.count_flops(lambda: a @ b) == 2 * 3 * 5 * 7
