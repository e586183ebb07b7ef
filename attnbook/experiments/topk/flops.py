"""Cost on counted work: counted FLOPs (``torch.utils.flop_counter`` on the references, on the ``meta``
device) of the indexer, dense and top-k attention at DeepSeek-V3.2's shapes, and the lengths at which the
top-k layer breaks even with dense attention."""

from __future__ import annotations

import torch

from attnlib.attention import softmax_attention_reference
from attnlib.topk import index_scores_reference, topk_attention_reference

from .._measure import count_flops
from .deepseek import DEEPSEEK_V32


def _meta(*shape):
    return torch.empty(*shape, device="meta")


def indexer_flops(T_q: int, T_k: int, n_heads: int, head_dim: int) -> int:
    """Counted FLOPs of :func:`attnlib.topk.index_scores_reference` for ``T_q`` queries and ``T_k`` keys
    (matrix products only: the ReLU-weighted sum over heads is ``2 H_I`` more per pair, uncounted)."""
    return count_flops(lambda: index_scores_reference(_meta(1, n_heads, T_q, head_dim), _meta(1, 1, T_k, head_dim),
                                                      _meta(1, n_heads, T_q)))


def attention_flops(T_q: int, T_k: int, n_heads: int, d_qk: int, d_v: int) -> int:
    """Counted FLOPs of dense softmax attention (:func:`attnlib.attention.softmax_attention_reference`,
    non-causal: every pair) with ``n_heads`` heads."""
    return count_flops(lambda: softmax_attention_reference(_meta(1, n_heads, T_q, d_qk), _meta(1, n_heads, T_k, d_qk),
                                                           _meta(1, n_heads, T_k, d_v), scale=1.0, causal=False))


def topk_attention_flops(T_q: int, T_k: int, top_k: int, n_heads: int, d_qk: int, d_v: int) -> int:
    """Counted FLOPs of :func:`attnlib.topk.topk_attention_reference` (the attention over ``top_k``
    gathered keys per query; the selection is given)."""
    idx = torch.empty(1, 1, T_q, top_k, dtype=torch.int64, device="meta")
    return count_flops(lambda: topk_attention_reference(_meta(1, n_heads, T_q, d_qk), _meta(1, n_heads, T_k, d_qk),
                                                        _meta(1, n_heads, T_k, d_v), idx, scale=1.0))


def mla_dims(config: dict = DEEPSEEK_V32, mode: str = "mqa") -> dict[str, int]:
    """MLA's attention as one softmax attention per mode. ``"mqa"`` (DeepSeek's decode, and the form its
    sparse attention runs in): the ``n_heads`` queries are absorbed into the latent, so every head scores
    one shared key of dim ``d_c + d_r`` (the latent and the rotary part) and reads one shared value of
    dim ``d_c`` (the latent). ``"mha"`` (DeepSeek's training and prefill, ``model.py``'s branch for
    ``mask is not None``): per-head keys of ``qk_nope + d_r`` and values of ``v_head_dim``."""
    d_c, d_r = config["kv_lora_rank"], config["qk_rope_head_dim"]
    if mode == "mqa":
        return dict(n_heads=config["n_heads"], d_qk=d_c + d_r, d_v=d_c)
    if mode == "mha":
        return dict(n_heads=config["n_heads"], d_qk=config["qk_nope_head_dim"] + d_r, d_v=config["v_head_dim"])
    raise ValueError(f"mode must be 'mqa' (MLA absorbed, decode) or 'mha' (per-head, prefill); got {mode!r}")


def per_pair_flops(config: dict = DEEPSEEK_V32, *, length: int = 64) -> dict[str, float]:
    """Counted FLOPs per (query, key) pair of the indexer and of MLA's attention in both of its forms
    (:func:`mla_dims`), and the indexer's ratio ``r_I`` to each, for a DeepSeek-V3.2-shaped layer
    (counted on ``length`` x ``length`` meta tensors). Keys: ``indexer``, ``mqa``, ``mha``, ``r_I_mqa``,
    ``r_I_mha``."""
    pairs = length * length
    out = {"indexer": indexer_flops(length, length, config["index_n_heads"], config["index_head_dim"]) / pairs}
    for mode in ("mqa", "mha"):
        m = mla_dims(config, mode)
        out[mode] = attention_flops(length, length, m["n_heads"], m["d_qk"], m["d_v"]) / pairs
        out[f"r_I_{mode}"] = out["indexer"] / out[mode]
    return out


def break_even_length(top_k: int, ratio: float) -> float:
    """``T* = k / (1 - r_I)``: per query, the top-k layer costs ``r_I T + k`` attention-pairs (the indexer
    scores all ``T`` keys, the attention reads ``k``) against dense attention's ``T`` -- when the sparse and
    the dense attention cost the same per pair (:func:`prefill_break_even` when they do not)."""
    if not 0 <= ratio < 1:
        raise ValueError(f"ratio must be in [0, 1) (an indexer cheaper than the attention); got {ratio}")
    return top_k / (1.0 - ratio)


def prefill_break_even(top_k: int, *, dense: float, sparse: float, indexer: float) -> float:
    """The context length at which one query of a top-k layer -- the indexer over every key (``indexer``
    FLOPs per pair) and the attention over ``top_k`` keys (``sparse`` per pair) -- costs what dense attention
    over every key (``dense`` per pair) costs: ``T* = sparse * k / (dense - indexer)``. With
    ``sparse = dense`` this is :func:`break_even_length`. DeepSeek prefills densely in MLA's MHA form but
    runs its sparse attention in the MQA form, 3.4 times dearer per pair: then ``sparse != dense``."""
    if not indexer < dense:
        raise ValueError(f"the indexer must cost less per pair than the dense attention; got indexer={indexer}, "
                         f"dense={dense}")
    return sparse * top_k / (dense - indexer)


def decode_flops(T: int, config: dict = DEEPSEEK_V32, *, top_k: int | None = None) -> dict[str, int]:
    """Counted FLOPs of one decoding query at context ``T`` (one query, ``T`` keys): dense MLA (MQA
    form) and the top-k layer (the indexer over ``T`` keys plus the attention over ``min(k, T)``)."""
    mla = mla_dims(config, "mqa")
    k = config["index_topk"] if top_k is None else top_k
    dense = attention_flops(1, T, mla["n_heads"], mla["d_qk"], mla["d_v"])
    sparse = indexer_flops(1, T, config["index_n_heads"], config["index_head_dim"]) + \
        topk_attention_flops(1, T, min(k, T), mla["n_heads"], mla["d_qk"], mla["d_v"])
    return dict(dense=dense, sparse=sparse)
