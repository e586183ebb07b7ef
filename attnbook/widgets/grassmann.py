"""Chapter 6's figures: planes through the origin and their Plücker coordinates.

``planes_figure`` draws 2-planes of ``R^3`` with their spanning vectors and the cross product (a
rotatable 3-D scene). ``features_figure`` is a Plotly-native slider over ``(r, offset)`` pairs: the
normalised Plücker coordinates of every position of a sequence (works in the static book).
``pair_figure`` shows, for one layer and one input, the plane of ``z_t`` and ``z_{t-delta}``, its
coordinates and the gate at ``t``; ``pair_explorer`` wraps it in ipywidgets for a live kernel.
They draw what :mod:`attnbook.experiments.grassmann` computes (:func:`~attnbook.experiments.grassmann.planes_in_r3`,
:func:`~attnbook.experiments.grassmann.plucker_feature_maps`, :func:`~attnbook.experiments.grassmann.pair_plane`,
:func:`~attnbook.experiments.grassmann.pair_terms`); the live explorer takes the function that computes a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnbook.experiments.grassmann import PairPlane, PlaneR3, PluckerFeatureMap
from attnlib.grassmann import pair_indices

from ._slider import add_frame_slider, check_steps
from ._style import COLORWAY, DIVERGING_SCALE, PLAN_SCALE, colorbar, merge_meta, stack_panels, title, top_margin, wrap

COLORS = COLORWAY
SUPERSCRIPTS = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _scene(vectors, **kw) -> dict:
    """A cube scene that holds every vector and the unit plane patches, seen from far enough that
    nothing is cut off at the panel's edge."""
    m = max([1.0] + [float(np.abs(np.asarray(v)).max()) for v in vectors]) * 1.1
    ax = dict(range=[-m, m], autorange=False, zeroline=False, showspikes=False)
    return dict(aspectmode="cube", xaxis=dict(ax, title="x"), yaxis=dict(ax, title="y"), zaxis=dict(ax, title="z"),
                camera=dict(eye=dict(x=1.6, y=1.6, z=1.1)), **kw)


def _plane_traces(u: np.ndarray, w: np.ndarray, color: str, name: str, scene: str = "scene"):
    """A square patch of span(u, w), the two vectors, and the normal ``u x w`` (unit length)."""
    q, _ = np.linalg.qr(np.stack([u, w], 1))
    s = np.linspace(-1, 1, 2)
    a, b = np.meshgrid(s, s)
    pts = a[..., None] * q[:, 0] + b[..., None] * q[:, 1]
    n = np.cross(u, w)
    n = n / max(np.linalg.norm(n), 1e-12)
    traces = [go.Surface(x=pts[..., 0], y=pts[..., 1], z=pts[..., 2], opacity=0.35, showscale=False,
                         colorscale=[[0, color], [1, color]], name=name, scene=scene, hoverinfo="name")]
    for vec, dash, label in ((u, "solid", "u"), (w, "dot", "w"), (n, "dash", "u × w (unit length)")):
        traces.append(go.Scatter3d(x=[0, vec[0]], y=[0, vec[1]], z=[0, vec[2]], mode="lines+markers",
                                   line=dict(color=color, width=6, dash=dash), marker=dict(size=[0, 4]),
                                   name=f"{name}: {label}", scene=scene))
    return traces


def planes_figure(planes: Sequence[PlaneR3]) -> go.Figure:
    """Planes ``span(u, w)`` in ``R^3`` with ``u``, ``w`` and the unit normal. The title lists each
    plane's Plücker coordinates ``(p01, p02, p12) = (c2, -c1, c0)`` with ``c = u x w``.

    ``planes``: :func:`attnbook.experiments.grassmann.planes_in_r3` (one
    :class:`~attnbook.experiments.grassmann.PlaneR3` per plane)."""
    fig = go.Figure()
    lines, vectors = [], []
    for k, pl in enumerate(planes):
        if not isinstance(pl, PlaneR3):
            raise TypeError(f"planes[{k}] must be an attnbook.experiments.grassmann.PlaneR3; got {type(pl).__name__}")
        vectors += [pl.u, pl.w]
        for tr in _plane_traces(pl.u, pl.w, COLORS[k % len(COLORS)], f"plane {k}"):
            fig.add_trace(tr)
        p = pl.coordinates
        lines.append(f"plane {k}: p = ({p[0]:.2f}, {p[1]:.2f}, {p[2]:.2f})")
    fig.update_layout(title=title("Planes and their Plücker coordinates", "<br>".join(lines)), height=560,
                      scene=_scene(vectors), margin=dict(l=0, r=0, t=top_margin(1, len(lines))))
    return fig


def features_figure(maps: Sequence[PluckerFeatureMap]) -> go.Figure:
    """Slider over every ``(r, delta)``: a heatmap of the normalised Plücker coordinates of
    ``span(z_t[:r], z_{t-delta}[:r])`` (rows: positions ``t``; columns: pairs ``(i, j)``). The first
    ``delta`` rows are zero: those positions have no partner ``delta`` steps back.

    ``maps``: :func:`attnbook.experiments.grassmann.plucker_feature_maps` of one sequence (one
    :class:`~attnbook.experiments.grassmann.PluckerFeatureMap` per step).
    """
    maps = check_steps("maps", maps, PluckerFeatureMap, what="one per (r, delta)")
    frames, labels = [], []
    for fm in maps:
        cols = [f"({a},{b})" for a, b in fm.pairs]
        # Numeric columns with per-frame tick labels and x-range: a step with a larger r has more
        # columns than the first, and a frame that did not set its own range would show only the
        # first frame's columns.
        xaxis = dict(range=[-0.5, len(cols) - 0.5], tickvals=list(range(len(cols))), ticktext=cols,
                     title="Plücker coordinate (i, j)")
        frames.append(go.Frame(name=f"r={fm.r}, delta={fm.delta}", data=[go.Heatmap(
            z=fm.features, x=list(range(len(cols))), zmin=-1, zmax=1, colorscale=DIVERGING_SCALE,
            colorbar=dict(title=dict(text="p<sub>ij</sub> (signed)", side="right")), text=[cols] * fm.features.shape[0],
            hovertemplate="position %{y}, coordinate %{text}: %{z:.3f}<extra></extra>")],
            layout=go.Layout(title=title(f"Normalised Plücker coordinates, r = {fm.r}, δ = {fm.delta}"),
                             xaxis=xaxis)))
        labels.append(f"{fm.r},{fm.delta}")
    fig = go.Figure(data=frames[0].data, layout=dict(height=500, title=frames[0].layout.title,
                                                     xaxis=frames[0].layout.xaxis, yaxis_autorange="reversed"))
    fig.update_layout(yaxis_title="position t")
    return add_frame_slider(fig, frames, labels, prefix="(r, δ) = ")


def pair_figure(plane: PairPlane, *, tokens: Sequence[str] | None = None) -> go.Figure:
    """One position ``t`` and one offset of a layer on one input (:func:`attnbook.experiments.grassmann.pair_plane`):
    left, the plane of ``z_t`` and ``z_{t-delta}`` drawn in 3-D (for ``r > 3``, in the span of the
    reduced space's first three principal directions over the sequence -- a projection, said in the
    title); middle, its ``C(r, 2)`` normalised coordinates; right, the gate ``alpha_t`` per channel (1
    keeps ``h_t``, 0 takes the Grassmann signal). ``tokens`` label the positions in the title."""
    if not isinstance(plane, PairPlane):
        raise TypeError(f"plane must be an attnbook.experiments.grassmann.PairPlane; got {type(plane).__name__}")
    t, delta = plane.t, plane.delta
    note = (f"projected from R{str(plane.r).translate(SUPERSCRIPTS)} to 3 principal axes" if plane.projected
            else "z in R³")
    label = (lambda s: f"{s} ({tokens[s]!r})") if tokens is not None else str
    # The plane on top at full width (a 3-D scene squeezed into a third of a phone is cut off), the two bar
    # charts under it; short panel titles (long ones overprint their neighbours), the rest in the title.
    fig = make_subplots(rows=2, cols=2, row_heights=[0.55, 0.45], horizontal_spacing=0.2, vertical_spacing=0.1,
                        specs=[[{"type": "scene", "colspan": 2}, None], [{"type": "xy"}, {"type": "xy"}]],
                        subplot_titles=("the plane", "coordinates", "gate α<sub>t</sub>"))
    for tr in _plane_traces(plane.u, plane.w, COLORS[0], f"t = {t}, δ = {delta}"):
        fig.add_trace(tr, row=1, col=1)
    fig.add_trace(go.Bar(x=[f"({a},{b})" for a, b in plane.pairs], y=plane.coordinates,
                         marker_color=COLORS[1], name="normalised p<sub>ij</sub>"), row=2, col=1)
    fig.add_trace(go.Bar(y=plane.gate, marker_color=COLORS[2], name="gate α<sub>t</sub>"), row=2, col=2)
    fig.update_xaxes(title_text="pair (i, j)", row=2, col=1)
    fig.update_yaxes(title_text="normalised p<sub>ij</sub>", range=[-1.05, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="channel", row=2, col=2)
    fig.update_yaxes(title_text="α<sub>t</sub> (1 keeps h<sub>t</sub>)", range=[0, 1], row=2, col=2)
    fig.update_annotations(font=dict(size=13))
    fig.update_layout(height=780, showlegend=False, scene=_scene([plane.u, plane.w]),
                      margin=dict(t=top_margin(1, 2, 1)),
                      title=title(f"The plane of z at {label(t)} and {label(t - delta)}",
                                  f"t = {t}, δ = {delta}; {note}<br>mean gate {plane.mean_gate:.2f}"))
    return stack_panels(fig, heights=[380, 280, 280])


def pair_explorer(plane_at: Callable[[int, int], PairPlane], *, T: int, offsets: Sequence[int],
                  tokens: Sequence[str] | None = None):
    """Live (ipywidgets): pick ``t`` (of ``T`` positions) and an offset (of ``offsets``); redraws
    :func:`pair_figure` of ``plane_at(t, delta)``, e.g.
    ``lambda t, delta: attnbook.experiments.grassmann.pair_plane(layer, h, t, delta)``."""
    import ipywidgets as W
    from IPython.display import display

    offsets = list(offsets)
    if not offsets:
        raise ValueError("offsets must hold at least one offset")
    t_slider = W.IntSlider(value=min(T - 1, max(offsets)), min=0, max=T - 1, description="t")
    d_pick = W.Dropdown(options=offsets, value=offsets[0], description="offset")
    out = W.Output()

    def redraw(change=None):
        with out:
            out.clear_output(wait=True)
            if t_slider.value - d_pick.value < 0:
                print(f"position {t_slider.value} has no partner {d_pick.value} steps back")
                return
            display(pair_figure(plane_at(t_slider.value, d_pick.value), tokens=tokens))

    t_slider.observe(redraw, "value")
    d_pick.observe(redraw, "value")
    redraw()
    return W.VBox([W.HBox([t_slider, d_pick]), out])


def plane_mixing_figure(terms: dict, t: int, plan, paired, *, active: int = 0) -> go.Figure:
    """What a Grassmann layer mixes at position ``t``, one slider step per offset ``delta``, beside the
    exact softmax map of the same token states.

    ``terms``: :func:`attnbook.experiments.grassmann.pair_terms` of a layer with ``r = 3`` (so the plane is
    drawn exactly, not projected); ``plan``: ``[T, T]`` causal softmax attention of the states ``y`` on
    themselves; ``paired``: ``[T, T]`` bool, :func:`~attnbook.experiments.grassmann.pairing_pattern`.

    Top: the plane of ``y_t`` and ``y_{t-delta}`` in 3-D, with its normal; the pair's normalised Plücker
    coordinates (for ``r = 3``, the normal's entries up to order and sign); the pair's share
    ``W_plu omega / K`` of the signal ``g_t``, beside the whole signal. Bottom: softmax's plan (each row
    sums to 1 over earlier positions); the fixed pairing pattern, with this step's pair marked; the
    gate (``alpha_t`` in the code, the book's ``zeta_t``) that weighs ``h_t`` against the signal per
    channel. The signal ``g_t`` is the book's ``xi_t``.
    """
    z = np.asarray(terms["z"], dtype=np.float64)
    if z.ndim != 2 or z.shape[1] != 3:
        raise ValueError(f"terms['z'] has shape {z.shape}; plane_mixing_figure draws planes of R^3 (a layer "
                         "with reduced_dim=3); pair_figure projects larger ones")
    T = z.shape[0]
    offsets, partners = list(terms["offsets"]), list(terms["partners"])
    if not offsets:
        raise ValueError(f"position {t} has no partner: no plane to draw")
    feats, shares = np.asarray(terms["features"], dtype=np.float64), np.asarray(terms["terms"], dtype=np.float64)
    signal, gate = np.asarray(terms["signal"], dtype=np.float64), np.asarray(terms["gate"], dtype=np.float64)
    plan, paired = np.asarray(plan, dtype=np.float64), np.asarray(paired, dtype=bool)
    if plan.shape != (T, T) or paired.shape != (T, T):
        raise ValueError(f"plan and paired must be [T, T] = {(T, T)}; got {plan.shape} and {paired.shape}")
    i, j = pair_indices(3)
    coords = [f"({a},{b})" for a, b in zip(i.tolist(), j.tolist())]
    channels = list(range(signal.shape[0]))
    reach = 1.1 * max(float(np.abs(z[[t] + partners]).max()), 1.0)
    span = dict(range=[-reach, reach], autorange=False)
    smax = 1.05 * max(float(np.abs(shares).max()), float(np.abs(signal).max()))
    # The plan's colour bar sits beside its panel, in the gap before the pairing pattern, which has the
    # same rows and so shows no tick labels of its own (on a phone, stacked, it does).
    layout_axes = dict(
        scene=dict(xaxis=dict(title="y₀", **span), yaxis=dict(title="y₁", **span), zaxis=dict(title="y₂", **span),
                   aspectmode="cube", camera=dict(eye=dict(x=1.5, y=1.5, z=1.0))),
        xaxis=dict(title_text="pair (i, j)"), yaxis=dict(range=[-1.05, 1.05], title_text="ω̂<sub>ij</sub>"),
        xaxis2=dict(title_text="output channel"), yaxis2=dict(range=[-smax, smax], title_text="signal ξ<sub>t</sub>"),
        xaxis3=dict(range=[-0.5, T - 0.5], title_text="key position s"),
        yaxis3=dict(range=[T - 0.5, -0.5], title_text="position t"),
        xaxis4=dict(range=[-0.5, T - 0.5], title_text="partner t − δ"),
        yaxis4=dict(range=[T - 0.5, -0.5]),
        xaxis5=dict(title_text="channel"), yaxis5=dict(range=[0, 1], title_text="gate ζ<sub>t</sub>"))

    def step_title(k):
        return title(f"Grassmann mixing at t = {t}: pair (t, t − {offsets[k]})",
                     f"one of {len(offsets)} pairs; the layer averages their Plücker<br>"
                     "coordinates and projects them: no weights on positions<br>"
                     f"(softmax's row t is a plan over positions 0 to {t})")

    def step_traces(k):
        u, w = z[t], z[partners[k]]
        plane = _plane_traces(u, w, COLORS[0], f"plane of y<sub>{t}</sub>, y<sub>{partners[k]}</sub>")
        return plane + [
            go.Bar(x=coords, y=feats[k], marker_color=COLORS[1], name="Plücker coordinates ω̂ of the pair",
                   hovertemplate="ω̂%{x} = %{y:.3f}<extra></extra>"),
            go.Bar(x=channels, y=shares[k], marker_color=COLORS[1], name="this pair's share W ω̂ / K",
                   hovertemplate="channel %{x}: %{y:.3f}<extra>this pair</extra>"),
            go.Scatter(x=[partners[k]], y=[t], mode="markers", name="this pair (t, t − δ)", cliponaxis=False,
                       marker=dict(symbol="circle-open", size=13, color="#ff7f0e", line=dict(width=3)))]

    fig = make_subplots(rows=2, cols=3, column_widths=[0.36, 0.32, 0.32], row_heights=[0.52, 0.48],
                        horizontal_spacing=0.11, vertical_spacing=0.17,
                        specs=[[{"type": "scene"}, {"type": "xy"}, {"type": "xy"}],
                               [{"type": "xy"}, {"type": "xy"}, {"type": "xy"}]],
                        subplot_titles=[wrap(s, 13) for s in (
                            "plane of y<sub>t</sub>, y<sub>t−δ</sub>", "coordinates ω̂",
                            "share of ξ<sub>t</sub>", "softmax: the plan", "Grassmann: fixed pairs",
                            "gate ζ<sub>t</sub>")])
    fig.update_annotations(font=dict(size=13))
    first = step_traces(active)
    cells = [(1, 1)] * 4 + [(1, 2), (1, 3), (2, 2)]
    for tr, (r_, c_) in zip(first, cells):
        fig.add_trace(tr, row=r_, col=c_)
    n_step = len(first)
    fig.add_trace(go.Bar(x=channels, y=signal, name="the whole signal ξ<sub>t</sub>", marker_color="rgba(0,0,0,0)",
                         marker_line=dict(color="#444", width=1.5),
                         hovertemplate="channel %{x}: %{y:.3f}<extra>ξ<sub>t</sub></extra>"), row=1, col=3)
    fig.add_trace(go.Heatmap(z=plan.astype(np.float32), zmin=0.0, zmax=float(plan.max()), colorscale=PLAN_SCALE,
                             colorbar=colorbar(fig, ["xaxis3", "yaxis3"], title="weight"),
                             hovertemplate="position %{y} → %{x}: weight %{z:.3f}<extra>softmax</extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=[-0.5, t + 0.5], y=[t, t], mode="lines", line=dict(color="#ff7f0e", width=1),
                             name=f"row t = {t}", hoverinfo="skip"), row=2, col=1)
    fig.add_trace(go.Heatmap(z=paired.astype(np.uint8), zmin=0, zmax=1, showscale=False,
                             colorscale=[[0, "#f4f4f4"], [1, "#2b3a55"]],
                             hovertemplate="position %{y} paired with %{x}: %{z}<extra></extra>"), row=2, col=2)
    fig.add_trace(go.Bar(x=channels, y=gate, marker_color=COLORS[2], name="gate ζ<sub>t</sub>",
                         hovertemplate="channel %{x}: %{y:.2f}<extra>gate</extra>"), row=2, col=3)
    fig.update_layout(**layout_axes)
    fig.update_yaxes(showticklabels=False, row=2, col=2)
    # The marker belongs above the pattern's heatmap: draw it last.
    fig.data = fig.data[:n_step - 1] + fig.data[n_step:] + fig.data[n_step - 1:n_step]
    order = list(range(n_step - 1)) + [len(fig.data) - 1]
    frames = [go.Frame(data=step_traces(k), traces=order, name=f"delta{d}",
                       layout=go.Layout(title=step_title(k), **layout_axes))
              for k, d in enumerate(offsets)]
    fig.update_layout(title=step_title(active), height=880, barmode="overlay",
                      margin=dict(t=top_margin(1, 3, 2), l=60, r=20, b=40))
    merge_meta(fig, mechanism_map="Grassmann mixing")
    stack_panels(fig, heights=[360, 250, 250, 330, 330, 240],
                 narrow={"yaxis4.showticklabels": True, "yaxis4.title.text": "position t"})
    return add_frame_slider(fig, frames, [str(d) for d in offsets], prefix="offset δ = ", active=active)


__all__ = ["planes_figure", "features_figure", "pair_figure", "pair_explorer", "plane_mixing_figure"]
