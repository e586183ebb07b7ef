"""ANNA forward (chapter 5): time and peak memory against sequence length, beside SDPA.

    python benchmarks/anna.py                 # the full sweep (needs a CUDA GPU)
    python benchmarks/anna.py --smoke --out /tmp/x   # a tiny CPU run of the torch paths

Sweep: B=1, H=8, T from 1024 to 131072, D in {64, 128}, bf16, causal and not; ANNA with l=8 tables of
z=8 SimHash bits. Rows: "attnlib-anna" (hash kernel -> torch sort/searchsorted/cumsum -> gather
kernel), "torch-sdpa" (``torch.nn.functional.scaled_dot_product_attention``, the dense yardstick),
"torch-reference" (ANNA's torch path). ``flops`` counts ANNA's arithmetic (hashing 2 * 2T * D * l * z,
gathering 2 * l * T * Dv) and SDPA's (4 T^2 D, half when causal); ``peak_mib`` is
``torch.cuda.max_memory_allocated`` during the call. Before timing, the kernel is checked against the
reference at a small T. The issue's goal (log-log slope <= 1.2, >= 10x faster than SDPA at T=65536) is
printed, never asserted.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlib
from benchmarks import _common

L, Z = 8, 8


def _anna(backend):
    return lambda q, k, v, causal: attnlib.anna_attention(q, k, v, n_tables=L, n_bits=Z, causal=causal,
                                                          backend=backend)


IMPLS = {
    "attnlib-anna": _anna("triton"),
    "torch-reference": _anna("torch"),
    "torch-sdpa": lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
}


def _flops(impl: str, B, H, T, D, causal) -> float:
    if impl == "torch-sdpa":
        return 4 * B * H * T * T * D * (0.5 if causal else 1.0)
    return B * H * (2 * 2 * T * D * L * Z + 2 * L * T * D)


def run(Ts, Ds, dtype_name, B, H, device, impls) -> list[dict]:
    rows = []
    dtype = _common.DTYPES[dtype_name]
    if device == "cuda" and "attnlib-anna" in impls:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 999, 64, generator=g).cuda() for _ in range(3))
        ref = attnlib.anna_attention(q.double(), k.double(), v.double(), n_tables=L, n_bits=Z, backend="torch",
                                     causal=False)
        _common.require_agreement("attnlib-anna", _anna("triton")(q, k, v, False), ref, "the float64 reference")
    for D in Ds:
        for T in Ts:
            g = torch.Generator().manual_seed(T)
            q, k, v = (torch.randn(B, H, T, D, generator=g).to(device=device, dtype=dtype) for _ in range(3))
            for causal in (False, True):
                for impl in impls:
                    if impl == "torch-reference" and T > 16384:
                        continue                  # the reference's gathers are slow; the shape is enough
                    fn = IMPLS[impl]
                    try:
                        if device == "cuda":
                            torch.cuda.reset_peak_memory_stats()
                        ms = _common.time_ms(lambda fn=fn: fn(q, k, v, causal))
                        peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
                    except torch.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        continue
                    fl = _flops(impl, B, H, T, D, causal)
                    rows.append(dict(op="anna_attention", impl=impl, dtype=dtype_name, B=B, H=H, T=T, D=D,
                                     causal=causal, n_tables=L, n_bits=Z, ms=ms, tflops=fl / ms * 1e-9,
                                     peak_mib=peak))
    return rows


def summarise(rows: list[dict]) -> None:
    """Log-log slope of time against T per (impl, D, causal), and the speed-up over SDPA at T=65536."""
    keys = sorted({(r["impl"], r["D"], r["causal"]) for r in rows})
    for impl, D, causal in keys:
        pts = [(r["T"], r["ms"]) for r in rows if (r["impl"], r["D"], r["causal"]) == (impl, D, causal)]
        big = [(t, ms) for t, ms in pts if t >= 8192] or pts
        if len(big) >= 2:
            (t0, m0), (t1, m1) = big[0], big[-1]
            print(f"[slope] {impl} D={D} causal={causal}: {math.log(m1 / m0) / math.log(t1 / t0):.2f} "
                  f"(T {t0}..{t1})")
    for D in sorted({r["D"] for r in rows}):
        for causal in (False, True):
            at = {r["impl"]: r["ms"] for r in rows if r["T"] == 65536 and r["D"] == D and r["causal"] == causal}
            if "attnlib-anna" in at and "torch-sdpa" in at:
                print(f"[speed-up] D={D} causal={causal} at T=65536: SDPA / ANNA = "
                      f"{at['torch-sdpa'] / at['attnlib-anna']:.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the torch implementations")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    args = ap.parse_args()
    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes only to an explicit --out directory")
        rows = run([128, 256], [16], "fp32", 1, 2, "cpu", ["torch-reference", "torch-sdpa"])
    elif not torch.cuda.is_available():
        print("benchmarks/anna.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        rows = []
        Ts = [1024 * 2**i for i in range(8)]                       # 1024 .. 131072
        for D in (64, 128):
            rows += run(Ts, [D], "bf16", 1, 8, "cuda", ["attnlib-anna", "torch-sdpa", "torch-reference"])
            _common.checkpoint(rows, file_op="anna_attention", out_dir=args.out, label=f"D={D}", D=D)
    _common.print_table(rows, ["impl", "T", "D", "causal", "ms", "peak_mib"])
    summarise(rows)
    path = _common.write_results(rows, op="anna_attention", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
