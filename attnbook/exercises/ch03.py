"""Chapter 3's exercises: linear attention as an RNN, its chunkwise form, the gated (decayed) chunk,
and the normalised decode step."""

from __future__ import annotations

import math

import torch

from attnlib.linear import linear_attention, linear_attention_decode_step

from ._checker import Case, Exercise, Freedom, Wrong, agree, matches

f64 = torch.float64
_TOL = 1e-5      # relative RMS: an answer computed in float32 from the float64 inputs passes (a few
#                  times 1e-7 on these inputs); every mistake below is off by far more



def _reference(q, k, v, initial_state, mode="parallel"):
    """The library's causal linear attention (identity map, no scale): ``(o, S_T)`` in float64."""
    return linear_attention(q, k, v, scale=1.0, causal=True, mode=mode, initial_state=initial_state,
                            output_final_state=True, backend="torch")


def _randn(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)
    return randn


# What the inputs of a case are, for the freedoms: the shapes, and the state (``state`` is the position
# of the initial-state argument).
def _shape(case):
    B, H, T, D = case.args[0].shape
    return B, H, T, D, case.args[2].shape[-1]


def _batched(case):
    B, H, *_ = _shape(case)
    return B > 1 and H > 1


def _state_with(state, d_ne_dv=None, asymmetric=False):
    """A freedom's test: the case has an initial state (``state`` its position), optionally with
    D ≠ Dv, or a non-symmetric one with D = Dv."""
    def present(case):
        S0, (*_, D, Dv) = case.args[state], _shape(case)
        if S0 is None:
            return False
        if asymmetric:
            return D == Dv and not torch.allclose(S0, S0.transpose(-1, -2))
        return d_ne_dv is None or (D != Dv) == d_ne_dv
    return present


def _no_state_d_ne_dv(state):
    def present(case):
        *_, D, Dv = _shape(case)
        return case.args[state] is None and D != Dv
    return present


def _state_transposed(got, expected, case) -> bool:
    """The reader's final state is the answer's transpose: a [D, Dv] state (k v^T written)."""
    S, want = got[1], expected[1]
    return agree(S.transpose(-1, -2), want) and not agree(want.transpose(-1, -2), want)


_TRANSPOSED = ("your state is [D, Dv] (k_t v_t^T): keep the book's orientation [Dv, D], "
               "S_t = S_{t-1} + v_t k_t^T, o_t = S_t q_t")
_FROM_ZEROS = "that is the answer from zeros: start from the initial state S_0 when one is given"


# --- 1. the recurrent form --------------------------------------------------------------------------

def recurrent_linear_attention(q, k, v, initial_state):
    """Causal linear attention as an RNN: ``q, k [B, H, T, D]`` (features
    applied, no scale), ``v [B, H, T, Dv]``, ``initial_state``
    ``S_0 [B, H, Dv, D]`` or None (zeros). With ``S_t = S_{t-1} + v_t k_t^T``
    and ``o_t = S_t q_t``, return ``(o [B, H, T, Dv], S_T [B, H, Dv, D])``;
    leave ``initial_state`` unchanged."""
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    outs = []
    for t in range(T):
        # write v_t k_t^T first: query t sees key t (a new S, not S +=)
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


def _recurrent_variant(q, k, v, initial_state, *, from_zeros=False, square=False, in_place=False,
                       scale=False):
    """The loop with one thing changed: the initial state ignored, a [D, D] zero state when there is
    none, the state updated in place (``S +=`` on the caller's tensor), or a 1/sqrt(D) the statement
    does not have."""
    B, H, T, D = q.shape
    rows = D if square else v.shape[-1]
    S = q.new_zeros(B, H, rows, D) if initial_state is None or from_zeros else initial_state
    q = q * D ** -0.5 if scale else q
    outs = []
    for t in range(T):
        write = v[:, :, t, :, None] * k[:, :, t, None, :]
        if in_place:
            S += write
        else:
            S = S + write
        outs.append((S @ q[:, :, t, :, None])[..., 0])
    return torch.stack(outs, dim=2), S


def _recurrent_no_initial(q, k, v, initial_state):
    return _recurrent_variant(q, k, v, initial_state, from_zeros=True)


def _recurrent_square_zeros(q, k, v, initial_state):
    return _recurrent_variant(q, k, v, initial_state, square=True)


def _recurrent_in_place(q, k, v, initial_state):
    return _recurrent_variant(q, k, v, initial_state, in_place=True)


def _recurrent_scaled(q, k, v, initial_state):
    return _recurrent_variant(q, k, v, initial_state, scale=True)


def _recurrent_cases(gen):
    randn = _randn(gen)

    def c(label, q, k, v, initial_state, hint=""):
        return Case(label, (q, k, v, initial_state), _reference(q, k, v, initial_state), tol=_TOL, hint=hint)

    elu1 = torch.nn.functional.elu
    return [
        c("B = 2, H = 2, T = 6, D = Dv = 4, a non-symmetric S_0", randn(2, 2, 6, 4), randn(2, 2, 6, 4),
          randn(2, 2, 6, 4), randn(2, 2, 4, 4)),
        c("T = 9, D = 4, Dv = 3, with S_0", randn(1, 2, 9, 4), randn(1, 2, 9, 4), randn(1, 2, 9, 3),
          randn(1, 2, 3, 4)),
        c("no initial state (None), D = 5, Dv = 3", randn(1, 3, 6, 5), randn(1, 3, 6, 5), randn(1, 3, 6, 3),
          None,
          hint="with no initial state, start from zeros of the state's shape [B, H, Dv, D], with "
               "Dv = v.shape[-1], which need not be D"),
        c("T = 1", randn(1, 1, 1, 3), randn(1, 1, 1, 3), randn(1, 1, 1, 2), randn(1, 1, 2, 3)),
        c("D = 1, Dv = 4, T = 7", randn(1, 1, 7, 1), randn(1, 1, 7, 1), randn(1, 1, 7, 4), randn(1, 1, 4, 1)),
        c("zero keys: the state stays S_0", randn(1, 1, 4, 3), torch.zeros(1, 1, 4, 3, dtype=f64),
          randn(1, 1, 4, 2), randn(1, 1, 2, 3)),
        c("T = 64, positive features elu(x) + 1, no initial state", elu1(randn(1, 2, 64, 8)) + 1,
          elu1(randn(1, 2, 64, 8)) + 1, randn(1, 2, 64, 8), None),
    ]


RECURRENT = Exercise(
    name="recurrent linear attention",
    chapter="3",
    title="Linear attention as an RNN",
    statement=(
        "Causal linear attention $o_t=\\sum_{j\\le t}v_j\\,(k_j\\cdot q_t)$ is a recurrent network whose "
        "hidden state is a matrix: $S_t=S_{t-1}+v_tk_t^\\top\\in\\mathbb R^{D_v\\times D}$, "
        "$o_t=S_tq_t$. Write the loop, starting from a given state $S_0$ (a previous call's final "
        "state, which you leave unchanged) or from zeros when there is none, and return the outputs and "
        "a new $S_T$. The checker compares with the masked quadratic form "
        "$(QK^\\top\\odot M)V+QS_0^\\top$ for $T=1$, $D=1$, $D\\ne D_v$ with and without $S_0$, a "
        "non-symmetric $S_0$ with $D=D_v$, zero keys and positive features."),
    solution=recurrent_linear_attention,
    cases=_recurrent_cases,
    wrong=(Wrong(_recurrent_transposed, "[dv, d]"), Wrong(_recurrent_no_initial, "initial state"),
           Wrong(_recurrent_read_first, "sees key t"), Wrong(_recurrent_square_zeros, "[b, h, dv, d]"),
           Wrong(_recurrent_in_place, "changed its input `initial_state` in place"),
           Wrong(_recurrent_scaled, "no scale")),
    diagnose=((_state_transposed, _TRANSPOSED),
              (matches(_recurrent_no_initial), _FROM_ZEROS),
              (matches(_recurrent_read_first), "your o_t reads S_{t-1}: query t sees key t, so write "
                                               "v_t k_t^T before reading"),
              (matches(_recurrent_scaled), "there is no scale here: q and k come with their features "
                                           "applied, o_t = S_t q_t with no 1/sqrt(D)")),
    freedoms=(Freedom("B, H > 1", _batched),
              Freedom("D ≠ Dv with S_0", _state_with(3, d_ne_dv=True)),
              Freedom("no initial state (None) with D ≠ Dv", _no_state_d_ne_dv(3)),
              Freedom("a non-symmetric S_0 with D = Dv", _state_with(3, asymmetric=True)),
              Freedom("T = 1", lambda c: _shape(c)[2] == 1),
              Freedom("D = 1", lambda c: _shape(c)[3] == 1)),
    fresh_output=True,
)


# --- 2. the chunkwise form --------------------------------------------------------------------------

def chunkwise_linear_attention(q, k, v, initial_state, chunk_size):
    """Causal linear attention chunk by chunk: ``q, k [B, H, T, D]``,
    ``v [B, H, T, Dv]``, ``initial_state`` ``S_0 [B, H, Dv, D]`` or None
    (zeros), ``chunk_size`` L >= 1 (T need not be a multiple of L). Per chunk:
    ``O_c = (Q_c K_c^T * M) V_c + Q_c S^T`` (``*`` entrywise, ``M`` causal),
    then ``S += V_c^T K_c``. Return ``(o, S_T)``; leave ``initial_state``
    unchanged."""
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
        # then write the chunk into the state (a new S, not S +=)
        S = S + vc.transpose(-1, -2) @ kc
    return torch.cat(outs, dim=2), S


def _chunk_variant(q, k, v, initial_state, chunk_size, *, diagonal=0, flipped=False, scale=False,
                   write_first=False, from_zeros=False, square=False, drop_tail=False):
    """The chunk loop with one thing changed: the mask's diagonal dropped or the mask flipped (upper
    triangle), a 1/sqrt(D) the statement does not have, the chunk written before it is read, the
    initial state ignored, a [D, D] zero state when there is none, or the last, shorter chunk left out."""
    B, H, T, D = q.shape
    L = chunk_size
    rows = D if square else v.shape[-1]
    S = q.new_zeros(B, H, rows, D) if initial_state is None or from_zeros else initial_state
    scores = (lambda a, b: a @ b.transpose(-1, -2) * D ** -0.5) if scale else (lambda a, b: a @ b.transpose(-1, -2))
    outs = []
    for s in range(0, T - T % L if drop_tail else T, L):
        qc, kc, vc = q[:, :, s:s + L], k[:, :, s:s + L], v[:, :, s:s + L]
        if write_first:
            S = S + vc.transpose(-1, -2) @ kc                  # the chunk is counted twice below
        A = scores(qc, kc)
        A = A.triu() if flipped else A.tril(diagonal)
        outs.append(A @ vc + qc @ S.transpose(-1, -2))
        if not write_first:
            S = S + vc.transpose(-1, -2) @ kc
    return torch.cat(outs, dim=2), S


def _chunk_strict(q, k, v, initial_state, chunk_size):
    return _chunk_variant(q, k, v, initial_state, chunk_size, diagonal=-1)


def _chunk_flipped(q, k, v, initial_state, chunk_size):
    return _chunk_variant(q, k, v, initial_state, chunk_size, flipped=True)


def _chunk_scaled(q, k, v, initial_state, chunk_size):
    return _chunk_variant(q, k, v, initial_state, chunk_size, scale=True)


def _chunk_write_first(q, k, v, initial_state, chunk_size):
    return _chunk_variant(q, k, v, initial_state, chunk_size, write_first=True)


def _chunk_no_initial(q, k, v, initial_state, chunk_size):
    return _chunk_variant(q, k, v, initial_state, chunk_size, from_zeros=True)


def _chunk_square_zeros(q, k, v, initial_state, chunk_size):
    return _chunk_variant(q, k, v, initial_state, chunk_size, square=True)


def _chunk_drop_tail(q, k, v, initial_state, chunk_size):
    return _chunk_variant(q, k, v, initial_state, chunk_size, drop_tail=True)


def _chunk_reshape(q, k, v, initial_state, chunk_size):
    B, H, T, D = q.shape
    n = T // chunk_size
    if n * chunk_size != T:
        raise ValueError(f"T = {T} is not a multiple of the chunk size {chunk_size}")
    return chunkwise_linear_attention(q, k, v, initial_state, chunk_size)


def _chunk_cases(gen):
    randn = _randn(gen)

    def c(label, T, D, Dv, L, S0=True, B=1, H=2, hint=""):
        q, k, v = randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, Dv)
        S = randn(B, H, Dv, D) if S0 else None
        return Case(label, (q, k, v, S, L), _reference(q, k, v, S, mode="recurrent"), tol=_TOL, hint=hint)

    return [
        c("B = 2, H = 2, T = 12 in chunks of 4, D = Dv = 4, a non-symmetric S_0", 12, 4, 4, 4, B=2),
        c("T = 13 in chunks of 4 (the last has 1 row), D = 4, Dv = 3, with S_0", 13, 4, 3, 4,
          hint="T need not be a multiple of L: the last chunk is shorter, and its rows count too"),
        c("no initial state (None), D = 5, Dv = 3, T = 8 in chunks of 4", 8, 5, 3, 4, S0=False,
          hint="with no initial state, start from zeros of the state's shape [B, H, Dv, D], with "
               "Dv = v.shape[-1], which need not be D"),
        c("chunks of 1: the recurrence", 7, 3, 2, 1,
          hint="with L = 1 each chunk is one token, which sees itself: keep the diagonal of the mask"),
        c("one chunk longer than T (L = 16, T = 5): the quadratic form", 5, 3, 4, 16,
          hint="a chunk size larger than T makes one chunk, shorter than L, that holds every row"),
        c("T = 1, L = 4", 1, 4, 3, 4, hint="with T = 1 there is one chunk, of one row: shorter than L"),
        c("chunks of 5 in T = 10, D = 1", 10, 1, 3, 5),
    ]


def _chunks(test):
    """A freedom's test on the sequence length and the chunk size of a case."""
    return lambda case: test(case.args[0].shape[2], case.args[-1])


CHUNK = Exercise(
    name="chunkwise linear attention",
    chapter="3",
    title="The chunkwise form",
    statement=(
        "Between the recurrence ($L=1$) and the masked quadratic form ($L\\ge T$) lies the chunkwise "
        "form: for each chunk $c$ of $L$ rows, "
        "$O_c=(Q_cK_c^\\top\\odot M_L)V_c+Q_cS_{c-1}^\\top$, then $S_c=S_{c-1}+V_c^\\top K_c$. Write it "
        "from a given $S_0$ (left unchanged) or from zeros, for any chunk size $L$: one that does not "
        "divide $T$, $L=1$, $L>T$, $T=1$. The checker compares with the recurrence, also for "
        "$D\\ne D_v$ with and without $S_0$ and $D=1$."),
    solution=chunkwise_linear_attention,
    cases=_chunk_cases,
    wrong=(Wrong(_chunk_strict, "diagonal"), Wrong(_chunk_flipped, "flipped"), Wrong(_chunk_scaled, "no scale"),
           Wrong(_chunk_write_first, "before this chunk"), Wrong(_chunk_no_initial, "initial state"),
           Wrong(_chunk_square_zeros, "[b, h, dv, d]"), Wrong(_chunk_drop_tail, "shorter"),
           Wrong(_chunk_reshape, "shorter")),
    diagnose=((matches(_chunk_strict), "your intra-chunk mask drops the diagonal (j < t): query t sees "
                                       "key t, so keep it (tril(), not tril(-1))"),
              (matches(_chunk_flipped), "your intra-chunk mask is flipped: query t sees the keys j <= t, "
                                        "the lower triangle (tril), not the upper one"),
              (matches(_chunk_scaled), "there is no scale here: Q_c K_c^T as it stands, no 1/sqrt(D)"),
              (matches(_chunk_write_first), "the chunk is counted twice: read the state from before this "
                                            "chunk (Q_c S_{c-1}^T), then write V_c^T K_c into it"),
              (matches(_chunk_no_initial), _FROM_ZEROS),
              (_state_transposed, _TRANSPOSED)),
    freedoms=(Freedom("T not a multiple of L", _chunks(lambda T, L: T % L != 0)),
              Freedom("L = 1", _chunks(lambda T, L: L == 1)),
              Freedom("L > T", _chunks(lambda T, L: L > T)),
              Freedom("T = 1", _chunks(lambda T, L: T == 1)),
              Freedom("B, H > 1", _batched),
              Freedom("D ≠ Dv with S_0", _state_with(3, d_ne_dv=True)),
              Freedom("no initial state (None) with D ≠ Dv", _no_state_d_ne_dv(3)),
              Freedom("a non-symmetric S_0 with D = Dv", _state_with(3, asymmetric=True)),
              Freedom("D = 1", lambda c: _shape(c)[3] == 1)),
    fresh_output=True,
)


# --- 3. the gated chunk -----------------------------------------------------------------------------

def gated_linear_attention(q, k, v, g, initial_state, chunk_size):
    """``S_t = alpha_t S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``, chunk by chunk:
    ``q, k [B, H, T, D]``, ``v [B, H, T, Dv]``, ``g [B, H, T]`` the log-decay
    ``log alpha_t`` (<= 0, may be -800), ``initial_state`` ``S_0 [B, H, Dv, D]``
    or None (zeros), ``chunk_size`` L >= 1 (need not divide T). Return
    ``(o [B, H, T, Dv], S_T [B, H, Dv, D])``; leave the inputs unchanged."""
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = (q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size],
                      v[:, :, s:s + chunk_size])
        # log gamma_t = sum of g_r = log alpha_r, r <= t
        b = g[:, :, s:s + chunk_size].cumsum(dim=-1)
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


def _gated_variant(q, k, v, g, initial_state, chunk_size, *, once_too_often=False, undecayed_state=False,
                   undecayed_write=False, ratio=False, mask_after_exp=False, square=False):
    """The gated chunk with one thing changed: the key written at step j decayed by alpha_j as well
    (``once_too_often``), the entering state read without diag(gamma), the writes not decayed to the
    chunk's end, Gamma as a ratio of products, the mask multiplied after exp, or a [D, D] zero state
    when there is none."""
    B, H, T, D = q.shape
    S = q.new_zeros(B, H, D if square else v.shape[-1], D) if initial_state is None else initial_state
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = q[:, :, s:s + chunk_size], k[:, :, s:s + chunk_size], v[:, :, s:s + chunk_size]
        la = g[:, :, s:s + chunk_size]
        b = la.cumsum(-1)
        b_j = b - la if once_too_often else b          # exp(b_t - b_j + log alpha_j)
        L = b.shape[-1]
        keep = torch.ones(L, L, dtype=torch.bool).tril()
        if ratio:                                       # products gamma_t, then ratios: 0 / 0 after a reset
            gamma = (b.exp()[..., :, None] / b_j.exp()[..., None, :]).masked_fill(~keep, 0.0)
            to_end = b.exp()[..., -1:] / b_j.exp()
        elif mask_after_exp:                            # multiplied: exp(+800) * 0 is NaN
            gamma = torch.exp(b[..., :, None] - b_j[..., None, :]) * keep.to(q.dtype)
            to_end = torch.exp(b[..., -1:] - b_j)
        else:
            gamma = torch.exp((b[..., :, None] - b_j[..., None, :]).masked_fill(~keep, float("-inf")))
            to_end = torch.exp(b[..., -1:] - b_j)
        read = qc @ S.transpose(-1, -2)
        read = read if undecayed_state else b.exp()[..., None] * read
        outs.append(((qc @ kc.transpose(-1, -2)) * gamma) @ vc + read)
        to_end = torch.ones_like(to_end) if undecayed_write else to_end
        S = torch.exp(b[..., -1])[..., None, None] * S + (vc * to_end[..., None]).transpose(-1, -2) @ kc
    return torch.cat(outs, dim=2), S


def _gated_once_too_often(q, k, v, g, initial_state, chunk_size):
    return _gated_variant(q, k, v, g, initial_state, chunk_size, once_too_often=True)


def _gated_state_undecayed(q, k, v, g, initial_state, chunk_size):
    return _gated_variant(q, k, v, g, initial_state, chunk_size, undecayed_state=True)


def _gated_write_undecayed(q, k, v, g, initial_state, chunk_size):
    return _gated_variant(q, k, v, g, initial_state, chunk_size, undecayed_write=True)


def _gated_ratio(q, k, v, g, initial_state, chunk_size):
    return _gated_variant(q, k, v, g, initial_state, chunk_size, ratio=True)


def _gated_mask_after_exp(q, k, v, g, initial_state, chunk_size):
    return _gated_variant(q, k, v, g, initial_state, chunk_size, mask_after_exp=True)


def _gated_square_zeros(q, k, v, g, initial_state, chunk_size):
    return _gated_variant(q, k, v, g, initial_state, chunk_size, square=True)


def _gated_recurrence(q, k, v, g, initial_state):
    """The definition, token by token, in float64: ``S_t = alpha_t S_{t-1} + v_t k_t^T``,
    ``o_t = S_t q_t``."""
    B, H, T, D = q.shape
    S = torch.zeros(B, H, v.shape[-1], D, dtype=f64) if initial_state is None else initial_state.to(f64)
    outs = []
    for t in range(T):
        S = torch.exp(g[:, :, t].to(f64))[..., None, None] * S \
            + v[:, :, t, :, None].to(f64) * k[:, :, t, None, :].to(f64)
        outs.append((S @ q[:, :, t, :, None].to(f64))[..., 0])
    return torch.stack(outs, dim=2), S


def _gated_cases(gen):
    randn = _randn(gen)

    def c(label, T, D, Dv, L, g, S0=True, B=1, H=2, hint="", library=False, tol=_TOL):
        q, k, v = randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, Dv)
        S = randn(B, H, Dv, D) if S0 else None
        la = g(B, H, T)
        # With alpha = 1 the gated form is linear attention itself: the library's answer.
        want = _reference(q, k, v, S, mode="recurrent") if library else _gated_recurrence(q, k, v, la, S)
        return Case(label, (q, k, v, la, S, L), want, tol=tol, hint=hint)

    def uniform(lo):
        return lambda *shape: torch.rand(*shape, generator=gen, dtype=f64) * lo

    def reset(*shape):
        la = torch.rand(*shape, generator=gen, dtype=f64) * -0.3
        la[..., 5] = -800.0                    # alpha = e^-800 = 0 in float64: the state is wiped
        return la

    return [
        c("random gates in [e^-0.5, 1], B = 2, H = 2, T = 12 in chunks of 4, D = Dv = 4, S_0", 12, 4, 4, 4,
          uniform(-0.5), B=2),
        c("T = 13 in chunks of 4 (the last has 1 row), D = 4, Dv = 3, S_0", 13, 4, 3, 4, uniform(-0.5),
          hint="T need not be a multiple of L: the last chunk is shorter, and its rows count too"),
        c("alpha = 1 (g = 0): plain linear attention, T = 12 in chunks of 4", 12, 3, 3, 4,
          lambda *shape: torch.zeros(*shape, dtype=f64), library=True),
        c("a constant alpha = 0.9 (RetNet), no initial state, D = 4, Dv = 3, T = 16 in chunks of 8", 16, 4,
          3, 8, lambda *shape: torch.full(shape, math.log(0.9), dtype=f64), S0=False,
          hint="with no initial state, start from zeros of the state's shape [B, H, Dv, D], with "
               "Dv = v.shape[-1], which need not be D"),
        c("chunks of 1: the gated recurrence, T = 6", 6, 3, 2, 1, uniform(-1.0)),
        c("T = 1, chunks of 4", 1, 4, 3, 4, uniform(-1.0),
          hint="with T = 1 there is one chunk, of one row: shorter than L"),
        # tol: float32 keeps cumulative sums near -800 to 6e-5, so a float32 answer is only that close.
        c("a reset (alpha = e^-800) at t = 5, one chunk of 12", 12, 4, 3, 12, reset, tol=1e-4,
          hint="form Gamma as exp of differences of cumulative g = log alpha, the upper triangle set to "
               "-inf before exp: a ratio of products is 0 / 0 here, and exp(+800) * 0 is NaN"),
    ]


def _constant_gate(case) -> bool:
    g = case.args[3]
    return bool((g < 0).all() and (g == g.flatten()[0]).all())


def _gates_vary(case) -> bool:
    g = case.args[3]
    return bool((g != g[..., :1]).any() and (g != g[:1, :1]).any())


GATED = Exercise(
    name="gated chunkwise linear attention",
    chapter="3",
    title="Gated chunks",
    statement=(
        "A forget gate $S_t=\\alpha_tS_{t-1}+v_tk_t^\\top$ turns the causal mask into the decay mask "
        "$\\Gamma_{tj}=\\prod_{r=j+1}^t\\alpha_r$. Write the chunkwise form of the chapter's exercise 3: "
        "with $\\gamma_t=\\prod_{r\\le t}\\alpha_r$ inside a chunk of $L$ rows, "
        "$O_c=(Q_cK_c^\\top\\odot\\Gamma_L)V_c+\\mathrm{diag}(\\gamma)Q_cS_{c-1}^\\top$ and "
        "$S_c=\\gamma_LS_{c-1}+\\sum_j(\\gamma_L/\\gamma_j)v_jk_j^\\top$, from the log-decays "
        "$g_t=\\log\\alpha_t$ and a given $S_0$ (left unchanged) or zeros. It must agree with the "
        "recurrence for gates that differ per token and head, $\\alpha=1$, a constant $\\alpha$, $L=1$, "
        "$T=1$, $L$ not dividing $T$, $D\\ne D_v$ without $S_0$, and a gate of $e^{-800}$ that wipes the "
        "state."),
    solution=gated_linear_attention,
    cases=_gated_cases,
    wrong=(Wrong(_gated_once_too_often, "once too often"), Wrong(_gated_state_undecayed, "diag(gamma)"),
           Wrong(_gated_write_undecayed, "gamma_l / gamma_j"), Wrong(_gated_ratio, "ratio of products"),
           Wrong(_gated_mask_after_exp, "before exp"), Wrong(_gated_square_zeros, "[b, h, dv, d]")),
    diagnose=((matches(_gated_once_too_often), "the decay is applied once too often: the key written at "
                                               "step j is not decayed by alpha_j (Gamma_tj runs over r = "
                                               "j+1..t)"),
              (matches(_gated_state_undecayed), "the state entering the chunk must decay too: multiply "
                                                "Q_c S_{c-1}^T by diag(gamma), gamma_t = prod_{r<=t} "
                                                "alpha_r"),
              (matches(_gated_write_undecayed), "each write decays to the chunk's end before it joins "
                                                "the state: S_c = gamma_L S_{c-1} + sum_j (gamma_L / "
                                                "gamma_j) v_j k_j^T"),
              (_state_transposed, _TRANSPOSED)),
    freedoms=(Freedom("gates that differ per token and per head", _gates_vary),
              Freedom("alpha = 1 (g = 0)", lambda c: bool((c.args[3] == 0).all())),
              Freedom("a constant alpha < 1", _constant_gate),
              Freedom("a gate that wipes the state (g = -800)", lambda c: bool((c.args[3] <= -700).any())),
              Freedom("T not a multiple of L", _chunks(lambda T, L: T % L != 0)),
              Freedom("L = 1", _chunks(lambda T, L: L == 1)),
              Freedom("T = 1", _chunks(lambda T, L: T == 1)),
              Freedom("no initial state (None) with D ≠ Dv", _no_state_d_ne_dv(4)),
              Freedom("a non-symmetric S_0 with D = Dv", _state_with(4, asymmetric=True))),
    fresh_output=True,
)


# --- 4. the decode step -----------------------------------------------------------------------------

def linear_decode_step(q, k, v, initial_state, scale):
    """One token of normalised linear attention, ``phi(x) = elu(x) + 1``:
    ``q, k [B, H, 1, D]``, ``v [B, H, 1, Dv]``,
    ``initial_state [B, H, Dv + 1, D]`` (rows ``S``; last row
    ``kappa = sum phi(k)``) or None (zeros). Add ``v phi(k)^T`` and ``phi(k)``,
    then ``o = S phi(scale q) / (kappa . phi(scale q) + 1e-6)``. Return
    ``(o [B, H, 1, Dv], new state [B, H, Dv + 1, D])``; leave
    ``initial_state`` unchanged."""
    # scale multiplies q before the map
    phi_q = torch.nn.functional.elu(scale * q) + 1
    phi_k = torch.nn.functional.elu(k) + 1
    # A ones column appended to v writes kappa (the normaliser) as one more row
    # of the state: [B, H, 1, Dv + 1].
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    if initial_state is None:
        initial_state = q.new_zeros(q.shape[0], q.shape[1], v1.shape[-1],
                                    q.shape[-1])
    # + [v; 1] phi(k)^T, into a new state (not +=: the caller keeps theirs)
    S = initial_state + v1.transpose(-1, -2) @ phi_k
    o = phi_q @ S.transpose(-1, -2)                # [S phi(q); kappa . phi(q)]
    # 1e-6 keeps a vanishing normaliser finite
    return o[..., :-1] / (o[..., -1:] + 1e-6), S


def _decode_variant(q, k, v, initial_state, scale, *, eps=1e-6, scale_after=False, old_normaliser=False,
                    rows=None, in_place=False):
    """The step with one thing changed: no 1e-6, the scale applied after the map, the normaliser read
    from the state before this token, a zero state of ``rows(D, Dv)`` rows when there is none, or the
    caller's state updated in place."""
    phi = lambda x: torch.nn.functional.elu(x) + 1            # noqa: E731
    phi_q = phi(q) * scale if scale_after else phi(scale * q)
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
    B, H, _, D = q.shape
    n = (rows or (lambda D, Dv: Dv + 1))(D, v.shape[-1])
    S0 = q.new_zeros(B, H, n, D) if initial_state is None else initial_state
    write = v1.transpose(-1, -2) @ phi(k)
    if in_place:
        S0 += write
        S = S0
    else:
        S = S0 + write
    o = phi_q @ S.transpose(-1, -2)
    z = (phi_q @ (S - write)[..., -1:, :].transpose(-1, -2)) if old_normaliser else o[..., -1:]
    return o[..., :-1] / (z + eps), S


def _decode_no_eps(q, k, v, initial_state, scale):
    return _decode_variant(q, k, v, initial_state, scale, eps=0.0)


def _decode_scale_after(q, k, v, initial_state, scale):
    return _decode_variant(q, k, v, initial_state, scale, scale_after=True)


def _decode_old_normaliser(q, k, v, initial_state, scale):
    return _decode_variant(q, k, v, initial_state, scale, old_normaliser=True)


def _decode_no_kappa_row(q, k, v, initial_state, scale):
    return _decode_variant(q, k, v, initial_state, scale, rows=lambda D, Dv: D + 1)


def _decode_in_place(q, k, v, initial_state, scale):
    return _decode_variant(q, k, v, initial_state, scale, in_place=True)


def _decode_cases(gen):
    randn = _randn(gen)

    def prefix_state(B, H, T, D, Dv, scale, v=None):
        v = randn(B, H, T, Dv) if v is None else v
        _, S = linear_attention(randn(B, H, T, D), randn(B, H, T, D), v, scale=scale, feature_map="elu1",
                                causal=True, normalize=True, output_final_state=True, backend="torch")
        return S

    def c(label, q, k, v, state, scale, hint=""):
        want = linear_attention_decode_step(q, k, v, initial_state=state, scale=scale, feature_map="elu1",
                                            normalize=True)
        return Case(label, (q, k, v, state, scale), want, tol=_TOL, hint=hint)

    def positive(*shape):
        return torch.rand(*shape, generator=gen, dtype=f64) + 0.5

    return [
        c("after a prefix of 7 tokens, B = 2, H = 2, D = 4, Dv = 3, scale = 0.5", randn(2, 2, 1, 4),
          randn(2, 2, 1, 4), randn(2, 2, 1, 3), prefix_state(2, 2, 7, 4, 3, 0.5), 0.5),
        c("the first token (state None), D = 8, Dv = 2, scale = 1 / sqrt(8)", randn(1, 3, 1, 8),
          randn(1, 3, 1, 8), randn(1, 3, 1, 2), None, 8 ** -0.5,
          hint="with no state, start from zeros of shape [B, H, Dv + 1, D] (Dv value rows and kappa): "
               "the token then reads only itself"),
        c("scale = 3 after a prefix of 20 tokens", randn(1, 1, 1, 5), randn(1, 1, 1, 5), randn(1, 1, 1, 4),
          prefix_state(1, 1, 20, 5, 4, 3.0), 3.0,
          hint="scale multiplies q before the feature map: phi(scale q), not scale phi(q)"),
        # positive values: o is then a weighted mean, with no cancellation to magnify float32's rounding
        c("D = 1, Dv = 1 (values in [0.5, 1.5])", randn(1, 1, 1, 1), randn(1, 1, 1, 1), positive(1, 1, 1, 1),
          prefix_state(1, 1, 3, 1, 1, 1.0, v=positive(1, 1, 3, 1)), 1.0),
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
        "$\\phi(x)=\\mathrm{elu}(x)+1$ applied to the scaled query. Write one step, returning a new state "
        "and leaving the given one unchanged: from a state left by a prefix, from no state (zeros) with "
        "$D\\ne D_v$, with $D=D_v=1$, and with queries so negative that $\\phi(q)$ vanishes. The inputs "
        "are float64; float32 arithmetic is accurate enough (the checker allows a relative error of "
        "$10^{-5}$)."),
    solution=linear_decode_step,
    cases=_decode_cases,
    wrong=(Wrong(_decode_no_eps, "1e-6"), Wrong(_decode_scale_after, "before the feature map"),
           Wrong(_decode_old_normaliser, "this token's key"), Wrong(_decode_no_kappa_row, "dv + 1"),
           Wrong(_decode_in_place, "changed its input `initial_state` in place")),
    diagnose=((matches(_decode_scale_after, leaf=0), "scale multiplies q before the feature map: "
                                                     "phi(scale q), not scale phi(q), whose factor "
                                                     "cancels in the ratio"),
              (matches(_decode_old_normaliser, leaf=0), "your normaliser misses this token's key: add "
                                                        "phi(k_t) to kappa before dividing"),
              (matches(_decode_no_eps, leaf=0), "divide by kappa . phi(q) + 1e-6, as the library "
                                                "does: the 1e-6 matters when the normaliser is "
                                                "small, and keeps o finite when it vanishes")),
    freedoms=(Freedom("a state left by a prefix (B, H > 1)", lambda c: c.args[3] is not None and _batched(c)),
              Freedom("no state (None) with D ≠ Dv", _no_state_d_ne_dv(3)),
              Freedom("scale ≠ 1", lambda c: c.args[4] != 1.0),
              Freedom("D = Dv = 1", lambda c: _shape(c)[3] == 1 and _shape(c)[4] == 1),
              Freedom("a vanishing normaliser", lambda c: bool((c.args[0] < -30).all()))),
    fresh_output=True,
)


EXERCISES = (RECURRENT, CHUNK, GATED, DECODE)
