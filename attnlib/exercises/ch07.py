"""Chapter 7's exercises: the lightning indexer's scores, top-k attention (a causal selection, then softmax
restricted to it), the L1 distance a selection costs a softmax row, and what a top-k layer costs per token."""

from __future__ import annotations

import math

import torch

from ..attention import softmax_attention_reference
from ..topk import index_scores_reference, selection_mask, topk_attention_reference, topk_select_reference
from ._checker import Case, Exercise, Wrong, matches

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
          randn(2, 3, 7),
          hint="I_ts = sum over heads j of w_tj * ReLU(q_tj . k_s): the ReLU acts on each head's product"),
        c("one index head, d_I = 1 (many scores exactly 0)", randn(1, 1, 6, 1), randn(1, 1, 6, 1),
          randn(1, 1, 6)),
        c("3 queries against 8 keys (Tq != Tk)", randn(2, 2, 3, 4), randn(2, 1, 8, 4), randn(2, 2, 3)),
        c("a key every head scores negative, negative weights", pos_q, blind_k, -(randn(1, 4, 3).abs() + 0.1),
          hint="ReLU before the weights: a key with q . k < 0 on every head scores exactly 0, and with "
               "negative weights 0 is the highest score in the row"),
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
        "scores), so that it holds for one head of width 1, fewer queries than keys, a key that every head "
        "scores negative under negative weights (the chapter's exercise 4) and DeepSeek's 64 heads of 128."),
    solution=index_scores,
    cases=_scores_cases,
    wrong=(Wrong(_scores_relu_after, "weighted sum"), Wrong(_scores_unweighted, "weight")),
    diagnose=((matches(_scores_relu_after), "you applied the ReLU to the weighted sum: the ReLU acts on "
                                            "each head's product q_tj . k_s, before the weights and the sum"),
              (matches(_scores_unweighted), "each head's ReLU is multiplied by its weight w_tj before the "
                                            "sum over heads")),
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


def _topk_not_renormalised(q, k, v, I, top_k):
    T = q.shape[-2]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    p = torch.softmax(_dense_logits(q, k).masked_fill(~causal, float("-inf")), dim=-1)
    sel = selection_mask(topk_select_reference(I.to(f64), top_k, causal=True), T)
    return (p * sel) @ v.to(f64)


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
    T = q.shape[-2]
    sel = selection_mask(topk_select_reference(I.to(f64), top_k, causal=True), T)
    s = (q.to(f64) @ k.to(f64).transpose(-1, -2)).masked_fill(~sel, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.to(f64)


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
    return [
        c("B = 2, H = 3, T = 9, D = 5, Dv = 4, top_k = 3", randn(2, 3, 9, 5), randn(2, 3, 9, 5),
          randn(2, 3, 9, 4), randn(2, 1, 9, 9), 3,
          hint="choose by the index scores I among the visible keys s <= t only (row t keeps min(k, t + 1) "
               "visible keys), then softmax over the selected keys alone"),
        c("top_k = T = 7: dense causal attention", q1, k1, v1, randn(1, 1, 7, 7), 7,
          expected=dense(q1, k1, v1),
          hint="with top_k >= the keys a query sees, every visible key is kept: causal softmax attention"),
        c("top_k = 1: each query returns one value", randn(1, 2, 6, 3), randn(1, 2, 6, 3), randn(1, 2, 6, 2),
          randn(1, 1, 6, 6), 1),
        c("T = 1", randn(1, 1, 1, 4), randn(1, 1, 1, 4), randn(1, 1, 1, 3), randn(1, 1, 1, 1), 2),
        c("tied index scores (all 0), top_k = 3", randn(1, 1, 8, 4), randn(1, 1, 8, 4), randn(1, 1, 8, 2),
          torch.zeros(1, 1, 8, 8, dtype=f64), 3,
          hint="ties go to the earlier key: rank with a stable sort (torch.topk does not promise which tie)"),
        c("a needle the indexer ranks last: it must not be read", qn, kn, randn(1, 1, 8, 3), In, 2,
          hint="the keys come from the index scores I, not from the attention logits q . k"),
        c("logits of 1e4 in float16, top_k = 4", big_q, big_q.flip(-2).contiguous(),
          randn(1, 2, 6, 3, dtype=torch.float16), randn(1, 1, 6, 6), 4,
          hint="compute in float32 and subtract the largest selected logit before exp"),
        c("inf in the k and v of a key never selected", randn(1, 2, 9, 4), kinf, vinf, Iinf, 3,
          hint="an unselected key must not touch the output: gather the selected keys and values (a masked "
               "dense product gives 0 * inf = NaN)"),
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
        "causal attention and it holds for $T=1$, tied scores, a needle the indexer ranks last, float16 "
        "logits of $10^4$, and an infinite key that no query selects."),
    solution=topk_attention,
    imports="import math\n\nimport torch",
    cases=_topk_cases,
    wrong=(Wrong(_topk_not_renormalised, "renormalise"), Wrong(_topk_no_causal, "future"),
           Wrong(_topk_counts_masked, "visible keys")),
    diagnose=((matches(_topk_not_renormalised), "your rows sum to p(S) < 1: renormalise the softmax over the "
                                                "selected keys (softmax of the selected logits alone)"),
              (matches(_topk_no_causal), "your selection takes future keys (s > t): apply the causal mask "
                                         "before choosing the top k"),
              (matches(_topk_counts_masked), "you chose the top k among all keys and then dropped the "
                                             "future ones: choose among the visible keys, so a row keeps "
                                             "min(k, t+1) visible keys"),
              (matches(_topk_unscaled), "the logits are q . k / sqrt(D): scale by 1 / sqrt(D), the key "
                                        "dimension")),
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


def _l1_no_max(scores, selected):
    e = torch.exp(scores)
    return 2 * (1 - (e * selected).sum(-1) / e.sum(-1))


def _l1_definition(scores, selected):
    """The distance from its definition, on the library's restriction (the checker's answer)."""
    from ..experiments.topk import restrict
    p = torch.softmax(scores.to(f64), dim=-1)
    return (p - restrict(p, selected)).abs().sum(-1)


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
    cold = (1000.0 + randn(4, 9)).to(torch.float32)
    return [
        c("4 rows of 9 scores, 3 keys selected per row", randn(4, 9), random_selection((4, 9), 3),
          hint="||p - p~||_1 = 2 (1 - p(S)): the mass leaving the complement plus the same mass added on S"),
        c("causal rows (-inf above the diagonal), top-3 selection", causal, causal_sel,
          hint="a masked key (-inf) has p = 0: it is in neither p(S) nor its complement"),
        Case("every key selected: nothing lost", (randn(3, 5), torch.ones(3, 5, dtype=torch.bool)),
             torch.zeros(3, dtype=f64), hint="with S every key, p(S) = 1 and p~ = p"),
        c("a needle of logit 30 outside the selection: about 2", needle, needle_sel),
        c("tied scores, 2 of 6 kept: 2 (1 - 2/6)", torch.full((2, 6), 1.5, dtype=f64),
          random_selection((2, 6), 2)),
        c("logits of 1000 + N(0, 1) in float32", cold, random_selection((4, 9), 4),
          hint="exp(1000) overflows, even in float64: subtract each row's largest score first (p is "
               "unchanged)"),
    ]


TOPK_L1 = Exercise(
    name="top-k error",
    chapter="7",
    title="What a selection costs a softmax row",
    statement=(
        "Restricting a softmax row $p$ to a support $\\mathcal S$ and renormalising gives "
        "$\\tilde p=p\\,\\mathbb 1_{\\mathcal S}/p(\\mathcal S)$, the one-sided entropic plan with infinite "
        "cost off $\\mathcal S$. Compute $\\|p-\\tilde p\\|_1$ per row from the recall $p(\\mathcal S)$ "
        "alone, by the chapter's identity; the checker compares it with the distance computed from its "
        "definition, on causal rows, a full selection, a missed needle, ties and logits of $10^3$."),
    solution=topk_l1_error,
    cases=_l1_cases,
    wrong=(Wrong(_l1_half, "plus the same mass"), Wrong(_l1_no_max, "overflow")),
    diagnose=((matches(_l1_half), "your answer is half the L1 distance: the mass 1 - p(S) leaves the "
                                  "complement, plus the same mass added on S"),),
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


def _flops_cases(gen):
    from ..experiments.landscape import HeadConfig, prefill_flops

    def c(label, T, heads, d_head, index_heads, index_dim, top_k, hint=""):
        cfg = HeadConfig(heads=heads, d_head=d_head, index_heads=index_heads, index_dim=index_dim,
                         top_k=top_k)
        return Case(label, (T, heads, d_head, index_heads, index_dim, top_k),
                    prefill_flops("topk", T, cfg).matmul, hint=hint)

    # every size different, so that a formula that swaps two of them fails
    T = int(torch.randint(40, 90, (1,), generator=gen))
    k = int(torch.randint(5, 20, (1,), generator=gen))
    return [
        c(f"T = {T}, 3 heads of 5, 7 index heads of 11, top_k = {k}", T, 3, 5, 7, 11, k,
          hint="per pair: 2 H_I d_I for the indexer, 2 H (D + Dv) for a score and a weighted value"),
        c("T = 4096, 16 heads of 128, 4 index heads of 64, top_k = 2048", 4096, 16, 128, 4, 64, 2048,
          hint="query t reads min(k, t) keys, and the indexer scores all t visible keys"),
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
           Wrong(_flops_always_k, "min(k, t)")),
    diagnose=((matches(_flops_macs), "that is half the answer: a multiply-add counts as 2 FLOPs (a dot "
                                     "product of length d costs 2d)"),
              (matches(_flops_every_key), "every query read all T keys: under the causal mask query t sees "
                                          "only its t visible keys (the indexer's term averages to (T+1)/2)"),
              (matches(_flops_always_k), "a query at position t < k has only t keys to read: min(k, t), "
                                         "not k")),
)


EXERCISES = (INDEX_SCORES, TOPK_ATTENTION, TOPK_L1, TOPK_FLOPS)
