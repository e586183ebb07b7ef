"""Interactive figures, one submodule per chapter.

``*_figure`` functions return Plotly figures whose sliders are precomputed frames (they work in the
static book, no kernel needed); ``*_explorer`` functions return ipywidgets for a live kernel
(Colab or Jupyter). Chapter 1's are re-exported here; the others are imported from their chapter's
submodule: ``attnlib.widgets.needle`` (chapter 2), ``attnlib.widgets.linear`` (chapter 3),
``attnlib.widgets.deltanet`` (chapter 4).
"""

from .eot import (
    attention_explorer,
    attention_map_figure,
    transport_plan_explorer,
    transport_plan_figure,
    weights_comparison_figure,
)

__all__ = ["attention_map_figure", "attention_explorer", "transport_plan_figure", "transport_plan_explorer",
           "weights_comparison_figure"]
