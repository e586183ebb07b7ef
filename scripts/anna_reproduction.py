"""Chapter 5's reproduction: train a surrogate on Match2 or 1-hop induction, distil it into ANNA, and
record the error against the number of tables ``l`` and bits ``z`` -- for the paper's softmax surrogate
and for our SimHash-limit surrogate, over several seeds.

    python scripts/anna_reproduction.py --task match2 --seeds 10 --steps 3000
    python scripts/anna_reproduction.py --task induction --seeds 5 --steps 3000
    python scripts/anna_reproduction.py --task match2 --seeds 3 --steps 20000 --surrogates softmax \
        --out benchmarks/results/anna_reproduction_match2_20000_steps.json

Writes ``benchmarks/results/anna_reproduction_<task>.json`` (device, versions, date, configuration,
one row per (surrogate, seed)); lab 5 reads it for the chapter's table. The JSON is rewritten after
every seed, so an interrupted run keeps what it finished. Training time is recorded for information,
never asserted on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from attnbook.experiments import anna as ex
from benchmarks._common import device_name, versions  # the benchmarks' record of device and versions

ROOT = Path(__file__).resolve().parent.parent

# The paper sweeps [secondary] Match2 l = 1..16, z = 1..6, and induction layer 1 l = 32..96, layer 2
# l = 4..32, z = 1..4. Those grids cannot answer whether hashing can serve a trained model: in the many-table
# limit z is an inverse temperature (chapter 5), a sharp plan needs a large z, and the tables needed to
# see a partner at one-hash collision probability p grow like p^-z. So the grids go on to z = 24 and
# l = 4096 (Match2 is cheap: ANNA counted per symbol) and to z = 16, l = 256 per layer (induction), and
# every run also records the l -> infinity limit per z.
GRIDS = {
    "match2": dict(ls=[2 ** i for i in range(13)], zs=[1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24],
                   n_eval=1000, n_hash_seeds=4),
    # the causal reference at B=100, T=100 takes seconds per layer at l = 256 on a CPU: one table draw
    "induction": dict(ls=[(32, 4), (32, 32), (96, 8), (96, 32), (256, 256)], zs=[1, 2, 3, 4, 6, 8, 12, 16],
                      n_eval=100, n_hash_seeds=1),
}
SURROGATE_BITS = 4          # z of the SimHash-limit surrogate's kernel (the grid's middle)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=sorted(GRIDS), required=True)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=None, help="default: 64 for match2, 32 for induction")
    ap.add_argument("--lr", type=float, default=None, help="default: 1e-2 for match2, 3e-3 for induction")
    ap.add_argument("--surrogates", nargs="+", choices=ex.SURROGATES, default=list(ex.SURROGATES))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    grid = GRIDS[args.task]
    batch = args.batch or (64 if args.task == "match2" else 32)
    lr = args.lr or (1e-2 if args.task == "match2" else 3e-3)
    out = args.out or ROOT / "benchmarks" / "results" / f"anna_reproduction_{args.task}.json"
    doc = {
        "experiment": "anna_reproduction", "task": args.task,
        "device": device_name(), "date": datetime.date.today().isoformat(), "versions": versions(),
        "config": {"torch_threads": torch.get_num_threads(), "steps": args.steps, "batch": batch, "lr": lr, "d": 64,
                   "surrogate_bits": SURROGATE_BITS,
                   "ls": grid["ls"], "zs": grid["zs"], "n_eval_sequences": grid["n_eval"],
                   "n_hash_seeds": grid["n_hash_seeds"], "eval_seed": 99},
        "rows": [],
    }
    for seed in tqdm(range(args.seeds), desc=f"{args.task}: seeds"):
        for surrogate in args.surrogates:
            t0 = time.time()
            model = ex.train_surrogate(args.task, steps=args.steps, seed=seed, surrogate=surrogate,
                                       n_bits=SURROGATE_BITS, batch=batch, lr=lr, device=device, progress=tqdm)
            train_s = time.time() - t0
            row = {"seed": seed, "train_seconds": round(train_s, 1),
                   **ex.distillation_row(model, args.task, grid["ls"], grid["zs"], n=grid["n_eval"], seed=99,
                                         n_hash_seeds=grid["n_hash_seeds"], device=device)}
            if args.task == "induction":
                # which layer breaks: hash one layer, keep the other on its stand-in (None), best z each
                l1, l2 = max(l[0] for l in grid["ls"]), max(l[1] for l in grid["ls"])
                for name, per_layer in (("layer1_hashed", lambda z: [(l1, z, 99), None]),
                                        ("layer2_hashed", lambda z: [None, (l2, z, 99 + 104729)])):
                    row[name] = min(ex.error_rate(model, args.task, n=grid["n_eval"], seed=99, anna=per_layer(z),
                                                  device=device) for z in grid["zs"])
            doc["rows"].append(row)
            best = min(min(r) for r in row["anna_error"])
            tqdm.write(f"seed {seed} {surrogate:>13}: surrogate error {row['surrogate_error']:.3f}, "
                       f"best ANNA error {best:.3f} ({train_s:.0f} s)")
            out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
