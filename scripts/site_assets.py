"""Put the scripts every page of the book shares into book/_static/ (ignored by git), so that the
built site is self-contained and a browser fetches each of them once:

* ``plotly.min.js`` -- copied from the installed plotly package (the version the labs ran with);
* ``mathjax/`` -- MathJax 3 (TeX input, CommonHTML output, its fonts and lazily loaded extensions),
  unpacked from the npm package's tarball, downloaded once and checked against the registry's sha512.

    python scripts/site_assets.py        # `make book` runs it before the build

Re-running is cheap: plotly.js is copied only when it changed, MathJax downloaded only when missing.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

STATIC = Path(__file__).resolve().parent.parent / "book" / "_static"
MATHJAX_VERSION = "3.2.2"
MATHJAX_TARBALL = f"https://registry.npmjs.org/mathjax/-/mathjax-{MATHJAX_VERSION}.tgz"
# the registry's `dist.integrity` for that tarball (`npm view mathjax@3.2.2 dist.integrity`)
MATHJAX_SHA512 = "Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
# what the pages load (``mathjax_path: mathjax/tex-chtml.js``) and what it loads on demand
MATHJAX_KEEP = ("tex-chtml.js", "input/tex/extensions/", "output/chtml/fonts/woff-v2/", "ui/", "a11y/", "sre/")


def copy_plotly_js() -> Path:
    import plotly

    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    dst = STATIC / "plotly.min.js"
    if not dst.exists() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)
    return dst


def fetch_mathjax() -> Path:
    dst = STATIC / "mathjax"
    stamp = dst / "VERSION"
    if stamp.exists() and stamp.read_text().strip() == MATHJAX_VERSION:
        return dst
    with urllib.request.urlopen(MATHJAX_TARBALL, timeout=60) as r:
        data = r.read()
    digest = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if digest != MATHJAX_SHA512:
        raise SystemExit(f"{MATHJAX_TARBALL}: sha512 {digest} is not the registry's {MATHJAX_SHA512}")
    shutil.rmtree(dst, ignore_errors=True)
    prefix = "package/es5/"
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name[len(prefix):] if member.name.startswith(prefix) else ""
            if not member.isfile() or not rel.startswith(MATHJAX_KEEP) or ".." in rel.split("/"):
                continue
            out = dst / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(member).read())
    stamp.write_text(MATHJAX_VERSION + "\n")
    return dst


def main() -> int:
    STATIC.mkdir(parents=True, exist_ok=True)
    for made in (copy_plotly_js(), fetch_mathjax()):
        size = sum(f.stat().st_size for f in made.rglob("*")) if made.is_dir() else made.stat().st_size
        print(f"site assets: {made.relative_to(STATIC.parent.parent)} ({size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
