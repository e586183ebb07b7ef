"""Test set-up. Triton's interpreter must be switched on before attnlib defines its kernels, so
it is set here, before any test module imports attnlib (CPU tests run the kernels through it)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
_INTERPRET_AT_START = os.environ["TRITON_INTERPRET"]

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

if "OMP_NUM_THREADS" not in os.environ:
    # The tests' tensors are small, and torch's intra-op threads wait on each other: with a core taken
    # by another process every op stalls on the descheduled thread (a KL gradcheck went from 0.09 s to
    # 5.2 s on a busy machine). One thread, as the labs' quick mode (attnbook.lab.setup) uses.
    torch.set_num_threads(1)

if os.environ["TRITON_INTERPRET"] == "1":
    from ._interpreter import install  # noqa: E402

    install()          # the interpreter's generic scan a step at a time: same numbers, minutes sooner

# `make test` sets HYPOTHESIS_PROFILE=ci: the same examples on every run, so a red CI reproduces.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from attnlib.metrics import rel_rms  # noqa: E402  (the tolerance measure used throughout)


def pytest_make_parametrize_id(config, val, argname):
    # A dtype parameter is named by its dtype ("bfloat16", not "dtype1"), so that `-k bfloat16` selects
    # the bf16 cases (scripts/gpu_session.py slices the GPU tests that way).
    if isinstance(val, torch.dtype):
        return str(val).removeprefix("torch.")
    return None


def pytest_collection_finish(session):
    # Every test module is imported now. One that imports the compile machinery (benchmarks.kernel_report
    # switches the interpreter off for its process) would leave the kernels defined for the interpreter
    # while Triton no longer runs it: every interpreted test after it in that worker would fail, far from
    # the cause. Name the cause instead.
    if os.environ.get("TRITON_INTERPRET") != _INTERPRET_AT_START:
        raise pytest.UsageError("a test module changed TRITON_INTERPRET while it was imported (importing "
                                "benchmarks.kernel_report does): read what it needs from a module without "
                                "that side effect, or run the compile machinery in a subprocess")


@pytest.fixture
def rel_err():
    return rel_rms
