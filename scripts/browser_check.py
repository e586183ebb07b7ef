r"""Load every page of the built book in headless Chromium and check what a reader sees.

    python scripts/browser_check.py _build/html [--screenshots DIR]
    python scripts/browser_check.py --install-browser    # find a Chromium, or install one

Serves the HTML on 127.0.0.1, opens each chapter/lab page from the table of contents in a Chromium
found on this machine (``chromium``, ``chromium-browser``, ``google-chrome`` on PATH, or Playwright's
own), and fails a page if

* it should hold Plotly figures (a lab, ``*_lab.html``, or any page whose HTML embeds a Plotly figure) and
  shows no rendered ``.js-plotly-plot`` with drawn content, or fewer than it embeds;
* a figure with a slider does not change when its slider is moved;
* it raises a JavaScript error (``pageerror``), a request to the site fails, or it loads anything
  from outside the site (the site is self-contained: plotly.js and MathJax are served from _static/);
* MathJax left raw TeX in the text (``\frac``, ``$$``, ``\(`` ... outside rendered math and code)
  or could not typeset an equation (an error, or an undefined macro);
* it holds an ipywidgets output or widget state (a dead widget without a kernel);
* it weighs more than ``MAX_PAGE_BYTES``: its HTML plus what it loads from the site beyond the
  scripts and styles all pages share (``SHARED_PREFIXES``);
* it is a chapter page in ``MECHANISM_MAP_PAGES`` and holds no figure whose ``layout.meta`` has the
  key ``mechanism_map`` (the chapter's mechanism map, ``fig.update_layout(meta={"mechanism_map": ...})``);
* it logs an error to the console (``console.error``), at either width;

and, read as a reader reads it -- on a laptop (1280 px) and as a touch phone (390 px: a mobile
viewport, touch events, the device's pixel ratio) -- if

* it scrolls sideways: the page is wider than the screen (measured against the width set, since a
  phone's browser widens its viewport to fit a page that is too wide);
* a figure draws outside its box (its drawing taller or wider than the box the page gives it, so that
  it covers the text below);
* a display equation or a code box is wider than the width it has: at 1280 px any one; at 390 px one
  that scrolls without a sign that it does (``book/_static/scroll_hints.js`` marks a box that scrolls and
  the stylesheet fades its edge);
* an equation's number covers its equation;
* an output box is wider than the text column, or a text output (a check line, a printed table) is
  wider than its box at either width (its lines must wrap);
* a table scrolls sideways at 1280 px, or a table's caption is cut off at either width;
* the table of contents cannot be reached: on the phone, tapping the visible ☰ must open the drawer
  with the chapters' links and a tap beside it close it; on the laptop, ☰ must hide the sidebar and
  bring it back;
* a lab section it quotes, "(lab §n)", is not a link.

Prints one line per page, then the geometry it measured at each width (each figure's drawn height
against its box's, the widest display equation and code box against the width each has).
Exit code 0 only when every page passes; prints one line per page.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

# Chapter pages that must show their mechanism's map (a Plotly figure with layout.meta.mechanism_map).
MECHANISM_MAP_PAGES = (
    "book/01_softmax_is_eot.html",
    "book/02_needle.html",
    "book/03_linear_attention.html",
    "book/04_deltanet.html",
    "book/05_anna.html",
    "book/06_grassmann.html",
    "book/07_landscape.html",
)
MAX_PAGE_BYTES = 1_500_000
# (name, viewport, mobile): the widths a reader has; the page must not scroll sideways at either
WIDTHS = (("1280 px", {"width": 1280, "height": 900}, False), ("390 px", {"width": 390, "height": 844}, True))
# loaded by every page and cached by the browser: not counted in a page's weight
SHARED_PREFIXES = ("_static/", "_sphinx_design_static/", "searchindex.js")
# a TeX control word (\frac, \sum), display or inline delimiters, or a sub/superscript group
RAW_TEX = re.compile(r"\\[A-Za-z]{2,}|\$\$|\\[()\[\]]|[_^]\{")
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
INSTALL_HINT = f"{sys.executable} -m playwright install --with-deps chromium"


@contextlib.contextmanager
def serve(root: Path):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def end_headers(self):
            # as a static host would: the browser keeps what it loaded and does not ask again
            self.send_header("Cache-Control", "max-age=3600")
            super().end_headers()

    handler = functools.partial(Quiet, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def pages(root: Path) -> list[Path]:
    """Every chapter, lab and exercises page (book/*.html, notebooks/*.html) plus the landing page."""
    out = sorted(root.glob("book/*.html")) + sorted(root.glob("notebooks/*.html"))
    return [p for p in out if p.name not in ("genindex.html", "search.html")]


def expected_figures(html: str) -> int:
    """How many Plotly figures the page's HTML embeds (each ``Plotly.newPlot`` call is one).

    Only calls in the page's own scripts count: a call inside a JSON string (``Plotly.newPlot(\\"id\\"``,
    e.g. a glued figure's HTML kept in the notebook's data) is never run by the page."""
    return len(re.findall(r'Plotly\.newPlot\(\s*"', html))


def dead_widgets(html: str) -> int:
    """ipywidgets outputs (views) and saved widget state in the page: without a kernel they do nothing."""
    return len(re.findall(r'application/vnd\.jupyter\.widget-(?:view|state)\+json', html))


def _runs(exe: str) -> bool:
    """Whether ``exe --version`` works (Ubuntu's chromium-browser can be a stub that asks for a snap)."""
    try:
        return subprocess.run([exe, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_browser() -> str | None:
    """A Chromium to drive: ``$CHROMIUM``, else the first working browser on PATH, else Playwright's
    own (``playwright install chromium``). None when there is none."""
    for exe in (os.environ.get("CHROMIUM"), *(shutil.which(b) for b in BROWSERS)):
        if exe and _runs(exe):
            return exe
    try:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as p:
            exe = p.chromium.executable_path
    except Exception:  # noqa: BLE001 - no playwright driver: no managed browser either
        return None
    return exe if exe and Path(exe).exists() else None


def install_browser() -> int:
    """Find a Chromium, or install one: the system package where we may (root with apt-get), else
    Playwright's installer. Prints the browser, or one line naming the command that installs it."""
    exe = find_browser()
    if exe is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print("browser check: no Chromium found; installing the system package (apt-get install chromium)")
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, stdout=subprocess.DEVNULL,
                       check=False)
        exe = find_browser()
    if exe is None:
        print("browser check: no Chromium found; installing Playwright's (playwright install chromium)")
        subprocess.run([sys.executable, "-m", "playwright", "install", "chromium"], check=False)
        exe = find_browser()
    if exe is None:
        print(f"browser check: no Chromium found and none could be installed; run: {INSTALL_HINT}", file=sys.stderr)
        return 1
    print(f"browser check: using {exe}")
    return 0


SLIDER_PROBE = """
async () => {
  const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
  const results = [];
  for (const gd of plots) {
    const sliders = (gd.layout && gd.layout.sliders) || [];
    if (!sliders.length) continue;
    const steps = sliders[0].steps;
    const snapshot = () => JSON.stringify(gd.data.map(t => [t.z, t.x, t.y]));
    const before = snapshot();
    const target = steps[(sliders[0].active || 0) === steps.length - 1 ? 0 : steps.length - 1];
    try {
      // a step animates to a frame, or restyles/relayouts/updates the figure in place
      if (target.method === 'animate') {
        if (!gd._transitionData || !gd._transitionData._frames) continue;
        await window.Plotly.animate(gd, target.args[0], target.args[1]);
      } else {
        await window.Plotly[target.method](gd, ...target.args);
      }
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

# After MathJax's first typeset: text left in the article outside rendered math, code and figures,
# and the number of equations MathJax rendered as errors.
MATH_PROBE = """
async () => {
  const hasMath = document.querySelector('.math') !== null;
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) { await mj.startup.promise; }
  const loaded = !!(mj && mj.startup && mj.startup.document);
  const root = document.querySelector('article') || document.querySelector('main') || document.body;
  const skip = 'mjx-container, pre, code, script, style, .highlight, .cell_input, .js-plotly-plot, '
             + '.output.text_plain, .output.stream, .output.traceback, .sidebar-toggle';
  const texts = [];
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (el && !el.closest(skip) && n.textContent.trim()) texts.push(n.textContent);
  }
  // equations MathJax could not typeset: an error node, or an undefined macro (shown in red)
  const errors = [];
  if (loaded && mj.startup.toMML) {
    for (const item of mj.startup.document.math) {
      try {
        if (/<merror|mathcolor="red"/.test(mj.startup.toMML(item.root))) errors.push(item.math.trim());
      } catch (e) { errors.push(item.math.trim()); }
    }
  }
  return {hasMath, loaded, text: texts.join(' '), errors};
}
"""

MAP_PROBE = """
() => Array.from(document.querySelectorAll('.js-plotly-plot'))
  .map(gd => gd.layout && gd.layout.meta && gd.layout.meta.mechanism_map)
  .filter(m => m !== undefined && m !== null && m !== '')
  .map(String)
"""


# What a reader at this width sees of the page's geometry: how wide the page is (against the screen the
# check set, not window.innerWidth, which a phone's browser widens to fit a page that is too wide);
# each figure's drawing against its box; each display equation and code box against the width it has,
# and whether one that scrolls says so (scroll_hints.js sets data-scroll, custom.css fades that edge);
# equation numbers over their equation; output boxes and text outputs wider than the column or their box;
# tables that scroll and captions cut off; "(lab §n)" references left as plain text.
GEOMETRY_PROBE = """
([references]) => {
  const doc = document.documentElement;
  const pageWidth = Math.max(doc.scrollWidth, document.body.scrollWidth);
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  const column = article ? article.getBoundingClientRect() : {left: 0, right: window.innerWidth};
  const describe = el => (el.innerText || el.textContent || '').trim().split('\\n')[0].slice(0, 50);
  const visible = el => { const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; };
  // a box that scrolls sideways inside the column is fine: what is wider than the column within it
  // is reached by scrolling that box, not the page
  const scrolledWithin = el => {
    for (let a = el.parentElement; a && a !== article; a = a.parentElement) {
      const o = getComputedStyle(a).overflowX;
      const fits = a.getBoundingClientRect().right <= column.right + 2;
      if ((o === 'auto' || o === 'scroll' || o === 'hidden') && fits) return true;
    }
    return false;
  };
  const wideBoxes = [];
  const boxes = '.cell_output, .output, figure, table, .pst-scrollable-table-container';
  for (const el of document.querySelectorAll(boxes)) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > column.right + 2 && !scrolledWithin(el)) {
      wideBoxes.push(`${el.tagName.toLowerCase()} ${Math.round(r.width)} px: ` + describe(el));
    }
  }
  // a figure's drawing (its SVG layers) against the box the page gives it
  const figures = [];
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    if (!visible(gd)) continue;
    const box = gd.getBoundingClientRect();
    let w = 0, h = 0;
    for (const svg of gd.querySelectorAll('svg.main-svg')) {
      const r = svg.getBoundingClientRect();
      w = Math.max(w, r.right - box.left); h = Math.max(h, r.bottom - box.top);
    }
    figures.push({box: [Math.round(box.width), Math.round(box.height)], drawn: [Math.round(w), Math.round(h)],
                  name: (gd.closest('figure') && gd.closest('figure').id) || gd.id.slice(0, 8)});
  }
  // a box that scrolls sideways: how wide its content is, how wide the box, and its sign
  const scrolling = el => {
    const style = getComputedStyle(el);
    const mask = style.maskImage || style.webkitMaskImage || 'none';
    return {what: describe(el).slice(0, 40), content: el.scrollWidth, box: el.clientWidth,
            hinted: !!el.getAttribute('data-scroll') && mask !== 'none'};
  };
  const equations = [], overlaps = [];
  for (const div of document.querySelectorAll('div.math')) {
    if (!visible(div)) continue;
    const mj = div.querySelector('mjx-container[display="true"]') || div;
    equations.push({...scrolling(mj), what: div.id || describe(div).slice(0, 40)});
    // the equation's number over what is drawn of the equation
    const eqno = div.querySelector('.eqno');
    const math = mj.querySelector('mjx-math') || mj;
    if (eqno && math !== mj) {
      const a = eqno.getBoundingClientRect(), m = math.getBoundingClientRect(), c = mj.getBoundingClientRect();
      const left = Math.max(a.left, m.left, c.left), right = Math.min(a.right, m.right, c.right);
      const top = Math.max(a.top, m.top, c.top), bottom = Math.min(a.bottom, m.bottom, c.bottom);
      if (right - left > 1 && bottom - top > 1) overlaps.push(div.id || describe(div).slice(0, 40));
    }
  }
  const code = [];
  for (const pre of document.querySelectorAll('div.highlight pre')) if (visible(pre)) code.push(scrolling(pre));
  const hiddenText = [];
  for (const el of document.querySelectorAll('.cell_output pre, .output pre')) {
    if (visible(el) && el.scrollWidth > el.clientWidth + 2) hiddenText.push(describe(el));
  }
  // tables that scroll sideways, and captions cut off (inside a box that scrolls, or past the column)
  const tables = [], captions = [];
  for (const t of document.querySelectorAll('article table')) {
    if (!visible(t)) continue;
    const holder = t.closest('.pst-scrollable-table-container') || t;
    if (holder.scrollWidth > holder.clientWidth + 2) tables.push(describe(t).slice(0, 40));
    const cap = t.querySelector('caption');
    if (cap) {
      const r = cap.getBoundingClientRect(), h = holder.getBoundingClientRect();
      if (r.right > Math.min(h.right, column.right) + 2 || cap.scrollWidth > cap.clientWidth + 2) {
        captions.push(describe(cap).slice(0, 40));
      }
    }
  }
  // "(lab §n)", "§7's": every reference to a lab section must be a link
  const plainRefs = [];
  const walker = references && document.createTreeWalker(article || document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker && walker.nextNode(); n; n = walker.nextNode()) {
    if (/§\\s*\\d/.test(n.textContent) && !n.parentElement.closest('a, pre, code, .cell_output')) {
      plainRefs.push(n.textContent.trim().slice(0, 40));
    }
  }
  return {pageWidth, wideBoxes, figures, equations, overlaps, code, hiddenText, tables, captions, plainRefs};
}
"""

# Below this width the page is a phone's: a display equation or code box may scroll sideways inside its
# own box if it says so; above it (a laptop's 1280 px) every one fits its column.
PHONE_PX = 600


def _too_wide(boxes: list[dict], narrow: bool) -> list[dict]:
    """The boxes whose content is wider than the box: all of them on a laptop; on a phone those that
    scroll without the sign that they do."""
    return [b for b in boxes if b["content"] > b["box"] + 1 and not (narrow and b["hinted"])]


def _shown(items: list, n: int = 2) -> str:
    return " | ".join(str(i) for i in items[:n])


def layout_problems(page, width: str, first: bool) -> tuple[list[str], str]:
    """What a reader at this width would meet (see ``GEOMETRY_PROBE``), and one line of the geometry
    measured, for the log, against the width the check set (the page's viewport); unlinked references
    are checked at the first width only."""
    screen = page.viewport_size["width"]
    narrow = screen < PHONE_PX
    got = page.evaluate(GEOMETRY_PROBE, [first])
    problems = []
    if got["pageWidth"] > screen + 1:
        problems.append(f"scrolls sideways at {width} (the page is {got['pageWidth']} px wide)")
    if got["wideBoxes"]:
        problems.append(f"{len(got['wideBoxes'])} box(es) wider than the text column at {width}: "
                        + _shown(got["wideBoxes"]))
    spill = [f for f in got["figures"] if f["drawn"][0] > f["box"][0] + 2 or f["drawn"][1] > f["box"][1] + 2]
    if spill:
        problems.append(f"{len(spill)} figure(s) drawn outside their box at {width}: " + _shown(
            [f"{f['name']} draws {f['drawn'][0]}x{f['drawn'][1]} in {f['box'][0]}x{f['box'][1]} px" for f in spill]))
    for label, boxes in (("display equation(s)", got["equations"]), ("code box(es)", got["code"])):
        wide = _too_wide(boxes, narrow)
        if wide:
            how = "that scroll without a sign that they do" if narrow else "wider than the column"
            problems.append(f"{len(wide)} {label} {how} at {width}: "
                            + _shown([f"{b['what']} ({b['content']} in {b['box']} px)" for b in wide]))
    if got["overlaps"]:
        problems.append(f"{len(got['overlaps'])} equation number(s) over their equation at {width}: "
                        + _shown(got["overlaps"]))
    if got["hiddenText"]:
        problems.append(f"{len(got['hiddenText'])} output(s) wider than their box at {width} (lines must wrap): "
                        + _shown(got["hiddenText"]))
    if got["tables"] and not narrow:
        problems.append(f"{len(got['tables'])} table(s) that scroll sideways at {width}: " + _shown(got["tables"]))
    if got["captions"]:
        problems.append(f"{len(got['captions'])} caption(s) cut off at {width}: " + _shown(got["captions"]))
    if got["plainRefs"]:
        problems.append(f"{len(got['plainRefs'])} lab section reference(s) not linked: " + _shown(got["plainRefs"]))

    def widest(boxes):
        return max(boxes, key=lambda b: b["content"] - b["box"], default=None)

    parts = [f"page {got['pageWidth']}/{screen}"]
    if got["figures"]:
        parts.append("figures drawn/box " + ", ".join(f"{f['drawn'][1]}/{f['box'][1]}" for f in got["figures"]))
    for label, boxes in (("equation", got["equations"]), ("code", got["code"])):
        w = widest(boxes)
        if w:
            parts.append(f"widest {label} {w['content']}/{w['box']}")
    return problems, f"{width}: " + "; ".join(parts)


# The table of contents, as a reader reaches it: on a phone the visible ☰ opens the drawer with the
# chapters' links, and a tap beside it closes it; on a laptop ☰ hides the sidebar and shows it again.
DRAWER_STATE = """
() => {
  const modal = document.getElementById('pst-primary-sidebar-modal');
  const side = document.getElementById('pst-primary-sidebar');
  const shown = el => { if (!el) return false; const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0 && getComputedStyle(el).visibility !== 'hidden'; };
  const links = modal ? Array.from(modal.querySelectorAll('a')).filter(shown).length : 0;
  return {open: !!(modal && modal.open), links, sidebar: shown(side)};
}
"""


def drawer_problems(page, width: str, phone: bool, timeout_ms: int = 10_000) -> list[str]:
    """Whether the visible ☰ opens and closes the table of contents at this width (see ``DRAWER_STATE``);
    a state not reached within ``timeout_ms`` of the tap never comes."""
    # where the visible ☰ is (it moves when the sidebar hides): tapped or clicked there, as a finger or
    # a pointer would
    locate = """() => {
      for (const b of document.querySelectorAll('.primary-toggle')) {
        const r = b.getBoundingClientRect();
        if (r.width > 0 && r.height > 0 && getComputedStyle(b).visibility !== 'hidden') {
          return [r.left + r.width / 2, r.top + r.height / 2];
        }
      }
      return null;
    }"""
    spot = page.evaluate(locate)
    if not spot:
        return [f"no visible table-of-contents button at {width}"]

    def wait(condition: str) -> bool:
        try:
            page.wait_for_function(f"() => {{ const s = ({DRAWER_STATE})(); return {condition}; }}", timeout=timeout_ms)
            return True
        except Exception:  # noqa: BLE001 - a timeout: the state never came
            return False

    if phone:
        page.touchscreen.tap(*spot)
        if not wait("s.open && s.links > 0"):
            return [f"the table of contents does not open at {width} (tapping ☰ shows no drawer of links)"]
        size = page.viewport_size
        page.touchscreen.tap(size["width"] - 8, size["height"] // 2)       # beside the drawer
        if not wait("!s.open"):
            return [f"the table of contents does not close at {width} (a tap beside the drawer)"]
        return []
    before = page.evaluate(DRAWER_STATE)["sidebar"]
    page.mouse.click(*spot)
    if not wait(f"s.sidebar === {str(not before).lower()}"):
        return [f"☰ does not {'hide' if before else 'show'} the table of contents at {width}"]
    page.mouse.click(*page.evaluate(locate))
    if not wait(f"s.sidebar === {str(before).lower()}"):
        return [f"☰ does not bring the table of contents back at {width}"]
    return []


def console_errors(page) -> list[str]:
    """Collects what the page logs with ``console.error`` (e.g. a theme script rejecting its settings)."""
    logged: list[str] = []
    page.on("console", lambda m: m.type == "error" and logged.append(m.text))
    return logged


def _shared(path: str) -> bool:
    return path.startswith(SHARED_PREFIXES)


LAUNCH_ARGS = [
    # Software WebGL (SwiftShader): 3-D Plotly scenes draw on WebGL, as in a reader's browser. The page
    # itself is composited on the CPU (no GPU compositing through SwiftShader: the same pixels, a fifth
    # less time over the book).
    "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--disable-gpu-compositing",
    "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"]


# Every figure that restacks its panels at narrow widths (layout.meta.stack) has laid itself out for the
# width it has: book/_static/responsive_figures.js marks it data-layout="narrow" or "wide" when done.
LAID_OUT = """
() => Array.from(document.querySelectorAll('.js-plotly-plot'))
  .filter(gd => gd.layout && gd.layout.meta && gd.layout.meta.stack && gd.getBoundingClientRect().width > 0)
  .every(gd => gd.getAttribute('data-layout') === (gd.getBoundingClientRect().width < 600 ? 'narrow' : 'wide'))
"""


def _start(page, url: str) -> None:
    """Begin loading ``url`` and return once the navigation has started (the page goes on loading in its
    own renderer, so that a page's two widths load at the same time)."""
    page.goto(url, wait_until="commit", timeout=180_000)


def _finish(page, must_have: bool) -> None:
    """Wait for what a reader waits for: the page, its figures (where it has any: Plotly draws them while
    the page parses, so this returns at once unless one is late), and each figure laid out for the width.
    Waits on what the page shows, not on a clock, so that a busy machine makes the check slower, never
    wrong (a figure still not there after a minute is reported)."""
    page.wait_for_load_state("load", timeout=180_000)
    if must_have:
        with contextlib.suppress(Exception):
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
        with contextlib.suppress(Exception):
            page.wait_for_function(LAID_OUT, timeout=60_000)


def check_page(root: Path, base: str, rel: str, contexts: dict, screenshots: Path | None) -> tuple[bool, str]:
    """Every check of one page, at each width in ``WIDTHS``: (passed, the line to print)."""
    t0 = time.perf_counter()
    path = root / rel
    host = urlparse(base).netloc
    html = path.read_text(encoding="utf-8")
    want = expected_figures(html)
    must_have = rel.endswith("_lab.html") or want > 0
    page = contexts[WIDTHS[0][0]].new_page()
    errors: list[str] = []
    own: set[str] = set()          # what the page loads from the site beyond the shared assets
    outside: set[str] = set()      # hosts it loads from other than the site
    failed: set[str] = set()       # site requests that failed (404 ...)
    page.on("pageerror", lambda e: errors.append(str(e)))
    logs = [console_errors(page)]           # filled as the pages log: read at the end

    def on_response(r):
        u = urlparse(r.url)
        if u.scheme not in ("http", "https"):
            return
        if u.netloc != host:
            outside.add(u.netloc)
            return
        local = u.path.lstrip("/")
        if r.status >= 400:
            failed.add(local)
        elif local != rel and not _shared(local):
            own.add(local)

    page.on("response", on_response)
    page.on("requestfailed", lambda r: urlparse(r.url).netloc != host and outside.add(urlparse(r.url).netloc))
    # every other width's page loads while this one is checked
    others = []
    for width, viewport, mobile in WIDTHS[1:]:
        other = contexts[width].new_page()
        logs.append(console_errors(other))
        other.on("pageerror", lambda e: errors.append(str(e)))
        _start(other, f"{base}/{rel}")
        others.append((width, viewport, mobile, other))
    _start(page, f"{base}/{rel}")
    _finish(page, must_have)
    math = page.evaluate(MATH_PROBE)       # returns once MathJax has typeset the page
    drawn = page.evaluate(
        "() => Array.from(document.querySelectorAll('.js-plotly-plot'))"
        ".filter(gd => gd.querySelector('.main-svg') && gd._fullData && gd._fullData.length).length")
    maps = page.evaluate(MAP_PROBE) if drawn else []
    sliders_moved = page.evaluate(SLIDER_PROBE) if drawn else []
    weight = path.stat().st_size + sum((root / f).stat().st_size for f in own if (root / f).is_file())
    problems = []
    if must_have and drawn == 0:
        problems.append("no Plotly figure rendered")
    if drawn < want:
        problems.append(f"{drawn} of {want} embedded figures rendered")
    if not all(sliders_moved):
        problems.append(f"{sliders_moved.count(False)} slider(s) did not change their figure")
    if errors:
        shown = " | ".join(e.splitlines()[0][:160] for e in errors[:3])
        problems.append(f"{len(errors)} page error(s): {shown}")
    if failed:
        problems.append("missing from the site: " + ", ".join(sorted(failed)[:3]))
    if outside:
        problems.append("loads from outside the site: " + ", ".join(sorted(outside)))
    if math["hasMath"] and not math["loaded"]:
        problems.append("MathJax did not load")
    raw = sorted({m.group(0) for m in RAW_TEX.finditer(math["text"])})
    if raw:
        problems.append("raw TeX left on the page: " + " ".join(raw[:6]))
    if math["errors"]:
        problems.append(f"{len(math['errors'])} equation(s) MathJax could not typeset: "
                        + " | ".join(e[:60] for e in math["errors"][:3]))
    if dead_widgets(html):
        problems.append(f"{dead_widgets(html)} ipywidgets output(s)/state, dead without a kernel")
    if weight > MAX_PAGE_BYTES:
        problems.append(f"page weighs {weight / 1e6:.1f} MB (HTML and its own assets; at most "
                        f"{MAX_PAGE_BYTES / 1e6:.1f} MB)")
    if rel in MECHANISM_MAP_PAGES and not maps:
        problems.append("no mechanism map (a figure with layout.meta.mechanism_map)")
    found, geometry = layout_problems(page, WIDTHS[0][0], first=True)
    problems += found + drawer_problems(page, WIDTHS[0][0], phone=WIDTHS[0][2])
    for width, viewport, mobile, narrow in others:
        _finish(narrow, must_have)
        narrow.evaluate(MATH_PROBE)
        found, line = layout_problems(narrow, width, first=False)
        problems += found
        geometry += "\n      " + line
        if screenshots:
            screenshots.mkdir(parents=True, exist_ok=True)
            narrow.screenshot(path=str(screenshots / (rel.replace("/", "_") + f".{viewport['width']}.png")))
        problems += drawer_problems(narrow, width, phone=mobile)
        narrow.close()
    logged = [m for log in logs for m in log]
    if logged:
        shown = " | ".join(m[:120] for m in sorted(set(logged))[:3])
        problems.append(f"{len(logged)} console error(s): {shown}")
    if screenshots:
        screenshots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshots / (rel.replace("/", "_") + ".png")), full_page=False)
    page.close()
    status = "FAIL" if problems else "ok"
    line = (f"{status:4}  {rel}: {drawn} figure(s) rendered, {len(sliders_moved)} slider(s) moved, "
            f"{weight / 1e6:.2f} MB" + (f", map: {', '.join(maps)}" if maps else "")
            + f", {time.perf_counter() - t0:.1f} s" + ("" if not problems else "  -- " + "; ".join(problems))
            + "\n      " + geometry)
    return not problems, line


def check_pages(root: Path, base: str, rels: list[str], screenshots: Path | None, browser_exe: str | None,
                out=None) -> list[tuple[str, bool, str]]:
    """Check ``rels`` in one Chromium, one page after another: (page, passed, line) each. One browser
    context per width, kept for every page, so the scripts all pages share (plotly.js, MathJax) come
    from its cache after the first page, as they would for a reader moving between pages."""
    from playwright.sync_api import sync_playwright

    results = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_exe, args=LAUNCH_ARGS)
        contexts = {width: browser.new_context(viewport=viewport, is_mobile=mobile, has_touch=mobile,
                                               device_scale_factor=2 if mobile else 1)
                    for width, viewport, mobile in WIDTHS}
        for rel in rels:
            passed, line = check_page(root, base, rel, contexts, screenshots)
            results.append((rel, passed, line))
            if out is not None:
                print(line, file=out, flush=True)
        browser.close()
    return results


def _worker(args) -> list[tuple[str, bool, str]]:
    root, base, rels, screenshots, browser_exe = args
    return check_pages(root, base, rels, screenshots, browser_exe)


def check(root: Path, screenshots: Path | None, browser_exe: str | None, only: str = "", jobs: int = 1) -> int:
    """Check every page (whose path contains ``only``); the number that failed. ``jobs`` > 1: that many
    Chromiums, each with its share of the pages (the costliest, by HTML size, dealt out first), in
    processes of their own; the lines are printed in page order when all are done."""
    rels = [p.relative_to(root).as_posix() for p in pages(root)]
    rels = [r for r in rels if only in r]
    with serve(root) as base:
        if jobs <= 1 or len(rels) < 2:
            results = check_pages(root, base, rels, screenshots, browser_exe, out=sys.stdout)
        else:
            import multiprocessing

            by_cost = sorted(rels, key=lambda r: -(root / r).stat().st_size)
            shares = [by_cost[i::jobs] for i in range(jobs)]
            with multiprocessing.get_context("spawn").Pool(jobs) as pool:
                results = [r for part in pool.map(_worker, [(root, base, share, screenshots, browser_exe)
                                                            for share in shares if share]) for r in part]
            order = {rel: i for i, rel in enumerate(rels)}
            for _, _, line in sorted(results, key=lambda r: order[r[0]]):
                print(line, flush=True)
    return sum(not passed for _, passed, _ in results)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, nargs="?", default=Path("_build/html"))
    ap.add_argument("--screenshots", type=Path, default=None)
    ap.add_argument("--only", default="", help="check only the pages whose path contains this text")
    ap.add_argument("--jobs", type=int, default=1, help="Chromiums at a time, each checking its share of the pages")
    ap.add_argument("--install-browser", action="store_true",
                    help="find a Chromium, installing one when missing, and exit")
    args = ap.parse_args()
    if args.install_browser:
        return install_browser()
    if not (args.root / "index.html").exists():
        print(f"no built book at {args.root} (run `make book` first)", file=sys.stderr)
        return 2
    if not pages(args.root):
        print(f"no chapter pages under {args.root}", file=sys.stderr)
        return 2
    exe = find_browser()
    if exe is None:
        print(f"browser check: no Chromium found; run: {INSTALL_HINT}", file=sys.stderr)
        return 2
    failures = check(args.root, args.screenshots, exe, args.only, max(1, args.jobs))
    checked = sum(args.only in p.relative_to(args.root).as_posix() for p in pages(args.root))
    print(f"browser check: {checked - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
