"""Figures and tables numbered per chapter: "Fig. 4.2" is chapter 4's second figure, on its page or in
its lab, as the equations are numbered per chapter.

Sphinx numbers figures across the whole book (``numfig``) when the table of contents is not numbered.
After it has, this extension renumbers every document's figures and tables: the chapter is read from the
file name (``book/04_deltanet``, ``notebooks/04_deltanet_lab`` -> 4; the appendix ``a1_...`` -> A1), and
the figures of one document are counted in the order Sphinx found them. A chapter's page and its lab
count separately, the lab's with an "L" (Fig. 4.L1), so that a number names one figure in the book."""

from __future__ import annotations

import re

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment

CHAPTER = re.compile(r"^(?:book|notebooks)/(\d\d|a\d)_")


def chapter_of(docname: str) -> str | None:
    """"4" for book/04_deltanet and its lab, "A1" for the first appendix, None for pages outside a chapter."""
    m = CHAPTER.match(docname)
    if m is None:
        return None
    tag = m.group(1)
    return tag.upper() if tag.startswith("a") else str(int(tag))


def renumber(app: Sphinx, env: BuildEnvironment) -> list[str]:
    for docname, by_type in env.toc_fignumbers.items():
        chapter = chapter_of(docname)
        if chapter is None:
            continue
        lab = docname.startswith("notebooks/")
        for figtype, numbers in by_type.items():
            if figtype == "section":
                continue
            ordered = sorted(numbers, key=lambda key: numbers[key])
            for i, key in enumerate(ordered, start=1):
                numbers[key] = (chapter, f"L{i}" if lab else str(i))
    return []


def setup(app: Sphinx):
    # after Sphinx's own numbering (TocTreeCollector, priority 500)
    app.connect("env-get-updated", renumber, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
