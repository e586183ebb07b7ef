"""Where `make test`'s time goes, against its budget (10 minutes on a 2-core machine).

`make test` runs each of its steps through this script, which records the step's wall time and CPU time
(its own and its children's) in ``_build/test_budget/steps.json``; the pytest steps also leave a JUnit
file there. At the end ``report`` prints one line per step, the files and labs that cost most, and the
total against the budget. It reports; it never fails a run for its time (a slow machine is not a red
one): ``--strict`` exits 1 past the budget, for a developer who wants that.

    python scripts/test_budget.py begin                     # a new run: forget the last one's steps
    python scripts/test_budget.py step NAME -- CMD ...      # run CMD, record its time, exit as it did
    python scripts/test_budget.py report [--budget 600] [--top 12] [--strict] [--save-costs]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "_build" / "test_budget"
STEPS = DIR / "steps.json"
BUDGET_S = 600.0
COSTS = ROOT / "tests" / "file_costs.json"     # read by the root conftest.py: costliest files first


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load() -> list[dict]:
    return json.loads(STEPS.read_text()) if STEPS.exists() else []


def begin() -> int:
    shutil.rmtree(DIR, ignore_errors=True)
    DIR.mkdir(parents=True)
    STEPS.write_text("[]\n")
    return 0


def step(name: str, cmd: list[str]) -> int:
    DIR.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.time(), _children_cpu()
    code = subprocess.call(cmd)
    steps = _load()
    steps.append({"step": name, "start": t0, "wall_s": round(time.time() - t0, 1),
                  "cpu_s": round(_children_cpu() - c0, 1), "exit": code})
    STEPS.write_text(json.dumps(steps, indent=1) + "\n")
    return code


def _junit_costs() -> dict[str, float]:
    """Seconds per test file or notebook, summed over its tests (setup and teardown included), from every
    JUnit file of the run (written with ``-o junit_family=xunit1``, whose test cases name their file)."""
    per_file: dict[str, float] = defaultdict(float)
    for xml in sorted(DIR.glob("*.xml")):
        for case in ET.parse(xml).iter("testcase"):
            per_file[case.get("file") or case.get("classname", "?")] += float(case.get("time", 0) or 0)
    return dict(per_file)


def report(budget: float, top: int, strict: bool, save_costs: bool = False) -> int:
    steps = _load()
    if not steps:
        print("no steps recorded (run `make test` first)", file=sys.stderr)
        return 2
    total = max(s["start"] + s["wall_s"] for s in steps) - min(s["start"] for s in steps)
    print(f"make test, step by step (budget {budget:.0f} s on {os.cpu_count()} cores):")
    print(f"  {'step':<16} {'wall s':>7} {'cpu s':>7} {'of budget':>9}")
    for s in steps:
        mark = "" if s["exit"] == 0 else f"  (exit {s['exit']})"
        print(f"  {s['step']:<16} {s['wall_s']:>7.0f} {s['cpu_s']:>7.0f} {s['wall_s'] / budget:>8.0%}{mark}")
    print(f"  {'total':<16} {total:>7.0f} {sum(s['cpu_s'] for s in steps):>7.0f} {total / budget:>8.0%}")
    costs = _junit_costs()
    if costs:
        print(f"the {min(top, len(costs))} costliest test files and labs (seconds of their tests, summed):")
        for name, seconds in sorted(costs.items(), key=lambda kv: -kv[1])[:top]:
            print(f"  {seconds:7.1f}  {name}")
    if save_costs and costs:
        COSTS.write_text(json.dumps({k: round(v, 1) for k, v in sorted(costs.items())}, indent=1) + "\n")
        print(f"wrote {COSTS} (the order `make test` starts files in)")
    over = total > budget
    print(f"{'OVER' if over else 'within'} budget: {total:.0f} s of {budget:.0f} s")
    return 1 if over and strict else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    sub.add_parser("begin")
    st = sub.add_parser("step")
    st.add_argument("name")
    st.add_argument("cmd", nargs=argparse.REMAINDER)
    rp = sub.add_parser("report")
    rp.add_argument("--budget", type=float, default=BUDGET_S)
    rp.add_argument("--top", type=int, default=12)
    rp.add_argument("--strict", action="store_true", help="exit 1 when the run took longer than the budget")
    rp.add_argument("--save-costs", action="store_true", help="write the files' costs to tests/file_costs.json")
    a = ap.parse_args(argv)
    if a.what == "begin":
        return begin()
    if a.what == "step":
        cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
        return step(a.name, cmd)
    return report(a.budget, a.top, a.strict, a.save_costs)


if __name__ == "__main__":
    sys.exit(main())
