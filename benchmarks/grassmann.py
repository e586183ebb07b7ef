"""Grassmann mixing: attnlib's fused Triton kernel vs the PyTorch references vs SDPA at matched width.

    python benchmarks/grassmann.py                         # the full sweep (needs a CUDA GPU)
    python benchmarks/grassmann.py --smoke --out /tmp/x    # a tiny CPU run of the torch paths

What is timed, for ``z [B, L, r]`` and ``W [d, C(r,2)]`` (the paper's d = 256, r = 32, offsets
1, 2, 4, 8, 12, 16), forward ("fwd") and forward + backward ("fwd+bwd"):

* ``attnlib``          -- ``plucker_projection(..., backend="triton")``: the fused kernel;
* ``torch_features``   -- the reference that builds the ``[B, L, |W|, C]`` coordinates;
* ``torch_collapsed``  -- the kernel's algorithm written in PyTorch (no ``[B, L, |W|, C]`` tensor);
* ``sdpa``             -- causal ``F.scaled_dot_product_attention`` with ``H`` heads of ``d / H``
  (the same model width d), default dispatch.

L from 512 to 65536. Rows follow ``benchmarks/_common.py``'s schema plus ``pass``, ``peak_mem_bytes``
(CUDA peak allocated during the call; None on the CPU), ``r`` and ``n_offsets``. ``tflops`` counts
``2 B L r^2 d`` for the Grassmann rows (the projection in the kernel's order; times 3 with the
backward) and ``2 B H L^2 D`` for causal SDPA (times 3.5 with the backward) -- a rate for
comparison between rows of one op, not a measure of useful work across ops.
Goal (issue 15): attnlib >= 3x torch_features and linear in L; the crossover with SDPA measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from attnlib.grassmann import n_pairs, plucker_projection, plucker_projection_reference
from benchmarks import _common

OFFSETS = (1, 2, 4, 8, 12, 16)


def _grassmann(mode, backend):
    def fn(z, W):
        return plucker_projection(z, W, OFFSETS, mode=mode, backend=backend)
    return fn


GRASSMANN = {
    "attnlib": _grassmann("features", "triton"),
    "torch_features": _grassmann("features", "torch"),
    "torch_collapsed": _grassmann("collapsed", "torch"),
}


def _measure(fn, args, backward: bool, device: str) -> tuple[float, int | None]:
    def call():
        out = fn(*args)
        if backward:
            out.backward(torch.ones_like(out))
        return out
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = None
    return _common.time_ms(call), peak


def run(Ls, dtypes, B, d, r, H, device, impls, passes) -> list[dict]:
    rows = []
    for dtype_name in dtypes:
        dtype = _common.DTYPES[dtype_name]
        for L in Ls:
            g = torch.Generator(device=device).manual_seed(L)
            z = torch.randn(B, L, r, device=device, generator=g).to(dtype)
            W = (torch.randn(d, n_pairs(r), device=device, generator=g) / n_pairs(r) ** 0.5).to(dtype)
            q, k, v = (torch.randn(B, H, L, d // H, device=device, generator=g).to(dtype) for _ in range(3))
            if "attnlib" in impls and L == Ls[0]:
                ref = plucker_projection_reference(z.double(), W.double(), OFFSETS)
                _common.require_agreement("attnlib", GRASSMANN["attnlib"](z, W), ref, "float64 reference",
                                          tol=2e-2 if dtype != torch.float32 else 1e-4)
            for pas in passes:
                backward = pas == "fwd+bwd"
                for impl in impls:
                    if impl == "sdpa":
                        args = [t.requires_grad_(backward) for t in (q, k, v)]
                        fn = lambda a, b_, c: F.scaled_dot_product_attention(a, b_, c, is_causal=True)  # noqa: E731
                        flops = 2 * B * H * L * L * (d // H) * (3.5 if backward else 1.0)
                        shape = dict(H=H, D=d // H)
                    else:
                        args = [z.detach().requires_grad_(backward), W.detach().requires_grad_(backward)]
                        fn = GRASSMANN[impl]
                        flops = 2 * B * L * r * r * d * (3 if backward else 1)
                        shape = dict(H=1, D=d)
                    try:
                        ms, peak = _measure(fn, args, backward, device)
                    except torch.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        continue
                    op = "sdpa_causal" if impl == "sdpa" else "grassmann_mixing"
                    rows.append(dict(op=op, impl=impl, dtype=dtype_name, B=B, T=L, causal=True, ms=ms,
                                     tflops=flops / ms * 1e-9, peak_mem_bytes=peak, r=r, n_offsets=len(OFFSETS),
                                     width=d, **{"pass": pas}, **shape))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the torch implementations")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    ap.add_argument("--L", default="512,1024,2048,4096,8192,16384,32768,65536")
    ap.add_argument("--dtypes", default="bf16,fp32")
    args = ap.parse_args()
    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes only to an explicit --out directory")
        rows = run([64, 128], ["fp32"], 1, 32, 6, 2, "cpu", ["torch_features", "torch_collapsed", "sdpa"],
                   ["fwd", "fwd+bwd"])
    elif not torch.cuda.is_available():
        print("benchmarks/grassmann.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        Ls = [int(x) for x in args.L.split(",")]
        rows = []
        for L in Ls:                          # one length at a time, rewriting the JSON after each
            rows += run([L], args.dtypes.split(","), 1, 256, 32, 4, "cuda", ["attnlib", "torch_features",
                                                                            "torch_collapsed", "sdpa"],
                        ["fwd", "fwd+bwd"])
            _common.checkpoint(rows, file_op="grassmann_mixing", out_dir=args.out, label=f"L={L}", T=L)
    _common.print_table(rows, ["op", "impl", "dtype", "pass", "T", "ms", "peak_mem_bytes"])
    path = _common.write_results(rows, op="grassmann_mixing", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
