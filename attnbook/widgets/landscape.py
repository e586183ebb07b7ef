"""Chapter 7's figures: every mechanism on one set of axes, and the chapter's tables.

``landscape_figure`` draws what :func:`attnbook.experiments.landscape.landscape_curves` computed -- FLOPs
per token of prefill, of decode, and memory per token of context, against the context length on log-log
axes -- with three buttons (Plotly ``updatemenus``: it works in the static book) switching between the
three, and the crossovers the lab computed marked on their panel. ``html_table`` renders rows of dicts
as HTML; ``text_table`` prints them within a width (the lab's output boxes). Nothing here computes a cost.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from html import escape

import plotly.graph_objects as go

from attnbook.experiments.landscape import LABELS

from ._style import COLORWAY

PANELS = {
    "prefill": ("prefill", "FLOPs per token, prefill of T tokens",
                "FLOPs per token to read a prompt of T tokens"),
    "decode": ("decode", "FLOPs to decode one token at context T",
               "FLOPs to decode one more token after T"),
    "memory": ("memory", "bytes of cache or state per token of context",
               "bytes of cache or state per token of context"),
}
_BLUE, _VERMILION, _GREEN, _PINK, _ORANGE, _SKY, _BLACK = COLORWAY[:7]
# One legible colour of the book's palette per mechanism (its yellow is too pale for a line), the
# families told apart by dash as well: recurrent dashed, sparse dotted. Gated DeltaNet is drawn wide
# and pale under DeltaNet, whose line lies on it in the prefill panel (and on linear attention's in the
# memory panel): both stay visible.
STYLE = {
    "softmax": dict(color=_BLUE, dash="solid", width=2.5),
    "block_sparse": dict(color=_SKY, dash="dot", width=2.5),
    "linear": dict(color=_GREEN, dash="dash", width=2),
    "delta": dict(color=_PINK, dash="dash", width=2),
    "gated_delta": dict(color=_ORANGE, dash="solid", width=6),
    "anna": dict(color=_BLACK, dash="dot", width=2),
    "grassmann": dict(color=_BLACK, dash="longdash", width=2),
    "topk": dict(color=_VERMILION, dash="solid", width=2.5),
    "hybrid": dict(color=_BLUE, dash="dashdot", width=2.5),
}
OPACITY = {"gated_delta": 0.45}
DRAW_FIRST = ("gated_delta",)          # under the lines that coincide with it
# What the eye cannot separate on a panel, said in words under the title.
NOTES = {
    "prefill": "DeltaNet's line lies on Gated DeltaNet's (the wide one)",
    "decode": "top-k's line lies on softmax's until T reaches k",
    "memory": "linear, DeltaNet and Gated DeltaNet: one line (one state)",
}


def _log_range(values: Sequence[float]) -> list[float]:
    finite = [v for v in values if v and v > 0 and math.isfinite(v)]
    lo, hi = math.log10(min(finite)), math.log10(max(finite))
    return [lo - 0.15, hi + 0.15]


def landscape_figure(lengths: Sequence[int], curves: Mapping[str, Mapping[str, Sequence[float]]], *,
                     crossovers: Mapping[str, Sequence[tuple[str, float, float]]] | None = None,
                     names: Mapping[str, str] | None = None,
                     title: str = "Every mechanism on one set of axes", active: str = "prefill",
                     height: int = 620) -> go.Figure:
    """Log-log lines of ``curves[panel][mechanism]`` against ``lengths``, one panel each (``prefill``,
    ``decode``, ``memory``), switched by buttons over the plot. ``crossovers[panel]`` is a list of
    ``(label, x, y)`` or ``(label, x, y, (ax, ay))`` points marked on that panel (the memory crossover,
    the decode break-even ...), labelled in words by the caller, the label ``(ax, ay)`` pixels off the
    point (right and down), with an arrow to it; ``names[mechanism]`` overrides a legend name. The y range and
    title follow the panel; the x axis is shared."""
    panels = [p for p in PANELS if p in curves]
    if not panels:
        raise ValueError(f"curves must hold at least one of the panels {tuple(PANELS)}")
    if active not in panels:
        raise ValueError(f"active must be one of {panels}; got {active!r}")
    crossovers = crossovers or {}
    names = {**LABELS, **(names or {})}
    listed = list(curves[panels[0]])
    drawn = [m for m in listed if m in DRAW_FIRST] + [m for m in listed if m not in DRAW_FIRST]
    x = [float(t) for t in lengths]
    for panel in panels:
        for m in listed:
            if len(curves[panel][m]) != len(x):
                raise ValueError(f"curves[{panel!r}][{m!r}] has {len(curves[panel][m])} values for "
                                 f"{len(x)} lengths")

    def ys(panel: str) -> list[list[float]]:
        pts = crossovers.get(panel, [])
        return [[float(v) for v in curves[panel][m]] for m in drawn] + [[float(p[2]) for p in pts]]

    def marks(panel: str) -> dict:
        pts = crossovers.get(panel, [])
        return dict(x=[float(p[1]) for p in pts], text=[p[0] for p in pts])

    def labels(panel: str) -> list[dict]:
        # each label off its cross, where the caller says there is room, with an arrow back to it:
        # at a crossover two lines meet, so a label beside the point sits on one of them
        out = []
        for p in crossovers.get(panel, []):
            ax, ay = p[3] if len(p) > 3 else (50, 45)
            out.append(dict(x=math.log10(float(p[1])), y=math.log10(float(p[2])), xref="x", yref="y",
                            text=p[0], showarrow=True, arrowhead=0, arrowwidth=1, arrowcolor="#444",
                            ax=ax, ay=ay, font=dict(size=12), bgcolor="rgba(255,255,255,0.85)"))
        return out

    def y_range(panel: str) -> list[float]:
        return _log_range([v for row in ys(panel) for v in row])

    def subtitle(panel: str) -> dict:
        return dict(text=f"{PANELS[panel][0]}: {NOTES[panel]}", font=dict(size=12, color="#444"))

    fig = go.Figure()
    for i, m in enumerate(drawn):
        name = names.get(m, m)
        fig.add_scatter(x=x, y=ys(active)[i], mode="lines", name=name, legendrank=listed.index(m),
                        line=STYLE.get(m, dict(color=_BLACK)), opacity=OPACITY.get(m, 1.0),
                        hovertemplate=f"{name}<br>T = %{{x:,.0f}}<br>%{{y:.3s}}<extra></extra>")
    fig.add_scatter(y=ys(active)[-1], mode="markers", name="crossovers", legendrank=len(listed),
                    marker=dict(symbol="x", size=11, color=_BLACK), cliponaxis=False,
                    hovertemplate="%{text}<extra></extra>", **marks(active))
    fig.update_xaxes(type="log", title_text="context length T (tokens)", exponentformat="power")
    fig.update_yaxes(type="log", exponentformat="power", title_text=PANELS[active][1], range=y_range(active))
    n = len(drawn)
    buttons = []
    for p in panels:
        m = marks(p)
        buttons.append(dict(
            label=PANELS[p][0], method="update",
            args=[{"y": ys(p), "x": [x] * n + [m["x"]], "text": [None] * n + [m["text"]]},
                  {"yaxis.title.text": PANELS[p][1], "yaxis.range": y_range(p), "annotations": labels(p),
                   "title.subtitle.text": subtitle(p)["text"]}]))
    fig.update_layout(
        title=dict(text=title, subtitle=subtitle(active)), height=height, margin=dict(t=120),
        annotations=labels(active),
        updatemenus=[dict(type="buttons", direction="right", showactive=True, active=panels.index(active),
                          x=0.0, xanchor="left", y=1.02, yanchor="bottom", pad=dict(t=0, b=4),
                          font=dict(size=12), buttons=buttons)])
    return fig


def cell_texts(rows: Sequence[Mapping], columns: Sequence[str],
               formats: Mapping[str, str] | None = None) -> list[dict[str, str]]:
    """Each row's ``columns`` as the text a table cell shows (``formats[key]`` a format spec; ``None``
    a dash): what a chapter page pastes cell by cell into a table of its own."""
    formats = formats or {}
    return [{k: _cell(r.get(k), formats.get(k)) for k in columns} for r in rows]


def text_table(rows: Sequence[Mapping], columns: Mapping[str, str],
               formats: Mapping[str, str] | None = None, *, width: int = 80) -> str:
    """``rows`` (dicts) as lines of text no wider than ``width``: columns side by side, each as wide
    as its widest cell, when that fits; otherwise one block per row, ``header: value`` per line, long
    values wrapped under their header. ``columns`` maps a key to its header, ``formats`` a key to a
    format spec; ``None`` shows as a dash."""
    formats = formats or {}
    cells = [[_cell(r.get(k), formats.get(k)) for k in columns] for r in rows]
    heads = list(columns.values())
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(heads)]
    if sum(widths) + 2 * (len(widths) - 1) <= width:
        def line(vals):
            return "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
        return "\n".join([line(heads), line(["-" * w for w in widths])] + [line(c) for c in cells])
    label = max(len(h) for h in heads[1:]) if len(heads) > 1 else 0
    out = []
    for c in cells:
        out += textwrap.wrap(c[0], width) or [""]
        for h, v in zip(heads[1:], c[1:]):
            out += textwrap.wrap(f"{h.rjust(label)}: {v}", width, subsequent_indent=" " * (label + 4),
                                 break_on_hyphens=False, break_long_words=True) or [""]
    return "\n".join(out)


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


__all__ = ["cell_texts", "html_table", "landscape_figure", "text_table"]
