"""Chapter 5's figures: ANNA's weights as a transport plan beside softmax's, collision curves, and
the ANNA conditions over (l, z).

``anna_plan_figure`` draws chapter 1's plan panels (:mod:`._plan`) (heatmap, row sums, column sums); its slider
steps are precomputed frames, one per (l, z), so it works in the static book. The plans are computed by
:mod:`attnbook.experiments.anna` (:func:`~attnbook.experiments.anna.anna_plans`); the live explorer takes the
function that computes a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from attnbook.experiments.anna import AnnaPlan

from ._plan import plan_frame_traces, plan_pair_figure
from ._slider import SLIDER_PX, add_frame_slider, check_steps
from ._style import colour, top_margin
from ._style import title as _title_dict


def _title(plan: AnnaPlan) -> dict:
    sm, an = plan.softmax_stats, plan.anna_stats
    return _title_dict(f"ANNA: l = {plan.n_tables} tables of z = {plan.n_bits} bits",
                 f"entropy: softmax (τ = {plan.tau:g}) {sm.entropy:.2f}, ANNA {an.entropy:.2f}<br>"
                 f"cells with mass: softmax {sm.support}/{sm.size}, ANNA {an.support}/{an.size}<br>"
                 f"ANNA: {an.empty_rows} empty rows; largest column sum {an.max_column_sum:.2f}")


def _anna_restyle(fig: go.Figure, plan: AnnaPlan) -> dict:
    """``restyle`` data for ANNA's three traces (3: map, 4: row sums, 5: column sums), every coordinate
    restated (a ``None`` would reset it)."""
    heat, rows, cols = plan_frame_traces(plan.anna)
    m, r, c = fig.data[3], fig.data[4], fig.data[5]
    return {"z": [heat.z, None, None], "x": [m.x, rows.x, c.x], "y": [m.y, r.y, cols.y]}


def anna_plan_figure(plans: Sequence[AnnaPlan], *, active: int = 0) -> go.Figure:
    """Softmax's plan ``softmax(q k^T / tau)`` (left, fixed) beside ANNA's plan (right), for every
    ``(l, z)`` of a grid: a slider over the number of tables ``l`` (at the ``z`` shown) and buttons for
    the bits per table ``z`` (at the ``l`` shown), so that either can be varied with the other fixed.
    ``plans``: :func:`attnbook.experiments.anna.anna_plans`, one per pair of the grid ``ls x zs`` (any
    order); ``active`` the one shown first. Bars: row sums (right of each map) and column sums (below).
    Rows of ANNA's plan sum to 1 or to 0 (a query that collided with nothing ships no mass).

    Static: every pair is precomputed. There is one ``l`` slider per ``z`` and one row of ``z``
    buttons per ``l``; only those of the pair shown are visible, and each step restyles ANNA's traces
    and shows the other control's copy for its new value, set to the value kept."""
    plans = check_steps("plans", plans, AnnaPlan, what="one per (n_tables, n_bits) pair")
    ls = sorted({pl.n_tables for pl in plans})
    zs = sorted({pl.n_bits for pl in plans})
    grid = {(pl.n_tables, pl.n_bits): pl for pl in plans}
    if len(grid) != len(plans) or len(grid) != len(ls) * len(zs):
        raise ValueError("plans must hold each (n_tables, n_bits) pair of a grid ls x zs once; got "
                         f"{[(pl.n_tables, pl.n_bits) for pl in plans]}")
    shown = plans[active]
    l0, z0 = ls.index(shown.n_tables), zs.index(shown.n_bits)
    fig = plan_pair_figure(shown.softmax, shown.anna, ("softmax plan", "ANNA plan"), row_sum_max=1.2,
                           column_sum_max=float(shown.softmax.shape[0]), height=620)

    def step(l: int, z: int, layout: dict) -> list:
        pl = grid[l, z]
        return [_anna_restyle(fig, pl), {"title": _title(pl), **layout}, [3, 4, 5]]

    # slider b: l at z = zs[b]; moving it shows the z buttons of the new l, with z = zs[b] lit
    sliders = [dict(active=l0, visible=(b == z0), currentvalue=dict(prefix=f"tables l (z = {z}): "),
                    steps=[dict(method="update", label=str(l),
                                args=step(l, z, {**{f"updatemenus[{a2}].visible": a2 == a for a2 in range(len(ls))},
                                                 f"updatemenus[{a}].active": b}))
                           for a, l in enumerate(ls)])
               for b, z in enumerate(zs)]
    # buttons a: z at l = ls[a]; a click shows the l slider of the new z, at l = ls[a]
    menus = [dict(type="buttons", direction="right", active=z0, visible=(a == l0), showactive=True,
                  x=0.0, xanchor="left", y=1.0, yanchor="bottom", pad=dict(b=34, l=120),
                  buttons=[dict(method="update", label=f"z = {z}",
                                args=step(l, z, {**{f"sliders[{b2}].visible": b2 == b for b2 in range(len(zs))},
                                                 f"sliders[{b}].active": a}))
                           for b, z in enumerate(zs)])
             for a, l in enumerate(ls)]
    fig.add_annotation(text="bits per table:", x=0.0, xref="paper", xanchor="left", y=1.0, yref="paper",
                       yanchor="bottom", yshift=40, showarrow=False)
    fig.update_layout(title=_title(shown), sliders=sliders, updatemenus=menus,
                      margin=dict(t=top_margin(1, 3, 1) + 40, b=SLIDER_PX + 50),
                      height=620 + 40 + SLIDER_PX)
    return fig


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
    step, e.g. ``attnbook.experiments.anna.anna_plan_at(q, k, tau=0.1)``."""
    import ipywidgets as W

    static = anna_plan_figure([plan_at(4, 4, seed)])
    static.frames = ()
    static.layout.sliders, static.layout.updatemenus = (), ()
    static.layout.annotations = [a for a in static.layout.annotations if a.text != "bits per table:"]
    fig = go.FigureWidget(static)
    l_slider = W.IntSlider(value=4, min=1, max=max_tables, description="l (tables)")
    z_slider = W.IntSlider(value=4, min=1, max=max_bits, description="z (bits)")
    s_slider = W.IntSlider(value=seed, min=0, max=99, description="seed")

    def redraw(change=None):
        plan = plan_at(l_slider.value, z_slider.value, s_slider.value)
        heat, rows, cols = plan_frame_traces(plan.anna)
        with fig.batch_update():
            fig.data[3].z, fig.data[4].x, fig.data[5].y = heat.z, rows.x, cols.y
            fig.layout.title = _title(plan)

    for s in (l_slider, z_slider, s_slider):
        s.observe(redraw, names="value")
    return W.VBox([W.HBox([l_slider, z_slider, s_slider]), fig])


# The stand-ins a model is trained through (attnbook.experiments.anna.SURROGATES), in words.
STAND_INS = {"softmax": "the softmax stand-in", "simhash_limit": "the SimHash-limit stand-in"}


def reproduction_figure(summary: dict, ls, zs, *, show_zs=None, title: str = "") -> go.Figure:
    """Error of the distilled ANNA model against the number of tables ``l``, one line per ``z`` (mean
    over seeds, error bars one standard deviation), ending at ``l = ∞`` where the summary has the
    many-table limit (``limit_error``), with a slider over the surrogate the model was trained through.
    ``summary`` is ``attnbook.experiments.anna.summarise_reproduction``'s output; ``ls`` may hold
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

    def head(n):
        return _title_dict(title, f"trained through {STAND_INS.get(n, n)} ({summary[n]['n_seeds']} seeds)")

    frames = [go.Frame(data=traces(n), name=n, layout=go.Layout(title=head(n))) for n in names]
    fig = go.Figure(data=frames[0].data, layout=go.Layout(title=head(names[0])))
    fig.update_xaxes(title_text="tables l" + (" (layer 1 / layer 2)" if "/" in x[0] else "")
                     + (";  ∞: the many-table limit" if with_limit else ""), type="category")
    fig.update_yaxes(title_text="per-token error", range=[-0.02, 1.0])
    fig.update_layout(height=500)
    short = {"softmax": "softmax", "simhash_limit": "SimHash<br>limit"}
    return add_frame_slider(fig, frames, [short.get(n, n.replace("_", "<br>")) for n in names],
                            prefix="trained through: ")
