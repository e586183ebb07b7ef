"""Chapter 3's figures: the state ``S_t`` filling up token by token, and where linear attention
overtakes softmax attention.

``state_buildup_figure`` and ``crossover_figure`` use Plotly's own sliders over precomputed frames
(they work in the static book); ``crossover_explorer`` is an ipywidgets wrapper for a live kernel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..experiments.linear import check_measurements, crossover_length, fit_power_law, model_crossover, model_times
from ..experiments.recall import state_trajectory
from ..linear import linear_attention
from ._plan import as_single_head
from ._slider import add_frame_slider
from ._style import SIGNED_SCALE, colour

SOFTMAX_COLOUR, LINEAR_COLOUR = colour(1), colour(0)


def state_buildup_figure(q, k, v, *, bytes_per_number: int = 2) -> go.Figure:
    """Slider over ``t``: the state ``S_t = sum_{j<=t} v_j k_j^T`` (left), the output
    ``o_t = S_t q_t`` against softmax-free attention computed the quadratic way (middle), and the
    numbers each method keeps in memory (right: the KV cache grows as ``t (D + Dv)``, the state
    stays ``Dv x D``).

    Args: ``q, k: [T, D]``, ``v: [T, Dv]`` -- one head, small ``T`` (one frame per token).
    """
    q, k, v = as_single_head("q", q), as_single_head("k", k), as_single_head("v", v)
    T, D = k.shape
    if q.shape != k.shape or v.shape[0] != T:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "q and k [T, D] and v [T, Dv] with the same T")
    Dv = v.shape[1]
    states = state_trajectory(k, v, rule="linear")                       # S_1 .. S_T  [T, Dv, D]
    # The library's two forms of unnormalised linear attention: the recurrence o_t = S_t q_t, and the
    # quadratic (Q K^T . M) V.
    outs, quad = (linear_attention(q[None, None], k[None, None], v[None, None], scale=1.0, normalize=False,
                                   mode=mode)[0, 0] for mode in ("recurrent", "parallel"))
    zmax = states.abs().max().item() or 1.0
    ts = np.arange(1, T + 1)
    kv = ts * (D + Dv) * bytes_per_number
    st = np.full(T, Dv * D * 4)                                          # fp32 state

    # Two panels over one: three side by side leave no room for their axis titles at a phone's width.
    # Panel names go in the axis titles; subplot titles over the panels would overprint each other.
    fig = make_subplots(rows=2, cols=2, column_widths=[0.55, 0.45], row_heights=[0.55, 0.45],
                        horizontal_spacing=0.16, vertical_spacing=0.2, specs=[[{}, {}], [{"colspan": 2}, None]])
    KV_COLOUR, STATE_COLOUR = colour(1), colour(2)

    def traces(t: int):
        return [
            go.Heatmap(z=states[t - 1].numpy(), zmin=-zmax, zmax=zmax, colorscale=SIGNED_SCALE,
                       showscale=False, xaxis="x", yaxis="y", name="S_t",
                       hovertemplate="S[%{y}, %{x}] = %{z:.3f}<extra></extra>"),
            go.Bar(x=np.arange(Dv), y=outs[t - 1].numpy(), name="o<sub>t</sub> = S<sub>t</sub> q<sub>t</sub>",
                   marker_color=LINEAR_COLOUR, xaxis="x2", yaxis="y2"),
            go.Scatter(x=np.arange(Dv), y=quad[t - 1].numpy(), mode="markers", name="row t of (QK<sup>T</sup>∘M)V",
                       marker=dict(symbol="x", size=9, color="black"), xaxis="x2", yaxis="y2"),
            go.Scatter(x=ts, y=kv, mode="lines", name="KV cache (fp16)", line=dict(color=KV_COLOUR),
                       xaxis="x3", yaxis="y3"),
            go.Scatter(x=ts, y=st, mode="lines", name="state (fp32)", line=dict(color=STATE_COLOUR),
                       xaxis="x3", yaxis="y3"),
            go.Scatter(x=[t, t], y=[kv[t - 1], st[t - 1]], mode="markers", showlegend=False, name="at t",
                       marker=dict(size=10, color=[KV_COLOUR, STATE_COLOUR]), xaxis="x3", yaxis="y3"),
        ]

    for i, tr in enumerate(traces(1)):
        fig.add_trace(tr, row=1 if i < 3 else 2, col=1 if i == 0 or i >= 3 else 2)
    omax = max(outs.abs().max().item(), quad.abs().max().item()) * 1.1 or 1.0
    fig.update_yaxes(range=[-omax, omax], title_text="output o<sub>t</sub>", row=1, col=2)
    fig.update_xaxes(title_text="state S<sub>t</sub>: key dim", row=1, col=1)
    fig.update_xaxes(dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="value dim", autorange="reversed", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="output: value dim", row=1, col=2)
    fig.update_xaxes(title_text="token t", range=[0.5, T + 0.5], row=2, col=1)
    fig.update_yaxes(title_text="bytes per head", range=[0, 1.05 * max(kv.max(), st.max())], row=2, col=1)
    fig.update_layout(height=620, title="Linear attention as an RNN<br><sup>one outer product per token</sup>")
    frames = [go.Frame(data=traces(t), name=f"t{t}") for t in range(1, T + 1)]
    return add_frame_slider(fig, frames, [str(t) for t in range(1, T + 1)], prefix="t = ")


def crossover_figure(measurements: Mapping[int, Mapping[str, Sequence[float]]], *,
                     fit_from: int = 0) -> go.Figure:
    """Log-log time against ``T`` for softmax and linear attention, one slider step per ``D``:
    measured medians, their interquartile band (when the measurements carry ``softmax_q1`` /
    ``softmax_q3`` ...), fitted power laws (slopes in the legend, fitted on ``T >= fit_from``) and
    the measured crossover length as a vertical line.

    ``measurements``: ``{D: {"T": [...], "softmax": [ms...], "linear": [ms...]}}`` as returned by
    ``attnlib.experiments.linear.measure_scaling``.
    """
    check_measurements(measurements)
    Ds = list(measurements)
    lo = min(min(list(r.get("softmax_q1", r["softmax"])) + list(r.get("linear_q1", r["linear"])))
             for r in measurements.values())
    hi = max(max(list(r.get("softmax_q3", r["softmax"])) + list(r.get("linear_q3", r["linear"])))
             for r in measurements.values())

    def traces(D):
        r = measurements[D]
        T = np.asarray(r["T"], dtype=float)
        sel = T >= fit_from
        out = []
        for name, color in (("softmax", SOFTMAX_COLOUR), ("linear", LINEAR_COLOUR)):
            y = np.asarray(r[name], dtype=float)
            slope, icpt = fit_power_law(T[sel], y[sel], robust=True)
            if f"{name}_q1" in r and f"{name}_q3" in r:           # the spread of the repeats
                band = np.concatenate([np.asarray(r[f"{name}_q3"], float), np.asarray(r[f"{name}_q1"], float)[::-1]])
                out.append(go.Scatter(x=np.concatenate([T, T[::-1]]), y=band, fill="toself", mode="lines",
                                      line=dict(width=0), fillcolor=color, opacity=0.2, hoverinfo="skip",
                                      name=f"{name}: quartiles of the repeats"))
            out.append(go.Scatter(x=T, y=y, mode="markers", marker=dict(color=color, size=8),
                                  name=f"{name} (median)"))
            out.append(go.Scatter(x=T[sel], y=np.exp(icpt) * T[sel] ** slope, mode="lines",
                                  line=dict(color=color, dash="dot"),
                                  name=f"{name} fit: slope {slope:.2f}"))
        tc = crossover_length(r["T"], r["softmax"], r["linear"])
        x = [tc, tc] if math.isfinite(tc) else [None, None]
        out.append(go.Scatter(x=x, y=[lo, hi], mode="lines", line=dict(color="gray", dash="dash"),
                              name=f"crossover T ~ {tc:.0f}" if math.isfinite(tc) else "no crossover"))
        return out

    fig = go.Figure(traces(Ds[0]))
    # Every step keeps the axes the figure opened with: cover every D's lengths, not only the first's.
    all_T = [float(t) for r in measurements.values() for t in r["T"]]
    fig.update_xaxes(type="log", title_text="sequence length T",
                     range=[math.log10(min(all_T)) - 0.05, math.log10(max(all_T)) + 0.05])
    fig.update_yaxes(type="log", title_text="CPU time (ms)", range=[math.log10(lo) - 0.1,
                                                                     math.log10(hi) + 0.1])
    fig.update_layout(height=500, title="Causal softmax vs linear attention<br><sup>CPU time, one thread</sup>")
    frames = [go.Frame(data=traces(D), name=f"D{D}") for D in Ds]
    return add_frame_slider(fig, frames, [str(D) for D in Ds], prefix="head dim D = ")


def crossover_explorer(model: Mapping[str, float], *, lengths=(64, 131072)):
    """Live explorer of the calibrated cost model: sliders for ``D`` and ``T``; the plot shows both
    predicted times against ``T`` for that ``D``, and the title reads off the two times at ``T``."""
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
        ys, yl = model_times(model, Ts, D)
        s, lin = (float(x[0]) for x in model_times(model, [T], D))
        with fig.batch_update():
            fig.data[0].y, fig.data[1].y = ys, yl
            fig.data[2].x, fig.data[2].y = [T, T], [s, lin]
            fig.layout.title = (f"D = {D}, T = {T}: softmax {s:.3g} ms, linear {lin:.3g} ms "
                                f"({s / lin:.2g}x); crossover T* = {model_crossover(model, D):.0f}")

    d_slider.observe(redraw, "value")
    t_slider.observe(redraw, "value")
    redraw()
    return W.VBox([W.HBox([d_slider, t_slider]), fig])


__all__ = ["state_buildup_figure", "crossover_figure", "crossover_explorer"]
