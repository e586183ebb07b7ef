"""Chapter 4's figures: the state's singular values over time for the two rules, and the beta /
stability explorer. The states come from :func:`attnlib.experiments.recall.state_trajectory`.

Each figure exists in two forms: a Plotly figure with a native frame slider (precomputed, works in
the static book) and, for the stability explorer, a live ``ipywidgets`` version for a running kernel.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch

from ..experiments.recall import state_trajectory
from ._slider import add_frame_slider
from ._style import colour

LINEAR_COLOUR, DELTA_COLOUR, UNSTABLE_COLOUR = colour(1), colour(0), colour(4)


def singular_values_figure(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | float, *,
                           steps: list[int] | None = None) -> go.Figure:
    """Bars of the singular values of ``S_t`` for linear attention and the delta rule, one frame per
    ``t`` in ``steps`` (default: 12 evenly spaced). Linear attention's spectrum keeps growing with
    every write; the delta rule's stays near the values' scale because each write first removes
    what the key already retrieves."""
    T = k.shape[0]
    steps = steps or sorted(set(np.linspace(1, T, 12).round().astype(int).tolist()))
    sv = {r: torch.linalg.svdvals(state_trajectory(k, v, beta, rule=r)).numpy() for r in ("linear", "delta")}
    ymax = float(max(sv["linear"].max(), sv["delta"].max())) * 1.05
    idx = np.arange(1, sv["linear"].shape[1] + 1)

    def traces(t):
        return [go.Bar(x=idx, y=sv["linear"][t - 1], name="linear attention", marker_color=LINEAR_COLOUR),
                go.Bar(x=idx, y=sv["delta"][t - 1], name="delta rule", marker_color=DELTA_COLOUR)]

    fig = go.Figure(data=traces(steps[0]))
    fig.update_layout(barmode="group", title="Singular values of the state S<sub>t</sub> after t writes",
                      xaxis_title="index i (largest first)", yaxis_title="σ<sub>i</sub>(S<sub>t</sub>)",
                      yaxis_range=[0, ymax], xaxis_range=[0.5, len(idx) + 0.5], height=440)
    frames = [go.Frame(data=traces(t), name=f"t{t}") for t in steps]
    return add_frame_slider(fig, frames, [str(t) for t in steps], prefix="t = ")


def _norm_history(beta: float, key_norm: float, *, T: int, D: int, seed: int) -> np.ndarray:
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(T, D, generator=gen, dtype=torch.float64), dim=-1) * key_norm
    v = torch.randn(T, D, generator=gen, dtype=torch.float64)
    S = state_trajectory(k, v, beta, rule="delta")
    return S.flatten(1).norm(dim=1).numpy()


def stability_figure(betas=(0.5, 1.0, 1.5, 1.9, 2.1, 2.5), key_norms=(1.0,), *, T: int = 200, D: int = 16,
                     seed: int = 0) -> go.Figure:
    """``||S_t||`` over t (log scale) for the delta rule with random keys of norm ``key_norm`` and
    learning rate ``beta``; one frame per ``(beta, key_norm)``. The edge is ``beta ||k||^2 = 2``: there
    the eigenvalue ``1 - beta ||k||^2`` of the transition crosses -1."""
    combos = [(b, n) for n in key_norms for b in betas]
    hist = {c: _norm_history(c[0], c[1], T=T, D=D, seed=seed) for c in combos}
    ymax = np.log10(max(max(h.max() for h in hist.values()), 10.0)) + 0.5
    t = np.arange(1, T + 1)

    def traces(c):
        b, n = c
        lam = 1 - b * n * n
        return [go.Scatter(x=t, y=hist[c], mode="lines", name=f"‖S<sub>t</sub>‖, β‖k‖² = {b * n * n:.2f}",
                           line=dict(color=DELTA_COLOUR if abs(lam) <= 1 else UNSTABLE_COLOUR))]

    fig = go.Figure(data=traces(combos[0]))
    fig.update_layout(title="Delta rule: the state's norm<br><sup>stable while β‖k‖² ≤ 2</sup>",
                      xaxis_title="token t", yaxis_title="‖S<sub>t</sub>‖ (Frobenius)", yaxis_type="log",
                      yaxis_range=[-1, ymax], xaxis_range=[1, T], height=420, showlegend=True)
    frames = [go.Frame(data=traces(c), name=f"b{c[0]}n{c[1]}") for c in combos]
    labels = [f"{b},{n}" if len(key_norms) > 1 else f"{b}" for b, n in combos]
    return add_frame_slider(fig, frames, labels, prefix="β = " if len(key_norms) == 1 else "β, ‖k‖ = ")


def stability_explorer(*, T: int = 200, D: int = 16, seed: int = 0):
    """Live version (needs a running kernel): sliders for beta and the key norm; the plot shows
    ``||S_t||`` and the title the transition's eigenvalue ``1 - beta ||k||^2`` along the key."""
    import ipywidgets as widgets

    fig = go.FigureWidget(data=[go.Scatter(x=np.arange(1, T + 1), y=_norm_history(1.0, 1.0, T=T, D=D, seed=seed),
                                           mode="lines")])
    fig.update_layout(xaxis_title="token t", yaxis_title="‖S<sub>t</sub>‖ (Frobenius)", yaxis_type="log", height=400,
                      title="β‖k‖² = 1.00, eigenvalue along k = 0.00")
    b_slider = widgets.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.05, description="beta")
    n_slider = widgets.FloatSlider(value=1.0, min=0.25, max=2.0, step=0.05, description="||k||")

    def update(_=None):
        b, n = b_slider.value, n_slider.value
        with fig.batch_update():
            fig.data[0].y = _norm_history(b, n, T=T, D=D, seed=seed)
            fig.layout.title = f"β‖k‖² = {b * n * n:.2f}, eigenvalue along k = {1 - b * n * n:.2f}"

    b_slider.observe(update, names="value")
    n_slider.observe(update, names="value")
    return widgets.VBox([widgets.HBox([b_slider, n_slider]), fig])

