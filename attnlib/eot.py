"""Chapter 1's mathematics: attention as one-sided entropic optimal transport.

Notation (one head; leading batch dims allowed everywhere): ``C [..., Nq, Nk]`` a cost matrix,
``eps > 0`` the entropy weight, ``P`` a transport plan of the same shape.

    primal   min_P  <P, C> - eps * H(P)   over  P >= 0,  P 1 = 1   (each query ships unit mass;
                                                                    the key marginal is free)
    H(P)  = -sum_ij P_ij log P_ij
    plan     P*_ij = exp(-C_ij / eps) / sum_l exp(-C_il / eps)   (= softmax(-C / eps), row-wise)
    dual     D(C, eps) = -eps * sum_i logsumexp_j(-C_ij / eps)   (= the primal's optimal value)

With ``C = -q.k`` and ``eps = sqrt(d)`` the plan is scaled dot-product attention's weight matrix.
The solvers here never call softmax: they find the plan as a generic convex solver would, so that
the notebook can check that what they find *is* softmax.
"""

from __future__ import annotations

import torch

from . import _validate
from ._numerics import acc_dtype


def _check_cost(C) -> torch.Tensor:
    C = _validate.check_tensor("C", C, min_ndim=2)
    if C.shape[-1] == 0 or C.shape[-2] == 0:
        raise ValueError(f"C has shape {tuple(C.shape)}; expected at least one source and one target")
    if _validate.checks_values(C) and not torch.isfinite(C).all():
        raise ValueError("C has non-finite entries; expected a finite cost matrix")
    return C


def _shifted_cost(C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``C`` in the accumulation dtype with each row's minimum subtracted, and those minima.

    Subtracting a constant from a row of the cost does not change the plan (one-sided: it cancels in
    the row's normalisation; two-sided: it moves into the row potential ``f``). It keeps every
    exponent near zero: with costs of 1e4 in float16 the unshifted exponents lose every digit.
    """
    Cw = C.to(acc_dtype(C.dtype))
    row_min = Cw.min(dim=-1, keepdim=True).values
    return Cw - row_min, row_min


def _check_marginal(solver: str, name: str, got: torch.Tensor, want: torch.Tensor, claimed: float,
                    dtype: torch.dtype, n_terms: int, exponent: float = 0.0) -> None:
    """Refuse to return a plan whose marginal misses by more than the solver's own last residual
    (``claimed``) plus rounding -- of the returned dtype, of a sum of ``n_terms`` in the accumulation
    dtype, and of each entry ``exp(x)`` whose argument, of size up to ``exponent``, carries a rounding
    error of about ``exponent`` units in the last place -- a plan that is not what it says it is."""
    err = (got - want).abs().max().item() if got.numel() else 0.0
    scale = 1.0 + (want.abs().max().item() if want.numel() else 0.0)
    slack = (4 * torch.finfo(dtype).eps + (n_terms + exponent) * torch.finfo(got.dtype).eps) * scale
    if not err <= claimed + slack:                      # also catches NaN
        raise FloatingPointError(
            f"{solver}: the plan's {name} marginal misses by {err:.3g}, more than the solver's residual "
            f"{claimed:.3g} allows in {str(dtype).replace('torch.', '')} (costs too large for eps? "
            "try float64 inputs or a larger eps)")


def entropy(P: torch.Tensor) -> torch.Tensor:
    """``H(P) = -sum_ij P_ij log P_ij`` over the last two dims (``0 log 0 = 0``). Shape ``[...]``.

    ``P`` must be non-negative (checked on CPU tensors; see :mod:`attnlib._validate`)."""
    P = _validate.check_tensor("P", P, min_ndim=2)
    if P.numel() and _validate.checks_values(P) and not (P >= 0).all():
        raise ValueError(f"P has negative entries (min {P.min().item():.3g}); expected a non-negative plan "
                         "(the entropy of a negative mass is not defined)")
    return -torch.special.xlogy(P, P).sum(dim=(-2, -1))


def objective(P: torch.Tensor, C: torch.Tensor, eps: float) -> torch.Tensor:
    """The primal objective ``<P, C> - eps * H(P)``, summed over rows. Shape ``[...]``."""
    C = _check_cost(C)
    P = _validate.check_tensor("P", P, min_ndim=2)
    if P.shape != C.shape:
        raise ValueError(f"P has shape {tuple(P.shape)}; expected {tuple(C.shape)} to match C")
    eps = _validate.check_positive("eps", eps)
    return (P * C).sum(dim=(-2, -1)) - eps * entropy(P)


def dual_value(C: torch.Tensor, eps: float) -> torch.Tensor:
    """``-eps * sum_i logsumexp_j(-C_ij / eps)``: the optimal value, by the Gibbs variational
    principle. Per row, ``-eps * logsumexp(-C_i / eps)`` is the dual potential. Shape ``[...]``."""
    C = _check_cost(C)
    eps = _validate.check_positive("eps", eps)
    return -eps * torch.logsumexp(-C / eps, dim=-1).sum(dim=-1)


def gibbs_plan(C: torch.Tensor, eps: float) -> torch.Tensor:
    """The closed-form optimum, ``exp(-C / eps)`` normalised per row
    (i.e. softmax(-C / eps))."""
    C = _check_cost(C)
    eps = _validate.check_positive("eps", eps)
    return torch.softmax(-C / eps, dim=-1)


def solve_one_sided(C: torch.Tensor, eps: float, *, method: str = "newton", tol: float = 1e-12,
                    max_iter: int = 10_000, step: float | None = None, return_history: bool = False):
    """Solve the one-sided primal iteratively, without calling softmax.

    ``method="newton"`` -- Newton's method on each row's dual multiplier. Stationarity of the
    Lagrangian ``<p, c> + eps sum p log p + lam (sum p - 1)`` gives
    ``p_j(lam) = exp(-(c_j + lam) / eps - 1)``; feasibility is the scalar equation
    ``f(lam) = sum_j p_j(lam) - 1 = 0``. ``f`` is convex and decreasing, so Newton started left of the
    root (``lam_0 = -min_j c_j - eps``, where ``f >= 0`` and no exponent is positive) climbs to it
    monotonically: about ``log Nk`` steps of size ~eps, then quadratic convergence.

    ``method="mirror"`` -- entropic mirror descent (exponentiated gradient) on the primal from the
    uniform plan: ``log p <- log p - step * (c + eps (1 + log p))``, then the KL projection back
    onto the simplex (divide by the sum). The error contracts by ``|1 - step * eps|`` per
    iteration; the default ``step = 0.5 / eps`` halves it.

    Precision: each row's cost is first shifted by its minimum (the plan does not change) and the
    iteration runs in float32 (float64 for float64 costs), so half-precision costs of 1e4 give the
    right plan, returned in ``C``'s dtype. The iteration stops at ``tol``, after ``max_iter`` steps,
    or when the residual stops falling (the dtype's rounding floor). Before returning, the plan's row
    sums are checked against the last residual: a plan that misses its own marginal by more than
    rounding raises ``FloatingPointError`` instead of coming back wrong.

    Returns ``P`` (and, with ``return_history``, a list of the max marginal/plan change per
    iteration -- the convergence curve the notebook plots).
    """
    C = _check_cost(C)
    eps = _validate.check_positive("eps", eps)
    if method not in ("newton", "mirror"):
        raise ValueError(f"method must be 'newton' or 'mirror'; got {method!r}")
    tol = _validate.check_positive("tol", tol)
    max_iter = _validate.check_int("max_iter", max_iter, lo=1)
    _validate.check_bool("return_history", return_history)
    Cs, _ = _shifted_cost(C)                                           # min_j c_j = 0 in every row
    history: list[float] = []

    if method == "newton":
        lam = torch.full_like(Cs[..., :1], -eps)                      # -min_j c_j - eps: f(lam_0) >= 0
        for _ in range(max_iter):
            p = torch.exp(-(Cs + lam) / eps - 1.0)                     # every exponent <= 0
            f = p.sum(dim=-1, keepdim=True) - 1.0
            history.append(f.abs().max().item())
            if history[-1] <= tol or (len(history) > 1 and history[-1] >= history[-2]):
                break                                                  # converged, or at the rounding floor
            lam = lam + eps * f / (f + 1.0)                            # lam - f / f'
        P = torch.exp(-(Cs + lam) / eps - 1.0)
        claimed = history[-1]
    else:
        step = 0.5 / eps if step is None else _validate.check_positive("step", step)
        if step * eps >= 2.0:
            raise ValueError(f"step must be < 2 / eps = {2.0 / eps:g} for mirror descent to converge; "
                             f"got {step:g}")
        logP = torch.full_like(Cs, -torch.log(torch.tensor(float(Cs.shape[-1]), dtype=torch.float64)).item())
        for _ in range(max_iter):
            logP_new = logP - step * (Cs + eps * (1.0 + logP))
            # KL projection onto the simplex: subtract each row's log-partition (stably).
            row_max = logP_new.max(dim=-1, keepdim=True).values
            logP_new = logP_new - row_max - torch.log(torch.exp(logP_new - row_max).sum(-1, keepdim=True))
            change = (logP_new.exp() - logP.exp()).abs().max().item()
            logP = logP_new
            history.append(change)
            if change <= tol or (len(history) > 1 and change >= history[-2] and change < 1e-3):
                break                                                  # converged, or at the rounding floor
        P = logP.exp()
        claimed = 0.0                                                  # every iterate is normalised
    out = P.to(C.dtype)
    _check_marginal("solve_one_sided", "row", out.to(P.dtype).sum(-1), torch.ones_like(P[..., 0]),
                    claimed, C.dtype, C.shape[-1])
    return (out, history) if return_history else out


def sinkhorn(C: torch.Tensor, eps: float, a: torch.Tensor | None = None, b: torch.Tensor | None = None,
             *, max_iter: int = 10_000, tol: float = 1e-9, return_potentials: bool = False):
    """Two-sided (balanced) entropic OT by log-domain Sinkhorn -- the Sinkformer's attention.

    Finds ``P = exp((f_i + g_j - C_ij) / eps)`` with ``P 1 = a`` and ``P^T 1 = b`` by alternately
    fitting the row potentials ``f`` and the column potentials ``g``:

        f_i = eps log a_i - eps logsumexp_j((g_j - C_ij) / eps)
        g_j = eps log b_j - eps logsumexp_i((f_i - C_ij) / eps)

    Defaults: ``a = 1`` (each query ships unit mass, as in attention) and ``b = Nq / Nk`` (every key
    receives the same mass). The first row update from ``g = 0`` gives ``a_i * softmax(-C_i / eps)``:
    one-sided attention is a single half-step of Sinkhorn.

    Precision as :func:`solve_one_sided`: rows shifted by their minimum (absorbed into ``f``, which is
    returned for the unshifted ``C``), iterations in float32 (float64 for float64 costs), the plan
    returned in ``C``'s dtype after its marginals are checked against the last residual.

    Returns ``P`` (or ``(P, f, g, n_iter)``, ``n_iter`` the iterations run). Stops when the row marginal error
    ``max_i |P 1 - a|_i <= tol`` (the columns are exact after each ``g``-update), or when that error
    stops falling (the dtype's rounding floor), or after ``max_iter`` iterations.
    """
    C = _check_cost(C)
    eps = _validate.check_positive("eps", eps)
    Nq, Nk = C.shape[-2:]
    acc = acc_dtype(C.dtype)
    if a is None:
        a = torch.ones(Nq, dtype=acc, device=C.device)
    if b is None:
        b = torch.full((Nk,), Nq / Nk, dtype=acc, device=C.device)
    for name, m, n in (("a", a, Nq), ("b", b, Nk)):
        _validate.check_tensor(name, m)
        if m.shape[-1] != n:
            raise ValueError(f"{name} has shape {tuple(m.shape)}; expected last dim {n} to match C")
        if m.device != C.device:
            raise ValueError(f"{name} is on {m.device}; expected {C.device} to match C")
        if not (m > 0).all():
            raise ValueError(f"{name} must be strictly positive")
    a, b = a.to(acc), b.to(acc)
    if not torch.allclose(a.sum(-1), b.sum(-1), rtol=1e-6, atol=0):
        raise ValueError(f"a and b must carry the same total mass; got {a.sum(-1)} and {b.sum(-1)}")
    max_iter = _validate.check_int("max_iter", max_iter, lo=1)
    _validate.check_bool("return_potentials", return_potentials)
    tol = _validate.check_positive("tol", tol)
    Cs, row_min = _shifted_cost(C)
    log_a, log_b = a.log(), b.log()
    f = torch.zeros(Cs.shape[:-1], dtype=acc, device=C.device)
    g = torch.zeros(Cs.shape[:-2] + (Nk,), dtype=acc, device=C.device)
    it, errs = 0, []
    for it in range(1, max_iter + 1):  # noqa: B007 - the count is returned
        f = eps * log_a - eps * torch.logsumexp((g.unsqueeze(-2) - Cs) / eps, dim=-1)
        g = eps * log_b - eps * torch.logsumexp((f.unsqueeze(-1) - Cs) / eps, dim=-2)
        # After the g-update columns are exact; measure the rows, which the next f-update fixes.
        P = torch.exp((f.unsqueeze(-1) + g.unsqueeze(-2) - Cs) / eps)
        errs.append((P.sum(-1) - a).abs().max().item())
        if errs[-1] <= tol or (it > 1 and errs[-1] >= errs[-2] and errs[-1] < 1e-3):
            break
    P = torch.exp((f.unsqueeze(-1) + g.unsqueeze(-2) - Cs) / eps)
    out = P.to(C.dtype)
    back = out.to(acc)
    # exp((f + g - C) / eps): the argument's rounding error grows with f, g and C over eps.
    exponent = ((f.abs().amax() + g.abs().amax() + Cs.abs().amax()) / eps).item() if Cs.numel() else 0.0
    _check_marginal("sinkhorn", "row", back.sum(-1), a.expand_as(back[..., 0]), errs[-1], C.dtype, Nk, exponent)
    _check_marginal("sinkhorn", "column", back.sum(-2), b.expand_as(back[..., 0, :]), 0.0, C.dtype, Nq,
                    exponent)
    f = f + row_min.squeeze(-1)                                        # the potential of the unshifted C
    if return_potentials:
        return out, f.to(C.dtype), g.to(C.dtype), it
    return out


def lse_hessian(s: torch.Tensor, eps: float) -> torch.Tensor:
    """Hessian of ``eps * logsumexp(s / eps)`` in ``s`` (last dim): ``(diag p - p p^T) / eps``,
    with ``p = softmax(s / eps)`` -- the Fisher information of the softmax family, up to scale."""
    s = _validate.check_tensor("s", s, min_ndim=1)
    eps = _validate.check_positive("eps", eps)
    p = torch.softmax(s / eps, dim=-1)
    return (torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)) / eps


def advantage_gradient(p: torch.Tensor, v: torch.Tensor, grad_o: torch.Tensor, eps: float) -> torch.Tensor:
    """The gradient of a loss through ``o = sum_j p_j v_j``, ``p = softmax(s / eps)``, w.r.t. ``s``,
    written as a policy gradient: with utilities ``u_j = -grad_o . v_j``,

        dL/ds_j = -(p_j / eps) * (u_j - E_p[u])     (REINFORCE with the mean as baseline).

    ``p: [..., Nk]``, ``v: [..., Nk, Dv]``, ``grad_o: [..., Dv]`` (leading dims broadcast), one float
    dtype, one device. Returns ``[..., Nk]``."""
    p = _validate.check_tensor("p", p, min_ndim=1)
    v = _validate.check_tensor("v", v, min_ndim=2)
    grad_o = _validate.check_tensor("grad_o", grad_o, min_ndim=1)
    _validate.check_same_device_dtype([("p", p), ("v", v), ("grad_o", grad_o)])
    if v.shape[-2] != p.shape[-1]:
        raise ValueError(f"v has shape {tuple(v.shape)}; expected [..., Nk={p.shape[-1]}, Dv] to match p [..., Nk]")
    if grad_o.shape[-1] != v.shape[-1]:
        raise ValueError(f"grad_o has shape {tuple(grad_o.shape)}; expected [..., Dv={v.shape[-1]}] to match v")
    eps = _validate.check_positive("eps", eps)
    u = -(v @ grad_o.unsqueeze(-1)).squeeze(-1)
    baseline = (p * u).sum(-1, keepdim=True)
    return -(p / eps) * (u - baseline)
