"""Chapter 7's top-k layer: its mechanism map, and recall against k.

Drawing only: the plans, scores, selections and recalls are computed by
:mod:`attnbook.experiments.topk` (on :mod:`attnlib.topk`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ._slider import add_frame_slider
from ._style import PLAN_SCALE, colour
from .curves import curves_figure

LOST_COLOUR = colour(1)


def _r(x, digits: int = 4) -> np.ndarray:
    """float32, rounded: the figure's JSON carries what the eye can see, not 17 digits."""
    return np.round(np.asarray(x, dtype=np.float64), digits).astype(np.float32)


def _outlines(mask: np.ndarray) -> tuple[list, list]:
    """The outline of every selected cell ``(t, s)`` of ``mask`` as one broken line (``None`` between
    squares): a square of side 0.9 around each, drawn over a heatmap in data units, so that it scales
    with the plot."""
    xs: list = []
    ys: list = []
    h = 0.45
    for t, s in zip(*np.nonzero(mask)):
        xs += [s - h, s + h, s + h, s - h, s - h, None]
        ys += [t - h, t - h, t + h, t + h, t - h, None]
    return xs, ys


def mechanism_map_figure(plan, scores, ks: Sequence[int], restricted: Sequence, lost: Sequence, *,
                         masks: Sequence | None = None, active: int | None = None) -> go.Figure:
    """The top-k layer beside softmax's plan, with a slider over ``k``.

    Top left, the dense causal plan ``[T, T]``; top right, the plan restricted to each row's ``k``
    best-scored keys and renormalised (chapter 1's plan with that support), on the same colour scale;
    in both, the ``k`` keys chosen in each row are outlined. Bottom left, the indexer's scores on the
    causal pairs (``nan`` elsewhere); bottom right, each row's lost mass ``1 - p(S)`` (half the L1
    distance between the two plans). ``restricted[i]``, ``lost[i]`` (and ``masks[i]``, the selection:
    by default where ``restricted[i]`` is positive) belong to ``ks[i]``.
    """
    plan = np.asarray(plan, dtype=np.float64)
    T = plan.shape[0]
    ks = [int(k) for k in ks]
    if not ks or len(restricted) != len(ks) or len(lost) != len(ks):
        raise ValueError(f"need one restricted plan and one lost-mass row per k; got {len(ks)} k, "
                         f"{len(restricted)} plans, {len(lost)} rows")
    mats = [np.asarray(R, dtype=np.float64) for R in restricted]
    losts = [np.asarray(x, dtype=np.float64) for x in lost]
    for i, (R, x) in enumerate(zip(mats, losts)):
        if R.shape != (T, T) or x.shape != (T,):
            raise ValueError(f"restricted[{i}] / lost[{i}] have shapes {R.shape} / {x.shape}; expected "
                             f"({T}, {T}) / ({T},) like plan")
    if masks is None:
        sel = [R > 0 for R in mats]
    else:
        if len(masks) != len(ks):
            raise ValueError(f"need one selection mask per k; got {len(masks)} for {len(ks)} k")
        sel = [np.asarray(m, dtype=bool) for m in masks]
    active = len(ks) // 2 if active is None else active
    pos = list(range(T))
    zmax = float(plan[1:].max()) if T > 1 else 1.0        # a causal first row is one weight 1: keep contrast
    sc = np.asarray(scores, dtype=np.float64)
    lost_max = max(float(x.max()) for x in losts)

    def title(i):
        x = losts[i]
        return dict(text="The top-k layer against softmax's plan",
                    subtitle=dict(text=f"outlined: the k = {ks[i]} keys of {T} chosen per row<br>mass lost: "
                                       f"mean {x.mean():.2f}, max {x.max():.2f}", font=dict(size=12)))

    fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.16, vertical_spacing=0.16,
                        subplot_titles=("softmax's plan", "top-k plan", "indexer scores", "mass lost"))
    heat = dict(x=pos, y=pos, colorscale=PLAN_SCALE, showscale=False)
    fig.add_trace(go.Heatmap(z=_r(plan), zmin=0, zmax=zmax, **heat,
                             hovertemplate="query %{y} → key %{x}: %{z:.3f}<extra>plan</extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=_r(mats[active]), zmin=0, zmax=zmax, **heat,
                             hovertemplate="query %{y} → key %{x}: %{z:.3f}<extra>top-k plan</extra>"), row=1, col=2)
    fig.add_trace(go.Heatmap(z=_r(sc, 3), x=pos, y=pos, colorscale="Greys", showscale=False,
                             hovertemplate="query %{y}, key %{x}: score %{z:.2f}<extra>indexer</extra>"), row=2, col=1)
    fig.add_trace(go.Bar(x=_r(losts[active]), y=pos, orientation="h", marker_color=LOST_COLOUR, name="mass lost",
                         hovertemplate="query %{y}: 1 - p(S) = %{x:.3f}<extra></extra>", showlegend=False),
                  row=2, col=2)
    box = dict(mode="lines", line=dict(color=LOST_COLOUR, width=1), hoverinfo="skip", showlegend=False,
               name="chosen keys")
    for col in (1, 2):
        ox, oy = _outlines(sel[active])
        fig.add_trace(go.Scatter(x=ox, y=oy, **box), row=1, col=col)
    axes = dict(yaxis=dict(range=[T - 0.5, -0.5]), yaxis2=dict(range=[T - 0.5, -0.5]),
                yaxis3=dict(range=[T - 0.5, -0.5]), yaxis4=dict(range=[T - 0.5, -0.5]),
                xaxis=dict(range=[-0.5, T - 0.5]), xaxis2=dict(range=[-0.5, T - 0.5]),
                xaxis4=dict(range=[0, max(lost_max * 1.05, 1e-3)]))
    for r, c in ((1, 1), (1, 2), (2, 1)):
        fig.update_xaxes(title_text="key s", range=[-0.5, T - 0.5], row=r, col=c)
    for r, c in ((1, 1), (1, 2), (2, 1), (2, 2)):
        fig.update_yaxes(title_text="query t", row=r, col=c)
    fig.update_xaxes(title_text="1 - p(S)", row=2, col=2)

    def frame_data(i):
        ox, oy = _outlines(sel[i])
        return [go.Heatmap(z=_r(mats[i])), go.Bar(x=_r(losts[i])), go.Scatter(x=ox, y=oy), go.Scatter(x=ox, y=oy)]

    frames = [go.Frame(data=frame_data(i), traces=[1, 3, 4, 5], name=f"k{k}",
                       layout=go.Layout(title=title(i), **axes))
              for i, k in enumerate(ks)]
    fig.update_layout(title=title(active), height=760, margin=dict(t=110),
                      meta={"mechanism_map": "top-k attention with a lightning indexer"}, **axes)
    return add_frame_slider(fig, frames, [str(k) for k in ks], prefix="k = ", active=active)


def recall_figure(ks: Sequence[int], curves: dict[str, tuple[Sequence[float], Sequence[float]]], *,
                  oracle: tuple[Sequence[float], Sequence[float]],
                  untrained: tuple[Sequence[float], Sequence[float]], title: str) -> go.Figure:
    """Recall ``p(S)`` against ``k`` (log axis): one line per trained indexer (``curves[name] = (mean,
    spread)``), the oracle top-k (the teacher's own: an upper bound) and an untrained indexer, each
    with its spread over seeds as error bars."""
    data, errors, styles = {}, {}, {}
    for name, (mean, spread) in {**curves, "oracle top-k": oracle, "untrained indexer": untrained}.items():
        data[name] = (list(ks), list(mean))
        errors[name] = list(spread)
    styles["oracle top-k"] = dict(line=dict(color="black", dash="dash"), marker=dict(color="black"))
    styles["untrained indexer"] = dict(line=dict(color="#888", dash="dot"), marker=dict(color="#888"))
    fig = curves_figure(data, title=title, x_title="k (keys selected per query)",
                        y_title="recall p(S)", log_x=True, y_range=[0, 1.02], errors=errors, styles=styles, height=480)
    fig.update_xaxes(tickvals=list(ks), ticktext=[str(k) for k in ks])
    return fig


SHARED_SERIES = {"own": "each head its own top-k", "shared": "one shared top-k: mean over heads",
                 "worst_head": "one shared top-k: worst head"}


def shared_selection_figure(heads: Sequence[int], by_common: dict[float, dict[str, Sequence[float]]], *,
                            top_k: int, title: str) -> go.Figure:
    """What one selection shared by all heads costs each head: the mass a head's plan keeps on the
    selected keys against the number of heads ``H`` (log axis), for a per-head selection, and for one
    shared selection (its mean over heads and its worst head). ``by_common[c][series]`` holds one value
    per entry of ``heads`` (series as :data:`SHARED_SERIES`); a slider steps through the share ``c`` of
    each head's plan that is common to all heads."""
    commons = sorted(by_common)
    if not commons:
        raise ValueError("by_common must hold at least one share")
    styles = {"own": dict(line=dict(color="black", dash="dash"), marker=dict(color="black")),
              "shared": dict(line=dict(color=colour(0)), marker=dict(color=colour(0))),
              "worst_head": dict(line=dict(color=LOST_COLOUR), marker=dict(color=LOST_COLOUR))}

    def traces(c):
        return [go.Scatter(x=list(heads), y=[float(v) for v in by_common[c][key]], name=name, mode="lines+markers",
                           hovertemplate="H = %{x}<br>mass kept %{y:.3f}<extra></extra>", **styles[key])
                for key, name in SHARED_SERIES.items()]

    active = len(commons) // 2
    fig = go.Figure(traces(commons[active]))
    fig.update_xaxes(title_text="heads sharing the selection (H)", type="log", tickvals=list(heads),
                     ticktext=[str(h) for h in heads])
    fig.update_yaxes(title_text=f"head's mass on the {top_k} keys kept", range=[0, 1.02])
    fig.update_layout(title=title, height=480)
    labels = [f"{c:g}" for c in commons]
    frames = [go.Frame(data=traces(c), name=label) for c, label in zip(commons, labels)]
    add_frame_slider(fig, frames, labels, prefix="share common to all heads: ", active=active)
    return fig


__all__ = ["mechanism_map_figure", "recall_figure", "shared_selection_figure"]
