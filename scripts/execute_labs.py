"""Execute every lab once, fail naming the cell that raised, and keep the executed notebooks in the
book's execution cache, so that `jupyter-book build` (``execute_notebooks: cache``) renders these
outputs instead of running every lab a second time.

    python scripts/execute_labs.py [--fresh] [--jobs N] [notebooks/*.ipynb]

`make test` runs the labs through nbval instead (``notebooks/conftest.py`` fills the same cache with
what nbval executed); `make book` runs this script, which skips labs already in the cache.

The cache (jupyter-cache, ``_build/.jupyter_cache``) matches a notebook on its code cells alone. The
numbers on a page also depend on attnlib, the committed results the labs read, the installed packages
and the lab's environment (``ATTNBOOK_*``), so the cache is emptied whenever their fingerprint changes
(and always with ``--fresh``, which `make test` passes): a stale cache cannot show outdated numbers.

Labs run as a reader's kernel would (in ``notebooks/``, cells tagged ``skip-execution`` skipped),
``--jobs`` at a time (default: one per CPU core, one on a GPU machine); quick mode uses one torch
thread per kernel, so two labs on two cores do not wait on each other. Exit code 1 if any lab fails.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import re
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / ".jupyter_cache"      # Jupyter Book's default execution cache
FINGERPRINT = CACHE.with_name(".jupyter_cache.fingerprint")
TIMEOUT = 600                                   # seconds per cell, as `execute: timeout` in _config.yml
# what the labs' numbers depend on besides their own code
INPUTS = ("attnlib", "attnbook", "benchmarks/results", "requirements.txt", "requirements-dev.txt", "pyproject.toml")
PACKAGES = ("torch", "triton", "numpy", "scipy", "plotly")
ENV_PREFIXES = ("ATTNBOOK_", "PLOTLY_RENDERER", "TRITON_INTERPRET")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def fingerprint() -> str:
    h = hashlib.sha256()
    for name in INPUTS:
        p = ROOT / name
        files = sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts) if p.is_dir() else [p]
        for f in files:
            if f.exists():
                h.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    for pkg in PACKAGES:
        try:
            h.update(f"{pkg}={importlib.metadata.version(pkg)}\0".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{pkg}=-\0".encode())
    h.update(sys.version.encode())
    for k in sorted(os.environ):
        if k.startswith(ENV_PREFIXES):
            h.update(f"{k}={os.environ[k]}\0".encode())
    return h.hexdigest()


def open_cache(fresh: bool):
    """The execution cache, emptied first when ``fresh`` or when what the labs depend on changed."""
    from jupyter_cache import get_cache

    now = fingerprint()
    stale = not FINGERPRINT.exists() or FINGERPRINT.read_text().strip() != now
    if (fresh or stale) and CACHE.exists():
        shutil.rmtree(CACHE)
        why = "--fresh" if fresh else "attnlib, results, packages or environment changed"
        print(f"execution cache emptied ({why})")
    FINGERPRINT.parent.mkdir(parents=True, exist_ok=True)
    FINGERPRINT.write_text(now + "\n")
    return get_cache(str(CACHE))


def store(cache, path: Path, executed, seconds: float) -> None:
    """Keep ``executed`` (the notebook at ``path`` with its outputs) in the cache for the book build."""
    from jupyter_cache.base import CacheBundleIn

    stage = cache.add_nb_to_project(str(path))
    cache.cache_notebook_bundle(CacheBundleIn(executed, stage.uri, data={"execution_seconds": seconds}),
                                check_validity=False, overwrite=True)


def execute(path: str) -> tuple[str, str | None, float]:
    """Run one notebook in a fresh kernel; return (executed notebook as JSON, failure or None, seconds)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    # record_timing=False: timings in cell metadata would change the hash the book build matches on
    client = NotebookClient(nb, timeout=TIMEOUT, allow_errors=False, store_widget_state=False, record_timing=False,
                            resources={"metadata": {"path": str(Path(path).parent)}})
    start = time.perf_counter()
    failure = None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        failure = describe_failure(nb, e)
    return nbformat.writes(nb), failure, time.perf_counter() - start


def describe_failure(nb, error: Exception) -> str:
    """Name the cell that failed (its index among code cells, id and first line) and its error."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    failed = next((c for c in code if any(o.get("output_type") == "error" for o in c.get("outputs", []))), None)
    if failed is None:      # a timeout or a dead kernel: the last cell that started
        started = [c for c in code if c.get("execution_count") is not None]
        failed = started[-1] if started else None
    head = "a cell"
    if failed is not None:
        first = next((ln for ln in failed.source.splitlines() if ln.strip()), "")
        head = f"code cell {code.index(failed) + 1} (id {failed.get('id', '?')}: {first[:80]!r})"
    return f"{head} raised:\n{ANSI.sub('', str(error)).strip()}"


def shown(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--fresh", action="store_true", help="empty the execution cache first")
    ap.add_argument("--jobs", type=int, default=0, help="labs at a time (default: CPU cores, 1 with a GPU)")
    args = ap.parse_args()
    notebooks = [p.resolve() for p in (args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb")))]

    import nbformat

    cache = open_cache(args.fresh)
    todo = []
    for p in notebooks:
        try:
            cache.match_cache_notebook(nbformat.read(p, as_version=4))
            print(f"cached  {shown(p)}")
        except KeyError:
            todo.append(p)
    jobs = args.jobs or (1 if shutil.which("nvidia-smi") else min(os.cpu_count() or 1, len(todo) or 1))
    failures = 0
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        running = {pool.submit(execute, str(p)): p for p in todo}
        for done in as_completed(running):
            p = running[done]
            text, failure, seconds = done.result()
            rel = shown(p)
            if failure:
                failures += 1
                print(f"FAIL    {rel} ({seconds:.0f} s): {failure}", flush=True)
                continue
            store(cache, p, nbformat.reads(text, as_version=4), seconds)
            print(f"ok      {rel} ({seconds:.0f} s)", flush=True)
    print(f"labs: {len(notebooks) - failures} passed, {failures} failed"
          + (f" ({len(notebooks) - len(todo)} from the cache)" if len(todo) < len(notebooks) else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
