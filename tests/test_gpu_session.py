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
import torch

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


# --- the ledger: `next` -----------------------------------------------------------------------------

GPU = "NVIDIA H200"
ON_GPU = {"device": GPU, "gpu": True}


def _row(step, fingerprint, rc=0, seconds=60.0, stopped=False):
    return {"step": step, "fingerprint": fingerprint, "rc": rc, "seconds": seconds, "stopped": stopped}


def test_the_ledger_holds_every_benchmark_and_lab_after_the_gpu_tests():
    steps = [gs.parse_steps([s])[0] for s in gs.LEDGER]               # each is a step `run` accepts
    assert [n for k, n in steps if k == "bench"] == list(gs.BENCH)
    assert [n for k, n in steps if k == "labs"] == list(gs.LABS)
    kinds = [k for k, _ in steps]
    assert kinds == sorted(kinds, key=["tests", "bench", "labs"].index)   # correctness, speed, labs
    assert kinds.count("tests") == len(gs.TEST_FAMILIES) + 1 and "bfloat16" in gs.LEDGER[0]


def test_a_dtype_parameter_is_named_by_its_dtype_so_that_k_selects_it():
    from tests.conftest import pytest_make_parametrize_id

    assert pytest_make_parametrize_id(None, torch.bfloat16, "dtype") == "bfloat16"
    assert pytest_make_parametrize_id(None, 3, "T") is None


def test_next_runs_what_a_gpu_has_not_done_for_this_code_in_order_and_within_the_budget():
    prints = {step: f"fp-{i}" for i, step in enumerate(gs.LEDGER)}
    first, second, third = gs.LEDGER[:3]
    rows = [
        {**ON_GPU, **_row(first, prints[first])},                               # done
        {**ON_GPU, **_row(second, "an older code", seconds=400.0)},              # other code: not done
        {"device": "x86-64", "gpu": False, **_row(third, prints[third])},        # a rehearsal: not done
        {**ON_GPU, **_row(gs.LEDGER[3], prints[gs.LEDGER[3]], rc=1)},            # failed: not done
        {**ON_GPU, **_row(gs.LEDGER[4], prints[gs.LEDGER[4]], stopped=True)},    # cut short: not done
    ]
    plan = gs.plan_next(600, rows, prints)
    assert plan["done"] == [first]
    assert plan["estimates"][second] == 400.0                    # the last time a GPU ran it
    assert plan["estimates"][third] == gs.ESTIMATE_S["tests"]    # CPU times are no estimate
    # 600 s less the margins leaves 555: the 400-s step fits first, then one 150-s step does not
    assert plan["steps"] == [second, third][: 1 + (400 + 150 <= 600 - gs.MARGIN_S - gs.INSTALL_S)]
    assert plan["passed_over"][0] in gs.LEDGER[2:]
    everything = [{**ON_GPU, **_row(s, prints[s])} for s in gs.LEDGER]
    assert gs.plan_next(600, everything, prints)["steps"] == []


def test_a_step_longer_than_the_rest_of_the_budget_is_passed_over_for_a_later_one_that_fits():
    prints = {step: "fp" for step in gs.LEDGER}
    rows = [{**ON_GPU, **_row(gs.LEDGER[0], "old", seconds=500.0)}]
    plan = gs.plan_next(300, rows, prints)
    assert gs.LEDGER[0] in plan["passed_over"] and plan["steps"][0] == gs.LEDGER[1]


def test_the_fingerprint_follows_code_and_versions_not_comments_or_build_tags(tmp_path, monkeypatch):
    code = tmp_path / "step.py"
    monkeypatch.setattr(gs, "ROOT", tmp_path)
    monkeypatch.setattr(gs, "step_inputs", lambda step: [code])
    code.write_text("def f():\n    return 1\n")
    base = gs.fingerprint("bench:x", {"torch": "2.9.0", "triton": "3.6.0"})
    assert gs.fingerprint("bench:x", {"torch": "2.9.0+cu130", "triton": "3.6.0"}) == base
    assert gs.fingerprint("bench:x", {"torch": "2.9.0", "triton": "3.5.1"}) != base
    code.write_text("def f():\n    # why\n    return 1\n")
    assert gs.fingerprint("bench:x", {"torch": "2.9.0", "triton": "3.6.0"}) == base
    code.write_text("def f():\n    return 2\n")
    assert gs.fingerprint("bench:x", {"torch": "2.9.0", "triton": "3.6.0"}) != base


def test_rehearsal_of_next_on_cpu_runs_the_undone_steps_and_writes_their_ledger_rows(tmp_path, capsys):
    """A fake device's ledger says every step is done but one test slice; `next` on this CPU runs exactly
    that (the GPU tests skip), packs its results and its ledger row, and rows made on a CPU never mark a
    step done. (The benchmarks' own smoke runs are tests/test_benchmarks.py's.)"""
    from attnbook import _provenance

    versions = {pkg: _provenance._version(pkg) for pkg in ("torch", "triton")}
    prints = {step: gs.fingerprint(step, versions) for step in gs.LEDGER}
    todo = [gs.LEDGER[0]]
    results, out, work = tmp_path / "results", tmp_path / "out", tmp_path / "work"
    results.mkdir()
    (results / "nvidia-h200-2026-12-01-ledger.json").write_text(json.dumps(
        {"device": GPU, "gpu": True, "date": "2026-12-01", "versions": versions,
         "rows": [_row(s, prints[s]) for s in gs.LEDGER if s not in todo]}))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_session.py"), "next", "--budget", "600",
           "--results", str(results), "--out", str(out), "--work", str(work)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [s["step"] for s in summary["steps"]] == todo
    assert all(s["rc"] == 0 and not s["stopped"] for s in summary["steps"])
    with tarfile.open(out / "results.tar") as tar:
        docs = {m.name: json.load(tar.extractfile(m)) for m in tar.getmembers()}
    (ledger,) = [d for n, d in docs.items() if n.endswith("-ledger.json")]
    assert [(r["step"], r["fingerprint"], r["rc"]) for r in ledger["rows"]] == [(s, prints[s], 0) for s in todo]
    (tests,) = [d for n, d in docs.items() if n.endswith("-test_gpu.json")]
    assert tests["rows"] and all("bfloat16" in r["test"] and r["outcome"] == "skipped" for r in tests["rows"])
    gs.unpack(out / "results.tar", results)
    capsys.readouterr()
    assert gs.main(["next", "--budget", "600", "--results", str(results), "--dry-run"]) == 0
    again = capsys.readouterr().out
    planned = [line.split(None, 1)[1] for line in again.splitlines() if line.strip().startswith("next")]
    assert planned and planned[0].startswith(todo[0]), again              # a CPU's rows count for nothing
