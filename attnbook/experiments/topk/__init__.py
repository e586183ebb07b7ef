"""Chapter 7's top-k layer, measured: the transport reading, the needle against the indexer, the indexer
trained as DeepSeek trains it, and the cost on counted work.

The operator itself (index scores, causal top-k selection, softmax over the selected keys, the
indexer's KL loss) is :mod:`attnlib.topk`; chapter 1's one-sided transport solver is :mod:`attnlib.eot`;
chapter 2's planted needle and its closed forms are :mod:`attnbook.experiments.needle`. This package only runs them:

* :func:`transport_reading` -- a row's plan ``p``, its restriction to the selected set ``S``
  renormalised (``p~``), and the three facts the chapter states about them, each measured against
  something independent of :func:`attnlib.topk.topk_attention`: ``p~`` is chapter 1's one-sided
  entropic plan on the columns of ``S`` (solved by Newton's method, no softmax); ``||p - p~||_1 =
  2 (1 - p(S))``; the output moves by at most ``2 (1 - p(S)) max_s ||v_s||``
  (:func:`tight_values` attains it).
* :func:`mechanism_map` -- the dense plan, the index scores and the restricted plan at several ``k``.
* :func:`blind_needle` -- chapter 2's needle whose *index key* sits where every index query's ReLU is 0.
* :class:`Indexer`, :func:`planted_task`, :func:`train_indexer`, :func:`recall_grid` -- a teacher
  attention over planted needles in a power-law tail, the indexer trained on it (dense KL warm-up, then
  the KL on the selected set), and its recall ``p(S)`` against ``k``, ``H_I`` and ``d_I``.
* :func:`per_pair_flops`, :func:`topk_attention_flops`, :func:`break_even_length` -- counted FLOPs
  (``torch.utils.flop_counter`` on the references, on the ``meta`` device) and ``T* = k / (1 - r_I)``.

Every random choice comes from a ``torch.Generator`` the caller passes in.

The package, a module per job:

    transport      the transport reading: p, p~ and the three facts, measured
    mechanism_map  the map's plan, index scores and restricted plans, with a noisy indexer
    needles        chapter 2's needle against the indexer: blind_needle, signed_indexer_needle
    heads          one selection shared by a layer's heads, and what it costs each head
    task           the planted task the indexer learns from (a teacher attention)
    training       the lightning indexer, its two training stages and its recall
    flops          counted FLOPs at DeepSeek-V3.2's shapes and the break-even lengths
    cache          the bytes a token keeps and a decoding query reads
    figure         the cost models set beside DeepSeek's Figure 3, and the decode roofline
    deepseek       DeepSeek-V3.2-Exp's configuration (DEEPSEEK_V32)
    _common        the float64 dtype and the generator check the modules share
"""

from __future__ import annotations

from .cache import CACHE_BYTES, CACHE_BYTES_FP8, cache_bytes_per_token, decode_bytes
from .deepseek import DEEPSEEK_V32
from .figure import DSA_COST_FIGURE, cost_model_vs_figure, decode_slope_roofline
from .flops import (
    attention_flops,
    break_even_length,
    decode_flops,
    indexer_flops,
    mla_dims,
    per_pair_flops,
    prefill_break_even,
    topk_attention_flops,
)
from .heads import head_plans, shared_selection_loss
from .mechanism_map import mechanism_map, noisy_indexer
from .needles import blind_needle, signed_indexer_needle
from .task import PlantedTask, planted_task
from .training import Indexer, recall, recall_grid, train_indexer
from .transport import eot_plan_on_support, random_rows, restrict, tight_values, transport_reading

# The classes are the package's: reprs name them as attnbook.experiments.topk.X, wherever in the package
# they are defined.
for _cls in (Indexer, PlantedTask):
    _cls.__module__ = __name__
del _cls

__all__ = ["DEEPSEEK_V32", "restrict", "eot_plan_on_support", "transport_reading", "tight_values",
           "random_rows", "noisy_indexer", "mechanism_map", "blind_needle", "signed_indexer_needle", "head_plans",
           "shared_selection_loss", "PlantedTask", "planted_task", "Indexer",
           "train_indexer", "recall", "recall_grid", "indexer_flops", "attention_flops", "topk_attention_flops",
           "mla_dims", "per_pair_flops", "break_even_length", "prefill_break_even", "decode_flops",
           "CACHE_BYTES", "CACHE_BYTES_FP8", "cache_bytes_per_token", "decode_bytes", "DSA_COST_FIGURE",
           "cost_model_vs_figure", "decode_slope_roofline"]
