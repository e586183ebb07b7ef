"""Every mechanism of ``attnlib.mechanisms`` is in every list that names mechanisms, or its book record
(``attnbook.mechanisms.BOOK``) says why not.

Each consumer is read where it lives (a registry, a tuple, a test file's syntax tree, a notebook's code),
so a mechanism added to the library and forgotten by one of them fails here, naming the consumer; and a
reason left behind after a consumer learnt the mechanism fails too, so the reasons stay true.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import re
from functools import cache
from pathlib import Path

import pytest

from attnbook import mechanisms as book
from attnbook.experiments import landscape, recall, roofline
from attnbook.experiments.needle import ALGORITHMS
from attnlib.mechanisms import REGISTRY, SUPPORT_MODULES, Mechanism

ROOT = Path(__file__).resolve().parent.parent
# The adversaries the landscape runs itself rather than through chapter 2's algorithms: the operator, and
# chapter 7's top-k layer with its indexer.
OWN_ADVERSARIES = ("exact", "lightning_indexer")
# The ops of the committed kernel report (importing its package would switch Triton's interpreter off)
REPORT_OPS = tuple(json.loads((ROOT / "benchmarks" / "results" / "kernel_report.json").read_text())["ops"])


@cache
def _gpu_session():
    spec = importlib.util.spec_from_file_location("gpu_session", ROOT / "scripts" / "gpu_session.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@cache
def _test_trees() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted((ROOT / "tests").glob("test_*.py"))}


def _called(node: ast.AST) -> set[str]:
    """The names of the functions called anywhere under ``node`` (``f(...)`` and ``mod.f(...)``)."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            names.add(f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "")
    return names


def _refused_in_a_test(fn: str) -> bool:
    """A test calls ``fn`` inside ``with pytest.raises(...)``."""
    for tree in _test_trees().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.With) and any(
                    isinstance(i.context_expr, ast.Call) and "raises" in _called(i.context_expr) for i in node.items):
                if fn in _called(ast.Module(body=node.body, type_ignores=[])):
                    return True
    return False


NON_FINITE_TEST = re.compile(r"nan|non_?finite|inf\b|_inf_")


def _non_finite_test(fn: str) -> bool:
    """A test named for NaN or non-finite inputs calls ``fn``, directly or through a helper of its file."""
    for tree in _test_trees().values():
        helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")}
        for node in tree.body:
            if (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
                    and NON_FINITE_TEST.search(node.name)):
                called = _called(node)
                called |= {c for h in called & set(helpers) for c in _called(helpers[h])}
                if fn in called:
                    return True
    return False


def _notebook_code(path: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")


def present(mech: Mechanism, where: book.InTheBook, consumer: str) -> bool:
    """Whether ``consumer`` (a key of ``attnbook.mechanisms.CONSUMERS``) lists the mechanism."""
    name, fn = mech.name, mech.operator.__name__
    entry = landscape.REGISTRY.get(name)
    if consumer == "landscape":
        return entry is not None
    if consumer == "needle":            # one of chapter 2's algorithms, or the landscape's adversary for it
        return name in ALGORITHMS or (entry is not None and (entry.adversary[0] in ALGORITHMS
                                                             or entry.adversary[0] in OWN_ADVERSARIES))
    if consumer == "recall":
        return entry is not None and entry.recall_rule in recall.MECHANISMS
    if consumer == "roofline":
        return name in roofline.OPS
    if consumer == "kernel report":
        return name in REPORT_OPS
    if consumer == "gpu tests":
        gs = _gpu_session()
        selected = any(where.gpu_keyword in re.findall(r"\w+", family) for family in gs.TEST_FAMILIES)
        tested = any(where.gpu_keyword in n.name for n in _test_trees()["test_gpu.py"].body
                     if isinstance(n, ast.FunctionDef) and n.name.startswith("test_"))
        return selected and tested
    if consumer == "benchmark":
        return mech.benchmark in _gpu_session().BENCH and (ROOT / "benchmarks" / f"{mech.benchmark}.py").is_file()
    if consumer == "bad inputs":
        return _refused_in_a_test(fn)
    if consumer == "non-finite":
        return _non_finite_test(fn)
    if consumer == "exercises":
        source = Path(importlib.import_module(f"attnbook.exercises.{where.exercises}").__file__).read_text()
        return fn in source or f"attnlib.{mech.module} import" in source
    if consumer == "figures":
        return importlib.util.find_spec(f"attnbook.widgets.{where.figures}") is not None
    if consumer == "lab":
        labs = sorted((ROOT / "notebooks").glob(f"{where.chapter}_*_lab.ipynb"))
        return len(labs) == 1 and fn in _notebook_code(labs[0])
    raise KeyError(consumer)


def test_every_mechanism_has_a_book_record_and_the_landscape_adds_only_compositions():
    assert set(book.BOOK) == set(REGISTRY)
    assert set(landscape.REGISTRY) <= set(REGISTRY) | set(book.COMPOSED)
    assert set(book.COMPOSED) <= set(landscape.REGISTRY)


@pytest.mark.parametrize("consumer", list(book.CONSUMERS))
def test_every_mechanism_is_in_every_consumer_or_says_why_not(consumer):
    missing = [name for name, mech in REGISTRY.items()
               if not present(mech, book.BOOK[name], consumer) and consumer not in book.BOOK[name].absent]
    assert not missing, f"{consumer} ({book.CONSUMERS[consumer]}) lacks {missing}: add them, or say why in " \
                        "attnbook.mechanisms.BOOK[...].absent"


@pytest.mark.parametrize("consumer", list(book.CONSUMERS))
def test_no_reason_for_an_absence_outlives_the_absence(consumer):
    stale = [name for name, mech in REGISTRY.items()
             if consumer in book.BOOK[name].absent and present(mech, book.BOOK[name], consumer)]
    assert not stale, f"{consumer} now lists {stale}: remove the reason in attnbook.mechanisms.BOOK[...].absent"


def test_reasons_name_only_known_consumers():
    for name, where in book.BOOK.items():
        assert set(where.absent) <= set(book.CONSUMERS), (name, set(where.absent) - set(book.CONSUMERS))


def test_a_mechanism_no_consumer_knows_is_missing_from_each_of_them():
    """The check can fail: a new mechanism, its record added and nothing else, is absent everywhere that
    reads names or tests (the modules it borrows from the softmax record aside)."""
    new = Mechanism("nystrom", "Nystrom", REGISTRY["softmax"].operator, REGISTRY["softmax"].reference,
                    kernels="nystrom", benchmark="nystrom")
    where = book.InTheBook("02", "needle", "ch02", "nystrom")
    for consumer in ("landscape", "needle", "recall", "roofline", "kernel report", "gpu tests", "benchmark"):
        assert not present(new, where, consumer), consumer


def test_the_vocabulary_test_reads_the_operator_modules_from_the_registry():
    from tests.test_vocabulary import OPERATOR_MODULES

    assert set(OPERATOR_MODULES) == {m.module for m in REGISTRY.values()} | set(SUPPORT_MODULES)
