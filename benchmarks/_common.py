"""Shared plumbing for the benchmark scripts: timing, FLOP rates, the results table and JSON.

Every script writes ``benchmarks/results/<device>-<date>[-<op>].json`` with the schema

    {"device", "date", "versions": {...}, "rows": [{"op", "impl", "dtype", "B", "H", "T", "D",
                                                    "causal", "pass", "ms", "tflops",
                                                    "peak_mem_bytes", ...}]}

``pass`` is ``"fwd"`` (the forward alone, under ``torch.no_grad``) or ``"fwd+bwd"`` (forward, then the
gradients of all inputs for a fixed random output gradient). ``peak_mem_bytes`` is the peak of CUDA
memory allocated *during* one call, above what was allocated before it (so the inputs do not count;
outputs, saved activations and gradients do), from ``torch.cuda.max_memory_allocated``; ``None`` where
it was not measured (no GPU). A row that sets neither is written as a forward row with memory not
measured.

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

from attnlib.metrics import rel_rms

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# The anchor shapes (issue 13), (B, H, T, D) with Dv = D, bf16: the first four are its forward table, the last
# its forward+backward shape. Their one home: the chunked benchmarks (linear.py, deltanet.py) run both passes
# on all five, the static kernel report (kernel_report/) captures them, the GPU session's plan is checked
# against them (tests/test_gpu_session.py).
ANCHOR_SHAPES = ((4, 16, 4096, 64), (4, 16, 4096, 128), (4, 16, 16384, 128), (1, 8, 65536, 128),
                 (2, 16, 4096, 128))


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
    """Median time of ``fn()`` in ms: CUDA events via triton.testing.do_bench on a GPU; on the CPU, where
    only the smoke runs time anything (to check that a script runs and writes its schema, often through
    Triton's interpreter), the wall clock of one call."""
    if torch.cuda.is_available():
        import triton.testing
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    import time
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


PASSES = ("fwd", "fwd+bwd")


def as_pass(fn, inputs, pass_: str):
    """A zero-argument callable running ``fn()`` as the benchmark ``pass_``.

    ``"fwd"``: ``fn()`` under ``torch.no_grad()`` (nothing saved for a backward). ``"fwd+bwd"``: ``fn()``
    then ``torch.autograd.grad`` of its output (or of its first output) with respect to ``inputs``
    (tensors with ``requires_grad``) for one fixed random output gradient, drawn once here.
    """
    if pass_ == "fwd":
        def run_fwd():
            with torch.no_grad():
                return fn()
        return run_fwd
    if pass_ != "fwd+bwd":
        raise ValueError(f"pass must be one of {PASSES}; got {pass_!r}")

    def first(out):
        return out[0] if isinstance(out, (tuple, list)) else out
    probe = first(fn())
    grad = torch.randn(probe.shape, device=probe.device, dtype=probe.dtype,
                       generator=torch.Generator(device=probe.device).manual_seed(0))
    del probe

    def run_fwd_bwd():
        return torch.autograd.grad(first(fn()), inputs, grad)
    return run_fwd_bwd


def peak_mem_bytes(fn) -> int | None:
    """Peak CUDA memory allocated during one ``fn()`` above what was allocated before; ``None`` on CPU."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def measure(fn, inputs, pass_: str) -> dict:
    """``{"pass", "ms", "peak_mem_bytes"}`` of ``fn`` run as ``pass_`` (see :func:`as_pass`)."""
    run = as_pass(fn, inputs, pass_)
    return {"pass": pass_, "ms": time_ms(run), "peak_mem_bytes": peak_mem_bytes(run)}


def progress(iterable, *, desc: str, total: int | None = None):
    """A tqdm progress bar (on stderr) over the shapes of a sweep."""
    from tqdm.auto import tqdm
    return tqdm(iterable, desc=desc, total=total, dynamic_ncols=True)


def print_table(rows: list[dict], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns} if rows else {}
    print("  ".join(c.rjust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(_fmt(r.get(c)).rjust(widths[c]) for c in columns))


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.3f}" if abs(x) < 1e4 else f"{x:.3g}"
    return "-" if x is None else str(x)


def header() -> dict:
    """What every results file starts with: ``{"device", "date", "versions"}``."""
    return {"device": device_name(), "date": _dt.date.today().isoformat(), "versions": versions()}


def result_file(head: dict, op: str, out_dir: Path | None = None) -> Path:
    """``<out_dir>/<device>-<date>-<op>.json`` for the :func:`header` ``head`` (the directory is made)."""
    out_dir = Path(out_dir) if out_dir else RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "-", head["device"]).strip("-").lower()
    return out_dir / f"{slug}-{head['date']}-{op}.json"


def write_results(rows: list[dict], *, op: str, out_dir: Path | None = None) -> Path:
    """Write the JSON file and return its path."""
    rows = [{"pass": "fwd", "peak_mem_bytes": None, **r} for r in rows]       # the schema's defaults
    bad = [r["pass"] for r in rows if r["pass"] not in PASSES]
    if bad:
        raise ValueError(f"row pass must be one of {PASSES}; got {bad[0]!r}")
    head = header()
    path = result_file(head, op, out_dir)
    path.write_text(json.dumps({**head, "rows": rows}, indent=1) + "\n")
    return path


def require_agreement(name: str, got: torch.Tensor, ref: torch.Tensor, what: str, tol: float = 2e-2) -> float:
    """Print ``got``'s relative RMS error against the float64 ``ref``; stop the benchmark (nothing is
    timed) when it is not finite or above ``tol`` -- a fast wrong kernel is not a result."""
    err = rel_rms(got, ref)
    print(f"[check] {name} vs {what}: relative RMS error {err:.2e}")
    if not math.isfinite(err) or err > tol:
        raise SystemExit(f"{name} disagrees with the reference (error {err:.2e}); not timing it")
    return err


def checkpoint(rows: list[dict], *, file_op: str, out_dir: Path | None, label: str, **match) -> None:
    """After each shape: rewrite the JSON named after ``file_op`` (a run cut short keeps what it
    measured) and print the times of the rows matching ``match``."""
    write_results(rows, op=file_op, out_dir=out_dir)
    done = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    print(f"[done] {label}: " + ", ".join(f"{r['impl']} {r.get('pass', 'fwd')} {r['ms']:.3f} ms" for r in done),
          flush=True)


def add_sweep_arguments(ap, *, dtypes: str) -> None:
    """The options every sequence-length sweep shares (--smoke, --out, --dtypes, --D, --T, --B, --H)."""
    ap.add_argument("--smoke", action="store_true", help="tiny CPU run of the torch paths")
    ap.add_argument("--out", type=Path, default=None, help="directory for the JSON file")
    ap.add_argument("--dtypes", default=dtypes)
    ap.add_argument("--D", default="64,128")
    ap.add_argument("--T", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--H", type=int, default=16)
