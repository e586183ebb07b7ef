"""The browser check's layout probe can fail: on small pages built here, it must flag a page that
scrolls sideways, an output wider than its box, a box wider than the text column, a console error and
a lab reference that is not a link -- and pass the same content made to fit. Needs a Chromium (``make
test`` installs one before the unit tests); skipped without one."""

import contextlib
import importlib.util
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = Path(__file__).resolve().parent.parent


def _browser_check():
    spec = importlib.util.spec_from_file_location("browser_check", ROOT / "scripts" / "browser_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = _browser_check()
PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
<style>body {{ margin: 0; }} article {{ max-width: 700px; margin: 0 20px; }}
pre {{ overflow-x: auto; font: 14px monospace; }}</style></head>
<body><main><article class="bd-article">{body}</article></main>{script}</body></html>"""
FITS = {
    "output": '<div class="cell_output"><pre>✓ a claim\n  (its numbers)</pre></div>',
    "table": '<div style="overflow-x: auto"><table style="width: 1500px"><tr><td>x</td></tr></table></div>',
    "reference": '<p>as measured (lab <a href="#s4">§4</a>).</p>',
    "script": "",
}
BREAKS = {
    "output": '<div class="cell_output"><pre>' + "✓ " + "a claim with its numbers " * 8 + "</pre></div>",
    "table": '<table style="width: 1500px"><tr><td>x</td></tr></table>',
    "reference": "<p>as measured (lab §4).</p>",
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


def _problems(browser, tmp_path, parts, width):
    body = "".join(v for k, v in parts.items() if k != "script")
    (tmp_path / "page.html").write_text(PAGE.format(body=body, script=parts["script"]), encoding="utf-8")
    page = browser.new_page(viewport={"width": width, "height": 800})
    logged = CHECK.console_errors(page)
    page.goto((tmp_path / "page.html").as_uri(), wait_until="load")
    problems = CHECK.layout_problems(page, f"{width} px", first=True)
    page.close()
    return problems + [f"console: {m}" for m in logged]


def test_a_page_that_fits_passes(browser, tmp_path):
    assert _problems(browser, tmp_path, FITS, 1280) == []


@pytest.mark.parametrize("part, expected", [
    ("output", "wider than their box"), ("table", "scrolls sideways"),
    ("reference", "not linked"), ("script", "console: Got invalid theme mode")])
def test_each_way_a_page_fails_a_reader_is_flagged(browser, tmp_path, part, expected):
    problems = _problems(browser, tmp_path, {**FITS, part: BREAKS[part]}, 1280)
    assert any(expected in p for p in problems), problems


def test_hovering_a_cell_of_an_attention_map_outlines_its_row(browser, tmp_path):
    """book/_static/hover_rows.js: on a figure that opts in (``widgets._style.hover_rows``), the pointer
    over a cell outlines that query's row, and leaving the figure removes the outline."""
    import plotly

    from attnlib.widgets._style import hover_rows
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
