"""Chapter 3's cost experiments: counted work, cache bytes, CPU timings, fits and the crossover.

Two kinds of measurement, kept apart on purpose:

* **Counted work** (:func:`measure_flops`, :func:`kv_cache_bytes`,
  :func:`state_bytes`) is a fact of the algorithm: exact, the same on every machine. The lab asserts
  on these.
* **Timings** (:func:`measure_scaling`) are a fact of one machine at one moment. They are shown with
  their spread (median and quartiles of interleaved repeats) and never asserted on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from attnlib.attention import softmax_attention
from attnlib.linear import linear_attention

from ._measure import count_flops, interleaved_cpu_ms
from .recall import state_trajectory
from .weights import single_head

# ---------------------------------------------------------------------------------------------
# Memory: the KV cache grows, the state does not
# ---------------------------------------------------------------------------------------------

def kv_cache_bytes(t: int, *, D: int, Dv: int | None = None, bytes_per_elem: int = 2) -> int:
    """Bytes one head's KV cache holds after ``t`` tokens: ``t (D + Dv)`` numbers."""
    return t * (D + (D if Dv is None else Dv)) * bytes_per_elem


def state_bytes(*, D: int, Dv: int | None = None, bytes_per_elem: int = 4) -> int:
    """Bytes one head's linear-attention state holds, for any ``t``: ``Dv x D`` numbers (fp32)."""
    return (D if Dv is None else Dv) * D * bytes_per_elem


def state_buildup(q, k, v, *, bytes_per_number: int = 2) -> dict:
    """Linear attention as an RNN, token by token, for chapter 3's state figure. ``q, k: [T, D]``,
    ``v: [T, Dv]``: one head. Returns ``{"states": [T, Dv, D]`` (``S_t = sum_{j<=t} v_j k_j^T``),
    ``"outputs": [T, Dv]`` (the recurrence ``o_t = S_t q_t``), ``"quadratic": [T, Dv]`` (the same
    outputs the quadratic way, ``(Q K^T . M) V``), ``"t"``, ``"kv_cache_bytes"`` (``t (D + Dv)`` numbers
    of ``bytes_per_number``) and ``"state_bytes"`` (``Dv x D`` in fp32) at each ``t``, and
    ``"bytes_per_number"``}``; tensors in float64."""
    q, k, v = (single_head(name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    T, D = k.shape
    if q.shape != k.shape or v.shape[0] != T:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: expected "
                         "q and k [T, D] and v [T, Dv] with the same T")
    Dv = v.shape[1]
    # The library's two forms of unnormalised linear attention: the recurrence o_t = S_t q_t, and the
    # quadratic (Q K^T . M) V.
    outs, quad = (linear_attention(q[None, None], k[None, None], v[None, None], scale=1.0, causal=True,
                                   normalize=False, mode=mode)[0, 0] for mode in ("recurrent", "parallel"))
    ts = np.arange(1, T + 1)
    return {"states": state_trajectory(k, v, rule="linear"), "outputs": outs, "quadratic": quad, "t": ts,
            "kv_cache_bytes": kv_cache_bytes(ts, D=D, Dv=Dv, bytes_per_elem=bytes_per_number),
            "state_bytes": np.full(T, state_bytes(D=D, Dv=Dv)), "bytes_per_number": bytes_per_number}


# ---------------------------------------------------------------------------------------------
# Counted work
# ---------------------------------------------------------------------------------------------

def measure_flops(lengths: Sequence[int], dims: Sequence[int], *, batch: int = 1, heads: int = 1,
                  chunk_size: int = 64) -> dict[int, dict[str, list[int]]]:
    """Counted FLOPs of causal softmax attention (attnlib's reference, which forms every score and
    masks afterwards: ``4 T^2 D`` per head) and of causal chunkwise linear attention
    (``4 T D (L + D)`` per head, for ``T`` a multiple of the chunk length ``L = chunk_size``), for every
    ``T`` and ``D``.
    Returns ``{D: {"T": [...], "softmax": [...], "linear": [...]}}``. Inputs live on the ``meta``
    device: the count depends on shapes only, so nothing is computed and long lengths cost nothing."""
    out: dict[int, dict[str, list[int]]] = {}
    for D in dims:
        row: dict[str, list[int]] = {"T": list(lengths), "softmax": [], "linear": []}
        for T in lengths:
            q = torch.zeros(batch, heads, T, D, device="meta")   # shapes only: nothing is computed
            row["softmax"].append(count_flops(lambda q=q: softmax_attention(q, q, q, causal=True, backend="torch")))
            row["linear"].append(count_flops(
                lambda q=q: linear_attention(q, q, q, chunk_size=chunk_size, backend="torch", causal=True)))
        out[D] = row
    return out


# ---------------------------------------------------------------------------------------------
# Timings, shown with their spread
# ---------------------------------------------------------------------------------------------

def measure_scaling(lengths: Sequence[int], dims: Sequence[int], *, batch: int = 1, heads: int = 4,
                    chunk_size: int = 64, reps: int = 5, seed: int = 0,
                    progress=None) -> dict[int, dict[str, list[float]]]:
    """CPU time (``time.process_time``, one thread) of causal softmax attention (PyTorch's
    ``scaled_dot_product_attention``) and causal linear attention (the chunk reference), for every
    ``T`` in ``lengths`` and ``D`` in ``dims``.

    The repeats are *interleaved*: each of the ``reps`` rounds times every (D, T, method) once, so a
    burst of load from another process spreads over all points instead of bending one of them.
    CPU time rather than wall time: other processes stretch the wall clock more than this process's
    own work, though on a busy machine caches and memory bandwidth are shared, so even CPU time
    moves. Returns ``{D: {"T": [...], "softmax": [...], "linear": [...], "softmax_q1": [...],
    "softmax_q3": [...], "linear_q1": [...], "linear_q3": [...]}}``: medians and quartiles, in ms.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1; got {reps}")
    g = torch.Generator().manual_seed(seed)
    calls = {}
    for D in dims:
        for T in lengths:
            q, k, v = (torch.randn(batch, heads, T, D, generator=g) for _ in range(3))
            calls[D, T, "softmax"] = lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            calls[D, T, "linear"] = lambda q=q, k=k, v=v: linear_attention(q, k, v, chunk_size=chunk_size,
                                                                          backend="torch", causal=True)
    samples = interleaved_cpu_ms(calls, reps, progress=progress)
    out: dict[int, dict[str, list[float]]] = {}
    for D in dims:
        row: dict[str, list[float]] = {"T": list(lengths)}
        for name in ("softmax", "linear"):
            qs = np.array([np.percentile(samples[D, T, name], [25, 50, 75]) for T in lengths])
            row[name], row[f"{name}_q1"], row[f"{name}_q3"] = (qs[:, 1].tolist(), qs[:, 0].tolist(),
                                                               qs[:, 2].tolist())
        out[D] = row
    return out


def fit_power_law(x, y, *, robust: bool = False) -> tuple[float, float]:
    """A line through ``(log x, log y)``: returns ``(slope, intercept)``, i.e.
    ``y ~ exp(intercept) * x ** slope``. Least squares, or with ``robust=True`` the Theil-Sen
    estimate (the median of the slopes between all pairs of points), which one disturbed timing
    cannot drag far."""
    lx = torch.log(torch.as_tensor(x, dtype=torch.float64))
    ly = torch.log(torch.as_tensor(y, dtype=torch.float64))
    if robust:
        i, j = torch.triu_indices(len(lx), len(lx), offset=1)
        slope = ((ly[j] - ly[i]) / (lx[j] - lx[i])).median()
        return slope.item(), (ly - slope * lx).median().item()
    A = torch.stack([lx, torch.ones_like(lx)], dim=1)
    sol = torch.linalg.lstsq(A, ly[:, None]).solution[:, 0]
    return sol[0].item(), sol[1].item()


def crossover_length(lengths, t_softmax, t_linear) -> float:
    """The sequence length beyond which linear attention costs less, from measured costs.

    Takes the smallest measured ``T`` from which softmax costs more at every larger ``T`` too, and
    interpolates (log-log) between it and the previous length where the two curves cross. Returns
    ``lengths[0]`` if softmax costs more everywhere and ``inf`` if it never falls behind for good.
    """
    T = [float(t) for t in lengths]
    r = [math.log(s / lin) for s, lin in zip(t_softmax, t_linear)]   # > 0: softmax costs more
    i = len(r)
    while i > 0 and r[i - 1] > 0:
        i -= 1
    if i == len(r):
        return math.inf
    if i == 0:
        return T[0]
    lo, hi = math.log(T[i - 1]), math.log(T[i])
    frac = -r[i - 1] / (r[i] - r[i - 1])                            # where log-ratio hits zero
    return math.exp(lo + frac * (hi - lo))


def crossover_fits(measurements: Mapping[int, Mapping[str, Sequence[float]]], *, fit_from: int = 0) -> dict:
    """What chapter 3's crossover figure shows, per head dimension ``D`` of ``measurements``
    (:func:`measure_scaling`'s ``{D: {"T", "softmax", "linear", ...}}``): the measured medians and, when
    present, quartiles (``"<name>"``, ``"<name>_q1"``, ``"<name>_q3"``), a robust power law fitted on
    ``T >= fit_from`` (``"<name>_slope"``, and the fitted curve ``"<name>_fit_T"``, ``"<name>_fit"``)
    for ``name`` in softmax and linear, and the measured ``"crossover"`` length
    (:func:`crossover_length`; ``inf`` when there is none)."""
    check_measurements(measurements)
    out = {}
    for D, r in measurements.items():
        T = np.asarray(r["T"], dtype=float)
        sel = T >= fit_from
        row = {"T": T}
        for name in ("softmax", "linear"):
            y = np.asarray(r[name], dtype=float)
            slope, icpt = fit_power_law(T[sel], y[sel], robust=True)
            row.update({name: y, f"{name}_slope": slope, f"{name}_fit_T": T[sel],
                        f"{name}_fit": np.exp(icpt) * T[sel] ** slope})
            if f"{name}_q1" in r and f"{name}_q3" in r:           # the spread of the repeats
                row[f"{name}_q1"] = np.asarray(r[f"{name}_q1"], dtype=float)
                row[f"{name}_q3"] = np.asarray(r[f"{name}_q3"], dtype=float)
        row["crossover"] = crossover_length(r["T"], r["softmax"], r["linear"])
        out[D] = row
    return out


# ---------------------------------------------------------------------------------------------
# A two-term cost model calibrated to the timings (for the live explorer)
# ---------------------------------------------------------------------------------------------

def check_measurements(m: Mapping) -> None:
    """Raise ValueError unless ``m`` is ``{D: {"T": [...], "softmax": [...], "linear": [...]}}``."""
    if not m:
        raise ValueError("measurements is empty; expected {D: {'T': [...], 'softmax': [...], "
                         "'linear': [...]}}")
    for D, row in m.items():
        for key in ("T", "softmax", "linear"):
            if key not in row:
                raise ValueError(f"measurements[{D}] lacks {key!r}")
        if not (len(row["T"]) == len(row["softmax"]) == len(row["linear"]) >= 2):
            raise ValueError(f"measurements[{D}] needs equally long T, softmax, linear lists (>= 2)")


def _two_term_fit(xs, ys) -> tuple[float, float]:
    """``y ~ c0 + c1 x`` by least squares on relative errors, both coefficients kept >= 0."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    A = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
    c0, c1 = np.linalg.lstsq(A, np.ones_like(y), rcond=None)[0]
    if c0 < 0:
        return 0.0, float(np.sum(y * x) / np.sum(x * x))
    if c1 < 0:
        return float(np.mean(y)), 0.0
    return float(c0), float(c1)


def cost_model(measurements: Mapping[int, Mapping[str, Sequence[float]]], *, chunk_size: int = 64,
               fit_from: int = 0) -> dict[str, float]:
    """Calibrate two cost laws to the measurements (``T >= fit_from``):

        t_softmax = T^2 (a0 + a1 D)           per score: a D-long dot product (a1 D) plus the
                                              exponential and running sums, which do not scale with D;
        t_linear  = T (b0 + b1 D (L + D))     per token: the chunk algorithm's FLOPs (b1) plus a
                                              per-token overhead that does not scale with D (b0).

    The per-score and per-token constants are medians of ``t / T^2`` and ``t / T`` per ``D``;
    each pair of coefficients is fitted by least squares on relative errors. Returns
    ``{"a0", "a1", "b0", "b1", "L"}``.
    """
    check_measurements(measurements)
    Ds, per_score, per_token = [], [], []
    for D, r in measurements.items():
        sel = [(T, s, lin) for T, s, lin in zip(r["T"], r["softmax"], r["linear"]) if T >= fit_from]
        if not sel:
            raise ValueError(f"no measurement for D={D} has T >= fit_from={fit_from}")
        Ds.append(float(D))
        per_score.append(float(np.median([s / (T * T) for T, s, _ in sel])))
        per_token.append(float(np.median([lin / T for T, _, lin in sel])))
    a0, a1 = _two_term_fit(Ds, per_score)
    b0, b1 = _two_term_fit([D * (chunk_size + D) for D in Ds], per_token)
    return {"a0": a0, "a1": a1, "b0": b0, "b1": b1, "L": chunk_size}


def model_times(model: Mapping[str, float], T, D) -> tuple[np.ndarray, np.ndarray]:
    """The model's ``(t_softmax, t_linear)`` at lengths ``T`` for head dimension ``D``."""
    T = np.asarray(T, dtype=float)
    return (T * T * (model["a0"] + model["a1"] * D),
            T * (model["b0"] + model["b1"] * D * (model["L"] + D)))


def model_crossover(model: Mapping[str, float], D: float) -> float:
    """Where ``T^2 (a0 + a1 D) = T (b0 + b1 D (L + D))``: ``T* = (b0 + b1 D (L + D)) / (a0 + a1 D)``."""
    return (model["b0"] + model["b1"] * D * (model["L"] + D)) / (model["a0"] + model["a1"] * D)


def model_prediction(model: Mapping[str, float], T, D) -> dict:
    """The calibrated model at lengths ``T`` for head dimension ``D``, for the live explorer:
    ``{"softmax": times, "linear": times, "crossover": T*}`` (:func:`model_times`, :func:`model_crossover`)."""
    soft, lin = model_times(model, T, D)
    return {"softmax": soft, "linear": lin, "crossover": model_crossover(model, D)}


__all__ = ["kv_cache_bytes", "state_bytes", "state_buildup", "measure_flops", "measure_scaling",
           "fit_power_law", "crossover_length", "crossover_fits", "check_measurements", "cost_model", "model_times",
           "model_crossover", "model_prediction"]
