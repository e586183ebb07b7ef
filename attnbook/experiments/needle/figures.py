"""What the chapter's figures draw (:mod:`attnbook.widgets.needle` draws these; it computes nothing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from attnlib import _validate
from attnlib.window import sliding_window_attention

from .algorithms import (
    Algorithm,
    make,
)
from .argument import (
    Case,
    _check_M,
    algorithm_rows,
    attack,
    exact_rows,
    needle_mass,
    plant,
)

# ---------------------------------------------------------------------------------------------
# What the chapter's figures draw (attnbook.widgets.needle draws these; it computes nothing)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlantedRow:
    """One algorithm against its own adversarial input with a needle of score ``M``: the planted row
    ``i`` (needle at key ``j``) of exact attention and of the algorithm (``[T]`` float64 each), their
    L1 distance and the exact row's mass on the needle, ``needle_mass(T, M)``."""
    name: str
    kind: str
    T: int
    i: int
    j: int
    M: float
    exact: np.ndarray
    got: np.ndarray
    error: float
    needle_mass: float


@dataclass(frozen=True)
class ProbeMap(PlantedRow):
    """A :class:`PlantedRow` with the algorithm's probe map on that input: ``probes [T, T]`` uint8, 1
    where it computed the exact score (query rows, key columns); ``n_probes`` and ``probe_fraction``
    count them, both None for an algorithm that computes no exact score (features, low rank: the map
    is all 0)."""
    probes: np.ndarray
    n_probes: int | None
    probe_fraction: float | None


@dataclass(frozen=True)
class NeedleMap:
    """What one algorithm computes on its own adversarial input, beside the exact plan: ``exact`` and
    ``got`` ``[T, T]`` float32 (row ``t``: the distribution over keys for query ``t``; float32 since a
    figure stores them), the L1 error on row ``i`` (from the float64 rows), and where row ``i``'s mass
    goes, ``(exact, algorithm)`` each: onto the needle's key ``j`` and onto the other keys."""
    name: str
    T: int
    i: int
    j: int
    M: float
    exact: np.ndarray
    got: np.ndarray
    error: float
    on_needle: tuple[float, float]
    elsewhere: tuple[float, float]


def _planted_row(algo: Algorithm, case: Case, M: float) -> dict:
    exact = exact_rows(case)[case.i].numpy()
    got = algo.attend(case.q, case.k, case.v)[0, 0, case.i].double().numpy()
    return dict(name=algo.name, kind=algo.kind, T=case.T, i=case.i, j=case.j, M=M, exact=exact, got=got,
                error=float(np.abs(exact - got).sum()), needle_mass=needle_mass(case.T, M))


def planted_row(algo: Algorithm, M: float = 80.0) -> PlantedRow:
    """The planted row of ``algo`` on :func:`attack` ``(algo, M)``: exact against the algorithm's."""
    M = _check_M(M)
    return PlantedRow(**_planted_row(algo, attack(algo, M=M), M))


def rows_vs_M(algo: Algorithm, M_values) -> list[PlantedRow]:
    """:func:`planted_row` of one algorithm at every needle score in ``M_values`` (at least one)."""
    Ms = [_check_M(m) for m in M_values]
    if not Ms:
        raise ValueError("M_values must hold at least one value")
    return [planted_row(algo, M) for M in Ms]


def probe_map(algo: Algorithm, M: float = 80.0) -> ProbeMap:
    """:func:`planted_row` with the algorithm's probe map on the same adversarial input."""
    M = _check_M(M)
    case = attack(algo, M=M)
    p = algo.probes(case.q, case.k)
    if p is None:
        probes, n, frac = np.zeros((case.T, case.T), dtype=np.uint8), None, None
    else:
        probes, n, frac = p.numpy().astype(np.uint8), int(p.sum()), p.float().mean().item()
    return ProbeMap(**_planted_row(algo, case, M), probes=probes, n_probes=n, probe_fraction=frac)


def _algorithms(algos) -> list:
    algos = list(algos)
    if not algos:
        raise ValueError("algos must hold at least one algorithm")
    return algos


def probe_maps(algos, M: float = 80.0) -> list[ProbeMap]:
    """:func:`probe_map` of every algorithm in ``algos`` (at least one), each on its own adversarial input."""
    return [probe_map(algo, M) for algo in _algorithms(algos)]


def probe_map_at(*, d: int = 16, seed: int = 0) -> Callable[[str, int, float], ProbeMap]:
    """A function ``(name, T, M) -> ProbeMap`` for a live explorer: it builds each ``(name, T)`` algorithm
    once (``make(name, T=T, d=d, seed=seed)``) and keeps it, so that moving ``M`` only re-attacks it."""
    cache: dict[tuple[str, int], Algorithm] = {}

    def at(name: str, T: int, M: float) -> ProbeMap:
        if (name, T) not in cache:
            cache[name, T] = make(name, T=T, d=d, seed=seed)
        return probe_map(cache[name, T], M)
    return at


def _needle_map(name: str, case: Case, exact: np.ndarray, got: np.ndarray) -> NeedleMap:
    """The :class:`NeedleMap` of ``got`` against ``exact`` (``[T, T]`` float64) on ``case``: the L1 error on
    the attacked row from the float64 rows, the maps and the row's masses in float32."""
    err = float(np.abs(exact[case.i] - got[case.i]).sum())
    exact, got = exact.astype(np.float32), got.astype(np.float32)
    on_j = (float(exact[case.i, case.j]), float(got[case.i, case.j]))
    rest = (float(exact[case.i].sum()) - on_j[0], float(got[case.i].sum()) - on_j[1])
    return NeedleMap(name, case.T, case.i, case.j, case.M, exact, got, err, on_j, rest)


def needle_map(algo: Algorithm, M: float = 80.0) -> NeedleMap:
    """Exact attention and the algorithm's rows on :func:`attack` ``(algo, M)``, whole ``[T, T]`` maps."""
    M = _check_M(M)
    case = attack(algo, M=M)
    return _needle_map(algo.name, case, exact_rows(case).numpy(), algorithm_rows(algo, case).numpy())


def needle_maps(algos, M: float = 80.0) -> list[NeedleMap]:
    """:func:`needle_map` of every algorithm in ``algos`` (at least one, all with one ``T``). Keep ``T``
    small (the lab takes 56): each holds two ``T x T`` maps."""
    algos = _algorithms(algos)
    T = algos[0].T
    if any(a.T != T for a in algos):
        raise ValueError(f"the algorithms must share one T; got {[a.T for a in algos]}")
    return [needle_map(algo, M) for algo in algos]


def window_maps(*, T: int, d: int, i: int, j: int, windows, M: float = 80.0) -> list[NeedleMap]:
    """Sliding-window attention (:func:`attnlib.sliding_window_attention`, not causal: ``|i - j| < window``)
    on one planted needle ``(i, j)`` of score ``M``, beside the exact plan, one :class:`NeedleMap` per
    window (named ``"window <w>"``): while ``window <= |i - j|`` the needle lies off the band and gets no
    mass; once inside, the windowed row agrees with the exact one."""
    M = _check_M(M)
    windows = [_validate.check_int("windows[...]", w, lo=1) for w in windows]
    case = plant(T, d, i=i, j=j, M=M, dtype=torch.float64)
    exact = exact_rows(case).numpy()
    return [_needle_map(f"window {w}", case, exact,
                        sliding_window_attention(case.q, case.k, case.v, window=w, scale=case.scale, causal=False,
                                                 backend="torch")[0, 0].numpy())
            for w in windows]
