"""The book's one figure style: a Plotly template, made the default when ``attnbook.widgets`` is imported.

Every figure -- the widgets' and any a lab draws itself -- gets the same font, colours, margins,
hover labels and legend placement. Figures size themselves to the page (``autosize``; no fixed
width), so they fit a 390-px phone as well as a desktop column. Legends sit outside the plot,
horizontal, under the x axis; a figure with a slider puts its legend at the figure's foot, below
the slider (:func:`attnbook.widgets._slider.add_frame_slider` does that), so neither covers the other.

Colours: ``THEORY_MEASURED`` pairs are for one quantity drawn twice -- predicted (a line) and
measured (markers of the same colour) -- so that the eye pairs them without reading the legend.
A plan (attention weights, a transport plan: non-negative) is drawn in ``PLAN_SCALE`` in every chapter;
a signed quantity (weights that may be negative) in ``DIVERGING_SCALE``, centred on 0 -- and its colour
bar says so. Blue is positive in both (a plan's mass, a positive weight) and red negative, so that a
figure with a plan beside signed weights has one colour convention. Cells a query may not look at (a
causal mask) are ``MASKED_COLOUR``, never a weight of 0.

Titles start under Plotly's toolbar (the modebar, top right: ``MODEBAR_PX``), so that on a phone the
toolbar never covers the title's end; a subtitle goes in ``title.subtitle`` (:func:`title`), at 11 px or
more, not in ``<sup>`` (70 % of the title's size: under 10 px).

Multi-panel figures: :func:`colorbar` puts a panel's colour bar beside that panel (not beside the whole
figure, where it lands on the next panel), and :func:`stack_panels` writes ``layout.meta.stack``, which
the book's ``_static/responsive_figures.js`` reads to stack the panels one under the other on a screen
narrower than 600 px (Plotly cannot reflow subplots by itself).
"""

from __future__ import annotations

import re

import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE = "attention_as_transport"

# Okabe--Ito's colour-blind-safe palette, blue first (the book's "exact" colour), then vermilion.
COLORWAY = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
FONT = "Helvetica Neue, Helvetica, Arial, sans-serif"
PLAN_SCALE = "Blues"             # the plan: non-negative weights and masses (white 0, dark blue large)
DIVERGING_SCALE = "RdBu"         # signed quantities, centred on 0: red negative, white 0, blue positive
MASKED_COLOUR = "#c4c4c4"        # cells the query may not look at: not white (weight 0), not a blue
MASKED_NOTE = "grey: masked (the query may not look there)"
SIGNED_NOTE = "signed, 0 = white"  # for a colour bar title on DIVERGING_SCALE

MODEBAR_PX = 30                  # the toolbar's height (top right); titles start under it
SUBTITLE_PX = 12                 # subtitle font (title.subtitle); axis titles and notes are 12 px too
NARROW_PX = 600                  # below this width responsive_figures.js stacks a figure's panels

LEGEND_BELOW = dict(orientation="h", x=0.0, xanchor="left", y=-0.18, yanchor="top", yref="paper",
                    bgcolor="rgba(255,255,255,0)", font=dict(size=11), title=dict(text=""))


TITLE_CHARS, SUBTITLE_CHARS = 48, 64   # a title line, and a <sup> line, that fit a 390-px phone
SUBTITLE_LINE_CHARS = 56               # a line of title.subtitle (12 px) that fits a 390-px phone


def wrap(text: str, width: int = 18) -> str:
    """``text`` broken into lines of at most ``width`` characters at spaces (Plotly's ``<br>``): a panel
    title that fits over its panel on a phone. Tags (``<sub>``) do not count: they take no room."""
    def visible(s: str) -> int:
        return len(re.sub(r"<[^>]+>", "", s))

    lines: list[str] = []
    for word in text.split(" "):
        if lines and visible(lines[-1]) + 1 + visible(word) <= width:
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
        # Under the toolbar (top right), which would otherwise cover a phone-wide title's end.
        title=dict(x=0.0, xanchor="left", xref="container", y=1.0, yanchor="top", yref="container",
                   pad=dict(l=8, t=MODEBAR_PX), font=dict(size=14), automargin=True,
                   subtitle=dict(font=dict(size=SUBTITLE_PX, color="#444"))),
        margin=dict(l=60, r=20, t=80, b=60, pad=0),
        autosize=True,
        legend=LEGEND_BELOW,
        hoverlabel=dict(font=dict(family=FONT, size=12), bgcolor="white", bordercolor="#888", namelength=-1),
        hovermode="closest",
        xaxis=dict(automargin=True, title=dict(standoff=8), zeroline=False),
        yaxis=dict(automargin=True, title=dict(standoff=8), zeroline=False),
        coloraxis=dict(colorbar=dict(thickness=10, outlinewidth=0, title=dict(side="right", font=dict(size=12)),
                                     tickfont=dict(size=11))),
        # A short toolbar (zoom, pan, reset, download): what a heatmap or a curve needs.
        modebar=dict(orientation="h", bgcolor="rgba(255,255,255,0.8)", color="#888", activecolor="#333",
                     remove=["lasso", "select", "zoomin", "zoomout", "autoscale"]),
    )
    t.layout.annotationdefaults = dict(font=dict(size=12))          # subplot titles and notes
    t.layout.sliderdefaults = dict(
        x=0.0, xanchor="left", len=1.0, y=0.0, yanchor="top", pad=dict(t=50, b=10),
        font=dict(size=11), currentvalue=dict(visible=True, xanchor="left", font=dict(size=12)),
        bgcolor="#f0f0f0", activebgcolor="#d0d0d0", bordercolor="#bbb", ticklen=4, minorticklen=0,
    )
    t.layout.updatemenudefaults = dict(font=dict(size=11), bgcolor="white", bordercolor="#bbb")
    return t


def title(text: str, subtitle: str | None = None, **kw) -> dict:
    """A ``layout.title``: ``text`` and, under it, ``subtitle`` (``title.subtitle``, 12 px). Callers break
    their lines with ``<br>`` (``TITLE_CHARS``, ``SUBTITLE_LINE_CHARS`` fit a phone; the widget tests
    check them).
    ``kw``: further title properties (``font`` ...). Use it in a figure and in its slider's frames."""
    out = dict(text=text, **kw)
    out["subtitle"] = dict(text=subtitle or "")
    return out


def split_title(text: str, **kw) -> dict:
    """A title written the old way, ``"main<br><sup>subtitle</sup>"``, as :func:`title` (the subtitle
    in ``title.subtitle``, legible on a phone); a title without ``<sup>`` stays as it is."""
    main, sep, rest = text.partition("<sup>")
    if not sep:
        return title(text, **kw)
    main = main.removesuffix("<br>")
    return title(main, rest.replace("</sup>", "").strip(), **kw)


def top_margin(title_lines: int = 1, subtitle_lines: int = 0, panel_title_lines: int = 0) -> int:
    """The top margin (px) that holds the toolbar, a title of ``title_lines`` lines, a subtitle of
    ``subtitle_lines`` and, above the top panels, subplot titles of ``panel_title_lines`` lines."""
    panel = 16 * panel_title_lines + 6 if panel_title_lines else 0
    return MODEBAR_PX + 19 * title_lines + 16 * subtitle_lines + panel + 14


def _axis_key(ref: str, letter: str) -> str:
    """``"x2"`` -> ``"xaxis2"``; ``"xaxis2"`` stays."""
    return ref if ref.startswith(f"{letter}axis") else f"{letter}axis{ref[1:]}"


def panels(fig: go.Figure) -> list[list[str]]:
    """The figure's panels in reading order (top to bottom, then left to right): ``["xaxis2", "yaxis2"]``
    for a cartesian panel (an x axis with a domain and the y axis it is anchored to), ``["scene"]`` for
    a 3-D one."""
    found = []
    for key in fig.layout:
        ax = fig.layout[key]
        if key.startswith("xaxis") and ax.domain is not None:
            y = _axis_key(ax.anchor, "y") if ax.anchor and ax.anchor != "free" else "yaxis"
            ydom = fig.layout[y].domain or (0.0, 1.0)
            found.append(((-ydom[1], ax.domain[0]), [key, y]))
        elif key.startswith("scene") and ax.domain is not None and ax.domain.x is not None:
            found.append(((-(ax.domain.y or (0.0, 1.0))[1], ax.domain.x[0]), [key]))
    return [keys for _, keys in sorted(found, key=lambda f: f[0])]


def _extent(fig: go.Figure, keys) -> tuple[float, float, float, float]:
    xs, ys = [], []
    for key in keys:
        ax = fig.layout[key]
        if key.startswith("scene"):
            xs += list(ax.domain.x or (0.0, 1.0))
            ys += list(ax.domain.y or (0.0, 1.0))
        elif key.startswith("xaxis"):
            xs += list(ax.domain or (0.0, 1.0))
        else:
            ys += list(ax.domain or (0.0, 1.0))
    return min(xs or [0.0]), max(xs or [1.0]), min(ys or [0.0]), max(ys or [1.0])


def colorbar(fig: go.Figure, keys, *, title: str = "", gap: float = 0.012, share: tuple[int, int] = (0, 1),
             **kw) -> dict:
    """A colour bar (``colorbar=`` of a trace or a coloraxis) beside its own panel: just right of the
    panel ``keys`` (``["xaxis2", "yaxis2"]``, or a list of several panels: their extent), as tall as it,
    thin. ``share = (i, n)``: the ``i``-th of ``n`` bars stacked beside one panel. The figure must leave
    room to the panel's right (``horizontal_spacing`` of make_subplots, or the right margin)."""
    keys = [keys] if isinstance(keys, str) else list(keys)
    if keys and isinstance(keys[0], (list, tuple)):
        keys = [k for unit in keys for k in unit]
    _, x1, y0, y1 = _extent(fig, keys)
    i, n = share
    length = (y1 - y0) / n
    out = dict(x=x1 + gap, xanchor="left", xref="paper", y=y1 - (i + 0.5) * length, yanchor="middle",
               yref="paper", len=0.92 * length, lenmode="fraction", thickness=10, outlinewidth=0,
               title=dict(text=title, side="right"), tickfont=dict(size=11))
    out.update(kw)
    return out


def merge_meta(fig: go.Figure, **entries) -> go.Figure:
    """Add ``entries`` to ``layout.meta`` (a dict), keeping what is there. ``fig.update_layout(meta=...)``
    replaces the whole dict, and with it the stacking description of :func:`stack_panels`."""
    meta = fig.layout.meta
    meta = dict(meta) if isinstance(meta, dict) else {}
    meta.update(entries)
    fig.layout.meta = meta
    return fig


def hover_rows(fig: go.Figure) -> go.Figure:
    """Ask the book's page to outline a query's whole row while the pointer is over one of its cells
    (``layout.meta.hover_rows``, read by ``_static/hover_rows.js``): the row is that query's plan."""
    return merge_meta(fig, hover_rows=True)


def stack_panels(fig: go.Figure, units=None, *, height: int = 300, heights=None, narrow=None) -> go.Figure:
    """Describe how to stack ``fig``'s panels on a narrow screen, in ``layout.meta.stack`` (read by the
    book's ``_static/responsive_figures.js``; Plotly itself cannot reflow subplots).

    ``units``: the panels in reading order, each a list of layout keys that move together (a panel and
    the bars beside it: ``[["xaxis", "yaxis", "xaxis2", "yaxis2"], ["scene"], ...]``); default
    :func:`panels` (every panel on its own). ``height``: px per unit when stacked (plot, its title, its
    tick labels and x-axis title), or ``heights``, one per unit. ``narrow``: extra layout properties for
    the stacked form (``{"yaxis2.showticklabels": True}``: a panel that shared the left panel's labels
    shows its own). Returns ``fig``."""
    units = panels(fig) if units is None else [list(u) for u in units]
    for unit in units:
        for key in unit:
            if not (key.startswith(("xaxis", "yaxis", "scene")) and key in fig.layout
                    and fig.layout[key].domain is not None):
                raise ValueError(f"stack_panels: {key!r} is not a panel of this figure (no domain)")
    heights = [int(height)] * len(units) if heights is None else [int(h) for h in heights]
    if len(heights) != len(units):
        raise ValueError(f"got {len(heights)} heights for {len(units)} panels")
    return merge_meta(fig, stack=dict(panels=units, heights=heights, narrow=dict(narrow or {})))


def register() -> None:
    """Register the template and make it Plotly's default (idempotent)."""
    pio.templates[TEMPLATE] = _template()
    pio.templates.default = TEMPLATE
