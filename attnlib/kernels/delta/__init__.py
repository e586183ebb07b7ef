"""Chunked DeltaNet / Gated DeltaNet: forward and backward, assembled from ``wy.py`` and ``kernels/common``."""

from .chunk import delta_rule_chunk_backward, delta_rule_chunk_forward

__all__ = ["delta_rule_chunk_forward", "delta_rule_chunk_backward"]
