"""Softmax attention, forward and forward+backward: attnlib's Triton kernels vs PyTorch SDPA (the anchor,
timed in the same run) vs a naive PyTorch version.

    python benchmarks/attention.py                        # the full sweep (needs a CUDA GPU)
    python benchmarks/attention.py --smoke --out /tmp/x   # a tiny CPU run (attnlib only under TRITON_INTERPRET=1)

Sweep (defaults): B=4, H=16, T in 1024..16384, D in {64, 128}, causal and not, bf16 and fp16, plus the
long shape B=1 H=8 T=65536 D=128; each shape in two passes, ``fwd`` and ``fwd+bwd`` (see
``_common.py``: the backward is ``torch.autograd.grad`` of q, k, v for a fixed output gradient), with
the peak memory of one call. FLOPs: forward ``4 B H T^2 D`` (two matmuls of ``2 T^2 D``), forward +
backward 3.5x that (the backward's five matmuls, the usual FlashAttention convention); halved when
causal. "naive" materialises the ``[T, T]`` scores (skipped when they would not fit in memory).
SDPA runs with PyTorch's default dispatch; the kernel it picked is recorded in the JSON
(``sdpa_kernel``, from a profiler trace). Before any timing, every implementation's output and
gradients must agree with a float64 reference on a small problem (the run stops otherwise).
Targets on an H100 (issue 13): forward >= 0.9x SDPA, forward+backward >= 0.8x SDPA with peak memory
within 1.2x of SDPA's, at T >= 4096.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import attnlib
from attnlib import _backend
from attnlib.attention import softmax_attention_reference
from benchmarks import _common


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
FWD_BWD_FLOP_FACTOR = 3.5           # forward 2 matmuls + backward 5 matmuls of the same size
# Gradients go through P and dS rounded to the input dtype (as in FlashAttention): bf16 gradients sit
# near 1e-2 of relative RMS error. A wrong kernel is off by order 1.
GRAD_TOL = 6e-2


def sdpa_kernel_name(device) -> str | None:
    """The CUDA kernel SDPA dispatches to (flash, cuDNN, memory-efficient...), from a profiler trace."""
    if device.type != "cuda":
        return None
    try:
        from torch.profiler import ProfilerActivity, profile
        q = torch.randn(1, 2, 256, 64, device=device, dtype=torch.bfloat16)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            torch.cuda.synchronize()
        names = [e.key for e in prof.key_averages() if "attention" in e.key.lower() or "fmha" in e.key.lower()
                 or "flash" in e.key.lower()]
        return names[0][:120] if names else "unknown"
    except Exception as exc:  # noqa: BLE001 - the name is a note, not a result
        return f"unknown ({type(exc).__name__})"


def check_agreement(impls, device, dtype_name) -> None:
    """Output and gradients of every implementation against the float64 reference, causal and not."""
    dtype = _common.DTYPES[dtype_name]
    g = torch.Generator().manual_seed(0)
    T = 200 if device.type == "cuda" else 33            # the CPU smoke run goes through the interpreter
    q, k, v = (torch.randn(1, 2, T, 64, generator=g).to(device) for _ in range(3))
    w = torch.randn(1, 2, T, 64, generator=g).to(device)
    for causal in (False, True):
        ref64 = [t.double().requires_grad_() for t in (q, k, v)]
        o_ref, _ = softmax_attention_reference(*ref64, scale=64 ** -0.5, causal=causal)
        want = [o_ref, *torch.autograd.grad((o_ref * w.double()).sum(), ref64)]
        for impl in impls:
            xs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
            o = IMPLS[impl](*xs, causal)
            got = [o, *torch.autograd.grad((o * w.to(dtype)).sum(), xs)]
            for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
                _common.require_agreement(f"{impl} {name}", a, b.detach(),
                                          f"float64 reference ({dtype_name}, causal={causal})",
                                          tol=2e-2 if name == "o" else GRAD_TOL)


def run(shapes, dtypes, causals, passes, device, impls, out_dir) -> list[dict]:
    rows = []
    todo = [(d, c, s) for d in dtypes for c in causals for s in shapes]
    for dtype_name in dtypes:
        check_agreement(impls, device, dtype_name)
    for dtype_name, causal, (B, H, T, D) in _common.progress(todo, desc="softmax attention"):
        g = torch.Generator(device=device).manual_seed(T + D)
        q, k, v = (torch.randn(B, H, T, D, device=device, generator=g, dtype=_common.DTYPES[dtype_name])
                   .requires_grad_() for _ in range(3))
        for pass_ in passes:
            flops = 4 * B * H * T * T * D / (2 if causal else 1) * (FWD_BWD_FLOP_FACTOR if pass_ == "fwd+bwd" else 1)
            for impl in impls:
                if impl == "naive" and B * H * T * T * 4 * (3 if pass_ == "fwd+bwd" else 1) > 16 * 2**30:
                    continue  # the fp32 score matrices alone would exceed 16 GiB
                try:
                    fn = IMPLS[impl]
                    m = _common.measure(lambda fn=fn, q=q, k=k, v=v: fn(q, k, v, causal), [q, k, v], pass_)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                rows.append(dict(op="softmax_attention", impl=impl, dtype=dtype_name, B=B, H=H, T=T, D=D,
                                 causal=causal, **m, tflops=flops / m["ms"] * 1e-9))
        del q, k, v
        _common.checkpoint(rows, file_op="softmax_attention", out_dir=out_dir,
                           label=f"{dtype_name} causal={causal} B{B} H{H} T{T} D{D}",
                           dtype=dtype_name, causal=causal, B=B, H=H, T=T, D=D)
    return rows


def summarise(rows) -> None:
    key = lambda r: (r["dtype"], r["causal"], r["B"], r["H"], r["T"], r["D"], r["pass"])  # noqa: E731
    sdpa = {key(r): r for r in rows if r["impl"] == "sdpa"}
    for pass_, target in (("fwd", 0.9), ("fwd+bwd", 0.8)):
        pairs = [(sdpa[key(r)], r) for r in rows if r["impl"] == "attnlib" and r["pass"] == pass_
                 and r["T"] >= 4096 and key(r) in sdpa]
        if not pairs:
            continue
        speed = [s["ms"] / a["ms"] for s, a in pairs]
        print(f"{pass_}: attnlib speed / SDPA speed at T >= 4096: min {min(speed):.2f}x, max {max(speed):.2f}x "
              f"(target >= {target}x)")
        mem = [a["peak_mem_bytes"] / s["peak_mem_bytes"] for s, a in pairs
               if a["peak_mem_bytes"] is not None and s["peak_mem_bytes"]]
        if mem:
            print(f"{pass_}: attnlib peak memory / SDPA's: max {max(mem):.2f}x"
                  + (" (target <= 1.2x)" if pass_ == "fwd+bwd" else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    _common.add_sweep_arguments(ap, dtypes="bf16,fp16")
    ap.set_defaults(T="1024,2048,4096,8192,16384")
    ap.add_argument("--passes", default="fwd,fwd+bwd")
    ap.add_argument("--causal", default="false,true")
    ap.add_argument("--long", default="1,8,65536,128", help="one extra B,H,T,D shape ('' for none)")
    args = ap.parse_args()
    passes = args.passes.split(",")
    causals = [c.strip().lower() == "true" for c in args.causal.split(",")]
    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes only to an explicit --out directory")
        # The Triton kernels run on the CPU only through the interpreter (set TRITON_INTERPRET=1).
        impls = (["attnlib"] if _backend.INTERPRET else []) + ["sdpa", "naive"]
        rows = run([(1, 2, 24, 16)], ["fp32"], [False, True], passes, torch.device("cpu"), impls, args.out)
    elif not torch.cuda.is_available():
        print("benchmarks/attention.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        device = torch.device("cuda")
        shapes = [(args.B, args.H, int(T), int(D)) for D in args.D.split(",") for T in args.T.split(",")]
        if args.long:
            shapes.append(tuple(int(x) for x in args.long.split(",")))
        note = sdpa_kernel_name(device)
        print(f"SDPA dispatches to: {note}")
        rows = run(shapes, args.dtypes.split(","), causals, passes, device, list(IMPLS), args.out)
        for r in rows:
            if r["impl"] == "sdpa":
                r["sdpa_kernel"] = note
    _common.print_table(rows, ["impl", "dtype", "B", "H", "D", "causal", "T", "pass", "ms", "tflops",
                               "peak_mem_bytes"])
    summarise(rows)
    path = _common.write_results(rows, op="softmax_attention", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
