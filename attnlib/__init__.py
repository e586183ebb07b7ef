"""attnlib -- the library behind *Attention as Transport*.

One module per chapter's mechanism; each op has a reference in plain PyTorch (the book's equation)
and a Triton kernel, behind one function with ``backend="auto" | "torch" | "triton"``.
"""

from . import eot
from .attention import softmax_attention, softmax_attention_reference

__version__ = "0.1.0"

__all__ = ["softmax_attention", "softmax_attention_reference", "eot", "__version__"]
