"""Causal linear attention forward: attnlib's Triton chunk kernel vs fla vs the torch reference vs SDPA.

    python benchmarks/linear.py                   # on a CUDA GPU: the full sweep, JSON into results/
    python benchmarks/linear.py --smoke --out DIR # anywhere: a tiny CPU run of the torch paths

Implementations (all causal, no feature map, no normaliser, scale 1/sqrt(D)):

* ``attnlib``         -- ``attnlib.linear_attention(..., mode="chunk", backend="triton")``, chunk 64.
* ``fla``             -- ``fla.ops.linear_attn.chunk_linear_attn(..., normalize=False)`` from the
  ``flash-linear-attention`` package (layout ``[B, T, H, D]``: the transposes are made *outside* the
  timed region). Skipped with a message when ``fla`` cannot be imported.
* ``torch_reference`` -- ``attnlib.linear_attention(..., mode="chunk", backend="torch")`` (float32
  arithmetic; a Python loop over chunks, three cuBLAS calls per chunk).
* ``sdpa``            -- ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``: the
  softmax attention that linear attention replaces (what the crossover is measured against).

FLOP counts used for the ``tflops`` column (multiply-adds count 2):

* linear attention, chunk size C: per chunk the four products ``Q K^T`` (C x C x D), ``A V``
  (C x C x Dv), ``Q S`` and ``K^T V`` (C x D x Dv each), i.e. ``2 B H T (C D + C Dv + 2 D Dv)``
  = ``4 B H T D (C + D)`` for Dv = D, C = 64, the same count for attnlib, fla and the reference
  (the work the chunk algorithm does, including the masked half of each C x C block);
* causal softmax attention: ``2 B H T^2 D`` (half of ``4 B H T^2 D``), the usual convention.

The two counts measure different algorithms: compare implementations of the same op by ``tflops``,
and linear against softmax by ``ms``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DTYPES, add_sweep_arguments, checkpoint, print_table, require_agreement, time_ms, write_results  # noqa: E402

import attnlib  # noqa: E402

CHUNK = 64


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


def impls(fla_fn, *, smoke):
    out = {
        "attnlib": (lambda q, k, v, _bt: attnlib.linear_attention(q, k, v, mode="chunk",
                                                                 chunk_size=CHUNK, backend="triton")),
        "torch_reference": (lambda q, k, v, _bt: attnlib.linear_attention(q, k, v, mode="chunk",
                                                                         chunk_size=CHUNK,
                                                                         backend="torch")),
        "sdpa": (lambda q, k, v, _bt: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }
    if smoke:
        del out["attnlib"]                                     # no GPU: the kernel cannot run compiled
    if fla_fn is not None and not smoke:
        out["fla"] = lambda q, k, v, bt: fla_fn(*bt)
    return out


def check_agreement(fla_fn, device, dtype):
    """Before timing: attnlib's kernel, the reference and fla must agree on one small problem."""
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 300, 64, generator=g).to(device, dtype) for _ in range(3))
    ref = attnlib.linear_attention(q.double(), k.double(), v.double(), backend="torch")
    got = {"attnlib": attnlib.linear_attention(q, k, v, backend="triton")}
    if fla_fn is not None:
        bt = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        got["fla"] = fla_fn(*bt).transpose(1, 2)
    for name, o in got.items():
        require_agreement(name, o, ref, f"float64 reference ({str(dtype).replace('torch.', '')})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_sweep_arguments(ap, dtypes="bf16,fp16")
    args = ap.parse_args(argv)

    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes JSON only to a directory given with --out")
        device = torch.device("cpu")
        B, H, Ts, Ds, dtypes = 1, 2, [128, 256], [16], ["fp32"]
    else:
        if not torch.cuda.is_available():
            print("benchmarks/linear.py needs a CUDA GPU (Triton kernels, fla, cuBLAS). "
                  "Nothing to measure here; use --smoke --out DIR for a CPU smoke run.")
            return 0
        device = torch.device("cuda")
        B, H = args.B, args.H
        Ts = [int(t) for t in args.T.split(",")]
        Ds = [int(d) for d in args.D.split(",")]
        dtypes = args.dtypes.split(",")

    fla_fn = None if args.smoke else load_fla()
    rows = []
    for dname in dtypes:
        dtype = DTYPES[dname]
        if not args.smoke:
            check_agreement(fla_fn, device, dtype)
        for D in Ds:
            for T in Ts:
                q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype) for _ in range(3))
                bt = [x.transpose(1, 2).contiguous() for x in (q, k, v)]   # fla's layout, untimed
                for name, fn in impls(fla_fn, smoke=args.smoke).items():
                    try:
                        ms = time_ms(functools.partial(fn, q, k, v, bt))
                    except torch.cuda.OutOfMemoryError:
                        print(f"[skip] {name} T={T} D={D}: out of memory")
                        torch.cuda.empty_cache()
                        continue
                    flops = sdpa_flops(B, H, T, D) if name == "sdpa" else linear_flops(B, H, T, D)
                    rows.append({"op": "linear_attention", "impl": name, "dtype": dname, "B": B,
                                 "H": H, "T": T, "D": D, "causal": True, "ms": ms,
                                 "tflops": flops / (ms * 1e-3) / 1e12})
                del q, k, v, bt
                checkpoint(rows, file_op="linear", out_dir=args.out, label=f"{dname} D={D} T={T}",
                           T=T, D=D, dtype=dname)
    print_table(rows, ["impl", "dtype", "D", "T", "ms", "tflops"])
    path = write_results(rows, op="linear", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
