"""Top-k attention with a lightning indexer (DeepSeek Sparse Attention's operator): the fused index
scores, forward and backward (``indexer.py``), and the softmax over each query's gathered keys, forward
and backward (``attention.py``). Between them, torch sorts each row of scores to select the keys."""

import torch

from ..common.family import KernelFamily, attention_inputs, empty
from .attention import topk_attention_backward, topk_attention_forward
from .indexer import index_scores_backward, index_scores_forward

INDEX_HEADS, TOP_K = 4, 2048        # the compile workloads' index heads and keys per query (DeepSeek's k)


def _workloads(D: int, dtype, device, T: int) -> dict:
    x = empty(device, dtype)

    def run(causal: bool):
        # The indexer at d_I = D (DeepSeek-V3.2: 64 index heads of 128), then the attention over TOP_K keys.
        q, k, v, do, dlse = attention_inputs(x, T, D)
        iq, ik, iw = x(1, INDEX_HEADS, T, D), x(1, 1, T, D), x(1, INDEX_HEADS, T)
        scores = index_scores_forward(iq, ik, iw, causal=causal)
        index_scores_backward(iq, ik, iw, scores)
        indices = x(1, 1, T, TOP_K, dt=torch.int64)
        o, lse = topk_attention_forward(q, k, v, indices, scale=D ** -0.5)
        topk_attention_backward(q, k, v, indices, o, lse, do, dlse, scale=D ** -0.5)

    return {"topk": lambda: run(True)}


FAMILY = KernelFamily("topk", ("_index_scores_fwd_kernel", "_index_scores_bwd_dq_kernel",
                               "_index_scores_bwd_dk_kernel", "_topk_attn_fwd_kernel", "_topk_attn_bwd_kernel",
                               "softmax_bwd_preprocess_kernel"),
                      "fixed", _workloads)

__all__ = ["FAMILY", "index_scores_backward", "index_scores_forward", "topk_attention_backward",
           "topk_attention_forward"]
