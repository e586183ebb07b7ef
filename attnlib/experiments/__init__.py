"""What the labs measure, kept apart from the operators: tasks, timers, fits and counts.

An operator module (``attnlib.linear``, ``attnlib.deltanet`` ...) is a chapter's equations and their
dispatch; the experiments that chapters run on them live here, one submodule per subject:

    recall   write key--value pairs into one state and read them back (chapters 3, 4 and 7's capacity)
    linear   chapter 3's cost: counted FLOPs, cache bytes, CPU timings, power-law fits, crossover
    mqar     multi-query associative recall and the tiny models trained on it (chapter 4 onwards)
    hybrid   chapter 7's hybrids: full and linear layers in the published layouts, quadratic share, probes
    anna     chapter 5's tasks (match2, k-hop induction), collision rates, the (c, r) conditions
    grassmann  chapter 6's corpus, GrassmannLM and TransformerLM, training, counted FLOPs
    kernels  what the chunked kernels move, launch by launch, read from the static kernel report
    topk     chapter 7's top-k layer: the transport reading, the blind needle, the trained indexer, cost
    weights  the [T, T] weights each mechanism puts on the values (the operator applied to v = I)
    landscape  chapter 7: every mechanism's cost on one set of axes, crossovers, published designs
    flash_walk  the flash forward kernel's running state, key tile by key tile (the appendix)
    roofline  counted FLOPs and bytes per op against a GPU's two ceilings (the appendix)

Chapters add their own submodule with one import line below.
"""

from . import anna, flash_walk, grassmann, hybrid, kernels, landscape, linear, mqar, recall, roofline, topk, weights

__all__ = ["anna", "flash_walk", "grassmann", "hybrid", "kernels", "landscape", "linear", "mqar", "recall",
           "roofline", "topk", "weights"]
