"""Chunked linear attention: forward and backward, assembled from ``kernels/common``."""

import torch

from ..common.family import KernelFamily, empty
from .chunk import linear_chunk_backward, linear_chunk_forward


def _workloads(D: int, dtype, device, T: int) -> dict:
    x = empty(device, dtype)

    def run(causal: bool):
        q, k, v, do = x(1, 1, T, D), x(1, 1, T, D), x(1, 1, T, D), x(1, 1, T, D)
        s0, ds = x(1, 1, D, D, dt=torch.float32), x(1, 1, D, D, dt=torch.float32)
        linear_chunk_forward(q, k, v, s0, scale=D ** -0.5, causal=causal, chunk_size=64, output_final_state=True)
        linear_chunk_backward(q, k, v, s0, do, ds, scale=D ** -0.5, causal=causal, chunk_size=64)

    return {"linear": lambda: run(True), "linear non-causal": lambda: run(False)}


FAMILY = KernelFamily("linear", ("_fwd_h_kernel", "_fwd_o_kernel", "_bwd_dh_kernel", "_bwd_dqk_kernel",
                                 "_bwd_dv_local_kernel", "_segment_output_kernel", "_segment_sum_kernel",
                                 "_segment_scan_kernel"), "head", _workloads)

__all__ = ["FAMILY", "linear_chunk_forward", "linear_chunk_backward"]
