"""Chapter 7's figures: every mechanism on one set of axes, and the chapter's tables.

``landscape_figure`` draws what :func:`attnlib.experiments.landscape.landscape_curves` computed -- FLOPs
per token of prefill, of decode, and memory per token of context, against the context length on log-log
axes -- with a Plotly slider (precomputed frames: it works in the static book) switching between the
three, and the crossovers the lab computed marked on their panel. ``html_table`` renders
rows of dicts. Nothing here computes a cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

import plotly.graph_objects as go

from ..experiments.landscape import LABELS
from ._slider import add_frame_slider
from ._style import colour

PANELS = {
    "prefill": ("prefill", "FLOPs per token, prefill of T tokens"),
    "decode": ("decode", "FLOPs to decode one token at context T"),
    "memory": ("memory", "bytes of cache or state per token of context"),
}
# Recurrent and hybrid mechanisms dashed, sparse ones dotted: the families read apart without colour.
DASH = {"linear": "dash", "delta": "dash", "gated_delta": "dash", "hybrid": "dashdot", "block_sparse": "dot",
        "topk": "dot", "anna": "dot", "grassmann": "longdash"}


def _log_range(values: Sequence[float]) -> list[float]:
    finite = [v for v in values if v and v > 0 and math.isfinite(v)]
    lo, hi = math.log10(min(finite)), math.log10(max(finite))
    return [lo - 0.15, hi + 0.15]


def landscape_figure(lengths: Sequence[int], curves: Mapping[str, Mapping[str, Sequence[float]]], *,
                     crossovers: Mapping[str, Sequence[tuple[str, float, float]]] | None = None,
                     title: str = "Every mechanism on one set of axes", active: str = "prefill",
                     height: int = 560) -> go.Figure:
    """Log-log lines of ``curves[panel][mechanism]`` against ``lengths``, one frame per panel
    (``prefill``, ``decode``, ``memory``), switched by a slider. ``crossovers[panel]`` is a list of
    ``(label, x, y)`` points marked on that panel (e.g. ``T_mem`` on ``memory``, the decode break-even
    on ``decode``). The y range follows the panel; the x axis is shared."""
    panels = [p for p in PANELS if p in curves]
    if not panels:
        raise ValueError(f"curves must hold at least one of the panels {tuple(PANELS)}")
    if active not in panels:
        raise ValueError(f"active must be one of {panels}; got {active!r}")
    crossovers = crossovers or {}
    mechanisms = list(curves[panels[0]])
    x = [float(t) for t in lengths]

    def traces(panel: str) -> list[go.Scatter]:
        out = []
        for i, m in enumerate(mechanisms):
            y = [float(v) for v in curves[panel][m]]
            if len(y) != len(x):
                raise ValueError(f"curves[{panel!r}][{m!r}] has {len(y)} values for {len(x)} lengths")
            out.append(go.Scatter(x=x, y=y, mode="lines", name=LABELS.get(m, m),
                                  line=dict(color=colour(i), dash=DASH.get(m, "solid"), width=2),
                                  hovertemplate=f"{LABELS.get(m, m)}<br>T=%{{x:.3s}}<br>%{{y:.3s}}<extra></extra>"))
        pts = crossovers.get(panel, [])
        out.append(go.Scatter(x=[p[1] for p in pts], y=[p[2] for p in pts], mode="markers+text",
                              text=[p[0] for p in pts], textposition="top left", name="crossovers",
                              marker=dict(symbol="x", size=11, color="#000"), cliponaxis=False,
                              hovertemplate="%{text}<br>T=%{x:.4s}<extra></extra>"))
        return out

    def layout(panel: str) -> dict:
        ys = [v for m in mechanisms for v in curves[panel][m]] + [p[2] for p in crossovers.get(panel, [])]
        return dict(yaxis=dict(title=dict(text=PANELS[panel][1]), range=_log_range(ys), type="log"))

    fig = go.Figure(data=traces(active))
    fig.update_xaxes(type="log", title_text="context length T (tokens)", exponentformat="power")
    fig.update_yaxes(type="log", exponentformat="power")
    fig.update_layout(title=title, height=height, **layout(active))
    frames = [go.Frame(name=p, data=traces(p), layout=layout(p)) for p in panels]
    return add_frame_slider(fig, frames, [PANELS[p][0] for p in panels], prefix="shown: ",
                            active=panels.index(active))


def _cell(value, fmt: str | None) -> str:
    if value is None:
        return "—"
    if fmt and isinstance(value, (int, float)):
        return format(value, fmt)
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "—"
    return str(value)


def html_table(rows: Sequence[Mapping], columns: Mapping[str, str],
               formats: Mapping[str, str] | None = None) -> str:
    """An HTML table of ``rows`` (dicts): ``columns`` maps a key to its header, ``formats`` a key to a
    format spec (``",.0f"``, ``".2f"`` ...); ``None`` shows as a dash. HTML, because a glued output
    reaches another page (the chapter's) only as HTML, text or an image, not as Markdown."""
    formats = formats or {}
    head = "".join(f"<th>{escape(h)}</th>" for h in columns.values())
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(r.get(k), formats.get(k)))}</td>" for k in columns)
                   + "</tr>" for r in rows)
    return (f'<table class="table glued-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


__all__ = ["html_table", "landscape_figure"]
