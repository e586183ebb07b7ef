"""The flash forward walked tile by tile: the real kernel's running state after each key tile.

:func:`flash_walk` launches attnlib's flash forward kernel (``attnlib/kernels/flash/forward.py``) with
its ``TRACE`` switch on: after folding each tile of ``block_n`` keys into its running state, every
program stores that state -- per query row the running max ``m``, the running sum
``l = sum_j exp(s_ij - m)`` over the keys seen so far and the unnormalised output
``acc = sum_j exp(s_ij - m) v_j`` -- into a trace buffer. The function returns one query tile's trace,
in natural units (the kernel works in base 2: its max is ``m / ln 2``), together with the partial
plans ``exp(s_ij - m) / l`` that the state stands for, the kernel's own outputs, and the scores.

Nothing here re-implements the loop: the numbers are the kernel's, read back. On a CPU the kernel runs
through Triton's interpreter, which must be switched on (``TRITON_INTERPRET=1``) before attnlib is
imported; on a GPU of compute capability 8.0 or newer it runs compiled. Tiles are fixed (no autotuning)
and the loads take the pointer path, so the trace's layout is known in advance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attnlib import _validate
from attnlib._backend import choose_backend

TILE_SIZES = (16, 128)      # tl.dot needs tiles of at least 16; 128 is the largest the kernel launches


@dataclass(frozen=True)
class FlashWalk:
    """One query tile's walk over the key tiles (``n`` visited tiles, ``r`` rows, ``Dv`` value columns).

    ``rows [r]``: the query indices of the tile (those inside the sequence). ``key_end [n]``: after tile
    ``t`` the program has seen keys ``0 .. key_end[t] - 1``. ``m``, ``l [n, r]``: running max (natural
    units: the scaled scores' max) and running sum ``sum_j exp(s_ij - m_i)``; ``acc [n, r, Dv]``: the
    unnormalised output. ``plans [n, r, Tk]``: ``exp(s_ij - m_i) / l_i`` from the traced state, zero on
    the keys not yet seen. ``o [r, Dv]``, ``lse [r]``: what the kernel wrote back. ``scores [r, Tk]``:
    the scaled scores ``scale * q_i . k_j`` (``-inf`` where masked), float64. All float64 except the
    kernel's ``o`` (the inputs' dtype) and ``lse`` (float32).
    """
    rows: torch.Tensor
    key_end: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor  # noqa: E741 - the book's name for the running sum
    acc: torch.Tensor
    plans: torch.Tensor
    o: torch.Tensor
    lse: torch.Tensor
    scores: torch.Tensor
    block_m: int
    block_n: int
    causal: bool
    scale: float

    @property
    def o_partial(self) -> torch.Tensor:
        """``acc / l`` after each tile, ``[n, r, Dv]``: the output of attention over the keys seen so far."""
        return self.acc / self.l[..., None]

    @property
    def lse_partial(self) -> torch.Tensor:
        """``m + log l`` after each tile, ``[n, r]``: the log-sum-exp over the keys seen so far."""
        return self.m + torch.log(self.l)


def flash_walk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
               causal: bool = False, block_m: int = 32, block_n: int = 16, query_tile: int = 0,
               batch: int = 0, head: int = 0) -> FlashWalk:
    """Run the flash forward kernel with its trace on and return query tile ``query_tile`` of head
    ``(batch, head)``, walked over the key tiles.

    ``q, k: [B, H, T, D]``, ``v: [B, H, Tk, Dv]`` (float32, float16 or bfloat16; float32 under the
    interpreter), as for ``softmax_attention``. ``block_m``, ``block_n``: the kernel's tiles, powers of
    two in ``[16, 128]`` (causal: ``block_n <= block_m``, as the kernel asserts). With ``causal`` the
    tiles above the diagonal are never visited, so the walk has only the tiles the program visits.
    """
    _, H, T_Q, T_K, D, _ = _validate.check_qkv(q, k, v, same_length=causal)
    B = q.shape[0]
    causal = _validate.check_bool("causal", causal)
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    block_m = _validate.check_power_of_two("block_m", block_m, lo=TILE_SIZES[0], hi=TILE_SIZES[1])
    block_n = _validate.check_power_of_two("block_n", block_n, lo=TILE_SIZES[0], hi=TILE_SIZES[1])
    if causal and block_n > block_m:
        raise ValueError(f"block_n must divide block_m when causal (the diagonal stage starts at the tile's "
                         f"first row); got block_n={block_n}, block_m={block_m}")
    if T_Q == 0:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected at least one query to walk")
    query_tile = _validate.check_int("query_tile", query_tile, lo=0, hi=math.ceil(T_Q / block_m) - 1,
                                     why=f" (the query tiles of {T_Q} rows in tiles of {block_m})")
    batch = _validate.check_int("batch", batch, lo=0, hi=B - 1)
    head = _validate.check_int("head", head, lo=0, hi=H - 1)
    choose_backend("triton", q)             # raises, saying why, where the kernel cannot run

    from attnlib.kernels.flash.forward import flash_attention_forward_traced
    o, lse, m2, l_run, acc = flash_attention_forward_traced(q, k, v, scale=scale, causal=causal,
                                                            block_m=block_m, block_n=block_n)
    rows = torch.arange(query_tile * block_m, min((query_tile + 1) * block_m, T_Q))
    m = m2[batch, head][:, rows].double().cpu() * math.log(2.0)          # base 2 -> natural units
    l_t = l_run[batch, head][:, rows].double().cpu()
    acc_t = acc[batch, head][:, rows].double().cpu()
    visited = ~torch.isnan(l_t).any(dim=1)
    n = int(visited.sum())
    if not bool(visited[:n].all()):
        raise RuntimeError("the trace's visited key tiles are not a prefix: the kernel's loop changed")

    qh, kh = q[batch, head, rows].double().cpu(), k[batch, head].double().cpu()
    scores = scale * qh @ kh.T                                               # [r, Tk]
    if causal:
        scores = scores.masked_fill(torch.arange(T_K)[None, :] > rows[:, None], float("-inf"))
    key_end = torch.tensor([min((t + 1) * block_n, T_K) for t in range(n)])
    seen = torch.arange(T_K)[None, :] < key_end[:, None]                   # [n, Tk]
    plans = torch.exp(scores[None] - m[:n, :, None]) / l_t[:n, :, None]
    plans = torch.where(seen[:, None, :], plans, torch.zeros(()).double())
    plans = torch.nan_to_num(plans, nan=0.0)                                # rows with no key yet: 0 / 0
    return FlashWalk(rows=rows, key_end=key_end, m=m[:n], l=l_t[:n], acc=acc_t[:n], plans=plans,
                     o=o[batch, head, rows].cpu(), lse=lse[batch, head, rows].cpu(), scores=scores,
                     block_m=block_m, block_n=block_n, causal=causal, scale=scale)


__all__ = ["FlashWalk", "TILE_SIZES", "flash_walk"]
