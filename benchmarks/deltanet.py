"""DeltaNet / Gated DeltaNet forward: attnlib's Triton chunk kernel vs fla vs the recurrent torch loop.

    python benchmarks/deltanet.py                   # on a CUDA GPU: the full sweep, JSON into results/
    python benchmarks/deltanet.py --smoke --out DIR # anywhere: a tiny CPU run of the torch paths

Ops (``"op"`` in the JSON): ``delta_rule`` (``g=None``) and ``gated_delta_rule``. Implementations:

* ``attnlib``         -- ``attnlib.delta_rule(..., mode="chunk", backend="triton")``, chunk 64
  (on the CPU smoke run: ``backend="torch"``, the chunk reference; the row says so in ``"backend"``).
* ``fla``             -- ``fla.ops.delta_rule.chunk_delta_rule`` / ``fla.ops.gated_delta_rule.
  chunk_gated_delta_rule`` (``flash-linear-attention``), layout ``[B, T, H, D]``: the transposes are
  made *outside* the timed region. Skipped with a message when ``fla`` cannot be imported.
* ``torch_recurrent`` -- ``attnlib.delta_rule(..., mode="recurrent", backend="torch")``: the
  definition, one token at a time (only up to ``--max-T-recurrent``, default 4096: it is slow).

Inputs: keys L2-normalised, ``beta`` uniform in (0, 1), ``g = log(alpha)`` with ``alpha`` in
(0.9, 1) for the gated op, scale ``1/sqrt(D)``, ``Dv = D``. FLOP count for the ``tflops`` column
(multiply-adds count 2), per chunk of C: ``K K^T``, ``Q K^T`` (C x C x D each), the triangular solve
(~C^3 / 3), ``W = T K`` (C x C x D), ``U = T V`` (C x C x Dv), ``W S^T``, ``Q S^T``, ``U'^T K`` (C x D x Dv
each) and ``(Q K^T . M) U'`` (C x C x Dv): about ``2 B H T (3 C D + 2 C Dv + 3 D Dv + C^2 / 3)``. It
is the chunk algorithm's work, used for all implementations so that ``tflops`` compares speed.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DTYPES, add_sweep_arguments, checkpoint, print_table, require_agreement, time_ms, write_results  # noqa: E402

import attnlib  # noqa: E402

CHUNK = 64


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


def make_inputs(B, H, T, D, device, dtype, gated, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g)
    k = F.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
    v = torch.randn(B, H, T, D, generator=g)
    beta = torch.rand(B, H, T, generator=g)
    gg = torch.log(0.9 + 0.1 * torch.rand(B, H, T, generator=g)) if gated else None
    cast = (lambda x: x.to(device, dtype)) if dtype != torch.float64 else (lambda x: x.to(device))
    return (cast(q), cast(k), cast(v), beta.to(device, torch.float32 if dtype == torch.float64 else dtype),
            None if gg is None else gg.to(device, torch.float32))


def to_bt(q, k, v, beta, g):
    """fla's layout [B, T, H, D] (and [B, T, H] for beta, g) -- made outside the timed region."""
    return ([x.transpose(1, 2).contiguous() for x in (q, k, v)] + [beta.transpose(1, 2).contiguous()]
            + [None if g is None else g.transpose(1, 2).contiguous()])


def check_agreement(fla_fn, device, dtype):
    """Before timing: the kernel and fla must agree with the float64 recurrence on one small problem."""
    for gated in (False, True):
        q, k, v, beta, g = make_inputs(1, 2, 300, 64, device, dtype, gated)
        ref = attnlib.delta_rule(q.double(), k.double(), v.double(), beta.double(),
                                 g=None if g is None else g.double(), mode="recurrent", backend="torch")
        got = {"attnlib": attnlib.delta_rule(q, k, v, beta, g=g, backend="triton")}
        if fla_fn is not None:
            bq, bk, bv, bb, bg = to_bt(q, k, v, beta, g)
            got["fla"] = fla_fn(bq, bk, bv, bb, bg, 1 / math.sqrt(64)).transpose(1, 2)
        for name, o in got.items():
            require_agreement(name, o, ref, f"float64 recurrence ({'gated' if gated else 'plain'}, "
                                          f"{str(dtype).replace('torch.', '')})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sweep_arguments(ap, dtypes="bf16")
    ap.add_argument("--max-T-recurrent", type=int, default=4096)
    args = ap.parse_args(argv)

    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes JSON only to a directory given with --out")
        device = torch.device("cpu")
        B, H, Ts, Ds, dtypes, max_rec = 1, 2, [128, 256], [16], ["fp32"], 256
    else:
        if not torch.cuda.is_available():
            print("benchmarks/deltanet.py needs a CUDA GPU (Triton kernels, fla). "
                  "Nothing to measure here; use --smoke --out DIR for a CPU smoke run.")
            return 0
        device = torch.device("cuda")
        B, H = args.B, args.H
        Ts = [int(t) for t in args.T.split(",")]
        Ds = [int(d) for d in args.D.split(",")]
        dtypes = args.dtypes.split(",")
        max_rec = args.max_T_recurrent

    fla_fn = None if args.smoke else load_fla()
    kernel_backend = "torch" if args.smoke else "triton"
    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        if not args.smoke:
            check_agreement(fla_fn, device, dtype)
        for gated in (False, True):
            op = "gated_delta_rule" if gated else "delta_rule"
            for D in Ds:
                scale = 1 / math.sqrt(D)
                for T in Ts:
                    q, k, v, beta, g = make_inputs(B, H, T, D, device, dtype, gated)
                    bt = to_bt(q, k, v, beta, g) if fla_fn is not None else None
                    runs = {"attnlib": functools.partial(attnlib.delta_rule, q, k, v, beta, g=g, mode="chunk",
                                                         chunk_size=CHUNK, backend=kernel_backend)}
                    if fla_fn is not None:
                        runs["fla"] = functools.partial(fla_fn, *bt, scale)
                    if T <= max_rec:
                        runs["torch_recurrent"] = functools.partial(attnlib.delta_rule, q, k, v, beta, g=g,
                                                                    mode="recurrent", backend="torch")
                    for name, fn in runs.items():
                        try:
                            ms = time_ms(fn)
                        except torch.cuda.OutOfMemoryError:
                            print(f"[skip] {name} {op} T={T} D={D}: out of memory")
                            torch.cuda.empty_cache()
                            continue
                        rows.append({"op": op, "impl": name, "dtype": dname, "B": B, "H": H, "T": T, "D": D,
                                     "causal": True, "ms": ms,
                                     "tflops": delta_flops(B, H, T, D) / (ms * 1e-3) / 1e12,
                                     "backend": kernel_backend if name == "attnlib" else name})
                    del runs, q, k, v, beta, g, bt
                    checkpoint(rows, file_op="deltanet", out_dir=args.out, label=f"{op} D={D} T={T}",
                               op=op, T=T, D=D, dtype=dname)
    print_table(rows, ["op", "impl", "dtype", "D", "T", "ms", "tflops"])
    path = write_results(rows, op="deltanet", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
