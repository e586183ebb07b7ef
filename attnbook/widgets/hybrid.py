"""Chapter 7's hybrids: recall of models that mix full (softmax) and linear-time layers, against the
fraction of their layers that are full. The lab trains the models (``attnbook.experiments.hybrid``
writes the layouts); this draws what it measured: every seed a point, the mean a line, one slider
step per kind of linear layer (:func:`hybrid_recall_figure`); and the grid's learning curves
(``scripts/hybrid_grid.py``, grouped by :func:`attnbook.experiments.hybrid.grid_curves`): recall
against training steps, one line per ratio, one slider step per task and learning rate
(:func:`hybrid_curves_figure`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ._slider import add_frame_slider
from ._style import colour
from ._style import title as style_title


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


def _mean_curve(seeds: Sequence[Sequence[Sequence[float]]]) -> tuple[list[int], list[float]]:
    steps = [int(s) for s, _ in seeds[0]]
    if any([int(s) for s, _ in c] != steps for c in seeds):
        raise ValueError("the seeds of one ratio must be evaluated at the same steps")
    return steps, np.mean([[float(r) for _, r in c] for c in seeds], axis=0).tolist()


def hybrid_curves_figure(curves: Mapping[str, Mapping[float, Mapping[str, Sequence[Sequence[Sequence[float]]]]]], *,
                         title: str, threshold: float | None = 0.9,
                         chance: Mapping[str, float] | None = None) -> go.Figure:
    """``curves[task][lr][ratio label] = [curve of each seed]``, a curve ``[(step, recall), ...]`` (as
    :func:`attnbook.experiments.hybrid.grid_curves` groups a grid's runs): recall against training steps,
    one colour per ratio -- the mean over seeds a thick line, each seed a thin one. One slider step per
    (task, learning rate), in the order given; the subtitle names the step shown. ``threshold``: a dashed
    line at that recall; ``chance[task]``: a dotted line at the recall of a uniform guess. A ratio missing
    from some step (a grid cut short) is drawn empty there."""
    cells = [(task, lr, per) for task, by_lr in curves.items() for lr, per in by_lr.items()]
    if not cells:
        raise ValueError("curves must hold at least one (task, lr) with curves")
    labels = list(dict.fromkeys(label for _, _, per in cells for label in per))
    n_seeds = {len(seeds) for _, _, per in cells for seeds in per.values()}

    def last_step(task):
        return max((c[-1][0] for per in curves[task].values() for seeds in per.values() for c in seeds if c), default=1)

    def frame(task, lr, per):
        out = []
        for i, label in enumerate(labels):
            seeds = [c for c in per.get(label, []) if c]
            xs, ys = [], []
            for c in seeds:                        # every seed in one trace, broken by None: a fixed trace count
                xs += [int(s) for s, _ in c] + [None]
                ys += [float(r) for _, r in c] + [None]
            mx, my = _mean_curve(seeds) if seeds else ([], [])
            out += [go.Scatter(x=xs, y=ys, mode="lines", name=f"{label}, one seed", legendgroup=label,
                               showlegend=False, line=dict(color=colour(i), width=1), opacity=0.35,
                               hoverinfo="skip"),
                    go.Scatter(x=mx, y=my, mode="lines+markers", name=label, legendgroup=label,
                               line=dict(color=colour(i), width=2.5), marker=dict(size=4),
                               hovertemplate=f"{label}<br>step %{{x}}<br>mean recall %{{y:.3f}}<extra></extra>")]
        end = last_step(task)
        if threshold is not None:
            out.append(go.Scatter(x=[0, end], y=[threshold, threshold], mode="lines", name=f"recall {threshold:g}",
                                  line=dict(color="#888", dash="dash", width=1), hoverinfo="skip"))
        if chance is not None:
            out.append(go.Scatter(x=[0, end], y=[chance[task]] * 2, mode="lines", name="chance",
                                  line=dict(color="#888", dash="dot", width=1), hoverinfo="skip"))
        return out

    def heading(task, lr):
        seeds = f"{min(n_seeds)}" if len(n_seeds) == 1 else f"{min(n_seeds)}-{max(n_seeds)}"
        return style_title(title, f"{task}, lr {lr:g}: mean of {seeds} seeds (thin: each)")

    def x_range(task):
        end = last_step(task)
        return [-0.02 * end, 1.02 * end]

    task0, lr0, per0 = cells[0]
    fig = go.Figure(frame(task0, lr0, per0))
    fig.update_xaxes(title_text="training steps", range=x_range(task0))
    fig.update_yaxes(title_text="recall (held-out queries)", range=[-0.02, 1.05])
    fig.update_layout(title=heading(task0, lr0), height=480)
    if len(cells) > 1:
        frames = [go.Frame(data=frame(task, lr, per), name=f"{task}, lr {lr:g}",
                           layout=dict(title=heading(task, lr), xaxis=dict(range=x_range(task))))
                  for task, lr, per in cells]
        add_frame_slider(fig, frames, [f"{task}<br>{lr:g}" for task, lr, _ in cells], prefix="task, lr: ")
    return fig


__all__ = ["hybrid_recall_figure", "hybrid_curves_figure"]
