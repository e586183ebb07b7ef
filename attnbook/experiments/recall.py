"""Associative recall without training: write key--value pairs into one state, read them back;
and the state itself, write by write (``state_trajectory``).

Chapter 3 runs it for linear attention (``S = sum_i v_i k_i^T``: crosstalk grows like ``(N - 1) / D``),
chapter 4 for the delta rule too, with overwrites, and chapter 7 sets both beside softmax attention,
which keeps every pair (``recall_vs_pairs``: recall against the number of pairs, with distinct keys and
with overwrites). One function for all of them, built on the library's own operators, so the
experiment measures exactly what the chapters define.

The read-out. Values are random unit vectors; a read ``r`` recalls key ``i`` when the latest value
written under ``k_i`` is the unique nearest, by dot product, among every value ever written (old values
of overwritten keys included). All candidates have unit length, so the largest dot product is also the
largest cosine. A tie (an exact superposition ``v_old + v_new``, as linear attention returns for an
overwritten orthonormal key) counts as a miss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnlib import _validate
from attnlib.attention import softmax_attention
from attnlib.deltanet import delta_rule, delta_rule_recurrent_reference
from attnlib.linear import linear_attention, linear_attention_recurrent_reference

RULES = ("linear", "delta")                           # the recurrent states (``state_trajectory``)
MECHANISMS = ("softmax", "linear", "delta")           # what ``associative_recall`` can read back from
REGIMES = ("distinct", "overwrites")                  # ``recall_vs_pairs``: each key once / some again
KEY_KINDS = ("random", "orthonormal")
RECENCY_BIAS = 0.25     # softmax: the newest write's logit lead over the oldest, per unit of scale
TIE_TOLERANCE = 1e-9    # relative: a read this close to two values is a tie, not a recall


def _draw_pairs(num_pairs: int, dim: int, overwrites: int, keys: str, gen: torch.Generator):
    """Keys ``[N, dim]``, their first values ``[N, dim]`` and the new values of the first
    ``overwrites`` keys, all unit vectors in float64 (drawn in this order: lab 3 and 4 rely on it)."""
    f64 = torch.float64
    if keys == "random":
        k = F.normalize(torch.randn(num_pairs, dim, generator=gen, dtype=f64), dim=-1)
    else:                                              # the first N columns of a Haar-random rotation
        q, r = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=f64))
        k = (q * torch.sign(torch.diagonal(r))).T[:num_pairs]
    vals = F.normalize(torch.randn(num_pairs, dim, generator=gen, dtype=f64), dim=-1)
    new = F.normalize(torch.randn(overwrites, dim, generator=gen, dtype=f64), dim=-1)
    return k, vals, new


def _read(rule: str, k_seq: torch.Tensor, v_seq: torch.Tensor, queries: torch.Tensor, *, beta: float,
          softmax_scale: float) -> torch.Tensor:
    """Write the sequence ``k_seq, v_seq`` ``[T, D]`` in one pass, then read ``queries`` ``[N, D]``:
    returns the reads ``[N, Dv]``."""
    k4, v4 = k_seq[None, None], v_seq[None, None]
    if rule == "softmax":
        # The cache keeps every write. Identical keys score alike, so without position softmax cannot
        # tell the newer write from the older: a recency bias (as ALiBi's, linear in position) breaks
        # the tie, carried as one extra key coordinate that every query reads with weight 1.
        T = k_seq.shape[0]
        recency = RECENCY_BIAS * torch.arange(T, dtype=k_seq.dtype) / max(T - 1, 1)
        k_pos = torch.cat([k4, recency[None, None, :, None]], dim=-1)
        q_pos = F.pad(queries, (0, 1), value=1.0)[None, None]
        return softmax_attention(q_pos, k_pos, v4, scale=softmax_scale, backend="torch", causal=False)[0, 0]
    q_seq = torch.zeros_like(k4)                                     # only the final state is read
    if rule == "linear":
        _, S = linear_attention(q_seq, k4, v4, mode="recurrent", output_final_state=True, causal=True)
    else:
        b = torch.full(k4.shape[:3], beta, dtype=k_seq.dtype)
        _, S = delta_rule(q_seq, k4, v4, b, mode="chunk", output_final_state=True)
    return queries @ S[0, 0].T                                       # row i: (S k_i)^T


def _recall_fraction(reads: torch.Tensor, latest: torch.Tensor, old: torch.Tensor) -> float:
    """Fraction of reads whose own latest value (row ``i`` of ``latest``) beats every other candidate
    (the other latest values and all ``old`` ones) by more than the tie tolerance."""
    scores = reads @ torch.cat([latest, old]).T                      # [N, N + overwrites]
    n = reads.shape[0]
    own = scores[torch.arange(n), torch.arange(n)]
    others = scores.clone()
    others[torch.arange(n), torch.arange(n)] = -torch.inf
    margin = TIE_TOLERANCE * reads.norm(dim=-1)
    return (own > others.max(dim=-1).values + margin).double().mean().item()


def associative_recall(num_pairs: int, dim: int, *, rule: str = "linear", beta: float = 1.0,
                       overwrites: int = 0, trials: int = 4, seed: int = 0, keys: str = "random",
                       softmax_scale: float | None = None, generator: torch.Generator | None = None
                       ) -> tuple[float, float]:
    """Write ``num_pairs`` (key, value) pairs into one ``[dim, dim]`` state, read them back.

    A single pass, no training. Keys are unit vectors, random (``keys="random"``) or orthonormal
    (``"orthonormal"``, needs ``num_pairs <= dim``); values random unit vectors. If ``overwrites > 0``,
    the first ``overwrites`` keys are written again, after all the others, with *new* random values,
    and reading ``k_i`` should return the latest one. ``rule="linear"`` (Hebbian) writes with
    :func:`attnlib.linear_attention` (``S = sum_i v_i k_i^T``); ``rule="delta"`` with
    :func:`attnlib.delta_rule` at learning rate ``beta``; ``rule="softmax"`` keeps every write and reads
    with :func:`attnlib.softmax_attention` at ``softmax_scale`` (default ``dim``: with unit keys a random
    other key takes about ``exp(-s + s^2 / (2 dim))`` of the stored key's weight at scale ``s``, least
    at ``s = dim``), plus a small recency bias so that of two identical keys the newer one wins.

    For ``rule="linear"`` reading key ``i`` gives ``S k_i = v_i + sum_{j != i} v_j (k_j . k_i)``: the
    wanted value plus crosstalk whose expected squared norm is ``(num_pairs - 1) / dim`` (each
    ``(k_j . k_i)^2`` averages ``1 / dim``), spread evenly over the ``dim`` coordinates.

    Returns ``(accuracy, readout_error)`` averaged over ``trials``: accuracy is the fraction of reads
    whose nearest written value (largest dot product, among all values ever written, old ones
    included; a tie is a miss) is the latest value of that key; readout_error is the mean
    ``|read_i - v_i|^2``. Randomness comes from ``generator`` when given, else from ``seed``.
    """
    if rule not in MECHANISMS:
        raise ValueError(f"rule must be one of {MECHANISMS}; got {rule!r}")
    if keys not in KEY_KINDS:
        raise ValueError(f"keys must be one of {KEY_KINDS}; got {keys!r}")
    num_pairs = _validate.check_int("num_pairs", num_pairs, lo=1)
    dim = _validate.check_int("dim", dim, lo=1)
    if keys == "orthonormal" and num_pairs > dim:
        raise ValueError(f"keys='orthonormal' needs num_pairs <= dim; got num_pairs={num_pairs}, dim={dim}")
    overwrites = _validate.check_int("overwrites", overwrites, lo=0, hi=num_pairs, why=" (at most num_pairs)")
    trials = _validate.check_int("trials", trials, lo=1)
    softmax_scale = float(dim) if softmax_scale is None else _validate.check_positive("softmax_scale",
                                                                                        softmax_scale)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    acc_sum = err_sum = 0.0
    for _ in range(trials):
        k, vals, new = _draw_pairs(num_pairs, dim, overwrites, keys, gen)
        k_seq = torch.cat([k, k[:overwrites]])
        v_seq = torch.cat([vals, new])
        latest = torch.cat([new, vals[overwrites:]])                 # what each key should return
        reads = _read(rule, k_seq, v_seq, k, beta=beta, softmax_scale=softmax_scale)
        acc_sum += _recall_fraction(reads, latest, vals[:overwrites])  # old values compete too
        err_sum += (reads - latest).square().sum(-1).mean().item()
    return acc_sum / trials, err_sum / trials


def recall_vs_pairs(pair_counts, dim: int, *, generator: torch.Generator, trials: int = 5,
                    rules=MECHANISMS, regimes=REGIMES, overwrite_fraction: float = 0.5,
                    keys: str = "random", beta: float = 1.0) -> dict[str, dict[str, torch.Tensor]]:
    """State capacity without training: recall against the number of pairs ``N``, per mechanism and regime.

    For each ``N`` in ``pair_counts`` and each regime, ``trials`` draws of pairs, each read back by every
    rule in ``rules`` (the same draw for all of them, so that they are compared on the same pairs):
    ``"distinct"`` writes ``N`` keys once; ``"overwrites"`` then writes the first
    ``round(overwrite_fraction * N)`` keys again with new values (recall is against the latest).
    Details as in :func:`associative_recall`, which does each cell.

    Returns ``{regime: {rule: recall [len(pair_counts), trials]}}`` (float64): mean and spread over the
    trial axis are the caller's.

    What it shows (``tests/test_capacity.py`` checks each part): softmax recalls every pair while keys are
    not near-duplicates; with distinct keys the delta rule never beats Hebbian (at ``dim = 64`` and
    ``N = 256``: about 0.76 against 0.27); with overwrites Hebbian misses about half the overwritten keys
    (its read is ``v_old + v_new`` plus crosstalk) while the delta rule replaces the old value, so the
    delta rule wins while the distinct keys number up to about ``dim``.
    """
    counts = [_validate.check_int("pair_counts[i]", n, lo=1) for n in pair_counts]
    if not counts:
        raise ValueError("pair_counts must name at least one number of pairs")
    dim = _validate.check_int("dim", dim, lo=1)
    trials = _validate.check_int("trials", trials, lo=1)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
    for name, chosen, allowed in (("rules", rules, MECHANISMS), ("regimes", regimes, REGIMES)):
        if isinstance(chosen, str) or not chosen or any(c not in allowed for c in chosen):
            raise ValueError(f"{name} must be a non-empty sequence drawn from {allowed}; got {chosen!r}")
    if isinstance(overwrite_fraction, bool) or not isinstance(overwrite_fraction, (int, float)) \
            or not 0 < overwrite_fraction <= 1:
        raise ValueError(f"overwrite_fraction must be a number in (0, 1]; got {overwrite_fraction!r}")
    out = {regime: {rule: torch.zeros(len(counts), trials, dtype=torch.float64) for rule in rules}
           for regime in regimes}
    for regime in regimes:
        for a, n in enumerate(counts):
            overwrites = round(overwrite_fraction * n) if regime == "overwrites" else 0
            for t in range(trials):
                state = generator.get_state()                        # one draw, every rule reads it
                for rule in rules:
                    generator.set_state(state)
                    out[regime][rule][a, t] = associative_recall(
                        n, dim, rule=rule, beta=beta, overwrites=overwrites, trials=1, keys=keys,
                        generator=generator)[0]
    return out


def state_trajectory(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | float = 1.0, *, rule: str,
                     g: torch.Tensor | None = None) -> torch.Tensor:
    """The states ``S_1 .. S_T`` of one head as pairs are written: ``k: [T, D]``, ``v: [T, Dv]``,
    ``beta: [T]`` or a number (the delta rule's learning rate; linear attention ignores it).

    Runs the library's own recurrences one token at a time, handing the state over:
    ``rule="linear"``: :func:`attnlib.linear.linear_attention_recurrent_reference` (``S_t = S_{t-1} + v_t k_t^T``);
    ``rule="delta"``: :func:`attnlib.deltanet.delta_rule_recurrent_reference` (gated when ``g`` is given; any
    ``beta``, also outside the stable range, since chapter 4 shows what happens there).
    Returns ``[T, Dv, D]`` in float64.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
    k, v = k.double()[None, None], v.double()[None, None]                # [1, 1, T, D]
    T = k.shape[2]
    beta = torch.as_tensor(beta, dtype=torch.float64).expand(T)[None, None]
    g = None if g is None else torch.as_tensor(g, dtype=torch.float64).expand(T)[None, None]
    S = torch.zeros(1, 1, v.shape[-1], k.shape[-1], dtype=torch.float64)
    q = torch.zeros_like(k[:, :, :1])                                    # outputs are not needed
    out = []
    for t in range(T):
        kt, vt = k[:, :, t:t + 1], v[:, :, t:t + 1]
        if rule == "linear":
            _, S = linear_attention_recurrent_reference(q, kt, vt, initial_state=S, causal=True)
        else:
            g_t = None if g is None else g[:, :, t:t + 1]
            _, S = delta_rule_recurrent_reference(q, kt, vt, beta[:, :, t:t + 1], g_t, scale=1.0, initial_state=S)
        out.append(S[0, 0])
    return torch.stack(out)


__all__ = ["associative_recall", "recall_vs_pairs", "state_trajectory", "RULES", "MECHANISMS", "REGIMES",
           "KEY_KINDS"]
