"""Chapter 7's exercises: the lightning indexer's scores, top-k attention (a causal selection, then softmax
restricted to it), the L1 distance a selection costs a softmax row, and what a top-k layer costs per token."""

from __future__ import annotations

import math

import torch

from attnlib.attention import softmax_attention_reference
from attnlib.topk import index_scores_reference, selection_mask, topk_attention_reference, topk_select_reference

from ._checker import Case, Exercise, Freedom, Wrong, matches

f64 = torch.float64



# --- 1. the lightning indexer's scores ------------------------------------------------------------

def index_scores(index_q, index_k, index_w):
    """The indexer's scores. Float tensors: ``index_q [B, H_I, Tq, d_I]``; one
    index key per token, shared by the heads, ``index_k [B, 1, Tk, d_I]``;
    signed weights ``index_w [B, H_I, Tq]``. Return ``I [B, 1, Tq, Tk]``:
    ``I[b, 0, t, s] = sum_j w[b, j, t] ReLU(q[b, j, t] . k[b, 0, s])`` for every
    pair (no mask, no scale)."""
    # [B, H_I, Tq, d_I] @ [B, 1, d_I, Tk] -> [B, H_I, Tq, Tk]: the shared key
    # broadcasts over the index heads
    per_head = torch.relu(index_q @ index_k.transpose(-1, -2))
    # each head's ReLU first, then its weight, then the sum over heads
    return (index_w.unsqueeze(-1) * per_head).sum(dim=1, keepdim=True)


def _scores_relu_after(index_q, index_k, index_w):
    weighted = index_w.unsqueeze(-1) * (index_q @ index_k.transpose(-1, -2))
    return torch.relu(weighted.sum(dim=1, keepdim=True))


def _scores_unweighted(index_q, index_k, index_w):
    return torch.relu(index_q @ index_k.transpose(-1, -2)).sum(dim=1, keepdim=True)


def _scores_relu_weighted(index_q, index_k, index_w):
    """The ReLU on each head's weighted product, w ReLU-ed too: right wherever every weight is >= 0."""
    return torch.relu(index_w.unsqueeze(-1) * (index_q @ index_k.transpose(-1, -2))).sum(dim=1, keepdim=True)


def _scores_mean_heads(index_q, index_k, index_w):
    """The mean over the index heads: right for one head."""
    return index_scores(index_q, index_k, index_w) / index_q.shape[1]


def _scores_square(index_q, index_k, index_w):
    """Tq keys for Tq queries: right wherever Tq = Tk."""
    return index_scores(index_q, index_k[..., :index_q.shape[-2], :], index_w)


def _scores_first_batch_keys(index_q, index_k, index_w):
    """Batch 0's keys for every batch (``index_k[0, 0]``): right for B = 1."""
    return index_scores(index_q, index_k[:1, :1].expand_as(index_k), index_w)


def _scores_causal(index_q, index_k, index_w):
    """A causal mask on the scores (0 where s > t): the mask belongs to the selection."""
    I = index_scores(index_q, index_k, index_w)
    Tq, Tk = I.shape[-2:]
    return I.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool).triu(1), 0.0)


def _blind_key(case) -> bool:
    """Whether some key is scored negative by every head for every query (its ReLU is 0 throughout)."""
    iq, ik, _ = case.args
    return bool(((iq @ ik.transpose(-1, -2)) < 0).all(dim=1).all(dim=-2).any())


def _scores_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def c(label, iq, ik, iw, hint=""):
        return Case(label, (iq, ik, iw), index_scores_reference(iq, ik, iw), hint=hint)

    # the chapter's blind key: every index query in the positive orthant, the key at -(1, ..., 1), so every
    # head's product is negative and its ReLU 0; negative weights put every other key below it
    pos_q = randn(1, 4, 3, 6).abs() + 0.1
    blind_k = randn(1, 1, 5, 6).abs() + 0.1
    blind_k[0, 0, 2] = -1.0
    return [
        c("B = 2, H_I = 3, Tq = Tk = 7, d_I = 5, signed weights", randn(2, 3, 7, 5), randn(2, 1, 7, 5),
          randn(2, 3, 7)),
        c("one index head, d_I = 1 (many scores exactly 0)", randn(1, 1, 6, 1), randn(1, 1, 6, 1),
          randn(1, 1, 6)),
        c("B = 2: 3 queries against 8 keys (Tq != Tk)", randn(2, 2, 3, 4), randn(2, 1, 8, 4), randn(2, 2, 3)),
        c("a key every head scores negative, negative weights", pos_q, blind_k, -(randn(1, 4, 3).abs() + 0.1),
          hint="key 2 has q . k < 0 on every head: ReLU each head's product before its weight, so the key "
               "scores exactly 0, and with negative weights 0 is the highest score in the row"),
        c("all weights 0", randn(1, 3, 4, 3), randn(1, 1, 4, 3), torch.zeros(1, 3, 4, dtype=f64)),
        c("DeepSeek's width: 64 index heads of 128, 1 query, 16 keys", randn(1, 64, 1, 128),
          randn(1, 1, 16, 128), randn(1, 64, 1) / 64),
    ]


INDEX_SCORES = Exercise(
    name="lightning indexer",
    chapter="7",
    title="The lightning indexer's scores",
    statement=(
        "The indexer scores every (query, key) pair with $H_I$ index heads that share one index key per "
        "token: $I_{t,s}=\\sum_{j=1}^{H_I} w_{t,j}\\,\\mathrm{ReLU}(q^I_{t,j}\\cdot k^I_s)$, with weights "
        "of either sign. Compute $I$ for every pair (the causal mask belongs to the selection, not to the "
        "scores), so that it holds for several batches, one head of width 1, fewer queries than keys, a key "
        "that every head scores negative under negative weights (the chapter's exercise 4) and DeepSeek's "
        "64 heads of 128."),
    solution=index_scores,
    cases=_scores_cases,
    wrong=(Wrong(_scores_relu_after, "weighted sum"), Wrong(_scores_unweighted, "weight"),
           Wrong(_scores_relu_weighted, "before its weight"), Wrong(_scores_mean_heads, "not their mean"),
           Wrong(_scores_square, "expected shape (2, 1, 3, 8)"),
           Wrong(_scores_first_batch_keys, "entries differ; first at [1,"),
           Wrong(_scores_causal, "no mask")),
    diagnose=((matches(_scores_relu_after), "you applied the ReLU to the weighted sum: the ReLU acts on "
                                            "each head's product q_tj . k_s, before the weights and the sum"),
              (matches(_scores_unweighted), "each head's ReLU is multiplied by its weight w_tj before the "
                                            "sum over heads"),
              (matches(_scores_relu_weighted), "the ReLU acts on q_tj . k_s alone, before its weight: "
                                               "w ReLU(q . k), not ReLU(w q . k), which differ where w < 0"),
              (matches(_scores_mean_heads), "the heads' weighted ReLUs are summed, not their mean"),
              (matches(_scores_causal), "the scores have no mask: every pair is scored, s > t too (the "
                                        "causal mask belongs to the selection)")),
    freedoms=(
        Freedom("B > 1, each batch its own keys", lambda c: c.args[1].shape[0] > 1),
        Freedom("several index heads (H_I > 1)", lambda c: c.args[0].shape[1] > 1),
        Freedom("weights of either sign", lambda c: bool((c.args[2] < 0).any() and (c.args[2] > 0).any())),
        Freedom("fewer queries than keys (Tq < Tk)", lambda c: c.args[0].shape[-2] < c.args[1].shape[-2]),
        Freedom("pairs with s > t (no mask)", lambda c: c.args[0].shape[-2] > 1),
        Freedom("a key every head scores negative", _blind_key),
    ),
)


# --- 2. top-k attention ---------------------------------------------------------------------------

def topk_attention(q, k, v, I, top_k):
    """Causal top-k attention: ``q, k [B, H, T, D]``, ``v [B, H, T, Dv]``, index
    scores ``I [B, 1, T, T]`` (shared by the heads), ``top_k >= 1``. Query t
    keeps its ``top_k`` visible keys (s <= t) of highest ``I[t, s]`` (all if it
    sees fewer; ties to the earlier key), then softmax of ``q . k / sqrt(D)`` on
    them alone. Return ``[B, H, T, Dv]``; never read an unselected key."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, H, T, D = q.shape
    n = min(top_k, T)
    rows = torch.arange(T)[:, None]
    # [T, T]: key s <= query t
    visible = torch.arange(T)[None, :] <= rows
    # Rank by index score with the invisible keys at -inf: a stable sort gives
    # ties to the earlier key and puts every visible key before every
    # invisible one, so the first n slots hold the top-k visible keys.
    score = I.masked_fill(~visible, float("-inf"))
    idx = torch.sort(score, dim=-1, descending=True,
                     stable=True).indices[..., :n]      # [B, 1, T, n]
    # a row that sees fewer than n keys has empty slots
    used = idx <= rows
    # Gather the selected keys and values ([B, H, T, n, D]): the other keys are
    # never read, so an inf or NaN in them cannot reach the output (masking a
    # dense product would give 0 * inf = NaN).
    b, h = (torch.arange(B)[:, None, None, None],
            torch.arange(H)[None, :, None, None])
    k_sel, v_sel = k.to(acc)[b, h, idx], v.to(acc)[b, h, idx]
    v_sel = torch.where(used.unsqueeze(-1), v_sel, 0.0)
    s = torch.einsum("bhtd,bhtnd->bhtn", q.to(acc), k_sel) / math.sqrt(D)
    s = s.masked_fill(~used, float("-inf"))
    # renormalised over the selected keys only
    p = torch.softmax(s, dim=-1)
    return torch.einsum("bhtn,bhtnd->bhtd", p, v_sel)


def _dense_logits(q, k):
    return (q.to(f64) @ k.to(f64).transpose(-1, -2)) / math.sqrt(q.shape[-1])


def _selected(I, top_k):
    """The library's selection as a mask ``[B, 1, T, T]``."""
    return selection_mask(topk_select_reference(I.to(f64), top_k, causal=True), I.shape[-1])


def _topk_not_renormalised(q, k, v, I, top_k):
    T = q.shape[-2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    p = torch.softmax(_dense_logits(q, k).masked_fill(~causal, float("-inf")), dim=-1)
    return (p * _selected(I, top_k)) @ v.to(f64)


def _masked_attention(q, k, v, sel):
    s = _dense_logits(q, k).masked_fill(~sel, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.to(f64)


def _topk_no_causal(q, k, v, I, top_k):
    T = q.shape[-2]
    sel = selection_mask(topk_select_reference(I.to(f64), top_k, causal=False), T)
    return _masked_attention(q, k, v, sel)


def _topk_counts_masked(q, k, v, I, top_k):
    T = q.shape[-2]
    sel = selection_mask(topk_select_reference(I.to(f64), top_k, causal=False), T)
    return _masked_attention(q, k, v, sel & torch.ones(T, T, dtype=torch.bool).tril())


def _topk_unscaled(q, k, v, I, top_k):
    s = (q.to(f64) @ k.to(f64).transpose(-1, -2)).masked_fill(~_selected(I, top_k), float("-inf"))
    return torch.softmax(s, dim=-1) @ v.to(f64)


def _topk_variant(q, k, v, I, top_k, *, order=None, mask=float("-inf"), scale=None, exp=torch.exp):
    """The worked answer with one thing changed: how the keys are ranked (``order(score) -> indices``),
    the value that hides the future keys from the ranking, the logits' scale, or the exponential."""
    T, D = q.shape[-2:]
    rows = torch.arange(T)[:, None]
    score = I.to(f64).masked_fill(~(torch.arange(T)[None, :] <= rows), mask)
    if order is None:
        idx = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :min(top_k, T)]
    else:
        idx = order(score)
    used = idx <= rows
    b, h = torch.arange(q.shape[0])[:, None, None, None], torch.arange(q.shape[1])[None, :, None, None]
    k_sel, v_sel = k.to(f64)[b, h, idx], v.to(f64)[b, h, idx]
    v_sel = torch.where(used.unsqueeze(-1), v_sel, 0.0)
    s = torch.einsum("bhtd,bhtnd->bhtn", q.to(f64), k_sel) * (scale or D ** -0.5)
    s = s.masked_fill(~used, float("-inf"))
    e = exp(s - s.amax(-1, keepdim=True)) if exp is not None else torch.exp(s)
    return torch.einsum("bhtn,bhtnd->bhtd", e / e.sum(-1, keepdim=True), v_sel)


def _topk_scale_dv(q, k, v, I, top_k):
    """1 / sqrt(Dv) for 1 / sqrt(D): right wherever D = Dv."""
    return _topk_variant(q, k, v, I, top_k, scale=v.shape[-1] ** -0.5)


def _topk_first_batch_scores(q, k, v, I, top_k):
    """Batch 0's index scores for every batch: right for B = 1."""
    return _topk_variant(q, k, v, I[:1].expand_as(I), top_k)


def _topk_torch_topk(q, k, v, I, top_k):
    """``torch.topk(score, top_k)``: raises where top_k > T."""
    return _topk_variant(q, k, v, I, top_k, order=lambda s: torch.topk(s, top_k, dim=-1).indices)


def _topk_ties_late(q, k, v, I, top_k):
    """An ascending stable sort read from the end: ties go to the later key."""
    def order(s):
        return torch.sort(s, dim=-1, stable=True).indices.flip(-1)[..., :min(top_k, s.shape[-1])]
    return _topk_variant(q, k, v, I, top_k, order=order)


def _topk_by_logits(q, k, v, I, top_k):
    """The keys of highest logit q . k, per head: the indexer ignored."""
    T = q.shape[-2]
    logits = _dense_logits(q, k).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    sel = selection_mask(topk_select_reference(logits, top_k, causal=True), T)
    return _masked_attention(q, k, v, sel)


def _topk_no_max(q, k, v, I, top_k):
    """exp of the logits as they are: overflows at logits of 1e4."""
    return _topk_variant(q, k, v, I, top_k, exp=None)


def _topk_half_in_base_2(q, k, v, I, top_k):
    """For float16 inputs, the kernel's exp2 without its log2(e) factor (a softmax at another temperature):
    invisible where the softmax is one-hot."""
    return _topk_variant(q, k, v, I, top_k, exp=torch.exp2 if q.dtype == torch.float16 else torch.exp)


def _topk_dense_masked(q, k, v, I, top_k):
    """The right selection, applied as a mask on the dense product: 0 * inf = NaN from an unread key."""
    return _masked_attention(q, k, v, _selected(I, top_k))


def _topk_finite_mask(q, k, v, I, top_k):
    """The future keys hidden from the ranking by -1e9, not -inf."""
    return _topk_variant(q, k, v, I, top_k, mask=-1e9)


def _half_logits(c, lo, hi) -> bool:
    q, k = c.args[0], c.args[1]
    if q.dtype != torch.float16:
        return False
    m = _dense_logits(q, k).abs().amax().item()
    return lo <= m < hi


def _ties(c) -> bool:
    return bool((c.args[3].diff(dim=-1) == 0).any())


def _topk_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    def c(label, q, k, v, I, top_k, expected=None, hint=""):
        if expected is None:
            idx = topk_select_reference(I, top_k, causal=True)
            expected = topk_attention_reference(q.to(f64), k.to(f64), v.to(f64), idx,
                                                scale=q.shape[-1] ** -0.5)[0]
        tol = 5e-3 if q.dtype == torch.float16 else None
        return Case(label, (q, k, v, I, top_k), expected, tol=tol, hint=hint)

    def dense(q, k, v):
        return softmax_attention_reference(q.to(f64), k.to(f64), v.to(f64), scale=q.shape[-1] ** -0.5,
                                           causal=True)[0]

    q1, k1, v1 = randn(1, 2, 7, 4), randn(1, 2, 7, 4), randn(1, 2, 7, 3)
    # the needle: key 3 has a huge logit for every query, but the indexer ranks it last
    qn = randn(1, 1, 8, 4)
    kn = randn(1, 1, 8, 4)
    kn[0, 0, 3] = 20.0 * qn[0, 0].mean(0) / qn[0, 0].mean(0).norm()
    In = randn(1, 1, 8, 8)
    In[..., 3] = -1e3
    # inf in the key and value of position 4, which the indexer ranks last (never selected with top_k = 3)
    kinf, vinf, Iinf = randn(1, 2, 9, 4), randn(1, 2, 9, 2), randn(1, 1, 9, 9)
    kinf[:, :, 4], vinf[:, :, 4], Iinf[..., 4] = float("inf"), float("inf"), -1e3
    big = randn(1, 2, 6, 8)
    big_q = (big / big.norm(dim=-1, keepdim=True) * 100.0 * 8 ** 0.25).to(torch.float16)
    # float16 logits of order 1 to 10: the softmax is far from one-hot, every weight counts
    mid_q, mid_k = (2 * randn(1, 2, 8, 8)).to(torch.float16), (2 * randn(1, 2, 8, 8)).to(torch.float16)
    # index scores between -1.5e30 and -0.5e30: below any finite constant a mask is usually given
    low_I = -1e30 * (0.5 + torch.rand(1, 1, 7, 7, generator=gen, dtype=f64))
    return [
        c("B = 2, H = 3, T = 9, D = 5, Dv = 4, top_k = 3", randn(2, 3, 9, 5), randn(2, 3, 9, 5),
          randn(2, 3, 9, 4), randn(2, 1, 9, 9), 3),
        c("top_k = T = 7: dense causal attention", q1, k1, v1, randn(1, 1, 7, 7), 7,
          expected=dense(q1, k1, v1),
          hint="with top_k >= the keys a query sees, every visible key is kept: causal softmax attention"),
        c("top_k = 1: each query returns one value", randn(1, 2, 6, 3), randn(1, 2, 6, 3), randn(1, 2, 6, 2),
          randn(1, 1, 6, 6), 1),
        c("T = 1, top_k = 2", randn(1, 1, 1, 4), randn(1, 1, 1, 4), randn(1, 1, 1, 3), randn(1, 1, 1, 1), 2,
          hint="top_k = 2 > T = 1: a query keeps min(top_k, t + 1) keys (torch.topk raises for k > T)"),
        c("tied index scores (all 0), top_k = 3", randn(1, 1, 8, 4), randn(1, 1, 8, 4), randn(1, 1, 8, 2),
          torch.zeros(1, 1, 8, 8, dtype=f64), 3,
          hint="ties go to the earlier key: rank with a stable sort (torch.topk does not promise which tie)"),
        c("a needle the indexer ranks last: it must not be read", qn, kn, randn(1, 1, 8, 3), In, 2,
          hint="key 3's logit q . k is the largest, but the keys come from the index scores I, which rank "
               "it last"),
        c("float16 inputs, logits of order 1 to 10, top_k = 5", mid_q, mid_k,
          randn(1, 2, 8, 3, dtype=torch.float16), randn(1, 1, 8, 8), 5,
          hint="float16 inputs whose softmax is far from one-hot: every weight is checked (to 5e-3), so the "
               "softmax must be e^x over the selected logits, computed in float32"),
        c("logits of 1e4 in float16, top_k = 4", big_q, big_q.flip(-2).contiguous(),
          randn(1, 2, 6, 3, dtype=torch.float16), randn(1, 1, 6, 6), 4,
          hint="logits of 1e4: exp overflows; compute in float32 and subtract the largest selected logit "
               "before exp"),
        c("inf in the k and v of a key never selected", randn(1, 2, 9, 4), kinf, vinf, Iinf, 3,
          hint="an unselected key must not touch the output: gather the selected keys and values (a masked "
               "dense product gives 0 * inf = NaN)"),
        c("index scores near -1e30, top_k = 3", randn(1, 1, 7, 3), randn(1, 1, 7, 3), randn(1, 1, 7, 2),
          low_I, 3,
          hint="these index scores lie below -5e29: a finite constant (-1e9, -1e30) that hides the future "
               "keys ranks them above the visible ones; hide them with -inf"),
    ]


TOPK_ATTENTION = Exercise(
    name="top-k attention",
    chapter="7",
    title="Top-k attention: select, then softmax on the selection",
    statement=(
        "Query $t$ keeps the set $\\mathcal S_t$ of its $k$ visible keys ($s\\le t$) with the highest index "
        "scores $I_{t,s}$, all of them if it sees at most $k$, ties to the earlier key; then "
        "$o_t=\\sum_{s\\in\\mathcal S_t}\\frac{e^{q_t\\cdot k_s/\\sqrt D}}{\\sum_{r\\in\\mathcal S_t}"
        "e^{q_t\\cdot k_r/\\sqrt D}}v_s$, one selection for all heads. Write it so that $k\\ge T$ is dense "
        "causal attention and it holds for $D\\ne D_v$, $T=1$, tied scores, a needle the indexer ranks "
        "last, index scores of any size (some near $-10^{30}$), an infinite key that no query selects, and "
        "float16 inputs, whose answer is checked to $5\\cdot10^{-3}$ (compute in float32) at logits of "
        "order 1 and of $10^4$."),
    solution=topk_attention,
    imports="import math\n\nimport torch",
    cases=_topk_cases,
    wrong=(Wrong(_topk_not_renormalised, "renormalise"), Wrong(_topk_no_causal, "future"),
           Wrong(_topk_counts_masked, "visible keys"), Wrong(_topk_unscaled, "sqrt(d)"),
           Wrong(_topk_scale_dv, "not dv"), Wrong(_topk_first_batch_scores, "entries differ; first at [1,"),
           Wrong(_topk_torch_topk, "torch.topk raises"), Wrong(_topk_ties_late, "earlier key"),
           Wrong(_topk_by_logits, "not from the attention logits"), Wrong(_topk_no_max, "overflows"),
           Wrong(_topk_half_in_base_2, "e^x"), Wrong(_topk_dense_masked, "0 * inf"),
           Wrong(_topk_finite_mask, "with -inf")),
    diagnose=((matches(_topk_not_renormalised), "your rows sum to p(S) < 1: renormalise the softmax over the "
                                                "selected keys (softmax of the selected logits alone)"),
              (matches(_topk_no_causal), "your selection takes future keys (s > t): apply the causal mask "
                                         "before choosing the top k"),
              (matches(_topk_counts_masked), "you chose the top k among all keys and then dropped the "
                                             "future ones: choose among the visible keys, so a row keeps "
                                             "min(k, t+1) visible keys"),
              (matches(_topk_unscaled), "the logits are q . k / sqrt(D): scale by 1 / sqrt(D), the key "
                                        "dimension"),
              (matches(_topk_scale_dv), "the logits are q . k / sqrt(D): D is the key dimension, not Dv"),
              (matches(_topk_by_logits), "you chose the keys of largest q . k: the keys come from the index "
                                         "scores I, not from the attention logits, one selection for all "
                                         "heads")),
    freedoms=(
        Freedom("D ≠ Dv", lambda c: c.args[0].shape[-1] != c.args[2].shape[-1]),
        Freedom("B > 1 and H > 1", lambda c: c.args[0].shape[0] > 1 and c.args[0].shape[1] > 1),
        Freedom("top_k > T", lambda c: c.args[4] > c.args[0].shape[-2]),
        Freedom("rows that see fewer than top_k keys", lambda c: 1 < c.args[4] < c.args[0].shape[-2]),
        Freedom("tied index scores", _ties),
        Freedom("float16 logits of order 1 to 10", lambda c: _half_logits(c, 1.0, 100.0)),
        Freedom("float16 logits of 1e4", lambda c: _half_logits(c, 1e3, math.inf)),
        Freedom("an infinite key never selected", lambda c: not bool(torch.isfinite(c.args[1]).all())),
        Freedom("index scores below -1e29", lambda c: c.args[3].amax().item() < -1e29),
    ),
)


# --- 3. what a selection costs a row: the L1 distance ----------------------------------------------

def topk_l1_error(scores, selected):
    """``||p - p~||_1`` per row: ``p = softmax(scores)`` over the last dim,
    ``p~`` = p restricted to ``selected`` and renormalised. ``scores [..., N]``
    (``-inf``: a masked key); ``selected [..., N]`` bool, at least one finite
    score selected per row. Return float64 ``[...]``, from the recall p(S)
    alone."""
    s = scores.to(torch.float64)
    # subtract the row's max: exp never overflows
    m = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - m)
    # p(S), the mass the selection keeps
    recall = (e * selected).sum(-1) / e.sum(-1)
    # the mass leaving the complement, 1 - p(S), and the same mass added on S
    # by renormalising
    return 2 * (1 - recall)


def _l1_half(scores, selected):
    return topk_l1_error(scores, selected) / 2


def _l1_shifted(scores, selected, shift):
    s = scores.to(f64)
    e = torch.exp(s - shift(s))
    return 2 * (1 - (e * selected).sum(-1) / e.sum(-1))


def _l1_no_max(scores, selected):
    """exp of the scores as they are: overflows past 709."""
    return _l1_shifted(scores, selected, lambda s: 0.0)


def _l1_one_max(scores, selected):
    """One maximum for the whole tensor: a row far below it underflows to 0 / 0."""
    return _l1_shifted(scores, selected, lambda s: s.amax())


def _l1_mean_shift(scores, selected):
    """Each row's mean subtracted: -inf in a row makes it NaN."""
    return _l1_shifted(scores, selected, lambda s: s.mean(-1, keepdim=True))


def _l1_dim1(scores, selected):
    """Reduced over dim 1: the keys' dim only for 2-D scores."""
    s = scores.to(f64)
    e = torch.exp(s - s.amax(dim=1, keepdim=True))
    return 2 * (1 - (e * selected).sum(1) / e.sum(1))


def _l1_input_dtype(scores, selected):
    """The answer in the scores' dtype, not float64."""
    return topk_l1_error(scores, selected).to(scores.dtype)


def _l1_definition(scores, selected):
    """The distance from its definition, on the library's restriction (the checker's answer)."""
    from attnbook.experiments.topk import restrict
    p = torch.softmax(scores.to(f64), dim=-1)
    return (p - restrict(p, selected)).abs().sum(-1)


def _row_spread(c) -> bool:
    m = c.args[0].to(f64).amax(-1)
    return m.numel() > 1 and (m.amax() - m.amin()).item() > 700


def _l1_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    def random_selection(shape, n):
        order = torch.rand(*shape, generator=gen).argsort(dim=-1)
        return order < n

    def c(label, scores, selected, hint=""):
        return Case(label, (scores, selected), _l1_definition(scores, selected), hint=hint)

    T = 8
    causal = randn(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    causal_sel = selection_mask(topk_select_reference(randn(1, 1, T, T), 3, causal=True), T)[0, 0]
    needle = torch.zeros(3, 10, dtype=f64)
    needle[:, 7] = 30.0
    needle_sel = torch.zeros(3, 10, dtype=torch.bool)
    needle_sel[:, :4] = True
    # row r at 1000 r + N(0, 1): exp overflows, and one maximum for all rows underflows the others
    far = 1000.0 * torch.arange(4, dtype=f64)[:, None] + randn(4, 9)
    return [
        c("4 rows of 9 scores, 3 keys selected per row", randn(4, 9), random_selection((4, 9), 3)),
        c("causal rows (-inf above the diagonal), top-3 selection", causal, causal_sel,
          hint="-inf scores are masked keys, p = 0: subtract each row's largest score, which is finite; "
               "a mean, or -inf - (-inf), makes the row NaN"),
        Case("every key selected: nothing lost", (randn(3, 5), torch.ones(3, 5, dtype=torch.bool)),
             torch.zeros(3, dtype=f64), hint="with S every key, p(S) = 1 and p~ = p"),
        c("scores [2, 3, 7]: 2 x 3 rows, 2 keys selected per row", randn(2, 3, 7),
          random_selection((2, 3, 7), 2),
          hint="three dims: the keys are the last one, dim=-1, whatever the leading dims"),
        c("a needle of logit 30 outside the selection: about 2", needle, needle_sel),
        c("tied scores, 2 of 6 kept: 2 (1 - 2/6)", torch.full((2, 6), 1.5, dtype=f64),
          random_selection((2, 6), 2)),
        c("float32 scores: 5 rows of 6, 2 keys selected per row", randn(5, 6, dtype=torch.float32),
          random_selection((5, 6), 2)),
        c("row r at 1000 r + N(0, 1)", far, random_selection((4, 9), 4),
          hint="rows up to 3000 apart: exp(3000) overflows (even in float64), and one maximum for all rows "
               "underflows the others to 0 / 0: subtract each row's own largest score"),
    ]


TOPK_L1 = Exercise(
    name="top-k error",
    chapter="7",
    title="What a selection costs a softmax row",
    statement=(
        "Restricting a softmax row $p$ to a support $\\mathcal S$ and renormalising gives "
        "$\\tilde p=p\\,\\mathbb 1_{\\mathcal S}/p(\\mathcal S)$, the one-sided entropic plan with infinite "
        "cost off $\\mathcal S$. Compute $\\|p-\\tilde p\\|_1$ per row from the recall $p(\\mathcal S)$ "
        "alone, by the chapter's identity, in float64 whatever the scores' dtype; the checker compares it "
        "with the distance computed from its definition, on causal rows, a full selection, scores with "
        "three dims, a missed needle, ties, float32 scores and rows of scores up to $3000$ apart."),
    solution=topk_l1_error,
    cases=_l1_cases,
    wrong=(Wrong(_l1_half, "plus the same mass"), Wrong(_l1_no_max, "overflows"),
           Wrong(_l1_one_max, "own largest score"), Wrong(_l1_mean_shift, "masked keys"),
           Wrong(_l1_dim1, "dim=-1"), Wrong(_l1_input_dtype, "expected dtype float64")),
    diagnose=((matches(_l1_half), "your answer is half the L1 distance: the mass 1 - p(S) leaves the "
                                  "complement, plus the same mass added on S"),),
    freedoms=(
        Freedom("masked keys (-inf)", lambda c: bool(torch.isinf(c.args[0]).any())),
        Freedom("scores with three dims", lambda c: c.args[0].dim() == 3),
        Freedom("float32 scores", lambda c: c.args[0].dtype == torch.float32),
        Freedom("rows more than 700 apart", _row_spread),
    ),
    out_dtype=torch.float64,
)


# --- 4. what a top-k layer costs per token ---------------------------------------------------------

def topk_prefill_flops(T, heads, d_head, index_heads, index_dim, top_k):
    """Matrix-product FLOPs per token of a causal prefill of ``T`` tokens
    through one top-k layer: ``heads`` attention heads, ``D = Dv = d_head``; an
    indexer of ``index_heads`` heads of width ``index_dim`` (all ints). Query t
    (1-based) sees t keys. 2 FLOPs per multiply-add; leave out the ReLU and the
    weighted sum. Return a float: the mean over the T queries."""
    # one dot product per index head and pair
    indexer = 2 * index_heads * index_dim
    # a score (q . k) and a weighted value, per head
    pair = 2 * heads * (d_head + d_head)
    total = sum(indexer * t + pair * min(top_k, t) for t in range(1, T + 1))
    return total / T


def _flops_macs(T, heads, d_head, index_heads, index_dim, top_k):
    return topk_prefill_flops(T, heads, d_head, index_heads, index_dim, top_k) / 2


def _flops_every_key(T, heads, d_head, index_heads, index_dim, top_k):
    return float(2 * index_heads * index_dim * T + 4 * heads * d_head * min(top_k, T))


def _flops_always_k(T, heads, d_head, index_heads, index_dim, top_k):
    return float(index_heads * index_dim * (T + 1) + 4 * heads * d_head * top_k)


def _flops_dense_reads(T, heads, d_head, index_heads, index_dim, top_k):
    """Query t reads all its t keys: top_k ignored (right for T <= top_k)."""
    return topk_prefill_flops(T, heads, d_head, index_heads, index_dim, T)


def _flops_indexer_heads(T, heads, d_head, index_heads, index_dim, top_k):
    """The indexer given the attention's heads: right where H_I = H."""
    return topk_prefill_flops(T, heads, d_head, heads, index_dim, top_k)


def _flops_cases(gen):
    from attnbook.experiments.landscape import HeadConfig, prefill_flops

    def c(label, T, heads, d_head, index_heads, index_dim, top_k, hint=""):
        cfg = HeadConfig(heads=heads, d_head=d_head, index_heads=index_heads, index_dim=index_dim,
                         top_k=top_k)
        return Case(label, (T, heads, d_head, index_heads, index_dim, top_k),
                    prefill_flops("topk", T, cfg).matmul, hint=hint)

    # every size different, so that a formula that swaps two of them fails
    T = int(torch.randint(40, 90, (1,), generator=gen))
    k = int(torch.randint(5, 20, (1,), generator=gen))
    return [
        c(f"T = {T}, 3 heads of 5, 7 index heads of 11, top_k = {k}", T, 3, 5, 7, 11, k),
        c("T = 4096, 16 heads of 128, 4 index heads of 64, top_k = 2048", 4096, 16, 128, 4, 64, 2048,
          hint="T >> top_k: a query past t = k reads only k keys, but the indexer still scores all t "
               "visible keys"),
        c("T = 100 < top_k = 2048: every visible key is read", 100, 16, 128, 4, 64, 2048,
          hint="a query at position t < k reads its t keys, not k"),
        c("T = top_k = 64", 64, 2, 32, 3, 16, 64),
        c("T = 1", 1, 4, 8, 2, 16, 2048,
          hint="the first query has one visible key: 2 H_I d_I + 2 H (D + Dv)"),
        c("top_k = 1, T = 33", 33, 2, 16, 1, 8, 1),
    ]


TOPK_FLOPS = Exercise(
    name="top-k layer flops",
    chapter="7",
    title="What a top-k layer costs per token",
    statement=(
        "A top-k layer pays twice: its indexer scores every visible key ($2H_Id_I$ FLOPs per pair), its "
        "softmax reads $\\min(k,t)$ of them ($2H(D+D_v)$ per pair). Write the matrix-product FLOPs per token "
        "of a causal prefill of $T$ tokens -- the mean of the $T$ queries' costs -- and compare with the "
        "chapter's table: it is checked against the cost model the lab verifies on counted FLOPs, for "
        "$T<k$, $T=k$, $T\\gg k$ and $T=1$. The indexer stays quadratic; the attention is $O(Tk)$."),
    solution=topk_prefill_flops,
    cases=_flops_cases,
    wrong=(Wrong(_flops_macs, "multiply-add"), Wrong(_flops_every_key, "visible"),
           Wrong(_flops_always_k, "min(k, t)"), Wrong(_flops_dense_reads, "only its k"),
           Wrong(_flops_indexer_heads, "its own h_i")),
    diagnose=((matches(_flops_macs), "that is half the answer: a multiply-add counts as 2 FLOPs (a dot "
                                     "product of length d costs 2d)"),
              (matches(_flops_every_key), "every query read all T keys: under the causal mask query t sees "
                                          "only its t visible keys (the indexer's term averages to (T+1)/2)"),
              (matches(_flops_always_k), "a query at position t < k has only t keys to read: min(k, t), "
                                         "not k"),
              (matches(_flops_dense_reads), "a query reads only its k selected keys once t > k: min(k, t) "
                                            "keys, not t"),
              (matches(_flops_indexer_heads), "the indexer has its own H_I heads of width d_I: 2 H_I d_I "
                                              "per pair, whatever the attention's H")),
    freedoms=(
        Freedom("T < top_k", lambda c: c.args[0] < c.args[5]),
        Freedom("T > top_k", lambda c: c.args[0] > c.args[5]),
        Freedom("T = 1", lambda c: c.args[0] == 1),
        Freedom("H_I ≠ H and d_I ≠ D", lambda c: c.args[3] != c.args[1] and c.args[4] != c.args[2]),
    ),
)


EXERCISES = (INDEX_SCORES, TOPK_ATTENTION, TOPK_L1, TOPK_FLOPS)
