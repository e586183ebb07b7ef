"""Chapter 1's figures' numbers: entropic transport plans and attention maps, computed for the widgets.

* :func:`transport_plans` / :func:`plan_pair` -- at each temperature, the one-sided plan (softmax,
  :func:`attnlib.eot.gibbs_plan`) and the balanced two-sided one (:func:`attnlib.eot.sinkhorn`), with
  the entropy and objective ``<P, C> - eps H(P)`` of each.
* :func:`attention_maps` / :func:`attention_map` -- ``softmax(q k^T / tau)`` of one head at each
  temperature, full and causal.

:mod:`attnbook.widgets.eot` draws what these return; it computes nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnlib import _validate, eot

from .weights import softmax_weights


@dataclass(frozen=True)
class PlanPair:
    """One cost at one temperature ``eps``: the one-sided plan (rows ship unit mass) and the two-sided
    plan (Sinkhorn; columns also receive their target), ``[Nq, Nk]`` float64 each, and the entropy and
    objective of each, in that order."""
    eps: float
    one_sided: torch.Tensor
    two_sided: torch.Tensor
    entropy: tuple[float, float]
    objective: tuple[float, float]


@dataclass(frozen=True)
class AttentionMap:
    """Attention weights of one head at temperature ``tau``: ``full`` ``[Tq, Tk]`` and ``causal``
    ``[T, T]`` (None when ``Tq != Tk``: there is no causal form), and ``masked`` ``[T, T]`` bool, True
    where the causal form forbids the query to look (above the diagonal; its weight there is 0 by
    the mask, not by the scores)."""
    tau: float
    full: np.ndarray
    causal: np.ndarray | None
    masked: np.ndarray | None = None


def _as_cost(C) -> torch.Tensor:
    C = torch.as_tensor(C, dtype=torch.float64)
    if C.dim() != 2:
        raise ValueError(f"C has shape {tuple(C.shape)}; expected a [Nq, Nk] cost matrix")
    return C


def _positive_values(name: str, values: Sequence[float]) -> list[float]:
    vals = [_validate.check_positive(f"{name}[i]", float(x)) for x in values]
    if not vals:
        raise ValueError(f"{name} must hold at least one temperature")
    return vals


def plan_pair(C, eps: float, *, b=None) -> PlanPair:
    """The two plans of cost ``C [Nq, Nk]`` at temperature ``eps``; ``b`` the columns' target for
    Sinkhorn (default ``Nq / Nk`` each)."""
    C = _as_cost(C)
    eps = _validate.check_positive("eps", eps)
    b = None if b is None else torch.as_tensor(b, dtype=torch.float64)
    one = eot.gibbs_plan(C, eps)
    two = eot.sinkhorn(C, eps, b=b, max_iter=2000, tol=1e-9)
    return PlanPair(eps, one, two,
                    entropy=(eot.entropy(one).item(), eot.entropy(two).item()),
                    objective=(eot.objective(one, C, eps).item(), eot.objective(two, C, eps).item()))


def transport_plans(C, eps_values: Sequence[float], *, b=None) -> list[PlanPair]:
    """:func:`plan_pair` at every temperature in ``eps_values`` (at least one, each > 0)."""
    C = _as_cost(C)
    return [plan_pair(C, eps, b=b) for eps in _positive_values("eps_values", eps_values)]


def attention_map(q, k, tau: float) -> AttentionMap:
    """``softmax(q k^T / tau)`` for one head (``q [Tq, D]``, ``k [Tk, D]``), and its causal form when
    ``Tq == Tk``."""
    tau = _validate.check_positive("tau", tau)
    full = softmax_weights(q, k, tau=tau, causal=False).numpy()
    if full.shape[0] != full.shape[1]:
        return AttentionMap(tau, full, None)
    causal = softmax_weights(q, k, tau=tau, causal=True).numpy()
    return AttentionMap(tau, full, causal, masked=np.triu(np.ones(full.shape, dtype=bool), 1))


def attention_maps(q, k, temperatures: Sequence[float]) -> list[AttentionMap]:
    """:func:`attention_map` at every temperature in ``temperatures`` (at least one, each > 0)."""
    return [attention_map(q, k, tau) for tau in _positive_values("temperatures", temperatures)]


__all__ = ["AttentionMap", "PlanPair", "attention_map", "attention_maps", "plan_pair", "transport_plans"]
