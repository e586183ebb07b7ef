"""``{glue:figure}`` with ``:doc:``: a numbered, captioned figure pasted from a lab notebook.

myst-nb's ``glue:figure`` wraps a glued output in a figure (caption, ``:name:`` for ``{numref}``) but only
for outputs glued in the same document; its ``:doc:`` option exists for ``{glue}`` alone. The chapter
pages are Markdown and their figures come from the labs, so this extension gives ``glue:figure`` the
``:doc:`` option too: the figure holds a pending reference that myst-nb resolves (as for ``{glue}``)
once the lab has run, and Sphinx numbers the figure like any other (``numfig``).

    ```{glue:figure} ch1_plan_figure
    :doc: ../notebooks/01_softmax_is_eot_lab.ipynb
    :name: fig-ch1-plan

    The caption.
    ```
"""

from __future__ import annotations

from docutils import nodes
from docutils.parsers.rst import directives as spec
from myst_nb.ext.glue.directives import PasteFigureDirective
from myst_nb.ext.glue.utils import PendingGlueReferenceError, create_pending_glue_ref, glue_warning


class PasteFigureFromDocDirective(PasteFigureDirective):
    option_spec = {**PasteFigureDirective.option_spec, "doc": spec.unchanged}

    def run(self):
        if "doc" not in self.options:
            return super().run()
        try:
            ref = create_pending_glue_ref(self.document, self.source, self.line, self.options["doc"],
                                          self.arguments[0])
        except PendingGlueReferenceError as exc:
            return [glue_warning(str(exc), self.document, self.line)]
        figure = nodes.figure("", ref)
        self.set_source_info(figure)
        figure["classes"] += self.options.get("figclass", []) + ["glued-figure"]
        if "align" in self.options:
            figure["align"] = self.options["align"]
        self.add_name(figure)
        if self.content:
            holder = nodes.Element()
            self.state.nested_parse(self.content, self.content_offset, holder)
            first = holder[0]
            if not isinstance(first, nodes.paragraph):
                return [figure, glue_warning("Figure caption must be a paragraph.", self.document, self.lineno)]
            caption = nodes.caption(first.rawsource, "", *first.children)
            caption.source, caption.line = first.source, first.line
            figure += caption
            if len(holder) > 1:
                figure += nodes.legend("", *holder[1:])
        return [figure]


def setup(app):
    app.setup_extension("myst_nb")
    app.add_directive_to_domain("glue", "figure", PasteFigureFromDocDirective, override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
