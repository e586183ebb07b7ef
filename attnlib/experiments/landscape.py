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
* **Published designs** (:data:`DESIGNS`): each config number with the source it was read from, and a
  flag where it could not be verified; :func:`design_table` computes cache, state, ``f`` and ``T_mem``.

Conventions. ``T`` is the prompt length (prefill: FLOPs per token averaged over the prompt); ``t`` the
number of keys a decoded token reads (itself included). Causal everywhere. One sequence (batch 1), one
layer. Memory "per token" is the layer's cache or state after ``T`` tokens, divided by ``T``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .. import needle
from ..anna import anna_attention_reference, lsh_projections
from ..attention import softmax_attention, softmax_attention_reference
from ..deltanet import delta_rule_chunk_reference, delta_rule_decode_step
from ..grassmann import n_pairs, plucker_projection_collapsed
from ..linear import linear_attention_chunk_reference, linear_attention_decode_step
from ..topk import index_scores_reference, topk_attention_reference, topk_select_reference
from .linear import count_flops, interleaved_cpu_ms
from .topk import signed_indexer_needle

MECHANISMS = ("softmax", "block_sparse", "linear", "delta", "gated_delta", "anna", "grassmann", "topk", "hybrid")
LABELS = {"softmax": "softmax (causal)", "block_sparse": "block-sparse (local band)", "linear": "linear",
          "delta": "DeltaNet", "gated_delta": "Gated DeltaNet", "anna": "ANNA (LSH)", "grassmann": "Grassmann",
          "topk": "top-k + indexer", "hybrid": "hybrid (1 full in r+1)"}
RECURRENT = ("linear", "delta", "gated_delta")        # a d_k x d_v state per head
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
# The cost models, per layer and token
# ---------------------------------------------------------------------------------------------

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
    H, d = cfg.heads, cfg.d_head
    pair = 2 * H * (d + d)                                       # one (query, key) pair, all heads
    if mechanism == "softmax":
        return Flops(pair * (T + 1) / 2)
    if mechanism == "block_sparse":
        return Flops(pair * _band_prefill_pairs(T, cfg) / T)
    if mechanism == "linear":
        return Flops(H * (2 * cfg.chunk * (d + d) + 4 * d * d))
    if mechanism in ("delta", "gated_delta"):
        C = cfg.chunk
        return Flops(H * (6 * C * d + 4 * C * d + 6 * d * d),
                     H * _delta_chunk_elementwise(cfg, mechanism == "gated_delta"))
    if mechanism == "anna":
        l, z = cfg.lsh_tables, cfg.lsh_bits
        return Flops(H * 4 * l * z * d, H * (2 * l * d + d))
    if mechanism == "grassmann":
        return _grassmann_per_token(cfg)
    if mechanism == "topk":
        HI, dI = cfg.index_heads, cfg.index_dim
        k = cfg.top_k                                            # mean of min(k, t) over t = 1..T
        mean_keys = (T + 1) / 2 if T <= k else (k * (k + 1) / 2 + (T - k) * k) / T
        return Flops(2 * HI * dI * (T + 1) / 2 + pair * mean_keys, 3 * HI * (T + 1) / 2)
    if mechanism == "hybrid":
        r = cfg.hybrid_ratio
        return (prefill_flops("gated_delta", T, cfg).scaled(r) + prefill_flops("softmax", T, cfg)).scaled(1 / (r + 1))
    raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}")


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
    H, d = cfg.heads, cfg.d_head
    pair = 2 * H * (d + d)
    if mechanism == "softmax":
        return Flops(pair * t)
    if mechanism == "block_sparse":
        return Flops(pair * band_keys(t, cfg))
    if mechanism == "linear":
        # The counter counts the outer product [d_v, 1] @ [1, d_k] as 2 d_k d_v: its multiplies plus, in
        # effect, the add into the state, which attnlib does elementwise.
        return Flops(H * 4 * d * d)
    if mechanism in ("delta", "gated_delta"):
        extra = 2 * d * d + 2 * d + (d * d if mechanism == "gated_delta" else 0)
        return Flops(H * 4 * d * d, H * extra)
    if mechanism == "anna":
        l, z = cfg.lsh_tables, cfg.lsh_bits
        return Flops(H * 4 * l * z * d, H * (2 * l * d + d))
    if mechanism == "grassmann":
        return _grassmann_per_token(cfg)
    if mechanism == "topk":
        HI, dI = cfg.index_heads, cfg.index_dim
        return Flops(2 * HI * dI * t + pair * min(cfg.top_k, t), 3 * HI * t)
    if mechanism == "hybrid":
        r = cfg.hybrid_ratio
        return (decode_flops("gated_delta", t, cfg).scaled(r) + decode_flops("softmax", t, cfg)).scaled(1 / (r + 1))
    raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}")


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
    H, d, b = cfg.heads, cfg.d_head, cfg.bytes_per_elem
    cache_per_token = 2 * cfg.kv_heads * d * b
    if mechanism == "softmax":
        return cache_per_token * T
    if mechanism == "block_sparse":
        return cache_per_token * min(T, cfg.band_blocks * cfg.block_size)
    if mechanism in RECURRENT:
        return H * d * d * b
    if mechanism == "anna":
        return H * cfg.lsh_tables * min(T, 2 ** cfg.lsh_bits) * (d + 1) * b
    if mechanism == "grassmann":
        return max(cfg.grassmann_offsets) * cfg.grassmann_rank * b
    if mechanism == "topk":
        return (cache_per_token + cfg.index_dim * b) * T
    if mechanism == "hybrid":
        r = cfg.hybrid_ratio
        return (r * memory_bytes("gated_delta", T, cfg) + memory_bytes("softmax", T, cfg)) / (r + 1)
    raise ValueError(f"unknown mechanism {mechanism!r}; expected one of {MECHANISMS}")


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

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q, k, v = rnd(1, H, T, d), rnd(1, H, T, d), rnd(1, H, T, d)
    if mechanism == "softmax":
        return sum(count_flops(lambda t=t: softmax_attention_reference(q[:, :, t - 1:t], k[:, :, :t], v[:, :, :t],
                                                                        scale=1.0)) for t in range(1, T + 1)) / T
    if mechanism == "block_sparse":
        B, total = cfg.block_size, 0
        for i in range(-(-T // B)):
            lo = max(0, i - cfg.band_blocks + 1) * B
            qs = q[:, :, i * B:(i + 1) * B]
            total += count_flops(lambda qs=qs, lo=lo, i=i: softmax_attention_reference(
                qs, k[:, :, lo:(i + 1) * B], v[:, :, lo:(i + 1) * B], scale=1.0))
        return total / T
    if mechanism == "linear":
        return count_flops(lambda: linear_attention_chunk_reference(q, k, v, chunk_size=cfg.chunk)) / T
    if mechanism in ("delta", "gated_delta"):
        beta = torch.rand(1, H, T, generator=gen)
        g = -torch.rand(1, H, T, generator=gen) if mechanism == "gated_delta" else None
        return count_flops(lambda: delta_rule_chunk_reference(q, k, v, beta, g, scale=1.0, chunk_size=cfg.chunk)) / T
    if mechanism == "anna":
        proj = lsh_projections("simhash", cfg.lsh_tables, cfg.lsh_bits, d, seed=0).float()
        return count_flops(lambda: anna_attention_reference(q, k, v, proj, family="simhash", causal=True)) / T
    if mechanism == "grassmann":
        z, w = rnd(1, T, cfg.grassmann_rank), rnd(cfg.d_model, n_pairs(cfg.grassmann_rank))
        return count_flops(lambda: plucker_projection_collapsed(z, w, cfg.grassmann_offsets)) / T
    if mechanism == "topk":
        iq, ik = rnd(1, cfg.index_heads, T, cfg.index_dim), rnd(1, 1, T, cfg.index_dim)
        iw = torch.rand(1, cfg.index_heads, T, generator=gen)
        total = 0
        for t in range(1, T + 1):
            I = index_scores_reference(iq[:, :, t - 1:t], ik[:, :, :t], iw[:, :, t - 1:t])   # [1, 1, 1, t]
            idx = topk_select_reference(I, cfg.top_k, causal=False)
            total += count_flops(lambda t=t: index_scores_reference(iq[:, :, t - 1:t], ik[:, :, :t], iw[:, :, t - 1:t]))
            total += count_flops(lambda t=t, idx=idx: topk_attention_reference(q[:, :, t - 1:t], k[:, :, :t],
                                                                               v[:, :, :t], idx, scale=1.0))
        return total / T
    raise ValueError(f"no reference to count for {mechanism!r}")


def _count_decode(mechanism: str, t: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    """Counted matrix-product FLOPs of one decode step that reads ``t`` positions, on the references."""
    H, d = cfg.heads, cfg.d_head

    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q1, k1, v1 = rnd(1, H, 1, d), rnd(1, H, 1, d), rnd(1, H, 1, d)
    if mechanism in ("softmax", "block_sparse"):
        n = t if mechanism == "softmax" else band_keys(t, cfg)
        k, v = rnd(1, H, n, d), rnd(1, H, n, d)
        return count_flops(lambda: softmax_attention_reference(q1, k, v, scale=1.0))
    if mechanism == "linear":
        S = rnd(1, H, d, d)
        return count_flops(lambda: linear_attention_decode_step(q1, k1, v1, S))
    if mechanism in ("delta", "gated_delta"):
        S, beta = rnd(1, H, d, d), torch.rand(1, H, 1, generator=gen)
        g = -torch.rand(1, H, 1, generator=gen) if mechanism == "gated_delta" else None
        return count_flops(lambda: delta_rule_decode_step(q1, k1, v1, beta, S, g=g))
    if mechanism == "topk":
        iq, ik, iw = rnd(1, cfg.index_heads, 1, cfg.index_dim), rnd(1, 1, t, cfg.index_dim), torch.rand(
            1, cfg.index_heads, 1, generator=gen)
        k, v = rnd(1, H, t, d), rnd(1, H, t, d)
        idx = topk_select_reference(index_scores_reference(iq, ik, iw), cfg.top_k, causal=False)
        return (count_flops(lambda: index_scores_reference(iq, ik, iw))
                + count_flops(lambda: topk_attention_reference(q1, k, v, idx, scale=1.0)))
    raise ValueError(f"no decode reference to count for {mechanism!r}")


# The one place the counter and the model differ: a top-k query at t = 1 has one slot, and the einsum
# ``p @ v_sel`` over a single slot is an elementwise product, which FlopCounterMode does not count. So the
# counted prefill of the top-k layer falls short of the model by ``2 H d_v / T`` per token, no more.
COUNTED_PREFILL = ("softmax", "block_sparse", "linear", "delta", "gated_delta", "anna", "grassmann", "topk")
COUNTED_DECODE = ("softmax", "block_sparse", "linear", "delta", "gated_delta", "topk")


def count_tolerance(mechanism: str, T: int, cfg: HeadConfig = HeadConfig()) -> float:
    """How far (FLOPs per token) the counted prefill may fall below the model's ``matmul`` part: 0, except
    for the top-k layer, whose first query's single-slot ``p @ v_sel`` the counter misses (``2 H d_v / T``)."""
    return 2 * cfg.heads * cfg.d_head / T if mechanism == "topk" else 0.0


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
    H, d = cfg.heads, cfg.d_head
    calls = {}
    for t in contexts:
        q1, k1, v1 = (torch.randn(1, H, 1, d, generator=generator) for _ in range(3))
        k, v = torch.randn(1, H, t, d, generator=generator), torch.randn(1, H, t, d, generator=generator)
        S = torch.randn(1, H, d, d, generator=generator)
        beta, g = torch.rand(1, H, 1, generator=generator), -torch.rand(1, H, 1, generator=generator)
        calls["softmax", t] = lambda q1=q1, k=k, v=v: softmax_attention(q1, k, v, backend="torch")
        calls["linear", t] = lambda q1=q1, k1=k1, v1=v1, S=S: linear_attention_decode_step(q1, k1, v1, S)
        calls["gated_delta", t] = lambda q1=q1, k1=k1, v1=v1, S=S, b=beta, g=g: delta_rule_decode_step(
            q1, k1, v1, b, S, g=g)
    calls = {key: fn for key, fn in calls.items() if key[0] in mechanisms}
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
        return softmax_attention(q, k, v, backend="torch")


# What ran against chapter 2's needle for each mechanism -- (the algorithm's name, what it is, why the
# adversary wins or why it does not apply). Where the book has the operator itself in a form the adversary
# can be aimed at (softmax, the top-k layer), that is what runs; elsewhere it is chapter 2's small model of
# the family, and the table says so.
ADVERSARY = {
    "softmax": ("exact", "softmax attention itself", "the operator itself: nothing to miss"),
    "block_sparse": ("sliding_window", "chapter 2's sliding window (a band of sqrt(T) keys)",
                     "a fixed pattern: the needle goes outside the band"),
    "linear": ("performer", "chapter 2's Performer (FAVOR+ positive random features)",
               "random features estimate the needle's weight with a variance that grows like e^M; other "
               "feature maps approximate no softmax"),
    "delta": (None, "", "not an approximation of softmax: the adversary's error is undefined"),
    "gated_delta": (None, "", "not an approximation of softmax: the adversary's error is undefined"),
    "anna": ("lsh", "chapter 2's angular-LSH buckets (Reformer-style rounds)",
             "the needle sits across a hyperplane of every round"),
    "grassmann": (None, "", "no attention rows: it mixes fixed offsets, not a softmax over keys"),
    "topk": ("lightning_indexer", "chapter 7's top-k layer (topk_attention) with a 64-head, 128-dim indexer, "
             "signed weights",
             "the needle's index key is placed where its index score is the row's lowest, at every M"),
    "hybrid": (None, "", "its full layers are exact; its linear layers are not approximations of softmax"),
}


def adversary_errors(T: int = 256, d: int = 16, M: float = 80.0, *, top_k: int = 16,
                     seed: int = 0) -> dict[str, float | None]:
    """Chapter 2's planted-needle error ``||p_i - r_i||_1`` (0 = exact, 2 = the needle missed entirely) for
    each mechanism the adversary applies to (:data:`ADVERSARY`); None where none applies. Softmax is
    measured on the sliding-window attack's input; the top-k layer is
    :func:`attnlib.experiments.topk.signed_indexer_needle` at DeepSeek-V3.2's index shapes (signed weights,
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
    """From :func:`attnlib.experiments.recall.recall_vs_pairs`'s output: per regime, the numbers of pairs
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
    ``recall`` is :func:`attnlib.experiments.recall.recall_vs_pairs`'s output."""
    rule = {"softmax": "softmax", "linear": "linear", "delta": "delta", "gated_delta": "delta"}
    mqar = mqar or {}
    rows = []
    for mech in MECHANISMS:
        algo, ran, why = ADVERSARY[mech]
        row = {"mechanism": LABELS[mech], "adversary": ran if algo else "n/a", "error": errors.get(mech), "why": why}
        r = rule.get(mech)
        for regime in recall:
            for idx in (0, -1):
                key = f"recall_{regime}_N{pair_counts[idx]}"
                row[key] = None if r is None else float(recall[regime][r][idx].mean())
        row["capacity_note"] = {
            "softmax": "keeps every pair (the cache grows)",
            "linear": f"crosstalk (N-1)/d_k: degrades past N ~ d_k = {dim}",
            "delta": f"replaces overwritten keys; below Hebbian for distinct keys past N ~ d_k = {dim}",
            "gated_delta": "as the delta rule, with a decay (gate 1 here: no forgetting)",
            "block_sparse": "exact inside its band, nothing outside",
            "topk": "exact over the k selected keys, if the indexer selects them",
            "anna": "what shares a bucket with the query",
            "grassmann": "no key-value store: the last max(offsets) tokens",
            "hybrid": "its full layers keep every pair",
        }[mech]
        for column, by_mech in mqar.items():
            row[f"mqar_{column}"] = by_mech.get(mech)
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Published designs, as cited
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cited:
    """A config number with where it was read (URL / arXiv id and field) and whether the source itself
    was read (``verified``) or only a copy or summary of it."""
    value: object
    source: str
    verified: bool = True


_TF = "https://github.com/huggingface/transformers/blob/main/src/transformers/models"
_QWEN = f"{_TF}/qwen3_next/configuration_qwen3_next.py (defaults, documented as Qwen3-Next-80B-A3B's)"
_JAMBA = f"{_TF}/jamba/configuration_jamba.py (defaults, documented as Jamba-v0.1's)"
_MIXTRAL = f"{_TF}/mixtral/configuration_mixtral.py (defaults, checkpoint mistralai/Mixtral-8x7B-v0.1)"
_DSV3 = f"{_TF}/deepseek_v3/configuration_deepseek_v3.py (defaults, DeepSeek-V3)"
_DSV32 = "https://github.com/deepseek-ai/DeepSeek-V3.2-Exp inference/config_671B_v3.2.json"
_KIMI = ("huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct config.json, as reproduced in several public "
         "repositories (the file itself not read); arXiv 2510.26692")
_MINIMAX = "huggingface.co/MiniMaxAI/MiniMax-Text-01 model card (Model Architecture); arXiv 2501.08313"

# Each design: its layers by kind, the full-attention layers' cache per token and layer (numbers), and
# the recurrent layers' state (numbers). Fields carry their sources.
DESIGNS: dict[str, dict[str, Cited | str]] = {
    "Qwen3-Next-80B-A3B": dict(
        linear_kind="Gated DeltaNet", full_kind="gated attention (GQA)",
        n_layers=Cited(48, f"{_QWEN}: num_hidden_layers"),
        full_every=Cited(4, f"{_QWEN}: full_attention_interval (layer i is full when (i+1) % 4 == 0)"),
        q_heads=Cited(16, f"{_QWEN}: num_attention_heads"),
        kv_heads=Cited(2, f"{_QWEN}: num_key_value_heads"), head_dim=Cited(256, f"{_QWEN}: head_dim"),
        lin_v_heads=Cited(32, f"{_QWEN}: linear_num_value_heads"),
        lin_k_heads=Cited(16, f"{_QWEN}: linear_num_key_heads"),
        lin_dk=Cited(128, f"{_QWEN}: linear_key_head_dim"), lin_dv=Cited(128, f"{_QWEN}: linear_value_head_dim"),
        conv=Cited(4, f"{_QWEN}: linear_conv_kernel_dim"),
    ),
    "Kimi Linear 48B-A3B": dict(
        linear_kind="KDA (gated delta rule, channel-wise decay)", full_kind="MLA (NoPE)",
        n_layers=Cited(27, f"{_KIMI}: num_hidden_layers", verified=False),
        full_layers=Cited((4, 8, 12, 16, 20, 24, 27), f"{_KIMI}: linear_attn_config.full_attn_layers (1-based)",
                          verified=False),
        mla_heads=Cited(32, f"{_KIMI}: num_attention_heads", verified=False),
        mla_latent=Cited(512, f"{_KIMI}: kv_lora_rank", verified=False),
        mla_rope=Cited(64, f"{_KIMI}: qk_rope_head_dim (cached beside the latent, as in DeepSeek's MLA; with "
                           "mla_use_nope the 64 dims may not be rotated, but they are still keys)", verified=False),
        mla_nope=Cited(128, f"{_KIMI}: qk_nope_head_dim", verified=False),
        mla_v=Cited(128, f"{_KIMI}: v_head_dim", verified=False),
        lin_v_heads=Cited(32, f"{_KIMI}: linear_attn_config.num_heads", verified=False),
        lin_k_heads=Cited(32, f"{_KIMI}: linear_attn_config.num_heads", verified=False),
        lin_dk=Cited(128, f"{_KIMI}: linear_attn_config.head_dim", verified=False),
        lin_dv=Cited(128, f"{_KIMI}: linear_attn_config.head_dim (d_v = d_k)", verified=False),
        conv=Cited(4, f"{_KIMI}: linear_attn_config.short_conv_kernel_size", verified=False),
    ),
    "MiniMax-Text-01": dict(
        linear_kind="lightning attention (linear)", full_kind="softmax attention (GQA)",
        n_layers=Cited(80, f"{_MINIMAX}: Number Layers"),
        full_every=Cited(8, f"{_MINIMAX}: 'a softmax attention is positioned after every 7 lightning attention'"),
        q_heads=Cited(64, f"{_MINIMAX}: Number of attention heads"),
        head_dim=Cited(128, f"{_MINIMAX}: Attention head dimension"),
        kv_heads=Cited(8, "num_key_value_heads = 8: only in third-party copies of the config (GQA group 8); "
                          "not in the model card", verified=False),
        lin_v_heads=Cited(64, f"{_MINIMAX}: Number of attention heads (lightning layers alike)"),
        lin_k_heads=Cited(64, f"{_MINIMAX}: Number of attention heads"),
        lin_dk=Cited(128, f"{_MINIMAX}: Attention head dimension"),
        lin_dv=Cited(128, f"{_MINIMAX}: Attention head dimension"),
        conv=Cited(0, "lightning attention has no short convolution"),
    ),
    "Jamba-v0.1": dict(
        linear_kind="Mamba (selective SSM)", full_kind="attention (GQA)",
        n_layers=Cited(32, f"{_JAMBA}: num_hidden_layers"),
        full_every=Cited(8, f"{_JAMBA}: attn_layer_period (offset 4)"),
        q_heads=Cited(32, f"{_JAMBA}: num_attention_heads"),
        kv_heads=Cited(8, f"{_JAMBA}: num_key_value_heads"),
        head_dim=Cited(128, f"{_JAMBA}: hidden_size 4096 / num_attention_heads 32"),
        mamba_inner=Cited(8192, f"{_JAMBA}: mamba_expand 2 x hidden_size 4096"),
        mamba_state=Cited(16, f"{_JAMBA}: mamba_d_state"),
        conv=Cited(4, f"{_JAMBA}: mamba_d_conv"),
    ),
    "DeepSeek-V3.2-Exp": dict(
        linear_kind="(none)", full_kind="MLA + lightning indexer, top-k 2048",
        n_layers=Cited(61, f"{_DSV32}: n_layers"),
        full_every=Cited(1, "every layer is an MLA layer"),
        mla_heads=Cited(128, f"{_DSV32}: n_heads"),
        mla_latent=Cited(512, f"{_DSV32}: kv_lora_rank"), mla_rope=Cited(64, f"{_DSV32}: qk_rope_head_dim"),
        mla_nope=Cited(128, f"{_DSV32}: qk_nope_head_dim"), mla_v=Cited(128, f"{_DSV32}: v_head_dim"),
        index_dim=Cited(128, f"{_DSV32}: index_head_dim"), index_heads=Cited(64, f"{_DSV32}: index_n_heads"),
        index_key_bytes=Cited(132, "https://github.com/deepseek-ai/DeepSeek-V3.2-Exp inference/model.py, Indexer: "
                                   "k_cache float8_e4m3fn [.., 128] (128 B) and k_scale_cache float32 "
                                   "[.., 128 // block_size 128] (4 B) per token"),
        top_k=Cited(2048, f"{_DSV32}: index_topk"),
    ),
    "DeepSeek-V3 (full MLA)": dict(
        linear_kind="(none)", full_kind="MLA",
        n_layers=Cited(61, f"{_DSV3}: num_hidden_layers"), full_every=Cited(1, "every layer"),
        mla_heads=Cited(128, f"{_DSV3}: num_attention_heads"),
        mla_latent=Cited(512, f"{_DSV3}: kv_lora_rank"), mla_rope=Cited(64, f"{_DSV3}: qk_rope_head_dim"),
        mla_nope=Cited(128, f"{_DSV3}: qk_nope_head_dim"), mla_v=Cited(128, f"{_DSV3}: v_head_dim"),
    ),
    "Mixtral-8x7B (full GQA)": dict(
        linear_kind="(none)", full_kind="attention (GQA)",
        n_layers=Cited(32, f"{_MIXTRAL}: num_hidden_layers"), full_every=Cited(1, "every layer"),
        q_heads=Cited(32, f"{_MIXTRAL}: num_attention_heads"),
        kv_heads=Cited(8, f"{_MIXTRAL}: num_key_value_heads"),
        head_dim=Cited(128, f"{_MIXTRAL}: hidden_size 4096 / num_attention_heads 32"),
    ),
}


def _v(design: Mapping, key: str):
    return design[key].value


def design_row(name: str, design: Mapping, *, bytes_per_elem: int = 2) -> dict:
    """One published design, computed from its cited config: layer counts and ratio, KV cache bytes per
    token (all full layers; an index key at the precision it is stored in), recurrent state bytes (all
    linear layers; constant in T; convolution states included), the quadratic share ``f`` (full layers /
    all layers), ``T_mem`` per layer (one linear
    layer's state against one full layer's cache per token) and for the whole model (all state against
    all cache per token), and which of the numbers used were not verified at their source."""
    n = _v(design, "n_layers")
    if "full_layers" in design:
        n_full = len(_v(design, "full_layers"))
    else:
        n_full = n // _v(design, "full_every")
    n_lin = n - n_full
    if "mla_latent" in design:
        cache = _v(design, "mla_latent") + _v(design, "mla_rope")
    else:
        cache = 2 * _v(design, "kv_heads") * _v(design, "head_dim")
    # the index key is stored at its own precision (FP8 and a float32 scale), not at bytes_per_elem
    index_bytes = _v(design, "index_key_bytes") if "index_key_bytes" in design else 0
    if "mamba_inner" in design:
        inner = _v(design, "mamba_inner")
        state = inner * _v(design, "mamba_state") + inner * (_v(design, "conv") - 1)
        core_state = inner * _v(design, "mamba_state")
    elif n_lin:
        hv, hk, dk, dv = (_v(design, k) for k in ("lin_v_heads", "lin_k_heads", "lin_dk", "lin_dv"))
        core_state = hv * dk * dv
        conv = _v(design, "conv")
        state = core_state + max(conv - 1, 0) * (2 * hk * dk + hv * dv)
    else:
        state = core_state = 0
    unverified = sorted(k for k, c in design.items() if isinstance(c, Cited) and not c.verified)
    b = bytes_per_elem
    return {
        "model": name, "layers": n, "full": n_full, "linear": n_lin,
        "ratio": ("all full" if not n_lin else f"{n_lin // n_full}:1" if n_lin % n_full == 0 else f"{n_lin}:{n_full}"),
        "types": f"{design['linear_kind']} / {design['full_kind']}",
        "kv_bytes_per_token": n_full * (cache * b + index_bytes),
        "state_bytes": n_lin * state * b,
        "f": n_full / n,
        "T_mem_layer": core_state / cache if n_lin else None,
        "T_mem_model": n_lin * state / (n_full * cache) if n_lin else None,
        "unverified": unverified,
    }


def design_table(designs: Mapping[str, Mapping] = DESIGNS, *, bytes_per_elem: int = 2) -> list[dict]:
    """:func:`design_row` for every design."""
    return [design_row(name, d, bytes_per_elem=bytes_per_elem) for name, d in designs.items()]


def design_sources(designs: Mapping[str, Mapping] = DESIGNS) -> list[dict]:
    """Every config number used, with its source and whether it was verified there."""
    return [{"model": name, "field": k, "value": c.value, "source": c.source, "verified": c.verified}
            for name, d in designs.items() for k, c in d.items() if isinstance(c, Cited)]


def attention_dims(design: Mapping, mode: str) -> tuple[int, int, int]:
    """A design's full attention layer as ``(query heads, D_qk, D_v)``. MLA has two forms: ``mode="mha"``
    (training and prefill in DeepSeek's code: per-head keys of ``nope + rope`` and values of ``v``) and
    ``mode="mqa"`` (decoding: queries absorbed into the latent, so every head scores the shared
    ``latent + rope`` key and reads the ``latent`` value). For other attention layers the two coincide."""
    if mode not in ("mha", "mqa"):
        raise ValueError(f"mode must be 'mha' (MLA's prefill form) or 'mqa' (its decode form); got {mode!r}")
    if "mla_latent" in design:
        H, latent, rope = _v(design, "mla_heads"), _v(design, "mla_latent"), _v(design, "mla_rope")
        if mode == "mha":
            return H, _v(design, "mla_nope") + rope, _v(design, "mla_v")
        return H, latent + rope, latent
    return _v(design, "q_heads"), _v(design, "head_dim"), _v(design, "head_dim")


def pair_flops(design: Mapping, mode: str) -> int:
    """FLOPs per (query, key) pair of a design's full attention layer in ``mode`` (:func:`attention_dims`),
    ``2 H (D_qk + D_v)`` summed over its query heads (grouped-query attention shares keys between heads,
    not the products)."""
    H, d_qk, d_v = attention_dims(design, mode)
    return 2 * H * (d_qk + d_v)


def indexer_hosts(designs: Mapping[str, Mapping] = DESIGNS, *, index_heads: int = 64,
                  index_dim: int = 128) -> list[dict]:
    """What a lightning indexer of ``index_heads`` heads of ``index_dim`` (DeepSeek-V3.2's: 64 x 128,
    ``2 * 64 * 128 = 16,384`` FLOPs per pair) costs relative to the full layer it would sit in:
    ``r_I = indexer FLOPs per pair / the layer's FLOPs per pair`` (:func:`pair_flops`), in both of MLA's
    forms, and the quadratic term a model keeps with top-k layers in place of its full ones,
    ``f * r_I`` (``f`` its share of full layers). One row per design with a full attention layer."""
    index_pair = 2 * index_heads * index_dim
    rows = []
    for name, d in designs.items():
        row = design_row(name, d)
        mha, mqa = pair_flops(d, "mha"), pair_flops(d, "mqa")
        rows.append({"model": name, "layer": d["full_kind"], "f": row["f"], "pair_prefill": mha, "pair_decode": mqa,
                     "r_I_prefill": index_pair / mha, "r_I_decode": index_pair / mqa,
                     "f_r_I_prefill": row["f"] * index_pair / mha, "f_r_I_decode": row["f"] * index_pair / mqa,
                     "mla": "mla_latent" in d})
    return rows


def quadratic_share(ratio: int) -> float:
    """``f = 1 / (n_lin + 1)``: the share of layers that stay quadratic with one full layer in every
    ``n_lin + 1`` (``ratio`` is n_lin, the linear:full ratio's first term)."""
    return 1.0 / (ratio + 1)


__all__ = ["ADVERSARY", "COUNTED_DECODE", "COUNTED_PREFILL", "Cited", "DESIGNS", "Flops", "GPU_RESULT_FILES",
           "HeadConfig", "LABELS", "MECHANISMS", "RECURRENT", "adversary_errors", "band_keys", "count_tolerance",
           "counted_flops",
           "cpu_decode_times", "decode_break_even", "decode_flops", "delta_rule_verdict", "design_row",
           "attention_dims", "design_sources", "design_table", "exactness_table", "indexer_hosts", "pair_flops",
           "first_length_where", "gpu_rows",
           "landscape_curves", "memory_bytes", "memory_crossover", "prefill_flops", "quadratic_share"]
