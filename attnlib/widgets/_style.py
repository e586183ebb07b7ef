"""The book's one figure style: a Plotly template, made the default when ``attnlib.widgets`` is imported.

Every figure -- the widgets' and any a lab draws itself -- gets the same font, colours, margins,
hover labels and legend placement. Figures size themselves to the page (``autosize``; no fixed
width), so they fit a 390-px phone as well as a desktop column. Legends sit outside the plot,
horizontal, under the x axis; a figure with a slider puts its legend at the figure's foot, below
the slider (:func:`attnlib.widgets._slider.add_frame_slider` does that), so neither covers the other.

Colours: ``THEORY_MEASURED`` pairs are for one quantity drawn twice -- predicted (a line) and
measured (markers of the same colour) -- so that the eye pairs them without reading the legend.
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = "attention_as_transport"

# Okabe--Ito's colour-blind-safe palette, blue first (the book's "exact" colour), then vermilion.
COLORWAY = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
FONT = "Helvetica Neue, Helvetica, Arial, sans-serif"
SIGNED_SCALE = "RdBu_r"          # signed quantities: blue negative, white zero, red positive
PLAN_SCALE = "Blues"             # non-negative masses (transport plans, probabilities)

LEGEND_BELOW = dict(orientation="h", x=0.0, xanchor="left", y=-0.18, yanchor="top", yref="paper",
                    bgcolor="rgba(255,255,255,0)", font=dict(size=11), title=dict(text=""))


TITLE_CHARS, SUBTITLE_CHARS = 48, 64   # a title line, and a <sup> line, that fit a 390-px phone


def wrap(text: str, width: int = 18) -> str:
    """``text`` broken into lines of at most ``width`` characters at spaces (Plotly's ``<br>``): a panel
    title that fits over its panel on a phone."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def colour(i: int) -> str:
    """The ``i``-th colour of the book's colourway (cycling): the same quantity, the same colour."""
    return COLORWAY[i % len(COLORWAY)]


def _template() -> go.layout.Template:
    # plotly_white's layout only: its per-trace defaults (4 KB) would travel inside every figure on a page,
    # and the widgets set their colour scales themselves.
    t = go.layout.Template(layout=pio.templates["plotly_white"].layout)
    t.layout.update(
        font=dict(family=FONT, size=12, color="#222"),
        colorway=list(COLORWAY),
        # From the figure's left edge (not the plot's): a phone has room for about 48 characters.
        title=dict(x=0.0, xanchor="left", xref="container", y=0.98, yanchor="top", yref="container",
                   pad=dict(l=8), font=dict(size=14), automargin=True),
        margin=dict(l=60, r=20, t=70, b=60, pad=0),
        autosize=True,
        legend=LEGEND_BELOW,
        hoverlabel=dict(font=dict(family=FONT, size=12), bgcolor="white", bordercolor="#888", namelength=-1),
        hovermode="closest",
        xaxis=dict(automargin=True, title=dict(standoff=8), zeroline=False),
        yaxis=dict(automargin=True, title=dict(standoff=8), zeroline=False),
        coloraxis=dict(colorbar=dict(thickness=12, outlinewidth=0, title=dict(side="right"))),
    )
    t.layout.annotationdefaults = dict(font=dict(size=12))          # subplot titles and notes
    t.layout.sliderdefaults = dict(
        x=0.0, xanchor="left", len=1.0, y=0.0, yanchor="top", pad=dict(t=50, b=10),
        font=dict(size=11), currentvalue=dict(visible=True, xanchor="left", font=dict(size=12)),
        bgcolor="#f0f0f0", activebgcolor="#d0d0d0", bordercolor="#bbb", ticklen=4, minorticklen=0,
    )
    t.layout.updatemenudefaults = dict(font=dict(size=11), bgcolor="white", bordercolor="#bbb")
    return t


def register() -> None:
    """Register the template and make it Plotly's default (idempotent)."""
    pio.templates[TEMPLATE] = _template()
    pio.templates.default = TEMPLATE
