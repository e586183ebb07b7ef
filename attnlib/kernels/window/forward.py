"""Sliding-window attention forward in Triton: the flash forward over the key tiles of each query tile's
band only (``attnlib/kernels/flash/forward.py``; the walk: ``band.py``).

Tiling. The grid is ``(cdiv(T, BLOCK_M), B * H)``: one program owns ``BLOCK_M`` query rows of one (batch,
head), keeps its q tile, and folds key tiles of ``BLOCK_N`` into the online-softmax state ``(m, l, acc)``
(``online_softmax``) -- but only the tiles its rows' bands intersect (``band.band_tiles``):

  * inner tiles, on every row's band: flash's unmasked loop (``attend_keys`` with no mask);
  * edge tiles (the band's left end ``j > i - window``, its right end -- the causal diagonal or
    ``j < i + window`` --, the ragged tail at ``T``): one masked loop (:func:`band_keys`), scores off the
    band selected to ``-inf``, and v's finite part in ``p @ v``; the accumulator starts NaN at the entries
    of exactly the rows whose band holds a non-finite value there (``band.seen_not_finite``).

So a NaN or inf in q, k or v reaches the rows whose band holds it and no other, as in the definition;
every row's band holds its own key, so no row is empty. ``o = acc / l`` and the natural-log
``lse = (m + log2 l) ln 2`` are written as by flash (``store_o_lse``).

Loads, tiles, autotuning: as flash's forward -- tensor descriptors (TMA) on sm_90 where Triton and the
strides allow, pointers elsewhere; on a GPU flash's candidates and pruning (see :data:`_FWD_CONFIGS`),
keyed also on the window's power-of-two bucket; under the interpreter fixed small tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import WINDOW_MAX_HEAD_DIM
from ..common import launch
from ..common.online_softmax import (
    LOG2E,
    attend_keys,
    finite_part,
    head_base,
    load_key_tile,
    load_rows,
    no_bad,
    online_softmax_update,
    softmax_init,
    store_o_lse,
)
from ..common.precision import softmax_precision
from ..common.tiles import program_tile
from ..flash import forward as flash_fwd
from ..flash.forward import FWD_BLOCKS, configs, launch_tiles, length_bucket, spill_width
from .band import band_mask, band_tiles, clamp_window, edge_tile, merged_spills, seen_not_finite, window_bucket


@triton.jit
def band_keys(acc, l_i, m_i, q, K_base, V_base, b, h, lo, edge_end, full_end, n_edge, offs_m, offs_n, offs_d,
              offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T, D, DV, window, qk_scale,
              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr,
              TMA: tl.constexpr):
    """Fold the band's edge tiles into ``(acc, l_i, m_i)``: scores off a row's band (or past ``T``) are
    ``-inf`` by selection, and ``p @ v`` takes v's finite part (a masked key's non-finite value would
    otherwise reach, through a 0 weight, rows that do not see it; ``band.seen_not_finite`` started the
    accumulator of the rows that do at NaN)."""
    for t in range(0, n_edge):
        start_n = edge_tile(t, lo, edge_end, full_end, BLOCK_N)
        k, v = load_key_tile(K_base, V_base, b, h, start_n, offs_n, offs_d, offs_dv, stride_kt, stride_kd,
                             stride_vt, stride_vd, T, D, DV, MASK_T=True, EVEN_D=EVEN_D, TMA=TMA)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale                # base-2 logits
        s = tl.where(band_mask(offs_m, start_n + offs_n, window, T, CAUSAL), s, float("-inf"))
        v, _ = finite_part(v, start_n + offs_n)
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, s, v, PRECISION=PRECISION)
    return acc, l_i, m_i


@triton.jit
def _window_fwd_kernel(Q, K, V, O, LSE,
                       stride_qb, stride_qh, stride_qt, stride_qd,
                       stride_kb, stride_kh, stride_kt, stride_kd,
                       stride_vb, stride_vh, stride_vt, stride_vd,
                       stride_ob, stride_oh, stride_ot, stride_od,
                       H, T, D, DV, window, qk_scale, T_BUCKET, W_BUCKET,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                       CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr):
    pid_bh, b, h, start_m, offs_m, offs_n, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)

    K_base = head_base(K, b, h, stride_kb, stride_kh, TMA)
    V_base = head_base(V, b, h, stride_vb, stride_vh, TMA)
    # Keys j reached by row i: i - (window - 1) <= j <= i (+ window - 1 when not causal).
    lo, edge_end, full_end, hi, n_edge = band_tiles(start_m, window - 1, 0 if CAUSAL else window - 1, T, BLOCK_M,
                                                    BLOCK_N)
    # acc starts NaN where a row's band holds a non-finite value that the edge tiles set aside (before q is
    # loaded: nothing else is live yet).
    acc = seen_not_finite(V_base, b, h, lo, edge_end, full_end, n_edge, offs_m, offs_n, offs_dv, stride_vt,
                          stride_vd, T, DV, window, BLOCK_M=BLOCK_M, BLOCK_C=BLOCK_DV, BLOCK_WALK=BLOCK_N,
                          CAUSAL=CAUSAL, EVEN_C=EVEN_D, TMA=TMA)
    _, l_i, m_i = softmax_init(BLOCK_M, BLOCK_DV)
    q = load_rows(head_base(Q, b, h, stride_qb, stride_qh, TMA), b, h, start_m, tl.arange(0, BLOCK_M), offs_d,
                  stride_qt, stride_qd, T, D, MASK_T=True, EVEN_C=False, TMA=TMA)

    # Inner tiles: on every row's band, no mask (flash's loop).
    acc, l_i, m_i, _ = attend_keys(acc, l_i, m_i, no_bad(BLOCK_DV), q, K_base, V_base, b, h, edge_end, full_end,
                                   offs_m, offs_n, offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T, D,
                                   DV, qk_scale, BLOCK_N=BLOCK_N, MASK_T=False, CAUSAL=False, EVEN_D=EVEN_D,
                                   PRECISION=PRECISION, TMA=TMA)
    # Edge tiles, both ends, masked.
    acc, l_i, m_i = band_keys(acc, l_i, m_i, q, K_base, V_base, b, h, lo, edge_end, full_end, n_edge, offs_m, offs_n,
                              offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T, D, DV, window, qk_scale,
                              BLOCK_N=BLOCK_N, CAUSAL=CAUSAL, EVEN_D=EVEN_D, PRECISION=PRECISION, TMA=TMA)
    # Every row's band holds its own key: has_keys is all True. LSE: contiguous [B, H, T].
    store_o_lse(O + b * stride_ob + h * stride_oh, LSE + pid_bh * T, acc, l_i, m_i, offs_m >= 0, no_bad(BLOCK_DV),
                offs_m, offs_dv, stride_ot, stride_od, T, DV)


def same_shapes(flash_configs, blocks: dict) -> list:
    """Fresh ``triton.Config`` s (each autotuner its own objects) of the flash candidates' shapes, with the
    pre-hook that sets the descriptor boxes ``blocks``."""
    return configs([(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in flash_configs],
                   blocks)


# Flash's candidates and shared-memory estimate, by import: a program holds what flash's forward holds
# -- the q tile, the fp32 acc [BLOCK_M, Dv], one score tile and one (k, v) tile per step --, its edge step
# adds a [BLOCK_M, BLOCK_N] band mask where flash's diagonal step computes the causal one, the pass that
# finds non-finite values runs before the loop (nothing else live), and the same tiles pass through
# shared memory (compiled: the same bytes as flash at every kept candidate). Its registers are not quite
# flash's -- within a few on sm_80/sm_89, up to +25 on sm_90 --, so its SPILLS table is flash's plus the
# window kernel's own spills, measured with ``scripts/kernel_resources.py --workloads "window,window
# non-causal" --dims 64 128 256 --widest-only`` on sm_80 (bf16 causal), sm_89 (fp16 non-causal) and sm_90
# (bf16 causal by descriptors, fp16 non-causal by pointers): on sm_90 at D = 256 every 64-key-row
# candidate spilled (4-280 B) where flash's did not, which is why the kernels stop at D = 128
# (``WINDOW_MAX_HEAD_DIM``; the table keeps no entry for wider heads). Then at D = 64 and 128 in every
# combination of bf16 and fp16, causal and not, descriptors and pointers (``--dims 64 128 --dtypes bf16
# fp16``, both runs): 4-40 B at D = 64 for 64 x 64 and 128 x 64 tiles on sm_80/sm_89, 12 B for the 3-stage
# 128 x 128 on sm_90 by pointers at D = 128.
_WINDOW_FWD_SPILLS = {"sm80": {(64, 64, 4, 2): 64, (128, 64, 8, 3): 64},
                      "sm89": {(64, 64, 4, 3): 64, (64, 64, 4, 2): 64, (128, 64, 8, 3): 64, (128, 64, 4, 3): 64},
                      "sm90": {(128, 128, 8, 3): 128}}
_FWD_CONFIGS = same_shapes(flash_fwd._FWD_CONFIGS, FWD_BLOCKS)
_FWD_SPILLS = merged_spills(flash_fwd._FWD_SPILLS, _WINDOW_FWD_SPILLS)
_prune_fwd = launch.pruner(flash_fwd.fwd_smem, _FWD_SPILLS, spill_width("O"), "LSE")
_KEY = ["T_BUCKET", "W_BUCKET", "D", "DV", "CAUSAL"]
_window_fwd = launch.autotuned(_window_fwd_kernel, _FWD_CONFIGS, _KEY, _prune_fwd, name="window.forward._window_fwd")

# Under the interpreter: small tiles (it is slow and numpy-backed), so that CPU tests of a few dozen
# positions still have inner tiles as well as edge ones.
INTERPRET_FWD = dict(BLOCK_M=16, BLOCK_N=16)


def sliding_window_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, window: int, scale: float,
                           causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. Inputs already validated by ``attnlib.window.sliding_window_attention``.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; any strides. Returns ``(o, lse)``: ``o`` in q's dtype,
    ``lse`` a contiguous float32 ``[B, H, T]`` (natural log). ``Dv = 0`` gives an empty ``o`` and the
    right ``lse``.
    """
    B, H, T, D = q.shape
    DV = v.shape[3]
    launch.require_launchable(q, D, DV, limit=WINDOW_MAX_HEAD_DIM)
    if DV == 0:
        # The LSE does not depend on v: one zero value column (a stride-0 view), as flash does.
        o, lse = sliding_window_forward(q, k, v.new_zeros(1).expand(B, H, T, 1), window=window, scale=scale,
                                        causal=causal)
        return o[..., :0], lse
    lse = torch.empty(B, H, T, device=q.device, dtype=torch.float32)
    o = torch.empty(B, H, T, DV, device=q.device, dtype=q.dtype)
    if B * H * T == 0:
        return o, lse
    window = clamp_window(window, T)
    BLOCK_D, BLOCK_DV = launch.head_block(D), launch.head_block(DV)
    tma = launch.tma_device(q.device) and launch.tma_compatible(q, k, v)
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_M"]), B * H)  # noqa: E731
    launch_tiles(_window_fwd, grid,
                 [*launch.head_descriptors(tma, q, k, v), o, lse,
                  *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                  H, T, D, DV, window, scale * LOG2E.value, length_bucket(T), window_bucket(window)],
                 dict(BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, CAUSAL=causal, EVEN_D=(D == BLOCK_D and DV == BLOCK_DV),
                      PRECISION=softmax_precision(q.dtype), TMA=tma),
                 INTERPRET_FWD, FWD_BLOCKS)
    return o, lse


__all__ = ["same_shapes", "sliding_window_forward"]
