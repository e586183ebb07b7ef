"""Chapter 1's figures: transport plans and attention maps.

Static versions (``*_figure``) precompute every slider step as a Plotly frame, so they work in the
built book with no kernel. Live versions (``*_explorer``) are ipywidgets around a FigureWidget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from .. import _validate, eot
from ..experiments.weights import softmax_weights
from ._plan import as_single_head, plan_frame_traces, plan_pair_figure, plan_traces
from ._slider import add_frame_slider
from ._style import PLAN_SCALE, SIGNED_SCALE, wrap


def _as_cost(C) -> torch.Tensor:
    C = torch.as_tensor(C, dtype=torch.float64)
    if C.dim() != 2:
        raise ValueError(f"C has shape {tuple(C.shape)}; expected a [Nq, Nk] cost matrix")
    return C


def _check_eps_values(eps_values: Sequence[float]) -> list[float]:
    vals = [_validate.check_positive("eps_values[i]", float(e)) for e in eps_values]
    if not vals:
        raise ValueError("eps_values must hold at least one temperature")
    return vals


def _plans(C: torch.Tensor, eps: float, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    one = eot.gibbs_plan(C, eps)
    two = eot.sinkhorn(C, eps, b=b, n_iter=2000, tol=1e-9)
    return one, two


def _title(C, eps, one, two) -> str:
    def stats(P):
        return f"H={eot.entropy(P).item():.2f}, obj={eot.objective(P, C, eps).item():.2f}"
    return (f"Transport plans at temperature ε = {eps:.3g}<br><sup>one-sided (softmax): {stats(one)}<br>"
            f"two-sided (Sinkhorn): {stats(two)}</sup>")


def transport_plan_figure(C, eps_values: Sequence[float], *, b=None, active: int | None = None) -> go.Figure:
    """One-sided vs two-sided entropic transport plans for cost ``C [Nq, Nk]``, with an ε slider.

    Left: the one-sided plan (= softmax(-C/ε) row-wise); its rows ship unit mass, its columns
    receive whatever they attract. Right: the balanced plan from Sinkhorn (columns receive
    ``b``, by default ``Nq/Nk`` each). Bars: row sums (red, right of each map) and column sums
    (green, below). The title reports entropy and objective ``<P, C> - ε H(P)``.
    """
    C = _as_cost(C)
    vals = _check_eps_values(eps_values)
    b_t = None if b is None else torch.as_tensor(b, dtype=torch.float64)
    active = len(vals) // 2 if active is None else active

    plans = [_plans(C, eps, b_t) for eps in vals]
    frames = [go.Frame(data=plan_frame_traces(one) + plan_frame_traces(two), name=f"eps{i}", traces=list(range(6)),
                       layout=go.Layout(title_text=_title(C, eps, one, two)))
              for i, (eps, (one, two)) in enumerate(zip(vals, plans))]
    labels = [f"{eps:.3g}" for eps in vals]
    one, two = plans[active]
    fig = plan_pair_figure(one, two, ("one-sided plan<br>(softmax)", "two-sided plan<br>(Sinkhorn)"),
                           row_sum_max=max(1.2, 1.2 * C.shape[0] / C.shape[1]), column_sum_max=float(C.shape[0]),
                           height=600)
    fig.update_layout(title_text=_title(C, vals[active], one, two), margin=dict(t=100))
    return add_frame_slider(fig, frames, labels, prefix="ε = ", active=active)


def _attention_weights(q: torch.Tensor, k: torch.Tensor, tau: float, causal: bool) -> np.ndarray:
    return softmax_weights(q, k, tau=tau, causal=causal).numpy()


def attention_map_figure(q, k, temperatures: Sequence[float], *, active: int | None = None) -> go.Figure:
    """Attention weights ``softmax(q k^T / τ)`` for one head (``q [Tq, D]``, ``k [Tk, D]``), with a
    temperature slider and a causal on/off menu -- all precomputed, so it works in a static page."""
    q, k = as_single_head("q", q), as_single_head("k", k)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"k has shape {tuple(k.shape)}; expected (*, {q.shape[1]}) to match q")
    taus = _check_eps_values(temperatures)
    active = len(taus) // 2 if active is None else active
    causal_ok = q.shape[0] == k.shape[0]
    xs = [f"k{j}" for j in range(k.shape[0])]
    ys = [f"q{i}" for i in range(q.shape[0])]

    def traces(tau):
        out = [go.Heatmap(z=_attention_weights(q, k, tau, False), x=xs, y=ys, zmin=0, zmax=1,
                          colorscale=PLAN_SCALE, visible=True, name="full",
                          hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>")]
        if causal_ok:
            out.append(go.Heatmap(z=_attention_weights(q, k, tau, True), x=xs, y=ys, zmin=0, zmax=1,
                                  colorscale=PLAN_SCALE, visible=False, name="causal",
                                  hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>"))
        return out

    fig = go.Figure(data=traces(taus[active]))
    n = len(fig.data)
    # Frames carry z only, so that the causal menu's visibility choice survives slider moves.
    frames = [go.Frame(data=[go.Heatmap(z=tr.z) for tr in traces(t)], name=f"tau{i}", traces=list(range(n)))
              for i, t in enumerate(taus)]
    fig.update_layout(title="Softmax attention weights", height=520, margin=dict(t=90),
                      xaxis_title="key j", yaxis=dict(title="query i", autorange="reversed"))
    fig.update_traces(colorbar=dict(title=dict(text="weight"), thickness=12))
    if causal_ok:
        fig.update_layout(updatemenus=[dict(type="buttons", direction="right", x=1.0, y=1.02, xanchor="right",
                                            yanchor="bottom", showactive=True, buttons=[
            dict(label="full", method="restyle", args=[{"visible": [True, False]}]),
            dict(label="causal", method="restyle", args=[{"visible": [False, True]}]),
        ])])
    return add_frame_slider(fig, frames, [f"{t:.3g}" for t in taus], prefix="τ = ", active=active)


def weights_comparison_figure(steps: Sequence[Mapping[str, np.ndarray]], labels: Sequence[str], *,
                              prefix: str, title: str, active: int = 0,
                              zmax: float | Mapping[str, float] | None = None) -> go.Figure:
    """Weight matrices side by side -- softmax's plan beside another mechanism's (implied) weights on
    the same input -- with a slider over a parameter (temperature, feature count, beta ...).

    ``steps[i]`` maps a panel name to a ``[T, T]`` weight matrix (row ``t``: the weights of query
    ``t`` on the values); every step has the same panel names. Each panel has its own colour scale
    (and colour bar), diverging and centred on zero -- blue negative, red positive -- and spanning that
    panel's largest |entry| over all steps: a plan, all on one side of zero, is read on its own scale
    instead of being washed out by a signed panel's large entries, and a step of the slider keeps the
    scale, so steps compare. ``zmax`` caps the scales (a number for every panel, or one per panel
    name; larger entries show in the end colour). Each panel's hover shows the entry; each frame's
    title reports, per panel, the range of the row sums and the smallest entry -- the two things that
    decide whether the rows are a transport plan (rows summing to 1, entries >= 0). Works in a static
    page (precomputed frames).
    """
    if not steps:
        raise ValueError("steps must hold at least one slider step")
    if len(steps) != len(labels):
        raise ValueError(f"got {len(steps)} steps but {len(labels)} labels")
    names = list(steps[0])
    for i, st in enumerate(steps):
        if list(st) != names:
            raise ValueError(f"steps[{i}] has panels {list(st)}; expected {names}")
    mats = [[np.asarray(st[n], dtype=float) for n in names] for st in steps]
    for i, row in enumerate(mats):
        for n, W in zip(names, row):
            if W.ndim != 2 or not np.isfinite(W).all():
                raise ValueError(f"steps[{i}][{n!r}] must be a finite [T, T] matrix; got shape {W.shape}")
    caps = zmax if isinstance(zmax, Mapping) else {n: zmax for n in names}
    scales = []
    for c, n in enumerate(names):
        top = max(float(np.abs(row[c]).max()) for row in mats) or 1.0
        cap = caps.get(n)
        scales.append(top if cap is None else min(top, _validate.check_positive("zmax", float(cap))))

    def describe(row):
        return "<br>".join(f"{n}: row sums {W.sum(1).min():.2f}..{W.sum(1).max():.2f}, min {W.min():+.2f}"
                           for n, W in zip(names, row))

    # Room between panels for each panel's own colour bar; rows are the same queries in every panel, so
    # only the first panel labels them.
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[wrap(n, 12) for n in names],
                        horizontal_spacing=0.16)
    for c, W in enumerate(mats[active], start=1):
        axis = "coloraxis" if c == 1 else f"coloraxis{c}"
        fig.add_trace(go.Heatmap(z=W, coloraxis=axis,
                                 hovertemplate="query %{y} → value %{x}: %{z:.3f}<extra></extra>"), row=1, col=c)
        fig.update_xaxes(title_text="value j", row=1, col=c)
        fig.update_yaxes(title_text="query t" if c == 1 else None, showticklabels=(c == 1), autorange="reversed",
                         row=1, col=c)
        right = fig.layout[f"xaxis{'' if c == 1 else c}"].domain[1]
        fig.update_layout({axis: dict(colorscale=SIGNED_SCALE, cmin=-scales[c - 1], cmax=scales[c - 1], cmid=0.0,
                                      colorbar=dict(title=dict(text="weight" if c == len(names) else ""),
                                                    x=right + 0.005, xanchor="left", len=0.8, thickness=10))})
    frames = [go.Frame(data=[go.Heatmap(z=W) for W in row], name=f"s{i}", traces=list(range(len(names))),
                       layout=go.Layout(title_text=f"{title}<br><sup>{describe(row)}</sup>"))
              for i, row in enumerate(mats)]
    fig.update_layout(title_text=f"{title}<br><sup>{describe(mats[active])}</sup>", height=520,
                      margin=dict(t=110, r=50))
    return add_frame_slider(fig, frames, list(labels), prefix=prefix, active=active)


def transport_plan_explorer(C, *, eps_min: float = 0.02, eps_max: float = 50.0):
    """Live version of :func:`transport_plan_figure` (needs a running kernel): a log slider over ε."""
    import ipywidgets as W

    C = _as_cost(C)
    static = transport_plan_figure(C, [1.0], active=0)
    static.frames = ()
    static.layout.sliders = ()
    fig = go.FigureWidget(static)
    slider = W.FloatLogSlider(value=1.0, min=np.log10(eps_min), max=np.log10(eps_max), step=0.05,
                              description="ε", continuous_update=True, readout_format=".3g")

    def redraw(change=None):
        eps = slider.value
        one, two = _plans(C, eps, None)
        new = plan_traces(one, True) + plan_traces(two, False)
        with fig.batch_update():
            for tr, nt in zip(fig.data, new):
                if isinstance(nt, go.Heatmap):
                    tr.z = nt.z
                elif nt.orientation == "h":
                    tr.x = nt.x
                else:
                    tr.y = nt.y
            fig.layout.title.text = _title(C, eps, one, two)

    slider.observe(redraw, names="value")
    return W.VBox([slider, fig])


def attention_explorer(q, k):
    """Live attention map: temperature slider and causal checkbox (needs a running kernel)."""
    import ipywidgets as W

    q, k = as_single_head("q", q), as_single_head("k", k)
    fig = go.FigureWidget(go.Heatmap(z=_attention_weights(q, k, 1.0, False), zmin=0, zmax=1,
                                     colorscale="Viridis"))
    fig.update_layout(title="attention weights", yaxis=dict(autorange="reversed"), height=420)
    tau = W.FloatLogSlider(value=1.0, min=-2, max=2, step=0.05, description="τ")
    causal = W.Checkbox(value=False, description="causal", disabled=q.shape[0] != k.shape[0])

    def redraw(change=None):
        fig.data[0].z = _attention_weights(q, k, tau.value, causal.value)

    tau.observe(redraw, names="value")
    causal.observe(redraw, names="value")
    return W.VBox([W.HBox([tau, causal]), fig])
