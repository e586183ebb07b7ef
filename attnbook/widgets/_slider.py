"""Plotly-native sliders that work in a static page: every step is a precomputed frame.

A figure is built from its first frame's traces; each slider step animates to a named frame
(``redraw=True`` so heatmaps repaint). Nothing needs a live kernel.

Layout, in the book's style (:mod:`._style`): the slider runs the plot's full width just under it,
with the current value read out above its rail; a legend, if the figure has one, moves to the
figure's foot, under the slider, with the bottom margin sized to hold both -- so the slider never
covers a legend entry. Step labels must be short enough to be read side by side at a phone's width
(``MAX_LABEL_PX`` of slider per label): Plotly silently drops labels that do not fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

PHONE_SLIDER_PX = 330        # the slider's length on a 390-px screen (the plot's width less its margins)
DESKTOP_SLIDER_PX = 640      # ... in the book's main column on a desktop
CHAR_PX = 6.6                # width of one character of the 11-px label font
SLIDER_PX = 110              # height the slider takes under the plot: padding, current value, rail, labels
LEGEND_ROW_PX = 22


def check_steps(name: str, steps: Sequence, kind: type, *, what: str = "") -> list:
    """``steps`` as a list of ``kind`` (the data an ``experiments`` function returns for each slider step):
    a figure draws what it is given, so a figure handed anything else -- an op, a model -- fails here,
    naming the argument. ``what`` says what one step is, for the error."""
    steps = list(steps)
    if not steps:
        raise ValueError(f"{name} must hold at least one slider step{f' ({what})' if what else ''}")
    for n, st in enumerate(steps):
        if not isinstance(st, kind):
            raise TypeError(f"{name}[{n}] must be an {kind.__module__}.{kind.__name__}; got {type(st).__name__}")
    return steps


def label_fits(label: str, n_steps: int, *, width: float = DESKTOP_SLIDER_PX) -> bool:
    """Whether a step label of this length is drawn (not skipped) on a slider of ``width`` pixels with
    ``n_steps`` steps: each label gets ``width / n_steps`` pixels (the longest line of a ``<br>`` label)."""
    longest = max(len(line) for line in label.split("<br>"))
    return longest * CHAR_PX + 6 <= width / n_steps


def legend_rows(names: Sequence[str], *, width: float = PHONE_SLIDER_PX) -> int:
    """Rows a horizontal legend with these entries takes at ``width`` pixels (entries packed greedily)."""
    rows, used = 0, width
    for name in names:
        w = 40 + CHAR_PX * len(name)
        if used + w > width:
            rows, used = rows + 1, 0.0
        used += w
    return rows


def _legend_names(fig: go.Figure) -> list[str]:
    if fig.layout.showlegend is False:
        return []
    shown = [t for t in fig.data if t.showlegend is not False and t.name and t.type not in ("heatmap", "surface")]
    if len(shown) < 2 and fig.layout.showlegend is not True:
        return []
    return [str(t.name) for t in shown]


def add_frame_slider(fig: go.Figure, frames: Sequence[go.Frame], labels: Sequence[str], *,
                     prefix: str, active: int = 0) -> go.Figure:
    """Attach ``frames`` to ``fig`` with a slider whose step ``i`` shows ``frames[i]``.

    ``frames[i].name`` must be set and unique. The figure's initial traces should equal
    ``frames[active]``'s so that the page opens on the step the slider shows. A frame that changes
    what its data spans should carry the axis ranges that show it (a step keeps the axes in force).
    """
    if len(frames) != len(labels):
        raise ValueError(f"got {len(frames)} frames but {len(labels)} labels")
    fig.frames = list(frames)
    steps = [
        dict(method="animate", label=lab,
             args=[[fr.name], dict(mode="immediate", frame=dict(duration=0, redraw=True),
                                   transition=dict(duration=0))])
        for fr, lab in zip(frames, labels)
    ]
    fig.update_layout(sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=prefix))])
    names = _legend_names(fig)
    bottom = SLIDER_PX + 50                                                   # + the x axis' ticks and title
    if names:
        fig.update_layout(legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom", xref="container",
                                      x=0.0, xanchor="left"))
        bottom += LEGEND_ROW_PX * legend_rows(names)
    before = fig.layout.margin.b if fig.layout.margin.b is not None else fig.layout.template.layout.margin.b or 0
    if bottom > before:
        # The slider (and legend) take room from the figure, not from the plot: grow the figure by it.
        height = fig.layout.height or 450
        fig.update_layout(margin=dict(b=bottom), height=height + bottom - before)
    return fig

