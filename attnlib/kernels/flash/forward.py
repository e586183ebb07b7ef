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
    ``where``, no bounds checks;
  * masked tiles: the ragged tail ``Tk % BLOCK_N`` and, when causal, the diagonal block, where a key
    masked for some rows reaches none of them, whatever it holds (``online_softmax.attend_keys``).
A row whose logits are all ``-inf`` (a non-finite q or k) is written as NaN with ``lse = -inf``, as in
the definition, never as 0 (``online_softmax.store_o_lse``).
Causal masking is top-left aligned with ``Tq == Tk`` (query i sees keys j <= i), as in SDPA. The
diagonal stage starts at the program's first row, which is a key-tile boundary only if ``BLOCK_N``
divides ``BLOCK_M``: the kernel asserts it at compile time (``tl.static_assert``).

Scores are scaled by ``scale * log2(e)`` (folded into one multiply) so that ``exp2`` (one instruction)
replaces ``exp``. Head dims that are not powers of two are padded to ``BLOCK_D`` with masked loads.

Loads. On sm_90 the q, k and v tiles come through the copy engine (TMA): the wrapper passes host-side
tensor descriptors (``triton.tools.tensor_descriptor``) instead of pointers when the installed Triton
has them and the strides allow it (``launch.tma_device``, ``launch.tma_compatible``), and the constexpr
``TMA`` selects the descriptor loads in the same kernel body (``online_softmax.load_rows``). Host-side
rather than ``tl.make_tensor_descriptor`` in the kernel: a device-side descriptor needs a global-memory
scratch allocator registered process-wide (``triton.set_allocator``), which a library should not impose
on its caller, and every program would write and fence its descriptors before its first load. Host
descriptors travel as kernel parameters; their box is the configuration's tile, set by the autotuner's
pre-hook (``launch.descriptor_blocks``). Everywhere else -- sm_80/sm_89, the interpreter, a Triton
without descriptors, strides TMA cannot take -- the pointer path.

Trace. The constexpr ``TRACE`` (False in every production launch, where its code is not compiled: the
registers and shared memory of each configuration for sm_80 and sm_90 are what they were without it)
makes every program store its running ``m_i``, ``l_i`` and ``acc`` after each key tile into trace
buffers (``online_softmax.trace_state``). :func:`flash_attention_forward_traced` launches it at fixed
tiles; ``attnbook.experiments.flash_walk`` reads one query tile's walk back, for the appendix.

Tiles on a GPU are autotuned (keyed on the head dims, causality, and the power-of-two bucket of the
length so that a new length does not re-tune) among the candidates ``launch.pruner`` keeps for the
device: those whose shared memory (:func:`fwd_smem`) fits what the device offers, and, in half
precision, that ptxas did not show spilling registers at the call's head width on that GPU generation
(``_FWD_SPILLS``, measured for sm_80, sm_89 and sm_90 by ``scripts/kernel_report.py --spill-tables``).
Under the interpreter (``TRITON_INTERPRET=1``) autotuning is bypassed: one small fixed configuration, so CPU
tests stay fast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..._backend import INTERPRET
from ..common import launch
from ..common.online_softmax import LOG2E, attend_keys, head_base, load_rows, no_bad, softmax_init, store_o_lse
from ..common.precision import softmax_precision
from ..common.tiles import program_tile


@triton.jit
def _flash_fwd_kernel(Q, K, V, O, LSE, TRACE_M, TRACE_L, TRACE_ACC,
                      stride_qb, stride_qh, stride_qt, stride_qd,
                      stride_kb, stride_kh, stride_kt, stride_kd,
                      stride_vb, stride_vh, stride_vt, stride_vd,
                      stride_ob, stride_oh, stride_ot, stride_od,
                      H, T_Q, T_K, D, DV, qk_scale, T_BUCKET,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                      CAUSAL: tl.constexpr, EVEN_D: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
                      TRACE: tl.constexpr):
    if CAUSAL:
        tl.static_assert(BLOCK_M % BLOCK_N == 0, "causal forward: BLOCK_N must divide BLOCK_M (the diagonal "
                                                 "stage starts at the program's first row)")
    pid_bh, b, h, start_m, offs_m, offs_n, offs_d, offs_dv = program_tile(H, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV)

    q = load_rows(head_base(Q, b, h, stride_qb, stride_qh, TMA), b, h, start_m, tl.arange(0, BLOCK_M), offs_d,
                  stride_qt, stride_qd, T_Q, D, MASK_T=True, EVEN_C=False, TMA=TMA)
    K_base = head_base(K, b, h, stride_kb, stride_kh, TMA)
    V_base = head_base(V, b, h, stride_vb, stride_vh, TMA)

    acc, l_i, m_i = softmax_init(BLOCK_M, BLOCK_DV)
    bad = no_bad(BLOCK_DV)
    if TRACE:   # this program's (batch, head) in the [B * H, n_key_tiles, T_Q(, DV)] trace buffers
        trace_rows = pid_bh * tl.cdiv(T_K, BLOCK_N) * T_Q
        TRACE_M += trace_rows
        TRACE_L += trace_rows
        TRACE_ACC += trace_rows * DV

    if CAUSAL:
        full_end = start_m                                  # tiles wholly left of the diagonal
        masked_end = tl.minimum(start_m + BLOCK_M, T_K)     # the diagonal tile(s)
    else:
        full_end = (T_K // BLOCK_N) * BLOCK_N
        masked_end = T_K

    # Stage 1: no masks. Every row sees every key of these tiles, so no row is empty.
    acc, l_i, m_i, bad = attend_keys(acc, l_i, m_i, bad, q, K_base, V_base, b, h, 0, full_end, offs_m, offs_n, offs_d,
                                     offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale,
                                     BLOCK_N=BLOCK_N, MASK_T=False, CAUSAL=False, EVEN_D=EVEN_D, PRECISION=PRECISION,
                                     TMA=TMA, TRACE_M=TRACE_M, TRACE_L=TRACE_L, TRACE_ACC=TRACE_ACC, T_Q=T_Q,
                                     TRACE=TRACE)
    # Stage 2: the diagonal (causal) and the ragged tail, masked.
    acc, l_i, m_i, bad = attend_keys(acc, l_i, m_i, bad, q, K_base, V_base, b, h, full_end, masked_end, offs_m,
                                     offs_n, offs_d, offs_dv, stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV,
                                     qk_scale, BLOCK_N=BLOCK_N, MASK_T=True, CAUSAL=CAUSAL, EVEN_D=EVEN_D,
                                     PRECISION=PRECISION, TMA=TMA, TRACE_M=TRACE_M, TRACE_L=TRACE_L,
                                     TRACE_ACC=TRACE_ACC, T_Q=T_Q, TRACE=TRACE)
    # Every row has keys (T_K > 0); l = 0 only where all its logits are -inf. LSE: contiguous [B, H, Tq].
    store_o_lse(O + b * stride_ob + h * stride_oh, LSE + pid_bh * T_Q, acc, l_i, m_i, (offs_m >= 0) & (T_K > 0),
                bad, offs_m, offs_dv, stride_ot, stride_od, T_Q, DV)


def fwd_smem(cfg, args) -> int:
    """Shared memory of a candidate: the q tile plus ``num_stages`` buffered (k, v) tiles in the inputs'
    dtype, plus ``launch.SMEM_MARGIN``. That is what sm_90 allocates (its products read every operand
    from shared memory); on sm_80/sm_89, whose ``mma.sync`` takes q from registers, Triton allocated
    less for every candidate (``scripts/kernel_resources.py --every-config --sm 80 89 90``)."""
    bd, bdv = args["BLOCK_D"], args["BLOCK_DV"]
    bm, bn = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"]
    return args["O"].element_size() * (bm * bd + cfg.num_stages * bn * (bd + bdv)) + launch.SMEM_MARGIN


def spill_width(out: str):
    """The head width a ``SPILLS`` table is read at, for a kernel whose output argument ``out`` has the
    inputs' dtype: ``max(BLOCK_D, BLOCK_DV)`` for half-precision inputs; 0 -- never pruned for spills --
    for float32, whose exact (ieee) products run on the CUDA cores (FMA), not the tensor cores: most
    float32 candidates spill (compiled for sm_90 at D = 128 and 256, up to 58 KB of spill stores), and
    a float32 launch on a GPU is the correctness path, not a fast one. Shared memory is checked for
    every dtype."""

    def width(args) -> int:
        return max(args["BLOCK_D"], args["BLOCK_DV"]) if args[out].element_size() == 2 else 0

    return width


def configs(shapes, blocks):
    """``triton.Config`` s of ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``, each with the pre-hook that
    sets the tensor descriptors' boxes to its tiles."""
    hook = launch.descriptor_blocks(blocks)
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s, pre_hook=hook)
            for bm, bn, w, s in shapes]


# The box of each descriptor argument: q [BLOCK_M, BLOCK_D], k [BLOCK_N, BLOCK_D], v [BLOCK_N, BLOCK_DV].
FWD_BLOCKS = {"Q": ("BLOCK_M", "BLOCK_D"), "K": ("BLOCK_N", "BLOCK_D"), "V": ("BLOCK_N", "BLOCK_DV")}

# The Triton tutorial's space (BLOCK_M 64/128, BLOCK_N 32..128, 4 or 8 warps) with 2 or 3 stages, BLOCK_N
# dividing BLOCK_M (asserted in the kernel). 128 x 128 with 2 stages is the D = 128 tiling that needs
# Hopper's shared memory (160 KB of tiles); the 2-stage 128 x 64 and 64 x 64 fit the 99 KB of an L4 at
# D = 128. The last two serve float32 at D = 256: 64 x 32 with one stage (128 KB of tiles: A100, H100)
# and 32 x 16 (64 KB: an L4); the last is what the pruner falls back to.
_FWD_CONFIGS = configs([(128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 2),
                        (64, 64, 4, 3), (64, 64, 4, 2), (64, 32, 4, 3), (64, 32, 4, 1), (32, 16, 4, 1)], FWD_BLOCKS)

# Register spills measured with ptxas -v at D = 64, 128, 256 (``scripts/kernel_report.py --spill-tables``:
# bf16 -- fp16 gives the same registers --, causal and not, both backward forms, on sm_90 through
# descriptors and through pointers): configuration -> the narrowest head block at which it spilled, per
# target family. 128 x 64 with 4 warps holds a [128, D] fp32 accumulator in 128
# threads: 255 registers and 164-272 B of spill stores at D = 128 on sm_80/sm_89, up to 232 B on
# sm_90; its 8-warp twin (138-244 registers at D = 128) takes its place. On sm_80/sm_89 (mma.sync) the
# 128 x 128 tiles spill at D = 128 (12-72 B) and every tile of 64 keys or more at D = 256 (4 B to
# 38 KB), leaving 64 x 32 there; on sm_90 (wgmma) the 128 x 128 tiles spill only at D = 256 through
# pointers (232-252 B; 251-252 registers and no spill through descriptors). The one-stage 32 x 16
# fallback spills 12 B on sm_90 at D = 64 and 256.
_FWD_SPILLS = {
    "sm80": {(64, 64, 4, 2): 256, (64, 64, 4, 3): 256, (128, 64, 4, 3): 128, (128, 64, 8, 2): 256,
             (128, 64, 8, 3): 256, (128, 128, 8, 2): 128, (128, 128, 8, 3): 128},
    "sm89": {(64, 64, 4, 2): 256, (64, 64, 4, 3): 256, (128, 64, 4, 3): 128, (128, 64, 8, 2): 256,
             (128, 64, 8, 3): 256, (128, 128, 8, 2): 128, (128, 128, 8, 3): 128},
    "sm90": {(32, 16, 4, 1): 64, (128, 64, 4, 3): 128, (128, 128, 8, 2): 256, (128, 128, 8, 3): 256},
}

_prune_fwd = launch.pruner(fwd_smem, _FWD_SPILLS, spill_width("O"), "LSE")
_flash_fwd = launch.autotuned(_flash_fwd_kernel, _FWD_CONFIGS, ["T_BUCKET", "D", "DV", "CAUSAL"], _prune_fwd,
                             name="flash.forward._flash_fwd")

# Under the interpreter: small tiles (it is slow and numpy-backed); BLOCK_N divides BLOCK_M.
INTERPRET_FWD = dict(BLOCK_M=32, BLOCK_N=16)


def length_bucket(T: int) -> int:
    """The autotuning key for a length: its power-of-two ceiling (at least 256), so that every new
    length does not trigger a new tuning run."""
    return max(256, triton.next_power_of_2(T))


def launch_tiles(kernel, grid, args: list, kwargs: dict, fixed: dict, blocks: dict) -> None:
    """``kernel[grid](*args, **kwargs)``: on a GPU through the autotuner (whose configurations set the
    descriptor boxes); under the interpreter with the ``fixed`` tiles, setting the boxes here."""
    if INTERPRET:
        kwargs = {**kwargs, **fixed}
        launch.descriptor_blocks(blocks)({**dict(zip(kernel.arg_names, args)), **kwargs})
    kernel[grid](*args, **kwargs)


def flash_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                            causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel. Inputs already validated by ``attnlib.softmax_attention``.

    ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; any strides. Returns ``(o, lse)``: ``o`` in q's dtype,
    ``lse`` a contiguous float32 ``[B, H, Tq]``. ``Dv = 0`` is allowed: ``o`` is empty but ``lse``
    (which does not depend on v) is still computed.
    """
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    launch.require_launchable(q, D, DV)
    if DV == 0:
        # The LSE does not depend on v: run on one zero value column (a stride-0 view, no copy) and
        # return an empty o. (Returning early here once gave a wrong lse.)
        o, lse = flash_attention_forward(q, k, v.new_zeros(1).expand(B, H, T_K, 1), scale=scale, causal=causal)
        return o[..., :0], lse
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    o = torch.empty(B, H, T_Q, DV, device=q.device, dtype=q.dtype)
    if B * H * T_Q == 0:
        return o, lse
    BLOCK_D, BLOCK_DV = launch.head_block(D), launch.head_block(DV)
    tma = launch.tma_device(q.device) and launch.tma_compatible(q, k, v)
    grid = lambda meta: (triton.cdiv(T_Q, meta["BLOCK_M"]), B * H)  # noqa: E731
    launch_tiles(_flash_fwd, grid,
                 [*launch.head_descriptors(tma, q, k, v), o, lse, None, None, None,
                  *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                  H, T_Q, T_K, D, DV, scale * LOG2E.value, length_bucket(max(T_Q, T_K))],
                 dict(BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, CAUSAL=causal, EVEN_D=(D == BLOCK_D and DV == BLOCK_DV),
                      PRECISION=softmax_precision(q.dtype), TMA=tma, TRACE=False),
                 INTERPRET_FWD, FWD_BLOCKS)
    return o, lse


def flash_attention_forward_traced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float,
                                   causal: bool, block_m: int, block_n: int):
    """The same kernel with ``TRACE`` on, at fixed tiles ``block_m x block_n`` and through pointer loads
    (no autotuning: the trace's layout depends on ``BLOCK_N``). For reading the kernel on small inputs,
    e.g. through the interpreter; ``attnbook.experiments.flash_walk`` validates the arguments.

    Returns ``(o, lse, m2, l, acc)``: the kernel's outputs, then the running state after each key tile,
    float32 ``[B, H, n_tiles, Tq]`` (``m2`` in base-2 units, ``l``) and ``[B, H, n_tiles, Tq, Dv]``
    (``acc``, unnormalised). A tile a program never visits (above the causal diagonal) stays NaN.
    """
    B, H, T_Q, D = q.shape
    T_K, DV = k.shape[2], v.shape[3]
    launch.require_launchable(q, D, DV)
    n_tiles = triton.cdiv(T_K, block_n)
    o = torch.empty(B, H, T_Q, DV, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    m2, l_run = (torch.full((B, H, n_tiles, T_Q), float("nan"), device=q.device) for _ in range(2))
    acc = torch.full((B, H, n_tiles, T_Q, DV), float("nan"), device=q.device)
    BLOCK_D, BLOCK_DV = launch.head_block(D), launch.head_block(DV)
    _flash_fwd_kernel[(triton.cdiv(T_Q, block_m), B * H)](
        q, k, v, o, lse, m2, l_run, acc, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, T_Q, T_K, D, DV, scale * LOG2E.value, length_bucket(max(T_Q, T_K)),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=BLOCK_D, BLOCK_DV=BLOCK_DV, CAUSAL=causal,
        EVEN_D=(D == BLOCK_D and DV == BLOCK_DV), PRECISION=softmax_precision(q.dtype), TMA=False, TRACE=True,
        num_warps=4, num_stages=1)
    return o, lse, m2, l_run, acc


__all__ = ["flash_attention_forward", "flash_attention_forward_traced"]
