"""Chapter 6's figures: planes through the origin and their Plücker coordinates.

``planes_figure`` draws 2-planes of ``R^3`` with their spanning vectors and the cross product (a
rotatable 3-D scene). ``features_figure`` is a Plotly-native slider over ``(r, offset)`` pairs: the
normalised Plücker coordinates of every position of a sequence (works in the static book).
``pair_figure`` shows, for one layer and one input, the plane of ``z_t`` and ``z_{t-delta}``, its
coordinates and the gate at ``t``; ``pair_explorer`` wraps it in ipywidgets for a live kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..grassmann import CausalGrassmannMixing, pair_indices, plucker, plucker_features
from ._slider import add_frame_slider
from ._style import COLORWAY, SIGNED_SCALE

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
    for vec, dash, label in ((u, "solid", "u"), (w, "dot", "w"), (n, "dash", "u x w (normalised)")):
        traces.append(go.Scatter3d(x=[0, vec[0]], y=[0, vec[1]], z=[0, vec[2]], mode="lines+markers",
                                   line=dict(color=color, width=6, dash=dash), marker=dict(size=[0, 4]),
                                   name=f"{name}: {label}", scene=scene))
    return traces


def planes_figure(pairs: Sequence[tuple]) -> go.Figure:
    """Planes ``span(u, w)`` in ``R^3`` with ``u``, ``w`` and the unit normal. The title lists each
    plane's Plücker coordinates ``(p01, p02, p12) = (c2, -c1, c0)`` with ``c = u x w``."""
    fig = go.Figure()
    lines, vectors = [], []
    for k, (u, w) in enumerate(pairs):
        u, w = np.asarray(u, dtype=float), np.asarray(w, dtype=float)
        if u.shape != (3,) or w.shape != (3,):
            raise ValueError(f"planes_figure draws planes of R^3; pair {k} has shapes {u.shape}, {w.shape}")
        vectors += [u, w]
        for tr in _plane_traces(u, w, COLORS[k % len(COLORS)], f"plane {k}"):
            fig.add_trace(tr)
        p = plucker(torch.tensor(u), torch.tensor(w)).numpy()
        lines.append(f"plane {k}: p = ({p[0]:.2f}, {p[1]:.2f}, {p[2]:.2f})")
    fig.update_layout(title="Planes and their Plücker coordinates<br><sup>"
                      + "<br>".join(lines) + "</sup>", height=560, scene=_scene(vectors),
                      margin=dict(l=0, r=0, t=60 + 16 * len(lines)))
    return fig


def features_figure(z: torch.Tensor, rs: Sequence[int], offsets: Sequence[int]) -> go.Figure:
    """Slider over every ``(r, delta)``: a heatmap of the normalised Plücker coordinates of
    ``span(z_t[:r], z_{t-delta}[:r])`` (rows: positions ``t``; columns: pairs ``(i, j)``). The first
    ``delta`` rows are zero: those positions have no partner ``delta`` steps back.

    Args: ``z: [L, R]`` one sequence of reduced vectors, with ``R >= max(rs)``.
    """
    z = torch.as_tensor(z, dtype=torch.float64)
    if z.dim() != 2 or z.shape[1] < max(rs):
        raise ValueError(f"z has shape {tuple(z.shape)}; expected [L, R] with R >= max(rs) = {max(rs)}")
    frames, labels = [], []
    for r in rs:
        i, j = pair_indices(r)
        cols = [f"({a},{b})" for a, b in zip(i.tolist(), j.tolist())]
        # Numeric columns with per-frame tick labels and x-range: a step with a larger r has more
        # columns than the first, and a frame that did not set its own range would show only the
        # first frame's columns.
        xaxis = dict(range=[-0.5, len(cols) - 0.5], tickvals=list(range(len(cols))), ticktext=cols,
                     title="Plücker coordinate (i, j)")
        feats = plucker_features(z[None, :, :r], tuple(offsets), backend="torch")[0]     # [L, W, C]
        for k, delta in enumerate(offsets):
            name = f"r={r}, delta={delta}"
            fk = feats[:, k].numpy()
            frames.append(go.Frame(name=name, data=[go.Heatmap(
                z=fk, x=list(range(len(cols))), zmin=-1, zmax=1, colorscale=SIGNED_SCALE,
                colorbar=dict(title=dict(text="p<sub>ij</sub>")), text=[cols] * fk.shape[0],
                hovertemplate="position %{y}, coordinate %{text}: %{z:.3f}<extra></extra>")],
                layout=go.Layout(title=f"Normalised Plücker coordinates, r = {r}, δ = {delta}", xaxis=xaxis)))
            labels.append(f"{r},{delta}")
    fig = go.Figure(data=frames[0].data, layout=dict(height=500, title=frames[0].layout.title.text,
                                                     xaxis=frames[0].layout.xaxis, yaxis_autorange="reversed"))
    fig.update_layout(yaxis_title="position t")
    return add_frame_slider(fig, frames, labels, prefix="(r, δ) = ")


def pair_figure(layer: CausalGrassmannMixing, h: torch.Tensor, t: int, delta: int, *,
                tokens: Sequence[str] | None = None) -> go.Figure:
    """One position ``t`` and one offset of a layer on input ``h [1, L, d]``: left, the plane of
    ``z_t`` and ``z_{t-delta}`` drawn in 3-D (for ``r > 3``, in the span of the reduced space's first
    three principal directions over the sequence -- a projection, said in the title); middle, its
    ``C(r, 2)`` normalised coordinates; right, the gate ``alpha_t`` per channel (1 keeps ``h_t``,
    0 takes the Grassmann signal)."""
    L = h.shape[1]
    if not 0 <= t < L:
        raise ValueError(f"t must be in [0, {L}); got {t}")
    if t - delta < 0:
        raise ValueError(f"t - delta = {t - delta} < 0: position {t} has no partner {delta} steps back")
    with torch.no_grad():
        x = layer.norm(h) if layer.norm_kind == "pre" else h
        z, g = layer.mixing_signal(x)
        alpha = layer.gate_value(x, g)[0, t]
    z = z[0].double()
    u, w = z[t], z[t - delta]
    p = plucker(u, w)
    p = p / p.norm().clamp_min(layer.eps)
    r = z.shape[1]
    if r == 3:
        u3, w3, note = u.numpy(), w.numpy(), "z in R³"
    else:
        basis = torch.linalg.svd(z - z.mean(0), full_matrices=False).Vh[:3]           # [3, r]
        note = f"projected from R{str(r).translate(SUPERSCRIPTS)} to 3 principal axes"
        u3, w3 = (basis @ u).numpy(), (basis @ w).numpy()
    label = (lambda s: f"{s} ({tokens[s]!r})") if tokens is not None else str
    # The plane on top at full width (a 3-D scene squeezed into a third of a phone is cut off), the two bar
    # charts under it; short panel titles (long ones overprint their neighbours), the rest in the title.
    fig = make_subplots(rows=2, cols=2, row_heights=[0.55, 0.45], horizontal_spacing=0.2, vertical_spacing=0.1,
                        specs=[[{"type": "scene", "colspan": 2}, None], [{"type": "xy"}, {"type": "xy"}]],
                        subplot_titles=("the plane", "coordinates", "gate α<sub>t</sub>"))
    for tr in _plane_traces(u3, w3, COLORS[0], f"t={t}, delta={delta}"):
        fig.add_trace(tr, row=1, col=1)
    i, j = pair_indices(r)
    fig.add_trace(go.Bar(x=[f"({a},{b})" for a, b in zip(i.tolist(), j.tolist())], y=p.numpy(),
                         marker_color=COLORS[1], name="p_ij"), row=2, col=1)
    fig.add_trace(go.Bar(y=alpha.double().numpy(), marker_color=COLORS[2], name="alpha"), row=2, col=2)
    fig.update_xaxes(title_text="pair (i, j)", row=2, col=1)
    fig.update_yaxes(title_text="normalised p<sub>ij</sub>", range=[-1.05, 1.05], row=2, col=1)
    fig.update_xaxes(title_text="channel", row=2, col=2)
    fig.update_yaxes(title_text="α<sub>t</sub> (1 keeps h<sub>t</sub>)", range=[0, 1], row=2, col=2)
    fig.update_layout(height=780, showlegend=False, scene=_scene([u3, w3]), margin=dict(t=100),
                      title=f"The plane of z at {label(t)} and {label(t - delta)}<br><sup>t = {t}, δ = {delta}; "
                            f"{note}<br>mean gate {alpha.mean().item():.2f}</sup>")
    return fig


def pair_explorer(layer: CausalGrassmannMixing, h: torch.Tensor, *, tokens: Sequence[str] | None = None):
    """Live (ipywidgets): pick ``t`` and an offset of the layer; redraws :func:`pair_figure`."""
    import ipywidgets as W
    from IPython.display import display

    L = h.shape[1]
    t_slider = W.IntSlider(value=min(L - 1, max(layer.offsets)), min=0, max=L - 1, description="t")
    d_pick = W.Dropdown(options=list(layer.offsets), value=layer.offsets[0], description="offset")
    out = W.Output()

    def redraw(change=None):
        with out:
            out.clear_output(wait=True)
            if t_slider.value - d_pick.value < 0:
                print(f"position {t_slider.value} has no partner {d_pick.value} steps back")
                return
            display(pair_figure(layer, h, t_slider.value, d_pick.value, tokens=tokens))

    t_slider.observe(redraw, "value")
    d_pick.observe(redraw, "value")
    redraw()
    return W.VBox([W.HBox([t_slider, d_pick]), out])


__all__ = ["planes_figure", "features_figure", "pair_figure", "pair_explorer"]
