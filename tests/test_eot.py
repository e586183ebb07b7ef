"""Chapter 1's identities, for all inputs (hypothesis), and the solvers' convergence."""

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import attnlib
from attnlib import eot

from .conftest import rel_rms

dims = st.integers(min_value=1, max_value=7)
epsilons = st.floats(min_value=0.05, max_value=20.0)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
FAST = settings(max_examples=30, deadline=None)


def _cost(nq, nk, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(nq, nk, generator=g, dtype=torch.float64)


@FAST
@given(dims, dims, epsilons, seeds)
def test_strong_duality_primal_at_softmax_equals_dual(nq, nk, eps, seed):
    C = _cost(nq, nk, seed)
    P = eot.gibbs_plan(C, eps)
    assert math.isclose(eot.objective(P, C, eps).item(), eot.dual_value(C, eps).item(),
                        rel_tol=1e-10, abs_tol=1e-10)


@FAST
@given(dims, dims, epsilons, seeds)
def test_any_other_feasible_plan_costs_more(nq, nk, eps, seed):
    """Gibbs variational principle: the softmax plan minimises the primal over the row simplex."""
    C = _cost(nq, nk, seed)
    g = torch.Generator().manual_seed(seed + 1)
    Q = torch.rand(nq, nk, generator=g, dtype=torch.float64) ** 3
    Q = Q / Q.sum(-1, keepdim=True)
    assert eot.objective(Q, C, eps) >= eot.dual_value(C, eps) - 1e-9


@FAST
@given(dims, dims, epsilons, seeds, st.sampled_from(["newton", "mirror"]))
def test_iterative_solvers_find_softmax_without_calling_it(nq, nk, eps, seed, method):
    C = _cost(nq, nk, seed)
    P = eot.solve_one_sided(C, eps, method=method, tol=1e-13, max_iter=20_000)
    assert (P - torch.softmax(-C / eps, -1)).abs().max() < 1e-8


def test_newton_converges_quadratically_and_mirror_linearly():
    C = _cost(16, 64, 0)
    _, hist_n = eot.solve_one_sided(C, 0.5, method="newton", return_history=True)
    _, hist_m = eot.solve_one_sided(C, 0.5, method="mirror", return_history=True)
    assert hist_n[-1] < 1e-12 and len(hist_n) < 40
    # linear rate |1 - step * eps| = 0.5 with the default step: ratio of successive changes ~ 0.5
    ratios = [b / a for a, b in zip(hist_m[10:20], hist_m[11:21])]
    assert all(abs(r - 0.5) < 0.05 for r in ratios)
    assert len(hist_m) > len(hist_n)


def test_softmax_solver_does_not_call_softmax(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("softmax called")
    monkeypatch.setattr(torch, "softmax", boom)
    monkeypatch.setattr(torch, "logsumexp", boom)
    C = _cost(3, 5, 1)
    eot.solve_one_sided(C, 1.0, method="newton")
    eot.solve_one_sided(C, 1.0, method="mirror")


@FAST
@given(dims, dims, st.floats(0.2, 5.0), seeds)
def test_sinkhorn_meets_both_marginals_and_first_half_step_is_softmax(nq, nk, eps, seed):
    C = _cost(nq, nk, seed, scale=1.0)
    # Sinkhorn contracts the Hilbert projective metric by tanh(delta/4)^2 per round, with delta the
    # projective diameter of the Gibbs kernel exp(-C/eps) (Franklin & Lorenz, 1989). Near-permutation
    # problems (small eps, spread-out costs) need far more than 5000 rounds; only problems the bound
    # says converge within the budget are tested.
    M = C[:, :, None] - C[:, None, :]                            # M[i, k, l] = C_ik - C_il
    delta = ((M.amax(0) - M.amin(0)).max() / eps).item()
    assume(5000 * math.log(math.tanh(delta / 4) ** 2 + 1e-300) < -40)
    P, f, g, _ = eot.sinkhorn(C, eps, max_iter=5000, tol=1e-11, return_potentials=True)
    assert (P.sum(-1) - 1).abs().max() < 1e-9
    assert (P.sum(-2) - nq / nk).abs().max() < 1e-9
    P1 = eot.sinkhorn(C, eps, max_iter=1, tol=1e-300)
    # after one (f, g) round the row potentials came from g = 0: rows of exp((f - C)/eps) are softmax
    f1 = -eps * torch.logsumexp(-C / eps, dim=-1)
    assert rel_rms(torch.exp((f1[:, None] - C) / eps), torch.softmax(-C / eps, -1)) < 1e-12
    assert P1.shape == C.shape


def test_sinkhorn_matches_pot():
    ot = pytest.importorskip("ot")
    C = _cost(6, 9, 3, scale=1.0)
    a = torch.ones(6, dtype=torch.float64)
    b = torch.full((9,), 6 / 9, dtype=torch.float64)
    P = eot.sinkhorn(C, 0.5, a, b, max_iter=5000, tol=1e-12)
    P_pot = ot.bregman.sinkhorn_log(a.numpy(), b.numpy(), C.numpy(), 0.5, numItermax=5000, stopThr=1e-13)
    assert abs(P.numpy() - P_pot).max() < 1e-8


@FAST
@given(st.integers(2, 8), st.integers(1, 4), st.floats(0.2, 5.0), seeds)
def test_backward_is_reinforce_with_a_mean_baseline(nk, dv, eps, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(nk, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(nk, dv, generator=g, dtype=torch.float64)
    w = torch.randn(dv, generator=g, dtype=torch.float64)
    o = torch.softmax(s / eps, -1) @ v
    loss = (w * o).sum() + 0.5 * (o ** 2).sum()
    loss.backward()
    grad_o = w + o.detach()
    adv = eot.advantage_gradient(torch.softmax(s.detach() / eps, -1), v, grad_o, eps)
    assert rel_rms(adv, s.grad) < 1e-10


@FAST
@given(st.integers(2, 8), st.floats(0.2, 5.0), seeds)
def test_lse_hessian_is_fisher_psd_with_ones_in_null_space(nk, eps, seed):
    s = torch.randn(nk, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    H = eot.lse_hessian(s, eps)
    H_auto = torch.autograd.functional.hessian(lambda x: eps * torch.logsumexp(x / eps, -1), s)
    # Entries are p_i(delta_ij - p_j)/eps, at most 1/(4 eps) in size. When p is nearly one-hot they are
    # tiny and autograd's route loses relative accuracy to cancellation (1 - p), so the error is
    # measured against the entries' scale 1/eps, not against themselves.
    assert (H - H_auto).abs().max() * eps < 1e-12
    assert torch.linalg.eigvalsh(H).min() > -1e-12
    assert (H @ torch.ones(nk, dtype=torch.float64)).abs().max() < 1e-12


def test_attention_lse_is_the_dual_potential():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 6, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 9, 16, generator=g, dtype=torch.float64)
    v = torch.randn(1, 1, 9, 4, generator=g, dtype=torch.float64)
    _, lse = attnlib.softmax_attention(q, k, v, return_lse=True, causal=False)
    eps = math.sqrt(16)
    C = -(q[0, 0] @ k[0, 0].T)
    assert math.isclose(eot.dual_value(C, eps).item(), -eps * lse.sum().item(), rel_tol=1e-12)


def test_temperature_limits():
    C = _cost(4, 6, 7)
    hard = eot.gibbs_plan(C, 1e-4)
    assert torch.equal(hard.argmax(-1), C.argmin(-1)) and (hard.max(-1).values > 1 - 1e-9).all()
    soft = eot.gibbs_plan(C, 1e6)
    assert (soft - 1 / 6).abs().max() < 1e-5


@pytest.mark.parametrize("call, err, match", [
    (lambda: eot.dual_value(torch.zeros(3, 4), 0.0), ValueError, "eps must be a finite number > 0"),
    (lambda: eot.dual_value(torch.zeros(4), 1.0), ValueError, "expected at least 2 dims"),
    (lambda: eot.dual_value(torch.full((2, 2), float("inf")), 1.0), ValueError, "non-finite"),
    (lambda: eot.objective(torch.zeros(3, 3), torch.zeros(3, 4), 1.0), ValueError, "to match C"),
    (lambda: eot.solve_one_sided(torch.zeros(2, 2), 1.0, method="adam"), ValueError, "method must be"),
    (lambda: eot.solve_one_sided(torch.zeros(2, 2), 1.0, method="mirror", step=3.0), ValueError, "step must be"),
    (lambda: eot.sinkhorn(torch.zeros(2, 3), 1.0, b=torch.ones(3)), ValueError, "same total mass"),
    (lambda: eot.sinkhorn(torch.zeros(2, 3), 1.0, b=torch.ones(2)), ValueError, "b has shape"),
    (lambda: eot.sinkhorn(torch.zeros(2, 3), 1.0, a=-torch.ones(2), b=-torch.ones(3) * 2 / 3), ValueError,
     "strictly positive"),
])
def test_eot_bad_inputs(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_sinkhorn_at_small_eps_returns_plans_whose_marginals_hold_to_rounding():
    """At eps = 0.05 the exponents (f + g - C) / eps reach ~40, and exp carries their rounding: about 40
    units in the last place per entry. The marginal check allows for it (it refused about one cost
    matrix in six here before), yet the plans it returns hold the rows to the solver's tolerance (1e-9)
    and the columns, exact after each column update, to 1e-13."""
    for seed in range(60):
        C = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        P = eot.sinkhorn(C, eps=0.05)
        assert (P.sum(-1) - 1).abs().max() <= 1e-9 and (P.sum(-2) - 0.75).abs().max() < 1e-13
