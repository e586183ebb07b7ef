"""Block-sparse softmax attention (chapter 2): forward and backward over the visited blocks only."""

from .backward import block_sparse_attention_backward
from .forward import block_sparse_attention_forward, visit_lists

__all__ = ["block_sparse_attention_backward", "block_sparse_attention_forward", "visit_lists"]
