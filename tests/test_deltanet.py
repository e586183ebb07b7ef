"""DeltaNet / Gated DeltaNet: the three torch modes agree with each other, the Triton chunk kernel
(through the interpreter) agrees with the recurrence, and bad input gets clear errors.

Tolerances (relative RMS): float64 torch modes 1e-12; float32 kernel 1e-5; float16 inputs 1e-2.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib.deltanet import (
    delta_rule,
    delta_rule_decode_step,
    delta_rule_recurrent_reference,
    huber_delta_rule_recurrent,
    ut_transform,
)


def make(B=1, H=2, T=37, D=8, Dv=5, *, gated=False, dtype=torch.float64, beta_max=2.0, seed=0,
         normalize=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen, dtype=dtype)
    k = torch.randn(B, H, T, D, generator=gen, dtype=dtype)
    if normalize:
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, H, T, Dv, generator=gen, dtype=dtype)
    beta = torch.rand(B, H, T, generator=gen, dtype=dtype) * beta_max
    g = -0.3 * torch.rand(B, H, T, generator=gen, dtype=dtype) if gated else None
    return q, k, v, beta, g


# ------------------------------------------------------------------ the torch modes agree

@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("T", [1, 63, 100, 1000])
def test_chunk_and_parallel_match_recurrent_on_odd_lengths(T, gated, rel_err):
    q, k, v, beta, g = make(T=T, gated=gated, D=6, Dv=3, H=1)
    S0 = torch.randn(1, 1, 3, 6, dtype=torch.float64)
    o_r, S_r = delta_rule(q, k, v, beta, g=g, mode="recurrent", initial_state=S0, output_final_state=True)
    for cs in (16, 64):
        o_c, S_c = delta_rule(q, k, v, beta, g=g, mode="chunk", chunk_size=cs, initial_state=S0,
                              output_final_state=True)
        assert rel_err(o_c, o_r) < 1e-12 and rel_err(S_c, S_r) < 1e-12
    if T <= 100:
        o_p, S_p = delta_rule(q, k, v, beta, g=g, mode="parallel", initial_state=S0, output_final_state=True)
        assert rel_err(o_p, o_r) < 1e-12 and rel_err(S_p, S_r) < 1e-12


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 70), D=st.integers(1, 9), Dv=st.integers(1, 5), gated=st.booleans(),
       cs=st.sampled_from([16, 32, 128]), seed=st.integers(0, 10_000))
def test_chunk_matches_recurrent_for_all_shapes(T, D, Dv, gated, cs, seed):
    q, k, v, beta, g = make(T=T, D=D, Dv=Dv, gated=gated, seed=seed)
    o_r = delta_rule(q, k, v, beta, g=g, mode="recurrent")
    o_c = delta_rule(q, k, v, beta, g=g, mode="chunk", chunk_size=cs)
    torch.testing.assert_close(o_c, o_r, rtol=1e-10, atol=1e-10)


def test_recurrent_is_the_definition():
    """One token by hand: S_1 = beta v k^T (from zero), then S_2 = alpha S_1 (I - beta k k^T) + beta v k^T."""
    q, k, v, beta, g = make(T=2, H=1, D=4, Dv=3, gated=True)
    o, S = delta_rule(q, k, v, beta, g=g, scale=1.0, mode="recurrent", output_final_state=True)
    k1, k2, v1, v2 = k[0, 0, 0], k[0, 0, 1], v[0, 0, 0], v[0, 0, 1]
    b1, b2, a2 = beta[0, 0, 0], beta[0, 0, 1], g[0, 0, 1].exp()
    S1 = torch.exp(g[0, 0, 0]) * 0 + b1 * torch.outer(v1, k1)
    S2 = a2 * S1 @ (torch.eye(4, dtype=S1.dtype) - b2 * torch.outer(k2, k2)) + b2 * torch.outer(v2, k2)
    torch.testing.assert_close(S[0, 0], S2)
    torch.testing.assert_close(o[0, 0, 1], S2 @ q[0, 0, 1])


def test_initial_state_continues_exactly(rel_err):
    q, k, v, beta, g = make(T=90, gated=True)
    o_full, S_full = delta_rule(q, k, v, beta, g=g, output_final_state=True, chunk_size=16)
    o1, S1 = delta_rule(q[:, :, :41], k[:, :, :41], v[:, :, :41], beta[:, :, :41], g=g[:, :, :41],
                        output_final_state=True, chunk_size=16)
    o2, S2 = delta_rule(q[:, :, 41:], k[:, :, 41:], v[:, :, 41:], beta[:, :, 41:], g=g[:, :, 41:],
                        initial_state=S1, output_final_state=True, chunk_size=32)
    assert rel_err(torch.cat([o1, o2], dim=2), o_full) < 1e-12
    assert rel_err(S2, S_full) < 1e-12


def test_decode_steps_reproduce_the_sequence(rel_err):
    q, k, v, beta, g = make(T=12, gated=True)
    o_seq, S_seq = delta_rule(q, k, v, beta, g=g, output_final_state=True)
    S, outs = None, []
    for t in range(12):
        one = slice(t, t + 1)
        o_t, S = delta_rule_decode_step(q[:, :, one], k[:, :, one], v[:, :, one], beta[:, :, one], initial_state=S,
                                        g=g[:, :, one])
        outs.append(o_t)
    assert rel_err(torch.cat(outs, 2), o_seq) < 1e-12 and rel_err(S, S_seq) < 1e-12


def test_scale_defaults_to_inverse_sqrt_dim(rel_err):
    q, k, v, beta, _ = make(D=9)
    assert rel_err(delta_rule(q, k, v, beta), delta_rule(q / 3.0, k, v, beta, scale=1.0)) < 1e-14


def test_beta_zero_is_identity_and_beta_one_overwrites():
    """beta = 0 leaves the state alone; beta = 1 with a unit key makes S k = v exactly (the overwrite)."""
    q, k, v, beta, _ = make(T=5, H=1)
    o = delta_rule(q, k, v, torch.zeros_like(beta))
    assert o.abs().max() == 0
    _, S = delta_rule(q, k, v, torch.ones_like(beta), output_final_state=True)
    torch.testing.assert_close(S[0, 0] @ k[0, 0, -1], v[0, 0, -1])


def test_delta_rule_is_a_gradient_step_on_the_regression_loss():
    q, k, v, beta, _ = make(T=1, H=1, D=4, Dv=3)
    S0 = torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    loss = 0.5 * ((S0[0, 0] @ k[0, 0, 0] - v[0, 0, 0]) ** 2).sum()
    (grad,) = torch.autograd.grad(loss, S0)
    _, S1 = delta_rule(q, k, v, beta, initial_state=S0.detach(), output_final_state=True)
    torch.testing.assert_close(S1, S0.detach() - beta[..., None] * grad)


def test_ut_transform_solves_the_triangular_system():
    _, k, _, beta, g = make(T=16, gated=True)
    T, Gamma, _ = ut_transform(k, beta, g)
    A = torch.tril(beta.unsqueeze(-1) * (k @ k.transpose(-1, -2)) * Gamma, -1)
    eye = torch.eye(16, dtype=k.dtype)
    torch.testing.assert_close((eye + A) @ T, torch.diag_embed(beta))


def test_transition_eigenvalues_and_divergence_beyond_two():
    k = torch.nn.functional.normalize(torch.randn(6, dtype=torch.float64), dim=0)
    for b in (0.5, 1.5, 2.5):
        ev = torch.linalg.eigvalsh(torch.eye(6, dtype=torch.float64) - b * torch.outer(k, k))
        torch.testing.assert_close(ev.min(), torch.tensor(1 - b, dtype=torch.float64))
    q, k, v, beta, _ = make(T=400, H=1, D=4, Dv=2, seed=3)
    _, S_ok = delta_rule_recurrent_reference(q, k, v, torch.full_like(beta, 1.9), scale=1.0)
    _, S_bad = delta_rule_recurrent_reference(q, k, v, torch.full_like(beta, 2.5), scale=1.0)
    assert S_ok.norm() < 100 and S_bad.norm() > 1e6


def test_huber_delta_rule_matches_delta_rule_for_small_errors_and_clips_large_ones(rel_err):
    q, k, v, beta, _ = make(T=20, H=1)
    o_sq = delta_rule(q, k, v, beta, mode="recurrent")
    o_hub = huber_delta_rule_recurrent(q, k, v, beta, delta=1e6, scale=1 / math.sqrt(8))
    assert rel_err(o_hub, o_sq) < 1e-12
    v_out = v.clone()
    v_out[:, :, 5] = 1e4                                   # one corrupted write
    _, S_sq = delta_rule_recurrent_reference(q, k, v_out, beta, scale=1.0)
    _, S_hub = huber_delta_rule_recurrent(q, k, v_out, beta, delta=1.0, scale=1.0, output_final_state=True)
    assert S_hub.norm() < 1e-2 * S_sq.norm()


def test_fp16_inputs_keep_an_fp32_state_and_stay_finite_over_long_sequences():
    T = 32768
    q, k, v, beta, g = make(B=1, H=1, T=T, D=4, Dv=4, gated=True, dtype=torch.float16)
    o, S = delta_rule(q, k, v, beta, g=g, mode="chunk", chunk_size=128, output_final_state=True)
    assert o.dtype == torch.float16 and S.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    o2 = delta_rule(q, k, v, beta, mode="chunk", chunk_size=128)
    assert torch.isfinite(o2).all()


def test_exported_from_the_package():
    assert attnlib.delta_rule is delta_rule and attnlib.delta_rule_decode_step is delta_rule_decode_step


def test_gradients_flow_through_every_mode(rel_err):
    q, k, v, beta, g = make(T=21, gated=True)
    grads = []
    for mode in ("recurrent", "chunk", "parallel"):
        ts = [t.clone().requires_grad_() for t in (q, k, v, beta, g)]
        o = delta_rule(*ts[:4], g=ts[4], mode=mode, chunk_size=16)
        grads.append(torch.autograd.grad(o.square().sum(), ts))
    for a, b in zip(grads[0], grads[1]):
        assert rel_err(b, a) < 1e-10
    for a, b in zip(grads[0], grads[2]):
        assert rel_err(b, a) < 1e-10


# ------------------------------------------------------------------ the Triton kernel (interpreter)

@pytest.mark.parametrize("T,D,Dv,gated,cs", [(63, 8, 5, False, 16), (63, 8, 5, True, 16),
                                             (100, 20, 12, True, 32), (17, 3, 33, False, 16),
                                             (1000, 4, 3, True, 64)])
def test_triton_chunk_kernel_matches_recurrent(T, D, Dv, gated, cs, rel_err):
    q, k, v, beta, g = make(B=1, H=2, T=T, D=D, Dv=Dv, gated=gated)
    S0 = torch.randn(1, 2, Dv, D, dtype=torch.float64)
    o_r, S_r = delta_rule(q, k, v, beta, g=g, mode="recurrent", initial_state=S0, output_final_state=True)
    f = [t.float() if t is not None else None for t in (q, k, v, beta, g, S0)]
    o_t, S_t = delta_rule(*f[:4], g=f[4], initial_state=f[5], chunk_size=cs, output_final_state=True,
                          backend="triton")
    assert o_t.dtype == torch.float32 and S_t.dtype == torch.float32
    assert rel_err(o_t, o_r) < 1e-5 and rel_err(S_t, S_r) < 1e-5


def test_triton_kernel_takes_strided_inputs_and_splits_dv(rel_err):
    from attnlib.kernels.delta import delta_rule_chunk_forward
    q, k, v, beta, g = make(B=1, H=2, T=40, D=16, Dv=40, gated=True, dtype=torch.float32)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)            # [B, T, H, D] memory, same values
    o_r, S_r = delta_rule(q, k, v, beta, g=g, mode="recurrent", output_final_state=True, scale=0.5)
    o_t, S_t = delta_rule_chunk_forward(qt, k, v, beta, g, scale=0.5, chunk_size=16, output_final_state=True,
                                       block_v=16)
    assert rel_err(o_t, o_r) < 1e-5 and rel_err(S_t, S_r) < 1e-5


def test_triton_backward_matches_torch(rel_err):
    q, k, v, beta, g = make(B=1, H=1, T=20, D=8, Dv=4, gated=True, dtype=torch.float32)
    grads = []
    for backend in ("torch", "triton"):
        ts = [t.clone().requires_grad_() for t in (q, k, v, beta, g)]
        o = delta_rule(*ts[:4], g=ts[4], chunk_size=16, backend=backend)
        grads.append(torch.autograd.grad(o.square().sum(), ts))
    for a, b in zip(*grads):
        assert rel_err(b, a) < 1e-5


def test_triton_kernel_fp16_inputs(rel_err):
    q, k, v, beta, g = make(B=1, H=1, T=33, D=16, Dv=16, gated=True)
    o_r = delta_rule(q, k, v, beta, g=g, mode="recurrent")
    h = [t.half() for t in (q, k, v, beta, g)]
    o_t = delta_rule(*h[:4], g=h[4], chunk_size=16, backend="triton")
    assert o_t.dtype == torch.float16 and rel_err(o_t, o_r) < 1e-2


# ------------------------------------------------------------------ bad input

def test_bad_inputs_raise_clear_errors():
    q, k, v, beta, g = make(T=10, gated=True)
    with pytest.raises(ValueError, match=r"beta has entries in .*expected beta in \[0, 2\]"):
        delta_rule(q, k, v, beta + 2.5)
    with pytest.raises(ValueError, match=r"beta has entries"):
        delta_rule(q, k, v, beta - 1)
    with pytest.raises(ValueError, match="beta has non-finite"):
        delta_rule(q, k, v, beta * float("nan"))
    with pytest.raises(ValueError, match=r"g has a positive entry"):
        delta_rule(q, k, v, beta, g=-g + 0.1)
    with pytest.raises(ValueError, match=r"g has non-finite"):
        delta_rule(q, k, v, beta, g=g - float("inf"))
    with pytest.raises(ValueError, match=r"beta has shape \(1, 2, 9\); expected \(1, 2, 10\)"):
        delta_rule(q, k, v, beta[..., :9])
    with pytest.raises(ValueError, match=r"beta has shape .*expected 3 dims"):
        delta_rule(q, k, v, beta[..., None])
    with pytest.raises(ValueError, match=r"k has shape .* to match q"):
        delta_rule(q, k[..., :3], v, beta)
    with pytest.raises(ValueError, match="causal attention needs as many queries as keys"):
        delta_rule(q[:, :, :5], k, v, beta)
    with pytest.raises(TypeError, match="v has dtype float32"):
        delta_rule(q, k, v.float(), beta)
    with pytest.raises(TypeError, match="beta has dtype int64"):
        delta_rule(q, k, v, beta.long())
    with pytest.raises(ValueError, match=r"chunk_size must be a power of two in \[1, 4096\]; got 48"):
        delta_rule(q, k, v, beta, chunk_size=48)
    with pytest.raises(ValueError, match=r"chunk_size must be a power of two in \[1, 4096\]; got 8192"):
        delta_rule(q, k, v, beta, chunk_size=8192)
    with pytest.raises(ValueError, match=r"does not apply here: the kernel takes chunk_size in \(16, 32, 64\); got 1"):
        delta_rule(q.float(), k.float(), v.float(), beta.float(), chunk_size=128, backend="triton")
    with pytest.raises(ValueError, match="mode must be one of"):
        delta_rule(q, k, v, beta, mode="fast")
    with pytest.raises(ValueError, match=r"initial_state has shape \(1, 2, 8, 5\); expected \(1, 2, 5, 8\)"):
        delta_rule(q, k, v, beta, initial_state=torch.zeros(1, 2, 8, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        delta_rule(q, k, v, beta, scale=-1.0)
    with pytest.raises(ValueError, match="backend must be one of"):
        delta_rule(q, k, v, beta, backend="cuda")
    with pytest.raises(ValueError, match="backend='triton' does not apply here: the kernel implements mode='chunk'"):
        delta_rule(q.float(), k.float(), v.float(), beta.float(), mode="recurrent", backend="triton")
    with pytest.raises(TypeError, match="float64"):
        delta_rule(q, k, v, beta, backend="triton")


def test_length_one_and_empty_batch():
    q, k, v, beta, g = make(T=1, gated=True)
    assert delta_rule(q, k, v, beta, g=g).shape == (1, 2, 1, 5)
    q, k, v, beta, g = make(B=0, T=7, gated=True)
    for mode in ("recurrent", "chunk", "parallel"):
        assert delta_rule(q, k, v, beta, g=g, mode=mode).shape == (0, 2, 7, 5)


# ------------------------------------------------------------------ the chapter's figures

def test_stability_explorer_builds_and_responds():
    from attnbook.experiments import deltanet as xd
    from attnbook.widgets import deltanet as wdn
    box = wdn.stability_explorer(lambda b, n: xd.norm_history(b, n, T=40, D=8, seed=0))
    (b_slider, _n_slider), fig = box.children[0].children, box.children[1]
    before = list(fig.data[0].y)
    b_slider.value = 2.5
    assert list(fig.data[0].y) != before and "2.50" in fig.layout.title.text


def test_delta_rule_implied_weights_match_su_and_turn_negative_on_non_negative_input():
    from attnlib.deltanet import implied_weights
    g = torch.Generator().manual_seed(1)
    T = 10
    q = torch.nn.functional.normalize(torch.rand(T, 5, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.rand(T, 5, generator=g, dtype=torch.float64), dim=-1)
    W = implied_weights(q, k, 1.0).numpy()
    su = (q @ k.T).tril() @ torch.linalg.inv(torch.eye(T, dtype=torch.float64) + (k @ k.T).tril(-1))
    assert np.allclose(W, su.numpy(), atol=1e-12)
    assert (q @ k.T).min() >= 0 and W.min() < 0                          # not a plan
    with pytest.raises(ValueError, match="both be \\[T, D\\]"):
        implied_weights(q, k[:5], 1.0)


def test_gated_implied_weights_reach_deltanet_and_the_diagonal_at_the_gate_limits():
    from attnlib import deltanet
    g = torch.Generator().manual_seed(3)
    q, k = (torch.nn.functional.normalize(torch.randn(9, 4, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    assert torch.allclose(deltanet.implied_weights(q, k, 0.7, 0.0), deltanet.implied_weights(q, k, 0.7))
    tiny = deltanet.implied_weights(q, k, 0.7, np.log(1e-12))
    assert torch.allclose(tiny, torch.diag(0.7 * (q * k).sum(1)), atol=1e-9)
    # o = W v for any v: the weights are what the layer computes
    v = torch.randn(1, 1, 9, 3, generator=g, dtype=torch.float64)
    gate = torch.full((1, 1, 9), np.log(0.8), dtype=torch.float64)
    o, _ = deltanet.delta_rule_recurrent_reference(q[None, None], k[None, None], v,
                                                   torch.full((1, 1, 9), 0.7, dtype=torch.float64), gate, scale=1.0)
    assert torch.allclose(deltanet.implied_weights(q, k, 0.7, np.log(0.8)) @ v[0, 0], o[0, 0])
