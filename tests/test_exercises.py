"""The exercises' checker can pass a right answer and fail a wrong one, with the words a reader needs.

For every exercise in ``attnbook.exercises``: its solution, executed from the source the book shows
(``imports`` + ``solution_source()``, in a fresh namespace, as a reader's notebook would), passes on
several seeds; each plausible wrong answer written for it fails, and its message carries the hint meant
for it; the stub the reader starts from says "not attempted" instead of raising. And the exercises
notebooks are what ``scripts/exercise_notebooks.py`` writes from the package."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
import torch

from attnbook import exercises
from attnbook.exercises._checker import WIDTH, Case, Exercise, Wrong, compare, run
from attnbook.lab import CODE_WIDTH

ROOT = Path(__file__).resolve().parents[1]
ALL = exercises.all_exercises()
IDS = [f"{e.chapter}:{e.name}" for e in ALL]


@pytest.fixture(autouse=True)
def _puzzles_need_the_interpreter(request):
    """The kernel puzzles run through Triton's interpreter, which must be on before triton is imported
    (``make unit`` sets it without a GPU); on a GPU machine they are skipped, not failed."""
    ex = request.node.callspec.params.get("ex") if hasattr(request.node, "callspec") else None
    if ex is not None and ex.chapter == "A" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernel puzzles run through Triton's interpreter (TRITON_INTERPRET=1)")


def _flat(message: str) -> str:
    return " ".join(message.split()).lower()


@pytest.mark.parametrize("ex", ALL, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])   # the seeds the labs are checked over
def test_the_solution_the_book_shows_passes(ex, seed):
    outcome = exercises.check(ex.name, ex.define(ex.solution_source()), seed=seed)
    assert outcome.passed, outcome.message


@pytest.mark.parametrize("ex", ALL, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_every_wrong_answer_fails_with_the_hint_written_for_it(ex, seed):
    assert ex.wrong, f"{ex.name}: no wrong answer to show that the checker can fail"
    for wrong in ex.wrong:
        outcome = exercises.check(ex.name, wrong.fn, seed=seed)
        assert outcome.status == "failed", f"{ex.name}: {wrong.fn.__name__} passed:\n{outcome.message}"
        assert wrong.shows.lower() in _flat(outcome.message), (
            f"{ex.name}: {wrong.fn.__name__} failed without saying {wrong.shows!r}:\n{outcome.message}")


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_the_stub_says_not_attempted(ex):
    outcome = exercises.check(ex.name, ex.define(ex.stub_source()))
    assert outcome.status == "not attempted", outcome.message
    assert "not attempted" in outcome.message and "Traceback" not in outcome.message


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_every_message_fits_the_output_box(ex):
    messages = [exercises.check(ex.name, ex.solution).message]
    messages += [exercises.check(ex.name, w.fn).message for w in ex.wrong]
    long = [line for m in messages for line in m.splitlines() if len(line) > WIDTH]
    assert not long, long


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_the_inputs_include_degenerate_ones_and_flow_from_the_seed(ex):
    a = ex.cases(torch.Generator().manual_seed(1))
    b = ex.cases(torch.Generator().manual_seed(1))
    assert len(a) >= 3, f"{ex.name}: only {len(a)} inputs"
    assert [c.label for c in a] == [c.label for c in b]
    for ca, cb in zip(a, b):
        for x, y in zip(ca.args, cb.args):
            if isinstance(x, torch.Tensor):
                assert torch.equal(x.nan_to_num(), y.nan_to_num()), (
                    f"{ex.name}: input {ca.label!r} is not drawn from the generator")


def test_the_readers_functions_use_the_librarys_argument_names():
    """An argument the reader fills in means what it means in attnlib (``initial_state``, not ``S0``)."""
    import inspect

    from .test_vocabulary import SYNONYMS

    found = {ex.name: sorted(set(inspect.signature(getattr(ex.solution, "fn", ex.solution)).parameters)
                             & set(SYNONYMS)) for ex in ALL}
    assert not {k: v for k, v in found.items() if v}, {k: [f"{n} -> {SYNONYMS[n]}" for n in v]
                                                        for k, v in found.items() if v}


def test_each_chapter_has_three_to_six_exercises_and_the_appendix_four_puzzles():
    counts = {ch: len(exercises.chapter(ch)) for ch in "1234567"}
    assert all(3 <= n <= 6 for n in counts.values()), counts
    assert len(exercises.chapter("A")) >= 4
    names = [e.name for e in ALL]
    assert len(names) == len(set(names)), "two exercises share a name"


def test_a_failure_names_the_input_and_what_came_back():
    ex = exercises.get("softmax from the dual")
    out = exercises.check(ex.name, lambda s, eps: torch.softmax(s.float() * eps, dim=-1))
    text = out.message
    assert out.status == "failed" and re.search(r"wrong on input \d+ of \d+", text)
    assert "expected [" in text and "got      [" in text and "hint:" in text


def test_the_pages_checker_prints_the_verdict_and_raises_nothing(capsys):
    exercise = exercises.checker(seed=3)
    ex = exercises.get("softmax from the dual")
    exercise(ex.name, ex.solution)
    exercise(ex.name, ex.wrong[0].fn)
    exercise(ex.name, lambda s, eps: (_ for _ in ()).throw(NotImplementedError))
    out = capsys.readouterr().out
    assert out.startswith("✓ softmax from the dual: right on all")
    assert "✗ softmax from the dual: wrong on input" in out and "not attempted" in out


def test_an_error_in_the_readers_function_is_reported_not_raised():
    out = exercises.check("softmax from the dual", lambda s, eps: s.nonexistent())
    assert out.status == "failed" and "raised AttributeError" in out.message


def test_a_function_that_forgets_to_return_is_told_so():
    out = exercises.check("softmax from the dual", lambda s, eps: None)
    assert out.status == "failed" and "missing `return`" in out.message


def test_an_unknown_exercise_lists_the_known_ones():
    with pytest.raises(ValueError, match="softmax from the dual"):
        exercises.get("no such exercise")


def test_compare_fails_a_nan_a_wrong_shape_and_an_error_beyond_the_tolerance():
    e = torch.ones(2, 3, dtype=torch.float64)
    case = Case("x", (e,), e)
    assert compare(e.clone(), case) is None
    assert "NaN" in compare(e.clone().fill_(float("nan")), case)
    assert "shape" in compare(torch.ones(3, 2, dtype=torch.float64), case)
    assert "relative RMS error" in compare(e * 1.01, case)


def test_a_judge_decides_when_the_answer_is_not_unique():
    ex = Exercise(name="positive", chapter="1", title="t", statement="s", solution=lambda x: x,
                  cases=lambda g: [Case("a vector", (torch.ones(3),),
                                        judge=lambda got: None if (got > 0).all() else "not positive")],
                  wrong=(Wrong(lambda x: -x, "not positive"),))
    assert run(ex, lambda x: 2 * x, torch.Generator()).passed
    assert "not positive" in run(ex, lambda x: -x, torch.Generator()).message


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_exercises_notebooks_are_written_from_the_package():
    assert _script("exercise_notebooks").main(["--check"]) == 0, (
        "run `python scripts/exercise_notebooks.py` and commit the notebooks")


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_the_stub_and_the_solution_fit_the_page(ex):
    """The stub is a code cell and the solution a folded block: lines within a code box's CODE_WIDTH."""
    long = [(kind, n, len(line)) for kind, src in (("stub", ex.stub_source()), ("solution", ex.solution_source()))
            for n, line in enumerate(src.splitlines(), start=1) if len(line) > CODE_WIDTH]
    assert not long, f"{ex.name}: lines over {CODE_WIDTH} characters (part, line, length): {long}"


PAGES = sorted((ROOT / "notebooks").glob("*_exercises.ipynb"))


def _cells(page: Path) -> list[tuple[str, str]]:
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(page.read_text())["cells"]]


def _fenced(markdown: str) -> list[tuple[str, str]]:
    """The fenced blocks of a markdown cell: (language, body)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", markdown, flags=re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_line_of_code_an_exercises_page_shows_fits_a_code_box(page):
    """Code cells (set-up, stubs) and the fenced blocks of the markdown (folded solutions, the verdict
    example): at 1280 px a code box shows CODE_WIDTH characters; a longer line hides behind a scroll bar."""
    shown = [src if kind == "code" else body for kind, src in _cells(page)
             for body in ([src] if kind == "code" else [b for _, b in _fenced(src)])]
    long = [line for block in shown for line in block.splitlines() if len(line) > CODE_WIDTH]
    assert not long, f"{page.name}: lines over {CODE_WIDTH} characters: {long}"


SETUP = """# Set-up: works locally and on Colab (installs the book's code if missing).
import importlib.util, subprocess, sys
REPO = "https://github.com/attention-as-transport/attention-as-transport"
if importlib.util.find_spec("attnbook") is None:   # attnlib, then the book
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    f"git+{REPO}#subdirectory=attnlib", f"git+{REPO}"],
                   check=True)
"""


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_an_exercises_page_shows_a_folded_verdict_before_its_exercises(page):
    """After the introduction, before the set-up and exercise 1: a closed fold with one of the chapter's
    wrong answers for its tests, the checker's message for it (carrying the words CI expects of it) and
    its pass message. That the messages are the checker's own, current output is the notebooks-are-
    written-from-the-package test's (the script writes them by running the checker)."""
    cells = _cells(page)
    assert [kind for kind, _ in cells[:3]] == ["markdown", "markdown", "code"], page.name
    intro, fold, setup = (src for _, src in cells[:3])
    assert intro.startswith("# ") and setup.startswith(SETUP), page.name
    assert fold.startswith("<details>\n<summary>") and fold.rstrip().endswith("</details>"), page.name
    assert fold.count("<details") == 1, f"{page.name}: the fold must start closed"
    blocks = _fenced(fold)
    assert [lang for lang, _ in blocks] == ["python", "text", "text"], page.name
    (_, source), (_, failed), (_, passed) = blocks
    ch = "A" if page.stem.startswith("a1") else page.stem[1]
    name, wrong_name = _script("exercise_notebooks").VERDICT_EXAMPLES[ch]
    ex = exercises.get(name)
    wrong = [w for w in ex.wrong if getattr(w.fn, "fn", w.fn).__name__ == wrong_name]
    assert ex.chapter == ch and wrong, f"{page.name}: {wrong_name} is not a wrong answer of {name!r}"
    assert f"def {ex.function_name}(" in source and f'exercise("{name}", {ex.function_name})' in fold
    assert failed.startswith(f"✗ {name}: wrong on input") and wrong[0].shows.lower() in _flat(failed), failed
    assert passed.startswith(f"✓ {name}: right on all"), passed


# --- what the statement lets vary, and the promises the checker keeps ---------------------------------
# These reason from each exercise's declared freedoms and promises, not from the wrong answers written for
# it: an answer of a known kind of mistake, made here from the solution, must fail.

def _tensor_args(case: Case) -> list[int]:
    return [i for i, a in enumerate(case.args) if isinstance(a, torch.Tensor) and a.numel()]


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_every_freedom_the_statement_gives_is_exercised_by_an_input(ex):
    assert ex.freedoms, f"{ex.name}: no freedoms listed (what may its inputs vary in?)"
    for seed in (0, 3):
        cases = ex.cases(torch.Generator().manual_seed(seed))
        missing = [f.name for f in ex.freedoms if not any(f.present(c) for c in cases)]
        assert not missing, f"{ex.name} (seed {seed}): no input exercises {missing}"


def _writes_into_its_first_input(fn):
    def answer(*args):
        out = fn(*args)
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.numel()]
        first = next((a for a in tensors if a.is_floating_point()), tensors[0] if tensors else None)
        if first is not None:                         # a reader's in-place update of an input
            first.logical_not_() if first.dtype == torch.bool else first.add_(1)
        return out
    return answer


def _takes_tensors(ex: Exercise) -> bool:
    return any(_tensor_args(c) for c in ex.cases(torch.Generator().manual_seed(0)))


# A kernel puzzle's device function sees only tiles its harness loaded, so it cannot reach the inputs.
@pytest.mark.parametrize("ex", [e for e in ALL if not e.may_write_inputs and e.harness is None and _takes_tensors(e)],
                         ids=lambda e: e.name)
def test_an_answer_that_changes_an_input_fails(ex):
    outcome = exercises.check(ex.name, _writes_into_its_first_input(ex.solution), seed=0)
    assert outcome.status == "failed" and "in place" in outcome.message, outcome.message


def _in_another_dtype(fn):
    def answer(*args):
        out = fn(*args)
        def cast(t):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                return t.to(torch.float32 if t.dtype != torch.float32 else torch.float64)
            if isinstance(t, torch.Tensor):
                return t.to(torch.int32 if t.dtype != torch.int32 else torch.int64)
            return t
        return tuple(cast(t) for t in out) if isinstance(out, tuple) else cast(out)
    return answer


@pytest.mark.parametrize("ex", [e for e in ALL if e.out_dtype is not None], ids=lambda e: e.name)
def test_an_answer_in_another_dtype_fails_where_the_statement_fixes_it(ex):
    outcome = exercises.check(ex.name, _in_another_dtype(ex.solution), seed=0)
    assert outcome.status == "failed" and "dtype" in outcome.message, outcome.message


@pytest.mark.parametrize("ex", [e for e in ALL if e.fresh_output], ids=lambda e: e.name)
def test_an_answer_that_returns_its_input_fails_where_the_statement_asks_for_a_new_tensor(ex):
    def answer(*args):
        out = fn(*args)
        leaves = list(out) if isinstance(out, tuple) else [out]
        for j, t in enumerate(leaves):
            same = next((a for a in args if isinstance(a, torch.Tensor) and a.shape == getattr(t, "shape", None)
                         and a.dtype == t.dtype), None)
            if same is not None:
                same.copy_(t)                             # written into the input, and the input returned
                leaves[j] = same
                break
        return tuple(leaves) if isinstance(out, tuple) else leaves[0]
    fn = ex.solution
    outcome = exercises.check(ex.name, answer, seed=0)
    assert outcome.status == "failed", outcome.message


def test_a_mistake_no_hint_is_about_is_told_where_it_differs_not_given_a_hint():
    """An answer off by a small relative amount everywhere is not any input's special case: the checker
    names the entries that differ, the first one with both values, and gives no hint."""
    ex = exercises.get("softmax from the dual")

    def answer(*args):
        return ex.solution(*args) * 1.01
    outcome = exercises.check(ex.name, answer, seed=0)
    assert outcome.status == "failed"
    assert "where:" in outcome.message and "hint:" not in outcome.message, outcome.message
    assert re.search(r"\d+ of \d+ entries differ; first at \[", outcome.message), outcome.message


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_the_page_says_what_is_checked_and_what_is_not(ex):
    text = ex.promises()
    assert "leaves its inputs unchanged" in text or ex.may_write_inputs
    assert "does not check how you computed" in text
