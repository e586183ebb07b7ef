"""The learning-rate schedule the hand-written training loops share: linear warm-up, then cosine decay.

``lr(s) = base_lr * min(1, (s + 1) / warmup) * (1 + cos(pi * min(s, steps) / steps)) / 2`` for the
optimiser step ``s = 0, 1, ...``: the first step already takes ``base_lr / warmup`` (never a zero
step), the rate reaches ``base_lr`` at step ``warmup - 1`` (less the little the cosine has taken off
by then) and decays to 0 at step ``steps``, where it stays.
"""

from __future__ import annotations

import math

import torch


def warmup_cosine_factor(step: int, steps: int, warmup: int) -> float:
    """The multiplier of the base learning rate at optimiser step ``step`` (see the module docstring)."""
    return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


def warmup_cosine(opt: torch.optim.Optimizer, steps: int, warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler for ``opt`` that applies :func:`warmup_cosine_factor`; call its ``step()`` after
    every ``opt.step()``."""
    if steps < 1 or warmup < 1:
        raise ValueError(f"steps and warmup must be at least 1; got steps={steps}, warmup={warmup}")
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine_factor(s, steps, warmup))
