"""Flash-attention forward in Triton: one pass over the keys, online softmax, LSE written out.

Tiling. The grid is ``(cdiv(Tq, BLOCK_M), B * H)``: one program owns ``BLOCK_M`` query rows of one
(batch, head). Its ``q`` tile ``[BLOCK_M, D]`` stays in registers; it walks the keys in tiles of
``BLOCK_N``, and for each tile computes the scores ``s = q k^T`` ``[BLOCK_M, BLOCK_N]`` and folds them
into three running quantities per row (``attnlib/kernels/common/online_softmax.py``):

    m_i  -- the running max of the scores seen so far (base-2 units),
    l_i  -- the running sum of exp2(s - m_i),
    acc  -- the running sum of exp2(s - m_i) v_j, ``[BLOCK_M, Dv]``.

When a new tile raises the max from ``m`` to ``m'``, old sums are rescaled by ``exp2(m - m')``.
At the end ``o = acc / l`` and ``lse = (m + log2 l) * ln 2`` -- the log-sum-exp of the row, i.e.
chapter 1's dual potential, computed as a streaming reduction. Only ``o`` and ``lse`` go back to
memory: the ``[T, T]`` plan never exists. The backward (``backward.py``) needs nothing else.

The key loop runs in two stages so that the inner loop of the common case has no masks (the Triton
tutorial's split; the causal diagonal is its own stage):
  * unmasked tiles: every key is valid for every row of the program
    (non-causal: all full tiles; causal: the tiles strictly left of the diagonal block) -- no
    ``where``, no bounds checks, no empty-row guard;
  * masked tiles: the ragged tail ``Tk % BLOCK_N`` and, when causal, the diagonal block.
Causal masking is top-left aligned with ``Tq == Tk`` (query i sees keys j <= i), as in SDPA; it needs
``BLOCK_M`` to be a multiple of ``BLOCK_N`` so that the diagonal stage starts on a key-tile boundary.

Scores are scaled by ``scale * log2(e)`` (folded into one multiply) so that ``exp2`` (one instruction)
replaces ``exp``. Head dims that are not powers of two are padded to ``BLOCK_D`` with masked loads.

Tiles on a GPU are autotuned (``triton.autotune``, keyed on the head dims, causality, and the
power-of-two bucket of the length so that a new length does not re-tune), among configurations
pruned to fit in shared memory -- which is what keeps D = 256 launching -- and, in half precision, to
spill no registers at the head width of the call (``_FWD_SPILLS``, measured with ptxas for sm_90).
Under the interpreter (``TRITON_INTERPRET=1``) autotuning is bypassed: one small fixed configuration,
so CPU tests stay fast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import INTERPRET
from ..common.online_softmax import LOG2E, attend_keys, head_block, softmax_init, store_o_lse
from ..common.tiles import load_tile, program_tile


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE,
                      stride_qb, stride_qh, stride_qt, stride_qd,
                      stride_kb, stride_kh, stride_kt, stride_kd,
                      stride_vb, stride_vh, stride_vt, stride_vd,
                      stride_ob, stride_oh, stride_ot, stride_od,
                      H, T_Q, T_K, D, DV, qk_scale, T_BUCKET,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr):
    pid_bh, b, h, start_m, offs_m, offs_n, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)

    q = load_tile(Q + b * stride_qb + h * stride_qh, offs_m, offs_d, stride_qt, stride_qd, T_Q, D)
    # k is read transposed, [BLOCK_D, BLOCK_N], so that s = q @ k needs no in-register transpose.
    K_base = K + b * stride_kb + h * stride_kh
    V_base = V + b * stride_vb + h * stride_vh

    acc, l_i, m_i = softmax_init(BLOCK_M, BLOCK_DV)

    if CAUSAL:
        full_end = start_m                                  # tiles wholly left of the diagonal
        masked_end = tl.minimum(start_m + BLOCK_M, T_K)     # the diagonal tile(s)
    else:
        full_end = (T_K // BLOCK_N) * BLOCK_N
        masked_end = T_K

    # Stage 1: no masks. Every row sees every key of these tiles, so no row is empty.
    acc, l_i, m_i = attend_keys(acc, l_i, m_i, q, K_base, V_base, 0, full_end, offs_m, offs_n, offs_d, offs_dv,
                                stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale, BLOCK_N=BLOCK_N,
                                MASK_T=False, CAUSAL=False, EVEN_D=EVEN_D, PRECISION=PRECISION)
    # Stage 2: the diagonal (causal) and the ragged tail, masked.
    acc, l_i, m_i = attend_keys(acc, l_i, m_i, q, K_base, V_base, full_end, masked_end, offs_m, offs_n, offs_d,
                                offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale,
                                BLOCK_N=BLOCK_N, MASK_T=True, CAUSAL=CAUSAL, EVEN_D=EVEN_D, PRECISION=PRECISION)
    # Only padded rows (>= T_Q) can have l = 0; LSE: contiguous [B, H, Tq].
    store_o_lse(O + b * stride_ob + h * stride_oh, LSE + pid_bh * T_Q, acc, l_i, m_i, offs_m, offs_dv,
                stride_ot, stride_od, T_Q, DV)


# Shared memory the tiles may take: q plus ``stages`` buffered (k, v) tiles. Hopper offers 227 KiB
# per block and Ampere 163 KiB; leave room for the layout conversions and scratch Triton adds.
SMEM_BUDGET = 160 * 1024


def _fwd_smem(cfg, args) -> int:
    bd, bdv = args["BLOCK_D"], args["BLOCK_DV"]
    bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
    return args["Q"].element_size() * (bm * bd + cfg.num_stages * bn * (bd + bdv))


def config_key(cfg) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of an autotuning configuration."""
    return cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps, cfg.num_stages


def spills(cfg, args, measured: dict) -> bool:
    """Whether ptxas reported register spills for ``cfg`` at these head dims and this dtype.

    ``measured`` maps a configuration (:func:`config_key`) to the narrowest head block
    ``max(BLOCK_D, BLOCK_DV)`` at which it spilled, for half-precision inputs (fp16 and bf16 spill
    alike): ``scripts/kernel_resources.py --every-config`` compiles every configuration for sm_90 and
    reads ``ptxas -v``. A spilled tile goes through local memory on every use, so a configuration
    that spills is dropped before the autotuner times it. Float32 inputs are not pruned for spills:
    their exact (ieee) products do not run on tensor cores, and the four configurations measured at
    D = 64 (causal; 128 x 64 with 4 and 8 warps, 128 x 128, 64 x 64) all spilled, 2.8 to 52 KB of
    spill stores -- a float32 launch on a GPU is a correctness path, not a fast one."""
    narrowest = measured.get(config_key(cfg))
    return (narrowest is not None and args["Q"].element_size() == 2
            and max(args["BLOCK_D"], args["BLOCK_DV"]) >= narrowest)


def _prune_fwd(configs, nargs, **kwargs):
    """Drop the configurations whose tiles overflow shared memory (wide heads, float32) -- they would
    fail to launch with OutOfResources --, those measured to spill registers at this head width
    (``_FWD_SPILLS``) and, for heads wider than 128, the large register tiles.
    The last configuration is the fallback, used only when no other fits (D = 256 in float32)."""
    args = {**nargs, **kwargs}                  # positional arguments, then the constexpr keywords
    wide = max(args["BLOCK_D"], args["BLOCK_DV"]) > 128
    keep = [c for c in configs[:-1] if _fwd_smem(c, args) <= SMEM_BUDGET and not spills(c, args, _FWD_SPILLS)
            and not (wide and c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] > 64 * 64)]
    return keep or configs[-1:]


# The Triton tutorial's Hopper space (BLOCK_M 64/128, BLOCK_N 32..128, 4 or 8 warps, 3 stages), with
# BLOCK_N <= BLOCK_M so that the causal diagonal stage starts on a key-tile boundary. Kept small: each
# configuration is compiled once per (dtype, head dims, causal) on first use.
_FWD_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                for bm, bn, w, s in [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3),
                                     (64, 32, 4, 3),
                                     (64, 32, 4, 1)]]   # the fallback: D = 256 in float32

# Register spills measured with ptxas -v for sm_90, fp16 = bf16, causal and not (benchmarks/results/
# kernel_resources.json has the kept ones): 128 x 64 with 4 warps holds a [128, D] fp32 accumulator
# in 128 threads -- 255 registers and no spill at D = 64, but 140-232 B of spill stores at D = 128 and
# 4.2-4.4 KB at 256; its 8-warp twin (167-168 registers at D = 128) takes its place. 128 x 128 (8 warps)
# spills 172-252 B at D = 256, where shared memory and the tile-size rule drop it anyway.
_FWD_SPILLS = {(128, 64, 4, 3): 128, (128, 128, 8, 3): 256}

if INTERPRET:
    _flash_fwd = _flash_fwd_kernel          # one fixed configuration, chosen at the launch
else:
    _flash_fwd = triton.autotune(_FWD_CONFIGS, key=["T_BUCKET", "D", "DV", "CAUSAL"],
                                 prune_configs_by={"early_config_prune": _prune_fwd})(_flash_fwd_kernel)

# Under the interpreter: small tiles (it is slow and numpy-backed); BLOCK_M a multiple of BLOCK_N.
INTERPRET_FWD = dict(BLOCK_M=32, BLOCK_N=16)


def length_bucket(T: int) -> int:
    """The autotuning key for a length: its power-of-two ceiling (at least 256), so that every new
    length does not trigger a new tuning run."""
    return max(256, triton.next_power_of_2(T))


def precision_for(dtype: torch.dtype) -> str:
    """``ieee`` for fp32 inputs (exact products, no tf32); irrelevant for half inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def check_launchable(q: torch.Tensor, D: int, DV: int) -> None:
    if q.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1")
    if max(D, DV) > 256:
        raise ValueError(f"the Triton kernel supports head dims up to 256; got D={D}, Dv={DV} "
                         "(use backend='torch')")


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                            causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. Inputs already validated by ``attnlib.softmax_attention``.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; any strides. Returns ``(o, lse)``: ``o`` in q's dtype,
    ``lse`` a contiguous float32 ``[B, H, Tq]``. ``Dv = 0`` is allowed: ``o`` is empty but ``lse``
    (which does not depend on v) is still computed.
    """
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    check_launchable(q, D, DV)
    if DV == 0:
        # The LSE does not depend on v: run on one zero value column (a stride-0 view, no copy) and
        # return an empty o. (Returning early here once gave a wrong lse.)
        o, lse = flash_attention_forward(q, k, v.new_zeros(1).expand(B, H, T_K, 1), scale=scale, causal=causal)
        return o[..., :0], lse
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    o = torch.empty(B, H, T_Q, DV, device=q.device, dtype=q.dtype)
    if B * H * T_Q == 0:
        return o, lse
    BLOCK_D, BLOCK_DV = head_block(D), head_block(DV)
    fixed = INTERPRET_FWD if INTERPRET else {}
    grid = lambda meta: (triton.cdiv(T_Q, meta["BLOCK_M"]), B * H)  # noqa: E731
    _flash_fwd[grid](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, T_Q, T_K, D, DV, scale * LOG2E.value, length_bucket(max(T_Q, T_K)),
        BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, CAUSAL=causal, EVEN_D=(D == BLOCK_D and DV == BLOCK_DV),
        PRECISION=precision_for(q.dtype), **fixed,
    )
    return o, lse


__all__ = ["flash_attention_forward"]
