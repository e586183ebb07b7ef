"""Fused Grassmann mixing in Triton: pairing, Plücker products, normalisation, the average over
offsets and the projection to the model width, forward and backward, without ever storing the
``[B, L, |W|, C(r,2)]`` tensor of coordinates.

What it computes (``attnlib.grassmann.plucker_projection`` without the bias):

    g_t = (1 / K_t) sum_{delta valid at t} W p(z_t, z_{t-delta}) / max(||p||, eps)

Two identities make the fusion cheap. (1) The projection of a Plücker vector is a bilinear form,
``W p(u, w) = sum_ij u_i w_j Wa[i, j]`` with ``Wa [r, r, d]`` the antisymmetric expansion of
``W [d, C]`` (built in PyTorch, so its gradient flows back to ``W``). (2) ``p(u, .)`` is linear, so
with ``u = z_t`` shared by every offset the average collapses onto one partner vector,

    w_hat_t = sum_delta c_delta z_{t-delta},      c_delta = valid / (K_t max(||p_delta||, eps)),
    g_t     = sum_i u_i (w_hat_t @ Wa[i]),

and ``||p||^2 = ||u||^2 ||w||^2 - (u . w)^2`` (Lagrange) gives each offset's norm from three dot
products. Per token: ``O(|W| r)`` for the pairing and norms plus ``2 r^2 d`` for the projection,
instead of ``O(|W| r^2 d)`` for projecting every offset. (Lagrange's form loses relative accuracy
when ``u`` and ``w`` are nearly parallel -- about ``eps_machine / sin^2`` of their angle -- where
the normalised direction is ill-conditioned anyway.)

Tiling.

* ``_fwd_kernel``, grid ``(cdiv(L, BLOCK_T), cdiv(d, BLOCK_D), B)``: a program owns ``BLOCK_T``
  positions and ``BLOCK_D`` output columns. It loads ``u = z_t`` as a ``[BLOCK_T, BLOCK_R]`` tile,
  loops over the offsets loading the partner tile ``z_{t-delta}`` (masked to zero where
  ``t - delta < 0``), accumulates ``w_hat`` in registers, then loops over ``i < r``: one
  ``[BLOCK_T, BLOCK_R] x [BLOCK_R, BLOCK_D]`` dot with ``Wa[i]``, scaled by the column ``u_i``.
  Written back: ``g`` tile, and ``w_hat`` (``[B, L, r]`` float32, by the ``d``-block 0 programs),
  saved for the backward pass. Nothing of size ``|W| C`` exists, not even in registers.
* ``_bwd_partner_kernel``, grid ``(cdiv(L, BLOCK_T), B)``: from ``dg`` (looping over ``d`` in
  ``BLOCK_D`` slices and over ``i``) the gradients of the bilinear form: ``dw_hat_t`` and the direct
  part of ``du_t``; both ``[B, L, r]`` float32.
* ``_bwd_z_kernel``, grid ``(cdiv(L, BLOCK_T), B)``: ``dz_s`` gathered, without atomics, from the
  two roles ``z_s`` plays -- as ``u`` at ``t = s`` and as the partner of ``t = s + delta`` -- by
  recomputing each pair's norm and coefficient (``O(|W| r)`` per token).
* ``_bwd_weight_kernel``, grid ``(r, cdiv(d, BLOCK_D), SPLIT)``: ``dWa[i] = sum_t u_{t,i} w_hat_t^T dg_t``,
  one ``[BLOCK_R, BLOCK_D]`` accumulator per program over a contiguous share of the ``B L`` rows;
  the ``SPLIT`` partial sums are added in PyTorch (deterministic, no atomics).

All arithmetic is float32 whatever the input dtype; fp32 inputs use IEEE products (no tf32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.launch import require_launchable


@triton.jit
def _load_rows(zb, rows, rmask_t, offs_r, R, stride_zt, stride_zr):
    """Rows ``z[rows, :R]`` as a float32 ``[BLOCK_T, BLOCK_R]`` tile, zero where masked."""
    ptr = zb + rows[:, None] * stride_zt + offs_r[None, :] * stride_zr
    return tl.load(ptr, mask=rmask_t[:, None] & (offs_r[None, :] < R), other=0.0).to(tl.float32)


@triton.jit
def _positions(Z, stride_zb, b, L, R, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr):
    """``(t, tmask, offs_r, rmask, zb, base, m2)`` of a program that owns ``BLOCK_T`` positions (grid axis 0)
    of batch ``b``: the positions and ``t < L``, the ``r`` offsets and ``< R``, batch ``b`` of ``z``, and
    the offsets and mask of these rows in a contiguous ``[B, L, r]`` float32 buffer (``w_hat`` and its kin)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < L
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < R
    return (t, tmask, offs_r, rmask, Z + b * stride_zb, b * L * R + t[:, None] * R + offs_r[None, :],
            tmask[:, None] & rmask[None, :])


@triton.jit
def _load_coordinate(zb, t, tmask, i, stride_zt, stride_zr):
    """The column ``u_i = z[t, i]``, float32 ``[BLOCK_T]`` (0 past ``L``)."""
    return tl.load(zb + t * stride_zt + i * stride_zr, mask=tmask, other=0.0).to(tl.float32)


@triton.jit
def _pair(zb, rows, valid, offs_r, R, stride_zt, stride_zr, u, uu):
    """Pair ``u`` (with ``uu = ||u||^2``) with the rows ``w = z[rows]`` (zero where not ``valid``): returns
    ``(w, ||w||^2, u . w, ||p(u, w)||^2)``, the last by Lagrange, ``||u||^2 ||w||^2 - (u . w)^2``, clamped at 0."""
    w = _load_rows(zb, rows, valid, offs_r, R, stride_zt, stride_zr)
    ww = tl.sum(w * w, axis=1)
    uw = tl.sum(u * w, axis=1)
    return w, ww, uw, tl.maximum(uu * ww - uw * uw, 0.0)


@triton.jit
def _coefficient_grad(valid, n2, k, dwhat, partner, eps):
    """For one offset: the coefficient ``c = valid / (K max(||p||, eps))`` and ``f``, twice the derivative
    of the loss through ``c`` with respect to ``||p||^2`` (zero where the ``eps`` floor holds), given the
    gradient ``dwhat`` of the partner sum it weights and the ``partner`` row it multiplies."""
    n = tl.sqrt(n2)
    big = valid & (n > eps)
    c = tl.where(valid, 1.0 / (k * tl.maximum(n, eps)), 0.0)
    dc = tl.sum(dwhat * partner, axis=1)
    return c, tl.where(big, -c * dc / tl.where(big, n2, 1.0), 0.0)             # d/d(n^2) times 2


@triton.jit
def _count_valid(t, OFF, NW):
    """``K_t``: the number of offsets with ``t - delta >= 0`` (float32, per row)."""
    cnt = tl.zeros(t.shape, dtype=tl.float32)
    for k in range(NW):
        delta = tl.load(OFF + k)
        cnt += ((t - delta) >= 0).to(tl.float32)
    return cnt


@triton.jit
def _fwd_kernel(Z, WA, OFF, G, WHAT,
                stride_zb, stride_zt, stride_zr, stride_gb, stride_gt, stride_gd,
                L, R, D, NW, eps,
                BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                PRECISION: tl.constexpr):
    pid_d = tl.program_id(1)
    b = tl.program_id(2)
    t, tmask, offs_r, rmask, zb, base, m2 = _positions(Z, stride_zb, b, L, R, BLOCK_T, BLOCK_R)
    offs_e = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    emask = offs_e < D

    u = _load_rows(zb, t, tmask, offs_r, R, stride_zt, stride_zr)          # [BLOCK_T, BLOCK_R]
    uu = tl.sum(u * u, axis=1)
    what = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k in range(NW):
        delta = tl.load(OFF + k)
        s = t - delta
        valid = tmask & (s >= 0)
        w, _, _, n2 = _pair(zb, s, valid, offs_r, R, stride_zt, stride_zr, u, uu)
        n = tl.sqrt(n2)                                                     # ||p(u, w)||, Lagrange
        c = tl.where(valid, 1.0 / tl.maximum(n, eps), 0.0)
        what += c[:, None] * w
        cnt += valid.to(tl.float32)
    what = what / tl.maximum(cnt, 1.0)[:, None]
    if pid_d == 0:
        tl.store(WHAT + base, what, mask=m2)

    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for i in range(R):
        ui = _load_coordinate(zb, t, tmask, i, stride_zt, stride_zr)
        wa = tl.load(WA + i * R * D + offs_r[:, None] * D + offs_e[None, :],
                     mask=rmask[:, None] & emask[None, :], other=0.0).to(tl.float32)   # Wa[i] slice
        acc += ui[:, None] * tl.dot(what, wa, input_precision=PRECISION)
    gptr = G + b * stride_gb + t[:, None] * stride_gt + offs_e[None, :] * stride_gd
    tl.store(gptr, acc.to(G.dtype.element_ty), mask=tmask[:, None] & emask[None, :])


@triton.jit
def _bwd_partner_kernel(Z, WA, WHAT, DG, DWHAT, DU,
                        stride_zb, stride_zt, stride_zr, stride_gb, stride_gt, stride_gd,
                        L, R, D,
                        BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                        PRECISION: tl.constexpr):
    """dw_hat_t = sum_i u_i (dg_t @ Wa[i]^T);  du_t[i] (direct) = w_hat_t . (dg_t @ Wa[i]^T)."""
    b = tl.program_id(1)
    t, tmask, offs_r, rmask, zb, base, m2 = _positions(Z, stride_zb, b, L, R, BLOCK_T, BLOCK_R)
    what = tl.load(WHAT + base, mask=m2, other=0.0)
    dwhat = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    du = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    for e0 in range(0, D, BLOCK_D):
        offs_e = e0 + tl.arange(0, BLOCK_D)
        emask = offs_e < D
        dg = tl.load(DG + b * stride_gb + t[:, None] * stride_gt + offs_e[None, :] * stride_gd,
                     mask=tmask[:, None] & emask[None, :], other=0.0).to(tl.float32)   # [BLOCK_T, BLOCK_D]
        for i in range(R):
            ui = _load_coordinate(zb, t, tmask, i, stride_zt, stride_zr)
            wa_t = tl.load(WA + i * R * D + offs_r[None, :] * D + offs_e[:, None],
                           mask=rmask[None, :] & emask[:, None], other=0.0).to(tl.float32)  # [BLOCK_D, BLOCK_R]
            y = tl.dot(dg, wa_t, input_precision=PRECISION)                  # [BLOCK_T, BLOCK_R]
            dwhat += ui[:, None] * y
            dui = tl.sum(what * y, axis=1)
            du += tl.where(offs_r[None, :] == i, dui[:, None], 0.0)
    tl.store(DWHAT + base, dwhat, mask=m2)
    tl.store(DU + base, du, mask=m2)


@triton.jit
def _bwd_z_kernel(Z, OFF, DWHAT, DU, DZ,
                  stride_zb, stride_zt, stride_zr,
                  L, R, NW, eps,
                  BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr):
    """dz_s = du_s (direct) + [z_s as u: through the norms at t = s]
                            + [z_s as partner of t = s + delta: coefficient and norm]."""
    b = tl.program_id(1)
    s, smask, offs_r, rmask, zb, base, m2 = _positions(Z, stride_zb, b, L, R, BLOCK_T, BLOCK_R)

    x = _load_rows(zb, s, smask, offs_r, R, stride_zt, stride_zr)          # z_s
    xx = tl.sum(x * x, axis=1)
    dz = tl.load(DU + base, mask=m2, other=0.0)
    dwhat_s = tl.load(DWHAT + base, mask=m2, other=0.0)
    k_s = tl.maximum(_count_valid(s, OFF, NW), 1.0)
    for k in range(NW):
        delta = tl.load(OFF + k)
        # role 1: z_s is u, paired with w = z_{s-delta}
        p = s - delta
        valid = smask & (p >= 0)
        w, ww, uw, n2 = _pair(zb, p, valid, offs_r, R, stride_zt, stride_zr, x, xx)
        _, f = _coefficient_grad(valid, n2, k_s, dwhat_s, w, eps)
        dz += f[:, None] * (ww[:, None] * x - uw[:, None] * w)
        # role 2: z_s is the partner w of u = z_{s+delta}
        t = s + delta
        valid2 = smask & (t < L)
        u, uu, ux, n2b = _pair(zb, t, valid2, offs_r, R, stride_zt, stride_zr, x, xx)
        m2b = valid2[:, None] & rmask[None, :]
        dwhat_t = tl.load(DWHAT + b * L * R + t[:, None] * R + offs_r[None, :], mask=m2b, other=0.0)
        k_t = tl.maximum(_count_valid(t, OFF, NW), 1.0)
        cb, fb = _coefficient_grad(valid2, n2b, k_t, dwhat_t, x, eps)
        dz += cb[:, None] * dwhat_t + fb[:, None] * (uu[:, None] * x - ux[:, None] * u)
    tl.store(DZ + base, dz, mask=m2)


@triton.jit
def _bwd_weight_kernel(Z, WHAT, DG, DWA,
                       stride_zn, stride_zr, stride_gn, stride_gd,
                       N, R, D, ROWS_PER_SPLIT,
                       BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                       PRECISION: tl.constexpr):
    """Partial dWa[split, i, :, e-block] = sum over this split's rows n of u_{n,i} w_hat_n^T dg_n."""
    i = tl.program_id(0)
    pid_d = tl.program_id(1)
    split = tl.program_id(2)
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < R
    offs_e = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    emask = offs_e < D
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    start = split * ROWS_PER_SPLIT
    for n0 in range(start, start + ROWS_PER_SPLIT, BLOCK_T):
        rows = n0 + tl.arange(0, BLOCK_T)
        nmask = (rows < N) & (rows < start + ROWS_PER_SPLIT)
        ui = tl.load(Z + rows * stride_zn + i * stride_zr, mask=nmask, other=0.0).to(tl.float32)
        what = tl.load(WHAT + rows[:, None] * R + offs_r[None, :], mask=nmask[:, None] & rmask[None, :],
                       other=0.0)
        dg = tl.load(DG + rows[:, None] * stride_gn + offs_e[None, :] * stride_gd,
                     mask=nmask[:, None] & emask[None, :], other=0.0).to(tl.float32)
        acc += tl.dot(tl.trans(ui[:, None] * what), dg, input_precision=PRECISION)
    ptr = DWA + split * R * R * D + i * R * D + offs_r[:, None] * D + offs_e[None, :]
    tl.store(ptr, acc, mask=rmask[:, None] & emask[None, :])


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

BLOCK_T = 16          # positions per program (>= 16: the smallest tl.dot tile on a GPU)


def _blocks(R: int, D: int) -> tuple[int, int]:
    block_r = max(16, triton.next_power_of_2(R))
    block_d = min(64, max(16, triton.next_power_of_2(D)))
    return block_r, block_d


def grassmann_fwd(z: torch.Tensor, wa: torch.Tensor, offsets: torch.Tensor, eps: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``z [B, L, r]``, ``wa [r, r, d]`` (contiguous), ``offsets`` int32 on z's device.
    Returns ``(g [B, L, d] in z's dtype, w_hat [B, L, r] float32)``."""
    require_launchable(z)
    B, L, R = z.shape
    D = wa.shape[-1]
    g = torch.empty(B, L, D, device=z.device, dtype=z.dtype)
    what = torch.empty(B, L, R, device=z.device, dtype=torch.float32)
    if B * L == 0 or D == 0:
        return g.zero_(), what.zero_()
    block_r, block_d = _blocks(R, D)
    precision = "ieee" if z.dtype == torch.float32 else "tf32"
    grid = (triton.cdiv(L, BLOCK_T), triton.cdiv(D, block_d), B)
    _fwd_kernel[grid](z, wa, offsets, g, what, *z.stride(), *g.stride(), L, R, D, offsets.numel(),
                      float(eps), BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_D=block_d, PRECISION=precision)
    return g, what


def grassmann_bwd(z, wa, offsets, eps, what, dg) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients ``(dz [B, L, r] float32, dwa [r, r, d] float32)`` for ``dg [B, L, d]``."""
    B, L, R = z.shape
    D = wa.shape[-1]
    dg = dg.contiguous()
    if B * L == 0 or D == 0:
        return torch.zeros(B, L, R, device=z.device), torch.zeros(R, R, D, device=z.device)
    block_r, block_d = _blocks(R, D)
    precision = "ieee" if z.dtype == torch.float32 else "tf32"
    dwhat = torch.empty(B, L, R, device=z.device, dtype=torch.float32)
    du = torch.empty_like(dwhat)
    grid = (triton.cdiv(L, BLOCK_T), B)
    _bwd_partner_kernel[grid](z, wa, what, dg, dwhat, du, *z.stride(), *dg.stride(), L, R, D,
                              BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_D=block_d, PRECISION=precision)
    dz = torch.empty_like(dwhat)
    _bwd_z_kernel[grid](z, offsets, dwhat, du, dz, *z.stride(), L, R, offsets.numel(), float(eps),
                        BLOCK_T=BLOCK_T, BLOCK_R=block_r)
    N = B * L
    zf, gf = z.reshape(N, R), dg.reshape(N, D)
    split = max(1, min(64, triton.cdiv(N, 2048)))
    rows = triton.cdiv(triton.cdiv(N, split), BLOCK_T) * BLOCK_T
    split = triton.cdiv(N, rows)
    dwa = torch.empty(split, R, R, D, device=z.device, dtype=torch.float32)
    _bwd_weight_kernel[(R, triton.cdiv(D, block_d), split)](
        zf, what, gf, dwa, *zf.stride(), *gf.stride(), N, R, D, rows,
        BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_D=block_d, PRECISION=precision)
    return dz, dwa.sum(0)


class _FusedPluckerProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, wa, offsets, eps):
        g, what = grassmann_fwd(z, wa, offsets, eps)
        ctx.save_for_backward(z, wa, offsets, what)
        ctx.eps = eps
        return g

    @staticmethod
    def backward(ctx, dg):
        z, wa, offsets, what = ctx.saved_tensors
        dz, dwa = grassmann_bwd(z, wa, offsets, ctx.eps, what, dg)
        return dz.to(z.dtype), dwa.to(wa.dtype), None, None


def fused_plucker_projection(z: torch.Tensor, wa: torch.Tensor, offsets, eps: float) -> torch.Tensor:
    """``g [B, L, d]`` for ``z [B, L, r]`` and the antisymmetric weight ``wa [r, r, d]``; differentiable
    in both. Inputs validated by ``attnlib.grassmann.plucker_projection``."""
    offs = torch.tensor(list(offsets), dtype=torch.int32, device=z.device)
    return _FusedPluckerProjection.apply(z.contiguous(), wa.contiguous(), offs, float(eps))


__all__ = ["fused_plucker_projection", "grassmann_fwd", "grassmann_bwd"]
