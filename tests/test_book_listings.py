"""Every line of code a chapter's page shows fits its code box: ``CODE_WIDTH`` characters, what a code
box shows at 1280 px without a scroll bar. That is the library functions book/*.md include
(``literalinclude``) and the code the pages write out themselves (fences, of any language).

The pages are read with MyST's own parser, set up as ``_config.yml`` sets it up, and a directive's body
is read as MyST reads it (a fence inside a note is a listing too). An include is resolved as Sphinx
resolves it: ``:pyobject:`` is the object's lines from its first decorator to the end of its body (found
with ``ast``), then ``:start-after:``/``:start-at:``, ``:end-before:``/``:end-at:``, ``:lines:`` and
``:dedent:``, in Sphinx's order. An option this file does not read, where it could change the lines shown
or the width of the box, fails the check instead of being passed over. The tests below compare the lines
with those Sphinx's own reader gives, for the book's includes and for each option read here.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown_it.renderer import RendererHTML
from myst_parser.config.main import MdParserConfig
from myst_parser.parsers.mdit import create_md_parser
from myst_parser.parsers.options import options_to_items

from attnbook.lab import CODE_WIDTH

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "book").glob("*.md"))

# Directives whose body is code, shown as written after their options.
CODE_DIRECTIVES = {"code-block", "code", "sourcecode", "code-cell"}
# Directives whose body this file cannot read as markdown (reST, another file): a page with one fails.
OPAQUE_DIRECTIVES = {"eval-rst", "include"}
# literalinclude's options: those that pick the lines (applied below, in Sphinx's order) and those that
# only name, caption or colour the box. Any other is not understood: linenos/lineno-* take a gutter out
# of the box's width, prepend/append/diff show other text, tab-width/encoding change the characters.
SELECTING = {"pyobject", "start-after", "start-at", "end-before", "end-at", "lines", "dedent"}
PRESENTING = {"language", "caption", "name", "class", "emphasize-lines", "force"}


@dataclass
class Listing:
    page: str                               # "book/03_linear_attention.md"
    line: int                               # the page's line that opens it
    title: str                              # "{literalinclude} ../attnlib/linear.py :pyobject: ..."
    lines: list[tuple[str, str]]            # (where the line is written, the line as the box shows it)
    include: tuple[Path, dict] | None = None   # a literalinclude's file and options


@functools.cache
def _markdown():
    """The markdown parser the book is built with: MyST's, with the extensions ``_config.yml`` enables
    (dollarmath and amsmath decide what an indented line between ``$$`` is). The blocks are all it needs:
    the inline parse, half the time, is left out."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    extensions = set(config.get("parse", {}).get("myst_enable_extensions", []))
    return create_md_parser(MdParserConfig(enable_extensions=extensions), RendererHTML).disable("inline")


def _directive(info: str) -> tuple[str, str] | None:
    """``(name, argument)`` of a fence that opens a directive (``{name} argument``), None otherwise."""
    parts = info.strip().split(maxsplit=1)
    if not parts or not (parts[0].startswith("{") and parts[0].endswith("}")):
        return None
    return parts[0][1:-1], parts[1] if len(parts) > 1 else ""


def _options(body: str) -> tuple[dict[str, str], int]:
    """A directive's options and how many lines of its body they take, split off as MyST does: a
    ``---`` YAML block, or the leading lines that start with ``:``."""
    lines = body.splitlines()
    if body.startswith("---"):
        end = next((i for i in range(1, len(lines)) if re.match(r"-{3,}", lines[i])), len(lines))
        options = yaml.safe_load("\n".join(lines[1:end])) or {}
        return {k: "" if v is None else str(v) for k, v in options.items()}, end + 1
    n = 0
    while n < len(lines) and lines[n].lstrip().startswith(":"):
        n += 1
    items, _ = options_to_items("\n".join(line.lstrip()[1:] for line in lines[:n]))
    return dict(items), n


def _definitions(body: list[ast.stmt], prefix: str = ""):
    """``(dotted name, node)`` of every class and function ``:pyobject:`` can name, in the file's order:
    those at module level (also inside ``if``/``try``/``with`` blocks) and in classes, none inside a
    function (Sphinx's ``ModuleAnalyzer.find_tags``; a later definition of a name wins)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield prefix + node.name, node
            if isinstance(node, ast.ClassDef):
                yield from _definitions(node.body, f"{prefix}{node.name}.")
        else:
            inner = [s for field in ("body", "orelse", "finalbody") for s in getattr(node, field, [])]
            inner += [s for handler in getattr(node, "handlers", []) for s in handler.body]
            yield from _definitions(sorted(inner, key=lambda s: s.lineno), prefix)


def _line_numbers(spec: str, total: int) -> list[int]:
    """``:lines:`` (``1,3-5,8-``) as 0-based indices, as Sphinx's ``parselinenos`` reads it."""
    items = []
    for part in spec.split(","):
        ends = part.strip().split("-")
        if ends == ["", ""] or len(ends) > 2:
            raise ValueError(f"invalid :lines: {spec!r}")
        if len(ends) == 1:
            items.append(int(ends[0]) - 1)
        else:
            start = int(ends[0] or 1)
            end = int(ends[1] or max(start, total))
            if start > end:
                raise ValueError(f"invalid :lines: {spec!r}")
            items.extend(range(start - 1, end))
    return items


def _find(lines: list[tuple[int, str]], text: str, after_first: bool = False) -> int:
    """The index of the first line containing ``text`` (as ``:start-after:`` and its kin look)."""
    for i, (_, line) in enumerate(lines):
        if text in line and (i or not after_first):
            return i
    raise AssertionError(f"no line contains {text!r}")


def _shown(path: Path) -> str:
    """A path as a failure names it: from the repository's root when it lies inside it."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def _included(page: Path, argument: str, options: dict[str, str]) -> tuple[Path, list[tuple[int, str]]]:
    """The file a literalinclude names and the lines it shows, as ``(line number in the file, text)``."""
    path = (ROOT / argument.lstrip("/")) if argument.startswith("/") else (page.parent / argument)
    path = path.resolve()
    text = path.read_text(encoding="utf-8-sig")
    lines = list(enumerate(text.splitlines(), start=1))
    if "pyobject" in options:
        found = dict(_definitions(ast.parse(text).body))
        assert options["pyobject"] in found, f"{options['pyobject']!r} is not defined in {path}"
        node = found[options["pyobject"]]
        first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        lines = lines[first - 1:node.end_lineno]
    if "start-at" in options:
        lines = lines[_find(lines, options["start-at"]):]
    elif "start-after" in options:
        lines = lines[_find(lines, options["start-after"]) + 1:]
    if "end-at" in options:
        lines = lines[:_find(lines, options["end-at"]) + 1]
    elif "end-before" in options:                       # Sphinx passes over a match on the first line
        lines = lines[:_find(lines, options["end-before"], after_first=True)]
    if "lines" in options:
        lines = [lines[i] for i in _line_numbers(options["lines"], len(lines)) if i < len(lines)]
    if "dedent" in options:
        if options["dedent"].strip():
            n = int(options["dedent"])
            lines = [(number, line[n:]) for number, line in lines]
        else:
            dedented = textwrap.dedent("\n".join(line for _, line in lines)).split("\n")
            lines = [(number, line) for (number, _), line in zip(lines, dedented, strict=True)]
    return path, lines


@functools.cache
def listings(page: Path) -> list[Listing]:
    """Every code box the page shows, with its lines."""
    name = _shown(page)
    found = []

    def read(text: str, offset: int) -> None:               # offset: the page's 0-based line of text's first
        for token in _markdown().parse(text):
            if token.type not in ("fence", "colon_fence", "code_block"):
                continue
            opens = offset + token.map[0]
            directive = _directive(token.info) if token.type != "code_block" else None
            if directive is None and token.type == "colon_fence":  # a div: its body is markdown
                read(token.content, opens + 1)
            elif directive is None:                             # a fenced or indented block of code
                first = opens + (token.type == "fence")
                title = f"{token.markup}{token.info.strip()} block" if token.type == "fence" else "indented block"
                code = [(f"{name}:{first + 1 + i}", line) for i, line in enumerate(token.content.splitlines())]
                found.append(Listing(name, opens + 1, title, code))
            else:
                kind, argument = directive
                options, n = _options(token.content)
                body = token.content.splitlines()[n:]
                title = f"{{{kind}}} {argument}".strip() + "".join(f" :{k}: {v}" for k, v in options.items()
                                                                   if k in SELECTING)
                if kind in OPAQUE_DIRECTIVES:
                    pytest.fail(f"{name}:{opens + 1}: {{{kind}}} shows text this check cannot read")
                elif kind == "literalinclude":
                    unknown = sorted(set(options) - SELECTING - PRESENTING)
                    if unknown:
                        pytest.fail(f"{name}:{opens + 1} {title}: this check does not understand "
                                    f"{', '.join(':' + k + ':' for k in unknown)}; teach it what they show")
                    path, lines = _included(page, argument, options)
                    where = _shown(path)
                    found.append(Listing(name, opens + 1, title, [(f"{where}:{i}", line) for i, line in lines],
                                         include=(path, options)))
                elif kind in CODE_DIRECTIVES:
                    first = opens + 1 + n
                    found.append(Listing(name, opens + 1, title,
                                         [(f"{name}:{first + 1 + i}", line) for i, line in enumerate(body)]))
                else:                                           # a note, a table, a figure: markdown inside
                    read("\n".join(body), opens + 1 + n)

    read(page.read_text(encoding="utf-8"), 0)
    return found


def _width(line: str) -> int:
    return len(line.expandtabs())                           # a tab in a <pre> reaches the next 8th column


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_listing_a_chapter_shows_fits_a_code_box(page):
    too_wide = [f"{listing.page}:{listing.line} {listing.title}\n"
                f"    {where}: {_width(line)} characters: {line.strip()}"
                for listing in listings(page) for where, line in listing.lines if _width(line) > CODE_WIDTH]
    if too_wide:
        pytest.fail(f"lines wider than a code box ({CODE_WIDTH} characters):\n" + "\n".join(too_wide))


def test_the_check_finds_every_listing_on_the_pages():
    """Each ``{literalinclude}`` and each fence with a language on a page is a listing the check reads,
    and none is empty (a parser that missed them would pass every page)."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        found = listings(page)
        includes = len(re.findall(r"^\s*(?:`{3,}|~{3,}|:{3,})\s*\{literalinclude\}", text, re.MULTILINE))
        fences = len(re.findall(r"^\s*(?:`{3,}|~{3,})[ \t]*[\w+-]+[ \t]*$", text, re.MULTILINE))
        assert sum(listing.include is not None for listing in found) == includes, page.name
        assert sum(listing.title.endswith(" block") for listing in found) >= fences, page.name
        assert all(listing.lines for listing in found), page.name
    assert any(listing.include for page in PAGES for listing in listings(page))


def _sphinx_lines(listing: Listing) -> list[str]:
    """The lines Sphinx's own literalinclude reader gives for an include."""
    code = pytest.importorskip("sphinx.directives.code")

    class Config:
        source_encoding = "utf-8-sig"

    path, options = listing.include
    typed = {k: code.LiteralInclude.option_spec[k](v or None) for k, v in options.items()}
    text, _ = code.LiteralIncludeReader(str(path), typed, Config()).read()
    return text.splitlines()


def test_an_included_listing_is_the_lines_sphinx_shows():
    """The lines resolved above are those Sphinx's literalinclude reads, for every include the book has."""
    for page in PAGES:
        for listing in listings(page):
            if listing.include is not None:
                assert [line for _, line in listing.lines] == _sphinx_lines(listing), f"{listing.page}:{listing.line}"


SOURCE = """\
import functools


@functools.cache
@functools.wraps(print)
def decorated(x):
    return x


class Box:
    def method(self):
        # start here
        a = 1
        b = 2
        # end here
        return a + b


if True:
    def hidden():
        return 0
"""


@pytest.mark.parametrize("options", [
    {"pyobject": "decorated"},
    {"pyobject": "Box.method", "dedent": ""},
    {"pyobject": "Box.method", "start-after": "start here", "end-before": "end here", "dedent": "8"},
    {"pyobject": "Box", "lines": "2-3,5-"},
    {"start-at": "class Box", "end-at": "return a + b", "lines": "-3"},
    {"pyobject": "hidden", "language": "python", "caption": "a caption: with a colon"},
], ids=lambda options: ",".join(options))
def test_the_include_options_the_check_reads_pick_the_lines_sphinx_picks(tmp_path, options):
    (tmp_path / "code.py").write_text(SOURCE)
    page = tmp_path / "page.md"
    page.write_text("```{literalinclude} code.py\n" + "".join(f":{k}: {v}\n" for k, v in options.items()) + "```\n")
    (listing,) = listings(page)
    assert listing.lines and [line for _, line in listing.lines] == _sphinx_lines(listing)


@pytest.mark.parametrize("option", [":linenos:", ":prepend: import torch", ":tab-width: 4", ":lineno-match:"])
def test_an_include_option_the_check_does_not_read_fails_it(tmp_path, option):
    page = tmp_path / "page.md"
    page.write_text(f"```{{literalinclude}} /attnlib/eot.py\n:pyobject: gibbs_plan\n{option}\n```\n")
    with pytest.raises(pytest.fail.Exception, match="does not understand"):
        listings(page)


def test_a_long_line_is_named_wherever_the_page_writes_it(tmp_path):
    """A fence inside a note, a code-block with options, an indented block: each is a listing, and a
    line too wide is named by the page's line."""
    long = "x = " + "1 + " * CODE_WIDTH + "1"
    page = tmp_path / "page.md"
    page.write_text(f":::{{note}}\nA note.\n\n```python\n{long}\n```\n:::\n\n"
                    f"```{{code-block}} python\n:caption: c\n\nshort\n{long}\n```\n\n"
                    f"Text.\n\n    {long}\n")
    wide = [where for listing in listings(page) for where, line in listing.lines if _width(line) > CODE_WIDTH]
    assert wide == [f"{page}:5", f"{page}:13", f"{page}:18"]
