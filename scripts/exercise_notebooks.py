"""Write each chapter's exercises notebook from ``attnlib.exercises`` (the one home of the statements,
stubs, solutions and checks), or check that the committed notebooks are what it would write.

    python scripts/exercise_notebooks.py           # (re)write notebooks/*_exercises.ipynb
    python scripts/exercise_notebooks.py --check   # exit 1 naming any notebook that differs

A notebook per chapter, next to its lab (``notebooks/01_softmax_is_eot_lab.ipynb`` ->
``notebooks/01_softmax_is_eot_exercises.ipynb``): the set-up cell of the labs, then per exercise a
numbered section with its statement, a code cell holding the stub and the checker's call, and the
solution folded in a ``<details>`` block, which JupyterLab, Colab and the built book all show closed.
The appendix's notebook switches Triton's interpreter on in its first cell, so the kernel puzzles run
on any CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPOSITORY = "https://github.com/attention-as-transport/attention-as-transport"

CHAPTERS = {  # chapter -> (lab notebook stem, heading)
    "1": ("01_softmax_is_eot_lab", "Exercises 1: softmax attention as transport"),
    "2": ("02_needle_lab", "Exercises 2: the needle"),
    "3": ("03_linear_attention_lab", "Exercises 3: linear attention"),
    "4": ("04_deltanet_lab", "Exercises 4: the delta rule"),
    "5": ("05_anna_lab", "Exercises 5: attention by locality-sensitive hashing"),
    "6": ("06_grassmann_lab", "Exercises 6: Grassmann mixing"),
    "7": ("07_landscape_lab", "Exercises 7: the landscape"),
    "A": ("a1_reading_a_kernel_lab", "Kernel puzzles"),
}

INTRO = (
    "Each exercise is a function to write. Fill in its body and run the cell: the checker runs your "
    "function on random inputs and on the awkward ones that break careless code (whichever apply: one "
    "position, masked rows, ties, a cold temperature, logits of $10^4$ in float16, repeated or "
    "parallel keys, lengths that do not divide into chunks), and compares what it returns with "
    "`attnlib` or with a definition written out independently. It prints ✓ with the inputs it tried, "
    "or the first input your function gets wrong, with what was expected, what came back and a hint "
    "about the usual mistake behind it. Until you fill a function in, its cell says *not attempted*. "
    "A worked solution is folded under each exercise; open it after you have tried.")

PUZZLE_INTRO = (
    "Each puzzle is a small Triton function to complete: one step of a kernel from the appendix. Your "
    "function runs inside a small kernel through Triton's interpreter, which the first cell switches "
    "on, so the puzzles work on any laptop and on Colab, with or without a GPU. The checker compares "
    "each result with `attnlib`'s reference on random tiles and on the awkward ones (tiles on the "
    "diagonal, a sequence that ends inside a tile, a running maximum that moves), and says what is "
    "wrong and why when it is. A worked solution is folded under each puzzle.")


def setup_source(interpret: bool) -> str:
    lines = ["# Set-up: works locally and on Colab (installs attnlib from the book's repository if missing)."]
    if interpret:
        lines += ["import os",
                  "# The puzzles run through Triton's interpreter on any machine; Triton reads this when a",
                  "# kernel is defined, so it is set before anything imports triton.",
                  'os.environ["TRITON_INTERPRET"] = "1"']
    lines += [
        "import importlib.util, subprocess, sys",
        'if importlib.util.find_spec("attnlib") is None:',
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",',
        f'                    "attnlib @ git+{REPOSITORY}"],',
        "                   check=True)",
        "from attnlib.experiments.lab import setup",
        "lab = setup(seed=0)   # the seed of the checker's random inputs",
        "print(lab)",
    ]
    return "\n".join(lines)


def exercise_cell(ex) -> str:
    return f'{ex.imports.rstrip()}\n\n\n{ex.stub_source().rstrip()}\n\n\nlab.exercise("{ex.name}", {ex.function_name})'


def solution_markdown(ex) -> str:
    code = f"{ex.imports.rstrip()}\n\n\n{ex.solution_source().rstrip()}"
    return f"<details>\n<summary>Solution</summary>\n\n```python\n{code}\n```\n\n</details>"


def _cell(kind: str, source: str, key: str) -> dict:
    cell = {"cell_type": kind, "id": hashlib.sha1(key.encode()).hexdigest()[:8], "metadata": {},
            "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    return cell


def notebook(ch: str) -> tuple[Path, dict]:
    from attnlib import exercises

    lab, heading = CHAPTERS[ch]
    stem = lab.replace("_lab", "_exercises")
    chapter_page = "a1_reading_a_kernel" if ch == "A" else lab.replace("_lab", "")
    link = (f"the [appendix](../book/{chapter_page}.md)" if ch == "A"
            else f"[chapter {ch}](../book/{chapter_page}.md)")
    intro = PUZZLE_INTRO if ch == "A" else INTRO
    cells = [_cell("markdown", f"# {heading}\n\nThe checked exercises of {link}. {intro}", f"{stem}:intro"),
             _cell("code", setup_source(interpret=ch == "A"), f"{stem}:setup")]
    for n, ex in enumerate(exercises.chapter(ch), start=1):
        cells += [_cell("markdown", f"## {n}. {ex.title}\n\n{ex.statement}", f"{stem}:{ex.name}:statement"),
                  _cell("code", exercise_cell(ex), f"{stem}:{ex.name}:stub"),
                  _cell("markdown", solution_markdown(ex), f"{stem}:{ex.name}:solution")]
    nb = {"cells": cells,
          "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                       "language_info": {"name": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    return ROOT / "notebooks" / f"{stem}.ipynb", nb


def text(nb: dict) -> str:
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare with the committed notebooks")
    args = ap.parse_args(argv)
    stale = []
    for ch in CHAPTERS:
        path, nb = notebook(ch)
        if args.check:
            if not path.is_file() or path.read_text() != text(nb):
                stale.append(path.name)
        else:
            path.write_text(text(nb))
            print("wrote", path.relative_to(ROOT))
    if stale:
        print("not what scripts/exercise_notebooks.py writes (run it): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
