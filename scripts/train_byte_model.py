"""Train chapter 1's real-input model: a small byte-level Transformer on chapter 6's corpus (53 modules of
Python's standard library), deterministically from a seed on one CPU thread (a few minutes).

    python scripts/train_byte_model.py                  # the committed run (attnbook.experiments.byte_model.CONFIG)
    python scripts/train_byte_model.py --steps 50 --out /tmp/byte_model     # a smoke run
    python scripts/train_byte_model.py --measure-only   # re-measure the committed weights, no training

Writes ``<out>.pt`` (the float16 state dict and the configuration, read by ``byte_model.load``) and
``<out>.json``: the configuration, the corpus, the training and validation bits per byte of the float16
weights (on fixed windows), the unigram and bigram baselines on the same validation windows, what each head
does (its mean attention mass per role, on the validation windows and on the book's snippet), device,
versions, date and the training time (for information only).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbook.experiments import byte_model as bm  # noqa: E402
from attnbook.experiments.grassmann import fixed_windows, n_params, stdlib_corpus  # noqa: E402
from benchmarks._common import device_name, versions  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=bm.CONFIG.steps)
    p.add_argument("--seed", type=int, default=bm.CONFIG.seed)
    p.add_argument("--out", default=str(ROOT / bm.WEIGHTS).removesuffix(".pt"),
                   help="output path without suffix (writes .pt and .json)")
    p.add_argument("--measure-only", action="store_true",
                   help="load <out>.pt instead of training and rewrite <out>.json (keeping its training time)")
    args = p.parse_args()
    torch.set_num_threads(1)
    cfg = dataclasses.replace(bm.CONFIG, steps=args.steps, seed=args.seed)

    corpus = stdlib_corpus()
    train_bytes, _, info = corpus
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.measure_only:
        previous = json.loads(out.with_suffix(".json").read_text())
        seconds, trained = previous["train_seconds"], previous["trained_on"]
        cfg = bm.load(out.with_suffix(".pt")).config
    else:
        t0 = time.perf_counter()
        model = bm.train(cfg, corpus)
        seconds, trained = round(time.perf_counter() - t0, 1), datetime.date.today().isoformat()
        bm.save(model, cfg, out.with_suffix(".pt"))
    model = bm.load(out.with_suffix(".pt"))                   # measure what is committed: float16 weights
    xv, yv = bm.validation_windows(cfg, corpus)
    xt, yt = fixed_windows(train_bytes, cfg.val_windows, cfg.seq_len)
    val_bpb, train_bpb = bm.bits_per_byte(model, xv, yv), bm.bits_per_byte(model, xt, yt)
    base = bm.baselines(train_bytes, xv, yv)
    uniform_val = bm.uniform_roles(xv)
    corpus_roles = bm.describe_heads(bm.corpus_head_roles(model, xv), uniform_val)
    att = bm.snippet_attention(bm.SNIPPET, model)
    uniform_snippet = bm.uniform_roles(att.tokens)
    snippet_roles = bm.describe_heads(bm.head_roles(att.weights, att.tokens), uniform_snippet)

    result = dict(
        what="chapter 1's real input: a byte-level causal softmax Transformer on chapter 6's corpus",
        config=dataclasses.asdict(cfg),
        warmup_steps=max(1, cfg.steps // 10),
        params=n_params(model),
        weights_file=out.with_suffix(".pt").name,
        weights_bytes=out.with_suffix(".pt").stat().st_size,
        corpus=dict(info, source="attnbook.experiments.grassmann.stdlib_corpus", val_fraction=0.1),
        eval=dict(windows=cfg.val_windows, window_bytes=cfg.seq_len,
                  how="fixed_windows (evenly spaced, non-overlapping), float16 weights"),
        train_bits_per_byte=train_bpb,
        val_bits_per_byte=val_bpb,
        baselines_bits_per_byte=dict(base, how="add-one smoothed byte frequencies of the training text, "
                                               "scored on the same validation windows"),
        snippet=bm.SNIPPET,
        head_roles_how=("mean attention mass a query puts on each role's keys (attnbook.experiments.byte_model."
                        "head_roles), layer and head counted from 0 (the figure's head 1.4 is layer 0, head 3); "
                        "'role': the role whose mass most exceeds a uniform head's"),
        head_roles_validation=corpus_roles,
        uniform_head_validation=uniform_val,
        head_roles_snippet=snippet_roles,
        uniform_head_snippet=uniform_snippet,
        device=device_name(),
        torch_threads=torch.get_num_threads(),
        versions=versions(),
        trained_on=trained,
        date=datetime.date.today().isoformat(),
        train_seconds=seconds,
    )
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(f"{seconds:.0f} s; val {val_bpb:.3f} bits/byte (train {train_bpb:.3f}); "
          f"unigram {base['unigram']:.3f}, bigram {base['bigram']:.3f}")
    for row in corpus_roles:
        print(f"L{row['layer'] + 1}H{row['head'] + 1} ({row['role']}): "
              + ", ".join(f"{r} {row[r]:.2f}" for r in bm.ROLES))


if __name__ == "__main__":
    main()
