"""Chapter 1's exercises: softmax from the one-sided dual, Sinkhorn, causal attention from its
definition, and how a row's entropy moves with the temperature."""

from __future__ import annotations

import math

import torch

from .. import eot
from ..attention import softmax_attention_reference
from ._checker import Case, Exercise, Wrong, agree, matches

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
    # the largest score: no exp(x) with x > 0
    m = s.amax(dim=-1, keepdim=True)
    f = -eps * (m + torch.log(torch.exp(s - m).sum(dim=-1, keepdim=True)))
    return torch.exp(s + f / eps)


def _dual_no_max(scores, eps):
    s = scores.to(torch.float32 if scores.dtype == torch.float16 else scores.dtype) / eps
    lam = eps * torch.log(torch.exp(s).sum(dim=-1, keepdim=True))
    return torch.exp(s - lam / eps)


def _dual_columns(scores, eps):
    p = torch.exp((scores - scores.amax(dim=-2, keepdim=True)) / eps)
    return p / p.sum(dim=-2, keepdim=True)


def _dual_times_eps(scores, eps):
    s = scores.to(torch.float32) * eps
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return p / p.sum(dim=-1, keepdim=True)


def _plan(scores, eps):
    """The library's plan for cost ``-scores`` (masked entries, ``-inf``, get no mass)."""
    s = scores.to(f64)
    finite = torch.isfinite(s)
    if finite.all():
        return eot.gibbs_plan(-s, eps)
    return torch.softmax(s / eps, dim=-1).masked_fill(~finite, 0.0)


def _softmax_cases(gen):
    def randn(*shape, dtype=f64):
        return torch.randn(*shape, generator=gen, dtype=f64).to(dtype)

    causal = randn(5, 5).masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    huge = (randn(3, 6) * 1e4).clamp(-6e4, 6e4).to(torch.float16)
    cold = randn(4, 9, dtype=torch.float32)
    return [
        _c("4 x 7 random scores, eps = 1", randn(4, 7), 1.0),
        _c("2 x 3 x 5 random scores, eps = 0.25", randn(2, 3, 5), 0.25,
           hint="the temperature divides the scores: s / eps, not s * eps"),
        _c("one key per row (3 x 1)", randn(3, 1), 1.0),
        _c("one query (1 x 6)", randn(1, 6), 0.5),
        _c("tied scores (4 x 5, all equal)", torch.full((4, 5), 2.5, dtype=f64), 1.0,
           hint="equal scores must get equal mass, 1 / Nk each"),
        _c("a causal mask (-inf above the diagonal, 5 x 5)", causal, 1.0,
           hint="a key with score -inf gets exp(-inf) = 0; the first row has one key, with all the mass"),
        _c("eps = 1e-3 in float32 (scores / eps about 1000)", cold, 1e-3,
           hint="exp overflows: subtract each row's largest score before exp (the plan is unchanged)"),
        _c("logits of 1e4 in float16 (3 x 6)", huge, 1.0,
           hint="exp overflows: subtract each row's largest score before exp, and compute in float32"),
    ]


def _c(label, scores, eps, hint=""):
    return Case(label, (scores, eps), _plan(scores, eps), hint=hint)


def _rows_are_columns(got, expected, case) -> bool:
    g = torch.as_tensor(got, dtype=f64)
    return g.shape[-2] > 1 and agree(g.sum(dim=-2), torch.ones_like(g.sum(dim=-2)), 1e-6)


SOFTMAX_FROM_DUAL = Exercise(
    name="softmax from the dual",
    chapter="1",
    title="Softmax from the dual potential",
    statement=(
        "The one-sided problem with cost $C=-s$ splits into one problem per query row, whose optimal "
        "value is the row's dual potential $f_i=-\\varepsilon\\log\\sum_j e^{s_{ij}/\\varepsilon}$; "
        "the optimal plan is $P_{ij}=e^{(f_i-C_{ij})/\\varepsilon}=e^{(s_{ij}+f_i)/\\varepsilon}$. "
        "Write that plan from the potential, without "
        "`torch.softmax` or `torch.logsumexp`, so that it survives masked keys ($s_{ij}=-\\infty$), one "
        "key, ties, a cold temperature and logits of $10^4$ in float16."),
    solution=softmax_from_dual,
    cases=_softmax_cases,
    wrong=(Wrong(_dual_no_max, "subtract each row's largest score"),
           Wrong(_dual_columns, "normalise over the keys"),
           Wrong(_dual_times_eps, "divides the scores")),
    diagnose=((_rows_are_columns, "your columns sum to 1: each query's row sums to one, so normalise "
                                  "over the keys (the last dim)"),),
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
    K = torch.exp(-C / eps)
    u, w = torch.ones_like(a), torch.ones_like(b)
    for _ in range(5000):
        u = a / (K @ w)
        w = b / (K.T @ u)
    return u[:, None] * K * w[None, :]


def _sinkhorn_cases(gen):
    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=f64)

    def marg(n, total):
        m = rand(n) + 0.2
        return m / m.sum() * total

    def c(label, C, eps, a, b, hint="", tol=1e-6):
        return Case(label, (C, eps, a, b), eot.sinkhorn(C, eps, a, b, tol=1e-12), tol=tol, hint=hint)

    C1, C2, C3 = rand(4, 4), rand(3, 6), rand(5, 5)
    pts = torch.linspace(0, 1, 6, dtype=f64)
    return [
        c("4 x 4 costs in [0, 1], eps = 0.5, uniform marginals", C1, 0.5, torch.ones(4, dtype=f64),
          torch.ones(4, dtype=f64),
          hint="both marginals must hold: alternate the row and column updates until they do"),
        c("3 x 6, eps = 0.2, random marginals", C2, 0.2, marg(3, 1.0), marg(6, 1.0)),
        c("one source (1 x 5): the plan is b itself", rand(1, 5), 0.3, torch.ones(1, dtype=f64),
          marg(5, 1.0)),
        c("squared distances of 6 points on a line, eps = 1e-3", (pts[:, None] - pts[None, :]) ** 2,
          1e-3, torch.ones(6, dtype=f64), torch.ones(6, dtype=f64)),
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
        "$P^\\top\\mathbf 1=b$. Sinkhorn alternates the two potentials' closed-form updates; written "
        "in the log domain it survives a small $\\varepsilon$. Return the plan for costs in $[0,1]$, "
        "for one source, for points on a line at $\\varepsilon=10^{-3}$ and for costs of 100."),
    solution=sinkhorn_plan,
    cases=_sinkhorn_cases,
    wrong=(Wrong(_sinkhorn_rows_only, "alternate the row and column"),
           Wrong(_sinkhorn_plain, "underflows")),
    diagnose=((_columns_miss, "your rows sum to a but your columns miss b: that is one-sided attention "
                              "(a half-step); alternate the row and column updates"),),
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


def _no_max_half(q, k, v):
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    T = s.shape[-1]
    p = torch.exp(s).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), 0.0)
    return (p / p.sum(dim=-1, keepdim=True)) @ v


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
    return [
        c("B = 2, H = 3, T = 7, D = 5, Dv = 4", randn(2, 3, 7, 5), randn(2, 3, 7, 5), randn(2, 3, 7, 4),
          hint="query i sees keys j <= i, itself included: keep the lower triangle, diagonal too"),
        c("T = 1 (one query, one key)", randn(1, 2, 1, 3), randn(1, 2, 1, 3), randn(1, 2, 1, 3),
          hint="with one key the only query sees itself: its output is v_0"),
        c("T = 9, D = 1", randn(1, 1, 9, 1), randn(1, 1, 9, 1), randn(1, 1, 9, 2)),
        c("six copies of one key: each row averages its prefix of values", randn(1, 1, 6, 4), same_key,
          randn(1, 1, 6, 3)),
        c("scores of 1e4 in float16", big_q, big_q.flip(-2).contiguous(), randn(1, 2, 5, 3, dtype=torch.float16),
          hint="exp(1e4) overflows: compute in float32 and subtract each row's largest score"),
    ]



CAUSAL_ATTENTION = Exercise(
    name="causal attention",
    chapter="1",
    title="Causal attention from its definition",
    statement=(
        "Softmax attention with a causal mask is one one-sided plan per query over the keys it may "
        "see: $o_i=\\sum_{j\\le i}P_{ij}v_j$ with $P_{ij}\\propto e^{q_i\\cdot k_j/\\sqrt D}$. Write it "
        "for tensors `[batch, heads, time, dim]` so that it holds for $T=1$, a single dimension, "
        "repeated keys and float16 scores of $10^4$."),
    solution=causal_attention,
    imports="import math\n\nimport torch",
    cases=_attention_cases,
    wrong=(Wrong(_strict, "itself included"), Wrong(_future, "future"),
           Wrong(_unscaled, "sqrt(d)"), Wrong(_no_max_half, "overflow")),
    diagnose=((matches(_strict, 1e-4), "your mask hides the diagonal (j < i): query i sees keys j <= i, "
                                 "itself included"),
              (matches(_future, 1e-4), "your mask is the wrong way round: query i sees the past and itself "
                                 "(j <= i), never the future"),
              (matches(_unscaled, 1e-4), "the scores are scaled by 1 / sqrt(D), the key dimension")),
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


def _entropy_eps_squared(scores, eps):
    return entropy_temperature_derivative(scores, eps) * eps


def _entropy_uncentred(scores, eps):
    s = scores.to(f64)
    p = torch.softmax(s / eps, dim=-1)
    return (p * s ** 2).sum(-1) / eps ** 3


def _entropy_derivative_autograd(scores, eps):
    """Autograd's derivative of each row's entropy in eps (the checker's reference)."""
    rows = scores.to(f64).reshape(-1, scores.shape[-1])
    out = []
    for row in rows:
        e = torch.tensor(float(eps), dtype=f64, requires_grad=True)
        p = torch.softmax(row / e, dim=-1)
        (grad,) = torch.autograd.grad(-torch.special.xlogy(p, p).sum(), e)
        out.append(grad)
    return torch.stack(out).reshape(scores.shape[:-1])


def _entropy_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    # tol 1e-5: the same formula in float32 is within 2e-6 (a cold row is sensitive); mistakes are O(1)
    def c(label, s, eps, hint=""):
        return Case(label, (s, eps), _entropy_derivative_autograd(s, eps), tol=1e-5, hint=hint)

    return [
        c("3 x 6 random scores, eps = 0.7", randn(3, 6), 0.7),
        c("scores with a mean far from 0 (5 + N(0, 1)), eps = 1", 5 + randn(4, 5), 1.0,
          hint="the variance is about the row's mean score under p: subtract it"),
        c("tied scores: the entropy is log N at every eps", torch.full((2, 5), -3.0, dtype=f64), 0.3),
        c("one key per row", randn(3, 1), 2.0),
        c("a cold row (eps = 0.05)", randn(2, 8), 0.05),
    ]


ENTROPY_DERIVATIVE = Exercise(
    name="entropy and temperature",
    chapter="1",
    title="How a row's entropy moves with the temperature",
    statement=(
        "For $p^\\star=\\mathrm{softmax}(s/\\varepsilon)$ the entropy grows with the temperature: "
        "$\\partial H(p^\\star)/\\partial\\varepsilon=\\mathrm{Var}_{p^\\star}(s)/\\varepsilon^3\\ge0$ "
        "(the chapter's exercise 3). Compute the right-hand side per row; the checker compares it "
        "with autograd's derivative of the entropy."),
    solution=entropy_temperature_derivative,
    cases=_entropy_cases,
    wrong=(Wrong(_entropy_eps_squared, "chain rule"), Wrong(_entropy_uncentred, "mean score")),
    diagnose=((matches(_entropy_eps_squared, 1e-4), "that is Var_p(s) / eps^2: differentiating s / eps in eps "
                                              "brings another 1 / eps (the chain rule)"),
              (matches(_entropy_uncentred, 1e-4), "that is E_p[s^2] / eps^3: the variance is about the row's "
                                            "mean score under p; subtract it")),
)


EXERCISES = (SOFTMAX_FROM_DUAL, SINKHORN, CAUSAL_ATTENTION, ENTROPY_DERIVATIVE)
