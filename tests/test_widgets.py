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
