"""Chapter 3: linear attention. The three references agree with each other and with the definition;
the Triton chunk kernel (through the interpreter) agrees with them; states continue sequences
exactly; bad input gets a clear error."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import linear_attention, linear_attention_decode_step
from attnlib.linear import (
    MODES,
    FavorPlus,
    elu1,
    linear_attention_chunk_reference,
    linear_attention_parallel_reference,
)

F64 = torch.float64


def qkv(B, H, T, D, Dv=None, dtype=F64, seed=0):
    g = torch.Generator().manual_seed(seed)
    Dv = D if Dv is None else Dv
    return (torch.randn(B, H, T, D, generator=g, dtype=dtype),
            torch.randn(B, H, T, D, generator=g, dtype=dtype),
            torch.randn(B, H, T, Dv, generator=g, dtype=dtype))


def definition(q, k, v, *, scale, causal):
    """o_t = sum_{j<=t} (scale q_t . k_j) v_j, written as the double loop over (t, j)."""
    B, H, T, _ = q.shape
    o = torch.zeros(B, H, T, v.shape[-1], dtype=F64)
    for t in range(T):
        for j in range(T if not causal else t + 1):
            o[:, :, t] += (scale * (q[:, :, t] * k[:, :, j]).sum(-1, keepdim=True)) * v[:, :, j]
    return o


# --- the references -----------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,D,Dv", [(1, 16, 16), (7, 5, 3), (37, 24, 20)])
def test_every_mode_matches_the_double_loop_definition(T, D, Dv, causal, rel_err):
    q, k, v = qkv(2, 2, T, D, Dv)
    ref = definition(q, k, v, scale=1 / math.sqrt(D), causal=causal)
    for mode in MODES:
        o = linear_attention(q, k, v, mode=mode, causal=causal, chunk_size=4)
        assert rel_err(o, ref) < 1e-12, mode


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T", [1, 37, 100])
@pytest.mark.parametrize("chunk_size", [1, 16, 64, 128])
def test_chunk_matches_recurrent_on_odd_lengths(T, chunk_size, causal, rel_err):
    q, k, v = qkv(2, 3, T, 24, 20, seed=T)
    o_r, S_r = linear_attention(q, k, v, mode="recurrent", causal=causal, output_final_state=True)
    o_c, S_c = linear_attention(q, k, v, mode="chunk", chunk_size=chunk_size, causal=causal,
                                output_final_state=True)
    assert rel_err(o_c, o_r) < 1e-12 and rel_err(S_c, S_r) < 1e-12


def test_final_state_is_the_sum_of_outer_products():
    q, k, v = qkv(1, 2, 9, 4, 3)
    _, S = linear_attention(q, k, v, output_final_state=True, causal=True)
    expected = sum(v[:, :, j, :, None] * k[:, :, j, None, :] for j in range(9))
    assert torch.allclose(S, expected, atol=1e-12)
    assert S.shape == (1, 2, 3, 4)                            # [B, H, Dv, D]


@settings(max_examples=25, deadline=None)
@given(T=st.integers(1, 40), D=st.integers(1, 12), Dv=st.integers(1, 12),
       log_chunk=st.integers(0, 5), seed=st.integers(0, 10_000))
def test_associativity_parallel_equals_chunk_for_all_shapes(T, D, Dv, log_chunk, seed):
    q, k, v = qkv(1, 2, T, D, Dv, seed=seed)
    for causal in (True, False):
        o_p, S_p = linear_attention_parallel_reference(q, k, v, causal=causal)
        o_c, S_c = linear_attention_chunk_reference(q, k, v, causal=causal, chunk_size=2 ** log_chunk)
        assert torch.allclose(o_p, o_c, atol=1e-10, rtol=1e-10)
        assert torch.allclose(S_p, S_c, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("normalize", [False, True])
def test_initial_state_continues_a_sequence_exactly(mode, normalize, rel_err):
    q, k, v = qkv(2, 2, 53, 8, 6)
    kw = dict(mode=mode, causal=True, chunk_size=16, normalize=normalize, feature_map="elu1",
              output_final_state=True)
    o_full, S_full = linear_attention(q, k, v, **kw)
    cut = 20
    o1, S1 = linear_attention(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut], **kw)
    o2, S2 = linear_attention(q[:, :, cut:], k[:, :, cut:], v[:, :, cut:], initial_state=S1, **kw)
    assert rel_err(torch.cat([o1, o2], dim=2), o_full) < 1e-12
    assert rel_err(S2, S_full) < 1e-12


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("feature_map", [None, "elu1"])
def test_decode_steps_reproduce_the_recurrent_mode(normalize, feature_map, rel_err):
    q, k, v = qkv(2, 3, 23, 8, 5)
    o_ref, S_ref = linear_attention(q, k, v, mode="recurrent", normalize=normalize,
                                    feature_map=feature_map, output_final_state=True, causal=True)
    state, outs = None, []
    for t in range(23):
        sl = slice(t, t + 1)
        o_t, state = linear_attention_decode_step(q[:, :, sl], k[:, :, sl], v[:, :, sl], initial_state=state,
                                                  normalize=normalize, feature_map=feature_map)
        outs.append(o_t)
    assert rel_err(torch.cat(outs, dim=2), o_ref) < 1e-12
    assert rel_err(state, S_ref) < 1e-12


def test_normalize_gives_rows_of_weights_that_sum_to_one(rel_err):
    q, k, v = qkv(1, 2, 30, 6, 4)
    pq, pk = elu1(q / math.sqrt(6)), elu1(k)
    w = (pq @ pk.transpose(-1, -2)).tril()
    expected = (w / w.sum(-1, keepdim=True)) @ v
    for mode in MODES:
        o = linear_attention(q, k, v, feature_map="elu1", normalize=True, mode=mode, chunk_size=8, causal=True)
        assert rel_err(o, expected) < 1e-6, mode              # the 1e-6 in the denominator


def test_constant_values_pass_through_a_normalized_positive_map():
    q, k, _ = qkv(1, 1, 40, 8)
    v = torch.full((1, 1, 40, 3), 2.5, dtype=F64)
    o = linear_attention(q, k, v, feature_map="relu", normalize=True, causal=True)
    # a convex combination of identical values is that value (rows where relu leaves some weight)
    assert torch.allclose(o[o.abs() > 0], torch.tensor(2.5, dtype=F64), atol=1e-5)


def test_scale_multiplies_q_before_the_feature_map(rel_err):
    q, k, v = qkv(1, 1, 12, 4)
    o = linear_attention(q, k, v, scale=0.3, feature_map="elu1", mode="parallel", causal=True)
    expected = (elu1(0.3 * q) @ elu1(k).transpose(-1, -2)).tril() @ v
    assert rel_err(o, expected) < 1e-12


# --- feature maps ---------------------------------------------------------------------------------

def test_favor_plus_is_unbiased_for_the_softmax_kernel():
    g = torch.Generator().manual_seed(1)
    x = 0.4 * torch.randn(5, 8, generator=g, dtype=F64)
    y = 0.4 * torch.randn(5, 8, generator=g, dtype=F64)
    exact = torch.exp(x @ y.T)
    est = torch.stack([FavorPlus(8, 64, seed=s)(x) @ FavorPlus(8, 64, seed=s)(y).T for s in range(200)])
    # the mean of 200 independent estimates is within a few standard errors of the kernel
    err = (est.mean(0) - exact).abs()
    sem = est.std(0) / math.sqrt(200)
    assert (err < 5 * sem + 1e-12).all()
    assert (est > 0).all()                                    # positive features: no sign flips


def test_favor_plus_normalized_approaches_softmax_attention_as_features_grow(rel_err):
    q, k, v = qkv(1, 2, 32, 8, seed=3)
    q, k = 0.5 * q, 0.5 * k
    exact = attnlib.softmax_attention(q, k, v, causal=True)
    errs = [rel_err(linear_attention(q, k, v, feature_map="favor+", normalize=True,
                                     feature_kwargs=dict(num_features=m, seed=0), causal=True), exact)
            for m in (8, 4096)]
    assert errs[1] < errs[0] and errs[1] < 0.1


def test_favor_plus_same_seed_same_features_different_seed_different():
    x = torch.randn(3, 6, dtype=F64)
    assert torch.equal(FavorPlus(6, 16, seed=4)(x), FavorPlus(6, 16, seed=4)(x))
    assert not torch.equal(FavorPlus(6, 16, seed=4)(x), FavorPlus(6, 16, seed=5)(x))


def test_favor_plus_state_has_num_features_columns():
    q, k, v = qkv(1, 2, 10, 8, 3)
    fm = FavorPlus(8, num_features=20, seed=0)
    _, S = linear_attention(q, k, v, feature_map=fm, output_final_state=True, causal=True)
    assert S.shape == (1, 2, 3, 20)


def test_callable_feature_map_is_applied_to_q_and_k(rel_err):
    q, k, v = qkv(1, 1, 10, 4)
    o = linear_attention(q, k, v, feature_map=torch.exp, scale=1.0, mode="parallel", causal=True)
    assert rel_err(o, (torch.exp(q) @ torch.exp(k).transpose(-1, -2)).tril() @ v) < 1e-12


# --- precision --------------------------------------------------------------------------------

def test_long_fp16_sequence_stays_finite_and_accurate(rel_err):
    q, k, v = qkv(1, 2, 4096, 16, dtype=torch.float16)
    v = v + 20                                                # values with a large common part
    # positive features: every outer product adds to the state, whose entries pass fp16's 65504
    o, S = linear_attention(q, k, v, feature_map="elu1", normalize=True, output_final_state=True, causal=True)
    assert S.dtype == torch.float32 and torch.isfinite(S).all()
    assert S.abs().max() > torch.finfo(torch.float16).max    # it would have overflowed in fp16
    ref = linear_attention(q.double(), k.double(), v.double(), feature_map="elu1", normalize=True, causal=True)
    assert o.dtype == torch.float16 and torch.isfinite(o).all()
    assert rel_err(o, ref) < 1e-3
    o_plain = linear_attention(q, k, v - 20, feature_map="elu1", causal=True)
    ref_plain = linear_attention(q.double(), k.double(), (v - 20).double(), feature_map="elu1", causal=True)
    assert torch.isfinite(o_plain).all() and rel_err(o_plain, ref_plain) < 2e-3


# --- the Triton kernel (interpreter on CPU) --------------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,D,Dv,chunk", [(1, 16, 16, 16), (37, 24, 20, 16), (100, 32, 32, 32),
                                          (50, 16, 40, 16)])
def test_triton_kernel_matches_reference_on_odd_shapes(T, D, Dv, chunk, causal, rel_err):
    q, k, v = qkv(2, 2, T, D, Dv, dtype=torch.float32, seed=T + D)
    o_t, S_t = linear_attention(q, k, v, causal=causal, chunk_size=chunk, backend="triton",
                                output_final_state=True)
    o_r, S_r = linear_attention(q.double(), k.double(), v.double(), causal=causal,
                                mode="recurrent", output_final_state=True)
    assert o_t.dtype == torch.float32 and S_t.dtype == torch.float32
    assert rel_err(o_t, o_r) < 1e-5 and rel_err(S_t, S_r) < 1e-5


def test_triton_kernel_continues_from_initial_state_with_normalize(rel_err):
    q, k, v = qkv(1, 2, 45, 16, 8, dtype=torch.float32, seed=7)
    kw = dict(causal=True, feature_map="elu1", normalize=True, chunk_size=16, output_final_state=True)
    o_full, S_full = linear_attention(q, k, v, backend="torch", **kw)
    o1, S1 = linear_attention(q[:, :, :19], k[:, :, :19], v[:, :, :19], backend="triton", **kw)
    o2, S2 = linear_attention(q[:, :, 19:], k[:, :, 19:], v[:, :, 19:], initial_state=S1,
                              backend="triton", **kw)
    assert S1.shape == (1, 2, 9, 16)                           # Dv + 1 rows: the normaliser rides along
    assert rel_err(torch.cat([o1, o2], dim=2), o_full) < 1e-5 and rel_err(S2, S_full) < 1e-5


@pytest.mark.parametrize("causal", [True, False])
def test_triton_kernel_with_initial_state_and_scale_matches_reference(causal, rel_err):
    q, k, v = qkv(2, 1, 29, 24, 12, dtype=torch.float32, seed=11)
    S0 = torch.randn(2, 1, 12, 24)
    kw = dict(causal=causal, initial_state=S0, scale=0.37, output_final_state=True)
    o_t, S_t = linear_attention(q, k, v, chunk_size=16, backend="triton", **kw)
    o_r, S_r = linear_attention(q, k, v, mode="parallel", backend="torch", **kw)
    assert rel_err(o_t, o_r) < 1e-5 and rel_err(S_t, S_r) < 1e-5


def test_triton_kernel_fp16_inputs_accumulate_in_fp32(rel_err):
    """float16 inputs: products accumulate in float32 and the final state is float32 (1e-3, float16's own
    rounding of the inputs' products); the output's products with the per-chunk states and the score
    tile take bfloat16 operands (``kernels/common/precision.py``), so it is within bfloat16's rounding:
    2^-8 relative per operand here, where the interpreter truncates to bfloat16 (a GPU rounds to nearest)."""
    q, k, v = qkv(1, 2, 40, 16, 16, dtype=torch.float16, seed=2)
    o, S = linear_attention(q, k, v, chunk_size=16, backend="triton", output_final_state=True, causal=True)
    ref, S_ref = linear_attention(q.double(), k.double(), v.double(), output_final_state=True, causal=True)
    assert o.dtype == torch.float16 and S.dtype == torch.float32
    assert rel_err(o, ref) < 1e-2 and rel_err(S, S_ref) < 1e-3


def test_triton_backward_matches_reference_gradients(rel_err):
    q, k, v = qkv(1, 1, 20, 16, 16, dtype=torch.float32, seed=5)
    grads = []
    for backend in ("torch", "triton"):
        ins = [t.clone().requires_grad_(True) for t in (q, k, v)]
        linear_attention(*ins, chunk_size=16, backend=backend, causal=True).square().sum().backward()
        grads.append([t.grad for t in ins])
    for a, b in zip(*grads):
        assert rel_err(b, a) < 1e-5


# --- bad input ------------------------------------------------------------------------------------------

def test_mismatched_shapes_are_rejected():
    q, k, v = qkv(1, 2, 10, 8)
    with pytest.raises(ValueError, match="k has shape"):
        linear_attention(q, k[..., :4], v, causal=True)
    with pytest.raises(ValueError, match="v has shape"):
        linear_attention(q, k, v[:, :, :5], causal=True)
    with pytest.raises(ValueError, match="as many queries as keys"):
        linear_attention(q[:, :, :3], k, v, causal=True)


def test_initial_state_of_wrong_shape_or_dtype_is_rejected():
    q, k, v = qkv(1, 2, 10, 8, 6)
    with pytest.raises(ValueError, match=r"initial_state has shape \(1, 2, 8, 8\); expected \(1, 2, 6, 8\)"):
        linear_attention(q, k, v, initial_state=torch.zeros(1, 2, 8, 8, dtype=F64), causal=True)
    with pytest.raises(ValueError, match="extra row"):
        linear_attention(q, k, v, normalize=True, initial_state=torch.zeros(1, 2, 6, 8, dtype=F64), causal=True)
    with pytest.raises(TypeError, match="initial_state has dtype float16"):
        linear_attention(q, k, v, initial_state=torch.zeros(1, 2, 6, 8, dtype=torch.float16), causal=True)
    with pytest.raises(TypeError, match="state has dtype float32; expected float64"):
        linear_attention_decode_step(q[:, :, :1], k[:, :, :1], v[:, :, :1],
                                     initial_state=torch.zeros(1, 2, 6, 8))


@pytest.mark.parametrize("chunk_size", [48, 0, 3])
def test_chunk_size_must_be_a_power_of_two(chunk_size):
    q, k, v = qkv(1, 1, 10, 4)
    with pytest.raises(ValueError, match="chunk_size must be a power of two"):
        linear_attention(q, k, v, chunk_size=chunk_size, causal=True)


def test_unknown_feature_map_mode_and_backend_are_rejected():
    q, k, v = qkv(1, 1, 10, 4)
    with pytest.raises(ValueError, match="feature_map must be None, one of"):
        linear_attention(q, k, v, feature_map="softmax", causal=True)
    with pytest.raises(ValueError, match="feature_kwargs only applies"):
        linear_attention(q, k, v, feature_map="elu1", feature_kwargs={"seed": 1}, causal=True)
    with pytest.raises(ValueError, match="takes num_features, seed"):
        linear_attention(q, k, v, feature_map="favor+", feature_kwargs={"sigma": 1}, causal=True)
    with pytest.raises(ValueError, match="mode must be one of"):
        linear_attention(q, k, v, mode="scan", causal=True)
    with pytest.raises(ValueError, match="backend must be one of"):
        linear_attention(q, k, v, backend="cuda", causal=True)
    with pytest.raises(ValueError, match="implements mode='chunk'"):
        linear_attention(q.float(), k.float(), v.float(), mode="recurrent", backend="triton", causal=True)
    with pytest.raises(ValueError, match=r"chunk_size in \(16, 32, 64\); got 8"):
        linear_attention(q.float(), k.float(), v.float(), chunk_size=8, backend="triton", causal=True)


def test_decode_step_refuses_more_than_one_token():
    q, k, v = qkv(1, 1, 3, 4)
    with pytest.raises(ValueError, match="one token"):
        linear_attention_decode_step(q, k, v)


# --- measurement helpers and figures ----------------------------------------------------------------

def test_state_buildup_figure_frames_hold_the_running_state():
    import numpy as np

    from attnbook.experiments import linear as xl
    from attnbook.widgets import linear as lw
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(7, 4, generator=g, dtype=F64) for _ in range(3))
    fig = lw.state_buildup_figure(xl.state_buildup(q, k, v))
    assert len(fig.frames) == 7 and len(fig.layout.sliders[0].steps) == 7
    S3 = sum(v[j, :, None] * k[j, None, :] for j in range(3))
    assert np.allclose(np.asarray(fig.frames[2].data[0].z), S3.numpy())
    # the bars (recurrence) sit on the crosses (quadratic form) in every frame
    for fr in fig.frames:
        assert np.allclose(np.asarray(fr.data[1].y), np.asarray(fr.data[2].y))
    with pytest.raises(ValueError, match="one head"):
        xl.state_buildup(q[None], k, v)
