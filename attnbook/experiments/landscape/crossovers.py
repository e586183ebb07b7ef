"""Crossovers: the length at which a KV cache outgrows a recurrent state (:func:`memory_crossover`), the
context at which softmax decode costs what a recurrent step costs (:func:`decode_break_even`), and the first
length at which one cost reaches another (:func:`first_length_where`)."""

from __future__ import annotations

from collections.abc import Callable

from .costs import HeadConfig
from .registry import RECURRENT, decode_flops


def memory_crossover(cfg: HeadConfig = HeadConfig()) -> float:  # noqa: B008
    """``T_mem = H_v d_k d_v / (2 H_kv d_h)``: the length at which one layer's KV cache holds as many
    numbers as a linear / delta layer's state (same bytes per number)."""
    return cfg.heads * cfg.d_head * cfg.d_head / (2 * cfg.kv_heads * cfg.d_head)


def decode_break_even(mechanism: str, cfg: HeadConfig = HeadConfig()) -> float:  # noqa: B008
    """The ``t`` at which softmax decode (``2 H (d_k + d_v) t``) costs what a recurrent layer's decode
    step costs (constant in ``t``): ``t* = decode_flops(mechanism).total / (2 H (d_k + d_v))``. For plain
    linear attention with ``d_k = d_v = d``: ``t* = 4 H d^2 / (4 H d) = d``."""
    if mechanism not in RECURRENT:
        raise ValueError(f"mechanism must be one of {RECURRENT}; got {mechanism!r}")
    return decode_flops(mechanism, 1, cfg).total / (2 * cfg.heads * 2 * cfg.d_head)


def first_length_where(cost_a: Callable[[int], float], cost_b: Callable[[int], float], *, start: int = 1,
                       stop: int = 1 << 24) -> int | None:
    """The smallest integer ``T`` in ``[start, stop)`` with ``cost_a(T) >= cost_b(T)``, by doubling then
    bisection (``cost_a - cost_b`` must change sign once, from negative to non-negative), or None."""
    if cost_a(start) >= cost_b(start):
        return start
    lo, hi = start, start * 2
    while hi < stop and cost_a(hi) < cost_b(hi):
        lo, hi = hi, hi * 2
    if hi >= stop:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost_a(mid) < cost_b(mid) else (lo, mid)
    return hi
