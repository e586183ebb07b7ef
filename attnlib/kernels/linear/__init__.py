"""Chunked linear attention: forward and backward, assembled from ``kernels/common``."""

from .chunk import linear_chunk_backward, linear_chunk_forward

__all__ = ["linear_chunk_forward", "linear_chunk_backward"]
