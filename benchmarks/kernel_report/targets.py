"""What is measured where: the target GPUs, the ops, the shapes (the benchmarks', from
``benchmarks/_common.py``), the passes and the dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from benchmarks._common import ANCHOR_SHAPES


@dataclass(frozen=True)
class Target:
    """A GPU a reader meets (REFERENCES.md, "Performance anchors"): what torch and Triton report for it."""
    sm: int
    gpu: str
    sms: int
    memory_gib: int

    @property
    def capability(self) -> tuple[int, int]:
        return divmod(self.sm, 10)

    @property
    def shared_memory(self) -> int:
        """Opt-in shared memory per block: attnlib's own table, the number its launch code uses."""
        from attnlib.kernels.common.launch import SHARED_MEMORY
        return SHARED_MEMORY[self.capability]


TARGETS = {"sm_75": Target(75, "Tesla T4", 40, 15), "sm_80": Target(80, "NVIDIA A100-SXM4-80GB", 108, 80),
           "sm_89": Target(89, "NVIDIA L4", 58, 22), "sm_90": Target(90, "NVIDIA H100 80GB HBM3", 132, 80)}
COMPILED_TARGETS = ("sm_80", "sm_89", "sm_90")      # where auto takes the Triton kernels
SHAPES = ANCHOR_SHAPES                             # the benchmarks' shapes, (B, H, T, D)
OPS = ("softmax", "linear", "delta", "gated_delta")
CHUNKED = ("linear", "delta", "gated_delta")       # the ops fla implements
PASSES = ("fwd", "fwd+bwd")
DTYPE = torch.bfloat16


def shape_name(shape) -> str:
    return "x".join(map(str, shape))


def parse_shape(text: str) -> tuple[int, ...]:
    B, H, T, D = (int(x) for x in text.lower().split("x"))
    return B, H, T, D
