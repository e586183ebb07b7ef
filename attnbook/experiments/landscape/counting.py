"""Counting the references: each registered mechanism's attnlib references counted at small sizes
(:func:`counted_flops`), beside its model's ``matmul`` part, so that the formulas' matrix products are
asserted, not typed; and how far a count may fall below the model (:func:`count_tolerance`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .costs import HeadConfig
from .references import _randn
from .registry import COUNTED_DECODE, COUNTED_PREFILL, REGISTRY, decode_flops, prefill_flops


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


def count_tolerance(mechanism: str, T: int, cfg: HeadConfig = HeadConfig()) -> float:  # noqa: B008
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
