"""Synthetic tasks and tiny sequence models for the trained experiments (chapter 4 onwards).

Multi-query associative recall (MQAR), after Zoology (Arora et al., 2023): a sequence first lists
``n_pairs`` key--value pairs, then asks for the values of some of the keys again. Here the layout is

    k_1 v_1 k_2 v_2 ... k_N v_N  q_1 q_2 ... q_M          (q_i one of the keys, in random order)

and the target at each query position is the value that followed that key; every other position
is ignored (target ``-100``). Keys and values come from disjoint parts of the vocabulary
(``[0, n_keys)`` and ``[n_keys, n_keys + n_values)``), keys are distinct within a sequence.
(Zoology scatters the queries among noise tokens and predicts the token after each query; the
compact layout keeps sequences short enough for a CPU.)

The models are deliberately small: an embedding, ``n_layers`` blocks of (short causal convolution,
token mixer, MLP) with pre-norm residuals, and a readout. The token mixer is the only thing that
changes between ``"softmax"``, ``"linear"``, ``"deltanet"`` and ``"gated_deltanet"``; the short
convolution (as in fla's and Zoology's models) lets a block see the previous token, which is how a
value's position learns the key it belongs to. ``mixer`` may also be a sequence of names, one per
layer: a hybrid (chapter 7; :func:`attnbook.experiments.hybrid.hybrid_pattern` writes the published
layouts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnlib import _validate

from ._training import train_loop, warmup_cosine

MIXERS = ("softmax", "linear", "deltanet", "gated_deltanet")
IGNORE = -100


def mqar_batch(batch: int, n_pairs: int, *, n_keys: int = 64, n_values: int = 64,
               n_queries: int | None = None, generator: torch.Generator | None = None,
               device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Draw an MQAR batch.

    Returns ``(tokens [batch, 2 n_pairs + n_queries] long, targets [same] long)`` with targets
    ``-100`` except at query positions. ``n_queries`` defaults to ``n_pairs`` (every key asked once).
    Vocabulary size: ``n_keys + n_values``.
    """
    for name, val in (("batch", batch), ("n_pairs", n_pairs), ("n_keys", n_keys), ("n_values", n_values)):
        _validate.check_int(name, val, lo=1)
    if n_pairs > n_keys:
        raise ValueError(f"n_pairs={n_pairs} distinct keys need n_keys >= n_pairs; got n_keys={n_keys}")
    n_queries = n_pairs if n_queries is None else n_queries
    _validate.check_int("n_queries", n_queries, lo=1, hi=n_pairs, why=" (at most n_pairs)")
    keys = torch.rand(batch, n_keys, generator=generator).argsort(-1)[:, :n_pairs]        # distinct
    values = n_keys + torch.randint(0, n_values, (batch, n_pairs), generator=generator)
    which = torch.rand(batch, n_pairs, generator=generator).argsort(-1)[:, :n_queries]
    queries = keys.gather(1, which)
    answers = values.gather(1, which)
    pairs = torch.stack([keys, values], dim=-1).reshape(batch, 2 * n_pairs)
    tokens = torch.cat([pairs, queries], dim=1)
    targets = torch.full_like(tokens, IGNORE)
    targets[:, 2 * n_pairs:] = answers
    return tokens.to(device), targets.to(device)


class ShortConv(nn.Module):
    """Depthwise causal convolution over time, ``[batch, T, d] -> [batch, T, d]``."""

    def __init__(self, d: int, width: int = 3):
        super().__init__()
        self.width = width
        self.conv = nn.Conv1d(d, d, width, groups=d, bias=False)

    def forward(self, x):
        y = F.pad(x.transpose(1, 2), (self.width - 1, 0))
        return self.conv(y).transpose(1, 2)


class Mixer(nn.Module):
    """Multi-head token mixer: projections, then one of :data:`MIXERS`, then an output projection.

    ``deltanet``/``gated_deltanet``: keys and queries are L2-normalised per head (the stable regime
    of chapter 4), ``beta_t = sigmoid(w_beta . x_t)`` per head, and for the gated rule
    ``g_t = logsigmoid(w_g . x_t + b)`` -- data-dependent learning rate and forgetting.
    ``linear``: the same normalised keys and queries with the plain sum ``S_t = S_{t-1} + v_t k_t^T``.
    """

    def __init__(self, d_model: int, n_heads: int, kind: str, chunk_size: int = 16):
        super().__init__()
        if kind not in MIXERS:
            raise ValueError(f"mixer must be one of {MIXERS}; got {kind!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.kind, self.h, self.dh, self.chunk_size = kind, n_heads, d_model // n_heads, chunk_size
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        if kind in ("deltanet", "gated_deltanet"):
            self.beta = nn.Linear(d_model, n_heads)
        if kind == "gated_deltanet":
            self.gate = nn.Linear(d_model, n_heads)
            nn.init.constant_(self.gate.bias, 3.0)       # alpha = sigmoid(3) ~ 0.95 at the start

    def forward(self, x):
        Bn, T, _ = x.shape
        q, k, v = (t.reshape(Bn, T, self.h, self.dh).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        if self.kind == "softmax":
            from attnlib.attention import softmax_attention
            o = softmax_attention(q, k, v, causal=True)
        else:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            scale = 1.0
            if self.kind == "linear":
                from attnlib.linear import linear_attention
                o = linear_attention(q, k, v, scale=scale, causal=True, mode="chunk",
                                     chunk_size=self.chunk_size)
            else:
                from attnlib.deltanet import delta_rule
                beta = torch.sigmoid(self.beta(x)).transpose(1, 2)             # [B, H, T]
                g = F.logsigmoid(self.gate(x)).transpose(1, 2) if self.kind == "gated_deltanet" else None
                o = delta_rule(q, k, v, beta, g=g, scale=scale, mode="chunk", chunk_size=self.chunk_size)
        return self.out(o.transpose(1, 2).reshape(Bn, T, -1))


class Block(nn.Module):
    def __init__(self, d_model: int, n_heads: int, kind: str, chunk_size: int = 16):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.conv = ShortConv(d_model)
        self.mixer = Mixer(d_model, n_heads, kind, chunk_size)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def forward(self, x):
        x = x + self.mixer(self.conv(self.norm1(x)))
        return x + self.mlp(self.norm2(x))


def layer_mixers(mixer: str | Sequence[str], n_layers: int | None = None) -> tuple[str, ...]:
    """The mixer of every layer: one name repeated ``n_layers`` times (2 when not given), or a
    sequence of names, one per layer (then ``n_layers``, if given, must equal its length)."""
    if isinstance(mixer, str):
        n = 2 if n_layers is None else _validate.check_int("n_layers", n_layers, lo=1)
        return (mixer,) * n
    pattern = tuple(mixer)
    if not pattern or not all(isinstance(m, str) for m in pattern):
        raise ValueError(f"mixer must be a name or a non-empty sequence of names; got {mixer!r}")
    if n_layers is not None and n_layers != len(pattern):
        raise ValueError(f"n_layers={n_layers} but the mixer pattern has {len(pattern)} layers")
    return pattern


class RecallModel(nn.Module):
    """Embedding -> ``n_layers`` x Block(mixer) -> LayerNorm -> readout. ``tokens [B, T] -> logits [B, T, V]``.

    ``mixer``: one of :data:`MIXERS` for every layer, or a sequence of them, one per layer (a hybrid;
    ``n_layers`` then defaults to its length)."""

    def __init__(self, vocab: int, d_model: int = 64, n_layers: int | None = None, n_heads: int = 2,
                 mixer: str | Sequence[str] = "deltanet", chunk_size: int = 16):
        super().__init__()
        self.mixers = layer_mixers(mixer, n_layers)
        self.emb = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, kind, chunk_size) for kind in self.mixers)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


@dataclass
class RecallResult:
    mixer: str | tuple[str, ...]   # a name, or one per layer (a hybrid)
    n_pairs: int
    accuracy: float           # fraction of query positions answered correctly, fresh test batch
    final_loss: float
    steps: int
    params: int
    model: nn.Module | None = field(default=None, repr=False, compare=False)   # trained, in eval mode
    # (optimiser steps taken, recall on a fixed held-out batch) along the way; empty unless asked for
    curve: list[tuple[int, float]] = field(default_factory=list)


def recall_accuracy(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> float:
    """Fraction of the non-ignored positions whose argmax prediction equals the target."""
    with torch.no_grad():
        pred = model(tokens).argmax(-1)
    keep = targets != IGNORE
    return (pred[keep] == targets[keep]).float().mean().item()


def curve_steps(steps: int, eval_every: int) -> list[int]:
    """The optimiser steps after which :func:`train_recall` evaluates a learning curve: 0 (before
    training), every ``eval_every`` steps, and ``steps`` (the end), each once."""
    return sorted({*range(0, steps, eval_every), steps})


def train_recall(mixer: str | Sequence[str], n_pairs: int, *, steps: int = 200, batch: int = 32,
                 d_model: int = 64, n_layers: int | None = None, n_heads: int = 2, lr: float = 3e-3, n_keys: int = 64,
                 n_values: int = 64, seed: int = 0, device: torch.device | str = "cpu",
                 test_batch: int = 256, chunk_size: int = 16, eval_every: int | None = None,
                 eval_batch: int = 128) -> RecallResult:
    """Train a :class:`RecallModel` on fresh MQAR batches (AdamW, cosine schedule, no data reuse)
    and report its recall on a held-out batch. ``mixer`` and ``n_layers`` as for :class:`RecallModel`;
    the result keeps the trained model (``.model``) for probes.

    ``eval_every``: also record a learning curve (``.curve``): recall on one fixed batch of
    ``eval_batch`` sequences, held out from training and drawn apart from the test batch, at the steps
    :func:`curve_steps` lists. The evaluation draws from its own generator and no randomness of
    torch's global generator, so the training is the same, bit for bit, with or without it."""
    steps = _validate.check_int("steps", steps, lo=1)
    if eval_every is not None:
        eval_every = _validate.check_int("eval_every", eval_every, lo=1, why=" (or None: no curve)")
        eval_batch = _validate.check_int("eval_batch", eval_batch, lo=1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    model = RecallModel(n_keys + n_values, d_model, n_layers, n_heads, mixer, chunk_size).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = warmup_cosine(opt, steps, warmup=20)
    curve: list[tuple[int, float]] = []
    at = set(curve_steps(steps, eval_every)) if eval_every is not None else set()
    if at:
        # drawn before training from a generator of its own: the training stream is untouched
        xe, ye = mqar_batch(eval_batch, n_pairs, n_keys=n_keys, n_values=n_values,
                            generator=torch.Generator().manual_seed(20_000 + seed), device=device)

    def record(step: int) -> None:
        if step in at:
            model.eval()
            curve.append((step, recall_accuracy(model, xe, ye)))
            model.train()

    def step_loss(_: int) -> torch.Tensor:
        x, y = mqar_batch(batch, n_pairs, n_keys=n_keys, n_values=n_values, generator=gen, device=device)
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE)

    record(0)
    loss = train_loop(step_loss, opt, steps, sched=sched, clip=1.0, after_step=lambda step, _: record(step + 1))
    test_gen = torch.Generator().manual_seed(10_000 + seed)
    xt, yt = mqar_batch(test_batch, n_pairs, n_keys=n_keys, n_values=n_values, generator=test_gen,
                        device=device)
    model.eval()
    acc = recall_accuracy(model, xt, yt)
    mixers = model.mixers if len(set(model.mixers)) > 1 else model.mixers[0]
    return RecallResult(mixers, n_pairs, acc, float(loss.detach()), steps, sum(p.numel() for p in model.parameters()),
                        model, curve)


def accuracy_grid(mixers: Sequence[str], pairs: Sequence[int], seeds: Sequence[int], *, device: str = "cpu",
                  **train) -> dict:
    """Held-out recall of one single-layer model per mixer, number of pairs and seed
    (:func:`train_recall` with ``n_layers=1`` and ``train``'s keyword arguments):
    ``{mixer: {str(n_pairs): [accuracy per seed]}}``, plain numbers (which ``lab.run`` may read from a
    committed run in quick mode)."""
    return {m: {str(n): [train_recall(m, n, n_layers=1, seed=s, device=device, **train).accuracy for s in seeds]
                for n in pairs} for m in mixers}
