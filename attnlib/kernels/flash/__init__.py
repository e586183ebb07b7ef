"""Dense softmax attention (chapter 1): the flash forward and its FlashAttention-2 backward."""

from ..common.family import KernelFamily, attention_inputs, empty
from .backward import flash_attention_backward
from .forward import flash_attention_forward


def _workloads(D: int, dtype, device, T: int) -> dict:
    x = empty(device, dtype)

    def run(causal: bool, deterministic: bool = True):
        q, k, v, do, dlse = attention_inputs(x, T, D)
        o, lse = flash_attention_forward(q, k, v, scale=D ** -0.5, causal=causal)
        flash_attention_backward(q, k, v, o, lse, do, dlse, scale=D ** -0.5, causal=causal,
                                 deterministic=deterministic)

    # the backward in both forms: deterministic (dK/dV, then dQ) and fused (dQ added atomically)
    return {"flash": lambda: run(True), "flash non-causal": lambda: run(False),
            "flash fused": lambda: run(True, False), "flash fused non-causal": lambda: run(False, False)}


FAMILY = KernelFamily("flash", ("_flash_fwd_kernel", "_flash_bwd_dkdv_kernel", "_flash_bwd_dq_kernel",
                                "softmax_bwd_preprocess_kernel"), "blocks", _workloads)

__all__ = ["FAMILY", "flash_attention_backward", "flash_attention_forward"]
