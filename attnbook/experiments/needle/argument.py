"""The needle's argument: the planted input, the exact row, the needle's weight and the error an
algorithm makes on that row."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from attnlib import _validate
from attnlib.attention import softmax_attention_reference

_ACC = torch.float64     # the algorithms' internal precision: they are models, not fast paths


# ---------------------------------------------------------------------------------------------
# The planted input and the error on its row
# ---------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One adversarial input. ``q, k: [1, 1, T, d]``, ``v = I_T`` as ``[1, 1, T, T]`` (one-hot values),
    the planted row ``i`` and key ``j``, the needle's score ``M`` and free-form ``info``."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    i: int
    j: int
    M: float
    scale: float
    info: dict = field(default_factory=dict)

    @property
    def T(self) -> int:
        return self.q.shape[2]


def _check_M(M) -> float:
    if isinstance(M, bool) or not isinstance(M, (int, float)):
        raise TypeError(f"M must be a number; got {type(M).__name__}")
    if not (math.isfinite(M) and M > 0):
        raise ValueError(f"M must be a finite number > 0 (the needle's score); got {M!r}")
    return float(M)


def _check_float_dtype(dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype (the vectors are scaled by "
                        f"sqrt(M)); got {dtype!r}")
    return dtype


def _check_direction(name: str, x, d: int) -> torch.Tensor:
    """A direction in ``R^d``: a finite, non-zero vector of shape ``[d]``, returned unit-norm in float64."""
    _validate.check_tensor(name, x, ndim=1)
    if tuple(x.shape) != (d,):
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected ({d},) = [d]")
    x = x.to(_ACC)
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} has non-finite entries; expected a finite direction")
    n = x.norm()
    if not n > 0:
        raise ValueError(f"{name} is the zero vector; expected a non-zero direction")
    return x / n


def plant(T: int, d: int, i: int, j: int, M: float, *, scale: float | None = None,
          u: torch.Tensor | None = None, w: torch.Tensor | None = None,
          haystack_k: torch.Tensor | None = None, haystack_q: torch.Tensor | None = None,
          dtype: torch.dtype = torch.float32) -> Case:
    """The needle: ``q_i = a u``, ``k_j = a w`` with ``scale * (q_i . k_j) = M``; everything else zero,
    except the optional haystacks ``[T, d]``: keys (rows other than ``j``), which must be orthogonal
    to ``u`` so that row ``i``'s other scores stay exactly zero, and queries (rows other than ``i``),
    which row ``i`` never sees. ``u`` defaults to ``e_1`` and ``w`` to ``u``.

    ``a`` and ``b`` are chosen equal, so the vectors' entries stay ``O(sqrt(M))`` (finite in fp16 up to
    ``M`` around 1e8).
    """
    T, d = _validate.check_int("T", T, lo=2), _validate.check_int("d", d, lo=1)
    M = _check_M(M)
    i, j = _validate.check_int("i", i, lo=0), _validate.check_int("j", j, lo=0)
    if not (i < T and j < T):
        raise ValueError(f"the planted pair (i={i}, j={j}) must lie in [0, {T})")
    dtype = _check_float_dtype(dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else _validate.check_positive("scale", scale)
    u = torch.eye(d, dtype=_ACC)[0] if u is None else _check_direction("u", u, d)
    w = u if w is None else _check_direction("w", w, d)
    for name, hay in (("haystack_k", haystack_k), ("haystack_q", haystack_q)):
        if hay is not None:
            _validate.check_tensor(name, hay, ndim=2)
            if tuple(hay.shape) != (T, d):
                raise ValueError(f"{name} has shape {tuple(hay.shape)}; expected ({T}, {d}) = [T, d]")
    cos = float(u @ w)
    if cos <= 0:
        raise ValueError(f"u and w must have a positive inner product; got u.w = {cos:.3g}")
    a = math.sqrt(M / (scale * cos))
    q = torch.zeros(T, d, dtype=_ACC) if haystack_q is None else haystack_q.to(_ACC).clone()
    k = torch.zeros(T, d, dtype=_ACC) if haystack_k is None else haystack_k.to(_ACC).clone()
    if haystack_k is not None:
        leak = (k @ u).abs()
        leak[j] = 0
        if float(leak.max()) > 1e-9 * (1 + float(k.norm(dim=-1).max())):
            raise ValueError("haystack_k must be orthogonal to u (row i's other scores must stay 0)")
    q[i] = a * u
    k[j] = a * w
    v = torch.eye(T, dtype=dtype)
    return Case(q=q.to(dtype)[None, None], k=k.to(dtype)[None, None], v=v[None, None], i=i, j=j,
                M=M, scale=scale, info={"u.w": cos})


def exact_rows(case: Case) -> torch.Tensor:
    """The exact attention matrix ``softmax(scale * q k^T)`` of a case, ``[T, T]`` float64."""
    o = softmax_attention_reference(case.q.double(), case.k.double(), case.v.double(),
                                    scale=case.scale, causal=False)[0]
    return o[0, 0]


def _check_score(M) -> float:
    """A needle score for the closed forms: any finite real (``M <= 0`` is a needle that loses)."""
    if isinstance(M, bool) or not isinstance(M, (int, float)):
        raise TypeError(f"M must be a number; got {type(M).__name__}")
    if not math.isfinite(M):
        raise ValueError(f"M must be a finite number (the needle's score); got {M!r}")
    return float(M)


def needle_mass(T: int, M: float) -> float:
    """``pi(M) = e^M / (e^M + T - 1)``: the weight the exact row puts on the
    needle (``T >= 1`` keys, any finite ``M``). Evaluated as the logistic
    function of ``M - log(T - 1)``, which neither overflows nor loses the
    small masses."""
    T, M = _validate.check_int("T", T, lo=1), _check_score(M)
    if T == 1:
        return 1.0                      # the needle is the only key
    x = M - math.log(T - 1)
    return (1.0 / (1.0 + math.exp(-x)) if x >= 0
            else math.exp(x) / (1.0 + math.exp(x)))


def uniform_miss_error(T: int, n_seen: int, M: float) -> float:
    """L1 error on the planted row of an algorithm that averages uniformly over ``n_seen`` keys,
    none of them the needle, all with score 0: ``2 - 2 (1 - pi) n_seen / (T - 1)``.

    Needs ``T >= 2`` (a needle and a haystack) and ``0 <= n_seen <= T - 1``."""
    T = _validate.check_int("T", T, lo=2)
    n_seen = _validate.check_int("n_seen", n_seen, lo=0)
    if n_seen > T - 1:
        raise ValueError(f"n_seen must be <= T - 1 = {T - 1} (the keys other than the needle); got {n_seen}")
    return 2.0 - 2.0 * (1.0 - needle_mass(T, M)) * n_seen / (T - 1)


def algorithm_rows(algo, case: Case) -> torch.Tensor:
    """The algorithm's answer on a case, ``[T, T]`` float64: its output with the case's one-hot values,
    so row ``t`` is the distribution it puts on the keys for query ``t`` (the counterpart of
    :func:`exact_rows`)."""
    return algo.attend(case.q, case.k, case.v)[0, 0].double()


def row_error(algo, case: Case) -> float:
    """``|| exact row i - algorithm's row i ||_1`` (float64). With one-hot values the rows are the
    attention distributions themselves."""
    exact = exact_rows(case)[case.i]
    got = algorithm_rows(algo, case)[case.i]
    if not torch.isfinite(got).all():
        raise FloatingPointError(f"{algo.name} returned a non-finite row at M={case.M}")
    return float((exact - got).abs().sum())


def attack(algo, M: float = 80.0, **kwargs) -> Case:
    """The input built to defeat ``algo`` with a needle of score ``M`` (see each algorithm's
    ``adversary`` for how it hides)."""
    return algo.adversary(_check_M(M), **kwargs)
