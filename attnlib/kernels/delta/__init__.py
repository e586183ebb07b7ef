"""Chunked DeltaNet / Gated DeltaNet: forward and backward, assembled from ``wy.py`` and ``kernels/common``."""

import torch

from ..common.family import KernelFamily, empty
from .chunk import delta_rule_chunk_backward, delta_rule_chunk_forward


def _workloads(D: int, dtype, device, T: int) -> dict:
    x = empty(device, dtype)

    def run(gated: bool, only_dq: bool = False):
        q, k, v, do = x(1, 1, T, D), x(1, 1, T, D), x(1, 1, T, D), x(1, 1, T, D)
        beta = x(1, 1, T)
        g = x(1, 1, T, dt=torch.float32) if gated else None
        s0, ds = x(1, 1, D, D, dt=torch.float32), x(1, 1, D, D, dt=torch.float32)
        delta_rule_chunk_forward(q, k, v, beta, g, scale=D ** -0.5, chunk_size=64, initial_state=s0,
                                 output_final_state=True)
        delta_rule_chunk_backward(q, k, v, beta, g, s0, do, ds, scale=D ** -0.5, chunk_size=64, only_dq=only_dq)

    return {"delta": lambda: run(False), "gated delta": lambda: run(True),
            "gated delta dq only": lambda: run(True, only_dq=True)}


FAMILY = KernelFamily("delta", ("_wy_fwd_kernel", "_wy_bwd_kernel", "_fwd_h_kernel", "_fwd_o_kernel",
                                "_bwd_dh_kernel", "_bwd_dqk_kernel", "_bwd_dv_local_kernel"), "head", _workloads)

__all__ = ["FAMILY", "delta_rule_chunk_forward", "delta_rule_chunk_backward"]
