"""Write each chapter's exercises notebook from ``attnbook.exercises`` (the one home of the statements,
stubs, solutions and checks), or check that the committed notebooks are what it would write.

    python scripts/exercise_notebooks.py           # (re)write notebooks/*_exercises.ipynb
    python scripts/exercise_notebooks.py --check   # exit 1 naming any notebook that differs

A notebook per chapter, next to its lab (``notebooks/01_softmax_is_eot_lab.ipynb`` ->
``notebooks/01_softmax_is_eot_exercises.ipynb``): the introduction; a folded example of the checker's
verdicts (below); the set-up cell of the labs; then per exercise a numbered section with its statement,
a code cell holding the stub and the checker's call, and the solution folded in a ``<details>`` block,
which JupyterLab, Colab and the built book all show closed. The appendix's notebook switches Triton's
interpreter on in its first cell, so the kernel puzzles run on any CPU. Every line of code a page shows
fits ``attnbook.lab.CODE_WIDTH`` (tests/test_exercises.py).

The example is text this script writes by running the checker (:data:`VERDICT_EXAMPLES`): one of the
wrong answers a chapter's module keeps for its tests, executed from the very source the page shows,
and what the checker (``exercise(name, fn)``) prints for it and for the worked solution, with the
notebook's seed. So the page shows a verdict without running anything, and ``--check`` (a unit test)
fails when the checker, an exercise or its inputs change what it says. The appendix's example runs
through Triton's interpreter: in this process when it is on (or triton is not imported yet), otherwise
in a child process.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
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


# chapter -> (exercise, the wrong answer its verdict example shows: one of that exercise's ``wrong``,
# named as in its module; self-contained, since the page shows its source and the example runs that)
VERDICT_EXAMPLES = {
    "1": ("sinkhorn", "_sinkhorn_rows_only"),
    "2": ("block-sparse attention", "_sparse_times_zero"),
    "3": ("recurrent linear attention", "_recurrent_read_first"),
    "4": ("delta rule", "_delta_outer_transposed"),
    "5": ("simhash codes", "_codes_ge"),
    "6": ("plucker coordinates", "_pl_fp16"),
    "7": ("lightning indexer", "_scores_relu_after"),
    "A": ("chunk state update", "_state_no_correction"),
}


def setup_source(interpret: bool) -> str:
    lines = [
        "# Set-up: works locally and on Colab (installs the book's code if missing).",
        "import importlib.util, subprocess, sys",
        f'REPO = "{REPOSITORY}"',
        'if importlib.util.find_spec("attnbook") is None:   # attnlib, then the book',
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",',
        '                    f"git+{REPO}#subdirectory=attnlib", f"git+{REPO}"],',
        '                   check=True)',
    ]
    if interpret:
        lines += ["import os",
                  "# The puzzles run through Triton's interpreter on any machine; Triton reads",
                  "# this when a kernel is defined, so it is set before anything imports triton.",
                  'os.environ["TRITON_INTERPRET"] = "1"']
    lines += [
        "from attnbook.lab import setup",
        "from attnbook.exercises import checker",
        "lab = setup(seed=0)   # the seed of the checker's random inputs",
        "exercise = checker(lab.seed)",
        "print(lab)",
    ]
    return "\n".join(lines)


def exercise_cell(ex) -> str:
    return f'{ex.imports.rstrip()}\n\n\n{ex.stub_source().rstrip()}\n\n\nexercise("{ex.name}", {ex.function_name})'


def solution_markdown(ex) -> str:
    code = f"{ex.imports.rstrip()}\n\n\n{ex.solution_source().rstrip()}"
    return f"<details>\n<summary>Solution</summary>\n\n```python\n{code}\n```\n\n</details>"


def _fn_name(fn) -> str:
    return getattr(getattr(fn, "fn", fn), "__name__", "")


def verdict(ch: str) -> dict:
    """Chapter ``ch``'s verdict example, made by running the checker: the wrong answer's source (under
    the name of the function the reader writes), what the checker says to it, and to the solution."""
    from attnbook import exercises

    name, wrong_name = VERDICT_EXAMPLES[ch]
    ex = exercises.get(name)
    wrong = next((w for w in ex.wrong if _fn_name(w.fn) == wrong_name), None)
    if ex.chapter != ch or wrong is None:
        raise ValueError(f"VERDICT_EXAMPLES[{ch!r}]: {wrong_name} is not a wrong answer of chapter {ch}'s "
                         f"exercise {name!r}")
    source = textwrap.dedent(inspect.getsource(getattr(wrong.fn, "fn", wrong.fn))).rstrip() + "\n"
    source = re.sub(rf"\bdef {re.escape(wrong_name)}\(", f"def {ex.function_name}(", source, count=1)
    failed = exercises.check(ex.name, ex.define(source)).message
    if failed != exercises.check(ex.name, wrong.fn).message:
        raise ValueError(f"VERDICT_EXAMPLES[{ch!r}]: {wrong_name}, run from its source, is not what the module "
                         "runs (does it call a helper?): pick a self-contained wrong answer")
    passed = exercises.check(ex.name, ex.define(ex.solution_source())).message
    if not (failed.startswith("✗") and passed.startswith("✓")):
        raise ValueError(f"chapter {ch}'s verdict example: expected a failure and a pass, got\n{failed}\n{passed}")
    number = [e.name for e in exercises.chapter(ch)].index(ex.name) + 1
    return {"exercise": ex.name, "number": number, "title": ex.title, "function": ex.function_name,
            "source": source, "failed": failed, "passed": passed}


def _interpreter_on() -> bool:
    """Whether Triton runs kernels through its interpreter in this process, as the puzzles' verdict
    needs; switched on here when triton is not imported yet (the appendix's set-up cell does the same)."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def verdicts() -> dict[str, dict]:
    """Every chapter's verdict example: here, or in a child process with Triton's interpreter on."""
    if _interpreter_on():
        return {ch: verdict(ch) for ch in CHAPTERS}
    out = subprocess.run([sys.executable, __file__, "--verdicts"], capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "1"}, check=True)
    return json.loads(out.stdout)


def verdict_markdown(v: dict) -> str:
    """A closed fold: the wrong answer, the checker's message for it, and its message for the solution."""
    return (f"<details>\n<summary>What the checker says: an example</summary>\n\n"
            f"A plausible wrong answer to {'puzzle' if v['source'].startswith('@triton') else 'exercise'} "
            f"{v['number']}, *{v['title']}*:\n\n"
            f"```python\n{v['source'].rstrip()}\n```\n\n"
            f"`exercise(\"{v['exercise']}\", {v['function']})` prints:\n\n"
            f"```text\n{v['failed']}\n```\n\n"
            f"and for the worked solution:\n\n"
            f"```text\n{v['passed']}\n```\n\n</details>")


def _cell(kind: str, source: str, key: str) -> dict:
    cell = {"cell_type": kind, "id": hashlib.sha1(key.encode()).hexdigest()[:8], "metadata": {},
            "source": source.splitlines(keepends=True)}
    if kind == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    return cell


def notebook(ch: str) -> tuple[Path, dict]:
    from attnbook import exercises

    lab, heading = CHAPTERS[ch]
    stem = lab.replace("_lab", "_exercises")
    chapter_page = "a1_reading_a_kernel" if ch == "A" else lab.replace("_lab", "")
    link = (f"the [appendix](../book/{chapter_page}.md)" if ch == "A"
            else f"[chapter {ch}](../book/{chapter_page}.md)")
    intro = PUZZLE_INTRO if ch == "A" else INTRO
    cells = [_cell("markdown", f"# {heading}\n\nThe checked exercises of {link}. {intro}", f"{stem}:intro"),
             _cell("markdown", verdict_markdown(verdicts()[ch]), f"{stem}:verdicts"),
             _cell("code", setup_source(interpret=ch == "A"), f"{stem}:setup")]
    for n, ex in enumerate(exercises.chapter(ch), start=1):
        statement = f"## {n}. {ex.title}\n\n{ex.statement}\n\n*What is checked.* {ex.promises()}"
        cells += [_cell("markdown", statement, f"{stem}:{ex.name}:statement"),
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
    ap.add_argument("--verdicts", action="store_true", help=argparse.SUPPRESS)   # verdicts()' child
    args = ap.parse_args(argv)
    if args.verdicts:
        if not _interpreter_on():
            raise SystemExit("--verdicts runs the kernel puzzles: set TRITON_INTERPRET=1")
        print(json.dumps({ch: verdict(ch) for ch in CHAPTERS}))
        return 0
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
