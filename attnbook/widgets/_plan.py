"""The plan picture shared by chapters 1 and 5: two transport plans side by side, each a heatmap with
its row sums (bars to its right) and column sums (bars under it).

Drawing only: the plans are computed by the caller (``attnlib.eot``, ``attnbook.experiments.weights``).
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ._style import PLAN_SCALE, colorbar, colour, stack_panels

ROW_SUM_COLOUR, COLUMN_SUM_COLOUR = colour(1), colour(2)
# Where each trace of a pair of plans goes: (heatmap, row sums, column sums) for the left plan, then the right.
POSITIONS = [(1, 1), (1, 2), (2, 1), (1, 3), (1, 4), (2, 3)]


def plan_traces(P: torch.Tensor, show_scale: bool) -> list[go.BaseTraceType]:
    """Heatmap of P, its row sums (horizontal bars) and column sums (vertical bars)."""
    Pn = P.numpy()
    rows = [f"q{i}" for i in range(Pn.shape[0])]
    cols = [f"k{j}" for j in range(Pn.shape[1])]
    return [
        go.Heatmap(z=Pn, x=cols, y=rows, zmin=0.0, zmax=1.0, colorscale=PLAN_SCALE, showscale=show_scale,
                   colorbar=dict(title=dict(text="mass P<sub>ij</sub>", side="right"), thickness=10)
                   if show_scale else None,
                   hovertemplate="%{y} → %{x}: mass %{z:.3f}<extra></extra>"),
        go.Bar(x=Pn.sum(1), y=rows, orientation="h", marker_color=ROW_SUM_COLOUR, name="row sum",
               hovertemplate="%{y} ships %{x:.3f}<extra>row sum</extra>", showlegend=False),
        go.Bar(x=cols, y=Pn.sum(0), marker_color=COLUMN_SUM_COLOUR, name="column sum",
               hovertemplate="%{x} receives %{y:.3f}<extra>column sum</extra>", showlegend=False),
    ]


def plan_frame_traces(P: torch.Tensor) -> list[go.BaseTraceType]:
    """Only what a slider step changes (z of the map, lengths of the bars): frames that restate
    axes, colour bars or labels make Plotly re-create the heatmap and can leave it blank."""
    Pn = P.numpy()
    return [go.Heatmap(z=Pn), go.Bar(x=Pn.sum(1)), go.Bar(y=Pn.sum(0))]


def plan_pair_figure(left: torch.Tensor, right: torch.Tensor, titles: tuple[str, str], *,
                     row_sum_max: float, column_sum_max: float, height: int) -> go.Figure:
    """Two plans side by side (``left`` shows the colour bar), with their row- and column-sum bars.
    The bar axes are fixed (``row_sum_max``, ``column_sum_max``) so that every slider step shows its bars
    on the same scale. Both plans share the colour scale; its bar stands right of the pair (beside the
    left plan when a phone stacks the two: :func:`._style.stack_panels`)."""
    fig = make_subplots(rows=2, cols=4, column_widths=[0.37, 0.09, 0.37, 0.09], row_heights=[0.72, 0.28],
                        horizontal_spacing=0.035, vertical_spacing=0.08,
                        subplot_titles=(titles[0], "", titles[1], "", "", "", "", ""))
    for tr, (r, c) in zip(plan_traces(left, True) + plan_traces(right, False), POSITIONS):
        fig.add_trace(tr, row=r, col=c)
    for c in (1, 3):
        fig.update_xaxes(title_text="key j", row=1, col=c, showticklabels=False)
        # The right-hand plan has the same queries and the same column-sum scale: label them once, on the left.
        fig.update_yaxes(title_text="query i" if c == 1 else None, showticklabels=(c == 1), autorange="reversed",
                         row=1, col=c)
        fig.update_xaxes(title_text="key j", row=2, col=c)
        fig.update_yaxes(range=[0, column_sum_max], title_text="column sum" if c == 1 else None,
                         showticklabels=(c == 1), row=2, col=c)
    for c in (2, 4):
        fig.update_yaxes(autorange="reversed", showticklabels=False, row=1, col=c)
        fig.update_xaxes(range=[0, row_sum_max], title_text="row sum", tickvals=[0, 1], row=1, col=c)
    fig.update_layout(height=height, bargap=0.15)
    fig.update_annotations(font=dict(size=13))
    # The colour bar right of the right-hand plan's row sums, as tall as the maps.
    fig.update_traces(colorbar=colorbar(fig, ["xaxis4", "yaxis4"], title="mass P<sub>ij</sub>"),
                      selector=dict(type="heatmap", showscale=True))
    # Narrow: each plan with its bars, one under the other; the right-hand plan labels its own queries.
    stack_panels(fig, [["xaxis", "yaxis", "xaxis2", "yaxis2", "xaxis5", "yaxis5"],
                       ["xaxis3", "yaxis3", "xaxis4", "yaxis4", "xaxis7", "yaxis7"]], height=430,
                 narrow={"yaxis3.showticklabels": True, "yaxis3.title.text": "query i",
                         "yaxis7.showticklabels": True, "yaxis7.title.text": "column sum"})
    return fig
