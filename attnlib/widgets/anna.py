"""Chapter 5's figures: ANNA's weights as a transport plan beside softmax's, collision curves, and
the ANNA conditions over (l, z).

``anna_plan_figure`` draws chapter 1's plan panels (:mod:`._plan`) (heatmap, row sums, column sums); its slider
steps are precomputed frames, one per (l, z), so it works in the static book. The plans are computed by
:mod:`attnlib.experiments.anna` (:func:`~attnlib.experiments.anna.anna_plans`); the live explorer takes the
function that computes a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from ..experiments.anna import AnnaPlan, PlanStats
from ._plan import plan_frame_traces, plan_pair_figure
from ._slider import add_frame_slider, check_steps
from ._style import colour


def _stats_text(st: PlanStats) -> str:
    return (f"H {st.entropy:.2f}, support {st.support}/{st.size}, "
            f"{st.empty_rows} empty, col ≤ {st.max_column_sum:.2f}")


def _title(plan: AnnaPlan) -> str:
    return (f"ANNA with l = {plan.n_tables} tables of z = {plan.n_bits} bits<br><sup>softmax (τ={plan.tau:g}): "
            f"{_stats_text(plan.softmax_stats)}<br>ANNA: {_stats_text(plan.anna_stats)}</sup>")


def anna_plan_figure(plans: Sequence[AnnaPlan], *, active: int = 0) -> go.Figure:
    """Softmax's plan ``softmax(q k^T / tau)`` (left, fixed) beside ANNA's plan (right), one slider step
    per :class:`~attnlib.experiments.anna.AnnaPlan` (:func:`attnlib.experiments.anna.anna_plans`, one per
    ``(l, z)``). Bars: row sums (right of each map) and column sums (below). Rows of ANNA's plan sum to
    1 or to 0 (a query that collided with nothing ships no mass)."""
    plans = check_steps("plans", plans, AnnaPlan, what="one per (n_tables, n_bits) pair")
    frames = [go.Frame(data=plan_frame_traces(pl.softmax) + plan_frame_traces(pl.anna), name=f"lz{i}",
                       traces=list(range(6)), layout=go.Layout(title_text=_title(pl))) for i, pl in enumerate(plans)]
    shown = plans[active]
    fig = plan_pair_figure(shown.softmax, shown.anna, ("softmax plan", "ANNA plan"), row_sum_max=1.2,
                           column_sum_max=float(shown.softmax.shape[0]), height=620)
    fig.update_layout(title_text=_title(shown), margin=dict(t=110))
    return add_frame_slider(fig, frames, [f"{pl.n_tables},{pl.n_bits}" for pl in plans], prefix="(l, z) = ",
                            active=active)


def collision_figure(thetas, measured: dict, theory: dict | None = None, *, title: str = "") -> go.Figure:
    """Collision probability against the angle: ``measured`` (markers) and ``theory`` (lines), each a
    dict ``label -> values at thetas``."""
    x = [float(t) for t in thetas]
    fig = go.Figure()
    for i, (name, ys) in enumerate(measured.items()):
        fig.add_scatter(x=x, y=[float(y) for y in ys], mode="markers", name=f"{name} (measured)",
                        marker=dict(color=colour(i), size=8), legendgroup=name)
    for i, (name, ys) in enumerate((theory or {}).items(), start=len(measured)):
        fig.add_scatter(x=x, y=[float(y) for y in ys], mode="lines", name=f"{name} (theory)",
                        line=dict(color=colour(i)), legendgroup=name)
    fig.update_xaxes(title_text="angle θ between x and y (radians)")
    fig.update_yaxes(title_text="Pr[same bucket]", range=[-0.02, 1.02])
    fig.update_layout(title=title, height=440)
    return fig


def add_theory_and_measurement(fig: go.Figure, x, theory, measured, *, name: str, index: int) -> go.Figure:
    """Add one quantity to a figure twice, in one colour: its theory (a line) and its measurement
    (markers), named ``name``. ``index`` picks the colour (the book's colourway)."""
    c = colour(index)
    xs = [float(t) for t in x]
    fig.add_scatter(x=xs, y=[float(y) for y in theory], mode="lines", name=f"{name} theory",
                    line=dict(color=c), legendgroup=name)
    fig.add_scatter(x=xs, y=[float(y) for y in measured], mode="markers", name=f"{name} measured",
                    marker=dict(color=c, size=8), legendgroup=name)
    return fig


def conditions_heatmap(l_values, z_values, fraction, *, title: str = "") -> go.Figure:
    """Fraction of queries meeting both ANNA conditions, ``fraction [len(l_values), len(z_values)]``."""
    fig = go.Figure(go.Heatmap(z=[[float(f) for f in row] for row in fraction], x=[str(z) for z in z_values],
                               y=[str(l) for l in l_values], zmin=0, zmax=1, colorscale="Viridis",
                               text=[[f"{float(f):.2f}" for f in row] for row in fraction], texttemplate="%{text}",
                               hovertemplate="l=%{y}, z=%{x}: %{z:.2f}<extra></extra>"))
    fig.update_xaxes(title_text="z (hashes per table)")
    fig.update_yaxes(title_text="l (tables)")
    fig.update_layout(title=title, height=420)
    return fig


def anna_plan_explorer(plan_at: Callable[[int, int, int], AnnaPlan], *, seed: int = 0, max_tables: int = 64,
                       max_bits: int = 16):
    """Live version of :func:`anna_plan_figure` (needs a running kernel): separate sliders for ``l`` and
    ``z``, and the hash seed, so every combination can be explored. ``plan_at(l, z, seed)`` computes the
    step, e.g. ``attnlib.experiments.anna.anna_plan_at(q, k, tau=0.1)``."""
    import ipywidgets as W

    static = anna_plan_figure([plan_at(4, 4, seed)])
    static.frames = ()
    static.layout.sliders = ()
    fig = go.FigureWidget(static)
    l_slider = W.IntSlider(value=4, min=1, max=max_tables, description="l (tables)")
    z_slider = W.IntSlider(value=4, min=1, max=max_bits, description="z (bits)")
    s_slider = W.IntSlider(value=seed, min=0, max=99, description="seed")

    def redraw(change=None):
        plan = plan_at(l_slider.value, z_slider.value, s_slider.value)
        heat, rows, cols = plan_frame_traces(plan.anna)
        with fig.batch_update():
            fig.data[3].z, fig.data[4].x, fig.data[5].y = heat.z, rows.x, cols.y
            fig.layout.title.text = _title(plan)

    for s in (l_slider, z_slider, s_slider):
        s.observe(redraw, names="value")
    return W.VBox([W.HBox([l_slider, z_slider, s_slider]), fig])


def reproduction_figure(summary: dict, ls, zs, *, show_zs=None, title: str = "") -> go.Figure:
    """Error of the distilled ANNA model against the number of tables ``l``, one line per ``z`` (mean
    over seeds, error bars one standard deviation), ending at ``l = ∞`` where the summary has the
    many-table limit (``limit_error``), with a slider over the surrogate the model was trained through.
    ``summary`` is ``attnlib.experiments.anna.summarise_reproduction``'s output; ``ls`` may hold
    per-layer tuples (shown as ``l1/l2``); ``show_zs`` picks the lines drawn (default: every ``z``)."""
    names = list(summary)
    x = ["/".join(map(str, l)) if isinstance(l, (tuple, list)) else str(l) for l in ls]
    shown = list(zs) if show_zs is None else list(show_zs)
    missing = [z for z in shown if z not in zs]
    if missing:
        raise ValueError(f"show_zs must be a subset of zs = {list(zs)}; got {missing} outside it")
    with_limit = all("limit_error_mean" in summary[n] for n in names)
    xs = x + ["∞"] if with_limit else x

    def traces(name):
        s = summary[name]
        out = []
        for z in shown:
            b = list(zs).index(z)
            y, e = s["anna_error_mean"][:, b].tolist(), s["anna_error_std"][:, b].tolist()
            if with_limit:
                y, e = y + [s["limit_error_mean"][b].item()], e + [s["limit_error_std"][b].item()]
            out.append(go.Scatter(x=xs, y=y, mode="lines+markers", name=f"z = {z}",
                                  error_y=dict(type="data", array=e, visible=True)))
        m, sd = s["surrogate_error"]
        out.append(go.Scatter(x=[xs[0], xs[-1]], y=[m, m], mode="lines", line=dict(dash="dash", color="black"),
                              name=f"the stand-in itself ({m:.3f} ± {sd:.3f})"))
        return out

    frames = [go.Frame(data=traces(n), name=n, layout=go.Layout(
        title_text=f"{title}<br><sup>trained through: {n} ({summary[n]['n_seeds']} seeds)</sup>")) for n in names]
    fig = go.Figure(data=frames[0].data, layout=go.Layout(title_text=frames[0].layout.title.text))
    fig.update_xaxes(title_text="tables l" + (" (layer 1 / layer 2)" if "/" in x[0] else "")
                     + (";  ∞: the many-table limit" if with_limit else ""), type="category")
    fig.update_yaxes(title_text="per-token error", range=[-0.02, 1.0])
    fig.update_layout(height=500)
    return add_frame_slider(fig, frames, [n.replace("_", "<br>") for n in names], prefix="trained through: ")
