"""Chapter 4's figures: the state's singular values over time for the two rules, and the beta /
stability explorer. They draw what :mod:`attnbook.experiments.deltanet` computes (the spectra, the
state's norm over time); a live explorer takes the function that computes a step.

Each figure exists in two forms: a Plotly figure with a native frame slider (precomputed, works in
the static book) and, for the stability explorer, a live ``ipywidgets`` version for a running kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._slider import add_frame_slider
from ._style import DIVERGING_SCALE, PLAN_SCALE, colorbar, colour, merge_meta, stack_panels, title, top_margin

LINEAR_COLOUR, DELTA_COLOUR, UNSTABLE_COLOUR = colour(1), colour(0), colour(4)


def singular_values_figure(spectra: Mapping[str, np.ndarray], *, steps: list[int] | None = None) -> go.Figure:
    """Bars of the singular values of ``S_t`` for linear attention and the delta rule, one frame per
    ``t`` in ``steps`` (default: 12 evenly spaced). ``spectra``: ``{"linear" | "delta": [T, r]}``, row
    ``t - 1`` the values after ``t`` writes (:func:`attnbook.experiments.deltanet.state_spectra`).
    Linear attention's spectrum keeps growing with every write; the delta rule's stays near the values'
    scale because each write first removes what the key already retrieves."""
    missing = {"linear", "delta"} - set(spectra)
    if missing:
        raise ValueError(f"spectra lacks {sorted(missing)}; expected the keys 'linear' and 'delta'")
    sv = {r: np.asarray(spectra[r], dtype=float) for r in ("linear", "delta")}
    if sv["linear"].ndim != 2 or sv["linear"].shape != sv["delta"].shape:
        raise ValueError(f"spectra['linear'] has shape {sv['linear'].shape} and spectra['delta'] "
                         f"{sv['delta'].shape}; expected the same [T, r]")
    T = sv["linear"].shape[0]
    steps = steps or sorted(set(np.linspace(1, T, 12).round().astype(int).tolist()))
    ymax = float(max(sv["linear"].max(), sv["delta"].max())) * 1.05
    idx = np.arange(1, sv["linear"].shape[1] + 1)

    def traces(t):
        return [go.Bar(x=idx, y=sv["linear"][t - 1], name="linear attention", marker_color=LINEAR_COLOUR),
                go.Bar(x=idx, y=sv["delta"][t - 1], name="delta rule", marker_color=DELTA_COLOUR)]

    fig = go.Figure(data=traces(steps[0]))
    fig.update_layout(barmode="group", title=title("Singular values of the state S<sub>t</sub> after t writes"),
                      xaxis_title="index i (largest first)", yaxis_title="σ<sub>i</sub>(S<sub>t</sub>)",
                      yaxis_range=[0, ymax], xaxis_range=[0.5, len(idx) + 0.5], height=440)
    frames = [go.Frame(data=traces(t), name=f"t{t}") for t in steps]
    return add_frame_slider(fig, frames, [str(t) for t in steps], prefix="t = ")


def stability_figure(histories: Mapping[tuple[float, float], np.ndarray]) -> go.Figure:
    """``||S_t||`` over t (log scale) for the delta rule with random keys of norm ``key_norm`` and
    learning rate ``beta``; one frame per ``(beta, key_norm)`` of ``histories``
    (:func:`attnbook.experiments.deltanet.stability_histories`). The edge is ``beta ||k||^2 = 2``: there
    the eigenvalue ``1 - beta ||k||^2`` of the transition crosses -1."""
    if not histories:
        raise ValueError("histories must hold at least one (beta, key_norm) history")
    combos = list(histories)
    hist = {c: np.asarray(histories[c], dtype=float) for c in combos}
    T = len(hist[combos[0]])
    ymax = np.log10(max(max(h.max() for h in hist.values()), 10.0)) + 0.5
    t = np.arange(1, T + 1)

    def traces(c):
        b, n = c
        lam = 1 - b * n * n
        return [go.Scatter(x=t, y=hist[c], mode="lines", name=f"‖S<sub>t</sub>‖, β‖k‖² = {b * n * n:.2f}",
                           line=dict(color=DELTA_COLOUR if abs(lam) <= 1 else UNSTABLE_COLOUR))]

    fig = go.Figure(data=traces(combos[0]))
    fig.update_layout(title=title("Delta rule: the state's norm", "stable while β‖k‖² ≤ 2"),
                      margin=dict(t=top_margin(1, 1)),
                      xaxis_title="token t", yaxis_title="‖S<sub>t</sub>‖ (Frobenius)", yaxis_type="log",
                      yaxis_range=[-1, ymax], xaxis_range=[1, T], height=420, showlegend=True)
    frames = [go.Frame(data=traces(c), name=f"b{c[0]}n{c[1]}") for c in combos]
    several_norms = len({n for _, n in combos}) > 1
    labels = [f"{b},{n}" if several_norms else f"{b}" for b, n in combos]
    return add_frame_slider(fig, frames, labels, prefix="β, ‖k‖ = " if several_norms else "β = ")


def stability_explorer(history_at: Callable[[float, float], np.ndarray]):
    """Live version (needs a running kernel): sliders for beta and the key norm; the plot shows
    ``||S_t||`` and the title the transition's eigenvalue ``1 - beta ||k||^2`` along the key.
    ``history_at(beta, key_norm)`` computes the curve, e.g.
    ``lambda b, n: attnbook.experiments.deltanet.norm_history(b, n, T=200, D=16, seed=0)``."""
    import ipywidgets as widgets

    first = np.asarray(history_at(1.0, 1.0), dtype=float)
    fig = go.FigureWidget(data=[go.Scatter(x=np.arange(1, len(first) + 1), y=first, mode="lines")])
    fig.update_layout(xaxis_title="token t", yaxis_title="‖S<sub>t</sub>‖ (Frobenius)", yaxis_type="log", height=400,
                      title="β‖k‖² = 1.00, eigenvalue along k = 0.00")
    b_slider = widgets.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.05, description="β")
    n_slider = widgets.FloatSlider(value=1.0, min=0.25, max=2.0, step=0.05, description="‖k‖")

    def update(_=None):
        b, n = b_slider.value, n_slider.value
        with fig.batch_update():
            fig.data[0].y = history_at(b, n)
            fig.layout.title = f"β‖k‖² = {b * n * n:.2f}, eigenvalue along k = {1 - b * n * n:.2f}"

    b_slider.observe(update, names="value")
    n_slider.observe(update, names="value")
    return widgets.VBox([widgets.HBox([b_slider, n_slider]), fig])


def gate_weights_figure(plan, weights, alphas, *, beta: float, active: int = 0) -> go.Figure:
    """Softmax's causal plan beside Gated DeltaNet's implied weights, with a slider over the gate.

    ``plan``: ``[T, T]`` softmax attention weights on the same queries and keys (fixed); ``weights[i]``:
    the ``[T, T]`` implied weights (:func:`attnlib.deltanet.implied_weights`) at the constant decay
    ``alphas[i]`` (``g = log alpha``; ``alpha = 1`` is DeltaNet). Each panel has its own colour scale:
    the plan's runs from 0 to its largest weight after the first row (a causal first row is a single
    weight 1, shown in the end colour), the gated weights' is diverging, centred on 0 and the
    same for every step (so the steps compare), its colour bar titled "signed weight". Each frame sets
    both panels' axes and reports the weights' row sums and smallest entry in the subtitle. On a phone
    the panels stack.
    """
    plan = np.asarray(plan, dtype=np.float64)
    mats = [np.asarray(W, dtype=np.float64) for W in weights]
    alphas = [float(a) for a in alphas]
    if not mats or len(mats) != len(alphas):
        raise ValueError(f"need one weight matrix per gate value; got {len(mats)} and {len(alphas)}")
    T = plan.shape[0]
    for i, W in enumerate(mats):
        if W.shape != plan.shape or plan.shape != (T, T) or not np.isfinite(W).all():
            raise ValueError(f"weights[{i}] has shape {W.shape}; expected a finite {plan.shape} matrix like plan")
    wmax = max(float(np.abs(W).max()) for W in mats) or 1.0
    pos = list(range(T))

    def num(x):
        return f"{x:.2f}".replace("-", "−")

    def step_title(alpha, W):
        rs = W.sum(1)
        name = "DeltaNet, no decay" if alpha == 1.0 else f"decay α = {alpha:g}"
        return title("Gated DeltaNet's weights and softmax's plan",
                     f"{name}, β = {beta:g}<br>"
                     f"gated weights: row sums {num(rs.min())} to {num(rs.max())}, smallest {num(W.min())}<br>"
                     f"plan: row sums 1, smallest {num(plan.min())}")

    axes = dict(xaxis=dict(range=[-0.5, T - 0.5], title_text="value position j"),
                xaxis2=dict(range=[-0.5, T - 0.5], title_text="value position j"),
                yaxis=dict(range=[T - 0.5, -0.5], title_text="query position t"),
                yaxis2=dict(range=[T - 0.5, -0.5]))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.17,
                        subplot_titles=("softmax: the plan", "Gated DeltaNet:<br>its weights"))
    fig.update_annotations(font=dict(size=13))
    # The first causal row has one key and weight 1; scaled to the other rows, the plan keeps its contrast.
    plan_top = float(plan[1:].max()) if T > 1 else float(plan.max())
    fig.add_trace(go.Heatmap(z=plan.astype(np.float32), x=pos, y=pos, zmin=0.0, zmax=plan_top,
                             colorscale=PLAN_SCALE, colorbar=colorbar(fig, ["xaxis", "yaxis"], title="weight"),
                             hovertemplate="query %{y} → value %{x}: %{z:.3f}<extra>softmax</extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=mats[active].astype(np.float32), x=pos, y=pos, zmin=-wmax, zmax=wmax, zmid=0.0,
                             colorscale=DIVERGING_SCALE,
                             colorbar=colorbar(fig, ["xaxis2", "yaxis2"], title="signed weight"),
                             hovertemplate="query %{y} → value %{x}: %{z:.3f}<extra>gated delta</extra>"),
                  row=1, col=2)
    frames = [go.Frame(data=[go.Heatmap(z=W.astype(np.float32))], traces=[1], name=f"alpha{i}",
                       layout=go.Layout(title=step_title(a, W), **axes))
              for i, (a, W) in enumerate(zip(alphas, mats))]
    fig.update_layout(title=step_title(alphas[active], mats[active]), height=500,
                      margin=dict(t=top_margin(1, 3, 2), l=60, r=60, b=40), **axes)
    # The right-hand map has the left's queries: it labels them only when a phone stacks the two.
    fig.update_yaxes(showticklabels=False, row=1, col=2)
    merge_meta(fig, mechanism_map="Gated DeltaNet")
    stack_panels(fig, height=380, narrow={"yaxis2.showticklabels": True, "yaxis2.title.text": "query position t"})
    labels = ["1 (DeltaNet)" if a == 1.0 else f"{a:g}" for a in alphas]
    return add_frame_slider(fig, frames, labels, prefix="decay α = ", active=active)
