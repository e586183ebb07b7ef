"""House rules that CI enforces: notebooks stored without outputs, one repository URL, every lab in
the table of contents, and labs whose claims are visible checks in code a page can show."""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _config_repository_url() -> str:
    text = (ROOT / "_config.yml").read_text()
    m = re.search(r"^repository:\s*\n\s+url:\s*(\S+)", text, re.M)
    assert m, "_config.yml has no repository.url"
    return m.group(1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    nb = json.loads(path.read_text())
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_setup_cell_installs_from_the_configured_repository(path):
    nb = json.loads(path.read_text())
    first = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    assert f'REPO = "{_config_repository_url()}"' in first and "git+{REPO}" in first
    assert "setup(seed=" in first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lab_is_in_the_table_of_contents(path):
    assert f"notebooks/{path.stem}" in (ROOT / "_toc.yml").read_text()


def test_readme_points_at_the_configured_repository():
    assert _config_repository_url() in (ROOT / "README.md").read_text()


def _code_cells(path):
    nb = json.loads(path.read_text())
    return [(i, "".join(c["source"])) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]


def top_level_asserts(source: str) -> list[int]:
    """Line numbers of the ``assert`` statements of a code cell that are not inside a function: a
    claim the cell makes, which should be a visible ``lab.check``. Asserts inside a helper
    function guard against programming errors and may stay."""
    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Assert):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    found: list[int] = []
    visit(ast.parse(source))
    return found


def test_top_level_asserts_are_found_outside_functions_only():
    source = ("assert x\nfor i in y:\n    if i:\n        assert i > 0\n"
              "def helper(a):\n    assert a\n    return a\n")
    assert top_level_asserts(source) == [1, 4]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_lab_claims_are_visible_checks_not_bare_asserts(path):
    """Each claim a lab verifies is a ``lab.check(claim, condition, detail)``, which shows the reader
    what was verified and by how much; a bare ``assert`` passes silently."""
    bare = [(i, line) for i, source in _code_cells(path) for line in top_level_asserts(source)]
    assert not bare, (f"{path.name}: bare asserts (cell index, line) {bare}; make each claim a "
                      "lab.check(claim, condition, detail)")


def _script(name: str):
    """Import scripts/<name>.py as a module (the scripts are not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_serves_its_scripts_itself_and_loads_no_thebe():
    """One plotly.js and MathJax from _static/ (scripts/site_assets.py), no sphinx-thebe (its script,
    included twice, raised a page error), no widget scripts from CDNs; the book's own small scripts
    after plotly.js, every one of them in book/_static/."""
    text = (ROOT / "_config.yml").read_text()
    scripts = re.search(r"^\s+html_js_files: \[([^\]]*)\]$", text, re.M)
    names = re.split(r",\s*", scripts.group(1).strip()) if scripts else []
    assert names and names[0] == "plotly.min.js"
    assert all((ROOT / "book" / "_static" / name).is_file() for name in names[1:])
    assert re.search(r"^\s+mathjax_path: mathjax/tex-chtml\.js$", text, re.M)
    assert re.search(r"^\s+html_static_path: \[book/_static\]$", text, re.M)
    assert re.search(r"^\s+nb_ipywidgets_js: \{\}", text, re.M)
    extensions = re.search(r"^\s+extensions: \[([^\]]*)\]", text, re.M)
    assert extensions and "sphinx_thebe" not in extensions.group(1) and "myst_nb" in extensions.group(1)
    assert _script("site_assets").STATIC == ROOT / "book" / "_static"


def test_the_book_renders_the_labs_from_the_execution_that_make_runs():
    text = (ROOT / "_config.yml").read_text()
    assert re.search(r"^\s+execute_notebooks: cache$", text, re.M)
    labs = _script("execute_labs")
    assert labs.CACHE == ROOT / "_build" / ".jupyter_cache"        # where myst-nb looks by default
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^book: install labs book-build$", make, re.M)
    # make test: one pytest run executes the unit tests and every lab (nbval) into an emptied cache
    # (notebooks/conftest.py), then the book is built from it; the committed results are checked first
    assert re.search(r"--nbval-lax .*\\\n.* tests notebooks --lab-cache --fresh-lab-cache", make)
    assert re.search(r"^TEST_STEPS := check-artifacts .*\bchecks book-build browser$", make, re.M)


def test_the_execution_cache_is_keyed_on_attnlib_and_the_environment(monkeypatch, tmp_path):
    labs = _script("execute_labs")
    (tmp_path / "attnlib").mkdir()
    (tmp_path / "attnlib" / "ops.py").write_text("x = 1\n")
    monkeypatch.setattr(labs, "ROOT", tmp_path)
    monkeypatch.delenv("ATTNBOOK_SEED", raising=False)
    first = labs.fingerprint()
    assert labs.fingerprint() == first
    (tmp_path / "attnlib" / "ops.py").write_text("x = 2\n")
    second = labs.fingerprint()
    assert second != first
    monkeypatch.setenv("ATTNBOOK_SEED", "3")
    assert labs.fingerprint() != second


def test_the_browser_check_expects_a_mechanism_map_on_every_chapter_page():
    check = _script("browser_check")
    chapters = sorted(f"book/{p.stem}.html" for p in (ROOT / "book").glob("0[0-9]_*.md"))
    assert sorted(check.MECHANISM_MAP_PAGES) == chapters


@pytest.mark.parametrize("text, raw", [
    (r"the plan \frac{1}{2}", True), ("$$P = 1$$", True), (r"\(x\)", True), ("P_{ij}", True),
    (r"\sum_i \lambda_i", True), ("costs $5 and $6", False), ("plain prose, snake_case", False)])
def test_the_browser_check_sees_raw_tex(text, raw):
    assert bool(_script("browser_check").RAW_TEX.search(text)) is raw


def test_the_browser_check_counts_dead_widgets():
    check = _script("browser_check")
    view = '<script type="application/vnd.jupyter.widget-view+json">{"model_id": "x"}</script>'
    assert check.dead_widgets("<p>no widgets</p>") == 0
    assert check.dead_widgets(view + view) == 2


def test_without_a_browser_make_test_stops_in_one_line_naming_the_command(monkeypatch, capsys):
    """No Chromium anywhere, not root, and Playwright's installer fails: one line, naming one command."""
    check = _script("browser_check")
    ran = []
    monkeypatch.setattr(check, "find_browser", lambda: None)
    monkeypatch.setattr(check.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(check.subprocess, "run", lambda cmd, **kw: ran.append(cmd))
    assert check.install_browser() == 1
    assert ran == [[check.sys.executable, "-m", "playwright", "install", "chromium"]]   # the user's own install
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("-m playwright install --with-deps chromium")
