"""Exactness and recall, per mechanism: chapter 2's adversary run against it (:func:`adversary_errors`),
where the delta rule's recall beats Hebbian's (:func:`delta_rule_verdict`), and the table that sets both
beside the trained MQAR recalls (:func:`exactness_table`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from attnlib.attention import softmax_attention

from .. import needle
from ..topk import signed_indexer_needle
from .registry import ADVERSARY, REGISTRY


class _ExactSoftmax:
    """Softmax attention itself, shaped as a chapter-2 algorithm (``attend``), so that the adversary's
    planted row can be measured on it too."""
    name = "softmax"

    def attend(self, q, k, v):
        return softmax_attention(q, k, v, causal=False, backend="torch")


def adversary_errors(T: int = 256, d: int = 16, M: float = 80.0, *, top_k: int = 16,
                     seed: int = 0) -> dict[str, float | None]:
    """Chapter 2's planted-needle error ``||p_i - r_i||_1`` (0 = exact, 2 = the needle missed entirely) for
    each mechanism the adversary applies to (:data:`ADVERSARY`); None where none applies. Softmax is
    measured on the sliding-window attack's input; the top-k layer is
    :func:`attnbook.experiments.topk.signed_indexer_needle` at DeepSeek-V3.2's index shapes (signed weights,
    the needle's index key placed lowest in its row), keeping ``top_k`` keys per query."""
    out: dict[str, float | None] = {}
    for mech, (algo_name, _ran, _why) in ADVERSARY.items():
        if algo_name is None:
            out[mech] = None
        elif algo_name == "exact":
            case = needle.attack(needle.make("sliding_window", T=T, d=d, seed=seed), M=M)
            out[mech] = needle.row_error(_ExactSoftmax(), case)
        elif algo_name == "lightning_indexer":
            out[mech] = signed_indexer_needle(T, M, top_k, d=d, generator=torch.Generator().manual_seed(seed))["error"]
        else:
            algo = needle.make(algo_name, T=T, d=d, seed=seed)
            out[mech] = needle.row_error(algo, needle.attack(algo, M=M))
    return out


def delta_rule_verdict(pair_counts: Sequence[int], recall: Mapping[str, Mapping[str, torch.Tensor]], *,
                       margin: float = 0.05) -> dict[str, list[int]]:
    """From :func:`attnbook.experiments.recall.recall_vs_pairs`'s output: per regime, the numbers of pairs
    ``N`` at which the delta rule's mean recall beats Hebbian's by more than ``margin`` (``"<regime>"``)
    and those at which Hebbian's beats the delta rule's by more than ``margin`` (``"<regime>:hebbian"``)."""
    out: dict[str, list[int]] = {}
    for regime, by_rule in recall.items():
        lin, dlt = by_rule["linear"].mean(1), by_rule["delta"].mean(1)
        out[regime] = [int(n) for n, a, b in zip(pair_counts, lin, dlt) if b - a > margin]
        out[f"{regime}:hebbian"] = [int(n) for n, a, b in zip(pair_counts, lin, dlt) if a - b > margin]
    return out


def exactness_table(errors: Mapping[str, float | None], pair_counts: Sequence[int],
                    recall: Mapping[str, Mapping[str, torch.Tensor]], *, dim: int,
                    mqar: Mapping[str, Mapping[str, float]] | None = None) -> list[dict]:
    """One row per mechanism: chapter 2's adversary error (or why it does not apply), the state's
    no-training recall at the smallest and largest ``N`` (distinct keys, and with overwrites) where the
    capacity experiment has the mechanism, and trained MQAR recalls from ``mqar`` (trained elsewhere):
    ``mqar[column][mechanism]`` becomes the row's ``"mqar_<column>"`` (blank where a mechanism has none).
    ``recall`` is :func:`attnbook.experiments.recall.recall_vs_pairs`'s output."""
    mqar = mqar or {}
    rows = []
    for mech, record in REGISTRY.items():
        algo, ran, why = record.adversary
        row = {"mechanism": record.label, "measured_as": record.measured_as, "adversary": ran if algo else "n/a",
               "error": errors.get(mech), "why": why}
        r = record.recall_rule
        for regime in recall:
            for idx in (0, -1):
                key = f"recall_{regime}_N{pair_counts[idx]}"
                row[key] = None if r is None else float(recall[regime][r][idx].mean())
        row["capacity_note"] = record.capacity_note.format(dim=dim)
        for column, by_mech in mqar.items():
            row[f"mqar_{column}"] = by_mech.get(mech)
        rows.append(row)
    return rows
