"""Chapter 5's experiments: the tasks, the collision curves, the ANNA conditions, the needle, and
the softmax-surrogate training distilled into ANNA; and ANNA's plan beside softmax's
(:func:`anna_plans`, :func:`anna_plan_at`), which :mod:`attnbook.widgets.anna` draws.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlib import eot
from attnlib.anna import (
    anna_attention,
    anna_collision_counts,
    anna_weights_from_counts,
    lsh_codes,
    lsh_projections,
    simhash_collision_probability,
    table_collision_probability,
)

from ._training import train_loop
from .weights import anna_weights, softmax_weights


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
                          return_weights=True, backend="torch", causal=False)
    w = w[0, 0]
    near, within = inst.dist <= inst.r, inst.dist <= inst.c * inst.r
    cond1 = ((w > 0) & ~within).sum(-1) == 0
    bound = 1.0 / ((within.sum(-1, keepdim=True) - 1).clamp_min(0) * n_tables + 1).double()
    cond2 = ((w < bound - 1e-12) & near).sum(-1) == 0
    proj = lsh_projections(family, n_tables, n_bits, inst.q.shape[-1], seed)
    m = anna_collision_counts(lsh_codes(inst.q, proj, family), lsh_codes(inst.k, proj, family), causal=False)[0, 0]
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
                              return_weights=True, backend="torch", causal=False)
        needle = inst.dist[0].argmin()
        misses += int(w[0, 0, 0, needle] == 0)
    p = simhash_collision_probability(theta).item()
    return misses / n_trials, 1.0 - table_collision_probability(p, n_bits, n_tables).item()


# ----------------------------------------------------------------------------------------------
# Training: a differentiable surrogate, distilled into ANNA
# ----------------------------------------------------------------------------------------------

SURROGATES = ("softmax", "simhash_limit")


def surrogate_logits(q: torch.Tensor, k: torch.Tensor, surrogate: str, *, beta: torch.Tensor | float = 1.0,
                     n_bits: int = 4) -> torch.Tensor:
    """Attention logits of a differentiable stand-in for ANNA, for unit-norm ``q, k [..., T, D]``.

    * ``"softmax"`` (the paper's surrogate): ``beta * q k^T``.
    * ``"simhash_limit"`` (ours): ``n_bits * log(1 - theta_ij / pi)``, the log of the probability that
      ``q_i`` and ``k_j`` share a bucket of one SimHash table of ``n_bits`` bits. Its softmax is the
      ``l -> infinity`` limit of ANNA's weights (chapter 5, "Many tables"), so the surrogate trains the
      very kernel that ANNA samples with finitely many tables.
    """
    cos = q @ k.transpose(-1, -2)
    if surrogate == "softmax":
        return beta * cos
    if surrogate == "simhash_limit":
        # arccos has an infinite slope at +-1: keep the cosine a hair inside so gradients stay finite
        theta = torch.arccos(cos.clamp(-1 + 1e-6, 1 - 1e-6))
        return n_bits * torch.log1p(-theta / math.pi)
    raise ValueError(f"surrogate must be one of {SURROGATES}; got {surrogate!r}")


class SurrogateLayer(nn.Module):
    """One attention layer trained through a differentiable surrogate, evaluated with ANNA.

    Training: ``softmax(logits) v`` with unit-norm ``q_hat, k_hat`` and the logits of
    ``surrogate_logits`` -- the paper's ``beta q_hat k_hat^T`` with a learned temperature ``beta``, or
    our SimHash limit kernel at ``n_bits`` bits. Evaluation with ``anna=(l, z, seed)``: the same
    ``q_hat, k_hat, v`` through ``anna_attention`` (non-causal for Match2, causal for induction).
    """

    def __init__(self, d: int, causal: bool, surrogate: str = "softmax", n_bits: int = 4):
        super().__init__()
        if surrogate not in SURROGATES:
            raise ValueError(f"surrogate must be one of {SURROGATES}; got {surrogate!r}")
        self.wq, self.wk, self.wv = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.log_beta = nn.Parameter(torch.tensor(math.log(8.0)), requires_grad=surrogate == "softmax")
        self.causal, self.surrogate, self.n_bits = causal, surrogate, n_bits

    def unit_qk(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q_hat, k_hat [B, 1, T, d]``: the unit-norm queries and keys both ANNA and the surrogate see."""
        return F.normalize(self.wq(h), dim=-1)[:, None], F.normalize(self.wk(h), dim=-1)[:, None]

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """The stand-in's attention logits for unit ``q, k`` (before any causal mask)."""
        return surrogate_logits(q, k, self.surrogate, beta=self.log_beta.exp(), n_bits=self.n_bits)

    def forward(self, h: torch.Tensor, anna=None) -> torch.Tensor:
        """``anna``: ``None`` (the stand-in), ``(l, z, seed)`` (ANNA with ``l`` SimHash tables of ``z``
        bits), ``(math.inf, z, None)`` (the ``l -> infinity`` limit of those weights: softmax of
        ``z log(1 - theta / pi)``), or a tensor ``w [B, 1, T, T]`` of weights to serve as they are."""
        q, k = self.unit_qk(h)
        v = self.wv(h)[:, None]
        if isinstance(anna, torch.Tensor):
            return (anna.to(v.dtype) @ v)[:, 0]
        if anna is None or anna[0] == math.inf:
            s = self.logits(q, k) if anna is None else surrogate_logits(q, k, "simhash_limit", n_bits=anna[1])
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

    def __init__(self, vocab: int, n_out: int, d: int, n_layers: int, causal: bool, max_len: int,
                 surrogate: str = "softmax", n_bits: int = 4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d) if causal else None
        self.attn = nn.ModuleList(SurrogateLayer(d, causal, surrogate, n_bits) for _ in range(n_layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
                                 for _ in range(n_layers))
        self.out = nn.Linear(d, n_out)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        if self.pos is not None:
            h = h + self.pos(torch.arange(x.shape[1], device=x.device))
        return h

    def forward(self, x: torch.Tensor, anna: list[tuple[int, int, int]] | None = None) -> torch.Tensor:
        h = self.embed(x)
        for i, (a, m) in enumerate(zip(self.attn, self.mlp)):
            h = h + a(h, None if anna is None else anna[i])
            h = h + m(h)
        return self.out(h)


def _task(task: str, N: int | None, k: int):
    """``(vocab, n_out, n_layers, causal, N, draw(n, seed))`` of a task."""
    if task == "match2":
        N = N or 32
        return 37, 2, 1, False, N, lambda n, s: match2(n, N, 37, seed=s)
    if task == "induction":
        N = N or 100
        return 4, 5, 2, True, N, lambda n, s: khop_induction(n, N, k, 4, seed=s)
    raise ValueError(f"task must be 'match2' or 'induction'; got {task!r}")


def train_surrogate(task: str, *, steps: int, seed: int, surrogate: str = "softmax", n_bits: int = 4, d: int = 64,
                    batch: int = 64, lr: float = 3e-3, device: str | torch.device = "cpu", N: int | None = None,
                    k: int = 1, progress=None) -> TinyModel:
    """Train a surrogate model on ``"match2"`` (one layer, N=32, M=37) or ``"induction"`` (``k``-hop,
    alphabet 4, two layers, N=100 by default): AdamW with a one-cycle schedule, fresh data every step,
    every random choice from ``seed``. ``surrogate`` and ``n_bits`` as in ``surrogate_logits``."""
    vocab, n_out, n_layers, causal, N, draw = _task(task, N, k)
    torch.manual_seed(seed)
    model = TinyModel(vocab, n_out, d, n_layers, causal=causal, max_len=N, surrogate=surrogate,
                      n_bits=n_bits).to(device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)

    def step_loss(s: int) -> torch.Tensor:
        x, y = draw(batch, 1_000_003 * seed + s)
        return F.cross_entropy(model(x.to(device)).flatten(0, 1), y.to(device).flatten())

    train_loop(step_loss, opt, steps, sched=sched,
               progress=None if progress is None else partial(progress, desc=f"{task}, {surrogate}", leave=False))
    return model


@torch.no_grad()
def error_rate(model: TinyModel, task: str, *, n: int, seed: int, anna: list | None = None,
               device: str | torch.device = "cpu", N: int | None = None, k: int = 1) -> float:
    """Per-token error of ``model`` on fresh data: its stand-in, or per layer what ``SurrogateLayer.forward``
    takes as ``anna`` (ANNA's ``(l, z, seed)``, the limit ``(math.inf, z, None)``, or weights)."""
    *_, draw = _task(task, N, k)
    was_training = model.training
    model.eval()
    x, y = draw(n, seed)
    pred = model(x.to(device), anna).argmax(-1).cpu()
    model.train(was_training)
    return (pred != y).double().mean().item()


def _check_match2_model(model: TinyModel, what: str) -> None:
    if len(model.attn) != 1 or model.pos is not None:
        raise ValueError(f"{what} needs a one-layer Match2 model without positions")


@torch.no_grad()
def match2_partner_geometry(model: TinyModel) -> dict:
    """Where a one-layer Match2 model put its unit queries and keys: for each symbol ``a``, the cosine
    between ``q_hat(a)`` and its partner's key ``k_hat(-a mod M)``, and the largest cosine with any other
    symbol's key. LSH separates the partner only if the first is well above the second."""
    _check_match2_model(model, "match2_partner_geometry")
    M = model.emb.num_embeddings
    q, k = model.attn[0].unit_qk(model.emb.weight[None])
    cos = (q @ k.transpose(-1, -2))[0, 0]
    a = torch.arange(M, device=cos.device)
    partner = cos[a, (-a) % M]
    others = cos.clone()
    others[a, (-a) % M] = -float("inf")
    return dict(partner_cos=partner.cpu(), max_other_cos=others.max(-1).values.cpu())


WEIGHTINGS = ("count", "set")


@torch.no_grad()
def match2_anna_weights(model: TinyModel, x: torch.Tensor, n_tables: int, n_bits: int, seed: int,
                        weighting: str = "count") -> torch.Tensor:
    """The weights ``w [n, 1, N, N]`` that ANNA (SimHash, ``n_tables`` tables of ``n_bits`` bits, tables
    drawn from ``seed``) gives a one-layer Match2 model on the sequences ``x [n, N]``, computed per symbol.

    ``weighting="count"`` (the library's, :func:`attnlib.anna_attention`): ``w_ij = m_ij / sum_j' m_ij'``,
    ``m_ij`` the number of tables in which ``q_i`` and ``k_j`` share a bucket. ``weighting="set"``: uniform
    weights over the set of keys that collide in at least one table, ``w_ij = [m_ij > 0] / #{j': m_ij' > 0}``
    -- the other reading of an implementation that looks up every table and averages what it finds
    (chapter 5, exercise 4).

    Without positions, a token's unit query and key depend on its symbol alone, so whether ``q_i`` and
    ``k_j`` share a bucket of a table depends only on ``(x_i, x_j)``: hash the ``M`` symbols' queries and
    keys once, count ``C[a, b]`` = tables in which query ``a`` meets key ``b``, and read
    ``m_ij = C[x_i, x_j]``, ``w_ij = m_ij / sum_j' m_ij'`` (the definition, ``anna_weights_from_counts``).
    It costs ``O(l M^2)`` instead of ``O(l n N D)``, which is what lets the reproduction sweep ``l`` into
    the thousands; a test checks it against ``anna_attention`` on the sequences themselves."""
    _check_match2_model(model, "match2_anna_weights")
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}; got {weighting!r}")
    q, k = model.attn[0].unit_qk(model.emb.weight[None])                       # [1, 1, M, d]
    proj = lsh_projections("simhash", n_tables, n_bits, q.shape[-1], seed)
    C = anna_collision_counts(lsh_codes(q, proj, "simhash"), lsh_codes(k, proj, "simhash"), causal=False)[0, 0]
    if weighting == "set":
        C = (C > 0).to(C.dtype)                                                # each colliding key once
    x = x.to(C.device)
    m = C[x[:, :, None], x[:, None, :]]                                        # [n, N, N]
    return anna_weights_from_counts(m, dtype=torch.float32)[:, None]


def anna_error_grid(model: TinyModel, task: str, ls, zs, *, n: int, seed: int, n_hash_seeds: int = 2,
                    device: str | torch.device = "cpu", N: int | None = None, k: int = 1,
                    weighting: str = "count") -> torch.Tensor:
    """``[len(ls), len(zs)]`` error of the model distilled into ANNA: every attention layer replaced by
    ``anna_attention`` with ``n_tables = l`` (``ls`` holds one ``l`` per layer as a tuple when the
    model has several layers) and ``n_bits = z``; averaged over ``n_hash_seeds`` draws of the tables.
    For Match2 the weights come from ``match2_anna_weights`` (the same operator, counted per symbol),
    which also serves ``weighting="set"`` (uniform over the colliding keys); other tasks count."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}; got {weighting!r}")
    if weighting != "count" and task != "match2":
        raise ValueError(f"weighting={weighting!r} is served for match2 only (anna_attention counts); "
                         f"got task={task!r}")
    out = torch.zeros(len(ls), len(zs), dtype=torch.float64)
    *_, draw = _task(task, N, k)
    x = draw(n, seed)[0]
    for a, l in enumerate(ls):
        per_layer = l if isinstance(l, tuple) else (l,) * len(model.attn)
        for b, z in enumerate(zs):
            errs = []
            for h in range(n_hash_seeds):
                serve = [(li, z, seed + 7919 * h + 104729 * i) for i, li in enumerate(per_layer)]
                if task == "match2":
                    serve = [match2_anna_weights(model, x, *serve[0], weighting=weighting).to(device)]
                errs.append(error_rate(model, task, n=n, seed=seed, device=device, N=N, k=k, anna=serve))
            out[a, b] = sum(errs) / len(errs)
    return out


def limit_error(model: TinyModel, task: str, zs, *, n: int, seed: int, device: str | torch.device = "cpu",
                N: int | None = None, k: int = 1) -> list[float]:
    """Per ``z``: the error of the model served the ``l -> infinity`` limit of ANNA's weights in every
    layer (softmax of ``z log(1 - theta / pi)`` on its unit queries and keys) -- where the columns of
    ``anna_error_grid`` go as ``l`` grows, whatever the model was trained through."""
    return [error_rate(model, task, n=n, seed=seed, device=device, N=N, k=k,
                       anna=[(math.inf, z, None)] * len(model.attn)) for z in zs]


def distillation_row(model: TinyModel, task: str, ls, zs, *, n: int, seed: int, n_hash_seeds: int,
                     device: str | torch.device = "cpu") -> dict:
    """What a reproduction run records of one trained model: its stand-in's error, the distilled error
    grid over ``(ls, zs)`` (``anna_error_grid``), the error at ``l -> infinity`` per ``z``
    (``limit_error``), the learned temperatures of a softmax stand-in, and for
    Match2 the partner geometry's means; every error on the same ``n`` sequences drawn from ``seed``."""
    layer = model.attn[0]
    row = {"surrogate": layer.surrogate,
           "surrogate_error": error_rate(model, task, n=n, seed=seed, device=device),
           "anna_error": anna_error_grid(model, task, ls, zs, n=n, seed=seed, n_hash_seeds=n_hash_seeds,
                                         device=device).tolist(),
           "limit_error": limit_error(model, task, zs, n=n, seed=seed, device=device)}
    if task == "match2":
        geo = match2_partner_geometry(model)
        row["partner_cos_mean"] = geo["partner_cos"].mean().item()
        row["max_other_cos_mean"] = geo["max_other_cos"].mean().item()
    if layer.surrogate == "softmax":
        row["beta"] = [a.log_beta.exp().item() for a in model.attn]
    return row


def quick_reproduction(*, steps: int, batch: int, lr: float, ls, zs, set_cells: int, seed: int, eval_seed: int,
                       mass_seed: int, anna_seed: int, device: str = "cpu") -> dict:
    """Lab 5's quick run on Match2, as plain numbers (which ``lab.run`` may read from its committed run):
    each stand-in of :data:`SURROGATES` trained once (``train_surrogate``), then

    * ``rows``: its :func:`distillation_row` over ``(ls, zs)`` on 400 sequences from ``eval_seed``, with
      ``set_error`` (the first ``set_cells`` values of ``ls`` and ``zs``, each colliding key counted once)
      and ``partner_nearest`` (the share of symbols whose partner's key is the nearest to its query);
    * ``masses[surrogate]``: the partner share of its own plan (``own``), of the ``l -> infinity`` plan at
      ``z`` = 4, 16, 24 (keys ``"4"``, ``"16"``, ``"24"``; 400 sequences from ``mass_seed``), and of ANNA
      with 4,096 tables of 4 bits (``anna_4096_z4``; tables from ``anna_seed``)."""
    x_m, y_m = match2(400, 32, 37, seed=mass_seed)          # the sequences match2_partner_mass draws
    rows, masses = [], {}
    for surrogate in SURROGATES:
        model = train_surrogate("match2", steps=steps, seed=seed, surrogate=surrogate, batch=batch, lr=lr,
                                device=device)
        row = distillation_row(model, "match2", ls, zs, n=400, seed=eval_seed, n_hash_seeds=1, device=device)
        row["set_error"] = anna_error_grid(model, "match2", ls[:set_cells], zs[:set_cells], n=400, seed=eval_seed,
                                           n_hash_seeds=1, device=device, weighting="set").tolist()
        geo = match2_partner_geometry(model)
        row["partner_nearest"] = (geo["partner_cos"] > geo["max_other_cos"]).double().mean().item()
        rows.append(row)
        mass = {"own": match2_partner_mass(model, n=400, seed=mass_seed, device=device)}
        for z in (4, 16, 24):
            mass[str(z)] = match2_partner_mass(model, n=400, seed=mass_seed, plan="simhash_limit", n_bits=z,
                                               device=device)
        w = match2_anna_weights(model, x_m, 4096, 4, anna_seed)[:, 0]
        mass["anna_4096_z4"] = partner_share(w, x_m, y_m, 37)
        masses[surrogate] = mass
    return {"rows": rows, "masses": masses}


def summarise_reproduction(doc: dict) -> dict:
    """Mean and standard deviation over seeds of a reproduction run (the JSON that
    ``scripts/anna_reproduction.py`` writes, or the same structure built in a lab), per surrogate:
    ``surrogate_error``, ``anna_error`` (``[len(ls), len(zs)]``), ``limit_error`` (``[len(zs)]``, when
    recorded), ``best_z_error`` (per ``l``, the
    best ``z`` of each seed's grid, then mean and std), and the seeds counted."""
    out = {}
    for surrogate in SURROGATES:
        rows = [r for r in doc["rows"] if r["surrogate"] == surrogate]
        if not rows:
            continue
        grid = torch.tensor([r["anna_error"] for r in rows], dtype=torch.float64)      # [seeds, ls, zs]
        soft = torch.tensor([r["surrogate_error"] for r in rows], dtype=torch.float64)
        best = grid.min(-1).values                                                    # [seeds, ls]
        sd = (lambda t: t.std(0) if len(rows) > 1 else torch.zeros_like(t[0]))        # noqa: E731
        out[surrogate] = dict(n_seeds=len(rows), surrogate_error=(soft.mean().item(), sd(soft).item()),
                              anna_error_mean=grid.mean(0), anna_error_std=sd(grid),
                              best_z_error_mean=best.mean(0), best_z_error_std=sd(best))
        if "limit_error" in rows[0]:
            lim = torch.tensor([r["limit_error"] for r in rows], dtype=torch.float64)     # [seeds, zs]
            out[surrogate].update(limit_error_mean=lim.mean(0), limit_error_std=sd(lim))
        if "partner_cos_mean" in rows[0]:
            pc = torch.tensor([r["partner_cos_mean"] for r in rows], dtype=torch.float64)
            oc = torch.tensor([r["max_other_cos_mean"] for r in rows], dtype=torch.float64)
            out[surrogate].update(partner_cos=(pc.mean().item(), sd(pc).item()),
                                  max_other_cos=(oc.mean().item(), sd(oc).item()))
    return out


def best_cell_error(doc: dict, surrogate: str, *, max_l=None, max_z: int | None = None) -> tuple[float, float]:
    """Mean and standard deviation over seeds of each seed's best distilled error among the grid cells
    with ``l <= max_l`` (a per-layer tuple for several layers; every layer must be within) and
    ``z <= max_z`` -- e.g. the paper's grid inside a larger one. ``doc`` as in ``summarise_reproduction``."""
    ls, zs = doc["config"]["ls"], doc["config"]["zs"]
    bound = (lambda l: True) if max_l is None else (                              # noqa: E731
        lambda l: all(a <= b for a, b in zip(l if isinstance(l, (list, tuple)) else (l,),
                                              max_l if isinstance(max_l, (list, tuple)) else (max_l,))))
    ia = [a for a, l in enumerate(ls) if bound(l)]
    ib = [b for b, z in enumerate(zs) if max_z is None or z <= max_z]
    if not ia or not ib:
        raise ValueError(f"no grid cell has l <= {max_l} and z <= {max_z}; the grid is ls={ls}, zs={zs}")
    rows = [r for r in doc["rows"] if r["surrogate"] == surrogate]
    if not rows:
        raise ValueError(f"the run has no rows for surrogate {surrogate!r}")
    best = torch.tensor([min(r["anna_error"][a][b] for a in ia for b in ib) for r in rows], dtype=torch.float64)
    return best.mean().item(), (best.std().item() if len(rows) > 1 else 0.0)


@torch.no_grad()
def match2_partner_mass(model: TinyModel, *, n: int, seed: int, plan: str = "own", n_bits: int = 4,
                        device: str | torch.device = "cpu") -> float:
    """The share of a one-layer Match2 model's attention that lands on partner keys (``x_j = -x_i mod
    M``), averaged over the tokens that have a partner. ``plan="own"``: the plan the model was trained
    with (its surrogate); ``plan="simhash_limit"``: the plan ANNA with ``n_bits`` bits tends to as
    ``l -> infinity`` on the same unit queries and keys -- what the distilled model is served.
    Attention blind to content would put about (number of partners) / N there."""
    _check_match2_model(model, "match2_partner_mass")
    if plan not in ("own", "simhash_limit"):
        raise ValueError(f"plan must be 'own' or 'simhash_limit'; got {plan!r}")
    M = model.emb.num_embeddings
    x, y = match2(n, 32, M, seed=seed)
    x = x.to(device)
    layer = model.attn[0]
    q, k = layer.unit_qk(model.embed(x))
    s = layer.logits(q, k) if plan == "own" else surrogate_logits(q, k, "simhash_limit", n_bits=n_bits)
    return partner_share(torch.softmax(s, -1)[:, 0], x, y, M)


def partner_share(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, M: int) -> float:
    """The share of the attention ``w [n, N, N]`` on Match2 sequences ``x [n, N]`` (labels ``y``) that
    lands on partner keys (``x_i + x_j = 0 mod M``), averaged over the tokens that have a partner."""
    x = x.to(w.device)
    is_partner = (x[:, :, None] + x[:, None, :]) % M == 0                      # [n, i, j]
    mass = (w * is_partner).sum(-1)                                            # [n, i]
    has = y.to(w.device).bool()
    return (mass[has].sum() / has.sum()).item()


# ---------------------------------------------------------------------------------------------
# ANNA's plan beside softmax's (what attnbook.widgets.anna draws; it computes nothing)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanStats:
    """What a plan's title reports: its entropy, how many entries carry mass (of ``size``), how many
    rows ship nothing, and the largest column sum."""
    entropy: float
    support: int
    size: int
    empty_rows: int
    max_column_sum: float


def plan_stats(P: torch.Tensor) -> PlanStats:
    """:class:`PlanStats` of a ``[Tq, Tk]`` plan."""
    rows = P.sum(-1)
    return PlanStats(eot.entropy(P).item(), int((P > 0).sum()), P.numel(), int((rows == 0).sum()),
                     P.sum(0).max().item())


@dataclass(frozen=True)
class AnnaPlan:
    """Softmax's plan ``softmax(q k^T / tau)`` and ANNA's plan with ``l = n_tables`` tables of
    ``z = n_bits`` hashes (hash seed ``seed``) on the same ``q [Tq, D]``, ``k [Tk, D]``: ``[Tq, Tk]``
    float64 each, with their :class:`PlanStats`. ANNA's rows sum to 1, or to 0 for a query that
    collided with no key."""
    n_tables: int
    n_bits: int
    seed: int
    tau: float
    softmax: torch.Tensor
    anna: torch.Tensor
    softmax_stats: PlanStats
    anna_stats: PlanStats


def anna_plan_at(q, k, *, tau: float = 0.1) -> Callable[[int, int, int], AnnaPlan]:
    """A function ``(n_tables, n_bits, seed) -> AnnaPlan`` on fixed ``q``, ``k``: softmax's plan is
    computed once, here, and shared by every step (a live explorer calls this at every slider move)."""
    soft = softmax_weights(q, k, tau=tau, causal=False)           # checks q and k: one head each
    soft_stats = plan_stats(soft)

    def at(n_tables: int, n_bits: int, seed: int) -> AnnaPlan:
        P = anna_weights(q, k, n_tables, n_bits, seed=seed)
        return AnnaPlan(n_tables, n_bits, seed, tau, soft, P, soft_stats, plan_stats(P))
    return at


def anna_plan(q, k, n_tables: int, n_bits: int, *, tau: float = 0.1, seed: int = 0) -> AnnaPlan:
    """Softmax's plan and ANNA's with ``l = n_tables`` tables of ``z = n_bits`` hashes, on one head."""
    return anna_plan_at(q, k, tau=tau)(n_tables, n_bits, seed)


def anna_plans(q, k, settings: Sequence[tuple[int, int]], *, tau: float = 0.1, seed: int = 0) -> list[AnnaPlan]:
    """:func:`anna_plan` for every ``(n_tables, n_bits)`` in ``settings`` (at least one), one hash seed."""
    settings = list(settings)
    if not settings:
        raise ValueError("settings must hold at least one (n_tables, n_bits) pair")
    at = anna_plan_at(q, k, tau=tau)
    return [at(n_tables, n_bits, seed) for n_tables, n_bits in settings]
