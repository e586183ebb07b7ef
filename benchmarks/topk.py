"""Top-k attention with a lightning indexer, forward and forward+backward: time and peak memory against
the number of selected keys ``k``, beside dense causal attention (attnlib's flash kernels and PyTorch
SDPA, the anchor, in the same run).

    python benchmarks/topk.py                        # the full sweep (needs a CUDA GPU)
    python benchmarks/topk.py --smoke --out /tmp/x   # a tiny CPU run (kernels only under TRITON_INTERPRET=1)

Sweep: B=2, H=16, T in {4096, 16384}, D=128, causal, bf16; the indexer with H_I=4 index heads of
d_I=64 (DeepSeek-V3.2 runs 64 heads of 128 in fp8, beside 128 attention heads); k in {256, 1024, 2048}.
Rows: "attnlib-topk" (``attnlib.topk_attention``, backend triton: the fused index scores, torch's sort
for the selection, the gathered-key attention kernels), "attnlib-index-scores" (the indexer's kernel
alone, causal tiles skipped as inside topk_attention; its fwd+bwd row differentiates the scores, as the
indexer's KL loss does), "attnlib-dense" (``attnlib.softmax_attention``, backend triton), "sdpa"
(PyTorch's fused attention: the dense anchor), and "torch-reference" (``backend="torch"``, which builds
the ``[B, H_I, T, T]`` per-head scores and gathers ``[B, H, T, k, D]`` keys and values; small T only).
The fwd+bwd rows of the top-k rows differentiate q, k, v (the selection gives the indexer no gradient
through o). FLOPs: attention ``4 B H T k D`` (gathered keys only; dense ``2 B H T^2 D``, causal) plus
the indexer's ``B H_I T^2 d_I`` (causal half), the attention part times 3.5 for forward+backward.
Expected on a GPU: the top-k attention's own time grows with k and not with T^2, but the indexer and
the selection (a sort of every [T] row of scores) are quadratic in T and dominate at long T and small
k -- the honest cost of this operator: it saves the attention's T^2, not the indexer's. Before any
timing, the kernels' output and gradients must agree with the float64 reference on a small problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlib
from attnlib import _backend
from attnlib.topk import index_scores_reference, topk_attention_reference, topk_select
from benchmarks import _common

FWD_BWD_FLOP_FACTOR = 3.5
# The attention kernels compute in float32 from the 16-bit inputs; gradients are rounded once at the end.
GRAD_TOL = 2e-2


def _topk(backend):
    def fn(q, k, v, index, top_k):
        return attnlib.topk_attention(q, k, v, *index, top_k=top_k, causal=True, backend=backend)
    return fn


def _index_scores(q, k, v, index, top_k):
    iq, ik, iw = index
    if torch.is_grad_enabled():
        return attnlib.index_scores(iq, ik, iw, backend="triton")
    from attnlib.kernels.topk import index_scores_forward
    return index_scores_forward(iq, ik, iw, causal=True)


IMPLS = {
    "attnlib-topk": _topk("triton"),
    "attnlib-index-scores": _index_scores,
    "attnlib-dense": lambda q, k, v, index, top_k: attnlib.softmax_attention(q, k, v, causal=True, backend="triton"),
    "sdpa": lambda q, k, v, index, top_k: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "torch-reference": _topk("torch"),
}
DENSE = ("attnlib-dense", "sdpa")


def check_agreement(device, dtype_name) -> None:
    """The kernels' output and gradients against the float64 reference, on the same selection."""
    dtype = _common.DTYPES[dtype_name]
    g = torch.Generator().manual_seed(0)
    T = 300 if device.type == "cuda" else 24
    q, k, v, w = (torch.randn(1, 2, T, 64, generator=g).to(device) for _ in range(4))
    iq, ik, iw = (torch.randn(*s, generator=g).to(device) for s in ((1, 4, T, 32), (1, 1, T, 32), (1, 4, T)))
    top_k = 16 if device.type == "cuda" else 5
    idx = topk_select(index_scores_reference(iq, ik, iw), top_k, causal=True)
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = topk_attention_reference(*ref64, idx, scale=64 ** -0.5)
    want = [o_ref, *torch.autograd.grad((o_ref * w.double()).sum(), ref64)]
    xs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    o, got_idx = attnlib.topk_attention(*xs, iq, ik, iw, top_k=top_k, return_indices=True, backend="triton",
                                        causal=True)
    if not torch.equal(got_idx, idx):
        raise SystemExit("attnlib-topk selected other keys than the reference; not timing it")
    got = [o, *torch.autograd.grad((o * w.to(dtype)).sum(), xs)]
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        _common.require_agreement(f"attnlib-topk {name}", a, b.detach(), f"float64 reference ({dtype_name})",
                                  tol=2e-2 if name == "o" else GRAD_TOL)


def run(Ts, D, top_ks, H_I, d_I, dtype_name, B, H, passes, device, impls, out_dir) -> list[dict]:
    rows = []
    if "attnlib-topk" in impls:
        check_agreement(device, dtype_name)
    dtype = _common.DTYPES[dtype_name]
    todo = [(T, top_k) for T in Ts for top_k in top_ks]
    for T, top_k in _common.progress(todo, desc="top-k attention"):
        g = torch.Generator(device=device).manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D, device=device, generator=g, dtype=dtype).requires_grad_()
                   for _ in range(3))
        index = [torch.randn(*s, device=device, generator=g, dtype=dtype)
                 for s in ((B, H_I, T, d_I), (B, 1, T, d_I), (B, H_I, T))]
        for pass_ in passes:
            for impl in impls:
                if impl in DENSE + ("attnlib-index-scores",) and top_k != top_ks[0]:
                    continue                      # these rows do not depend on k: timed once per T
                if impl == "torch-reference" and B * max(H_I * T * T, H * T * top_k * D) * 4 > 2 * 2**30:
                    continue                      # the reference builds the per-head scores and gathered rows
                inputs = [q, k, v]
                if impl == "attnlib-index-scores":
                    index = [x.detach().requires_grad_(pass_ == "fwd+bwd") for x in index]
                    inputs = index
                fn = IMPLS[impl]
                try:
                    m = _common.measure(lambda fn=fn, q=q, k=k, v=v, index=index, top_k=top_k:
                                        fn(q, k, v, index, top_k), inputs, pass_)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                factor = FWD_BWD_FLOP_FACTOR if pass_ == "fwd+bwd" else 1
                indexer = B * H_I * T * T * d_I
                attention = 2 * B * H * T * T * D if impl in DENSE else 4 * B * H * T * min(top_k, T) * D
                flops = indexer if impl == "attnlib-index-scores" else \
                    attention * factor + (0 if impl in DENSE else indexer)
                rows.append(dict(op="topk_attention", impl=impl, dtype=dtype_name, B=B, H=H, T=T, D=D, causal=True,
                                 top_k=None if impl in DENSE else top_k, index_heads=H_I, index_dim=d_I,
                                 **m, tflops=flops / m["ms"] * 1e-9))
        del q, k, v, index
        _common.checkpoint(rows, file_op="topk_attention", out_dir=out_dir, label=f"T{T} k {top_k}", T=T)
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
        impls = (["attnlib-topk", "attnlib-index-scores"] if _backend.INTERPRET else []) + ["sdpa", "torch-reference"]
        rows = run([16], 16, [4, 16], 2, 16, "fp32", 1, 2, passes, torch.device("cpu"), impls, args.out)
    elif not torch.cuda.is_available():
        print("benchmarks/topk.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        rows = run([4096, 16384], 128, [256, 1024, 2048], 4, 64, "bf16", 2, 16, passes, torch.device("cuda"),
                   list(IMPLS), args.out)
    _common.print_table(rows, ["impl", "T", "top_k", "pass", "ms", "tflops", "peak_mem_bytes"])
    path = _common.write_results(rows, op="topk_attention", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
