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
