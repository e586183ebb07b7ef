"""Chapter 1's real input: the attention of a trained byte-level model on a snippet of Python, with the
snippet's characters on both axes.

One heatmap per mechanism on the same axes -- softmax's plan (shown first) and linear attention with
``elu + 1`` features on the same queries and keys -- switched by two buttons, and a slider over the
model's heads (precomputed frames: it works in a static page). The masked cells (key after query) hold
no number (NaN), so the grey plot background shows through them, distinct from the white of a zero weight.
Hovering a cell names the query's character, with the text it ends, the key's character, and the weight.

Drawing only: :func:`attnbook.experiments.byte_model.snippet_attention` and
:func:`~attnbook.experiments.byte_model.head_views` compute what is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from attnbook.experiments.byte_model import ROLE_TEXT, HeadView, SnippetAttention, visible

from ._slider import add_frame_slider, check_steps
from ._style import (
    MASKED_COLOUR,
    MASKED_NOTE,
    PLAN_SCALE,
    SUBTITLE_LINE_CHARS,
    hover_rows,
    title,
    top_margin,
    wrap,
)

NOTE_PX = 18                    # the masked note, a second line under the x axis' title
BUTTONS_PX = 50                 # the mechanism buttons, between the subtitle and the plot
MECHANISMS = ("softmax", "linear (elu+1)")
PREFIX_CHARS = 10               # how much of the text before a query its hover label quotes

SHORT_ROLE = {"previous": "the previous byte", "self": "itself", "first": "the first byte",
              "newline": "the newline starting its line", "open_bracket": "the open bracket",
              "same_byte": "earlier copies of its byte", "after_same_byte": "the byte after a copy"}


def _masked(W) -> np.ndarray:
    """``W [T, T]`` as float32 with NaN above the diagonal (the keys a causal query cannot see)."""
    z = W.detach().cpu().numpy() if hasattr(W, "detach") else np.asarray(W)
    z = z.astype(np.float32)                  # float32 travels in half the bytes; the hover shows 3 decimals
    z[np.triu_indices(z.shape[0], 1)] = np.nan
    return z


def _hover_data(text: str) -> np.ndarray:
    """Per cell ``[t, j]``: the text that query ``t`` ends and the text that key ``j`` ends (visible
    whitespace, the last ``PREFIX_CHARS``), so that a hover tells which ␣ of the snippet a key is."""
    labels = [visible(c) for c in text]
    ends = ["…" * (t + 1 > PREFIX_CHARS) + "".join(labels[max(0, t + 1 - PREFIX_CHARS):t + 1])
            for t in range(len(text))]
    cells = np.empty((len(text), len(text), 2), dtype=object)
    for t, e in enumerate(ends):
        cells[t, :, 0] = e
        cells[:, t, 1] = e
    return cells


def _subtitle(v: HeadView) -> str:
    r = v.roles
    role = r["role"]
    # measured on softmax's plan: said so, since the linear button shows other weights under the same title
    return wrap(f"head {v.layer + 1}.{v.head + 1} under softmax: {r[role]:.2f} of a row on "
                f"{SHORT_ROLE.get(role, ROLE_TEXT.get(role, role))}", SUBTITLE_LINE_CHARS)


def real_input_figure(att: SnippetAttention, views: Sequence[HeadView], *, active: int = 0,
                      heading: str = "Attention on a real snippet", height: int = 600) -> go.Figure:
    """The heatmap of one head's attention on ``att.text`` (characters on both axes, whitespace drawn as
    ``␣`` and ``↵``), a slider over ``views`` (one step per head, labelled ``layer.head``: ``1.1``...), buttons for
    softmax's plan and linear attention's weights on the same queries and keys; the subtitle gives the
    shown head's role as measured (``views[i].roles``: the role whose mass most exceeds a uniform head's)."""
    if not isinstance(att, SnippetAttention):
        raise TypeError(f"att must be a SnippetAttention; got {type(att).__name__}")
    views = check_steps("views", views, HeadView, what="one head")
    if not 0 <= active < len(views):
        raise ValueError(f"active must be in [0, {len(views) - 1}]; got {active}")
    T = len(att.text)
    for n, v in enumerate(views):
        if tuple(v.softmax.shape) != (T, T) or tuple(v.linear.shape) != (T, T):
            raise ValueError(f"views[{n}] holds [{T}, {T}] weights only for a {T}-byte text; got "
                             f"{tuple(v.softmax.shape)} and {tuple(v.linear.shape)}")
    ticks = dict(tickmode="array", tickvals=list(range(T)), ticktext=list(att.labels), tickangle=0,
                 tickfont=dict(size=10, family="Menlo, Consolas, monospace"), showgrid=False)
    cd = _hover_data(att.text)
    # on these axes %{y} and %{x} are the tick labels: the query's and the key's characters
    hover = ("query %{y}, ending “%{customdata[0]}”<br>key %{x}, ending “%{customdata[1]}”<br>"
             "weight %{z:.3f}<extra>%{fullData.name}</extra>")

    def traces(v: HeadView) -> list[go.Heatmap]:
        return [go.Heatmap(z=_masked(v.softmax), name=MECHANISMS[0], visible=True),
                go.Heatmap(z=_masked(v.linear), name=MECHANISMS[1], visible=False)]

    fig = go.Figure(data=traces(views[active]))
    fig.update_traces(x=list(range(T)), y=list(range(T)), customdata=cd, hovertemplate=hover,
                      hoverongaps=False, zmin=0.0, zmax=1.0, colorscale=PLAN_SCALE, xgap=0.5, ygap=0.5,
                      colorbar=dict(title=dict(text="weight"), thickness=10, len=0.8))
    frames = [go.Frame(data=[go.Heatmap(z=tr.z) for tr in traces(v)], traces=[0, 1], name=f"h{n}",
                       layout=dict(title=title(heading, _subtitle(v))))
              for n, v in enumerate(views)]
    lines = max(_subtitle(v).count("<br>") + 1 for v in views)
    fig.update_layout(
        title=title(heading, _subtitle(views[active])),
        height=height, margin=dict(t=top_margin(1, lines) + BUTTONS_PX, l=50, r=10), plot_bgcolor=MASKED_COLOUR,
        hoverlabel=dict(font=dict(color="#222")),
        xaxis=dict(title=dict(text=f"key j (an earlier byte)<br>{MASKED_NOTE}"), **ticks),
        yaxis=dict(title=dict(text="query t"), autorange="reversed", **ticks),
        updatemenus=[dict(type="buttons", direction="right", showactive=True, active=0, x=0.0, xanchor="left",
                          y=1.02, yanchor="bottom", pad=dict(t=0, b=4), buttons=[
                              dict(label=MECHANISMS[0], method="restyle", args=[{"visible": [True, False]}]),
                              dict(label=MECHANISMS[1], method="restyle", args=[{"visible": [False, True]}]),
                          ])])
    labels = [f"{v.layer + 1}.{v.head + 1}" for v in views]
    fig = add_frame_slider(fig, frames, labels, prefix="layer.head ", active=active)
    # the x axis' title has a second line (the masked note): the slider moves down by one line
    fig.layout.sliders[0].pad.t = fig.layout.sliders[0].pad.t or fig.layout.template.layout.sliderdefaults.pad.t
    fig.layout.sliders[0].pad.t += NOTE_PX
    fig.update_layout(height=fig.layout.height + NOTE_PX, margin=dict(b=fig.layout.margin.b + NOTE_PX))
    return hover_rows(fig)
