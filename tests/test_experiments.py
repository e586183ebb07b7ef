"""The labs' experiments (attnbook.experiments): counts are exact, fits recover what they fit, the
recall experiment measures the crosstalk it predicts, and the timing helper returns its spread."""

import math

import numpy as np
import pytest
import torch

from attnbook.experiments import linear as xl
from attnbook.experiments._measure import count_flops
from attnbook.experiments.recall import associative_recall


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
    assert count_flops(lambda: a @ b) == 2 * 3 * 5 * 7


def test_normalised_linear_attention_weights_are_a_plan_only_with_positive_features():
    from attnbook.experiments.weights import linear_attention_weights
    g = torch.Generator().manual_seed(0)
    q, k = (0.5 * torch.randn(12, 6, generator=g, dtype=torch.float64) for _ in range(2))
    for fm in ("elu1", "favor+"):
        W = linear_attention_weights(q, k, feature_map=fm).numpy()
        assert np.allclose(W.sum(1), 1, atol=1e-4) and W.min() >= 0
        assert np.allclose(np.triu(W, 1), 0)                              # causal
    W_id = linear_attention_weights(q, k).numpy()
    assert np.allclose(W_id.sum(1), 1, atol=1e-3) and W_id.min() < 0
    # the weights are what the library computes: W @ V equals the output for any V
    from attnlib import linear_attention
    v = torch.randn(1, 1, 12, 3, generator=g, dtype=torch.float64)
    o = linear_attention(q[None, None], k[None, None], v, scale=1.0, feature_map="elu1", normalize=True, causal=True)
    assert np.allclose(linear_attention_weights(q, k, feature_map="elu1") @ v[0, 0], o[0, 0])


def _tiny_report():
    """A report in the shape scripts/kernel_report.py writes, two shapes, made up here."""
    def ln(phase, kernel, nbytes, programs=None):
        return {"phase": phase, "kind": "triton", "kernel": kernel, "bytes": nbytes, "programs": programs}
    launches = {
        "attnlib|linear|1x2x64x16|sm_90": {"launches": [ln("fwd", "a_fwd", 640, 4), ln("bwd", "a_bwd", 1280, 8)]},
        "fla|linear|1x2x64x16|sm_90": {"launches": [ln("fwd", "f1", 512), ln("fwd", "f2", 512), ln("bwd", "f3", 2048)]},
        "attnlib|linear|2x2x32x16|sm_90": {"launches": [ln("fwd", "a_fwd", 640), ln("bwd", "a_bwd", 1280)]},
        "fla|linear|2x2x32x16|sm_90": {"launches": [ln("fwd", "f1", 1024), ln("bwd", "f3", 2048)]},
    }
    rows = [{"op": "linear", "target": "sm_90", "pass": "fwd", "shape": {"B": 1, "H": 2, "T": 64, "D": 16},
             "attnlib": {"bytes": 640}, "anchor": {"name": "fla", "bytes": 1024}, "ratio": 0.625}]
    return {"launches": launches, "rows": rows, "shapes": ["1x2x64x16", "2x2x32x16"], "ops": ["linear"]}


def test_launch_bytes_are_read_per_launch_and_per_pass():
    from attnbook.experiments import kernels as xk

    r = _tiny_report()
    got = xk.launches(r, "fla", "linear", "1x2x64x16")
    assert [(x.phase, x.kernel, x.bytes) for x in got] == [("fwd", "f1", 512), ("fwd", "f2", 512), ("bwd", "f3", 2048)]
    assert xk.pass_bytes(r, "fla", "linear", "1x2x64x16") == {"fwd": 1024, "bwd": 2048}
    assert xk.ratio_rows(r, "linear") == [{"shape": "1x2x64x16", "pass": "fwd", "attnlib": 640, "anchor": 1024,
                                           "ratio": 0.625, "anchor_name": "fla"}]
    with pytest.raises(KeyError, match="no capture"):
        xk.launches(r, "attnlib", "delta", "1x2x64x16")
