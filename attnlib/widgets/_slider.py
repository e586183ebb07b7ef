"""Plotly-native sliders that work in a static page: every step is a precomputed frame.

A figure is built from its first frame's traces; each slider step animates to a named frame
(``redraw=True`` so heatmaps repaint). Nothing needs a live kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go


def add_frame_slider(fig: go.Figure, frames: Sequence[go.Frame], labels: Sequence[str], *,
                     prefix: str, active: int = 0) -> go.Figure:
    """Attach ``frames`` to ``fig`` with a slider whose step ``i`` shows ``frames[i]``.

    ``frames[i].name`` must be set and unique. The figure's initial traces should equal
    ``frames[active]``'s so that the page opens on the step the slider shows.
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
    fig.update_layout(sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=prefix),
                                    pad=dict(t=40))])
    return fig
