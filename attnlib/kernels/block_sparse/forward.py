"""Block-sparse attention forward in Triton: exact softmax over the visited key blocks only.

The inspected set. Chapter 2's adversary reads an algorithm's *inspected set* -- the query-key
pairs whose scores it actually computes. Here that set is given explicitly, block by block:
``block_mask[h, I, J]`` says whether query block ``I`` of head ``h`` looks at key block ``J``.

Compact lists, computed with torch ops on the device before the launch (CSR-like, per head and
query block; no host synchronisation, so the list width is the full ``nK``):

    counts[h, I]        -- how many key blocks query block I visits,
    indices[h, I, t]    -- the t-th visited key block (t < counts[h, I]); the rest is never read.

Tiling. The mask's block size ``BS`` and the kernel's tiles are decoupled: ``BLOCK_M`` and ``BLOCK_N``
divide ``BS`` (``BS`` up to 1024 would not fit a GPU tile; every kernel asserts it at compile time,
:func:`tiles_divide_block`). The tiles are fixed per head width (:func:`tile`) and shrunk where the
device's shared memory is short (:func:`fit_tiles`: float32 on a 99 KB L4). The grid is ``(cdiv(Tq, BLOCK_M), B * H)``:
one program owns ``BLOCK_M`` query rows of one (batch, head), all in query block ``I``, keeps its ``q``
tile in registers and walks *only the visited key blocks of I* (``for t in range(counts[h, I])``,
then one scalar load of the block index), each in ``BLOCK_N``-key tiles, folding every
``[BLOCK_M, BLOCK_N]`` score tile into the online-softmax state ``(m_i, l_i, acc)`` with the very loop
the dense flash kernel runs (``attend_keys`` in ``attnlib/kernels/common/online_softmax.py``). Unvisited
blocks are never loaded: the work is proportional to the number of visited blocks, not to ``T^2``.
Tiles past ``Tk``, and when causal tiles wholly right of the program's last query, are skipped.

Every tile is masked (ragged tail ``T % BLOCK_N``; the diagonal when causal) -- visited sets are
usually small, so the two-stage unmasked/masked split of the dense kernel is not worth its code.

Rows that see no key (an empty row of the mask, or a causal block with nothing at or left of the
diagonal) keep ``m = -inf`` and ``l = 0``; they are written as ``o = 0`` and ``lse = -inf``
(the log of an empty sum), never NaN. A row that has keys but whose logits are all ``-inf`` (a
non-finite q or k) is written as NaN with ``lse = -inf``, as in the reference, never as 0. Inside a
visited tile that the causal diagonal cuts, a key reaches only the rows that see it, whatever it holds
(``online_softmax.attend_keys``). The backward is in ``backward.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common import launch
from ..common.online_softmax import LOG2E, attend_keys, no_bad, softmax_init, store_o_lse
from ..common.precision import softmax_precision
from ..common.tiles import load_tile, program_tile
from ..flash.forward import fwd_smem


@triton.jit
def tiles_divide_block(BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tiling invariant of every block-sparse kernel, checked at compile time: a tile never straddles
    two blocks of the mask (it would read keys, or serve queries, of a block pair the mask left out)."""
    tl.static_assert(BS % BLOCK_M == 0, "block-sparse: BLOCK_M must divide the mask's block size")
    tl.static_assert(BS % BLOCK_N == 0, "block-sparse: BLOCK_N must divide the mask's block size")


@triton.jit
def _block_sparse_fwd_kernel(Q, K, V, O, LSE, COUNTS, INDICES,
                             stride_qb, stride_qh, stride_qt, stride_qd,
                             stride_kb, stride_kh, stride_kt, stride_kd,
                             stride_vb, stride_vh, stride_vt, stride_vd,
                             stride_ob, stride_oh, stride_ot, stride_od,
                             stride_ch, stride_cm, stride_ih, stride_im, stride_it,
                             H, T_Q, T_K, D, DV, qk_scale,
                             BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                             CAUSAL: tl.constexpr, PRECISION: tl.constexpr):
    tiles_divide_block(BS, BLOCK_M, BLOCK_N)
    pid_bh, b, h, start_m, offs_m, offs_n, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)
    q_block = start_m // BS

    q = load_tile(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qt, stride_qd, T_Q, D)
    K_base = K + b * stride_kb + h * stride_kh
    V_base = V + b * stride_vb + h * stride_vh

    acc, l_i, m_i = softmax_init(BLOCK_M, BLOCK_DV)
    bad = no_bad(BLOCK_DV)

    n_visit = tl.load(COUNTS + h * stride_ch + q_block * stride_cm)
    idx_base = INDICES + h * stride_ih + q_block * stride_im
    for t in range(0, n_visit):
        block_start = tl.load(idx_base + t * stride_it) * BS      # one scalar: the visited key block
        hi = tl.minimum(block_start + BS, T_K)
        if CAUSAL:
            hi = tl.minimum(hi, start_m + BLOCK_M)                  # keys after every row: nothing to add
        acc, l_i, m_i, bad = attend_keys(acc, l_i, m_i, bad, q, K_base, V_base, b, h, block_start, hi, offs_m,
                                         offs_n, offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D,
                                         DV, qk_scale, BLOCK_N=BLOCK_N, MASK_T=True, CAUSAL=CAUSAL, EVEN_D=False,
                                         PRECISION=PRECISION, TMA=False)
    # A row has keys if it visits a block, and when causal if the first visited block starts at or
    # before it; empty rows get o = 0 and lse = -inf. LSE: contiguous [B, H, Tq].
    has_keys = (offs_m >= 0) & (n_visit > 0)
    if CAUSAL:
        has_keys = has_keys & (tl.load(idx_base) * BS <= offs_m)
    store_o_lse(O + b * stride_ob + h * stride_oh, LSE + pid_bh * T_Q, acc, l_i, m_i, has_keys, bad, offs_m, offs_dv,
                stride_ot, stride_od, T_Q, DV)


def visit_lists(block_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_mask [H, nQ, nK]`` bool -> ``(counts [H, nQ] int32, indices [H, nQ, nK] int32)``.

    ``indices[h, I, :counts[h, I]]`` lists the visited key blocks of query block ``I`` in increasing
    order; the rest is padding that the kernels never read. Torch ops only, on the mask's device: no
    host synchronisation (the width is ``nK``, not the largest count, which would need ``.item()``).
    Applied to ``block_mask.transpose(-1, -2)`` it gives, per key block, the query blocks that visit it.
    """
    counts = block_mask.sum(-1, dtype=torch.int32)
    # A stable descending sort of the 0/1 mask puts visited block indices first, in order.
    order = torch.sort(block_mask.to(torch.int8), dim=-1, descending=True, stable=True).indices
    return counts.contiguous(), order.to(torch.int32).contiguous()


def check_block_size(block_size: int) -> None:
    if block_size < 16:
        raise ValueError(f"the Triton kernel needs block_size >= 16 (tl.dot tiles); got {block_size} "
                         "(use backend='torch')")


def tile(block_size: int, gpu_tile: int, head_dim: int) -> int:
    """A kernel tile that divides the mask's block: ``min(block_size, gpu_tile)``, halved for heads wider
    than 128 (registers); :func:`fit_tiles` starts from it on a GPU."""
    return min(block_size, gpu_tile if head_dim <= 128 else gpu_tile // 2)


STAGES = 2          # software-pipelining stages of every block-sparse launch


def fit_tiles(bm: int, bn: int, smem, args: dict, device: torch.device) -> tuple[int, int]:
    """``(BLOCK_M, BLOCK_N)`` from ``(bm, bn)``, the wider halved (never below 16, so both still divide the
    mask's block) until the kernel's shared memory fits ``device``. ``smem(cfg, args)``: the flash
    kernel's estimate for the same tile loop (``flash.forward.fwd_smem``, ``flash.backward.bwd_smem``).
    Half precision keeps the tiles of :func:`tile` on every target (compiled for sm_80, sm_89, sm_90 at
    D = 64, 128, 256: at most 98 KB, no spill); float32 doubles every tile, and 128 x 64 at D = 128
    took 164 KB on sm_89, which offers 99. The halvings are candidates chosen by ``launch.choose``, the
    rule every launch follows (16 x 16 under the interpreter, so that CPU tests cover several tiles per
    block)."""
    tiles = launch.choose(launch.halvings(bm, bn, first="M", num_stages=STAGES), args, device, smem=smem,
                          interpret=dict(BLOCK_M=launch.MIN_DOT, BLOCK_N=launch.MIN_DOT))
    return tiles["BLOCK_M"], tiles["BLOCK_N"]


def block_sparse_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   block_mask: torch.Tensor, *, block_size: int, scale: float,
                                   causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. Inputs already validated by ``attnlib.block_sparse_attention``.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``, ``block_mask: [H, cdiv(Tq, bs), cdiv(Tk, bs)]``.
    Returns ``(o, lse)``, ``lse`` a contiguous float32 ``[B, H, Tq]``. ``Dv = 0`` still gives the right
    ``lse`` (it does not depend on v).
    """
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    launch.require_launchable(q, D, DV)
    check_block_size(block_size)
    if DV == 0:
        o, lse = block_sparse_attention_forward(q, k, v.new_zeros(1).expand(B, H, T_K, 1), block_mask,
                                                block_size=block_size, scale=scale, causal=causal)
        return o[..., :0], lse
    o = torch.empty(B, H, T_Q, DV, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    if B * H * T_Q == 0:
        return o, lse
    counts, indices = visit_lists(block_mask)
    width = max(D, DV)
    tiles = dict(O=o, BLOCK_D=launch.head_block(D), BLOCK_DV=launch.head_block(DV))
    BLOCK_M, BLOCK_N = fit_tiles(tile(block_size, 128, width), tile(block_size, 64, width), fwd_smem, tiles, q.device)
    grid = (triton.cdiv(T_Q, BLOCK_M), B * H)
    _block_sparse_fwd_kernel[grid](
        q, k, v, o, lse, counts, indices,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        *counts.stride(), *indices.stride(),
        H, T_Q, T_K, D, DV, scale * LOG2E.value,
        BS=block_size, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=tiles["BLOCK_D"], BLOCK_DV=tiles["BLOCK_DV"],
        CAUSAL=causal, PRECISION=softmax_precision(q.dtype),
        num_warps=4 if BLOCK_M <= 64 else 8, num_stages=STAGES,
    )
    return o, lse


__all__ = ["block_sparse_attention_forward", "fit_tiles", "tile", "visit_lists"]
