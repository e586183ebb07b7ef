"""Chapter 3's figures: the state ``S_t`` filling up token by token, and where linear attention
overtakes softmax attention.

``state_buildup_figure`` and ``crossover_figure`` use Plotly's own sliders over precomputed frames
(they work in the static book); ``crossover_explorer`` is an ipywidgets wrapper for a live kernel.
They draw what :mod:`attnbook.experiments.linear` computes (:func:`~attnbook.experiments.linear.state_buildup`,
:func:`~attnbook.experiments.linear.crossover_fits`, :func:`~attnbook.experiments.linear.model_prediction`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._slider import add_frame_slider
from ._style import DIVERGING_SCALE, colorbar, colour, stack_panels, title, top_margin

SOFTMAX_COLOUR, LINEAR_COLOUR = colour(1), colour(0)


def state_buildup_figure(buildup: Mapping) -> go.Figure:
    """Slider over ``t``: the state ``S_t = sum_{j<=t} v_j k_j^T`` (left), the output
    ``o_t = S_t q_t`` against softmax-free attention computed the quadratic way (middle), and the
    numbers each method keeps in memory (right: the KV cache grows as ``t (D + Dv)``, the state
    stays ``Dv x D``).

    ``buildup``: :func:`attnbook.experiments.linear.state_buildup` of one head, small ``T`` (one frame per
    token).
    """
    missing = {"states", "outputs", "quadratic", "t", "kv_cache_bytes", "state_bytes"} - set(buildup)
    if missing:
        raise ValueError(f"buildup lacks {sorted(missing)}; "
                         "expected attnbook.experiments.linear.state_buildup's output")
    states = np.asarray(buildup["states"], dtype=float)                 # S_1 .. S_T  [T, Dv, D]
    outs, quad = np.asarray(buildup["outputs"], dtype=float), np.asarray(buildup["quadratic"], dtype=float)
    ts, kv, st = (np.asarray(buildup[key]) for key in ("t", "kv_cache_bytes", "state_bytes"))
    T, Dv = states.shape[0], states.shape[1]
    zmax = float(np.abs(states).max()) or 1.0
    b = buildup.get("bytes_per_number", 2)
    cache_name = "KV cache (fp16)" if b == 2 else f"KV cache ({b} bytes per number)"

    # Two panels over one: three side by side leave no room for their axis titles at a phone's width.
    # Panel names go in the axis titles; subplot titles over the panels would overprint each other.
    fig = make_subplots(rows=2, cols=2, column_widths=[0.52, 0.48], row_heights=[0.55, 0.45],
                        horizontal_spacing=0.24, vertical_spacing=0.2, specs=[[{}, {}], [{"colspan": 2}, None]])
    KV_COLOUR, STATE_COLOUR = colour(1), colour(2)

    def traces(t: int):
        return [
            go.Heatmap(z=states[t - 1], zmin=-zmax, zmax=zmax, coloraxis="coloraxis",
                       xaxis="x", yaxis="y", name="S<sub>t</sub>",
                       hovertemplate="S[%{y}, %{x}] = %{z:.3f}<extra></extra>"),
            go.Bar(x=np.arange(Dv), y=outs[t - 1], name="o<sub>t</sub> = S<sub>t</sub> q<sub>t</sub>",
                   marker_color=LINEAR_COLOUR, xaxis="x2", yaxis="y2"),
            go.Scatter(x=np.arange(Dv), y=quad[t - 1], mode="markers", name="row t of (QK<sup>T</sup>∘M)V",
                       marker=dict(symbol="x", size=9, color="black"), xaxis="x2", yaxis="y2"),
            go.Scatter(x=ts, y=kv, mode="lines", name=cache_name, line=dict(color=KV_COLOUR),
                       xaxis="x3", yaxis="y3"),
            go.Scatter(x=ts, y=st, mode="lines", name="state (fp32)", line=dict(color=STATE_COLOUR),
                       xaxis="x3", yaxis="y3"),
            go.Scatter(x=[t, t], y=[kv[t - 1], st[t - 1]], mode="markers", showlegend=False, name="at t",
                       marker=dict(size=10, color=[KV_COLOUR, STATE_COLOUR]), xaxis="x3", yaxis="y3"),
        ]

    for i, tr in enumerate(traces(1)):
        fig.add_trace(tr, row=1 if i < 3 else 2, col=1 if i == 0 or i >= 3 else 2)
    omax = max(float(np.abs(outs).max()), float(np.abs(quad).max())) * 1.1 or 1.0
    fig.update_yaxes(range=[-omax, omax], title_text="output o<sub>t</sub>", row=1, col=2)
    fig.update_xaxes(title_text="state S<sub>t</sub>: key dim", row=1, col=1)
    fig.update_xaxes(dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="value dim", autorange="reversed", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="output: value dim", row=1, col=2)
    fig.update_xaxes(title_text="token t", range=[0.5, T + 0.5], row=2, col=1)
    fig.update_yaxes(title_text="bytes per head", range=[0, 1.05 * max(kv.max(), st.max())], row=2, col=1)
    fig.update_layout(height=660, title=title("Linear attention as an RNN", "one outer product per token"),
                      margin=dict(t=top_margin(1, 1) + 8),
                      coloraxis=dict(colorscale=DIVERGING_SCALE, cmin=-zmax, cmax=zmax, cmid=0.0,
                                     colorbar=colorbar(fig, ["xaxis", "yaxis"], title="signed entry")))
    stack_panels(fig, heights=[320, 280, 280])
    frames = [go.Frame(data=traces(t), name=f"t{t}") for t in range(1, T + 1)]
    return add_frame_slider(fig, frames, [str(t) for t in range(1, T + 1)], prefix="t = ")


def crossover_figure(fits: Mapping[int, Mapping]) -> go.Figure:
    """Log-log time against ``T`` for softmax and linear attention, one slider step per ``D``:
    measured medians, their interquartile band (when the measurements carry quartiles), the fitted
    power laws (slopes in the legend) and the measured crossover length as a vertical line.

    ``fits``: :func:`attnbook.experiments.linear.crossover_fits` of the measurements.
    """
    if not fits:
        raise ValueError("fits is empty; expected attnbook.experiments.linear.crossover_fits' output")
    Ds = list(fits)
    lo = min(min(list(r.get("softmax_q1", r["softmax"])) + list(r.get("linear_q1", r["linear"])))
             for r in fits.values())
    hi = max(max(list(r.get("softmax_q3", r["softmax"])) + list(r.get("linear_q3", r["linear"])))
             for r in fits.values())

    def traces(D):
        r = fits[D]
        T = np.asarray(r["T"], dtype=float)
        out = []
        for name, color in (("softmax", SOFTMAX_COLOUR), ("linear", LINEAR_COLOUR)):
            if f"{name}_q1" in r and f"{name}_q3" in r:           # the spread of the repeats
                band = np.concatenate([np.asarray(r[f"{name}_q3"], float), np.asarray(r[f"{name}_q1"], float)[::-1]])
                out.append(go.Scatter(x=np.concatenate([T, T[::-1]]), y=band, fill="toself", mode="lines",
                                      line=dict(width=0), fillcolor=color, opacity=0.2, hoverinfo="skip",
                                      name=f"{name}: quartiles of the repeats"))
            out.append(go.Scatter(x=T, y=np.asarray(r[name], dtype=float), mode="markers",
                                  marker=dict(color=color, size=8), name=f"{name} (median)"))
            out.append(go.Scatter(x=r[f"{name}_fit_T"], y=r[f"{name}_fit"], mode="lines",
                                  line=dict(color=color, dash="dot"),
                                  name=f"{name} fit: slope {r[f'{name}_slope']:.2f}"))
        tc = r["crossover"]
        x = [tc, tc] if math.isfinite(tc) else [None, None]
        out.append(go.Scatter(x=x, y=[lo, hi], mode="lines", line=dict(color="gray", dash="dash"),
                              name=f"crossover T ~ {tc:.0f}" if math.isfinite(tc) else "no crossover"))
        return out

    fig = go.Figure(traces(Ds[0]))
    # Every step keeps the axes the figure opened with: cover every D's lengths, not only the first's.
    all_T = [float(t) for r in fits.values() for t in r["T"]]
    fig.update_xaxes(type="log", title_text="sequence length T",
                     range=[math.log10(min(all_T)) - 0.05, math.log10(max(all_T)) + 0.05])
    fig.update_yaxes(type="log", title_text="CPU time (ms)", range=[math.log10(lo) - 0.1,
                                                                     math.log10(hi) + 0.1])
    fig.update_layout(height=500, title=title("Causal softmax vs linear attention", "CPU time, one thread"),
                      margin=dict(t=top_margin(1, 1)))
    frames = [go.Frame(data=traces(D), name=f"D{D}") for D in Ds]
    return add_frame_slider(fig, frames, [str(D) for D in Ds], prefix="head dim D = ")


def crossover_explorer(predict: Callable[[np.ndarray, int], Mapping], *, lengths=(64, 131072)):
    """Live explorer of the calibrated cost model: sliders for ``D`` and ``T``; the plot shows both
    predicted times against ``T`` for that ``D``, and the title reads off the two times at ``T``.
    ``predict(T_values, D)`` returns ``{"softmax", "linear", "crossover"}``, e.g.
    ``lambda T, D: attnbook.experiments.linear.model_prediction(model, T, D)``."""
    import ipywidgets as W

    Ts = np.geomspace(*lengths, 60)
    fig = go.FigureWidget()
    fig.add_scatter(x=Ts, y=Ts, mode="lines", name="softmax  T² (a0 + a1 D)", line=dict(color=SOFTMAX_COLOUR))
    fig.add_scatter(x=Ts, y=Ts, mode="lines", name="linear  T (b0 + b1 D (L + D))", line=dict(color=LINEAR_COLOUR))
    fig.add_scatter(x=[1, 1], y=[1, 1], mode="markers", marker=dict(size=11, color=[SOFTMAX_COLOUR, LINEAR_COLOUR]),
                    showlegend=False)
    fig.update_xaxes(type="log", title_text="sequence length T")
    fig.update_yaxes(type="log", title_text="predicted CPU time (ms)")
    fig.update_layout(height=420)
    d_slider = W.SelectionSlider(options=[16, 32, 64, 128, 256], value=64, description="D")
    t_slider = W.SelectionSlider(options=[int(2 ** i) for i in range(6, 18)], value=1024,
                                 description="T")

    def redraw(change=None):
        D, T = d_slider.value, t_slider.value
        curve, at_T = predict(Ts, D), predict(np.array([T]), D)
        s, lin = float(at_T["softmax"][0]), float(at_T["linear"][0])
        with fig.batch_update():
            fig.data[0].y, fig.data[1].y = curve["softmax"], curve["linear"]
            fig.data[2].x, fig.data[2].y = [T, T], [s, lin]
            fig.layout.title = (f"D = {D}, T = {T}: softmax {s:.3g} ms, linear {lin:.3g} ms "
                                f"({s / lin:.2g}x); crossover T* = {curve['crossover']:.0f}")

    d_slider.observe(redraw, "value")
    t_slider.observe(redraw, "value")
    redraw()
    return W.VBox([W.HBox([d_slider, t_slider]), fig])


__all__ = ["state_buildup_figure", "crossover_figure", "crossover_explorer"]
