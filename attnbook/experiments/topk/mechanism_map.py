"""The mechanism map: the plan, the indexer's scores, the restricted plan -- what chapter 7's map draws
(:func:`mechanism_map`), with an indexer that sees the attention through noise (:func:`noisy_indexer`)."""

from __future__ import annotations

import math

import torch

from attnlib.topk import index_scores, selection_mask, topk_select

from ..weights import softmax_weights
from ._common import F64, _check_generator
from .transport import restrict


def noisy_indexer(q: torch.Tensor, k: torch.Tensor, *, n_heads: int, noise: float,
                  generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An indexer that sees the attention through noise: index key ``k_s`` (shared), index queries
    ``q_t + noise * z_{t,j}`` for ``j = 1..n_heads``, weights ``1 / n_heads``. Its scores
    ``mean_j ReLU((q_t + noise z) . k_s)`` rank keys roughly as the attention does, but not exactly.
    Inputs ``[1, 1, T, d]``; returns ``(index_q [1, H_I, T, d], index_k [1, 1, T, d], index_w [1, H_I, T])``."""
    g = _check_generator(generator)
    T, d = q.shape[-2:]
    z = torch.randn(1, n_heads, T, d, generator=g, dtype=F64)
    index_q = q.double().expand(1, n_heads, T, d) + noise * z * q.double().norm(dim=-1, keepdim=True)
    return index_q, k.double(), torch.full((1, n_heads, T), 1.0 / n_heads, dtype=F64)


def mechanism_map(T: int, d: int, ks, *, generator: torch.Generator, n_heads: int = 4,
                  noise: float = 0.6, spread: float = 3.0) -> dict:
    """What chapter 7's map draws, computed: for one random causal head of ``T`` tokens, the dense
    plan ``[T, T]``, the index scores ``[T, T]`` (causal part; ``nan`` above the diagonal), and for
    each ``k`` in ``ks`` the selection mask, the restricted renormalised plan and each row's lost mass
    ``1 - p(S)``."""
    g = _check_generator(generator)
    q = torch.randn(1, 1, T, d, generator=g, dtype=F64) * math.sqrt(spread) / d ** 0.25
    k = torch.randn(1, 1, T, d, generator=g, dtype=F64) * math.sqrt(spread) / d ** 0.25
    iq, ik, iw = noisy_indexer(q, k, n_heads=n_heads, noise=noise, generator=g)
    p = softmax_weights(q[0, 0], k[0, 0], tau=math.sqrt(q.shape[-1]), causal=True)
    scores = index_scores(iq, ik, iw)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    out = dict(plan=p, scores=torch.where(causal, scores[0, 0], float("nan")), ks=[int(x) for x in ks],
               masks=[], restricted=[], lost=[])
    for kk in out["ks"]:
        mask = selection_mask(topk_select(scores, kk, causal=True), T)[0, 0]
        out["masks"].append(mask)
        out["restricted"].append(restrict(p, mask))
        out["lost"].append(1 - (p * mask).sum(-1))
    return out
