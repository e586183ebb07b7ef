"""Causal linear attention, forward and forward+backward: attnlib's chunked Triton kernels vs fla vs
the torch reference vs SDPA, with peak memory.

    python benchmarks/linear.py                    # on a CUDA GPU: issue 13's shapes, JSON into results/
    python benchmarks/linear.py --shapes sweep     # the T x D sweep at --B, --H
    python benchmarks/linear.py --smoke --out DIR  # anywhere: a tiny CPU run of the torch paths

Implementations (all causal, no feature map, no normaliser, scale 1/sqrt(D)):

* ``attnlib``         -- ``attnlib.linear_attention(..., mode="chunk", backend="triton")``, chunk 64:
  forward and backward kernels (``attnlib/kernels/linear/``).
* ``fla``             -- ``fla.ops.linear_attn.chunk_linear_attn(..., normalize=False)`` from the
  ``flash-linear-attention`` package, the anchor, in the same run (layout ``[B, T, H, D]``: the
  transposes are made *outside* the timed region). Skipped with a message when ``fla`` cannot be imported.
* ``torch_reference`` -- ``attnlib.linear_attention(..., mode="chunk", backend="torch")`` (float32
  arithmetic; a Python loop over chunks). Forward only on a GPU.
* ``sdpa``            -- ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``: the
  softmax attention that linear attention replaces.

Each row has ``"pass"``: ``"fwd"`` (inputs without gradients) or ``"fwd+bwd"`` (``q, k, v`` require
gradients; one forward and ``torch.autograd.grad`` of all three against a fixed random ``dO``), and
``"peak_mem_bytes"``: ``torch.cuda.max_memory_allocated`` during one such call, inputs included --
both layouts' copies, the same for every implementation of a shape, so compare differences (None on
the CPU). Before timing, the kernels' outputs *and gradients* are checked against a float64
reference on a small problem: a fast wrong kernel is not a result.

FLOP counts for the ``tflops`` column (multiply-adds count 2), forward:

* linear attention, chunk C: per chunk ``Q K^T`` (C x C x D), ``A V`` (C x C x Dv), ``Q S`` and
  ``K^T V`` (C x D x Dv each): ``2 B H T (C D + C Dv + 2 D Dv)`` = ``4 B H T D (C + D)`` for Dv = D;
* causal softmax attention: ``2 B H T^2 D``.

Forward+backward rows count 3x the forward (the usual convention: the backward does about twice the
forward's products). Compare implementations of the same op by ``tflops`` or ``ms``, and linear
against softmax by ``ms``.
"""

from __future__ import annotations

import argparse
import functools
import sys

import torch
import torch.nn.functional as F

import attnlib
from benchmarks._common import (
    ANCHOR_SHAPES,
    DTYPES,
    add_sweep_arguments,
    checkpoint,
    measure,
    print_table,
    require_agreement,
    write_results,
)

CHUNK = 64
# Issue 13's shapes: (B, H, T, D). The first four are its forward table, the last its fwd+bwd shape;
# both passes run on all of them.
ISSUE_SHAPES = list(ANCHOR_SHAPES)
PASSES = ("fwd", "fwd+bwd")


def linear_flops(B, H, T, D, C=CHUNK):
    return 4 * B * H * T * D * (C + D)


def sdpa_flops(B, H, T, D):
    return 2 * B * H * T * T * D


def load_fla():
    try:
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception as exc:  # noqa: BLE001 - any import failure means: skip fla
        print(f"[skip] fla: not importable ({type(exc).__name__}: {exc}); "
              "pip install flash-linear-attention to include it")
        return None
    import inspect
    params = inspect.signature(chunk_linear_attn).parameters
    extra = {"head_first": False} if "head_first" in params else {}

    def run(q, k, v):                                          # q, k, v: [B, T, H, D]
        return chunk_linear_attn(q, k, v, normalize=False, **extra)[0]
    return run


def impls(fla_fn, *, smoke, pass_):
    """``{name: (fn, layout)}``; ``fn`` takes (q, k, v) in ``layout`` ("bhtd" ours, "bthd" fla's)."""
    out = {
        "attnlib": (functools.partial(attnlib.linear_attention, causal=True, mode="chunk", chunk_size=CHUNK,
                                      backend="triton"), "bhtd"),
        "torch_reference": (functools.partial(attnlib.linear_attention, causal=True, mode="chunk", chunk_size=CHUNK,
                                              backend="torch"), "bhtd"),
        "sdpa": (functools.partial(F.scaled_dot_product_attention, is_causal=True), "bhtd"),
    }
    if smoke:
        del out["attnlib"]                                     # no GPU: the kernel cannot run compiled
    elif pass_ == "fwd+bwd":
        del out["torch_reference"]                             # a Python loop's autograd: not a contender
    if fla_fn is not None and not smoke:
        out["fla"] = (fla_fn, "bthd")
    return out


def check_agreement(fla_fn, device, dtype):
    """Before timing: outputs and gradients of attnlib's kernels (and fla) against float64."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 64, generator=g).to(device, dtype) for _ in range(3))
    do = torch.randn(1, 2, 300, 64, generator=g).to(device, dtype)
    ins64 = [x.double().requires_grad_() for x in (q, k, v)]
    ref = attnlib.linear_attention(*ins64, backend="torch", causal=True)
    ref_grads = torch.autograd.grad(ref, ins64, do.double())
    runs = {"attnlib": lambda a, b, c: attnlib.linear_attention(a, b, c, backend="triton", causal=True)}
    if fla_fn is not None:
        runs["fla"] = lambda a, b, c: fla_fn(*(x.transpose(1, 2) for x in (a, b, c))).transpose(1, 2)
    tag = str(dtype).replace("torch.", "")
    for name, fn in runs.items():
        ins = [x.clone().requires_grad_() for x in (q, k, v)]
        o = fn(*ins)
        grads = torch.autograd.grad(o, ins, do)
        require_agreement(name, o, ref, f"float64 reference ({tag})")
        for gname, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
            require_agreement(f"{name} {gname}", a, b, f"float64 reference ({tag})", tol=5e-2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sweep_arguments(ap, dtypes="bf16")
    ap.add_argument("--shapes", default="issue", choices=("issue", "sweep"),
                    help="issue: issue 13's (B, H, T, D) list; sweep: every --T x --D at --B, --H")
    ap.add_argument("--passes", default="fwd,fwd+bwd")
    args = ap.parse_args(argv)

    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes JSON only to a directory given with --out")
        device = torch.device("cpu")
        shapes, dtypes = [(1, 2, 128, 16), (1, 2, 256, 16)], ["fp32"]
    else:
        if not torch.cuda.is_available():
            print("benchmarks/linear.py needs a CUDA GPU (Triton kernels, fla, cuBLAS). "
                  "Nothing to measure here; use --smoke --out DIR for a CPU smoke run.")
            return 0
        device = torch.device("cuda")
        shapes = (ISSUE_SHAPES if args.shapes == "issue" else
                  [(args.B, args.H, int(t), int(d)) for d in args.D.split(",") for t in args.T.split(",")])
        dtypes = args.dtypes.split(",")
    passes = args.passes.split(",")

    fla_fn = None if args.smoke else load_fla()
    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        if not args.smoke:
            check_agreement(fla_fn, device, dtype)
        for B, H, T, D in shapes:
            for pass_ in passes:
                bwd = pass_ == "fwd+bwd"
                q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype, requires_grad=bwd)
                           for _ in range(3))
                layouts = {"bhtd": (q, k, v)}
                if fla_fn is not None:                         # fla's layout, made outside the timed region
                    layouts["bthd"] = tuple(x.detach().transpose(1, 2).contiguous().requires_grad_(bwd)
                                            for x in (q, k, v))
                for name, (fn, layout) in impls(fla_fn, smoke=args.smoke, pass_=pass_).items():
                    ins = layouts[layout]
                    wrt = [x for x in ins if isinstance(x, torch.Tensor) and x.requires_grad]
                    try:
                        m = measure(functools.partial(fn, *ins), wrt, pass_)
                        ms, peak = m["ms"], m["peak_mem_bytes"]
                    except torch.cuda.OutOfMemoryError:
                        print(f"[skip] {name} {pass_} B={B} H={H} T={T} D={D}: out of memory")
                        torch.cuda.empty_cache()
                        continue
                    flops = (sdpa_flops if name == "sdpa" else linear_flops)(B, H, T, D) * (3 if bwd else 1)
                    rows.append({"op": "linear_attention", "impl": name, "pass": pass_, "dtype": dname,
                                 "B": B, "H": H, "T": T, "D": D, "causal": True, "ms": ms,
                                 "tflops": flops / (ms * 1e-3) / 1e12, "peak_mem_bytes": peak})
                del q, k, v, layouts
                checkpoint(rows, file_op="linear", out_dir=args.out, label=f"{dname} {pass_} B={B} H={H} T={T} D={D}",
                           B=B, H=H, T=T, D=D, dtype=dname, **{"pass": pass_})
    print_table(rows, ["impl", "pass", "dtype", "B", "H", "T", "D", "ms", "tflops", "peak_mem_bytes"])
    path = write_results(rows, op="linear", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
