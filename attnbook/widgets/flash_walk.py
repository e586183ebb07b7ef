"""The appendix's figures: the flash forward kernel walked tile by tile, and the roofline.

:func:`flash_walk_figure` draws a :class:`attnbook.experiments.flash_walk.FlashWalk` (the kernel's traced
state); :func:`roofline_figure` draws the points of :mod:`attnbook.experiments.roofline` under the roofs of
the devices. Both only draw: every number comes from those functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._slider import add_frame_slider
from ._style import DIVERGING_SCALE, PLAN_SCALE, colorbar, colour, split_title, stack_panels, top_margin, wrap

_title = split_title


def _walk_traces(walk, t: int, x_rows, key_axis, dv_axis, zmax_plan: float, zmax_out: float) -> list:
    seen = int(walk.key_end[t])
    plan = walk.plans[t].numpy().copy()
    plan[:, seen:] = np.nan                                   # keys not yet loaded: blank, not zero
    out = walk.o_partial[t].numpy()
    return [
        go.Heatmap(z=plan, x=key_axis, y=x_rows, coloraxis="coloraxis",
                   hovertemplate="query %{y}, key %{x}: weight %{z:.3f}<extra>partial plan</extra>"),
        go.Heatmap(z=out, x=dv_axis, y=x_rows, coloraxis="coloraxis2",
                   hovertemplate="query %{y}, column %{x}: %{z:.3f}<extra>partial output</extra>"),
        go.Scatter(x=x_rows, y=walk.m[t].numpy(), mode="markers", name="running max m",
                   marker=dict(color=colour(1), size=6, symbol="diamond"), xaxis="x3", yaxis="y3"),
        go.Scatter(x=x_rows, y=walk.lse_partial[t].numpy(), mode="markers", name="running m + log ℓ",
                   marker=dict(color=colour(0), size=6), xaxis="x3", yaxis="y3"),
        go.Scatter(x=x_rows, y=walk.l[t].numpy(), mode="markers", name="running sum ℓ",
                   marker=dict(color=colour(2), size=6), xaxis="x4", yaxis="y4"),
    ]


def flash_walk_figure(walk, *, title: str = "The flash forward, one key tile at a time") -> go.Figure:
    """Four panels with a slider over the key tiles of ``walk`` (a ``FlashWalk``): the partial plan
    ``exp(s - m) / ℓ`` on the keys seen so far (rows: the tile's queries), the partial output ``acc / ℓ``,
    the running max ``m`` and running log-sum-exp ``m + log ℓ`` per row beside the kernel's saved
    ``lse`` (a line), and the running sum ``ℓ`` per row."""
    n = int(walk.m.shape[0])
    if n == 0:
        raise ValueError("walk has no key tiles to show")
    rows = walk.rows.numpy()
    key_axis = np.arange(walk.scores.shape[1])
    dv_axis = np.arange(walk.acc.shape[-1])
    finite_plans = walk.plans.numpy()
    zmax_plan = float(finite_plans.max())
    zmax_out = float(np.abs(walk.o_partial.numpy()).max()) or 1.0
    ys = np.concatenate([walk.m.numpy().ravel(), walk.lse_partial.numpy().ravel(), walk.lse.double().numpy()])
    ys = ys[np.isfinite(ys)]
    pad = 0.05 * (ys.max() - ys.min() + 1e-12)
    l_max = float(walk.l.max())

    fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.16, vertical_spacing=0.2,
                        subplot_titles=(wrap("partial plan", 20), wrap("partial output", 20),
                                        wrap("running max and log-sum-exp", 20), wrap("running sum ℓ", 20)))
    fig.update_annotations(font=dict(size=13))
    for tr, (r, c) in zip(_walk_traces(walk, n - 1, rows, key_axis, dv_axis, zmax_plan, zmax_out),
                          [(1, 1), (1, 2), (2, 1), (2, 1), (2, 2)]):
        fig.add_trace(tr, row=r, col=c)
    fig.add_trace(go.Scatter(x=rows, y=walk.lse.double().numpy(), mode="lines", name="saved lse (final)",
                             line=dict(color=colour(0), width=1, dash="dot")), row=2, col=1)
    frames = [go.Frame(data=_walk_traces(walk, t, rows, key_axis, dv_axis, zmax_plan, zmax_out),
                       name=f"tile{t}", traces=[0, 1, 2, 3, 4]) for t in range(n)]
    labels = [str(int(e)) for e in walk.key_end]
    # Each map's colour bar beside it (the plan's in the gap before the output, which shows the same rows).
    fig.update_layout(title=_title(title), height=660, margin=dict(t=top_margin(1, 0, 2), r=60),
                      coloraxis=dict(colorscale=PLAN_SCALE, cmin=0, cmax=zmax_plan,
                                     colorbar=colorbar(fig, ["xaxis", "yaxis"], title="weight")),
                      coloraxis2=dict(colorscale=DIVERGING_SCALE, cmin=-zmax_out, cmax=zmax_out, cmid=0.0,
                                      colorbar=colorbar(fig, ["xaxis2", "yaxis2"], title="signed value")))
    stack_panels(fig, heights=[300, 300, 260, 260],
                 narrow={"yaxis2.showticklabels": True, "yaxis2.title.text": "query i"})
    fig.update_xaxes(title_text="key j", row=1, col=1)
    fig.update_yaxes(title_text="query i", autorange="reversed", row=1, col=1)
    fig.update_xaxes(title_text="value column", row=1, col=2)
    fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=2)   # the same rows as on the left
    fig.update_xaxes(title_text="query i", row=2, col=1)
    fig.update_yaxes(title_text="scaled score", range=[ys.min() - pad, ys.max() + pad], row=2, col=1)
    fig.update_xaxes(title_text="query i", row=2, col=2)
    fig.update_yaxes(title_text="ℓ", range=[0.0, 1.05 * l_max], row=2, col=2)
    for ax in ("xaxis3", "xaxis4"):
        fig.layout[ax].range = [float(rows.min()) - 0.5, float(rows.max()) + 0.5]
    return add_frame_slider(fig, frames, labels, prefix="keys seen: ", active=n - 1)


# one symbol per op, so that ops of equal intensity stay apart
_OPEN_SYMBOLS = ("circle-open", "square-open", "diamond-open", "triangle-up-open")


def roofline_figure(points: Sequence[Mapping], roofs: Sequence, measured: Sequence[Mapping] = (), *,
                    title: str = "Roofline: the attention ops' forward passes") -> go.Figure:
    """Attainable TFLOP/s against arithmetic intensity (FLOP/byte, log-log) for each roof (a ``Roof``),
    the ops' static points placed on the first roof (``points``: ``op``, ``shape``, ``intensity``), and
    measured points (``measured``: ``device``, ``intensity``, ``tflops``, ``dtype``, ``causal``,
    ``shape``) in the colour of their own device's roof."""
    if not roofs:
        raise ValueError("roofs must name at least one device")
    intensities = [p["intensity"] for p in points] + [p["intensity"] for p in measured]
    lo = min([*intensities, *(r.ridge for r in roofs)]) / 4
    hi = max([*intensities, *(r.ridge for r in roofs)]) * 4
    grid = np.geomspace(lo, hi, 200)
    fig = go.Figure()
    dash = ("solid", "dash", "dot")
    for i, roof in enumerate(roofs):
        fig.add_trace(go.Scatter(x=grid, y=roof.attainable(grid).numpy(), mode="lines",
                                 name=f"{roof.device} roof ({roof.tflops:.0f} TFLOP/s, {roof.tb_per_s:g} TB/s)",
                                 line=dict(color="#555", width=1.5, dash=dash[i % 3]),
                                 hovertemplate="%{x:.0f} FLOP/B: at most %{y:.0f} TFLOP/s<extra></extra>"))
    first = roofs[0]
    ops = list(dict.fromkeys(p["op"] for p in points))
    for i, op in enumerate(ops):
        mine = [p for p in points if p["op"] == op]
        x = np.array([p["intensity"] for p in mine])
        fig.add_trace(go.Scatter(x=x, y=first.attainable(x).numpy(), mode="markers",
                                 name=f"{op}: bound on {first.device.replace('NVIDIA ', '')}",
                                 marker=dict(color=colour(i), size=9, symbol=_OPEN_SYMBOLS[i % len(_OPEN_SYMBOLS)],
                                             line=dict(width=2)),
                                 text=[p["shape"] for p in mine],
                                 hovertemplate="%{text}: %{x:.0f} FLOP/B, bound %{y:.0f} TFLOP/s<extra></extra>"))
    devices = list(dict.fromkeys(p["device"] for p in measured))
    for device in devices:
        mine = [p for p in measured if p["device"] == device]
        fig.add_trace(go.Scatter(x=[p["intensity"] for p in mine], y=[p["tflops"] for p in mine], mode="markers",
                                 name=f"softmax, measured on {device.replace('NVIDIA ', '')}",
                                 marker=dict(color=colour(0), size=8, symbol="x"),
                                 text=[f"{p['shape']} {p['dtype']} {'causal' if p['causal'] else 'full'}"
                                       for p in mine],
                                 hovertemplate="%{text}: %{x:.0f} FLOP/B, %{y:.0f} TFLOP/s<extra></extra>"))
    top = max(r.tflops for r in roofs)
    fig.update_layout(title=_title(title), height=520,
                      xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte)",
                                 range=[np.log10(lo), np.log10(hi)]),
                      yaxis=dict(type="log", title="TFLOP/s", range=[np.log10(lo * min(r.tb_per_s for r in roofs)),
                                                                      np.log10(top * 2)]))
    return fig


__all__ = ["flash_walk_figure", "roofline_figure"]
