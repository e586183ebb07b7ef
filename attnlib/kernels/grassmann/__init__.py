"""Grassmann mixing kernels (chapter 6): the fused Plücker projection, forward and backward launch
wrappers (the autograd Function is ``attnlib.grassmann``'s). See ``plucker_fused.py`` for the tiling."""

from .plucker_fused import plucker_fused_backward, plucker_fused_forward

__all__ = ["plucker_fused_forward", "plucker_fused_backward"]
