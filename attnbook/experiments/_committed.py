"""Where the book's committed files (results, weights) are found: in a clone, or fetched from the repository.

A lab runs in ``notebooks/`` of a clone, or on Colab where only the packages are installed and the
repository's ``benchmarks/results/`` is not. :func:`committed_file` looks in the working directory and
above it, then next to the package (an editable install), then in a download cache, and (where asked)
downloads the file from :data:`REPOSITORY_RAW`.
"""

from __future__ import annotations

from pathlib import Path

# where a session without a clone fetches committed files from (the repository a lab's first cell installs)
REPOSITORY_RAW = "https://raw.githubusercontent.com/attention-as-transport/attention-as-transport/main"
CACHE = Path.home() / ".cache" / "attnbook"


def committed_file(relpath: str, download: bool = True) -> Path | None:
    """The committed file ``relpath`` (relative to the repository's root), or None when it is neither here
    nor (with ``download``) downloadable."""
    here = Path(__file__).resolve().parents[2]
    for d in (Path.cwd(), *Path.cwd().parents, here):
        if (d / relpath).is_file():
            return d / relpath
    cached = CACHE / relpath
    if cached.is_file():
        return cached
    if not download:
        return None
    import urllib.request
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(f"{REPOSITORY_RAW}/{relpath}", timeout=20) as r:
            cached.write_bytes(r.read())
        return cached
    except Exception:  # noqa: BLE001 - offline or moved: the caller says what is missing
        return None
