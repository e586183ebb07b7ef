"""Every GPU check of the project in a few time-boxed calls on a lent GPU machine: `tests/test_gpu.py`,
the benchmarks at the anchor shapes, the labs at full scale. What each step produces is packed into
``$OUT`` as soon as the step ends, so a call cut short keeps what it measured.

That machine has torch, triton, pytest, scipy and tqdm but reaches no package index, runs one command
for at most 10 minutes, and returns at most 8 files from ``$OUT``. Hence three commands.

**Here**, before asking for the device (needs pip and the internet; about 30 MB)::

    python scripts/gpu_session.py wheels

downloads fla and the Jupyter stack that runs the labs (the versions installed here, fla pinned) as
CPython 3.12 manylinux wheels into ``.whl/`` (git-ignored), and checks that every dependency they declare
is among them or on the device's image.

**On the device**, one ``run`` call per line, ``.whl`` carried, each inside the 10-minute limit::

    python3 scripts/gpu_session.py run tests bench:linear,deltanet --budget 540
    python3 scripts/gpu_session.py run bench:attention,block_sparse,topk,anna,grassmann --budget 540
    python3 scripts/gpu_session.py run labs:01,02,03,04 --budget 540
    python3 scripts/gpu_session.py run labs:05,06,07,a1 --budget 540

A session's 30 minutes of device time, a machine's start included, hold about three such calls: put
first what has never been measured. ``tests:EXPR`` runs only the GPU tests ``pytest -k EXPR`` selects.

Each ``run`` installs ``.whl`` into ``/tmp/site``, then runs its steps in the order given, each in its own
process group with Triton's interpreter off (on, where there is no GPU: a rehearsal on a CPU runs the
steps as CI would, the GPU tests skipped). A step may use what is left of ``--budget`` less a margin for
packing, and is stopped at that deadline; one that cannot start in time is recorded as skipped.
``$OUT`` then holds ``session.log`` (all the steps printed), ``summary.json`` (device, versions, and each
step's command, exit code, seconds and whether it was stopped) and ``results.tar``: the benchmarks' JSON
(schema in ``benchmarks/_common.py``), test_gpu's cases with their measured errors, and the labs' times,
each named ``<device>-<date>-<what>.json``.

**Or let the ledger choose** what to run in one call (on the device, ``.whl`` carried)::

    python3 scripts/gpu_session.py next --budget 540

``next`` reads the ledger -- ``benchmarks/results/*-ledger.json``, one row per step a lent GPU ran: its
fingerprint, exit code and seconds -- and runs, in :data:`LEDGER`'s order (correctness first, then speed
against the anchors, then the labs at full scale), the steps not yet done for the present code that fit
the budget, by each step's last measured time (:data:`ESTIMATE_S` before it has one). A step is done when
a GPU ran it cleanly with the same fingerprint: the code it executes (every repository file, as the
committed artifacts are stamped, ``attnbook._provenance``) and the torch and Triton it ran with. Each step
adds its row to ``$OUT``'s ledger file as it ends. ``next --dry-run`` prints the plan and runs nothing.

**Back here**::

    python scripts/gpu_session.py unpack PATH/results.tar

puts those files into ``benchmarks/results/``. A file that is already there is merged row by row when it
comes from the same device and versions, and refused otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
SITE = Path("/tmp/site")
MARGIN_S = 15            # kept back from every step's deadline to write the summary and the tar

# What the device lacks: fla (pinned: the version whose kernels the benchmarks call) and what nbclient
# needs to execute a lab. Everything else the labs import (torch, triton, numpy, scipy, tqdm) is there.
FLA = {"fla-core": "0.6.0", "flash-linear-attention": "0.6.0"}
LAB_STACK = (
    "nbclient", "nbformat", "ipykernel", "ipython", "jupyter_client", "jupyter_core", "traitlets",
    "pyzmq", "tornado", "debugpy", "comm", "plotly", "narwhals", "ipywidgets", "widgetsnbextension",
    "jupyterlab_widgets", "anywidget", "psygnal", "matplotlib-inline", "jedi", "parso", "pexpect",
    "ptyprocess", "prompt_toolkit", "wcwidth", "stack_data", "executing", "asttokens", "pure_eval",
    "platformdirs", "fastjsonschema", "jsonschema", "jsonschema-specifications", "referencing",
    "rpds-py", "ipython_pygments_lexers", "nest-asyncio2",
)
# The device image's package list, as the workplace documents it ("Packages: a, b, ...").
DEVICE_PACKAGE_LIST = Path("/work/.library/device/KINDS.md")
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_34_x86_64", "manylinux1_x86_64")
DEVICE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython",
                  "extra": ""}

# The benchmark scripts and the arguments that make them measure the anchor shapes: B4 H16 T4096 D64 and
# D128, B4 H16 T16384 D128, B1 H8 T65536 D128 and B2 H16 T4096 D128 in bf16 (linear.py and deltanet.py
# run exactly these as their default ``--shapes issue``; block_sparse, topk, anna and grassmann have
# their own sweeps).
BENCH = {
    "linear": [],
    "deltanet": [],
    "attention": ["--dtypes", "bf16", "--T", "4096,16384", "--D", "64,128", "--long", "1,8,65536,128"],
    "block_sparse": [],
    "window": [],
    "topk": [],
    "anna": [],
    "grassmann": [],
}
LABS = {p.name.split("_")[0]: p for p in sorted((ROOT / "notebooks").glob("*_lab.ipynb"))}   # not the exercises

# The ledger: every slice of the GPU work, in the order a lent GPU should spend its minutes on them --
# every kernel against float64 (bf16 first, one family a slice), then each benchmark against its anchor
# (fla for the chunked operators, SDPA for softmax), then each lab at full scale. Profiling the worst
# ratio and tuning is left to a person with the numbers in hand.
TEST_FAMILIES = ("softmax or sliding_window", "block_sparse", "linear or delta", "anna or grassmann or topk")
LEDGER = (
    *(f"tests:bfloat16 and ({family})" for family in TEST_FAMILIES),
    "tests:not (bfloat16 and (" + " or ".join(TEST_FAMILIES) + "))",     # the rest: fp16, fp32, no dtype
    "bench:linear", "bench:deltanet", "bench:attention", "bench:block_sparse", "bench:window",
    "bench:topk", "bench:anna", "bench:grassmann",
    *(f"labs:{name}" for name in LABS),
)
# Seconds a step is expected to take before a GPU has run it (a guess, replaced by the ledger's last
# measured time for the step): the test slices and benchmarks include Triton's first-call compiling.
ESTIMATE_S = {"tests": 150, "bench": 180, "labs": 180}
INSTALL_S = 30           # installing the carried wheels, and reading the environment


# --------------------------------------------------------------------------------------------------
# The steps of a run


def parse_steps(words: list[str]) -> list[tuple[str, str]]:
    """``["tests", "bench:linear,deltanet", "labs"]`` -> ``[("tests", ""), ("bench", "linear"), ...]``,
    one pair per step; ``bench`` and ``labs`` alone mean all of them, in the tables' order; after
    ``tests:`` comes a pytest ``-k`` expression."""
    steps = []
    for word in words:
        kind, _, names = word.partition(":")
        table = {"bench": BENCH, "labs": LABS}.get(kind)
        if kind == "tests":
            steps.append(("tests", names))
            continue
        if table is None:
            raise ValueError(f"step must be tests[:k-expression], bench[:names] or labs[:names]; got {word!r}")
        chosen = names.split(",") if names else list(table)
        unknown = [n for n in chosen if n not in table]
        if unknown:
            raise ValueError(f"{kind}: unknown {unknown}; expected some of {sorted(table)}")
        steps += [(kind, n) for n in chosen]
    return steps


def step_command(kind: str, name: str, work: Path) -> list[str]:
    """The process a step runs (every output lands under ``work``)."""
    py = sys.executable
    if kind == "tests":
        select = ["-k", name] if name else []
        return [py, "-m", "pytest", "tests/test_gpu.py", "-o", "addopts=", "-v", "-rfEs", *select,
                "-p", "no:cacheprovider", f"--junitxml={work / 'test_gpu.xml'}"]
    if kind == "bench":
        return [py, f"benchmarks/{name}.py", "--out", str(work / "results"), *BENCH[name]]
    return [py, str(Path(__file__).resolve()), "_lab", str(LABS[name]), "--out", str(work / "labs")]


def run_step(cmd: list[str], env: dict, log, seconds: float) -> dict:
    """Run ``cmd`` in its own process group, its output appended to ``log``; stop the whole group
    (a lab's kernel too) after ``seconds``."""
    start = time.perf_counter()
    log.write(f"\n$ {' '.join(cmd)}   (at most {seconds:.0f} s)\n")
    log.flush()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    stopped = False
    try:
        rc = proc.wait(timeout=max(seconds, 0))
    except subprocess.TimeoutExpired:
        stopped = True
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
    secs = time.perf_counter() - start
    log.write(f"[{'stopped' if stopped else 'exit ' + str(rc)} after {secs:.1f} s]\n")
    log.flush()
    return {"command": cmd, "rc": rc, "seconds": round(secs, 1), "stopped": stopped}


def install_wheels(log) -> dict:
    """``.whl/*.whl`` into ``/tmp/site`` (no index, no dependencies: the set was closed by ``wheels``)."""
    wheels = sorted(WHEELS.glob("*.whl"))
    if not wheels:
        log.write("no .whl/ carried: fla and the labs' Jupyter stack will be missing\n")
        return {"wheels": 0}
    if sys.version_info[:2] != (3, 12):
        log.write(f"the wheels are for CPython 3.12, this is {sys.version.split()[0]}: not installed\n")
        return {"wheels": 0}
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, wheels)]
    return {"wheels": len(wheels), **run_step(cmd, os.environ.copy(), log, 120)}


def step_env(work: Path) -> dict:
    """The environment every step runs in: the carried wheels and the repository importable, output
    unbuffered, the labs with their own seeds (at full scale on a GPU), and Triton's interpreter off
    where there is a GPU (on without one, so that a rehearsal on a CPU runs the labs as CI does)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNBOOK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(TRITON_INTERPRET="0" if shutil.which("nvidia-smi") else "1", PYTHONUNBUFFERED="1",
               ATTNLIB_GPU_ERRORS=str(work / "gpu_errors.json"))
    return env


def run(args, prints: dict[str, str] | None = None) -> int:
    """Run ``args.steps`` within ``args.budget``; with ``prints`` (step -> fingerprint, from ``next``), add
    each step's row to the ledger file in ``$OUT`` as it ends."""
    steps = parse_steps(args.steps)
    out = Path(args.out or os.environ.get("OUT") or ROOT / "_build" / "gpu_session")
    work = Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    (work / "results").mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget - MARGIN_S
    summary = {"steps": []}
    with open(out / "session.log", "a") as log:
        summary["install"] = install_wheels(log)
        env = step_env(work)
        summary["environment"] = describe_environment(env, log)
        for kind, name in steps:
            left = deadline - time.monotonic()
            if left < 20:
                summary["steps"].append({"step": f"{kind}:{name}", "skipped": "budget spent"})
                continue
            record = run_step(step_command(kind, name, work), env, log, left)
            label = f"{kind}:{name}" if name else kind
            summary["steps"].append({"step": label, **record})
            collect(work, env, log)
            if prints is not None:
                write_ledger_row(work / "results", summary["environment"], label, prints.get(label), record)
            pack(work / "results", out, summary)
    bad = [s for s in summary["steps"] if s.get("rc") not in (0, None) or "skipped" in s or s.get("stopped")]
    print(f"{len(summary['steps']) - len(bad)} of {len(summary['steps'])} steps finished cleanly; "
          f"see {out / 'summary.json'}")
    return 1 if bad else 0


def write_ledger_row(results: Path, environment: dict, step: str, print_: str | None, record: dict) -> Path:
    """Append one step's row to this session's ledger file (``<device>-<date>-ledger.json``)."""
    head = {k: environment.get(k) for k in ("device", "date", "versions")}
    head["gpu"] = bool(environment.get("nvidia_smi"))          # nvidia-smi answered: a GPU ran the step
    head["device"] = head["device"] or "unknown device"
    head["date"] = head["date"] or time.strftime("%Y-%m-%d")
    # benchmarks._common.result_file's name, spelled here: this process does not import torch
    slug = re.sub(r"[^A-Za-z0-9]+", "-", head["device"]).strip("-").lower()
    path = results / f"{slug}-{head['date']}-ledger.json"
    doc = json.loads(path.read_text()) if path.exists() else {**head, "rows": []}
    doc["rows"].append({"step": step, "fingerprint": print_, "rc": record["rc"], "seconds": record["seconds"],
                        "stopped": record["stopped"]})
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def describe_environment(env: dict, log) -> dict:
    """GPU, driver and package versions, read by a child with the step environment."""
    code = "import json; from benchmarks import _common; print(json.dumps(_common.header()))"
    try:
        head = json.loads(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                                         capture_output=True, text=True, timeout=120).stdout)
    except (subprocess.SubprocessError, json.JSONDecodeError) as e:
        log.write(f"could not read the environment: {e}\n")
        head = {}
    try:
        head["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm,driver_version", "--format=csv"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head["nvidia_smi"] = None
    return head


def collect(work: Path, env: dict, log) -> None:
    """Turn test_gpu's JUnit XML and error file, and the labs' fragments, into results files."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "_collect", str(work)]
    subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=120)


def pack(results: Path, out: Path, summary: dict) -> None:
    """``summary.json`` and ``results.tar`` (the files of ``results``, flat), rewritten whole."""
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    tmp = out / "results.tar.part"
    with tarfile.open(tmp, "w") as tar:
        for f in sorted(results.glob("*.json")):
            tar.add(f, arcname=f.name)
    tmp.rename(out / "results.tar")


# --------------------------------------------------------------------------------------------------
# Child commands of a run (need torch; the labs need the carried Jupyter stack)


def execute_lab(path: Path, out: Path) -> int:
    """Execute one lab at full scale; write ``<lab>.json``: seconds, and the failing cell if any."""
    # scripts/ is a folder of commands, not a package: load the lab runner by its path
    spec = importlib.util.spec_from_file_location("execute_labs", ROOT / "scripts" / "execute_labs.py")
    execute_labs = importlib.util.module_from_spec(spec)
    sys.modules["execute_labs"] = execute_labs
    spec.loader.exec_module(execute_labs)
    execute = execute_labs.execute

    out.mkdir(parents=True, exist_ok=True)
    _, failure, seconds = execute(str(path))
    (out / f"{path.stem}.json").write_text(json.dumps(
        {"lab": path.name, "seconds": round(seconds, 1), "ok": failure is None, "failure": failure}) + "\n")
    print(f"{path.name}: {'ok' if failure is None else 'FAILED'} in {seconds:.0f} s")
    if failure:
        print(failure)
    return 0 if failure is None else 1


def collect_results(work: Path) -> None:
    """test_gpu.xml + gpu_errors.json -> ``<device>-<date>-test_gpu.json``; labs/*.json ->
    ``<device>-<date>-labs.json`` (both under ``work/results``, in the benchmarks' header format)."""
    from benchmarks import _common

    head = _common.header()
    xml = work / "test_gpu.xml"
    if xml.exists():
        errors = work / "gpu_errors.json"
        measured = json.loads(errors.read_text())["errors"] if errors.exists() else []
        rows = junit_cases(xml.read_text())
        _common.result_file(head, "test_gpu", work / "results").write_text(
            json.dumps({**head, "rows": rows, "errors": measured}, indent=1) + "\n")
    labs = sorted((work / "labs").glob("*.json"))
    if labs:
        rows = [json.loads(f.read_text()) for f in labs]
        _common.result_file(head, "labs", work / "results").write_text(
            json.dumps({**head, "full_scale": True, "rows": rows}, indent=1) + "\n")


def junit_cases(xml_text: str) -> list[dict]:
    """One row per test case of a JUnit XML report: ``{"test", "outcome", "seconds", "message"}``."""
    import xml.etree.ElementTree as ET

    rows = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or "").splitlines()[0][:300] if el.get("message") else None
                break
        rows.append({"test": case.get("name"), "outcome": outcome,
                     "seconds": float(case.get("time") or 0), "message": message})
    return rows


# --------------------------------------------------------------------------------------------------
# The ledger: what has run on a GPU for the present code, and what to run next


def step_inputs(step: str) -> list[Path]:
    """The files whose code a step's result depends on: the test file or benchmark script and everything
    of the repository it imports; for a lab, the notebook and every module of attnlib (its cells import
    them as they go) and of the book's code."""
    from attnbook import _provenance

    kind, _, name = step.partition(":")
    if kind == "tests":
        return _provenance.closure(ROOT / "tests" / "test_gpu.py")
    if kind == "bench":
        return _provenance.closure(ROOT / "benchmarks" / f"{name}.py")
    return [LABS[name], *sorted(_provenance.modules(("attnlib", "attnbook")).values())]


def fingerprint(step: str, versions: dict) -> str:
    """What a step's result is a result of: the code of its files (comments and docstrings aside) and the
    torch and Triton it runs with (their releases, without a local build tag)."""
    import hashlib

    from attnbook import _provenance

    files = {}
    for path in step_inputs(step):
        rel = path.relative_to(ROOT).as_posix()
        files[rel] = (_provenance.code_digest(path) if path.suffix == ".py"
                      else hashlib.sha256(_notebook_code(path).encode()).hexdigest())
    release = {k: str(versions.get(k, "-")).split("+")[0] for k in ("torch", "triton")}
    blob = json.dumps({"step": step, "files": files, "versions": release}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _notebook_code(path: Path) -> str:
    """A notebook's code cells (what runs), not its prose or outputs."""
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def ledger_rows(results: Path) -> list[dict]:
    """Every row of every ledger file in ``results``, with the file's device."""
    rows = []
    for f in sorted(results.glob("*-ledger.json")):
        doc = json.loads(f.read_text())
        rows += [{"device": doc.get("device"), "gpu": doc.get("gpu"), **r} for r in doc.get("rows", [])]
    return rows


def _on_gpu(row: dict) -> bool:
    """Whether a ledger row was made on a GPU (its file says so: a rehearsal on a CPU writes rows too)."""
    return row.get("gpu") is True


def plan_next(budget: float, rows: list[dict], prints: dict[str, str]) -> dict:
    """The steps of :data:`LEDGER` to run in ``budget`` seconds: not done for the present code (no clean
    GPU row with the step's fingerprint in ``prints``), in the ledger's order, each taken when its
    estimate fits what is left (a step too long for the rest is passed over, not waited for). Returns
    ``{"steps", "estimates", "done", "passed_over"}``."""
    done = {r["step"] for r in rows if _on_gpu(r) and r.get("rc") == 0 and not r.get("stopped")
            and r.get("fingerprint") == prints.get(r["step"])}
    estimates = {}
    for step in LEDGER:
        measured = [r["seconds"] for r in rows if r["step"] == step and _on_gpu(r) and not r.get("stopped")
                    and r.get("seconds") is not None]
        estimates[step] = measured[-1] if measured else ESTIMATE_S[step.partition(":")[0]]
    left = budget - MARGIN_S - INSTALL_S
    chosen, passed_over = [], []
    for step in LEDGER:
        if step in done:
            continue
        if estimates[step] <= left:
            chosen.append(step)
            left -= estimates[step]
        else:
            passed_over.append(step)
    return {"steps": chosen, "estimates": estimates, "done": sorted(done, key=LEDGER.index),
            "passed_over": passed_over}


def next_steps(args) -> int:
    """``next``: plan from the ledger, print the plan, and (unless ``--dry-run``) run it as ``run`` does,
    each step's ledger row written as it ends."""
    from attnbook import _provenance

    results = Path(args.results)
    versions = {pkg: _provenance._version(pkg) for pkg in ("torch", "triton")}   # without importing them
    prints = {step: fingerprint(step, versions) for step in LEDGER}
    plan = plan_next(args.budget, ledger_rows(results), prints)
    print(f"ledger: {len(plan['done'])} of {len(LEDGER)} steps done for the present code "
          f"(torch {versions.get('torch')}, triton {versions.get('triton')})")
    for step in plan["steps"]:
        print(f"  next  {step:<50s} ~{plan['estimates'][step]:.0f} s")
    for step in plan["passed_over"]:
        print(f"  later {step:<50s} ~{plan['estimates'][step]:.0f} s (does not fit)")
    if not plan["steps"] and not plan["passed_over"]:
        print("every step is done for the present code; what is left is profiling the worst ratio, by hand")
    if args.dry_run or not plan["steps"]:
        return 0
    args.steps = plan["steps"]
    return run(args, prints=prints)


# --------------------------------------------------------------------------------------------------
# Here: the wheels, and the results coming back


def wheel_set() -> dict[str, str]:
    """Name -> version to carry: fla pinned, the Jupyter stack at the versions installed here."""
    from importlib.metadata import PackageNotFoundError, version

    wanted = dict(FLA)
    for name in LAB_STACK:
        try:
            wanted[name] = version(name)
        except PackageNotFoundError as e:
            raise SystemExit(f"{name} is not installed here; `make install` first") from e
    return wanted


def download_wheels() -> int:
    WHEELS.mkdir(exist_ok=True)
    have = {canonicalize_name(w.name.split("-")[0]): w for w in WHEELS.glob("*.whl")}
    for name, ver in wheel_set().items():
        old = have.get(canonicalize_name(name))
        if old is not None and old.name.split("-")[1] == ver:
            continue
        if old is not None:
            old.unlink()                     # two versions of one package stop the whole install there
        cmd = [sys.executable, "-m", "pip", "download", "-qq", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "-d", str(WHEELS), f"{name}=={ver}"]
        for plat in PLATFORMS:
            cmd += ["--platform", plat]
        subprocess.run(cmd, check=True)
    problems = check_closure(sorted(WHEELS.glob("*.whl")), device_packages())
    size = sum(w.stat().st_size for w in WHEELS.glob("*.whl"))
    print(f"{len(list(WHEELS.glob('*.whl')))} wheels in {WHEELS}, {size / 2**20:.1f} MiB")
    for p in problems:
        print(f"missing: {p}")
    return 1 if problems else 0


def device_packages(path: Path = DEVICE_PACKAGE_LIST) -> set[str]:
    """The device image's packages from the workplace's list, or none when it is not here."""
    if not path.exists():
        return set()
    m = re.search(r"Packages: (.*?)\.\s*$", path.read_text(), flags=re.M)
    return {canonicalize_name(n) for n in m.group(1).split(", ")} if m else set()


def check_closure(wheels: list[Path], on_device: set[str]) -> list[str]:
    """Each requirement the wheels declare for CPython 3.12 on Linux (no extras) that neither another
    wheel (at a version the requirement admits) nor the device provides."""

    carried = {}
    metas = {}
    for w in wheels:
        with zipfile.ZipFile(w) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            metas[w.name] = z.read(meta).decode()
        carried[canonicalize_name(w.name.split("-")[0])] = Version(w.name.split("-")[1])
    problems = []
    for wname, meta in metas.items():
        for line in meta.splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(DEVICE_MARKERS):
                continue
            name = canonicalize_name(req.name)
            if name in carried:
                if req.specifier and carried[name] not in req.specifier:
                    problems.append(f"{wname} needs {req}, carried {carried[name]}")
            elif name not in on_device:
                problems.append(f"{wname} needs {req}")
    return problems


def unpack(tar_path: Path, dest: Path) -> int:
    """Results from a run into ``dest``: new files as they are, same-named files merged row by row when
    device and versions agree."""
    with tarfile.open(tar_path) as tar:
        for member in tar.getmembers():
            if not member.isfile() or "/" in member.name or not member.name.endswith(".json"):
                raise SystemExit(f"{tar_path}: unexpected member {member.name!r}")
            new = json.load(tar.extractfile(member))
            target = dest / member.name
            merged = target.exists()
            if merged:
                old = json.loads(target.read_text())
                if (old.get("device"), old.get("versions")) != (new.get("device"), new.get("versions")):
                    raise SystemExit(f"{target} exists from another device or versions; not merged")
                new = {**new, "rows": old["rows"] + [r for r in new["rows"] if r not in old["rows"]]}
            target.write_text(json.dumps(new, indent=1) + "\n")
            print(f"{'merged into' if merged else 'wrote'} {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("wheels", help="here: download the wheels the device lacks into .whl/")
    r = sub.add_parser("run", help="on the device: run steps, results into $OUT")
    r.add_argument("steps", nargs="+", help="tests | bench[:a,b] | labs[:01,a1] (in this order)")
    r.add_argument("--budget", type=float, default=540, help="seconds for the whole call")
    r.add_argument("--out", default=None, help="default: $OUT")
    r.add_argument("--work", default="/tmp/gpu_session", help="scratch directory for the steps")
    nx = sub.add_parser("next", help="on the device: the ledger's next steps that fit the budget")
    nx.add_argument("--budget", type=float, default=540, help="seconds for the whole call")
    nx.add_argument("--out", default=None, help="default: $OUT")
    nx.add_argument("--work", default="/tmp/gpu_session", help="scratch directory for the steps")
    nx.add_argument("--results", default=str(ROOT / "benchmarks" / "results"), help="where the ledger is")
    nx.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    u = sub.add_parser("unpack", help="here: a run's results.tar into benchmarks/results/")
    u.add_argument("tar", type=Path)
    u.add_argument("--dest", type=Path, default=ROOT / "benchmarks" / "results")
    lab = sub.add_parser("_lab")
    lab.add_argument("notebook", type=Path)
    lab.add_argument("--out", type=Path, required=True)
    col = sub.add_parser("_collect")
    col.add_argument("work", type=Path)
    args = ap.parse_args(argv)
    if args.command == "wheels":
        return download_wheels()
    if args.command == "run":
        return run(args)
    if args.command == "next":
        return next_steps(args)
    if args.command == "unpack":
        return unpack(args.tar, args.dest)
    if args.command == "_lab":
        return execute_lab(args.notebook, args.out)
    collect_results(args.work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
