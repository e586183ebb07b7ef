"""A lab's training runs, committed: what ``lab.run`` reads instead of training for minutes on a CPU.

A lab cell that trains models for minutes calls ``lab.run(name, experiment, **params)``, where
``experiment`` is a function of the library (``attnbook.experiments``) that trains, probes and returns
plain numbers (a JSON-able dict). At full scale (a GPU) it always runs. In quick mode (a CPU) it may
read ``benchmarks/results/lab_runs/<name>.json`` instead: the same function's result for the same
parameters, stamped with the inputs it was made from (``attnbook._provenance``: the code of every repository
file the function's module executes, the torch, numpy and Python versions). With the same stamp, running it
again gives the same numbers -- the function is seeded and runs on one CPU thread -- so reading it is
running it, without the minutes. ``ATTNBOOK_RUNS`` chooses:

* ``read`` (the default): the committed run when it is of this code and these parameters, else run;
* ``require`` (``make test``): the committed run, or an error naming the command that makes it
  (:data:`REMAKE`) -- CI never trains what it can read, and never silently reads a stale run;
* ``write``: run, and commit the result (``python -m benchmarks._artifacts --regenerate`` does this
  for every stale run, from the parameters each file records);
* ``live``: always run.
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import platform
import time
from pathlib import Path

from . import _provenance
from .experiments import anna, hybrid, mqar

DIR = _provenance.ROOT / "benchmarks" / "results" / "lab_runs"
PACKAGES = ("torch", "numpy")
MODES = ("read", "require", "write", "live")
REMAKE = "python -m benchmarks._artifacts --regenerate"


def _qualname(experiment) -> str:
    return f"{experiment.__module__}.{experiment.__qualname__}"


# The experiments whose runs a lab commits (``lab.run``), named by import statement rather than loaded by
# name, so that the import graph sees every module a run executes; a new one is one entry here.
EXPERIMENTS = {_qualname(f): f for f in (mqar.accuracy_grid, anna.quick_reproduction, hybrid.short_run)}


def experiment_named(qualname: str):
    """The experiment a committed run records, from :data:`EXPERIMENTS`."""
    if qualname not in EXPERIMENTS:
        raise ValueError(f"{qualname} is not among lab_runs.EXPERIMENTS ({', '.join(sorted(EXPERIMENTS))}); "
                         "a lab that commits its runs names the experiment there")
    return EXPERIMENTS[qualname]


def mode() -> str:
    m = os.environ.get("ATTNBOOK_RUNS", "read")
    if m not in MODES:
        raise ValueError(f"ATTNBOOK_RUNS must be one of {', '.join(MODES)}; got {m!r}")
    return m


def path(name: str) -> Path:
    return DIR / f"{name}.json"


def shown(name: str) -> str:
    """Where the run ``name`` lives, as a reader of the repository finds it."""
    p = path(name)
    return p.relative_to(_provenance.ROOT).as_posix() if p.is_relative_to(_provenance.ROOT) else str(p)


def source(experiment) -> Path:
    return Path(inspect.getsourcefile(experiment)).resolve()


def stamp(experiment) -> dict:
    return _provenance.stamp(source(experiment), PACKAGES)


def plain(value):
    """``value`` as JSON has it (tuples become lists): what a committed run holds and reads back."""
    return json.loads(json.dumps(value))


def committed(name: str) -> dict | None:
    p = path(name)
    return json.loads(p.read_text()) if p.exists() else None


def why_not(name: str, experiment, params: dict, run: dict | None = None) -> list[str]:
    """Why the committed run ``name`` is not ``experiment(**params)`` of this code (empty: it is)."""
    run = committed(name) if run is None else run
    if run is None:
        return [f"{shown(name)} is missing"]
    why = []
    qualname = _qualname(experiment)
    if run.get("experiment") != qualname:
        why.append(f"it is a run of {run.get('experiment')}, not of {qualname}")
    if run.get("params") != plain(params):
        diff = sorted(k for k in set(run.get("params", {})) | set(params)
                      if run.get("params", {}).get(k) != plain(params).get(k))
        why.append(f"other parameters: {', '.join(diff)}")
    return why + _provenance.staleness(run, stamp(experiment))


def execute(name: str, experiment, params: dict, write: bool) -> dict:
    """Run ``experiment(**params)``; with ``write``, commit the result as the run ``name``."""
    before = stamp(experiment)
    t0 = time.time()
    result = experiment(**params)
    seconds = time.time() - t0
    if write:
        experiment_named(_qualname(experiment))         # a run committed is a run `rerun` can make again
        if stamp(experiment) != before:
            raise RuntimeError(f"the code of {name} changed while it ran: run it again")
        record = {"name": name, "experiment": _qualname(experiment),
                  "params": plain(params), **before,
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "seconds": round(seconds, 1), "machine": platform.processor() or platform.machine(),
                  "result": result}
        DIR.mkdir(parents=True, exist_ok=True)
        path(name).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return result


def rerun(name: str) -> None:
    """Make the committed run ``name`` again from the parameters it records (after a code change), as a
    lab in quick mode runs it: on one CPU thread (``lab.setup``), since the order of a sum split over
    threads could change the last bits of what was trained."""
    import torch

    torch.set_num_threads(1)
    run = committed(name)
    execute(name, experiment_named(run["experiment"]), run["params"], write=True)


def staleness(name: str) -> list[str]:
    """Why the committed run ``name`` is not of this code, from the experiment it records."""
    run = committed(name)
    if run["experiment"] not in EXPERIMENTS:
        return [f"it is a run of {run['experiment']}, which lab_runs.EXPERIMENTS does not name"]
    return _provenance.staleness(run, stamp(EXPERIMENTS[run["experiment"]]))


def names() -> list[str]:
    return sorted(p.stem for p in DIR.glob("*.json")) if DIR.exists() else []
