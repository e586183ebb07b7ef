"""What the labs measure, kept apart from the operators: tasks, timers, fits and counts.

An operator module (``attnlib.linear``, ``attnlib.deltanet`` ...) is a chapter's equations and their
dispatch; the experiments that chapters run on them live here, one submodule per subject:

    eot      chapter 1's figures' numbers: one- and two-sided plans per temperature, attention maps
    recall   write key--value pairs into one state and read them back (chapters 3, 4 and 7's capacity)
    linear   chapter 3's cost: counted FLOPs, cache bytes, CPU timings, power-law fits, crossover
    mqar     multi-query associative recall and the tiny models trained on it (chapter 4 onwards)
    deltanet  chapter 4's state spectra and the delta rule's stability (the state's norm over time)
    hybrid   chapter 7's hybrids: full and linear layers in the published layouts, quadratic share, probes
    anna     chapter 5's tasks (match2, k-hop induction), collision rates, the (c, r) conditions
    grassmann  chapter 6's corpus, GrassmannLM and TransformerLM, training, counted FLOPs
    kernels  what the chunked kernels move, launch by launch, read from the static kernel report
    topk     chapter 7's top-k layer: the transport reading, the blind needle, the trained indexer, cost
             (a package, a module per job)
    weights  the [T, T] weights each mechanism puts on the values (the operator applied to v = I)
    landscape  chapter 7: every mechanism's cost on one set of axes (one record per mechanism), crossovers
             (a package: costs, counted references, the registry, crossovers, timings, exactness)
    published  chapter 7: the published designs' config numbers, each with its source, and what they imply
    flash_walk  the flash forward kernel's running state, key tile by key tile (the appendix)
    roofline  counted FLOPs and bytes per op against a GPU's two ceilings (the appendix)
    needle   chapter 2's toy algorithms, the adversary that defeats each, and their work counts

The two instruments they share, :func:`_measure.count_flops` (FLOPs by PyTorch's counter) and
:func:`_measure.interleaved_cpu_ms` (CPU time of interleaved repeats), live once in ``_measure``.

Widgets (:mod:`attnbook.widgets`) draw what these return and compute nothing themselves.

Chapters add their own submodule with one import line below.
"""

from . import (
    anna,
    deltanet,
    eot,
    flash_walk,
    grassmann,
    hybrid,
    kernels,
    landscape,
    linear,
    mqar,
    needle,
    published,
    recall,
    roofline,
    topk,
    weights,
)

__all__ = ["anna", "deltanet", "eot", "flash_walk", "grassmann", "hybrid", "kernels", "landscape", "linear",
           "mqar", "needle", "published", "recall", "roofline", "topk", "weights"]
