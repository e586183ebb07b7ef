"""The command line (``scripts/kernel_report.py``, ``python -m benchmarks.kernel_report``): the report, a
part of it, the spill tables, the fingerprint, or a worker's job."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton

import benchmarks.kernel_report as package

from . import RESULT, ROOT
from .compile import compile_worker
from .jobs import capture_worker, collect, fla_available
from .record import VARIANTS
from .report import (
    AUTOTUNED,
    BYTES,
    SDPA_MODEL,
    SPILL_SHAPES,
    TORCH_PATHS,
    build_report,
    dumps,
    inputs_stamp,
    print_report,
    print_spill_tables,
    spill_tables,
)
from .targets import COMPILED_TARGETS, OPS, SHAPES, TARGETS, parse_shape, shape_name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=package.__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {','.join(OPS)}")
    ap.add_argument("--shapes", default=",".join(map(shape_name, SHAPES)), help="comma-separated BxHxTxD")
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, from {','.join(TARGETS)}")
    ap.add_argument("--no-fla", action="store_true", help="attnlib only")
    ap.add_argument("--fla-targets", help="capture fla on these targets only (default: every --targets)")
    ap.add_argument("--no-compile", action="store_true", help="capture only: launches and bytes")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel worker processes")
    ap.add_argument("--no-save", action="store_true", help=f"do not write {RESULT.relative_to(ROOT)}")
    ap.add_argument("--json-out", help="write the report to this file (as well)")
    ap.add_argument("--fingerprint", action="store_true", help="print the hash of the report's inputs and exit")
    ap.add_argument("--spill-tables", action="store_true",
                    help="compile every autotuning candidate of attnlib's kernels (every op and variant, D "
                         "64/128/256, sm_80/89/90, on sm_90 both load paths) and print the SPILLS tables "
                         "their pruning hooks read")
    ap.add_argument("--every-config", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pointer-loads", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=("capture", "compile"), help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--spec-file", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.fingerprint:
        print(inputs_stamp()["inputs_sha256"])
        return 0
    ops = [o for o in a.ops.split(",") if o]
    shapes = [parse_shape(s) for s in a.shapes.split(",") if s]
    targets = [t for t in a.targets.split(",") if t]
    for o in ops:
        if o not in OPS + VARIANTS:
            ap.error(f"unknown op {o!r}")
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}")
    if a.worker == "capture":
        out = capture_worker(a.lib, targets[0], ops, shapes, a.spec_file, a.every_config, a.pointer_loads)
        Path(a.worker_out).write_text(json.dumps(out))
        return 0
    if a.worker == "compile":
        Path(a.worker_out).write_text(json.dumps(compile_worker(a.spec_file)))
        return 0

    if a.spill_tables:               # every op and variant; on sm_90 both load paths (descriptors, pointers)
        data = collect(list(OPS + VARIANTS), SPILL_SHAPES, COMPILED_TARGETS, ["attnlib"], True, max(1, a.jobs),
                       every_config=True, pointer_targets=["sm_90"])
        print_spill_tables(spill_tables(data))
        return 0
    fla = None if a.no_fla else fla_available()
    if fla is None and not a.no_fla:
        print("[warn] fla-core is not installed: the report has no anchor for the chunked ops", file=sys.stderr)
    libs = ["attnlib"] + (["fla"] if fla else [])
    t0 = time.time()
    fla_targets = [t for t in (a.fla_targets or "").split(",") if t in targets] or None
    data = collect(ops, shapes, targets, libs, not a.no_compile, max(1, a.jobs), fla_targets)
    report = {"what": "static performance report: every kernel launch of attnlib's ops (backend='auto') and "
                      "of fla's, on fake GPUs of the targets; attnlib's Triton launches compiled for sm_80/89/90. "
                      "Nothing ran on a GPU; nothing is timed.",
              "dtype": "bf16", "ops": ops, "shapes": [shape_name(s) for s in shapes],
              "targets": {t: {"gpu": TARGETS[t].gpu, "sms": TARGETS[t].sms,
                              "shared_memory_per_block": TARGETS[t].shared_memory} for t in targets},
              "bytes": BYTES, "softmax_anchor": SDPA_MODEL, "autotuned": AUTOTUNED, "torch_paths": TORCH_PATHS,
              "triton": triton.__version__, "torch": torch.__version__, "fla": fla,
              "date": datetime.date.today().isoformat(), "seconds": round(time.time() - t0, 1),
              **build_report(data, ops, shapes, targets)}
    everything = (ops == list(OPS) and shapes == list(SHAPES) and targets == list(TARGETS) and fla
                  and fla_targets is None and not a.no_compile)
    if everything:                   # the default, complete report: reusable while its inputs are unchanged
        report.update(inputs_stamp())
    print_report(report)
    text = dumps(report)
    if a.json_out:
        Path(a.json_out).write_text(text)
    if not a.no_save:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(text)
        print(f"\nwrote {RESULT.relative_to(ROOT)}", file=sys.stderr)
    return 0
