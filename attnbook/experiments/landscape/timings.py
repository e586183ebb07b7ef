"""Measured times, a fact of one machine, never asserted: the committed GPU benchmark rows
(:data:`GPU_RESULT_FILES`, :func:`gpu_rows`) and one decode step per mechanism timed on this CPU
(:func:`cpu_decode_times`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .._measure import interleaved_cpu_ms
from .costs import HeadConfig
from .registry import REGISTRY

GPU_RESULT_FILES = ("benchmarks/results/nvidia-h200-2026-11-23-softmax_attention.json",
                    "benchmarks/results/nvidia-h200-2026-11-23-block_sparse_attention.json")


def gpu_rows(results: Mapping[str, Mapping | None], *, ops=None) -> list[dict]:
    """The committed GPU benchmark rows, each with the device, date and versions its file records.

    ``results`` maps a file name to its parsed JSON (``{"device", "date", "versions", "rows"}``) or None
    (not found: skipped). Rows measured more than once (a file may hold repeated runs) are merged:
    ``ms`` is the median of the recorded times, ``runs`` how many there were. Nothing is invented: a
    field the file lacks stays absent."""
    merged: dict[tuple, dict] = {}
    for name, doc in results.items():
        if not doc:
            continue
        for row in doc.get("rows", []):
            if ops is not None and row.get("op") not in ops:
                continue
            key = (doc.get("device"), tuple(sorted((k, v) for k, v in row.items() if k not in ("ms", "tflops"))))
            entry = merged.setdefault(key, {**{k: v for k, v in row.items() if k not in ("ms", "tflops")},
                                            "device": doc.get("device"), "date": doc.get("date"),
                                            "versions": doc.get("versions"), "file": name, "_ms": []})
            entry["_ms"].append(float(row["ms"]))
    out = []
    for entry in merged.values():
        ms = entry.pop("_ms")
        out.append({**entry, "ms": float(np.median(ms)), "runs": len(ms)})
    return out


def cpu_decode_times(contexts: Sequence[int], cfg: HeadConfig, *, reps: int = 7, generator: torch.Generator,
                     mechanisms: Sequence[str] = ("softmax", "linear", "gated_delta")) -> dict[str, dict[str, list]]:
    """CPU time (``time.process_time``, one thread, ms) of one decode step per mechanism at each context
    length, on attnlib's PyTorch paths: softmax reads a cache of ``t`` keys
    (:func:`attnlib.softmax_attention`), linear and Gated DeltaNet update their state
    (:func:`attnlib.linear_attention_decode_step`, :func:`attnlib.delta_rule_decode_step`). Repeats are
    interleaved (every call once per round) so that a burst of load spreads over all points.

    Returns ``{mechanism: {"t": [...], "median": [...], "q1": [...], "q3": [...]}}``. A fact of this
    machine at this moment: shown, never asserted."""
    timed = tuple(m for m, r in REGISTRY.items() if r.decode_step is not None)
    unknown = [m for m in mechanisms if m not in timed]
    if unknown:
        raise ValueError(f"mechanisms must be among {timed} (those with a timed decode step); got {unknown}")
    H, d = cfg.heads, cfg.d_head
    calls = {}
    for t in contexts:
        # every input is drawn whichever mechanisms are timed, so a subset times the same tensors
        x = dict(zip(("q1", "k1", "v1"), (torch.randn(1, H, 1, d, generator=generator) for _ in range(3))))
        x["k"], x["v"] = torch.randn(1, H, t, d, generator=generator), torch.randn(1, H, t, d, generator=generator)
        x["S"] = torch.randn(1, H, d, d, generator=generator)
        x["beta"], x["g"] = torch.rand(1, H, 1, generator=generator), -torch.rand(1, H, 1, generator=generator)
        for m in timed:
            if m in mechanisms:
                calls[m, t] = REGISTRY[m].decode_step(x)
    samples = interleaved_cpu_ms(calls, reps)
    out: dict[str, dict[str, list]] = {}
    for m in mechanisms:
        qs = np.array([np.percentile(samples[m, t], [25, 50, 75]) for t in contexts])
        out[m] = {"t": list(contexts), "q1": qs[:, 0].tolist(), "median": qs[:, 1].tolist(), "q3": qs[:, 2].tolist()}
    return out
