"""attnlib -- the library behind *Attention as Transport*.

One module per chapter's mechanism; each op has a reference in plain PyTorch (the book's equation)
and a Triton kernel, behind one function with ``backend="auto" | "torch" | "triton"``.
"""

from . import eot, metrics
from .anna import anna_attention
from .attention import softmax_attention
from .deltanet import delta_rule, delta_rule_decode_step
from .grassmann import CausalGrassmannMixing, plucker, plucker_features, plucker_projection
from .linear import linear_attention, linear_attention_decode_step
from .sparse import block_sparse_attention
from .topk import index_scores, indexer_kl_loss, topk_attention, topk_select
from .window import sliding_window_attention

__version__ = "0.1.0"

__all__ = [
    "softmax_attention",                                  # chapter 1
    "eot", "metrics",
    "block_sparse_attention", "sliding_window_attention",  # chapter 2 (its needle: attnbook.experiments.needle)
    "linear_attention", "linear_attention_decode_step",   # chapter 3
    "delta_rule", "delta_rule_decode_step",               # chapter 4
    "anna_attention",                                     # chapter 5
    "plucker", "plucker_features", "plucker_projection", "CausalGrassmannMixing",   # chapter 6
    "topk_attention", "index_scores", "topk_select", "indexer_kl_loss",            # chapter 7
    "__version__",
]
