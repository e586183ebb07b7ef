"""What every lab notebook's first cells need: seeds, device, quick/full scale, figure rendering.

    from attnbook.lab import setup
    lab = setup(seed=0)          # lab.device, lab.quick, lab.scale(small, large), lab.triton_kernels
    lab.check("Newton's method lands on softmax", err < 1e-8, f"max error {err:.1e}")  # ✓ on the page

Three marks, so that the reader can tell what a line is worth (all three validate the condition
alike and raise :class:`LabCheckFailed` when it is false):

* ``lab.check`` prints ✓: a verification. Something *independent* agreed with the claim: a definition
  written out in the lab, a closed form, another algorithm, solver or library (autograd, SciPy, POT, a
  FLOP counter), or a measured quantity held to a margin it could miss. Never a function against
  itself.
* ``lab.identity`` prints ≡: an identity, a definition or a theorem re-checked on this data (a bound
  or an equality that holds for every input, a derivative re-checked by autograd), or a property true
  by construction (rows normalised, ``exp`` positive, a mask's zeros), or a function against itself in
  another form (its causal run against its own non-causal runs). It can only fail if the code is broken.
* ``lab.illustrate`` prints ◦: worked numbers. Arithmetic on typed or committed numbers, a reading of
  a figure or of a committed result file, or an example that shows a claim on this data where it
  could hardly fail (a near-certain property of random data).

Quick mode (the default on a CPU: CI's 2 cores must run each notebook in about a minute) shrinks
the experiments; on a GPU, or with ``ATTNBOOK_FULL=1``, they run at full scale.

Every random choice in a lab flows from ``lab.seed``: ``lab.generator(offset)`` for tensors,
``lab.seeds(n)`` for experiments repeated over several seeds. ``ATTNBOOK_SEED=<int>`` in the
environment overrides the seed a notebook passes to :func:`setup`, so ``scripts/check_seeds.py`` can
run every lab over seeds 0-4 without editing it; CI leaves it unset (seed 0).
"""

from __future__ import annotations

import os
import random
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import torch

# The characters an output box shows without scrolling on a laptop (about 80 at 1280 px): check lines
# are wrapped to it, and the labs print their own lines within it.
OUTPUT_WIDTH = 80
# The characters a code box shows at 1280 px (13-px monospace, book/_static/custom.css): every line of code
# a reader's page shows -- a lab's cells, an exercise's stub and solution, a chapter's listing -- fits it.
CODE_WIDTH = 80


def wrap_mark(mark: str, claim: str, detail: str = "") -> str:
    """``mark claim  (detail)`` on one line when it fits in ``OUTPUT_WIDTH`` characters; otherwise the
    claim, then ``(detail)`` on the lines below it, indented under the claim, every line within the
    width, so that the measured numbers are never behind a scroll bar."""
    one_line = f"{mark} {claim}  ({detail})" if detail else f"{mark} {claim}"
    if len(one_line) <= OUTPUT_WIDTH:
        return one_line
    first = textwrap.wrap(f"{mark} {claim}", OUTPUT_WIDTH, subsequent_indent="  ",
                          break_on_hyphens=False)
    if detail:
        first += textwrap.wrap(f"({detail})", OUTPUT_WIDTH, initial_indent="  ", subsequent_indent="   ",
                               break_on_hyphens=False)
    return "\n".join(first)


class LabCheckFailed(AssertionError):
    """A lab's claim did not hold: the message names the claim and the numbers measured."""


@dataclass(frozen=True)
class Lab:
    seed: int
    device: torch.device
    quick: bool
    on_colab: bool
    triton_kernels: bool = False    # the Triton kernels run compiled here (a GPU of capability >= 8.0)

    def __repr__(self) -> str:
        where = "Colab, " if self.on_colab else ""
        kernels = "Triton kernels compiled" if self.triton_kernels else "no compiled Triton kernels"
        scale = "quick scale" if self.quick else "full scale"
        return f"Lab: seed {self.seed}, {where}{self.device.type}, {scale}, {kernels}"

    def scale(self, quick, full):
        """Pick the quick-mode value or the full-scale one."""
        return quick if self.quick else full

    def generator(self, offset: int = 0) -> torch.Generator:
        """A CPU generator seeded from the lab's seed (``offset`` gives independent streams)."""
        return torch.Generator().manual_seed(self.derive(offset))

    def derive(self, offset: int = 0) -> int:
        """An integer seed for a library function's ``seed=`` argument, derived from the lab's seed
        (distinct offsets give distinct seeds; distinct lab seeds give disjoint ranges)."""
        return self.seed * 100_003 + offset

    def check(self, claim: str, condition, detail: str = "", *, against: str = "") -> None:
        """A claim the page verifies against something independent, shown to the reader: prints
        ``✓ claim  (detail)`` when ``condition`` holds and raises :class:`LabCheckFailed` with the same
        text when it does not.

        Use it only when the condition compares the claim with something that does not share its code
        or its derivation: a definition written out in the lab, a closed form, another algorithm or
        library, or a measurement held to a margin it could miss. An identity, a definition or a
        theorem re-checked on this data, or a property true by construction, is :meth:`identity` (≡);
        arithmetic on typed or committed numbers, a reading of a figure or of a committed result file,
        or a near-certain example is :meth:`illustrate` (◦).

        ``detail`` carries the measured numbers (and the margin they are held to), so the page shows
        what was verified and by how much, not only that it passed. ``condition`` may be a Python or
        NumPy bool, or a one-element tensor.

        ``against`` names the independent thing when the code does not show it: when both sides of the
        comparison come out of the library (one function's result, or one module's formulas, as a
        measurement and the model it is held to often do), say what was measured, for instance
        "torch's FLOP counter on the references". It is printed after the detail, and the labs' test
        (``tests/test_lab_checks.py``) requires it wherever both sides trace to one library module."""
        if not isinstance(against, str):
            raise TypeError(f"check {claim!r}: against must be a str; got {type(against).__name__}")
        if against:
            detail = f"{detail}; against {against}" if detail else f"against {against}"
        self._mark("✓", "check", claim, condition, detail)

    def identity(self, claim: str, condition, detail: str = "") -> None:
        """An identity, a definition or a theorem re-checked on this data, or a property true by
        construction: prints ``≡ claim  (detail)``; raises :class:`LabCheckFailed` when ``condition``
        is false (which only broken code can make it), validating it as :meth:`check` does."""
        self._mark("≡", "identity", claim, condition, detail)

    def illustrate(self, claim: str, condition, detail: str = "") -> None:
        """Worked numbers: arithmetic on typed or committed numbers, a reading of a figure or of a
        committed result file, or an example that could hardly fail. Prints ``◦ claim  (detail)``;
        raises :class:`LabCheckFailed` when ``condition`` is false, validating it as :meth:`check`
        does."""
        self._mark("◦", "illustrate", claim, condition, detail)

    @staticmethod
    def _mark(mark: str, kind: str, claim: str, condition, detail: str) -> None:
        """The one implementation behind :meth:`check`, :meth:`identity` and :meth:`illustrate`."""
        if not isinstance(claim, str) or not claim:
            raise TypeError(f"{kind}: claim must be a non-empty str; got {claim!r}")
        if hasattr(condition, "item"):
            if getattr(condition, "numel", lambda: getattr(condition, "size", 1))() != 1:
                raise ValueError(f"{kind} {claim!r}: condition must be a single truth value; "
                                 f"got an array of shape {tuple(condition.shape)}")
            condition = condition.item()
        if not isinstance(condition, (bool, np.bool_)):
            raise TypeError(f"{kind} {claim!r}: condition must be a bool; got {type(condition).__name__}")
        if not condition:
            raise LabCheckFailed(wrap_mark("✗", claim, detail))
        print(wrap_mark(mark, claim, detail))

    def glue(self, name: str, value) -> None:
        """Hand a number or text to the chapter page (myst-nb's ``glue``; the page writes
        ``{glue:text}`notebooks/NN_lab.ipynb::name:.2f```). Shows nothing in the notebook; does
        nothing where myst-nb is not installed (e.g. Colab), since there is no page to paste into.
        NumPy and torch scalars are passed as Python numbers, so that a format such as ``:.3f`` applies."""
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        _glue(name, value)

    def glue_figure(self, name: str, fig) -> None:
        """Hand a Plotly figure to the chapter page (``{glue} name`` with ``:doc:``). It travels as
        HTML with precomputed sliders, the form Jupyter Book 1 renders (Plotly's own JSON mime type
        would be dropped), and draws with the plotly.js that the book serves once for every page."""
        _glue(name, _PageFigure(fig))

    def result_file(self, relpath: str):
        """A committed result file (e.g. ``benchmarks/results/x.json``) as parsed JSON, or None.

        Looked up from the working directory upwards (a clone: the notebook runs in ``notebooks/``);
        on Colab, where only the packages are installed, fetched from the repository
        (:func:`attnbook.experiments._committed.committed_file`). None when neither works, so a lab can
        say what it could not show."""
        import json

        from .experiments._committed import committed_file

        found = committed_file(relpath, download=self.on_colab)
        return json.loads(found.read_text()) if found else None

    def run(self, name: str, experiment, /, **params) -> dict:
        """``experiment(**params)``: an experiment that trains for minutes (a function of the library that
        returns plain numbers). At full scale it runs. In quick mode it may read its committed run
        instead (``attnbook.lab_runs``: the same function of the same code with the same
        parameters, so the same numbers), and says so; ``ATTNBOOK_RUNS`` chooses (``read``, the default;
        ``require`` in ``make test``; ``write``; ``live``)."""
        from . import lab_runs

        mode = lab_runs.mode() if self.quick else "live"
        if mode in ("read", "require"):
            run = lab_runs.committed(name)
            why = lab_runs.why_not(name, experiment, params, run)
            if not why:
                print(textwrap.fill(f"(read from {lab_runs.shown(name)}: this code's run with these parameters, made "
                                    f"{run['date'][:10]} in {run['seconds']:.0f} s on a CPU; "
                                    f"ATTNBOOK_RUNS=live runs it here)", OUTPUT_WIDTH))
                return run["result"]
            if mode == "require":
                raise LabCheckFailed(f"the committed run {name!r} is not of this code: {'; '.join(why)}. "
                                     f"Make it with `{lab_runs.REMAKE}` (or `make artifacts`; a new run or new "
                                     f"parameters: run the lab once with ATTNBOOK_RUNS=write) and commit it.")
        result = lab_runs.execute(name, experiment, params, write=mode == "write" and self.quick)
        return lab_runs.plain(result)                  # as a committed run reads back (tuples as lists)

    def seeds(self, n: int, offset: int = 0) -> list[int]:
        """``n`` seeds for an experiment repeated over seeds (mean and spread), derived from the lab's."""
        return [self.derive(offset + i) for i in range(n)]


def _glue(name: str, value) -> None:
    try:
        from myst_nb import glue
    except ImportError:  # no book build here: nothing to paste into
        return
    glue(name, value, display=False)


def in_colab() -> bool:
    return "google.colab" in sys.modules


def figure_html(fig, default_height="100%") -> str:
    """A figure as an HTML fragment for the built book: its data, layout and precomputed slider
    frames, drawn by the ``Plotly`` the page already has (the book serves plotly.js once, in
    ``_static/plotly.min.js``). No plotly.js and no MathJax inlined: a second MathJax beside the
    page's own would break its math, and 4.8 MB of plotly.js per figure would make every page heavy."""
    import plotly.io as pio

    return pio.to_html(fig, full_html=False, include_plotlyjs=False, include_mathjax=False,
                       auto_play=False, default_width="100%", default_height=default_height, validate=False)


class _PageFigure:
    """A figure that displays as :func:`figure_html` (what ``glue_figure`` hands to myst-nb)."""

    def __init__(self, fig):
        self.fig = fig

    def _repr_html_(self) -> str:
        return figure_html(self.fig)

    def __repr__(self) -> str:
        return "<Plotly figure>"


def _register_page_renderer() -> None:
    """Plotly renderer ``page``: the figure as :func:`figure_html` (``text/html``)."""
    import plotly.io as pio
    from plotly.io._base_renderers import MimetypeRenderer

    class PageRenderer(MimetypeRenderer):
        def to_mimebundle(self, fig_dict):
            return {"text/html": figure_html(fig_dict, default_height=525)}   # plotly's own HTML default

    if "page" not in pio.renderers:
        pio.renderers["page"] = PageRenderer()


def configure_plotly() -> None:
    """Make Plotly figures show up both in live kernels and in the built book.

    Each figure is emitted twice, in one output: Plotly's own JSON mime type, which JupyterLab,
    Notebook 7 and VS Code draw (plotly 6+ supports no older frontend), and an HTML fragment
    (renderer ``page``, :func:`figure_html`) for the built book, where Jupyter Book 1 drops the JSON
    mime type and the page's shared plotly.js draws the fragment. Colab has its own renderer, which
    plotly picks by itself. ``PLOTLY_RENDERER`` in the environment overrides the choice.
    """
    import plotly.io as pio

    if in_colab():
        return
    _register_page_renderer()
    pio.renderers.default = os.environ.get("PLOTLY_RENDERER", "plotly_mimetype+page")


def quiet_notebook_progress_bars() -> None:
    """Make tqdm's notebook bars honour ``TQDM_DISABLE`` as its plain bars do.

    ``tqdm.notebook`` (what ``tqdm.auto`` picks in a kernel) passes ``disable=False`` to its parent
    itself, so the variable is ignored and a lab executed for the book (the Makefile sets it) leaves an
    ipywidgets bar in the page, dead without a kernel. A reader's own run keeps its bars."""
    if os.environ.get("TQDM_DISABLE", "").strip().lower() in ("", "0", "false", "no"):
        return
    try:
        from tqdm import notebook
    except ImportError:  # tqdm without ipywidgets: no notebook bars to silence
        return
    cls = notebook.tqdm_notebook
    if getattr(cls, "_honours_tqdm_disable", False):
        return
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    cls._honours_tqdm_disable = True


def seed_from_env(seed: int) -> int:
    """``ATTNBOOK_SEED`` when set (the seed-check script sets it), else ``seed``."""
    raw = os.environ.get("ATTNBOOK_SEED", "").strip()
    if not raw:
        return seed
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"ATTNBOOK_SEED must be an integer; got {raw!r}") from None


def setup(seed: int = 0) -> Lab:
    """Seed python, numpy and torch; pick the device and the scale; configure Plotly."""
    seed = seed_from_env(seed)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - notebooks may use the legacy global generator
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    quick = device.type == "cpu" and os.environ.get("ATTNBOOK_FULL", "0") != "1"
    if quick and "OMP_NUM_THREADS" not in os.environ:
        # Quick mode's tensors are small, and torch's intra-op threads wait on each other: with one
        # core taken by another process, every op stalls on the thread that was descheduled (a 30 s lab
        # can take many minutes). One thread loses little when the machine is idle.
        torch.set_num_threads(1)
    colab = in_colab()
    if colab:  # plotly's FigureWidget is an anywidget: Colab needs its custom widget manager
        try:
            from google.colab import output  # type: ignore[import-not-found]
            output.enable_custom_widget_manager()
        except Exception:  # noqa: BLE001 - a missing manager only costs the live widgets
            pass
    configure_plotly()
    quiet_notebook_progress_bars()
    torch.set_printoptions(precision=4, sci_mode=False)
    return Lab(seed=seed, device=device, quick=quick, on_colab=colab, triton_kernels=_kernels_run_on(device))


def _kernels_run_on(device: torch.device) -> bool:
    """Whether ``backend="auto"`` takes the Triton kernels on ``device`` (the library's one rule: a CUDA
    GPU of capability 8.0 or newer, with triton installed). On a T4 it does not: the labs then check
    the kernels through Triton's interpreter, or say that they did not."""
    from attnlib._backend import cuda_capability, too_old, triton_installed

    return device.type == "cuda" and triton_installed() and too_old(cuda_capability(device)) is None
