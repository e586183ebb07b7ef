"""Softmax attention forward: attnlib's Triton kernel vs PyTorch SDPA vs a naive PyTorch version.

    python benchmarks/attention.py            # the full sweep (needs a CUDA GPU)
    python benchmarks/attention.py --smoke --out /tmp/x   # a tiny CPU run of the torch paths

Sweep: B=4, H=16, T in 512..16384, D in {64, 128}, causal and not, fp16 and bf16.
FLOPs = 4 * B * H * T^2 * D (two matmuls of 2*T^2*D each), halved when causal.
"naive" materialises the [T, T] scores (skipped when they would not fit in memory).
SDPA is called with its default dispatch (PyTorch picks its fastest backend, normally flash).
Target on an H100: attnlib >= 0.9x SDPA at T >= 4096.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import attnlib  # noqa: E402


def naive(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        T = s.shape[-1]
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


IMPLS = {
    "attnlib": lambda q, k, v, c: attnlib.softmax_attention(q, k, v, causal=c, backend="triton"),
    "sdpa": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
    "naive": naive,
}


def run(Ts, Ds, dtypes, causals, B, H, device, impls) -> list[dict]:
    rows = []
    for dtype_name in dtypes:
        for D in Ds:
            for causal in causals:
                for T in Ts:
                    g = torch.Generator(device=device).manual_seed(T + D)
                    q, k, v = (torch.randn(B, H, T, D, device=device, generator=g,
                                           dtype=_common.DTYPES[dtype_name]) for _ in range(3))
                    flops = 4 * B * H * T * T * D / (2 if causal else 1)
                    for impl in impls:
                        if impl == "naive" and B * H * T * T * 4 > 16 * 2**30:
                            continue  # the fp32 score matrix alone would exceed 16 GiB
                        try:
                            ms = _common.time_ms(lambda: IMPLS[impl](q, k, v, causal))
                        except torch.OutOfMemoryError:
                            torch.cuda.empty_cache()
                            continue
                        rows.append(dict(op="softmax_attention", impl=impl, dtype=dtype_name, B=B, H=H, T=T,
                                         D=D, causal=causal, ms=ms, tflops=flops / ms * 1e-9))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the torch implementations")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    args = ap.parse_args()
    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes only to an explicit --out directory")
        rows = run([64, 128], [16], ["fp32"], [False, True], 1, 2, "cpu", ["sdpa", "naive"])
    elif not torch.cuda.is_available():
        print("benchmarks/attention.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        rows = run([512, 1024, 2048, 4096, 8192, 16384], [64, 128], ["fp16", "bf16"], [False, True],
                   4, 16, "cuda", list(IMPLS))
    _common.print_table(rows, ["impl", "dtype", "D", "causal", "T", "ms", "tflops"])
    sdpa = {(r["dtype"], r["D"], r["causal"], r["T"]): r["ms"] for r in rows if r["impl"] == "sdpa"}
    ratios = [sdpa[(r["dtype"], r["D"], r["causal"], r["T"])] / r["ms"] for r in rows
              if r["impl"] == "attnlib" and r["T"] >= 4096 and (r["dtype"], r["D"], r["causal"], r["T"]) in sdpa]
    if ratios:
        print(f"attnlib speed / SDPA speed at T >= 4096: min {min(ratios):.2f}x, max {max(ratios):.2f}x "
              "(target >= 0.9x)")
    path = _common.write_results(rows, op="softmax_attention", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
