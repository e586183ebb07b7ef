"""Author--year citations, in the text and in the bibliography alike.

sphinxcontrib-bibtex's ``author_year`` reference style writes "(Vaswani et al., 2017)" in the text,
while pybtex's bibliography styles label the entries "[VSP+17]" (alpha) or "[1]" (unsrt). This
extension registers

* a pybtex label style, ``author_year``: "Litman", "Peyré and Cuturi", "Vaswani et al." and the
  year, with "a", "b" ... appended when two entries of one bibliography would get the same label
  ("Litman, 2025a" and "Litman, 2025b");
* a formatting style, ``author_year`` (``bibtex_default_style``): pybtex's ``unsrt`` entries, sorted
  by author, year and title, labelled as above;
* a reference style, ``author_year_label`` (``bibtex_reference_style``): sphinxcontrib-bibtex's
  ``author_year``, except that the year is read from the entry's label, so that the text cites
  "Litman, 2025a" where the bibliography lists "Litman, 2025a".
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pybtex.plugin
import sphinxcontrib.bibtex.plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.template import join, node
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle
from sphinxcontrib.bibtex.style.referencing.basic_author_year import (
    BasicAuthorYearParentheticalReferenceStyle,
    BasicAuthorYearTextualReferenceStyle,
)
from sphinxcontrib.bibtex.style.template import join2, post_text, pre_text, reference, year

LABEL_SEP = ", "


def _surname(person) -> str:
    """A person's surname as plain text ("Peyr{\\'e}" -> "Peyré", "{DeepSeek-AI}" -> "DeepSeek-AI")."""
    latex = " ".join(person.prelast_names + person.last_names)
    return Text.from_latex(latex).render_as("text")


def _authors(entry) -> str:
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(p) for p in persons if str(p) != "others"]
    if not names:
        return Text.from_latex(entry.fields.get("title", entry.key)).render_as("text")
    if len(names) == 1 and len(persons) == 1:
        return names[0]
    if len(names) == 2 and len(persons) == 2:
        return f"{names[0]} and {names[1]}"
    return f"{names[0]} et al."


def _labels(sorted_entries) -> list[str]:
    """"Author, year" for each entry, with a letter after the year where two would be alike."""
    labels = [f"{_authors(e)}{LABEL_SEP}{e.fields.get('year', 'n.d.')}" for e in sorted_entries]
    count, seen, out = Counter(labels), Counter(), []
    for label in labels:
        if count[label] == 1:
            out.append(label)
        else:
            out.append(label + chr(ord("a") + seen[label]))
            seen[label] += 1
    return out


# The labels of every entry of every bibliography file, set when the configuration is read: a page's
# bibliography lists only what the page cites, but "Litman, 2025a" must mean the same paper on every page.
_BOOK_LABELS: dict[str, str] = {}


class AuthorYearLabelStyle(BaseLabelStyle):
    """Labels "Author, year", with a letter after the year where two entries of the book are alike."""

    def format_labels(self, sorted_entries):
        local = _labels(sorted_entries)
        for entry, label in zip(sorted_entries, local):
            yield _BOOK_LABELS.get(entry.key, label)


class AuthorYearStyle(UnsrtStyle):
    default_label_style = AuthorYearLabelStyle
    default_sorting_style = "author_year_title"


@node
def label_year(children, data):
    """The year as the bibliography's label has it ("2025a"); the entry's year field otherwise."""
    assert not children
    entry = data.get("formatted_entry")
    if entry is not None and LABEL_SEP in entry.label:
        return Text(entry.label.rsplit(LABEL_SEP, 1)[1])
    return year.format_data(data)


@dataclasses.dataclass
class _Parenthetical(BasicAuthorYearParentheticalReferenceStyle):
    def inner(self, role_name):
        return join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text,
            reference[join(sep=self.author_year_sep)[
                self.person.author_or_editor_or_title(full="s" in role_name), label_year]],
            post_text,
        ]


@dataclasses.dataclass
class _Textual(BasicAuthorYearTextualReferenceStyle):
    def inner(self, role_name):
        return join(sep=self.text_reference_sep)[
            self.person.author_or_editor_or_title(full="s" in role_name),
            join[self.bracket.left,
                 join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[pre_text, reference[label_year], post_text],
                 self.bracket.right],
        ]


@dataclasses.dataclass
class AuthorYearLabelReferenceStyle(AuthorYearReferenceStyle):
    def __post_init__(self):
        super().__post_init__()
        for i, style in enumerate(self.styles):
            if type(style) is BasicAuthorYearParentheticalReferenceStyle:
                self.styles[i] = _Parenthetical(**{f.name: getattr(style, f.name) for f in dataclasses.fields(style)})
            elif type(style) is BasicAuthorYearTextualReferenceStyle:
                self.styles[i] = _Textual(**{f.name: getattr(style, f.name) for f in dataclasses.fields(style)})
        self.role_style.update((role, style) for style in self.styles for role in style.role_names())


pybtex.plugin.register_plugin("pybtex.style.labels", "author_year", AuthorYearLabelStyle)
pybtex.plugin.register_plugin("pybtex.style.formatting", "author_year", AuthorYearStyle)
sphinxcontrib.bibtex.plugin.register_plugin("sphinxcontrib.bibtex.style.referencing", "author_year_label",
                                             AuthorYearLabelReferenceStyle)


def _label_the_book(app, config):
    from pathlib import Path

    from pybtex.database import parse_file

    entries = {}
    for name in config.bibtex_bibfiles:
        for key, entry in parse_file(Path(app.srcdir) / name).entries.items():
            entries.setdefault(key, entry)
    ordered = AuthorYearStyle().sort(list(entries.values()))
    _BOOK_LABELS.clear()
    _BOOK_LABELS.update((e.key, label) for e, label in zip(ordered, _labels(ordered)))


def setup(app):
    app.connect("config-inited", _label_the_book)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
