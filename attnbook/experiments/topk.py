"""Chapter 7's top-k layer, measured: the transport reading, the needle against the indexer, the indexer
trained as DeepSeek trains it, and the cost on counted work.

The operator itself (index scores, causal top-k selection, softmax over the selected keys, the
indexer's KL loss) is :mod:`attnlib.topk`; chapter 1's one-sided transport solver is :mod:`attnlib.eot`;
chapter 2's planted needle and its closed forms are :mod:`attnbook.experiments.needle`. This module only runs them:

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnlib import _validate, eot
from attnlib.attention import softmax_attention_reference
from attnlib.topk import (
    index_scores,
    index_scores_reference,
    indexer_kl_loss,
    selection_mask,
    topk_attention,
    topk_attention_reference,
    topk_select,
)

from . import needle
from ._measure import count_flops
from ._training import train_loop
from .weights import softmax_weights

F64 = torch.float64

# DeepSeek-V3.2-Exp's configuration (``inference/config_671B_v3.2.json`` of deepseek-ai/DeepSeek-V3.2-Exp):
# 128 attention heads; MLA with a 512-dim latent (kv_lora_rank), a 64-dim rotary part and, in its per-head
# (MHA) form, keys of 128 + 64 and values of 128; the indexer's 64 heads of dim 128 and k = 2048.
DEEPSEEK_V32 = dict(n_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                    index_n_heads=64, index_head_dim=128, index_topk=2048)


def _check_generator(generator) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (every random choice flows from it); "
                        f"got {type(generator).__name__}")
    return generator


# ---------------------------------------------------------------------------------------------
# 1. The transport reading
# ---------------------------------------------------------------------------------------------

def restrict(p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``p`` restricted to ``mask`` and renormalised along the last dim (the chapter's ``p~``)."""
    kept = torch.where(mask, p, torch.zeros_like(p))
    return kept / kept.sum(-1, keepdim=True)


def eot_plan_on_support(cost_row: torch.Tensor, support: torch.Tensor, eps: float) -> torch.Tensor:
    """Chapter 1's one-sided entropic plan for one row whose keys are only ``support`` (bool ``[Tk]``):
    :func:`attnlib.eot.solve_one_sided` (Newton, no softmax) on those columns, 0 elsewhere -- the
    plan with cost ``+inf`` off the support. ``cost_row [Tk]`` float64."""
    plan = torch.zeros_like(cost_row)
    plan[support] = eot.solve_one_sided(cost_row[support][None], eps)[0]
    return plan


def transport_reading(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *,
                      causal: bool = True) -> dict[str, torch.Tensor]:
    """The three facts, measured row by row for one sequence and head (``q, k: [1, 1, T, D]``,
    ``v: [1, 1, T, Dv]``, ``indices [1, 1, T, n]`` from :func:`attnlib.topk.topk_select`).

    Returns per-row float64 tensors ``[T]``: ``mass`` ``p(S)``; ``l1`` ``||p - p~||_1``; ``eot_gap``
    ``max |p~ - eot plan on S|`` (chapter 1's solver, independent of softmax); ``operator_gap``
    ``max |p~ - topk_attention's row|`` (the operator on one-hot values); ``output_error``
    ``||o - o~||_2`` for the given ``v``, and ``bound`` ``2 (1 - p(S)) max_s ||v_s||`` over the row's
    visible keys."""
    T, D = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)
    p = softmax_weights(q[0, 0], k[0, 0], tau=math.sqrt(D), causal=causal)              # [T, T]
    mask = selection_mask(indices, T)[0, 0]                                      # [T, T]
    pt = restrict(p, mask)
    mass = (p * mask).sum(-1)
    cost = -scale * (q.double() @ k.double().transpose(-1, -2))[0, 0]           # C = -scale q.k, eps = 1
    eot_rows = torch.stack([eot_plan_on_support(cost[t], mask[t], 1.0) for t in range(T)])
    eye = torch.eye(T, dtype=F64)[None, None]
    op = topk_attention_reference(q.double(), k.double(), eye, indices, scale=scale)[0][0, 0]
    o = p @ v.double()[0, 0]
    o_t = pt @ v.double()[0, 0]
    vnorm = v.double()[0, 0].norm(dim=-1)                                        # [T]
    visible = torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.ones(T, T, dtype=torch.bool)
    vmax = torch.where(visible, vnorm[None, :], torch.zeros(())).max(-1).values
    return dict(mass=mass, l1=(p - pt).abs().sum(-1), eot_gap=(pt - eot_rows).abs().max(-1).values,
                operator_gap=(pt - op).abs().max(-1).values, output_error=(o - o_t).norm(dim=-1),
                bound=2 * (1 - mass) * vmax)


def tight_values(mask_row: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """Values that attain the bound on one row: ``+u`` on the selected keys, ``-u`` off them (``u`` the
    unit ``direction``). Then ``o~ - o = 2 (1 - p(S)) u`` exactly. Returns ``[Tk, Dv]`` float64."""
    u = direction.double() / direction.double().norm()
    sign = torch.where(mask_row, 1.0, -1.0).to(F64)
    return sign[:, None] * u[None, :]


def random_rows(T: int, d: int, *, generator: torch.Generator, spread: float = 2.0):
    """Random ``q, k, v [1, 1, T, d]`` (float64) with logits of standard deviation about ``spread``."""
    g = _check_generator(generator)
    q, k, v = (torch.randn(1, 1, T, d, generator=g, dtype=F64) for _ in range(3))
    return q * math.sqrt(spread), k * math.sqrt(spread), v          # scale q.k = q.k / sqrt(d): spread^1


# ---------------------------------------------------------------------------------------------
# 2. The mechanism map: the plan, the indexer's scores, the restricted plan
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# 3. Chapter 2 again: a needle the indexer cannot see
# ---------------------------------------------------------------------------------------------

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


def head_plans(batch: int, T: int, n_heads: int, *, common: float, generator: torch.Generator,
               **task) -> torch.Tensor:
    """``[batch, n_heads, T, T]`` causal attention rows for a layer of ``n_heads`` heads on the planted task:
    each head's row is ``common * P_c + (1 - common) * P_h``, a convex mixture (so still a plan) of one
    plan shared by all heads and the head's own, each drawn by :func:`planted_task` (``task``: its keyword
    arguments). ``common = 1``: identical heads; ``common = 0``: heads that attend to unrelated needles."""
    g = _check_generator(generator)
    n_heads = _validate.check_int("n_heads", n_heads, lo=1)
    if not (isinstance(common, (int, float)) and not isinstance(common, bool) and 0 <= common <= 1):
        raise ValueError(f"common must be a number in [0, 1] (the share of each head's plan common to all heads); "
                         f"got {common!r}")
    shared = planted_task(batch, T, generator=g, **task).plan                       # [B, 1, T, T]
    own = torch.cat([planted_task(batch, T, generator=g, **task).plan for _ in range(n_heads)], dim=1)
    return common * shared + (1 - common) * own


def shared_selection_loss(plans: torch.Tensor, ks, *, first_row: int = 0) -> dict[str, list[float]]:
    """What one selection shared by all heads costs each head. ``plans [B, H, T, T]``: each head's causal
    attention rows. The shared selection is the top-``k`` of the head-averaged plan -- the best any single
    selection can do for the average, and what an indexer trained on the head-summed distribution (as
    DeepSeek's is) aims at. For each ``k`` in ``ks``, over rows ``t >= first_row``:

    * ``shared``: the average plan's mass on the shared set (equal to the mean over heads of each head's mass);
    * ``worst_head``: the smallest head's mass on the shared set, averaged over rows;
    * ``own``: each head's mass on its *own* top-``k`` (a selection per head), averaged over heads and rows.

    Returns float lists, one entry per ``k``."""
    if plans.dim() != 4 or plans.shape[-1] != plans.shape[-2]:
        raise ValueError(f"plans must be [B, H, T, T]; got shape {tuple(plans.shape)}")
    B, H, T, _ = plans.shape
    mean_plan = plans.mean(1, keepdim=True)                                     # [B, 1, T, T]
    one_per_head = plans.reshape(B * H, 1, T, T)                                # each head its own "sequence"
    out = dict(shared=[], worst_head=[], own=[])
    for k in ks:
        shared = selection_mask(topk_select(mean_plan, int(k), causal=True), T)                 # [B, 1, T, T]
        per_head = (plans * shared).sum(-1)[..., first_row:]                       # [B, H, rows]
        own_sel = selection_mask(topk_select(one_per_head, int(k), causal=True), T).reshape(B, H, T, T)
        own = (plans * own_sel).sum(-1)[..., first_row:]
        out["shared"].append(float(per_head.mean()))
        out["worst_head"].append(float(per_head.min(1).values.mean()))
        out["own"].append(float(own.mean()))
    return out


# ---------------------------------------------------------------------------------------------
# 4. The indexer trained as DeepSeek trains it
# ---------------------------------------------------------------------------------------------

@dataclass
class PlantedTask:
    """A batch of the planted task. ``states [B, T, 2 d_c + 2]`` the token states the indexer reads;
    ``plan [B, 1, T, T]`` the teacher's causal attention on them (its target); ``planted [B, T, T]``
    the needles (bool)."""
    states: torch.Tensor
    plan: torch.Tensor
    planted: torch.Tensor


def planted_task(batch: int, T: int, *, content_dim: int = 32, n_planted: int = 16, beta: float = 5.0,
                 tail: float = 1.0, generator: torch.Generator) -> PlantedTask:
    """Planted needles in a power-law tail, read by a teacher softmax attention.

    Token ``s`` carries a key content ``u_s ~ N(0, I / d_c)``, a query content ``g_s = sum_{r in P_s} u_r``
    (``P_s``: ``n_planted`` earlier tokens, its needles) and a salience ``z_s = -tail * log(rank_s)``
    (``rank_s`` a random permutation of ``1..T``). The teacher is one softmax head with query
    ``(beta g_t, 1)`` and key ``(u_s, z_s)``: logit ``beta g_t . u_s + z_s``, so each row puts mass on its
    needles (logit about ``beta``) over a background whose weights fall off like ``rank^-tail``, blurred
    by the needles' crosstalk (``g_t . u_s`` has spread ``sqrt(n_planted / d_c)`` off the needles).
    The states the indexer reads are ``(u_s, g_s, z_s, 1)``."""
    g = _check_generator(generator)
    u = torch.randn(batch, T, content_dim, generator=g) / math.sqrt(content_dim)
    # needles: n_planted earlier positions per token (all of them while fewer exist)
    score = torch.rand(batch, T, T, generator=g).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(-1), -1.0)
    top = score.topk(min(n_planted, T), dim=-1).indices
    planted = torch.zeros(batch, T, T, dtype=torch.bool).scatter_(-1, top, True) & (score >= 0)
    gq = planted.float() @ u
    rank = torch.argsort(torch.rand(batch, T, generator=g), dim=-1).float() + 1
    z = -tail * torch.log(rank)
    states = torch.cat([u, gq, z[..., None], torch.ones(batch, T, 1)], dim=-1)
    q = torch.cat([beta * gq, torch.ones(batch, T, 1)], dim=-1)[:, None]
    k = torch.cat([u, z[..., None]], dim=-1)[:, None]
    logits = (q @ k.transpose(-1, -2)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    plan = torch.softmax(logits, dim=-1)                 # the teacher's weights (softmax_attention on v = I)
    return PlantedTask(states=states, plan=plan, planted=planted)


class Indexer(torch.nn.Module):
    """DeepSeek's lightning indexer read from token states ``x [B, T, d]``: index queries
    ``x W_q -> [B, H_I, T, d_I]``, one shared index key ``x W_k -> [B, 1, T, d_I]``, weights
    ``x W_w -> [B, H_I, T]`` times ``H_I^{-1/2} d_I^{-1/2}`` (the factor DeepSeek folds into the weights).
    Initialised from ``generator`` (fan-in scaled Gaussians)."""

    def __init__(self, d_state: int, n_heads: int, head_dim: int, *, generator: torch.Generator):
        super().__init__()
        g = _check_generator(generator)
        self.n_heads = _validate.check_int("n_heads", n_heads, lo=1)
        self.head_dim = _validate.check_int("head_dim", head_dim, lo=1)

        def init(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(shape[0]))

        self.W_q = init(d_state, n_heads * head_dim)        # index queries, H_I heads
        self.W_k = init(d_state, head_dim)                  # the one index key, shared by the heads
        self.W_w = init(d_state, n_heads)                   # each head's weight, per query

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        iq = (x @ self.W_q).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        ik = (x @ self.W_k)[:, None]
        iw = (x @ self.W_w).transpose(1, 2) / math.sqrt(self.n_heads * self.head_dim)
        return iq, ik, iw

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return index_scores(*self(x))


def train_indexer(indexer: Indexer, task_fn, *, dense_steps: int, sparse_steps: int, top_k: int,
                  lr: float = 3e-3) -> list[float]:
    """DeepSeek-V3.2's two stages for the indexer alone (the teacher is fixed): ``dense_steps`` of
    ``KL(p_t || softmax(I_t))`` over every visible key, then ``sparse_steps`` with the KL restricted to
    the ``top_k`` keys the indexer itself selects. The indexer's input is detached (it learns from the
    attention, never the reverse). ``task_fn()`` returns a fresh :class:`PlantedTask` batch per step.
    Adam; returns the loss per step (mean KL per query)."""
    opt = torch.optim.Adam(indexer.parameters(), lr=lr)
    losses = []

    def step_loss(step: int) -> torch.Tensor:
        task = task_fn()
        I = indexer.scores(task.states.detach())
        selected = None if step < dense_steps else topk_select(I.detach(), top_k, causal=True)
        return indexer_kl_loss(task.plan, I, selected, causal=True).mean()

    train_loop(step_loss, opt, dense_steps + sparse_steps, after_step=lambda _, loss: losses.append(loss.item()))
    return losses


def recall(plan: torch.Tensor, scores: torch.Tensor, ks, *, first_row: int) -> list[float]:
    """Mean ``p(S)`` -- the teacher's mass on the ``k`` keys the scores select -- over rows
    ``t >= first_row`` of every sequence, for each ``k`` in ``ks``. ``plan, scores [B, 1, T, T]``."""
    T = plan.shape[-1]
    out = []
    for k in ks:
        mask = selection_mask(topk_select(scores, int(k), causal=True), T)
        out.append(float((plan * mask).sum(-1)[..., first_row:].mean()))
    return out


def recall_grid(configs, ks, seeds, *, T: int = 128, batch: int = 16, task: dict | None = None,
                dense_steps: int = 150, sparse_steps: int = 50, train_k: int | None = None,
                lr: float = 3e-3, device: str | torch.device = "cpu") -> dict:
    """Recall ``p(S)`` against ``k`` for indexers of each ``(H_I, d_I)`` in ``configs``, each trained
    from each seed (its own generator: initial weights, training batches, and a held-out batch), beside
    the same indexer untrained (random) and the oracle (the teacher's own top-k: an upper bound).
    Rows ``t >= T / 2`` are scored (each sees at least ``T / 2`` keys; ``ks`` should stay below that).
    The data are drawn on the CPU (so a seed gives the same task everywhere) and trained on ``device``.

    Returns ``{"ks", "configs", "trained" [C, S, K], "untrained" [C, S, K], "oracle" [S, K],
    "final_loss" [C, S]}`` (float64 tensors)."""
    task = dict(task or {})
    ks = [int(k) for k in ks]
    train_k = train_k if train_k is not None else max(ks)
    trained = torch.zeros(len(configs), len(seeds), len(ks), dtype=F64)
    untrained, final = torch.zeros_like(trained), torch.zeros(len(configs), len(seeds), dtype=F64)
    oracle = torch.zeros(len(seeds), len(ks), dtype=F64)
    def draw(g):
        t = planted_task(batch, T, generator=g, **task)
        return PlantedTask(t.states.to(device), t.plan.to(device), t.planted.to(device))

    for si, seed in enumerate(seeds):
        test = draw(torch.Generator().manual_seed(seed + 7919))
        oracle[si] = torch.tensor(recall(test.plan, test.plan, ks, first_row=T // 2))
        for ci, (H_I, d_I) in enumerate(configs):
            g = torch.Generator().manual_seed(seed * 1009 + ci)
            ix = Indexer(test.states.shape[-1], H_I, d_I, generator=g).to(device)
            with torch.no_grad():
                untrained[ci, si] = torch.tensor(recall(test.plan, ix.scores(test.states), ks, first_row=T // 2))
            losses = train_indexer(ix, lambda: draw(g), dense_steps=dense_steps,
                                   sparse_steps=sparse_steps, top_k=train_k, lr=lr)
            final[ci, si] = sum(losses[-10:]) / 10
            with torch.no_grad():
                trained[ci, si] = torch.tensor(recall(test.plan, ix.scores(test.states), ks, first_row=T // 2))
    return dict(ks=ks, configs=[tuple(c) for c in configs], trained=trained, untrained=untrained, oracle=oracle,
                final_loss=final)


# ---------------------------------------------------------------------------------------------
# 5. Cost on counted work
# ---------------------------------------------------------------------------------------------

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


# What DeepSeek-V3.2-Exp's reference code keeps per token and layer (``inference/model.py``): the latent and
# its rotary key at the default dtype, which ``generate.py`` sets to bfloat16 (``kv_cache``, ``pe_cache``),
# and the index key in FP8 (e4m3, ``k_cache``) with one float32 scale per 128 values (``k_scale_cache``).
CACHE_BYTES = dict(latent=(512 + 64) * 2, index_key=128 * 1 + 4)
# The layout DeepSeek's serving kernels read (FlashMLA's README, "FP8 with scale"): the 512 latent values in
# FP8 e4m3 with one float32 scale per 128 of them, and the 64 rotary values in bf16 -- 656 bytes per token.
CACHE_BYTES_FP8 = dict(latent=512 * 1 + 4 * 4 + 64 * 2, index_key=CACHE_BYTES["index_key"])


def cache_bytes_per_token(cache: dict = CACHE_BYTES) -> dict[str, int]:
    """Bytes one token leaves in one layer's cache at the precision each part is stored in: MLA's latent
    and rotary key (``dense``), and with the indexer its index key too (``topk``). Every token stays a
    candidate for every later query, so nothing is evicted: the cache grows by the index key."""
    return dict(dense=cache["latent"], topk=cache["latent"] + cache["index_key"])


def decode_bytes(T: int, *, top_k: int = DEEPSEEK_V32["index_topk"], latent: int = CACHE_BYTES["latent"],
                 index_key: int = CACHE_BYTES["index_key"], sparse_latent: int | None = None) -> dict[str, int]:
    """Bytes of cache one decoding query reads in one layer at context ``T``: dense MLA reads every latent
    row (``T * latent``); the top-k layer reads every index key and the ``min(k, T)`` selected latent rows
    (``T * index_key + min(k, T) * sparse_latent``; ``sparse_latent`` defaults to ``latent``, e.g. 656 B for
    FlashMLA's FP8 layout). Every row is read once per query: the bytes a memory-bound step moves."""
    sparse_latent = latent if sparse_latent is None else sparse_latent
    return dict(dense=T * latent, sparse=T * index_key + min(top_k, T) * sparse_latent)


# Our reading of Figure 3 of the DeepSeek-V3.2-Exp report ("Inference costs of DeepSeek-V3.1-Terminus and
# DeepSeek-V3.2-Exp on H800 clusters"; cost per million tokens in USD against the token position, from their
# deployed service at 2 USD per GPU hour): straight lines fitted to the plotted curves' pixels. Ours, not
# DeepSeek's numbers: each is good to about 2% of the panel's full scale. ``slope`` in USD per million tokens
# per 1K of position, ``at_0`` the line's value at position 0; for V3.2-Exp past its kink (positions >= 12K),
# and ``kink`` the position (K tokens) where its prefill line changes slope.
DSA_COST_FIGURE = {
    "prefill": {"V3.1-Terminus": dict(at_0=0.0557, slope=4.894e-3), "V3.2-Exp": dict(at_0=0.0985, slope=7.33e-4),
                "V3.2-Exp below the kink": dict(at_0=0.0645, slope=5.8e-3), "kink": 6.7},
    "decode": {"V3.1-Terminus": dict(at_0=0.0752, slope=1.669e-2), "V3.2-Exp": dict(at_0=0.1500, slope=8.42e-4)},
}


def cost_model_vs_figure(config: dict = DEEPSEEK_V32, figure: dict = DSA_COST_FIGURE,
                         cache: dict = CACHE_BYTES) -> dict[str, dict[str, float]]:
    """The counting models set beside our reading of DeepSeek's Figure 3 (:data:`DSA_COST_FIGURE`). Per
    quantity, ``predicted`` (from :func:`per_pair_flops` and :data:`CACHE_BYTES`; positions in tokens) and
    ``read`` (from the figure; its "K" is 1024 tokens):

    * ``prefill_kink``: the position where the sparse path (indexer over every key, MQA-form attention
      over ``k``) becomes cheaper than DeepSeek's "masked MHA mode" (dense MHA over every key, plus the
      indexer): ``mqa * k / mha``;
    * ``masked_mha_slope``: that mode's cost per key over V3.1's dense MHA: ``(mha + indexer) / mha``;
    * ``prefill_slope``: V3.1's cost per key over V3.2's past the kink, predicted ``mha / indexer`` with
      the indexer's FP8 FLOPs at the price of bf16 ones (``predicted``) or at half (``predicted_fp8``);
    * ``decode_slope``: the same for decoding, by FLOPs (``mqa / indexer``, and at half price) and by
      bytes read (``bytes``: a bf16 latent row against an FP8 index key and its scale);
    * ``decode_offset``: how far V3.2's decode line starts above V3.1's, against the cost of reading ``k``
      keys on V3.1's own line (``predicted``);
    * ``decode_roofline``: the decode slope a roofline predicts (:func:`decode_slope_roofline`) with one
      query per read of the cache (``one_query``) and with two (``two_queries``), and the arithmetic
      intensities and ridges behind it."""
    c = per_pair_flops(config)
    k = config["index_topk"]
    pre, dec = figure["prefill"], figure["decode"]
    per_token = 1 / 1024                                  # the figure's slopes are per 1K positions
    return {
        "prefill_kink": dict(predicted=c["mqa"] * k / c["mha"], read=figure["prefill"]["kink"] * 1024),
        "masked_mha_slope": dict(predicted=(c["mha"] + c["indexer"]) / c["mha"],
                                 read=pre["V3.2-Exp below the kink"]["slope"] / pre["V3.1-Terminus"]["slope"]),
        "prefill_slope": dict(predicted=c["mha"] / c["indexer"], predicted_fp8=2 * c["mha"] / c["indexer"],
                              read=pre["V3.1-Terminus"]["slope"] / pre["V3.2-Exp"]["slope"]),
        "decode_slope": dict(predicted=c["mqa"] / c["indexer"], predicted_fp8=2 * c["mqa"] / c["indexer"],
                             bytes=cache["latent"] / cache["index_key"],
                             read=dec["V3.1-Terminus"]["slope"] / dec["V3.2-Exp"]["slope"]),
        "decode_offset": dict(predicted=k * per_token * dec["V3.1-Terminus"]["slope"],
                              read=dec["V3.2-Exp"]["at_0"] - dec["V3.1-Terminus"]["at_0"]),
        "decode_roofline": decode_slope_roofline(config, cache),
    }


def decode_slope_roofline(config: dict = DEEPSEEK_V32, cache: dict = CACHE_BYTES, *,
                          roof=None) -> dict[str, float]:
    """Dense decoding's cost per key over the indexer's, by the roofline of appendix A1: each side's time
    per key is ``max(FLOPs / peak, bytes / (bandwidth x q))`` when ``q`` queries of one sequence share each
    read of the cache (``q = 1``: plain decoding; ``q = 2``: one token drafted ahead, as multi-token
    prediction does). Dense MLA runs at the bf16 peak on ``cache["latent"]`` bytes per key; the indexer at
    the FP8 peak, twice the bf16 one on Hopper, on ``cache["index_key"]`` bytes. ``roof``: an
    :class:`attnbook.experiments.roofline.Roof` (default the H100's datasheet ceilings)."""
    from .roofline import PEAKS

    roof = PEAKS["NVIDIA H100"] if roof is None else roof
    c = per_pair_flops(config)
    bf16, fp8, bw = roof.tflops * 1e12, 2 * roof.tflops * 1e12, roof.tb_per_s * 1e12

    def ratio(q: int) -> float:
        dense = max(c["mqa"] / bf16, cache["latent"] / (bw * q))
        indexer = max(c["indexer"] / fp8, cache["index_key"] / (bw * q))
        return dense / indexer

    return dict(one_query=ratio(1), two_queries=ratio(2), device=roof.device,
                dense_intensity=c["mqa"] / cache["latent"], indexer_intensity=c["indexer"] / cache["index_key"],
                bf16_ridge=roof.ridge, fp8_ridge=2 * roof.ridge)


__all__ = ["DEEPSEEK_V32", "restrict", "eot_plan_on_support", "transport_reading", "tight_values",
           "random_rows", "noisy_indexer", "mechanism_map", "blind_needle", "signed_indexer_needle", "head_plans",
           "shared_selection_loss", "PlantedTask", "planted_task", "Indexer",
           "train_indexer", "recall", "recall_grid", "indexer_flops", "attention_flops", "topk_attention_flops",
           "mla_dims", "per_pair_flops", "break_even_length", "prefill_break_even", "decode_flops",
           "CACHE_BYTES", "CACHE_BYTES_FP8", "cache_bytes_per_token", "decode_bytes", "DSA_COST_FIGURE",
           "cost_model_vs_figure", "decode_slope_roofline"]
