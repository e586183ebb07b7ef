"""softmax_attention: the Triton kernel (through the interpreter on CPU) against the reference,
the reference against the definition, and the error messages.

Tolerances (relative RMS error against the float64 reference):
  fp32 kernel (interpreter or ieee dots on GPU) 1e-5;  fp16 kernel 2e-3;  bf16 kernel (GPU only) 1e-2.
"""

import math

import pytest
import torch

import attnlib
from attnlib import _backend
from attnlib.attention import softmax_attention_reference

from .conftest import rel_rms

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _qkv(B, H, T, D, dtype=torch.float32, Tk=None, Dv=None, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    Tk = T if Tk is None else Tk
    Dv = D if Dv is None else Dv
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.randn(B, H, Tk, D, generator=g)
    v = torch.randn(B, H, Tk, Dv, generator=g)
    return (t.to(device=device, dtype=dtype) for t in (q, k, v))


def test_reference_matches_the_definition_in_float64():
    q, k, v = _qkv(2, 3, 7, 5, torch.float64)
    s = q @ k.transpose(-1, -2) / math.sqrt(5)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    for causal in (False, True):
        ss = s.masked_fill(~mask, -math.inf) if causal else s
        P = torch.exp(ss) / torch.exp(ss).sum(-1, keepdim=True)
        o, lse = softmax_attention_reference(q, k, v, scale=1 / math.sqrt(5), causal=causal)
        assert rel_rms(o, P @ v) < 1e-14
        assert rel_rms(lse, torch.log(torch.exp(ss).sum(-1))) < 1e-14


def test_default_scale_is_inverse_sqrt_dim():
    q, k, v = _qkv(1, 1, 5, 16, torch.float64)
    a = attnlib.softmax_attention(q, k, v, backend="torch", causal=False)
    b = attnlib.softmax_attention(q, k, v, scale=0.25, backend="torch", causal=False)
    assert rel_rms(a, b) < 1e-15


@pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")
@pytest.mark.parametrize("T,D,causal", [
    (1, 16, False), (1, 16, True), (37, 16, False), (37, 32, True), (100, 64, True),
    (50, 24, False), (33, 40, True), (64, 128, False),
])
def test_kernel_matches_reference_on_odd_shapes(T, D, causal):
    q, k, v = _qkv(2, 2, T, D, seed=T + D)
    o, lse = attnlib.softmax_attention(q, k, v, causal=causal, return_lse=True, backend="triton")
    o_ref, lse_ref = softmax_attention_reference(q.double(), k.double(), v.double(),
                                                 scale=1 / math.sqrt(D), causal=causal)
    assert rel_rms(o, o_ref) < TOL[torch.float32]
    assert rel_rms(lse, lse_ref) < TOL[torch.float32]


@pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")
def test_kernel_cross_attention_and_separate_value_dim():
    q, k, v = _qkv(1, 2, 20, 32, Tk=45, Dv=16)
    o, lse = attnlib.softmax_attention(q, k, v, return_lse=True, backend="triton", causal=False)
    o_ref, lse_ref = softmax_attention_reference(q, k, v, scale=32 ** -0.5, causal=False)
    assert o.shape == (1, 2, 20, 16)
    assert rel_rms(o, o_ref) < TOL[torch.float32] and rel_rms(lse, lse_ref) < TOL[torch.float32]


@pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")
def test_kernel_handles_non_contiguous_inputs():
    q, k, v = _qkv(1, 20, 3, 16)   # [B, T, H, D] storage viewed as [B, H, T, D]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = attnlib.softmax_attention(q, k, v, causal=True, backend="triton")
    assert rel_rms(o, attnlib.softmax_attention(q, k, v, causal=True, backend="torch")) < TOL[torch.float32]


@pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")
def test_kernel_fp16_with_logits_of_1e4_is_finite_and_correct():
    q, k, v = _qkv(1, 1, 40, 16, torch.float16)
    q = q * 25.0   # scores q.k / 4 reach ~1e4 in magnitude; exp would overflow without the max shift
    k = k * 25.0
    o, lse = attnlib.softmax_attention(q, k, v, causal=True, return_lse=True, backend="triton")
    o_ref, lse_ref = softmax_attention_reference(q, k, v, scale=0.25, causal=True)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert lse_ref.abs().max() > 1e3
    assert rel_rms(o, o_ref) < TOL[torch.float16]
    assert rel_rms(lse, lse_ref) < 1e-5


@pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")
def test_kernel_backward_from_saved_lse_matches_autograd():
    q, k, v = _qkv(1, 2, 21, 16)
    for t in (q, k, v):
        t.requires_grad_(True)
    grads = []
    for backend in ("triton", "torch"):
        o, lse = attnlib.softmax_attention(q, k, v, causal=True, return_lse=True, backend=backend)
        (o.pow(2).sum() + lse.sum()).backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for a, b in zip(*grads):
        assert rel_rms(a, b) < 1e-5


# The GPU runs of the kernel (every dtype) live in tests/test_gpu.py.


def test_auto_uses_the_reference_on_cpu():
    assert _backend.choose_backend("auto", torch.zeros(1)) == "torch"


def test_length_one_and_empty_batch():
    q, k, v = _qkv(1, 1, 1, 8)
    assert torch.allclose(attnlib.softmax_attention(q, k, v, causal=True), v)
    q, k, v = _qkv(0, 2, 5, 8)
    o, lse = attnlib.softmax_attention(q, k, v, return_lse=True, causal=False)
    assert o.shape == (0, 2, 5, 8) and lse.shape == (0, 2, 5)


def test_reference_fp16_with_huge_logits_is_finite():
    q, k, v = _qkv(1, 1, 8, 4, torch.float16)
    o = attnlib.softmax_attention(q * 100, k * 100, v, scale=1.0, backend="torch", causal=False)
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("bad, err, match", [
    (dict(k=torch.randn(2, 4, 50, 16)), ValueError, r"k has shape \(2, 4, 50, 16\); expected \(2, 4, \*, 32\)"),
    (dict(v=torch.randn(2, 4, 9, 32)), ValueError, r"v has shape .* expected \(2, 4, 10, \*\)"),
    (dict(q=torch.randn(2, 4, 32)), ValueError, r"q has shape \(2, 4, 32\) \(3 dims\); expected 4 dims"),
    (dict(q=torch.randint(0, 3, (2, 4, 10, 32))), TypeError, r"q has dtype int64"),
    (dict(k=torch.randn(2, 4, 10, 32, dtype=torch.float64)), TypeError, r"k has dtype float64; expected float32"),
    (dict(q=[1.0]), TypeError, r"q must be a torch.Tensor"),
    (dict(scale=0.0), ValueError, r"scale must be a finite number > 0; got 0.0"),
    (dict(scale=float("nan")), ValueError, r"scale must be a finite number > 0"),
    (dict(backend="cuda"), ValueError, r"backend must be one of"),
    (dict(deterministic=1), TypeError, r"deterministic must be a bool \(True or False\); got int 1"),
    (dict(causal="yes"), TypeError, r"causal must be a bool \(True or False\); got str 'yes'"),
    (dict(causal=True, k=torch.randn(2, 4, 12, 32), v=torch.randn(2, 4, 12, 32)), ValueError,
     r"causal attention needs as many queries as keys"),
    (dict(k=torch.randn(2, 4, 0, 32), v=torch.randn(2, 4, 0, 32)), ValueError, r"empty set of keys"),
])
def test_bad_inputs_raise_clear_errors(bad, err, match):
    args = dict(causal=False, q=torch.randn(2, 4, 10, 32), k=torch.randn(2, 4, 10, 32), v=torch.randn(2, 4, 10, 32))
    kw = {k: bad.pop(k) for k in list(bad) if k not in args}
    args.update(bad)
    with pytest.raises(err, match=match):
        attnlib.softmax_attention(args["q"], args["k"], args["v"], causal=args["causal"], **kw)


def test_triton_on_cpu_without_interpreter_says_how_to_enable_it(monkeypatch):
    monkeypatch.setattr(_backend, "INTERPRET", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        _backend.choose_backend("triton", torch.zeros(1))


def test_triton_kernel_refuses_float64():
    if not _backend.INTERPRET:
        pytest.skip("needs TRITON_INTERPRET=1 at import")
    q, k, v = _qkv(1, 1, 4, 16, torch.float64)
    with pytest.raises(TypeError, match="float64"):
        attnlib.softmax_attention(q, k, v, backend="triton", causal=False)
