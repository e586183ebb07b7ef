"""The labs' common set-up: seeding, quick mode on CPU, and a renderer the built book can show."""

import numpy as np
import plotly.io as pio
import pytest
import torch

from attnbook.lab import OUTPUT_WIDTH, LabCheckFailed, setup


def test_setup_seeds_and_picks_quick_mode_on_cpu(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_FULL", raising=False)
    lab = setup(seed=3)
    a = torch.randn(3)
    setup(seed=3)
    assert torch.equal(a, torch.randn(3))
    if not torch.cuda.is_available():
        assert lab.quick and lab.scale(1, 2) == 1
    monkeypatch.setenv("ATTNBOOK_FULL", "1")
    assert not setup(seed=0).quick


def test_setup_uses_a_renderer_that_emits_html_for_the_book(monkeypatch):
    """Figures reach the page as HTML drawn by the page's shared plotly.js (no plotly.js, no second
    MathJax inlined), and reach JupyterLab/Notebook 7 as plotly's own JSON mime type."""
    import plotly.graph_objects as go

    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    setup(seed=0)
    assert pio.renderers.default == "plotly_mimetype+page"
    fig = go.Figure(go.Scatter(y=[1, 2]), frames=[go.Frame(data=[go.Scatter(y=[2, 1])])])
    bundle = pio.renderers._build_mime_bundle(fig.to_dict())   # what fig.show() displays
    assert set(bundle) >= {"application/vnd.plotly.v1+json", "text/html"}
    html = bundle["text/html"]
    assert "Plotly.newPlot(" in html and len(html) < 20_000                # the figure, not plotly.js
    assert "MathJax" not in html and "<script src" not in html
    assert "Plotly.animate" not in html                                      # frames are slider steps


def test_glued_figures_carry_no_plotly_js(monkeypatch):
    import plotly.graph_objects as go
    from IPython.core.formatters import format_display_data

    from attnbook.lab import _PageFigure

    data, _ = format_display_data(_PageFigure(go.Figure(go.Scatter(y=[1, 2]))))
    html = data["text/html"]
    assert "Plotly.newPlot(" in html and len(html) < 20_000
    assert "MathJax" not in html and "<script src" not in html


def test_the_seed_comes_from_ATTNBOOK_SEED_when_set(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_SEED", raising=False)
    assert setup(seed=0).seed == 0
    monkeypatch.setenv("ATTNBOOK_SEED", "3")
    lab = setup(seed=0)
    assert lab.seed == 3
    assert torch.equal(torch.randn(2, generator=lab.generator(1)),
                       torch.randn(2, generator=torch.Generator().manual_seed(lab.derive(1))))
    monkeypatch.setenv("ATTNBOOK_SEED", "x")
    with pytest.raises(ValueError, match="ATTNBOOK_SEED must be an integer"):
        setup(seed=0)


def test_derived_seeds_are_distinct_across_offsets_and_lab_seeds(monkeypatch):
    monkeypatch.delenv("ATTNBOOK_SEED", raising=False)
    a, b = setup(seed=0), setup(seed=1)
    assert len(set(a.seeds(5)) | set(b.seeds(5))) == 10
    assert a.derive(0) != a.derive(1)


def test_notebooks_executed_by_make_show_no_progress_bars():
    """The Makefile runs notebooks (the labs run, the book build) with TQDM_DISABLE=1, which the installed
    tqdm honours: the built pages carry no "100% 8/8" bars, while a reader's own run keeps them."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    make = Path(__file__).resolve().parents[1].joinpath("Makefile").read_text()
    assert re.search(r"^NB_ENV\s*:=.*\bTQDM_DISABLE=1\b", make, re.M)
    for command in ("jupyter-book build", "scripts/execute_labs.py", "--nbval-lax"):
        lines = [ln for ln in make.splitlines() if command in ln]
        assert lines and all("$(NB_ENV)" in ln for ln in lines), command
    check = "from tqdm.auto import tqdm; import sys; sys.exit(0 if tqdm(range(2), file=sys.stdout).disable else 1)"
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    assert subprocess.run([sys.executable, "-c", check], env={**env, "TQDM_DISABLE": "1"},
                          capture_output=True).returncode == 0
    assert subprocess.run([sys.executable, "-c", check], env=env, capture_output=True).returncode == 1


def test_notebook_progress_bars_honour_TQDM_DISABLE(monkeypatch):
    """tqdm.notebook ignores TQDM_DISABLE by itself; after setup() it does not (no widget in the page)."""
    from tqdm.notebook import tqdm as notebook_tqdm

    monkeypatch.setenv("TQDM_DISABLE", "1")
    setup(seed=0)
    assert notebook_tqdm(range(2)).disable


def test_check_prints_the_claim_and_its_numbers_when_it_holds(capsys):
    lab = setup(seed=0)
    lab.check("rows sum to one", torch.tensor(1e-13) < 1e-12, "max error 1.0e-13")
    assert capsys.readouterr().out == "✓ rows sum to one  (max error 1.0e-13)\n"


def test_check_names_the_independent_thing_after_its_numbers(capsys):
    lab = setup(seed=0)
    lab.check("model = count", True, "3072 FLOPs", against="torch's FLOP counter")
    lab.check("model = count", True, against="torch's FLOP counter")
    assert capsys.readouterr().out == ("✓ model = count  (3072 FLOPs; against torch's FLOP counter)\n"
                                       "✓ model = count  (against torch's FLOP counter)\n")
    with pytest.raises(TypeError, match="against must be a str"):
        lab.check("model = count", True, against=1)


def test_check_raises_with_the_numbers_when_the_claim_fails():
    lab = setup(seed=0)
    with pytest.raises(LabCheckFailed, match=r"✗ error below 0.1  \(measured 0.3\)"):
        lab.check("error below 0.1", 0.3 < 0.1, "measured 0.3")
    with pytest.raises(AssertionError):  # nbval and plain pytest see an ordinary failed assert
        lab.check("false", False)


def test_a_long_check_wraps_within_the_output_width_and_keeps_every_word(capsys):
    """A check line wider than an output box shows (``OUTPUT_WIDTH``) is wrapped: the claim, then its
    numbers on indented lines below, no line wider than the box, no word lost or split."""
    lab = setup(seed=0)
    claim = "the chunkwise kernel matches the float64 recurrence on every odd shape we tried here"
    detail = "max relative RMS error 3.1e-07 at T = 37, D = 24, over 5 seeds; allowed 1e-05 for fp32 inputs"
    lab.check(claim, True, detail)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 1 and all(len(line) <= OUTPUT_WIDTH for line in lines)
    assert lines[0].startswith("✓ the chunkwise") and all(line.startswith("  ") for line in lines[1:])
    assert " ".join(" ".join(lines).split()) == f"✓ {claim} ({detail})"
    with pytest.raises(LabCheckFailed) as failed:
        lab.check(claim, False, detail)
    assert all(len(line) <= OUTPUT_WIDTH for line in str(failed.value).splitlines())


def test_the_lab_prints_itself_within_the_output_width():
    assert len(repr(setup(seed=0))) <= OUTPUT_WIDTH


def test_check_refuses_what_is_not_one_truth_value():
    lab = setup(seed=0)
    with pytest.raises(ValueError, match="single truth value"):
        lab.check("all close", torch.ones(3) > 0)
    with pytest.raises(TypeError, match="must be a bool"):
        lab.check("a number is not a claim", 0.5)
    with pytest.raises(TypeError, match="non-empty str"):
        lab.check("", True)


@pytest.mark.parametrize("mark, name", [("✓", "check"), ("≡", "identity"), ("◦", "illustrate")])
def test_each_mark_prints_its_sign_and_raises_as_check_does(capsys, mark, name):
    """check (a verification), identity (≡) and illustrate (◦) print different marks, so the reader can
    tell them apart, and validate and fail alike."""
    lab = setup(seed=0)
    say = getattr(lab, name)
    say("a claim", torch.tensor(1e-13) < 1e-12, "max error 1.0e-13")
    say("no detail", np.bool_(True))
    assert capsys.readouterr().out == f"{mark} a claim  (max error 1.0e-13)\n{mark} no detail\n"
    with pytest.raises(LabCheckFailed, match=r"✗ error below 0.1  \(measured 0.3\)"):
        say("error below 0.1", 0.3 < 0.1, "measured 0.3")
    with pytest.raises(AssertionError):
        say("false", False)
    assert capsys.readouterr().out == ""                    # a failed claim prints no mark
    with pytest.raises(ValueError, match="single truth value"):
        say("all close", torch.ones(3) > 0)
    with pytest.raises(TypeError, match="must be a bool"):
        say("a number is not a claim", 0.5)
    with pytest.raises(TypeError, match="non-empty str"):
        say("", True)


def test_the_three_marks_are_distinct(capsys):
    lab = setup(seed=0)
    for name in ("check", "identity", "illustrate"):
        getattr(lab, name)("c", True)
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["✓", "≡", "◦"]


def test_lab_glue_is_silent_in_the_notebook(capsys):
    from attnbook.lab import setup
    lab = setup(seed=0)
    lab.glue("x", 1.5)
    import plotly.graph_objects as go
    lab.glue_figure("f", go.Figure(go.Scatter(y=[1, 2])))
    assert capsys.readouterr().out == ""
