"""The band's tile walk and masks, shared by the sliding-window forward and backward kernels.

The band. Query ``i`` sees key ``j`` when ``i - window < j`` and ``j <= i`` (causal) or ``j < i + window``
(not causal). A program owns ``BLOCK_OWN`` consecutive positions (queries in the forward and dQ
programs, keys in dK/dV) and walks the other side in tiles of ``BLOCK_WALK``; an owned position ``p``
reaches the walked positions ``[p - before, p + after]`` (forward, dQ: ``before = window - 1``,
``after = 0`` or ``window - 1``; dK/dV, the transpose: ``before = 0`` or ``window - 1``,
``after = window - 1``). :func:`band_tiles` splits the tiles the program's band intersects into

    edge tiles  [lo, edge_end)        -- some owned position does not reach some walked one (left edge),
    inner tiles [edge_end, full_end)  -- every owned position reaches every walked one: no mask,
    edge tiles  [full_end, hi)        -- the right edge (the causal diagonal) and the ragged tail at T,

every tile starting at a multiple of ``BLOCK_WALK``. A program visits ``(BLOCK_OWN + window) /
BLOCK_WALK + 2`` tiles at most: the work is ``O(T window)``, not ``O(T^2)``. Unlike the flash kernels'
causal split, nothing here needs one tile size to divide the other (the split is computed from the
program's first and last positions, not from a shared diagonal tile).

The edge tiles of both sides run in one loop (:func:`edge_tile` maps the loop index to a tile), so the
kernels compile one masked loop body, not two.

Non-finite values. In an edge tile, a key off some rows' band may hold a non-finite value (v in the
forward, k in dQ) that those rows multiply by a 0 weight: ``0 * inf`` is NaN. The products there take
the operand's finite part (``online_softmax.finite_part``), and the accumulator starts NaN at exactly the
(row, column) entries whose band holds a non-finite entry in that column (:func:`seen_not_finite`) --
found by a 0/1 matrix product ``band_mask @ not_finite``, since on a band the rows that see a key are an
interval around it, not "every row at or after it" as on the causal diagonal (``poison_rows``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..common.online_softmax import load_rows


@triton.jit
def band_tiles(start, before, after, T, BLOCK_OWN: tl.constexpr, BLOCK_WALK: tl.constexpr):
    """``(lo, edge_end, full_end, hi, n_edge)`` for the program owning ``[start, start + BLOCK_OWN)``:
    the walked range ``[lo, hi)`` its band reaches (``lo`` a tile start, ``hi <= T``), the unmasked tiles
    ``[edge_end, full_end)``, and the number of edge tiles (:func:`edge_tile`)."""
    lo = (tl.maximum(start - before, 0) // BLOCK_WALK) * BLOCK_WALK
    hi = tl.minimum(start + BLOCK_OWN + after, T)
    # Walked positions reached by the last owned position (p - before) and the first (p + after): a tile
    # inside both is reached by every owned position. Clamped so that the stages stay ordered.
    inner = tl.cdiv(tl.maximum(start + BLOCK_OWN - 1 - before, 0), BLOCK_WALK) * BLOCK_WALK
    edge_end = tl.minimum(tl.maximum(inner, lo), hi)
    full_end = tl.maximum(edge_end, (tl.minimum(start + after + 1, T) // BLOCK_WALK) * BLOCK_WALK)
    n_edge = tl.cdiv(edge_end - lo, BLOCK_WALK) + tl.cdiv(hi - full_end, BLOCK_WALK)
    return lo, edge_end, full_end, hi, n_edge


@triton.jit
def edge_tile(t, lo, edge_end, full_end, BLOCK_WALK: tl.constexpr):
    """The first position of edge tile ``t``: the left edge's tiles from ``lo``, then the right edge's
    from ``full_end``."""
    n_left = tl.cdiv(edge_end - lo, BLOCK_WALK)
    return tl.where(t < n_left, lo + t * BLOCK_WALK, full_end + (t - n_left) * BLOCK_WALK)


@triton.jit
def band_mask(offs_q, offs_k, window, T, CAUSAL: tl.constexpr):
    """``[len(offs_q), len(offs_k)]`` bool: key ``offs_k`` is on query ``offs_q``'s band and before ``T``."""
    valid = (offs_k[None, :] < T) & (offs_k[None, :] > offs_q[:, None] - window)
    if CAUSAL:
        valid = valid & (offs_k[None, :] <= offs_q[:, None])
    else:
        valid = valid & (offs_k[None, :] < offs_q[:, None] + window)
    return valid


@triton.jit
def seen_not_finite(base, b, h, lo, edge_end, full_end, n_edge, offs_m, offs_walk, offs_c, stride_t, stride_c, T, C,
                    window, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_WALK: tl.constexpr,
                    CAUSAL: tl.constexpr, EVEN_C: tl.constexpr, TMA: tl.constexpr):
    """The initial fp32 accumulator ``[BLOCK_M, BLOCK_C]`` of rows ``offs_m``: NaN where the row's band,
    within the edge tiles, holds a key whose column of ``base`` (v in the forward, k in dQ) is not finite
    -- what the edge tiles' finite parts set aside --, 0 elsewhere (NaN stays NaN through every rescale and
    sum of the loops that follow).

    Non-finite inputs are rare, so a first pass only counts them (one load and reduction per edge tile);
    where there are any, a second finds the rows that see each, one key of the tile at a time (a key's
    rows are an interval of the band, which no single per-column index describes). No ``tl.dot``: a 0/1
    product ``band_mask @ not_finite`` was exact too, but took a tensor-core layout of its own (the
    attention's chained products take another) and made the compiled forward spill registers on sm_80."""
    n_bad = 0
    for t in range(0, n_edge):
        start_n = edge_tile(t, lo, edge_end, full_end, BLOCK_WALK)
        y = load_rows(base, b, h, start_n, offs_walk, offs_c, stride_t, stride_c, T, C, MASK_T=True, EVEN_C=EVEN_C,
                      TMA=TMA)
        n_bad += tl.sum(tl.where(tl.abs(y) < float("inf"), 0, 1))        # NaN compares False
    hits = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.int1)
    if n_bad > 0:
        for t in range(0, n_edge):
            start_n = edge_tile(t, lo, edge_end, full_end, BLOCK_WALK)
            y = load_rows(base, b, h, start_n, offs_walk, offs_c, stride_t, stride_c, T, C, MASK_T=True,
                          EVEN_C=EVEN_C, TMA=TMA)
            not_finite = tl.where(tl.abs(y) < float("inf"), 0, 1)
            for jj in range(0, BLOCK_WALK):
                key_bad = tl.max(tl.where(offs_walk[:, None] == jj, not_finite, 0), 0)       # [BLOCK_C]
                sees = band_mask(offs_m, start_n + jj + tl.zeros([1], dtype=tl.int32), window, T, CAUSAL)
                hits = hits | (sees & (key_bad[None, :] > 0))
    return tl.where(hits, float("nan"), 0.0)


def merged_spills(flash: dict, window: dict) -> dict:
    """A ``SPILLS`` table for a window kernel: flash's entries for the same candidates (the loops the window
    kernel shares with flash's kernel) and the window kernel's own measured spills, the narrowest width
    of either."""
    out = {}
    for family in sorted(set(flash) | set(window)):
        mine = dict(flash.get(family, {}))
        for key, width in window.get(family, {}).items():
            mine[key] = min(width, mine.get(key, width))
        out[family] = mine
    return out


def clamp_window(window: int, T: int) -> int:
    """``window`` as the kernels take it: at most ``T`` (a wider band is the same band, and the kernels'
    integer arithmetic stays in 32 bits), at least 1."""
    return max(1, min(int(window), T))


def window_bucket(window: int) -> int:
    """The autotuning key for a (clamped) window: its power-of-two ceiling, at least 16 -- the band's
    width sets how many tiles a program visits, hence which tiling wins."""
    return max(16, triton.next_power_of_2(window))


__all__ = ["band_mask", "band_tiles", "clamp_window", "edge_tile", "merged_spills", "seen_not_finite",
           "window_bucket"]
