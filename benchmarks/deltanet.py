"""DeltaNet / Gated DeltaNet, forward and forward+backward: attnlib's chunked Triton kernels vs fla vs
the recurrent torch loop, with peak memory.

    python benchmarks/deltanet.py                    # on a CUDA GPU: issue 13's shapes, JSON into results/
    python benchmarks/deltanet.py --shapes sweep     # the T x D sweep at --B, --H
    python benchmarks/deltanet.py --smoke --out DIR  # anywhere: a tiny CPU run of the torch paths

Ops (``"op"`` in the JSON): ``delta_rule`` (``g=None``) and ``gated_delta_rule``. Implementations:

* ``attnlib``         -- ``attnlib.delta_rule(..., mode="chunk", backend="triton")``, chunk 64: the
  forward and backward kernels of ``attnlib/kernels/delta/`` (on the CPU smoke run:
  ``backend="torch"``, the chunk reference; the row says so in ``"backend"``).
* ``fla``             -- ``fla.ops.delta_rule.chunk_delta_rule`` / ``fla.ops.gated_delta_rule.
  chunk_gated_delta_rule`` (``flash-linear-attention``), the anchor, in the same run; layout
  ``[B, T, H, D]``, the transposes made *outside* the timed region. Skipped with a message when ``fla``
  cannot be imported.
* ``torch_recurrent`` -- ``attnlib.delta_rule(..., mode="recurrent", backend="torch")``: the
  definition, one token at a time (forward only, up to ``--max-T-recurrent``, default 4096: it is slow).

Each row has ``"pass"``: ``"fwd"`` (inputs without gradients) or ``"fwd+bwd"`` (``q, k, v, beta`` and
``g`` require gradients; one forward and ``torch.autograd.grad`` of all of them against a fixed random
``dO``), and ``"peak_mem_bytes"``: ``torch.cuda.max_memory_allocated`` during one such call, inputs
included -- both layouts' copies, the same for every implementation of a shape, so compare
differences (None on the CPU). Before timing, outputs *and gradients* of the kernels (and fla) are
checked against the float64 recurrence on a small problem.

Inputs: keys L2-normalised, ``beta`` uniform in (0, 1), ``g = log(alpha)`` with ``alpha`` in
(0.9, 1) for the gated op, scale ``1/sqrt(D)``, ``Dv = D``. FLOP count for the ``tflops`` column
(multiply-adds count 2), per chunk of C: ``K K^T``, ``Q K^T`` (C x C x D each), the triangular solve
(~C^3 / 3), ``W = T K`` (C x C x D), ``U = T V`` (C x C x Dv), ``W S^T``, ``Q S^T``, ``U'^T K`` (C x D x Dv
each) and ``(Q K^T . M) U'`` (C x C x Dv): about ``2 B H T (3 C D + 2 C Dv + 3 D Dv + C^2 / 3)``; 3x
that for forward+backward rows. It is the chunk algorithm's work, used for all implementations so
that ``tflops`` compares speed.
"""

from __future__ import annotations

import argparse
import functools
import math
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
# Issue 13's shapes: (B, H, T, D); both passes run on all of them.
ISSUE_SHAPES = list(ANCHOR_SHAPES)


def delta_flops(B, H, T, D, C=CHUNK):
    Dv = D
    return 2 * B * H * T * (3 * C * D + 2 * C * Dv + 3 * D * Dv + C * C / 3)


def load_fla():
    try:
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:  # noqa: BLE001 - any import failure means: skip fla
        print(f"[skip] fla: not importable ({type(exc).__name__}: {exc}); "
              "pip install flash-linear-attention to include it")
        return None
    import inspect
    extra_d = {"head_first": False} if "head_first" in inspect.signature(chunk_delta_rule).parameters else {}
    extra_g = ({"head_first": False} if "head_first" in inspect.signature(chunk_gated_delta_rule).parameters
               else {})

    def run(q, k, v, beta, g, scale):                          # [B, T, H, D], beta/g [B, T, H]
        if g is None:
            return chunk_delta_rule(q=q, k=k, v=v, beta=beta, scale=scale, **extra_d)[0]
        return chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, scale=scale, **extra_g)[0]
    return run


def make_inputs(B, H, T, D, device, dtype, gated, seed=0, requires_grad=False):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g)
    k = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
    v = torch.randn(B, H, T, D, generator=g)
    beta = torch.rand(B, H, T, generator=g)
    gg = torch.log(0.9 + 0.1 * torch.rand(B, H, T, generator=g)) if gated else None
    cast = (lambda x: x.to(device, dtype)) if dtype != torch.float64 else (lambda x: x.to(device))
    out = (cast(q), cast(k), cast(v), beta.to(device, torch.float32 if dtype == torch.float64 else dtype),
           None if gg is None else gg.to(device, torch.float32))
    return tuple(x if x is None else x.requires_grad_(requires_grad) for x in out)


def to_bt(q, k, v, beta, g, requires_grad=False):
    """fla's layout [B, T, H, D] (and [B, T, H] for beta, g) -- made outside the timed region."""
    return tuple(None if x is None else x.detach().transpose(1, 2).contiguous().requires_grad_(requires_grad)
                 for x in (q, k, v, beta, g))


def check_agreement(fla_fn, device, dtype):
    """Before timing: outputs and gradients of the kernels (and fla) against the float64 recurrence."""
    tag = str(dtype).replace("torch.", "")
    for gated in (False, True):
        q, k, v, beta, g = make_inputs(1, 2, 300, 64, device, dtype, gated)
        do = torch.randn(1, 2, 300, 64, generator=torch.Generator().manual_seed(1)).to(device, dtype)
        ins64 = [x.double().requires_grad_() for x in (q, k, v, beta) + ((g,) if gated else ())]
        ref = attnlib.delta_rule(*ins64[:4], g=ins64[4] if gated else None, mode="recurrent", backend="torch")
        ref_grads = torch.autograd.grad(ref, ins64, do.double())
        runs = {"attnlib": lambda a, b, c, d, e: attnlib.delta_rule(a, b, c, d, g=e, backend="triton")}
        if fla_fn is not None:                                 # differentiated through the layout change
            runs["fla"] = lambda a, b, c, d, e: fla_fn(
                *(None if x is None else x.transpose(1, 2) for x in (a, b, c, d, e)), 1 / math.sqrt(64)
            ).transpose(1, 2)
        for name, fn in runs.items():
            ins = [x.clone().requires_grad_() for x in (q, k, v, beta) + ((g,) if gated else ())]
            o = fn(*ins[:4], ins[4] if gated else None)
            grads = torch.autograd.grad(o, ins, do)
            what = f"float64 recurrence ({'gated' if gated else 'plain'}, {tag})"
            require_agreement(name, o, ref, what)
            for gname, a, b in zip(("dq", "dk", "dv", "dbeta", "dg"), grads, ref_grads):
                require_agreement(f"{name} {gname}", a, b, what, tol=5e-2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sweep_arguments(ap, dtypes="bf16")
    ap.add_argument("--max-T-recurrent", type=int, default=4096)
    ap.add_argument("--shapes", default="issue", choices=("issue", "sweep"),
                    help="issue: issue 13's (B, H, T, D) list; sweep: every --T x --D at --B, --H")
    ap.add_argument("--passes", default="fwd,fwd+bwd")
    args = ap.parse_args(argv)

    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes JSON only to a directory given with --out")
        device = torch.device("cpu")
        shapes, dtypes, max_rec = [(1, 2, 128, 16), (1, 2, 256, 16)], ["fp32"], 256
    else:
        if not torch.cuda.is_available():
            print("benchmarks/deltanet.py needs a CUDA GPU (Triton kernels, fla). "
                  "Nothing to measure here; use --smoke --out DIR for a CPU smoke run.")
            return 0
        device = torch.device("cuda")
        shapes = (ISSUE_SHAPES if args.shapes == "issue" else
                  [(args.B, args.H, int(t), int(d)) for d in args.D.split(",") for t in args.T.split(",")])
        dtypes = args.dtypes.split(",")
        max_rec = args.max_T_recurrent
    passes = args.passes.split(",")

    fla_fn = None if args.smoke else load_fla()
    kernel_backend = "torch" if args.smoke else "triton"
    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        if not args.smoke:
            check_agreement(fla_fn, device, dtype)
        for gated in (False, True):
            op = "gated_delta_rule" if gated else "delta_rule"
            for B, H, T, D in shapes:
                scale = 1 / math.sqrt(D)
                for pass_ in passes:
                    bwd = pass_ == "fwd+bwd"
                    q, k, v, beta, g = make_inputs(B, H, T, D, device, dtype, gated, requires_grad=bwd)

                    def ours(q, k, v, beta, g, mode="chunk", backend=kernel_backend):
                        return attnlib.delta_rule(q, k, v, beta, g=g, mode=mode, chunk_size=CHUNK, backend=backend)
                    runs = {"attnlib": (ours, (q, k, v, beta, g))}
                    if fla_fn is not None:
                        runs["fla"] = (functools.partial(fla_fn, scale=scale), to_bt(q, k, v, beta, g, bwd))
                    if T <= max_rec and not bwd:
                        runs["torch_recurrent"] = (functools.partial(ours, mode="recurrent", backend="torch"),
                                                   (q, k, v, beta, g))
                    for name, (fn, ins) in runs.items():
                        wrt = [x for x in ins if isinstance(x, torch.Tensor) and x.requires_grad]
                        try:
                            m = measure(functools.partial(fn, *ins), wrt, pass_)
                            ms, peak = m["ms"], m["peak_mem_bytes"]
                        except torch.cuda.OutOfMemoryError:
                            print(f"[skip] {name} {op} {pass_} B={B} H={H} T={T} D={D}: out of memory")
                            torch.cuda.empty_cache()
                            continue
                        flops = delta_flops(B, H, T, D) * (3 if bwd else 1)
                        rows.append({"op": op, "impl": name, "pass": pass_, "dtype": dname, "B": B, "H": H,
                                     "T": T, "D": D, "causal": True, "ms": ms,
                                     "tflops": flops / (ms * 1e-3) / 1e12, "peak_mem_bytes": peak,
                                     "backend": kernel_backend if name == "attnlib" else name})
                    del runs, q, k, v, beta, g
                    checkpoint(rows, file_op="deltanet", out_dir=args.out,
                               label=f"{op} {pass_} B={B} H={H} T={T} D={D}", op=op, B=B, H=H, T=T, D=D,
                               dtype=dname, **{"pass": pass_})
    print_table(rows, ["op", "impl", "pass", "dtype", "B", "H", "T", "D", "ms", "tflops", "peak_mem_bytes"])
    path = write_results(rows, op="deltanet", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
