"""The indexer trained as DeepSeek trains it: the lightning indexer (:class:`Indexer`), its two training
stages (:func:`train_indexer`), and its recall ``p(S)`` against ``k``, ``H_I`` and ``d_I`` (:func:`recall`,
:func:`recall_grid`)."""

from __future__ import annotations

import math

import torch

from attnlib import _validate
from attnlib.topk import index_scores, indexer_kl_loss, selection_mask, topk_select

from .._training import train_loop
from ._common import F64, _check_generator
from .task import PlantedTask, planted_task


class Indexer(torch.nn.Module):
    """DeepSeek's lightning indexer read from token states ``x [B, T, d]``: index queries
    ``x W_q -> [B, H_I, T, d_I]``, one shared index key ``x W_k -> [B, 1, T, d_I]``, weights
    ``x W_w -> [B, H_I, T]`` times ``H_I^{-1/2} d_I^{-1/2}`` (the factor DeepSeek folds into the weights).
    Initialised from ``generator`` (fan-in scaled Gaussians)."""

    def __init__(self, d_state: int, n_heads: int, head_dim: int, *, generator: torch.Generator):
        super().__init__()
        g = _check_generator(generator)
        self.n_heads = _validate.check_int("n_heads", n_heads, lo=1)
        self.head_dim = _validate.check_int("head_dim", head_dim, lo=1)

        def init(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(shape[0]))

        self.W_q = init(d_state, n_heads * head_dim)        # index queries, H_I heads
        self.W_k = init(d_state, head_dim)                  # the one index key, shared by the heads
        self.W_w = init(d_state, n_heads)                   # each head's weight, per query

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        iq = (x @ self.W_q).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        ik = (x @ self.W_k)[:, None]
        iw = (x @ self.W_w).transpose(1, 2) / math.sqrt(self.n_heads * self.head_dim)
        return iq, ik, iw

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        return index_scores(*self(x))


def train_indexer(indexer: Indexer, task_fn, *, dense_steps: int, sparse_steps: int, top_k: int,
                  lr: float = 3e-3) -> list[float]:
    """DeepSeek-V3.2's two stages for the indexer alone (the teacher is fixed): ``dense_steps`` of
    ``KL(p_t || softmax(I_t))`` over every visible key, then ``sparse_steps`` with the KL restricted to
    the ``top_k`` keys the indexer itself selects. The indexer's input is detached (it learns from the
    attention, never the reverse). ``task_fn()`` returns a fresh :class:`PlantedTask` batch per step.
    Adam; returns the loss per step (mean KL per query)."""
    opt = torch.optim.Adam(indexer.parameters(), lr=lr)
    losses = []

    def step_loss(step: int) -> torch.Tensor:
        task = task_fn()
        I = indexer.scores(task.states.detach())
        selected = None if step < dense_steps else topk_select(I.detach(), top_k, causal=True)
        return indexer_kl_loss(task.plan, I, selected, causal=True).mean()

    train_loop(step_loss, opt, dense_steps + sparse_steps, after_step=lambda _, loss: losses.append(loss.item()))
    return losses


def recall(plan: torch.Tensor, scores: torch.Tensor, ks, *, first_row: int) -> list[float]:
    """Mean ``p(S)`` -- the teacher's mass on the ``k`` keys the scores select -- over rows
    ``t >= first_row`` of every sequence, for each ``k`` in ``ks``. ``plan, scores [B, 1, T, T]``."""
    T = plan.shape[-1]
    out = []
    for k in ks:
        mask = selection_mask(topk_select(scores, int(k), causal=True), T)
        out.append(float((plan * mask).sum(-1)[..., first_row:].mean()))
    return out


def recall_grid(configs, ks, seeds, *, T: int = 128, batch: int = 16, task: dict | None = None,
                dense_steps: int = 150, sparse_steps: int = 50, train_k: int | None = None,
                lr: float = 3e-3, device: str | torch.device = "cpu") -> dict:
    """Recall ``p(S)`` against ``k`` for indexers of each ``(H_I, d_I)`` in ``configs``, each trained
    from each seed (its own generator: initial weights, training batches, and a held-out batch), beside
    the same indexer untrained (random) and the oracle (the teacher's own top-k: an upper bound).
    Rows ``t >= T / 2`` are scored (each sees at least ``T / 2`` keys; ``ks`` should stay below that).
    The data are drawn on the CPU (so a seed gives the same task everywhere) and trained on ``device``.

    Returns ``{"ks", "configs", "trained" [C, S, K], "untrained" [C, S, K], "oracle" [S, K],
    "final_loss" [C, S]}`` (float64 tensors)."""
    task = dict(task or {})
    ks = [int(k) for k in ks]
    train_k = train_k if train_k is not None else max(ks)
    trained = torch.zeros(len(configs), len(seeds), len(ks), dtype=F64)
    untrained, final = torch.zeros_like(trained), torch.zeros(len(configs), len(seeds), dtype=F64)
    oracle = torch.zeros(len(seeds), len(ks), dtype=F64)
    def draw(g):
        t = planted_task(batch, T, generator=g, **task)
        return PlantedTask(t.states.to(device), t.plan.to(device), t.planted.to(device))

    for si, seed in enumerate(seeds):
        test = draw(torch.Generator().manual_seed(seed + 7919))
        oracle[si] = torch.tensor(recall(test.plan, test.plan, ks, first_row=T // 2))
        for ci, (H_I, d_I) in enumerate(configs):
            g = torch.Generator().manual_seed(seed * 1009 + ci)
            ix = Indexer(test.states.shape[-1], H_I, d_I, generator=g).to(device)
            with torch.no_grad():
                untrained[ci, si] = torch.tensor(recall(test.plan, ix.scores(test.states), ks, first_row=T // 2))
            losses = train_indexer(ix, lambda: draw(g), dense_steps=dense_steps,
                                   sparse_steps=sparse_steps, top_k=train_k, lr=lr)
            final[ci, si] = sum(losses[-10:]) / 10
            with torch.no_grad():
                trained[ci, si] = torch.tensor(recall(test.plan, ix.scores(test.states), ks, first_row=T // 2))
    return dict(ks=ks, configs=[tuple(c) for c in configs], trained=trained, untrained=untrained, oracle=oracle,
                final_loss=final)
