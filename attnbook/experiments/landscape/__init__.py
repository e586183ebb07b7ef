"""Chapter 7's landscape: every mechanism of the book on one set of axes.

Three kinds of numbers, kept apart on purpose:

* **Cost models** (:func:`prefill_flops`, :func:`decode_flops`, :func:`memory_bytes`): per layer and per
  token, for one head configuration (:class:`HeadConfig`), written as the chapters write them. Each is
  split into ``matmul`` -- the matrix products, which ``torch.utils.flop_counter`` counts (2 FLOPs per
  multiply-add) -- and ``elementwise`` -- the work the counter does not see (the delta rule's rank-one
  update, decays, the triangular solve, LSH scans, Plücker products, the indexer's weighted ReLU sum),
  added from the formula. :func:`counted_flops` counts the attnlib references at small sizes so that
  the ``matmul`` part is *asserted*, not typed.
* **Measured times** (:func:`gpu_rows` read from committed GPU JSON, :func:`cpu_decode_times` measured
  here with their quartiles): a fact of one machine, never asserted.
* **Published designs** (:data:`DESIGNS`, :func:`design_table` ...): they live in
  :mod:`attnbook.experiments.published`, each config number with the source it was read from; this
  package re-exports them for the lab.

Each mechanism is one :class:`Mechanism` record in :data:`REGISTRY`: its label, its three cost
formulas, the references that count it, its decode step for the timings, what chapter 2's adversary
ran against it and what its state holds. The public functions look the record up; a new mechanism is
one more record.

Conventions. ``T`` is the prompt length (prefill: FLOPs per token averaged over the prompt); ``t`` the
number of keys a decoded token reads (itself included). Causal everywhere. One sequence (batch 1), one
layer. Memory "per token" is the layer's cache or state after ``T`` tokens, divided by ``T``.

The package, a module per job:

    costs         HeadConfig, Flops and each mechanism's cost formulas (prefill, decode, memory)
    references    the attnlib references that count each mechanism's matrix products
    decode_steps  the one decode step per mechanism that cpu_decode_times times
    registry      the Mechanism records (REGISTRY), the tuples derived from them, the public cost functions
    counting      counted_flops and count_tolerance: the references counted beside the models
    crossovers    memory_crossover, decode_break_even, first_length_where
    timings       the committed GPU rows and the CPU decode times
    exactness     chapter 2's adversary per mechanism, the delta rule's verdict, the exactness table
"""

from __future__ import annotations

from ..published import (
    DESIGNS,
    Cited,
    attention_dims,
    design_row,
    design_sources,
    design_table,
    indexer_hosts,
    pair_flops,
    quadratic_share,
)
from .costs import Flops, HeadConfig, band_keys
from .counting import count_tolerance, counted_flops
from .crossovers import decode_break_even, first_length_where, memory_crossover
from .exactness import adversary_errors, delta_rule_verdict, exactness_table
from .registry import (
    ADVERSARY,
    COUNTED_DECODE,
    COUNTED_PREFILL,
    LABELS,
    MECHANISMS,
    RECURRENT,
    REGISTRY,
    Mechanism,
    decode_flops,
    landscape_curves,
    memory_bytes,
    prefill_flops,
)
from .timings import GPU_RESULT_FILES, cpu_decode_times, gpu_rows

# The classes are the package's: reprs name them as attnbook.experiments.landscape.X, wherever in the
# package they are defined.
for _cls in (Flops, HeadConfig, Mechanism):
    _cls.__module__ = __name__
del _cls

__all__ = ["ADVERSARY", "COUNTED_DECODE", "COUNTED_PREFILL", "Cited", "DESIGNS", "Flops", "GPU_RESULT_FILES",
           "HeadConfig", "LABELS", "MECHANISMS", "Mechanism", "RECURRENT", "REGISTRY", "adversary_errors",
           "attention_dims", "band_keys", "count_tolerance", "counted_flops", "cpu_decode_times",
           "decode_break_even", "decode_flops", "delta_rule_verdict", "design_row", "design_sources",
           "design_table", "exactness_table", "first_length_where", "gpu_rows", "indexer_hosts",
           "landscape_curves", "memory_bytes", "memory_crossover", "pair_flops", "prefill_flops", "quadratic_share"]
