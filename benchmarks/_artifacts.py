"""The committed compile results and what each one was made from.

Three results in ``benchmarks/results/`` take a CPU many minutes to make, so they are committed and the
tests read them: the static kernel report, the register counts behind ``tests/test_kernel_registers.py``
and the run of every autotuning candidate through the interpreter. Each is stamped with the inputs it was
made from (:func:`stamp`, by :mod:`attnbook._provenance`): the sha256 of the code of every repository
file its script executes -- the script and the closure of its imports, read from the source, so the
book's code (experiments, figures, exercises) is not among them -- and the versions of the packages that
compile or run the kernels. A result whose stamp matches the files and versions here is what making it again would
give; one that does not is stale, and the checks fail at once, naming the command that makes it again
(``make artifacts`` makes every stale one). Nothing in ``make test`` rebuilds a stale result.

The labs' committed training runs (``benchmarks/results/lab_runs/``, ``attnbook.lab_runs``)
are checked and made again here too, each from the parameters it records.

    python -m benchmarks._artifacts            # one line per result: current, or stale and why; exit 1 if stale
    python -m benchmarks._artifacts --regenerate   # make the stale ones again (what `make artifacts` runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attnbook import _provenance as provenance
from attnbook._provenance import ROOT


@dataclass(frozen=True)
class Artifact:
    name: str
    path: str                      # the committed JSON, relative to the repository root
    script: str                    # what makes it; its import closure is what it depends on
    command: tuple[str, ...]       # how to make it again, from the repository root
    packages: tuple[str, ...]      # the installed packages whose versions change what it holds
    interpret: bool = False        # the script runs the kernels through Triton's interpreter

    def shell(self) -> str:
        return ("TRITON_INTERPRET=1 " if self.interpret else "") + " ".join(self.command)


ARTIFACTS = (
    Artifact("kernel report", "benchmarks/results/kernel_report.json", "scripts/kernel_report.py",
             ("python", "scripts/kernel_report.py"), ("torch", "triton", "fla-core")),
    Artifact("register counts", "benchmarks/results/kernel_registers_cache.json", "scripts/kernel_resources.py",
             ("python", "scripts/kernel_resources.py", "--checked-runs"), ("torch", "triton")),
    Artifact("every autotuning candidate run", "benchmarks/results/candidates_executed.json",
             "scripts/check_candidates.py", ("python", "scripts/check_candidates.py"), ("torch", "triton"),
             interpret=True),
)
BY_NAME = {a.name: a for a in ARTIFACTS}


def by_script(script: str | Path) -> Artifact:
    rel = Path(script).resolve().relative_to(ROOT).as_posix()
    return next(a for a in ARTIFACTS if a.script == rel)


def stamp(artifact: Artifact) -> dict:
    """The fields a result is stamped with when it is written: its inputs and their hash."""
    return provenance.stamp(ROOT / artifact.script, artifact.packages)


def committed(artifact: Artifact) -> dict | None:
    path = ROOT / artifact.path
    return json.loads(path.read_text()) if path.exists() else None


def staleness(artifact: Artifact, result: dict | None = None) -> list[str]:
    """Why the committed result is not what making it again would give (empty: it is current)."""
    return provenance.staleness(committed(artifact) if result is None else result, stamp(artifact))


def stale_message(artifact: Artifact, why: list[str]) -> str:
    return (f"{artifact.path} ({artifact.name}) is stale: {'; '.join(why)}. Make it again with "
            f"`{artifact.shell()}` (or `make artifacts`) and commit it.")


def regenerate(artifact: Artifact) -> int:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    if artifact.interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    print(f"[artifacts] {artifact.name}: {artifact.shell()}", flush=True)
    t0 = time.time()
    code = subprocess.run([sys.executable, *artifact.command[1:]], cwd=ROOT, env=env).returncode
    print(f"[artifacts] {artifact.name}: {'done' if code == 0 else 'FAILED'} in {time.time() - t0:.0f} s", flush=True)
    return code


def _lab_runs(regenerate: bool) -> int:
    """Check (and with ``regenerate`` make again) every committed lab run; the number still stale."""
    from attnbook import lab_runs

    stale = 0
    for name in lab_runs.names():
        rel = lab_runs.path(name).relative_to(ROOT)
        why = lab_runs.staleness(name)
        if why and regenerate:
            print(f"[artifacts] lab run {name}: made again from its parameters", flush=True)
            t0 = time.time()
            lab_runs.rerun(name)
            print(f"[artifacts] lab run {name}: done in {time.time() - t0:.0f} s", flush=True)
            why = lab_runs.staleness(name)
        stale += bool(why)
        print(f"{'stale' if why else 'ok':5}  {rel}")
        if why:
            print(f"       {rel} (a lab's committed run) is stale: {'; '.join(why)}. Make it again with "
                  f"`{lab_runs.REMAKE}` (or `make artifacts`) and commit it.")
    return stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Are the committed results current? (see the module's doc)")
    ap.add_argument("--regenerate", action="store_true", help="make every stale result again")
    a = ap.parse_args(argv)
    stale = _lab_runs(a.regenerate)
    for artifact in ARTIFACTS:
        why = staleness(artifact)
        if why and a.regenerate:
            if regenerate(artifact) != 0:
                return 1
            why = staleness(artifact)
        stale += bool(why)
        print(f"{'stale' if why else 'ok':5}  {artifact.path}")
        if why:
            print(f"       {stale_message(artifact, why)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
