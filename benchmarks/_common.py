"""Shared plumbing for the benchmark scripts: timing, FLOP rates, the results table and JSON.

Every script writes ``benchmarks/results/<device>-<date>[-<op>].json`` with the schema

    {"device", "date", "versions": {...}, "rows": [{"op", "impl", "dtype", "B", "H", "T", "D",
                                                    "causal", "ms", "tflops", ...}]}

Speed targets live here, as printed tables and committed JSON -- never as timed tests.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import re
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return platform.processor() or platform.machine() or "cpu"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": str(torch.version.cuda)}
    for mod in ("triton", "fla", "attnlib"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - absent packages are simply not listed
            pass
    return out


def time_ms(fn, *, warmup_ms: float = 100, rep_ms: float = 500) -> float:
    """Median time of ``fn()`` in ms: CUDA events via triton.testing.do_bench on a GPU,
    a wall clock with a few repeats on the CPU (smoke runs only)."""
    if torch.cuda.is_available():
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    import statistics
    import time
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns} if rows else {}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(widths[c]) for c in columns))


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 1e4 else f"{x:.3g}"
    return "-" if x is None else str(x)


def write_results(rows: list[dict], *, op: str, out_dir: Path | None = None) -> Path:
    """Write the JSON file and return its path."""
    out_dir = Path(out_dir) if out_dir else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = device_name()
    date = _dt.date.today().isoformat()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", dev).strip("-").lower()
    path = out_dir / f"{slug}-{date}-{op}.json"
    path.write_text(json.dumps({"device": dev, "date": date, "versions": versions(), "rows": rows},
                               indent=1) + "\n")
    return path


def require_agreement(name: str, got: torch.Tensor, ref: torch.Tensor, what: str, tol: float = 2e-2) -> float:
    """Print ``got``'s relative RMS error against the float64 ``ref``; stop the benchmark (nothing is
    timed) when it is not finite or above ``tol`` -- a fast wrong kernel is not a result."""
    err = ((got.double() - ref).norm() / ref.norm()).item()
    print(f"[check] {name} vs {what}: relative RMS error {err:.2e}")
    if not math.isfinite(err) or err > tol:
        raise SystemExit(f"{name} disagrees with the reference (error {err:.2e}); not timing it")
    return err


def checkpoint(rows: list[dict], *, file_op: str, out_dir: Path | None, label: str, **match) -> None:
    """After each shape: rewrite the JSON named after ``file_op`` (a run cut short keeps what it
    measured) and print the times of the rows matching ``match``."""
    write_results(rows, op=file_op, out_dir=out_dir)
    done = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    print(f"[done] {label}: " + ", ".join(f"{r['impl']} {r['ms']:.3f} ms" for r in done), flush=True)


def add_sweep_arguments(ap, *, dtypes: str) -> None:
    """The options every sequence-length sweep shares (--smoke, --out, --dtypes, --D, --T, --B, --H)."""
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the torch paths")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON file")
    ap.add_argument("--dtypes", default=dtypes)
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--T", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=16)


# --- forward+backward passes and peak memory (appended for the chunked linear / delta benchmarks) ---

def forward_backward(fn, inputs, grad_out):
    """A closure for one training step's worth of work: ``fn(*inputs)`` forward, then the gradients
    of every input that requires one (``torch.autograd.grad``, so nothing accumulates in ``.grad``)."""
    wrt = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]

    def step():
        out = fn(*inputs)
        return torch.autograd.grad(out, wrt, grad_out)
    return step


def measured_peak_bytes(fn) -> int | None:
    """Peak CUDA memory allocated while ``fn()`` runs once (inputs included: they are allocated
    already), or None without a GPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())
