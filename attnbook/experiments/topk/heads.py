"""One selection for every head: a layer's heads on the planted task, sharing part of their plan
(:func:`head_plans`), and what one selection shared by all of them costs each head
(:func:`shared_selection_loss`)."""

from __future__ import annotations

import torch

from attnlib import _validate
from attnlib.topk import selection_mask, topk_select

from ._common import _check_generator
from .task import planted_task


def head_plans(batch: int, T: int, n_heads: int, *, common: float, generator: torch.Generator,
               **task) -> torch.Tensor:
    """``[batch, n_heads, T, T]`` causal attention rows for a layer of ``n_heads`` heads on the planted task:
    each head's row is ``common * P_c + (1 - common) * P_h``, a convex mixture (so still a plan) of one
    plan shared by all heads and the head's own, each drawn by :func:`planted_task` (``task``: its keyword
    arguments). ``common = 1``: identical heads; ``common = 0``: heads that attend to unrelated needles."""
    g = _check_generator(generator)
    n_heads = _validate.check_int("n_heads", n_heads, lo=1)
    if not (isinstance(common, (int, float)) and not isinstance(common, bool) and 0 <= common <= 1):
        raise ValueError(f"common must be a number in [0, 1] (the share of each head's plan common to all heads); "
                         f"got {common!r}")
    shared = planted_task(batch, T, generator=g, **task).plan                       # [B, 1, T, T]
    own = torch.cat([planted_task(batch, T, generator=g, **task).plan for _ in range(n_heads)], dim=1)
    return common * shared + (1 - common) * own


def shared_selection_loss(plans: torch.Tensor, ks, *, first_row: int = 0) -> dict[str, list[float]]:
    """What one selection shared by all heads costs each head. ``plans [B, H, T, T]``: each head's causal
    attention rows. The shared selection is the top-``k`` of the head-averaged plan -- the best any single
    selection can do for the average, and what an indexer trained on the head-summed distribution (as
    DeepSeek's is) aims at. For each ``k`` in ``ks``, over rows ``t >= first_row``:

    * ``shared``: the average plan's mass on the shared set (equal to the mean over heads of each head's mass);
    * ``worst_head``: the smallest head's mass on the shared set, averaged over rows;
    * ``own``: each head's mass on its *own* top-``k`` (a selection per head), averaged over heads and rows.

    Returns float lists, one entry per ``k``."""
    if plans.dim() != 4 or plans.shape[-1] != plans.shape[-2]:
        raise ValueError(f"plans must be [B, H, T, T]; got shape {tuple(plans.shape)}")
    B, H, T, _ = plans.shape
    mean_plan = plans.mean(1, keepdim=True)                                     # [B, 1, T, T]
    one_per_head = plans.reshape(B * H, 1, T, T)                                # each head its own "sequence"
    out = dict(shared=[], worst_head=[], own=[])
    for k in ks:
        shared = selection_mask(topk_select(mean_plan, int(k), causal=True), T)                 # [B, 1, T, T]
        per_head = (plans * shared).sum(-1)[..., first_row:]                       # [B, H, rows]
        own_sel = selection_mask(topk_select(one_per_head, int(k), causal=True), T).reshape(B, H, T, T)
        own = (plans * own_sel).sum(-1)[..., first_row:]
        out["shared"].append(float(per_head.mean()))
        out["worst_head"].append(float(per_head.min(1).values.mean()))
        out["own"].append(float(own.mean()))
    return out
