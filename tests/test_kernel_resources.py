"""The heaviest chunked kernels, compiled for an H100 (sm_90) without a GPU, fit its shared memory at
the launch configuration the wrappers choose. The interpreter cannot see this: a kernel that needs more
than 227 KB of shared memory compiles, runs through the interpreter, and then fails to launch on the
GPU. ``scripts/kernel_resources.py`` captures the wrappers' launches and compiles them, in a subprocess
with the interpreter off (tests/conftest.py turns it on for this process)."""

from .test_kernel_registers import KERNELS, chunked_rows

H100_SHARED_BYTES = 232448                    # 227 KB per block, the sm_90 opt-in maximum
HEAVIEST = KERNELS                            # the forward state pass and the three chunked backward kernels


def test_backward_kernels_fit_h100_shared_memory():
    rows = [r for r in chunked_rows() if r["D"] >= 128]
    assert {r["kernel"] for r in rows} == set(HEAVIEST)
    for r in rows:
        assert 0 < r["shared_bytes"] <= H100_SHARED_BYTES, r
