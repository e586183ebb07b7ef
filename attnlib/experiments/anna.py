"""Chapter 5's experiments: the tasks, the collision curves, the ANNA conditions, the needle, and
the softmax-surrogate training distilled into ANNA.

Tasks (both from Sanford, Hsu, Telgarsky; used by Liu et al. 2025 for ANNA):

* ``match2``: ``x in [M]^N`` uniform, ``y_i = 1{exists j in [N]: x_i + x_j = 0 mod M}`` (``j = i``
  allowed, as in the definition; with ``M`` odd only ``x_i = 0`` matches itself).
* ``khop_induction``: characters from an alphabet of ``alphabet`` letters, adjacent ones distinct.
  ``find(i)`` = the last ``j < i`` with ``x_j = x_i``; one hop answers ``x_{j+1}`` and moves to
  ``j + 1``; ``k`` hops iterate from there. When some hop finds no earlier match the label is
  ``BLANK = alphabet``. (This follows the public generator ``chsanford/hop-induction-heads``,
  ``src/tasks.py``; that generator also prepends a hop-count token, which we leave out: ``k`` is fixed
  per call.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..anna import (
    anna_attention,
    anna_collision_counts,
    lsh_codes,
    lsh_projections,
    simhash_collision_probability,
    table_collision_probability,
)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------

def match2(n: int, N: int = 32, M: int = 37, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` Match2 sequences: ``(x [n, N] long in [0, M), y [n, N] long in {0, 1})``."""
    if n < 0 or N < 1 or M < 2:
        raise ValueError(f"match2 needs n >= 0, N >= 1, M >= 2; got n={n}, N={N}, M={M}")
    x = torch.randint(0, M, (n, N), generator=_gen(seed))
    partner = (-x) % M                                                        # the value that matches x_i
    present = torch.zeros(n, M, dtype=torch.bool).scatter_(1, x, True)       # which values occur
    y = present.gather(1, partner).long()
    return x, y


def khop_induction(n: int, N: int = 100, k: int = 1, alphabet: int = 4,
                   seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` k-hop induction sequences: ``(x [n, N] long in [0, alphabet), y [n, N] long in
    [0, alphabet]``, ``alphabet`` being the blank label)."""
    if n < 0 or N < 1 or k < 0 or alphabet < 2:
        raise ValueError(f"khop_induction needs n >= 0, N >= 1, k >= 0, alphabet >= 2; "
                         f"got n={n}, N={N}, k={k}, alphabet={alphabet}")
    g = _gen(seed)
    x = torch.empty(n, N, dtype=torch.long)
    x[:, 0] = torch.randint(0, alphabet, (n,), generator=g)
    for t in range(1, N):                       # a uniform letter among the alphabet - 1 others
        step = torch.randint(1, alphabet, (n,), generator=g)
        x[:, t] = (x[:, t - 1] + step) % alphabet
    # nxt[i] = (last j < i with x_j = x_i) + 1, or -1 when there is none
    nxt = torch.full((n, N), -1, dtype=torch.long)
    last = torch.full((n, alphabet), -1, dtype=torch.long)
    rows = torch.arange(n)
    for t in range(N):
        j = last[rows, x[:, t]]
        nxt[:, t] = torch.where(j >= 0, j + 1, -1)
        last[rows, x[:, t]] = t
    idx = torch.arange(N).expand(n, N).clone()
    for _ in range(k):
        ok = idx >= 0
        idx = torch.where(ok, nxt.gather(1, idx.clamp_min(0)), -1)
    y = torch.where(idx >= 0, x.gather(1, idx.clamp_min(0)), alphabet)
    return x, y


# ----------------------------------------------------------------------------------------------
# Collision probabilities
# ----------------------------------------------------------------------------------------------

def pairs_at_angle(n: int, D: int, theta: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` pairs of unit vectors in ``R^D`` at exactly the angle ``theta``: ``x, y [n, D]`` float64."""
    g = _gen(seed)
    x = F.normalize(torch.randn(n, D, generator=g, dtype=torch.float64), dim=-1)
    u = torch.randn(n, D, generator=g, dtype=torch.float64)
    u = F.normalize(u - (u * x).sum(-1, keepdim=True) * x, dim=-1)
    return x, math.cos(theta) * x + math.sin(theta) * u


def collision_rate(family: str, D: int, thetas, *, n_pairs: int = 1000, n_tables: int = 64, n_bits: int = 1,
                   seed: int = 0) -> torch.Tensor:
    """Empirical ``Pr[g(x) = g(y)]`` for one table of ``n_bits`` hashes, at each angle: ``n_pairs`` random
    pairs at that angle, each hashed by ``n_tables`` independent tables; the rate is the mean over all
    ``n_pairs * n_tables`` (pair, table) draws."""
    out = []
    for a, theta in enumerate(thetas):
        x, y = pairs_at_angle(n_pairs, D, float(theta), seed + 7919 * a)
        proj = lsh_projections(family, n_tables, n_bits, D, seed + 104729 * (a + 1))
        same = lsh_codes(x[None, None], proj, family) == lsh_codes(y[None, None], proj, family)
        out.append(same.double().mean())
    return torch.stack(out)


# ----------------------------------------------------------------------------------------------
# The ANNA conditions and the needle
# ----------------------------------------------------------------------------------------------

@dataclass
class PlantedInstance:
    q: torch.Tensor         # [1, 1, n_queries, D] unit vectors
    k: torch.Tensor         # [1, 1, n_keys, D] unit vectors
    dist: torch.Tensor      # [n_queries, n_keys] Euclidean distances
    r: float
    c: float


def planted_instance(n_queries: int, n_keys: int, D: int, *, theta_near: float, n_near: int,
                     c: float, seed: int) -> PlantedInstance:
    """Random unit keys; each query has ``n_near`` keys planted at angle ``theta_near`` (distance
    ``r = 2 sin(theta_near / 2)``), the other keys are random (in high ``D`` almost orthogonal)."""
    g = _gen(seed)
    if n_queries * n_near > n_keys:
        raise ValueError(f"planted_instance needs n_queries * n_near <= n_keys (disjoint planted keys); "
                         f"got {n_queries} * {n_near} > {n_keys}")
    k = F.normalize(torch.randn(n_keys, D, generator=g, dtype=torch.float64), dim=-1)
    q = F.normalize(torch.randn(n_queries, D, generator=g, dtype=torch.float64), dim=-1)
    perm = torch.randperm(n_keys, generator=g)
    for i in range(n_queries):
        slots = perm[i * n_near:(i + 1) * n_near]
        u = torch.randn(n_near, D, generator=g, dtype=torch.float64)
        u = F.normalize(u - (u @ q[i])[:, None] * q[i], dim=-1)
        k[slots] = math.cos(theta_near) * q[i] + math.sin(theta_near) * u
    # distances of unit vectors from their inner products (torch.cdist may round by ~1e-8), and r
    # with a relative margin so that the planted keys are inside N(q, r) despite rounding
    dist = (2 - 2 * q @ k.T).clamp_min(0).sqrt()
    r = 2 * math.sin(theta_near / 2) * (1 + 1e-9)
    return PlantedInstance(q[None, None], k[None, None], dist, r, c)


def anna_conditions(inst: PlantedInstance, n_tables: int, n_bits: int, seed: int,
                    family: str = "simhash") -> dict:
    """Check the two ANNA conditions on every query, from the weights ``anna_attention`` returns.

    (i) ``w_ij > 0`` only for ``dist_ij <= c r``; (ii) ``w_ij >= 1 / ((|N(q_i, c r)| - 1) l + 1)`` for
    ``dist_ij <= r``. Returns the fraction of queries satisfying (i), (ii), both, and the same
    "both" read off the collision counts alone (no far key collides, every near key collides at
    least once), which the chapter shows is equivalent.
    """
    v = torch.zeros(1, 1, inst.k.shape[2], 1, dtype=torch.float64)
    _, w = anna_attention(inst.q, inst.k, v, n_tables=n_tables, n_bits=n_bits, family=family, seed=seed,
                          return_weights=True, backend="torch")
    w = w[0, 0]
    near, within = inst.dist <= inst.r, inst.dist <= inst.c * inst.r
    cond1 = ((w > 0) & ~within).sum(-1) == 0
    bound = 1.0 / ((within.sum(-1, keepdim=True) - 1).clamp_min(0) * n_tables + 1).double()
    cond2 = ((w < bound - 1e-12) & near).sum(-1) == 0
    proj = lsh_projections(family, n_tables, n_bits, inst.q.shape[-1], seed)
    m = anna_collision_counts(lsh_codes(inst.q, proj, family), lsh_codes(inst.k, proj, family))[0, 0]
    by_counts = (((m > 0) & ~within).sum(-1) == 0) & (((m == 0) & near).sum(-1) == 0)
    return dict(cond1=cond1.double().mean().item(), cond2=cond2.double().mean().item(),
                both=(cond1 & cond2).double().mean().item(), both_by_counts=by_counts.double().mean().item(),
                agree=bool((by_counts == (cond1 & cond2)).all()))


def needle_miss_rate(n_trials: int, n_keys: int, D: int, *, theta: float, n_tables: int, n_bits: int,
                     seed: int) -> tuple[float, float]:
    """Chapter 2's needle against ANNA: one key at angle ``theta`` from the query among random keys.
    Returns ``(measured, predicted)`` probability that the needle gets no weight, the prediction
    being ``(1 - p(theta)^z)^l`` for SimHash (the tables are independent draws)."""
    misses = 0
    for t in range(n_trials):
        inst = planted_instance(1, n_keys, D, theta_near=theta, n_near=1, c=1.0, seed=seed + 31 * t)
        v = torch.zeros(1, 1, n_keys, 1, dtype=torch.float64)
        _, w = anna_attention(inst.q, inst.k, v, n_tables=n_tables, n_bits=n_bits, seed=seed + 31 * t + 15_485_863,
                              return_weights=True, backend="torch")
        needle = inst.dist[0].argmin()
        misses += int(w[0, 0, 0, needle] == 0)
    p = simhash_collision_probability(theta).item()
    return misses / n_trials, 1.0 - table_collision_probability(p, n_bits, n_tables).item()


# ----------------------------------------------------------------------------------------------
# Training: the softmax surrogate, distilled into ANNA
# ----------------------------------------------------------------------------------------------

class SurrogateLayer(nn.Module):
    """One attention layer whose softmax can be swapped for ANNA at evaluation.

    Training: ``softmax(beta q_hat k_hat^T) v`` with unit-norm ``q_hat, k_hat`` and a learned
    temperature ``beta`` (the paper's surrogate). Evaluation with ``anna=(l, z, seed)``: the same
    ``q_hat, k_hat, v`` through ``anna_attention`` (non-causal for Match2, causal for induction).
    """

    def __init__(self, d: int, causal: bool):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.log_beta = nn.Parameter(torch.tensor(math.log(8.0)))
        self.causal = causal

    def forward(self, h: torch.Tensor, anna: tuple[int, int, int] | None = None) -> torch.Tensor:
        q = F.normalize(self.wq(h), dim=-1)[:, None]                         # [B, 1, T, d]
        k = F.normalize(self.wk(h), dim=-1)[:, None]
        v = self.wv(h)[:, None]
        if anna is None:
            s = self.log_beta.exp() * q @ k.transpose(-1, -2)
            if self.causal:
                T = h.shape[1]
                s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=h.device).tril(), float("-inf"))
            o = torch.softmax(s, -1) @ v
        else:
            n_tables, n_bits, seed = anna
            o = anna_attention(q, k, v, n_tables=n_tables, n_bits=n_bits, seed=seed, causal=self.causal)
        return o[:, 0]


class TinyModel(nn.Module):
    """Embedding (+ positions when causal), ``n_layers`` of [attention + MLP] with residuals, readout."""

    def __init__(self, vocab: int, n_out: int, d: int, n_layers: int, causal: bool, max_len: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d) if causal else None
        self.attn = nn.ModuleList(SurrogateLayer(d, causal) for _ in range(n_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                 for _ in range(n_layers))
        self.out = nn.Linear(d, n_out)

    def forward(self, x: torch.Tensor, anna: list[tuple[int, int, int]] | None = None) -> torch.Tensor:
        h = self.emb(x)
        if self.pos is not None:
            h = h + self.pos(torch.arange(x.shape[1], device=x.device))
        for i, (a, m) in enumerate(zip(self.attn, self.mlp)):
            h = h + a(h, None if anna is None else anna[i])
            h = h + m(h)
        return self.out(h)


def train_surrogate(task: str, *, steps: int, seed: int, d: int = 64, batch: int = 64, lr: float = 3e-3,
                    device: str | torch.device = "cpu", N: int | None = None, k: int = 1,
                    progress=None) -> TinyModel:
    """Train the softmax surrogate on ``"match2"`` (one layer, N=32, M=37) or ``"induction"``
    (``k``-hop, alphabet 4, two layers, N=100 by default). Fresh data every step from ``seed``."""
    torch.manual_seed(seed)
    if task == "match2":
        N = N or 32
        model = TinyModel(37, 2, d, 1, causal=False, max_len=N)
        draw = lambda s: match2(batch, N, 37, seed=s)  # noqa: E731
    elif task == "induction":
        N = N or 100
        model = TinyModel(4, 5, d, 2, causal=True, max_len=N)
        draw = lambda s: khop_induction(batch, N, k, 4, seed=s)  # noqa: E731
    else:
        raise ValueError(f"task must be 'match2' or 'induction'; got {task!r}")
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    it = range(steps) if progress is None else progress(range(steps))
    for s in it:
        x, y = draw(1_000_003 * seed + s)
        loss = F.cross_entropy(model(x.to(device)).flatten(0, 1), y.to(device).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model


@torch.no_grad()
def error_rate(model: TinyModel, task: str, *, n: int, seed: int, anna: list[tuple[int, int, int]] | None = None,
               device: str | torch.device = "cpu", N: int | None = None, k: int = 1) -> float:
    """Per-token error of ``model`` on fresh data (softmax, or ANNA with per-layer ``(l, z, seed)``)."""
    model.eval()
    x, y = match2(n, N or 32, 37, seed=seed) if task == "match2" else khop_induction(n, N or 100, k, 4, seed=seed)
    pred = model(x.to(device), anna).argmax(-1).cpu()
    model.train()
    return (pred != y).double().mean().item()
