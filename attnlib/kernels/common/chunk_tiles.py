"""Addressing and gate helpers shared by the chunked kernels (``chunk_state.py``, ``chunk_o.py``,
``../delta/wy.py``, ``../linear/segments.py``).

Not a kernel: ``@triton.jit`` helpers, inlined into their callers by Triton. Every chunked kernel reads
contiguous ``[B, H, T, X]`` tensors with ``(B, H)`` flattened into ``bh`` (``launch.py``), so row ``t`` of
head ``bh`` starts at ``(bh * T + t) * X``; :func:`load_chunk` / :func:`store_chunk` move one
``[CHUNK, len(offs)]`` tile of such rows. :func:`chunk_rows` gives a chunk's row indices and masks.
:func:`chunk_gates` loads the chunk-local log-gate cumsum ``G`` of the rows and of the chunk's last valid
row; :func:`decay_to_end` is ``e_t = exp(g_last - G_t)`` (0 past ``T``) and :func:`gate_ratio` is
``Gamma_ij = exp(G_i - G_j)`` on a mask (0 off it, as ``exp(-inf)``: never ``exp`` of a large positive
difference).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def chunk_rows(c, T, D, CHUNK: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(offs_c, offs_d, t, tmask, kd)`` of chunk ``c``: the in-chunk offsets, the head-dim offsets, the
    rows ``t``, ``t < T`` and the ``[CHUNK, BLOCK_D]`` mask of a key-like tile."""
    offs_c = tl.arange(0, CHUNK)
    offs_d = tl.arange(0, BLOCK_D)
    t = c * CHUNK + offs_c
    tmask = t < T
    return offs_c, offs_d, t, tmask, tmask[:, None] & (offs_d < D)[None, :]


@triton.jit
def load_chunk(X, bh, T, t, offs, W, mask):
    """Rows ``t`` of head ``bh`` of a contiguous ``[B, H, T, W]`` tensor, columns ``offs``; 0 off the mask."""
    return tl.load(X + (bh * T + t[:, None]) * W + offs[None, :], mask=mask, other=0.0)


@triton.jit
def store_chunk(X, x, bh, T, t, offs, W, mask):
    """Store ``x`` at the tile :func:`load_chunk` reads."""
    tl.store(X + (bh * T + t[:, None]) * W + offs[None, :], x, mask=mask)


@triton.jit
def chunk_gates(G, bh, T, c, t, tmask, CHUNK: tl.constexpr):
    """``(g, g_last)``: the gate cumsum of rows ``t`` (0 past ``T``) and of the chunk's last valid row."""
    g_last = tl.load(G + bh * T + tl.minimum(c * CHUNK + CHUNK, T) - 1)
    g = tl.load(G + bh * T + t, mask=tmask, other=0.0)
    return g, g_last


@triton.jit
def decay_to_end(g, g_last, tmask):
    """``e_t = exp(g_last - G_t)``, the decay from row ``t`` to the chunk's end; 0 past ``T``."""
    return tl.where(tmask, tl.exp(g_last - g), 0.0)


@triton.jit
def gate_ratio(gi, gj, mask):
    """``exp(gi - gj)`` where ``mask`` holds, 0 elsewhere (``exp(-inf)``, so no overflow off the mask)."""
    return tl.exp(tl.where(mask, gi - gj, float("-inf")))


__all__ = ["chunk_gates", "chunk_rows", "decay_to_end", "gate_ratio", "load_chunk", "store_chunk"]
