"""The labs' common set-up: seeding, quick mode on CPU, and a renderer the built book can show."""

import plotly.io as pio
import torch

from attnlib.lab import setup


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
    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    setup(seed=0)
    assert "notebook" in pio.renderers.default
    assert pio.renderers["notebook"].auto_play is False   # frames are slider steps, not a movie
