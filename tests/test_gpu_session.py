"""The lent-GPU runbook (scripts/gpu_session.py): what it plans, that it stops a step at its deadline,
that the wheels it carries are closed under their dependencies, and a rehearsal of a whole call on
this CPU (the GPU tests skip; the results still come back packed)."""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from benchmarks import _common

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("gpu_session", ROOT / "scripts" / "gpu_session.py")
gs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gs)

# The shapes every attention benchmark must measure (B, H, T, D), bf16: the GPU issue's forward table, the
# first four of the anchor shapes' one home.
ANCHOR_SHAPES = set(_common.ANCHOR_SHAPES[:4])


def test_steps_expand_to_every_benchmark_and_lab_and_reject_unknown_names():
    assert [n for _, n in gs.parse_steps(["bench"])] == list(gs.BENCH)
    labs = gs.parse_steps(["labs"])
    assert len(labs) == len(list((ROOT / "notebooks").glob("*_lab.ipynb"))) >= 8
    assert gs.parse_steps(["tests:linear or delta", "labs:01,a1"]) == [
        ("tests", "linear or delta"), ("labs", "01"), ("labs", "a1")]
    with pytest.raises(ValueError, match="unknown"):
        gs.parse_steps(["bench:linear,flash"])
    with pytest.raises(ValueError, match="step must be"):
        gs.parse_steps(["profile"])


def _load(name):
    return importlib.import_module(f"benchmarks.{name}")


def test_planned_benchmarks_measure_the_anchor_shapes():
    for name in ("linear", "deltanet"):              # their default --shapes issue, no arguments added
        assert gs.BENCH[name] == []
        assert ANCHOR_SHAPES <= set(_load(name).ISSUE_SHAPES), name
    args = dict(zip(gs.BENCH["attention"][::2], gs.BENCH["attention"][1::2]))
    planned = {(4, 16, int(t), int(d)) for t in args["--T"].split(",") for d in args["--D"].split(",")}
    planned.add(tuple(int(x) for x in args["--long"].split(",")))
    assert ANCHOR_SHAPES <= planned
    assert args["--dtypes"] == "bf16"


def test_a_step_past_its_deadline_is_stopped_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    with open(tmp_path / "log", "w") as log:
        t0 = time.perf_counter()
        rec = gs.run_step([sys.executable, "-c", script], os.environ.copy(), log, 2.0)
    # stopped at its 2-s deadline, long before the 60 s it would run (45 s: room for a busy machine)
    assert rec["stopped"] and time.perf_counter() - t0 < 45
    child = int(pidfile.read_text())
    for _ in range(50):                              # the grandchild got the group's SIGTERM
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").exists() and Path(f"/proc/{child}/stat").read_text().split()[2] == "Z":
            break                                    # dead, waiting for its (stopped) parent's reaper
        time.sleep(0.1)
    else:
        pytest.fail("the step's child process outlived the step")
    assert "stopped after" in (tmp_path / "log").read_text()


def _wheel(directory, name, version, requires):
    path = directory / f"{name}-{version}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_closure_names_what_neither_the_wheels_nor_the_device_provide(tmp_path):
    wheels = [
        _wheel(tmp_path, "alpha", "1.0", ["beta>=2", "torch", 'colorama; sys_platform == "win32"',
                                          'pytest; extra == "test"', 'backport; python_version < "3.10"']),
        _wheel(tmp_path, "beta", "1.5", ["gamma_pkg"]),
    ]
    problems = gs.check_closure(wheels, on_device={"torch"})
    assert problems == ["alpha-1.0-py3-none-any.whl needs beta>=2, carried 1.5",
                        "beta-1.5-py3-none-any.whl needs gamma_pkg"]
    assert gs.check_closure(wheels[1:], on_device={"gamma-pkg"}) == []


def test_junit_rows_carry_each_outcome():
    xml = """<testsuites><testsuite>
      <testcase classname="t" name="a" time="0.5"/>
      <testcase classname="t" name="b" time="1">
        <failure message="AssertionError: rel RMS 3e-2&#10;more">x</failure></testcase>
      <testcase classname="t" name="c" time="0"><skipped message="needs a CUDA GPU"/></testcase>
    </testsuite></testsuites>"""
    assert gs.junit_cases(xml) == [
        {"test": "a", "outcome": "passed", "seconds": 0.5, "message": None},
        {"test": "b", "outcome": "failed", "seconds": 1.0, "message": "AssertionError: rel RMS 3e-2"},
        {"test": "c", "outcome": "skipped", "seconds": 0.0, "message": "needs a CUDA GPU"}]


def _tar(path, files):
    src = path.parent / (path.stem + "_src")
    src.mkdir()
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            (src / name).write_text(json.dumps(data))
            tar.add(src / name, arcname=name)
    return path


def test_unpack_merges_rows_of_one_device_and_refuses_another(tmp_path):
    dest = tmp_path / "results"
    dest.mkdir()
    head = {"device": "GPU X", "date": "2026-01-01", "versions": {"torch": "1"}}
    gs.unpack(_tar(tmp_path / "a.tar", {"x-labs.json": {**head, "rows": [{"lab": "1"}]}}), dest)
    gs.unpack(_tar(tmp_path / "b.tar", {"x-labs.json": {**head, "rows": [{"lab": "1"}, {"lab": "2"}]}}), dest)
    assert json.loads((dest / "x-labs.json").read_text())["rows"] == [{"lab": "1"}, {"lab": "2"}]
    other = {**head, "versions": {"torch": "2"}, "rows": []}
    with pytest.raises(SystemExit, match="another device or versions"):
        gs.unpack(_tar(tmp_path / "c.tar", {"x-labs.json": other}), dest)


def test_rehearsal_on_cpu_packs_the_gpu_tests_outcomes(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_session.py"), "run", "tests:softmax",
                           "bench:linear", "--budget", "240", "--out", str(out), "--work", str(work)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == ["tests:softmax", "bench:linear"]
    assert all(s["rc"] == 0 and not s["stopped"] for s in summary["steps"])
    assert summary["environment"]["versions"]["torch"]
    with tarfile.open(out / "results.tar") as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("-test_gpu.json")]
        report = json.load(tar.extractfile(member))
    assert report["rows"] and {r["outcome"] for r in report["rows"]} == {"skipped"}
    assert all("softmax" in r["test"] for r in report["rows"])
    assert sorted(p.name for p in out.iterdir()) == ["results.tar", "session.log", "summary.json"]
