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
from ._slider import add_frame_slider


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


def _plan_traces(P: torch.Tensor, show_scale: bool) -> list[go.BaseTraceType]:
    """Heatmap of P, its row sums (horizontal bars) and column sums (vertical bars)."""
    Pn = P.numpy()
    rows = [f"q{i}" for i in range(Pn.shape[0])]
    cols = [f"k{j}" for j in range(Pn.shape[1])]
    return [
        go.Heatmap(z=Pn, x=cols, y=rows, zmin=0.0, zmax=1.0, colorscale="Blues", showscale=show_scale,
                   colorbar=dict(title="P", len=0.7, y=0.62) if show_scale else None,
                   hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>"),
        go.Bar(x=Pn.sum(1), y=rows, orientation="h", marker_color="#d62728",
               hovertemplate="%{y} ships %{x:.3f}<extra>row sum</extra>", showlegend=False),
        go.Bar(x=cols, y=Pn.sum(0), marker_color="#2ca02c",
               hovertemplate="%{x} receives %{y:.3f}<extra>column sum</extra>", showlegend=False),
    ]


def _frame_traces(P: torch.Tensor) -> list[go.BaseTraceType]:
    """Only what a slider step changes (z of the map, lengths of the bars): frames that restate
    axes, colour bars or labels make Plotly re-create the heatmap and can leave it blank."""
    Pn = P.numpy()
    return [go.Heatmap(z=Pn), go.Bar(x=Pn.sum(1)), go.Bar(y=Pn.sum(0))]


def _plans(C: torch.Tensor, eps: float, b: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    one = eot.gibbs_plan(C, eps)
    two = eot.sinkhorn(C, eps, b=b, n_iter=2000, tol=1e-9)
    return one, two


def _title(C, eps, one, two) -> str:
    def stats(P):
        return f"H={eot.entropy(P).item():.2f}, obj={eot.objective(P, C, eps).item():.2f}"
    return (f"ε = {eps:.3g}<br><sup>one-sided (softmax): {stats(one)}   |   "
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

    fig = make_subplots(rows=2, cols=4, column_widths=[0.36, 0.1, 0.36, 0.1], row_heights=[0.72, 0.28],
                        horizontal_spacing=0.03, vertical_spacing=0.06, shared_yaxes=False,
                        subplot_titles=("one-sided plan (softmax)", "row sums", "two-sided plan (Sinkhorn)",
                                        "row sums", "", "", "", ""))
    positions = [(1, 1), (1, 2), (2, 1), (1, 3), (1, 4), (2, 3)]

    frames, labels = [], []
    for i, eps in enumerate(vals):
        one, two = _plans(C, eps, b_t)
        if i == active:
            traces = _plan_traces(one, show_scale=True) + _plan_traces(two, show_scale=False)
            for tr, (r, c) in zip(traces, positions):
                fig.add_trace(tr, row=r, col=c)
        frames.append(go.Frame(data=_frame_traces(one) + _frame_traces(two), name=f"eps{i}", traces=list(range(6)),
                               layout=go.Layout(title_text=_title(C, eps, one, two))))
        labels.append(f"{eps:.3g}")
    one, two = _plans(C, vals[active], b_t)
    fig.update_layout(title=dict(text=_title(C, vals[active], one, two), font=dict(size=13)),
                      height=560, bargap=0.15, margin=dict(t=80, l=40, r=20, b=20))
    for c in (1, 3):
        fig.update_yaxes(autorange="reversed", row=1, col=c)
    for c in (2, 4):
        fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=c)
        fig.update_xaxes(range=[0, max(2.0, float(C.shape[0]) / C.shape[1] * 2)], row=1, col=c)
    for c in (1, 3):
        fig.update_yaxes(range=[0, float(C.shape[0])], title_text="column sums", row=2, col=c)
    return add_frame_slider(fig, frames, labels, prefix="ε = ", active=active)


def _attention_weights(q: torch.Tensor, k: torch.Tensor, tau: float, causal: bool) -> np.ndarray:
    s = (q @ k.T) / tau
    if causal:
        keep = torch.ones_like(s, dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1).numpy()


def _as_single_head(name: str, x) -> torch.Tensor:
    x = torch.as_tensor(x, dtype=torch.float64)
    if x.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [T, D] (one head)")
    return x


def attention_map_figure(q, k, temperatures: Sequence[float], *, active: int | None = None) -> go.Figure:
    """Attention weights ``softmax(q k^T / τ)`` for one head (``q [Tq, D]``, ``k [Tk, D]``), with a
    temperature slider and a causal on/off menu -- all precomputed, so it works in a static page."""
    q, k = _as_single_head("q", q), _as_single_head("k", k)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"k has shape {tuple(k.shape)}; expected (*, {q.shape[1]}) to match q")
    taus = _check_eps_values(temperatures)
    active = len(taus) // 2 if active is None else active
    causal_ok = q.shape[0] == k.shape[0]
    xs = [f"k{j}" for j in range(k.shape[0])]
    ys = [f"q{i}" for i in range(q.shape[0])]

    def traces(tau):
        out = [go.Heatmap(z=_attention_weights(q, k, tau, False), x=xs, y=ys, zmin=0, zmax=1,
                          colorscale="Viridis", visible=True, name="full",
                          hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>")]
        if causal_ok:
            out.append(go.Heatmap(z=_attention_weights(q, k, tau, True), x=xs, y=ys, zmin=0, zmax=1,
                                  colorscale="Viridis", visible=False, name="causal",
                                  hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>"))
        return out

    fig = go.Figure(data=traces(taus[active]))
    n = len(fig.data)
    # Frames carry z only, so that the causal menu's visibility choice survives slider moves.
    frames = [go.Frame(data=[go.Heatmap(z=tr.z) for tr in traces(t)], name=f"tau{i}", traces=list(range(n)))
              for i, t in enumerate(taus)]
    fig.update_layout(title="attention weights softmax(q·k / τ)", height=480,
                      yaxis=dict(autorange="reversed"), margin=dict(t=60, b=20))
    if causal_ok:
        fig.update_layout(updatemenus=[dict(type="buttons", direction="right", x=0.0, y=1.12,
                                            xanchor="left", buttons=[
            dict(label="full", method="restyle", args=[{"visible": [True, False]}]),
            dict(label="causal", method="restyle", args=[{"visible": [False, True]}]),
        ])])
    return add_frame_slider(fig, frames, [f"{t:.3g}" for t in taus], prefix="τ = ", active=active)


def weights_comparison_figure(steps: Sequence[Mapping[str, np.ndarray]], labels: Sequence[str], *,
                              prefix: str, title: str, active: int = 0, zmax: float | None = None) -> go.Figure:
    """Weight matrices side by side -- softmax's plan beside another mechanism's (implied) weights on
    the same input -- with a slider over a parameter (temperature, feature count, beta ...).

    ``steps[i]`` maps a panel name to a ``[T, T]`` weight matrix (row ``t``: the weights of query
    ``t`` on the values); every step has the same panel names. One diverging colour scale, centred
    on zero, for all panels and steps: a plan is all on one side of it, signed weights are not.
    Each panel's hover shows the entry; each frame's title reports, per panel, the range of the row
    sums and the smallest entry -- the two things that decide whether the rows are a transport plan
    (rows summing to 1, entries >= 0). ``zmax`` caps the colour scale (default: the largest |entry|;
    larger entries show in the end colour). Works in a static page (precomputed frames).
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
    if zmax is None:
        zmax = max(float(np.abs(W).max()) for row in mats for W in row) or 1.0
    zmax = _validate.check_positive("zmax", float(zmax))

    def describe(row):
        return "   |   ".join(f"{n}: row sums {W.sum(1).min():.2f}..{W.sum(1).max():.2f}, min {W.min():+.2f}"
                               for n, W in zip(names, row))

    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, horizontal_spacing=0.06)
    for c, W in enumerate(mats[active], start=1):
        fig.add_trace(go.Heatmap(z=W, zmin=-zmax, zmax=zmax, zmid=0.0, colorscale="RdBu_r", showscale=(c == 1),
                                 colorbar=dict(title="weight", len=0.8),
                                 hovertemplate="query %{y} → value %{x}: %{z:.3f}<extra></extra>"), row=1, col=c)
        fig.update_yaxes(autorange="reversed", row=1, col=c)
    frames = [go.Frame(data=[go.Heatmap(z=W) for W in row], name=f"s{i}", traces=list(range(len(names))),
                       layout=go.Layout(title_text=f"{title}<br><sup>{describe(row)}</sup>"))
              for i, row in enumerate(mats)]
    fig.update_layout(title=dict(text=f"{title}<br><sup>{describe(mats[active])}</sup>", font=dict(size=13)),
                      height=430, margin=dict(t=90, l=30, r=20, b=20))
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
        new = _plan_traces(one, True) + _plan_traces(two, False)
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

    q, k = _as_single_head("q", q), _as_single_head("k", k)
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
