"""Block-sparse attention forward: time against the fraction of key blocks visited, beside dense attention.

    python benchmarks/block_sparse.py            # the full sweep (needs a CUDA GPU)
    python benchmarks/block_sparse.py --smoke --out /tmp/x   # a tiny CPU run of the torch paths

Sweep: B=4, H=16, T in {4096, 16384}, D=128, block 128 (and 64), fp16, not causal; densities
1/32 .. 1 (each query block visits its diagonal block plus random others). Rows:
"attnlib-block-sparse" (the Triton kernel, cost proportional to the visited blocks), "attnlib-dense"
(``attnlib.softmax_attention``, backend triton -- the density-1 yardstick), and "torch-reference"
(the masked reference, which pays for every block; small T only).
FLOPs = 4 * B * H * T^2 * D * density (visited blocks only). Expected on a GPU: time roughly
proportional to density, and at density 1 within a small factor of the dense kernel (the sparse
kernel masks every tile and reads an index per block). Measured on an H200: see benchmarks/results/.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

import attnlib  # noqa: E402
from attnlib.sparse import n_blocks  # noqa: E402


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
                                                                                  backend="triton"),
    "attnlib-dense": lambda q, k, v, m, bs: attnlib.softmax_attention(q, k, v, backend="triton"),
    "torch-reference": lambda q, k, v, m, bs: attnlib.block_sparse_attention(q, k, v, m, block_size=bs,
                                                                             backend="torch"),
    "torch-dense": lambda q, k, v, m, bs: attnlib.softmax_attention(q, k, v, backend="torch"),
}


def run(Ts, D, block_sizes, densities, dtype_name, B, H, device, impls) -> list[dict]:
    rows = []
    for T in Ts:
        g = torch.Generator(device=device).manual_seed(T)
        q, k, v = (torch.randn(B, H, T, D, device=device, generator=g, dtype=_common.DTYPES[dtype_name])
                   for _ in range(3))
        for bs in block_sizes:
            for density in densities:
                mask = random_block_mask(H, T, bs, density, device)
                actual = mask.float().mean().item()
                for impl in impls:
                    dense = impl in ("attnlib-dense", "torch-dense")
                    if dense and density != densities[-1]:
                        continue                      # the dense yardstick does not depend on the mask
                    if impl.startswith("torch") and B * H * T * T * 4 > 4 * 2**30:
                        continue                      # the reference builds the [T, T] scores
                    try:
                        fn = IMPLS[impl]
                        ms = _common.time_ms(lambda fn=fn, q=q, k=k, v=v, m=mask, bs=bs: fn(q, k, v, m, bs))
                    except torch.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        continue
                    frac = 1.0 if dense else actual
                    flops = 4 * B * H * T * T * D * frac
                    rows.append(dict(op="block_sparse_attention", impl=impl, dtype=dtype_name, B=B, H=H, T=T,
                                     D=D, causal=False, block_size=bs, density=round(frac, 4), ms=ms,
                                     tflops=flops / ms * 1e-9))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the torch implementations")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON (default benchmarks/results)")
    args = ap.parse_args()
    if args.smoke:
        if args.out is None:
            ap.error("--smoke writes only to an explicit --out directory")
        rows = run([128], 16, [16], [0.25, 1.0], "fp32", 1, 2, "cpu", ["torch-reference", "torch-dense"])
    elif not torch.cuda.is_available():
        print("benchmarks/block_sparse.py needs a CUDA GPU (use --smoke --out DIR for a CPU smoke run)")
        return 0
    else:
        rows = run([4096, 16384], 128, [128, 64], [1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0], "fp16", 4, 16,
                   "cuda", ["attnlib-block-sparse", "attnlib-dense", "torch-reference"])
    _common.print_table(rows, ["impl", "T", "block_size", "density", "ms", "tflops"])
    path = _common.write_results(rows, op="block_sparse_attention", out_dir=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
