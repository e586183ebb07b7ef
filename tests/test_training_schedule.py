"""The shared learning-rate schedule (attnbook.experiments._training): linear warm-up, cosine to 0."""

import math

import pytest
import torch

from attnbook.experiments._training import warmup_cosine, warmup_cosine_factor


def test_warmup_is_linear_and_the_cosine_reaches_the_floor():
    steps, warmup = 200, 20
    f = [warmup_cosine_factor(s, steps, warmup) for s in range(steps + 5)]
    cos = [0.5 * (1 + math.cos(math.pi * s / steps)) for s in range(steps + 1)]
    assert f[0] == pytest.approx(1 / warmup)                                  # the first step is not a zero step
    for s in range(warmup):                                                   # linear ramp times the cosine
        assert f[s] == pytest.approx((s + 1) / warmup * cos[s], rel=1e-12)
    for s in range(warmup, steps + 1):                                        # then the cosine alone
        assert f[s] == pytest.approx(cos[s], rel=1e-12, abs=1e-15)
    assert max(f) == pytest.approx(cos[warmup - 1], rel=1e-12)                # the peak: end of the warm-up
    assert f[steps // 2] == pytest.approx(0.5, abs=1e-12)                     # half-way down at mid-run
    assert all(v == pytest.approx(0.0, abs=1e-15) for v in f[steps:])         # the floor, and it stays there
    assert all(a >= b for a, b in zip(f[warmup - 1:], f[warmup:]))            # monotone after the peak


@pytest.mark.parametrize("steps,warmup", [(200, 20), (40, 4), (7, 1)])
def test_the_scheduler_applies_the_factor_as_the_loops_had_it(steps, warmup):
    """mqar (warm-up 20) and grassmann (warm-up steps // 10) had this lambda written out; same numbers."""
    base = 3e-3
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base)
    sched = warmup_cosine(opt, steps, warmup)
    old = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))  # noqa: E731
    for s in range(steps + 2):
        assert opt.param_groups[0]["lr"] == base * old(s)                    # bit for bit
        opt.step()
        sched.step()


def test_rejects_an_empty_schedule():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match="at least 1"):
        warmup_cosine(opt, 0, 1)
