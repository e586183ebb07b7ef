"""The committed results are checked, not rebuilt: each is stamped with exactly what made it, a change to
any of that makes it stale with a message naming the command, and a change to anything else does not.

``make test``'s first step (``python -m benchmarks._artifacts``) runs the same comparison; here it is also
shown to fail where it must, on a copy of the repository with one file changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from attnbook import _provenance as provenance
from attnbook import lab_runs
from attnbook.experiments import hybrid as hx
from benchmarks import _artifacts as artifacts

ROOT = Path(__file__).resolve().parent.parent


def test_every_committed_result_is_of_this_code():
    stale = {a.path: artifacts.staleness(a) for a in artifacts.ARTIFACTS}
    stale.update({str(lab_runs.path(n)): lab_runs.staleness(n) for n in lab_runs.names()})
    assert lab_runs.names(), "no committed lab run found"
    assert not any(stale.values()), "\n".join(f"{k}: {v} -- run `make artifacts` and commit" for k, v in stale.items()
                                             if v)


def test_the_kernel_results_read_the_kernels_and_ops_but_not_the_book():
    for a in artifacts.ARTIFACTS:
        files = set(artifacts.stamp(a)["inputs"]["files"])
        assert a.script in files
        assert {"attnlib/kernels/flash/forward.py", "attnlib/attention.py", "attnlib/_backend.py"} <= files, a.name
        book = sorted(f for f in files if f.startswith(("attnbook/experiments/", "attnbook/widgets/",
                                                        "attnbook/exercises/", "notebooks/", "book/", "tests/")))
        assert not book, (a.name, book)
        assert "attnbook/_provenance.py" not in files and "benchmarks/_artifacts.py" not in files   # the stamping
    report = artifacts.stamp(artifacts.BY_NAME["kernel report"])["inputs"]
    assert {"benchmarks/kernel_report/compile.py", "benchmarks/_common.py"} <= set(report["files"])
    assert set(report["versions"]) == {"torch", "triton", "fla-core", "python"}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of the code the results read, with ``provenance.ROOT`` pointing at it."""
    for d in ("attnlib", "attnbook", "benchmarks", "scripts"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "results", "*.json"))
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    monkeypatch.setattr(artifacts, "ROOT", tmp_path)
    return tmp_path


def test_a_changed_kernel_makes_the_kernel_results_stale_and_names_the_command(tree):
    before = {a.name: artifacts.stamp(a) for a in artifacts.ARTIFACTS}
    kernel = tree / "attnlib" / "kernels" / "flash" / "forward.py"
    kernel.write_text(kernel.read_text() + "\n_A_CHANGE = 1\n")
    for a in artifacts.ARTIFACTS:
        why = artifacts.staleness(a, before[a.name])
        assert why == ["changed: attnlib/kernels/flash/forward.py"], (a.name, why)
        message = artifacts.stale_message(a, why)
        assert a.shell() in message and "make artifacts" in message


def test_a_rewrapped_commented_or_redocumented_kernel_leaves_the_kernel_results_current(tree):
    """The stamp reads what a file executes: a comment, a docstring or a line broken to fit a page
    change no result; one changed constant does."""
    before = {a.name: artifacts.stamp(a) for a in artifacts.ARTIFACTS}
    kernel = tree / "attnlib" / "kernels" / "flash" / "forward.py"
    source = kernel.read_text()
    laid_out = source.replace('"""', '"""Rewritten. ', 1).replace("(", "(\n    ", 3) + "\n# a comment\n"
    kernel.write_text(laid_out)
    assert all(artifacts.staleness(a, before[a.name]) == [] for a in artifacts.ARTIFACTS)
    kernel.write_text(laid_out + "_A_CONSTANT = 2\n")
    assert all(artifacts.staleness(a, before[a.name]) for a in artifacts.ARTIFACTS)


def test_a_changed_exercise_figure_or_experiment_leaves_the_kernel_results_current(tree):
    before = {a.name: artifacts.stamp(a) for a in artifacts.ARTIFACTS}
    for f in ("exercises/ch01.py", "widgets/_style.py", "experiments/landscape/costs.py", "lab.py"):
        (tree / "attnbook" / f).write_text((tree / "attnbook" / f).read_text() + "\n_A_CHANGE = 1\n")
    assert all(artifacts.staleness(a, before[a.name]) == [] for a in artifacts.ARTIFACTS)


def test_a_new_import_and_a_new_version_are_named(tree, monkeypatch):
    a = artifacts.BY_NAME["register counts"]
    before = artifacts.stamp(a)
    (tree / "attnlib" / "extra_helper.py").write_text("X = 1\n")
    wy = tree / "attnlib" / "kernels" / "delta" / "wy.py"
    wy.write_text(wy.read_text() + "\ndef _late():\n    from ...extra_helper import X  # noqa\n    return X\n")
    why = artifacts.staleness(a, before)
    assert "changed: attnlib/kernels/delta/wy.py" in why and "now read: attnlib/extra_helper.py" in why
    monkeypatch.setattr(provenance, "_version", lambda pkg: "9.9.9" if pkg == "triton" else "x")
    assert any(w.startswith("triton ") and w.endswith("-> 9.9.9") for w in artifacts.staleness(a, before))


def test_a_result_without_a_stamp_is_stale():
    assert artifacts.staleness(artifacts.ARTIFACTS[0], {"rows": []}) == [
        "it carries no record of its inputs (made before they were recorded)"]


# ---------------------------------------------------------------------------------------------- lab runs

TINY = dict(n_pairs=2, n_keys=4, n_values=4, n_layers=2, ratios=[1, 0], mixers=["gated_deltanet"], seeds=[0],
            model=dict(d_model=8, n_heads=2, batch=4, steps=2, lr=1e-2, chunk_size=8), probe_seed=5,
            place_seeds=[6])


def test_the_hybrid_short_run_gives_the_same_numbers_twice():
    """What lets a lab read a committed run instead of training: the experiment is a function of its
    code and parameters (seeded, no global state), so the same call gives the same numbers."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first, second = hx.short_run(**TINY), hx.short_run(**TINY)
    finally:
        torch.set_num_threads(threads)
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)
    assert set(first["accuracy"]["gated_deltanet"]) == {"1:1", "all-softmax"}


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(lab_runs, "DIR", tmp_path / "lab_runs")
    return tmp_path


def test_a_run_of_an_experiment_lab_runs_does_not_name_is_refused(runs_dir, monkeypatch):
    """A committed run must be one `rerun` can make again, from the experiments named by import statement."""
    monkeypatch.setenv("ATTNBOOK_RUNS", "write")
    with pytest.raises(ValueError, match="not among lab_runs.EXPERIMENTS"):
        _lab().run("t", _counter([]), x=3)


def _lab(quick=True):
    import torch

    from attnbook.lab import Lab

    return Lab(seed=0, device=torch.device("cpu"), quick=quick, on_colab=False)


def _counter(calls):
    def experiment(*, x: int) -> dict:
        calls.append(x)
        return {"x": x, "square": x * x, "pair": (x, x)}
    experiment.__module__ = __name__
    experiment.__qualname__ = "_counted"
    return experiment


def test_a_lab_run_is_written_then_read_and_a_change_of_parameters_is_refused(runs_dir, monkeypatch, capsys):
    calls: list = []
    experiment = _counter(calls)
    monkeypatch.setitem(lab_runs.EXPERIMENTS, "tests.test_artifacts._counted", experiment)
    monkeypatch.setenv("ATTNBOOK_RUNS", "write")
    written = _lab().run("t", experiment, x=3)
    assert calls == [3] and written == {"x": 3, "square": 9, "pair": [3, 3]}     # as JSON has it
    monkeypatch.setenv("ATTNBOOK_RUNS", "require")
    assert _lab().run("t", experiment, x=3) == written and calls == [3]          # read, not run
    assert "read from" in capsys.readouterr().out
    from attnbook.lab import LabCheckFailed

    with pytest.raises(LabCheckFailed, match=r"other parameters: x.*python -m benchmarks._artifacts --regenerate"):
        _lab().run("t", experiment, x=4)
    monkeypatch.setenv("ATTNBOOK_RUNS", "read")
    assert _lab().run("t", experiment, x=4)["square"] == 16 and calls == [3, 4]    # read mode runs it
    assert _lab(quick=False).run("t", experiment, x=3) == written and calls == [3, 4, 3]   # full scale: always


def test_the_runs_mode_is_one_of_four(monkeypatch):
    monkeypatch.setenv("ATTNBOOK_RUNS", "sometimes")
    with pytest.raises(ValueError, match="ATTNBOOK_RUNS must be one of read, require, write, live"):
        lab_runs.mode()
