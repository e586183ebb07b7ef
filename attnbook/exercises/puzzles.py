"""The appendix's kernel puzzles: four ``@triton.jit`` functions that kernels are built from -- the
online-softmax update of a query tile, the causal mask of a score tile, a chunk's state update from its
WY factors, and the UT factor of a chunk by forward substitution.

The reader writes the device function; a small harness kernel here loads its tiles, calls it (passed as
a ``tl.constexpr`` argument) and stores what it returns, through Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1`` must be set before triton is first imported). Errors raised inside the
interpreter arrive wrapped in ``InterpreterError`` s; the harness unwraps them, so that the reader reads
the error their code raised, and a stub that still raises ``NotImplementedError`` is "not attempted".
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from attnlib.deltanet import delta_rule_recurrent_reference, ut_transform
from attnlib.linear import linear_attention_recurrent_reference

from ._checker import Case, Exercise, Freedom, Wrong, agree

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the puzzles need triton; the other chapters' exercises do not
    class _NoTriton:
        """Lets this module (and so ``attnbook.exercises``) import without triton; its harness says why not."""

        @staticmethod
        def jit(fn):
            return fn

    triton, tl = _NoTriton(), None

f32, f64 = torch.float32, torch.float64
NEG_INF = float("-inf")


# --- the harness: launch a reader's device function inside a kernel, through the interpreter --------

def _raised_by_reader(e: BaseException) -> bool:
    """Whether ``e`` was raised by code outside triton (the reader's), not by the interpreter itself."""
    tb = e.__traceback__
    if tb is None:
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return os.sep + "triton" + os.sep not in tb.tb_frame.f_code.co_filename


def _launch(kernel, grid, *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, with the interpreter's wrapped errors unwrapped: the reader's
    ``NotImplementedError`` (an unfilled stub) as itself, any other error as the one their code raised."""
    if tl is None:
        raise RuntimeError("the kernel puzzles need Triton: pip install triton")
    if type(kernel).__name__ != "InterpretedFunction":
        raise RuntimeError("the kernel puzzles run on the CPU through Triton's interpreter: set "
                           "os.environ['TRITON_INTERPRET'] = '1' before triton or attnlib is first imported "
                           "(restart the kernel)")
    try:
        with warnings.catch_warnings():             # numpy's overflow and NaN warnings: the checker says more
            warnings.simplefilter("ignore", RuntimeWarning)
            kernel[grid](*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - unwrapped below
        chain, x = [], e
        while x is not None and all(x is not c for c in chain):
            chain.append(x)
            x = x.__cause__
        if any(isinstance(c, NotImplementedError) and _raised_by_reader(c) for c in chain):
            raise NotImplementedError from None
        raise chain[-1] from None


def _returning(fn, name: str, shapes: tuple):
    """``fn`` (a ``@triton.jit`` function) wrapped so that the harness kernel checks what it returns:
    ``len(shapes)`` tiles (one tile when ``shapes`` has one entry) of the given shapes. Under the
    interpreter the kernel calls it as Python."""

    if not callable(getattr(fn, "fn", None)):
        # a @triton.jit function wraps the Python one as .fn; the interpreter would run a plain
        # function too, but a compiled kernel can call only @triton.jit ones
        raise TypeError(f"`{name}` is not a Triton function: put @triton.jit above its def")

    def call(*args):
        out = fn(*args)
        if out is None:
            raise TypeError(f"`{name}` returned None (a missing `return`?)")
        outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(outs) != len(shapes):
            raise TypeError(f"`{name}` returned {len(outs)} value(s); expected {len(shapes)}")
        for i, (o, want) in enumerate(zip(outs, shapes)):
            got = [int(getattr(d, "value", d)) for d in getattr(o, "shape", ())]
            if got != list(want):
                which = f"value {i} of " if len(shapes) > 1 else ""
                raise ValueError(f"{which}`{name}` has shape {got}; expected a tile of shape {list(want)}")
        return out

    return call


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "your function")


def _pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, (n - 1).bit_length()))



# --- 1. the online-softmax update ------------------------------------------------------------------

@triton.jit
def online_softmax_update(acc, l, m, s, v):
    """Fold one key tile into a query tile's running state: ``acc [BM, DV]``,
    ``l, m [BM]`` (float32; ``m = -inf``, ``l = 0``, ``acc = 0`` for a row with
    no key yet), scores ``s [BM, BN]`` (for ``tl.exp``, not ``exp2``; ``-inf`` =
    masked), values ``v [BN, DV]``. Return ``(acc, l, m)`` over the keys seen
    plus this tile."""
    # the running maximum over every key seen
    m_new = tl.maximum(m, tl.max(s, 1))
    # A row with only -inf so far keeps m = -inf; measure it against 0, since
    # exp(-inf - (-inf)) is NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    # <= 1: the old sums, re-measured against m_new
    alpha = tl.exp(m - m_ref)
    # every term <= 1: no overflow at any scale
    p = tl.exp(s - m_ref[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v)
    return acc, l, m_new


@triton.jit
def _softmax_no_rescale(acc, l, m, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_ref)
    p = tl.exp(s - m_ref[:, None])
    return acc + tl.dot(p, v), l * alpha + tl.sum(p, 1), m_new


@triton.jit
def _softmax_nan_rows(acc, l, m, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    return acc * alpha[:, None] + tl.dot(p, v), l * alpha + tl.sum(p, 1), m_new


@triton.jit
def _softmax_tile_max(acc, l, m, s, v):
    m_new = tl.max(s, 1)                                  # the tile's max, forgetting the old one
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_ref)
    p = tl.exp(s - m_ref[:, None])
    return acc * alpha[:, None] + tl.dot(p, v), l * alpha + tl.sum(p, 1), m_new


@triton.jit
def _softmax_masked_as_zero(acc, l, m, s, v):
    s = tl.where(s == float("-inf"), 0.0, s)              # -inf "cleaned" to 0: a masked key counts
    m_new = tl.maximum(m, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_ref)
    p = tl.exp(s - m_ref[:, None])
    return acc * alpha[:, None] + tl.dot(p, v), l * alpha + tl.sum(p, 1), m_new


@triton.jit
def _softmax_exp_ratio(acc, l, m, s, v):
    m_new = tl.maximum(m, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m) / tl.exp(m_ref)                     # a ratio of exponentials: inf / inf past 88
    p = tl.exp(s) / tl.exp(m_ref)[:, None]
    return acc * alpha[:, None] + tl.dot(p, v), l * alpha + tl.sum(p, 1), m_new


@triton.jit
def _softmax_kernel(ACC, L, M, S, V, fn: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_DV: tl.constexpr):
    rm, rn, rd = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_DV)
    acc = tl.load(ACC + rm[:, None] * BLOCK_DV + rd[None, :])
    l = tl.load(L + rm)
    m = tl.load(M + rm)
    s = tl.load(S + rm[:, None] * BLOCK_N + rn[None, :])
    v = tl.load(V + rn[:, None] * BLOCK_DV + rd[None, :])
    acc, l, m = fn(acc, l, m, s, v)
    tl.store(ACC + rm[:, None] * BLOCK_DV + rd[None, :], acc)
    tl.store(L + rm, l)
    tl.store(M + rm, m)


def _softmax_harness(fn):
    def call(acc, l, m, s, v):
        acc, l, m, s, v = (x.to(f32).contiguous().clone() for x in (acc, l, m, s, v))
        BM, BN, DV = s.shape[0], s.shape[1], v.shape[1]
        wrapped = _returning(fn, _name(fn), ((BM, DV), (BM,), (BM,)))
        _launch(_softmax_kernel, (1,), acc, l, m, s, v, fn=wrapped, BLOCK_M=BM, BLOCK_N=BN, BLOCK_DV=DV)
        return acc, l, m
    return call


def _softmax_state(s, v):
    """The state over the keys of ``s [BM, N]`` from its definition, in float64: ``m`` the row max
    (``-inf`` for a row of ``-inf``), ``l = sum exp(s - m)``, ``acc = sum exp(s - m) v`` (0 for that row)."""
    s, v = s.to(f64), v.to(f64)
    m = s.amax(-1) if s.shape[-1] else torch.full(s.shape[:1], NEG_INF, dtype=f64)
    ref = torch.where(m == NEG_INF, 0.0, m)
    p = torch.exp(s - ref[:, None])
    return p @ v, p.sum(-1), m


def _softmax_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def c(label, s_seen, v_seen, s, v, hint=""):
        acc, l, m = _softmax_state(s_seen, v_seen)
        args = (acc.to(f32), l.to(f32), m.to(f32), s.to(f32), v.to(f32))
        # the expected state: the definition over all the keys, from the float32 inputs
        want = _softmax_state(torch.cat([s_seen.to(f32).to(f64), s.to(f32).to(f64)], 1),
                              torch.cat([v_seen.to(f32).to(f64), v.to(f32).to(f64)], 0))
        return Case(label, args, want, hint=hint)

    BM, BN, DV = 16, 16, 16
    up = torch.zeros(BM, 1, dtype=f64)
    up[:8] = 30.0                                                  # rows 0-7: the tile 30 higher
    causal = torch.ones(BM, BN, dtype=torch.bool).tril()           # row i sees keys j <= i
    blind = torch.ones(BM, BN, dtype=torch.bool)
    blind[:5] = False                                              # rows 0-4 see no key of this tile
    blind[5:] = causal[5:]
    half = randn(BM, BN).masked_fill(torch.rand(BM, BN, generator=gen) < 0.4, NEG_INF)
    half[:, 0] = randn(BM)                                         # every row keeps one key
    return [
        c("24 keys seen, a 16 x 32 tile of scores, DV = 16", 2 * randn(BM, 24), randn(24, DV),
          2 * randn(BM, 32), randn(32, DV)),
        c("rows 0-7: the tile's scores 30 above m; rows 8-15: 30 below", 30 - up + randn(BM, 8),
          randn(8, DV), up + randn(BM, BN), randn(BN, DV),
          hint="in rows 0-7 the maximum moves up: multiply the old l and acc by exp(m - m_new); in rows "
               "8-15 it stays: m_new = max(m, the tile's max) never decreases"),
        c("a tile with 40% of its scores masked (-inf)", randn(BM, 8), randn(8, DV), half, randn(BN, DV),
          hint="-inf is a masked key: exp(-inf - m_new) = 0 adds nothing to l or acc; keep the -inf as it "
               "is"),
        c("the first tile (m = -inf); rows 0-4 have no key in it either", randn(BM, 0), randn(0, DV),
          randn(BM, BN).masked_fill(~blind, NEG_INF), randn(BN, DV),
          hint="a row with only -inf scores keeps m = -inf, l = 0, acc = 0: exp(-inf - (-inf)) is NaN; "
               "measure such a row against 0 (the other rows start from the empty state: exp(-inf) = 0)"),
        c("scores of 1e4 (float32), BN = 32, DV = 32", 1e4 * randn(BM, 8), randn(8, 32),
          1e4 * randn(BM, 32), randn(32, 32),
          hint="scores of 1e4: exp(1e4) overflows, and so does a ratio exp(s) / exp(m_new); every "
               "exponent must be a score minus the running maximum"),
    ]


def _rows(case, test) -> bool:
    """Whether ``test(m, the tile's row max)`` holds for some row of the case's state and tile."""
    m, s = case.args[2], case.args[3]
    return bool(test(m, s.amax(1)).any())


def _softmax_unrescaled(got, expected, case) -> bool:
    acc, l, m, s, v = (x.to(f64) for x in case.args)
    m_new = torch.maximum(m, s.amax(1))
    ref = torch.where(m_new == NEG_INF, 0.0, m_new)
    alt = acc + torch.exp(s - ref[:, None]) @ v
    return not agree(got[0], expected[0], 1e-4) and agree(got[0], alt, 1e-4)


def _softmax_masked_counted(got, expected, case) -> bool:
    acc, l, m, s, v = (x.to(f64) for x in case.args)
    s = torch.where(s == NEG_INF, 0.0, s)
    m_new = torch.maximum(m, s.amax(1))
    ref = torch.where(m_new == NEG_INF, 0.0, m_new)
    alpha, p = torch.exp(m - ref), torch.exp(s - ref[:, None])
    alt = (acc * alpha[:, None] + p @ v, l * alpha + p.sum(1), m_new)
    return not agree(got, expected, 1e-4) and agree(got, alt, 1e-4)


def _softmax_m_is_tile_max(got, expected, case) -> bool:
    return not agree(got[2], expected[2], 1e-6) and agree(got[2], case.args[3].to(f64).amax(1), 1e-6)


ONLINE_SOFTMAX = Exercise(
    name="online softmax tile",
    chapter="A",
    title="The online-softmax update of a query tile",
    statement=(
        "The flash forward keeps, for each query row, the running maximum $m_i$ of the scores seen, "
        "$\\ell_i=\\sum_j e^{s_{ij}-m_i}$ and $\\mathrm{acc}_i=\\sum_j e^{s_{ij}-m_i}v_j$, and folds in one "
        "tile of keys at a time. Write that fold as a `@triton.jit` device function (natural `tl.exp`; the "
        "library's kernel uses base 2). It must hold when the maximum moves or stays, on the first tile, "
        "with masked scores, for rows that have seen no key yet, and at scores of $10^4$."),
    solution=online_softmax_update,
    cases=_softmax_cases,
    wrong=(Wrong(_softmax_no_rescale, "rescale acc"),
           Wrong(_softmax_nan_rows, "measure such a row against 0"),
           Wrong(_softmax_tile_max, "running maximum"),
           Wrong(_softmax_masked_as_zero, "keep the -inf"),
           Wrong(_softmax_exp_ratio, "a score minus the running maximum")),
    diagnose=((_softmax_unrescaled, "acc was not rescaled: the old sum is measured against the old "
                                    "maximum; rescale acc (like l) by exp(m - m_new) before adding p @ v"),
              (_softmax_m_is_tile_max, "your m is the tile's maximum: m must be the running maximum over "
                                       "every key seen, max(m, the tile's max)"),
              (_softmax_masked_counted, "you counted the masked scores as 0: -inf is a masked key, and "
                                        "exp(-inf - m_new) = 0 adds nothing to l or acc; keep the -inf")),
    imports="import torch\nimport triton\nimport triton.language as tl",
    harness=_softmax_harness,
    freedoms=(
        Freedom("the maximum moves", lambda c: _rows(c, lambda m, t: (m > -math.inf) & (t > m))),
        Freedom("the maximum stays", lambda c: _rows(c, lambda m, t: (t > -math.inf) & (t < m))),
        Freedom("the first tile (m = -inf)", lambda c: bool((c.args[2] == -math.inf).all())),
        Freedom("masked scores (-inf)", lambda c: bool((c.args[3] == -math.inf).any())),
        Freedom("rows with no key yet and none in the tile",
                lambda c: _rows(c, lambda m, t: (m == -math.inf) & (t == -math.inf))),
        Freedom("scores of 1e4", lambda c: c.args[3].abs().nan_to_num(posinf=0).amax().item() > 1e3),
        Freedom("tiles of 32 keys (BN ≠ BM)", lambda c: c.args[3].shape[1] != c.args[3].shape[0]),
    ),
)


# --- 2. the causal mask of a score tile ------------------------------------------------------------

@triton.jit
def causal_mask(s, start_m, start_n, T_K,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Mask the scores ``s [BLOCK_M, BLOCK_N]`` of queries
    ``start_m + 0 .. BLOCK_M-1`` against keys ``start_n + 0 .. BLOCK_N-1``:
    query ``i`` sees keys ``j <= i`` with ``j < T_K``; entries past ``T_K`` hold
    garbage. Return ``s`` with ``-inf`` where the key is not seen, the other
    scores unchanged."""
    # positions in the sequence, not in the tile
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    seen = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T_K)
    # a select: garbage (even NaN) is replaced
    return tl.where(seen, s, float("-inf"))


@triton.jit
def _mask_strict(s, start_m, start_n, T_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    return tl.where((offs_n[None, :] < offs_m[:, None]) & (offs_n[None, :] < T_K), s, float("-inf"))


@triton.jit
def _mask_in_tile(s, start_m, start_n, T_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    return tl.where((rn[None, :] <= rm[:, None]) & (start_n + rn[None, :] < T_K), s, float("-inf"))


@triton.jit
def _mask_no_bound(s, start_m, start_n, T_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    return tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))


@triton.jit
def _mask_additive(s, start_m, start_n, T_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    seen = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T_K)
    return s + tl.where(seen, 0.0, float("-inf"))


@triton.jit
def _mask_square(s, start_m, start_n, T_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_M)              # BLOCK_M keys: a square tile assumed
    seen = (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < T_K)
    return tl.where(seen, s, float("-inf"))


@triton.jit
def _mask_kernel(S, OUT, T_Q, T_K, N_PAD, fn: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    start_n = tl.program_id(1) * BLOCK_N
    rows = start_m + tl.arange(0, BLOCK_M)
    cols = start_n + tl.arange(0, BLOCK_N)
    inside = (rows[:, None] < T_Q) & (cols[None, :] < T_K)
    # past the ends of the sequence: garbage, as from an unmasked load (NaN, the worst kind)
    s = tl.load(S + rows[:, None] * T_K + cols[None, :], mask=inside, other=float("nan"))
    s = fn(s, start_m, start_n, T_K, BLOCK_M, BLOCK_N)
    tl.store(OUT + rows[:, None] * N_PAD + cols[None, :], s, mask=rows[:, None] < T_Q)


def _mask_harness(fn):
    def call(s, block_m, block_n):
        s = s.to(f32).contiguous()
        T_Q, T_K = s.shape
        n_pad = -(-T_K // block_n) * block_n
        out = torch.zeros(T_Q, n_pad, dtype=f32)
        wrapped = _returning(fn, _name(fn), ((block_m, block_n),))
        _launch(_mask_kernel, (-(-T_Q // block_m), n_pad // block_n), s, out, T_Q, T_K, n_pad, fn=wrapped,
                BLOCK_M=block_m, BLOCK_N=block_n)
        return out
    return call


def _tile_kind(i, j, bm, bn) -> str:
    m0, n0 = i // bm * bm, j // bn * bn
    where = ("entirely below the diagonal: every key is in every query's past" if n0 + bn - 1 <= m0
             else "entirely above the diagonal" if n0 > m0 + bm - 1 else "on the diagonal")
    return f"the tile of queries {m0}-{m0 + bm - 1}, keys {n0}-{n0 + bn - 1}, lies {where}"


def _mask_judge(s, bm, bn):
    T_Q, T_K = s.shape
    n_pad = -(-T_K // bn) * bn
    i = torch.arange(T_Q)[:, None]
    j = torch.arange(n_pad)[None, :]
    exists = j < T_K
    seen = (j <= i) & exists
    # the masks of the usual mistakes: j < i; positions inside the tile; no bound on the keys
    in_tile = (j % bn <= i % bm) & exists
    mistakes = (((j < i) & exists, "Your mask is j < i: query i sees keys j <= i, itself included"),
                (in_tile, "Your mask compares positions inside the tile: compare positions in the "
                          "sequence, start_m + row with start_n + column"),
                (j <= i, "You kept keys past the end of the keys: mask j >= T_K too, even where j <= i"))

    def judge(got):
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (T_Q, n_pad):
            return f"expected a [{T_Q}, {n_pad}] tile grid back, got {getattr(got, 'shape', type(got))}"
        padded = torch.full((T_Q, n_pad), float("nan"))
        padded[:, :T_K] = s
        wrong = torch.where(seen, got != padded, got != NEG_INF)
        if not wrong.any():
            return None
        n = int(wrong.sum())
        a, b = (int(x) for x in wrong.nonzero()[0])
        value = got[a, b].item()
        if seen[a, b] and value == NEG_INF:
            what = f"key {b} is in query {a}'s past but masked"
            if a == b:
                what = f"query {a}'s own key is masked"
        elif seen[a, b]:
            what = f"the score of query {a}, key {b} changed ({s[a, b].item():.4g} -> {value:.4g})"
        elif b >= T_K:
            what = f"key {b} is past the end of the keys (T_K = {T_K}) but came back {value:.4g}"
        else:
            what = f"key {b} is in query {a}'s future but came back {value:.4g}, not -inf"
        out = f"{n} entr{'y' if n == 1 else 'ies'} wrong; the first: {what} ({_tile_kind(a, b, bm, bn)})"
        masked = got == NEG_INF
        for keep, why in mistakes:
            if torch.equal(masked, ~keep):
                return f"{out}. {why}"
        if bool(torch.isnan(got)[wrong].all()) and not bool(seen[wrong].any()):
            return (f"{out}. Masked scores must be -inf, and those past the ends are garbage (NaN here): "
                    "NaN - inf is NaN; select with tl.where, do not add -inf")
        return out

    return judge


def _mask_cases(gen):
    def c(label, T_Q, T_K, bm, bn, hint=""):
        s = torch.randn(T_Q, T_K, generator=gen, dtype=f64).to(f32)
        return Case(label, (s, bm, bn), judge=_mask_judge(s, bm, bn), hint=hint)

    return [
        c("T = 48, 32 x 16 tiles: below, on and above the diagonal", 48, 48, 32, 16),
        c("T = 16, one 16 x 16 tile on the diagonal", 16, 16, 16, 16),
        c("T = 40, 16 x 16 tiles: the last tiles ragged", 40, 40, 16, 16),
        c("T = 37, 16 x 32 tiles: the diagonal crosses mid-tile", 37, 37, 16, 32),
        c("40 queries, 24 keys: the late queries see every key", 40, 24, 16, 16),
        c("T = 1", 1, 1, 16, 16),
    ]


CAUSAL_MASK = Exercise(
    name="causal mask tile",
    chapter="A",
    title="The causal mask of a score tile",
    statement=(
        "A program holds the scores of `BLOCK_M` queries starting at `start_m` against `BLOCK_N` keys "
        "starting at `start_n`. Set to $-\\infty$ every score of a key that query $i$ must not see -- "
        "$j>i$, or $j\\ge T_K$, where the load read past the end -- and leave the rest unchanged. The "
        "harness runs it on every tile of the grid: tiles below, on and above the diagonal, ragged last "
        "tiles holding garbage (NaN), tiles wider than tall, fewer keys than queries, $T=1$."),
    solution=causal_mask,
    cases=_mask_cases,
    wrong=(Wrong(_mask_strict, "itself included"), Wrong(_mask_in_tile, "positions in the sequence"),
           Wrong(_mask_no_bound, "mask j >= t_k"), Wrong(_mask_additive, "tl.where"),
           Wrong(_mask_square, "raised")),
    imports="import torch\nimport triton\nimport triton.language as tl",
    harness=_mask_harness,
    freedoms=(
        Freedom("several tiles each way", lambda c: c.args[0].shape[0] > c.args[1]
                and c.args[0].shape[1] > c.args[2]),
        Freedom("ragged last tiles (T_K not a multiple of BLOCK_N)", lambda c: c.args[0].shape[1] % c.args[2] != 0),
        Freedom("BLOCK_M ≠ BLOCK_N", lambda c: c.args[1] != c.args[2]),
        Freedom("fewer keys than queries", lambda c: c.args[0].shape[1] < c.args[0].shape[0]),
        Freedom("T = 1", lambda c: tuple(c.args[0].shape) == (1, 1)),
    ),
)


# --- 3. a chunk's state update from its WY factors -------------------------------------------------

@triton.jit
def chunk_state_update(h, k, w, u):
    """One chunk of L = 16 tokens of the delta rule in the kernel's layout
    ``h = S^T``: ``h [BLOCK_D, BLOCK_DV]`` the state before the chunk, keys
    ``k [L, BLOCK_D]`` and WY factors ``w [L, BLOCK_D]``, ``u [L, BLOCK_DV]``
    (float32; padding rows and columns are 0). Return ``h`` after the chunk,
    ``[BLOCK_D, BLOCK_DV]``."""
    # U - W S^T: what the chunk writes, net of what h predicts
    v_new = u - tl.dot(w, h)
    return h + tl.dot(tl.trans(k), v_new)         # S^T + K^T (U - W S^T)


@triton.jit
def _state_transposed(h, k, w, u):
    v_new = u - tl.dot(w, tl.trans(h))
    return h + tl.trans(tl.dot(tl.trans(v_new), k))


@triton.jit
def _state_no_correction(h, k, w, u):
    return h + tl.dot(tl.trans(k), u)


@triton.jit
def _state_plus(h, k, w, u):
    return h + tl.dot(tl.trans(k), u + tl.dot(w, h))


@triton.jit
def _state_unit_keys(h, k, w, u):
    k = k / tl.sqrt(tl.sum(k * k, 1))[:, None]            # "the keys are unit": 0 / 0 on a padding row
    return h + tl.dot(tl.trans(k), u - tl.dot(w, h))


@triton.jit
def _state_kernel(H0, K, W, U, HOUT, n_chunks, fn: tl.constexpr, L: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_DV: tl.constexpr):
    rc, rd, rv = tl.arange(0, L), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    h = tl.load(H0 + rd[:, None] * BLOCK_DV + rv[None, :])
    for c in range(0, n_chunks):                  # the sequential pass: one chunk after the other
        rows = c * L + rc
        k = tl.load(K + rows[:, None] * BLOCK_D + rd[None, :])
        w = tl.load(W + rows[:, None] * BLOCK_D + rd[None, :])
        u = tl.load(U + rows[:, None] * BLOCK_DV + rv[None, :])
        h = fn(h, k, w, u)
    tl.store(HOUT + rd[:, None] * BLOCK_DV + rv[None, :], h)


CHUNK = 16


def _pad(x, rows, cols):
    out = torch.zeros(rows, cols, dtype=f32)
    out[:x.shape[0], :x.shape[1]] = x
    return out


def _state_harness(fn):
    def call(h0, k, w, u):
        D, DV = h0.shape
        T = k.shape[0]
        n = max(1, -(-T // CHUNK))
        bd, bv = _pow2(D), _pow2(DV)
        rows = n * CHUNK                                  # a ragged last chunk: zero rows, identity steps
        hp, kp, wp, up = _pad(h0, bd, bv), _pad(k, rows, bd), _pad(w, rows, bd), _pad(u, rows, bv)
        out = torch.zeros(bd, bv, dtype=f32)
        wrapped = _returning(fn, _name(fn), ((bd, bv),))
        _launch(_state_kernel, (1,), hp, kp, wp, up, out, n, fn=wrapped, L=CHUNK, BLOCK_D=bd, BLOCK_DV=bv)
        return out[:D, :DV]
    return call


def _wy(k, v, beta):
    """The WY factors ``W = T K``, ``U = T V`` of each chunk of ``CHUNK`` rows (the last may be short),
    from the library's UT transform, in float64."""
    ws, us = [], []
    for a in range(0, k.shape[0], CHUNK):
        T, _, _ = ut_transform(k[a:a + CHUNK], beta[a:a + CHUNK])
        ws.append(T @ k[a:a + CHUNK])
        us.append(T @ v[a:a + CHUNK])
    return torch.cat(ws), torch.cat(us)


def _state_cases(gen):
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=f64)

    def keys(T, D):
        k = randn(T, D)
        return k / k.norm(dim=-1, keepdim=True)

    def c(label, h0, k, v, beta, hint=""):
        w, u = _wy(k, v, beta)
        # the definition, token by token: S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
        _, S = delta_rule_recurrent_reference(k[None, None], k[None, None], v[None, None], beta[None, None],
                                              scale=1.0, initial_state=h0.T[None, None])
        return Case(label, (h0.to(f32), k.to(f32), w.to(f32), u.to(f32)), S[0, 0].T, hint=hint)

    def linear(label, h0, k, v, hint=""):
        _, S = linear_attention_recurrent_reference(k[None, None], k[None, None], v[None, None],
                                                    initial_state=h0.T[None, None], causal=True)
        return Case(label, (h0.to(f32), k.to(f32), torch.zeros_like(k).to(f32), v.to(f32)), S[0, 0].T,
                    hint=hint)

    def beta(T):
        return torch.rand(T, generator=gen, dtype=f64)

    same = keys(1, 16).expand(16, 16).contiguous()
    return [
        c("one chunk, D = Dv = 16, a random state before it", randn(16, 16), keys(16, 16), randn(16, 16),
          beta(16)),
        linear("w = 0, u = v: linear attention, h + K^T V", randn(16, 16), randn(16, 16), randn(16, 16),
               hint="w = 0, u = v is linear attention, h + K^T V, with keys of any norm: use k as given"),
        c("T = 40: three chunks, the last one 8 rows", randn(16, 16), keys(40, 16), randn(40, 16), beta(40),
          hint="the last chunk is ragged: its 8 padding rows (k = w = u = 0) must leave h unchanged, so no "
               "division by a key's norm"),
        c("D = 12, Dv = 20 (padded tiles), T = 32", randn(12, 20), keys(32, 12), randn(32, 20), beta(32)),
        c("the state before is 0", torch.zeros(16, 8, dtype=f64), keys(16, 16), randn(16, 8), beta(16)),
        c("one key written 16 times with beta = 1", randn(16, 16), same, randn(16, 16),
          torch.ones(16, dtype=f64), hint="with beta = 1 each write replaces the last: S k = v_16 after"),
        c("T = 1", randn(16, 16), keys(1, 16), randn(1, 16), beta(1),
          hint="T = 1: the chunk has 15 padding rows (k = w = u = 0), which must leave h unchanged"),
    ]


def _state_alt(variant):
    def predicate(got, expected, case):
        h, k, w, u = (x.to(f64) for x in case.args)
        for a in range(0, k.shape[0], CHUNK):
            kc, wc, uc = k[a:a + CHUNK], w[a:a + CHUNK], u[a:a + CHUNK]
            if variant == "transposed":
                h = h + kc.T @ (uc - wc @ h.T) if h.shape[0] == h.shape[1] else h
            elif variant == "no correction":
                h = h + kc.T @ uc
            elif variant == "unit keys":
                h = h + (kc / kc.norm(dim=-1, keepdim=True)).T @ (uc - wc @ h)
            else:
                h = h + kc.T @ (uc + wc @ h)
        return not agree(got, expected, 1e-4) and agree(got, h, 1e-4)
    return predicate


STATE_UPDATE = Exercise(
    name="chunk state update",
    chapter="A",
    title="A chunk's state update from its WY factors",
    statement=(
        "Over a chunk of $L=16$ tokens the delta rule's state $S$ ($D_v\\times D$) moves by "
        "$S \\leftarrow S + (U - W S^\\top)^\\top K$, with the chunk's WY factors $W=\\mathcal TK$, "
        "$U=\\mathcal TV$ ($\\mathcal T$ its UT factor); with "
        "$W=0$, $U=V$ it is linear attention's $S + V^\\top K$. The kernel keeps $h=S^\\top$ "
        "($D\\times D_v$), whose columns evolve independently. Write the update of $h$; the harness "
        "carries it across chunks (a ragged last one, padded tiles, keys of any norm, $T=1$) and compares with the "
        "recurrence token by token."),
    solution=chunk_state_update,
    cases=_state_cases,
    wrong=(Wrong(_state_transposed, "layout"), Wrong(_state_no_correction, "u - w h"),
           Wrong(_state_plus, "sign"), Wrong(_state_unit_keys, "use k as given")),
    diagnose=((_state_alt("transposed"), "you updated h as if it were S: in the kernel's layout h = S^T "
                                         "the update is h + K^T (U - W h)"),
              (_state_alt("no correction"), "you added K^T U: the chunk writes U - W S^T, i.e. u - w h in "
                                            "the kernel's layout"),
              (_state_alt("plus"), "the correction has the wrong sign: U - W S^T, i.e. u - w h"),
              (_state_alt("unit keys"), "you normalised the keys: use k as given (keys of any norm; a "
                                        "padding row, k = 0, must leave h unchanged)")),
    imports="import torch\nimport triton\nimport triton.language as tl",
    harness=_state_harness,
    freedoms=(
        Freedom("several chunks, the last one ragged", lambda c: c.args[1].shape[0] > CHUNK
                and c.args[1].shape[0] % CHUNK != 0),
        Freedom("D ≠ Dv (padded tiles)", lambda c: c.args[0].shape[0] != c.args[0].shape[1]),
        Freedom("T = 1", lambda c: c.args[1].shape[0] == 1),
        Freedom("keys of any norm", lambda c: bool((c.args[1].norm(dim=-1) - 1).abs().amax() > 1e-3)),
        Freedom("w = 0, u = v", lambda c: bool((c.args[2] == 0).all())),
    ),
)


# --- 4. the UT factor of a 16 x 16 block ------------------------------------------------------------

@triton.jit
def ut_factor(k, beta, chunk_size: tl.constexpr):
    """The UT factor of a chunk of L = ``chunk_size`` keys: ``k [L, BLOCK_D]``
    (float32, zero-padded), ``beta [L]``. With
    ``A = strictly-lower(diag(beta) K K^T)``, return
    ``T = (I + A)^{-1} diag(beta)``, ``[L, L]``, by forward substitution in
    registers."""
    r = tl.arange(0, chunk_size)
    a = tl.dot(k, tl.trans(k)) * beta[:, None]         # diag(beta) K K^T
    a = tl.where(r[:, None] > r[None, :], a, 0.0)      # its strictly lower part
    # rows of (I + A)^{-1}, filled top-down
    x = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in tl.static_range(1, chunk_size):
        # row i of A: A[i, j], zero for j >= i
        a_i = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)
        # e_i - sum_{j<i} A[i, j] X[j, :]
        row = tl.where(r == i, 1.0, 0.0) - tl.sum(a_i[:, None] * x, 0)
        # rows j < i are final already
        x = tl.where(r[:, None] == i, row[None, :], x)
    return x * beta[None, :]                   # times diag(beta), on the right


@triton.jit
def _ut_with_diagonal(k, beta, chunk_size: tl.constexpr):
    r = tl.arange(0, chunk_size)
    a = tl.where(r[:, None] >= r[None, :], tl.dot(k, tl.trans(k)) * beta[:, None], 0.0)
    x = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in tl.static_range(0, chunk_size):               # (I + A) has 1 + A[i, i] on its diagonal: divide by it
        a_i = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)
        off = tl.where(r < i, a_i, 0.0)
        d = tl.sum(tl.where(r == i, a_i, 0.0), 0)
        row = (tl.where(r == i, 1.0, 0.0) - tl.sum(off[:, None] * x, 0)) / (1.0 + d)
        x = tl.where(r[:, None] == i, row[None, :], x)
    return x * beta[None, :]


@triton.jit
def _ut_wrong_triangle(k, beta, chunk_size: tl.constexpr):
    r = tl.arange(0, chunk_size)
    a = tl.where(r[:, None] > r[None, :], tl.dot(k, tl.trans(k)) * beta[:, None], 0.0)
    x = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in tl.static_range(1, chunk_size):
        a_i = tl.sum(tl.where(r[None, :] == i, a, 0.0), 1)       # column i: A[j, i], zero for j < i
        a_i = tl.where(r < i, a_i, 0.0)
        row = tl.where(r == i, 1.0, 0.0) - tl.sum(a_i[:, None] * x, 0)
        x = tl.where(r[:, None] == i, row[None, :], x)
    return x * beta[None, :]


@triton.jit
def _ut_beta_columns(k, beta, chunk_size: tl.constexpr):
    r = tl.arange(0, chunk_size)
    a = tl.where(r[:, None] > r[None, :], tl.dot(k, tl.trans(k)) * beta[None, :], 0.0)
    x = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    for i in tl.static_range(1, chunk_size):
        a_i = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)
        row = tl.where(r == i, 1.0, 0.0) - tl.sum(a_i[:, None] * x, 0)
        x = tl.where(r[:, None] == i, row[None, :], x)
    return x * beta[None, :]


@triton.jit
def _ut_unit_keys(k, beta, chunk_size: tl.constexpr):
    r = tl.arange(0, chunk_size)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    # diag(beta) (K K^T - I), its diagonal taken for 0 ("the keys are unit"), the lower triangle kept
    a = tl.where(r[:, None] >= r[None, :], (tl.dot(k, tl.trans(k)) - eye) * beta[:, None], 0.0)
    x = eye
    for i in tl.static_range(1, chunk_size):
        a_i = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)
        row = tl.where(r == i, 1.0, 0.0) - tl.sum(a_i[:, None] * x, 0)
        x = tl.where(r[:, None] == i, row[None, :], x)
    return x * beta[None, :]


@triton.jit
def _ut_kernel(K, BETA, OUT, fn: tl.constexpr, L: tl.constexpr, BLOCK_D: tl.constexpr):
    rc, rd = tl.arange(0, L), tl.arange(0, BLOCK_D)
    k = tl.load(K + rc[:, None] * BLOCK_D + rd[None, :])
    beta = tl.load(BETA + rc)
    t = fn(k, beta, L)
    tl.store(OUT + rc[:, None] * L + rc[None, :], t)


def _ut_harness(fn):
    def call(k, beta):
        n, D = k.shape
        bd = _pow2(D)
        kp = _pad(k, CHUNK, bd)
        bp = torch.zeros(CHUNK, dtype=f32)
        bp[:n] = beta
        out = torch.zeros(CHUNK, CHUNK, dtype=f32)
        wrapped = _returning(fn, _name(fn), ((CHUNK, CHUNK),))
        _launch(_ut_kernel, (1,), kp, bp, out, fn=wrapped, L=CHUNK, BLOCK_D=bd)
        return out[:n, :n]
    return call


def _ut_cases(gen):
    def keys(n, D):
        k = torch.randn(n, D, generator=gen, dtype=f64)
        return k / k.norm(dim=-1, keepdim=True)

    def beta(n):
        return torch.rand(n, generator=gen, dtype=f64)

    def c(label, k, b, hint=""):
        T, _, _ = ut_transform(k, b)
        return Case(label, (k.to(f32), b.to(f32)), T, hint=hint)

    eye = torch.eye(16, dtype=f64)
    norms = 0.5 + 1.5 * torch.rand(16, 1, generator=gen, dtype=f64)
    return [
        c("16 unit keys, D = 32, beta in (0, 1)", keys(16, 32), beta(16)),
        c("D = 40 (padded to 64), keys of norms 0.5 to 2", norms * keys(16, 40), beta(16),
          hint="these keys are not unit: the diagonal of K K^T is ||k_i||^2, not 1, so diag(beta) (K K^T - "
               "I) keeps a diagonal; A is only the part of diag(beta) K K^T left of the diagonal"),
        c("a ragged chunk of 11 keys (padding: k = 0, beta = 0)", keys(11, 16), beta(11),
          hint="the 5 padding rows have k = 0 and beta = 0: their rows and columns of T come out 0 (no "
               "division by beta)"),
        c("beta = 0: nothing is written, T = 0", keys(16, 16), torch.zeros(16, dtype=f64)),
        c("orthogonal keys: A = 0 and T = diag(beta)", eye, beta(16)),
        c("one key 16 times (D = 1), beta = 2: the largest stable step", torch.ones(16, 1, dtype=f64),
          torch.full((16,), 2.0, dtype=f64)),
    ]


def _ut_alt(variant):
    def predicate(got, expected, case):
        k, b = (x.to(f64) for x in case.args)
        n = k.shape[0]
        eye = torch.eye(n, dtype=f64)
        kk = k @ k.T
        if variant == "diagonal":
            alt = torch.linalg.solve(eye + torch.tril(b[:, None] * kk), torch.diag(b))
        elif variant == "columns":
            alt = torch.linalg.solve(eye + torch.tril(kk * b[None, :], -1), torch.diag(b))
        elif variant == "unit keys":         # the diagonal of diag(beta) (K K^T - I) taken into row i
            d = 1.0 - b * (kk.diagonal() - 1.0)
            d[0] = 1.0
            alt = torch.linalg.solve(eye + torch.tril(b[:, None] * kk, -1), torch.diag(d)) @ torch.diag(b)
        else:
            alt = torch.diag(b)
        return not agree(got, expected, 1e-4) and agree(got, alt, 1e-4)
    return predicate


UT_FACTOR = Exercise(
    name="ut factor",
    chapter="A",
    title="The UT factor of a chunk, by forward substitution",
    statement=(
        "The delta rule's chunk form needs, for each chunk of $L$ keys, "
        "$\\mathcal T=(I+A)^{-1}\\operatorname{diag}(\\beta)$ with "
        "$A=\\operatorname{tril}(\\operatorname{diag}(\\beta)KK^\\top,-1)$, the factor that "
        "`attnlib.deltanet.ut_transform` computes with a triangular solve. Compute it for $L=16$ (a "
        "$16\\times16$ block) inside a kernel, row by row: a tile cannot be indexed, so take row $i$ of a "
        "tile `x` as `tl.sum(tl.where(r[:, None] == i, x, 0.0), 0)` and write one back with `tl.where` "
        "(`r = tl.arange(0, chunk_size)`, loop with `tl.static_range`). Inputs: padded head dims, keys of "
        "any norm, a ragged chunk, $\\beta=0$ and $\\beta=2$, orthogonal and repeated keys."),
    solution=ut_factor,
    cases=_ut_cases,
    wrong=(Wrong(_ut_with_diagonal, "strictly lower"), Wrong(_ut_wrong_triangle, "row i of a"),
           Wrong(_ut_beta_columns, "rows of k k^t"), Wrong(_ut_unit_keys, "not unit")),
    diagnose=((_ut_alt("diagonal"), "you kept the diagonal of diag(beta) K K^T: A is its strictly lower "
                                    "part, so I + A has ones on the diagonal"),
              (_ut_alt("triangle"), "your substitution never used A: row i of the inverse combines the rows "
                                    "j < i with A[i, j], row i of A (left of the diagonal), not column i"),
              (_ut_alt("columns"), "beta scales the rows of K K^T (diag(beta) on the left), then T takes "
                                   "diag(beta) on the right"),
              (_ut_alt("unit keys"), "the keys are not unit: the diagonal of K K^T is ||k_i||^2, not 1; A is "
                                     "only the part of diag(beta) K K^T left of the diagonal")),
    imports="import torch\nimport triton\nimport triton.language as tl",
    harness=_ut_harness,
    freedoms=(
        Freedom("D = 40, padded to 64", lambda c: c.args[0].shape[1] != _pow2(c.args[0].shape[1], 1)),
        Freedom("D = 1", lambda c: c.args[0].shape[1] == 1),
        Freedom("keys of any norm", lambda c: bool((c.args[0].norm(dim=-1) - 1).abs().amax() > 1e-3)),
        Freedom("a ragged chunk (fewer than 16 keys)", lambda c: c.args[0].shape[0] < CHUNK),
        Freedom("beta = 0", lambda c: bool((c.args[1] == 0).all())),
        Freedom("beta > 1", lambda c: c.args[1].amax().item() > 1),
    ),
)


EXERCISES = (ONLINE_SOFTMAX, CAUSAL_MASK, STATE_UPDATE, UT_FACTOR)
