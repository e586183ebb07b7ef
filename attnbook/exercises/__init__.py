"""Exercises a reader can check: each chapter's, and the appendix's kernel puzzles.

    from attnbook.exercises import checker
    exercise = checker(seed=0)                       # the seed of the random inputs (a lab's lab.seed)
    def softmax_from_dual(scores, eps): ...          # the reader's answer
    exercise("softmax from the dual", softmax_from_dual)

prints ``✓`` with the inputs tried, or the first input on which the answer is wrong, what was
expected, what came back and a hint, or ``not attempted`` while the stub still raises
``NotImplementedError``. :func:`check` returns the same as an :class:`Outcome` (what CI tests).

Each chapter's module (``ch01`` .. ``ch07``; ``puzzles`` for the appendix, whose answers are Triton
kernels run through the interpreter) lists its exercises in ``EXERCISES``: the statement, the worked
solution (whose signature and docstring are the reader's stub), the inputs, and wrong answers that the
checker must catch. ``scripts/exercise_notebooks.py`` writes the exercises notebooks from them.

The chapters are imported here, by name, so that the import graph (``tests/test_import_graph.py``) sees
every edge: the exercises build on the operators and the experiments, and nothing below them imports
the exercises.
"""

from __future__ import annotations

import zlib

import torch

from . import (
    ch01,
    ch02,
    ch03,
    ch04,
    ch05,
    ch06,
    ch07,
    puzzles,  # the appendix; imports without triton, and says why when it is missing
)
from ._checker import Case, Exercise, Outcome, Wrong, run

__all__ = ["Case", "Exercise", "Outcome", "Wrong", "all_exercises", "check", "checker", "chapter", "get",
           "MODULES"]

# Chapter modules in book order, the appendix's puzzles last.
_CHAPTERS = (ch01, ch02, ch03, ch04, ch05, ch06, ch07, puzzles)
MODULES = tuple(m.__name__.rpartition(".")[2] for m in _CHAPTERS)


def _module_exercises(mod: str) -> tuple[Exercise, ...]:
    return _CHAPTERS[MODULES.index(mod)].EXERCISES


def all_exercises() -> list[Exercise]:
    """Every exercise, in book order."""
    return [ex for mod in MODULES for ex in _module_exercises(mod)]


def chapter(ch: str) -> list[Exercise]:
    """The exercises of chapter ``ch`` ("1" .. "7", or "A")."""
    mod = "puzzles" if ch == "A" else f"ch{int(ch):02d}"
    return list(_module_exercises(mod))


def get(name: str) -> Exercise:
    """The exercise called ``name`` (the name its page passes to the checker)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, the exercise's name; got {type(name).__name__}")
    for mod in MODULES:
        for ex in _module_exercises(mod):
            if ex.name == name:
                return ex
    known = ", ".join(repr(e.name) for e in all_exercises())
    raise ValueError(f"no exercise is called {name!r}; the exercises are: {known}")


def seed_for(name: str, seed: int) -> int:
    """The seed of an exercise's random inputs: the lab's seed, and a stream of its own per exercise."""
    return seed * 100_003 + 50_000 + zlib.crc32(name.encode()) % 40_000


def check(name: str, fn, *, seed: int = 0) -> Outcome:
    """Run the reader's ``fn`` on the inputs of exercise ``name`` (random ones drawn from ``seed``)."""
    ex = get(name)
    return run(ex, fn, torch.Generator().manual_seed(seed_for(name, seed)))


def checker(seed: int = 0):
    """``exercise(name, fn)`` for an exercises page: run the reader's ``fn`` on the inputs of exercise
    ``name`` (random ones drawn from ``seed``, a lab's ``lab.seed``, and the degenerate ones) and print
    ``✓`` with the inputs tried, the first input it gets wrong (expected, got, a hint or where it
    differs), or "not attempted" while ``fn`` still raises ``NotImplementedError``. A wrong answer is
    reported, not raised, so the notebook runs on."""
    seed = int(seed)

    def exercise(name: str, fn) -> None:
        print(check(name, fn, seed=seed))
    return exercise
