"""The chunked linear-attention kernels (``attnlib/kernels/linear/``, through Triton's interpreter,
float32): forward and every gradient against float64 references, at odd shapes -- T not a multiple
of the chunk, D not a power of two, Dv != D, value tiles split across programs -- with initial and
final states; gradients for any subset of inputs; the float16 score tile that must not overflow.

Tolerance: relative RMS error 2e-5 for float32 against float64 (measured ~1e-7).
"""

import pytest
import torch

from attnlib import linear_attention
from attnlib.kernels.linear import linear_chunk_backward, linear_chunk_forward
from attnlib.linear import linear_attention_recurrent_reference

F64 = torch.float64
TOL = 2e-5


def inputs(B, H, T, D, Dv, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=g, dtype=F64) for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g, dtype=F64)
    S0 = torch.randn(B, H, Dv, D, generator=g, dtype=F64)
    do = torch.randn(B, H, T, Dv, generator=g, dtype=F64)
    dS = torch.randn(B, H, Dv, D, generator=g, dtype=F64)
    return q, k, v, S0, do, dS


def reference_grads(q, k, v, S0, do, dS, *, scale, causal):
    """Float64 outputs and gradients of the recurrence (the definition), by autograd."""
    ins = [t.clone().requires_grad_() for t in (q, k, v, S0)]
    o, S = linear_attention_recurrent_reference(ins[0] * scale, ins[1], ins[2], initial_state=ins[3], causal=causal)
    return o, S, torch.autograd.grad([o, S], ins, [do, dS])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,D,Dv,chunk,block_v", [(1, 12, 20, 16, None), (17, 24, 8, 32, None),
                                                  (45, 12, 20, 16, None), (70, 24, 40, 32, 16),
                                                  (130, 12, 20, 64, None),
                                                  (40, 136, 24, 16, None),    # D > 128: the two-pass forward
                                                  (37, 4, 4, 32, None)])      # width 4: chapter 7's hybrids
def test_forward_and_every_gradient_match_float64_recurrence(T, D, Dv, chunk, block_v, causal, rel_err):
    q, k, v, S0, do, dS = inputs(2, 1, T, D, Dv, seed=T)
    o_r, S_r, grads_r = reference_grads(q, k, v, S0, do, dS, scale=0.7, causal=causal)
    f = [t.float() for t in (q, k, v, S0)]
    o, S = linear_chunk_forward(*f[:3], f[3], scale=0.7, causal=causal, chunk_size=chunk, output_final_state=True,
                                block_v=block_v)
    grads = linear_chunk_backward(*f, do.float(), dS.float(), scale=0.7, causal=causal, chunk_size=chunk,
                                  block_v=block_v)
    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert rel_err(o, o_r) < TOL and rel_err(S, S_r) < TOL
    for name, got, want in zip(("dq", "dk", "dv", "dS0"), grads, grads_r):
        assert rel_err(got, want) < TOL, name


@pytest.mark.parametrize("segments", [2, 3, 9])
@pytest.mark.parametrize("with_state", [False, True])
def test_forward_cut_into_parallel_segments_matches_float64_recurrence(segments, with_state, rel_err):
    """The causal forward sums the state of each segment in parallel, scans the sums, then walks each
    segment from its entering state (``kernels/linear/segments.py``): any number of segments, up to one
    per chunk (9 here), gives the recurrence's output and final state; 3 segments of 3 chunks leave a
    ragged last chunk (T = 130 = 8 * 16 + 2)."""
    q, k, v, S0, do, dS = inputs(2, 1, 130, 24, 20, seed=segments)
    S0 = S0 if with_state else None
    o_r, S_r, _ = reference_grads(q, k, v, S0 if with_state else torch.zeros_like(dS), do, dS, scale=0.7,
                                  causal=True)
    o, S = linear_chunk_forward(q.float(), k.float(), v.float(), S0.float() if with_state else None, scale=0.7,
                                causal=True, chunk_size=16, output_final_state=True, segments=segments)
    assert rel_err(o, o_r) < TOL and rel_err(S, S_r) < TOL


@pytest.mark.parametrize("wrt", ["q", "k", "v", "initial_state"])
def test_gradient_of_any_single_input_through_the_public_function(wrt, rel_err):
    """Only one input requires a gradient: the backward runs, and the gradient matches the torch
    reference (normalised elu1 features, initial state, final state used in the loss)."""
    q, k, v, _, _, _ = inputs(1, 2, 23, 12, 6, seed=3)
    S0 = torch.rand(1, 2, 7, 12, dtype=F64)                                    # Dv + 1 rows: normalize
    got = {}
    for backend, dt in (("triton", torch.float32), ("torch", F64)):
        ts = {"q": q.to(dt), "k": k.to(dt), "v": v.to(dt), "initial_state": S0.float() if dt != F64 else S0}
        ts[wrt] = ts[wrt].clone().requires_grad_()
        o, S = linear_attention(ts["q"], ts["k"], ts["v"], feature_map="elu1", normalize=True, chunk_size=16,
                                initial_state=ts["initial_state"], output_final_state=True, backend=backend,
                                causal=True)
        (o.square().sum() + S.sum()).backward()
        got[backend] = ts[wrt].grad
    assert got["triton"].dtype == torch.float32 and rel_err(got["triton"], got["torch"]) < TOL


def test_empty_batch_runs_forward_and_backward():
    q, k, v = (torch.randn(0, 2, 17, 12, requires_grad=True) for _ in range(3))
    o, S = linear_attention(q, k, v, chunk_size=16, output_final_state=True, backend="triton", causal=True)
    assert o.shape == (0, 2, 17, 12) and S.shape == (0, 2, 12, 12)
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_fp16_scores_above_the_fp16_range_stay_finite(rel_err):
    """Issue 12: with scale q . k = 32 * 60^2 / sqrt(2) ~ 81459 > 65504 inside a chunk, a score tile cast to float16
    overflows. The kernel keeps the score tile (and the state) in float32."""
    T, D = 40, 32
    q = torch.full((1, 1, T, D), 60.0, dtype=torch.float16)
    k = torch.full((1, 1, T, D), 60.0, dtype=torch.float16)
    v = (torch.randn(1, 1, T, D, generator=torch.Generator().manual_seed(0)) * 1e-3).half()
    assert (q[0, 0, 0].double() @ k[0, 0, 0].double()) * 2 ** -0.5 > 65504     # scale 1/sqrt(2)
    o = linear_attention(q, k, v, chunk_size=16, scale=2 ** -0.5, backend="triton", causal=True)
    ref = linear_attention(q.double(), k.double(), v.double(), scale=2 ** -0.5, backend="torch", causal=True)
    assert o.dtype == torch.float16 and torch.isfinite(o).all()
    assert rel_err(o, ref) < 5e-3


def test_fp16_state_beyond_the_fp16_range_stays_finite(rel_err):
    """A float16 call whose state outgrows float16: S_t = sum_j v_j k_j^T reaches 8 * (8 + 4) / 2 * 1500 = 72000 >
    65504 in every entry. The kernels store the per-chunk states, and multiply by them, in bfloat16
    (float32's exponent range), so the output stays finite and within bfloat16's rounding of the
    float64 answer; a float16 state would have overflowed to inf."""
    T, D = 1500, 16
    q = torch.full((1, 1, T, D), 2.0 ** -10, dtype=torch.float16)
    k = torch.full((1, 1, T, D), 8.0, dtype=torch.float16)
    v = torch.full((1, 1, T, D), 8.0, dtype=torch.float16)
    v[..., ::2, :] = 4.0                                              # not a constant sequence
    state = torch.einsum("bhtv,bhtd->bhvd", v.double(), k.double())
    assert state.min() > 65504
    o, S = linear_attention(q, k, v, scale=1.0, output_final_state=True, backend="triton", causal=True)
    ref, S_ref = linear_attention(q.double(), k.double(), v.double(), scale=1.0, output_final_state=True,
                                  backend="torch", causal=True)
    assert o.dtype == torch.float16 and torch.isfinite(o).all() and torch.isfinite(S).all()
    assert rel_err(o, ref) < 1e-2 and rel_err(S, S_ref) < 1e-5


def test_a_loss_on_the_final_state_alone(rel_err):
    """The output is unused: its gradient reaches the backward as None (nothing zero-filled), and the
    keys' gradient through the final state still matches the reference."""
    q, k, v, _, _, _ = inputs(1, 2, 40, 16, 16, seed=7)
    grads = []
    for backend, dt in (("triton", torch.float32), ("torch", F64)):
        kk = k.to(dt).clone().requires_grad_()
        _, S = linear_attention(q.to(dt), kk, v.to(dt), output_final_state=True, backend=backend, causal=True)
        S.square().sum().backward()
        grads.append(kk.grad)
    assert rel_err(*grads) < TOL
