"""Dense softmax attention (chapter 1): the flash forward and its FlashAttention-2 backward."""

from .backward import flash_attention_backward
from .forward import flash_attention_forward

__all__ = ["flash_attention_backward", "flash_attention_forward"]
