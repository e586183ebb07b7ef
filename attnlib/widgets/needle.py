"""Chapter 2's figures: probe maps with the planted needle, the exact row against the algorithm's row,
error curves and work curves.

Static versions (``*_figure``) precompute every slider step as a Plotly frame, so they work in the
built book; :func:`needle_explorer` is the live ipywidgets version (algorithm, M, T).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .. import needle
from ._slider import add_frame_slider
from ._style import colour, wrap

EXACT_COLOR, ALGO_COLOR, NEEDLE_COLOR = colour(0), colour(1), colour(4)


def slider_label(name: str) -> str:
    """An algorithm's name as a slider step label: one word per line, so that eight fit side by side."""
    return name.replace("_", "<br>")


def _probe_z(algo, case) -> np.ndarray:
    """0/1 map of the exact scores computed (all 0 for feature / low-rank algorithms)."""
    p = algo.probes(case.q, case.k)
    if p is None:
        return np.zeros((case.T, case.T), dtype=np.uint8)
    return p.numpy().astype(np.uint8)


def _rows(algo, case) -> tuple[np.ndarray, np.ndarray, float]:
    exact = needle.exact_rows(case)[case.i].numpy()
    got = algo.attend(case.q, case.k, case.v)[0, 0, case.i].double().numpy()
    return exact, got, float(np.abs(exact - got).sum())


def _caption(algo, case, err) -> str:
    p = algo.probes(case.q, case.k)
    seen = "no exact score (features / low rank)" if p is None else \
        f"{int(p.sum())} of {case.T ** 2} scores ({p.float().mean().item():.1%})"
    return (f"{algo.name} [{algo.kind}] against the needle<br><sup>probes: {seen}<br>needle (i={case.i}, "
            f"j={case.j}), M={case.M:g}: L1 error {err:.3f}</sup>")


def probe_map_figure(algos: Sequence, *, M: float = 80.0, active: int = 0) -> go.Figure:
    """For each algorithm (a slider step): left, its probe map on its own adversarial input
    (query rows, key columns; dark = score computed) with the needle ``(i, j)`` marked; right, the
    planted row: exact attention (blue) vs the algorithm's (red)."""
    algos = list(algos)
    if not algos:
        raise ValueError("algos must hold at least one algorithm")
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.12,
                        subplot_titles=("probe map", "planted row i"))
    frames, labels, caps = [], [], []
    for n, algo in enumerate(algos):
        case = needle.attack(algo, M=M)
        z = _probe_z(algo, case)
        exact, got, err = _rows(algo, case)
        caps.append(_caption(algo, case, err))
        if n == active:
            fig.add_trace(go.Heatmap(z=z, zmin=0, zmax=1, colorscale=[[0, "#f4f4f4"], [1, "#2b3a55"]],
                                     showscale=False, hovertemplate="q%{y} · k%{x}: %{z}<extra></extra>"),
                          row=1, col=1)
            fig.add_trace(go.Scatter(x=[case.j], y=[case.i], mode="markers", name="needle (i, j)", cliponaxis=False,
                                     marker=dict(symbol="x", size=14, color=NEEDLE_COLOR, line=dict(width=2))),
                          row=1, col=1)
            fig.add_trace(go.Scatter(y=exact, mode="lines", name="exact row", line=dict(color=EXACT_COLOR)),
                          row=1, col=2)
            fig.add_trace(go.Scatter(y=got, mode="lines", name="algorithm's row",
                                     line=dict(color=ALGO_COLOR, dash="dot")), row=1, col=2)
        frames.append(go.Frame(data=[go.Heatmap(z=z), go.Scatter(x=[case.j], y=[case.i]),
                                     go.Scatter(y=exact), go.Scatter(y=got)],
                               name=f"algo{n}", traces=[0, 1, 2, 3],
                               layout=go.Layout(title_text=caps[-1])))
        labels.append(slider_label(algo.name))
    T = algos[0].T
    fig.update_layout(title_text=caps[active], height=540, margin=dict(t=110))
    fig.update_yaxes(range=[T - 0.5, -0.5], title_text="query i", row=1, col=1)
    fig.update_xaxes(range=[-0.5, T - 0.5], title_text="key j (dark: exact score computed)", row=1, col=1)
    fig.update_xaxes(range=[-0.5, T - 0.5], title_text="key j", row=1, col=2)
    fig.update_yaxes(range=[-0.05, 1.05], title_text="attention weight", row=1, col=2)
    return add_frame_slider(fig, frames, labels, prefix="algorithm: ", active=active)


def row_vs_M_figure(algo, M_values: Sequence[float], *, active: int | None = None) -> go.Figure:
    """The planted row of one algorithm as the needle grows: a slider over ``M``."""
    Ms = [float(m) for m in M_values]
    if not Ms:
        raise ValueError("M_values must hold at least one value")
    active = len(Ms) // 2 if active is None else active
    frames, caps = [], []
    for n, M in enumerate(Ms):
        case = needle.attack(algo, M=M)
        exact, got, err = _rows(algo, case)
        caps.append(f"{algo.name}: the planted row as M grows<br><sup>M = {M:g}, needle mass "
                    f"π(M) = {needle.needle_mass(case.T, M):.3f}, L1 error {err:.3f}</sup>")
        if n == active:
            fig = go.Figure([go.Scatter(y=exact, mode="lines", name="exact row", line=dict(color=EXACT_COLOR)),
                             go.Scatter(y=got, mode="lines", name="algorithm's row",
                                        line=dict(color=ALGO_COLOR, dash="dot"))])
        frames.append(go.Frame(data=[go.Scatter(y=exact), go.Scatter(y=got)], name=f"M{n}", traces=[0, 1],
                               layout=go.Layout(title_text=caps[-1])))
    fig.update_layout(title_text=caps[active], height=420, margin=dict(t=90),
                      xaxis=dict(title="key j", range=[-0.5, algo.T - 0.5]),
                      yaxis=dict(title="attention weight", range=[-0.05, 1.05]))
    return add_frame_slider(fig, frames, [f"{m:g}" for m in Ms], prefix="M = ", active=active)


def error_curves_figure(x_values: Sequence[float], errors: dict[str, Sequence[float]], *, x_title: str,
                        log_x: bool = False, reference: Sequence[float] | None = None,
                        reference_name: str = "", title: str | None = None) -> go.Figure:
    """L1 error on the planted row against ``M`` or ``T``, one line per algorithm; the limit 2 dashed
    (its label at the left end, clear of labels a caller puts at the top of a vertical line)."""
    fig = go.Figure()
    for name, errs in errors.items():
        fig.add_trace(go.Scatter(x=list(x_values), y=list(errs), mode="lines+markers", name=name))
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
                                name=n) for n in names])
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
    fig = go.Figure([go.Scatter(x=Ts, y=list(w), mode="lines+markers", name=n) for n, w in work.items()])
    fig.add_trace(go.Scatter(x=Ts, y=[t * t for t in Ts], mode="lines", name="exact: T²",
                             line=dict(color="black", width=3, dash="dash")))
    fig.update_layout(height=460, xaxis=dict(title="sequence length T", type="log"),
                      yaxis=dict(title="work (score equivalents)", type="log"),
                      title="Work of each algorithm against T²")
    return fig


def needle_explorer(*, d: int = 16, T_values: Sequence[int] = (64, 128, 256, 512)):
    """Live version (needs a running kernel): algorithm menu, log slider over M, T menu."""
    import ipywidgets as W

    names = sorted(needle.ALGORITHMS)
    algo_w = W.Dropdown(options=names, value="sliding_window", description="algorithm")
    T_w = W.Dropdown(options=list(T_values), value=256 if 256 in T_values else T_values[0], description="T")
    M_w = W.FloatLogSlider(value=80.0, min=-1, max=3, step=0.05, description="M", readout_format=".3g")
    static = probe_map_figure([needle.make(algo_w.value, T=T_w.value, d=d)], M=M_w.value)
    static.frames, static.layout.sliders = (), ()
    fig = go.FigureWidget(static)
    cache: dict = {}

    def redraw(change=None):
        key = (algo_w.value, T_w.value)
        if key not in cache:
            cache[key] = needle.make(algo_w.value, T=T_w.value, d=d)
        algo = cache[key]
        case = needle.attack(algo, M=M_w.value)
        exact, got, err = _rows(algo, case)
        with fig.batch_update():
            fig.data[0].z = _probe_z(algo, case)
            fig.data[1].x, fig.data[1].y = [case.j], [case.i]
            fig.data[2].y, fig.data[3].y = exact, got
            fig.layout.title.text = _caption(algo, case, err)

    for w in (algo_w, T_w, M_w):
        w.observe(redraw, names="value")
    return W.VBox([W.HBox([algo_w, T_w]), M_w, fig])


# Probabilities of one row span 1/T (the haystack) to 1 (the needle): a colour scale whose steps sit at
# small weights shows both; the colour bar's ticks stay the weights themselves.
_PLAN_SCALE = [[0.0, "#ffffff"], [0.004, "#f0f6fc"], [0.02, "#c6dbef"], [0.08, "#6baed6"], [0.3, "#2171b5"],
               [1.0, "#08306b"]]


def needle_maps_figure(algos: Sequence, *, M: float = 80.0, active: int = 0) -> go.Figure:
    """What each algorithm computes on its own adversarial input, beside the exact plan (a slider step
    per algorithm): left, exact softmax attention (rows: queries, columns: keys); middle, the
    algorithm's rows (its output with one-hot values); both with the needle ``(i, j)`` marked and one
    colour scale, since both are probability rows. Right, where row ``i``'s unit of mass goes: onto
    the needle's key ``j`` or onto the other keys, exact against the algorithm's.

    Keep ``T`` small (the lab takes 56): every step stores two ``T x T`` float32 maps.
    """
    algos = list(algos)
    if not algos:
        raise ValueError("algos must hold at least one algorithm")
    T = algos[0].T
    if any(a.T != T for a in algos):
        raise ValueError(f"the algorithms must share one T; got {[a.T for a in algos]}")
    keys = list(range(T))
    steps = []
    for algo in algos:
        case = needle.attack(algo, M=M)
        exact, got = needle.exact_rows(case).numpy(), needle.algorithm_rows(algo, case).numpy()
        err = float(np.abs(exact[case.i] - got[case.i]).sum())
        steps.append((algo, case, exact.astype(np.float32), got.astype(np.float32), err))

    def title(algo, case, err, exact, got):
        return (f"{algo.name}: the attacked row i = {case.i}<br><sup>needle at key j = {case.j}, M = {case.M:g}<br>"
                f"its mass: exact {exact[case.i, case.j]:.3f}, {algo.name} {got[case.i, case.j]:.3f}<br>"
                f"L1 error {err:.3f} (at most 2)</sup>")

    def mass(exact, got, case):
        on_j = [float(exact[case.i, case.j]), float(got[case.i, case.j])]
        return on_j, [float(exact[case.i].sum()) - on_j[0], float(got[case.i].sum()) - on_j[1]]

    axes = {}
    for n in (1, 2):
        axes[f"xaxis{n if n > 1 else ''}"] = dict(range=[-0.5, T - 0.5], title_text="key position j")
        axes[f"yaxis{n if n > 1 else ''}"] = dict(range=[T - 0.5, -0.5], title_text="query position i")
    axes["yaxis3"] = dict(range=[0, 1.05], title_text="mass", title_standoff=4)
    axes["xaxis3"] = dict(title_text="row i")
    fig = make_subplots(rows=1, cols=3, column_widths=[0.39, 0.39, 0.22], horizontal_spacing=0.12,
                        subplot_titles=[wrap(s, 14) for s in ("exact softmax: the plan", "the algorithm's rows",
                                                              "row i's<br>mass")])
    bar_x = fig.layout.xaxis2.domain[1] + 0.01                    # the colour bar, right of the two maps
    algo, case, exact, got, err = steps[active]
    for col, Z, who in ((1, exact, "exact"), (2, got, "algorithm")):
        fig.add_trace(go.Heatmap(z=Z, x=keys, y=keys, zmin=0.0, zmax=1.0, colorscale=_PLAN_SCALE,
                                 showscale=(col == 2), colorbar=dict(title="weight", x=bar_x, len=0.8, thickness=10,
                                                                     tickvals=[0, 0.1, 0.3, 1]),
                                 hovertemplate=f"query %{{y}} → key %{{x}}: %{{z:.3f}}<extra>{who}</extra>"),
                      row=1, col=col)
    for col in (1, 2):
        fig.add_trace(go.Scatter(x=[case.j], y=[case.i], mode="markers", name="needle (i, j)", showlegend=(col == 1),
                                 cliponaxis=False,
                                 marker=dict(symbol="circle-open", size=14, color="#ff7f0e", line=dict(width=3))),
                      row=1, col=col)
    on_j, rest = mass(exact, got, case)
    fig.add_trace(go.Bar(x=["exact", "algorithm"], y=on_j, name="on the needle's key j", marker_color="#ff7f0e"),
                  row=1, col=3)
    fig.add_trace(go.Bar(x=["exact", "algorithm"], y=rest, name="on the other keys", marker_color="#6baed6"),
                  row=1, col=3)
    frames = []
    for n, (algo, case, exact, got, err) in enumerate(steps):
        on_j, rest = mass(exact, got, case)
        frames.append(go.Frame(
            data=[go.Heatmap(z=exact), go.Heatmap(z=got), go.Scatter(x=[case.j], y=[case.i]),
                  go.Scatter(x=[case.j], y=[case.i]), go.Bar(y=on_j), go.Bar(y=rest)],
            traces=[0, 1, 2, 3, 4, 5], name=f"algo{n}",
            layout=go.Layout(title_text=title(algo, case, err, exact, got), **axes)))
    algo, case, exact, got, err = steps[active]
    fig.update_layout(title=dict(text=title(algo, case, err, exact, got), font=dict(size=13)), height=500,
                      barmode="stack", margin=dict(t=140, l=60, r=20, b=40),
                      legend=dict(x=1.02, y=1.0, xanchor="left", yanchor="top"),
                      meta={"mechanism_map": "subquadratic attention algorithms"}, **axes)
    return add_frame_slider(fig, frames, [slider_label(a.name) for a in algos], prefix="algorithm: ",
                            active=active)


__all__ = ["error_curves_figure", "error_vs_M_by_T_figure", "needle_explorer", "needle_maps_figure",
           "probe_map_figure", "row_vs_M_figure", "work_figure"]
