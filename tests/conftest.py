"""Test set-up. Triton's interpreter must be switched on before attnlib defines its kernels, so
it is set here, before any test module imports attnlib (CPU tests run the kernels through it)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

if "OMP_NUM_THREADS" not in os.environ:
    # The tests' tensors are small, and torch's intra-op threads wait on each other: with a core taken
    # by another process every op stalls on the descheduled thread (a KL gradcheck went from 0.09 s to
    # 5.2 s on a busy machine). One thread, as the labs' quick mode (attnlib.experiments.lab.setup) uses.
    torch.set_num_threads(1)

# `make test` sets HYPOTHESIS_PROFILE=ci: the same examples on every run, so a red CI reproduces.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from attnlib.metrics import rel_rms  # noqa: E402  (the tolerance measure used throughout)


@pytest.fixture
def rel_err():
    return rel_rms
