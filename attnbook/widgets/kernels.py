"""What a chunked kernel moves, launch by launch, beside fla (chapters 3 and 4).

``launch_bytes_figure`` draws one stacked bar per (library, pass): each segment is one kernel launch,
its height the bytes of the tensors that launch touches; a Plotly slider (precomputed steps: it works
in the static book) moves between the benchmark shapes. The numbers come from
:mod:`attnbook.experiments.kernels`; this module only draws.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from attnbook.experiments.kernels import Launch

from ._slider import add_frame_slider
from ._style import split_title

COLOURS = {"attnlib": ("#1f77b4", "#aec7e8"), "fla": ("#ff7f0e", "#ffbb78")}   # alternate shades per launch


def _bars(launches_by_lib: Mapping[str, Sequence[Launch]], rows: int) -> list[go.Bar]:
    """One bar segment per launch: x = "<lib> <pass>", height = bytes per (batch, head, token)."""
    out = []
    for phase in ("fwd", "bwd"):                          # bars side by side per pass: attnlib, then fla
        for lib, launches in launches_by_lib.items():
            for i, ln in enumerate(x for x in launches if x.phase == phase):
                programs = f"<br>{ln.programs} programs" if ln.programs else ""
                out.append(go.Bar(
                    x=[f"{lib} {phase}"], y=[ln.bytes / rows], showlegend=False,
                    marker=dict(color=COLOURS.get(lib, ("#7f7f7f", "#c7c7c7"))[i % 2],
                                line=dict(color="white", width=1)),
                    hovertemplate=(f"{lib} {phase}, launch {i + 1}: {ln.kernel}<br>{ln.bytes / 1e6:,.1f} MB in all, "
                                   f"%{{y:.0f}} B per token and head{programs}<extra></extra>")))
    return out


def launch_bytes_figure(per_shape: Mapping[str, Mapping[str, Sequence[Launch]]], *, title: str) -> go.Figure:
    """``per_shape[shape][lib]``: the launches of ``lib`` at ``shape`` (``"BxHxTxD"``, forward then
    backward). Bars "attnlib fwd", "fla fwd", "attnlib bwd", "fla bwd" in that order, stacked by launch
    (hover: kernel, MB, programs), in bytes per (batch, head, token) so that shapes compare; one slider
    step per shape."""
    if not per_shape:
        raise ValueError("per_shape is empty: no shape to draw")
    bars = {}
    for shape, by_lib in per_shape.items():
        B, H, T, _ = (int(x) for x in shape.split("x"))
        bars[shape] = _bars(by_lib, B * H * T)
    width = max(len(b) for b in bars.values())
    # A step with fewer launches is padded with empty bars, so that every frame replaces every trace.
    padded = {s: b + [go.Bar(x=[None], y=[None], showlegend=False) for _ in range(width - len(b))]
              for s, b in bars.items()}
    shapes = list(padded)
    fig = go.Figure(data=padded[shapes[0]])
    # A slider step redraws the traces but keeps the axes it opened with: fix both axes to cover
    # every step (all bar categories, the tallest stack), not only the first one.
    cats, top = [], 0.0
    for b in bars.values():
        stack: dict[str, float] = {}
        for tr in b:
            stack[tr.x[0]] = stack.get(tr.x[0], 0.0) + float(tr.y[0])
        cats += [c for c in stack if c not in cats]
        top = max([top, *stack.values()])
    fig.update_layout(barmode="stack", title=split_title(title), height=480, margin=dict(b=40),
                      yaxis=dict(title="bytes touched per (batch, head, token)", range=[0, 1.05 * top or 1.0]),
                      xaxis=dict(title="library and pass", type="category", categoryorder="array",
                                 categoryarray=cats, range=[-0.5, len(cats) - 0.5]))
    frames = [go.Frame(data=padded[s], name=s) for s in shapes]
    return add_frame_slider(fig, frames, [s.replace("x", "\u00d7") for s in shapes], prefix="B\u00d7H\u00d7T\u00d7D = ")


__all__ = ["launch_bytes_figure"]
