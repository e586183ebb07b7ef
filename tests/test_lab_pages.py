"""What a reader of a lab page sees: the experiment, its figure and its checks, not the plumbing that
hands numbers to the chapter page; and lab sections that the prose can quote by number."""

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from attnbook.lab import CODE_WIDTH

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
GLUE = ("glue", "glue_figure")
HIDDEN = {"remove-cell", "remove-input"}     # tags of the code cells whose code the book leaves off the page


def _extension(name: str):
    """One of the book's Sphinx extensions (book/_ext/, not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "book" / "_ext" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_glue(stmt: ast.stmt) -> bool:
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (isinstance(call, ast.Call) and isinstance(call.func, (ast.Attribute, ast.Name))
            and (call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id) in GLUE)


def _only_glue(body: list[ast.stmt]) -> bool:
    """Every statement hands a value to the page: a glue call, or a loop or branch of glue calls."""
    return all(_is_glue(s) or (isinstance(s, (ast.For, ast.If)) and _only_glue(s.body + s.orelse))
               for s in body)


def _code_cells(path: Path):
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] == "code":
            yield i, cell, "".join(cell["source"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_line_of_code_a_lab_page_shows_fits_a_code_box(path):
    """A code box on a page shows ``CODE_WIDTH`` characters at 1280 px; a longer line hides its end behind a
    scroll bar. Every line of a cell the page shows fits (a cell tagged remove-cell or remove-input is not
    shown, and may be wider)."""
    wide = [f"cell {i} line {n}: {len(line)} characters"
            for i, cell, src in _code_cells(path) if not HIDDEN & set(cell.get("metadata", {}).get("tags", []))
            for n, line in enumerate(src.split("\n"), 1) if len(line) > CODE_WIDTH]
    assert not wide, f"{path.name}: lines wider than a code box ({CODE_WIDTH} characters): " + "; ".join(wide)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_glue_calls_live_only_in_hidden_cells_that_do_nothing_else(path):
    """A cell that calls ``lab.glue``/``glue_figure`` holds nothing a reader should see (so the book
    hides it: tag ``remove-cell``), and a cell the reader sees calls no glue; glue goes through the
    lab (``lab.glue``), not myst-nb's directly."""
    wrong = []
    for i, cell, src in _code_cells(path):
        tree = ast.parse(src)
        glues = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and _is_glue(n)]
        hidden = "remove-cell" in cell.get("metadata", {}).get("tags", [])
        if glues and not _only_glue(tree.body):
            wrong.append(f"cell {i} mixes glue calls with other code")
        elif glues and not hidden:
            wrong.append(f"cell {i} glues but is not tagged remove-cell")
        elif hidden and not glues:
            wrong.append(f"cell {i} is hidden from the page but hands nothing to it")
        if any(not isinstance(n.value.func, ast.Attribute) for n in glues):
            wrong.append(f"cell {i} calls glue() directly instead of lab.glue()")
    assert not wrong, f"{path.name}: " + "; ".join(wrong)


def _numbered_sections(path: Path) -> list[int]:
    out = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            out += [int(n) for n in re.findall(r"^##\s+(\d+)\.\s", "".join(cell["source"]), re.M)]
    return out


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_lab_section_number_is_used_once(path):
    numbers = _numbered_sections(path)
    assert numbers and len(numbers) == len(set(numbers)), f"{path.name}: sections {numbers}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lab_section_the_prose_quotes_exists(path):
    """"(lab §n)" on the chapter page and "§n" in the lab link to the lab's section n (the book's
    lab_links extension), so n must be one of the lab's numbered sections."""
    page = ROOT / "book" / (path.stem.removesuffix("_lab") + ".md")
    texts = [page.read_text()] if page.exists() else []
    texts += ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
              if c["cell_type"] == "markdown"]
    quoted = {int(n) for t in texts for n in re.findall(r"§\s?(\d+)", t)}
    assert quoted <= set(_numbered_sections(path)), (
        f"{path.name}: quoted {sorted(quoted - set(_numbered_sections(path)))} do not exist")


@pytest.mark.parametrize("docname, chapter", [
    ("book/04_deltanet", "4"), ("notebooks/04_deltanet_lab", "4"), ("book/07_landscape", "7"),
    ("book/a1_reading_a_kernel", "A1"), ("book/intro", None), ("book/notation", None)])
def test_figures_are_numbered_by_the_chapter_their_file_belongs_to(docname, chapter):
    assert _extension("chapter_numbers").chapter_of(docname) == chapter


def _pasted_names() -> str:
    """Every text that may paste a glued value: the chapter pages and the labs' own markdown."""
    texts = [p.read_text() for p in (ROOT / "book").glob("*.md")]
    for path in NOTEBOOKS:
        texts += ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                  if c["cell_type"] == "markdown"]
    return "\n".join(texts)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_glued_name_is_pasted_somewhere(path):
    """A value handed to the pages that no page pastes is dead plumbing. A name built in an f-string
    (``f"ch2_bs_{name}"``) counts as pasted when some pasted name fits its pattern."""
    pasted = set(re.findall(r"(?:::|\{glue(?::\w+)?\}`?\s*)([A-Za-z0-9_]+)", _pasted_names()))
    pasted |= set(re.findall(r"```\{glue(?::\w+)?\}\s+([A-Za-z0-9_]+)", _pasted_names()))
    unused = []
    for _, _, src in _code_cells(path):
        for node in ast.walk(ast.parse(src)):
            if not (isinstance(node, ast.stmt) and _is_glue(node)) or not node.value.args:
                continue
            name = node.value.args[0]
            if isinstance(name, ast.Constant):
                pattern = re.escape(name.value)
            elif isinstance(name, ast.JoinedStr):
                pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else "[A-Za-z0-9_]+"
                                  for v in name.values)
            else:
                continue
            if not any(re.fullmatch(pattern, p) for p in pasted):
                unused.append(ast.unparse(name))
    assert not unused, f"{path.name}: glued but pasted nowhere: {unused}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_lab_replaces_a_figures_meta(path):
    """``fig.update_layout(meta=...)`` replaces the whole ``layout.meta``, and with it what the page's
    scripts read there (how to stack the panels on a phone, the hovered row's outline): labs pass
    ``mechanism_map=`` to the widget, or use ``widgets._style.merge_meta``."""
    wrong = [i for i, _, src in _code_cells(path) if re.search(r"update_layout\([^)]*\bmeta\s*=", src)]
    assert not wrong, f"{path.name}: cells {wrong} replace layout.meta"
