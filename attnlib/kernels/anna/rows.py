"""Row addressing shared by ANNA's two hashing kernels (``simhash.py``, ``crosspolytope.py``).

Not a kernel: ``@triton.jit`` helpers, inlined by Triton. Both hashing kernels run on a
``(cdiv(T, BLOCK_T), n_tables, B * H)`` grid, load one float32 ``[BLOCK_T, BLOCK_D]`` tile of rows
(:func:`hash_rows`; ``BLOCK_D`` covers all of ``D``, padded with masked zero loads) and write one int64
key per row and table (:func:`store_codes`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import launch
from ..common.tiles import load_tile, split_bh


@triton.jit
def hash_rows(X, stride_xb, stride_xh, stride_xt, stride_xd, H, T, D,
              BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(b, h, table, offs_t, offs_d, x)``: this program's (batch, head), table, row and column offsets and
    its float32 row tile ``x [BLOCK_T, BLOCK_D]`` (zeros past ``T`` and ``D``)."""
    b, h = split_bh(tl.program_id(2), H)
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    x = load_tile(X + b * stride_xb + h * stride_xh, offs_t, offs_d, stride_xt, stride_xd, T, D).to(tl.float32)
    return b, h, tl.program_id(1), offs_t, offs_d, x


@triton.jit
def store_codes(CODE, code, b, h, table, offs_t, stride_cb, stride_ch, stride_cl, stride_ct, T):
    """Write the keys ``code [BLOCK_T]`` of rows ``offs_t`` (those before ``T``) in ``CODE [B, H, l, T]``."""
    tl.store(CODE + b * stride_cb + h * stride_ch + table * stride_cl + offs_t * stride_ct, code, mask=offs_t < T)



def hash_launch(x: torch.Tensor, n_tables: int, gpu_config: triton.Config, max_dim: int = launch.MAX_HEAD_DIM):
    """The host side shared by the two hashing wrappers: ``(code, tiles, BLOCK_D, grid)`` -- the int64
    output ``[B, H, l, T]`` (empty when there is nothing to hash), the launch keywords (``gpu_config`` 's
    row tile ``BLOCK_T``, warps and stages on a GPU; a row tile of 16 under the interpreter:
    ``launch.choose``), the head-dim tile (``launch.head_block``) and the ``(cdiv(T, BLOCK_T), l, B * H)``
    grid. Refuses (``launch.require_launchable``) a tensor the kernels cannot take or a head wider than
    ``max_dim``."""
    B, H, T, D = x.shape
    launch.require_launchable(x, D, limit=max_dim)
    code = torch.empty(B, H, n_tables, T, dtype=torch.int64, device=x.device)
    tiles = launch.choose([gpu_config], {}, x.device, interpret=dict(BLOCK_T=launch.MIN_DOT))
    return code, tiles, launch.head_block(D), (triton.cdiv(T, tiles["BLOCK_T"]), n_tables, B * H)


__all__ = ["hash_launch", "hash_rows", "store_codes"]
