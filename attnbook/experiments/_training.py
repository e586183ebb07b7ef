"""The book's one training loop (:func:`train_loop`), and the learning-rate schedule it is mostly run with:
linear warm-up, then cosine decay.

``lr(s) = base_lr * min(1, (s + 1) / warmup) * (1 + cos(pi * min(s, steps) / steps)) / 2`` for the
optimiser step ``s = 0, 1, ...``: the first step already takes ``base_lr / warmup`` (never a zero
step), the rate reaches ``base_lr`` at step ``warmup - 1`` (less the little the cosine has taken off
by then) and decays to 0 at step ``steps``, where it stays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

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


def train_loop(step_loss: Callable[[int], torch.Tensor], opt: torch.optim.Optimizer, steps: int, *,
               sched=None, clip: float | None = None, after_step: Callable[[int, torch.Tensor], None] | None = None,
               progress: Callable[[Iterable], Iterable] | None = None) -> torch.Tensor:
    """Every model the labs train, trained the same way: for ``step = 0 .. steps - 1``, the loss
    ``step_loss(step)`` (the step's batch is drawn inside it, so each experiment keeps its own data
    stream), its gradient, the gradient norm clipped to ``clip`` (None: not clipped) over the
    parameters ``opt`` updates, ``opt.step()``, ``sched.step()`` (None: a constant rate), then
    ``after_step(step, loss)`` (a probe, a curve). ``progress`` wraps the steps (a tqdm). Returns the
    last step's loss (NaN when ``steps`` is 0)."""
    params = [p for group in opt.param_groups for p in group["params"]]
    loss = torch.tensor(float("nan"))
    for step in range(steps) if progress is None else progress(range(steps)):
        loss = step_loss(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if sched is not None:
            sched.step()
        if after_step is not None:
            after_step(step, loss)
    return loss
