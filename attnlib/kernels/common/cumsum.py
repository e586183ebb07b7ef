"""Chunk-local cumulative sums of the log-gates, forward (``G_t = sum_{r<=t in chunk} g_r``) and
reverse (``sum_{r>=t in chunk}``, the backward of the forward one).

Tiling. The grid is ``(chunks, B * H)``: one program loads one chunk of ``CHUNK`` gates of one head
into registers, scans it with ``tl.cumsum`` in float32, and writes the chunk back. Nothing crosses a
chunk boundary -- the chunked kernels only ever need gate ratios *within* a chunk
(``exp(G_t - G_j)``), and the decay across a chunk is carried by the state pass. Positions past
``T`` load as 0 and are not stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import num_chunks


@triton.jit
def _chunk_cumsum_kernel(X, Y, T, CHUNK: tl.constexpr, REVERSE: tl.constexpr):
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    t = c * CHUNK + tl.arange(0, CHUNK)
    tmask = t < T
    x = tl.load(X + bh * T + t, mask=tmask, other=0.0).to(tl.float32)
    tl.store(Y + bh * T + t, tl.cumsum(x, axis=0, reverse=REVERSE), mask=tmask)


def chunk_cumsum(x: torch.Tensor, chunk_size: int, *, reverse: bool = False) -> torch.Tensor:
    """``x: [B, H, T]`` -> float32 ``[B, H, T]``, the cumsum restarted at every chunk."""
    B, H, T = x.shape
    y = torch.empty(B, H, T, device=x.device, dtype=torch.float32)
    if y.numel() == 0:
        return y
    _chunk_cumsum_kernel[(num_chunks(T, chunk_size), B * H)](x.contiguous(), y, T, CHUNK=chunk_size,
                                                            REVERSE=reverse)
    return y
