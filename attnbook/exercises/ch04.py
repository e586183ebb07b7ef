"""Chapter 4's exercises: the (gated) delta rule token by token, the UT transform of a chunk, the
chunkwise algorithm built from it, and the WY form of a chunk's product of transitions."""

from __future__ import annotations

import torch

from attnlib.deltanet import delta_rule_recurrent_reference
from attnlib.deltanet import ut_transform as _library_ut_transform

from ._checker import Case, Exercise, Freedom, Wrong, matches

f64 = torch.float64
_TOL = 1e-5      # relative RMS: an answer computed in float32 from the float64 inputs passes (cancellation
#                  in v - S k on a small case costs it a few digits); every mistake below is off by > 1e-2



def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=f64)


def _unit(x):
    return x / x.norm(dim=-1, keepdim=True)


# --- 1. the (gated) delta rule, token by token ----------------------------------------------------

def delta_rule_recurrent(q, k, v, beta, g, initial_state):
    """Gated DeltaNet by its definition: ``q, k [B, H, T, D]``,
    ``v [B, H, T, Dv]``, ``beta, g [B, H, T]`` (``g`` the log-decay, 0 = no
    gate), ``initial_state`` ``S_0 [B, H, Dv, D]``. Per token:
    ``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``,
    ``o_t = S_t q_t``. Return ``(o [B, H, T, Dv], S_T [B, H, Dv, D])``; leave
    ``initial_state`` unchanged."""
    S = initial_state.clone()
    outs = []
    for t in range(q.shape[-2]):
        k_t, v_t, q_t = k[..., t, :], v[..., t, :], q[..., t, :]
        # forget first: alpha_t S_{t-1}
        S = torch.exp(g[..., t])[..., None, None] * S
        # target minus what k_t retrieves now
        err = v_t - (S @ k_t[..., None])[..., 0]
        # one SGD step: + beta err k^T
        S = S + (beta[..., t, None] * err)[..., :, None] * k_t[..., None, :]
        outs.append((S @ q_t[..., None])[..., 0])      # read after the write
    return torch.stack(outs, dim=-2), S


def _recurrent_variant(q, k, v, beta, g, initial_state, *, sign=1.0, beta_power=1, decay="before",
                       alpha=None, from_zeros=False, normalise=False, in_place=False, read_first=False):
    """The loop with one thing changed: the error's sign, beta's power, where (or whether) the decay
    is applied, what multiplies the state (``alpha(g_t)``), the initial state ignored, the keys
    normalised, the caller's state updated in place, or o_t read before the write."""
    S = torch.zeros_like(initial_state) if from_zeros else initial_state if in_place else initial_state.clone()
    k = _unit(k) if normalise else k
    outs = []
    for t in range(q.shape[-2]):
        k_t, v_t, q_t = k[..., t, :], v[..., t, :], q[..., t, :]
        a_t = (torch.exp(g[..., t]) if alpha is None else alpha(g[..., t]))[..., None, None]
        if decay == "before" and in_place:
            S.mul_(a_t)
        elif decay == "before":
            S = a_t * S
        if read_first:
            outs.append((S @ q_t[..., None])[..., 0])
        err = sign * (v_t - (S @ k_t[..., None])[..., 0])
        write = (beta[..., t, None] ** beta_power * err)[..., :, None] * k_t[..., None, :]
        if in_place:
            S += write
        else:
            S = S + write
        if decay == "after":
            S = a_t * S
        if not read_first:
            outs.append((S @ q_t[..., None])[..., 0])
    return torch.stack(outs, dim=-2), S


def _delta_wrong_sign(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, sign=-1.0)


def _delta_beta_twice(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, beta_power=2)


def _delta_decay_after(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, decay="after")


def _delta_g_as_alpha(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, alpha=lambda gt: 1.0 + gt)


def _delta_from_zeros(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, from_zeros=True)


def _delta_unit_keys(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, normalise=True)


def _delta_in_place(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, in_place=True)


def _delta_read_first(q, k, v, beta, g, initial_state):
    return _recurrent_variant(q, k, v, beta, g, initial_state, read_first=True)


def _delta_outer_transposed(q, k, v, beta, g, initial_state):
    S = initial_state.clone()
    outs = []
    for t in range(q.shape[-2]):
        k_t, v_t = k[..., t, :], v[..., t, :]
        S = torch.exp(g[..., t])[..., None, None] * S
        err = v_t - (S @ k_t[..., None])[..., 0]
        # k err^T: [D, Dv]
        S = S + k_t[..., :, None] * (beta[..., t, None] * err)[..., None, :]
        outs.append((S @ q[..., t, :, None])[..., 0])
    return torch.stack(outs, dim=-2), S


def _delta_cases(gen):
    def c(label, q, k, v, beta, g, initial_state, hint=""):
        o, S = delta_rule_recurrent_reference(q, k, v, beta, g, scale=1.0, initial_state=initial_state)
        return Case(label, (q, k, v, beta, g, initial_state), (o, S), tol=_TOL, hint=hint)

    def rbeta(*shape):
        return 2 * torch.rand(*shape, generator=gen, dtype=f64)

    B, H, T, D, Dv = 1, 2, 7, 5, 3
    q, k, v = _randn(gen, B, H, T, D), _unit(_randn(gen, B, H, T, D)), _randn(gen, B, H, T, Dv)
    beta = rbeta(B, H, T)
    S0 = _randn(gen, B, H, Dv, D)
    zero_g = torch.zeros(B, H, T, dtype=f64)

    key = _unit(_randn(gen, 1, 1, 1, 4))
    twice_k = key.expand(1, 1, 2, 4).contiguous()                   # the same key written twice
    big = 3.0 * _unit(_randn(gen, 1, 1, 6, 4))                       # keys of norm 3
    small = (_randn(gen, 1, 1, 6, 4), _randn(gen, 1, 1, 6, 2))
    return [
        c("B = 2, H = 2, T = 6, D = Dv = 4, a gate g in [-1, 0], a non-symmetric S0", _randn(gen, 2, 2, 6, 4),
          _unit(_randn(gen, 2, 2, 6, 4)), _randn(gen, 2, 2, 6, 4), rbeta(2, 2, 6),
          -torch.rand(2, 2, 6, generator=gen, dtype=f64), _randn(gen, 2, 2, 4, 4)),
        c("T = 7, D = 5, Dv = 3, no gate (g = 0), random S0", q, k, v, beta, zero_g, S0),
        c("beta = 0: the state stays S0, o_t = S0 q_t", q, k, v, torch.zeros_like(beta), zero_g, S0,
          hint="with beta = 0 the step is the identity: nothing is written"),
        c("one unit key written twice, beta = 1: S k = v_new", twice_k, twice_k, _randn(gen, 1, 1, 2, 3),
          torch.ones(1, 1, 2, dtype=f64), torch.zeros(1, 1, 2, dtype=f64), torch.zeros(1, 1, 3, 4, dtype=f64),
          hint="subtract what the key already retrieves (S_{t-1} k_t) before writing: without it the "
               "second read returns v_old + v_new, as linear attention does"),
        c("keys of norm 3, beta = 2 / ||k||^2: each step reflects", _randn(gen, 1, 1, 6, 4), big,
          _randn(gen, 1, 1, 6, 3), torch.full((1, 1, 6), 2.0 / 9.0, dtype=f64),
          torch.zeros(1, 1, 6, dtype=f64), _randn(gen, 1, 1, 3, 4),
          hint="use the keys as given (do not normalise them): the transition I - beta k k^T depends on "
               "beta ||k||^2"),
        c("T = 1, D = 1, Dv = 1", _randn(gen, 1, 1, 1, 1), _randn(gen, 1, 1, 1, 1), _randn(gen, 1, 1, 1, 1),
          torch.full((1, 1, 1), 0.7, dtype=f64), torch.full((1, 1, 1), -0.3, dtype=f64),
          _randn(gen, 1, 1, 1, 1)),
        c("g = -1e4 (alpha = 0), random S0: each step forgets, then writes", small[0],
          _unit(_randn(gen, 1, 1, 6, 4)), small[1], torch.rand(1, 1, 6, generator=gen, dtype=f64) + 0.5,
          torch.full((1, 1, 6), -1e4, dtype=f64), _randn(gen, 1, 1, 2, 4),
          hint="the decay comes before the write: with alpha = 0 the state after step t is "
               "beta_t v_t k_t^T, so o_t = beta_t (k_t . q_t) v_t"),
    ]


# What the inputs of a case are, for the freedoms (q, k, v, beta, g, then the state).
def _shape(case):
    B, H, T, D = case.args[0].shape
    return B, H, T, D, case.args[2].shape[-1]


def _batched(case):
    B, H, *_ = _shape(case)
    return B > 1 and H > 1


def _not_unit(k) -> bool:
    return not torch.allclose(k.norm(dim=-1), torch.ones((), dtype=k.dtype))


def _asymmetric_state(case) -> bool:
    S0, (*_, D, Dv) = case.args[5], _shape(case)
    return D == Dv and D > 1 and not torch.allclose(S0, S0.transpose(-1, -2))


def _gate_varies(case) -> bool:
    g = case.args[4]
    return bool((g < 0).all() and (g != g[..., :1]).any())


def _key_twice(case) -> bool:
    k = case.args[1]
    return k.shape[-2] > 1 and bool((k[..., 1:, :] == k[..., :-1, :]).all(-1).any())


DELTA_RULE = Exercise(
    name="delta rule",
    chapter="4",
    title="The (gated) delta rule, token by token",
    statement=(
        "Each token takes one gradient step of size $\\beta_t$ on $\\tfrac12\\|Sk_t-v_t\\|^2$, after the "
        "decay $\\alpha_t=e^{g_t}$: $S_t=\\alpha_tS_{t-1}(I-\\beta_tk_tk_t^\\top)+\\beta_tv_tk_t^\\top$ and "
        "$o_t=S_tq_t$, with the state $S_t\\in\\mathbb R^{D_v\\times D}$ starting from $S_0$ (left "
        "unchanged: return a new state). Write the loop so that it survives $D\\ne D_v$, a gate that "
        "differs per token and head, $\\beta=0$, a key written twice (the second value must replace the "
        "first), keys of norm 3 with $\\beta=2/\\|k\\|^2$ (a reflection per step), $T=D=1$ and "
        "$\\alpha=0$."),
    solution=delta_rule_recurrent,
    cases=_delta_cases,
    wrong=(Wrong(_delta_wrong_sign, "wrong sign"), Wrong(_delta_beta_twice, "beta twice"),
           Wrong(_delta_decay_after, "before the delta step"), Wrong(_delta_g_as_alpha, "exp(g"),
           Wrong(_delta_outer_transposed, "the state is [dv, d]"), Wrong(_delta_from_zeros, "start from s0"),
           Wrong(_delta_unit_keys, "as given"), Wrong(_delta_read_first, "after this token's write"),
           Wrong(_delta_in_place, "changed its input `initial_state` in place")),
    diagnose=((matches(_delta_wrong_sign, 1e-4), "your update has the wrong sign: the gradient step adds "
                                                 "beta (v_t - S k_t) k_t^T, target minus prediction"),
              (matches(_delta_beta_twice, 1e-4), "that is beta^2 (v - S k) k^T: you applied beta twice (once "
                                                 "in the error, once in the write); it scales the step once"),
              (matches(_delta_decay_after, 1e-4), "you decay the new state, after the write: alpha_t "
                                                  "multiplies S_{t-1}, before the delta step"),
              (matches(_delta_g_as_alpha, 1e-4), "g is the log of the decay: multiply the state by "
                                                 "exp(g_t), not by g_t or 1 + g_t"),
              (matches(_delta_outer_transposed, 1e-4), "the state is [Dv, D]: S k_t is a value, and the "
                                                       "write is beta_t (v_t - S k_t) k_t^T, not k_t "
                                                       "(...)^T"),
              (matches(_delta_from_zeros, 1e-4), "that is the answer from zeros: start from S0, the "
                                                 "initial state given"),
              (matches(_delta_unit_keys, 1e-4), "use the keys as given (do not normalise them): the "
                                                "transition I - beta k k^T depends on beta ||k||^2"),
              (matches(_delta_read_first, 1e-4), "your o_t is read before this token's write: "
                                                 "o_t = S_t q_t, read after this token's write")),
    freedoms=(Freedom("B, H > 1", _batched),
              Freedom("D ≠ Dv", lambda c: _shape(c)[3] != _shape(c)[4]),
              Freedom("a non-symmetric S0 with D = Dv", _asymmetric_state),
              Freedom("a gate that differs per token (g < 0)", _gate_varies),
              Freedom("no gate (g = 0)", lambda c: bool((c.args[4] == 0).all())),
              Freedom("beta = 0", lambda c: bool((c.args[3] == 0).all())),
              Freedom("beta > 1", lambda c: bool((c.args[3] > 1).any())),
              Freedom("a key written twice", _key_twice),
              Freedom("keys of other than unit norm", lambda c: _not_unit(c.args[1])),
              Freedom("T = D = Dv = 1", lambda c: _shape(c)[2:] == (1, 1, 1)),
              Freedom("alpha = 0 (g = -1e4)", lambda c: bool((c.args[4] <= -1e3).all()))),
    fresh_output=True,
)


# --- 2. the UT transform of a chunk ---------------------------------------------------------------

def ut_transform(k, beta, g):
    """One chunk's UT transform: ``k [..., L, D]``, ``beta, g [..., L]``
    (``g <= 0``, log-decays). With ``G = cumsum(g)`` and
    ``Gamma_tj = exp(G_t - G_j)`` for ``j <= t``, return ``[..., L, L]``:
    ``T = (I + tril(diag(beta) (K K^T . Gamma), -1))^{-1} diag(beta)``, by a
    triangular solve."""
    L = k.shape[-2]
    G = g.cumsum(-1)
    above = torch.ones(L, L, dtype=torch.bool).triu(1)
    # gamma_t / gamma_j from a difference of logs: a ratio of two exp(G) would
    # be 0 / 0 for a strong gate
    Gamma = torch.exp((G[..., :, None] - G[..., None, :])
                      .masked_fill(above, float("-inf")))
    # row t times beta_t
    A = torch.tril(beta[..., :, None] * (k @ k.transpose(-1, -2)) * Gamma,
                   diagonal=-1)
    eye = torch.eye(L, dtype=k.dtype)
    # I + A is unit lower-triangular: forward substitution, no general inverse
    return torch.linalg.solve_triangular(eye + A, torch.diag_embed(beta),
                                         upper=False, unitriangular=True)


def _ut_variant(k, beta, g, *, diagonal=-1, beta_side="rows", ratio=False, right=True, gated=True,
                normalise=False, matrix_only=False):
    """The transform with one thing changed: the triangle's diagonal kept, beta on the columns, Gamma as a
    ratio of products, no diag(beta) on the right, the gate ignored, the keys normalised, or ``k.t()``
    (a single chunk's transpose, which refuses a batch)."""
    L = k.shape[-2]
    k = k / k.norm(dim=-1, keepdim=True) if normalise else k
    G = g.cumsum(-1) if gated else torch.zeros_like(g)
    lower = torch.ones(L, L, dtype=torch.bool).tril()
    if ratio:
        gam = torch.exp(G)
        Gamma = (gam[..., :, None] / gam[..., None, :]).masked_fill(~lower, 0.0)
    else:
        Gamma = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")))
    KK = (k @ (k.t() if matrix_only else k.transpose(-1, -2))) * Gamma
    KK = beta[..., :, None] * KK if beta_side == "rows" else KK * beta[..., None, :]
    A = torch.tril(KK, diagonal=diagonal)
    M = torch.eye(L, dtype=k.dtype) + A
    rhs = torch.diag_embed(beta) if right else torch.eye(L, dtype=k.dtype).expand_as(M)
    return torch.linalg.solve(M, rhs)


def _ut_with_diagonal(k, beta, g):
    return _ut_variant(k, beta, g, diagonal=0)


def _ut_beta_columns(k, beta, g):
    return _ut_variant(k, beta, g, beta_side="columns")


def _ut_gamma_ratio(k, beta, g):
    return _ut_variant(k, beta, g, ratio=True)


def _ut_no_diag_beta(k, beta, g):
    return _ut_variant(k, beta, g, right=False)


def _ut_no_gate(k, beta, g):
    return _ut_variant(k, beta, g, gated=False)


def _ut_unit_keys(k, beta, g):
    return _ut_variant(k, beta, g, normalise=True)


def _ut_one_chunk_only(k, beta, g):
    return _ut_variant(k, beta, g, matrix_only=True)


def _ut_cases(gen):
    def c(label, k, beta, g, hint=""):
        return Case(label, (k, beta, g), _library_ut_transform(k, beta, g)[0], tol=_TOL, hint=hint)

    def rbeta(*shape):
        return 2 * torch.rand(*shape, generator=gen, dtype=f64)

    ortho = torch.linalg.qr(_randn(gen, 4, 4))[0].T.contiguous()     # rows: orthonormal keys
    key = _unit(_randn(gen, 1, 5))
    alternate = rbeta(6)
    alternate[1::2] = 0.0
    return [
        c("a chunk of L = 6 unit keys, D = 4, no gate (g = 0)", _unit(_randn(gen, 6, 4)), rbeta(6),
          torch.zeros(6, dtype=f64)),
        c("a [2, 3] batch of chunks, L = 5, D = 3, keys not unit, no gate", _randn(gen, 2, 3, 5, 3),
          rbeta(2, 3, 5), torch.zeros(2, 3, 5, dtype=f64)),
        c("a gate g in [-1, 0], L = 5 unit keys, D = 4", _unit(_randn(gen, 5, 4)), rbeta(5),
          -torch.rand(5, generator=gen, dtype=f64),
          hint="the gate enters as Gamma_tj = exp(G_t - G_j), G the cumulative sum of g, for j <= t: it "
               "multiplies K K^T entrywise"),
        c("a chunk of one token: T = [[beta]]", _randn(gen, 1, 3), rbeta(1), torch.zeros(1, dtype=f64),
          hint="with one token the strict triangle is empty: T = [[beta]]"),
        c("orthonormal keys: T = diag(beta)", ortho, rbeta(4), -torch.rand(4, generator=gen, dtype=f64),
          hint="orthogonal keys never interact: the triangle is 0, so T = diag(beta)"),
        c("parallel keys: one unit key five times", key.expand(5, 5).contiguous(), rbeta(5),
          torch.zeros(5, dtype=f64),
          hint="with equal keys every k_t . k_j = 1: the entry (t, j < t) of the triangle is beta_t"),
        c("beta = 0 on every other token", _unit(_randn(gen, 6, 4)), alternate, torch.zeros(6, dtype=f64)),
        c("g = -1e4 (alpha = 0): the keys no longer interact", _unit(_randn(gen, 5, 4)), rbeta(5),
          torch.full((5,), -1e4, dtype=f64),
          hint="form gamma_t / gamma_j as exp(G_t - G_j), a difference of the cumulative log-decays: "
               "exp(G) underflows to 0 and the ratio is 0 / 0"),
    ]


UT_TRANSFORM = Exercise(
    name="ut transform",
    chapter="4",
    title="The UT transform of a chunk",
    statement=(
        "The pseudo-values of a chunk solve a unit lower-triangular system, and the UT transform "
        "$\\mathcal T=\\bigl(I+\\operatorname{tril}(\\operatorname{diag}(\\beta)(KK^\\top\\odot\\Gamma),-1)"
        "\\bigr)^{-1}\\operatorname{diag}(\\beta)$ is its solution operator, with "
        "$\\Gamma_{tj}=\\gamma_t/\\gamma_j=e^{G_t-G_j}$ ($j\\le t$, $G$ the cumulative sum of the "
        "log-decays $g$) the decay between two tokens of the chunk. Compute "
        "$\\mathcal T$ by one triangular solve for one chunk of $L$ tokens or a batch of them, with keys "
        "as given (not necessarily of unit norm), for one token, orthonormal keys, parallel keys, "
        "$\\beta=0$ on some tokens, a gate and a gate that closes completely ($g=-10^4$)."),
    solution=ut_transform,
    cases=_ut_cases,
    wrong=(Wrong(_ut_with_diagonal, "strict"), Wrong(_ut_beta_columns, "rows"),
           Wrong(_ut_gamma_ratio, "difference of the cumulative"), Wrong(_ut_no_diag_beta, "on the right"),
           Wrong(_ut_no_gate, "multiplies k k^t entrywise"), Wrong(_ut_unit_keys, "as given"),
           Wrong(_ut_one_chunk_only, "t() expects")),
    diagnose=((matches(_ut_with_diagonal, 1e-4), "your triangle includes the diagonal: I + tril(., -1) is "
                                                 "strictly lower, with ones on its diagonal"),
              (matches(_ut_beta_columns, 1e-4), "diag(beta) multiplies K K^T from the left: it scales the "
                                                "rows (row t by beta_t), not the columns"),
              (matches(_ut_no_diag_beta, 1e-4), "that is the inverse alone: multiply it by diag(beta) on "
                                                "the right"),
              (matches(_ut_unit_keys, 1e-4), "use the keys as given (do not normalise them): K K^T holds "
                                             "their norms")),
    freedoms=(Freedom("a batch of chunks (leading dimensions)", lambda c: c.args[0].dim() > 2),
              Freedom("one chunk (no leading dimension)", lambda c: c.args[0].dim() == 2),
              Freedom("L = 1", lambda c: c.args[0].shape[-2] == 1),
              Freedom("L > D", lambda c: c.args[0].shape[-2] > c.args[0].shape[-1]),
              Freedom("keys of other than unit norm", lambda c: _not_unit(c.args[0])),
              Freedom("a gate (g < 0)", lambda c: bool(((c.args[2] < 0) & (c.args[2] > -100)).all())),
              Freedom("beta = 0 on some tokens", lambda c: bool((c.args[1] == 0).any())),
              Freedom("alpha = 0 (g = -1e4)", lambda c: bool((c.args[2] <= -1e3).all()))),
)


# --- 3. the chunkwise algorithm -------------------------------------------------------------------

def delta_rule_chunkwise(q, k, v, beta, g, initial_state, chunk_size):
    """Gated DeltaNet by chunks of ``L = chunk_size`` tokens (the last may be
    shorter), with ``q, k [B, H, T, D]``, ``v [B, H, T, Dv]``,
    ``beta, g [B, H, T]``, ``initial_state`` ``S_0 [B, H, Dv, D]``: per chunk
    one UT transform and matrix products (no loop over tokens), the state
    carried across. Return ``(o [B, H, T, Dv], S_T [B, H, Dv, D])``."""
    S = initial_state.clone()
    outs = []
    for s in range(0, q.shape[-2], chunk_size):
        chunk = slice(s, s + chunk_size)
        Q, K, V = q[..., chunk, :], k[..., chunk, :], v[..., chunk, :]
        # G_t = log gamma_t
        b, G = beta[..., s:s + chunk_size], g[..., s:s + chunk_size].cumsum(-1)
        L = K.shape[-2]
        above = torch.ones(L, L, dtype=torch.bool).triu(1)
        # Gamma * M: gamma_t / gamma_j on and below the diagonal, 0 above it
        Gamma = torch.exp((G[..., :, None] - G[..., None, :])
                          .masked_fill(above, float("-inf")))
        A = torch.tril(b[..., :, None] * (K @ K.transpose(-1, -2)) * Gamma,
                       diagonal=-1)
        Tm = torch.linalg.solve_triangular(torch.eye(L, dtype=q.dtype) + A,
                                           torch.diag_embed(b),
                                           upper=False, unitriangular=True)
        gamma = torch.exp(G)[..., None]
        St = S.transpose(-1, -2)                           # S0^T: [D, Dv]
        # the pseudo-values U' = T (V - diag(gamma) K S0^T)
        U = Tm @ (V - gamma * (K @ St))
        outs.append(gamma * (Q @ St) + ((Q @ K.transpose(-1, -2)) * Gamma) @ U)
        to_end = torch.exp(G[..., -1:] - G)[..., None]     # gamma_L / gamma_j
        S = (torch.exp(G[..., -1])[..., None, None] * S
             + U.transpose(-1, -2) @ (to_end * K))
    return torch.cat(outs, dim=-2), S


def _chunk_variant(q, k, v, beta, g, initial_state, chunk_size, *, subtract_state=True, decay_state=True,
                   drop_tail=False, ratio=False, normalise=False, in_place=False):
    """The chunk loop with one thing changed: the incoming state left out of the pseudo-values or not
    decayed across the chunk, the last, shorter chunk dropped, the decays as ratios of products, the keys
    normalised, or the caller's state updated in place."""
    S = initial_state if in_place else initial_state.clone()
    k = _unit(k) if normalise else k
    outs = []
    T, L = q.shape[-2], chunk_size
    for s in range(0, T - T % L if drop_tail else T, L):
        Q, K, V = q[..., s:s + L, :], k[..., s:s + L, :], v[..., s:s + L, :]
        b, G = beta[..., s:s + L], g[..., s:s + L].cumsum(-1)
        n = K.shape[-2]
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        if ratio:
            e = torch.exp(G)
            Gamma = (e[..., :, None] / e[..., None, :]).masked_fill(~lower, 0.0)
            to_end = (e[..., -1:] / e)[..., None]
        else:
            Gamma = torch.exp((G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")))
            to_end = torch.exp(G[..., -1:] - G)[..., None]
        A = torch.tril(b[..., :, None] * (K @ K.transpose(-1, -2)) * Gamma, diagonal=-1)
        Tm = torch.linalg.solve(torch.eye(n, dtype=q.dtype) + A, torch.diag_embed(b))
        gamma = torch.exp(G)[..., None]
        St = S.transpose(-1, -2)
        U = Tm @ (V - gamma * (K @ St)) if subtract_state else Tm @ V
        outs.append(gamma * (Q @ St) + ((Q @ K.transpose(-1, -2)) * Gamma) @ U)
        write = U.transpose(-1, -2) @ (to_end * K)
        if in_place:
            S.mul_(torch.exp(G[..., -1])[..., None, None]).add_(write)
        else:
            S = (torch.exp(G[..., -1])[..., None, None] * S if decay_state else S) + write
    return torch.cat(outs, dim=-2), S


def _chunk_no_state_in_u(q, k, v, beta, g, initial_state, chunk_size):
    return _chunk_variant(q, k, v, beta, g, initial_state, chunk_size, subtract_state=False)


def _chunk_undecayed_carry(q, k, v, beta, g, initial_state, chunk_size):
    return _chunk_variant(q, k, v, beta, g, initial_state, chunk_size, decay_state=False)


def _chunk_drop_tail(q, k, v, beta, g, initial_state, chunk_size):
    return _chunk_variant(q, k, v, beta, g, initial_state, chunk_size, drop_tail=True)


def _chunk_ratio(q, k, v, beta, g, initial_state, chunk_size):
    return _chunk_variant(q, k, v, beta, g, initial_state, chunk_size, ratio=True)


def _chunk_unit_keys(q, k, v, beta, g, initial_state, chunk_size):
    return _chunk_variant(q, k, v, beta, g, initial_state, chunk_size, normalise=True)


def _chunk_in_place(q, k, v, beta, g, initial_state, chunk_size):
    return _chunk_variant(q, k, v, beta, g, initial_state, chunk_size, in_place=True)


def _chunk_cases(gen):
    def c(label, q, k, v, beta, g, initial_state, L, hint=""):
        o, S = delta_rule_recurrent_reference(q, k, v, beta, g, scale=1.0, initial_state=initial_state)
        return Case(label, (q, k, v, beta, g, initial_state, L), (o, S), tol=_TOL, hint=hint)

    def inputs(B, H, T, D, Dv, gated=True, key_norm=None):
        q, v = _randn(gen, B, H, T, D), _randn(gen, B, H, T, Dv)
        k = _unit(_randn(gen, B, H, T, D)) if key_norm is None else key_norm * _unit(_randn(gen, B, H, T, D))
        beta = (2 if key_norm is None else 1 / key_norm ** 2) * torch.rand(B, H, T, generator=gen, dtype=f64)
        g = -torch.rand(B, H, T, generator=gen, dtype=f64) if gated else torch.zeros(B, H, T, dtype=f64)
        return q, k, v, beta, g, _randn(gen, B, H, Dv, D)

    q, k, v, beta, g0, _ = inputs(1, 2, 8, 4, 3, gated=False)
    same = _unit(_randn(gen, 1, 1, 1, 4)).expand(1, 1, 9, 4).contiguous()
    par = inputs(1, 1, 9, 4, 2)
    strong = inputs(1, 1, 10, 4, 3)
    shorter = "the chunk size need not divide T: the last chunk is shorter, and its tokens count too"
    return [
        c("B = 2, H = 2, T = 12 in chunks of 4, D = Dv = 4, a gate, a non-symmetric S0",
          *inputs(2, 2, 12, 4, 4), 4),
        c("T = 13 in chunks of 4 (the last has 1 token), D = 5, Dv = 3, a gate, S0", *inputs(1, 1, 13, 5, 3), 4,
          hint=shorter),
        c("T = 8 in chunks of 4, no gate, S0 = 0", q, k, v, beta, g0, torch.zeros(1, 2, 3, 4, dtype=f64), 4),
        c("T = 1, chunk 8", *inputs(1, 1, 1, 3, 2), 8, hint=shorter),
        c("chunk 1: every token its own chunk", *inputs(1, 2, 6, 3, 4), 1),
        c("chunk 32 > T = 10: one chunk, the whole-sequence form", *inputs(1, 1, 10, 4, 3), 32, hint=shorter),
        c("parallel keys (one unit key 9 times), chunks of 3", par[0], same, *par[2:], 3),
        c("keys of norm 1.5, beta in [0, 1 / 2.25], chunks of 4", *inputs(1, 1, 8, 4, 3, key_norm=1.5), 4),
        c("g = -1e4 (alpha = 0), chunks of 5, S0", strong[0], strong[1], strong[2], strong[3],
          torch.full_like(strong[4], -1e4), strong[5], 5,
          hint="form every gamma_t / gamma_j as exp(G_t - G_j) from the cumulative log-decays: exp(G) "
               "underflows to 0 and the ratio is 0 / 0"),
    ]


def _chunks(test):
    """A freedom's test on the sequence length and the chunk size of a case."""
    return lambda case: test(case.args[0].shape[-2], case.args[-1])


CHUNKWISE = Exercise(
    name="chunkwise delta rule",
    chapter="4",
    title="Gated DeltaNet by chunks",
    statement=(
        "Carry the state across chunks of $L$ tokens: in each chunk, with $\\mathcal T$ its UT transform "
        "and $S_0$ the state entering it ($\\gamma_t=\\prod_{r\\le t}e^{g_r}$ inside the chunk, "
        "$\\Gamma_{tj}=\\gamma_t/\\gamma_j$), the pseudo-values "
        "$U'=\\mathcal T(V-\\operatorname{diag}(\\gamma)KS_0^\\top)$ give "
        "$O=\\operatorname{diag}(\\gamma)QS_0^\\top+(QK^\\top\\odot\\Gamma\\odot M)U'$ and "
        "$S_{\\text{end}}=\\gamma_LS_0+U'^\\top\\operatorname{diag}(\\gamma_L/\\gamma)K$ (the chapter's "
        "exercise 2 derives them). Leave the given initial state unchanged and return a new one. The "
        "checker compares with the token-by-token definition, for chunk sizes $L$ that do not divide $T$, "
        "$T=1$, chunks of 1 and of more than $T$, $D\\ne D_v$, parallel keys, keys of norm 1.5 and "
        "$\\alpha=0$."),
    solution=delta_rule_chunkwise,
    cases=_chunk_cases,
    wrong=(Wrong(_chunk_no_state_in_u, "incoming state"), Wrong(_chunk_undecayed_carry, "gamma_l s0"),
           Wrong(_chunk_drop_tail, "shorter"), Wrong(_chunk_ratio, "exp(g_t - g_j)"),
           Wrong(_chunk_unit_keys, "as given"),
           Wrong(_chunk_in_place, "changed its input `initial_state` in place")),
    diagnose=((matches(_chunk_no_state_in_u, 1e-4), "your pseudo-values ignore the incoming state S0 (the "
                                                    "state carried into this chunk, not only the initial "
                                                    "one): U' = T (V - diag(gamma) K S0^T) subtracts what "
                                                    "S0 already retrieves"),
              (matches(_chunk_undecayed_carry, 1e-4), "the carried state decays across the chunk too: "
                                                      "S_end = gamma_L S0 + U'^T diag(gamma_L / gamma) K, "
                                                      "with S0 the state that entered the chunk"),
              (matches(_chunk_unit_keys, 1e-4), "use the keys as given (do not normalise them): the "
                                                "transitions I - beta k k^T depend on beta ||k||^2")),
    freedoms=(Freedom("T not a multiple of L", _chunks(lambda T, L: T % L != 0)),
              Freedom("T = 1", _chunks(lambda T, L: T == 1)),
              Freedom("L = 1", _chunks(lambda T, L: L == 1)),
              Freedom("L > T", _chunks(lambda T, L: L > T)),
              Freedom("B, H > 1", _batched),
              Freedom("D ≠ Dv", lambda c: _shape(c)[3] != _shape(c)[4]),
              Freedom("a non-symmetric S0 with D = Dv", _asymmetric_state),
              Freedom("a gate that differs per token (g < 0)", _gate_varies),
              Freedom("no gate (g = 0)", lambda c: bool((c.args[4] == 0).all())),
              Freedom("parallel keys", _key_twice),
              Freedom("keys of other than unit norm", lambda c: _not_unit(c.args[1])),
              Freedom("alpha = 0 (g = -1e4)", lambda c: bool((c.args[4] <= -1e3).all()))),
    fresh_output=True,
)


# --- 4. a chunk's product of transitions in WY form -----------------------------------------------

def transition_product(k, beta):
    """What a chunk does to the state it receives: ``k [..., L, D]``,
    ``beta [..., L]``. Return ``(P [..., D, D], det [...])``:
    ``P = A_1 A_2 ... A_L`` with ``A_t = I - beta_t k_t k_t^T``, in WY form
    ``P = I - K^T T^T K`` (``T`` the chunk's UT transform, no gate), and
    ``det P`` in closed form, from the factors (the checker sees the values
    only: doing without torch.linalg.det is yours to keep)."""
    L, D = k.shape[-2:]
    A = torch.tril(beta[..., :, None] * (k @ k.transpose(-1, -2)),
                   diagonal=-1)
    eye = torch.eye(L, dtype=k.dtype)
    T = torch.linalg.solve_triangular(eye + A, torch.diag_embed(beta),
                                      upper=False, unitriangular=True)
    # S0 A_1 ... A_L = S0 + U'^T K with U' = -T K S0^T,
    # i.e. S0 (I - K^T T^T K)
    P = (torch.eye(D, dtype=k.dtype)
         - k.transpose(-1, -2) @ T.transpose(-1, -2) @ k)
    # A_t has eigenvalue 1 - beta_t ||k_t||^2 along k_t and 1 on the rest;
    # det of a product = product of dets
    det = torch.prod(1 - beta * (k * k).sum(-1), dim=-1)
    return P, det


def _product_reversed(k, beta):
    P, det = transition_product(k, beta)
    return P.transpose(-1, -2), det                   # I - K^T T K = A_L ... A_1


def _det_first_order(k, beta):
    P, _ = transition_product(k, beta)
    return P, 1 - (beta * (k * k).sum(-1)).sum(-1)


def _det_unsquared(k, beta):
    P, _ = transition_product(k, beta)
    return P, torch.prod(1 - beta * k.norm(dim=-1), dim=-1)


def _det_no_dim(k, beta):
    P, _ = transition_product(k, beta)
    return P, torch.prod(1 - beta * (k * k).sum(-1))          # over every chunk at once


def _product_cases(gen):
    def c(label, k, beta, hint=""):
        L, D = k.shape[-2:]
        lead = k.shape[:-2]
        kk, bb = k.reshape(1, -1, L, D), beta.reshape(1, -1, L)
        eye = torch.eye(D, dtype=f64).expand(1, kk.shape[1], D, D)
        zeros = torch.zeros_like(kk)
        _, P = delta_rule_recurrent_reference(zeros, kk, zeros, bb, scale=1.0, initial_state=eye)  # v = 0
        P = P.reshape(*lead, D, D)
        # tol 1e-4: a factor 1 - beta ||k||^2 near 0 loses digits in float32, and that is not a mistake
        return Case(label, (k, beta), (P, torch.linalg.det(P)), tol=1e-4, hint=hint)

    def rbeta(*shape):
        return 2 * torch.rand(*shape, generator=gen, dtype=f64)

    half = 0.5 * _unit(_randn(gen, 3, 4))
    proj_k = _unit(_randn(gen, 2, 3, 4))
    proj_b = rbeta(2, 3)
    proj_b[0, 1] = 1.0                                  # beta ||k||^2 = 1: a projection, det 0
    return [
        c("L = 5 unit keys in D = 4, beta in [0, 2]", _unit(_randn(gen, 5, 4)), rbeta(5)),
        c("a [3] batch of chunks, L = 3, D = 6, keys not unit", _randn(gen, 3, 3, 6) * 0.5, rbeta(3, 3) * 0.5),
        c("keys of norm 0.5, beta = 2 / ||k||^2: reflections, det = -1", half,
          torch.full((3,), 8.0, dtype=f64),
          hint="the eigenvalue along k_t is 1 - beta_t ||k_t||^2 (the squared norm): here -1 per token"),
        c("beta = 0: P = I, det = 1", _randn(gen, 4, 3), torch.zeros(4, dtype=f64)),
        c("two chunks, one with beta ||k||^2 = 1 (a projection, det 0)", proj_k, proj_b),
        c("L = 1: P = I - beta k k^T", _randn(gen, 1, 5), rbeta(1)),
        c("L = 8 keys in D = 3", _unit(_randn(gen, 8, 3)), rbeta(8)),
    ]


def _factors(case):
    """1 - beta_t ||k_t||^2, the determinant of each token's transition."""
    k, beta = case.args
    return 1 - beta * (k * k).sum(-1)


TRANSITION_PRODUCT = Exercise(
    name="transition product",
    chapter="4",
    title="A chunk's transitions in WY form",
    statement=(
        "Without its writes a chunk multiplies the state on the right by "
        "$P=A_1A_2\\cdots A_L$, $A_t=I-\\beta_tk_tk_t^\\top$. The WY representation writes this product of "
        "rank-one corrections as one: $P=I-K^\\top\\mathcal T^\\top K$, with $\\mathcal T$ the UT transform. "
        "Return $P$ that way, and $\\det P$ from each factor's determinant (the chapter's exercise 1), "
        "for one chunk or a batch of them, keys of any norm, reflections ($\\beta=2/\\|k\\|^2$), "
        "$\\beta=0$, a projection ($\\beta\\|k\\|^2=1$), one key and more keys than dimensions."),
    solution=transition_product,
    cases=_product_cases,
    wrong=(Wrong(_product_reversed, "leftmost"), Wrong(_det_first_order, "product of the dets"),
           Wrong(_det_unsquared, "squared norm"), Wrong(_det_no_dim, "output 1: expected shape (3,), got ()")),
    diagnose=((matches(_product_reversed, 1e-4), "that is A_L ... A_1 = P^T: the state is multiplied on the "
                                                 "right, S_t = S_{t-1} A_t, so A_1 is leftmost and "
                                                 "P = I - K^T T^T K"),
              (matches(_det_first_order, 1e-4, leaf=1), "det(A B) = det A det B, and det(I - beta k k^T) = "
                                                        "1 - beta ||k||^2: the determinant is the product of "
                                                        "the dets, one factor per token"),
              (matches(_det_unsquared, 1e-4, leaf=1), "each factor is 1 - beta_t ||k_t||^2, with the key's "
                                                      "squared norm")),
    freedoms=(Freedom("a batch of chunks (leading dimensions)", lambda c: c.args[0].dim() > 2),
              Freedom("one chunk (no leading dimension)", lambda c: c.args[0].dim() == 2),
              Freedom("L = 1", lambda c: c.args[0].shape[-2] == 1),
              Freedom("L > D", lambda c: c.args[0].shape[-2] > c.args[0].shape[-1]),
              Freedom("keys of other than unit norm", lambda c: _not_unit(c.args[0])),
              Freedom("beta = 0", lambda c: bool((c.args[1] == 0).all())),
              Freedom("reflections (factor -1)", lambda c: bool((_factors(c) + 1).abs().max() < 1e-12)),
              Freedom("a projection (factor 0)", lambda c: bool((_factors(c).abs() < 1e-12).any()))),
)


EXERCISES = (DELTA_RULE, UT_TRANSFORM, CHUNKWISE, TRANSITION_PRODUCT)
