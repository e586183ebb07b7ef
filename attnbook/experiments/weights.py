"""The weights each mechanism puts on the values, for one head: a ``[Tq, Tk]`` matrix whose row ``t``
holds the coefficients of ``o_t = sum_j w_tj v_j``.

Every function here runs the library's own operator on the values ``v = I`` (one-hot values), so the
matrix is what the operator computes, not a re-derivation of it. These are the matrices the chapters
set beside softmax's plan (``attnbook.widgets.eot.weights_comparison_figure``): a transport plan has
rows summing to 1 (or 0) and no negative entry; the other mechanisms may or may not. The delta
rule's weights (signed: no plan) are the operator module's own, :func:`attnlib.deltanet.implied_weights`.

``q, k: [T, D]`` (one head, any float dtype); the result is float64.
"""

from __future__ import annotations

import torch

from attnlib.anna import anna_attention
from attnlib.attention import softmax_attention
from attnlib.linear import linear_attention


def single_head(name: str, x) -> torch.Tensor:
    """``x`` as a float64 ``[T, D]`` tensor (one head), or a ValueError that says what was expected."""
    x = torch.as_tensor(x)
    if x.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [T, D] (one head)")
    return x.to(torch.float64)


def _one_hot_values(T: int) -> torch.Tensor:
    return torch.eye(T, dtype=torch.float64)[None, None]                   # v = I: o_t is row t of W


def softmax_weights(q, k, *, tau: float = 1.0, causal: bool = False) -> torch.Tensor:
    """``softmax(q k^T / tau)`` row by row (causal: keys ``j <= t``), from
    :func:`attnlib.softmax_attention` (the reference) -- chapter 1's one-sided transport plan."""
    q, k = single_head("q", q), single_head("k", k)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"k has shape {tuple(k.shape)}; expected (*, {q.shape[1]}) to match q")
    o = softmax_attention(q[None, None], k[None, None], _one_hot_values(k.shape[0]), scale=1.0 / tau,
                          causal=causal, backend="torch")
    return o[0, 0]


def linear_attention_weights(q, k, *, feature_map=None, feature_kwargs: dict | None = None,
                             causal: bool = True, normalize: bool = True) -> torch.Tensor:
    """The weights of (normalised) linear attention, from :func:`attnlib.linear_attention` (``scale = 1``):
    ``w_tj = phi(q_t) . phi(k_j) / (phi(q_t) . kappa_t)``.

    With a non-negative feature map these rows are a one-sided transport plan whose Gibbs kernel
    ``phi(Q) phi(K)^T`` has rank at most ``D'`` (non-causal) and whose partition function is
    ``phi(q_t) . kappa_t``; with the identity map (``feature_map=None``) the rows still sum to one but
    can have negative entries, and are no plan.
    """
    q, k = single_head("q", q), single_head("k", k)
    W = linear_attention(q[None, None], k[None, None], _one_hot_values(k.shape[0]), scale=1.0, causal=causal,
                         normalize=normalize, feature_map=feature_map, feature_kwargs=feature_kwargs,
                         mode="parallel")
    return W[0, 0]


def anna_weights(q, k, n_tables: int, n_bits: int, *, seed: int = 0, family: str = "simhash") -> torch.Tensor:
    """ANNA's weights with ``l = n_tables`` tables of ``z = n_bits`` hashes, from
    :func:`attnlib.anna_attention` (``return_weights=True``): each row sums to 1, or to 0 for a query
    that collided with no key."""
    q, k = single_head("q", q), single_head("k", k)
    v = torch.zeros(1, 1, k.shape[0], 1, dtype=torch.float64)
    _, w = anna_attention(q[None, None], k[None, None], v, n_tables=n_tables, n_bits=n_bits, seed=seed,
                          family=family, return_weights=True, backend="torch", causal=False)
    return w[0, 0].to(torch.float64)
