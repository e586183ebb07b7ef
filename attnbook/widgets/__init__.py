"""Interactive figures, one submodule per chapter.

``*_figure`` functions return Plotly figures whose sliders are precomputed frames (they work in the
static book, no kernel needed); ``*_explorer`` functions return ipywidgets for a live kernel
(Colab or Jupyter). Chapter 1's are re-exported here; the others are imported from their chapter's
submodule: ``attnbook.widgets.needle`` (chapter 2), ``attnbook.widgets.linear`` (chapter 3),
``attnbook.widgets.deltanet`` (chapter 4), ``attnbook.widgets.anna`` (chapter 5), ``attnbook.widgets.grassmann``
(chapter 6), ``attnbook.widgets.landscape`` (chapter 7).

Importing this package makes the book's figure style (:mod:`._style`) Plotly's default template, so
every figure -- these and any a lab draws itself -- looks the same and fits a phone's width.
Widgets draw; what they draw is computed by the library (``attnbook.experiments`` and the operators).
"""

from . import _style
from ._style import colour

_style.register()

from .curves import curves_figure  # noqa: E402 - the style is registered before any figure is built
from .eot import (  # noqa: E402
    attention_explorer,
    attention_map_figure,
    transport_plan_explorer,
    transport_plan_figure,
    weights_comparison_figure,
)

__all__ = ["attention_map_figure", "attention_explorer", "colour", "curves_figure", "transport_plan_figure",
           "transport_plan_explorer", "weights_comparison_figure"]
