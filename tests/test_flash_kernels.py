"""The flash kernels (forward and FlashAttention-2 backward, deterministic and fused) through Triton's
interpreter, fp32, on small odd shapes, against the float64 reference -- every gradient included (dq,
dk, dv, and through lse) -- by the pointer path and by the tensor-descriptor (TMA) path, which the
interpreter also runs when a test forces it.

Tolerance: relative RMS error 1e-5 (the fp32 kernels use IEEE products; measured errors sit near 3e-7).
GPU runs in fp16/bf16/fp32 live in tests/test_gpu.py.
"""

import pytest
import torch
from triton.runtime.errors import InterpreterError

import attnlib
from attnlib import _backend
from attnlib.attention import softmax_attention_reference
from attnlib.kernels.common import launch

from .conftest import rel_rms

pytestmark = pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")

TOL = 1e-5


def _inputs(B, H, Tq, Tk, D, Dv, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Tq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, H, Tk, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, H, Tk, Dv, generator=g, dtype=torch.float64)
    w_o = torch.randn(B, H, Tq, Dv, generator=g, dtype=torch.float64)     # a loss that weighs every output
    w_lse = torch.randn(B, H, Tq, generator=g, dtype=torch.float64)
    return q, k, v, w_o, w_lse


def _run(q, k, v, w_o, w_lse, *, causal, backend, dtype, deterministic=True):
    """Outputs and gradients of ``<w_o, o> + <w_lse, lse>`` (``w_lse = None``: no loss on the lse)."""
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    if backend == "reference":
        o, lse = softmax_attention_reference(q, k, v, scale=q.shape[-1] ** -0.5, causal=causal)
    else:
        o, lse = attnlib.softmax_attention(q, k, v, causal=causal, return_lse=True, backend="triton",
                                           deterministic=deterministic)
    loss = (o * w_o.to(dtype)).sum()
    if w_lse is not None:
        loss = loss + (lse * w_lse.to(lse.dtype)).sum()
    loss.backward()
    return o, lse, q.grad, k.grad, v.grad


def _assert_matches_reference(q, k, v, w_o, w_lse, causal, deterministic=True):
    got = _run(q, k, v, w_o, w_lse, causal=causal, backend="triton", dtype=torch.float32, deterministic=deterministic)
    want = _run(q, k, v, w_o, w_lse, causal=causal, backend="reference", dtype=torch.float64)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape, name
        assert torch.isfinite(a).all(), name
        if b.numel():
            assert rel_rms(a, b) < TOL, f"{name}: rel RMS {rel_rms(a, b):.2e}"


@pytest.mark.parametrize("B,H,Tq,Tk,D,Dv,causal", [
    (1, 2, 1, 1, 8, 8, True),        # a single position
    (2, 1, 17, 17, 8, 5, True),      # T not a multiple of any tile, Dv != D, Dv < 16
    (1, 2, 33, 33, 24, 40, True),    # D, Dv not powers of two
    (1, 1, 70, 70, 24, 12, True),    # several diagonal and off-diagonal tiles
    (1, 2, 33, 70, 24, 40, False),   # cross attention, Tk > Tq
    (2, 1, 70, 17, 8, 24, False),    # Tk < Tq
    (1, 1, 17, 17, 24, 24, False),
    (1, 1, 32, 32, 16, 16, True),    # exact multiples of every tile: the unmasked paths alone
])
@pytest.mark.parametrize("deterministic", [True, False], ids=["two-kernel", "fused"])
def test_forward_and_every_gradient_match_the_float64_reference(B, H, Tq, Tk, D, Dv, causal, deterministic):
    _assert_matches_reference(*_inputs(B, H, Tq, Tk, D, Dv, seed=Tq * 7 + Tk + D), causal, deterministic)


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-kernel", "fused"])
def test_wide_heads_up_to_256_forward_and_backward(deterministic):
    _assert_matches_reference(*_inputs(1, 1, 19, 19, 200, 130, seed=3), causal=True, deterministic=deterministic)


@pytest.fixture
def descriptor_launches(monkeypatch):
    """Force the tensor-descriptor path (TMA on sm_90) under the interpreter, which runs descriptor loads
    too; returns the list of ``use_tma`` choices the wrappers made."""
    used = []
    make = launch.head_descriptors

    def spy(use_tma, *tensors):
        used.append(use_tma)
        return make(use_tma, *tensors)

    monkeypatch.setattr(launch, "tma_device", lambda device: True)
    monkeypatch.setattr(launch, "head_descriptors", spy)
    return used


@pytest.mark.parametrize("B,H,Tq,Tk,D,Dv,causal,deterministic", [
    (2, 1, 37, 37, 24, 40, True, True),      # ragged T, D and Dv not powers of two (zero fill past them)
    (1, 2, 33, 70, 12, 20, False, False),    # cross attention, Tk > Tq, the fused backward
    (1, 1, 70, 17, 8, 24, False, True),      # Tk < Tq
])
def test_descriptor_loads_match_the_float64_reference(descriptor_launches, B, H, Tq, Tk, D, Dv, causal,
                                                       deterministic):
    """Strides of 16-byte multiples (float32: D, Dv multiples of 4): q, k, v and dO through descriptors."""
    _assert_matches_reference(*_inputs(B, H, Tq, Tk, D, Dv, seed=Tq + D), causal, deterministic)
    assert descriptor_launches == [True, True]          # the forward and the backward


def test_strides_tma_cannot_take_fall_back_to_pointers(descriptor_launches):
    """Dv = 5 in float32 (20-byte rows), a view one element off an aligned address, a stride-0 broadcast:
    each falls back to the pointer path, and the result is still right."""
    x = torch.randn(1, 1, 9, 8)
    assert launch.tma_compatible(x) and not launch.tma_compatible(torch.randn(1, 1, 9, 5))
    assert not launch.tma_compatible(torch.randn(1, 1, 9, 9)[..., 1:])
    assert not launch.tma_compatible(torch.randn(1, 1, 1, 8).expand(1, 2, 9, 8))
    assert not launch.tma_compatible(x.transpose(-1, -2))
    _assert_matches_reference(*_inputs(1, 2, 21, 21, 8, 5, seed=1), causal=True)
    assert descriptor_launches == [False, False]


@pytest.mark.parametrize("name,tiles,causal", [("INTERPRET_FWD", dict(BLOCK_M=16, BLOCK_N=32), True),
                                               ("INTERPRET_DKDV", dict(BLOCK_M=32, BLOCK_N=16), True),
                                               ("INTERPRET_DQ", dict(BLOCK_M=16, BLOCK_N=32), True)])
def test_causal_kernels_refuse_tiles_whose_diagonal_stage_would_start_mid_tile(monkeypatch, name, tiles, causal):
    """``tl.static_assert``: BLOCK_N divides BLOCK_M in the forward and dQ kernels, BLOCK_M divides
    BLOCK_N in dK/dV. (The interpreter raises it at the launch; the GPU compiler at compile time.)"""
    from attnlib.kernels.flash import backward as bwd
    from attnlib.kernels.flash import forward as fwd

    monkeypatch.setattr(fwd if name == "INTERPRET_FWD" else bwd, name, tiles)
    q = torch.randn(1, 1, 40, 16, requires_grad=True)
    with pytest.raises(InterpreterError, match="must divide"):
        o = attnlib.softmax_attention(q, q, q, causal=causal, backend="triton")
        o.sum().backward()


@pytest.mark.parametrize("causal", [False, True])
def test_gradient_through_the_lse_alone_is_exact(causal):
    """A loss on lse only: dS = P * dlse, which the kernels fold into delta (delta - dlse)."""
    q, k, v, _, w_lse = _inputs(1, 2, 37, 37, 8, 12, seed=11)
    zero = torch.zeros(1, 2, 37, 12, dtype=torch.float64)
    _assert_matches_reference(q, k, v, zero, w_lse, causal)


def test_value_dim_zero_gives_the_right_lse_and_its_gradients():
    q, k, v, w_o, w_lse = _inputs(1, 2, 21, 21, 8, 0, seed=5)
    _assert_matches_reference(q, k, v, w_o, w_lse, causal=True)
    o, lse = attnlib.softmax_attention(q.float(), k.float(), v.float(), causal=True, return_lse=True,
                                       backend="triton")
    assert o.shape == (1, 2, 21, 0) and bool((lse.abs() > 0).all())


def test_empty_batch_forward_and_backward():
    q, k, v = (torch.randn(0, 2, 9, 8, requires_grad=True) for _ in range(3))
    o, lse = attnlib.softmax_attention(q, k, v, causal=True, return_lse=True, backend="triton")
    (o.sum() + lse.sum()).backward()
    assert o.shape == (0, 2, 9, 8) and q.grad.shape == q.shape and v.grad.shape == v.shape


def test_strided_inputs_and_broadcast_output_gradient():
    """[B, T, H, D] storage viewed as [B, H, T, D], and o.sum() (whose gradient has stride 0)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 23, 3, 16, generator=g).transpose(1, 2).requires_grad_() for _ in range(3))
    grads = []
    for backend in ("triton", "torch"):
        o = attnlib.softmax_attention(q, k, v, causal=True, backend=backend)
        grads.append(torch.autograd.grad(o.sum() + o.square().sum(), (q, k, v)))
    for a, b in zip(*grads):
        assert rel_rms(a, b) < TOL


def test_fp16_backward_through_the_interpreter():
    q, k, v, w_o, w_lse = _inputs(1, 1, 33, 33, 16, 16, seed=9)
    got = _run(q, k, v, w_o, w_lse, causal=True, backend="triton", dtype=torch.float16)
    want = _run(q, k, v, w_o, w_lse, causal=True, backend="reference", dtype=torch.float64)
    for a, b in zip(got, want):
        assert rel_rms(a, b) < 5e-3


@pytest.mark.parametrize("family,limit", [("sm80", 163 * 1024), ("sm89", 99 * 1024), ("sm90", 227 * 1024)])
def test_autotune_pruning_keeps_candidates_that_fit_the_device(monkeypatch, family, limit):
    """The GPU autotuning spaces (not exercised here) keep the divisibility the causal stages rely on;
    on each target the pruner keeps at least one candidate for every head dim up to 256 and dtype, every
    kept one fits the device's shared memory (by the kernel's estimate) and, in half precision, none is
    listed as spilling at that width (tests/test_kernel_registers.py compiles the kept ones)."""
    from attnlib.kernels.flash import backward as bwd
    from attnlib.kernels.flash import forward as fwd

    assert all(c.kwargs["BLOCK_M"] % c.kwargs["BLOCK_N"] == 0 for c in fwd._FWD_CONFIGS + bwd._DQ_CONFIGS)
    assert all(c.kwargs["BLOCK_N"] % c.kwargs["BLOCK_M"] == 0 for c in bwd._DKDV_CONFIGS + bwd._FUSED_CONFIGS)
    monkeypatch.setattr(launch, "shared_memory_limit", lambda device: limit)
    monkeypatch.setattr(launch, "target_family", lambda device: family)
    for dtype in (torch.float16, torch.float32):
        x = torch.empty(0, dtype=dtype)
        for d in (16, 64, 128, 256):
            args = {"O": x, "DK": x, "DQ": x, "LSE": x, "BLOCK_D": d, "BLOCK_DV": d}
            for configs, spills, prune, smem in [
                (fwd._FWD_CONFIGS, fwd._FWD_SPILLS, fwd._prune_fwd, fwd.fwd_smem),
                (bwd._DKDV_CONFIGS, bwd._DKDV_SPILLS, bwd._prune_dkdv, bwd.bwd_smem("kv", "DK")),
                (bwd._FUSED_CONFIGS, bwd._FUSED_SPILLS, bwd._prune_fused, bwd.bwd_smem("kv", "DK", fused=True)),
                (bwd._DQ_CONFIGS, bwd._DQ_SPILLS, bwd._prune_dq, bwd.bwd_smem("q", "DQ")),
            ]:
                kept = prune(configs, args)
                assert kept and all(smem(c, args) <= limit for c in kept), (family, dtype, d)
                if dtype == torch.float16:
                    table = spills[family]
                    assert all(d < table.get(launch.config_key(c), 1 << 30) for c in kept), (family, d)


def test_no_queries_give_zero_key_and_value_gradients():
    q = torch.randn(1, 2, 0, 8, requires_grad=True)
    k, v = (torch.randn(1, 2, 5, 8, requires_grad=True) for _ in range(2))
    o, lse = attnlib.softmax_attention(q, k, v, return_lse=True, backend="triton", causal=False)
    (o.sum() + lse.sum()).backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(v.grad, torch.zeros_like(v))


def test_logits_of_order_1e3_give_finite_and_correct_gradients():
    """Scores up to ~2e3 (beyond exp's range in any dtype): the backward recomputes P from the saved
    lse, never exp(s) itself. fp32 rounding of scores that large sets the tolerance (measured 3e-5)."""
    q, k, v, w_o, w_lse = _inputs(1, 1, 40, 40, 16, 16, seed=0)
    got = _run(q * 25, k * 25, v, w_o, w_lse, causal=True, backend="triton", dtype=torch.float32)
    want = _run(q * 25, k * 25, v, w_o, w_lse, causal=True, backend="reference", dtype=torch.float64)
    assert want[1].abs().max() > 1e3
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and rel_rms(a, b) < 2e-4
