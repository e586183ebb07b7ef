"""What a user building on attnlib hits at the edges: extreme and bad inputs, and sibling APIs that
must agree (issue 12). Each test names the property it checks; where a case is documented rather
than refused, the test asserts the documented behaviour.
"""

import inspect
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlib
from attnbook.experiments import needle
from attnlib import _numerics, _validate, deltanet, eot, linear
from attnlib import anna as anna_module
from attnlib import attention as attention_module
from attnlib import sparse as sparse_module
from attnlib.metrics import rel_rms

F64 = torch.float64
HALF = [torch.float16, torch.bfloat16]


def _rand(*shape, seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# ----------------------------------------------------------------------------- chapter 1: EOT in half precision

def _huge_costs(dtype, seed=0):
    """Costs around 1e4 with an O(1) spread, rounded to ``dtype``: the plan is the softmax of *these*."""
    return (1e4 + 10 * torch.rand(6, 40, generator=torch.Generator().manual_seed(seed))).to(dtype)


@pytest.mark.parametrize("method", ["newton", "mirror"])
@pytest.mark.parametrize("dtype", HALF)
def test_one_sided_solvers_in_half_precision_with_costs_of_1e4_return_the_softmax_plan(dtype, method):
    C = _huge_costs(dtype)
    for eps in (1.0, 5.0):
        P = eot.solve_one_sided(C, eps, method=method)
        assert P.dtype == dtype
        exact = torch.softmax(-C.double() / eps, -1)
        assert (P.double() - exact).abs().max() < 4 * torch.finfo(dtype).eps
        assert (P.double().sum(-1) - 1).abs().max() < 4 * torch.finfo(dtype).eps


@pytest.mark.parametrize("dtype", HALF)
def test_sinkhorn_in_half_precision_with_costs_of_1e4_meets_both_marginals(dtype):
    C = _huge_costs(dtype, seed=1)
    P = eot.sinkhorn(C, 2.0)
    ref = eot.sinkhorn(C.double(), 2.0, tol=1e-12)
    assert P.dtype == dtype
    tol = 4 * torch.finfo(dtype).eps
    assert (P.double().sum(-1) - 1).abs().max() < tol
    assert (P.double().sum(-2) - 6 / 40).abs().max() < tol
    assert (P.double() - ref).abs().max() < tol


def test_sinkhorn_potentials_are_those_of_the_unshifted_cost():
    """Rows are shifted by their minimum inside the solver; the returned f undoes the shift."""
    C = _rand(5, 7) + 1e3 * torch.arange(5, dtype=F64)[:, None]          # rows far apart
    P, f, g, _ = eot.sinkhorn(C, 0.7, tol=1e-12, return_potentials=True)
    assert torch.allclose(P, torch.exp((f[:, None] + g[None, :] - C) / 0.7), atol=1e-12)


def test_a_plan_that_misses_its_own_marginal_raises_instead_of_coming_back(monkeypatch):
    """Off the CPU the cost's values are not read up front (no host sync); a non-finite cost then
    makes a plan that misses its marginal, and the solvers refuse to return it."""
    monkeypatch.setattr(_validate, "checks_values", lambda x: False)     # as for a GPU tensor
    C = torch.zeros(3, 4)
    C[1, 2] = float("nan")
    for solve in (lambda: eot.solve_one_sided(C, 1.0), lambda: eot.solve_one_sided(C, 1.0, method="mirror"),
                  lambda: eot.sinkhorn(C, 1.0)):
        with pytest.raises(FloatingPointError, match="marginal misses"):
            solve()


def test_a_truncated_run_returns_its_iterate_and_its_residual():
    """``max_iter`` is a stopping rule, not a failure: the iterate comes back with its history."""
    C = _rand(4, 9)
    P, hist = eot.solve_one_sided(C, 0.5, max_iter=2, return_history=True)
    assert len(hist) == 2 and (P.sum(-1) - 1).abs().max() <= hist[-1]


@pytest.mark.parametrize("method", ["newton", "mirror"])
def test_float32_solvers_stop_at_the_rounding_floor_instead_of_running_max_iter(method):
    """tol=1e-12 is below float32's reach: the iteration stops when the residual stops falling."""
    C = _rand(6, 30, dtype=torch.float32)
    P, hist = eot.solve_one_sided(C, 0.5, method=method, return_history=True)
    assert len(hist) < 200
    assert (P.double() - torch.softmax(-C.double() / 0.5, -1)).abs().max() < 1e-5
    _, _, _, n_it = eot.sinkhorn(C, 0.5, return_potentials=True)
    assert n_it < 1000


@pytest.mark.parametrize("call, err, match", [
    (lambda: eot.solve_one_sided(torch.zeros(2, 2), 1.0, max_iter=True), TypeError, "max_iter must be an int"),
    (lambda: eot.solve_one_sided(torch.zeros(2, 2), 1.0, max_iter=0), ValueError, "max_iter must be >= 1"),
    (lambda: eot.solve_one_sided(torch.zeros(2, 2), 1.0, return_history=1), TypeError, "return_history"),
    (lambda: eot.sinkhorn(torch.zeros(2, 2), 1.0, max_iter=True), TypeError, "max_iter must be an int"),
    (lambda: eot.sinkhorn(torch.zeros(2, 2), 1.0, tol=0.0), ValueError, "tol must be"),
    (lambda: eot.entropy(torch.tensor([[0.5, -0.5]])), ValueError, "P has negative entries"),
    (lambda: eot.objective(torch.tensor([[1.5, -0.5]]), torch.zeros(1, 2), 1.0), ValueError, "negative"),
    (lambda: eot.advantage_gradient([0.5, 0.5], torch.zeros(2, 3), torch.zeros(3), 1.0), TypeError,
     "p must be a torch.Tensor"),
    (lambda: eot.advantage_gradient(torch.ones(2) / 2, torch.zeros(3, 3), torch.zeros(3), 1.0), ValueError,
     r"v has shape \(3, 3\); expected \[..., Nk=2, Dv\]"),
    (lambda: eot.advantage_gradient(torch.ones(2) / 2, torch.zeros(2, 3), torch.zeros(4), 1.0), ValueError,
     r"grad_o has shape \(4,\); expected \[..., Dv=3\]"),
    (lambda: eot.advantage_gradient(torch.ones(2) / 2, torch.zeros(2, 3, dtype=F64), torch.zeros(3), 1.0),
     TypeError, "v has dtype float64; expected float32 to match p"),
    (lambda: eot.advantage_gradient(torch.ones(2) / 2, torch.zeros(2, 3), torch.zeros(3), 0.0), ValueError,
     "eps must be"),
])
def test_eot_bad_inputs_get_clear_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


# ----------------------------------------------------------------------------- chapter 2: the needle's helpers

@pytest.mark.parametrize("call, err, match", [
    (lambda: needle.plant(16, 4, 3, 5, 8.0, u=torch.zeros(4)), ValueError, "u is the zero vector"),
    (lambda: needle.plant(16, 4, 3, 5, 8.0, w=torch.tensor([1.0, float("nan"), 0, 0])), ValueError,
     "w has non-finite entries"),
    (lambda: needle.plant(16, 4, 3, 5, 8.0, u=torch.ones(5)), ValueError, r"u has shape \(5,\); expected \(4,\)"),
    (lambda: needle.plant(16, 4, 3, 5, 8.0, u=[1.0, 0, 0, 0]), TypeError, "u must be a torch.Tensor"),
    (lambda: needle.plant(16, 4, 3, 5, 8.0, dtype=torch.int64), TypeError, "dtype must be a floating-point"),
    (lambda: needle.plant(16, 4, 3, 5, float("nan")), ValueError, "M must be a finite number > 0"),
    (lambda: needle.plant(16, 4, -1, 5, 8.0), ValueError, "i must be >= 0"),
    (lambda: needle.plant(16, 4, 3, 5, 8.0, haystack_k=torch.zeros(15, 4)), ValueError,
     r"haystack_k has shape \(15, 4\); expected \(16, 4\)"),
    (lambda: needle.needle_mass(10, float("nan")), ValueError, "M must be a finite number"),
    (lambda: needle.needle_mass(10, "5"), TypeError, "M must be a number"),
    (lambda: needle.needle_mass(0, 1.0), ValueError, "T must be >= 1"),
    (lambda: needle.uniform_miss_error(1, 0, 3.0), ValueError, "T must be >= 2"),
    (lambda: needle.uniform_miss_error(10, 10, 3.0), ValueError, r"n_seen must be <= T - 1 = 9"),
    (lambda: needle.uniform_miss_error(10, 2.5, 3.0), TypeError, "n_seen must be an int"),
    (lambda: needle.bounded_case(16, 0, 1.0), ValueError, "d must be >= 1"),
    (lambda: needle.bounded_case(0, 4, 1.0), ValueError, "T must be >= 1"),
    (lambda: needle.bounded_case(16, 4, 1.0, dtype=torch.int32), TypeError, "dtype must be a floating-point"),
])
def test_needle_helpers_bad_inputs_get_clear_errors(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_needle_mass_is_a_stable_logistic_for_every_finite_score():
    assert needle.needle_mass(1, -50.0) == 1.0                        # the only key
    assert needle.needle_mass(11, 0.0) == pytest.approx(1 / 11)
    tiny = needle.needle_mass(1001, -1000.0)                          # e^-1000 / 1000: no overflow
    assert 0.0 <= tiny < 1e-300
    assert needle.needle_mass(1001, 1000.0) == 1.0
    assert needle.needle_mass(5, 2.0) == pytest.approx(1 / (1 + 4 * torch.tensor(-2.0).exp().item()))


# ----------------------------------------------------------------------------- value checks: no host sync

def _meta_inputs(T=20, D=8):
    m = dict(device="meta")
    return torch.empty(1, 2, T, D, **m), torch.empty(1, 2, T, **m), torch.ones(2, 2, 2, dtype=torch.bool, **m)


def _every_op(q, beta, mask):
    one = slice(0, 1)
    attnlib.softmax_attention(q, q, q, causal=True, backend="torch")
    for causal in (False, True):
        attnlib.anna_attention(q, q, q, n_tables=2, n_bits=3, causal=causal, backend="torch")
    attnlib.block_sparse_attention(q, q, q, mask, block_size=16, causal=True, backend="torch")
    for mode in linear.MODES:
        attnlib.linear_attention(q, q, q, mode=mode, backend="torch", causal=True)
    for mode in deltanet.MODES:
        attnlib.delta_rule(q, q, q, beta, g=beta, mode=mode, backend="torch")
    attnlib.linear_attention_decode_step(q[:, :, one], q[:, :, one], q[:, :, one])
    attnlib.delta_rule_decode_step(q[:, :, one], q[:, :, one], q[:, :, one], beta[:, :, one], g=beta[:, :, one])


def test_no_op_reads_tensor_values_back_to_the_host_off_the_cpu(monkeypatch):
    """Meta tensors have no values: any .item()/bool()/float() on them raises. Every op runs."""
    monkeypatch.delenv("ATTNLIB_CHECK_VALUES", raising=False)
    _every_op(*_meta_inputs())


def test_value_checks_off_the_cpu_run_on_request(monkeypatch):
    monkeypatch.setenv("ATTNLIB_CHECK_VALUES", "1")
    q, beta, _ = _meta_inputs()
    with pytest.raises(RuntimeError, match="meta"):                   # it tried to read beta's values
        attnlib.delta_rule(q, q, q, beta, backend="torch")
    with pytest.raises(RuntimeError, match="meta"):                   # it tried to read q's values
        attnlib.anna_attention(q, q, q, n_tables=2, n_bits=3, backend="torch", causal=False)


def test_value_checks_on_the_cpu_still_refuse_bad_gates():
    q = _rand(1, 1, 5, 4)
    with pytest.raises(ValueError, match="beta has entries in"):
        attnlib.delta_rule(q, q, q, torch.full((1, 1, 5), 3.0, dtype=F64))
    with pytest.raises(ValueError, match="g has a positive entry"):
        attnlib.delta_rule_decode_step(q[:, :, :1], q[:, :, :1], q[:, :, :1], torch.ones(1, 1, 1, dtype=F64),
                                       g=torch.ones(1, 1, 1, dtype=F64))


# ----------------------------------------------------------------------------- states: never aliased

@pytest.mark.parametrize("mode", linear.MODES)
def test_final_state_of_an_empty_linear_sequence_is_a_copy_not_the_initial_state(mode):
    e, S0 = torch.empty(1, 2, 0, 4, dtype=F64), _rand(1, 2, 4, 4)
    _, S = attnlib.linear_attention(e, e, e, mode=mode, initial_state=S0, output_final_state=True, causal=True)
    assert torch.equal(S, S0) and S.data_ptr() != S0.data_ptr()


@pytest.mark.parametrize("mode", deltanet.MODES)
def test_final_state_of_an_empty_delta_sequence_is_a_copy_not_the_initial_state(mode):
    e, S0 = torch.empty(1, 2, 0, 4, dtype=F64), _rand(1, 2, 4, 4)
    _, S = attnlib.delta_rule(e, e, e, torch.empty(1, 2, 0, dtype=F64), mode=mode, initial_state=S0,
                              output_final_state=True)
    assert torch.equal(S, S0) and S.data_ptr() != S0.data_ptr()


# ----------------------------------------------------------------------------- decode steps: one shape, clear errors

def test_both_decode_steps_take_and_return_one_token_shaped_like_their_full_ops(rel_err):
    B, H, T, D, Dv = 2, 3, 5, 6, 4
    q, k, v = _rand(B, H, T, D, seed=1), _rand(B, H, T, D, seed=2), _rand(B, H, T, Dv, seed=3)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.full((B, H, T), 0.5, dtype=F64)
    o_lin, o_del, S_lin, S_del = [], [], None, None
    for t in range(T):
        one = slice(t, t + 1)
        o, S_lin = attnlib.linear_attention_decode_step(q[:, :, one], k[:, :, one], v[:, :, one], initial_state=S_lin)
        assert o.shape == (B, H, 1, Dv)
        o_lin.append(o)
        o, S_del = attnlib.delta_rule_decode_step(q[:, :, one], k[:, :, one], v[:, :, one], beta[:, :, one],
                                                  initial_state=S_del)
        assert o.shape == (B, H, 1, Dv)
        o_del.append(o)
    assert rel_err(torch.cat(o_lin, 2), attnlib.linear_attention(q, k, v, mode="recurrent", causal=True)) < 1e-12
    assert rel_err(torch.cat(o_del, 2), attnlib.delta_rule(q, k, v, beta, mode="recurrent")) < 1e-12


def test_delta_decode_step_errors_name_state_and_one_token():
    q, beta = _rand(1, 2, 1, 4), torch.full((1, 2, 1), 0.5, dtype=F64)
    with pytest.raises(ValueError, match=r"state has shape \(1, 2, 3, 4\); expected \(1, 2, 4, 4\)"):
        attnlib.delta_rule_decode_step(q, q, q, beta, initial_state=torch.zeros(1, 2, 3, 4, dtype=F64))
    with pytest.raises(TypeError, match="state has dtype float32; expected float64"):
        attnlib.delta_rule_decode_step(q, q, q, beta, initial_state=torch.zeros(1, 2, 4, 4))
    with pytest.raises(TypeError, match="state must be a torch.Tensor"):
        attnlib.delta_rule_decode_step(q, q, q, beta, initial_state=[[0.0]])
    q3, beta3 = _rand(1, 2, 3, 4), torch.full((1, 2, 3), 0.5, dtype=F64)
    with pytest.raises(ValueError, match="the decode step takes one token"):
        attnlib.delta_rule_decode_step(q3, q3, q3, beta3)
    with pytest.raises(ValueError, match=r"q has shape \(1, 2, 4\) \(3 dims\); expected 4 dims"):
        attnlib.delta_rule_decode_step(q[:, :, 0], q[:, :, 0], q[:, :, 0], beta[:, :, 0])


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [None, [[0.0]], 1.5])
def test_linear_decode_step_non_tensor_inputs_raise_type_error_naming_the_argument(which, bad):
    args = {n: _rand(1, 2, 1, 4) for n in ("q", "k", "v")}
    args[which] = bad
    with pytest.raises(TypeError, match=f"{which} must be a torch.Tensor"):
        attnlib.linear_attention_decode_step(args["q"], args["k"], args["v"])


# ----------------------------------------------------------------------------- siblings agree

def test_linear_and_delta_list_their_modes_in_the_same_order():
    assert linear.MODES == deltanet.MODES


@pytest.mark.parametrize("chunk_size", [1, 4096])
def test_both_chunk_references_accept_the_same_chunk_sizes(chunk_size, rel_err):
    q = _rand(1, 1, 9, 4)
    k = torch.nn.functional.normalize(q, dim=-1)
    beta = torch.full((1, 1, 9), 0.5, dtype=F64)
    assert rel_err(attnlib.linear_attention(q, k, q, chunk_size=chunk_size, causal=True),
                   attnlib.linear_attention(q, k, q, mode="recurrent", causal=True)) < 1e-12
    assert rel_err(attnlib.delta_rule(q, k, q, beta, chunk_size=chunk_size),
                   attnlib.delta_rule(q, k, q, beta, mode="recurrent")) < 1e-12


@pytest.mark.parametrize("chunk_size", [8192, 48])
def test_both_ops_refuse_the_same_chunk_sizes_with_the_same_message(chunk_size):
    q = _rand(1, 1, 9, 4)
    msg = rf"chunk_size must be a power of two in \[1, 4096\]; got {chunk_size}"
    with pytest.raises(ValueError, match=msg):
        attnlib.linear_attention(q, q, q, chunk_size=chunk_size, causal=True)
    with pytest.raises(ValueError, match=msg):
        attnlib.delta_rule(q, q, q, torch.zeros(1, 1, 9, dtype=F64), chunk_size=chunk_size)


def test_every_reference_is_named_for_its_op_and_mode():
    assert attention_module.softmax_attention_reference
    assert sparse_module.block_sparse_attention_reference
    for mode in linear.MODES:
        assert callable(getattr(linear, f"linear_attention_{mode}_reference"))
        assert callable(getattr(deltanet, f"delta_rule_{mode}_reference"))
    for old in ("linear_attention_parallel", "linear_attention_recurrent", "linear_attention_chunk"):
        assert not hasattr(linear, old)
    assert not hasattr(deltanet, "delta_rule_recurrent")


def test_the_package_exports_operators_and_leaves_references_in_their_modules():
    assert not any(name.endswith("_reference") for name in attnlib.__all__)
    assert all(hasattr(attnlib, name) for name in attnlib.__all__)


def test_ops_share_argument_names():
    """fla's habit: one name for one thing across ops (q, k, v, scale, initial_state, ...)."""
    def params(f):
        return list(inspect.signature(f).parameters)
    lin, dlt = params(attnlib.linear_attention), params(attnlib.delta_rule)
    for name in ("q", "k", "v", "scale", "mode", "chunk_size", "initial_state", "output_final_state", "backend"):
        assert name in lin and name in dlt
    # a decode step starts from the same initial_state, and returns the next one (tests/test_vocabulary.py
    # checks every public signature)
    assert "initial_state" in params(attnlib.linear_attention_decode_step)
    assert "initial_state" in params(attnlib.delta_rule_decode_step)


# ----------------------------------------------------------------------------- masked positions contribute nothing

@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 7), n=st.integers(1, 7), kk=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_masked_matmul_ignores_whatever_lies_outside_the_mask(m, n, kk, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(m, n, generator=g, dtype=F64), torch.randn(n, kk, generator=g, dtype=F64)
    keep = torch.rand(m, n, generator=g) < 0.6
    junk = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=F64)
    a_bad = torch.where(keep, a, junk[torch.randint(3, (m, n), generator=g)])
    hidden = ~keep.any(0)                                             # columns no row sees
    b_bad = torch.where(hidden[:, None], junk[torch.randint(3, (n, kk), generator=g)], b)
    want = (torch.where(keep[..., None], a[..., None] * b[None], 0.0)).sum(1)
    got = _numerics.masked_matmul(a_bad, keep, b_bad)
    assert torch.allclose(got, want, atol=1e-12)


def test_masked_matmul_gives_nan_where_a_row_sees_a_non_finite_value():
    a, keep = torch.ones(2, 2, dtype=F64), torch.tensor([[True, False], [True, True]])
    b = torch.tensor([[1.0], [float("inf")]], dtype=F64)
    out = _numerics.masked_matmul(a, keep, b)
    assert out[0, 0] == 1.0 and torch.isnan(out[1, 0])


def _with_junk_at(T, pos, fill, *tensors):
    out = []
    for t in tensors:
        t = t.clone()
        t[:, :, pos] = fill
        out.append(t)
    return out


def _causal_ops():
    B, H, T, D = 1, 2, 40, 5
    q, k, v = _rand(B, H, T, D, seed=4), _rand(B, H, T, D, seed=5), _rand(B, H, T, 3, seed=6)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta, g = torch.full((B, H, T), 0.7, dtype=F64), torch.full((B, H, T), -0.1, dtype=F64)
    mask = torch.ones(H, 3, 3, dtype=torch.bool)
    ops = {"softmax": lambda q, k, v, b, g: attnlib.softmax_attention(q, k, v, causal=True),
           "block_sparse": lambda q, k, v, b, g: attnlib.block_sparse_attention(q, k, v, mask, block_size=16,
                                                                                causal=True)}
    for mode in linear.MODES:
        ops[f"linear_{mode}"] = (lambda mode: lambda q, k, v, b, g: attnlib.linear_attention(
            q, k, v, mode=mode, chunk_size=16, causal=True))(mode)
        ops[f"delta_{mode}"] = (lambda mode: lambda q, k, v, b, g: deltanet.delta_rule(
            q, k, v, b, g=g, mode=mode, chunk_size=16, backend="torch"))(mode)
    return ops, (q, k, v, beta, g)


@pytest.mark.parametrize("fill", [float("nan"), float("inf")])
@pytest.mark.parametrize("pos", [39, 21])
def test_a_non_finite_entry_at_a_masked_position_does_not_reach_rows_that_cannot_see_it(pos, fill, monkeypatch):
    """Uninitialised right padding: position ``pos`` holds junk in q, k, v (and beta, g). Rows before
    it equal the rows computed with clean inputs; rows from it on see it (documented: NaN/inf)."""
    monkeypatch.setattr(_validate, "checks_values", lambda x: False)     # let junk gates through
    ops, (q, k, v, beta, g) = _causal_ops()
    qb, kb, vb = _with_junk_at(40, pos, fill, q, k, v)
    bb, gb = beta.clone(), g.clone()
    bb[:, :, pos], gb[:, :, pos] = fill, fill
    for name, op in ops.items():
        clean, dirty = op(q, k, v, beta, g), op(qb, kb, vb, bb, gb)
        assert torch.equal(dirty[:, :, :pos], clean[:, :, :pos]), name
        assert not torch.isfinite(dirty[:, :, pos]).all(), name


def test_block_sparse_reference_does_not_leak_from_blocks_it_never_visits():
    q, k, v = _rand(1, 1, 40, 4, seed=7), _rand(1, 1, 40, 4, seed=8), _rand(1, 1, 40, 4, seed=9)
    mask = torch.tensor([[[1, 0, 0], [1, 1, 0], [1, 1, 1]]], dtype=torch.bool)     # block 2 seen by rows 32+
    kb, vb = _with_junk_at(40, 35, float("nan"), k, v)
    o = attnlib.block_sparse_attention(q, kb, vb, mask, block_size=16, backend="torch", causal=False)
    clean = attnlib.block_sparse_attention(q, k, v, mask, block_size=16, backend="torch", causal=False)
    assert torch.equal(o[:, :, :32], clean[:, :, :32])


@pytest.mark.skipif(not attnlib._backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import")
def test_kernels_keep_junk_out_of_the_blocks_and_chunks_before_it():
    """The documented kernel behaviour: blocks and chunks that end before a junk position never see
    it (the kernels may multiply junk by 0 *within* its own block or chunk: pad with zeros)."""
    T, D = 150, 16
    q, k, v = (_rand(1, 1, T, D, seed=s, dtype=torch.float32) for s in (10, 11, 12))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.full((1, 1, T), 0.5)
    kb, vb = _with_junk_at(T, T - 1, float("nan"), k, v)
    first_block = 128                                                 # no kernel tile is larger
    outs = {
        "softmax": attnlib.softmax_attention(q, kb, vb, causal=True, backend="triton"),
        "block_sparse": attnlib.block_sparse_attention(q, kb, vb, torch.ones(1, 10, 10, dtype=torch.bool).tril(),
                                                       block_size=16, causal=True, backend="triton"),
        "linear": attnlib.linear_attention(q, kb, vb, chunk_size=16, backend="triton", causal=True),
        "delta": attnlib.delta_rule(q, kb, vb, beta, chunk_size=16, backend="triton"),
    }
    for name, o in outs.items():
        assert torch.isfinite(o[:, :, :first_block]).all(), name


# ----------------------------------------------------------------------------- ANNA's flags and probabilities

_Q = torch.zeros(1, 1, 4, 3)


@pytest.mark.parametrize("call, err, match", [
    (lambda: attnlib.anna_attention(_Q, _Q, _Q, n_tables=2, n_bits=3, return_weights="no", causal=False), TypeError,
     "return_weights must be a bool .*got str 'no'"),
    (lambda: attnlib.anna_attention(_Q, _Q, _Q, n_tables=2, n_bits=3, causal=1), TypeError, "causal must be a bool"),
    (lambda: anna_module.simhash_collision_probability(3.5), ValueError, r"theta must lie in \[0, pi\].*3.5"),
    (lambda: anna_module.simhash_collision_probability(torch.tensor([0.1, -0.2])), ValueError,
     r"theta must lie in \[0, pi\].*-0.2"),
    (lambda: anna_module.simhash_collision_probability(float("nan")), ValueError, "theta must lie in"),
    (lambda: anna_module.simhash_collision_probability("1"), TypeError, "theta must be a number or a tensor"),
    (lambda: anna_module.simhash_collision_probability(1.0, n_bits=1.5), TypeError, "n_bits must be an int"),
    (lambda: anna_module.simhash_collision_probability(1.0, n_bits=-1), ValueError, "n_bits must be >= 0"),
    (lambda: anna_module.table_collision_probability(1.2, 2, 3), ValueError, r"p_one must lie in \[0, 1\].*1.2"),
    (lambda: anna_module.table_collision_probability(torch.tensor([-0.1]), 2, 3), ValueError, "p_one must lie in"),
    (lambda: anna_module.table_collision_probability(0.5, 0, 3), ValueError, "n_bits must be >= 1"),
    (lambda: anna_module.table_collision_probability(0.5, 2, 2.0), TypeError, "n_tables must be an int"),
    (lambda: anna_module.table_collision_probability(0.5, 2, 0), ValueError, "n_tables must be >= 1"),
])
def test_anna_flags_and_probability_helpers_refuse_what_they_cannot_mean(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_anna_probability_helpers_at_the_ends_of_their_ranges():
    assert anna_module.simhash_collision_probability(0.0, n_bits=5).item() == 1.0
    assert anna_module.simhash_collision_probability(torch.pi, n_bits=5).item() == 0.0
    assert anna_module.simhash_collision_probability(1.0, n_bits=0).item() == 1.0      # no bits: all collide
    assert anna_module.table_collision_probability(torch.tensor([0.0, 1.0]), 3, 4).tolist() == [0.0, 1.0]


def test_anna_allows_no_keys_where_softmax_refuses_them():
    """``Tk == 0`` is an empty row for ANNA (output 0) and undefined for softmax: one check, two answers."""
    q, e = torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 0, 4)
    assert torch.equal(attnlib.anna_attention(q, e, e, n_tables=1, n_bits=2, causal=False), torch.zeros(1, 1, 3, 4))
    with pytest.raises(ValueError, match="expected at least one key"):
        attnlib.softmax_attention(q, e, e, causal=False)


# ----------------------------------------------------------------------------- one measure

def test_rel_rms_is_the_relative_frobenius_error_and_zero_for_equal_tensors():
    b = torch.tensor([3.0, 4.0])
    assert rel_rms(b, b) == 0.0
    assert rel_rms(b + torch.tensor([0.3, 0.4]), b) == pytest.approx(0.1)
    assert rel_rms(torch.zeros(2), torch.zeros(2)) == 0.0
    with pytest.raises(TypeError, match="two tensors"):
        rel_rms([1.0], b)


def test_rel_rms_refuses_tensors_of_different_shapes_even_broadcastable_ones():
    b = torch.ones(3, 4)
    for a in (torch.ones(4), torch.ones(1, 4), torch.ones(3, 1), torch.ones(4, 3)):
        with pytest.raises(ValueError, match=re.escape(f"a of shape {tuple(a.shape)} and b of shape (3, 4)")):
            rel_rms(a, b)


# ----------------------------------------------------------------------------- the masking keeps gradients exact

def test_masked_references_keep_exact_gradients():
    """Selecting instead of multiplying by 0 (and the NaN bookkeeping) must not change a gradient."""
    B, H, T, D, Dv = 1, 1, 5, 3, 2
    q, k, v = (_rand(B, H, T, n, seed=20 + i).requires_grad_() for i, n in enumerate((D, D, Dv)))
    beta = (0.5 + 0.3 * torch.rand(B, H, T, dtype=F64)).requires_grad_()
    g = (-0.2 * torch.rand(B, H, T, dtype=F64)).requires_grad_()
    mask = torch.tensor([[[True, False, False], [True, True, False], [False, True, True]]])
    checks = {
        "softmax": (lambda q, k, v: attnlib.softmax_attention(q, k, v, causal=True), (q, k, v)),
        "block_sparse": (lambda q, k, v: attnlib.block_sparse_attention(q, k, v, mask, block_size=2, causal=True,
                                                                         backend="torch"), (q, k, v)),
    }
    for mode in linear.MODES:
        checks[f"linear_{mode}"] = ((lambda m: lambda q, k, v: attnlib.linear_attention(
            q, k, v, mode=m, chunk_size=2, causal=True))(mode), (q, k, v))
        checks[f"delta_{mode}"] = ((lambda m: lambda q, k, v, b, g: attnlib.delta_rule(
            q, torch.nn.functional.normalize(k, dim=-1), v, b, g=g, mode=m, chunk_size=2))(mode), (q, k, v, beta, g))
    for name, (fn, inputs) in checks.items():
        assert torch.autograd.gradcheck(fn, inputs), name


# ----------------------------------------------------------------------------- chapter 6: Grassmann mixing

def test_grassmann_layer_names_h_when_its_dtype_or_device_differs_from_the_parameters():
    from attnlib.grassmann import CausalGrassmannMixing
    layer = CausalGrassmannMixing(8, reduced_dim=3)
    with pytest.raises(TypeError, match=r"h has dtype float64; expected float32, the dtype of the layer's"):
        layer(torch.randn(1, 4, 8, dtype=F64))
    assert layer.double()(torch.randn(1, 4, 8, dtype=F64)).dtype == F64


@pytest.mark.parametrize("offsets,error,match", [
    ((1, 2**40), ValueError, r"offsets\[1\] must be in \[1, 2147483647\]"),
    ((2**63,), ValueError, r"offsets\[0\] must be in \[1, 2147483647\]"),
    ((4, 4), ValueError, r"offsets has repeated values: \(4, 4\); expected distinct positive ints"),
    ((2, True), TypeError, r"offsets\[1\] must be an int; got bool")])
def test_grassmann_offsets_out_of_range_are_named(offsets, error, match):
    from attnlib.grassmann import plucker_projection, receptive_field
    with pytest.raises(error, match=match):
        plucker_projection(torch.randn(1, 4, 3), torch.randn(2, 3), offsets)
    with pytest.raises(error, match=match):
        receptive_field(offsets, 1)


@pytest.mark.parametrize("depth,error", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_grassmann_receptive_field_refuses_a_bad_depth(depth, error):
    from attnlib.grassmann import receptive_field
    with pytest.raises(error, match="depth"):
        receptive_field((1, 2), depth)


@pytest.mark.parametrize("scale", [1e10, 1e-10, 1e30])
def test_grassmann_huge_and_tiny_tokens_give_the_scale_free_coordinates(scale):
    """p_hat is scale-invariant: |z| ~ 1e10 in float32 neither overflows (||p||^2 ~ 1e40) nor zeroes
    the rows. (At 1e-10, ||p|| ~ 1e-20 < eps: p / eps, tiny, as the definition says.)"""
    from attnlib.grassmann import plucker_features, plucker_projection
    z = _rand(1, 9, 5, dtype=torch.float32)
    W = _rand(4, 10, seed=1, dtype=torch.float32)
    for mode in ("features", "collapsed"):
        got = plucker_projection(z * scale, W, (1, 2), mode=mode)
        ref = plucker_projection((z * scale).double(), W.double(), (1, 2), mode=mode)
        assert torch.isfinite(got).all() and rel_rms(got.double(), ref) < 1e-6, mode
    f = plucker_features(z * scale, (1,))
    if scale > 1:
        assert torch.allclose(f, plucker_features(z, (1,)), atol=1e-6)


def test_grassmann_principal_angles_name_the_degenerate_argument():
    from attnlib.grassmann import principal_angles
    u, w = _rand(2, 5).unbind(0)
    with pytest.raises(ValueError, match=r"w2 is parallel to u2"):
        principal_angles(u, w, u, -u)
    with pytest.raises(ValueError, match=r"u1 has non-finite entries"):
        principal_angles(torch.full_like(u, float("nan")), w, u, w)


def test_collision_probability_takes_angles_rounded_in_float32_at_the_ends_of_their_range():
    """float32 pi rounds above math.pi: an angle grid built in float32 is still [0, pi]."""
    import math

    from attnlib.anna import simhash_collision_probability
    p = simhash_collision_probability(torch.linspace(0, math.pi, 13))
    assert p[0] == 1 and p[-1] == 0 and p.dtype == torch.float64
    with pytest.raises(ValueError, match="theta must lie in"):
        simhash_collision_probability(torch.tensor([3.15]))
