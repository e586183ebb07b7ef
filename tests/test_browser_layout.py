"""The browser check can fail: on small pages built here, each defect a reader could meet must be
flagged -- a page that scrolls sideways (also where a phone's browser zooms out to fit it), a figure drawn
outside its box, a display equation or code box wider than the column on a laptop or scrolling without a
sign on a phone, an equation number over its equation, an output that does not wrap, a table that
scrolls on a laptop or a caption cut off, a table of contents that does not open, a console error, a lab
reference that is not a link -- and the same content made to fit, with the book's own stylesheet and
scripts where the fix is theirs, must pass. Needs a Chromium (``make test`` installs one before the unit
tests); skipped without one."""

import contextlib
import importlib.util
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "book" / "_static"


def _browser_check():
    spec = importlib.util.spec_from_file_location("browser_check", ROOT / "scripts" / "browser_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = _browser_check()
PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<style>body {{ margin: 0; }} article {{ max-width: 700px; margin: 0 16px; }}
pre {{ overflow-x: auto; font: 14px monospace; white-space: pre; }}
mjx-container {{ display: block; overflow-x: auto; }} mjx-math {{ display: inline-block; height: 2em; }}
</style>{head}</head>
<body><main><article class="bd-article">{body}</article></main>{script}</body></html>"""
# The book's own stylesheet and scripts: what makes a wide equation or listing say that it scrolls, an
# output wrap, a long inline name break, and the visible ☰ open the table of contents.
BOOK = (f'<link rel="stylesheet" href="{(STATIC / "custom.css").as_uri()}">'
        f'<script src="{(STATIC / "scroll_hints.js").as_uri()}"></script>'
        f'<script src="{(STATIC / "sidebar_toggle.js").as_uri()}"></script>')
# A theme as the book's has it: two ☰ buttons, its script listening on the first (hidden) one only.
THEME = """<button class="primary-toggle" style="display: none">☰</button>
<button class="primary-toggle">☰</button><div id="pst-primary-sidebar"><a href="#a">1. Chapter one</a></div>
<dialog id="pst-primary-sidebar-modal"></dialog>
<script>(() => {
  const t = document.querySelector('.primary-toggle'), s = document.getElementById('pst-primary-sidebar');
  const d = document.getElementById('pst-primary-sidebar-modal');
  t.addEventListener('click', () => {
    if (innerWidth >= 992) { s.style.display = s.style.display === 'none' ? '' : 'none'; return; }
    d.append(...s.childNodes); d.showModal();
  });
  d.addEventListener('click', e => { if (e.target === d) d.close(); });
  d.addEventListener('close', () => s.append(...d.childNodes));
})();</script>"""
LONG = "attnbook.experiments.hybrid.hybrid_pattern(n_layers, ratio)"
FITS = {
    "output": '<div class="cell_output"><pre>✓ a claim\n  (its numbers)</pre></div>',
    "table": ('<div class="pst-scrollable-table-container" style="overflow-x: auto"><table style="width: 500px">'
              "<caption>Table 1. A caption</caption><tr><td>x</td></tr></table></div>"),
    "reference": '<p>as measured (lab <a href="#s4">§4</a>).</p>',
    "figure": ('<div style="height: 300px"><div class="js-plotly-plot" style="height: 100%">'
               '<svg class="main-svg" width="300" height="300"></svg></div></div>'),
    "equation": ('<div class="math" id="eq"><span class="eqno">(1.1)</span>'
                 '<mjx-container display="true"><mjx-math style="width: 300px"></mjx-math></mjx-container></div>'),
    "code": '<div class="highlight"><pre>import torch</pre></div>',
    "inline": f"<p>The pattern is <code class=\"literal\"><span class=\"pre\">{LONG}</span></code>.</p>",
    "script": "",
}
WIDE_EQUATION = ('<div class="math" id="eq"><mjx-container display="true">'
                 '<mjx-math style="width: 1500px"></mjx-math></mjx-container></div>')
WIDE_CODE = '<div class="highlight"><pre>' + "x = 1;  " * 40 + "</pre></div>"
WIDE_OUTPUT = '<div class="cell_output"><pre>' + "✓ " + "a claim with its numbers " * 8 + "</pre></div>"
BREAKS = {
    "output": WIDE_OUTPUT,
    "table": '<table style="width: 1500px"><tr><td>x</td></tr></table>',
    "reference": "<p>as measured (lab §4).</p>",
    "figure": ('<div style="height: 100px"><div class="js-plotly-plot" style="height: 100%">'
               '<svg class="main-svg" width="300" height="300"></svg></div></div>'),
    "equation": WIDE_EQUATION,
    "code": WIDE_CODE,
    "script": "<script>console.error('Got invalid theme mode: . Resetting to auto.')</script>",
}


@pytest.fixture(scope="module")
def browser():
    exe = CHECK.find_browser()
    if exe is None:
        pytest.skip("no Chromium here (make test installs one)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield b
        b.close()


def _problems(browser, tmp_path, parts, width, head="", drawer=False):
    """The browser check's problems with a page of ``parts`` at ``width`` (a phone below 600 px, as the
    check emulates one), after the book's scripts in ``head`` have had the page's load to run."""
    body = "".join(v for k, v in parts.items() if k != "script") + (THEME if drawer else "")
    (tmp_path / "page.html").write_text(PAGE.format(head=head, body=body, script=parts["script"]),
                                        encoding="utf-8")
    phone = width < CHECK.PHONE_PX
    context = browser.new_context(viewport={"width": width, "height": 800}, is_mobile=phone, has_touch=phone)
    page = context.new_page()
    logged = CHECK.console_errors(page)
    page.goto((tmp_path / "page.html").as_uri(), wait_until="load")
    page.wait_for_timeout(50)           # scroll_hints.js marks boxes on load and on ResizeObserver's first call
    problems, _ = CHECK.layout_problems(page, f"{width} px", first=True)
    if drawer:
        problems += CHECK.drawer_problems(page, f"{width} px", phone=phone, timeout_ms=1_000)
    context.close()
    return problems + [f"console: {m}" for m in logged]


@pytest.mark.parametrize("width", [1280, 390])
def test_a_page_that_fits_passes(browser, tmp_path, width):
    assert _problems(browser, tmp_path, FITS, width, head=BOOK, drawer=True) == []


LAPTOP_FLAGS = {
    "output": "wider than their box", "table": "scrolls sideways", "reference": "not linked",
    "figure": "drawn outside their box", "equation": "display equation(s) wider than the column",
    "code": "code box(es) wider than the column", "script": "console: Got invalid theme mode",
}


def test_each_way_a_laptop_page_fails_a_reader_is_flagged(browser, tmp_path):
    """Every defect at once on one page (one load): each is named by its own message."""
    problems = _problems(browser, tmp_path, BREAKS, 1280)
    missing = {part: flag for part, flag in LAPTOP_FLAGS.items() if not any(flag in p for p in problems)}
    assert not missing, (missing, problems)


def test_a_table_that_scrolls_on_a_laptop_and_a_caption_cut_off_are_flagged(browser, tmp_path):
    wide = FITS["table"].replace("width: 500px", "width: 1500px")
    at_1280 = _problems(browser, tmp_path, {**FITS, "table": wide}, 1280)
    assert any("table(s) that scroll sideways" in p for p in at_1280), at_1280
    # on a phone the table may scroll, but its caption must be read whole: the book's stylesheet keeps it
    at_390 = _problems(browser, tmp_path, {**FITS, "table": wide}, 390)
    assert any("caption(s) cut off" in p for p in at_390), at_390
    assert _problems(browser, tmp_path, {**FITS, "table": wide}, 390, head=BOOK) == []


def test_an_equation_number_over_its_equation_is_flagged(browser, tmp_path):
    covered = FITS["equation"].replace('class="eqno"', 'class="eqno" style="position: absolute; left: 40px"')
    problems = _problems(browser, tmp_path, {**FITS, "equation": covered}, 1280)
    assert any("equation number(s) over their equation" in p for p in problems), problems


PHONE_BREAKS = {"equation": WIDE_EQUATION, "code": WIDE_CODE, "output": WIDE_OUTPUT}
PHONE_FLAGS = {"equation": "display equation(s) that scroll without a sign",
               "code": "code box(es) that scroll without a sign", "output": "wider than their box"}


def test_on_a_phone_a_box_that_scrolls_silently_is_flagged_and_the_books_styles_fix_it(browser, tmp_path):
    """A wide equation, a wide listing and a long output on one phone page: each flagged without the
    book's stylesheet and scripts, none with them (the edge fades, the output wraps)."""
    parts = {**FITS, **PHONE_BREAKS}
    problems = _problems(browser, tmp_path, parts, 390)
    missing = {part: flag for part, flag in PHONE_FLAGS.items() if not any(flag in p for p in problems)}
    assert not missing, (missing, problems)
    assert _problems(browser, tmp_path, parts, 390, head=BOOK) == []


def test_a_long_inline_name_breaks_instead_of_widening_the_page_on_a_phone(browser, tmp_path):
    # Sphinx keeps each word of an inline literal unbroken; a phone's browser then zooms out to fit it
    nowrap = '<style>span.pre { white-space: nowrap; }</style>'
    problems = _problems(browser, tmp_path, FITS, 390, head=nowrap)
    assert any("scrolls sideways at 390" in p for p in problems), problems
    assert _problems(browser, tmp_path, FITS, 390, head=nowrap + BOOK) == []


@pytest.mark.parametrize("width, expected", [(390, "does not open at 390"), (1280, "does not hide")])
def test_a_table_of_contents_that_does_not_open_is_flagged(browser, tmp_path, width, expected):
    problems = _problems(browser, tmp_path, FITS, width, drawer=True)
    assert any(expected in p for p in problems), problems
    assert _problems(browser, tmp_path, FITS, width, head=BOOK, drawer=True) == []


def test_hovering_a_cell_of_an_attention_map_outlines_its_row(browser, tmp_path):
    """book/_static/hover_rows.js: on a figure that opts in (``widgets._style.hover_rows``), the pointer
    over a cell outlines that query's row, and leaving the figure removes the outline."""
    import plotly

    from attnbook.widgets._style import hover_rows
    fig = hover_rows(plotly.graph_objects.Figure(plotly.graph_objects.Heatmap(z=[[1, 0, 0], [0.5, 0.5, 0],
                                                                               [0.2, 0.3, 0.5]])))
    fig.update_layout(width=400, height=400, margin=dict(l=40, r=40, t=40, b=40))
    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    (tmp_path / "fig.html").write_text(
        f'<html><body><script src="{js.as_uri()}"></script>'
        f'<script src="{(ROOT / "book" / "_static" / "hover_rows.js").as_uri()}"></script>'
        f'<div id="f" class="js-plotly-plot-host"></div><script>Plotly.newPlot("f", {fig.to_json()});</script>'
        "</body></html>", encoding="utf-8")
    page = browser.new_page(viewport={"width": 500, "height": 500})
    page.goto((tmp_path / "fig.html").as_uri(), wait_until="load")
    # Waits on what the page shows, not on a clock: a busy machine makes them longer, never wrong.
    page.wait_for_function("() => document.querySelector('#f .nsewdrag') !== null", timeout=60_000)
    outline = "() => (document.getElementById('f').layout.shapes || []).filter(s => s.name === 'hover-row')"
    box = page.evaluate("() => { const r = document.querySelector('#f .nsewdrag').getBoundingClientRect();"
                        " return [r.left, r.top, r.width, r.height]; }")
    page.mouse.move(box[0] + box[2] * 0.5, box[1] + box[3] * 0.5)       # the middle row: query 1
    with contextlib.suppress(PlaywrightTimeout):                          # (no outline: the assert says so)
        page.wait_for_function(f"() => ({outline})().length > 0", timeout=60_000)
    shown = page.evaluate(outline)
    page.mouse.move(490, 490)                                             # off the plot
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(f"() => ({outline})().length === 0", timeout=60_000)
    left = page.evaluate(outline)
    page.close()
    assert len(shown) == 1 and shown[0]["y0"] == 0.5 and shown[0]["y1"] == 1.5, shown
    assert left == []
