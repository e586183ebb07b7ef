"""Grassmann mixing -- chapter 6's operator: Plücker coordinates of token pairs instead of attention.

Two vectors ``u, w`` of ``R^r`` span a plane through the origin, a point of the Grassmannian
``Gr(2, r)``. Its Plücker coordinates are the ``C(r, 2)`` antisymmetric products

    p_ij(u, w) = u_i w_j - u_j w_i,      i < j, in lexicographic order (0,1), (0,2), ..., (r-2, r-1),

i.e. the entries above the diagonal of ``u w^T - w u^T``. Facts the book uses, each tested:

* ``p(w, u) = -p(u, w)``; ``p(a u + b w, c u + d w) = (a d - b c) p(u, w)``: re-basing the pair only
  rescales ``p``, so ``p`` names the plane up to a non-zero factor (after normalising: up to a sign);
* ``||p||^2 = ||u||^2 ||w||^2 - (u . w)^2`` (Lagrange's identity): ``||p||`` is the area of the
  parallelogram, zero exactly when ``u`` and ``w`` are parallel;
* the quadratic Plücker relations ``p_ij p_kl - p_ik p_jl + p_il p_jk = 0`` (``i<j<k<l``) hold exactly
  for such decomposable ``p``, and cut ``Gr(2, r)`` out of the projective space of all 2-vectors;
* for ``r = 3``: ``(p_01, p_02, p_12) = (c_2, -c_1, c_0)`` with ``c = u x w`` (the cross product);
* ``<p(u1, w1), p(u2, w2)> = det([u1 w1]^T [u2 w2])`` (Cauchy--Binet), so for normalised
  coordinates ``|<p1, p2>| = cos(theta_1) cos(theta_2)``, the product of the principal angles' cosines.

The layer (Zhang 2025, "Attention Is Not What You Need"; details as the reproductions implement
them): reduce ``z_t = W_red h_t + b``; for each offset ``delta`` pair ``z_t`` with ``z_{t-delta}``;
normalise ``p / max(||p||, norm_floor)``; project ``W_plu p + b_plu`` to the model width; average over the
offsets that are valid at ``t`` (``t - delta >= 0``); gate ``alpha = sigmoid(W_gate [h_t; g_t])``;
mix ``alpha h_t + (1 - alpha) g_t``; LayerNorm.

**Causality.** The paper pairs ``z_t`` with ``z_{t+delta}``, which reads the future. Every function
here pairs with ``z_{t-delta}``; ``pairing="paper"`` exists only to demonstrate the leak.

The fused kernel (``kernels/grassmann/``) computes :func:`plucker_projection` -- pairing, products,
normalisation, the average and the projection -- without storing the ``[B, T, |W|, C(r,2)]`` tensor.
It uses that ``p(u, .)`` is linear: the normalised average over offsets is ``p(u, w_hat)`` with
``w_hat = sum_delta c_delta w_perp_delta``, ``c_delta = 1 / (K_t max(||p_delta||, norm_floor))``, where
``w_perp = w - (u . w / ||u||^2) u`` is the part of the partner orthogonal to ``u``:
``p(u, w) = p(u, w_perp)`` and ``||p|| = ||u|| ||w_perp||`` without cancellation.

**Numerics.** Every path computes in float32 (float64 for float64 inputs) and first rescales each
token by a power of two (exact) so that its largest entry lies in ``[0.5, 1)``: ``p_hat`` is
scale-invariant, and only ``norm_floor`` needs the scales (``||p||`` vs ``norm_floor`` becomes ``||p_s||`` vs
``norm_floor s_u s_w``). So ``|z| ~ 1e10`` in float32 neither overflows nor underflows. A repeated token
(``z_t = z_{t-delta}``) or a partner that is an exact power-of-two multiple gives ``p = 0`` exactly
-- a zero row, as the definition does. A nearly parallel pair at angle ``phi`` is ill-conditioned:
every path (and the definition evaluated in the input's precision) is off by about
``eps_machine / sin(phi)``. The threshold ``norm_floor s_u s_w`` is floored at the smallest normal number
of the compute dtype, which it reaches only when ``|z_u| |z_w| > 1e38 norm_floor`` in float32. One case
is left inexact: ``||p_s||^2`` underflows where the rescaled area is below ``~1e-19`` (float32), so a
pair with ``sin(phi) < ~1e-19`` that is not exactly degenerate, at a scale where ``norm_floor s_u s_w`` is
smaller still (``|z_u| |z_w| > 1e13 norm_floor``), is treated as degenerate (``p / norm_floor``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn

from . import _validate
from ._backend import choose_backend
from ._numerics import acc_dtype

PAIRINGS = ("causal", "paper")
MODES = ("features", "collapsed")
NORMS = ("post", "pre")
DEFAULT_OFFSETS = (1, 2, 4, 8, 12, 16)
MAX_OFFSET = 2**31 - 1            # the kernel indexes positions in int32


def n_pairs(r: int) -> int:
    """``C(r, 2)``: how many Plücker coordinates a pair of ``r``-vectors has."""
    return r * (r - 1) // 2


def pair_indices(r: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(i, j)`` for every coordinate, ``i < j``, lexicographic: the column order of :func:`plucker`."""
    ij = torch.triu_indices(r, r, offset=1, device=device)
    return ij[0], ij[1]


def _widen(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 if it is a 16-bit float (products of it then fit), else as it is."""
    return x.to(acc_dtype(x.dtype))


def _check_vectors(name: str, x) -> torch.Tensor:
    _validate.check_tensor(name, x, min_ndim=1)
    if x.shape[-1] < 2:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected a last dim r >= 2 (a plane "
                         "needs two coordinates at least)")
    return x


# ---------------------------------------------------------------------------------------------
# The geometry: Plücker coordinates, their relations, principal angles
# ---------------------------------------------------------------------------------------------

def plucker(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plücker coordinates of ``span(u, w)``: ``p_ij = u_i w_j - u_j w_i`` for ``i < j``.

    Args: ``u, w: [..., r]`` (same shape, dtype and device), ``r >= 2``.
    Returns: ``p [..., r (r - 1) / 2]``, columns in lexicographic ``(i, j)`` order.
    """
    _check_vectors("u", u)
    _check_vectors("w", w)
    _validate.check_same_device_dtype([("u", u), ("w", w)])
    if u.shape != w.shape:
        raise ValueError(f"w has shape {tuple(w.shape)}; expected {tuple(u.shape)} to match u")
    i, j = pair_indices(u.shape[-1], u.device)
    uf, wf = _widen(u), _widen(w)          # fp16 products overflow at |u_i w_j| > 65504
    return (uf[..., i] * wf[..., j] - uf[..., j] * wf[..., i]).to(u.dtype)


def plucker_relations(p: torch.Tensor, r: int) -> torch.Tensor:
    """Residuals of every quadratic Plücker relation, ``p_ij p_kl - p_ik p_jl + p_il p_jk``, one per
    ``i < j < k < l`` in lexicographic order.

    Zero (up to rounding) exactly when ``p`` is decomposable, ``p = u ^ w``: the relations cut the
    Grassmannian ``Gr(2, r)`` out of the space of all 2-vectors. For ``r < 4`` there are none (every
    2-vector in ``R^3`` is decomposable) and the last dim is 0.

    Args: ``p: [..., C(r, 2)]``; ``r >= 2``.  Returns: ``[..., C(r, 4)]``.
    """
    _validate.check_tensor("p", p, min_ndim=1)
    r = _validate.check_int("r", r, lo=2)
    if p.shape[-1] != n_pairs(r):
        raise ValueError(f"p has shape {tuple(p.shape)}; expected a last dim C({r}, 2) = {n_pairs(r)}")
    col = torch.full((r, r), -1, dtype=torch.long)
    i, j = pair_indices(r)
    col[i, j] = torch.arange(n_pairs(r))
    quads = torch.combinations(torch.arange(r), 4) if r >= 4 else torch.zeros(0, 4, dtype=torch.long)
    a, b, c, d = (quads[:, n] for n in range(4))
    pf = _widen(p)                         # quadratic: overflows fp16 long before p does
    P = lambda x, y: pf[..., col[x, y].to(p.device)]  # noqa: E731 - the coordinate p_xy, x < y
    return (P(a, b) * P(c, d) - P(a, c) * P(b, d) + P(a, d) * P(b, c)).to(p.dtype)


def _orthogonal_part(u: torch.Tensor, w: torch.Tensor, uu: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, w_perp)``: ``a = u . w / ||u||^2`` and ``w_perp = w - a u`` (``a = 0`` where ``u = 0``).

    ``p(u, w) = p(u, w_perp)`` and ``||p(u, w)|| = ||u|| ||w_perp||``: the area of the parallelogram
    without Lagrange's cancellation ``||u||^2 ||w||^2 - (u . w)^2``. ``w_perp`` is accurate to
    ``~eps_machine ||w||`` (relative ``eps_machine / sin`` of the angle, as the coordinates themselves),
    and it is exactly zero for ``w = u`` and for ``w = 2^k u``: the two dot products are then the same
    sums up to an exact power-of-two factor, so ``a`` is exact. The projection is applied twice: the
    first leaves a component along ``u`` of relative size ``~eps_machine / sin``, which ``p(u, .)``
    ignores but ``||w_perp||`` does not (at ``sin ~ 1e-5`` in float32 it shifts the norm by ~1e-5);
    the second removes it ("twice is enough", Gram--Schmidt)."""
    if uu is None:
        uu = u.square().sum(-1)
    uu = torch.where(uu > 0, uu, torch.ones_like(uu))
    a = (u * w).sum(-1) / uu
    v = w - a[..., None] * u
    a2 = (u * v).sum(-1) / uu
    return a + a2, v - a2[..., None] * u


def principal_angles(u1: torch.Tensor, w1: torch.Tensor, u2: torch.Tensor, w2: torch.Tensor
                     ) -> torch.Tensor:
    """The two principal angles ``0 <= theta_1 <= theta_2 <= pi/2`` between ``span(u1, w1)`` and
    ``span(u2, w2)``.

    With orthonormal bases ``Q1, Q2`` (``[..., r, 2]``), ``cos theta_k`` are the singular values of
    ``Q1^T Q2`` and ``sin theta_k`` those of ``(I - Q1 Q1^T) Q2 = Q2 - Q1 (Q1^T Q2)``. Each angle is
    ``atan2(sin, cos)``: the sine carries small angles (``arccos`` of a cosine near 1 keeps only
    ``sqrt(eps_machine)`` of them), the cosine angles near ``pi/2``.

    Args: four ``[..., r]`` tensors (same shape, dtype, device), each pair spanning a plane.
        Where values are checked (CPU tensors, or ``ATTNLIB_CHECK_VALUES=1``), non-finite entries
        and degenerate pairs -- a zero vector, or ``w`` parallel to ``u`` to within
        ``8 sqrt(r) eps_machine`` of the compute dtype -- raise ``ValueError``; elsewhere they give
        NaN or meaningless angles.
    Returns: ``[..., 2]`` in radians, ascending, in float32 (float64 for float64 inputs).
    """
    named = (("u1", u1), ("w1", w1), ("u2", u2), ("w2", w2))
    for name, x in named:
        _check_vectors(name, x)
    _validate.check_same_device_dtype(list(named))
    if not (u1.shape == w1.shape == u2.shape == w2.shape):
        raise ValueError(f"u1, w1, u2, w2 have shapes {tuple(u1.shape)}, {tuple(w1.shape)}, "
                         f"{tuple(u2.shape)}, {tuple(w2.shape)}; expected one shape [..., r]")
    acc = acc_dtype(u1.dtype)
    planes = [(u1.to(acc), w1.to(acc), "u1", "w1"), (u2.to(acc), w2.to(acc), "u2", "w2")]
    if _validate.checks_values(u1):
        for name, x in named:
            if not torch.isfinite(x).all():
                raise ValueError(f"{name} has non-finite entries (NaN or inf); expected finite values")
        tol = 8 * u1.shape[-1] ** 0.5 * torch.finfo(acc).eps
        for u, w, nu, nw in planes:
            for name, x in ((nu, u), (nw, w)):
                if (x.abs().amax(-1) == 0).any():
                    raise ValueError(f"{name} has a zero vector; expected each of {nu}, {nw} non-zero "
                                     f"(span({nu}, {nw}) must be a plane)")
            ws = w / w.abs().amax(-1, keepdim=True)             # scale-free: sin of the angle
            us = u / u.abs().amax(-1, keepdim=True)
            sin = _orthogonal_part(us, ws)[1].norm(dim=-1) / ws.norm(dim=-1)
            if (sin <= tol).any():
                raise ValueError(f"{nw} is parallel to {nu} (sin of their angle {sin.min().item():.1e} <= "
                                 f"{tol:.1e}); expected span({nu}, {nw}) to be a plane")
    q1, q2 = (torch.linalg.qr(torch.stack([u, w], dim=-1)).Q for u, w, _, _ in planes)   # [..., r, 2]
    m = q1.transpose(-1, -2) @ q2
    cos = torch.linalg.svdvals(m)                                           # descending
    sin = torch.linalg.svdvals(q2 - q1 @ m).flip(-1)                        # ascending
    return torch.atan2(sin, cos)


# ---------------------------------------------------------------------------------------------
# The layer's features: reference
# ---------------------------------------------------------------------------------------------

def _check_offsets(offsets) -> tuple[int, ...]:
    if isinstance(offsets, int) or not isinstance(offsets, Sequence) or isinstance(offsets, str):
        raise TypeError(f"offsets must be a sequence of positive ints; got {offsets!r}")
    offsets = tuple(offsets)
    if not offsets:
        raise ValueError("offsets is empty; expected at least one positive int (e.g. (1, 2, 4, 8, 12, 16))")
    offsets = tuple(_validate.check_int(f"offsets[{k}]", o, lo=1, hi=MAX_OFFSET,
                                        why=" (offsets are distinct positive ints; 0 would pair a token with "
                                        "itself, a degenerate plane; positions are int32 in the kernel)")
                    for k, o in enumerate(offsets))
    if len(set(offsets)) != len(offsets):
        raise ValueError(f"offsets has repeated values: {offsets!r}; expected distinct positive ints")
    return offsets


def _check_z(z) -> torch.Tensor:
    _validate.check_tensor("z", z, ndim=3)
    if z.shape[-1] < 2:
        raise ValueError(f"z has shape {tuple(z.shape)}; expected [B, T, r] with r >= 2")
    return z


def _check_norm_floor(norm_floor) -> float:
    return _validate.check_positive("norm_floor", norm_floor)


def _partner(z: torch.Tensor, delta: int, pairing: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z_{t-delta}, valid)`` (or ``z_{t+delta}`` under the paper's pairing), zero where invalid."""
    T = z.shape[1]
    shift = min(delta, T)
    pad = z.new_zeros(z.shape[0], shift, z.shape[2])
    valid = torch.zeros(T, dtype=torch.bool, device=z.device)
    if pairing == "causal":                                   # row t holds z_{t-delta}
        other = torch.cat([pad, z[:, :T - shift]], dim=1)
        valid[shift:] = True
    else:                                                     # row t holds z_{t+delta}: the future
        other = torch.cat([z[:, shift:], pad], dim=1)
        valid[:T - shift] = True
    return other, valid


def _unit_scale(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z_s, s)``: each token times ``s_t = 2^-e_t`` (exact), ``e_t`` the binary exponent of
    ``max_i |z_t,i|``, so that ``max_i |z_s,i|`` lies in ``[0.5, 1)``. ``s`` carries no gradient: it is
    piecewise constant, and ``dz = s dz_s``."""
    e = torch.frexp(z.detach().abs().amax(-1)).exponent
    e = e.clamp_min(math.frexp(torch.finfo(z.dtype).tiny)[1])      # subnormal tokens: s stays finite
    s = torch.ldexp(torch.ones(e.shape, dtype=z.dtype, device=z.device), -e)
    return z * s[..., None], s


def _threshold(norm_floor: float, s_u: torch.Tensor, s_w: torch.Tensor) -> torch.Tensor:
    """``norm_floor`` in the rescaled units of a pair, ``norm_floor s_u s_w``, floored at the smallest normal number
    so that it is never 0 (a zero pair then gives ``0 / floor = 0``, not ``0 / 0``)."""
    return (norm_floor * s_u * s_w).clamp_min(torch.finfo(s_u.dtype).tiny)


def _safe_norm(n2: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
    """``max(sqrt(n2), floor)`` with a finite gradient where ``n2 = 0`` (the floor holds there)."""
    big = n2.detach().sqrt() > floor
    return torch.where(big, torch.where(big, n2, torch.ones_like(n2)).sqrt(), floor)


def plucker_features(z: torch.Tensor, offsets: Sequence[int] = DEFAULT_OFFSETS, *, norm_floor: float = 1e-6,
                     pairing: str = "causal", backend: str = "auto") -> torch.Tensor:
    """Normalised Plücker coordinates of ``span(z_t, z_{t-delta})`` for each offset.

        p_hat[b, t, k] = p(z_t, z_{t-delta_k}) / max(||p||, norm_floor),   zero where t - delta_k < 0.

    A zero or repeated vector gives ``p = 0`` and so a zero row (no NaN). Offsets ``>= T`` are valid
    arguments: they pair nothing and their rows are all zero.

    Args:
        z: ``[B, T, r]``, ``r >= 2``.  offsets: distinct positive ints.  norm_floor: > 0.
        pairing: ``"causal"`` (``z_{t-delta}``, the default and the only causal choice) or
            ``"paper"`` (``z_{t+delta}`` as printed in the paper: reads the future; for the
            demonstration of the leak only).
        backend: ``"auto"``/``"torch"`` -- the reference. This function *returns* the
            ``[B, T, |W|, C(r,2)]`` tensor that the fused kernel exists to avoid storing, so it has no
            kernel: the kernel is :func:`plucker_projection`'s, and ``"triton"`` here is an error.

    Returns: ``[B, T, len(offsets), r (r - 1) / 2]`` in ``z``'s dtype (computed in float32/64).
    """
    _check_z(z)
    offsets = _check_offsets(offsets)
    norm_floor = _check_norm_floor(norm_floor)
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}; got {pairing!r}")
    choose_backend(backend, z, why_not="plucker_features returns the unprojected [B, T, |W|, C(r,2)] "
                   "tensor, which only the reference builds; the fused kernel is plucker_projection's")
    zs, s = _unit_scale(z.to(acc_dtype(z.dtype)))
    feats = []
    for delta in offsets:
        other, valid = _partner(zs, delta, pairing)
        s_other = _partner(s[..., None], delta, pairing)[0][..., 0]
        p = plucker(zs, other)                                   # [B, T, C], = s_t s_{t-delta} p(z_t, z_{t-delta})
        # p / max(||p||, norm_floor) in the rescaled units; the norm's gradient is 0 where p = 0
        p = p / torch.maximum(p.norm(dim=-1), _threshold(norm_floor, s, s_other))[..., None]
        feats.append(torch.where(valid[None, :, None], p, 0.0))      # not p * valid: NaN * 0 is NaN
    return torch.stack(feats, dim=2).to(z.dtype)


def valid_counts(T: int, offsets: Sequence[int], *, pairing: str = "causal", device=None) -> torch.Tensor:
    """``K_t``: how many offsets pair position ``t`` with a token inside the sequence. ``[T]`` long."""
    t = torch.arange(T, device=device)
    offs = torch.tensor(offsets, device=device)
    ok = (t[:, None] - offs[None, :] >= 0) if pairing == "causal" else (t[:, None] + offs[None, :] < T)
    return ok.sum(1)


def plucker_projection_reference(z: torch.Tensor, weight: torch.Tensor, offsets: Sequence[int], *,
                                 norm_floor: float = 1e-6, pairing: str = "causal") -> torch.Tensor:
    """The definition: ``g_t = W mean_{valid delta} p_hat(z_t, z_{t-delta})`` (no bias).

    ``z: [B, T, r]``, ``weight: [d, C(r,2)]`` -> ``g: [B, T, d]``; ``g_t = 0`` where no offset is valid.
    Builds the ``[B, T, |W|, C]`` tensor: this is the form that reads like the equation.
    """
    feats = plucker_features(z, offsets, norm_floor=norm_floor, pairing=pairing, backend="torch")
    K = valid_counts(z.shape[1], offsets, pairing=pairing, device=z.device).clamp_min(1)
    mean = feats.sum(2) / K[None, :, None].to(feats.dtype)                  # [B, T, C]
    return mean @ weight.to(mean.dtype).T


def plucker_projection_collapsed(z: torch.Tensor, weight: torch.Tensor, offsets: Sequence[int], *,
                                 norm_floor: float = 1e-6, pairing: str = "causal") -> torch.Tensor:
    """The same ``g`` as :func:`plucker_projection_reference`, in the kernel's order: ``p(u, .)`` is
    linear and ``p(u, w) = p(u, w_perp)``, so the average of the offsets' normalised coordinates is one
    Plücker vector,

        mean_delta p(z_t, z_{t-delta}) / n_delta = p(z_t, w_hat_t),
        w_hat_t = sum_delta valid / (K_t max(n_delta, norm_floor)) w_perp_delta,
        w_perp_delta = z_{t-delta} - (z_t . z_{t-delta} / ||z_t||^2) z_t,   n_delta = ||z_t|| ||w_perp_delta||,

    and one projection follows. Never builds ``[B, T, |W|, C]``: ``O(T (|W| r + C d))`` work. Summing
    the orthogonal parts (not the partners themselves) keeps every term's size at most
    ``1 / (K_t ||z_t||)``: a degenerate pair's ``1 / norm_floor`` coefficient multiplies a vector that is
    (near) zero instead of one parallel to ``z_t``, whose cancellation in ``p(z_t, .)`` would be lost
    to rounding. Tokens are rescaled first (see the module's notes on numerics).
    """
    acc = acc_dtype(z.dtype)
    u, s = _unit_scale(z.to(acc))
    counts = valid_counts(z.shape[1], offsets, pairing=pairing, device=z.device)
    K = counts.clamp_min(1).to(acc)
    uu = u.square().sum(-1)
    w_hat = torch.zeros_like(u)
    for delta in offsets:
        w, valid = _partner(u, delta, pairing)
        s_w = _partner(s[..., None], delta, pairing)[0][..., 0]
        _, v = _orthogonal_part(u, w, uu)
        n = _safe_norm(uu * v.square().sum(-1), _threshold(norm_floor, s, s_w))     # max(||p||, norm_floor), rescaled
        # an invalid offset adds exactly 0, even when z_t is not finite (a product with 0 would not)
        w_hat = w_hat + torch.where(valid[None, :, None], v / (K[None, :] * n)[..., None], 0.0)
    # g_t = 0 where no offset is valid, even when z_t is not finite (p(z_t, 0) would be NaN then)
    return torch.where(counts[None, :, None] > 0, plucker(u, w_hat) @ weight.to(acc).T, 0.0)


def antisymmetric_weight(weight: torch.Tensor, r: int) -> torch.Tensor:
    """``W [d, C(r,2)] -> Wa [r, r, d]`` with ``Wa[i, j] = W[:, c(i,j)]``, ``Wa[j, i] = -W[:, c(i,j)]``
    (``i < j``), zero diagonal, so that ``W p(u, w) = sum_ij u_i w_j Wa[i, j]``. Differentiable."""
    i, j = pair_indices(r, weight.device)
    wa = weight.new_zeros(r, r, weight.shape[0])
    wa = wa.index_put((i, j), weight.T).index_put((j, i), -weight.T)
    return wa


# ---------------------------------------------------------------------------------------------
# Triton path: the fused forward and backward kernels (kernels/grassmann/plucker_fused.py)
# ---------------------------------------------------------------------------------------------

class _TritonGrassmann(torch.autograd.Function):
    """``g [B, T, d]`` for ``z [B, T, r]`` and the antisymmetric weight ``wa [r, r, d]``, differentiable in
    both. The tokens are rescaled here, not in the kernels' package, so that the one scaling rule
    (:func:`_unit_scale`) serves the references and the kernels alike; the rescaled tokens, their scales
    and the kernel's ``w_hat`` are saved for the backward pass."""

    @staticmethod
    def forward(ctx, z, wa, offsets, norm_floor):
        from .kernels.grassmann import plucker_fused_forward
        zs, s = _unit_scale(z.detach().float())
        zs, s = zs.contiguous(), s.contiguous()
        g, what = plucker_fused_forward(zs, s, wa, offsets, norm_floor, z.dtype)
        ctx.save_for_backward(zs, s, wa, offsets, what)
        ctx.norm_floor, ctx.z_dtype = norm_floor, z.dtype
        return g

    @staticmethod
    def backward(ctx, dg):
        from .kernels.grassmann import plucker_fused_backward
        zs, s, wa, offsets, what = ctx.saved_tensors
        dz, dwa = plucker_fused_backward(zs, s, wa, offsets, ctx.norm_floor, what, dg.to(ctx.z_dtype))
        return dz.to(ctx.z_dtype), dwa.to(wa.dtype), None, None


def _why_not_kernel(z: torch.Tensor, weight: torch.Tensor, pairing: str) -> str | None:
    if pairing != "causal":
        return "the kernel implements the causal pairing z_{t-delta} only"
    if z.shape[-1] > 64:
        return f"the kernel takes reduced_dim r up to 64; got r={z.shape[-1]}"
    if weight.shape[0] > 4096:
        return f"the kernel takes a model width up to 4096; got {weight.shape[0]}"
    return None


def plucker_projection(z: torch.Tensor, weight: torch.Tensor, offsets: Sequence[int] = DEFAULT_OFFSETS, *,
                       norm_floor: float = 1e-6, pairing: str = "causal", mode: str = "collapsed",
                       backend: str = "auto") -> torch.Tensor:
    """The Grassmann layer's mixing signal before its bias: the average over valid offsets of the
    projected, normalised Plücker coordinates,

        g_t = (1 / K_t) sum_{delta: t - delta >= 0}  W p(z_t, z_{t-delta}) / max(||p||, norm_floor),

    ``g_t = 0`` where no offset is valid (``K_t = 0``, e.g. ``t = 0``).

    Args:
        z: ``[B, T, r]`` (2 <= r).  weight: ``[d, C(r,2)]``, same dtype and device.
        offsets: distinct positive ints (any size; offsets ``>= T`` contribute nothing).
        norm_floor: > 0.  pairing: ``"causal"`` or ``"paper"`` (reference only).
        mode: which PyTorch reference runs when the kernel does not: ``"collapsed"`` (the default, as
            :class:`CausalGrassmannMixing`'s: the kernel's algorithm, one Plücker vector per token) or
            ``"features"`` (the equation: builds every offset's coordinates; same answer, ``|W|`` times
            the memory).
        backend: ``"auto"`` (the fused Triton kernel on CUDA when it applies: causal pairing,
            r <= 64, d <= 4096; the reference otherwise), ``"torch"``, ``"triton"``.

    Returns: ``[B, T, d]`` in ``z``'s dtype.
    """
    _check_z(z)
    offsets = _check_offsets(offsets)
    norm_floor = _check_norm_floor(norm_floor)
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}; got {pairing!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    _validate.check_tensor("weight", weight, ndim=2)
    _validate.check_same_device_dtype([("z", z), ("weight", weight)])
    r = z.shape[-1]
    if weight.shape[1] != n_pairs(r):
        raise ValueError(f"weight has shape {tuple(weight.shape)}; expected [d, C({r}, 2) = {n_pairs(r)}]")
    if choose_backend(backend, z, why_not=_why_not_kernel(z, weight, pairing)) == "triton":
        offs = torch.tensor(offsets, dtype=torch.int32, device=z.device)
        return _TritonGrassmann.apply(z.contiguous(), antisymmetric_weight(weight, r).contiguous(), offs, norm_floor)
    ref = plucker_projection_collapsed if mode == "collapsed" else plucker_projection_reference
    return ref(z, weight, offsets, norm_floor=norm_floor, pairing=pairing).to(z.dtype)


# ---------------------------------------------------------------------------------------------
# The layer
# ---------------------------------------------------------------------------------------------

def receptive_field(offsets: Sequence[int], depth: int) -> int:
    """How far back ``depth`` stacked causal Grassmann layers can see: ``max(offsets) * depth``."""
    depth = _validate.check_int("depth", depth, lo=0, why=" (a number of stacked layers)")
    return max(_check_offsets(offsets)) * depth


class CausalGrassmannMixing(nn.Module):
    """The causal Grassmann mixing layer, ``[B, T, d_model] -> [B, T, d_model]``.

    ``norm="post"`` (as published):

        z = W_red h + b;   g = b_plu + plucker_projection(z, W_plu)   (b_plu only where K_t > 0)
        alpha = sigmoid(W_gate [h; g] + b_gate);   out = LayerNorm(alpha h + (1 - alpha) g)

    ``norm="pre"`` (our pre-norm variant; the reproductions' code for theirs was not available):
    ``x = LayerNorm(h)``, the same ``g`` and ``alpha`` computed from ``x``, and
    ``out = h + alpha x + (1 - alpha) g`` -- the gated mix enters a plain residual stream.

    Args: d_model >= 1; reduced_dim r >= 2 (``C(r,2)`` coordinates); offsets: distinct positive
    ints; norm_floor > 0; pairing ``"causal"`` (or ``"paper"``: reads the future, for demonstrations);
    mode and backend for :func:`plucker_projection` (the default ``"collapsed"`` reference is the
    kernel's algorithm in PyTorch: same output, no ``[B, T, |W|, C]`` tensor).
    """

    def __init__(self, d_model: int, reduced_dim: int = 32, offsets: Sequence[int] = DEFAULT_OFFSETS,
                 norm: str = "post", *, norm_floor: float = 1e-6, pairing: str = "causal", mode: str = "collapsed",
                 backend: str = "auto"):
        super().__init__()
        d_model = _validate.check_int("d_model", d_model, lo=1)
        reduced_dim = _validate.check_int("reduced_dim", reduced_dim, lo=2, why=" (a plane needs two dimensions)")
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}; got {norm!r}")
        if pairing not in PAIRINGS:
            raise ValueError(f"pairing must be one of {PAIRINGS}; got {pairing!r}")
        self.d_model, self.reduced_dim, self.norm_kind = d_model, reduced_dim, norm
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
        self.offsets, self.pairing, self.backend = _check_offsets(offsets), pairing, backend
        self.norm_floor = _check_norm_floor(norm_floor)
        self.mode = mode
        self.reduce = nn.Linear(d_model, reduced_dim)
        self.plu = nn.Linear(n_pairs(reduced_dim), d_model)
        self.gate = nn.Linear(2 * d_model, d_model)
        self.norm = nn.LayerNorm(d_model)

    def mixing_signal(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(z [B, T, r], g [B, T, d])`` for the layer's input ``x``."""
        z = self.reduce(x)
        g = plucker_projection(z, self.plu.weight, self.offsets, norm_floor=self.norm_floor, pairing=self.pairing,
                               mode=self.mode, backend=self.backend)
        K = valid_counts(x.shape[1], self.offsets, pairing=self.pairing, device=x.device)
        g = g + self.plu.bias * (K > 0)[:, None].to(g.dtype)
        return z, g

    def gate_value(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate(torch.cat([x, g], dim=-1)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        _validate.check_tensor("h", h, ndim=3)
        if h.shape[-1] != self.d_model:
            raise ValueError(f"h has shape {tuple(h.shape)}; expected [B, T, d_model={self.d_model}]")
        param = self.reduce.weight
        if h.dtype != param.dtype:
            raise TypeError(f"h has dtype {str(h.dtype).replace('torch.', '')}; expected "
                            f"{str(param.dtype).replace('torch.', '')}, the dtype of the layer's parameters "
                            "(convert one: layer.to(h.dtype) or h.to(...))")
        if h.device != param.device:
            raise ValueError(f"h is on {h.device}; expected {param.device}, where the layer's parameters are")
        x = self.norm(h) if self.norm_kind == "pre" else h
        _, g = self.mixing_signal(x)
        alpha = self.gate_value(x, g)
        mixed = alpha * x + (1 - alpha) * g
        return h + mixed if self.norm_kind == "pre" else self.norm(mixed)


__all__ = ["plucker", "plucker_relations", "principal_angles", "plucker_features", "plucker_projection",
           "plucker_projection_reference", "plucker_projection_collapsed", "CausalGrassmannMixing", "valid_counts",
           "antisymmetric_weight",
           "n_pairs", "pair_indices", "receptive_field"]
