"""Chapter 2 again: a needle the indexer cannot see. The planted needle fed to the top-k layer with an
indexer whose score for the needle is the row's lowest: positive weights and a hidden index key
(:func:`blind_needle`), or DeepSeek-V3.2's shapes with signed weights (:func:`signed_indexer_needle`)."""

from __future__ import annotations

import torch

from attnlib import _validate
from attnlib.topk import index_scores, topk_attention

from .. import needle
from ._common import F64, _check_generator
from .deepseek import DEEPSEEK_V32


def _needle_row(case: needle.Case, iq: torch.Tensor, ik: torch.Tensor, iw: torch.Tensor, top_k: int) -> dict:
    """Run the top-k layer (:func:`attnlib.topk.topk_attention`) on a planted case with the given indexer and
    measure row ``i``: its L1 error against the exact row, the needle's index score and the other visible
    keys' scores, and whether the needle was selected."""
    o, idx = topk_attention(case.q, case.k, case.v, iq, ik, iw, top_k=top_k, scale=case.scale,
                            return_indices=True, causal=True)
    row = o[0, 0, case.i]
    exact = needle.exact_rows(case)[case.i]
    scores = index_scores(iq, ik, iw)[0, 0, case.i, :case.i + 1]            # the row's visible keys
    others = torch.cat([scores[:case.j], scores[case.j + 1:]])
    return dict(error=float((exact - row).abs().sum()), closed_form=needle.uniform_miss_error(case.T, top_k, case.M),
                needle_score=float(scores[case.j]), lowest_haystack_score=float(others.min()),
                n_above=int((others > scores[case.j]).sum()),
                selected_needle=bool((idx[0, 0, case.i] == case.j).any()),
                needle_mass=needle.needle_mass(case.T, case.M))


def blind_needle(T: int, M: float, top_k: int, *, d: int = 8, d_index: int = 8, n_index_heads: int = 4,
                 hide: bool = True, generator: torch.Generator) -> dict:
    """Chapter 2's planted needle (:func:`attnbook.experiments.needle.plant`: row ``i = T - 1``, key ``j = 1``, score
    ``M``, every other score 0, one-hot values) fed to the top-k layer with an indexer that scores every
    pair, in the simplest construction: index queries, the haystack's index keys *and the weights* are
    positive (so every haystack key scores above 0); with ``hide`` the needle's index key is
    ``-(1, ..., 1)``, where every index query's ReLU is 0, so its index score is exactly 0 -- the lowest of
    the row -- and with ``top_k <= T - 1`` it is never selected. This needs the weights to be non-negative:
    with a negative weight other keys can score below 0 (:func:`signed_indexer_needle` does without).
    ``hide=False`` puts the needle's index key far out in the positive orthant: the indexer fetches it.

    Returns ``error`` (``||exact row - top-k row||_1``), ``closed_form`` (chapter 2's
    :func:`attnbook.experiments.needle.uniform_miss_error` for ``top_k`` keys seen, none the needle),
    ``needle_score`` and ``lowest_haystack_score`` (the needle's index score and the smallest other
    visible one on row ``i``), ``n_above`` (other visible keys scoring above the needle) and
    ``selected_needle`` (bool)."""
    g = _check_generator(generator)
    T = _validate.check_int("T", T, lo=3)
    top_k = _validate.check_int("top_k", top_k, lo=1, hi=T - 1, why=" (row T - 1 sees T keys: it must leave one out)")
    case = needle.plant(T, d, T - 1, 1, M, dtype=F64)
    iq = torch.rand(1, n_index_heads, T, d_index, generator=g, dtype=F64) + 0.1
    ik = torch.rand(1, 1, T, d_index, generator=g, dtype=F64) + 0.1
    ik[0, 0, case.j] = -1.0 if hide else 10.0
    iw = torch.rand(1, n_index_heads, T, generator=g, dtype=F64) + 0.1
    return _needle_row(case, iq, ik, iw, top_k)


def signed_indexer_needle(T: int, M: float, top_k: int, *, place: str = "lowest",
                          n_index_heads: int = DEEPSEEK_V32["index_n_heads"],
                          d_index: int = DEEPSEEK_V32["index_head_dim"], d: int = 8, margin: float = 1.0,
                          generator: torch.Generator) -> dict:
    """Chapter 2's needle against a lightning indexer at DeepSeek-V3.2's index shapes (64 heads of dim 128 by
    default) with *signed* weights, as DSA's are (a plain linear projection). Index queries, the haystack's
    index keys and the weights are Gaussian.

    Row ``i``'s ``H_I`` index queries span at most ``H_I`` of the ``d_I`` dimensions, so with ``H_I < d_I``
    any products ``c = Q_i k^I_j`` can be had (``k^I_j = pinv(Q_i) c``, plus anything in the
    ``d_I - H_I`` dimensions the queries do not see). Nothing of the attention logit ``M`` enters the index
    scores: the selection of row ``i`` does not depend on ``s_ij``. Where the needle's index key goes:

    * ``place="zero"``: every product ``-margin``, so every ReLU is 0 and the index score is exactly 0
      *whatever the weights' signs*. Missed only if at least ``top_k`` visible keys score above 0 -- with
      signed weights many rows have fewer (when the weights lean negative, most keys score below 0).
    * ``place="lowest"``: ``-margin`` for the heads of non-negative weight, ``+R`` for the others, with
      ``R`` large enough that the score falls below every other visible key's: missed at every ``M``
      whatever the weights (with no negative weight this is ``"zero"``, and the haystack scores above 0).

    Returns :func:`blind_needle`'s dict, ``head_products`` (``c``), and ``null_dim`` (``d_I`` minus the rank
    of row ``i``'s index queries: the dimensions of index key they cannot see)."""
    g = _check_generator(generator)
    T = _validate.check_int("T", T, lo=3)
    top_k = _validate.check_int("top_k", top_k, lo=1, hi=T - 1, why=" (row T - 1 sees T keys: it must leave one out)")
    n_index_heads = _validate.check_int("n_index_heads", n_index_heads, lo=1)
    d_index = _validate.check_int("d_index", d_index, lo=n_index_heads + 1,
                                  why=" (more index dims than index heads: otherwise the queries may leave no room)")
    if place not in ("zero", "lowest"):
        raise ValueError(f"place must be 'zero' (every ReLU 0) or 'lowest' (below every other key); got {place!r}")
    case = needle.plant(T, d, T - 1, 1, M, dtype=F64)
    iq = torch.randn(1, n_index_heads, T, d_index, generator=g, dtype=F64)
    ik = torch.randn(1, 1, T, d_index, generator=g, dtype=F64)
    iw = torch.randn(1, n_index_heads, T, generator=g, dtype=F64)
    Q, w = iq[0, :, case.i], iw[0, :, case.i]                                   # row i's index queries, weights
    c = torch.full((n_index_heads,), -margin, dtype=F64)
    negative = w < 0
    if place == "lowest" and negative.any():
        visible = torch.arange(T) <= case.i
        others = index_scores(iq, ik, iw)[0, 0, case.i][visible & (torch.arange(T) != case.j)]
        # score = R * sum of the negative weights: below the lowest other score by at least margin
        R = (margin - min(float(others.min()), 0.0)) / float(-w[negative].sum())
        c = torch.where(negative, torch.full_like(c, R), c)
    ik[0, 0, case.j] = torch.linalg.pinv(Q) @ c
    out = _needle_row(case, iq, ik, iw, top_k)
    out["head_products"] = Q @ ik[0, 0, case.j]
    out["null_dim"] = d_index - int(torch.linalg.matrix_rank(Q))
    return out
