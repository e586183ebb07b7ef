"""Chapter 7's hybrids: recall of models that mix full (softmax) and linear-time layers, against the
fraction of their layers that are full. The lab trains the models (``attnlib.experiments.hybrid``
writes the layouts); this draws what it measured: every seed a point, the mean a line, one slider
step per kind of linear layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ._slider import add_frame_slider
from ._style import colour


def _ticks(fractions: Sequence[float], labels: Mapping[float, str] | None):
    labels = labels or {}
    return dict(tickvals=list(fractions), ticktext=[labels.get(f, f"{f:g}") for f in fractions])


def hybrid_recall_figure(recall: Mapping[str, Mapping[float, Sequence[float]]], *, title: str,
                         chance: float | None = None, ratio_labels: Mapping[float, str] | None = None,
                         y_title: str = "recall (queries answered)") -> go.Figure:
    """``recall[linear_mixer][fraction of full layers] = [recall of each seed]``: per linear mixer, the
    seeds as points (spread sideways a little, in seed order, so that equal values stay visible) and
    their mean as a line. With more than one mixer a slider steps through them (the same axes).
    ``chance``: a dotted line at the recall of a uniform guess. ``ratio_labels[fraction]``: the tick
    text (e.g. ``"1/8<br>7:1"``)."""
    if not recall or any(not per for per in recall.values()):
        raise ValueError("recall must hold at least one mixer with at least one fraction")
    fractions = sorted({f for per in recall.values() for f in per})
    span = (fractions[-1] - fractions[0]) or 1.0

    def traces(mixer):
        per = recall[mixer]
        xs = sorted(per)
        mean = [float(np.mean(per[f])) for f in xs]
        px, py, text = [], [], []
        for f in xs:
            vals = [float(v) for v in per[f]]
            for i, v in enumerate(vals):
                px.append(f + (i - (len(vals) - 1) / 2) * 0.006 * span)
                py.append(v)
                text.append(f"seed {i}")
        out = [go.Scatter(x=xs, y=mean, mode="lines+markers", name="mean over seeds",
                          line=dict(color=colour(0), width=2),
                          marker=dict(color=colour(0), size=9, symbol="line-ew-open"),
                          hovertemplate="full fraction %{x:g}<br>mean recall %{y:.3f}<extra></extra>"),
               go.Scatter(x=px, y=py, mode="markers", name="one seed", text=text,
                          marker=dict(color=colour(1), size=7, opacity=0.75),
                          hovertemplate="%{text}<br>recall %{y:.3f}<extra></extra>")]
        if chance is not None:
            out.append(go.Scatter(x=[fractions[0], fractions[-1]], y=[chance, chance], mode="lines",
                                  name="chance", line=dict(color="#888", dash="dot", width=1), hoverinfo="skip"))
        return out

    mixers = list(recall)
    fig = go.Figure(traces(mixers[0]))
    pad = 0.04 * span
    fig.update_xaxes(title_text="fraction of layers that are full (softmax)",
                     range=[fractions[0] - pad, fractions[-1] + pad], **_ticks(fractions, ratio_labels))
    fig.update_yaxes(title_text=y_title, range=[-0.02, 1.05])
    fig.update_layout(title=title, height=440)
    if len(mixers) > 1:
        frames = [go.Frame(data=traces(m), name=m) for m in mixers]
        add_frame_slider(fig, frames, mixers, prefix="linear layers: ")
    return fig


__all__ = ["hybrid_recall_figure"]
