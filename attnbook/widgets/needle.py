"""Chapter 2's figures: probe maps with the planted needle, the exact row against the algorithm's row,
error curves and work curves.

Static versions (``*_figure``) precompute every slider step as a Plotly frame, so they work in the
built book; :func:`needle_explorer` is the live ipywidgets version (algorithm, M, T). They draw what
:mod:`attnbook.experiments.needle` computes (probe maps, planted rows, the maps of whole rows); a live
explorer takes the function that computes a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnbook.experiments.needle import ALGORITHMS, NeedleMap, PlantedRow, ProbeMap

from ._slider import add_frame_slider, check_steps
from ._style import colorbar, colour, merge_meta, stack_panels, title, top_margin

EXACT_COLOR, ALGO_COLOR, NEEDLE_COLOR = colour(0), colour(1), colour(4)


# What a figure calls each algorithm of :data:`attnbook.experiments.needle.ALGORITHMS` (words, not code
# names), and what it calls each kind.
LABELS = {"sliding_window": "sliding window", "strided": "strided", "random_keys": "random keys",
          "indexer_topk": "top-k (indexer)", "lsh": "LSH buckets", "performer": "Performer",
          "linformer": "Linformer", "norm_screen": "norm screen"}
KINDS = {"pattern": "fixed pattern", "random": "random sample", "reads vectors": "reads the vectors",
         "features": "random features", "low rank": "low rank"}


def label(name: str) -> str:
    """An algorithm's name in words, as the figures show it ("sliding_window" -> "sliding window")."""
    return LABELS.get(name, name.replace("_", " "))


def slider_label(name: str) -> str:
    """An algorithm's name as a slider step label: one word per line, so that eight fit side by side."""
    return label(name).replace(" ", "<br>")




def _caption(pm: ProbeMap) -> dict:
    seen = "no exact score" if pm.n_probes is None else \
        f"{pm.n_probes} of {pm.T ** 2} scores ({pm.probe_fraction:.1%})"
    return title(f"{label(pm.name)} ({KINDS.get(pm.kind, pm.kind)})",
                 f"computes {seen}<br>needle (i = {pm.i}, j = {pm.j}), M = {pm.M:g}: "
                 f"L1 error {pm.error:.3f}")


def _needle_peak(row: PlantedRow) -> go.Scatter:
    """A marker on the exact row's spike at the needle's key ``j``: one key wide, the spike alone is
    a hairline."""
    return go.Scatter(x=[row.j], y=[row.exact[row.j]], mode="markers", name="the needle's key j",
                      cliponaxis=False, marker=dict(symbol="circle-open", size=12, color=NEEDLE_COLOR,
                                                    line=dict(width=2.5)))


def probe_map_figure(maps: Sequence[ProbeMap], *, active: int = 0) -> go.Figure:
    """For each algorithm (a slider step): left, its probe map on its own adversarial input
    (query rows, key columns; dark = score computed) with the needle ``(i, j)`` marked; right, the
    planted row: exact attention (blue) vs the algorithm's (red).

    ``maps``: :func:`attnbook.experiments.needle.probe_maps` (one :class:`~attnbook.experiments.needle.ProbeMap`
    per algorithm)."""
    maps = check_steps("maps", maps, ProbeMap)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.16,
                        subplot_titles=("probe map", "planted row i"))
    frames, labels, caps = [], [], []
    for n, pm in enumerate(maps):
        caps.append(_caption(pm))
        if n == active:
            fig.add_trace(go.Heatmap(z=pm.probes, zmin=0, zmax=1, colorscale=[[0, "#f4f4f4"], [1, "#2b3a55"]],
                                     showscale=False, hovertemplate="q%{y} · k%{x}: %{z}<extra></extra>"),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=[pm.j], y=[pm.i], mode="markers", name="needle (i, j)", cliponaxis=False,
                                     marker=dict(symbol="x", size=14, color=NEEDLE_COLOR, line=dict(width=2))),
                          row=1, col=1)
            fig.add_trace(go.Scatter(y=pm.exact, mode="lines", name="exact row", line=dict(color=EXACT_COLOR)),
                          row=1, col=2)
            fig.add_trace(go.Scatter(y=pm.got, mode="lines", name="algorithm's row",
                                     line=dict(color=ALGO_COLOR, dash="dot")), row=1, col=2)
            fig.add_trace(_needle_peak(pm), row=1, col=2)
        frames.append(go.Frame(data=[go.Heatmap(z=pm.probes), go.Scatter(x=[pm.j], y=[pm.i]),
                                     go.Scatter(y=pm.exact), go.Scatter(y=pm.got),
                                     go.Scatter(x=[pm.j], y=[pm.exact[pm.j]])],
                               name=f"algo{n}", traces=[0, 1, 2, 3, 4],
                               layout=go.Layout(title=caps[-1])))
        labels.append(slider_label(pm.name))
    T = maps[0].T
    fig.update_layout(title=caps[active], height=540, margin=dict(t=top_margin(1, 2, 1)))
    fig.update_yaxes(range=[T - 0.5, -0.5], title_text="query i", row=1, col=1)
    fig.update_xaxes(range=[-0.5, T - 0.5], title_text="key j (dark: score computed)", row=1, col=1)
    fig.update_xaxes(range=[-0.5, T - 0.5], title_text="key j", row=1, col=2)
    fig.update_yaxes(range=[-0.05, 1.05], title_text="attention weight", row=1, col=2)
    return add_frame_slider(fig, frames, labels, prefix="algorithm: ", active=active)


def row_vs_M_figure(rows: Sequence[PlantedRow], *, active: int | None = None) -> go.Figure:
    """The planted row of one algorithm as the needle grows: a slider over ``M``.

    ``rows``: :func:`attnbook.experiments.needle.rows_vs_M` (one :class:`~attnbook.experiments.needle.PlantedRow`
    per needle score ``M``)."""
    rows = check_steps("rows", rows, PlantedRow)
    active = len(rows) // 2 if active is None else active
    frames, caps = [], []
    for n, row in enumerate(rows):
        caps.append(title(f"{label(row.name)}: the planted row as M grows",
                          f"M = {row.M:g}, needle mass π(M) = {row.needle_mass:.3f}, L1 error {row.error:.3f}"))
        if n == active:
            fig = go.Figure([go.Scatter(y=row.exact, mode="lines", name="exact row", line=dict(color=EXACT_COLOR)),
                             go.Scatter(y=row.got, mode="lines", name="algorithm's row",
                                        line=dict(color=ALGO_COLOR, dash="dot"))])
        frames.append(go.Frame(data=[go.Scatter(y=row.exact), go.Scatter(y=row.got)], name=f"M{n}", traces=[0, 1],
                               layout=go.Layout(title=caps[-1])))
    fig.update_layout(title=caps[active], height=420, margin=dict(t=top_margin(1, 1)),
                      xaxis=dict(title="key j", range=[-0.5, rows[0].T - 0.5]),
                      yaxis=dict(title="attention weight", range=[-0.05, 1.05]))
    return add_frame_slider(fig, frames, [f"{row.M:g}" for row in rows], prefix="M = ", active=active)


def error_curves_figure(x_values: Sequence[float], errors: dict[str, Sequence[float]], *, x_title: str,
                        log_x: bool = False, reference: Sequence[float] | None = None,
                        reference_name: str = "", title: str | None = None) -> go.Figure:
    """L1 error on the planted row against ``M`` or ``T``, one line per algorithm; the limit 2 dashed
    (its label at the left end, clear of labels a caller puts at the top of a vertical line)."""
    fig = go.Figure()
    for name, errs in errors.items():
        fig.add_trace(go.Scatter(x=list(x_values), y=list(errs), mode="lines+markers", name=label(name)))
    if reference is not None:
        fig.add_trace(go.Scatter(x=list(x_values), y=list(reference), mode="lines", name=reference_name,
                                 line=dict(color="black", dash="dot")))
    fig.add_hline(y=2.0, line=dict(color="grey", dash="dash"), annotation_text="2 (the limit)",
                  annotation_position="bottom left")
    fig.update_layout(height=460, xaxis_title=x_title, yaxis=dict(title="L1 error on row i", range=[0, 2.1]),
                      title=title or f"Error on the planted row against {x_title}")
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def error_vs_M_by_T_figure(T_values: Sequence[int], M_values: Sequence[float],
                           errors: dict[int, dict[str, Sequence[float]]], *, active: int = 0) -> go.Figure:
    """Error-vs-M curves of every algorithm, with a slider over ``T`` (``errors[T][name]``)."""
    names = list(errors[T_values[active]])
    fig = go.Figure([go.Scatter(x=list(M_values), y=list(errors[T_values[active]][n]), mode="lines+markers",
                                name=label(n)) for n in names])
    def title(T):
        return f"Error against the needle's score, T = {T}"

    frames = [go.Frame(data=[go.Scatter(y=list(errors[T][n])) for n in names], name=f"T{t}",
                       traces=list(range(len(names))), layout=go.Layout(title_text=title(T)))
              for t, T in enumerate(T_values)]
    fig.add_hline(y=2.0, line=dict(color="grey", dash="dash"), annotation_text="2 (the limit)",
                  annotation_position="bottom left")
    fig.update_layout(title=title(T_values[active]), height=480, xaxis=dict(title="needle score M", type="log"),
                      yaxis=dict(title="L1 error on row i", range=[0, 2.1]))
    return add_frame_slider(fig, frames, [str(T) for T in T_values], prefix="T = ", active=active)


def work_figure(T_values: Sequence[int], work: dict[str, Sequence[float]]) -> go.Figure:
    """Work (score equivalents) against ``T`` on log-log axes, with exact attention's ``T^2``."""
    Ts = list(T_values)
    fig = go.Figure([go.Scatter(x=Ts, y=list(w), mode="lines+markers", name=label(n))
                     for n, w in work.items()])
    fig.add_trace(go.Scatter(x=Ts, y=[t * t for t in Ts], mode="lines", name="exact: T²",
                             line=dict(color="black", width=3, dash="dash")))
    fig.update_layout(height=460, xaxis=dict(title="sequence length T", type="log"),
                      yaxis=dict(title="work (score equivalents)", type="log"),
                      title="Work of each algorithm against T²")
    return fig


def needle_explorer(map_at: Callable[[str, int, float], ProbeMap], *, names: Sequence[str] | None = None,
                    T_values: Sequence[int] = (64, 128, 256, 512)):
    """Live version of :func:`probe_map_figure` (needs a running kernel): algorithm menu, log slider over
    M, T menu. ``map_at(name, T, M)`` computes the step, e.g.
    ``attnbook.experiments.needle.probe_map_at(d=16)``; ``names`` are the menu's algorithms (default:
    every one in ``attnbook.experiments.needle.ALGORITHMS``)."""
    import ipywidgets as W

    names = sorted(ALGORITHMS) if names is None else list(names)
    algo_w = W.Dropdown(options=names, value="sliding_window" if "sliding_window" in names else names[0],
                        description="algorithm")
    T_w = W.Dropdown(options=list(T_values), value=256 if 256 in T_values else T_values[0], description="T")
    M_w = W.FloatLogSlider(value=80.0, min=-1, max=3, step=0.05, description="M", readout_format=".3g")
    static = probe_map_figure([map_at(algo_w.value, T_w.value, M_w.value)])
    static.frames, static.layout.sliders = (), ()
    fig = go.FigureWidget(static)

    def redraw(change=None):
        pm = map_at(algo_w.value, T_w.value, M_w.value)
        with fig.batch_update():
            fig.data[0].z = pm.probes
            fig.data[1].x, fig.data[1].y = [pm.j], [pm.i]
            fig.data[2].y, fig.data[3].y = pm.exact, pm.got
            fig.data[4].x, fig.data[4].y = [pm.j], [pm.exact[pm.j]]
            fig.layout.title = _caption(pm)

    for w in (algo_w, T_w, M_w):
        w.observe(redraw, names="value")
    return W.VBox([W.HBox([algo_w, T_w]), M_w, fig])


# Probabilities of one row span 1/T (the haystack) to 1 (the needle): a colour scale whose steps sit at
# small weights shows both; the colour bar's ticks stay the weights themselves.
_PLAN_SCALE = [[0.0, "#ffffff"], [0.004, "#f0f6fc"], [0.02, "#c6dbef"], [0.08, "#6baed6"], [0.3, "#2171b5"],
               [1.0, "#08306b"]]


def needle_maps_figure(maps: Sequence[NeedleMap], *, active: int = 0) -> go.Figure:
    """What each algorithm computes on its own adversarial input, beside the exact plan (a slider step
    per algorithm): left, exact softmax attention (rows: queries, columns: keys); middle, the
    algorithm's rows (its output with one-hot values); both with the needle ``(i, j)`` marked and one
    colour scale, since both are probability rows. Right, where row ``i``'s unit of mass goes: onto
    the needle's key ``j`` or onto the other keys, exact against the algorithm's.

    ``maps``: :func:`attnbook.experiments.needle.needle_maps` (one :class:`~attnbook.experiments.needle.NeedleMap`
    per algorithm, all with one ``T``). Keep ``T`` small (the lab takes 56): every step stores two
    ``T x T`` float32 maps.
    """
    maps = check_steps("maps", maps, NeedleMap)
    T = maps[0].T
    if any(m.T != T for m in maps):
        raise ValueError(f"the maps must share one T; got {[m.T for m in maps]}")
    keys = list(range(T))
    def map_title(m: NeedleMap) -> dict:
        return title(f"{label(m.name)}: the attacked row i = {m.i}",
                     f"needle at key j = {m.j}, M = {m.M:g}<br>its mass: exact {m.on_needle[0]:.3f}, "
                     f"{label(m.name)} {m.on_needle[1]:.3f}<br>L1 error {m.error:.3f} (at most 2)")

    # Three panels and, in its own gap between the second map and the bars, the maps' colour bar; the
    # bars' axis sits on their right, so that nothing of theirs reaches into that gap.
    domains = ([0.0, 0.33], [0.385, 0.715], [0.875, 1.0])
    axes = {}
    for n in (1, 2):
        axes[f"xaxis{n if n > 1 else ''}"] = dict(range=[-0.5, T - 0.5], title_text="key j", domain=domains[n - 1])
        # the second map shares the first one's rows: its labels show only when the panels stack
        axes[f"yaxis{n if n > 1 else ''}"] = dict(range=[T - 0.5, -0.5], title_text="query i" if n == 1 else None,
                                                  showticklabels=n == 1)
    axes["yaxis3"] = dict(range=[0, 1.05], title_text="mass", side="right", tickvals=[0, 0.5, 1])
    axes["xaxis3"] = dict(title_text="on key j", domain=domains[2], tickangle=-90)
    fig = make_subplots(rows=1, cols=3, subplot_titles=("exact", "algorithm", "row i"))
    fig.update_layout(**axes)
    for n, ann in enumerate(fig.layout.annotations):              # the titles over the moved panels
        ann.x = sum(domains[n]) / 2
    shown = maps[active]
    for col, Z, who in ((1, shown.exact, "exact"), (2, shown.got, "algorithm")):
        fig.add_trace(go.Heatmap(z=Z, x=keys, y=keys, zmin=0.0, zmax=1.0, colorscale=_PLAN_SCALE,
                                 showscale=(col == 2),
                                 colorbar=colorbar(fig, ["xaxis2", "yaxis2"], title="weight", gap=0.015,
                                                   tickvals=[0, 0.1, 0.3, 1], len=0.75),
                                 hovertemplate=f"query %{{y}} → key %{{x}}: %{{z:.3f}}<extra>{who}</extra>"),
                      row=1, col=col)
    for col in (1, 2):
        fig.add_trace(go.Scatter(x=[shown.j], y=[shown.i], mode="markers", name="needle (i, j)", showlegend=(col == 1),
                                 cliponaxis=False,
                                 marker=dict(symbol="circle-open", size=14, color=NEEDLE_COLOR, line=dict(width=3))),
                      row=1, col=col)
    fig.add_trace(go.Bar(x=["exact", "algorithm"], y=list(shown.on_needle), name="row i: on the needle's key j",
                         marker_color=NEEDLE_COLOR),
                  row=1, col=3)
    fig.add_trace(go.Bar(x=["exact", "algorithm"], y=list(shown.elsewhere), name="row i: on the other keys",
                         marker_color=colour(5)),
                  row=1, col=3)
    frames = []
    for n, m in enumerate(maps):
        frames.append(go.Frame(
            data=[go.Heatmap(z=m.exact), go.Heatmap(z=m.got), go.Scatter(x=[m.j], y=[m.i]),
                  go.Scatter(x=[m.j], y=[m.i]), go.Bar(y=list(m.on_needle)), go.Bar(y=list(m.elsewhere))],
            traces=[0, 1, 2, 3, 4, 5], name=f"algo{n}",
            layout=go.Layout(title=map_title(m), **axes)))
    fig.update_layout(title=map_title(shown), height=500, barmode="stack",
                      margin=dict(t=top_margin(1, 3, 1), l=60, r=40, b=40))
    merge_meta(fig, mechanism_map="subquadratic attention algorithms")
    # Narrow screens: the two maps and the bars one under the other.
    stack_panels(fig, [["xaxis", "yaxis"], ["xaxis2", "yaxis2"], ["xaxis3", "yaxis3"]],
                 heights=[330, 330, 220],
                 narrow={"yaxis2.title.text": "query i", "yaxis2.showticklabels": True})
    return add_frame_slider(fig, frames, [slider_label(m.name) for m in maps], prefix="algorithm: ",
                            active=active)


__all__ = ["LABELS", "error_curves_figure", "error_vs_M_by_T_figure", "label", "needle_explorer",
           "needle_maps_figure", "probe_map_figure", "row_vs_M_figure", "work_figure"]
