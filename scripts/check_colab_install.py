"""Check a lab's Colab path locally: its first cell installs attnlib into a fresh environment.

    python scripts/check_colab_install.py [--notebook notebooks/03_linear_attention_lab.ipynb] [--cells 2]

What Colab does, as far as it can be done without Colab:

1. clone this repository (its committed HEAD) into a temporary directory -- the stand-in for the URL
   in ``_config.yml``;
2. create a fresh virtual environment (with a current pip, as Colab has) that has no attnlib, and
   give it "preinstalled" torch, triton, numpy, plotly and tqdm, as Colab has them: the
   distributions (and their dependencies) of the Python running this script are linked into it,
   dist-info included, so pip sees them as installed and must not reinstall them;
3. run the notebook's first cell in that environment, outside the repository, with the repository URL
   replaced by ``git+file://<the clone>`` -- the same ``pip install "git+...#subdirectory=attnlib" "git+..."``
   command (the library, then the book's code);
4. run the next ``--cells - 1`` code cells, and check that ``attnlib`` and ``attnbook`` were imported from the fresh
   environment and that torch was not reinstalled.

Needs git and pip's index for the build backend (setuptools). Takes about a minute on a 2-core
machine, so it is not part of ``make test``. Exit code 0 when every step passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREINSTALLED = ("torch", "triton", "numpy", "plotly", "tqdm")   # what Colab ships and the labs import


def repository_url() -> str:
    m = re.search(r"^\s*url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M)
    if not m:
        raise SystemExit("no repository url in _config.yml")
    return m.group(1)


def closure(names) -> list[metadata.Distribution]:
    """The distributions ``names`` and everything they require (ignoring extras and markers)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.split(r"[\s<>=!~;\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if not name or name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen[name] = dist
        todo += [r for r in (dist.requires or []) if "extra ==" not in r]
    return list(seen.values())


def link_distributions(dists, site: Path) -> int:
    """Symlink each distribution's top-level entries (packages, modules, dist-info) into ``site``."""
    n = 0
    for dist in dists:
        base = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in (dist.files or []) if not str(f).startswith("..")}
        for top in tops:
            src, dst = base / top, site / top
            if src.exists() and not dst.exists() and top not in ("__pycache__", "bin"):
                dst.symlink_to(src)
                n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--notebook", type=Path, default=ROOT / "notebooks" / "03_linear_attention_lab.ipynb")
    ap.add_argument("--cells", type=int, default=2, help="how many code cells to run (the first installs)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cells = [c for c in json.loads(args.notebook.read_text())["cells"] if c["cell_type"] == "code"]
    code = ["".join(c["source"]) for c in cells[: args.cells]]
    url = repository_url()
    if url not in code[0]:
        print(f"FAIL: the first cell does not install from {url}")
        return 1
    with tempfile.TemporaryDirectory(prefix="colab-check-") as tmp:
        tmp = Path(tmp)
        clone = tmp / "clone"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(tmp / "venv")], check=True)
        py = tmp / "venv" / "bin" / "python"
        # Colab's pip is recent; the pip that venv bundles may be too old to parse git+file:/// URLs
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade", "pip"],
                       check=True)
        site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        n = link_distributions(closure(PREINSTALLED), site)
        print(f"fresh venv {tmp / 'venv'}: {n} preinstalled entries linked from {sysconfig.get_paths()['purelib']}")
        probe = subprocess.run([str(py), "-c", "import importlib.util as u; "
                                "print(u.find_spec('attnlib'), u.find_spec('attnbook'))"],
                               capture_output=True, text=True, check=True, cwd=tmp)
        if probe.stdout.strip() != "None None":
            print("FAIL: attnlib or attnbook is importable before the first cell ran")
            return 1
        script = "\n\n".join([code[0].replace(url, f"file://{clone}")] + code[1:]) + """

import attnlib, attnbook, torch
print("ATTNLIB_FILE", attnlib.__file__)
print("ATTNBOOK_FILE", attnbook.__file__)
print("TORCH_FILE", torch.__file__)
"""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.setdefault("TRITON_INTERPRET", "1")
        out = subprocess.run([str(py), "-c", script], capture_output=True, text=True, cwd=tmp, env=env)
        print(out.stdout[-3000:])
        if out.returncode != 0:
            print(out.stderr[-3000:])
            print(f"FAIL: the first {args.cells} cell(s) did not run ({time.perf_counter() - t0:.0f} s)")
            return 1
        where = dict(line.split(" ", 1) for line in out.stdout.splitlines()
                     if line.startswith(("ATTNLIB_FILE", "ATTNBOOK_FILE", "TORCH_FILE")))
        installed_in_venv = all(where[k].startswith(str(site)) for k in ("ATTNLIB_FILE", "ATTNBOOK_FILE"))
        here = Path(sysconfig.get_paths()["purelib"]).resolve()
        torch_linked = Path(where["TORCH_FILE"]).resolve().is_relative_to(here)
        print(f"attnlib imported from {where['ATTNLIB_FILE']}, attnbook from {where['ATTNBOOK_FILE']} "
              f"(fresh venv: {installed_in_venv}); "
              f"torch from the preinstalled copy: {torch_linked}")
        ok = installed_in_venv and torch_linked
        print(f"{'PASS' if ok else 'FAIL'}: Colab install path, {args.notebook.name}, "
              f"{args.cells} cell(s), {time.perf_counter() - t0:.0f} s")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
