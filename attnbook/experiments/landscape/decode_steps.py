"""One timed decode step per mechanism that has one: each builder takes :func:`.timings.cpu_decode_times`'
inputs and returns the call to time, on attnlib's PyTorch paths."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from attnlib.attention import softmax_attention
from attnlib.deltanet import delta_rule_decode_step
from attnlib.linear import linear_attention_decode_step

# --- softmax -----------------------------------------------------------------------------------

def _softmax_decode_step(x: Mapping[str, torch.Tensor]) -> Callable[[], object]:
    # one query against a cache of t keys: every key is in its past, hence not causal
    return lambda: softmax_attention(x["q1"], x["k"], x["v"], causal=False, backend="torch")


# --- linear attention --------------------------------------------------------------------------

def _linear_decode_step(x: Mapping[str, torch.Tensor]) -> Callable[[], object]:
    return lambda: linear_attention_decode_step(x["q1"], x["k1"], x["v1"], initial_state=x["S"])


# --- the delta rule, plain and gated -----------------------------------------------------------

def _gated_delta_decode_step(x: Mapping[str, torch.Tensor]) -> Callable[[], object]:
    return lambda: delta_rule_decode_step(x["q1"], x["k1"], x["v1"], x["beta"], g=x["g"], initial_state=x["S"])
