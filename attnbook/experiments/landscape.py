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
  module re-exports them for the lab.

Each mechanism is one :class:`Mechanism` record in :data:`REGISTRY`: its label, its three cost
formulas, the references that count it, its decode step for the timings, what chapter 2's adversary
ran against it and what its state holds. The public functions look the record up; a new mechanism is
one more record.

Conventions. ``T`` is the prompt length (prefill: FLOPs per token averaged over the prompt); ``t`` the
number of keys a decoded token reads (itself included). Causal everywhere. One sequence (batch 1), one
layer. Memory "per token" is the layer's cache or state after ``T`` tokens, divided by ``T``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from attnlib.anna import anna_attention_reference, lsh_projections
from attnlib.attention import softmax_attention, softmax_attention_reference
from attnlib.deltanet import delta_rule_chunk_reference, delta_rule_decode_step
from attnlib.grassmann import n_pairs, plucker_projection_collapsed
from attnlib.linear import linear_attention_chunk_reference, linear_attention_decode_step
from attnlib.topk import index_scores_reference, topk_attention_reference, topk_select_reference

from . import needle
from ._measure import count_flops, interleaved_cpu_ms
from .published import (
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
from .topk import signed_indexer_needle

GPU_RESULT_FILES = ("benchmarks/results/nvidia-h200-2026-11-23-softmax_attention.json",
                    "benchmarks/results/nvidia-h200-2026-11-23-block_sparse_attention.json")


@dataclass(frozen=True)
class HeadConfig:
    """One layer's shape. ``heads`` query heads (= value heads of a linear layer) of width ``d_head``
    (``d_k = d_v``), ``kv_heads`` cached key/value heads, ``bytes_per_elem`` for cache *and* state (bf16:
    2; a float32 state doubles the state's bytes). The other fields size one mechanism each:
    ``chunk`` (linear / delta chunk length), ``block_size`` and ``band_blocks`` (block-sparse: each query
    block visits its own and the ``band_blocks - 1`` blocks before it), ``top_k``, ``index_heads``,
    ``index_dim`` (the top-k layer's indexer: about 1/16 of an attention pair's FLOPs, DSA's proportion),
    ``lsh_tables``, ``lsh_bits`` (ANNA, SimHash), ``grassmann_rank`` and ``grassmann_offsets`` (a
    Grassmann layer mixing a ``heads * d_head`` wide stream), ``hybrid_ratio`` (``r`` Gated DeltaNet
    layers per full softmax layer)."""
    heads: int = 16
    kv_heads: int = 4
    d_head: int = 128
    bytes_per_elem: int = 2
    chunk: int = 64
    block_size: int = 64
    band_blocks: int = 8
    top_k: int = 2048
    index_heads: int = 4
    index_dim: int = 64
    lsh_tables: int = 4
    lsh_bits: int = 8
    grassmann_rank: int = 32
    grassmann_offsets: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    hybrid_ratio: int = 3

    @property
    def d_model(self) -> int:
        return self.heads * self.d_head


@dataclass(frozen=True)
class Flops:
    """FLOPs split into what ``FlopCounterMode`` sees (matrix products) and what it does not."""
    matmul: float
    elementwise: float = 0.0

    @property
    def total(self) -> float:
        return self.matmul + self.elementwise

    def __add__(self, other: Flops) -> Flops:
        return Flops(self.matmul + other.matmul, self.elementwise + other.elementwise)

    def scaled(self, c: float) -> Flops:
        return Flops(c * self.matmul, c * self.elementwise)


# ---------------------------------------------------------------------------------------------
# The cost models' shared pieces
# ---------------------------------------------------------------------------------------------

def _pair(cfg: HeadConfig) -> int:
    """FLOPs of one (query, key) pair over all heads: a score and a weighted value, ``2 H (d_k + d_v)``."""
    d = cfg.d_head
    return 2 * cfg.heads * (d + d)


def _cache_per_token(cfg: HeadConfig) -> int:
    """Bytes of one token's keys and values in the KV cache, all key/value heads."""
    return 2 * cfg.kv_heads * cfg.d_head * cfg.bytes_per_elem


def _randn(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


def band_keys(t: int, cfg: HeadConfig) -> int:
    """Keys a query at position ``t`` (1-based) reads in the block-sparse local band: its own block up
    to itself and the ``band_blocks - 1`` full blocks before it (the kernel computes its diagonal block
    whole; the decode step reads only the keys that exist)."""
    B = cfg.block_size
    return min(t, (cfg.band_blocks - 1) * B + (t - 1) % B + 1)


def _band_prefill_pairs(T: int, cfg: HeadConfig) -> int:
    """Pairs the block-sparse kernel computes for a prompt of ``T`` tokens: query block ``i`` times the
    key blocks ``max(0, i - band_blocks + 1) .. i``, whole blocks (``T`` rounded up to blocks)."""
    B, nb = cfg.block_size, -(-T // cfg.block_size)
    return sum(B * B * min(i + 1, cfg.band_blocks) for i in range(nb))


def _delta_chunk_elementwise(cfg: HeadConfig, gated: bool) -> float:
    """Per token and head, the chunk form's work outside matrix products: the unit-triangular solve
    ``(I + A)^{-1} diag(beta)`` by forward substitution (``C (C - 1)`` per token) and ``beta * A``
    (``C``); gated, also ``A . Gamma`` and ``P . Gamma`` (``2 C``), the ``gamma`` scalings of ``Q``, ``K``
    and ``K_end`` (``3 d``) and the state's decay once per chunk (``d^2 / C``)."""
    C, d = cfg.chunk, cfg.d_head
    extra = C * (C - 1) + C
    if gated:
        extra += 2 * C + 3 * d + d * d / C
    return extra


def _grassmann_per_token(cfg: HeadConfig) -> Flops:
    """The mixing signal of the causal Grassmann layer in the kernel's order: per offset the partner's
    part orthogonal to ``z_t`` (two projections, ``~8 r``), its norm (``2 r``) and the running sum
    ``w_hat`` (``2 r``); then one Plücker vector (``3 C(r,2)``) and its projection to the model width,
    ``2 C(r,2) d_model`` -- the only matrix product. The reduction ``W_red`` and the gate are projections,
    like attention's ``W_Q, W_K, W_V, W_O``, and are left out of every mechanism here."""
    r, W = cfg.grassmann_rank, len(cfg.grassmann_offsets)
    return Flops(2 * n_pairs(r) * cfg.d_model, W * 12 * r + 3 * n_pairs(r))


# ---------------------------------------------------------------------------------------------
# One block per mechanism: its formulas (prefill FLOPs per token at prompt length T, decode FLOPs at t
# keys read, bytes kept after T tokens), and the attnlib references that count it. The counting
# functions receive the q, k, v the caller drew first, so that every mechanism draws in the same order.
# ---------------------------------------------------------------------------------------------

# --- softmax -----------------------------------------------------------------------------------

def _softmax_prefill(T: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * (T + 1) / 2)


def _softmax_decode(t: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * t)


def _softmax_memory(T: int, cfg: HeadConfig) -> float:
    return _cache_per_token(cfg) * T


def _softmax_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    # one query row at a time against the keys it reads: the reference would form all T^2 scores
    return sum(count_flops(lambda t=t: softmax_attention_reference(q[:, :, t - 1:t], k[:, :, :t], v[:, :, :t],
                                                                    scale=1.0, causal=False))
               for t in range(1, T + 1)) / T


def _cache_count_decode(n_keys: Callable[[int, HeadConfig], int], q1, k1, v1, t: int, cfg: HeadConfig,
                        gen: torch.Generator) -> float:
    """One query against the ``n_keys(t)`` cached keys it reads (softmax: all ``t``; block-sparse: its band)."""
    H, d = cfg.heads, cfg.d_head
    n = n_keys(t, cfg)
    k, v = _randn(gen, 1, H, n, d), _randn(gen, 1, H, n, d)
    return count_flops(lambda: softmax_attention_reference(q1, k, v, scale=1.0, causal=False))


def _softmax_decode_step(x: Mapping[str, torch.Tensor]) -> Callable[[], object]:
    # one query against a cache of t keys: every key is in its past, hence not causal
    return lambda: softmax_attention(x["q1"], x["k"], x["v"], causal=False, backend="torch")


# --- block-sparse (local band) -----------------------------------------------------------------

def _block_sparse_prefill(T: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * _band_prefill_pairs(T, cfg) / T)


def _block_sparse_decode(t: int, cfg: HeadConfig) -> Flops:
    return Flops(_pair(cfg) * band_keys(t, cfg))


def _block_sparse_memory(T: int, cfg: HeadConfig) -> float:
    return _cache_per_token(cfg) * min(T, cfg.band_blocks * cfg.block_size)


def _block_sparse_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    # query block i against the whole key blocks of its band, as the kernel computes them
    B, total = cfg.block_size, 0
    for i in range(-(-T // B)):
        lo = max(0, i - cfg.band_blocks + 1) * B
        qs = q[:, :, i * B:(i + 1) * B]
        total += count_flops(lambda qs=qs, lo=lo, i=i: softmax_attention_reference(
            qs, k[:, :, lo:(i + 1) * B], v[:, :, lo:(i + 1) * B], scale=1.0, causal=False))
    return total / T


# --- linear attention --------------------------------------------------------------------------

def _linear_prefill(T: int, cfg: HeadConfig) -> Flops:
    H, d = cfg.heads, cfg.d_head
    return Flops(H * (2 * cfg.chunk * (d + d) + 4 * d * d))


def _linear_decode(t: int, cfg: HeadConfig) -> Flops:
    # The counter counts the outer product [d_v, 1] @ [1, d_k] as 2 d_k d_v: its multiplies plus, in
    # effect, the add into the state, which attnlib does elementwise.
    H, d = cfg.heads, cfg.d_head
    return Flops(H * 4 * d * d)


def _state_memory(T: int, cfg: HeadConfig) -> float:
    """A ``d_k x d_v`` state per head, whatever ``T`` (linear attention and both delta rules)."""
    H, d, b = cfg.heads, cfg.d_head, cfg.bytes_per_elem
    return H * d * d * b


def _linear_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    return count_flops(lambda: linear_attention_chunk_reference(q, k, v, causal=True, chunk_size=cfg.chunk)) / T


def _linear_count_decode(q1, k1, v1, t: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    S = _randn(gen, 1, cfg.heads, cfg.d_head, cfg.d_head)
    return count_flops(lambda: linear_attention_decode_step(q1, k1, v1, initial_state=S))


def _linear_decode_step(x: Mapping[str, torch.Tensor]) -> Callable[[], object]:
    return lambda: linear_attention_decode_step(x["q1"], x["k1"], x["v1"], initial_state=x["S"])


# --- the delta rule, plain and gated -----------------------------------------------------------

def _delta_prefill(gated: bool, T: int, cfg: HeadConfig) -> Flops:
    H, d, C = cfg.heads, cfg.d_head, cfg.chunk
    return Flops(H * (6 * C * d + 4 * C * d + 6 * d * d), H * _delta_chunk_elementwise(cfg, gated))


def _delta_decode(gated: bool, t: int, cfg: HeadConfig) -> Flops:
    H, d = cfg.heads, cfg.d_head
    extra = 2 * d * d + 2 * d + (d * d if gated else 0)
    return Flops(H * 4 * d * d, H * extra)


def _delta_count_prefill(gated: bool, q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    H = cfg.heads
    beta = torch.rand(1, H, T, generator=gen)
    g = -torch.rand(1, H, T, generator=gen) if gated else None
    return count_flops(lambda: delta_rule_chunk_reference(q, k, v, beta, g, scale=1.0, chunk_size=cfg.chunk)) / T


def _delta_count_decode(gated: bool, q1, k1, v1, t: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    H, d = cfg.heads, cfg.d_head
    S, beta = _randn(gen, 1, H, d, d), torch.rand(1, H, 1, generator=gen)
    g = -torch.rand(1, H, 1, generator=gen) if gated else None
    return count_flops(lambda: delta_rule_decode_step(q1, k1, v1, beta, g=g, initial_state=S))


def _gated_delta_decode_step(x: Mapping[str, torch.Tensor]) -> Callable[[], object]:
    return lambda: delta_rule_decode_step(x["q1"], x["k1"], x["v1"], x["beta"], g=x["g"], initial_state=x["S"])


# --- ANNA (LSH) --------------------------------------------------------------------------------

def _anna_per_token(T: int, cfg: HeadConfig) -> Flops:
    """Hash the query and the key, add ``v`` to one bucket and read one bucket per table: the same in
    prefill and decode."""
    H, d, l, z = cfg.heads, cfg.d_head, cfg.lsh_tables, cfg.lsh_bits
    return Flops(H * 4 * l * z * d, H * (2 * l * d + d))


def _anna_memory(T: int, cfg: HeadConfig) -> float:
    return cfg.heads * cfg.lsh_tables * min(T, 2 ** cfg.lsh_bits) * (cfg.d_head + 1) * cfg.bytes_per_elem


def _anna_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    proj = lsh_projections("simhash", cfg.lsh_tables, cfg.lsh_bits, cfg.d_head, seed=0).float()
    return count_flops(lambda: anna_attention_reference(q, k, v, proj, family="simhash", causal=True)) / T


# --- Grassmann ---------------------------------------------------------------------------------

def _grassmann_cost(T: int, cfg: HeadConfig) -> Flops:
    # no quadratic part: the same per-token work in prefill and decode, whatever T
    return _grassmann_per_token(cfg)


def _grassmann_memory(T: int, cfg: HeadConfig) -> float:
    return max(cfg.grassmann_offsets) * cfg.grassmann_rank * cfg.bytes_per_elem


def _grassmann_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    z, w = _randn(gen, 1, T, cfg.grassmann_rank), _randn(gen, cfg.d_model, n_pairs(cfg.grassmann_rank))
    return count_flops(lambda: plucker_projection_collapsed(z, w, cfg.grassmann_offsets)) / T


# --- top-k + indexer ---------------------------------------------------------------------------

def _topk_prefill(T: int, cfg: HeadConfig) -> Flops:
    HI, dI = cfg.index_heads, cfg.index_dim
    k = cfg.top_k                                            # mean of min(k, t) over t = 1..T
    mean_keys = (T + 1) / 2 if T <= k else (k * (k + 1) / 2 + (T - k) * k) / T
    return Flops(2 * HI * dI * (T + 1) / 2 + _pair(cfg) * mean_keys, 3 * HI * (T + 1) / 2)


def _topk_decode(t: int, cfg: HeadConfig) -> Flops:
    HI, dI = cfg.index_heads, cfg.index_dim
    return Flops(2 * HI * dI * t + _pair(cfg) * min(cfg.top_k, t), 3 * HI * t)


def _topk_memory(T: int, cfg: HeadConfig) -> float:
    # the KV cache does not shrink, and one index key per token is added to it
    return (_cache_per_token(cfg) + cfg.index_dim * cfg.bytes_per_elem) * T


def _topk_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    # per query, as for softmax: the references would score and gather for all T queries at once
    iq, ik = _randn(gen, 1, cfg.index_heads, T, cfg.index_dim), _randn(gen, 1, 1, T, cfg.index_dim)
    iw = torch.rand(1, cfg.index_heads, T, generator=gen)
    total = 0
    for t in range(1, T + 1):
        I = index_scores_reference(iq[:, :, t - 1:t], ik[:, :, :t], iw[:, :, t - 1:t])   # [1, 1, 1, t]
        idx = topk_select_reference(I, cfg.top_k, causal=False)
        total += count_flops(lambda t=t: index_scores_reference(iq[:, :, t - 1:t], ik[:, :, :t], iw[:, :, t - 1:t]))
        total += count_flops(lambda t=t, idx=idx: topk_attention_reference(q[:, :, t - 1:t], k[:, :, :t],
                                                                           v[:, :, :t], idx, scale=1.0))
    return total / T


def _topk_count_decode(q1, k1, v1, t: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    H, d = cfg.heads, cfg.d_head
    iq, ik, iw = _randn(gen, 1, cfg.index_heads, 1, cfg.index_dim), _randn(gen, 1, 1, t, cfg.index_dim), torch.rand(
        1, cfg.index_heads, 1, generator=gen)
    k, v = _randn(gen, 1, H, t, d), _randn(gen, 1, H, t, d)
    idx = topk_select_reference(index_scores_reference(iq, ik, iw), cfg.top_k, causal=False)
    return (count_flops(lambda: index_scores_reference(iq, ik, iw))
            + count_flops(lambda: topk_attention_reference(q1, k, v, idx, scale=1.0)))


# The one place the counter and the model differ: a top-k query at t = 1 has one slot, and the einsum
# ``p @ v_sel`` over a single slot is an elementwise product, which FlopCounterMode does not count. So the
# counted prefill of the top-k layer falls short of the model by ``2 H d_v / T`` per token, no more.
def _topk_count_tolerance(T: int, cfg: HeadConfig) -> float:
    return 2 * cfg.heads * cfg.d_head / T


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

def prefill_flops(mechanism: str, T: int, cfg: HeadConfig = HeadConfig()) -> Flops:
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


def decode_flops(mechanism: str, t: int, cfg: HeadConfig = HeadConfig()) -> Flops:
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


def memory_bytes(mechanism: str, T: int, cfg: HeadConfig = HeadConfig()) -> float:
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


def landscape_curves(lengths: Sequence[int], cfg: HeadConfig = HeadConfig(),
                     mechanisms: Sequence[str] = MECHANISMS) -> dict[str, dict[str, list[float]]]:
    """``{panel: {mechanism: values at lengths}}`` for the panels ``prefill``, ``decode`` (FLOPs per
    token, totals) and ``memory`` (bytes per token of context: ``memory_bytes / T``)."""
    return {
        "prefill": {m: [prefill_flops(m, T, cfg).total for T in lengths] for m in mechanisms},
        "decode": {m: [decode_flops(m, T, cfg).total for T in lengths] for m in mechanisms},
        "memory": {m: [memory_bytes(m, T, cfg) / T for T in lengths] for m in mechanisms},
    }


# ---------------------------------------------------------------------------------------------
# Counting the references
# ---------------------------------------------------------------------------------------------

def _count_prefill(mechanism: str, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    """Counted matrix-product FLOPs per token of the attnlib reference that computes what the kernel
    computes. Softmax, block-sparse and top-k are counted *per query* -- each query row against the keys
    it reads -- because their references form all ``T^2`` scores and mask afterwards (the kernels skip
    the masked blocks); the others run their chunked references on the whole prompt."""
    H, d = cfg.heads, cfg.d_head
    q, k, v = _randn(gen, 1, H, T, d), _randn(gen, 1, H, T, d), _randn(gen, 1, H, T, d)
    return REGISTRY[mechanism].count_prefill(q, k, v, T, cfg, gen)


def _count_decode(mechanism: str, t: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    """Counted matrix-product FLOPs of one decode step that reads ``t`` positions, on the references."""
    H, d = cfg.heads, cfg.d_head
    q1, k1, v1 = _randn(gen, 1, H, 1, d), _randn(gen, 1, H, 1, d), _randn(gen, 1, H, 1, d)
    return REGISTRY[mechanism].count_decode(q1, k1, v1, t, cfg, gen)


def count_tolerance(mechanism: str, T: int, cfg: HeadConfig = HeadConfig()) -> float:
    """How far (FLOPs per token) the counted prefill may fall below the model's ``matmul`` part: 0, except
    for the top-k layer, whose first query's single-slot ``p @ v_sel`` the counter misses (``2 H d_v / T``)."""
    record = REGISTRY.get(mechanism)
    return 0.0 if record is None or record.count_tolerance is None else record.count_tolerance(T, cfg)


def counted_flops(lengths: Sequence[int], cfg: HeadConfig, *, generator: torch.Generator
                  ) -> dict[str, dict[str, list[float]]]:
    """``{"prefill" | "decode": {mechanism: counted FLOPs per token at each length}}`` on attnlib's
    references (``torch.utils.flop_counter``: matrix products only), with the model's ``matmul`` and
    ``total`` beside them under ``"<mechanism>:model"`` and ``"<mechanism>:total"``. Small sizes: the
    references build ``[T, T]`` or gathered tensors. Prefill lengths should be multiples of the chunk
    and block sizes (the formulas assume whole chunks)."""
    out: dict[str, dict[str, list[float]]] = {"prefill": {}, "decode": {}}
    for m in COUNTED_PREFILL:
        out["prefill"][m] = [_count_prefill(m, T, cfg, generator) for T in lengths]
        out["prefill"][f"{m}:model"] = [prefill_flops(m, T, cfg).matmul for T in lengths]
        out["prefill"][f"{m}:total"] = [prefill_flops(m, T, cfg).total for T in lengths]
    for m in COUNTED_DECODE:
        out["decode"][m] = [_count_decode(m, t, cfg, generator) for t in lengths]
        out["decode"][f"{m}:model"] = [decode_flops(m, t, cfg).matmul for t in lengths]
        out["decode"][f"{m}:total"] = [decode_flops(m, t, cfg).total for t in lengths]
    return out


# ---------------------------------------------------------------------------------------------
# Crossovers
# ---------------------------------------------------------------------------------------------

def memory_crossover(cfg: HeadConfig = HeadConfig()) -> float:
    """``T_mem = H_v d_k d_v / (2 H_kv d_h)``: the length at which one layer's KV cache holds as many
    numbers as a linear / delta layer's state (same bytes per number)."""
    return cfg.heads * cfg.d_head * cfg.d_head / (2 * cfg.kv_heads * cfg.d_head)


def decode_break_even(mechanism: str, cfg: HeadConfig = HeadConfig()) -> float:
    """The ``t`` at which softmax decode (``2 H (d_k + d_v) t``) costs what a recurrent layer's decode
    step costs (constant in ``t``): ``t* = decode_flops(mechanism).total / (2 H (d_k + d_v))``. For plain
    linear attention with ``d_k = d_v = d``: ``t* = 4 H d^2 / (4 H d) = d``."""
    if mechanism not in RECURRENT:
        raise ValueError(f"mechanism must be one of {RECURRENT}; got {mechanism!r}")
    return decode_flops(mechanism, 1, cfg).total / (2 * cfg.heads * 2 * cfg.d_head)


def first_length_where(cost_a: Callable[[int], float], cost_b: Callable[[int], float], *, start: int = 1,
                       stop: int = 1 << 24) -> int | None:
    """The smallest integer ``T`` in ``[start, stop)`` with ``cost_a(T) >= cost_b(T)``, by doubling then
    bisection (``cost_a - cost_b`` must change sign once, from negative to non-negative), or None."""
    if cost_a(start) >= cost_b(start):
        return start
    lo, hi = start, start * 2
    while hi < stop and cost_a(hi) < cost_b(hi):
        lo, hi = hi, hi * 2
    if hi >= stop:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if cost_a(mid) < cost_b(mid) else (lo, mid)
    return hi


# ---------------------------------------------------------------------------------------------
# Measured times
# ---------------------------------------------------------------------------------------------

def gpu_rows(results: Mapping[str, Mapping | None], *, ops=None) -> list[dict]:
    """The committed GPU benchmark rows, each with the device, date and versions its file records.

    ``results`` maps a file name to its parsed JSON (``{"device", "date", "versions", "rows"}``) or None
    (not found: skipped). Rows measured more than once (a file may hold repeated runs) are merged:
    ``ms`` is the median of the recorded times, ``runs`` how many there were. Nothing is invented: a
    field the file lacks stays absent."""
    merged: dict[tuple, dict] = {}
    for name, doc in results.items():
        if not doc:
            continue
        for row in doc.get("rows", []):
            if ops is not None and row.get("op") not in ops:
                continue
            key = (doc.get("device"), tuple(sorted((k, v) for k, v in row.items() if k not in ("ms", "tflops"))))
            entry = merged.setdefault(key, {**{k: v for k, v in row.items() if k not in ("ms", "tflops")},
                                            "device": doc.get("device"), "date": doc.get("date"),
                                            "versions": doc.get("versions"), "file": name, "_ms": []})
            entry["_ms"].append(float(row["ms"]))
    out = []
    for entry in merged.values():
        ms = entry.pop("_ms")
        out.append({**entry, "ms": float(np.median(ms)), "runs": len(ms)})
    return out


def cpu_decode_times(contexts: Sequence[int], cfg: HeadConfig, *, reps: int = 7, generator: torch.Generator,
                     mechanisms: Sequence[str] = ("softmax", "linear", "gated_delta")) -> dict[str, dict[str, list]]:
    """CPU time (``time.process_time``, one thread, ms) of one decode step per mechanism at each context
    length, on attnlib's PyTorch paths: softmax reads a cache of ``t`` keys
    (:func:`attnlib.softmax_attention`), linear and Gated DeltaNet update their state
    (:func:`attnlib.linear_attention_decode_step`, :func:`attnlib.delta_rule_decode_step`). Repeats are
    interleaved (every call once per round) so that a burst of load spreads over all points.

    Returns ``{mechanism: {"t": [...], "median": [...], "q1": [...], "q3": [...]}}``. A fact of this
    machine at this moment: shown, never asserted."""
    timed = tuple(m for m, r in REGISTRY.items() if r.decode_step is not None)
    unknown = [m for m in mechanisms if m not in timed]
    if unknown:
        raise ValueError(f"mechanisms must be among {timed} (those with a timed decode step); got {unknown}")
    H, d = cfg.heads, cfg.d_head
    calls = {}
    for t in contexts:
        # every input is drawn whichever mechanisms are timed, so a subset times the same tensors
        x = dict(zip(("q1", "k1", "v1"), (torch.randn(1, H, 1, d, generator=generator) for _ in range(3))))
        x["k"], x["v"] = torch.randn(1, H, t, d, generator=generator), torch.randn(1, H, t, d, generator=generator)
        x["S"] = torch.randn(1, H, d, d, generator=generator)
        x["beta"], x["g"] = torch.rand(1, H, 1, generator=generator), -torch.rand(1, H, 1, generator=generator)
        for m in timed:
            if m in mechanisms:
                calls[m, t] = REGISTRY[m].decode_step(x)
    samples = interleaved_cpu_ms(calls, reps)
    out: dict[str, dict[str, list]] = {}
    for m in mechanisms:
        qs = np.array([np.percentile(samples[m, t], [25, 50, 75]) for t in contexts])
        out[m] = {"t": list(contexts), "q1": qs[:, 0].tolist(), "median": qs[:, 1].tolist(), "q3": qs[:, 2].tolist()}
    return out


# ---------------------------------------------------------------------------------------------
# Exactness and recall
# ---------------------------------------------------------------------------------------------

class _ExactSoftmax:
    """Softmax attention itself, shaped as a chapter-2 algorithm (``attend``), so that the adversary's
    planted row can be measured on it too."""
    name = "softmax"

    def attend(self, q, k, v):
        return softmax_attention(q, k, v, causal=False, backend="torch")


def adversary_errors(T: int = 256, d: int = 16, M: float = 80.0, *, top_k: int = 16,
                     seed: int = 0) -> dict[str, float | None]:
    """Chapter 2's planted-needle error ``||p_i - r_i||_1`` (0 = exact, 2 = the needle missed entirely) for
    each mechanism the adversary applies to (:data:`ADVERSARY`); None where none applies. Softmax is
    measured on the sliding-window attack's input; the top-k layer is
    :func:`attnbook.experiments.topk.signed_indexer_needle` at DeepSeek-V3.2's index shapes (signed weights,
    the needle's index key placed lowest in its row), keeping ``top_k`` keys per query."""
    out: dict[str, float | None] = {}
    for mech, (algo_name, _ran, _why) in ADVERSARY.items():
        if algo_name is None:
            out[mech] = None
        elif algo_name == "exact":
            case = needle.attack(needle.make("sliding_window", T=T, d=d, seed=seed), M=M)
            out[mech] = needle.row_error(_ExactSoftmax(), case)
        elif algo_name == "lightning_indexer":
            out[mech] = signed_indexer_needle(T, M, top_k, d=d, generator=torch.Generator().manual_seed(seed))["error"]
        else:
            algo = needle.make(algo_name, T=T, d=d, seed=seed)
            out[mech] = needle.row_error(algo, needle.attack(algo, M=M))
    return out


def delta_rule_verdict(pair_counts: Sequence[int], recall: Mapping[str, Mapping[str, torch.Tensor]], *,
                       margin: float = 0.05) -> dict[str, list[int]]:
    """From :func:`attnbook.experiments.recall.recall_vs_pairs`'s output: per regime, the numbers of pairs
    ``N`` at which the delta rule's mean recall beats Hebbian's by more than ``margin`` (``"<regime>"``)
    and those at which Hebbian's beats the delta rule's by more than ``margin`` (``"<regime>:hebbian"``)."""
    out: dict[str, list[int]] = {}
    for regime, by_rule in recall.items():
        lin, dlt = by_rule["linear"].mean(1), by_rule["delta"].mean(1)
        out[regime] = [int(n) for n, a, b in zip(pair_counts, lin, dlt) if b - a > margin]
        out[f"{regime}:hebbian"] = [int(n) for n, a, b in zip(pair_counts, lin, dlt) if a - b > margin]
    return out


def exactness_table(errors: Mapping[str, float | None], pair_counts: Sequence[int],
                    recall: Mapping[str, Mapping[str, torch.Tensor]], *, dim: int,
                    mqar: Mapping[str, Mapping[str, float]] | None = None) -> list[dict]:
    """One row per mechanism: chapter 2's adversary error (or why it does not apply), the state's
    no-training recall at the smallest and largest ``N`` (distinct keys, and with overwrites) where the
    capacity experiment has the mechanism, and trained MQAR recalls from ``mqar`` (trained elsewhere):
    ``mqar[column][mechanism]`` becomes the row's ``"mqar_<column>"`` (blank where a mechanism has none).
    ``recall`` is :func:`attnbook.experiments.recall.recall_vs_pairs`'s output."""
    mqar = mqar or {}
    rows = []
    for mech, record in REGISTRY.items():
        algo, ran, why = record.adversary
        row = {"mechanism": record.label, "measured_as": record.measured_as, "adversary": ran if algo else "n/a",
               "error": errors.get(mech), "why": why}
        r = record.recall_rule
        for regime in recall:
            for idx in (0, -1):
                key = f"recall_{regime}_N{pair_counts[idx]}"
                row[key] = None if r is None else float(recall[regime][r][idx].mean())
        row["capacity_note"] = record.capacity_note.format(dim=dim)
        for column, by_mech in mqar.items():
            row[f"mqar_{column}"] = by_mech.get(mech)
        rows.append(row)
    return rows


__all__ = ["ADVERSARY", "COUNTED_DECODE", "COUNTED_PREFILL", "Cited", "DESIGNS", "Flops", "GPU_RESULT_FILES",
           "HeadConfig", "LABELS", "MECHANISMS", "Mechanism", "RECURRENT", "REGISTRY", "adversary_errors",
           "attention_dims", "band_keys", "count_tolerance", "counted_flops", "cpu_decode_times",
           "decode_break_even", "decode_flops", "delta_rule_verdict", "design_row", "design_sources",
           "design_table", "exactness_table", "first_length_where", "gpu_rows", "indexer_hosts",
           "landscape_curves", "memory_bytes", "memory_crossover", "pair_flops", "prefill_flops", "quadratic_share"]
