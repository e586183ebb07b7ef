"""What the labs measure, kept apart from the operators: tasks, timers, fits and counts.

An operator module (``attnlib.linear``, ``attnlib.deltanet`` ...) is a chapter's equations and their
dispatch; the experiments that chapters run on them live here, one submodule per subject:

    recall   write key--value pairs into one state and read them back (chapters 3, 4 and 7's capacity)
    linear   chapter 3's cost: counted FLOPs, cache bytes, CPU timings, power-law fits, crossover
    mqar     multi-query associative recall and the tiny models trained on it (chapter 4 onwards)
    anna     chapter 5's tasks (match2, k-hop induction), collision rates, the (c, r) conditions
    grassmann  chapter 6's corpus, GrassmannLM and TransformerLM, training, counted FLOPs
    kernels  what the chunked kernels move, launch by launch, read from the static kernel report
    topk     chapter 7's top-k layer: the transport reading, the blind needle, the trained indexer, cost
    weights  the [T, T] weights each mechanism puts on the values (the operator applied to v = I)

Chapters add their own submodule with one import line below.
"""

from . import anna, grassmann, kernels, linear, mqar, recall, topk, weights

__all__ = ["anna", "grassmann", "kernels", "linear", "mqar", "recall", "topk", "weights"]
