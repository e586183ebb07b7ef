"""The worker subprocesses: one capture per (library, target) on its fake GPU, compile batches of the
distinct specialisations, run ``parallel`` at a time (``python -m benchmarks.kernel_report --worker ...``)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import ROOT
from .compile import _plain, describe_torch, describe_triton, specialise
from .fake_gpu import fake_gpu, pointer_loads
from .record import TorchLaunch, TritonLaunch, capture
from .targets import CHUNKED, COMPILED_TARGETS, TARGETS, shape_name

WORKER = [sys.executable, "-m", "benchmarks.kernel_report"]     # run from ROOT, ROOT on the path (_worker_env)

def capture_worker(lib: str, target_name: str, ops, shapes, spec_file: str | None,
                   every_config: bool = False, pointers: bool = False) -> dict:
    """One (library, target): every (op, shape) captured and described; the specialisations of the
    Triton launches pickled into ``spec_file`` for the compile step. ``every_config``: also the spill-table
    entries of every autotuning candidate (``"candidates"``: table, config key, width, specialisation)."""
    target = TARGETS[target_name]
    captures, specs, tabled = [], {}, []
    with fake_gpu(target), (pointer_loads() if pointers else contextlib.nullcontext()):
        for op in ops:
            if lib == "fla" and op not in CHUNKED:
                continue
            for shape in shapes:
                t0 = time.time()
                sink, calls = capture(lib, op, shape, every_config)
                for ln in sink:
                    if isinstance(ln, TritonLaunch) and ln.table:
                        for (a, kw, _), key in zip(ln.candidates, ln.config_keys):
                            tabled.append({"table": ln.table, "config_key": key, "width": ln.width,
                                           "spec": specialise(ln.fn, a, kw, target.sm)["id"]})
                triton_ = [describe_triton(ln, target, specs) for ln in sink if isinstance(ln, TritonLaunch)]
                torch_ = describe_torch([ln for ln in sink if isinstance(ln, TorchLaunch)])
                captures.append({"lib": lib, "op": op, "shape": list(shape), "target": target_name,
                                 "backend": "triton" if triton_ else "torch", "calls": calls,
                                 "launches": triton_ + torch_,
                                 "capture_s": round(time.time() - t0, 2)})
    if spec_file:
        with open(spec_file, "wb") as f:
            pickle.dump(specs, f)
    summary = {k: {"kernel": s["kernel"], "sm": s["sm"], "ref": s["ref"],
                   "consts": {c: _plain(v) for c, v in s["consts"].items()},
                   "num_warps": s["options"].num_warps, "num_stages": s["options"].num_stages}
               for k, s in specs.items()}
    return {"captures": captures, "specs": summary, "candidates": tabled}


# ----------------------------------------------------------------------------- running the workers

def _worker_env() -> dict:
    """The workers' environment: no interpreter; attnlib from PYTHONPATH if given (another checkout's
    kernels), else from this repository."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
    env["OMP_NUM_THREADS"] = "1"                          # each worker is one process on one core
    return env


@dataclass
class Job:
    """A worker subprocess: its command, and what to do with its output when it has finished."""
    what: str
    cmd: list
    done: object = None


def run_jobs(jobs: list[Job], parallel: int) -> None:
    """Run the jobs, at most ``parallel`` at a time, in list order; a finished job's ``done`` may add jobs
    (they run next). Raise with a worker's stderr if one fails."""
    running = []
    while jobs or running:
        while jobs and len(running) < parallel:
            job = jobs.pop(0)
            err = tempfile.TemporaryFile()
            running.append((job, err, subprocess.Popen(job.cmd, stdout=subprocess.DEVNULL, stderr=err,
                                                       env=_worker_env(), cwd=ROOT)))
        time.sleep(0.1)
        for item in list(running):
            job, err, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if proc.returncode:
                err.seek(0)
                for _, _, other in running:
                    other.kill()
                raise RuntimeError(f"{job.what} failed:\n{err.read().decode(errors='replace')[-6000:]}")
            if job.done:
                jobs[:0] = job.done() or []


def fla_available() -> str | None:
    """fla's version, or None where it is not installed."""
    try:
        from importlib.metadata import version
        return version("fla-core")
    except Exception:  # noqa: BLE001
        return None


COMPILE_BATCH = 12          # specialisations per compile worker: ~30 s of work for one ~2 s start-up


def collect(ops, shapes, targets, libs, compile_: bool, parallel: int, fla_targets=None,
            progress=sys.stderr, every_config: bool = False, pointer_targets=()) -> dict:
    """Capture every (library, target) in its own subprocess and compile attnlib's distinct
    specialisations for the compiled targets in batches, ``parallel`` subprocesses at a time. A target's
    compile batches start as soon as its capture is done (they run beside the other captures): attnlib's
    captures on the compiled targets go first, then the slow one (sm_75's PyTorch reference paths),
    then fla's."""
    work = Path(tempfile.mkdtemp(prefix="kernel-report-work-"))
    data = {"captures": [], "specs": {}, "compiled": {}, "candidates": {}}
    queued: set = set()
    t0 = time.time()

    def compile_batches(spec_file: Path) -> list[Job]:
        with open(spec_file, "rb") as f:
            todo = [(k, s) for k, s in pickle.load(f).items() if k not in queued]
        queued.update(k for k, _ in todo)
        todo.sort(key=lambda ks: ks[1]["kernel"])
        batches = []
        for i in range(0, len(todo), COMPILE_BATCH):
            path = work / f"compile-{len(queued)}-{i}.pkl"
            with open(path, "wb") as f:
                pickle.dump(todo[i:i + COMPILE_BATCH], f)
            batches.append(Job(f"compile {path.name}", [*WORKER, "--worker", "compile",
                                                         "--spec-file", str(path), "--worker-out",
                                                         str(path.with_suffix(".json"))],
                               functools.partial(read_compiled, path.with_suffix(".json"))))
        return batches

    def read_compiled(path: Path) -> None:
        data["compiled"].update(json.loads(path.read_text()))

    def read_capture(lib: str, target: str, out: Path, spec_file: Path) -> list[Job]:
        part = json.loads(out.read_text())
        data["captures"] += part["captures"]
        data["specs"].update(part["specs"])
        data["candidates"][target] = data["candidates"].get(target, []) + part["candidates"]
        print(f"  captured {lib} on {target} ({time.time() - t0:.0f} s)", file=progress)
        return compile_batches(spec_file) if compile_ and lib == "attnlib" and target in COMPILED_TARGETS else []

    # attnlib on the targets it runs PyTorch paths on first (the reference loops make the longest
    # capture), then on the compiled targets (their compile batches queue up as each finishes), then fla.
    order = [("attnlib", t) for t in targets if t not in COMPILED_TARGETS]
    order += [("attnlib", t) for t in targets if t in COMPILED_TARGETS]
    order += [("fla", t) for t in (fla_targets or targets) if "fla" in libs]
    order = [(lib, t, False) for lib, t in order] + [("attnlib", t, True) for t in pointer_targets]
    jobs = []
    for lib, target, pointers in order:
        lib_ops = [op for op in ops if lib == "attnlib" or op in CHUNKED]
        if not lib_ops:
            continue
        tag = f"{lib}-{target}" + ("-pointers" if pointers else "")
        out, spec_file = work / f"capture-{tag}.json", work / f"specs-{tag}.pkl"
        jobs.append(Job(f"capture {tag}",
                        [*WORKER, "--worker", "capture", "--lib", lib, "--targets", target,
                         "--ops", ",".join(lib_ops), "--shapes", ",".join(map(shape_name, shapes)),
                         "--worker-out", str(out), "--spec-file", str(spec_file)]
                        + (["--every-config"] if every_config else []) + (["--pointer-loads"] if pointers else []),
                        functools.partial(read_capture, lib, target, out, spec_file)))
    run_jobs(jobs, parallel)
    print(f"captured {len(data['captures'])} (library, op, shape, target), compiled {len(data['compiled'])} "
          f"distinct specialisations in {time.time() - t0:.0f} s", file=progress)
    return data
