"""The figures hold what their captions promise: one frame per slider step, plans whose marginals
are right, and a causal variant that is lower-triangular."""

import numpy as np
import pytest
import torch

from attnlib import widgets


def test_transport_plan_figure_has_a_frame_per_eps_and_correct_marginals():
    g = torch.Generator().manual_seed(0)
    C = torch.randn(5, 7, generator=g, dtype=torch.float64)
    eps = [0.1, 1.0, 10.0]
    fig = widgets.transport_plan_figure(C, eps)
    assert len(fig.frames) == 3 and len(fig.layout.sliders[0].steps) == 3
    for fr in fig.frames:
        one, one_rows, one_cols, two, two_rows, two_cols = fr.data
        assert np.allclose(np.asarray(one_rows.x), 1.0)              # each query ships unit mass
        assert np.allclose(np.asarray(two_cols.y), 5 / 7, atol=1e-6)  # Sinkhorn: balanced columns
        assert np.allclose(np.asarray(one.z).sum(1), 1.0)
    # lower temperature concentrates the one-sided plan
    assert np.asarray(fig.frames[0].data[0].z).max() > np.asarray(fig.frames[2].data[0].z).max()


def test_attention_map_figure_causal_trace_is_lower_triangular():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    fig = widgets.attention_map_figure(q, k, [0.5, 2.0])
    causal = np.asarray(fig.data[1].z)
    assert np.allclose(np.triu(causal, 1), 0) and np.allclose(causal.sum(1), 1)
    assert len(fig.layout.updatemenus[0].buttons) == 2


def test_explorers_build_and_respond():
    pytest.importorskip("ipywidgets")
    C = torch.randn(3, 4, dtype=torch.float64)
    box = widgets.transport_plan_explorer(C)
    slider, fig = box.children
    before = np.asarray(fig.data[0].z).copy()
    slider.value = 0.05
    assert not np.allclose(before, np.asarray(fig.data[0].z))


def test_widget_inputs_are_validated():
    with pytest.raises(ValueError, match="expected a \\[Nq, Nk\\] cost matrix"):
        widgets.transport_plan_figure(torch.zeros(3), [1.0])
    with pytest.raises(ValueError, match="eps_values"):
        widgets.transport_plan_figure(torch.zeros(2, 2), [0.0])
    with pytest.raises(ValueError, match="to match q"):
        widgets.attention_map_figure(torch.zeros(3, 2), torch.zeros(3, 4), [1.0])


# --- chapter 3 ------------------------------------------------------------------------------------

def test_crossover_figure_band_and_explorer_follow_the_measurements():
    pytest.importorskip("ipywidgets")
    from attnlib.experiments import linear as xl
    from attnlib.widgets import linear as lw
    m = {16: {"T": [64, 128, 256], "softmax": [1, 4, 16], "linear": [2, 4, 8],
              "softmax_q1": [0.9, 3.8, 15], "softmax_q3": [1.1, 4.2, 17],
              "linear_q1": [1.9, 3.9, 7.5], "linear_q3": [2.1, 4.1, 8.5]},
         64: {"T": [64, 128, 256], "softmax": [4, 16, 64], "linear": [16, 32, 64],
              "softmax_q1": [4, 16, 64], "softmax_q3": [4, 16, 64],
              "linear_q1": [16, 32, 64], "linear_q3": [16, 32, 64]}}
    fig = lw.crossover_figure(m)
    assert len(fig.frames) == 2
    names = [t.name for t in fig.frames[0].data]
    assert any("quartiles" in n for n in names) and any("slope 2.00" in n for n in names)
    assert fig.frames[0].data[-1].x[0] == pytest.approx(128)
    model = xl.cost_model(m)
    box = lw.crossover_explorer(model)
    (d_slider, _t), fig_w = box.children[0].children, box.children[1]
    before = list(fig_w.data[0].y)
    d_slider.value = 256
    assert list(fig_w.data[0].y) != before
    with pytest.raises(ValueError, match="lacks 'linear'"):
        lw.crossover_figure({16: {"T": [1, 2], "softmax": [1, 2]}})


# --- chapter 4 ------------------------------------------------------------------------------------

def test_deltanet_figures_have_a_frame_per_step_and_show_the_stability_edge():
    from attnlib.widgets import deltanet as wdn
    g = torch.Generator().manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(30, 6, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(30, 4, generator=g, dtype=torch.float64)
    S_lin = wdn.state_trajectory(k, v, 1.0, rule="linear")
    torch.testing.assert_close(S_lin[-1], v.T @ k)                   # S_T = sum_t v_t k_t^T
    fig = wdn.singular_values_figure(k, v, 1.0, steps=[1, 10, 30])
    assert len(fig.frames) == 3 and len(fig.layout.sliders[0].steps) == 3
    fig = wdn.stability_figure(betas=(1.0, 2.5), T=120, D=8)
    assert len(fig.frames) == 2
    ok, bad = (max(fr.data[0].y) for fr in fig.frames)
    assert ok < 10 < 1e3 < bad
    with pytest.raises(ValueError, match="rule must be"):
        wdn.state_trajectory(k, v, 1.0, rule="softmax")


# --- the transport thread: weights beside softmax's plan ------------------------------------------

def test_weights_comparison_figure_has_a_frame_per_step_and_validates_panels():
    W = np.eye(4)
    steps = [{"softmax": W, "other": -W}, {"softmax": W, "other": 2 * W}]
    fig = widgets.weights_comparison_figure(steps, ["a", "b"], prefix="x = ", title="t")
    assert len(fig.frames) == 2 and len(fig.data) == 2
    assert "min -1.00" in fig.frames[0].layout.title.text and "row sums 2.00..2.00" in fig.frames[1].layout.title.text
    assert fig.data[0].zmin == -2.0 and fig.data[0].zmax == 2.0          # one symmetric scale for all
    with pytest.raises(ValueError, match="expected \\['softmax', 'other'\\]"):
        widgets.weights_comparison_figure([steps[0], {"softmax": W}], ["a", "b"], prefix="", title="")
    with pytest.raises(ValueError, match="finite"):
        widgets.weights_comparison_figure([{"a": np.full((2, 2), np.nan)}], ["a"], prefix="", title="")
    with pytest.raises(ValueError, match="zmax must be a finite number > 0"):
        widgets.weights_comparison_figure(steps, ["a", "b"], prefix="", title="", zmax=0.0)


def test_normalised_linear_attention_weights_are_a_plan_only_with_positive_features():
    from attnlib.widgets import linear as lw
    g = torch.Generator().manual_seed(0)
    q, k = (0.5 * torch.randn(12, 6, generator=g, dtype=torch.float64) for _ in range(2))
    for fm in ("elu1", "favor+"):
        W = lw.linear_attention_weights(q, k, feature_map=fm)
        assert np.allclose(W.sum(1), 1, atol=1e-4) and W.min() >= 0
        assert np.allclose(np.triu(W, 1), 0)                              # causal
    W_id = lw.linear_attention_weights(q, k)
    assert np.allclose(W_id.sum(1), 1, atol=1e-3) and W_id.min() < 0
    # the weights are what the library computes: W @ V equals the output for any V
    from attnlib import linear_attention
    v = torch.randn(1, 1, 12, 3, generator=g, dtype=torch.float64)
    o = linear_attention(q[None, None], k[None, None], v, scale=1.0, feature_map="elu1", normalize=True)
    assert np.allclose(lw.linear_attention_weights(q, k, feature_map="elu1") @ v[0, 0].numpy(), o[0, 0].numpy())


def test_delta_rule_implied_weights_match_su_and_turn_negative_on_non_negative_input():
    from attnlib.widgets import deltanet as wdn
    g = torch.Generator().manual_seed(1)
    T = 10
    q = torch.nn.functional.normalize(torch.rand(T, 5, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.rand(T, 5, generator=g, dtype=torch.float64), dim=-1)
    W = wdn.implied_weights(q, k, 1.0)
    su = (q @ k.T).tril() @ torch.linalg.inv(torch.eye(T, dtype=torch.float64) + (k @ k.T).tril(-1))
    assert np.allclose(W, su.numpy(), atol=1e-12)
    assert (q @ k.T).min() >= 0 and W.min() < 0                          # not a plan
    with pytest.raises(ValueError, match="both be \\[T, D\\]"):
        wdn.implied_weights(q, k[:5], 1.0)


def test_lab_glue_is_silent_in_the_notebook(capsys):
    from attnlib.lab import setup
    lab = setup(seed=0)
    lab.glue("x", 1.5)
    import plotly.graph_objects as go
    lab.glue_figure("f", go.Figure(go.Scatter(y=[1, 2])), plotlyjs=False)
    assert capsys.readouterr().out == ""


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
    from attnlib.experiments import kernels as xk

    r = _tiny_report()
    got = xk.launches(r, "fla", "linear", "1x2x64x16")
    assert [(x.phase, x.kernel, x.bytes) for x in got] == [("fwd", "f1", 512), ("fwd", "f2", 512), ("bwd", "f3", 2048)]
    assert xk.pass_bytes(r, "fla", "linear", "1x2x64x16") == {"fwd": 1024, "bwd": 2048}
    assert xk.ratio_rows(r, "linear") == [{"shape": "1x2x64x16", "pass": "fwd", "attnlib": 640, "anchor": 1024,
                                           "ratio": 0.625, "anchor_name": "fla"}]
    with pytest.raises(KeyError, match="no capture"):
        xk.launches(r, "attnlib", "delta", "1x2x64x16")


def test_launch_bytes_figure_stacks_launches_per_token_and_head_with_a_step_per_shape():
    from attnlib.experiments import kernels as xk
    from attnlib.widgets.kernels import launch_bytes_figure

    r = _tiny_report()
    per_shape = {s: {lib: xk.launches(r, lib, "linear", s) for lib in ("attnlib", "fla")} for s in r["shapes"]}
    fig = launch_bytes_figure(per_shape, title="t")
    assert [f.name for f in fig.frames] == r["shapes"]
    assert len({len(f.data) for f in fig.frames}) == 1                       # padded: every step replaces every trace
    first = [(t.x[0], t.y[0]) for t in fig.frames[0].data if t.x[0] is not None]
    # forward bars first (attnlib, then fla), heights in bytes per (batch, head, token): 1 x 2 x 64 = 128 rows
    assert first == [("attnlib fwd", 5.0), ("fla fwd", 4.0), ("fla fwd", 4.0), ("attnlib bwd", 10.0), ("fla bwd", 16.0)]
    second = [(t.x[0], t.y[0]) for t in fig.frames[1].data if t.x[0] is not None]
    assert second == [("attnlib fwd", 5.0), ("fla fwd", 8.0), ("attnlib bwd", 10.0), ("fla bwd", 16.0)]


# ------------------------------------------------- slider steps that change size keep showing all of it
#
# A slider step (Plotly.animate) replaces traces and applies the frame's own ``layout``; it does not
# re-autorange the axes. A step is shown whole only if the range in force for it -- the frame's own,
# else the figure's, else the autorange of the data the figure opened with -- covers its data.

def _extent(values):
    v = [x for x in values if x is not None]
    if any(isinstance(x, str) for x in v):               # categorical: positions 0 .. n-1
        return 0.0, float(len(v) - 1)
    v = [float(x) for x in v]
    return min(v), max(v)


def _range_in_force(fig, frame, axis, opening):
    """``opening``: the range Plotly's autorange gives the data the figure opens with."""
    own = frame.layout[axis].range if frame.layout is not None else None
    if own is not None:
        return tuple(own)
    if fig.layout[axis].range is not None:
        return tuple(fig.layout[axis].range)
    return tuple(opening)                                # autorange of the opening data, kept for every step


def _heatmap_columns(trace):
    n = np.asarray(trace.z).shape[1]
    return list(range(n)) if trace.x is None else list(trace.x)


def test_plucker_features_figure_shows_every_column_of_every_step():
    from attnlib.grassmann import pair_indices
    from attnlib.widgets.grassmann import features_figure
    fig = features_figure(torch.randn(10, 6, dtype=torch.float64), [3, 6], [1, 4])
    opening = _extent(_heatmap_columns(fig.data[0]))
    for fr in fig.frames:
        (hm,) = fr.data
        cols = _heatmap_columns(hm)
        r = int(fr.name.split(",")[0].removeprefix("r="))
        assert len(cols) == np.asarray(hm.z).shape[1] == len(pair_indices(r)[0])
        lo, hi = _extent(cols)
        shown = _range_in_force(fig, fr, "xaxis", (opening[0] - 0.5, opening[1] + 0.5))
        assert shown[0] <= lo - 0.5 and shown[1] >= hi + 0.5, f"{fr.name}: x-range {shown} misses columns"
    for fr in fig.frames:                                # each column is labelled with its pair (i, j)
        i, j = pair_indices(int(fr.name.split(",")[0].removeprefix("r=")))
        assert list(fr.layout.xaxis.ticktext) == [f"({a},{b})" for a, b in zip(i.tolist(), j.tolist())]


def test_launch_bytes_figure_axes_cover_every_step():
    from attnlib.experiments.kernels import Launch
    from attnlib.widgets.kernels import launch_bytes_figure
    per_shape = {"1x1x8x4": {"attnlib": [Launch("fwd", "a", 80, None)]},
                 "1x1x8x8": {"attnlib": [Launch("fwd", "a", 800, None), Launch("bwd", "b", 400, None)]}}
    fig = launch_bytes_figure(per_shape, title="t")

    def stacks(data):
        out = {}
        for t in data:
            if t.x[0] is not None:
                out[t.x[0]] = out.get(t.x[0], 0.0) + t.y[0]
        return out

    first = stacks(fig.data)
    for fr in fig.frames:
        st = stacks(fr.data)
        y = _range_in_force(fig, fr, "yaxis", (0.0, max(first.values())))
        assert y[0] <= 0 and y[1] >= max(st.values()), fr.name
        x = _range_in_force(fig, fr, "xaxis", (-0.5, len(first) - 0.5))
        assert x[1] - x[0] >= len(st), fr.name                      # every bar of the step has a slot
        assert set(st) <= set(fig.layout.xaxis.categoryarray or first)


def test_crossover_figure_x_range_covers_every_head_dim():
    from attnlib.widgets import linear as lw
    m = {16: {"T": [64, 128, 256], "softmax": [1, 4, 16], "linear": [2, 4, 8]},
         64: {"T": [256, 1024, 4096], "softmax": [16, 256, 4096], "linear": [8, 32, 128]}}
    fig = lw.crossover_figure(m)

    def extent(data):
        return _extent([x for t in data if t.x is not None for x in t.x])

    opening = np.log10(extent(fig.data))                 # log axis: the range is in log10 units
    for fr in fig.frames:
        lo, hi = extent(fr.data)
        x = _range_in_force(fig, fr, "xaxis", opening)
        assert 10 ** x[0] <= lo and 10 ** x[1] >= hi, fr.name


# --- every chapter's mechanism map beside softmax's plan ---------------------------------------

def _check_map_figure(fig, mechanism, n_steps, axes):
    """One frame per slider step, each frame naming the range of every listed axis (nothing rides on
    the first frame's), and the marker the browser check looks for."""
    assert len(fig.frames) == len(fig.layout.sliders[0].steps) == n_steps
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == [fr.name for fr in fig.frames]
    for fr in fig.frames:
        for ax in axes:
            assert fr.layout[ax].range is not None, f"{fr.name}: {ax} has no range of its own"
    assert fig.layout.meta == {"mechanism_map": mechanism}
    assert fig.layout.title.text


def test_gate_weights_figure_steps_over_the_gate_and_keeps_the_plan():
    from attnlib import deltanet, softmax_attention
    from attnlib.widgets.deltanet import gate_weights_figure
    g = torch.Generator().manual_seed(2)
    T = 8
    q = torch.nn.functional.normalize(torch.rand(T, 4, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.rand(T, 4, generator=g, dtype=torch.float64), dim=-1)
    plan = softmax_attention(q[None, None], k[None, None], torch.eye(T, dtype=torch.float64)[None, None],
                             causal=True)[0, 0]
    alphas = [1.0, 0.8, 0.5]
    Ws = [deltanet.implied_weights(q, k, 1.0, np.log(a)) for a in alphas]
    fig = gate_weights_figure(plan, Ws, alphas, beta=1.0, active=1)
    _check_map_figure(fig, "Gated DeltaNet", 3, ["xaxis", "yaxis", "xaxis2", "yaxis2"])
    assert np.allclose(np.asarray(fig.data[0].z).sum(1), 1, atol=1e-6)          # the plan, in float32
    for fr, W in zip(fig.frames, Ws):
        assert list(fr.traces) == [1] and np.allclose(np.asarray(fr.data[0].z), W.numpy(), atol=1e-6)
    # its own colour scale per panel: the plan's starts at 0, the weights' is centred on 0 for every step
    assert fig.data[0].zmin == 0 and fig.data[1].zmin == -fig.data[1].zmax
    assert fig.data[1].zmax >= max(float(W.abs().max()) for W in Ws)
    with pytest.raises(ValueError, match="one weight matrix per gate value"):
        gate_weights_figure(plan, Ws, alphas[:2], beta=1.0)


def test_gated_implied_weights_reach_deltanet_and_the_diagonal_at_the_gate_limits():
    from attnlib import deltanet
    from attnlib.widgets import deltanet as wdn
    g = torch.Generator().manual_seed(3)
    q, k = (torch.nn.functional.normalize(torch.randn(9, 4, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    assert torch.allclose(deltanet.implied_weights(q, k, 0.7), torch.from_numpy(wdn.implied_weights(q, k, 0.7)))
    assert torch.allclose(deltanet.implied_weights(q, k, 0.7, 0.0), deltanet.implied_weights(q, k, 0.7))
    tiny = deltanet.implied_weights(q, k, 0.7, np.log(1e-12))
    assert torch.allclose(tiny, torch.diag(0.7 * (q * k).sum(1)), atol=1e-9)
    # o = W v for any v: the weights are what the layer computes
    v = torch.randn(1, 1, 9, 3, generator=g, dtype=torch.float64)
    gate = torch.full((1, 1, 9), np.log(0.8), dtype=torch.float64)
    o, _ = deltanet.delta_rule_recurrent_reference(q[None, None], k[None, None], v,
                                                   torch.full((1, 1, 9), 0.7, dtype=torch.float64), gate, scale=1.0)
    assert torch.allclose(deltanet.implied_weights(q, k, 0.7, np.log(0.8)) @ v[0, 0], o[0, 0])


def test_needle_maps_figure_has_a_step_per_algorithm_and_the_exact_plan():
    from attnlib import needle
    from attnlib.widgets.needle import needle_maps_figure
    algos = [needle.make(n, T=32, d=8, seed=0) for n in ("sliding_window", "performer", "linformer")]
    fig = needle_maps_figure(algos, M=40.0)
    _check_map_figure(fig, "subquadratic attention algorithms", 3, ["xaxis", "yaxis", "xaxis2", "yaxis2", "yaxis3"])
    for algo, fr in zip(algos, fig.frames):
        case = needle.attack(algo, M=40.0)
        exact, got = np.asarray(fr.data[0].z), np.asarray(fr.data[1].z)
        assert np.allclose(exact, needle.exact_rows(case).numpy(), atol=1e-6)
        assert np.allclose(got, needle.algorithm_rows(algo, case).numpy(), atol=1e-6)
        assert exact.dtype == np.float32                                          # page weight
        on_j, rest = (np.asarray(b.y) for b in fr.data[4:6])                     # where row i's mass goes
        assert np.allclose(on_j + rest, 1, atol=1e-5)
        assert on_j[0] == pytest.approx(needle.needle_mass(32, 40.0), abs=1e-6) and on_j[1] <= 8 / 32 + 1e-6
    with pytest.raises(ValueError, match="share one T"):
        needle_maps_figure([algos[0], needle.make("strided", T=40, d=8)])


def test_algorithm_rows_are_what_row_error_compares():
    from attnlib import needle
    algo = needle.make("strided", T=36, d=8, seed=1)
    case = needle.attack(algo, M=20.0)
    rows = needle.algorithm_rows(algo, case)
    assert rows.shape == (36, 36) and rows.dtype == torch.float64
    by_hand = float((needle.exact_rows(case)[case.i] - rows[case.i]).abs().sum())
    assert needle.row_error(algo, case) == pytest.approx(by_hand)


def test_plane_mixing_figure_steps_over_the_offsets_of_one_position():
    from attnlib import softmax_attention
    from attnlib.experiments import grassmann as gx
    from attnlib.grassmann import CausalGrassmannMixing
    from attnlib.widgets.grassmann import plane_mixing_figure
    torch.manual_seed(0)
    offsets, L, t = (1, 2, 4, 8), 12, 6                         # offset 8 has no partner at t = 6
    layer = CausalGrassmannMixing(5, 3, offsets).double()
    h = torch.randn(1, L, 5, dtype=torch.float64)
    pt = gx.pair_terms(layer, h, t)
    assert pt["offsets"] == [1, 2, 4] and pt["partners"] == [5, 4, 2]
    assert torch.allclose(pt["terms"].sum(0) + pt["bias"], pt["signal"], atol=1e-12)
    z = pt["z"]
    plan = softmax_attention(z[None, None], z[None, None], torch.eye(L, dtype=torch.float64)[None, None],
                             causal=True)[0, 0]
    paired = gx.pairing_pattern(L, offsets)
    assert paired.sum(1).tolist() == gx.valid_counts(L, offsets).tolist() and not paired.triu().any()
    fig = plane_mixing_figure(pt, t, plan, paired, active=2)
    _check_map_figure(fig, "Grassmann mixing", 3, ["xaxis3", "yaxis3", "xaxis4", "yaxis4", "yaxis", "yaxis2"])
    for k, fr in enumerate(fig.frames):
        assert fr.layout.scene.xaxis.range is not None                         # the 3-D box is fixed too
        bars = [d for d in fr.data if d.type == "bar"]
        assert np.allclose(np.asarray(bars[0].y), pt["features"][k].numpy())
        assert np.allclose(np.asarray(bars[1].y), pt["terms"][k].numpy())
        (marker,) = [d for d in fr.data if d.type == "scatter"]
        assert list(marker.x) == [pt["partners"][k]] and list(marker.y) == [t]
        assert max(fr.traces) < len(fig.data)
    with pytest.raises(ValueError, match="planes of R\\^3"):
        plane_mixing_figure({**pt, "z": torch.zeros(L, 4)}, t, plan, paired)
    with pytest.raises(ValueError, match="causal pairing"):
        gx.pair_terms(CausalGrassmannMixing(5, 3, offsets, pairing="paper"), h.float(), t)
