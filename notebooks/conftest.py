"""nbval runs every lab (`make notebooks`: ``pytest --nbval-lax notebooks --lab-cache``); with
``--lab-cache`` this plugin also keeps each lab that ran without a failure in the book's execution cache,
so `jupyter-book build` (``execute_notebooks: cache``) renders those outputs instead of running every lab
a second time. ``scripts/execute_labs.py`` owns the cache's rules: where it lives, and that it is emptied
when attnlib, the committed results, the packages or the labs' environment change (``--fresh-lab-cache``:
always). Under pytest-xdist (``-n 2 --dist loadfile``) each worker runs whole labs and stores its own.
"""

from __future__ import annotations

import fcntl
import importlib.util
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# scripts/ is a folder of commands, not a package: the one that owns the cache's rules is loaded by its path,
# and registered before it runs, as an import would register it.
_spec = importlib.util.spec_from_file_location("execute_labs", ROOT / "scripts" / "execute_labs.py")
execute_labs = importlib.util.module_from_spec(_spec)
sys.modules["execute_labs"] = execute_labs
_spec.loader.exec_module(execute_labs)

_RUNS: dict[str, dict] = {}       # lab path -> its nbval notebook, whether a cell failed, when it started


def pytest_addoption(parser):
    group = parser.getgroup("lab cache")
    group.addoption("--lab-cache", action="store_true",
                    help="keep every lab nbval ran without a failure in the book's execution cache")
    group.addoption("--fresh-lab-cache", action="store_true", help="empty the execution cache first")


def pytest_configure(config):
    # Once, before any lab runs: in the xdist controller, or in the only process without xdist.
    if config.getoption("--lab-cache") and not hasattr(config, "workerinput"):
        execute_labs.open_cache(config.getoption("--fresh-lab-cache"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if not item.config.getoption("--lab-cache") or not hasattr(item, "test_outputs"):
        return
    run = _RUNS.setdefault(str(item.fspath), {"nb": item.parent.nb, "failed": False, "ran": 0,
                                              "start": time.perf_counter()})
    if report.failed:
        run["failed"] = True
    if call.when == "call" and report.passed:
        cell = item.cell                             # the cell of nbval's copy of the notebook
        # A cell the book does not execute (an explorer that needs a live kernel) keeps no output.
        cell.outputs = [] if "skip-execution" in cell.metadata.get("tags", []) else list(item.test_outputs)
        cell.execution_count = item.cell_num + 1
        run["ran"] += 1


def pytest_sessionfinish(session):
    # only labs whose every code cell ran and passed (not one cut short, nor a selection with -k)
    done = {path: run for path, run in _RUNS.items() if not run["failed"]
            and run["ran"] == sum(c.cell_type == "code" for c in run["nb"].cells)}
    if not done:
        return
    lock = execute_labs.CACHE.with_name(".jupyter_cache.lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)                # xdist workers write the one sqlite cache in turn
        cache = execute_labs.open_cache(False)
        for path, run in done.items():
            execute_labs.store(cache, Path(path), run["nb"], time.perf_counter() - run["start"])
