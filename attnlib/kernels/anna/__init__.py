"""ANNA's Triton kernels (chapter 5). Between them, torch does the sorting:

1. ``simhash.simhash_codes`` / ``crosspolytope.crosspolytope_codes`` -- hashing: matrix products per
   tile of rows and table, the signs (or the signed arg-max digits) packed into an int64 bucket key
   (kernel).
2. sort the keys' codes per (batch, head, table), binary-search each query's segment ``[lo, hi)``
   and each sorted key's bucket start (torch: ``torch.sort``, ``torch.searchsorted``; see
   ``attnlib.anna._segments``).
3. ``scan.anna_segmented_scan`` -- the values in sorted order, summed by a running sum restarted at
   every bucket start (kernel).
4. ``gather.anna_gather`` -- per query, ``sum_t S_t[hi - 1] / sum_t (hi - lo)`` over the tables where
   it collides, the output written once (kernel).
"""

import torch

from ..._backend import CROSSPOLYTOPE_MAX_HEAD_DIM
from ..common.family import KernelFamily, empty
from .crosspolytope import crosspolytope_codes
from .gather import anna_gather
from .scan import anna_segmented_scan
from .simhash import simhash_codes

N_TABLES, N_BITS = 8, 8     # the compile workloads' tables and bits per table (the benchmark's l and z)


def _workloads(D: int, dtype, device, T: int) -> dict:
    x = empty(device, dtype)
    B, H = 1, 2

    def hash_and_sum(family: str):
        q, v = x(B, H, T, D), x(B, H, T, D)
        if family == "simhash":
            simhash_codes(q, x(N_TABLES, D, N_BITS, dt=torch.float32))
        else:
            crosspolytope_codes(q, x(N_TABLES, N_BITS, D, D, dt=torch.float32))
        perm, start = x(B, H, N_TABLES, T, dt=torch.int64), x(B, H, N_TABLES, T, dt=torch.int64)
        scan = anna_segmented_scan(v, perm, start)
        anna_gather(scan, x(B, H, N_TABLES, T, dt=torch.int64), x(B, H, N_TABLES, T, dt=torch.int64), dtype)

    # no backward: ANNA's weights are piecewise constant (the operator's gradient flows through v alone, in torch)
    out = {"anna simhash": lambda: hash_and_sum("simhash")}
    if D <= CROSSPOLYTOPE_MAX_HEAD_DIM:           # wider heads take the reference
        out["anna cross-polytope"] = lambda: hash_and_sum("crosspolytope")
    return out


FAMILY = KernelFamily("anna", ("_simhash_codes_kernel", "_crosspolytope_codes_kernel", "_anna_segmented_scan_kernel",
                               "_anna_gather_kernel"), "fixed", _workloads)

__all__ = ["FAMILY", "simhash_codes", "crosspolytope_codes", "anna_segmented_scan", "anna_gather"]
