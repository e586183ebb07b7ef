"""The registry: one :class:`Mechanism` record per mechanism (its label, cost formulas, counting references,
decode step, adversary and state), the tuples derived from it, and the public cost functions that look a
record up (:func:`prefill_flops`, :func:`decode_flops`, :func:`memory_bytes`, :func:`landscape_curves`).
The hybrid's formulas live here: they compose other mechanisms' records."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from .costs import (
    Flops,
    HeadConfig,
    _anna_memory,
    _anna_per_token,
    _block_sparse_decode,
    _block_sparse_memory,
    _block_sparse_prefill,
    _delta_decode,
    _delta_prefill,
    _grassmann_cost,
    _grassmann_memory,
    _linear_decode,
    _linear_prefill,
    _softmax_decode,
    _softmax_memory,
    _softmax_prefill,
    _state_memory,
    _topk_decode,
    _topk_memory,
    _topk_prefill,
    band_keys,
)
from .decode_steps import _gated_delta_decode_step, _linear_decode_step, _softmax_decode_step
from .references import (
    _anna_count_prefill,
    _block_sparse_count_prefill,
    _cache_count_decode,
    _delta_count_decode,
    _delta_count_prefill,
    _grassmann_count_prefill,
    _linear_count_decode,
    _linear_count_prefill,
    _softmax_count_prefill,
    _topk_count_decode,
    _topk_count_prefill,
    _topk_count_tolerance,
)

# --- hybrid: r Gated DeltaNet layers per full softmax layer ------------------------------------

def _hybrid_prefill(T: int, cfg: HeadConfig) -> Flops:
    r = cfg.hybrid_ratio
    return (prefill_flops("gated_delta", T, cfg).scaled(r) + prefill_flops("softmax", T, cfg)).scaled(1 / (r + 1))


def _hybrid_decode(t: int, cfg: HeadConfig) -> Flops:
    r = cfg.hybrid_ratio
    return (decode_flops("gated_delta", t, cfg).scaled(r) + decode_flops("softmax", t, cfg)).scaled(1 / (r + 1))


def _hybrid_memory(T: int, cfg: HeadConfig) -> float:
    r = cfg.hybrid_ratio
    return (r * memory_bytes("gated_delta", T, cfg) + memory_bytes("softmax", T, cfg)) / (r + 1)


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mechanism:
    """Everything the landscape knows about one mechanism.

    ``prefill(T, cfg)``, ``decode(t, cfg)`` (:class:`Flops`) and ``memory(T, cfg)`` (bytes) are its cost
    formulas; ``count_prefill(q, k, v, T, cfg, gen)`` and ``count_decode(q1, k1, v1, t, cfg, gen)`` count
    the attnlib references that compute the same thing (None: nothing to count), and
    ``count_tolerance(T, cfg)`` is how far that count may fall below the formula's ``matmul`` (None: 0).
    ``decode_step(inputs)`` builds one timed decode step from :func:`cpu_decode_times`' inputs (None: not
    timed). ``adversary`` is ``(chapter 2's algorithm or None, what ran, why the adversary wins or does not
    apply)``; ``recall_rule`` the capacity experiment's rule that stands for it (None: none);
    ``capacity_note`` what its state keeps (``{dim}`` is filled in); ``recurrent`` whether it keeps a
    ``d_k x d_v`` state per head; ``measured_as`` names the member of the family that the exactness table
    measured where it is not the mechanism itself (empty: the mechanism itself)."""
    name: str
    label: str
    prefill: Callable[[int, HeadConfig], Flops]
    decode: Callable[[int, HeadConfig], Flops]
    memory: Callable[[int, HeadConfig], float]
    adversary: tuple[str | None, str, str]
    capacity_note: str
    recall_rule: str | None = None
    recurrent: bool = False
    count_prefill: Callable[..., float] | None = None
    count_decode: Callable[..., float] | None = None
    count_tolerance: Callable[[int, HeadConfig], float] | None = None
    decode_step: Callable[[Mapping[str, torch.Tensor]], Callable[[], object]] | None = None
    measured_as: str = ""


_NOT_SOFTMAX = "not an approximation of softmax: the adversary's error is undefined"

REGISTRY: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism(
        "softmax", "softmax (causal)", _softmax_prefill, _softmax_decode, _softmax_memory,
        adversary=("exact", "softmax attention itself", "the operator itself: nothing to miss"),
        capacity_note="keeps every pair (the cache grows)", recall_rule="softmax",
        count_prefill=_softmax_count_prefill, count_decode=partial(_cache_count_decode, lambda t, cfg: t),
        decode_step=_softmax_decode_step),
    Mechanism(
        "block_sparse", "block-sparse (local band)", _block_sparse_prefill, _block_sparse_decode,
        _block_sparse_memory,
        adversary=("sliding_window", "chapter 2's sliding window (a band of sqrt(T) keys)",
                   "a fixed pattern: the needle goes outside the band"),
        capacity_note="exact inside its band, nothing outside", measured_as="needle: a sliding window",
        count_prefill=_block_sparse_count_prefill, count_decode=partial(_cache_count_decode, band_keys)),
    Mechanism(
        "linear", "linear", _linear_prefill, _linear_decode, _state_memory,
        adversary=("performer", "chapter 2's Performer (FAVOR+ positive random features)",
                   "random features estimate the needle's weight with a variance that grows like e^M; other "
                   "feature maps approximate no softmax"),
        capacity_note="crosstalk (N-1)/d_k: degrades past N ~ d_k = {dim}", recall_rule="linear", recurrent=True,
        measured_as="needle: Performer; recall: Hebbian", count_prefill=_linear_count_prefill,
        count_decode=_linear_count_decode, decode_step=_linear_decode_step),
    Mechanism(
        "delta", "DeltaNet", partial(_delta_prefill, False), partial(_delta_decode, False), _state_memory,
        adversary=(None, "", _NOT_SOFTMAX),
        capacity_note="replaces overwritten keys; below Hebbian for distinct keys past N ~ d_k = {dim}",
        recall_rule="delta", recurrent=True,
        count_prefill=partial(_delta_count_prefill, False), count_decode=partial(_delta_count_decode, False)),
    Mechanism(
        "gated_delta", "Gated DeltaNet", partial(_delta_prefill, True), partial(_delta_decode, True), _state_memory,
        adversary=(None, "", _NOT_SOFTMAX),
        capacity_note="as the delta rule, with a decay (gate 1 here: no forgetting)", recall_rule="delta",
        measured_as="recall: gate 1", recurrent=True,
        count_prefill=partial(_delta_count_prefill, True), count_decode=partial(_delta_count_decode, True),
        decode_step=_gated_delta_decode_step),
    Mechanism(
        "anna", "ANNA (LSH)", _anna_per_token, _anna_per_token, _anna_memory,
        adversary=("lsh", "chapter 2's angular-LSH buckets (Reformer-style rounds)",
                   "the needle sits across a hyperplane of every round"),
        capacity_note="what shares a bucket with the query", measured_as="needle: LSH buckets",
        count_prefill=_anna_count_prefill),
    Mechanism(
        "grassmann", "Grassmann", _grassmann_cost, _grassmann_cost, _grassmann_memory,
        adversary=(None, "", "no attention rows: it mixes fixed offsets, not a softmax over keys"),
        capacity_note="no key-value store: the last max(offsets) tokens", count_prefill=_grassmann_count_prefill),
    Mechanism(
        "topk", "top-k + indexer", _topk_prefill, _topk_decode, _topk_memory,
        adversary=("lightning_indexer", "chapter 7's top-k layer (topk_attention) with a 64-head, 128-dim "
                   "indexer, signed weights",
                   "the needle's index key is placed where its index score is the row's lowest, at every M"),
        capacity_note="exact over the k selected keys, if the indexer selects them",
        count_prefill=_topk_count_prefill, count_decode=_topk_count_decode, count_tolerance=_topk_count_tolerance),
    Mechanism(
        "hybrid", "hybrid (Gated DeltaNet + softmax)", _hybrid_prefill, _hybrid_decode, _hybrid_memory,
        adversary=(None, "", "its full layers are exact; its linear layers are not approximations of softmax"),
        capacity_note="its full layers keep every pair", measured_as="MQAR: 3:1"),
)}

MECHANISMS = tuple(REGISTRY)
LABELS = {m: r.label for m, r in REGISTRY.items()}
RECURRENT = tuple(m for m, r in REGISTRY.items() if r.recurrent)          # a d_k x d_v state per head
COUNTED_PREFILL = tuple(m for m, r in REGISTRY.items() if r.count_prefill is not None)
COUNTED_DECODE = tuple(m for m, r in REGISTRY.items() if r.count_decode is not None)
# What ran against chapter 2's needle for each mechanism -- (the algorithm's name, what it is, why the
# adversary wins or why it does not apply). Where the book has the operator itself in a form the adversary
# can be aimed at (softmax, the top-k layer), that is what runs; elsewhere it is chapter 2's small model of
# the family, and the table says so.
ADVERSARY = {m: r.adversary for m, r in REGISTRY.items()}


def _mechanism(mechanism: str) -> Mechanism:
    try:
        return REGISTRY[mechanism]
    except (KeyError, TypeError):                            # TypeError: not even hashable
        raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}") from None


# ---------------------------------------------------------------------------------------------
# The cost models, per layer and token
# ---------------------------------------------------------------------------------------------

def prefill_flops(mechanism: str, T: int, cfg: HeadConfig = HeadConfig()) -> Flops:  # noqa: B008
    """FLOPs per token of a causal prefill of ``T`` tokens, one layer (all heads), as the kernels
    compute it. ``d = d_head``, ``H = heads``:

    softmax       ``2 H (d_k + d_v) (T + 1) / 2``: a query at position ``t`` scores and sums ``t`` keys
    block_sparse  ``2 H (d_k + d_v)`` times the band's pairs per token (whole blocks)
    linear        ``H (2 C (d_k + d_v) + 4 d_k d_v)``: chunk ``C``, the masked quadratic form inside a chunk
                  (computed whole) plus the state's read and write
    delta         ``H (6 C d_k + 4 C d_v + 6 d_k d_v)``: the WY/UT chunk form's products; plus the solve
    gated_delta   the same products, plus the decays (elementwise)
    anna          ``4 H l z d_k`` to hash queries and keys, plus ``H (2 l d_v + d_v)``: one scan add and one
                  read per table, one division (the kernels' scan; the reference's doubling scan does
                  ``log2 T`` adds per table instead)
    grassmann     ``2 C(r,2) d_model`` plus the per-offset vector work (no heads)
    topk          ``2 H_I d_I (T + 1) / 2`` for the indexer (quadratic), ``3 H_I (T + 1) / 2`` for its
                  weighted ReLU sum, plus ``2 H (d_k + d_v)`` times the mean of ``min(k, t)``
    hybrid        ``(r gated_delta + softmax) / (r + 1)``
    """
    return _mechanism(mechanism).prefill(T, cfg)


def decode_flops(mechanism: str, t: int, cfg: HeadConfig = HeadConfig()) -> Flops:  # noqa: B008
    """FLOPs to decode one token that reads ``t`` positions (itself included), one layer:

    softmax       ``2 H (d_k + d_v) t``                      (grows with t)
    block_sparse  ``2 H (d_k + d_v) band_keys(t)``           (at most ``band_blocks`` blocks)
    linear        ``4 H d_k d_v``: write ``v k^T`` into the state, read ``S q``
    delta         ``4 H d_k d_v`` products (``S k`` and ``S q``) plus ``H (2 d_k d_v + 2 d_v)``: the rank-one
                  correction ``beta (v - S k) k^T`` and its add, which attnlib writes elementwise
    gated_delta   delta plus the decay ``alpha S``: ``H d_k d_v`` more (about 7 ``H d_k d_v`` in all)
    anna          hash the query and the key, add ``v`` to one bucket and read one bucket per table
    grassmann     the same per-token work as in prefill: the layer has no quadratic part
    topk          ``2 H_I d_I t`` (+ ``3 H_I t``) for the indexer, ``2 H (d_k + d_v) min(k, t)`` for attention
    hybrid        ``(r gated_delta + softmax) / (r + 1)``
    """
    return _mechanism(mechanism).decode(t, cfg)


def memory_bytes(mechanism: str, T: int, cfg: HeadConfig = HeadConfig()) -> float:  # noqa: B008
    """Bytes one layer keeps after ``T`` tokens to decode the next one (cache or state), all heads:

    softmax       ``2 H_kv d_h b T`` -- the KV cache
    block_sparse  ``2 H_kv d_h b min(T, band)`` -- a local band can drop the blocks behind it
    linear, delta, gated_delta   ``H d_k d_v b`` -- the state, whatever ``T``
    anna          ``H l min(T, 2^z) (d_v + 1) b`` -- per table, each occupied bucket's value sum and count
    grassmann     ``max(offsets) r b`` -- the last reduced vectors the offsets reach back to
    topk          ``(2 H_kv d_h + d_I) b T`` -- the KV cache does not shrink, and one index key per token
    hybrid        ``(r gated_delta + softmax) / (r + 1)``
    """
    return _mechanism(mechanism).memory(T, cfg)


def landscape_curves(lengths: Sequence[int], cfg: HeadConfig = HeadConfig(),  # noqa: B008
                     mechanisms: Sequence[str] = MECHANISMS) -> dict[str, dict[str, list[float]]]:
    """``{panel: {mechanism: values at lengths}}`` for the panels ``prefill``, ``decode`` (FLOPs per
    token, totals) and ``memory`` (bytes per token of context: ``memory_bytes / T``)."""
    return {
        "prefill": {m: [prefill_flops(m, T, cfg).total for T in lengths] for m in mechanisms},
        "decode": {m: [decode_flops(m, T, cfg).total for T in lengths] for m in mechanisms},
        "memory": {m: [memory_bytes(m, T, cfg) / T for T in lengths] for m in mechanisms},
    }
