"""Sliding-window attention (chapter 2's local band): the flash forward and FlashAttention-2 backward,
each program walking only the key (or query) tiles its band reaches."""

from .backward import sliding_window_backward
from .forward import sliding_window_forward

__all__ = ["sliding_window_backward", "sliding_window_forward"]
