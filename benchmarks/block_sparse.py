"""Block-sparse attention, forward and forward+backward: time against the fraction of key blocks visited,
beside dense attention (attnlib's flash kernels and PyTorch SDPA, the anchor, in the same run).

    python benchmarks/block_sparse.py                        # the full sweep (needs a CUDA GPU)
    python benchmarks/block_sparse.py --smoke --out /tmp/x   # a tiny CPU run (kernels only under TRITON_INTERPRET=1)

Sweep: B=4, H=16, T in {4096, 16384}, D=128, block 128 (and 64), fp16, not causal; densities
1/32 .. 1 (each query block visits its diagonal block plus random others); passes ``fwd`` and
``fwd+bwd`` with peak memory (``_common.py``). Rows: "attnlib-block-sparse" (the Triton kernels, cost
proportional to the visited blocks), "attnlib-dense" (``attnlib.softmax_attention``, backend triton),
"sdpa" (PyTorch's fused attention: the dense anchor), and "torch-reference" (the masked reference,
which pays for every block; small T only). Dense rows do not depend on the mask: timed once per T.
FLOPs = 4 * B * H * T^2 * D * density (visited blocks only), times 3.5 for forward+backward.
Expected on a GPU: time roughly proportional to density, and at density 1 within a small factor of the
dense kernel (the sparse kernel masks every tile and reads an index per block). Before any timing, the
kernel's output and gradients must agree with the float64 reference on a small problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attnlib
from attnlib import _backend
from attnlib.sparse import block_sparse_attention_reference, n_blocks
from benchmarks import _common

FWD_BWD_FLOP_FACTOR = 3.5
# Gradients go through P and dS rounded to the input dtype (as in FlashAttention): bf16 gradients sit
# near 1e-2 of relative RMS error. A wrong kernel is off by order 1.
GRAD_TOL = 6e-2


def random_block_mask(H: int, T: int, bs: int, density: float, device, seed: int = 0) -> torch.Tensor:
    """Each query block visits its diagonal block and ``round(density * nb) - 1`` random other ones."""
    nb = n_blocks(T, bs)
    g = torch.Generator().manual_seed(seed)
    per_row = max(1, round(density * nb))
    scores = torch.rand(H, nb, nb, generator=g)
    scores[:, torch.arange(nb), torch.arange(nb)] = 2.0          # the diagonal first
    idx = scores.topk(per_row, dim=-1).indices
    return torch.zeros(H, nb, nb, dtype=torch.bool).scatter_(-1, idx, True).to(device)


IMPLS = {
    "attnlib-block-sparse": lambda q, k, v, m, bs: attnlib.block_sparse_attention(q, k, v, m, block_size=bs,
                                                                                  backend="triton", causal=False),
    "attnlib-dense": lambda q, k, v, m, bs: attnlib.softmax_attention(q, k, v, backend="triton", causal=False),
    "sdpa": lambda q, k, v, m, bs: F.scaled_dot_product_attention(q, k, v),
    "torch-reference": lambda q, k, v, m, bs: attnlib.block_sparse_attention(q, k, v, m, block_size=bs,
                                                                             backend="torch", causal=False),
}
DENSE = ("attnlib-dense", "sdpa")


def check_agreement(device, dtype_name, bs) -> None:
    """The kernel's output and gradients against the float64 reference (a mask with empty rows too)."""
    dtype = _common.DTYPES[dtype_name]
    g = torch.Generator().manual_seed(0)
    T = 300 if device.type == "cuda" else 40
    q, k, v, w = (torch.randn(1, 2, T, 64, generator=g).to(device) for _ in range(4))
    mask = random_block_mask(2, T, bs, 0.5, device)
    mask[:, -1] = False                                     # the last query block visits nothing
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = block_sparse_attention_reference(*ref64, mask, block_size=bs, scale=64 ** -0.5, causal=False)
    want = [o_ref, *torch.autograd.grad((o_ref * w.double()).sum(), ref64)]
    xs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    o = IMPLS["attnlib-block-sparse"](*xs, mask, bs)
    got = [o, *torch.autograd.grad((o * w.to(dtype)).sum(), xs)]
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want):
        _common.require_agreement(f"attnlib-block-sparse {name}", a, b.detach(),
                                  f"float64 reference ({dtype_name}, block {bs})",
                                  tol=2e-2 if name == "o" else GRAD_TOL)


def run(Ts, D, block_sizes, densities, dtype_name, B, H, passes, device, impls, out_dir) -> list[dict]:
    rows = []
    if "attnlib-block-sparse" in impls:
        for bs in block_sizes:
            check_agreement(device, dtype_name, bs)
    todo = [(T, bs, dens) for T in Ts for bs in block_sizes for dens in densities]
    for T, bs, density in _common.progress(todo, desc="block-sparse attention"):
        g = torch.Generator(device=device).manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D, device=device, generator=g, dtype=_common.DTYPES[dtype_name])
                   .requires_grad_() for _ in range(3))
        mask = random_block_mask(H, T, bs, density, device)
        actual = mask.float().mean().item()                   # outside the timed region
        for pass_ in passes:
            for impl in impls:
                dense = impl in DENSE
                if dense and (density != densities[-1] or bs != block_sizes[0]):
                    continue                      # the dense yardsticks do not depend on the mask
                if impl == "torch-reference" and B * H * T * T * 4 > 4 * 2**30:
                    continue                      # the reference builds the [T, T] scores
                fn = IMPLS[impl]
                try:
                    m = _common.measure(lambda fn=fn, q=q, k=k, v=v, m=mask, bs=bs: fn(q, k, v, m, bs),
                                        [q, k, v], pass_)
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
                frac = 1.0 if dense else actual
                flops = 4 * B * H * T * T * D * frac * (FWD_BWD_FLOP_FACTOR if pass_ == "fwd+bwd" else 1)
                rows.append(dict(op="block_sparse_attention", impl=impl, dtype=dtype_name, B=B, H=H, T=T,
                                 D=D, causal=False, block_size=None if dense else bs, density=round(frac, 4),
                                 **m, tflops=flops / m["ms"] * 1e-9))
        del q, k, v
        _common.checkpoint(rows, file_op="block_sparse_attention", out_dir=out_dir,
                           label=f"T{T} block {bs} density {density:.3g}", T=T, density=round(actual, 4))
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
        impls = (["attnlib-block-sparse"] if _backend.INTERPRET else []) + ["sdpa", "torch-reference"]
        rows = run([48], 16, [16], [0.34, 1.0], "fp32", 1, 2, passes, torch.device("cpu"), impls, args.out)
    elif not torch.cuda.is_available():
        print("benchmarks/block_sparse.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        rows = run([4096, 16384], 128, [128, 64], [1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0], "fp16", 4, 16,
                   passes, torch.device("cuda"), list(IMPLS), args.out)
    _common.print_table(rows, ["impl", "T", "block_size", "density", "pass", "ms", "tflops", "peak_mem_bytes"])
    path = _common.write_results(rows, op="block_sparse_attention", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
