"""Load every page of the built book in headless Chromium and check that its figures render.

    python scripts/browser_check.py _build/html [--screenshots DIR]

Serves the HTML on 127.0.0.1, opens each chapter/lab page from the table of contents in Debian's
chromium (through Playwright, with the system browser: no browser download), and fails if

* a page that should hold Plotly figures (a lab notebook, or any page whose HTML embeds a
  Plotly figure) shows no rendered ``.js-plotly-plot`` with drawn content, or fewer than embedded;
* a figure with a slider does not change when its slider is moved;
* the page raises a JavaScript error (``pageerror``), except the known harmless ones below.

Exit code 0 only when every page passes; prints one line per page.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import re
import sys
import threading
from pathlib import Path

# Errors that come from the offline sandbox or from Jupyter Book's own templates, not our pages.
IGNORED_PAGE_ERRORS = (
    "THEBE_JS_URL",          # sphinx-thebe's script included twice by the default theme
    "require is not defined",  # ipywidgets' manager loads require.js from a CDN (unreachable offline)
)
CHROMIUM = "/usr/bin/chromium"


@contextlib.contextmanager
def serve(root: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def pages(root: Path) -> list[Path]:
    """Every chapter and lab page (book/*.html, notebooks/*.html) plus the landing page."""
    out = sorted(root.glob("book/*.html")) + sorted(root.glob("notebooks/*.html"))
    return [p for p in out if p.name not in ("genindex.html", "search.html")]


def expected_figures(html: str) -> int:
    """How many Plotly figures the page's HTML embeds (each ``Plotly.newPlot`` call is one).

    Only calls in the page's own scripts count: a call inside a JSON string (``Plotly.newPlot(\\"id\\"``,
    e.g. a glued figure's HTML kept in the notebook's data) is never run by the page."""
    return len(re.findall(r'Plotly\.newPlot\(\s*"', html))


SLIDER_PROBE = """
async () => {
  const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
  const results = [];
  for (const gd of plots) {
    const sliders = (gd.layout && gd.layout.sliders) || [];
    if (!sliders.length || !gd._transitionData || !gd._transitionData._frames) continue;
    const steps = sliders[0].steps;
    const snapshot = () => JSON.stringify(gd.data.map(t => [t.z, t.x, t.y]));
    const before = snapshot();
    const target = steps[(sliders[0].active || 0) === steps.length - 1 ? 0 : steps.length - 1];
    try {
      await window.Plotly.animate(gd, target.args[0], target.args[1]);
    } catch (e) {
      results.push(false);
      continue;
    }
    const heatmapsDrawn = gd.querySelectorAll('.hm image').length;
    const heatmaps = gd.data.filter(t => t.type === 'heatmap' && t.visible !== false).length;
    results.push(snapshot() !== before && heatmapsDrawn >= heatmaps);
  }
  return results;
}
"""


def check(root: Path, screenshots: Path | None) -> int:
    from playwright.sync_api import sync_playwright

    failures = 0
    with serve(root) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            # Software WebGL (SwiftShader): 3-D Plotly scenes draw on WebGL, as in a reader's browser.
            "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
            "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        for path in pages(root):
            rel = path.relative_to(root).as_posix()
            html = path.read_text(encoding="utf-8")
            want = expected_figures(html)
            must_have = rel.startswith("notebooks/") or want > 0
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.goto(f"{base}/{rel}", wait_until="load")
            if must_have:
                with contextlib.suppress(Exception):
                    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=20_000)
            page.wait_for_timeout(500)
            drawn = page.evaluate(
                "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
                ".filter(gd => gd.querySelector('.main-svg') && gd._fullData && gd._fullData.length).length")
            sliders_moved = page.evaluate(SLIDER_PROBE) if drawn else []
            bad_errors = [e for e in errors if not any(s in e for s in IGNORED_PAGE_ERRORS)]
            problems = []
            if must_have and drawn == 0:
                problems.append("no Plotly figure rendered")
            if drawn < want:
                problems.append(f"{drawn} of {want} embedded figures rendered")
            if not all(sliders_moved):
                problems.append(f"{sliders_moved.count(False)} slider(s) did not change their figure")
            if bad_errors:
                problems.append("page errors: " + " | ".join(bad_errors[:3]))
            if screenshots:
                screenshots.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshots / (rel.replace("/", "_") + ".png")), full_page=False)
            status = "FAIL" if problems else "ok"
            failures += bool(problems)
            print(f"{status:4}  {rel}: {drawn} figure(s) rendered, {len(sliders_moved)} slider(s) moved"
                  + ("" if not problems else "  -- " + "; ".join(problems)))
            page.close()
        browser.close()
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, nargs="?", default=Path("_build/html"))
    ap.add_argument("--screenshots", type=Path, default=None)
    args = ap.parse_args()
    if not (args.root / "index.html").exists():
        print(f"no built book at {args.root} (run `make book` first)", file=sys.stderr)
        return 2
    if not pages(args.root):
        print(f"no chapter pages under {args.root}", file=sys.stderr)
        return 2
    failures = check(args.root, args.screenshots)
    print(f"browser check: {len(pages(args.root)) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
