"""The transport reading: a row's plan ``p``, its restriction to the selected set ``S`` renormalised
(``p~``), and the three facts the chapter states about them, each measured against something independent of
:func:`attnlib.topk.topk_attention` (:func:`transport_reading`); values that attain the bound
(:func:`tight_values`) and random rows to measure on (:func:`random_rows`)."""

from __future__ import annotations

import math

import torch

from attnlib import eot
from attnlib.topk import selection_mask, topk_attention_reference

from ..weights import softmax_weights
from ._common import F64, _check_generator


def restrict(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``p`` restricted to ``mask`` and renormalised along the last dim (the chapter's ``p~``)."""
    kept = torch.where(mask, p, torch.zeros_like(p))
    return kept / kept.sum(-1, keepdim=True)


def eot_plan_on_support(cost_row: torch.Tensor, support: torch.Tensor, eps: float) -> torch.Tensor:
    """Chapter 1's one-sided entropic plan for one row whose keys are only ``support`` (bool ``[Tk]``):
    :func:`attnlib.eot.solve_one_sided` (Newton, no softmax) on those columns, 0 elsewhere -- the
    plan with cost ``+inf`` off the support. ``cost_row [Tk]`` float64."""
    plan = torch.zeros_like(cost_row)
    plan[support] = eot.solve_one_sided(cost_row[support][None], eps)[0]
    return plan


def transport_reading(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *,
                      causal: bool = True) -> dict[str, torch.Tensor]:
    """The three facts, measured row by row for one sequence and head (``q, k: [1, 1, T, D]``,
    ``v: [1, 1, T, Dv]``, ``indices [1, 1, T, n]`` from :func:`attnlib.topk.topk_select`).

    Returns per-row float64 tensors ``[T]``: ``mass`` ``p(S)``; ``l1`` ``||p - p~||_1``; ``eot_gap``
    ``max |p~ - eot plan on S|`` (chapter 1's solver, independent of softmax); ``operator_gap``
    ``max |p~ - topk_attention's row|`` (the operator on one-hot values); ``output_error``
    ``||o - o~||_2`` for the given ``v``, and ``bound`` ``2 (1 - p(S)) max_s ||v_s||`` over the row's
    visible keys."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    p = softmax_weights(q[0, 0], k[0, 0], tau=math.sqrt(D), causal=causal)              # [T, T]
    mask = selection_mask(indices, T)[0, 0]                                      # [T, T]
    pt = restrict(p, mask)
    mass = (p * mask).sum(-1)
    cost = -scale * (q.double() @ k.double().transpose(-1, -2))[0, 0]           # C = -scale q.k, eps = 1
    eot_rows = torch.stack([eot_plan_on_support(cost[t], mask[t], 1.0) for t in range(T)])
    eye = torch.eye(T, dtype=F64)[None, None]
    op = topk_attention_reference(q.double(), k.double(), eye, indices, scale=scale)[0][0, 0]
    o = p @ v.double()[0, 0]
    o_t = pt @ v.double()[0, 0]
    vnorm = v.double()[0, 0].norm(dim=-1)                                        # [T]
    visible = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
    vmax = torch.where(visible, vnorm[None, :], torch.zeros(())).max(-1).values
    return dict(mass=mass, l1=(p - pt).abs().sum(-1), eot_gap=(pt - eot_rows).abs().max(-1).values,
                operator_gap=(pt - op).abs().max(-1).values, output_error=(o - o_t).norm(dim=-1),
                bound=2 * (1 - mass) * vmax)


def tight_values(mask_row: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """Values that attain the bound on one row: ``+u`` on the selected keys, ``-u`` off them (``u`` the
    unit ``direction``). Then ``o~ - o = 2 (1 - p(S)) u`` exactly. Returns ``[Tk, Dv]`` float64."""
    u = direction.double() / direction.double().norm()
    sign = torch.where(mask_row, 1.0, -1.0).to(F64)
    return sign[:, None] * u[None, :]


def random_rows(T: int, d: int, *, generator: torch.Generator, spread: float = 2.0):
    """Random ``q, k, v [1, 1, T, d]`` (float64) with logits of standard deviation about ``spread``."""
    g = _check_generator(generator)
    q, k, v = (torch.randn(1, 1, T, d, generator=g, dtype=F64) for _ in range(3))
    return q * math.sqrt(spread), k * math.sqrt(spread), v          # scale q.k = q.k / sqrt(d): spread^1
