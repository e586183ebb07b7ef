"""Grassmann mixing kernels (chapter 6): the fused Plücker projection, forward and backward.
See ``plucker_fused.py`` for the tiling."""

from .plucker_fused import fused_plucker_projection, grassmann_bwd, grassmann_fwd

__all__ = ["fused_plucker_projection", "grassmann_fwd", "grassmann_bwd"]
