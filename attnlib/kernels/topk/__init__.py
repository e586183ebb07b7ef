"""Top-k attention with a lightning indexer (DeepSeek Sparse Attention's operator): the fused index
scores, forward and backward (``indexer.py``), and the softmax over each query's gathered keys, forward
and backward (``attention.py``). Between them, torch sorts each row of scores to select the keys."""

from .attention import topk_attention_backward, topk_attention_forward
from .indexer import index_scores_backward, index_scores_forward

__all__ = ["index_scores_backward", "index_scores_forward", "topk_attention_backward", "topk_attention_forward"]
