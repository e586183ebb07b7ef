"""The figures hold what their captions promise: one frame per slider step, plans whose marginals
are right, and a causal variant that is lower-triangular."""

import numpy as np
import pytest
import torch

from attnbook import widgets
from attnbook.experiments import eot as xe

from .test_experiments import _tiny_report  # the same made-up kernel report the reader is tested on


def test_transport_plan_figure_has_a_frame_per_eps_and_correct_marginals():
    g = torch.Generator().manual_seed(0)
    C = torch.randn(5, 7, generator=g, dtype=torch.float64)
    eps = [0.1, 1.0, 10.0]
    fig = widgets.transport_plan_figure(xe.transport_plans(C, eps))
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
    maps = xe.attention_maps(q, k, [0.5, 2.0])
    assert (maps[0].masked == np.triu(np.ones((6, 6), dtype=bool), 1)).all()
    fig = widgets.attention_map_figure(maps)
    causal = np.asarray(fig.data[1].z)
    assert np.allclose(np.triu(causal, 1), 0) and np.allclose(causal.sum(1), 1)
    assert len(fig.layout.updatemenus[0].buttons) == 2
    # masked cells: a grey layer over the causal map (NaN, transparent, where the query may look)
    from attnbook.widgets._style import MASKED_COLOUR, MASKED_NOTE
    mask = fig.data[2]
    assert np.array_equal(np.isnan(np.asarray(mask.z, dtype=float)), ~maps[0].masked)
    assert {c for _, c in mask.colorscale} == {MASKED_COLOUR} and mask.showscale is False
    full, causal_button = fig.layout.updatemenus[0].buttons
    assert causal_button.args[0]["visible"] == [False, True, True] and full.args[0]["visible"] == [True, False, False]
    assert causal_button.args[1]["title.subtitle.text"] == MASKED_NOTE
    assert all(len(fr.data) == 2 for fr in fig.frames)           # the mask does not change with τ
    rect = xe.attention_map(torch.randn(3, 4), torch.randn(5, 4), 1.0)
    assert rect.causal is None and rect.masked is None


def test_explorers_build_and_respond():
    pytest.importorskip("ipywidgets")
    C = torch.randn(3, 4, dtype=torch.float64)
    box = widgets.transport_plan_explorer(lambda eps: xe.plan_pair(C, eps))
    slider, fig = box.children
    before = np.asarray(fig.data[0].z).copy()
    slider.value = 0.05
    assert not np.allclose(before, np.asarray(fig.data[0].z))
    q, k = torch.randn(4, 3), torch.randn(4, 3)
    box = widgets.attention_explorer(lambda tau: xe.attention_map(q, k, tau))
    (_tau, causal), fig = box.children[0].children, box.children[1]
    causal.value = True
    assert np.allclose(np.triu(np.asarray(fig.data[0].z), 1), 0)


def test_widget_inputs_are_validated():
    with pytest.raises(ValueError, match="expected a \\[Nq, Nk\\] cost matrix"):
        xe.transport_plans(torch.zeros(3), [1.0])
    with pytest.raises(ValueError, match="eps_values"):
        xe.transport_plans(torch.zeros(2, 2), [0.0])
    with pytest.raises(ValueError, match="to match q"):
        xe.attention_maps(torch.zeros(3, 2), torch.zeros(3, 4), [1.0])
    with pytest.raises(ValueError, match="plans must hold at least one"):
        widgets.transport_plan_figure([])
    with pytest.raises(TypeError, match="maps\\[0\\] must be an attnbook.experiments.eot.AttentionMap"):
        widgets.attention_map_figure([torch.zeros(2, 2)])


# --- chapter 3 ------------------------------------------------------------------------------------

def test_crossover_figure_band_and_explorer_follow_the_measurements():
    pytest.importorskip("ipywidgets")
    from attnbook.experiments import linear as xl
    from attnbook.widgets import linear as lw
    m = {16: {"T": [64, 128, 256], "softmax": [1, 4, 16], "linear": [2, 4, 8],
              "softmax_q1": [0.9, 3.8, 15], "softmax_q3": [1.1, 4.2, 17],
              "linear_q1": [1.9, 3.9, 7.5], "linear_q3": [2.1, 4.1, 8.5]},
         64: {"T": [64, 128, 256], "softmax": [4, 16, 64], "linear": [16, 32, 64],
              "softmax_q1": [4, 16, 64], "softmax_q3": [4, 16, 64],
              "linear_q1": [16, 32, 64], "linear_q3": [16, 32, 64]}}
    fig = lw.crossover_figure(xl.crossover_fits(m))
    assert len(fig.frames) == 2
    names = [t.name for t in fig.frames[0].data]
    assert any("quartiles" in n for n in names) and any("slope 2.00" in n for n in names)
    assert fig.frames[0].data[-1].x[0] == pytest.approx(128)
    model = xl.cost_model(m)
    box = lw.crossover_explorer(lambda T, D: xl.model_prediction(model, T, D))
    (d_slider, _t), fig_w = box.children[0].children, box.children[1]
    before = list(fig_w.data[0].y)
    d_slider.value = 256
    assert list(fig_w.data[0].y) != before
    with pytest.raises(ValueError, match="lacks 'linear'"):
        xl.crossover_fits({16: {"T": [1, 2], "softmax": [1, 2]}})


# --- chapter 4 ------------------------------------------------------------------------------------

def test_deltanet_figures_have_a_frame_per_step_and_show_the_stability_edge():
    from attnbook.widgets import deltanet as wdn
    g = torch.Generator().manual_seed(0)
    k = torch.nn.functional.normalize(torch.randn(30, 6, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(30, 4, generator=g, dtype=torch.float64)
    from attnbook.experiments.recall import state_trajectory
    S_lin = state_trajectory(k, v, 1.0, rule="linear")
    torch.testing.assert_close(S_lin[-1], v.T @ k)                   # S_T = sum_t v_t k_t^T
    from attnbook.experiments import deltanet as xd
    fig = wdn.singular_values_figure(xd.state_spectra(k, v, 1.0), steps=[1, 10, 30])
    assert len(fig.frames) == 3 and len(fig.layout.sliders[0].steps) == 3
    fig = wdn.stability_figure(xd.stability_histories(betas=(1.0, 2.5), T=120, D=8))
    assert len(fig.frames) == 2
    ok, bad = (max(fr.data[0].y) for fr in fig.frames)
    assert ok < 10 < 1e3 < bad
    with pytest.raises(ValueError, match="rule must be"):
        state_trajectory(k, v, 1.0, rule="softmax")


# --- the transport thread: weights beside softmax's plan ------------------------------------------

def test_weights_comparison_figure_has_a_frame_per_step_and_validates_panels():
    W = np.eye(4)
    steps = [{"softmax": W, "other": -W}, {"softmax": W, "other": 2 * W}]
    fig = widgets.weights_comparison_figure(steps, ["a", "b"], prefix="x = ", title="t")
    assert len(fig.frames) == 2 and len(fig.data) == 2
    sub = [fr.layout.title.subtitle.text for fr in fig.frames]
    assert "smallest −1.00" in sub[0] and "row sums 2.00 to 2.00" in sub[1]
    # each panel its own scale over the steps: a plan (all >= 0) from 0 in the plan's colours, a signed
    # panel symmetric about 0 on the diverging scale, spanning its largest |entry| -- and said so
    from attnbook.widgets._style import DIVERGING_SCALE, PLAN_SCALE
    axes = [fig.layout[t.coloraxis] for t in fig.data]
    assert [a.cmax for a in axes] == [1.0, 2.0] and [a.cmin for a in axes] == [0.0, -2.0]
    assert axes[0].colorscale == fig.update_layout(coloraxis_colorscale=PLAN_SCALE).layout.coloraxis.colorscale
    assert axes[1].cmid == 0.0 and "signed" in axes[1].colorbar.title.text
    assert "signed" not in axes[0].colorbar.title.text
    assert DIVERGING_SCALE != PLAN_SCALE
    capped = widgets.weights_comparison_figure(steps, ["a", "b"], prefix="", title="t", zmax={"other": 1.5})
    assert [capped.layout[t.coloraxis].cmax for t in capped.data] == [1.0, 1.5]
    with pytest.raises(ValueError, match="expected \\['softmax', 'other'\\]"):
        widgets.weights_comparison_figure([steps[0], {"softmax": W}], ["a", "b"], prefix="", title="")
    with pytest.raises(ValueError, match="finite"):
        widgets.weights_comparison_figure([{"a": np.full((2, 2), np.nan)}], ["a"], prefix="", title="")
    with pytest.raises(ValueError, match="zmax must be a finite number > 0"):
        widgets.weights_comparison_figure(steps, ["a", "b"], prefix="", title="", zmax=0.0)


def test_launch_bytes_figure_stacks_launches_per_token_and_head_with_a_step_per_shape():
    from attnbook.experiments import kernels as xk
    from attnbook.widgets.kernels import launch_bytes_figure

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
    from attnbook.experiments.grassmann import plucker_feature_maps
    from attnbook.widgets.grassmann import features_figure
    from attnlib.grassmann import pair_indices
    fig = features_figure(plucker_feature_maps(torch.randn(10, 6, dtype=torch.float64), [3, 6], [1, 4]))
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
    from attnbook.experiments.kernels import Launch
    from attnbook.widgets.kernels import launch_bytes_figure
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
    from attnbook.experiments import linear as xl
    from attnbook.widgets import linear as lw
    m = {16: {"T": [64, 128, 256], "softmax": [1, 4, 16], "linear": [2, 4, 8]},
         64: {"T": [256, 1024, 4096], "softmax": [16, 256, 4096], "linear": [8, 32, 128]}}
    fig = lw.crossover_figure(xl.crossover_fits(m))

    def extent(data):
        return _extent([x for t in data if t.x is not None for x in t.x])

    opening = np.log10(extent(fig.data))                 # log axis: the range is in log10 units
    for fr in fig.frames:
        lo, hi = extent(fr.data)
        x = _range_in_force(fig, fr, "xaxis", opening)
        assert 10 ** x[0] <= lo and 10 ** x[1] >= hi, fr.name


# ------------------------------------------------------------------------- every figure reads at a glance
#
# One builder per figure-drawing function, on small inputs; the checks below hold for all of them:
# the book's template, a title, titled axes, a legend outside the plot (and under the slider), one
# readable label per slider step, subplot titles that fit over their panels, and slider steps whose
# data lies inside the axis ranges in force.

def _figure_builders():
    from attnbook.experiments import anna as xa
    from attnbook.experiments import deltanet as xd
    from attnbook.experiments import grassmann as xg
    from attnbook.experiments import linear as xl
    from attnbook.experiments import needle
    from attnbook.experiments.kernels import Launch
    from attnbook.experiments.weights import softmax_weights
    from attnbook.widgets import anna as wa
    from attnbook.widgets import deltanet as wdn
    from attnbook.widgets import grassmann as wg
    from attnbook.widgets import hybrid as wh
    from attnbook.widgets import kernels as wk
    from attnbook.widgets import linear as lw
    from attnbook.widgets import needle as nw
    from attnlib.deltanet import implied_weights
    from attnlib.grassmann import CausalGrassmannMixing

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    keys = torch.nn.functional.normalize(k, dim=-1)
    algos = [needle.make(n, T=64, d=8) for n in needle.ALGORITHMS]
    W = softmax_weights(q, k, causal=True).numpy()
    m = {16: {"T": [64, 128, 256], "softmax": [1, 4, 16], "linear": [2, 4, 8]},
         64: {"T": [256, 1024, 4096], "softmax": [16, 256, 4096], "linear": [8, 32, 128]}}
    per_shape = {"1x1x8x4": {"attnlib": [Launch("fwd", "a", 80, None)]},
                 "1x1x8x8": {"attnlib": [Launch("fwd", "a", 800, None), Launch("bwd", "b", 400, None)]}}
    summary = {"softmax": {"anna_error_mean": torch.rand(2, 2, generator=g), "anna_error_std": torch.zeros(2, 2),
                           "surrogate_error": (0.1, 0.01), "n_seeds": 2}}
    return {
        "transport_plan": lambda: widgets.transport_plan_figure(
            xe.transport_plans(torch.randn(5, 7, generator=g), [0.1, 1.0, 10.0])),
        "attention_map": lambda: widgets.attention_map_figure(xe.attention_maps(q, k, [0.5, 2.0])),
        "weights_comparison": lambda: widgets.weights_comparison_figure(
            [{"softmax (the plan)": W, "delta rule, implied weights": implied_weights(q, k, b).numpy()}
             for b in (0.5, 1.0)], ["0.5", "1"],
            prefix="β = ", title="weights"),
        "probe_map": lambda: nw.probe_map_figure(needle.probe_maps(algos)),
        "row_vs_M": lambda: nw.row_vs_M_figure(needle.rows_vs_M(algos[0], [1, 10, 100])),
        "error_curves": lambda: nw.error_curves_figure([1, 10], {"a": [0, 1], "b": [1, 2]}, x_title="M"),
        "error_vs_M_by_T": lambda: nw.error_vs_M_by_T_figure([32, 64], [1, 10], {32: {"a": [0, 1]}, 64: {"a": [1, 2]}}),
        "work": lambda: nw.work_figure([32, 64], {"a": [10, 40]}),
        "curves": lambda: widgets.curves_figure({"a": ([1, 2], [3, 4]), "b": ([1, 3], [2, 2])}, title="c",
                                                x_title="x (s)", y_title="y (m)", log_x=True),
        "state_buildup": lambda: lw.state_buildup_figure(xl.state_buildup(q, k, v[:, :3])),
        "crossover": lambda: lw.crossover_figure(xl.crossover_fits(m)),
        "singular_values": lambda: wdn.singular_values_figure(xd.state_spectra(keys, v, 1.0), steps=[1, 4, 8]),
        "stability": lambda: wdn.stability_figure(xd.stability_histories(betas=(1.0, 2.5), T=40, D=4)),
        "launch_bytes": lambda: wk.launch_bytes_figure(per_shape, title="bytes"),
        "anna_plan": lambda: wa.anna_plan_figure(xa.anna_plans(q, k, [(1, 2), (1, 4), (4, 2), (4, 4)])),
        "collision": lambda: wa.collision_figure([0, 1, 2], {"x": [1, .5, 0]}, {"x": [1, .4, 0]}, title="collisions"),
        "conditions": lambda: wa.conditions_heatmap([1, 2], [3, 4], [[.1, .2], [.3, .4]], title="conditions"),
        "reproduction": lambda: wa.reproduction_figure(summary, [1, 4], [2, 4], title="distilled"),
        "planes": lambda: wg.planes_figure(xg.planes_in_r3([(np.array([1., 0, 0]), np.array([0, 2., 1]))])),
        "needle_maps": lambda: nw.needle_maps_figure(needle.needle_maps(algos[:3], M=40.0)),
        "gate_weights": lambda: wdn.gate_weights_figure(
            W, [implied_weights(q, k, 1.0, np.log(a)).numpy() for a in (1.0, 0.5)], [1.0, 0.5], beta=1.0),
        "plane_mixing": _plane_mixing,
        "pair": lambda: wg.pair_figure(xg.pair_plane(CausalGrassmannMixing(8, reduced_dim=5, offsets=(1, 2)),
                                                     torch.randn(1, 6, 8, generator=g), 5, 2), tokens=list("abcdef")),
        "hybrid_recall": lambda: wh.hybrid_recall_figure(
            {"Gated DeltaNet": {0: [.3, .35], .5: [.8, .9], 1: [1, .98]}, "linear": {0: [.2, .25], 1: [1, .98]}},
            title="recall", chance=1 / 8, ratio_labels={0: "all-linear", 1: "all-softmax"}),
        "hybrid_curves": lambda: wh.hybrid_curves_figure(
            {task: {lr: {"all-linear": [[(0, .1), (25, .2), (50, .3)]] * 2, "1:1": [[(0, .1), (25, .9), (50, 1)]] * 2}
                    for lr in (3e-3, 1e-2, 3e-2)} for task in ("fits", "exceeds")},
            title="MQAR recall while training", chance={"fits": 1 / 8, "exceeds": 1 / 64}),
        "plucker_features": lambda: wg.features_figure(xg.plucker_feature_maps(
            torch.randn(10, 6, generator=g, dtype=torch.float64), [3, 6], [1, 4])),
        "flash_walk": _flash_walk,
        "roofline": _roofline,
        "topk_map": _topk_map,
        "topk_recall": lambda: _topk_widgets().recall_figure([2, 4], {"a": ([.2, .4], [.01, .02])}, title="recall",
                                                             oracle=([.8, .9], [0, 0]), untrained=([.1, .2], [0, 0])),
        "topk_shared": lambda: _topk_widgets().shared_selection_figure(
            [1, 4], {0.0: {"own": [.9, .9], "shared": [.9, .6], "worst_head": [.9, .3]},
                     1.0: {"own": [.9, .9], "shared": [.9, .9], "worst_head": [.9, .9]}}, top_k=8, title="shared"),
    }


def _flash_walk():
    """The walk figure on a hand-made trace (the kernel itself is tested in test_flash_walk.py)."""
    from attnbook.experiments.flash_walk import FlashWalk
    from attnbook.widgets.flash_walk import flash_walk_figure
    g = torch.Generator().manual_seed(1)
    s = torch.randn(4, 12, generator=g, dtype=torch.float64)
    v = torch.randn(12, 3, generator=g, dtype=torch.float64)
    ends = torch.tensor([4, 8, 12])
    m = torch.stack([s[:, :e].max(1).values for e in ends])
    l = torch.stack([torch.exp(s[:, :e] - m[t, :, None]).sum(1) for t, e in enumerate(ends)])  # noqa: E741
    acc = torch.stack([torch.exp(s[:, :e] - m[t, :, None]) @ v[:e] for t, e in enumerate(ends)])
    plans = torch.stack([torch.where(torch.arange(12) < e, torch.exp(s - m[t, :, None]) / l[t, :, None], 0.0)
                         for t, e in enumerate(ends)])
    walk = FlashWalk(rows=torch.arange(4, 8), key_end=ends, m=m, l=l, acc=acc, plans=plans,
                     o=(acc[-1] / l[-1, :, None]).float(), lse=(m[-1] + l[-1].log()).float(), scores=s,
                     block_m=4, block_n=4, causal=False, scale=1.0)
    return flash_walk_figure(walk)


def _roofline():
    from attnbook.experiments.roofline import PEAKS
    from attnbook.widgets.flash_walk import roofline_figure
    points = [dict(op="softmax", shape="1x1x8x4", intensity=900.0), dict(op="linear", shape="1x1x8x4", intensity=40.0)]
    measured = [dict(device="NVIDIA H200", shape="1x1x8x4", dtype="bf16", causal=True, intensity=900.0, tflops=300.0)]
    return roofline_figure(points, [PEAKS["NVIDIA H100"], PEAKS["NVIDIA H200"]], measured)


def _topk_widgets():
    from attnbook.widgets import topk
    return topk


def _topk_map():
    from attnbook.experiments import topk as xt
    m = xt.mechanism_map(10, 4, [1, 3, 10], generator=torch.Generator().manual_seed(0))
    return _topk_widgets().mechanism_map_figure(m["plan"], m["scores"], m["ks"], m["restricted"], m["lost"])


def _plane_mixing():
    from attnbook.experiments import grassmann as gx
    from attnbook.widgets.grassmann import plane_mixing_figure
    from attnlib import softmax_attention
    from attnlib.grassmann import CausalGrassmannMixing
    torch.manual_seed(0)
    offsets, T, t = (1, 2, 4), 10, 6
    h = torch.randn(1, T, 5, dtype=torch.float64)
    pt = gx.pair_terms(CausalGrassmannMixing(5, 3, offsets).double(), h, t)
    eye = torch.eye(T, dtype=torch.float64)[None, None]
    plan = softmax_attention(pt["z"][None, None], pt["z"][None, None], eye, causal=True)[0, 0]
    return plane_mixing_figure(pt, t, plan, gx.pairing_pattern(T, offsets))


FIGURES = sorted(_figure_builders())


@pytest.fixture(scope="module")
def built():
    return {name: make() for name, make in _figure_builders().items()}


def _axes_of(fig):
    """Layout names of the cartesian axes that some trace draws on (``xaxis``, ``yaxis2`` ...)."""
    out = set()
    for t in fig.data:
        if t.type in ("surface", "scatter3d"):
            continue
        for a in ("x", "y"):
            ref = getattr(t, f"{a}axis", None) or a
            out.add(f"{a}axis{ref[1:]}")
    return sorted(out)


@pytest.mark.parametrize("name", FIGURES)
def test_every_figure_is_styled_titled_and_has_titled_axes(built, name):
    import plotly.io as pio

    from attnbook.widgets._style import TEMPLATE
    fig = built[name]
    assert pio.templates.default == TEMPLATE
    assert fig.layout.title.text, f"{name}: no title"
    assert fig.layout.width is None, f"{name}: a fixed width does not fit a phone"
    for ax in _axes_of(fig):                  # an axis without tick labels (shared with a neighbour) needs none
        assert fig.layout[ax].title.text or fig.layout[ax].showticklabels is False, f"{name}: {ax} has no title"
    for scene in sorted({t.scene for t in fig.data if t.type in ("surface", "scatter3d")}):
        for a in ("xaxis", "yaxis", "zaxis"):
            assert fig.layout[scene][a].title.text, f"{name}: {scene}.{a} has no title"


@pytest.mark.parametrize("name", FIGURES)
def test_legends_sit_outside_the_plot_and_off_the_slider(built, name):
    fig = built[name]
    legend = fig.layout.legend
    if fig.layout.sliders:
        shown = [t for t in fig.data if t.showlegend is not False and t.type not in ("heatmap", "surface") and t.name]
        if len(shown) >= 2 or fig.layout.showlegend:
            assert legend.yref == "container" and legend.y == 0 and legend.yanchor == "bottom", name
            assert fig.layout.margin.b >= 150, f"{name}: no room under the plot for slider and legend"
    else:
        template_legend = fig.layout.template.layout.legend
        y = legend.y if legend.y is not None else template_legend.y
        assert y is not None and y < 0, f"{name}: legend inside the plot"
    orientation = legend.orientation or fig.layout.template.layout.legend.orientation
    assert orientation == "h", name


NO_SLIDER = ("planes", "pair", "conditions", "collision", "work", "error_curves", "curves", "roofline",
             "topk_recall")


@pytest.mark.parametrize("name", [n for n in FIGURES if n not in NO_SLIDER])
def test_every_slider_step_has_a_readable_label(built, name):
    from attnbook.widgets._slider import label_fits
    fig = built[name]
    assert fig.layout.sliders
    names = [f.name for f in fig.frames]
    reached = set()
    for slider in fig.layout.sliders:          # one slider, or one per value of a second parameter
        for s in slider.steps:
            if s.method == "animate":           # a step that shows a frame (else it restyles the traces)
                assert s.args[0][0] in names
                reached.add(s.args[0][0])
            assert label_fits(s.label, len(slider.steps)), f"{name}: label {s.label!r} is dropped at a desktop's width"
    assert reached == set(names), f"{name}: a frame no slider step shows"


@pytest.mark.parametrize("name", FIGURES)
def test_subplot_titles_fit_over_their_panels(built, name):
    """An annotation over a panel (a subplot title) is no wider than the panel on a phone, so that
    neighbouring titles do not overprint each other."""
    from attnbook.widgets._slider import CHAR_PX, PHONE_SLIDER_PX
    fig = built[name]
    domains = [fig.layout[a].domain for a in fig.layout if a.startswith("xaxis") and fig.layout[a].domain]
    domains += [fig.layout[s].domain.x for s in {t.scene for t in fig.data if t.type in ("surface", "scatter3d")}
                if fig.layout[s].domain.x]
    if len(domains) < 2:
        return
    for ann in fig.layout.annotations:
        if not ann.text or ann.yref != "paper" or ann.y is None or ann.y < 1.0 or ann.xref != "paper":
            continue
        width = max(len(line) for line in ann.text.replace("<sub>", "").replace("</sub>", "").split("<br>")) * CHAR_PX
        panel = min((d for d in domains if d[0] <= ann.x <= d[1]), key=lambda d: d[1] - d[0])
        assert width <= (panel[1] - panel[0]) * PHONE_SLIDER_PX * 1.15, f"{name}: {ann.text!r} overprints"


def _numeric(values):
    v = [x for x in values if x is not None]
    if not v or any(isinstance(x, str) for x in v):
        return None
    return [float(x) for x in np.asarray(v, dtype=float).ravel()]


@pytest.mark.parametrize("name", [n for n in FIGURES if n not in NO_SLIDER])
def test_every_slider_step_lies_inside_the_axes_in_force(built, name):
    fig = built[name]
    for fr in fig.frames:
        idx = list(fr.traces) if fr.traces is not None else list(range(len(fr.data)))
        for i, tr in zip(idx, fr.data):
            base = fig.data[i]
            if base.type in ("heatmap", "surface", "scatter3d"):
                continue
            for a in ("x", "y"):
                vals = getattr(tr, a) if getattr(tr, a) is not None else getattr(base, a)
                if a == "x" and vals is None and getattr(tr, "y", None) is not None:
                    vals = list(range(len(tr.y)))
                vals = _numeric(vals if vals is not None else [])
                ref = getattr(base, f"{a}axis", None) or a
                ax = f"{a}axis{ref[1:]}"
                own = (fr.layout.to_plotly_json() if fr.layout is not None else {}).get(ax, {}).get("range")
                rng = own if own is not None else fig.layout[ax].range
                if vals is None or rng is None or fig.layout[ax].type == "category":
                    continue
                rng = sorted(rng)                                     # reversed axes list (hi, lo)
                lo, hi = min(vals), max(vals)
                if fig.layout[ax].type == "log":
                    lo, hi = np.log10(max(lo, 1e-300)), np.log10(max(hi, 1e-300))
                assert rng[0] <= lo + 1e-9 and hi <= rng[1] + 1e-9, f"{name} {fr.name}: {ax} {rng} misses {lo}..{hi}"


def test_theory_and_measurement_of_one_quantity_share_a_colour():
    from attnbook.widgets.anna import add_theory_and_measurement, collision_figure
    fig = collision_figure([0, 1], {}, {}, title="t")
    for i in range(3):
        add_theory_and_measurement(fig, [0, 1], [1, 0], [0.9, 0.1], name=f"q{i}", index=i)
    colours = [(t.line.color if t.mode == "lines" else t.marker.color) for t in fig.data]
    assert colours[0::2] == colours[1::2] and len(set(colours[0::2])) == 3


GLUED_FIGURE = r"```\{glue:figure\} (\w+)\n((?::\w+:[^\n]*\n)*)\n(.*?)\n```"


def test_every_glued_figure_on_a_chapter_page_is_numbered_captioned_and_referenced():
    """Chapter pages paste the labs' figures as numbered figures with a caption ({glue:figure} with
    :doc: and :name:, book/_ext/glue_figure.py), and the prose refers to each by its number."""
    import re
    from pathlib import Path

    pages = sorted((Path(__file__).resolve().parents[1] / "book").glob("[0-9][0-9]_*.md"))
    assert pages
    for page in pages:
        text = page.read_text()
        assert not re.search(r"```\{glue\}\s", text), f"{page.name}: a figure pasted without number or caption"
        figures = list(re.finditer(GLUED_FIGURE, text, flags=re.S))
        assert len(figures) == text.count("{glue:figure}"), page.name
        for m in figures:
            opts = dict(re.findall(r":(\w+): ([^\n]*)", m.group(2)))
            assert "doc" in opts and opts.get("name", "").startswith("fig-"), f"{page.name}: {m.group(1)} {opts}"
            assert m.group(3).strip() and "```" not in m.group(3), f"{page.name}: {m.group(1)} has no caption"
            assert f"{{numref}}`{opts['name']}`" in text, f"{page.name}: the prose never refers to {opts['name']}"


def _strip(s):
    import re
    return [re.sub(r"<[^>]+>", "", line) for line in (s or "").split("<br>") if line.strip()]


def _title_lines(text):
    """``(main lines, <sup> lines)`` of a Plotly title, tags stripped."""
    main, _, sup = text.partition("<sup>")
    return _strip(main), _strip(sup)


@pytest.mark.parametrize("name", FIGURES)
def test_titles_fit_a_phone(built, name):
    """Plotly does not wrap a title: every line of it and of its subtitle, in every slider step, fits a
    390-px screen."""
    from attnbook.widgets._style import SUBTITLE_CHARS, SUBTITLE_LINE_CHARS, TITLE_CHARS
    fig = built[name]
    titles = [fig.layout.title] + [f.layout.title for f in fig.frames
                                   if f.layout is not None and f.layout.title.text]
    for t in titles:
        main, sup = _title_lines(t.text)
        assert all(len(line) <= TITLE_CHARS for line in main), f"{name}: {main}"
        assert all(len(line) <= SUBTITLE_CHARS for line in sup), f"{name}: {sup}"
        sub = _strip(t.subtitle.text)
        assert all(len(line) <= SUBTITLE_LINE_CHARS for line in sub), f"{name}: {sub}"


def test_curves_figure_takes_styles_and_error_bars_and_checks_lengths():
    fig = widgets.curves_figure({"a": ([1, 2], [3, 4]), "b": ([1, 2], [1, 1])}, title="t", x_title="x", y_title="y",
                                styles={"b": dict(line=dict(dash="dash"))}, errors={"a": [0.1, 0.2]})
    assert fig.data[1].line.dash == "dash" and fig.data[1].line.color == widgets.colour(1)   # merged, not replaced
    assert list(fig.data[0].error_y.array) == [0.1, 0.2] and fig.data[1].error_y.array is None
    with pytest.raises(ValueError, match="2 x values but 1 y values"):
        widgets.curves_figure({"a": ([1, 2], [3])}, title="t", x_title="x", y_title="y")


# --- every chapter's mechanism map beside softmax's plan ---------------------------------------

def _check_map_figure(fig, mechanism, n_steps, axes):
    """One frame per slider step, each frame naming the range of every listed axis (nothing rides on
    the first frame's), and the marker the browser check looks for."""
    assert len(fig.frames) == len(fig.layout.sliders[0].steps) == n_steps
    assert [s.args[0][0] for s in fig.layout.sliders[0].steps] == [fr.name for fr in fig.frames]
    for fr in fig.frames:
        for ax in axes:
            assert fr.layout[ax].range is not None, f"{fr.name}: {ax} has no range of its own"
    assert fig.layout.meta["mechanism_map"] == mechanism
    assert fig.layout.title.text


def test_gate_weights_figure_steps_over_the_gate_and_keeps_the_plan():
    from attnbook.widgets.deltanet import gate_weights_figure
    from attnlib import deltanet, softmax_attention
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


def test_needle_maps_figure_has_a_step_per_algorithm_and_the_exact_plan():
    from attnbook.experiments import needle
    from attnbook.widgets.needle import needle_maps_figure
    algos = [needle.make(n, T=32, d=8, seed=0) for n in ("sliding_window", "performer", "linformer")]
    fig = needle_maps_figure(needle.needle_maps(algos, M=40.0))
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
        needle.needle_maps([algos[0], needle.make("strided", T=40, d=8)])
    with pytest.raises(TypeError, match=r"maps\[0\] must be an attnbook.experiments.needle.NeedleMap"):
        needle_maps_figure(algos)                          # the figure draws maps; it runs no algorithm


def test_plane_mixing_figure_steps_over_the_offsets_of_one_position():
    from attnbook.experiments import grassmann as gx
    from attnbook.widgets.grassmann import plane_mixing_figure
    from attnlib import softmax_attention
    from attnlib.grassmann import CausalGrassmannMixing
    torch.manual_seed(0)
    offsets, T, t = (1, 2, 4, 8), 12, 6                         # offset 8 has no partner at t = 6
    layer = CausalGrassmannMixing(5, 3, offsets).double()
    h = torch.randn(1, T, 5, dtype=torch.float64)
    pt = gx.pair_terms(layer, h, t)
    assert pt["offsets"] == [1, 2, 4] and pt["partners"] == [5, 4, 2]
    assert torch.allclose(pt["terms"].sum(0) + pt["bias"], pt["signal"], atol=1e-12)
    z = pt["z"]
    plan = softmax_attention(z[None, None], z[None, None], torch.eye(T, dtype=torch.float64)[None, None],
                             causal=True)[0, 0]
    paired = gx.pairing_pattern(T, offsets)
    assert paired.sum(1).tolist() == gx.valid_counts(T, offsets).tolist() and not paired.triu().any()
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
        plane_mixing_figure({**pt, "z": torch.zeros(T, 4)}, t, plan, paired)
    with pytest.raises(ValueError, match="causal pairing"):
        gx.pair_terms(CausalGrassmannMixing(5, 3, offsets, pairing="paper"), h.float(), t)


# --- figures that read on a phone -------------------------------------------------------------------

MULTI_PANEL = ("transport_plan", "weights_comparison", "gate_weights", "plane_mixing", "pair", "state_buildup",
               "flash_walk")


@pytest.mark.parametrize("name", MULTI_PANEL)
def test_multi_panel_figures_say_how_to_stack_and_keep_colour_bars_beside_their_panel(built, name):
    """layout.meta.stack (read by book/_static/responsive_figures.js) names real panels, each once, in
    reading order; every colour bar stands right of its own panel, no further than the next panel's
    start, and as tall as its panel at most."""
    from attnbook.widgets._style import panels
    fig = built[name]
    stack = fig.layout.meta["stack"]
    keys = [k for unit in stack["panels"] for k in unit]
    assert len(keys) == len(set(keys)) and len(stack["heights"]) == len(stack["panels"]) >= 2
    assert sorted(keys) == sorted(k for unit in panels(fig) for k in unit if k in keys)
    for key in keys:
        assert fig.layout[key].domain is not None
    boxes = [(fig.layout[a].domain, fig.layout[f"yaxis{(fig.layout[a].anchor or 'y')[1:]}"].domain)
             for a in fig.layout if a.startswith("xaxis") and fig.layout[a].domain]
    bars = [(t.colorbar, t.xaxis or "x", t.yaxis or "y") for t in fig.data
            if t.type == "heatmap" and t.showscale is not False and t.coloraxis is None]
    bars += [(fig.layout[t.coloraxis].colorbar, t.xaxis or "x", t.yaxis or "y") for t in fig.data
             if getattr(t, "coloraxis", None)]
    assert bars or name == "pair", name
    for cb, xref, _yref in bars:
        x_dom = fig.layout[f"xaxis{xref[1:]}"].domain
        assert cb.x is not None and cb.x >= x_dom[1], f"{name}: colour bar over its own panel"
        lo, hi = cb.y - cb.len / 2, cb.y + cb.len / 2
        for bx, by in boxes:                          # on no panel beside it (a bar is ~50 px: 0.05)
            if by is not None and by[0] < hi and lo < by[1]:
                assert not (bx[0] - 0.05 < cb.x < bx[1]), f"{name}: colour bar on another panel"
        assert cb.len is not None and cb.thickness <= 12, name


def _visible_text(fig):
    """Every string a reader can see: titles, subtitles, axis and colour-bar titles, annotations, legend
    names, slider prefixes and labels, button labels."""
    lay = fig.layout.to_plotly_json()
    out = []

    def walk(obj, key=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k in ("template", "meta", "hovertemplate"):
                    continue
                walk(v, k)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v, key)
        elif isinstance(obj, str) and key in ("text", "prefix", "label", "name"):
            out.append(obj)

    walk(lay)
    for fr in fig.frames:
        walk(fr.layout.to_plotly_json() if fr.layout is not None else {})
    out += [t.name for t in fig.data if t.name and t.showlegend is not False]
    return out


OWN = ("transport_plan", "attention_map", "weights_comparison", "gate_weights", "plane_mixing", "pair",
       "planes", "plucker_features", "state_buildup", "crossover", "singular_values", "stability", "flash_walk",
       "curves", "launch_bytes", "roofline")


@pytest.mark.parametrize("name", OWN)
def test_no_code_names_in_what_a_reader_sees(built, name):
    """No snake_case names, no raw subscripts (``T_mem``, ``xi_t``), no ``name=value`` code spelling."""
    import re
    for text in _visible_text(built[name]):
        plain = re.sub(r"<[^>]+>", "", text)
        assert not re.search(r"\b[A-Za-z]+_[A-Za-z0-9({]", plain), f"{name}: {text!r}"
        assert not re.search(r"\b[A-Za-z]+=[-0-9]", plain), f"{name}: {text!r}"


@pytest.mark.parametrize("name", OWN)
def test_small_text_is_at_least_11px(built, name):
    """Subtitles in title.subtitle (12 px, not <sup>'s 10 px), annotations, axis titles >= 11 px."""
    fig = built[name]
    tl = fig.layout.template.layout
    assert tl.title.subtitle.font.size >= 11 and tl.font.size >= 11 and tl.annotationdefaults.font.size >= 11
    titles = [fig.layout.title] + [f.layout.title for f in fig.frames if f.layout is not None and f.layout.title.text]
    assert not any("<sup>" in (t.text or "") for t in titles), f"{name}: a <sup> subtitle (under 10 px)"
    for ann in fig.layout.annotations:
        assert ann.font.size is None or ann.font.size >= 11, name
    for ax in fig.layout:
        if ax.startswith(("xaxis", "yaxis")):
            size = fig.layout[ax].title.font.size
            assert size is None or size >= 11, f"{name}: {ax}"


def test_modebar_leaves_the_title_room():
    """The toolbar (top right) is short and the title starts under it, so a phone-wide title is not
    covered."""
    import plotly.io as pio

    from attnbook.widgets._style import MODEBAR_PX, TEMPLATE
    t = pio.templates[TEMPLATE].layout
    assert t.title.yref == "container" and t.title.yanchor == "top" and t.title.pad.t >= MODEBAR_PX
    assert t.margin.t >= MODEBAR_PX + 40 and len(t.modebar.remove) >= 4


def test_plan_colours_are_one_convention():
    """The plan in every chapter in PLAN_SCALE; DIVERGING_SCALE only for signed panels."""
    import plotly.graph_objects as go

    from attnbook.widgets._style import DIVERGING_SCALE, PLAN_SCALE

    def scale(name):
        return go.Figure(go.Heatmap(z=[[0]], colorscale=name)).data[0].colorscale

    plan, diverging = scale(PLAN_SCALE), scale(DIVERGING_SCALE)
    figs = _figure_builders()
    gate = figs["gate_weights"]()
    assert gate.data[0].colorscale == plan and gate.data[1].colorscale == diverging
    mix = figs["plane_mixing"]()
    (softmax,) = [t for t in mix.data if t.type == "heatmap" and t.showscale is not False]
    assert softmax.colorscale == plan
    att = figs["attention_map"]()
    assert att.layout.coloraxis.colorscale == plan


def test_stack_panels_and_colorbar_helpers():
    from plotly.subplots import make_subplots

    from attnbook.widgets._style import colorbar, merge_meta, panels, stack_panels
    fig = make_subplots(rows=2, cols=2, specs=[[{"type": "scene"}, {}], [{}, {}]])
    assert panels(fig) == [["scene"], ["xaxis", "yaxis"], ["xaxis2", "yaxis2"], ["xaxis3", "yaxis3"]]
    cb = colorbar(fig, ["xaxis2", "yaxis2"], title="weight")
    assert cb["x"] > fig.layout.xaxis2.domain[1] and cb["len"] < 1 and cb["title"]["text"] == "weight"
    merge_meta(fig, mechanism_map="m")
    stack_panels(fig, height=250)
    assert fig.layout.meta["mechanism_map"] == "m" and fig.layout.meta["stack"]["heights"] == [250] * 4
    with pytest.raises(ValueError, match="not a panel"):
        stack_panels(fig, [["xaxis9"]])
    with pytest.raises(ValueError, match="heights"):
        stack_panels(fig, heights=[1, 2])


def test_blue_is_positive_in_the_plan_and_in_the_signed_scale():
    """One colour convention in a figure that sets a plan beside signed weights: the plan's large mass
    and a positive signed weight are both blue, a negative weight red (never blue)."""
    import plotly.colors

    from attnbook.widgets._style import DIVERGING_SCALE, PLAN_SCALE

    def rgb(name, at):
        scale = plotly.colors.get_colorscale(name)
        colour = plotly.colors.sample_colorscale(scale, [at], colortype="tuple")[0]
        return [c * 255 if max(colour) <= 1 else c for c in colour]

    def blue(c):
        return c[2] > c[0] + 40

    def red(c):
        return c[0] > c[2] + 40

    assert blue(rgb(PLAN_SCALE, 1.0))
    assert blue(rgb(DIVERGING_SCALE, 1.0)) and red(rgb(DIVERGING_SCALE, 0.0))
