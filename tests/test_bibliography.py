"""The book's bibliography: author-year labels that tell every entry apart, and titles without TeX."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

pybtex = pytest.importorskip("pybtex")
pytest.importorskip("sphinxcontrib.bibtex")
from pybtex.database import parse_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIBFILES = yaml.safe_load((ROOT / "_config.yml").read_text())["bibtex_bibfiles"]


@pytest.fixture(scope="module")
def labels():
    # book/_ext is Sphinx's extension folder, not a package: load the extension by its path (registered
    # before it runs, as an import would: its dataclasses look their module up)
    spec = importlib.util.spec_from_file_location("author_year_bib", ROOT / "book" / "_ext" / "author_year_bib.py")
    author_year_bib = importlib.util.module_from_spec(spec)
    sys.modules["author_year_bib"] = author_year_bib
    spec.loader.exec_module(author_year_bib)

    class App:
        srcdir = ROOT

    class Config:
        bibtex_bibfiles = BIBFILES

    author_year_bib._label_the_book(App, Config)
    return dict(author_year_bib._BOOK_LABELS)


def test_every_entry_gets_its_own_author_year_label(labels):
    keys = {key for name in BIBFILES for key in parse_file(ROOT / name).entries}
    assert set(labels) == keys
    assert len(set(labels.values())) == len(labels), "two entries share a label"
    for key, label in labels.items():
        assert re.fullmatch(r"[^,]+, (\d{4}[a-z]?|n\.d\.)", label), (key, label)


def test_same_author_and_year_are_told_apart_by_a_letter(labels):
    assert (labels["litman2025"], labels["litman2025essay"]) == ("Litman, 2025a", "Litman, 2025b")


def test_titles_hold_no_tex_math():
    for name in BIBFILES:
        for key, entry in parse_file(ROOT / name).entries.items():
            assert "$" not in entry.fields.get("title", ""), f"{name}: {key} has TeX math in its title"
