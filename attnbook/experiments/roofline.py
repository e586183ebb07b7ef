"""The roofline of the attention ops: counted work and counted bytes against what a GPU can deliver.

A kernel that performs ``F`` floating-point operations and moves ``Q`` bytes between the GPU's memory
and its chips has the arithmetic intensity ``I = F / Q`` (FLOPs per byte). On a GPU with peak compute
``P`` (FLOP/s) and memory bandwidth ``W`` (byte/s) it cannot run faster than ``min(P, I W)`` -- the
roofline (Williams, Waterman and Patterson, 2009). Left of the ridge ``I = P / W`` the bound is the
memory (memory-bound); right of it, the arithmetic (compute-bound).

Bytes come from the static kernel report (``benchmarks/results/kernel_report.json``, made by
``scripts/kernel_report.py``): the tensors each launch of the op's forward pass touches, counted once
per launch -- a lower bound on its memory traffic, so the intensity here is an upper bound. FLOPs are
counted by PyTorch's FLOP counter (matrix products only) on the op's PyTorch reference, run on meta
tensors (shapes, no data) at the report's shape: for the chunked ops the reference is the same chunked
algorithm as the kernels; for causal softmax attention the reference forms every score and masks, while
the kernel skips the tiles above the diagonal, so its count is halved (the benchmarks' convention).

Peaks (dense 16-bit tensor-core FLOP/s and memory bandwidth) are NVIDIA's datasheet figures
(``PEAKS``). A measured point is drawn only where a GPU benchmark result is committed, on the roof of
the device it was measured on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlib import _validate

from ._measure import count_flops


@dataclass(frozen=True)
class Roof:
    """A device's two ceilings: ``tflops`` (dense fp16/bf16 tensor-core peak, TFLOP/s) and ``tb_per_s``
    (memory bandwidth, TB/s), and where they come from."""
    device: str
    tflops: float
    tb_per_s: float
    source: str

    @property
    def ridge(self) -> float:
        """The arithmetic intensity (FLOP/byte) at which the two ceilings meet."""
        return self.tflops / self.tb_per_s

    def attainable(self, intensity):
        """The roofline ``min(peak, intensity x bandwidth)`` in TFLOP/s (array-like in, tensor out)."""
        i = torch.as_tensor(intensity, dtype=torch.float64)
        return torch.minimum(torch.full_like(i, self.tflops), i * self.tb_per_s)


# NVIDIA's datasheets: H100 SXM5 -- 989 TFLOP/s dense bf16/fp16 (1,979 is with 2:4 sparsity), 3.35 TB/s
# HBM3; H200 SXM -- the same tensor cores, 4.8 TB/s HBM3e.
PEAKS = {
    "NVIDIA H100": Roof("NVIDIA H100", 989.0, 3.35,
                        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"),
    "NVIDIA H200": Roof("NVIDIA H200", 989.0, 4.8, "https://www.nvidia.com/en-us/data-center/h200/"),
}

OPS = ("softmax", "linear", "delta", "gated_delta")


def count_forward_flops(op: str, B: int, H: int, T: int, D: int, *, causal: bool = True) -> int:
    """Matrix-product FLOPs of ``op``'s forward pass at ``[B, H, T, D]`` (``Dv = D``), counted by
    ``torch.utils.flop_counter`` on the PyTorch reference run on meta tensors. ``op`` is one of ``OPS``;
    ``causal`` applies to softmax attention only (the chunked ops are causal). Causal softmax: half the
    count of the full score matrix (the tiles the kernel visits, less the diagonal's share)."""
    import attnlib

    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}; got {op!r}")
    for name, value in (("B", B), ("H", H), ("T", T), ("D", D)):
        _validate.check_int(name, value, lo=1)

    def x(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, device="meta", dtype=dtype)

    q, k, v = x(B, H, T, D), x(B, H, T, D), x(B, H, T, D)

    def forward():
        if op == "softmax":
            attnlib.softmax_attention(q, k, v, causal=False, backend="torch")
        elif op == "linear":
            attnlib.linear_attention(q, k, v, causal=True, backend="torch")
        else:
            g = x(B, H, T, dtype=torch.float32) if op == "gated_delta" else None
            attnlib.delta_rule(q, k, v, x(B, H, T), g=g, backend="torch")

    flops = count_flops(forward)
    return flops // 2 if op == "softmax" and causal else flops


def _shape_key(shape: dict) -> str:
    return "x".join(str(shape[k]) for k in "BHTD")


def static_points(report: dict, target: str = "sm_90") -> list[dict]:
    """Every (op, shape) of the report's forward rows on ``target``: counted bytes (attnlib's launches),
    counted FLOPs (:func:`count_forward_flops`; softmax attention causal, as the report runs it) and the
    arithmetic intensity. Each row: ``op``, ``shape`` (``"BxHxTxD"``), ``bytes``, ``flops``, ``intensity``."""
    out = []
    for row in report["rows"]:
        if row["target"] != target or row["pass"] != "fwd":
            continue
        s = row["shape"]
        flops = count_forward_flops(row["op"], s["B"], s["H"], s["T"], s["D"], causal=True)
        nbytes = int(row["attnlib"]["bytes"])
        out.append(dict(op=row["op"], shape=_shape_key(s), bytes=nbytes, flops=flops, intensity=flops / nbytes))
    if not out:
        raise KeyError(f"the report has no forward rows for target {target!r}; it has {sorted(report['targets'])}")
    return out


def measured_points(bench: dict, report: dict, impl: str = "attnlib", target: str = "sm_90") -> list[dict]:
    """Points of a committed softmax-attention benchmark (``benchmarks/attention.py``'s JSON) whose shape the
    report counted bytes for: ``device`` (the benchmark's), ``shape``, ``dtype``, ``causal``, ``tflops``
    (as measured; FLOPs ``4BHT^2D``, halved when causal), ``flops``, ``bytes`` (the report's, which are
    the same causal or not: the same tensors are touched) and ``intensity``."""
    nbytes = {_shape_key(r["shape"]): int(r["attnlib"]["bytes"]) for r in report["rows"]
              if r["op"] == "softmax" and r["pass"] == "fwd" and r["target"] == target}
    out = []
    for r in bench["rows"]:
        key = f"{r['B']}x{r['H']}x{r['T']}x{r['D']}"
        if r["impl"] != impl or key not in nbytes or r.get("pass", "fwd") != "fwd":
            continue
        flops = 4 * r["B"] * r["H"] * r["T"] ** 2 * r["D"] // (2 if r["causal"] else 1)
        out.append(dict(device=bench["device"], shape=key, dtype=r["dtype"], causal=r["causal"],
                        tflops=float(r["tflops"]), flops=flops, bytes=nbytes[key], intensity=flops / nbytes[key]))
    return out


__all__ = ["OPS", "PEAKS", "Roof", "count_forward_flops", "measured_points", "static_points"]
