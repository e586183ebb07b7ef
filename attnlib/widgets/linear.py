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
import torch
from plotly.subplots import make_subplots

from ..linear import crossover_length, fit_power_law
from ._slider import add_frame_slider


def _single_head(name: str, x) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [T, dim] (one head)")
    return x.to(torch.float64)


def state_buildup_figure(q, k, v, *, bytes_per_number: int = 2) -> go.Figure:
    """Slider over ``t``: the state ``S_t = sum_{j<=t} v_j k_j^T`` (left), the output
    ``o_t = S_t q_t`` against softmax-free attention computed the quadratic way (middle), and the
    numbers each method keeps in memory (right: the KV cache grows as ``t (D + Dv)``, the state
    stays ``Dv x D``).

    Args: ``q, k: [T, D]``, ``v: [T, Dv]`` -- one head, small ``T`` (one frame per token).
    """
    q, k, v = _single_head("q", q), _single_head("k", k), _single_head("v", v)
    T, D = k.shape
    if q.shape != k.shape or v.shape[0] != T:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "q and k [T, D] and v [T, Dv] with the same T")
    Dv = v.shape[1]
    states = torch.cumsum(v[:, :, None] * k[:, None, :], dim=0)          # S_1 .. S_T  [T, Dv, D]
    outs = torch.einsum("tvd,td->tv", states, q)                         # o_t = S_t q_t
    quad = ((q @ k.T).tril() @ v)                                        # (Q K^T . M) V
    zmax = states.abs().max().item() or 1.0
    ts = np.arange(1, T + 1)
    kv = ts * (D + Dv) * bytes_per_number
    st = np.full(T, Dv * D * 4)                                          # fp32 state

    fig = make_subplots(rows=1, cols=3, column_widths=[0.38, 0.27, 0.35], horizontal_spacing=0.09,
                        subplot_titles=("state S_t  [Dv x D]", "o_t: recurrence vs (QK^T.M)V",
                                        "bytes kept per head"))

    def traces(t: int):
        return [
            go.Heatmap(z=states[t - 1].numpy(), zmin=-zmax, zmax=zmax, colorscale="RdBu",
                       showscale=False, xaxis="x", yaxis="y"),
            go.Bar(x=np.arange(Dv), y=outs[t - 1].numpy(), name="S_t q_t", marker_color="#1f77b4",
                   xaxis="x2", yaxis="y2", showlegend=(t == 1)),
            go.Scatter(x=np.arange(Dv), y=quad[t - 1].numpy(), mode="markers", name="row t of (QK^T.M)V",
                       marker=dict(symbol="x", size=9, color="black"), xaxis="x2", yaxis="y2",
                       showlegend=(t == 1)),
            go.Scatter(x=ts, y=kv, mode="lines", name="KV cache (fp16)", line=dict(color="#d62728"),
                       xaxis="x3", yaxis="y3"),
            go.Scatter(x=ts, y=st, mode="lines", name="state (fp32)", line=dict(color="#2ca02c"),
                       xaxis="x3", yaxis="y3"),
            go.Scatter(x=[t, t], y=[kv[t - 1], st[t - 1]], mode="markers", showlegend=False,
                       marker=dict(size=10, color=["#d62728", "#2ca02c"]), xaxis="x3", yaxis="y3"),
        ]

    for i, tr in enumerate(traces(1)):
        col = 1 if i == 0 else (2 if i < 3 else 3)
        fig.add_trace(tr, row=1, col=col)
    omax = max(outs.abs().max().item(), quad.abs().max().item()) * 1.1 or 1.0
    fig.update_yaxes(range=[-omax, omax], row=1, col=2)
    fig.update_xaxes(title_text="key dim", row=1, col=1)
    fig.update_yaxes(title_text="value dim", autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="value dim", row=1, col=2)
    fig.update_xaxes(title_text="token t", row=1, col=3)
    fig.update_layout(height=420, margin=dict(t=60), legend=dict(orientation="h", y=-0.25),
                      title="Linear attention as an RNN: one outer product per token")
    frames = [go.Frame(data=traces(t), name=f"t{t}") for t in range(1, T + 1)]
    return add_frame_slider(fig, frames, [str(t) for t in range(1, T + 1)], prefix="t = ")


def _check_measurements(m: Mapping) -> None:
    if not m:
        raise ValueError("measurements is empty; expected {D: {'T': [...], 'softmax': [...], "
                         "'linear': [...]}}")
    for D, row in m.items():
        for key in ("T", "softmax", "linear"):
            if key not in row:
                raise ValueError(f"measurements[{D}] lacks {key!r}")
        if not (len(row["T"]) == len(row["softmax"]) == len(row["linear"]) >= 2):
            raise ValueError(f"measurements[{D}] needs equally long T, softmax, linear lists (>= 2)")


def crossover_figure(measurements: Mapping[int, Mapping[str, Sequence[float]]], *,
                     fit_from: int = 0) -> go.Figure:
    """Log-log time against ``T`` for softmax and linear attention, one slider step per ``D``:
    measured points, fitted power laws (slopes in the legend, fitted on ``T >= fit_from``) and the
    measured crossover length as a vertical line.

    ``measurements``: ``{D: {"T": [...], "softmax": [ms...], "linear": [ms...]}}`` as returned by
    ``attnlib.linear.measure_scaling``.
    """
    _check_measurements(measurements)
    Ds = list(measurements)
    lo = min(min(r["softmax"] + r["linear"]) for r in measurements.values())
    hi = max(max(r["softmax"] + r["linear"]) for r in measurements.values())

    def traces(D):
        r = measurements[D]
        T = np.asarray(r["T"], dtype=float)
        sel = T >= fit_from
        out = []
        for name, color in (("softmax", "#d62728"), ("linear", "#1f77b4")):
            y = np.asarray(r[name], dtype=float)
            slope, icpt = fit_power_law(T[sel], y[sel], robust=True)
            out.append(go.Scatter(x=T, y=y, mode="markers", marker=dict(color=color, size=8),
                                  name=f"{name} (measured)"))
            out.append(go.Scatter(x=T[sel], y=np.exp(icpt) * T[sel] ** slope, mode="lines",
                                  line=dict(color=color, dash="dot"),
                                  name=f"{name} fit: slope {slope:.2f}"))
        tc = crossover_length(r["T"], r["softmax"], r["linear"])
        x = [tc, tc] if math.isfinite(tc) else [None, None]
        out.append(go.Scatter(x=x, y=[lo, hi], mode="lines", line=dict(color="gray", dash="dash"),
                              name=f"crossover T ~ {tc:.0f}" if math.isfinite(tc) else "no crossover"))
        return out

    fig = go.Figure(traces(Ds[0]))
    fig.update_xaxes(type="log", title_text="sequence length T")
    fig.update_yaxes(type="log", title_text="CPU time (ms)", range=[math.log10(lo) - 0.1,
                                                                     math.log10(hi) + 0.1])
    fig.update_layout(height=460, title="Causal softmax vs linear attention (CPU, one thread)")
    frames = [go.Frame(data=traces(D), name=f"D{D}") for D in Ds]
    return add_frame_slider(fig, frames, [str(D) for D in Ds], prefix="head dim D = ")


def _two_term_fit(xs, ys) -> tuple[float, float]:
    """``y ~ c0 + c1 x`` by least squares on relative errors, both coefficients kept >= 0."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    A = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    c0, c1 = np.linalg.lstsq(A, np.ones_like(y), rcond=None)[0]
    if c0 < 0:
        return 0.0, float(np.sum(y * x) / np.sum(x * x))
    if c1 < 0:
        return float(np.mean(y)), 0.0
    return float(c0), float(c1)


def cost_model(measurements: Mapping[int, Mapping[str, Sequence[float]]], *, chunk_size: int = 64,
               fit_from: int = 0) -> dict[str, float]:
    """Calibrate two cost laws to the measurements (``T >= fit_from``):

        t_softmax = T^2 (a0 + a1 D)           per score: a D-long dot product (a1 D) plus the
                                              exponential and running sums, which do not scale with D;
        t_linear  = T (b0 + b1 D (C + D))     per token: the chunk algorithm's FLOPs (b1) plus a
                                              per-token overhead that does not scale with D (b0).

    The per-score and per-token constants are medians of ``t / T^2`` and ``t / T`` per ``D``;
    each pair of coefficients is fitted by least squares on relative errors. Returns
    ``{"a0", "a1", "b0", "b1", "C"}``.
    """
    _check_measurements(measurements)
    Ds, per_score, per_token = [], [], []
    for D, r in measurements.items():
        sel = [(T, s, lin) for T, s, lin in zip(r["T"], r["softmax"], r["linear"]) if T >= fit_from]
        if not sel:
            raise ValueError(f"no measurement for D={D} has T >= fit_from={fit_from}")
        Ds.append(float(D))
        per_score.append(float(np.median([s / (T * T) for T, s, _ in sel])))
        per_token.append(float(np.median([lin / T for T, _, lin in sel])))
    a0, a1 = _two_term_fit(Ds, per_score)
    b0, b1 = _two_term_fit([D * (chunk_size + D) for D in Ds], per_token)
    return {"a0": a0, "a1": a1, "b0": b0, "b1": b1, "C": chunk_size}


def _model_times(model, T, D):
    T = np.asarray(T, dtype=float)
    return (T * T * (model["a0"] + model["a1"] * D),
            T * (model["b0"] + model["b1"] * D * (model["C"] + D)))


def model_crossover(model: Mapping[str, float], D: float) -> float:
    """Where ``T^2 (a0 + a1 D) = T (b0 + b1 D (C + D))``: ``T* = (b0 + b1 D (C + D)) / (a0 + a1 D)``."""
    return (model["b0"] + model["b1"] * D * (model["C"] + D)) / (model["a0"] + model["a1"] * D)


def crossover_explorer(model: Mapping[str, float], *, lengths=(64, 131072)):
    """Live explorer of the calibrated cost model: sliders for ``D`` and ``T``; the plot shows both
    predicted times against ``T`` for that ``D``, and the title reads off the two times at ``T``."""
    import ipywidgets as W

    Ts = np.geomspace(*lengths, 60)
    fig = go.FigureWidget()
    fig.add_scatter(x=Ts, y=Ts, mode="lines", name="softmax  T^2 (a0 + a1 D)", line=dict(color="#d62728"))
    fig.add_scatter(x=Ts, y=Ts, mode="lines", name="linear  T (b0 + b1 D (C + D))", line=dict(color="#1f77b4"))
    fig.add_scatter(x=[1, 1], y=[1, 1], mode="markers", marker=dict(size=11, color=["#d62728", "#1f77b4"]),
                    showlegend=False)
    fig.update_xaxes(type="log", title_text="sequence length T")
    fig.update_yaxes(type="log", title_text="predicted CPU time (ms)")
    fig.update_layout(height=420)
    d_slider = W.SelectionSlider(options=[16, 32, 64, 128, 256], value=64, description="D")
    t_slider = W.SelectionSlider(options=[int(2 ** i) for i in range(6, 18)], value=1024,
                                 description="T")

    def redraw(change=None):
        D, T = d_slider.value, t_slider.value
        ys, yl = _model_times(model, Ts, D)
        s, lin = (float(x[0]) for x in _model_times(model, [T], D))
        with fig.batch_update():
            fig.data[0].y, fig.data[1].y = ys, yl
            fig.data[2].x, fig.data[2].y = [T, T], [s, lin]
            fig.layout.title = (f"D = {D}, T = {T}: softmax {s:.3g} ms, linear {lin:.3g} ms "
                                f"({s / lin:.2g}x); crossover T* = {model_crossover(model, D):.0f}")

    d_slider.observe(redraw, "value")
    t_slider.observe(redraw, "value")
    redraw()
    return W.VBox([W.HBox([d_slider, t_slider]), fig])


__all__ = ["state_buildup_figure", "crossover_figure", "cost_model", "model_crossover",
           "crossover_explorer"]
