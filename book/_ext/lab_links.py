""""(lab §4)" becomes a link to the lab's section 4.

Each chapter page quotes its lab's sections by number ("(lab §4)", "§2–§3"); each lab numbers its
sections ("## 4. The KKT conditions") and quotes its own ("as in §7"). This extension links every "§n"
on a chapter page (``book/NN_name``) to the section of its lab (``notebooks/NN_name_lab``) whose title
starts with "n.", and every "§n" in a lab to its own section n. A "§n" that names no section is a build
warning (the book builds with warnings as errors), so a renumbered lab cannot leave a stale reference.
Code, math and existing links are left alone."""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)
SECTION_REF = re.compile(r"§\s?(\d+)")
NUMBERED_TITLE = re.compile(r"^(\d+)\.\s")
SKIP = (nodes.literal, nodes.literal_block, nodes.math, nodes.math_block, nodes.reference, nodes.raw,
        nodes.FixedTextElement)


def lab_of(docname: str, found: set[str]) -> str | None:
    """The lab a page quotes: itself for a lab, ``notebooks/<name>_lab`` for ``book/<name>``."""
    if docname.startswith("notebooks/"):
        return docname
    if docname.startswith("book/"):
        lab = "notebooks/" + docname.split("/", 1)[1] + "_lab"
        return lab if lab in found else None
    return None


def numbered_sections(doctree, lab: str, warn: bool) -> dict[int, str]:
    """{n: section id} for every section whose title starts with "n." (the lab's own numbering); two
    sections with one number are a warning, since a reference to it could not say which."""
    out: dict[int, str] = {}
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        m = NUMBERED_TITLE.match(title.astext()) if title is not None else None
        if m and section["ids"]:
            n = int(m.group(1))
            if n in out and warn:
                logger.warning(f"{lab} numbers two sections {n}", location=section)
            out.setdefault(n, section["ids"][0])
    return out


def link_sections(app, doctree, docname):
    env = app.env
    lab = lab_of(docname, env.found_docs)
    if lab is None:
        return
    sections = numbered_sections(doctree if lab == docname else env.get_doctree(lab), lab,
                                 warn=lab == docname)
    target = "" if lab == docname else app.builder.get_relative_uri(docname, lab)
    for text in list(doctree.findall(nodes.Text)):
        parent = text.parent
        if parent is None or any(isinstance(a, SKIP) or _section_title(a) for a in _ancestors(parent)):
            continue
        value = str(text)
        if not SECTION_REF.search(value):
            continue
        pieces, at = [], 0
        for m in SECTION_REF.finditer(value):
            n = int(m.group(1))
            if n not in sections:
                logger.warning(f"'{m.group(0)}' names no section of {lab} (its numbered sections: "
                               f"{sorted(sections)})", location=parent)
                continue
            pieces += [nodes.Text(value[at:m.start()]),
                       nodes.reference(m.group(0), m.group(0), refuri=f"{target}#{sections[n]}",
                                       classes=["lab-section-ref"])]
            at = m.end()
        if not pieces:
            continue
        pieces.append(nodes.Text(value[at:]))
        parent.replace(text, [p for p in pieces if not (isinstance(p, nodes.Text) and not str(p))])


def _section_title(node) -> bool:
    """A section's heading (a link there would sit in the table of contents); a table's or a figure's
    title is linked like running text."""
    return isinstance(node, nodes.title) and isinstance(node.parent, nodes.section)


def _ancestors(node):
    while node is not None:
        yield node
        node = node.parent


def setup(app):
    app.connect("doctree-resolved", link_sections)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
