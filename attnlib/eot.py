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


def _check_cost(C) -> torch.Tensor:
    C = _validate.check_tensor("C", C, min_ndim=2)
    if C.shape[-1] == 0 or C.shape[-2] == 0:
        raise ValueError(f"C has shape {tuple(C.shape)}; expected at least one source and one target")
    if not torch.isfinite(C).all():
        raise ValueError("C has non-finite entries; expected a finite cost matrix")
    return C


def entropy(P: torch.Tensor) -> torch.Tensor:
    """``H(P) = -sum_ij P_ij log P_ij`` over the last two dims (``0 log 0 = 0``). Shape ``[...]``."""
    P = _validate.check_tensor("P", P, min_ndim=2)
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
    """The closed-form optimum, ``exp(-C / eps)`` normalised per row (i.e. softmax(-C / eps))."""
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

    Returns ``P`` (and, with ``return_history``, a list of the max marginal/plan change per
    iteration -- the convergence curve the notebook plots).
    """
    C = _check_cost(C)
    eps = _validate.check_positive("eps", eps)
    if method not in ("newton", "mirror"):
        raise ValueError(f"method must be 'newton' or 'mirror'; got {method!r}")
    tol = _validate.check_positive("tol", tol)
    if not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int; got {max_iter!r}")
    history: list[float] = []

    if method == "newton":
        lam = -C.min(dim=-1, keepdim=True).values - eps                # f(lam_0) >= 0
        for _ in range(max_iter):
            p = torch.exp(-(C + lam) / eps - 1.0)                      # every exponent <= 0
            f = p.sum(dim=-1, keepdim=True) - 1.0
            history.append(f.abs().max().item())
            if history[-1] <= tol:
                break
            lam = lam + eps * f / (f + 1.0)                            # lam - f / f'
        P = torch.exp(-(C + lam) / eps - 1.0)
    else:
        step = 0.5 / eps if step is None else _validate.check_positive("step", step)
        if step * eps >= 2.0:
            raise ValueError(f"step must be < 2 / eps = {2.0 / eps:g} for mirror descent to converge; "
                             f"got {step:g}")
        logP = torch.full_like(C, 0.0) - torch.log(torch.tensor(float(C.shape[-1]), dtype=C.dtype))
        for _ in range(max_iter):
            logP_new = logP - step * (C + eps * (1.0 + logP))
            # KL projection onto the simplex: subtract each row's log-partition (stably).
            row_max = logP_new.max(dim=-1, keepdim=True).values
            logP_new = logP_new - row_max - torch.log(torch.exp(logP_new - row_max).sum(-1, keepdim=True))
            change = (logP_new.exp() - logP.exp()).abs().max().item()
            logP = logP_new
            history.append(change)
            if change <= tol:
                break
        P = logP.exp()
    return (P, history) if return_history else P


def sinkhorn(C: torch.Tensor, eps: float, a: torch.Tensor | None = None, b: torch.Tensor | None = None,
             *, n_iter: int = 1000, tol: float = 1e-9, return_potentials: bool = False):
    """Two-sided (balanced) entropic OT by log-domain Sinkhorn -- the Sinkformer's attention.

    Finds ``P = exp((f_i + g_j - C_ij) / eps)`` with ``P 1 = a`` and ``P^T 1 = b`` by alternately
    fitting the row potentials ``f`` and the column potentials ``g``:

        f_i = eps log a_i - eps logsumexp_j((g_j - C_ij) / eps)
        g_j = eps log b_j - eps logsumexp_i((f_i - C_ij) / eps)

    Defaults: ``a = 1`` (each query ships unit mass, as in attention) and ``b = Nq / Nk`` (every key
    receives the same mass). The first row update from ``g = 0`` gives ``a_i * softmax(-C_i / eps)``:
    one-sided attention is a single half-step of Sinkhorn.

    Returns ``P`` (or ``(P, f, g, n_iter_run)``). Stops when the column marginal error
    ``max_j |P^T 1 - b|_j <= tol``.
    """
    C = _check_cost(C)
    eps = _validate.check_positive("eps", eps)
    Nq, Nk = C.shape[-2:]
    if a is None:
        a = torch.ones(Nq, dtype=C.dtype, device=C.device)
    if b is None:
        b = torch.full((Nk,), Nq / Nk, dtype=C.dtype, device=C.device)
    for name, m, n in (("a", a, Nq), ("b", b, Nk)):
        _validate.check_tensor(name, m)
        if m.shape[-1] != n:
            raise ValueError(f"{name} has shape {tuple(m.shape)}; expected last dim {n} to match C")
        if not (m > 0).all():
            raise ValueError(f"{name} must be strictly positive")
    if not torch.allclose(a.sum(-1), b.sum(-1), rtol=1e-6, atol=0):
        raise ValueError(f"a and b must carry the same total mass; got {a.sum(-1)} and {b.sum(-1)}")
    if not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"n_iter must be a positive int; got {n_iter!r}")
    log_a, log_b = a.log(), b.log()
    f = torch.zeros(C.shape[:-1], dtype=C.dtype, device=C.device)
    g = torch.zeros(C.shape[:-2] + (Nk,), dtype=C.dtype, device=C.device)
    it = 0
    for it in range(1, n_iter + 1):  # noqa: B007 - the count is returned
        f = eps * log_a - eps * torch.logsumexp((g.unsqueeze(-2) - C) / eps, dim=-1)
        g = eps * log_b - eps * torch.logsumexp((f.unsqueeze(-1) - C) / eps, dim=-2)
        # After the g-update columns are exact; measure the rows, which the next f-update fixes.
        P = torch.exp((f.unsqueeze(-1) + g.unsqueeze(-2) - C) / eps)
        if (P.sum(-1) - a).abs().max().item() <= tol:
            break
    P = torch.exp((f.unsqueeze(-1) + g.unsqueeze(-2) - C) / eps)
    return (P, f, g, it) if return_potentials else P


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

    ``p: [..., Nk]``, ``v: [..., Nk, Dv]``, ``grad_o: [..., Dv]``. Returns ``[..., Nk]``."""
    eps = _validate.check_positive("eps", eps)
    u = -(v @ grad_o.unsqueeze(-1)).squeeze(-1)
    baseline = (p * u).sum(-1, keepdim=True)
    return -(p / eps) * (u - baseline)
