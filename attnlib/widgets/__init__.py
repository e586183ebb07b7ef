"""Interactive figures. ``*_figure`` functions return Plotly figures whose sliders are precomputed
frames (they work in the static book); ``*_explorer`` functions return ipywidgets for a live kernel."""

from .eot import attention_explorer, attention_map_figure, transport_plan_explorer, transport_plan_figure

__all__ = ["attention_map_figure", "attention_explorer", "transport_plan_figure", "transport_plan_explorer"]
