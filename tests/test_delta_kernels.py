"""The chunked DeltaNet / Gated DeltaNet kernels (``attnlib/kernels/delta/`` and the shared pieces in
``kernels/common/``, through Triton's interpreter, float32): each piece against torch, then the
forward and every gradient (q, k, v, beta, g, initial state, with a final-state gradient) against the
float64 recurrence at odd shapes -- T not a multiple of the chunk, D not a power of two, Dv != D,
value tiles split across programs, gates near 0 and at -30, beta in [0, 2] -- and gradients for any
subset of inputs.

Tolerance: relative RMS error 2e-5 for float32 against float64 (measured ~1e-7 to 5e-7).
The triangular inverse, which lives inside the WY kernels, is checked through a small harness kernel.
"""

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlib import delta_rule
from attnlib.deltanet import delta_rule_recurrent_reference
from attnlib.kernels.common.solve_tril import tril_inverse
from attnlib.kernels.delta import delta_rule_chunk_backward, delta_rule_chunk_forward

F64 = torch.float64
TOL = 2e-5


def inputs(B, H, T, D, Dv, *, gated, seed, gate="mild"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen, dtype=F64)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=gen, dtype=F64)
    beta = 2 * torch.rand(B, H, T, generator=gen, dtype=F64)                # the whole stable range [0, 2]
    g = None
    if gated:
        if gate == "mild":
            g = torch.log(0.5 + 0.5 * torch.rand(B, H, T, generator=gen, dtype=F64))
        elif gate == "near0":
            g = -1e-4 * torch.rand(B, H, T, generator=gen, dtype=F64)
        else:                                                               # "-30": forget everything, sometimes
            g = torch.where(torch.rand(B, H, T, generator=gen, dtype=F64) < 0.3, -30.0,
                            -0.1 * torch.rand(B, H, T, generator=gen, dtype=F64))
    S0 = torch.randn(B, H, Dv, D, generator=gen, dtype=F64)
    do = torch.randn(B, H, T, Dv, generator=gen, dtype=F64)
    dS = torch.randn(B, H, Dv, D, generator=gen, dtype=F64)
    return q, k, v, beta, g, S0, do, dS


def f32(x):
    return None if x is None else x.float()


# ------------------------------------------------------------------ the in-register triangular inverse

@triton.jit
def _invert_kernel(A, AI, C: tl.constexpr):
    """Test harness: one [C, C] strictly lower tile in, its (I + A)^{-1} out (as the WY kernels call it)."""
    r = tl.arange(0, C)
    a = tl.load(A + r[:, None] * C + r[None, :])
    tl.store(AI + r[:, None] * C + r[None, :], tril_inverse(a, C, tl.float32))


def invert(A):
    out = torch.empty_like(A)
    _invert_kernel[(1,)](A, out, C=A.shape[-1])
    return out


@pytest.mark.parametrize("chunk", [16, 32, 64])
def test_tril_inverse_matches_float64_inverse(chunk, rel_err):
    L = (0.5 * torch.randn(chunk, chunk, generator=torch.Generator().manual_seed(chunk), dtype=F64)).tril(-1)
    want = torch.linalg.inv(torch.eye(chunk, dtype=F64) + L)
    assert rel_err(invert(L.float()), want) < TOL


@settings(max_examples=6, deadline=None)
@given(log_chunk=st.integers(4, 6), size=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 16))
def test_tril_inverse_times_the_matrix_is_the_identity(log_chunk, size, seed):
    chunk = 2 ** log_chunk
    A = (size * torch.randn(chunk, chunk, generator=torch.Generator().manual_seed(seed))).tril(-1)
    X = invert(A).double()
    L = torch.eye(chunk, dtype=F64) + A.double()
    assert torch.equal(X.triu(1), torch.zeros_like(X))                      # lower triangular, unit diagonal
    # fp32 backward-stable residual: relative to the sizes of the factors (the inverse grows with A)
    assert ((L @ X - torch.eye(chunk, dtype=F64)).norm() / (L.norm() * X.norm())).item() < 1e-6


# ------------------------------------------------------------------ forward and backward

# (T, D, Dv, chunk, block): ``block`` forces 16-wide key and value tiles, so D and Dv are walked in pieces
CASES = [(1, 12, 20, 16, None), (17, 24, 8, 32, None), (45, 12, 20, 16, None), (70, 24, 40, 32, 16),
         (130, 12, 20, 64, None), (90, 40, 24, 64, 16),
         (37, 4, 4, 32, None)]   # width-4 heads, as chapter 7's hybrid MQAR models use


def check_against_recurrence(T, D, Dv, chunk, block, gated, gate, rel_err):
    q, k, v, beta, g, S0, do, dS = inputs(2, 1, T, D, Dv, gated=gated, seed=T + D, gate=gate)
    ins = [t.clone().requires_grad_() for t in (q, k, v, beta, S0)]
    gg = g.clone().requires_grad_() if gated else None
    o_r, S_r = delta_rule_recurrent_reference(*ins[:4], gg, scale=0.7, initial_state=ins[4])
    want = torch.autograd.grad([o_r, S_r], ins + ([gg] if gated else []), [do, dS])
    tiles = dict(block_k=block, block_v=block)
    o, S = delta_rule_chunk_forward(*map(f32, (q, k, v, beta, g)), scale=0.7, chunk_size=chunk,
                                    initial_state=f32(S0), output_final_state=True, **tiles)
    dq, dk, dv, dbeta, dg, dS0 = delta_rule_chunk_backward(*map(f32, (q, k, v, beta, g, S0)), f32(do), f32(dS),
                                                           scale=0.7, chunk_size=chunk, **tiles)
    assert rel_err(o, o_r) < TOL and rel_err(S, S_r) < TOL
    got = [dq, dk, dv, dbeta, dS0] + ([dg] if gated else [])
    for name, a, b in zip(("dq", "dk", "dv", "dbeta", "dS0", "dg"), got, want):
        assert torch.isfinite(a).all() and rel_err(a, b) < TOL, name


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("T,D,Dv,chunk,block", CASES)
def test_forward_and_every_gradient_match_float64_recurrence(T, D, Dv, chunk, block, gated, rel_err):
    check_against_recurrence(T, D, Dv, chunk, block, gated, "mild", rel_err)


@pytest.mark.parametrize("gate", ["near0", "-30"])
def test_gates_near_zero_and_near_minus_infinity(gate, rel_err):
    check_against_recurrence(45, 12, 20, 16, None, True, gate, rel_err)


@pytest.mark.parametrize("wrt", ["q", "k", "v", "beta", "g", "initial_state"])
def test_gradient_of_any_single_input_through_the_public_function(wrt, rel_err):
    """Issue 12's defect: the backward raised when only q required a gradient. Any one input alone."""
    q, k, v, beta, g, S0, _, _ = inputs(1, 2, 23, 12, 6, gated=True, seed=5)
    got = {}
    for backend, dt in (("triton", torch.float32), ("torch", F64)):
        ts = {"q": q, "k": k, "v": v, "beta": beta, "g": g, "initial_state": S0}
        ts = {n: t.to(dt) for n, t in ts.items()}
        ts[wrt].requires_grad_()
        o, S = delta_rule(ts["q"], ts["k"], ts["v"], ts["beta"], g=ts["g"], chunk_size=16,
                          initial_state=ts["initial_state"], output_final_state=True, backend=backend)
        (o.square().sum() + S.sum()).backward()
        got[backend] = ts[wrt].grad
    assert got["triton"].dtype == torch.float32 and rel_err(got["triton"], got["torch"]) < TOL


def test_only_q_requiring_grad_without_final_state(rel_err):
    q, k, v, beta, _, _, _, _ = inputs(1, 1, 20, 16, 16, gated=False, seed=1)
    grads = []
    for backend, dt in (("triton", torch.float32), ("torch", F64)):
        qq = q.to(dt).requires_grad_()
        delta_rule(qq, k.to(dt), v.to(dt), beta.to(dt), chunk_size=16, backend=backend).sum().backward()
        grads.append(qq.grad)
    assert rel_err(*grads) < TOL


def test_empty_batch_runs_forward_and_backward():
    q, k, v = (torch.randn(0, 2, 17, 12, requires_grad=True) for _ in range(3))
    beta = torch.rand(0, 2, 17, requires_grad=True)
    g = (-torch.rand(0, 2, 17)).requires_grad_()
    o, S = delta_rule(q, k, v, beta, g=g, chunk_size=16, output_final_state=True, backend="triton")
    assert o.shape == (0, 2, 17, 12) and S.shape == (0, 2, 12, 12)
    o.sum().backward()
    assert all(t.grad is not None and t.grad.shape == t.shape for t in (q, k, v, beta, g))


def test_a_loss_on_the_final_state_alone(rel_err):
    """The output is unused: its gradient reaches the backward as None (nothing zero-filled), and every
    gradient through the final state still matches the reference."""
    q, k, v, beta, g, _, _, _ = inputs(1, 2, 40, 16, 16, gated=True, seed=8)
    got = []
    for backend, dt in (("triton", torch.float32), ("torch", F64)):
        ins = [t.to(dt).clone().requires_grad_() for t in (k, v, beta, g)]
        _, S = delta_rule(q.to(dt), ins[0], ins[1], ins[2], g=ins[3], output_final_state=True, backend=backend)
        S.square().sum().backward()
        got.append([t.grad for t in ins])
    for a, b in zip(*got):
        assert rel_err(a, b) < TOL
