"""ANNA's two Triton kernels (chapter 5). Between them, torch does the sorting:

1. ``simhash.simhash_codes`` / ``crosspolytope.crosspolytope_codes`` -- hashing: matrix products per
   tile of rows and table, the signs (or the signed arg-max digits) packed into an int64 bucket key
   (kernel).
2. sort the keys' codes per (batch, head, table), binary-search each query's segment ``[lo, hi)``,
   prefix-sum the values in sorted order (torch: ``torch.sort``, ``torch.searchsorted``, ``cumsum``;
   see ``attnlib.anna._segments``).
3. ``gather.anna_gather`` -- per query, ``sum_t (P_t[hi] - P_t[lo]) / sum_t (hi - lo)`` over the
   tables, the output written once (kernel).
"""

from .crosspolytope import crosspolytope_codes
from .gather import anna_gather
from .simhash import simhash_codes

__all__ = ["simhash_codes", "crosspolytope_codes", "anna_gather"]
