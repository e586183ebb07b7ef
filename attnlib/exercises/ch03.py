"""Chapter 3's exercises: linear attention as an RNN, its chunkwise form, the gated (decayed) chunk,
and the normalised decode step."""

from __future__ import annotations

import math

import torch

from ..linear import linear_attention, linear_attention_decode_step
from ._checker import Case, Exercise, Wrong, matches

f64 = torch.float64



def _reference(q, k, v, S0, mode="parallel"):
    """The library's causal linear attention (identity map, no scale): ``(o, S_T)`` in float64."""
    return linear_attention(q, k, v, scale=1.0, causal=True, mode=mode, initial_state=S0,
                            output_final_state=True, backend="torch")



# --- 1. the recurrent form --------------------------------------------------------------------------

def recurrent_linear_attention(q, k, v, initial_state):
    """Causal linear attention as an RNN: ``q, k [B, H, T, D]`` (features
    applied, no scale), ``v [B, H, T, Dv]``, ``initial_state``
    ``S_0 [B, H, Dv, D]`` or None (zeros). With ``S_t = S_{t-1} + v_t k_t^T``
    and ``o_t = S_t q_t``, return ``(o [B, H, T, Dv], S_T [B, H, Dv, D])``."""
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    outs = []
    for t in range(T):
        # write v_t k_t^T first: query t sees key t
        S = S + v[:, :, t, :, None] * k[:, :, t, None, :]
        # read: S_t q_t, [B, H, Dv]
        outs.append((S @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, dim=2), S


def _recurrent_transposed(q, k, v, initial_state):
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, D, v.shape[-1]) if initial_state is None else initial_state.transpose(-1, -2)
    outs = []
    for t in range(T):
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]     # k_t v_t^T: a [D, Dv] state
        outs.append((q[:, :, t, None, :] @ S)[..., 0, :])
    return torch.stack(outs, dim=2), S


def _recurrent_no_initial(q, k, v, initial_state):
    return recurrent_linear_attention(q, k, v, None)


def _recurrent_read_first(q, k, v, initial_state):
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    outs = []
    for t in range(T):
        # reads S_{t-1}: misses key t
        outs.append((S @ q[:, :, t, :, None])[..., 0])
        S = S + v[:, :, t, :, None] * k[:, :, t, None, :]
    return torch.stack(outs, dim=2), S


def _randn(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)
    return randn


def _recurrent_cases(gen):
    randn = _randn(gen)

    def c(label, q, k, v, S0, hint=""):
        return Case(label, (q, k, v, S0), _reference(q, k, v, S0), hint=hint)

    elu1 = torch.nn.functional.elu
    return [
        c("B = 2, H = 2, T = 9, D = 4, Dv = 3, with S_0", randn(2, 2, 9, 4), randn(2, 2, 9, 4),
          randn(2, 2, 9, 3), randn(2, 2, 3, 4),
          hint="S_t = S_{t-1} + v_t k_t^T starts from S_0; query t reads S_t, which holds key t"),
        c("no initial state (None: zeros)", randn(1, 3, 6, 5), randn(1, 3, 6, 5), randn(1, 3, 6, 5), None),
        c("T = 1", randn(1, 1, 1, 3), randn(1, 1, 1, 3), randn(1, 1, 1, 2), randn(1, 1, 2, 3)),
        c("D = 1, Dv = 4, T = 7", randn(1, 1, 7, 1), randn(1, 1, 7, 1), randn(1, 1, 7, 4), randn(1, 1, 4, 1)),
        c("D = Dv = 4 and a non-symmetric S_0", randn(1, 2, 5, 4), randn(1, 2, 5, 4), randn(1, 2, 5, 4),
          randn(1, 2, 4, 4),
          hint="the state is [Dv, D]: S_t = S_{t-1} + v_t k_t^T and o_t = S_t q_t"),
        c("zero keys: the state stays S_0", randn(1, 1, 4, 3), torch.zeros(1, 1, 4, 3, dtype=f64),
          randn(1, 1, 4, 2), randn(1, 1, 2, 3)),
        c("T = 64, positive features elu(x) + 1", elu1(randn(1, 2, 64, 8)) + 1, elu1(randn(1, 2, 64, 8)) + 1,
          randn(1, 2, 64, 8), None),
    ]


RECURRENT = Exercise(
    name="recurrent linear attention",
    chapter="3",
    title="Linear attention as an RNN",
    statement=(
        "Causal linear attention $o_t=\\sum_{j\\le t}v_j\\,(k_j\\cdot q_t)$ is a recurrent network whose "
        "hidden state is a matrix: $S_t=S_{t-1}+v_tk_t^\\top\\in\\mathbb R^{D_v\\times D}$, "
        "$o_t=S_tq_t$. Write the loop, starting from a given state $S_0$ (a previous call's final "
        "state, or zeros), and return the outputs and $S_T$. The checker compares with the masked "
        "quadratic form $(QK^\\top\\odot M)V+QS_0^\\top$ for $T=1$, $D=1$, $D=D_v$, zero keys and "
        "positive features."),
    solution=recurrent_linear_attention,
    cases=_recurrent_cases,
    wrong=(Wrong(_recurrent_transposed, "[dv, d]"), Wrong(_recurrent_no_initial, "initial state"),
           Wrong(_recurrent_read_first, "sees key t")),
    diagnose=((matches(_recurrent_transposed), "your state is [D, Dv] (k_t v_t^T): keep the book's "
                                               "orientation [Dv, D], S_t = S_{t-1} + v_t k_t^T, "
                                               "o_t = S_t q_t"),
              (matches(_recurrent_no_initial), "that is the answer from zeros: start from the initial "
                                               "state S_0 when one is given"),
              (matches(_recurrent_read_first), "your o_t reads S_{t-1}: query t sees key t, so write "
                                               "v_t k_t^T before reading")),
)


# --- 2. the chunkwise form --------------------------------------------------------------------------

def chunkwise_linear_attention(q, k, v, initial_state, chunk_size):
    """Causal linear attention chunk by chunk: ``q, k [B, H, T, D]``,
    ``v [B, H, T, Dv]``, ``S_0 [B, H, Dv, D]`` or None, ``chunk_size`` L >= 1 (T
    need not be a multiple). Per chunk: ``O_c = (Q_c K_c^T * M) V_c + Q_c S^T``
    (``*`` entrywise, ``M`` causal), then ``S += V_c^T K_c``. Return
    ``(o, S_T)``."""
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    outs = []
    for s in range(0, T, chunk_size):          # the last chunk may be shorter
        qc, kc, vc = (q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size],
                      v[:, :, s:s + chunk_size])
        # inside the chunk: keys j <= t, diagonal kept
        intra = (qc @ kc.transpose(-1, -2)).tril() @ vc
        # earlier chunks: the state before this one
        outs.append(intra + qc @ S.transpose(-1, -2))
        # then write the chunk into the state
        S = S + vc.transpose(-1, -2) @ kc
    return torch.cat(outs, dim=2), S


def _chunk_strict(q, k, v, initial_state, chunk_size):
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, v.shape[-1], D) if initial_state is None else initial_state
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        outs.append((qc @ kc.transpose(-1, -2)).tril(-1) @ vc + qc @ S.transpose(-1, -2))
        S = S + vc.transpose(-1, -2) @ kc
    return torch.cat(outs, dim=2), S


def _chunk_write_first(q, k, v, initial_state, chunk_size):
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, v.shape[-1], D) if initial_state is None else initial_state
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        S = S + vc.transpose(-1, -2) @ kc                      # the chunk is counted twice below
        outs.append((qc @ kc.transpose(-1, -2)).tril() @ vc + qc @ S.transpose(-1, -2))
    return torch.cat(outs, dim=2), S


def _chunk_no_initial(q, k, v, initial_state, chunk_size):
    return chunkwise_linear_attention(q, k, v, None, chunk_size)


def _chunk_reshape(q, k, v, initial_state, chunk_size):
    B, H, T, D = q.shape
    n = T // chunk_size
    if n * chunk_size != T:
        raise ValueError(f"T = {T} is not a multiple of the chunk size {chunk_size}")
    return chunkwise_linear_attention(q, k, v, initial_state, chunk_size)


def _chunk_cases(gen):
    randn = _randn(gen)

    def c(label, T, D, Dv, C, S0=True, B=1, H=2, hint=""):
        q, k, v = randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, Dv)
        S = randn(B, H, Dv, D) if S0 else None
        return Case(label, (q, k, v, S, C), _reference(q, k, v, S, mode="recurrent"), hint=hint)

    return [
        c("T = 13, chunks of 4 (the last has 1 row), with S_0", 13, 4, 3, 4, B=2,
          hint="T need not be a multiple of L: the last chunk is shorter"),
        c("T = 16, chunks of 4, no initial state", 16, 5, 5, 4, S0=False),
        c("chunks of 1: the recurrence", 7, 3, 2, 1,
          hint="with L = 1 each chunk is one token, which sees itself: keep the diagonal of the mask"),
        c("one chunk longer than T (L = 16, T = 5): the quadratic form", 5, 3, 4, 16),
        c("T = 1, L = 4", 1, 4, 3, 4),
        c("chunks of 5 in T = 12, D = 1", 12, 1, 3, 5),
    ]


CHUNK = Exercise(
    name="chunkwise linear attention",
    chapter="3",
    title="The chunkwise form",
    statement=(
        "Between the recurrence ($L=1$) and the masked quadratic form ($L\\ge T$) lies the chunkwise "
        "form: for each chunk $c$ of $L$ rows, "
        "$O_c=(Q_cK_c^\\top\\odot M_L)V_c+Q_cS_{c-1}^\\top$, then $S_c=S_{c-1}+V_c^\\top K_c$. Write it "
        "from a given $S_0$ for any chunk size: one that does not divide $T$, $L=1$, $L>T$, $T=1$. The "
        "checker compares with the recurrence."),
    solution=chunkwise_linear_attention,
    cases=_chunk_cases,
    wrong=(Wrong(_chunk_strict, "diagonal"), Wrong(_chunk_write_first, "before this chunk"),
           Wrong(_chunk_no_initial, "initial state"), Wrong(_chunk_reshape, "shorter")),
    diagnose=((matches(_chunk_strict), "your intra-chunk mask drops the diagonal (j < t): query t sees "
                                       "key t, so keep it (tril(), not tril(-1))"),
              (matches(_chunk_write_first), "the chunk is counted twice: read the state from before this "
                                            "chunk (Q_c S_{c-1}^T), then write V_c^T K_c into it"),
              (matches(_chunk_no_initial), "that is the answer from zeros: start from the initial state "
                                           "S_0 when one is given")),
)


# --- 3. the gated chunk -----------------------------------------------------------------------------

def gated_linear_attention(q, k, v, log_alpha, initial_state, chunk_size):
    """``S_t = alpha_t S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``, chunk by chunk:
    ``q, k [B, H, T, D]``, ``v [B, H, T, Dv]``, ``log_alpha [B, H, T]`` (<= 0,
    may be -800), ``S_0 [B, H, Dv, D]`` or None, ``chunk_size`` >= 1 (need not
    divide T). Return ``(o [B, H, T, Dv], S_T [B, H, Dv, D])``."""
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = (q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size],
                      v[:, :, s:s + chunk_size])
        # log gamma_t = sum of log alpha_r, r <= t
        b = log_alpha[:, :, s:s + chunk_size].cumsum(dim=-1)
        L = b.shape[-1]
        # Gamma_tj = gamma_t / gamma_j = exp(b_t - b_j) for j <= t. Mask the
        # exponent before exp: above the diagonal b_t - b_j can be +800, and
        # exp(+800) * 0 is NaN. Never divide products: 0 / 0.
        keep = torch.ones(L, L, dtype=torch.bool).tril()
        gamma = torch.exp((b[..., :, None] - b[..., None, :])
                          .masked_fill(~keep, float("-inf")))
        intra = ((qc @ kc.transpose(-1, -2)) * gamma) @ vc
        # the entering state decays by gamma_t
        inter = torch.exp(b)[..., None] * (qc @ S.transpose(-1, -2))
        outs.append(intra + inter)
        # S_c = gamma_L S_{c-1} + sum_j (gamma_L / gamma_j) v_j k_j^T
        to_end = torch.exp(b[..., -1:] - b)      # gamma_L / gamma_j, each <= 1
        written = (vc * to_end[..., None]).transpose(-1, -2) @ kc
        S = torch.exp(b[..., -1])[..., None, None] * S + written
    return torch.cat(outs, dim=2), S


def _gated_once_too_often(q, k, v, log_alpha, initial_state, chunk_size):
    # exp(b_t - b_j + log alpha_j): the key written at step j is decayed by alpha_j as well.
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, v.shape[-1], D) if initial_state is None else initial_state
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        la = log_alpha[:, :, s:s + chunk_size]
        b = la.cumsum(-1)
        b_before = b - la
        keep = torch.ones(b.shape[-1], b.shape[-1], dtype=torch.bool).tril()
        gamma = torch.exp((b[..., :, None] - b_before[..., None, :]).masked_fill(~keep, float("-inf")))
        inter = torch.exp(b)[..., None] * (qc @ S.transpose(-1, -2))
        outs.append(((qc @ kc.transpose(-1, -2)) * gamma) @ vc + inter)
        to_end = torch.exp(b[..., -1:] - b_before)
        written = (vc * to_end[..., None]).transpose(-1, -2) @ kc
        S = torch.exp(b[..., -1])[..., None, None] * S + written
    return torch.cat(outs, dim=2), S


def _gated_state_undecayed(q, k, v, log_alpha, initial_state, chunk_size):
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, v.shape[-1], D) if initial_state is None else initial_state
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        b = log_alpha[:, :, s:s + chunk_size].cumsum(-1)
        keep = torch.ones(b.shape[-1], b.shape[-1], dtype=torch.bool).tril()
        gamma = torch.exp((b[..., :, None] - b[..., None, :]).masked_fill(~keep, float("-inf")))
        outs.append(((qc @ kc.transpose(-1, -2)) * gamma) @ vc + qc @ S.transpose(-1, -2))   # no diag(gamma)
        to_end = torch.exp(b[..., -1:] - b)
        written = (vc * to_end[..., None]).transpose(-1, -2) @ kc
        S = torch.exp(b[..., -1])[..., None, None] * S + written
    return torch.cat(outs, dim=2), S


def _gated_ratio(q, k, v, log_alpha, initial_state, chunk_size):
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, v.shape[-1], D) if initial_state is None else initial_state
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        g = log_alpha[:, :, s:s + chunk_size].cumsum(-1).exp()       # products gamma_t, then ratios
        gamma = (g[..., :, None] / g[..., None, :]).tril()
        outs.append(((qc @ kc.transpose(-1, -2)) * gamma) @ vc + g[..., None] * (qc @ S.transpose(-1, -2)))
        S = g[..., -1, None, None] * S + (vc * (g[..., -1:] / g)[..., None]).transpose(-1, -2) @ kc
    return torch.cat(outs, dim=2), S


def _gated_mask_after_exp(q, k, v, log_alpha, initial_state, chunk_size):
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, v.shape[-1], D) if initial_state is None else initial_state
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        b = log_alpha[:, :, s:s + chunk_size].cumsum(-1)
        L = b.shape[-1]
        mask = torch.ones(L, L, dtype=q.dtype).tril()                # multiplied: exp(+800) * 0 is NaN
        gamma = torch.exp(b[..., :, None] - b[..., None, :]) * mask
        inter = torch.exp(b)[..., None] * (qc @ S.transpose(-1, -2))
        outs.append(((qc @ kc.transpose(-1, -2)) * gamma) @ vc + inter)
        to_end = torch.exp(b[..., -1:] - b)
        written = (vc * to_end[..., None]).transpose(-1, -2) @ kc
        S = torch.exp(b[..., -1])[..., None, None] * S + written
    return torch.cat(outs, dim=2), S


def _gated_recurrence(q, k, v, log_alpha, S0):
    """The definition, token by token, in float64: ``S_t = alpha_t S_{t-1} + v_t k_t^T``,
    ``o_t = S_t q_t``."""
    B, H, T, D = q.shape
    S = torch.zeros(B, H, v.shape[-1], D, dtype=f64) if S0 is None else S0.to(f64)
    outs = []
    for t in range(T):
        S = torch.exp(log_alpha[:, :, t].to(f64))[..., None, None] * S \
            + v[:, :, t, :, None].to(f64) * k[:, :, t, None, :].to(f64)
        outs.append((S @ q[:, :, t, :, None].to(f64))[..., 0])
    return torch.stack(outs, dim=2), S


def _gated_cases(gen):
    randn = _randn(gen)

    def c(label, T, D, Dv, C, log_alpha, S0=True, B=1, H=2, hint="", library=False, tol=None):
        q, k, v = randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, Dv)
        S = randn(B, H, Dv, D) if S0 else None
        la = log_alpha(B, H, T)
        # With alpha = 1 the gated form is linear attention itself: the library's answer.
        want = _reference(q, k, v, S, mode="recurrent") if library else _gated_recurrence(q, k, v, la, S)
        return Case(label, (q, k, v, la, S, C), want, tol=tol, hint=hint)

    def uniform(lo):
        return lambda *shape: torch.rand(*shape, generator=gen, dtype=f64) * lo

    def reset(*shape):
        la = torch.rand(*shape, generator=gen, dtype=f64) * -0.3
        la[..., 5] = -800.0                    # alpha = e^-800 = 0 in float64: the state is wiped
        return la

    return [
        c("random gates in [e^-0.5, 1], T = 13, chunks of 4, with S_0", 13, 4, 3, 4, uniform(-0.5), B=2,
          hint="Gamma_tj = prod_{r=j+1..t} alpha_r; the state entering a chunk decays by gamma_t = "
               "prod_{r<=t} alpha_r, and S_c = gamma_L S_{c-1} + sum_j (gamma_L / gamma_j) v_j k_j^T"),
        c("alpha = 1: plain linear attention, T = 11, chunks of 4", 11, 3, 3, 4,
          lambda *shape: torch.zeros(*shape, dtype=f64), library=True),
        c("a constant alpha = 0.9 (RetNet), T = 16, chunks of 8", 16, 4, 4, 8,
          lambda *shape: torch.full(shape, math.log(0.9), dtype=f64), S0=False),
        c("chunks of 1: the gated recurrence, T = 6", 6, 3, 2, 1, uniform(-1.0)),
        c("T = 1, chunks of 4", 1, 4, 3, 4, uniform(-1.0)),
        # tol: float32 keeps cumulative sums near -800 to 6e-5, so a float32 answer is only that close.
        c("a reset (alpha = e^-800) at t = 5, one chunk of 12", 12, 4, 3, 12, reset, tol=1e-4,
          hint="form Gamma as exp of differences of cumulative log alpha, the upper triangle set to -inf "
               "before exp: a ratio of products is 0 / 0 here, and exp(+800) * 0 is NaN"),
    ]


GATED = Exercise(
    name="gated chunkwise linear attention",
    chapter="3",
    title="Gated chunks",
    statement=(
        "A forget gate $S_t=\\alpha_tS_{t-1}+v_tk_t^\\top$ turns the causal mask into the decay mask "
        "$\\Gamma_{tj}=\\prod_{r=j+1}^t\\alpha_r$. Write the chunkwise form of the chapter's exercise 3: "
        "with $\\gamma_t=\\prod_{r\\le t}\\alpha_r$ inside a chunk, "
        "$O_c=(Q_cK_c^\\top\\odot\\Gamma_L)V_c+\\mathrm{diag}(\\gamma)Q_cS_{c-1}^\\top$ and "
        "$S_c=\\gamma_LS_{c-1}+\\sum_j(\\gamma_L/\\gamma_j)v_jk_j^\\top$, from $\\log\\alpha$. It must agree "
        "with the recurrence for $\\alpha=1$, a constant $\\alpha$, $L=1$, $T=1$ and a gate of $e^{-800}$ "
        "that wipes the state."),
    solution=gated_linear_attention,
    cases=_gated_cases,
    wrong=(Wrong(_gated_once_too_often, "once too often"), Wrong(_gated_state_undecayed, "diag(gamma)"),
           Wrong(_gated_ratio, "ratio of products"), Wrong(_gated_mask_after_exp, "before exp")),
    diagnose=((matches(_gated_once_too_often), "the decay is applied once too often: the key written at "
                                               "step j is not decayed by alpha_j (Gamma_tj runs over r = "
                                               "j+1..t)"),
              (matches(_gated_state_undecayed), "the state entering the chunk must decay too: multiply "
                                                "Q_c S_{c-1}^T by diag(gamma), gamma_t = prod_{r<=t} "
                                                "alpha_r")),
)


# --- 4. the decode step -----------------------------------------------------------------------------

def linear_decode_step(q, k, v, initial_state, scale):
    """One token of normalised linear attention, ``phi(x) = elu(x) + 1``:
    ``q, k [B, H, 1, D]``, ``v [B, H, 1, Dv]``,
    ``initial_state [B, H, Dv + 1, D]`` (rows ``S``; last row
    ``kappa = sum phi(k)``) or None. Add ``v phi(k)^T`` and ``phi(k)``, then
    ``o = S phi(scale q) / (kappa . phi(scale q) + 1e-6)``. Return
    ``(o [B, H, 1, Dv], new state [B, H, Dv + 1, D])``."""
    # scale multiplies q before the map
    phi_q = torch.nn.functional.elu(scale * q) + 1
    phi_k = torch.nn.functional.elu(k) + 1
    # A ones column appended to v writes kappa (the normaliser) as one more row
    # of the state: [B, H, 1, Dv + 1].
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    if initial_state is None:
        initial_state = q.new_zeros(q.shape[0], q.shape[1], v1.shape[-1],
                                    q.shape[-1])
    S = initial_state + v1.transpose(-1, -2) @ phi_k     # + [v; 1] phi(k)^T
    o = phi_q @ S.transpose(-1, -2)                # [S phi(q); kappa . phi(q)]
    # 1e-6 keeps a vanishing normaliser finite
    return o[..., :-1] / (o[..., -1:] + 1e-6), S


def _decode_no_eps(q, k, v, state, scale):
    o, S = linear_decode_step(q, k, v, state, scale)
    num = (torch.nn.functional.elu(scale * q) + 1) @ S.transpose(-1, -2)
    return num[..., :-1] / num[..., -1:], S


def _decode_scale_after(q, k, v, state, scale):
    phi_q = (torch.nn.functional.elu(q) + 1) * scale          # the map first, then the scale
    _, S = linear_decode_step(q, k, v, state, scale)
    o = phi_q @ S.transpose(-1, -2)
    return o[..., :-1] / (o[..., -1:] + 1e-6), S


def _decode_old_normaliser(q, k, v, state, scale):
    _, S = linear_decode_step(q, k, v, state, scale)
    z_old = (state[..., -1:, :] if state is not None else torch.zeros_like(S[..., -1:, :]))
    phi_q = torch.nn.functional.elu(scale * q) + 1
    num = phi_q @ S[..., :-1, :].transpose(-1, -2)
    return num / (phi_q @ z_old.transpose(-1, -2) + 1e-6), S


def _decode_cases(gen):
    randn = _randn(gen)

    def prefix_state(B, H, T, D, Dv, scale):
        _, S = linear_attention(randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, Dv), scale=scale,
                                feature_map="elu1", causal=True, normalize=True, output_final_state=True,
                                backend="torch")
        return S

    def c(label, q, k, v, state, scale, hint=""):
        want = linear_attention_decode_step(q, k, v, initial_state=state, scale=scale, feature_map="elu1",
                                            normalize=True)
        return Case(label, (q, k, v, state, scale), want, hint=hint)

    return [
        c("after a prefix of 7 tokens, B = 2, H = 2, D = 4, Dv = 3", randn(2, 2, 1, 4), randn(2, 2, 1, 4),
          randn(2, 2, 1, 3), prefix_state(2, 2, 7, 4, 3, 0.5), 0.5,
          hint="write this token first (S += v phi(k)^T, kappa += phi(k)), then read with phi(scale q)"),
        c("the first token (state None), scale = 1 / sqrt(8)", randn(1, 3, 1, 8), randn(1, 3, 1, 8),
          randn(1, 3, 1, 2), None, 8 ** -0.5,
          hint="with no state the token reads only itself: o = v phi(k).phi(q) / (phi(k).phi(q) + 1e-6)"),
        c("scale = 3 after a prefix of 20 tokens", randn(1, 1, 1, 5), randn(1, 1, 1, 5), randn(1, 1, 1, 4),
          prefix_state(1, 1, 20, 5, 4, 3.0), 3.0,
          hint="scale multiplies q before the feature map: phi(scale q), not scale phi(q)"),
        c("D = 1, Dv = 1", randn(1, 1, 1, 1), randn(1, 1, 1, 1), randn(1, 1, 1, 1),
          prefix_state(1, 1, 3, 1, 1, 1.0), 1.0),
        c("queries of -60: phi(q) rounds to 0", torch.full((1, 2, 1, 4), -60.0, dtype=f64),
          randn(1, 2, 1, 4), randn(1, 2, 1, 3), prefix_state(1, 2, 5, 4, 3, 1.0), 1.0,
          hint="the normaliser kappa . phi(q) can vanish (here elu(-60) + 1 rounds to 0): divide by "
               "kappa . phi(q) + 1e-6, which keeps o finite"),
    ]


DECODE = Exercise(
    name="linear attention decode step",
    chapter="3",
    title="The decode step, with the normaliser",
    statement=(
        "Generation with normalised linear attention keeps $S_t=\\sum_{j\\le t}v_j\\phi(k_j)^\\top$ and "
        "$\\kappa_t=\\sum_{j\\le t}\\phi(k_j)$ as one state of $D_v+1$ rows (a ones column appended to "
        "$v$, the chapter's exercise 1) and emits $o_t=S_t\\phi(q_t)/(\\kappa_t\\cdot\\phi(q_t)+10^{-6})$ with "
        "$\\phi(x)=\\mathrm{elu}(x)+1$ applied to the scaled query. Write one step: from a state left by "
        "a prefix, from no state, with $D=D_v=1$, and with queries so negative that $\\phi(q)$ vanishes."),
    solution=linear_decode_step,
    cases=_decode_cases,
    wrong=(Wrong(_decode_no_eps, "1e-6"), Wrong(_decode_scale_after, "before the feature map"),
           Wrong(_decode_old_normaliser, "this token's key")),
    diagnose=((matches(_decode_scale_after, leaf=0), "scale multiplies q before the feature map: "
                                                     "phi(scale q), not scale phi(q), whose factor "
                                                     "cancels in the ratio"),
              (matches(_decode_old_normaliser, leaf=0), "your normaliser misses this token's key: add "
                                                        "phi(k_t) to kappa before dividing"),
              (matches(_decode_no_eps, leaf=0), "divide by kappa . phi(q) + 1e-6, as the library "
                                                "does: the 1e-6 matters when the normaliser is "
                                                "small, and keeps o finite when it vanishes")),
)


EXERCISES = (RECURRENT, CHUNK, GATED, DECODE)
