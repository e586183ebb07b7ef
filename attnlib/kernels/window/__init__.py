"""Sliding-window attention (chapter 2's local band): the flash forward and FlashAttention-2 backward,
each program walking only the key (or query) tiles its band reaches."""

from ..._backend import WINDOW_MAX_HEAD_DIM
from ..common.family import KernelFamily, attention_inputs, empty
from .backward import sliding_window_backward
from .forward import sliding_window_forward

WINDOW = 512                # the band in the compile workloads (a runtime integer: registers do not depend on it)


def _workloads(D: int, dtype, device, T: int) -> dict:
    x = empty(device, dtype)

    def run(causal: bool):
        q, k, v, do, dlse = attention_inputs(x, T, D)
        kw = dict(window=WINDOW, scale=D ** -0.5, causal=causal)
        o, lse = sliding_window_forward(q, k, v, **kw)
        sliding_window_backward(q, k, v, o, lse, do, dlse, **kw)

    return {"window": lambda: run(True), "window non-causal": lambda: run(False)}


# Flash's candidates under flash's pruning hooks, with spill tables of their own; wider heads than
# WINDOW_MAX_HEAD_DIM spilled on sm_90 and take the PyTorch path.
FAMILY = KernelFamily("window", ("_window_fwd_kernel", "_window_bwd_dkdv_kernel", "_window_bwd_dq_kernel",
                                 "softmax_bwd_preprocess_kernel"),
                      "blocks", _workloads, max_head_dim=WINDOW_MAX_HEAD_DIM)

__all__ = ["FAMILY", "sliding_window_backward", "sliding_window_forward"]
