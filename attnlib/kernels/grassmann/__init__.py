"""Grassmann mixing kernels (chapter 6): the fused Plücker projection, forward and backward launch
wrappers (the autograd Function is ``attnlib.grassmann``'s). See ``plucker_fused.py`` for the tiling."""

import torch

from ..common.family import KernelFamily, empty
from .plucker_fused import plucker_fused_backward, plucker_fused_forward

RANK, N_OFFSETS = 16, 6     # the compile workloads' reduced width r and offsets (the book's default six)


def _workloads(D: int, dtype, device, T: int) -> dict:
    # D is the model width d: the projection W maps the r(r-1)/2 Plücker coordinates to d.
    x = empty(device, dtype)

    def run():
        zs, s = x(1, T, RANK, dt=torch.float32), x(1, T, dt=torch.float32)
        wa, offsets = x(RANK, RANK, D, dt=torch.float32), x(N_OFFSETS, dt=torch.int32)
        g, what = plucker_fused_forward(zs, s, wa, offsets, 1e-6, dtype)
        plucker_fused_backward(zs, s, wa, offsets, 1e-6, what, x(1, T, D))

    return {"grassmann": run}


FAMILY = KernelFamily("grassmann", ("_plucker_fwd_kernel", "_plucker_bwd_partner_kernel", "_plucker_bwd_z_kernel",
                                    "_plucker_bwd_weight_kernel"), "fixed", _workloads)

__all__ = ["FAMILY", "plucker_fused_forward", "plucker_fused_backward"]
