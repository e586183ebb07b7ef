"""Associative recall without training: write key--value pairs into one state, read them back;
and the state itself, write by write (``state_trajectory``).

Chapter 3 runs it for linear attention (``S = sum_i v_i k_i^T``: crosstalk grows like ``(N - 1) / D``),
chapter 4 for the delta rule too, with overwrites. One function for both, built on the library's own
operators, so the experiment measures exactly what the chapters define.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _validate
from ..deltanet import delta_rule, delta_rule_recurrent_reference
from ..linear import linear_attention, linear_attention_recurrent_reference

RULES = ("linear", "delta")


def associative_recall(num_pairs: int, dim: int, *, rule: str = "linear", beta: float = 1.0,
                       overwrites: int = 0, trials: int = 4, seed: int = 0) -> tuple[float, float]:
    """Write ``num_pairs`` random unit (key, value) pairs into one ``[dim, dim]`` state, read them back.

    A single pass, no training. If ``overwrites > 0``, the first ``overwrites`` keys are written again
    with *new* random values, and ``S k_i`` should return the latest one. ``rule="linear"`` writes with
    :func:`attnlib.linear_attention` (``S = sum_i v_i k_i^T``); ``rule="delta"`` with
    :func:`attnlib.delta_rule` at learning rate ``beta``.

    For ``rule="linear"`` reading key ``i`` gives ``S k_i = v_i + sum_{j != i} v_j (k_j . k_i)``: the
    wanted value plus crosstalk whose expected squared norm is ``(num_pairs - 1) / dim`` (each
    ``(k_j . k_i)^2`` averages ``1 / dim``).

    Returns ``(accuracy, readout_error)`` averaged over ``trials``: accuracy is the fraction of reads
    whose nearest written value (largest dot product, among all values ever written, old ones
    included) is the latest value of that key; readout_error is the mean ``|S k_i - v_i|^2``.
    """
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
    num_pairs = _validate.check_int("num_pairs", num_pairs, lo=1)
    dim = _validate.check_int("dim", dim, lo=1)
    overwrites = _validate.check_int("overwrites", overwrites, lo=0, hi=num_pairs, why=" (at most num_pairs)")
    trials = _validate.check_int("trials", trials, lo=1)
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    acc_sum = err_sum = 0.0
    for _ in range(trials):
        keys = F.normalize(torch.randn(num_pairs, dim, generator=gen, dtype=f64), dim=-1)
        vals = F.normalize(torch.randn(num_pairs, dim, generator=gen, dtype=f64), dim=-1)
        new = F.normalize(torch.randn(overwrites, dim, generator=gen, dtype=f64), dim=-1)
        k_seq = torch.cat([keys, keys[:overwrites]])[None, None]
        v_seq = torch.cat([vals, new])[None, None]
        q_seq = torch.zeros_like(k_seq)                             # only the final state is read
        if rule == "linear":
            _, S = linear_attention(q_seq, k_seq, v_seq, mode="recurrent", output_final_state=True)
        else:
            b = torch.full(k_seq.shape[:3], beta, dtype=f64)
            _, S = delta_rule(q_seq, k_seq, v_seq, b, mode="chunk", output_final_state=True)
        latest = torch.cat([new, vals[overwrites:]])                 # what each key should return
        read = keys @ S[0, 0].T                                     # row i: (S k_i)^T
        candidates = torch.cat([latest, vals[:overwrites]])         # old values compete too
        best = (read @ candidates.T).argmax(-1)
        acc_sum += (best == torch.arange(num_pairs)).double().mean().item()
        err_sum += (read - latest).square().sum(-1).mean().item()
    return acc_sum / trials, err_sum / trials


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
            _, S = linear_attention_recurrent_reference(q, kt, vt, S)
        else:
            g_t = None if g is None else g[:, :, t:t + 1]
            _, S = delta_rule_recurrent_reference(q, kt, vt, beta[:, :, t:t + 1], g_t, scale=1.0, initial_state=S)
        out.append(S[0, 0])
    return torch.stack(out)


__all__ = ["associative_recall", "state_trajectory", "RULES"]
