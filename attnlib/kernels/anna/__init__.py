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

from .crosspolytope import crosspolytope_codes
from .gather import anna_gather
from .scan import anna_segmented_scan
from .simhash import simhash_codes

__all__ = ["simhash_codes", "crosspolytope_codes", "anna_segmented_scan", "anna_gather"]
