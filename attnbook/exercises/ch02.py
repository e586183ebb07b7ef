"""Chapter 2's exercises: the needle planted where a probe map does not look, block-sparse attention
from its mask, the indexer's blind spot, the error of random key sampling in closed form, and
sliding-window attention from its band."""

from __future__ import annotations

import math

import torch

from attnlib.attention import softmax_attention_reference
from attnlib.sparse import block_sparse_attention_reference
from attnlib.window import sliding_window_attention_reference

from ._checker import TOLERANCE, Case, Exercise, Freedom, Wrong, agree, compare, matches

f64 = torch.float64



# --- 1. the needle ----------------------------------------------------------------------------------

def needle_adversary(seen, d, M):
    """Defeat an algorithm that computes only the scores ``seen [T, T]`` marks
    (bool; True only for ``j <= i``, always on the diagonal) and returns the
    softmax over them. Return ``(q, k, i)``: ``q, k [T, d]`` and a row ``i`` on
    which exact causal attention and the algorithm's are >= 1.9 apart in L1,
    every score ``q_i . k_j / sqrt(d)`` of row ``i`` in ``[-M, M]`` (to a
    relative 1e-6: float32 or float64)."""
    T = seen.shape[0]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    # pairs (i, j <= i) whose score is never computed
    unseen = causal & ~seen
    # the first row with such a pair, and its first unseen key
    i = int(unseen.any(dim=1).nonzero()[0])
    j = int(unseen[i].nonzero()[0])
    # Everything else zero: every other score of row i is 0 and the needle's is
    # exactly M, so the needle holds pi(M) > 1 / (1 + e^-4) of the exact row and
    # none of the algorithm's: an error >= 2 pi(M) > 1.96.
    # scores are divided by sqrt(d): a * a / sqrt(d) = M
    a = math.sqrt(M * math.sqrt(d))
    q = torch.zeros(T, d, dtype=torch.float64)
    k = torch.zeros(T, d, dtype=torch.float64)
    q[i, 0] = a
    k[j, 0] = a
    return q, k, i


def _adversary_future(seen, d, M):
    T = seen.shape[0]
    i, j = (int(x) for x in (~seen).nonzero()[0])    # the first unseen pair: above the diagonal
    a = math.sqrt(M * math.sqrt(d))
    q, k = torch.zeros(T, d, dtype=f64), torch.zeros(T, d, dtype=f64)
    q[i, 0], k[j, 0] = a, a
    return q, k, i


def _adversary_unscaled(seen, d, M):
    T = seen.shape[0]
    unseen = torch.ones(T, T, dtype=torch.bool).tril() & ~seen
    i = int(unseen.any(dim=1).nonzero()[-1])
    j = int(unseen[i].nonzero()[0])
    q, k = torch.zeros(T, d, dtype=f64), torch.zeros(T, d, dtype=f64)
    q[i, 0], k[j, 0] = math.sqrt(M), math.sqrt(M)    # forgets the 1 / sqrt(d)
    return q, k, i


def _adversary_polarity(seen, d, M):
    T = seen.shape[0]
    unseen = torch.ones(T, T, dtype=torch.bool).tril() & ~seen
    i = int(unseen.any(dim=1).nonzero()[-1])
    j = int(seen[i].nonzero()[0])                    # True read as "masked": a key the algorithm sees
    a = math.sqrt(M * math.sqrt(d))
    q, k = torch.zeros(T, d, dtype=f64), torch.zeros(T, d, dtype=f64)
    q[i, 0], k[j, 0] = a, a
    return q, k, i


def _plant(T, d, M, i, j):
    a = math.sqrt(M * math.sqrt(d))
    q, k = torch.zeros(T, d, dtype=f64), torch.zeros(T, d, dtype=f64)
    q[i, 0], k[j, 0] = a, a
    return q, k, i


def _adversary_last_row(seen, d, M):
    T = seen.shape[0]
    i = T - 1                                        # the last query, the longest past: but is a key missed?
    unseen = ~seen[i]
    j = int(unseen.nonzero()[0]) if unseen.any() else 0
    return _plant(T, d, M, i, j)


def _adversary_oldest_key(seen, d, M):
    T = seen.shape[0]
    return _plant(T, d, M, T - 1, 0)                 # the needle in the oldest key, "far outside the window"


def _adversary_skips_key_0(seen, d, M):
    T = seen.shape[0]
    unseen = (torch.ones(T, T, dtype=torch.bool).tril() & ~seen)
    unseen[:, 0] = False                             # key 0 taken for a sink, never missed
    i = int(unseen.any(dim=1).nonzero()[0])
    return _plant(T, d, M, i, int(unseen[i].nonzero()[0]))


def _needle_judge(seen, d, M):
    T = seen.shape[0]

    def judge(got):
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            return "return a tuple (q, k, i)"
        q, k, i = got
        if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)):
            return "q and k must be tensors"
        if tuple(q.shape) != (T, d) or tuple(k.shape) != (T, d):
            return f"q and k must have shape ({T}, {d}); got {tuple(q.shape)} and {tuple(k.shape)}"
        try:
            i = int(i)
        except (TypeError, ValueError):
            return f"i must be an int (the attacked row); got {type(i).__name__}"
        if not 0 <= i < T:
            return f"row i = {i} is outside [0, {T})"
        q, k = q.detach().to(f64), k.detach().to(f64)
        if not (torch.isfinite(q).all() and torch.isfinite(k).all()):
            return "q and k must be finite"
        s_all = (q[i] @ k.T) / math.sqrt(d)                     # row i's scores, future keys included
        s = s_all[: i + 1]
        worst = float(s.abs().max())
        if worst > M * (1 + 1e-6) + 1e-9:
            return f"row {i} has a score of magnitude {worst:.4g} > M = {M:.4g}: the budget is |score| <= M"
        v = torch.eye(T, dtype=f64)[None, None]
        exact = softmax_attention_reference(q[None, None], k[None, None], v, scale=d ** -0.5,
                                            causal=True)[0][0, 0, i]
        algo = block_sparse_attention_reference(q[None, None], k[None, None], v, seen[None], block_size=1,
                                                scale=d ** -0.5, causal=True)[0][0, 0, i]
        err = float((exact - algo).abs().sum())
        if err >= 1.9:
            return None
        j = int(s_all.argmax())
        head = f"on row {i} exact and the algorithm are only {err:.3f} apart in L1 (need >= 1.9): "
        if j > i:
            return head + (f"your largest score is at key {j} > i, in the future: causal attention never "
                           "sees it, exact or not; plant the needle at a key j <= i that seen[i] misses")
        if bool(seen[i, j]):
            return head + (f"the algorithm computes the score of ({i}, {j}) (seen[{i}, {j}] is True), so "
                           "it finds your needle: plant it where seen is False")
        if float(s_all[j]) < M - 1e-6:
            return head + (f"the needle's score is only {float(s_all[j]):.3g} < M = {M:.3g} and its weight "
                           f"{float(exact[j]):.2f}: the score is q_i . k_j / sqrt(d)")
        weight = float(exact[j])
        return head + (f"the needle's weight is only {weight:.2f}: keep every other score of row i at 0 "
                       "so that the needle dominates")

    return judge


def _needle_cases(gen):
    def case(label, seen, d, hint=""):
        T = seen.shape[0]
        M = math.log(T) + 4.0
        return Case(label, (seen, d, M), judge=_needle_judge(seen, d, M), hint=hint)

    def causal(T):
        return torch.ones(T, T, dtype=torch.bool).tril()

    def window(T, w, sinks):                          # j > i - w (w recent keys, itself included) or a sink
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return causal(T) & ((i - j < w) | (j < sinks))

    def strided(T, l):
        diff = torch.arange(T)[:, None] - torch.arange(T)[None, :]
        return causal(T) & ((diff < l) | (diff % l == 0))

    def sampled(T, s):
        pick = torch.rand(T, T, generator=gen).masked_fill(~causal(T), 2.0).argsort(dim=1)[:, :s]
        keep = torch.zeros(T, T, dtype=torch.bool).scatter_(1, pick, True) & causal(T)
        return keep | torch.eye(T, dtype=torch.bool)

    # the one missed pair: in a row before the last, at a key after 0
    T = 24
    i0 = int(torch.randint(2, T - 1, (1,), generator=gen))
    j0 = int(torch.randint(1, i0, (1,), generator=gen))
    one_hole = causal(T)
    one_hole[i0, j0] = False
    return [
        case("sliding window of 8 with 4 sinks, T = 48, d = 8", window(48, 8, 4), 8,
             hint="every query sees the 4 sinks (keys 0..3) and its 8 latest keys: plant the needle at a key "
                  "j <= i the window has left behind, after the sinks"),
        case("strided pattern (stride 6), T = 40, d = 4", strided(40, 6), 4),
        case("6 random earlier keys per query, T = 32, d = 16", sampled(32, 6), 16),
        case("every pair seen but one, T = 24, d = 3", one_hole, 3,
             hint="the map misses one pair, in a row before the last: search every row (i, j <= i) for it"),
        case("T = 2, each query sees only itself, d = 1", torch.eye(2, dtype=torch.bool), 1,
             hint="with T = 2 the one pair the map misses is (1, 0): the needle goes in key 0"),
        case("sliding window of 4, no sinks, T = 17, d = 1", window(17, 4, 0), 1),
    ]


def _unseen_pairs(seen) -> torch.Tensor:
    T = seen.shape[0]
    return torch.ones(T, T, dtype=torch.bool).tril() & ~seen


NEEDLE = Exercise(
    name="needle adversary",
    chapter="2",
    title="Plant the needle",
    statement=(
        "An algorithm computes only the causal scores its probe map `seen` marks and returns the softmax "
        "over them. Build the input that defeats it: $q, k$ and a row $i$ on which exact causal "
        "attention and the algorithm's, with one-hot values, are at least 1.9 apart in $\\ell_1$ (the "
        "largest possible is 2), with every score $q_i\\cdot k_j/\\sqrt d$ of row $i$ in $[-M,M]$, "
        "$M=\\log T+4$. The maps are a sliding window with sinks, a strided pattern, random samples, a "
        "map that misses a single pair (in some row before the last), and $T=2$; $d$ runs from 1 to 16."),
    solution=needle_adversary,
    imports="import math\n\nimport torch",
    cases=_needle_cases,
    wrong=(Wrong(_adversary_future, "in the future"), Wrong(_adversary_unscaled, "sqrt(d)"),
           Wrong(_adversary_polarity, "finds your needle"), Wrong(_adversary_last_row, "search every row"),
           Wrong(_adversary_oldest_key, "finds your needle"), Wrong(_adversary_skips_key_0, "goes in key 0")),
    freedoms=(
        Freedom("d > 1 (the score divides by sqrt(d))", lambda c: c.args[1] > 1),
        Freedom("d = 1", lambda c: c.args[1] == 1),
        Freedom("T = 2", lambda c: c.args[0].shape[0] == 2),
        Freedom("sinks: key 0 seen by every query", lambda c: bool(c.args[0][:, 0].all())
                and bool(_unseen_pairs(c.args[0]).any())),
        Freedom("the only missed pairs in a row before the last",
                lambda c: bool(_unseen_pairs(c.args[0]).any()) and not bool(_unseen_pairs(c.args[0])[-1].any())),
        Freedom("the only missed key is key 0", lambda c: bool(_unseen_pairs(c.args[0]).any())
                and not bool(_unseen_pairs(c.args[0])[:, 1:].any())),
    ),
)


# --- 2. block-sparse attention ----------------------------------------------------------------------

def sparse_attention(q, k, v, block_mask, block_size, causal):
    """Softmax attention over visited blocks: ``q, k [B, H, T, D]``,
    ``v [B, H, T, Dv]``, ``block_mask [H, nb, nb]`` bool
    (``nb = ceil(T / block_size)``; query block I visits key block J), scale
    ``1 / sqrt(D)``; ``causal`` also keeps ``j <= i``. Return
    ``(o [B, H, T, Dv], lse [B, H, T])``; a row that visits no key gets
    ``o = 0``, ``lse = -inf``. Compute in float32 or wider."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    T = q.shape[-2]
    # Each block entry covers block_size x block_size positions; the tail
    # block is cut at T.
    keep = (block_mask.repeat_interleave(block_size, dim=-2)
            .repeat_interleave(block_size, dim=-1))
    keep = keep[:, :T, :T]
    if causal:
        keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    # a selection: NaN outside S_i is dropped too
    s = s.masked_fill(~keep, float("-inf"))
    # -inf for a row with no visited key
    lse = torch.logsumexp(s, dim=-1)
    # empty rows: all 0
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
    # Select rather than multiply by 0: 0 * inf is NaN, and an unvisited v
    # may hold anything.
    pv = torch.where(keep[..., None],
                     p[..., None] * v.to(acc)[..., None, :, :], 0.0)
    return pv.sum(dim=-2), lse


def _sparse_softmax_then_mask(q, k, v, block_mask, block_size, causal):
    T = q.shape[-2]
    keep = block_mask.repeat_interleave(block_size, -2).repeat_interleave(block_size, -1)[:, :T, :T]
    s = (q.to(f64) @ k.to(f64).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1) * keep                       # normalised over every key, then masked
    return p @ v.to(f64), lse


def _sparse_empty_nan(q, k, v, block_mask, block_size, causal):
    T = q.shape[-2]
    keep = block_mask.repeat_interleave(block_size, -2).repeat_interleave(block_size, -1)[:, :T, :T]
    if causal:
        keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
    s = (q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v.to(torch.float32), torch.logsumexp(s, -1)


def _tiled(block_mask, block_size, T):
    nb = block_mask.shape[-1]
    return block_mask.repeat(1, block_size, block_size)[:, :T, :T] if nb else block_mask


def _sparse_tiled(q, k, v, block_mask, block_size, causal):
    T = q.shape[-2]
    keep = _tiled(block_mask, block_size, T)              # tiles the mask instead of expanding each block
    if causal:
        keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
    s = (q.to(f64) @ k.to(f64).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
    return p @ v.to(f64), lse


def _sparse_times_zero(q, k, v, block_mask, block_size, causal):
    T = q.shape[-2]
    keep = (block_mask.repeat_interleave(block_size, -2)
            .repeat_interleave(block_size, -1)[:, :T, :T])
    if causal:
        keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
    s = ((q.to(torch.float32) @ k.to(torch.float32).transpose(-1, -2))
         / math.sqrt(q.shape[-1]))
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
    # p = 0 outside S_i, but 0 * inf = NaN
    return p @ v.to(torch.float32), lse


def _sparse_variant(q, k, v, block_mask, block_size, causal, *, acc=f64, heads="each", causal_mode="flag",
                    mask=float("-inf"), shift="lse", cut=True):
    """The definition with one thing changed: the dtype computed in (None: the inputs'), one head's
    mask for all (``heads="first"``), how ``causal`` is applied (by position, by block, never or always),
    the value that hides an unvisited key (a finite one: empty rows set apart), what is subtracted before
    exp (each row's lse, or the whole tensor's max), and whether the expanded mask is cut at T."""
    acc = acc or q.dtype
    T, bs = q.shape[-2], block_size
    bm = block_mask[:1].expand_as(block_mask) if heads == "first" else block_mask
    if causal_mode == "blocks" and causal:
        bm = bm & torch.ones(bm.shape[-1], bm.shape[-1], dtype=torch.bool).tril()
    keep = bm.repeat_interleave(bs, dim=-2).repeat_interleave(bs, dim=-1)
    if cut:
        keep = keep[:, :T, :T]
    if (causal and causal_mode == "flag") or causal_mode == "always":
        keep = keep & torch.ones(T, T, dtype=torch.bool).tril()
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, mask)
    empty = ~keep.any(-1)
    if shift == "tensor":
        m = s[torch.isfinite(s)].max()
        p = torch.exp(s - m).masked_fill(~keep, 0.0)
        lse = m + torch.log(p.sum(-1))
        p = p / p.sum(-1, keepdim=True)
    else:
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - torch.where(torch.isinf(lse), 0.0, lse).unsqueeze(-1))
        if mask != float("-inf"):                     # a finite constant: empty rows set apart
            lse = lse.masked_fill(empty, float("-inf"))
            p = p.masked_fill(empty[..., None], 0.0)
    o = torch.where(keep[..., None], p[..., None] * v.to(acc)[..., None, :, :], 0.0).sum(-2)
    return o, lse


def _sparse_head_0(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, heads="first")


def _sparse_block_causal(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, causal_mode="blocks")


def _sparse_never_causal(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, causal_mode="never")


def _sparse_always_causal(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, causal_mode="always")


def _sparse_minus_1e4(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, acc=torch.float32, mask=-1e4)


def _sparse_in_half(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, acc=None)


def _sparse_tensor_max(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, shift="tensor")


def _sparse_uncut(q, k, v, block_mask, block_size, causal):
    return _sparse_variant(q, k, v, block_mask, block_size, causal, cut=False)


def _sparse_keep(block_mask, block_size, T, causal) -> torch.Tensor:
    keep = block_mask.repeat_interleave(block_size, -2).repeat_interleave(block_size, -1)[:, :T, :T]
    return keep & torch.ones(T, T, dtype=torch.bool).tril() if causal else keep


def _sparse_scores(c) -> torch.Tensor:
    """The visited scores of a case, in float64; -inf elsewhere."""
    q, k, _, bm, bs, causal = c.args
    keep = _sparse_keep(bm, bs, q.shape[-2], causal)
    s = (q.to(f64) @ k.to(f64).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s.masked_fill(~keep, float("-inf"))


def _sparse_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    def rmask(H, nb, density=0.4, diagonal=True):
        m = torch.rand(H, nb, nb, generator=gen) < density
        return m | torch.eye(nb, dtype=torch.bool) if diagonal else m

    def c(label, q, k, v, bm, bs, causal, hint=""):
        # in float64 from the same inputs: the answer, not the reference's own float16 rounding
        o, lse = block_sparse_attention_reference(q.to(f64), k.to(f64), v.to(f64), bm, block_size=bs,
                                                  scale=q.shape[-1] ** -0.5, causal=causal)
        return Case(label, (q, k, v, bm, bs, causal), (o, lse), hint=hint)

    # A query block with no visited key block (row 2 of head 0), non-causal.
    empty = rmask(2, 5)
    empty[0, 2] = False
    # Causal: query block 0 visits only key block 1, which lies in its future -- nothing is left.
    future = rmask(1, 4, diagonal=True)
    future[0, 0] = torch.tensor([False, True, False, False])
    # A window |i - j| < 5 (both sides) with 2 sinks, at block size 1 (a position-level mask).
    T = 19
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    win = (((i - j).abs() < 5) | (j < 2))[None]
    # inf in a key block that no query block visits (inf, not NaN, so that equal inputs compare equal).
    poison = rmask(2, 4)
    poison[:, :, 3] = False
    kp, vp = randn(1, 2, 30, 8), randn(1, 2, 30, 4)
    kp[..., 24:, :] = float("inf")
    vp[..., 24:, :] = float("inf")
    big = randn(1, 2, 24, 16)
    big = (big / big.norm(dim=-1, keepdim=True) * 100.0 * 16 ** 0.25).to(torch.float16)
    # scores near 400 within about 10 of each other: q and k along one axis, plus noise
    axis = torch.zeros(8, dtype=f64)
    axis[0] = (400 * 8 ** 0.5) ** 0.5
    mq, mk = (axis + 0.15 * randn(1, 2, 16, 8)).half(), (axis + 0.15 * randn(1, 2, 16, 8)).half()
    # every visited score near -1e4 (q_0 = -141.5, k_0 = 141.5, D = 4: -10011 plus the noise's products)
    lq, lk = 2 * randn(1, 2, 16, 4), 2 * randn(1, 2, 16, 4)
    lq[..., 0], lk[..., 0] = -141.5, 141.5
    return [
        c("random blocks of 8 (diagonal kept), T = 32, H = 2", randn(1, 2, 32, 8), randn(1, 2, 32, 8),
          randn(1, 2, 32, 4), rmask(2, 4), 8, False),
        c("causal, T = 37 with blocks of 8 (a short tail)", randn(2, 1, 37, 5), randn(2, 1, 37, 5),
          randn(2, 1, 37, 3), rmask(1, 5), 8, True,
          hint="T = 37 is not a multiple of 8: the last block holds 5 positions; expand each block over "
               "its positions and cut the mask at T"),
        c("a query block that visits no key block", randn(1, 2, 20, 4), randn(1, 2, 20, 4),
          randn(1, 2, 20, 6), empty, 4, False,
          hint="a row that visits no key is empty: o = 0 and lse = -inf (the log of an empty sum), "
               "not NaN"),
        c("causal, query block 0 visits only a future block", randn(1, 1, 16, 4), randn(1, 1, 16, 4),
          randn(1, 1, 16, 2), future, 4, True,
          hint="after the causal mask block 0 sees nothing: its rows are empty, o = 0 and lse = -inf"),
        c("block size 1: |i - j| < 5 or j < 2, T = 19", randn(1, 1, 19, 3), randn(1, 1, 19, 3),
          randn(1, 1, 19, 3), win, 1, False),
        c("inf in the keys and values of a block nobody visits", randn(1, 2, 30, 8), kp, vp, poison, 8,
          True,
          hint="a key outside S_i must contribute nothing, even inf: 0 * inf is NaN, so select "
               "(torch.where) instead of multiplying by a zero weight"),
        c("float16 scores near 400, within about 10 of each other", mq, mk,
          randn(1, 2, 16, 3, dtype=torch.float16), rmask(2, 4), 4, True,
          hint="float16 scores near 400: exp(400) overflows unless each row's max (or lse) is subtracted, "
               "and a float16 score is rounded to 0.25 (up to 13% of its weight): compute in float32"),
        c("float16, every visited score near -1e4", lq.half(), lk.half(), randn(1, 2, 16, 3, dtype=torch.float16),
          rmask(2, 4), 4, True,
          hint="the visited scores sit near -1e4, where a finite mask constant such as -1e4 gives the "
               "unvisited keys as much weight as the visited: hide them with -inf"),
        c("logits of 1e4 in float16", big, big.flip(-2).contiguous(), randn(1, 2, 24, 4, dtype=torch.float16),
          rmask(2, 3), 8, True,
          hint="logits of +/-1e4: exp overflows, and one max for the whole tensor underflows the rows far "
               "below it; compute in float32 and subtract each row's lse (or max)"),
    ]


def _row_max_spread(c) -> float:
    m = _sparse_scores(c).amax(-1)
    m = m[torch.isfinite(m)]
    return float(m.max() - m.min()) if m.numel() else 0.0


def _visited_near(c, level, width) -> bool:
    """Some head whose every visited score lies within ``width`` of ``level``."""
    s = _sparse_scores(c)
    near = ((s - level).abs() < width) | torch.isinf(s)
    return bool(near.flatten(-2).all(-1).any()) and bool(torch.isfinite(s).any())


SPARSE = Exercise(
    name="block-sparse attention",
    chapter="2",
    title="Block-sparse attention from its mask",
    statement=(
        "A block-sparse attention is a probe map a GPU likes: query block $I$ visits key block $J$ when "
        "`block_mask[h, I, J]` (each head its own mask), and row $i$ is the exact softmax over the keys "
        "$S_i$ it visits, $o_i=\\sum_{j\\in S_i}e^{s_{ij}-\\ell_i}v_j$ with "
        "$\\ell_i=\\log\\sum_{j\\in S_i}e^{s_{ij}}$ ($j\\le i$ too when `causal`). Return $o$ and $\\ell$ "
        "for lengths that are not a multiple of the block, rows that visit nothing ($o_i=0$, "
        "$\\ell_i=-\\infty$), blocks of one position, inf in a block nobody visits, and float16 scores "
        "of a few hundred, near $-10^4$ and of $\\pm10^4$ (computed in float32, the float16 answers are "
        "checked to $5\\cdot10^{-3}$)."),
    solution=sparse_attention,
    imports="import math\n\nimport torch",
    cases=_sparse_cases,
    wrong=(Wrong(_sparse_softmax_then_mask, "visited keys only"), Wrong(_sparse_tiled, "repeat_interleave"),
           Wrong(_sparse_empty_nan, "empty"), Wrong(_sparse_times_zero, "select"),
           Wrong(_sparse_head_0, "its own block mask"), Wrong(_sparse_block_causal, "inside a diagonal block"),
           Wrong(_sparse_never_causal, "causal=true"), Wrong(_sparse_always_causal, "causal=false"),
           Wrong(_sparse_minus_1e4, "with -inf"), Wrong(_sparse_in_half, "compute in float32"),
           Wrong(_sparse_tensor_max, "one max for the whole tensor"), Wrong(_sparse_uncut, "cut the mask at t")),
    diagnose=((matches(_sparse_tiled, 1e-4), "your position mask tiles the block mask (repeat) instead of "
                                           "expanding each block over its positions (repeat_interleave)"),
              (matches(_sparse_softmax_then_mask, 1e-4), "your rows were normalised over every key and then "
                                                       "masked: normalise over the visited keys only"),
              (matches(_sparse_head_0, 1e-4), "every head reads head 0's mask: head h visits the blocks of "
                                              "its own block mask, block_mask[h]"),
              (matches(_sparse_block_causal, 1e-4), "causal keeps j <= i position by position, inside a "
                                                    "diagonal block too, not whole blocks J <= I"),
              (matches(_sparse_never_causal, 1e-4), "with causal=True row i also drops the keys j > i of the "
                                                    "blocks it visits"),
              (matches(_sparse_always_causal, 1e-4), "with causal=False row i keeps every key of the blocks it "
                                                     "visits, future ones too")),
    freedoms=(
        Freedom("B > 1", lambda c: c.args[0].shape[0] > 1),
        Freedom("H > 1, each head its own mask", lambda c: c.args[3].shape[0] > 1
                and not bool((c.args[3] == c.args[3][:1]).all())),
        Freedom("D != Dv", lambda c: c.args[0].shape[-1] != c.args[2].shape[-1]),
        Freedom("T not a multiple of the block size", lambda c: c.args[0].shape[-2] % c.args[4] != 0),
        Freedom("block size 1", lambda c: c.args[4] == 1),
        Freedom("causal=False", lambda c: not c.args[5]),
        Freedom("causal=True", lambda c: bool(c.args[5])),
        Freedom("rows that visit no key", lambda c: bool(torch.isneginf(_sparse_scores(c)).all(-1).any())),
        Freedom("inf in a block nobody visits", lambda c: bool(torch.isinf(c.args[1]).any())),
        Freedom("float16 scores of a few hundred", lambda c: c.args[0].dtype == torch.float16
                and _visited_near(c, 400.0, 100.0)),
        Freedom("visited scores near -1e4, a finite mask constant", lambda c: _visited_near(c, -1e4, 50.0)),
        Freedom("float16 scores of 1e4 in rows thousands apart (a per-row max needed)",
                lambda c: c.args[0].dtype == torch.float16 and _row_max_spread(c) > 1000),
    ),
)


# --- 3. the indexer's blind spot --------------------------------------------------------------------

def blind_pair(P, gamma):
    """A needle an indexer cannot see: ``P [H, D, r]`` float64, one projection
    per indexer head (index score ``sum_h relu((u P_h) . (w P_h))``),
    ``0 < gamma < 1``. Return unit ``(u, w)``, each ``[D]``, with
    ``u . w >= gamma`` and each head's ``(u P_h) . (w P_h) < 0``, by a margin
    rounding cannot cross: below ``-1e-14 * ||P_h||_F^2``.
    """
    H, D, r = P.shape
    # every head's columns, side by side
    cols = P.permute(1, 0, 2).reshape(D, H * r)
    U, S, _ = torch.linalg.svd(cols, full_matrices=True)
    # the span's dimension, not H * r
    rank = int((S > S.max() * 1e-10).sum()) if S.numel() else 0
    if rank >= D:
        raise ValueError("the heads' columns span R^D: no blind spot")
    # orthogonal to every column: no head sees it
    n = U[:, rank]
    # A generic vector of the span: every head with a non-zero projection
    # sees it.
    g = torch.Generator().manual_seed(0)
    t = U[:, :rank] @ torch.randn(rank, generator=g, dtype=P.dtype)
    t = t / t.norm()
    # u = n + a t, w = n - a t: u . w = (1 - a^2) / (1 + a^2)
    # and (u P_h) . (w P_h) = -a^2 |t P_h|^2.
    # half the largest a: u . w above gamma
    a = math.sqrt((1 - gamma) / (1 + gamma)) / 2
    u, w = n + a * t, n - a * t
    return u / u.norm(), w / w.norm()


def _blind_first_head(P, gamma):
    U, _, _ = torch.linalg.svd(P[0], full_matrices=True)   # only head 0's columns
    r = P.shape[2]
    n, t = U[:, r], U[:, 0]
    a = math.sqrt((1 - gamma) / (1 + gamma)) / 2
    u, w = n + a * t, n - a * t
    return u / u.norm(), w / w.norm()


def _span_and_null(P):
    """The heads' joint column basis ``U`` (as the wrong answers below read it) and its rank ``k``:
    ``U[:, :k]`` spans every head's directions, ``U[:, k]`` is outside all of them."""
    H, D, r = P.shape
    U, S, _ = torch.linalg.svd(P.permute(1, 0, 2).reshape(D, H * r), full_matrices=True)
    return U, int((S > S.max() * 1e-10).sum())


def _opened(n, t, a):
    """``u, w = n +/- a t``, normalised: ``u . w = (1 - a^2) / (1 + a^2)``."""
    u, w = n + a * t, n - a * t
    return u / u.norm(), w / w.norm()


def _blind_equal(P, gamma):
    U, k = _span_and_null(P)
    n = U[:, k]
    return n, n.clone()                                   # u = w in the null space: score 0, not < 0


def _blind_count(P, gamma):
    H, D, r = P.shape
    if H * r >= D:
        raise ValueError(f"no null space: r * H = {H * r} >= D = {D}")
    U, _, _ = torch.linalg.svd(P.permute(1, 0, 2).reshape(D, H * r), full_matrices=True)
    n, t = U[:, H * r], U[:, 0]
    a = math.sqrt((1 - gamma) / (1 + gamma)) / 2
    u, w = n + a * t, n - a * t
    return u / u.norm(), w / w.norm()


def _blind_fixed_alpha(P, gamma):
    U, k = _span_and_null(P)
    t = U[:, :k].sum(dim=1)
    return _opened(U[:, k], t / t.norm(), 0.5)            # u . w = 0.6, whatever gamma asks


# A head's score must be below -MARGIN ||P_h||_F^2: rounding the products (u P_h) . (w P_h) in float64 moves
# them by about 1e-16 ||P_h||_F^2, and an answer u, w = n +/- a t stays clear of it for any step a >= 1e-6.
MARGIN = 1e-14


def _blind_top_direction(P, gamma):
    U, k = _span_and_null(P)                               # t: the span's top direction, the largest head's
    return _opened(U[:, k], U[:, 0], math.sqrt((1 - gamma) / (1 + gamma)) / 2)


def _blind_small_fixed_alpha(P, gamma):
    U, k = _span_and_null(P)
    t = U[:, :k].sum(dim=1)
    return _opened(U[:, k], t / t.norm(), 0.01)           # u . w = 0.9998: enough for 0.99, not 1 - 1e-6


def _blind_judge(P, gamma):
    H, D, r = P.shape

    def judge(got):
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            return "return a tuple (u, w)"
        u, w = got
        if not (isinstance(u, torch.Tensor) and isinstance(w, torch.Tensor)):
            return "u and w must be tensors"
        if tuple(u.shape) != (D,) or tuple(w.shape) != (D,):
            return f"u and w must have shape ({D},); got {tuple(u.shape)} and {tuple(w.shape)}"
        u, w = u.detach().to(f64), w.detach().to(f64)
        if not (torch.isfinite(u).all() and torch.isfinite(w).all()):
            return "u and w must be finite"
        for name, x in (("u", u), ("w", w)):
            if abs(float(x.norm()) - 1) > 1e-6:
                return f"{name} has norm {float(x.norm()):.6g}; both must be unit vectors"
        cos = float(u @ w)
        if cos < gamma - 1e-12:
            return (f"u . w = {cos:.6g} is below gamma = {gamma:.6g}: the needle's true score must stay "
                    "large; bring u and w closer (a smaller step along the projections' span)")
        scores = torch.einsum("d,hdr,e,her->h", u, P, w, P)
        for h in range(H):
            norm2 = float(P[h].pow(2).sum())
            sh = float(scores[h])
            if abs(sh) <= MARGIN * norm2:
                return (f"head {h} scores the pair {sh:.3g}, within the margin 1e-14 ||P_h||_F^2 = "
                        f"{MARGIN * norm2:.2g} of zero: that is zero up to rounding, and a rounding "
                        "accident makes it positive; move u and w apart (+/- a step) along a direction "
                        "every head's columns see")
            if sh > 0:
                return (f"head {h} scores the pair {sh:.3g} > 0 and its ReLU keeps it: the pair must be "
                        "hidden from every head, so work orthogonally to every head's columns")
        return None

    return judge


def _blind_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def c(label, P, gamma, hint=""):
        return Case(label, (P, gamma), judge=_blind_judge(P, gamma), hint=hint)

    shared = randn(1, 8, 4).expand(4, 8, 4).contiguous()
    scales = torch.tensor([1e3, 1.0, 1e-3], dtype=f64)[:, None, None]
    # two heads in orthogonal subspaces of R^7 (coordinates 0..2 and 3..5), at scales 1e3 and 1e-3
    apart = torch.zeros(2, 7, 2, dtype=f64)
    apart[0, :3], apart[1, 3:6] = 1e3 * randn(3, 2), 1e-3 * randn(3, 2)
    return [
        c("one head, D = 16, r = 4, gamma = 0.9", randn(1, 16, 4), 0.9),
        c("four heads, D = 32, r = 4, gamma = 0.99", randn(4, 32, 4), 0.99),
        c("eleven heads of rank 1 in D = 12: a one-dim blind spot", randn(11, 12, 1), 0.95),
        c("four heads sharing one projection: r H = 16 > D = 8", shared, 0.9,
          hint="the four heads share their columns: the blind spot is the orthogonal complement of their "
               "span, whose dimension is D minus their rank (4), not D - r * H"),
        c("D = 2, r = 1, gamma = 1 - 1e-6", randn(1, 2, 1), 1 - 1e-6,
          hint="gamma = 1 - 1e-6: u . w = (1 - a^2) / (1 + a^2) for u, w = n +/- a t, so the step must be "
               "small, a <= 7e-4, and still clear the margin"),
        c("heads at scales 1e3, 1 and 1e-3, D = 10, r = 2", randn(3, 10, 2) * scales, 0.9),
        c("two heads in orthogonal subspaces, at scales 1e3 and 1e-3, D = 7", apart, 0.9,
          hint="the heads' column spaces are orthogonal: a step t along one head's columns is invisible "
               "to the other; take t with a part in every head's span (a random vector of the span)"),
    ]


def _head_norm_ratio(P) -> float:
    n = P.flatten(1).norm(dim=1)
    return float(n.max() / n.min())


def _columns_rank(P) -> int:
    return int(torch.linalg.matrix_rank(P.permute(1, 0, 2).reshape(P.shape[1], -1)))


BLIND_PAIR = Exercise(
    name="indexer blind spot",
    chapter="2",
    title="The indexer's blind spot",
    statement=(
        "A cheap indexer scores a query-key pair by "
        "$\\sum_h\\mathrm{relu}\\big((u\\Pi_h)\\cdot(w\\Pi_h)\\big)$ with rank-$r$ projections "
        "$\\Pi_h\\in\\mathbb R^{D\\times r}$. Build unit $u,w$ with $u\\cdot w\\ge\\gamma$ whose score is "
        "zero with a margin: every head's $(u\\Pi_h)\\cdot(w\\Pi_h)<-10^{-14}\\|\\Pi_h\\|_F^2$, a margin "
        "rounding cannot cross (the chapter's exercise 1, with $H_I$ heads). It must work for one head, "
        "many heads, a one-dimensional blind spot, heads that share a projection, $\\gamma$ within "
        "$10^{-6}$ of 1, heads of very different scales and heads in orthogonal subspaces."),
    solution=blind_pair,
    imports="import math\n\nimport torch",
    cases=_blind_cases,
    wrong=(Wrong(_blind_first_head, "every head"), Wrong(_blind_equal, "rounding"),
           Wrong(_blind_count, "rank"), Wrong(_blind_fixed_alpha, "below gamma"),
           Wrong(_blind_small_fixed_alpha, "below gamma"), Wrong(_blind_top_direction, "every head's span")),
    freedoms=(
        Freedom("several heads", lambda c: c.args[0].shape[0] > 1),
        Freedom("heads sharing a projection (rank < r H)",
                lambda c: _columns_rank(c.args[0]) < c.args[0].shape[0] * c.args[0].shape[2]),
        Freedom("a one-dimensional blind spot (rank D - 1)",
                lambda c: _columns_rank(c.args[0]) == c.args[0].shape[1] - 1),
        Freedom("gamma within 1e-6 of 1", lambda c: c.args[1] >= 1 - 1e-6),
        Freedom("heads at scales 1e6 apart", lambda c: _head_norm_ratio(c.args[0]) >= 1e5),
        Freedom("heads in orthogonal subspaces", lambda c: c.args[0].shape[0] > 1 and float(
            torch.einsum("dr,ds->rs", c.args[0][0], c.args[0][1]).abs().max()) == 0.0),
    ),
)


# --- 4. random key sampling -------------------------------------------------------------------------

def sampling_error(T, s, M):
    """A row of ``T`` keys: the needle's score is ``M``, the other ``T - 1``
    scores are 0. An algorithm samples ``s`` of the ``T`` keys (``1 <= s < T``,
    uniformly, without replacement) and returns the softmax over its sample.
    Return the L1 errors ``(hit, miss, expected)`` (floats): the needle sampled,
    not sampled, and the mean over the coins. ``M`` may be 800 or -800; ``hit``
    may be as small as 1e-32 and is checked to the same relative accuracy."""
    # 1 - pi(M) = (T - 1) / (e^M + T - 1): the logistic of log(T - 1) - M,
    # written so that exp never overflows (M = 800 or M = -800).
    x = math.log(T - 1) - M
    # rest = 1 - pi(M)
    rest = 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
    c = rest / (T - 1)                   # exact weight of each zero-score key
    # Needle sampled: the algorithm puts more weight than the exact row on every
    # key it sampled and none on the T - s it missed, so the L1 distance is
    # twice the exact mass on the missed keys.
    hit = 2 * (T - s) * c
    # Needle missed: the exact mass on the needle and on the T - 1 - s
    # unsampled zero keys.
    miss = 2 * (1 - rest) + 2 * (T - 1 - s) * c
    # P(needle in a sample of s out of T) = s / T
    expected = s / T * hit + (1 - s / T) * miss
    return hit, miss, expected


def _sampling_hit_exact(T, s, M):
    _, miss, _ = sampling_error(T, s, M)
    return 0.0, miss, (1 - s / T) * miss


def _sampling_bound(T, s, M):
    hit, _, _ = sampling_error(T, s, M)
    pi = 1 - sampling_error(T, T - 1, M)[0] / 2 * (T - 1)   # 1 - (T - 1) c = pi
    miss = 2 * pi                                            # the lower bound 2 (pi - r_j), r_j = 0
    return hit, miss, s / T * hit + (1 - s / T) * miss


def _sampling_overflow(T, s, M):
    e = math.exp(M)
    pi, c = e / (e + T - 1), 1 / (e + T - 1)
    hit, miss = 2 * (T - s) * c, 2 * pi + 2 * (T - 1 - s) * c
    return hit, miss, s / T * hit + (1 - s / T) * miss


def _sampling_t_minus_1(T, s, M):
    hit, miss, _ = sampling_error(T, s, M)
    return hit, miss, s / (T - 1) * hit + (1 - s / (T - 1)) * miss


def _sampling_cancels(T, s, M):
    hit, miss, _ = sampling_error(T, s, M)
    x = math.log(T - 1) - M
    rest = 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))
    on_sample = (1 - rest) + (s - 1) * rest / (T - 1)       # the exact mass the sample holds
    hit = 2 * (1 - on_sample)                                # 1 minus nearly 1: 0 at M = 80
    return hit, miss, s / T * hit + (1 - s / T) * miss


def _sampling_exp_minus_m(T, s, M):
    w = (T - 1) * math.exp(-M)                               # e^(-M): safe at M = 800, not at M = -800
    rest = w / (1 + w)
    c = rest / (T - 1)
    hit, miss = 2 * (T - s) * c, 2 * (1 - rest) + 2 * (T - 1 - s) * c
    return hit, miss, s / T * hit + (1 - s / T) * miss


def _sampling_logs(T, s, M):
    log_c = -M - math.log1p((T - 1) * math.exp(-M)) if M > 0 else -math.log(math.exp(M) + T - 1)
    hit = 2 * math.exp(math.log(T - s) + log_c)
    pi = 1 - math.exp(math.log(T - 1) + log_c)
    miss = 2 * pi + 2 * math.exp(math.log(T - 1 - s) + log_c)   # log 0 when s = T - 1
    return hit, miss, s / T * hit + (1 - s / T) * miss


def _sampled_rows_error(T, s, M, needle_in: bool) -> float:
    """L1 distance between the exact row and the softmax over one sample, built as vectors (float64)."""
    scores = torch.zeros(T, dtype=f64)
    scores[0] = M
    exact = torch.softmax(scores, 0)
    sample = torch.zeros(T, dtype=torch.bool)
    if needle_in:
        sample[:s] = True
    else:
        sample[1:s + 1] = True
    algo = torch.softmax(scores.masked_fill(~sample, float("-inf")), 0)
    # For two probability vectors ||p - r||_1 = 2 sum (p - r)_+: no cancellation between near-equal terms.
    return float(2 * (exact - algo).clamp(min=0).sum())


def _sampling_cases(gen):
    def c(label, T, s, M, hint=""):
        hit = _sampled_rows_error(T, s, M, True)
        miss = _sampled_rows_error(T, s, M, False)
        return Case(label, (T, s, M), (hit, miss, s / T * hit + (1 - s / T) * miss), hint=hint)

    T = int(torch.randint(64, 512, (1,), generator=gen))
    s = int(torch.randint(2, T // 4, (1,), generator=gen))
    return [
        c(f"T = {T}, s = {s}, M = log(T - 1): the needle holds half the row", T, s, math.log(T - 1)),
        c("T = 256, s = 32, M = 80: hit is about 8e-33", 256, 32, 80.0,
          hint="at M = 80 hit is about 8e-33, checked to relative accuracy: 1 minus the sample's exact "
               "mass cancels to 0 in floats; write hit as 2 (T - s) times a zero key's weight"),
        c("T = 64, s = 8, M = 0: no needle at all", 64, 8, 0.0),
        c("T = 10, s = 9, M = 2: the sample misses one key", 10, 9, 2.0,
          hint="with s = T - 1 a sample without the needle holds every zero key: the exact mass it misses "
               "is the needle's alone (the T - 1 - s term is 0)"),
        c("T = 2, s = 1, M = 3", 2, 1, 3.0,
          hint="T = 2, s = 1: a sample without the needle is the one zero key, so the exact mass it misses "
               "is the needle's alone (the T - 1 - s term is 0)"),
        c("a needle that loses, M = -30, T = 100, s = 10", 100, 10, -30.0),
        c("M = 800, T = 1000, s = 30", 1000, 30, 800.0,
          hint="e^M overflows a float at M = 800: write the weights with e^(-M), or as the logistic of "
               "M - log(T - 1)"),
        c("M = -800, T = 50, s = 5", 50, 5, -800.0,
          hint="e^(-M) overflows a float at M = -800: write the weights with e^M there, or as the "
               "logistic of M - log(T - 1)"),
    ]


def _hit_zero(got, expected, case) -> bool:
    # not where the true hit is below 1e-12 (M = 80): 0 there is a cancellation, not this mistake
    return float(got[0]) == 0.0 and float(expected[0]) > 1e-12


def _miss_is_bound(got, expected, case) -> bool:
    bound = _sampling_bound(*case.args)[1]
    return agree(got[1], bound, 1e-6) and not agree(expected[1], bound, 1e-6)


def _over_t_minus_1(got, expected, case) -> bool:
    wrong = _sampling_t_minus_1(*case.args)[2]
    return agree(got[2], wrong, 1e-6) and not agree(expected[2], wrong, 1e-6)


SAMPLING = Exercise(
    name="random key sampling",
    chapter="2",
    title="The error of random key sampling",
    statement=(
        "The chapter's exercise 3: the needle is planted *before* the coins are tossed. A row has $T$ "
        "keys, the needle's score is $M$ and the others' 0; the algorithm samples $s<T$ of the $T$ keys "
        "and takes the softmax over its sample. Give the $\\ell_1$ error on the row when the sample holds "
        "the needle, when it does not, and its expectation over the coins, for every real $M$ (from "
        "$-800$ to 800). Each is checked to a relative accuracy of $10^{-6}$, the error when the sample "
        "holds the needle too, though at $M=80$ it is about $10^{-32}$: write it so that nothing "
        "cancels. Then see how the expectation depends on $M$."),
    solution=sampling_error,
    imports="import math",
    cases=_sampling_cases,
    wrong=(Wrong(_sampling_hit_exact, "not exact"), Wrong(_sampling_bound, "lower bound"),
           Wrong(_sampling_overflow, "overflows"), Wrong(_sampling_t_minus_1, "s / t"),
           Wrong(_sampling_cancels, "cancels to 0"), Wrong(_sampling_exp_minus_m, "at m = -800"),
           Wrong(_sampling_logs, "the t - 1 - s term is 0")),
    diagnose=((_hit_zero, "a sample that holds the needle is not exact: the T - s keys it missed carry "
                          "weight in the exact row"),
              (_miss_is_bound, "2 pi is the lower bound 2 (pi - r_j), not the error: the exact row's mass on "
                               "the keys the sample missed counts too"),
              (_over_t_minus_1, "the sample is drawn from all T keys, the needle among them: it holds the "
                                "needle with probability s / T")),
    freedoms=(
        Freedom("a hit error far below 1 (about 1e-32)", lambda c: 0 < c.expected[0] < 1e-20),
        Freedom("M = 800 (e^M overflows)", lambda c: c.args[2] >= 710),
        Freedom("M = -800 (e^-M overflows)", lambda c: c.args[2] <= -710),
        Freedom("M = 0 (no needle)", lambda c: c.args[2] == 0),
        Freedom("s = T - 1", lambda c: c.args[1] == c.args[0] - 1 and c.args[0] > 2),
        Freedom("T = 2", lambda c: c.args[0] == 2),
    ),
)


# --- 5. sliding-window attention --------------------------------------------------------------------

def sliding_window(q, k, v, window, causal):
    """Softmax attention over a band of keys: ``q, k [B, H, T, D]``,
    ``v [B, H, T, Dv]``, scale ``1 / sqrt(D)``, ``window >= 1``. With
    ``causal`` query ``i`` sees the keys ``i - window < j <= i``; without,
    ``|i - j| < window``. Return ``(o [B, H, T, Dv], lse [B, H, T])``. A key
    off the band contributes nothing, even inf. Compute in float32 or wider."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    T = q.shape[-2]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    # the band: window keys up to i itself, or |i - j| < window both sides
    if causal:
        keep = (j > i - window) & (j <= i)
    else:
        keep = (i - j).abs() < window
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    # a selection: an inf or NaN score off the band is dropped too
    s = s.masked_fill(~keep, float("-inf"))
    # finite: the band always holds key i
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    # Select rather than multiply by 0: 0 * inf is NaN, and a value off the
    # band may hold anything.
    pv = torch.where(keep[..., None],
                     p[..., None] * v.to(acc)[..., None, :, :], 0.0)
    return pv.sum(dim=-2), lse


def _window_band(T, window, causal, kind="band"):
    """The band as the wrong answers below read it: the right one, one key wider each side
    (``"wide"``: ``|i - j| <= window``), symmetric whatever ``causal`` says, or always causal."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if kind == "wide":
        near = (i - j).abs() <= window
    else:
        near = (i - j).abs() < window
    if (causal and kind != "symmetric") or kind == "causal":
        near = near & (j <= i)
    return near


def _window_variant(q, k, v, window, causal, *, band="band", acc="auto", mask=float("-inf"), shift="lse",
                    select=True, full_row=False):
    """The definition with one thing changed: the band (:func:`_window_band`), the dtype computed in
    (None: the inputs'), the value that hides a key off the band, what is subtracted before exp (each
    row's lse, the whole tensor's max, or nothing), whether the values are selected or multiplied by
    the weights, and whether each row is normalised over its full (causal) row and then masked."""
    if acc == "auto":
        acc = f64 if q.dtype == f64 else torch.float32
    acc = acc or q.dtype
    T = q.shape[-2]
    keep = _window_band(T, window, causal, band)
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    vv = v.to(acc)
    if full_row:                                       # softmax over the (causal) row, then the band
        if causal:
            s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        return (torch.softmax(s, -1) * keep) @ vv, torch.logsumexp(s, -1)
    s = s.masked_fill(~keep, mask)
    if shift == "tensor":
        m = s[torch.isfinite(s)].max()
        p = torch.exp(s - m).masked_fill(~keep, 0.0)
        lse = m + torch.log(p.sum(-1))
        p = p / p.sum(-1, keepdim=True)
    elif shift == "none":
        p = torch.exp(s)
        lse = torch.log(p.sum(-1))
        p = p / p.sum(-1, keepdim=True)
    else:
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1))
    if not select:
        return p @ vv, lse
    return torch.where(keep[..., None], p[..., None] * vv[..., None, :, :], 0.0).sum(-2), lse


def _window_wide(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, band="wide")


def _window_symmetric(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, band="symmetric")


def _window_always_causal(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, band="causal")


def _window_minus_1e4(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, mask=-1e4, select=False)


def _window_times_zero(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, select=False)


def _window_tensor_max(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, shift="tensor")


def _window_unshifted(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, shift="none")


def _window_in_half(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, acc=None)


def _window_softmax_then_mask(q, k, v, window, causal):
    return _window_variant(q, k, v, window, causal, full_row=True)


def _fails_like(wrong, tol: float = 1e-4):
    """A diagnosis: the reader's output is what ``wrong`` gives on this case's inputs, and that fails
    the case at its own tolerance (where the mistake changes nothing, rounding is not it: unlike
    :func:`matches`, which compares the wrong answer with the right one at ``tol``)."""
    def diagnosis(got, expected, case) -> bool:
        want = wrong(*case.args)
        return compare(want, case) is not None and agree(got, want, tol)
    return diagnosis


def _window_scores(c) -> torch.Tensor:
    """The scores on the band of a case, in float64; -inf elsewhere."""
    q, k, _, window, causal = c.args
    keep = _window_band(q.shape[-2], window, causal)
    s = (q.to(f64) @ k.to(f64).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s.masked_fill(~keep, float("-inf"))


def _rows_judge(expected, rows: slice, tol: float):
    """A judge of the rows ``rows`` only: those whose band holds no inf (the others are not checked)."""
    o, lse = expected
    sub = Case("", (), (o[..., rows, :], lse[..., rows]), tol=tol)
    first, last = range(o.shape[-2])[rows][0], range(o.shape[-2])[rows][-1]

    def judge(got):
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            return "return a tuple (o, lse)"
        go, gl = got
        if not (isinstance(go, torch.Tensor) and isinstance(gl, torch.Tensor)):
            return "o and lse must be tensors"
        for n, (g, e) in enumerate(((go, o), (gl, lse))):
            if tuple(g.shape) != tuple(e.shape):
                return f"output {n}: expected shape {tuple(e.shape)}, got {tuple(g.shape)}"
        problem = compare((go[..., rows, :], gl[..., rows]), sub)
        return None if problem is None else f"on rows {first}..{last} (no inf on their band): {problem}"

    return judge


def _window_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    def expected(q, k, v, window, causal):
        # in float64 from the same inputs: the answer, not the reference's own float16 rounding
        return sliding_window_attention_reference(q.to(f64), k.to(f64), v.to(f64), window=window,
                                                  scale=q.shape[-1] ** -0.5, causal=causal)

    def c(label, q, k, v, window, causal, hint=""):
        return Case(label, (q, k, v, window, causal), expected(q, k, v, window, causal), hint=hint)

    f16, f32 = torch.float16, torch.float32
    # scores near 400 within about 10 of each other: q and k along one axis, plus noise
    axis = torch.zeros(8, dtype=f64)
    axis[0] = (400 * 8 ** 0.5) ** 0.5
    mq, mk = (axis + 0.15 * randn(1, 2, 16, 8)).half(), (axis + 0.15 * randn(1, 2, 16, 8)).half()
    # every score near -1e4 (q_0 = -141.5, k_0 = 141.5, D = 4: -10011 plus the noise's products)
    lq, lk = 2 * randn(1, 2, 16, 4), 2 * randn(1, 2, 16, 4)
    lq[..., 0], lk[..., 0] = -141.5, 141.5
    # unit vectors of norm 200 in D = 16: scores q . k / 4 anywhere in [-1e4, 1e4], row maxima far apart
    big = randn(1, 2, 24, 16)
    big = (big / big.norm(dim=-1, keepdim=True) * 100.0 * 16 ** 0.25).to(f16)
    # inf in keys and values 0..3; causal with a window of 6, rows 0..8 see them and rows 9.. do not
    ki, vi = randn(1, 2, 24, 8, dtype=f32), randn(1, 2, 24, 4, dtype=f32)
    ki[..., :4, :] = float("inf")
    vi[..., :4, :] = float("inf")
    qi = randn(1, 2, 24, 8, dtype=f32)
    poison = Case("inf in keys and values 0..3, off the band of rows 9..23 (window 6, causal)",
                  (qi, ki, vi, 6, True), judge=_rows_judge(expected(qi, ki, vi, 6, True), slice(9, None),
                                                           TOLERANCE[f32]),
                  hint="a key off row i's band must contribute nothing, even inf: 0 * inf is NaN, so "
                       "select (torch.where) instead of multiplying by a zero weight")
    return [
        c("causal, window 5, T = 16 (not a multiple of 5), H = 2", randn(1, 2, 16, 8, dtype=f32),
          randn(1, 2, 16, 8, dtype=f32), randn(1, 2, 16, 8, dtype=f32), 5, True),
        c("not causal, window 3, T = 13, B = 2, D = 5, Dv = 3", randn(2, 1, 13, 5), randn(2, 1, 13, 5),
          randn(2, 1, 13, 3), 3, False,
          hint="not causal, query i sees the keys |i - j| < window: up to 2 window - 1 of them, later "
               "ones too"),
        c("window 1, causal: each query sees only itself (o = v)", randn(1, 1, 9, 4, dtype=f32),
          randn(1, 1, 9, 4, dtype=f32), randn(1, 1, 9, 6, dtype=f32), 1, True,
          hint="window 1: row i's band is key i alone (i - 1 < j <= i), so o_i = v_i and lse_i = s_ii"),
        c("window 12 >= T = 7, causal: causal softmax attention", randn(1, 2, 7, 3), randn(1, 2, 7, 3),
          randn(1, 2, 7, 3), 12, True),
        c("window 6 = T, not causal: softmax attention", randn(1, 1, 6, 4), randn(1, 1, 6, 4),
          randn(1, 1, 6, 2), 6, False),
        c("T = 1, window 4, B = 2, H = 3", randn(2, 3, 1, 3, dtype=f32), randn(2, 3, 1, 3, dtype=f32),
          randn(2, 3, 1, 5, dtype=f32), 4, False),
        c("float16 scores near 400, within about 10 of each other", mq, mk, randn(1, 2, 16, 3, dtype=f16),
          6, True,
          hint="float16 scores near 400: exp(400) overflows unless each row's max (or lse) is subtracted, "
               "and a float16 score is rounded to 0.25 (up to 13% of its weight): compute in float32"),
        c("float16, every score near -1e4, not causal, window 4", lq.half(), lk.half(),
          randn(1, 2, 16, 3, dtype=f16), 4, False,
          hint="the scores on the band sit near -1e4, where a finite mask constant such as -1e4 gives the "
               "keys off the band as much weight as those on it: hide them with -inf"),
        c("logits of 1e4 in float16, window 4, causal", big, big.flip(-2).contiguous(),
          randn(1, 2, 24, 4, dtype=f16), 4, True,
          hint="logits of +/-1e4: exp overflows, and one max for the whole tensor underflows the rows far "
               "below it; compute in float32 and subtract each row's lse (or max)"),
        poison,
    ]


def _window_row_max_spread(c) -> float:
    m = _window_scores(c).amax(-1)
    m = m[torch.isfinite(m)]
    return float(m.max() - m.min()) if m.numel() else 0.0


def _window_near(c, level, width) -> bool:
    """Some head whose every score on the band lies within ``width`` of ``level``."""
    s = _window_scores(c)
    near = ((s - level).abs() < width) | torch.isinf(s)
    return bool(near.flatten(-2).all(-1).any()) and bool(torch.isfinite(s).any())


WINDOW = Exercise(
    name="sliding-window attention",
    chapter="2",
    title="Sliding-window attention",
    statement=(
        "Row $i$ of sliding-window attention is the exact softmax over the keys $W_i$ of its band: "
        "$o_i=\\sum_{j\\in W_i}e^{s_{ij}-\\ell_i}v_j$, $\\ell_i=\\log\\sum_{j\\in W_i}e^{s_{ij}}$, "
        "$s_{ij}=q_i\\cdot k_j/\\sqrt D$. With `causal`, $W_i$ holds the $w=$ `window` keys "
        "$i-w<j\\le i$, key $i$ included; without, the keys $|i-j|<w$, up to $2w-1$ of them. The band is "
        "never empty (it holds key $i$), and $w\\ge T$ is softmax attention, causal or not. A position off "
        "the band contributes exactly nothing, even when its key or value holds inf (rows whose band "
        "holds an inf are not checked). In chapter 1's terms the plan is the softmax restricted to the "
        "band's support: the cost is infinite off it. Return $o$ and $\\ell$ for $w=1$, $w\\ge T$, "
        "lengths that are not a multiple of $w$, $T=1$, and float16 scores of a few hundred, near "
        "$-10^4$ and of $\\pm10^4$ (computed in float32, the float16 answers are checked to "
        "$5\\cdot10^{-3}$)."),
    solution=sliding_window,
    imports="import math\n\nimport torch",
    cases=_window_cases,
    wrong=(Wrong(_window_wide, "too wide"), Wrong(_window_symmetric, "no key after it"),
           Wrong(_window_always_causal, "later keys too"), Wrong(_window_minus_1e4, "with -inf"),
           Wrong(_window_times_zero, "select"), Wrong(_window_tensor_max, "one max for the whole tensor"),
           Wrong(_window_unshifted, "is subtracted"), Wrong(_window_in_half, "compute in float32"),
           Wrong(_window_softmax_then_mask, "over the band only")),
    diagnose=(
        (_fails_like(_window_wide), "your band is one key too wide: causal, query i sees i - window < j <= i "
                                    "(window keys, itself included); not causal, |i - j| < window"),
        (_fails_like(_window_symmetric), "with causal=True query i sees no key after it: i - window < j <= i, "
                                         "not |i - j| < window"),
        (_fails_like(_window_always_causal), "with causal=False query i sees |i - j| < window, later keys too"),
        (_fails_like(_window_softmax_then_mask), "your rows were normalised over the full row and then masked: "
                                                 "normalise over the band only"),
        (_fails_like(_window_minus_1e4), "a finite mask constant (-1e4) is no mask where the scores are as low: "
                                         "hide the keys off the band with -inf"),
        (_fails_like(_window_tensor_max, 1e-3), "one max for the whole tensor underflows the rows far below it: "
                                                "subtract each row's own max (or lse)")),
    freedoms=(
        Freedom("window 1", lambda c: c.args[3] == 1),
        Freedom("1 < window < T", lambda c: 1 < c.args[3] < c.args[0].shape[-2]),
        Freedom("window >= T", lambda c: c.args[3] >= c.args[0].shape[-2]),
        Freedom("causal=True", lambda c: bool(c.args[4])),
        Freedom("causal=False", lambda c: not c.args[4]),
        Freedom("T = 1", lambda c: c.args[0].shape[-2] == 1),
        Freedom("T not a multiple of window", lambda c: 1 < c.args[3] < c.args[0].shape[-2]
                and c.args[0].shape[-2] % c.args[3] != 0),
        Freedom("D != Dv", lambda c: c.args[0].shape[-1] != c.args[2].shape[-1]),
        Freedom("float16", lambda c: c.args[0].dtype == torch.float16),
        Freedom("float32", lambda c: c.args[0].dtype == torch.float32),
        Freedom("float64", lambda c: c.args[0].dtype == f64),
        Freedom("B > 1", lambda c: c.args[0].shape[0] > 1),
        Freedom("H > 1", lambda c: c.args[0].shape[1] > 1),
        Freedom("inf in keys and values off the band", lambda c: bool(torch.isinf(c.args[1]).any())
                and bool(torch.isinf(c.args[2]).any())),
        Freedom("scores near -1e4, a finite mask constant", lambda c: _window_near(c, -1e4, 50.0)),
        Freedom("float16 scores of 1e4 in rows thousands apart (a per-row max needed)",
                lambda c: c.args[0].dtype == torch.float16 and _window_row_max_spread(c) > 1000),
    ),
)


EXERCISES = (NEEDLE, SPARSE, BLIND_PAIR, SAMPLING, WINDOW)
