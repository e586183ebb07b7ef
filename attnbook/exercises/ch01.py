"""Chapter 1's exercises: softmax from the one-sided dual, Sinkhorn, causal attention from its
definition, and how a row's entropy moves with the temperature."""

from __future__ import annotations

import math

import torch

from attnlib import eot
from attnlib.attention import softmax_attention_reference

from ._checker import Case, Exercise, Freedom, Wrong, agree, matches

f64 = torch.float64



# --- 1. softmax from the dual ---------------------------------------------------------------------

def softmax_from_dual(scores, eps):
    """The plan of the one-sided problem with cost ``-scores``:
    ``scores [..., Nq, Nk]`` (entries may be ``-inf``, a masked key; every row
    has at least one finite entry), ``eps > 0``. Compute each row's dual
    potential ``f_i = -eps * log sum_j exp(s_ij / eps)``, then
    ``P_ij = exp((s_ij + f_i) / eps)``, without torch.softmax or
    torch.logsumexp. Return ``P`` (same shape; rows sum to 1)."""
    half = scores.dtype in (torch.float16, torch.bfloat16)
    s = scores.to(torch.float32 if half else scores.dtype) / eps
    # each row's largest score: no exp(x) with x > 0
    m = s.amax(dim=-1, keepdim=True)
    f = -eps * (m + torch.log(torch.exp(s - m).sum(dim=-1, keepdim=True)))
    return torch.exp(s + f / eps)


def _dual_variant(scores, eps, *, shift="row", upcast=True, temperature="divide", dim=-1):
    """The plan with one thing changed: what is subtracted before exp (``shift``: each row's max, the
    whole tensor's max, the row's mean, nothing, or the row's max counted once with log1p), whether
    float16 is computed in float32, how eps enters, and the dim normalised over."""
    half = scores.dtype in (torch.float16, torch.bfloat16)
    s = scores.to(torch.float32) if (half and upcast) else scores
    s = s / eps if temperature == "divide" else s * eps
    if shift == "row":
        m = s.amax(dim=dim, keepdim=True)
    elif shift == "tensor":
        m = s[torch.isfinite(s)].max()
    elif shift == "mean":
        m = s.mean(dim=dim, keepdim=True)
    else:
        m = torch.zeros((), dtype=s.dtype)
    if shift == "log1p":               # lse = m + log1p(sum over the keys below the max)
        m = s.amax(dim=dim, keepdim=True)
        lse = m + torch.log1p(torch.exp(s - m).masked_fill(s == m, 0.0).sum(dim=dim, keepdim=True))
    else:
        lse = m + torch.log(torch.exp(s - m).sum(dim=dim, keepdim=True))
    return torch.exp(s - lse)


def _dual_no_max(scores, eps):
    return _dual_variant(scores, eps, shift="none")


def _dual_columns(scores, eps):
    return _dual_variant(scores, eps, dim=-2)


def _dual_times_eps(scores, eps):
    return _dual_variant(scores, eps, temperature="multiply")


def _dual_tensor_max(scores, eps):
    return _dual_variant(scores, eps, shift="tensor")


def _dual_mean_shift(scores, eps):
    return _dual_variant(scores, eps, shift="mean")


def _dual_log1p(scores, eps):
    return _dual_variant(scores, eps, shift="log1p")


def _dual_in_half(scores, eps):
    return _dual_variant(scores, eps, upcast=False)


def _dual_squeezed(scores, eps):
    return _dual_variant(scores.squeeze(), eps)


def _plan(scores, eps):
    """The library's plan for cost ``-scores`` (masked entries, ``-inf``, get no mass)."""
    s = scores.to(f64)
    finite = torch.isfinite(s)
    if finite.all():
        return eot.gibbs_plan(-s, eps)
    return torch.softmax(s / eps, dim=-1).masked_fill(~finite, 0.0)


def _row_max_spread(scores, eps) -> float:
    """How far apart (in units of eps) the rows' largest scores are: past ~100 one max for the whole
    tensor underflows the rows below it."""
    m = scores.to(f64).amax(dim=-1)
    return float((m.max() - m.min()) / eps)


def _softmax_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    causal = randn(5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    offsets = torch.tensor([-400.0, -100.0, 200.0, 400.0], dtype=f64)[:, None]
    huge = (randn(3, 6) * 1e4).clamp(-6e4, 6e4).to(torch.float16)
    cold = randn(4, 9, dtype=torch.float32)
    # rows near 250 .. 500, several keys within a few units of the row's max
    moderate = (torch.tensor([250.0, 320.0, 410.0, 500.0], dtype=f64)[:, None] + 2 * randn(4, 6))
    return [
        _c("4 x 7 random scores, eps = 1", randn(4, 7), 1.0),
        _c("2 x 3 x 5 random scores, eps = 0.25", randn(2, 3, 5), 0.25),
        _c("one key per row (3 x 1)", randn(3, 1), 1.0,
           hint="with one key per row (Nk = 1) each row's plan is [1]: keep the key dim, P is 3 x 1"),
        _c("one query (1 x 6)", randn(1, 6), 0.5,
           hint="with one query (Nq = 1) P is 1 x 6: keep the query dim"),
        _c("tied scores (4 x 5, all equal)", torch.full((4, 5), 2.5, dtype=f64), 1.0,
           hint="every key ties for the max: equal scores get equal mass, 1 / Nk each (count every "
                "key at the max, not one)"),
        _c("a causal mask (-inf above the diagonal, 5 x 5)", causal, 1.0,
           hint="a key with score -inf gets exp(-inf) = 0; the first row has one key, with all the mass"),
        # tol 1e-4: in float32 a score near 400 keeps about 3e-5 (a mistake here gives inf or NaN)
        _c("rows at offsets -400, -100, 200 and 400 (4 x 8)", randn(4, 8) + offsets, 1.0, tol=1e-4,
           hint="the rows sit at offsets up to 800 apart: subtract each row's largest score before exp; "
                "one max for the whole tensor underflows the rows below it"),
        _c("eps = 1e-3 in float32 (scores / eps about 1000)", cold, 1e-3,
           hint="exp overflows: subtract each row's largest score before exp (the plan is unchanged)"),
        _c("float16 logits of 250 to 500, several near the max (4 x 6)", moderate.to(torch.float16), 1.0,
           hint="in float16 the potential m + log(sum) near 300 is rounded to 0.25, so exp(s + f) is off "
                "by up to 13%: compute in float32"),
        _c("logits of 1e4 in float16 (3 x 6)", huge, 1.0,
           hint="exp(1e4) overflows: subtract each row's largest score before exp, in float32"),
    ]


def _c(label, scores, eps, hint="", tol=None):
    return Case(label, (scores, eps), _plan(scores, eps), tol=tol, hint=hint)


def _rows_are_columns(got, expected, case) -> bool:
    g = torch.as_tensor(got, dtype=f64)
    return g.shape[-2] > 1 and agree(g.sum(dim=-2), torch.ones_like(g.sum(dim=-2)), 1e-6)


def _scores(case):
    return case.args[0]


SOFTMAX_FROM_DUAL = Exercise(
    name="softmax from the dual",
    chapter="1",
    title="Softmax from the dual potential",
    statement=(
        "The one-sided problem with cost $C=-s$ splits into one problem per query row, whose optimal "
        "value is the row's dual potential $f_i=-\\varepsilon\\log\\sum_j e^{s_{ij}/\\varepsilon}$; "
        "the optimal plan is $P_{ij}=e^{(f_i-C_{ij})/\\varepsilon}=e^{(s_{ij}+f_i)/\\varepsilon}$. "
        "Write that plan from the potential, without "
        "`torch.softmax` or `torch.logsumexp`, for scores with any leading dims, so that it survives "
        "masked keys ($s_{ij}=-\\infty$), one key or one query, ties, rows at very different offsets, a "
        "cold temperature, and float16 logits of a few hundred and of $10^4$."),
    solution=softmax_from_dual,
    cases=_softmax_cases,
    wrong=(Wrong(_dual_no_max, "subtract each row's largest score"),
           Wrong(_dual_columns, "normalise over the keys"),
           Wrong(_dual_times_eps, "divides the scores"),
           Wrong(_dual_tensor_max, "one max for the whole tensor"),
           Wrong(_dual_mean_shift, "exp(-inf) = 0"),
           Wrong(_dual_log1p, "count every key at the max"),
           Wrong(_dual_in_half, "compute in float32"),
           Wrong(_dual_squeezed, "keep the key dim")),
    diagnose=((_rows_are_columns, "your columns sum to 1: each query's row sums to one, so normalise "
                                  "over the keys (the last dim)"),
              (matches(_dual_times_eps, 1e-4), "that is softmax(s * eps): the temperature divides the "
                                               "scores, s / eps")),
    freedoms=(
        Freedom("leading dims besides the query dim", lambda c: _scores(c).dim() > 2),
        Freedom("eps other than 1", lambda c: c.args[1] != 1.0),
        Freedom("one key per row (Nk = 1)", lambda c: _scores(c).shape[-1] == 1),
        Freedom("one query (Nq = 1)", lambda c: _scores(c).shape[-2] == 1),
        Freedom("masked keys (-inf)", lambda c: bool(torch.isneginf(_scores(c)).any())),
        Freedom("rows tied at the max", lambda c: bool(
            (_scores(c) == _scores(c).amax(-1, keepdim=True)).sum(-1).gt(1).any())),
        Freedom("rows at offsets far apart (a per-row max needed)",
                lambda c: _row_max_spread(*c.args) > 200),
        Freedom("scores / eps beyond exp's range in float32",
                lambda c: _scores(c).dtype == torch.float32
                and float(_scores(c).abs().max()) / c.args[1] > 100),
        Freedom("float16 logits of a few hundred", lambda c: _scores(c).dtype == torch.float16
                and 100 < float(_scores(c).abs().max()) < 2000),
        Freedom("float16 logits of 1e4", lambda c: _scores(c).dtype == torch.float16
                and float(_scores(c).abs().max()) >= 5000),
    ),
)


# --- 2. Sinkhorn ----------------------------------------------------------------------------------

def sinkhorn_plan(C, eps, a, b):
    """The two-sided entropic plan: ``C [Nq, Nk]``, ``eps > 0``, marginals
    ``a [Nq]``, ``b [Nk]`` (positive, equal totals). Alternate
    ``f_i = eps log a_i - eps log sum_j exp((g_j - C_ij) / eps)`` and
    ``g_j = eps log b_j - eps log sum_i exp((f_i - C_ij) / eps)`` until the row
    sums of ``P = exp((f_i + g_j - C_ij) / eps)`` are within 1e-10 of ``a``;
    return ``P``."""
    f = torch.zeros(C.shape[0], dtype=C.dtype)
    g = torch.zeros(C.shape[1], dtype=C.dtype)
    for _ in range(100_000):
        f = eps * a.log() - eps * torch.logsumexp((g[None, :] - C) / eps, dim=1)
        g = eps * b.log() - eps * torch.logsumexp((f[:, None] - C) / eps, dim=0)
        P = torch.exp((f[:, None] + g[None, :] - C) / eps)
        if (P.sum(1) - a).abs().max() < 1e-10:
            break
    return P


def _sinkhorn_rows_only(C, eps, a, b):
    P = torch.softmax(-C / eps, dim=1)
    return a[:, None] * P


def _sinkhorn_plain(C, eps, a, b):
    K = torch.exp(-C / eps)                                       # in the plain domain: K may underflow
    u, w = torch.ones_like(a), torch.ones_like(b)
    for _ in range(100_000):
        u = a / (K @ w)
        w = b / (K.T @ u)
        P = u[:, None] * K * w[None, :]
        if not torch.isfinite(P).all() or (P.sum(1) - a).abs().max() < 1e-10:
            break
    return P


def _sinkhorn_normalised(C, eps, a, b):
    return sinkhorn_plan(C, eps, a / a.sum(), b / b.sum())       # marginals made probability vectors


def _sinkhorn_uniform(C, eps, a, b):
    n, m = C.shape
    return sinkhorn_plan(C, eps, torch.full_like(a, float(a.sum()) / n),   # a and b taken as uniform
                         torch.full_like(b, float(b.sum()) / m))


def _sinkhorn_fixed_sweeps(C, eps, a, b):
    f = torch.zeros(C.shape[0], dtype=C.dtype)
    g = torch.zeros(C.shape[1], dtype=C.dtype)
    for _ in range(50):                                           # a fixed count, not to the tolerance
        f = eps * a.log() - eps * torch.logsumexp((g[None, :] - C) / eps, dim=1)
        g = eps * b.log() - eps * torch.logsumexp((f[:, None] - C) / eps, dim=0)
    return torch.exp((f[:, None] + g[None, :] - C) / eps)


_PLANS: dict = {}


def _library_plan(C, eps, a, b):
    """The library's plan, kept per input: every check of an answer draws the same inputs again, and
    the slow case takes the library some 200 sweeps."""
    key = tuple(t.numpy().tobytes() for t in (C, a, b)) + (tuple(C.shape), eps)
    if key not in _PLANS:
        if len(_PLANS) > 256:
            _PLANS.clear()
        _PLANS[key] = eot.sinkhorn(C, eps, a, b, tol=1e-12)
    return _PLANS[key].clone()


def _sinkhorn_cases(gen):
    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=f64)

    def marg(n, total):
        m = rand(n) + 0.2
        return m / m.sum() * total

    def c(label, C, eps, a, b, hint="", tol=1e-6):
        return Case(label, (C, eps, a, b), _library_plan(C, eps, a, b), tol=tol, hint=hint)

    C1, C2, C3 = rand(4, 4), rand(3, 6), rand(5, 5)
    pts = torch.linspace(0, 1, 6, dtype=f64)
    return [
        c("4 x 4 costs in [0, 1], eps = 0.5, a = b = 1 (total mass 4)", C1, 0.5, torch.ones(4, dtype=f64),
          torch.ones(4, dtype=f64)),
        c("3 x 6, eps = 0.2, random marginals", C2, 0.2, marg(3, 1.0), marg(6, 1.0)),
        c("one source (1 x 5): the plan is b itself", rand(1, 5), 0.3, torch.ones(1, dtype=f64),
          marg(5, 1.0)),
        c("squared distances of 6 points on a line, eps = 0.03, random marginals",
          (pts[:, None] - pts[None, :]) ** 2, 0.03, marg(6, 2.0), marg(6, 2.0),
          hint="at eps = 0.03 Sinkhorn needs some 200 sweeps here: iterate until the row sums are within "
               "1e-10 of a, not a fixed number of times"),
        # tol: in float32, (f + g - C) / eps with C near 100 keeps only about 5e-5 of each exponent
        c("5 x 5 costs of 100 + U(0, 1), eps = 0.1: every exp(-C / eps) is 0", 100 + C3, 0.1,
          torch.ones(5, dtype=f64), torch.ones(5, dtype=f64), tol=1e-4,
          hint="exp(-C / eps) underflows to 0 when C / eps is large: iterate on the log-potentials "
               "f, g with logsumexp"),
    ]


def _columns_miss(got, expected, case) -> bool:
    P = torch.as_tensor(got, dtype=f64)
    a, b = case.args[2], case.args[3]
    return agree(P.sum(1), a, 1e-8) and not agree(P.sum(0), b, 1e-6)


SINKHORN = Exercise(
    name="sinkhorn",
    chapter="1",
    title="Sinkhorn from scratch",
    statement=(
        "Two-sided entropic transport also fixes what each key receives: $P\\mathbf 1=a$ and "
        "$P^\\top\\mathbf 1=b$, for any positive $a,b$ with equal totals (not necessarily 1). Sinkhorn "
        "alternates the two potentials' closed-form updates; written in the log domain it survives a "
        "small $\\varepsilon$. Return the plan for costs in $[0,1]$, for $N_q\\ne N_k$, for one "
        "source, for points on a line at $\\varepsilon=0.03$ (slow to converge) and for costs of 100."),
    solution=sinkhorn_plan,
    cases=_sinkhorn_cases,
    wrong=(Wrong(_sinkhorn_rows_only, "alternate the row and column"),
           Wrong(_sinkhorn_plain, "underflows"),
           Wrong(_sinkhorn_normalised, "as given"),
           Wrong(_sinkhorn_uniform, "the marginals a and b"),
           Wrong(_sinkhorn_fixed_sweeps, "not a fixed number")),
    diagnose=((_columns_miss, "your rows sum to a but your columns miss b: that is one-sided attention "
                              "(a half-step); alternate the row and column updates"),
              (matches(_sinkhorn_normalised), "your plan carries mass 1, a and b scaled to probability "
                                              "vectors: keep the marginals as given, P 1 = a"),
              (matches(_sinkhorn_uniform), "your rows (or columns) all carry the same mass: use the "
                                           "marginals a and b themselves, not uniform ones")),
    freedoms=(
        Freedom("marginals whose total is not 1", lambda c: abs(float(c.args[2].sum()) - 1) > 1e-6),
        Freedom("non-uniform marginals", lambda c: bool((c.args[2] != c.args[2][0]).any()
                                                       or (c.args[3] != c.args[3][0]).any())),
        Freedom("Nq != Nk", lambda c: c.args[0].shape[0] != c.args[0].shape[1]),
        Freedom("one source (Nq = 1)", lambda c: c.args[0].shape[0] == 1),
        Freedom("a small eps that needs some 200 sweeps", lambda c: c.args[1] <= 0.03),
        Freedom("costs whose exp(-C / eps) underflows", lambda c: float(c.args[0].min()) / c.args[1] > 750),
    ),
)


# --- 3. causal attention from its definition ------------------------------------------------------

def causal_attention(q, k, v):
    """Causal softmax attention written out: ``q, k [B, H, T, D]``,
    ``v [B, H, T, Dv]`` (any float dtype). Scores ``q_i . k_j / sqrt(D)``; query
    ``i`` sees keys ``j <= i``; each row normalised; output ``[B, H, T, Dv]``.
    Compute in float32 or wider (float16 scores may reach 1e4)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    T = s.shape[-1]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return (p / p.sum(dim=-1, keepdim=True)) @ v.to(acc)


def _attend(q, k, v, *, scale, keep):
    s = scale * (q.to(f64) @ k.to(f64).transpose(-1, -2))
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.to(f64)


def _strict(q, k, v):
    T = q.shape[-2]
    return _attend(q, k, v, scale=q.shape[-1] ** -0.5, keep=torch.ones(T, T, dtype=torch.bool).tril(-1))


def _future(q, k, v):
    T = q.shape[-2]
    return _attend(q, k, v, scale=q.shape[-1] ** -0.5, keep=torch.ones(T, T, dtype=torch.bool).triu())


def _unscaled(q, k, v):
    T = q.shape[-2]
    return _attend(q, k, v, scale=1.0, keep=torch.ones(T, T, dtype=torch.bool).tril())


def _scaled_by_dv(q, k, v):
    T = q.shape[-2]
    return _attend(q, k, v, scale=v.shape[-1] ** -0.5, keep=torch.ones(T, T, dtype=torch.bool).tril())


def _causal_variant(q, k, v, *, acc=None, mask=float("-inf"), shift="row"):
    """The definition with one thing changed: the dtype computed in (``acc``; None: the inputs'), the
    value that hides a future key, and what is subtracted before exp (each row's max, the whole
    tensor's, or nothing)."""
    acc = acc or q.dtype
    s = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    T = s.shape[-1]
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), mask)
    m = {"row": s.amax(dim=-1, keepdim=True), "tensor": s.max(), "none": torch.zeros((), dtype=acc)}[shift]
    p = torch.exp(s - m)
    return (p / p.sum(dim=-1, keepdim=True)) @ v.to(acc)


def _no_max_half(q, k, v):
    return _causal_variant(q, k, v, shift="none")


def _in_half(q, k, v):
    return _causal_variant(q, k, v)                       # float16 scores, softmax and products


def _mask_minus_1e4(q, k, v):
    return _causal_variant(q, k, v, acc=torch.float64, mask=-1e4)


def _tensor_max(q, k, v):
    return _causal_variant(q, k, v, acc=torch.float64, shift="tensor")


def _causal_scores(q, k) -> torch.Tensor:
    """The scores each query sees, in float64; -inf for the future."""
    s = (q.to(f64) @ k.to(f64).transpose(-1, -2)) / math.sqrt(q.shape[-1])
    T = s.shape[-1]
    return s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))


def _near_mask_constant(q, k) -> bool:
    """Some head whose every visible score lies within 50 of -1e4."""
    s = _causal_scores(q, k)
    near = ((s + 1e4).abs() < 50) | torch.isinf(s)
    return bool(near.flatten(-2).all(-1).any())


def _attention_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    def c(label, q, k, v, hint=""):
        o, _ = softmax_attention_reference(q.to(f64), k.to(f64), v.to(f64), scale=q.shape[-1] ** -0.5,
                                           causal=True)
        return Case(label, (q, k, v), o, tol=5e-3 if q.dtype == torch.float16 else None, hint=hint)

    same_key = randn(1, 1, 1, 4).expand(1, 1, 6, 4).contiguous()
    big = randn(1, 2, 5, 8)
    big_q = (big / big.norm(dim=-1, keepdim=True) * 100.0 * 8 ** 0.25).to(torch.float16)
    # scores near 400 within about 10 of each other: q and k along one axis (length sqrt(400 sqrt(8))), plus noise
    axis = torch.zeros(8, dtype=f64)
    axis[0] = (400 * 8 ** 0.5) ** 0.5
    moderate_q, moderate_k = (axis + 0.15 * randn(1, 2, 6, 8)).half(), (axis + 0.15 * randn(1, 2, 6, 8)).half()
    # every visible score near -1e4 (q_0 = -141.5, k_0 = 141.5, D = 4: -10011 plus the noise's products)
    low_q, low_k = 2 * randn(1, 2, 6, 4), 2 * randn(1, 2, 6, 4)
    low_q[..., 0], low_k[..., 0] = -141.5, 141.5
    return [
        c("B = 2, H = 3, T = 7, D = 5, Dv = 4", randn(2, 3, 7, 5), randn(2, 3, 7, 5), randn(2, 3, 7, 4)),
        c("T = 1 (one query, one key)", randn(1, 2, 1, 3), randn(1, 2, 1, 3), randn(1, 2, 1, 3),
          hint="with one key the only query sees itself: its output is v_0"),
        c("T = 9, D = 1", randn(1, 1, 9, 1), randn(1, 1, 9, 1), randn(1, 1, 9, 2)),
        c("six copies of one key: each row averages its prefix of values", randn(1, 1, 6, 4), same_key,
          randn(1, 1, 6, 3)),
        c("float16 scores near 400, within about 10 of each other", moderate_q, moderate_k,
          randn(1, 2, 6, 3, dtype=torch.float16),
          hint="float16 scores near 400: exp(400) overflows unless each row's max is subtracted, and "
               "a float16 score is rounded to 0.25 (up to 13% of its weight): compute in float32"),
        c("float16, every visible score near -1e4", low_q.half(), low_k.half(),
          randn(1, 2, 6, 3, dtype=torch.float16),
          hint="the visible scores sit near -1e4, where a finite mask constant such as -1e4 gives the "
               "future keys as much weight as the past: hide them with -inf"),
        c("scores of 1e4 in float16", big_q, big_q.flip(-2).contiguous(), randn(1, 2, 5, 3, dtype=torch.float16),
          hint="scores of +/-1e4: exp overflows, and one max for the whole tensor underflows the rows far "
               "below it; compute in float32 and subtract each row's largest score"),
    ]


def _qk(c):
    return c.args[0], c.args[1]


CAUSAL_ATTENTION = Exercise(
    name="causal attention",
    chapter="1",
    title="Causal attention from its definition",
    statement=(
        "Softmax attention with a causal mask is one one-sided plan per query over the keys it may "
        "see: $o_i=\\sum_{j\\le i}P_{ij}v_j$ with $P_{ij}\\propto e^{q_i\\cdot k_j/\\sqrt D}$. Write it "
        "for tensors `[batch, heads, time, dim]` so that it holds for $T=1$, a single dimension, "
        "repeated keys, and float16 scores of a few hundred, near $-10^4$ and of $\\pm10^4$ (computed in "
        "float32, the float16 answers are checked to $5\\cdot10^{-3}$)."),
    solution=causal_attention,
    imports="import math\n\nimport torch",
    cases=_attention_cases,
    wrong=(Wrong(_strict, "itself included"), Wrong(_future, "future"),
           Wrong(_unscaled, "sqrt(d)"), Wrong(_scaled_by_dv, "not dv"), Wrong(_no_max_half, "overflow"),
           Wrong(_in_half, "in float32"), Wrong(_mask_minus_1e4, "with -inf"),
           Wrong(_tensor_max, "each row's largest score")),
    diagnose=((matches(_strict, 1e-4), "your mask hides the diagonal (j < i): query i sees keys j <= i, "
                                 "itself included"),
              (matches(_future, 1e-4), "your mask is the wrong way round: query i sees the past and itself "
                                 "(j <= i), never the future"),
              (matches(_unscaled, 1e-4), "the scores are scaled by 1 / sqrt(D), the key dimension"),
              (matches(_scaled_by_dv, 1e-4), "the scale is 1 / sqrt(D) with D the key dimension (q's and "
                                             "k's last), not Dv")),
    freedoms=(
        Freedom("B > 1 and H > 1", lambda c: c.args[0].shape[0] > 1 and c.args[0].shape[1] > 1),
        Freedom("D != Dv", lambda c: c.args[0].shape[-1] != c.args[2].shape[-1]),
        Freedom("T = 1", lambda c: c.args[0].shape[-2] == 1),
        Freedom("D = 1", lambda c: c.args[0].shape[-1] == 1),
        Freedom("repeated keys", lambda c: bool((c.args[1].diff(dim=-2) == 0).all(-1).any())),
        Freedom("float16 scores of a few hundred", lambda c: c.args[0].dtype == torch.float16
                and 100 < float(_causal_scores(*_qk(c)).nan_to_num(0.0, 0.0, 0.0).abs().max()) < 2000),
        Freedom("visible scores near -1e4, a finite mask constant", lambda c: _near_mask_constant(*_qk(c))),
        Freedom("rows whose largest scores are thousands apart (a per-row max needed)",
                lambda c: float(_causal_scores(*_qk(c)).amax(-1).max() - _causal_scores(*_qk(c)).amax(-1).min())
                > 1000),
    ),
)


# --- 4. the entropy's temperature derivative ------------------------------------------------------

def entropy_temperature_derivative(scores, eps):
    """``dH/d eps`` for each row of ``p = softmax(scores / eps)``,
    ``H = -sum_j p_j log p_j``: ``scores [..., N]`` (finite), ``eps > 0``;
    return ``[...]``. Use the closed form ``Var_p(s) / eps^3`` (no autograd)."""
    s = scores.to(torch.float64)
    p = torch.softmax(s / eps, dim=-1)
    mean = (p * s).sum(-1, keepdim=True)          # the row's mean score under p
    return (p * (s - mean) ** 2).sum(-1) / eps ** 3


def _entropy_variant(scores, eps, *, power=3, centre="p", weights="p", shift="row", sign=1.0, dim=-1):
    """The closed form with one thing changed: eps's power, the centre (the row's mean under p, 0, or
    the plain mean), the weights (p, or uniform), p's temperature, what is subtracted before exp
    (each row's max, the whole tensor's, or nothing), the sign, and the dim summed over."""
    s = scores.to(f64)
    z = s / eps if shift != "eps1" else s
    if shift == "tensor":
        z = z - z.max()
    elif shift in ("row", "eps1"):
        z = z - z.amax(dim=dim, keepdim=True)
    p = torch.exp(z)
    p = p / p.sum(dim=dim, keepdim=True)
    if weights == "uniform":
        p = torch.full_like(p, 1.0 / s.shape[dim])
    mean = {"p": (p * s).sum(dim, keepdim=True), "zero": torch.zeros((), dtype=f64),
            "plain": s.mean(dim, keepdim=True)}[centre]
    return sign * (p * (s - mean) ** 2).sum(dim) / eps ** power


def _entropy_eps_squared(scores, eps):
    return _entropy_variant(scores, eps, power=2)


def _entropy_uncentred(scores, eps):
    return _entropy_variant(scores, eps, centre="zero")


def _entropy_plain_variance(scores, eps):
    return _entropy_variant(scores, eps, weights="uniform", centre="plain")


def _entropy_p_at_eps_1(scores, eps):
    return _entropy_variant(scores, eps, shift="eps1")


def _entropy_negative(scores, eps):
    return _entropy_variant(scores, eps, sign=-1.0)


def _entropy_tensor_max(scores, eps):
    return _entropy_variant(scores, eps, shift="tensor")


def _entropy_dim_1(scores, eps):
    return _entropy_variant(scores, eps, dim=1)


def _entropy_derivative_autograd(scores, eps):
    """Autograd's derivative of each row's entropy in eps (the checker's reference): one eps per row, so
    that one backward pass gives every row's derivative."""
    rows = scores.to(f64).reshape(-1, scores.shape[-1])
    e = torch.full((rows.shape[0], 1), float(eps), dtype=f64, requires_grad=True)
    p = torch.softmax(rows / e, dim=-1)
    (grad,) = torch.autograd.grad(-torch.special.xlogy(p, p).sum(), e)
    return grad.reshape(scores.shape[:-1])


def _entropy_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    # tol 1e-5: the same formula in float32 is within 2e-6 (a cold row is sensitive); mistakes are O(1)
    def c(label, s, eps, hint="", tol=1e-5):
        return Case(label, (s, eps), _entropy_derivative_autograd(s, eps), tol=tol, hint=hint)

    offsets = torch.tensor([-20.0, 0.0, 20.0], dtype=f64)[:, None]
    return [
        c("3 x 6 random scores, eps = 0.7", randn(3, 6), 0.7),
        c("scores with a mean far from 0 (5 + N(0, 1)), eps = 1", 5 + randn(4, 5), 1.0,
          hint="every score of a row moved by 5 leaves p and the derivative unchanged: centre on the "
               "row's mean under p"),
        c("tied scores: the entropy is log N at every eps", torch.full((2, 5), -3.0, dtype=f64), 0.3),
        c("one key per row", randn(3, 1), 2.0),
        c("a cold row (eps = 0.05)", randn(2, 8), 0.05),
        c("one row, scores [7] (no leading dim): a 0-dim answer", randn(7), 0.5,
          hint="scores [N] with no leading dim: sum over the last dim (-1) and return a 0-dim tensor"),
        # tol 2e-4: float32 keeps s - mean to about 200 ulps of the offset here
        c("2 x 3 x 5, rows at offsets -20, 0 and 20, eps = 0.05", 0.1 * randn(2, 3, 5) + offsets, 0.05,
          tol=2e-4,
          hint="the rows sit 800 apart in s / eps: take each row's own softmax (subtract each row's "
               "max); one max for the whole tensor underflows the rows below it"),
    ]


ENTROPY_DERIVATIVE = Exercise(
    name="entropy and temperature",
    chapter="1",
    title="How a row's entropy moves with the temperature",
    statement=(
        "For $p^\\star=\\mathrm{softmax}(s/\\varepsilon)$ the entropy grows with the temperature: "
        "$\\partial H(p^\\star)/\\partial\\varepsilon=\\mathrm{Var}_{p^\\star}(s)/\\varepsilon^3\\ge0$ "
        "(the chapter's exercise 3). Compute the right-hand side per row, for scores with any number of "
        "leading dims (none included) and rows at very different offsets; the checker compares it "
        "with autograd's derivative of the entropy."),
    solution=entropy_temperature_derivative,
    cases=_entropy_cases,
    wrong=(Wrong(_entropy_eps_squared, "chain rule"), Wrong(_entropy_uncentred, "mean score"),
           Wrong(_entropy_plain_variance, "under p"), Wrong(_entropy_p_at_eps_1, "softmax(s / eps)"),
           Wrong(_entropy_negative, "grows with the temperature"),
           Wrong(_entropy_tensor_max, "each row's own softmax"), Wrong(_entropy_dim_1, "last dim")),
    diagnose=((matches(_entropy_eps_squared, 1e-4), "that is Var_p(s) / eps^2: differentiating s / eps in "
                                                    "eps brings another 1 / eps (the chain rule)"),
              (matches(_entropy_uncentred, 1e-4), "that is E_p[s^2] / eps^3: the variance is about the row's "
                                                  "mean score under p; subtract it"),
              (matches(_entropy_plain_variance, 1e-4), "that is the plain variance of the row's scores: the "
                                                       "variance is under p = softmax(s / eps), each score "
                                                       "weighted by p_j"),
              (matches(_entropy_p_at_eps_1, 1e-4), "your p is softmax(s), at eps = 1: the weights are "
                                                   "p = softmax(s / eps)"),
              (matches(_entropy_negative, 1e-4), "your derivative has the wrong sign: the entropy grows with "
                                                 "the temperature, dH/deps = +Var_p(s) / eps^3 >= 0")),
    freedoms=(
        Freedom("eps other than 1", lambda c: c.args[1] != 1.0),
        Freedom("rows whose mean is far from 0", lambda c: float(c.args[0].mean(-1).abs().max()) > 3),
        Freedom("scores with no leading dim", lambda c: c.args[0].dim() == 1),
        Freedom("scores with two leading dims", lambda c: c.args[0].dim() == 3),
        Freedom("rows at offsets far apart in s / eps (a per-row max needed)",
                lambda c: float(c.args[0].amax(-1).max() - c.args[0].amax(-1).min()) / c.args[1] > 750),
        Freedom("tied scores (variance 0)", lambda c: bool((c.args[0] == c.args[0][..., :1]).all(-1).any())
                and c.args[0].shape[-1] > 1),
        Freedom("one key per row", lambda c: c.args[0].shape[-1] == 1),
    ),
)


EXERCISES = (SOFTMAX_FROM_DUAL, SINKHORN, CAUSAL_ATTENTION, ENTROPY_DERIVATIVE)
