"""Invariants of the static kernel report (``scripts/kernel_report.py``, the package
``benchmarks/kernel_report/``), checked without a GPU.

The report captures every launch that ``backend="auto"`` makes for softmax attention, linear attention,
the delta rule and the gated delta rule (bf16, forward and forward+backward, every benchmark shape) on
fake sm_75 / sm_80 / sm_89 / sm_90 devices, and the same for fla; it compiles each distinct
specialisation of attnlib's Triton launches for sm_80, sm_89 and sm_90 (``ptxas -v``, TTGIR). Making it
takes some 17 CPU-minutes (two thirds of it compiling the distinct specialisations; the captures take
the rest, mostly sm_75's PyTorch reference loops at T = 65536), so it is made by its script, committed,
and read here.

Each test asserts one property of the kernels over that whole matrix:

* every attnlib launch fits its target's shared memory and spills no registers (sm_80, sm_89, sm_90;
  for an autotuned kernel, every candidate its pruning hook keeps -- the autotuner may pick any);
* a half-precision (here bf16) path has no tf32 dot and no FMA dot on sm_80+: every ``tl.dot`` runs on
  16-bit tensor-core instructions (mma.sync, wgmma); float32 inputs, exact "ieee" on purpose, are not
  in this report;
* on sm_75 (T4) ``auto`` launches no Triton kernel (Triton has no tensor-core ``tl.dot`` there);
* attnlib's kernels touch no more bytes than fla's for linear attention, the delta rule and the gated
  delta rule, forward and forward+backward, at every benchmark shape (bytes: each tensor a launch
  uses, once per launch -- the report's ``"bytes"`` says exactly what is counted).

The tests read the committed report (``benchmarks/results/kernel_report.json``), which is stamped with
the inputs it was made from (``benchmarks/_artifacts.py``: every repository file the script executes --
attnlib's ops and kernels, the report's package, the shapes -- and the torch, triton and fla versions).
When those are not the inputs here, every test fails at once with the command that makes the report
again (``python scripts/kernel_report.py``, or ``make artifacts``; about 17 CPU-minutes): nothing here
compiles, so a kernel change without a new report cannot land, and neither can one whose new report
shows a spill or an overflow.

The compiled properties are skipped (with the reason) where Triton's CUDA backend or ptxas is missing:
the committed compile is of a ptxas this machine does not have.
"""

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _artifacts as artifacts

from ._kernel_inputs import compile_env, known_spill

ROOT = Path(__file__).resolve().parent.parent
COMPILED = ("sm_80", "sm_89", "sm_90")
CHUNKED = ("linear", "delta", "gated_delta")


def _ptxas_missing() -> str | None:
    """Why attnlib's kernels cannot be compiled for an NVIDIA target here (None: they can)."""
    try:
        from triton import knobs
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401

        if not os.path.exists(knobs.nvidia.ptxas.path):
            return f"ptxas not found at {knobs.nvidia.ptxas.path}"
    except Exception as exc:  # noqa: BLE001 - a triton without its CUDA backend or ptxas
        return f"triton's CUDA backend or ptxas is not available: {exc}"
    return None


REPORT = artifacts.BY_NAME["kernel report"]


@functools.cache
def _report_or_why() -> tuple[dict | None, str | None]:
    report = artifacts.committed(REPORT)
    why = artifacts.staleness(REPORT, report)
    return (None, artifacts.stale_message(REPORT, why)) if why else (report, None)


def report() -> dict:
    """The committed report: every op, shape and target, compiled, with fla. Made from exactly the inputs
    here, or the test fails with the command that makes it again."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    committed, why = _report_or_why()
    if why:
        pytest.fail(why, pytrace=False)
    return committed


def compiled_report() -> dict:
    why = _ptxas_missing()          # the committed compile is of a ptxas this machine lacks: nothing to compare
    if why:
        pytest.skip(why)
    return report()


def attnlib_specialisations(r: dict) -> list[dict]:
    """Every specialisation an attnlib launch on a compiled target uses (every kept autotuning candidate),
    each checked to have been compiled."""
    ids = {sid for key, cap in r["launches"].items() if key.startswith("attnlib|") and key.split("|")[3] in COMPILED
           for ln in cap["launches"] if ln["kind"] == "triton" for sid in ln["specs"]}
    assert ids, "no attnlib Triton launch on sm_80/89/90: the report captured nothing"
    missing = sorted(ids - set(r["specialisations"]))
    assert not missing, f"launch specialisations that were not compiled: {missing}"
    specs = [r["specialisations"][sid] for sid in sorted(ids)]
    errors = [(s["kernel"], s["target"], s["error"]) for s in specs if "error" in s]
    assert not errors, errors
    assert {s["target"] for s in specs} == set(COMPILED)
    return specs


def test_every_attnlib_launch_fits_its_targets_shared_memory():
    specs = attnlib_specialisations(compiled_report())
    too_big = sorted({(s["target"], s["label"], s["shared_bytes"], s["shared_limit"]) for s in specs
                      if not 0 <= s["shared_bytes"] <= s["shared_limit"]})
    assert not too_big, f"(target, specialisation, shared bytes, limit): {too_big}"


def test_no_attnlib_launch_spills_registers():
    specs = attnlib_specialisations(compiled_report())
    spilled = sorted({(s["target"], s["label"], s["spill_store_bytes"], s["spill_load_bytes"]) for s in specs
                      if (s["spill_store_bytes"] or s["spill_load_bytes"]) and not known_spill(
                          s["target"], s["kernel"], s["label"], max(s["spill_store_bytes"], s["spill_load_bytes"]))})
    assert not spilled, f"(target, specialisation, spill store B, spill load B): {spilled}"
    assert all(0 < s["registers"] <= 255 for s in specs)


def test_half_precision_dots_run_on_16_bit_tensor_cores():
    r = compiled_report()
    assert r["dtype"] in ("bf16", "fp16"), "this property is for half-precision inputs"
    specs = attnlib_specialisations(r)
    assert any(s["dots"] for s in specs), "no tl.dot found in any TTGIR: the parser missed them"
    tf32 = sorted({(s["target"], s["kernel"], d["line"]) for s in specs for d in s["dots"] if d["tf32"]})
    fma = sorted({(s["target"], s["kernel"], d["line"]) for s in specs for d in s["dots"] if d["kind"] == "fma"})
    wide = sorted({(s["target"], s["kernel"], d["line"], d["a"], d["b"]) for s in specs for d in s["dots"]
                   if d["kind"] != "fma" and not d["tf32"] and {d["a"], d["b"]} - {"bf16", "f16"}})
    assert not tf32, f"tf32 dots in a half-precision path (target, kernel, line): {tf32}"
    assert not fma, f"FMA dots in a half-precision path (target, kernel, line): {fma}"
    assert not wide, f"dots with operands wider than 16 bits (target, kernel, line, a, b): {wide}"


def test_auto_launches_no_triton_kernel_on_sm75():
    r = report()
    caps = {key: cap for key, cap in r["launches"].items() if key.startswith("attnlib|") and key.endswith("|sm_75")}
    assert len(caps) == len(r["ops"]) * len(r["shapes"]), sorted(caps)
    launched = sorted({(key, ln["kernel"]) for key, cap in caps.items() for ln in cap["launches"]
                       if ln["kind"] == "triton"})
    assert not launched, launched
    assert all(cap["backend"] == "torch" and cap["launches"] for cap in caps.values())


def test_attnlib_touches_no_more_bytes_than_fla_in_the_chunked_ops():
    rows = [row for row in report()["rows"] if row["op"] in CHUNKED and row["target"] in COMPILED]
    assert len(rows) == len(CHUNKED) * len(report()["shapes"]) * len(COMPILED) * 2
    assert all(row["anchor"]["name"] == "fla" and row["attnlib"]["backend"] == "triton" for row in rows)
    more = [(row["target"], row["op"], "x".join(str(row["shape"][k]) for k in "BHTD"), row["pass"], row["ratio"])
            for row in rows if row["attnlib"]["bytes"] > row["anchor"]["bytes"]]
    assert not more, f"attnlib touches more bytes than fla (target, op, shape, pass, ratio): {more}"


def test_the_script_and_the_package_are_one_command_over_the_benchmarks_shapes():
    """``scripts/kernel_report.py`` is a thin entry point to ``benchmarks/kernel_report/`` (whose workers run
    as ``python -m benchmarks.kernel_report``): both print the same fingerprint, and the report's default
    shapes are the benchmarks' (``benchmarks/_common.py``). Fast: nothing is captured or compiled."""
    from benchmarks._common import ANCHOR_SHAPES

    env = compile_env()
    printed = []
    for cmd in ([sys.executable, "-m", "benchmarks.kernel_report"], [sys.executable, "scripts/kernel_report.py"]):
        proc = subprocess.run([*cmd, "--fingerprint"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        printed.append(proc.stdout.strip())
    assert printed[0] == printed[1] == artifacts.stamp(REPORT)["inputs_sha256"]
    code = ("import benchmarks.kernel_report.targets as t, json; print(json.dumps([t.SHAPES, "
            "__import__('os').environ.get('TRITON_INTERPRET')]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "TRITON_INTERPRET": "1"}, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    shapes, interpret = json.loads(proc.stdout)
    assert [tuple(s) for s in shapes] == list(ANCHOR_SHAPES)
    assert interpret is None                # importing the package turns the interpreter off, before any kernel
