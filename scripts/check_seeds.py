"""Run labs over several seeds, with a CPU-bound process beside them, and print a pass/fail table.

    python scripts/check_seeds.py [NOTEBOOK ...] [--seeds 0,1,2,3,4] [--burners 1] [--timeout 900]

Every lab reads its seed from ``ATTNBOOK_SEED`` in ``attnbook.lab.setup`` (CI leaves it unset:
seed 0).
For each notebook and seed this runs ``pytest --nbval-lax`` on the notebook with that seed, while
``--burners`` busy-looping processes compete for the CPU -- the labs' asserts must hold on any seed
and however busy the machine is. The labs run as a reader runs them: no thread setting of this
script's own (in quick mode ``attnbook.lab.setup`` uses one thread unless ``OMP_NUM_THREADS`` is
set).
Without a GPU the Triton kernels run through the interpreter (``TRITON_INTERPRET=1``), as in
``make notebooks``.

Prints one row per notebook (a column per seed: ``pass``, or ``FAIL`` and the first failing cell)
with the wall time of each run, and the total. Exit code 0 only if every run passed.
Defaults: every ``notebooks/*.ipynb``, seeds 0-4, one burner.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BURN = "import time\nwhile True:\n    sum(i * i for i in range(10_000))\n"


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ``"0-4"`` (or a mix) -> a list of ints."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if re.fullmatch(r"\d+-\d+", part):
            lo, hi = (int(x) for x in part.split("-"))
            seeds.extend(range(lo, hi + 1))
        elif re.fullmatch(r"\d+", part):
            seeds.append(int(part))
        else:
            raise SystemExit(f"--seeds: expected e.g. 0,1,2 or 0-4; got {text!r}")
    return seeds


def has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def run_one(notebook: Path, seed: int, timeout: float) -> tuple[bool, str, float]:
    """Run one notebook at one seed; returns (passed, first failing cell or '', wall seconds)."""
    env = {**os.environ, "ATTNBOOK_SEED": str(seed), "PYTHONPATH": f"{ROOT}{os.pathsep}"
           + os.environ.get("PYTHONPATH", "")}
    # Every seed trains: seed 0 too, whose committed runs (lab.run) make test reads instead.
    env.setdefault("ATTNBOOK_RUNS", "live")
    if not has_gpu():
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider", str(notebook)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timeout {timeout:.0f} s", time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if out.returncode == 0:
        return True, "", wall
    m = re.search(r"::(Cell \d+)", out.stdout)
    return False, m.group(1) if m else f"rc {out.returncode}", wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--seeds", default="0-4")
    ap.add_argument("--burners", type=int, default=1, help="CPU-bound processes running beside the labs")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per notebook run")
    args = ap.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    seeds = parse_seeds(args.seeds)
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(max(0, args.burners))]
    print(f"{len(notebooks)} notebook(s) x seeds {seeds}, {len(burners)} CPU burner(s) beside them", flush=True)
    results: dict[tuple[str, int], tuple[bool, str, float]] = {}
    t_start = time.perf_counter()
    try:
        for nb in notebooks:
            for seed in seeds:
                results[nb.name, seed] = r = run_one(nb, seed, args.timeout)
                print(f"  {nb.name} seed {seed}: {'pass' if r[0] else 'FAIL ' + r[1]} ({r[2]:.0f} s)", flush=True)
    finally:
        for p in burners:            # only the processes this script started
            p.kill()
            p.wait()
    total = time.perf_counter() - t_start
    head = "| lab | " + " | ".join(f"seed {s}" for s in seeds) + " |"
    print()
    print(head)
    print("|" + "---|" * (len(seeds) + 1))
    for nb in notebooks:
        cells = []
        for s in seeds:
            ok, why, wall = results[nb.name, s]
            cells.append(f"pass {wall:.0f} s" if ok else f"FAIL ({why}) {wall:.0f} s")
        print(f"| {nb.name} | " + " | ".join(cells) + " |")
    failed = sum(not r[0] for r in results.values())
    print(f"\n{len(results) - failed}/{len(results)} runs passed; total {total:.0f} s "
          f"({len(burners)} burner(s), seeds via ATTNBOOK_SEED)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
