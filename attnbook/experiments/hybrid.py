"""Hybrids of full (softmax) and linear-time layers (chapter 7): layouts, their quadratic share, probes.

Production hybrids keep a few softmax layers among linear / delta-rule layers: Qwen3-Next closes
every group of three Gated DeltaNet layers with one attention layer (``full_attention_interval=4``),
Kimi Linear does the same with its KDA layers, MiniMax-01 puts one softmax layer after every seven
linear ones. :func:`hybrid_pattern` writes that layout for the MQAR models of
:mod:`attnbook.experiments.mqar` (whose ``mixer`` takes one name per layer).

Cost: with one full layer in ``r + 1`` the model's attention work is
``F(T) = (n / (r + 1)) a T^2 + b T`` (``n`` layers; ``a T^2`` a softmax layer's scores, ``b T``
everything linear in ``T``), so the share of the all-softmax model's quadratic term that the hybrid
keeps is ``f = 1 / (r + 1)``. :func:`quadratic_coefficient` reads ``a`` off FLOPs counted at two
lengths, so that the lab asserts ``f`` on counted work rather than on the formula.

Probes of a trained model: :func:`recall_by_pair` (recall of each written pair, by its place in the
list: the first pair is the one written longest before the queries), :func:`answers_a_commonest_value`
(does the model answer with the value listed most often -- counting, not recalling) and
:func:`recall_without` (recall with some layers' mixers switched off: which layers do the recalling).

:func:`short_run` is the lab's short run: every ratio from a few seeds, trained and probed, as plain
numbers (which ``lab.run`` may read from its committed run in quick mode).

The grid (``scripts/hybrid_grid.py``: every ratio at several learning rates and seeds, with learning
curves, on a task that fits a layer's state and one that exceeds it) is read by :func:`steps_to_recall`,
:func:`grid_summary` and :func:`grid_curves`, which take its parsed JSON and train nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn as nn

from attnlib import _validate

from ._measure import count_flops
from .mqar import MIXERS, mqar_batch, recall_accuracy, train_recall

LINEAR_MIXERS = tuple(m for m in MIXERS if m != "softmax")
ALL_LINEAR = math.inf          # the ratio of a model without full layers (f = 1 / (inf + 1) = 0)


def hybrid_pattern(n_layers: int, ratio: float, linear_mixer: str = "gated_deltanet") -> tuple[str, ...]:
    """The mixer of each of ``n_layers`` layers with ``ratio`` linear layers per full layer, each full
    (softmax) layer closing its group of ``ratio`` linear ones, as in Qwen3-Next and Kimi Linear:
    ``hybrid_pattern(8, 3)`` is ``(lin, lin, lin, softmax) * 2``.

    ``ratio``: an int ``r >= 0`` dividing the depth into groups of ``r + 1`` (``n_layers`` must be a
    multiple of ``r + 1``); ``0`` is all-softmax, :data:`ALL_LINEAR` (``math.inf``) has no full layer.
    ``linear_mixer``: one of :data:`LINEAR_MIXERS`."""
    n_layers = _validate.check_int("n_layers", n_layers, lo=1)
    if linear_mixer not in LINEAR_MIXERS:
        raise ValueError(f"linear_mixer must be one of {LINEAR_MIXERS}; got {linear_mixer!r}")
    if ratio == ALL_LINEAR:
        return (linear_mixer,) * n_layers
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 0:
        raise ValueError(f"ratio must be an int >= 0 (linear layers per full layer) or math.inf "
                         f"(no full layer); got {ratio!r}")
    if n_layers % (ratio + 1):
        raise ValueError(f"ratio={ratio} puts one full layer in every {ratio + 1}: n_layers must be a "
                         f"multiple of {ratio + 1}; got n_layers={n_layers}")
    group = (linear_mixer,) * ratio + ("softmax",)
    return group * (n_layers // (ratio + 1))


def full_fraction(pattern: Sequence[str]) -> float:
    """The fraction of a pattern's layers that are full (softmax): ``1 / (r + 1)`` for ratio ``r``."""
    return sum(m == "softmax" for m in pattern) / len(pattern)


def ratio_label(ratio: float) -> str:
    """How the chapter writes a ratio: linear:full layers, as the published designs do ("all-linear",
    "7:1", "3:1", "1:1", "all-softmax")."""
    if ratio == ALL_LINEAR:
        return "all-linear"
    return "all-softmax" if ratio == 0 else f"{ratio}:1"


# ---------------------------------------------------------------------------------------------
# Cost: the quadratic share, on counted work
# ---------------------------------------------------------------------------------------------

def mixer_flops(model: nn.Module, T: int) -> int:
    """Counted FLOPs (matrix products, :func:`attnbook.experiments._measure.count_flops`) of every token
    mixer of an MQAR model (``model.blocks[i].mixer``) on one sequence of ``T`` tokens. The count
    depends on shapes only, so the input is zeros."""
    T = _validate.check_int("T", T, lo=1)
    d = model.emb.embedding_dim
    x = torch.zeros(1, T, d, device=model.emb.weight.device)
    with torch.no_grad():
        return count_flops(lambda: [blk.mixer(x) for blk in model.blocks])


def quadratic_coefficient(lengths: tuple[int, int], flops: tuple[int, int]) -> float:
    """``a`` of ``F(T) = a T^2 + b T`` through two counted points (no constant term: every FLOP of a
    mixer is per token or per pair of tokens). ``F(T)/T = a T + b``, so ``a`` is that line's slope."""
    (t1, t2), (f1, f2) = lengths, flops
    if t1 == t2:
        raise ValueError(f"lengths must differ; got {lengths}")
    return (f2 / t2 - f1 / t1) / (t2 - t1)


# ---------------------------------------------------------------------------------------------
# Probes of a trained model
# ---------------------------------------------------------------------------------------------

def recall_by_pair(model: nn.Module, n_pairs: int, *, batch: int = 256, n_keys: int, n_values: int,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Recall of each written pair, by its place ``i = 0 .. n_pairs - 1`` in the list (pair 0 is
    written first, the longest before the queries): ``[n_pairs]`` fractions of the queries for that
    pair answered correctly, over a fresh batch in which every key is asked once. ``n_pairs`` may
    exceed the number the model was trained on (length generalisation)."""
    x, y = mqar_batch(batch, n_pairs, n_keys=n_keys, n_values=n_values, generator=generator,
                      device=model.emb.weight.device)
    with torch.no_grad():
        right = model(x).argmax(-1) == y
    keys, queries = x[:, 0:2 * n_pairs:2], x[:, 2 * n_pairs:]
    which = (queries[:, :, None] == keys[:, None, :]).float().argmax(-1)     # [batch, queries]: pair asked
    right = right[:, 2 * n_pairs:].float()
    counts = torch.zeros(n_pairs).index_add_(0, which.reshape(-1).cpu(), torch.ones(which.numel()))
    hits = torch.zeros(n_pairs).index_add_(0, which.reshape(-1).cpu(), right.reshape(-1).cpu())
    return hits / counts


def answers_a_commonest_value(tokens: torch.Tensor, answers: torch.Tensor, n_pairs: int) -> torch.Tensor:
    """For each query position of an MQAR batch, whether ``answers`` there (tokens, ``[B, T]``: a
    model's predictions, or the targets) is one of the values listed most often among the
    ``n_pairs`` pairs (``[B, T - 2 n_pairs]`` bools). A model that counts the values it has seen,
    without binding them to their keys, answers with a commonest value every time; the right answer
    is one only as often as this says for the targets."""
    values = tokens[:, 1:2 * n_pairs:2]
    listed = (answers[:, 2 * n_pairs:, None] == values[:, None, :]).sum(-1)          # [B, queries]
    counts = (values[:, :, None] == values[:, None, :]).sum(-1)                       # [B, n_pairs]
    return listed == counts.max(-1, keepdim=True).values


def recall_without(model: nn.Module, layers: Sequence[int], tokens: torch.Tensor, targets: torch.Tensor) -> float:
    """Recall (as :func:`attnbook.experiments.mqar.recall_accuracy`) with the token mixers of
    ``layers`` switched off (the mixer's output, and with it the short convolution's, replaced by
    zeros: the block keeps its residual path and its MLP). Which layers the recall depends on."""
    handles = [model.blocks[i].mixer.register_forward_hook(lambda mod, inp, out: torch.zeros_like(out))
               for i in layers]
    try:
        return recall_accuracy(model, tokens, targets)
    finally:
        for h in handles:
            h.remove()


def short_run(*, n_pairs: int, n_keys: int, n_values: int, n_layers: int, ratios: Sequence[float],
              mixers: Sequence[str], seeds: Sequence[int], model: dict, probe_seed: int,
              place_seeds: Sequence[int], device: str = "cpu") -> dict:
    """Train one MQAR hybrid per linear mixer, ratio (:func:`hybrid_pattern`) and seed
    (:func:`attnbook.experiments.mqar.train_recall` with ``model``'s keyword arguments), then probe the
    hybrids of ``mixers[0]``. Plain numbers, keyed by mixer and :func:`ratio_label`:

    * ``accuracy[mixer][label]``: held-out recall per seed (all-softmax is trained once and shared);
    * ``by_place[label]``: :func:`recall_by_pair` per seed (``place_seeds[i]`` draws seed ``i``'s batch);
    * ``commonest[label]``: per seed, the share of answers that are a commonest listed value
      (:func:`answers_a_commonest_value`) on one probe batch of 512 sequences (``probe_seed``), and
      ``truth_commonest``: the same share for the right answers;
    * ``layers_off``: the 1:1 hybrids' recall on that batch per seed, as trained (``none``), with
      the softmax layers off (``full``) and with the linear layers off (``linear``)."""
    vocab = dict(n_keys=n_keys, n_values=n_values)
    runs: dict[tuple[str, float], list] = {}
    for mixer in mixers:
        for r in ratios:
            if r == 0 and (mixers[0], 0) in runs:
                runs[mixer, r] = runs[mixers[0], 0]          # no linear layer: the same models
                continue
            pattern = hybrid_pattern(n_layers, r, mixer)
            runs[mixer, r] = [train_recall(pattern, n_pairs, **vocab, seed=s, device=device, **model) for s in seeds]
    out = {"accuracy": {m: {ratio_label(r): [res.accuracy for res in runs[m, r]] for r in ratios} for m in mixers}}
    probed = mixers[0]
    xq, yq = mqar_batch(512, n_pairs, **vocab, generator=torch.Generator().manual_seed(probe_seed), device=device)
    out["by_place"], out["commonest"] = {}, {}
    for r in ratios:
        models = [res.model for res in runs[probed, r]]
        out["by_place"][ratio_label(r)] = [
            recall_by_pair(m, n_pairs, **vocab, generator=torch.Generator().manual_seed(place_seeds[i])).tolist()
            for i, m in enumerate(models)]
        shares = []
        for m in models:
            with torch.no_grad():
                answers = m(xq).argmax(-1)
            shares.append(answers_a_commonest_value(xq, answers, n_pairs).float().mean().item())
        out["commonest"][ratio_label(r)] = shares
    out["truth_commonest"] = answers_a_commonest_value(xq, yq, n_pairs).float().mean().item()
    half = hybrid_pattern(n_layers, 1, probed)
    full_layers = [i for i, m in enumerate(half) if m == "softmax"]
    linear_layers = [i for i, m in enumerate(half) if m != "softmax"]
    models = [res.model for res in runs[probed, 1]]
    out["layers_off"] = {"none": [recall_without(m, [], xq, yq) for m in models],
                         "full": [recall_without(m, full_layers, xq, yq) for m in models],
                         "linear": [recall_without(m, linear_layers, xq, yq) for m in models]}
    return out


# ---------------------------------------------------------------------------------------------
# The grid of trained hybrids (scripts/hybrid_grid.py): reading its runs, no training
# ---------------------------------------------------------------------------------------------

def steps_to_recall(curve: Sequence[Sequence[float]], threshold: float = 0.9) -> int | None:
    """The first evaluated step of a learning curve (``[(step, recall), ...]`` in step order, as
    :func:`attnbook.experiments.mqar.train_recall` records it) at which recall is at least ``threshold``;
    ``None`` if it never is. Only the evaluated steps are seen: the true first step lies after the
    evaluation before it."""
    for step, recall in curve:
        if recall >= threshold:
            return int(step)
    return None


def _ratio_order(run: dict) -> tuple:
    return run["full_fraction"], str(run["ratio"])


def grid_summary(runs: Sequence[dict], threshold: float = 0.9) -> list[dict]:
    """One row per (task, ratio, lr) of a grid's runs (dicts with ``task``, ``ratio``, ``ratio_label``,
    ``full_fraction``, ``lr``, ``seed``, ``curve``, ``final_recall``): over its seeds, the final recall's
    mean and sample sd (``None`` with one seed), each seed's final recall and steps to ``threshold``
    (:func:`steps_to_recall`; ``None``: never), how many and what fraction reached it, and the median
    step at which those that did reached it (``None`` if none did). Rows come in the runs' task order,
    then by fraction of full layers, then by lr; seeds within a row in seed order."""
    cells: dict[tuple, list[dict]] = {}
    for run in runs:
        cells.setdefault((run["task"], str(run["ratio"]), float(run["lr"])), []).append(run)
    tasks = list(dict.fromkeys(run["task"] for run in runs))
    rows = []
    for key in sorted(cells, key=lambda k: (tasks.index(k[0]), _ratio_order(cells[k][0]), k[2])):
        cell = sorted(cells[key], key=lambda r: r["seed"])
        final = np.array([r["final_recall"] for r in cell], dtype=float)
        reach = [steps_to_recall(r["curve"], threshold) for r in cell]
        hits = [s for s in reach if s is not None]
        first = cell[0]
        rows.append({"task": first["task"], "ratio": first["ratio"], "ratio_label": first["ratio_label"],
                     "full_fraction": first["full_fraction"], "lr": float(first["lr"]),
                     "seeds": [r["seed"] for r in cell], "n_seeds": len(cell),
                     "final_recall": final.tolist(), "final_recall_mean": float(final.mean()),
                     "final_recall_sd": float(final.std(ddof=1)) if len(cell) > 1 else None,
                     "steps_to_threshold": reach, "reached": len(hits), "reached_fraction": len(hits) / len(cell),
                     "median_steps_to_threshold": float(np.median(hits)) if hits else None})
    return rows


def grid_curves(runs: Sequence[dict]) -> dict[str, dict[float, dict[str, list[list[tuple[int, float]]]]]]:
    """A grid's learning curves, grouped for drawing: ``curves[task][lr][ratio label]`` is the list of
    its seeds' curves (``[(step, recall), ...]``), tasks in the runs' order, learning rates ascending,
    ratios by fraction of full layers (all-linear first), seeds in seed order."""
    out: dict = {}
    ordered = sorted(runs, key=lambda r: (float(r["lr"]), _ratio_order(r), r["seed"]))
    for task in dict.fromkeys(run["task"] for run in runs):
        for run in (r for r in ordered if r["task"] == task):
            per_ratio = out.setdefault(task, {}).setdefault(float(run["lr"]), {})
            per_ratio.setdefault(run["ratio_label"], []).append([(int(s), float(v)) for s, v in run["curve"]])
    return out


__all__ = ["ALL_LINEAR", "LINEAR_MIXERS", "hybrid_pattern", "full_fraction", "ratio_label", "mixer_flops",
           "quadratic_coefficient", "recall_by_pair", "answers_a_commonest_value", "recall_without",
           "steps_to_recall", "grid_summary", "grid_curves"]
