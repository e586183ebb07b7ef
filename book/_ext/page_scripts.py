"""Plotly's script only on the pages that draw a figure.

Every page lists the shared scripts (``html_js_files``); a page without a Plotly figure (the
introduction, the notation) would still download plotly.js (about 4.6 MB) for nothing. This drops the
figure scripts from the pages whose body holds no ``Plotly.newPlot``."""

from __future__ import annotations

FIGURE_SCRIPTS = ("plotly.min.js", "responsive_figures.js", "hover_rows.js")


def drop_unused(app, pagename, templatename, context, doctree):
    if "Plotly.newPlot" in context.get("body", ""):
        return
    scripts = context.get("script_files")
    if scripts is not None:
        context["script_files"] = [s for s in scripts if not _name(s).endswith(FIGURE_SCRIPTS)]


def _name(script) -> str:
    """The file a script entry loads (Sphinx keeps them as objects with a ``filename``)."""
    return str(getattr(script, "filename", script)).split("?")[0]


def setup(app):
    app.connect("html-page-context", drop_unused)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
