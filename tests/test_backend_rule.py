"""The one backend rule: ``auto`` is the kernel where it applies, the reference otherwise.

The rule is a pure function of the device type, the dtype and the op's own reason (if any) that its
kernel does not apply, so every case is checked here without a GPU. tests/test_gpu.py checks on
CUDA that each op's ``auto`` really reaches its kernel.
"""

import pytest
import torch

import attnlib
from attnlib._backend import KERNEL_DTYPES, decide

ALL = dict(triton_available=True, interpret=False)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_auto_takes_the_kernel_on_cuda_when_it_applies(dtype):
    assert decide("auto", device_type="cuda", dtype=dtype, why_not=None, **ALL) == "triton"


@pytest.mark.parametrize("device_type, dtype, why_not, available", [
    ("cpu", torch.float32, None, True),                      # not a GPU tensor
    ("cuda", torch.float64, None, True),                     # no kernel in float64
    ("cuda", torch.float32, "the kernel implements mode='chunk'", True),   # the op's own condition
    ("cuda", torch.float32, None, False),                    # triton missing
    ("mps", torch.float16, None, True),
])
def test_auto_falls_back_to_the_reference_where_the_kernel_does_not_apply(device_type, dtype, why_not,
                                                                          available):
    assert decide("auto", device_type=device_type, dtype=dtype, why_not=why_not,
                  triton_available=available, interpret=False) == "torch"


def test_torch_is_always_the_reference():
    assert decide("torch", device_type="cuda", dtype=torch.float16, why_not=None, **ALL) == "torch"


def test_triton_where_the_kernel_does_not_apply_is_a_clear_error():
    with pytest.raises(ValueError, match="does not apply here: chunk_size 8"):
        decide("triton", device_type="cuda", dtype=torch.float32, why_not="chunk_size 8", **ALL)
    with pytest.raises(TypeError, match="float64"):
        decide("triton", device_type="cuda", dtype=torch.float64, why_not=None, **ALL)
    with pytest.raises(ValueError, match="needs the triton package"):
        decide("triton", device_type="cuda", dtype=torch.float32, why_not=None, triton_available=False,
               interpret=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        decide("triton", device_type="cpu", dtype=torch.float32, why_not=None, **ALL)
    assert decide("triton", device_type="cpu", dtype=torch.float32, why_not=None, triton_available=True,
                  interpret=True) == "triton"


@pytest.mark.parametrize("backend", ["cuda", "", None, 3])
def test_unknown_backend_names_the_choices(backend):
    with pytest.raises(ValueError, match="backend must be one of"):
        decide(backend, device_type="cpu", dtype=torch.float32, why_not=None, **ALL)


def test_every_op_answers_float64_with_auto(monkeypatch):
    """``auto`` with float64 inputs is the reference for every op, wherever the tensors are."""
    q = torch.randn(1, 2, 20, 8, dtype=torch.float64)
    beta = torch.rand(1, 2, 20, dtype=torch.float64)
    mask = torch.ones(2, 2, 2, dtype=torch.bool)
    assert attnlib.softmax_attention(q, q, q, causal=False).dtype == torch.float64
    assert attnlib.block_sparse_attention(q, q, q, mask, block_size=16, causal=False).dtype == torch.float64
    assert attnlib.linear_attention(q, q, q, mode="recurrent", causal=True).dtype == torch.float64
    assert attnlib.delta_rule(q, q, q, beta, mode="parallel").dtype == torch.float64


@pytest.mark.parametrize("capability, kernel", [((7, 5), False), ((7, 0), False), ((8, 0), True), ((8, 6), True),
                                                ((8, 9), True), ((9, 0), True), ((12, 0), True)])
def test_auto_takes_the_kernel_only_where_triton_reaches_tensor_cores(capability, kernel):
    """sm_75 (a T4) and older: Triton lowers tl.dot to FMA there, so ``auto`` takes PyTorch, whose cuBLAS
    and SDPA paths use the tensor cores; sm_80 and newer get the kernels."""
    got = decide("auto", device_type="cuda", dtype=torch.float16, why_not=None, capability=capability, **ALL)
    assert got == ("triton" if kernel else "torch")


def test_triton_on_a_gpu_without_tensor_core_lowering_says_why():
    with pytest.raises(ValueError, match=r"sm_75.*no tensor-core instruction"):
        decide("triton", device_type="cuda", dtype=torch.float16, why_not=None, capability=(7, 5), **ALL)
    # the op's own reason comes first: it is the one that holds on any GPU
    with pytest.raises(ValueError, match="chunk_size 8"):
        decide("triton", device_type="cuda", dtype=torch.float16, why_not="chunk_size 8", capability=(7, 5), **ALL)
