"""The fine print: inputs whose scores are bounded, where Alman and Song's bound applies, and the
entrywise error it bounds."""

from __future__ import annotations

import math

import torch

from attnlib import _validate
from attnlib.attention import softmax_attention_reference

from .algorithms import Algorithm
from .argument import _ACC, _check_float_dtype

# ---------------------------------------------------------------------------------------------
# The fine print: bounded scores
# ---------------------------------------------------------------------------------------------

def bounded_case(T: int, d: int, beta: float, *, seed: int = 0, dtype=torch.float32):
    """Random inputs whose scores are bounded: ``q_i, k_j`` uniform on spheres of radius
    ``sqrt(beta / scale)``, so ``|scale q_i . k_j| <= beta`` (Cauchy-Schwarz); values ``v ~ N(0, 1)``.
    Returns ``(q, k, v)`` of shape ``[1, 1, T, d]`` in ``dtype`` (a floating-point dtype)."""
    T, d = _validate.check_int("T", T, lo=1), _validate.check_int("d", d, lo=1)
    seed = _validate.check_int("seed", seed, lo=0)
    dtype = _check_float_dtype(dtype)
    beta = _validate.check_positive("beta", beta)
    g = torch.Generator().manual_seed(seed)
    scale = 1.0 / math.sqrt(d)
    q, k, v = torch.randn(3, T, d, generator=g, dtype=_ACC)
    r = math.sqrt(beta / scale)
    q = r * q / q.norm(dim=-1, keepdim=True)
    k = r * k / k.norm(dim=-1, keepdim=True)
    return tuple(x.to(dtype)[None, None] for x in (q, k, v))


def output_error(algo: Algorithm, q, k, v) -> float:
    """``max_{i, l} |o_il - exact_il|``: the entrywise error that Alman & Song bound."""
    _validate.check_qkv(q, k, v)                      # before the reference: its errors name no argument
    exact = softmax_attention_reference(q.double(), k.double(), v.double(), scale=algo.scale, causal=False)[0]
    return float((algo.attend(q, k, v).double() - exact).abs().max())
