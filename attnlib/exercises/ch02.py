"""Chapter 2's exercises: the needle planted where a probe map does not look, block-sparse attention
from its mask, the indexer's blind spot, and the error of random key sampling in closed form."""

from __future__ import annotations

import math

import torch

from ..attention import softmax_attention_reference
from ..sparse import block_sparse_attention_reference
from ._checker import Case, Exercise, Wrong, agree, matches

f64 = torch.float64



# --- 1. the needle ----------------------------------------------------------------------------------

def needle_adversary(seen, d, M):
    """Defeat an algorithm that computes only the scores ``seen [T, T]`` marks
    (bool; True only for ``j <= i``, always on the diagonal) and returns the
    softmax over them. Return ``(q, k, i)``: ``q, k [T, d]`` float64 and a row
    ``i`` on which exact causal attention and the algorithm's are >= 1.9 apart
    in L1, every score ``q_i . k_j / sqrt(d)`` of row ``i`` in ``[-M, M]``."""
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

    T = 24
    i0 = int(torch.randint(2, T, (1,), generator=gen))
    j0 = int(torch.randint(0, i0, (1,), generator=gen))
    one_hole = causal(T)
    one_hole[i0, j0] = False
    return [
        case("sliding window of 8 with 4 sinks, T = 48, d = 8", window(48, 8, 4), 8,
             hint="plant q_i and k_j with j <= i and seen[i, j] False; every other vector zero"),
        case("strided pattern (stride 6), T = 40, d = 4", strided(40, 6), 4),
        case("6 random earlier keys per query, T = 32, d = 16", sampled(32, 6), 16),
        case("every pair seen but one, T = 24, d = 3", one_hole, 3,
             hint="search the whole map for the one pair (i, j <= i) it misses"),
        case("T = 2, each query sees only itself, d = 1", torch.eye(2, dtype=torch.bool), 1),
        case("sliding window of 4, no sinks, T = 17, d = 1", window(17, 4, 0), 1),
    ]


NEEDLE = Exercise(
    name="needle adversary",
    chapter="2",
    title="Plant the needle",
    statement=(
        "An algorithm computes only the causal scores its probe map `seen` marks and returns the softmax "
        "over them. Build the input that defeats it: $q, k$ and a row $i$ on which exact causal "
        "attention and the algorithm's, with one-hot values, are at least 1.9 apart in $\\ell_1$ (the "
        "largest possible is 2), with every score of row $i$ in $[-M,M]$, $M=\\log T+4$. The maps are "
        "a sliding window with sinks, a strided pattern, random samples, a map that misses a single "
        "pair, and $T=2$."),
    solution=needle_adversary,
    imports="import math\n\nimport torch",
    cases=_needle_cases,
    wrong=(Wrong(_adversary_future, "in the future"), Wrong(_adversary_unscaled, "sqrt(d)"),
           Wrong(_adversary_polarity, "finds your needle")),
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
    return [
        c("random blocks of 8 (diagonal kept), T = 32, H = 2", randn(1, 2, 32, 8), randn(1, 2, 32, 8),
          randn(1, 2, 32, 4), rmask(2, 4), 8, False,
          hint="a key outside the visited blocks gets score -inf before the softmax: normalise over the "
               "visited keys only"),
        c("causal, T = 37 with blocks of 8 (a short tail)", randn(2, 1, 37, 5), randn(2, 1, 37, 5),
          randn(2, 1, 37, 3), rmask(1, 5), 8, True,
          hint="expand block (I, J) to rows I*bs..(I+1)*bs-1 and columns J*bs..(J+1)*bs-1, cut at T; "
               "causal keeps j <= i inside the diagonal block too"),
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
        c("logits of 1e4 in float16", big, big.flip(-2).contiguous(), randn(1, 2, 24, 4, dtype=torch.float16),
          rmask(2, 3), 8, True,
          hint="exp(1e4) overflows: compute in float32 and subtract each row's lse (or max)"),
    ]



SPARSE = Exercise(
    name="block-sparse attention",
    chapter="2",
    title="Block-sparse attention from its mask",
    statement=(
        "A block-sparse attention is a probe map a GPU likes: query block $I$ visits key block $J$ when "
        "`block_mask[h, I, J]`, and row $i$ is the exact softmax over the keys $S_i$ it visits, "
        "$o_i=\\sum_{j\\in S_i}e^{s_{ij}-\\ell_i}v_j$ with $\\ell_i=\\log\\sum_{j\\in S_i}e^{s_{ij}}$. "
        "Return $o$ and $\\ell$ for lengths that are not a multiple of the block, rows that visit "
        "nothing ($o_i=0$, $\\ell_i=-\\infty$), blocks of one position, inf in a block nobody visits "
        "and float16 logits of $10^4$."),
    solution=sparse_attention,
    imports="import math\n\nimport torch",
    cases=_sparse_cases,
    wrong=(Wrong(_sparse_softmax_then_mask, "visited keys only"), Wrong(_sparse_tiled, "repeat_interleave"),
           Wrong(_sparse_empty_nan, "empty"), Wrong(_sparse_times_zero, "select")),
    diagnose=((matches(_sparse_tiled, 1e-4), "your position mask tiles the block mask (repeat) instead of "
                                           "expanding each block over its positions (repeat_interleave)"),
              (matches(_sparse_softmax_then_mask, 1e-4), "your rows were normalised over every key and then "
                                                       "masked: normalise over the visited keys only")),
)


# --- 3. the indexer's blind spot --------------------------------------------------------------------

def blind_pair(P, gamma):
    """A needle an indexer cannot see: ``P [H, D, r]`` float64, one projection
    per indexer head (index score ``sum_h relu((u P_h) . (w P_h))``),
    ``0 < gamma < 1``. Return unit ``(u, w)``, each ``[D]``, with
    ``u . w >= gamma`` and each head's ``(u P_h) . (w P_h) < 0`` (not just 0).
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


def _blind_equal(P, gamma):
    H, D, r = P.shape
    U, S, _ = torch.linalg.svd(P.permute(1, 0, 2).reshape(D, H * r), full_matrices=True)
    n = U[:, int((S > S.max() * 1e-10).sum())]
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
    H, D, r = P.shape
    U, S, _ = torch.linalg.svd(P.permute(1, 0, 2).reshape(D, H * r), full_matrices=True)
    k = int((S > S.max() * 1e-10).sum())
    n, t = U[:, k], U[:, :k].sum(dim=1)
    t = t / t.norm()
    u, w = n + 0.5 * t, n - 0.5 * t                        # u . w = 0.6, whatever gamma asks
    return u / u.norm(), w / w.norm()


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
            if abs(sh) <= 1e-12 * norm2:
                return (f"head {h} scores the pair {sh:.3g}: zero only up to rounding, and a rounding "
                        "accident makes it positive; give it a margin by moving u and w apart "
                        "(+/- a step) along the projections' span")
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
    return [
        c("one head, D = 16, r = 4, gamma = 0.9", randn(1, 16, 4), 0.9,
          hint="take n orthogonal to the columns of P and t in their span; u, w = n +/- a t"),
        c("four heads, D = 32, r = 4, gamma = 0.99", randn(4, 32, 4), 0.99),
        c("eleven heads of rank 1 in D = 12: a one-dim blind spot", randn(11, 12, 1), 0.95),
        c("four heads sharing one projection: r H = 16 > D = 8", shared, 0.9,
          hint="the blind spot is the orthogonal complement of the span of all the columns, whose "
               "dimension is their rank, not r * H"),
        c("D = 2, r = 1, gamma = 1 - 1e-6", randn(1, 2, 1), 1 - 1e-6),
        c("heads at scales 1e3, 1 and 1e-3, D = 10, r = 2", randn(3, 10, 2) * scales, 0.9),
    ]


BLIND_PAIR = Exercise(
    name="indexer blind spot",
    chapter="2",
    title="The indexer's blind spot",
    statement=(
        "A cheap indexer scores a query-key pair by "
        "$\\sum_h\\mathrm{relu}\\big((u\\Pi_h)\\cdot(w\\Pi_h)\\big)$ with rank-$r$ projections "
        "$\\Pi_h\\in\\mathbb R^{D\\times r}$. Build unit $u,w$ with $u\\cdot w\\ge\\gamma$ whose score is "
        "zero with a margin: every head's $(u\\Pi_h)\\cdot(w\\Pi_h)<0$ (the chapter's exercise 1, with "
        "$H_I$ heads). It must work for one head, many heads, a one-dimensional blind spot, heads that "
        "share a projection, $\\gamma$ within $10^{-6}$ of 1 and heads of very different scales."),
    solution=blind_pair,
    imports="import math\n\nimport torch",
    cases=_blind_cases,
    wrong=(Wrong(_blind_first_head, "every head"), Wrong(_blind_equal, "rounding"),
           Wrong(_blind_count, "rank"), Wrong(_blind_fixed_alpha, "below gamma")),
)


# --- 4. random key sampling -------------------------------------------------------------------------

def sampling_error(T, s, M):
    """A row of ``T`` keys: the needle's score is ``M``, the other ``T - 1``
    scores are 0. An algorithm samples ``s`` of the ``T`` keys (``1 <= s < T``,
    uniformly, without replacement) and returns the softmax over its sample.
    Return the L1 errors ``(hit, miss, expected)`` (floats): the needle sampled,
    not sampled, and the mean over the coins. ``M`` may be 800 or -30."""
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
        c(f"T = {T}, s = {s}, M = log(T - 1): the needle holds half the row", T, s, math.log(T - 1),
          hint="hit: the T - s keys the sample missed carry weight in the exact row; miss: the needle and "
               "the unsampled keys. The needle is sampled with probability s / T"),
        c("T = 256, s = 32, M = 80", 256, 32, 80.0),
        c("T = 64, s = 8, M = 0: no needle at all", 64, 8, 0.0),
        c("T = 2, s = 1, M = 3", 2, 1, 3.0),
        c("T = 10, s = 9, M = 2: the sample misses one key", 10, 9, 2.0),
        c("a needle that loses, M = -30, T = 100, s = 10", 100, 10, -30.0),
        c("M = 800, T = 1000, s = 30", 1000, 30, 800.0,
          hint="e^M overflows a float at M = 800: write the weights with e^(-M), or as the logistic of "
               "M - log(T - 1)"),
    ]


def _hit_zero(got, expected, case) -> bool:
    return float(got[0]) == 0.0 and float(expected[0]) > 0


def _miss_is_bound(got, expected, case) -> bool:
    return agree(got[1], _sampling_bound(*case.args)[1], 1e-6)


def _over_t_minus_1(got, expected, case) -> bool:
    return agree(got[2], _sampling_t_minus_1(*case.args)[2], 1e-6)


SAMPLING = Exercise(
    name="random key sampling",
    chapter="2",
    title="The error of random key sampling",
    statement=(
        "The chapter's exercise 3: the needle is planted *before* the coins are tossed. A row has $T$ "
        "keys, the needle's score is $M$ and the others' 0; the algorithm samples $s<T$ of the $T$ keys "
        "and takes the softmax over its sample. Give the $\\ell_1$ error on the row when the sample holds "
        "the needle, when it does not, and its expectation over the coins, for every real $M$ (up to "
        "800, and negative). Then see how the expectation depends on $M$."),
    solution=sampling_error,
    imports="import math",
    cases=_sampling_cases,
    wrong=(Wrong(_sampling_hit_exact, "not exact"), Wrong(_sampling_bound, "lower bound"),
           Wrong(_sampling_overflow, "overflows"), Wrong(_sampling_t_minus_1, "s / t")),
    diagnose=((_hit_zero, "a sample that holds the needle is not exact: the T - s keys it missed carry "
                          "weight in the exact row"),
              (_miss_is_bound, "2 pi is the lower bound 2 (pi - r_j), not the error: the exact row's mass on "
                               "the keys the sample missed counts too"),
              (_over_t_minus_1, "the sample is drawn from all T keys, the needle among them: it holds the "
                                "needle with probability s / T")),
)


EXERCISES = (NEEDLE, SPARSE, BLIND_PAIR, SAMPLING)
