"""Chapter 2 -- the needle in the haystack: no subquadratic attention is asymptotically exact.

The argument. Exact attention row ``i`` is ``p_i = softmax_j(s_ij)`` with ``s_ij = scale * q_i . k_j``.
An algorithm that computes ``o(T^2)`` scores leaves, for some row ``i``, a key ``j`` it never looks at.
Plant a needle there -- ``q_i = a u``, ``k_j = b w`` with ``scale * a * b * (u . w) = M``, every other
vector zero (or chosen so that all other scores are zero) -- and take one-hot values ``v_l = e_l`` so that
an output row *is* an attention row. The exact row is

    p_ij = pi(M) = 1 / (1 + (T - 1) e^{-M}),   p_il = (1 - pi) / (T - 1) for l != j,

which tends to ``e_j``. An algorithm that never saw ``(i, j)`` answers with some probability vector
``r`` that does not depend on ``M`` at ``j`` -- typically ``r_j = 0`` -- so
``||p_i - r||_1 >= 2 (pi - r_j)  ->  2``. (Against an all-zero answer the distance is only 1.)

Everything here is a small, readable model of a published family, sized by ``T``:

==================  =======================================================  ======================
name                what it inspects                                          adversary
==================  =======================================================  ======================
sliding_window      ``|i - j| < w`` (``attnlib.sliding_window_attention``)     a pair outside the band
strided             local band + every ``l``-th key (Sparse Transformer)      a pair outside both
random_keys         ``s`` keys per query, drawn with fixed coins              an unsampled pair
indexer_topk        top-k key blocks by a rank-r indexer (DSA's idea)         needle in the null space
lsh                 same angular-LSH bucket in some round (Reformer)          needle across a hyperplane
performer           all pairs, through ``m`` positive random features         exponential variance
linformer           ``r`` pooled keys/values (low rank along time)            needle smeared by pooling
norm_screen         band + the ``c`` largest-norm keys (reads the vectors)    equal-norm haystack
==================  =======================================================  ======================

``ALGORITHMS[name](T=..., d=..., seed=...)`` builds one; ``attack(algo, M=...)`` builds the input that
defeats it and ``row_error(algo, case)`` measures the L1 distance on the planted row.
Every adversary plants the needle in row ``i = T // 2``, at a key ``j`` at least ``T // 8`` keys from
both ends of the row, so that a figure shows its spike clear of the axes.
The chapter's figures (:mod:`attnbook.widgets.needle`) draw what :func:`probe_maps`, :func:`rows_vs_M` and
:func:`needle_maps` return; :func:`probe_map_at` computes the live explorer's steps.

The package in four modules: ``argument`` (the planted input, the exact row, the needle's weight, the
error on the row), ``algorithms`` (the eight models and their adversaries), ``fine_print`` (bounded
scores, where Alman and Song's bound applies) and ``figures`` (what the figures draw).

Work is counted in *score equivalents*: one exact score ``q_i . k_j`` (``d`` multiply-adds) is one unit;
the indexer's, hash's and features' arithmetic is converted at ``d`` multiply-adds per unit. Exact
attention costs ``T^2``.
"""

from __future__ import annotations

from .algorithms import (
    ALGORITHMS,
    Algorithm,
    IndexerTopK,
    Linformer,
    LSHBuckets,
    NormScreen,
    Performer,
    RandomKeys,
    SlidingWindow,
    Strided,
    make,
)
from .argument import Case, algorithm_rows, attack, exact_rows, needle_mass, plant, row_error, uniform_miss_error
from .figures import (
    NeedleMap,
    PlantedRow,
    ProbeMap,
    needle_map,
    needle_maps,
    planted_row,
    probe_map,
    probe_map_at,
    probe_maps,
    rows_vs_M,
    window_maps,
)
from .fine_print import bounded_case, output_error

# The classes are the package's: messages and reprs name them as attnbook.experiments.needle.X, wherever
# in the package they are defined.
for _cls in (Algorithm, Case, IndexerTopK, Linformer, LSHBuckets, NeedleMap, NormScreen, Performer, PlantedRow,
             ProbeMap, RandomKeys, SlidingWindow, Strided):
    _cls.__module__ = __name__
del _cls

__all__ = ["ALGORITHMS", "Algorithm", "Case", "IndexerTopK", "LSHBuckets", "Linformer", "NeedleMap", "NormScreen",
           "Performer", "PlantedRow", "ProbeMap", "RandomKeys", "SlidingWindow", "Strided", "algorithm_rows", "attack",
           "bounded_case", "exact_rows", "make", "needle_map", "needle_maps", "needle_mass", "output_error", "plant",
           "planted_row", "probe_map", "probe_map_at", "probe_maps", "row_error", "rows_vs_M", "uniform_miss_error",
           "window_maps"]
