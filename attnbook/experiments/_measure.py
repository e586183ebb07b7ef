"""How the experiments measure: FLOPs counted by PyTorch's counter, CPU time of interleaved repeats.

One home for the two instruments every cost experiment uses (chapter 3's scaling, the Grassmann and
hybrid counts, the top-k layer's cost, the landscape, the roofline), so that they all count and time
the same way:

* :func:`count_flops` -- exact and machine-independent: what the labs assert on.
* :func:`interleaved_cpu_ms` -- a fact of one machine at one moment: shown with its spread, never
  asserted on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of ``fn()`` as counted by ``torch.utils.flop_counter`` (matrix
    products: ``2 m n k`` per ``[m, k] @ [k, n]``). Exact and machine-independent."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def _cpu_ms(fn) -> float:
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) * 1e3


def interleaved_cpu_ms(calls: Mapping, reps: int, *, progress=None) -> dict:
    """CPU time (``time.process_time``, ms, on one thread) of every call in ``calls`` (``{key: fn}``),
    ``reps`` times each. After one warm-up call each (first calls allocate), the repeats are
    *interleaved*: each round times every call once, so a burst of load from another process spreads
    over all points instead of bending one of them. Returns ``{key: [ms, ...]}``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    samples = {key: [] for key in calls}
    try:
        for fn in calls.values():
            fn()
        for _ in range(reps):
            for key, fn in calls.items():
                samples[key].append(_cpu_ms(fn))
            if progress is not None:
                progress.update(1)
    finally:
        torch.set_num_threads(threads)
    return samples


__all__ = ["count_flops", "interleaved_cpu_ms"]
