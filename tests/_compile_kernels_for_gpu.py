"""Compile every softmax / block-sparse / sliding-window Triton kernel for an NVIDIA GPU (sm_90) on this machine, no GPU
needed: Triton's front end, its MLIR passes and the bundled ptxas all run on the CPU. Catches what the
interpreter lets through (globals that are not constexpr, layouts or shapes the compiler refuses, shared
memory over the limit). The flash kernels are compiled both ways they load their tiles: pointers, and
tensor descriptors, whose PTX must then hold the TMA copy (``cp.async.bulk.tensor``). Run with
TRITON_INTERPRET unset (``tests/test_kernels_compile.py`` does it)."""

import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from attnlib.kernels.block_sparse import backward as bs_bwd
from attnlib.kernels.block_sparse import forward as bs_fwd
from attnlib.kernels.common import online_softmax
from attnlib.kernels.flash import backward as flash_bwd
from attnlib.kernels.flash import forward as flash_fwd
from attnlib.kernels.window import backward as window_bwd
from attnlib.kernels.window import forward as window_fwd

TARGET = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 227 * 1024                       # H100: shared memory per block


def compile_kernel(fn, pointers: dict, constexprs: dict, floats=(), num_warps=4, num_stages=2):
    sig = {n: "constexpr" if n in constexprs else pointers.get(n, "fp32" if n in floats else "i32")
           for n in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})


def desc(rows: int, cols: int) -> str:
    """A tensor-descriptor argument: fp16, box [1, 1, rows, cols] of a [B, H, T, D] tensor."""
    return f"tensordesc<fp16[1,1,{rows},{cols}]>"


def main() -> int:
    half, f32, i32 = "*fp16", "*fp32", "*i32"
    tiles = dict(BLOCK_D=64, BLOCK_DV=64, CAUSAL=True, PRECISION="tf32")
    fwd_args = dict(Q=half, K=half, V=half, O=half, LSE=f32)
    bwd_args = dict(Q=half, K=half, V=half, DO=half, LSE=f32, DELTA=f32, DK=half, DV_OUT=half)
    fwd_tma = dict(fwd_args, Q=desc(128, 64), K=desc(64, 64), V=desc(64, 64))
    bwd_tma = dict(bwd_args, Q=desc(32, 64), K=desc(128, 64), V=desc(128, 64), DO=desc(32, 64))
    dkdv = dict(BLOCK_M=32, BLOCK_N=128, EVEN_D=False, **tiles)
    untraced = dict(TRACE=False, TRACE_M=None, TRACE_L=None, TRACE_ACC=None)   # as every production launch
    fwd = dict(BLOCK_M=128, BLOCK_N=64, EVEN_D=False, **untraced, **tiles)
    window_tiles = dict(BLOCK_M=128, BLOCK_N=64, EVEN_D=False, **tiles)
    cases = {
        "flash forward": (flash_fwd._flash_fwd_kernel, fwd_args,
                          dict(fwd, TMA=False), ("qk_scale",), 4, 3),
        "flash forward, TMA": (flash_fwd._flash_fwd_kernel, fwd_tma,
                               dict(fwd, TMA=True), ("qk_scale",), 8, 3),
        "flash dK/dV": (flash_bwd._flash_bwd_dkdv_kernel, bwd_args,
                        dict(dkdv, DQ=None, TMA=False, ATOMIC_DQ=False), ("qk_scale", "sm_scale"), 8, 3),
        "flash fused dK/dV/dQ": (flash_bwd._flash_bwd_dkdv_kernel, dict(bwd_args, DQ=f32),
                                 dict(dkdv, TMA=False, ATOMIC_DQ=True), ("qk_scale", "sm_scale"), 8, 3),
        "flash fused dK/dV/dQ, TMA": (flash_bwd._flash_bwd_dkdv_kernel, dict(bwd_tma, DQ=f32),
                                      dict(dkdv, TMA=True, ATOMIC_DQ=True), ("qk_scale", "sm_scale"), 8, 3),
        "flash dQ": (flash_bwd._flash_bwd_dq_kernel,
                     dict(Q=half, K=half, V=half, DO=half, LSE=f32, DELTA=f32, DQ=half),
                     dict(BLOCK_M=128, BLOCK_N=32, EVEN_D=False, TMA=False, **tiles), ("qk_scale", "sm_scale"), 8, 3),
        "backward delta": (online_softmax.softmax_bwd_preprocess_kernel, dict(O=half, DO=half, DLSE=f32, DELTA=f32),
                           dict(BLOCK_M=64, BLOCK_DV=64, HAS_DLSE=True), (), 4, 2),
        "block-sparse forward": (bs_fwd._block_sparse_fwd_kernel,
                                 dict(Q=half, K=half, V=half, O=half, LSE=f32, COUNTS=i32, INDICES=i32),
                                 dict(BS=128, BLOCK_M=128, BLOCK_N=64, **tiles), ("qk_scale",), 8, 2),
        "block-sparse dK/dV": (bs_bwd._block_sparse_bwd_dkdv_kernel,
                               dict(Q=half, K=half, V=half, DO=half, LSE=f32, DELTA=f32, DK=half, DV_OUT=half,
                                    COUNTS_T=i32, INDICES_T=i32),
                               dict(BS=128, BLOCK_M=32, BLOCK_N=64, **tiles), ("qk_scale", "sm_scale"), 4, 2),
        "window forward": (window_fwd._window_fwd_kernel, fwd_args, dict(window_tiles, TMA=False), ("qk_scale",), 4, 3),
        "window forward, TMA": (window_fwd._window_fwd_kernel, fwd_tma, dict(window_tiles, TMA=True), ("qk_scale",),
                                8, 3),
        "window dK/dV": (window_bwd._window_bwd_dkdv_kernel, bwd_args,
                         dict(dkdv, TMA=False), ("qk_scale", "sm_scale"), 8, 3),
        "window dK/dV, TMA": (window_bwd._window_bwd_dkdv_kernel, bwd_tma,
                              dict(dkdv, TMA=True), ("qk_scale", "sm_scale"), 8, 3),
        "window dQ": (window_bwd._window_bwd_dq_kernel,
                      dict(Q=half, K=half, V=half, DO=half, LSE=f32, DELTA=f32, DQ=half),
                      dict(BLOCK_M=128, BLOCK_N=32, EVEN_D=False, TMA=False, **tiles), ("qk_scale", "sm_scale"), 8, 3),
        "block-sparse dQ": (bs_bwd._block_sparse_bwd_dq_kernel,
                            dict(Q=half, K=half, V=half, DO=half, LSE=f32, DELTA=f32, DQ=half, COUNTS=i32,
                                 INDICES=i32),
                            dict(BS=128, BLOCK_M=64, BLOCK_N=32, **tiles), ("qk_scale", "sm_scale"), 4, 2),
    }
    failed = 0
    for name, (fn, pointers, constexprs, floats, warps, stages) in cases.items():
        try:
            kernel = compile_kernel(fn, pointers, constexprs, floats, warps, stages)
            shared = kernel.metadata.shared
            tma = "cp.async.bulk.tensor" in kernel.asm["ptx"]
            ok = shared <= SMEM_LIMIT and tma == constexprs.get("TMA", False)
            print(f"{'ok' if ok else 'FAIL'} {name}: {shared} bytes of shared memory, TMA copies: {tma}")
            failed += not ok
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
