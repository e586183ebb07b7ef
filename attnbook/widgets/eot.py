"""Chapter 1's figures: transport plans and attention maps.

Static versions (``*_figure``) precompute every slider step as a Plotly frame, so they work in the
built book with no kernel. Live versions (``*_explorer``) are ipywidgets around a FigureWidget. They
draw what :mod:`attnbook.experiments.eot` computes (plans, their entropy and objective, attention maps);
a live explorer takes the function that computes a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnbook.experiments.eot import AttentionMap, PlanPair
from attnlib import _validate

from ._plan import plan_frame_traces, plan_pair_figure, plan_traces
from ._slider import add_frame_slider, check_steps
from ._style import (
    DIVERGING_SCALE,
    MASKED_COLOUR,
    MASKED_NOTE,
    PLAN_SCALE,
    colorbar,
    hover_rows,
    merge_meta,
    stack_panels,
    top_margin,
    wrap,
)
from ._style import title as _style_title


def _number(x: float) -> str:
    """``x`` to 2 decimals with a typographic minus."""
    return f"{x:.2f}".replace("-", "−")


def _title(pair: PlanPair) -> dict:
    def stats(i):
        return f"entropy {_number(pair.entropy[i])}, objective {_number(pair.objective[i])}"
    return _style_title(f"Transport plans at temperature ε = {pair.eps:.3g}",
                 f"one-sided (softmax): {stats(0)}<br>two-sided (Sinkhorn): {stats(1)}<br>"
                 "objective: cost ⟨P, C⟩ − ε × entropy, minimised")



def transport_plan_figure(plans: Sequence[PlanPair], *, active: int | None = None) -> go.Figure:
    """One-sided vs two-sided entropic transport plans, with an ε slider: one step per
    :class:`~attnbook.experiments.eot.PlanPair` (:func:`attnbook.experiments.eot.transport_plans`).

    Left: the one-sided plan (= softmax(-C/ε) row-wise); its rows ship unit mass, its columns
    receive whatever they attract. Right: the balanced plan from Sinkhorn (columns receive
    ``b``, by default ``Nq/Nk`` each). Bars: row sums (red, right of each map) and column sums
    (green, below). The title reports entropy and objective ``<P, C> - ε H(P)``, in words.
    """
    plans = check_steps("plans", plans, PlanPair)
    shape = tuple(plans[0].one_sided.shape)
    for i, pp in enumerate(plans):
        if tuple(pp.one_sided.shape) != shape or tuple(pp.two_sided.shape) != shape:
            raise ValueError(f"plans[{i}] has plans of shape {tuple(pp.one_sided.shape)} and "
                             f"{tuple(pp.two_sided.shape)}; expected {shape} like plans[0]")
    active = len(plans) // 2 if active is None else active
    frames = [go.Frame(data=plan_frame_traces(pp.one_sided) + plan_frame_traces(pp.two_sided), name=f"eps{i}",
                       traces=list(range(6)), layout=go.Layout(title=_title(pp)))
              for i, pp in enumerate(plans)]
    labels = [f"{pp.eps:.3g}" for pp in plans]
    shown = plans[active]
    Nq, Nk = shape
    fig = plan_pair_figure(shown.one_sided, shown.two_sided,
                           ("one-sided plan<br>(softmax)", "two-sided plan<br>(Sinkhorn)"),
                           row_sum_max=max(1.2, 1.2 * Nq / Nk), column_sum_max=float(Nq), height=640)
    fig.update_layout(title=_title(shown), margin=dict(t=top_margin(1, 3, 2)))
    hover_rows(fig)
    return add_frame_slider(fig, frames, labels, prefix="ε = ", active=active)


def attention_map_figure(maps: Sequence[AttentionMap], *, active: int | None = None,
                         mechanism_map: str | None = None) -> go.Figure:
    """Attention weights ``softmax(q k^T / τ)`` for one head, one slider step per
    :class:`~attnbook.experiments.eot.AttentionMap` (:func:`attnbook.experiments.eot.attention_maps`), with a
    causal on/off menu when the maps have a causal form -- all precomputed, so it works in a static page.
    In the causal form the masked cells (``AttentionMap.masked``) are grey, not white: a query may not
    look there, which is not the same as a weight of 0. ``mechanism_map``: the chapter's mechanism name,
    added to ``layout.meta`` (what the book's page check looks for)."""
    maps = check_steps("maps", maps, AttentionMap)
    active = len(maps) // 2 if active is None else active
    causal_ok = all(m.causal is not None for m in maps)
    Tq, Tk = maps[0].full.shape
    xs = [f"k{j}" for j in range(Tk)]
    ys = [f"q{i}" for i in range(Tq)]
    hover = "%{y} → %{x}: weight %{z:.3f}<extra></extra>"

    def traces(m: AttentionMap):
        out = [go.Heatmap(z=m.full, x=xs, y=ys, zmin=0, zmax=1, coloraxis="coloraxis", visible=True, name="full",
                          hovertemplate=hover)]
        if causal_ok:
            out.append(go.Heatmap(z=m.causal, x=xs, y=ys, zmin=0, zmax=1, coloraxis="coloraxis", visible=False,
                                  name="causal", hovertemplate=hover))
        return out

    fig = go.Figure(data=traces(maps[active]))
    n = len(fig.data)
    if causal_ok:
        # The masked cells drawn over the causal map in one neutral grey (NaN elsewhere: transparent).
        m = maps[active]
        masked = m.masked if m.masked is not None else np.triu(np.ones(m.causal.shape, dtype=bool), 1)
        fig.add_trace(go.Heatmap(z=np.where(masked, 1.0, np.nan), x=xs, y=ys, showscale=False, visible=False,
                                 colorscale=[[0, MASKED_COLOUR], [1, MASKED_COLOUR]], name="masked",
                                 hovertemplate="%{y} → %{x}: masked (the query may not look there)<extra></extra>"))
    # Frames carry z only, so that the causal menu's visibility choice survives slider moves.
    frames = [go.Frame(data=[go.Heatmap(z=tr.z) for tr in traces(m)], name=f"tau{i}", traces=list(range(n)))
              for i, m in enumerate(maps)]
    full_note = "the full map: every query looks at every key" if causal_ok else ""
    fig.update_layout(title=_style_title("Softmax attention weights", full_note), height=540,
                      margin=dict(t=top_margin(1, 1) + 44), xaxis_title="key j",
                      yaxis=dict(title="query i", autorange="reversed"), plot_bgcolor="white",
                      coloraxis=dict(colorscale=PLAN_SCALE, cmin=0, cmax=1,
                                     colorbar=dict(title=dict(text="weight", side="right"), thickness=10)))
    if causal_ok:
        # Under the subtitle, over the map's left edge: clear of the title and of the toolbar.
        fig.update_layout(updatemenus=[dict(type="buttons", direction="right", x=0.0, y=1.02, xanchor="left",
                                            yanchor="bottom", showactive=True, pad=dict(b=4), buttons=[
            dict(label="full", method="update",
                 args=[{"visible": [True, False, False]}, {"title.subtitle.text": full_note}]),
            dict(label="causal", method="update",
                 args=[{"visible": [False, True, True]}, {"title.subtitle.text": MASKED_NOTE}]),
        ])])
    if mechanism_map is not None:
        merge_meta(fig, mechanism_map=mechanism_map)
    hover_rows(fig)
    return add_frame_slider(fig, frames, [f"{m.tau:.3g}" for m in maps], prefix="τ = ", active=active)


def weights_comparison_figure(steps: Sequence[Mapping[str, np.ndarray]], labels: Sequence[str], *,
                              prefix: str, title: str, active: int = 0,
                              zmax: float | Mapping[str, float] | None = None,
                              mechanism_map: str | None = None) -> go.Figure:
    """Weight matrices side by side -- softmax's plan beside another mechanism's (implied) weights on
    the same input -- with a slider over a parameter (temperature, feature count, beta ...).

    ``steps[i]`` maps a panel name to a ``[T, T]`` weight matrix (row ``t``: the weights of query
    ``t`` on the values); every step has the same panel names (short: they title the panels). Each
    panel has its own colour scale (and colour bar, beside it), the same for every step of the slider
    (so steps compare): a panel whose entries are all >= 0 over all steps is a plan and is drawn in the
    book's plan colours from 0 to its largest entry; a panel with a negative entry is signed, drawn on
    the diverging scale centred on 0 and spanning its largest |entry| (its colour bar says "signed").
    ``zmax`` caps the scales (a number for every panel, or one per panel name; larger entries show in
    the end colour). Each panel's hover shows the entry; each frame's subtitle reports, per panel, the
    range of the row sums and the smallest entry -- the two things that decide whether the rows are a
    transport plan (rows summing to 1, entries >= 0). ``mechanism_map``: added to ``layout.meta``.
    Works in a static page (precomputed frames); on a phone the panels stack.
    """
    if not steps:
        raise ValueError("steps must hold at least one slider step")
    if len(steps) != len(labels):
        raise ValueError(f"got {len(steps)} steps but {len(labels)} labels")
    names = list(steps[0])
    for i, st in enumerate(steps):
        if list(st) != names:
            raise ValueError(f"steps[{i}] has panels {list(st)}; expected {names}")
    mats = [[np.asarray(st[n], dtype=float) for n in names] for st in steps]
    for i, row in enumerate(mats):
        for n, W in zip(names, row):
            if W.ndim != 2 or not np.isfinite(W).all():
                raise ValueError(f"steps[{i}][{n!r}] must be a finite [T, T] matrix; got shape {W.shape}")
    caps = zmax if isinstance(zmax, Mapping) else {n: zmax for n in names}
    scales, signed = [], []
    for c, n in enumerate(names):
        top = max(float(np.abs(row[c]).max()) for row in mats) or 1.0
        cap = caps.get(n)
        scales.append(top if cap is None else min(top, _validate.check_positive("zmax", float(cap))))
        signed.append(any(float(row[c].min()) < 0 for row in mats))
    # Each panel named in the subtitle by its name's first words (a phone stacks the panels: no "left").
    where = [n.split("(")[0].split(",")[0].strip() for n in names]
    where = [w if len(w) <= 18 else " ".join(w.split()[:2])[:18] for w in where]

    def describe(row):
        return "<br>".join(f"{w}: row sums {_number(W.sum(1).min())} to {_number(W.sum(1).max())}, "
                           f"smallest {_number(W.min())}" for w, W in zip(where, row))

    # Room between panels for each panel's own colour bar; rows are the same queries in every panel, so
    # only the first panel labels them (on a phone, stacked, each does).
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=[wrap(n, 16) for n in names],
                        horizontal_spacing=0.17)
    for c, W in enumerate(mats[active], start=1):
        axis = "coloraxis" if c == 1 else f"coloraxis{c}"
        suffix = "" if c == 1 else str(c)
        fig.add_trace(go.Heatmap(z=W, coloraxis=axis,
                                 hovertemplate="query %{y} → value %{x}: weight %{z:.3f}<extra></extra>"),
                      row=1, col=c)
        fig.update_xaxes(title_text="value j", row=1, col=c)
        fig.update_yaxes(title_text="query t" if c == 1 else None, showticklabels=(c == 1), autorange="reversed",
                         row=1, col=c)
        bar = colorbar(fig, [f"xaxis{suffix}", f"yaxis{suffix}"],
                       title="signed weight" if signed[c - 1] else "weight")
        zs = scales[c - 1]
        scale = (dict(colorscale=DIVERGING_SCALE, cmin=-zs, cmax=zs, cmid=0.0) if signed[c - 1]
                 else dict(colorscale=PLAN_SCALE, cmin=0.0, cmax=zs))
        fig.update_layout({axis: dict(**scale, colorbar=bar)})
    fig.update_annotations(font=dict(size=13))
    frames = [go.Frame(data=[go.Heatmap(z=W) for W in row], name=f"s{i}", traces=list(range(len(names))),
                       layout=go.Layout(title=_style_title(title, describe(row))))
              for i, row in enumerate(mats)]
    fig.update_layout(title=_style_title(title, describe(mats[active])), height=540,
                      margin=dict(t=top_margin(1, len(names), 2), r=60))
    narrow = {}
    for c in range(2, len(names) + 1):
        narrow.update({f"yaxis{c}.showticklabels": True, f"yaxis{c}.title.text": "query t"})
    stack_panels(fig, height=380, narrow=narrow)
    if mechanism_map is not None:
        merge_meta(fig, mechanism_map=mechanism_map)
    hover_rows(fig)
    return add_frame_slider(fig, frames, list(labels), prefix=prefix, active=active)


def transport_plan_explorer(plans_at: Callable[[float], PlanPair], *, eps_min: float = 0.02,
                            eps_max: float = 50.0):
    """Live version of :func:`transport_plan_figure` (needs a running kernel): a log slider over ε.
    ``plans_at(eps)`` computes the step, e.g. ``lambda eps: attnbook.experiments.eot.plan_pair(C, eps)``."""
    import ipywidgets as W

    static = transport_plan_figure([plans_at(1.0)], active=0)
    static.frames = ()
    static.layout.sliders = ()
    fig = go.FigureWidget(static)
    slider = W.FloatLogSlider(value=1.0, min=np.log10(eps_min), max=np.log10(eps_max), step=0.05,
                              description="ε", continuous_update=True, readout_format=".3g")

    def redraw(change=None):
        pair = plans_at(slider.value)
        new = plan_traces(pair.one_sided, True) + plan_traces(pair.two_sided, False)
        with fig.batch_update():
            for tr, nt in zip(fig.data, new):
                if isinstance(nt, go.Heatmap):
                    tr.z = nt.z
                elif nt.orientation == "h":
                    tr.x = nt.x
                else:
                    tr.y = nt.y
            fig.layout.title = _title(pair)

    slider.observe(redraw, names="value")
    return W.VBox([slider, fig])


def attention_explorer(maps_at: Callable[[float], AttentionMap]):
    """Live attention map: temperature slider and causal checkbox (needs a running kernel).
    ``maps_at(tau)`` computes the step, e.g. ``lambda tau: attnbook.experiments.eot.attention_map(q, k, tau)``."""
    import ipywidgets as W

    first = maps_at(1.0)
    fig = go.FigureWidget(go.Heatmap(z=first.full, zmin=0, zmax=1, colorscale=PLAN_SCALE,
                                     colorbar=dict(title=dict(text="weight", side="right"))))
    masked = first.masked if first.masked is not None else np.zeros(first.full.shape, dtype=bool)
    fig.add_heatmap(z=np.where(masked, 1.0, np.nan), showscale=False, visible=False,
                    colorscale=[[0, MASKED_COLOUR], [1, MASKED_COLOUR]],
                    hovertemplate="masked (the query may not look there)<extra></extra>")
    fig.update_layout(title=_style_title("Attention weights"), xaxis_title="key j",
                      yaxis=dict(title="query i", autorange="reversed"), height=440)
    tau = W.FloatLogSlider(value=1.0, min=-2, max=2, step=0.05, description="τ")
    causal = W.Checkbox(value=False, description="causal", disabled=first.causal is None)

    def redraw(change=None):
        m = maps_at(tau.value)
        shown = causal.value and m.causal is not None
        with fig.batch_update():
            fig.data[0].z = m.causal if shown else m.full
            fig.data[1].visible = shown
            fig.layout.title.subtitle.text = MASKED_NOTE if shown else ""

    tau.observe(redraw, names="value")
    causal.observe(redraw, names="value")
    return W.VBox([W.HBox([tau, causal]), fig])
