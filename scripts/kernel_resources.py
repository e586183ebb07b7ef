"""Registers, spills and shared memory of every Triton kernel of ``attnlib`` (chunked, flash, block-sparse,
sliding-window, top-k, ANNA, Grassmann), compiled on the CPU for an A100 (sm_80), an L4 (sm_89) or an H100
(sm_90; the default), at D = 64, 128, 256 in bf16 and fp16, every variant the wrappers launch (causal and
not, the fused flash backward, the dq-only delta backward, ...): the matrix behind the
autotuners' ``SPILLS`` tables and the resource tests. A compile-time resource report, not a timing:
nothing runs on a GPU. (``kernel_report.py`` is the report at the benchmark shapes, with bytes and fla
beside.)

How. Each kernel package declares its workloads, the forward and backward through its launch wrappers
(``FAMILY`` in ``attnlib/kernels/<package>/__init__.py``; the packages are those ``attnlib.mechanisms``
names). They run under ``FakeTensorMode`` on a fake CUDA device, so every block
size, warp count and stage count is the one they would choose on a GPU (``common/launch.py``). Each
kernel launch is intercepted instead of run; its arguments go through Triton's own binder (the
specialisation the JIT would make: pointer and integer divisibility by 16, integers equal to 1 as
constants; a tensor descriptor's dtype and box) and the kernel is compiled with ``triton.compile`` for
the target (``--sm``; the device queries -- compute capability, shared memory per block -- answer for it:
``benchmarks.kernel_report.fake_gpu``). Triton hands the PTX to its bundled ``ptxas -v``; we capture that
log for registers per thread and spill bytes, read the shared memory Triton allocates from the compiled
metadata, and from the PTX which instruction the products lower to (``wgmma``, ``mma.sync`` or neither:
FMA) and whether tiles are loaded by TMA.

Autotuned kernels would benchmark on a GPU. Here the autotuner's launch is intercepted too: its
``early_config_prune`` hook runs (with the real arguments and the target's shared memory and spill
table) and every configuration it keeps -- any of which the autotuner may pick -- is captured as its
own launch, after the configuration's pre-hook (which sets the tensor descriptors' boxes).
``--every-config`` skips the hook and captures the whole ``configs`` list (to see what the hook removes).
``--no-tma`` takes the pointer loads on sm_90 too (the fallback of the descriptor path). The
workloads fix what the head width does not: the block-sparse mask's block (128, the largest tiles its
wrappers launch), the sliding-window band (512: a runtime integer, registers do not depend on it), top-k's
keys per query, ANNA's tables, the Grassmann rank.

Run with TRITON_INTERPRET unset, from the repository root:

    python scripts/kernel_resources.py                       # D 64/128/256, bf16+fp16
    python scripts/kernel_resources.py --dims 128 --dtypes bf16 --kernels _bwd_dqk_kernel --no-save
    python scripts/kernel_resources.py --kernels _flash_fwd_kernel --every-config --no-save
    python scripts/kernel_resources.py --sm 80 89 90 --workloads "flash fused" --no-save

The ``SPILLS`` tables themselves come from ``kernel_report.py --spill-tables``.

``--json-stdout`` prints the rows as one JSON line. ``--checked-runs`` compiles the runs that
``tests/test_kernel_registers.py`` asserts on (``benchmarks._register_runs.CHECKED_RUNS``), each in its own
process, and writes their rows with the inputs they were made from to ``benchmarks/results/kernel_registers_cache.json``
(``python -m benchmarks._artifacts`` says whether that file is current; ``make artifacts`` remakes it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import triton
from torch._subclasses.fake_tensor import FakeTensorMode

# The capture and compile machinery lives in benchmarks/kernel_report/ (importing it sets the Triton
# environment: interpreter off -- attnlib's kernels are imported later, in workloads() -- and ptxas on every
# compile).
from benchmarks.kernel_report import ROOT
from benchmarks.kernel_report.compile import compile_spec, specialise
from benchmarks.kernel_report.fake_gpu import fake_gpu, pointer_loads
from benchmarks.kernel_report.record import TritonLaunch, is_descriptor, recording
from benchmarks.kernel_report.targets import TARGETS

SMS = (80, 89, 90)                                # A100, L4, H100: the targets auto runs the kernels on
RESULT = ROOT / "benchmarks" / "results" / "kernel_resources.json"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SEQ_LEN = 4096                                    # the length the integers are specialised for (T % 16 == 0)
CACHE = ROOT / "benchmarks" / "results" / "kernel_registers_cache.json"

# ----------------------------------------------------------------------------- what the wrappers launch

def workloads(D: int, dtype: torch.dtype) -> dict:
    """Forward and backward of every kernel package at head dim ``D`` (Dv = D), as callables: each package's
    ``FAMILY.workloads`` (``attnlib/kernels/common/family.py``), found through ``attnlib.mechanisms``; a
    package whose kernels stop below ``D`` has none there (wider heads take the PyTorch path)."""
    from attnlib.mechanisms import kernel_families

    out = {}
    for family in kernel_families():
        out.update(family.workloads_at(D, dtype, torch.device("cuda"), SEQ_LEN))
    return out


def launches(D: int, dtype: torch.dtype, sm: int, names=None, every_config: bool = False, only=None) -> list[dict]:
    """Every distinct kernel specialisation the wrappers launch at ``D`` in ``dtype`` on ``sm_<sm>`` (for
    an autotuned kernel: every candidate its pruning hook keeps, or with ``every_config`` all of its
    configs; ``kernel_report.record.recording``); ``only``: these workloads. Run inside ``fake_gpu``."""
    seen, out = {}, []
    for workload, run in workloads(D, dtype).items():
        if only and workload not in only:
            continue
        sink: list = []
        with FakeTensorMode(), recording(sink, ["fwd"], every_config):
            run()
        for launch in sink:
            if not isinstance(launch, TritonLaunch) or (names and launch.fn.__name__ not in names):
                continue
            for args, kwargs, _ in launch.candidates:
                spec = specialise(launch.fn, args, kwargs, sm)
                if spec["id"] in seen:
                    seen[spec["id"]]["used_by"].append(workload)
                    continue
                entry = {**spec, "used_by": [workload], "descriptors": any(map(is_descriptor, args))}
                seen[spec["id"]] = entry
                out.append(entry)
    return out


# ----------------------------------------------------------------------------- compile and count

_COUNTED: dict = {}


def compile_and_count(entry: dict) -> dict:
    """Compile one launch for its target and read ptxas's counts (``kernel_report.compile.compile_spec``;
    memoised: the same specialisation recurs across D, e.g. the triangular solve, and Triton would not
    run ptxas again for it)."""
    if entry["id"] not in _COUNTED:
        _COUNTED[entry["id"]] = _row(entry, compile_spec(entry))
    return {**_COUNTED[entry["id"]], "used_by": list(entry["used_by"])}


def _row(entry: dict, res: dict) -> dict:
    c = entry["consts"]
    flags = [k for k, v in c.items() if v is True]
    tiles = ("CHUNK", "BLOCK_D", "BLOCK_DV")    # BLOCK_M, BLOCK_N, BS: in the flags
    flags += [f"{k}={v}" for k, v in c.items() if type(v) is int and k not in tiles]
    flags += [f"{k}={v}" for k, v in entry["signature"].items() if k in ("O", "V") and v == "*fp32"]
    return {"kernel": entry["kernel"], "sm": entry["sm"], "flags": flags, "mma": res["mma"], "tma": res["tma"],
            "chunk": c.get("CHUNK"), "block_d": c.get("BLOCK_D"),
            "block_v": c.get("BLOCK_DV"),
            "num_warps": entry["options"].num_warps, "num_stages": entry["options"].num_stages,
            "registers": res["registers"], "spill_store_bytes": res["spill_store_bytes"],
            "spill_load_bytes": res["spill_load_bytes"], "shared_bytes": res["shared_bytes"]}


def _launch_shape(entry: dict) -> tuple:
    """A launch up to its head width: kernel, constants other than the head tiles, warps and stages."""
    consts = {k: v for k, v in entry["consts"].items() if k not in ("BLOCK_D", "BLOCK_DV")}
    return entry["kernel"], repr(sorted(consts.items())), entry["options"].num_warps, entry["options"].num_stages


def report(dims, dtypes, names=None, progress=sys.stderr, every_config: bool = False, only=None,
           widest_only: bool = False, sms=(90,), tma: bool = True) -> list[dict]:
    """Compile and count every launch, for each target in ``sms``. ``widest_only``: a launch that recurs
    at several head widths (the same autotuning candidate kept at D 64 and 128) is compiled at the
    widest only -- the registers of a configuration never fell when D shrank, in every row of the
    saved report. ``tma=False``: the pointer path on sm_90 too (``kernel_report.fake_gpu.pointer_loads``)."""
    rows = []
    for sm in sms:
        with fake_gpu(TARGETS[f"sm_{sm}"]), (contextlib.nullcontext() if tma else pointer_loads()):
            for dt in dtypes:
                done: dict = {}                    # launch shape -> its row (widest_only)
                for D in sorted(dims, reverse=widest_only):
                    for entry in launches(D, DTYPES[dt], sm, names, every_config, only):
                        if widest_only and _launch_shape(entry) in done:
                            # compiled at a wider head: the row stands for these workloads too
                            row = done[_launch_shape(entry)]
                            row["used_by"] += [w for w in entry["used_by"] if w not in row["used_by"]]
                            continue
                        row = {"D": D, "dtype": dt, **compile_and_count(entry)}
                        done[_launch_shape(entry)] = row
                        rows.append(row)
                        if progress:
                            print(fmt_row(row), file=progress, flush=True)
    return rows


HEADER = (f"{'sm':>3} {'kernel':<29} {'flags':<40} {'D':>4} {'dtype':<5} {'chunk':>5} {'BD':>4} {'BV':>4} "
          f"{'warps':>5} {'stages':>6} {'regs':>4} {'spill st/ld B':>14} {'smem B':>7} {'mma':>8} tma")


def fmt_row(r: dict) -> str:
    return (f"{r['sm']:>3} {r['kernel']:<29} {','.join(r['flags']):<40} {r['D']:>4} {r['dtype']:<5} "
            f"{r['chunk'] or '-':>5} {r['block_d'] or '-':>4} {r['block_v'] or '-':>4} {r['num_warps']:>5} "
            f"{r['num_stages']:>6} {r['registers']:>4} "
            f"{str(r['spill_store_bytes']) + '/' + str(r['spill_load_bytes']):>14} {r['shared_bytes']:>7} "
            f"{r['mma']:>8} {'yes' if r['tma'] else 'no'}")


def _one_run(name: str) -> tuple[str, list[dict], float]:
    from benchmarks._register_runs import CHECKED_RUNS

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    t0 = time.time()
    proc = subprocess.run([sys.executable, __file__, "--no-save", "--json-stdout", *CHECKED_RUNS[name]],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: {proc.stderr[-4000:]}")
    return name, json.loads(proc.stdout.strip().splitlines()[-1]), time.time() - t0


def checked_runs(jobs: int) -> int:
    """Compile every run of ``benchmarks._register_runs.CHECKED_RUNS`` (``jobs`` processes at a time; each
    compile is single-threaded) and write CACHE, stamped with the inputs it was made from. (The runs are
    imported here, after ``benchmarks.kernel_report`` switched the interpreter off: they are built from the
    kernel packages' records, which imports the kernels.)"""
    from benchmarks import _artifacts as artifacts
    from benchmarks._register_runs import CHECKED_RUNS

    stamp = artifacts.stamp(artifacts.by_script(__file__))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = {}
        for name, rows, seconds in pool.map(_one_run, sorted(CHECKED_RUNS)):
            print(f"{name}: {len(rows)} launches compiled in {seconds:.0f} s", file=sys.stderr, flush=True)
            done[name] = {"args": CHECKED_RUNS[name], "rows": rows}
    if artifacts.stamp(artifacts.by_script(__file__)) != stamp:
        print("the kernels or this script changed while they were compiled: run it again", file=sys.stderr)
        return 2
    CACHE.write_text(json.dumps({**stamp, "triton": triton.__version__, "torch": torch.__version__,
                                 "date": datetime.date.today().isoformat(), "runs": done}, indent=0, sort_keys=True)
                     + "\n")
    print(f"wrote {CACHE.relative_to(ROOT)}", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checked-runs", action="store_true",
                    help=f"compile the runs the register tests read and write {CACHE.relative_to(ROOT)}")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes at a time (--checked-runs)")
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--sm", type=int, nargs="+", default=[90], choices=SMS,
                    help="targets: 80 (A100), 89 (L4; also the sm_86 parts' table), 90 (H100); default 90")
    ap.add_argument("--no-tma", action="store_true",
                    help="the pointer loads on sm_90 too (the fallback of the tensor-descriptor path; not saved)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=sorted(DTYPES))
    ap.add_argument("--kernels", default="", help="comma-separated kernel names (default: all)")
    ap.add_argument("--no-save", action="store_true", help=f"do not write {RESULT.relative_to(ROOT)}")
    ap.add_argument("--json-stdout", action="store_true", help="print the rows as one JSON line")
    ap.add_argument("--every-config", action="store_true",
                    help="autotuned kernels: every configuration, not only those the pruning hook keeps (not saved)")
    ap.add_argument("--workloads", default="", help="comma-separated workloads, e.g. 'flash non-causal' (default: all)")
    ap.add_argument("--widest-only", action="store_true",
                    help="compile a launch that recurs at several --dims at the widest only (not saved)")
    a = ap.parse_args(argv)
    if a.checked_runs:
        return checked_runs(max(1, a.jobs))
    names = set(filter(None, a.kernels.split(",")))
    only = set(filter(None, a.workloads.split(",")))
    print(HEADER, file=sys.stderr)
    rows = report(a.dims, a.dtypes, names or None, every_config=a.every_config, only=only or None,
                  widest_only=a.widest_only, sms=a.sm, tma=not a.no_tma)
    if a.json_stdout:
        print(json.dumps(rows))
    if not (a.no_save or a.every_config or a.widest_only or only or a.no_tma):
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        meta = {"what": "compile-time resources of the chunked, flash, block-sparse and sliding-window kernels "
                        "(ptxas -v), "
                        "not a timing; autotuned kernels: one row per candidate the pruning hook keeps",
                "target": ", ".join(f"cuda sm_{sm}" for sm in a.sm) + ", warp size 32", "triton": triton.__version__,
                "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                "seq_len_specialised": SEQ_LEN, "workloads": "each kernel package's FAMILY.workloads",
                "rows": rows}
        RESULT.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"wrote {RESULT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
