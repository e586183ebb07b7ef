"""How each mechanism's matrix products are counted: the attnlib references that compute what its kernel
computes, run under ``torch.utils.flop_counter`` (:func:`attnbook.experiments._measure.count_flops`), one
counting function per mechanism, and the top-k layer's tolerance, the one place the counter and the model
differ. :mod:`.counting` runs them over the registry."""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnlib.anna import anna_attention_reference, lsh_projections
from attnlib.attention import softmax_attention_reference
from attnlib.deltanet import delta_rule_chunk_reference, delta_rule_decode_step
from attnlib.grassmann import n_pairs, plucker_projection_collapsed
from attnlib.linear import linear_attention_chunk_reference, linear_attention_decode_step
from attnlib.topk import index_scores_reference, topk_attention_reference, topk_select_reference

from .._measure import count_flops
from .costs import HeadConfig


def _randn(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


# ---------------------------------------------------------------------------------------------
# One block per mechanism: the attnlib references that count it. The counting functions receive the
# q, k, v the caller drew first, so that every mechanism draws in the same order.
# ---------------------------------------------------------------------------------------------

# --- softmax -----------------------------------------------------------------------------------

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


# --- block-sparse (local band) -----------------------------------------------------------------

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

def _linear_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    return count_flops(lambda: linear_attention_chunk_reference(q, k, v, causal=True, chunk_size=cfg.chunk)) / T


def _linear_count_decode(q1, k1, v1, t: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    S = _randn(gen, 1, cfg.heads, cfg.d_head, cfg.d_head)
    return count_flops(lambda: linear_attention_decode_step(q1, k1, v1, initial_state=S))


# --- the delta rule, plain and gated -----------------------------------------------------------

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


# --- ANNA (LSH) --------------------------------------------------------------------------------

def _anna_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    proj = lsh_projections("simhash", cfg.lsh_tables, cfg.lsh_bits, cfg.d_head, seed=0).float()
    return count_flops(lambda: anna_attention_reference(q, k, v, proj, family="simhash", causal=True)) / T


# --- Grassmann ---------------------------------------------------------------------------------

def _grassmann_count_prefill(q, k, v, T: int, cfg: HeadConfig, gen: torch.Generator) -> float:
    z, w = _randn(gen, 1, T, cfg.grassmann_rank), _randn(gen, cfg.d_model, n_pairs(cfg.grassmann_rank))
    return count_flops(lambda: plucker_projection_collapsed(z, w, cfg.grassmann_offsets)) / T


# --- top-k + indexer ---------------------------------------------------------------------------

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
