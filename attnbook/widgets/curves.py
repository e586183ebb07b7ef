"""Measured curves, one line per series -- the plain figures the labs draw beside their checks
(convergence of a solver, an error against a size, accuracy against a load, counted work).

One function, so that every such figure has a title, titled axes (with units), the book's colours
and a legend under the plot; the numbers are the lab's, computed before the call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from ._style import colour, split_title, top_margin


def curves_figure(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str, x_title: str,
                  y_title: str, log_x: bool = False, log_y: bool = False, y_range: Sequence[float] | None = None,
                  errors: Mapping[str, Sequence[float]] | None = None, styles: Mapping[str, dict] | None = None,
                  mode: str = "lines+markers", height: int = 440) -> go.Figure:
    """``curves[name] = (x, y)``: one line per name, in the book's colourway unless ``styles[name]``
    (Plotly scatter properties: ``line``, ``marker``, ``mode`` ...) says otherwise; ``errors[name]``
    adds symmetric error bars. ``y_range`` is in data units (log10 of them on a log axis, as Plotly)."""
    if not curves:
        raise ValueError("curves must hold at least one series")
    styles = styles or {}
    errors = errors or {}
    fig = go.Figure()
    for i, (name, (x, y)) in enumerate(curves.items()):
        x, y = [float(v) for v in x], [float(v) for v in y]
        if len(x) != len(y):
            raise ValueError(f"curve {name!r} has {len(x)} x values but {len(y)} y values")
        style = dict(mode=mode, line=dict(color=colour(i)), marker=dict(color=colour(i)))
        for key, val in styles.get(name, {}).items():
            style[key] = {**style.get(key, {}), **val} if isinstance(val, dict) else val
        err = errors.get(name)
        fig.add_scatter(x=x, y=y, name=name, error_y=None if err is None else dict(type="data", array=list(err)),
                        **style)
    fig.update_xaxes(title_text=x_title, type="log" if log_x else None, exponentformat="power")
    fig.update_yaxes(title_text=y_title, type="log" if log_y else None, exponentformat="power", range=y_range)
    # A "<br><sup>...</sup>" subtitle goes to title.subtitle: 12 px instead of <sup>'s 10 px.
    t = split_title(title)
    fig.update_layout(title=t, height=height)
    if t["subtitle"]["text"]:
        fig.update_layout(margin=dict(t=top_margin(1, t["subtitle"]["text"].count("<br>") + 1)))
    return fig


__all__ = ["curves_figure"]
