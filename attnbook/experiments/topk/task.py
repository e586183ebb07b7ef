"""The planted task the indexer is trained on: needles in a power-law tail, read by a teacher softmax
attention (:func:`planted_task`, :class:`PlantedTask`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._common import _check_generator


@dataclass
class PlantedTask:
    """A batch of the planted task. ``states [B, T, 2 d_c + 2]`` the token states the indexer reads;
    ``plan [B, 1, T, T]`` the teacher's causal attention on them (its target); ``planted [B, T, T]``
    the needles (bool)."""
    states: torch.Tensor
    plan: torch.Tensor
    planted: torch.Tensor


def planted_task(batch: int, T: int, *, content_dim: int = 32, n_planted: int = 16, beta: float = 5.0,
                 tail: float = 1.0, generator: torch.Generator) -> PlantedTask:
    """Planted needles in a power-law tail, read by a teacher softmax attention.

    Token ``s`` carries a key content ``u_s ~ N(0, I / d_c)``, a query content ``g_s = sum_{r in P_s} u_r``
    (``P_s``: ``n_planted`` earlier tokens, its needles) and a salience ``z_s = -tail * log(rank_s)``
    (``rank_s`` a random permutation of ``1..T``). The teacher is one softmax head with query
    ``(beta g_t, 1)`` and key ``(u_s, z_s)``: logit ``beta g_t . u_s + z_s``, so each row puts mass on its
    needles (logit about ``beta``) over a background whose weights fall off like ``rank^-tail``, blurred
    by the needles' crosstalk (``g_t . u_s`` has spread ``sqrt(n_planted / d_c)`` off the needles).
    The states the indexer reads are ``(u_s, g_s, z_s, 1)``."""
    g = _check_generator(generator)
    u = torch.randn(batch, T, content_dim, generator=g) / math.sqrt(content_dim)
    # needles: n_planted earlier positions per token (all of them while fewer exist)
    score = torch.rand(batch, T, T, generator=g).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(-1), -1.0)
    top = score.topk(min(n_planted, T), dim=-1).indices
    planted = torch.zeros(batch, T, T, dtype=torch.bool).scatter_(-1, top, True) & (score >= 0)
    gq = planted.float() @ u
    rank = torch.argsort(torch.rand(batch, T, generator=g), dim=-1).float() + 1
    z = -tail * torch.log(rank)
    states = torch.cat([u, gq, z[..., None], torch.ones(batch, T, 1)], dim=-1)
    q = torch.cat([beta * gq, torch.ones(batch, T, 1)], dim=-1)[:, None]
    k = torch.cat([u, z[..., None]], dim=-1)[:, None]
    logits = (q @ k.transpose(-1, -2)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    plan = torch.softmax(logits, dim=-1)                 # the teacher's weights (softmax_attention on v = I)
    return PlantedTask(states=states, plan=plan, planted=planted)
