"""Block-sparse softmax attention (chapter 2): forward and backward over the visited blocks only."""

import torch

from ..common.family import KernelFamily, attention_inputs, empty
from .backward import block_sparse_attention_backward
from .forward import block_sparse_attention_forward, visit_lists

BLOCK_SIZE = 128            # the mask's block in the compile workloads: the widest tiles the wrappers launch


def _workloads(D: int, dtype, device, T: int) -> dict:
    x = empty(device, dtype)

    def run(causal: bool):
        q, k, v, do, dlse = attention_inputs(x, T, D)
        n = T // BLOCK_SIZE
        mask = x(q.shape[1], n, n, dt=torch.bool)
        kw = dict(block_size=BLOCK_SIZE, scale=D ** -0.5, causal=causal)
        o, lse = block_sparse_attention_forward(q, k, v, mask, **kw)
        block_sparse_attention_backward(q, k, v, o, lse, do, dlse, mask, **kw)

    return {"block-sparse": lambda: run(True), "block-sparse non-causal": lambda: run(False)}


FAMILY = KernelFamily("block_sparse", ("_block_sparse_fwd_kernel", "_block_sparse_bwd_dkdv_kernel",
                                       "_block_sparse_bwd_dq_kernel",
                                       "softmax_bwd_preprocess_kernel"), "blocks", _workloads)

__all__ = ["FAMILY", "block_sparse_attention_backward", "block_sparse_attention_forward", "visit_lists"]
