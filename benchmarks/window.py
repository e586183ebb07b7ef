"""Sliding-window attention, forward and forward+backward: time against the window, beside causal attention
(attnlib's flash kernels and PyTorch SDPA, the anchor) and SDPA given the band as a mask, in the same run.

    python benchmarks/window.py                        # the full sweep (needs a CUDA GPU)
    python benchmarks/window.py --smoke --out /tmp/x   # a tiny CPU run (kernels only under TRITON_INTERPRET=1)

Sweep: B=4, H=16, T in {4096, 16384}, D=128, bf16, causal; windows 256, 1024, 4096 keys; passes ``fwd`` and
``fwd+bwd`` with peak memory (``_common.py``). Rows: "attnlib-window" (the Triton kernels, which visit only
the key tiles of each query tile's band), "sdpa-band" (PyTorch's fused attention with the band as a boolean
mask: what a PyTorch user writes; it still visits every tile), "attnlib-causal" and "sdpa-causal" (causal
attention over every key: the cost the window saves), and "torch-reference" (the masked reference; small T
only). Causal rows do not depend on the window: timed once per T. FLOPs = 4 * B * H * D * pairs, pairs the
(query, key) pairs on the band (``sum_i min(i + 1, window)``), times 3.5 for forward+backward.
Expected on a GPU: time roughly proportional to ``window / T`` for the window kernel, against a constant
for the causal rows and sdpa-band. Before any timing, the kernel's output and gradients must agree with
the float64 reference on a small problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlib
from attnlib import _backend
from attnlib.window import band, sliding_window_attention_reference
from benchmarks import _common

FWD_BWD_FLOP_FACTOR = 3.5
# Gradients go through P and dS rounded to the input dtype (as in FlashAttention): bf16 gradients sit
# near 1e-2 of relative RMS error. A wrong kernel is off by order 1.
GRAD_TOL = 6e-2


def band_pairs(T: int, window: int) -> int:
    """The causal band's (query, key) pairs: ``sum_{i < T} min(i + 1, window)``."""
    w = min(window, T)
    return w * (w + 1) // 2 + (T - w) * w


IMPLS = {
    "attnlib-window": lambda q, k, v, w, m: attnlib.sliding_window_attention(q, k, v, window=w, causal=True,
                                                                            backend="triton"),
    "sdpa-band": lambda q, k, v, w, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
    "attnlib-causal": lambda q, k, v, w, m: attnlib.softmax_attention(q, k, v, causal=True, backend="triton"),
    "sdpa-causal": lambda q, k, v, w, m: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "torch-reference": lambda q, k, v, w, m: attnlib.sliding_window_attention(q, k, v, window=w, causal=True,
                                                                             backend="torch"),
}
CAUSAL = ("attnlib-causal", "sdpa-causal")


def check_agreement(device, dtype_name) -> None:
    """The kernel's output and gradients against the float64 reference, at a window that cuts tiles."""
    dtype = _common.DTYPES[dtype_name]
    g = torch.Generator().manual_seed(0)
    T, window = (300, 37) if device.type == "cuda" else (40, 7)
    q, k, v, w = (torch.randn(1, 2, T, 64, generator=g).to(device) for _ in range(4))
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = sliding_window_attention_reference(*ref64, window=window, scale=64 ** -0.5, causal=True)
    want = [o_ref, *torch.autograd.grad((o_ref * w.double()).sum(), ref64)]
    xs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    o = IMPLS["attnlib-window"](*xs, window, None)
    got = [o, *torch.autograd.grad((o * w.to(dtype)).sum(), xs)]
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        _common.require_agreement(f"attnlib-window {name}", a, b.detach(), f"float64 reference ({dtype_name}, "
                                  f"window {window})", tol=2e-2 if name == "o" else GRAD_TOL)


def run(Ts, D, windows, dtype_name, B, H, passes, device, impls, out_dir) -> list[dict]:
    rows = []
    if "attnlib-window" in impls:
        check_agreement(device, dtype_name)
    todo = [(T, w) for T in Ts for w in windows]
    for T, window in _common.progress(todo, desc="sliding-window attention"):
        g = torch.Generator(device=device).manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D, device=device, generator=g, dtype=_common.DTYPES[dtype_name])
                   .requires_grad_() for _ in range(3))
        mask = band(T, T, window, causal=True, device=device) if "sdpa-band" in impls else None
        for pass_ in passes:
            for impl in impls:
                if impl in CAUSAL and window != windows[0]:
                    continue                      # causal attention does not depend on the window
                if impl == "torch-reference" and B * H * T * T * 4 > 4 * 2**30:
                    continue                      # the reference builds the [T, T] scores
                fn = IMPLS[impl]
                try:
                    m = _common.measure(lambda fn=fn, q=q, k=k, v=v, w=window, mask=mask: fn(q, k, v, w, mask),
                                        [q, k, v], pass_)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                pairs = band_pairs(T, T if impl in CAUSAL else window)
                flops = 4 * B * H * D * pairs * (FWD_BWD_FLOP_FACTOR if pass_ == "fwd+bwd" else 1)
                rows.append(dict(op="sliding_window_attention", impl=impl, dtype=dtype_name, B=B, H=H, T=T,
                                 D=D, causal=True, window=None if impl in CAUSAL else window,
                                 **m, tflops=flops / m["ms"] * 1e-9))
        del q, k, v
        _common.checkpoint(rows, file_op="sliding_window_attention", out_dir=out_dir, label=f"T{T} window {window}",
                           T=T, window=window)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    ap.add_argument("--passes", default="fwd,fwd+bwd")
    args = ap.parse_args()
    passes = args.passes.split(",")
    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes only to an explicit --out directory")
        impls = (["attnlib-window"] if _backend.INTERPRET else []) + ["sdpa-band", "sdpa-causal", "torch-reference"]
        rows = run([48], 16, [7, 48], "fp32", 1, 2, passes, torch.device("cpu"), impls, args.out)
    elif not torch.cuda.is_available():
        print("benchmarks/window.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        rows = run([4096, 16384], 128, [256, 1024, 4096], "bf16", 4, 16, passes, torch.device("cuda"), list(IMPLS),
                   args.out)
    _common.print_table(rows, ["impl", "T", "window", "pass", "ms", "tflops", "peak_mem_bytes"])
    path = _common.write_results(rows, op="sliding_window_attention", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
