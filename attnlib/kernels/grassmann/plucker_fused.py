"""Fused Grassmann mixing in Triton: pairing, Plücker products, normalisation, the average over
offsets and the projection to the model width, forward and backward, without ever storing the
``[B, T, |W|, C(r,2)]`` tensor of coordinates.

What it computes (``attnlib.grassmann.plucker_projection`` without the bias):

    g_t = (1 / K_t) sum_{delta valid at t} W p(z_t, z_{t-delta}) / max(||p||, eps)

Three identities make the fusion cheap and accurate. (1) The projection of a Plücker vector is a
bilinear form, ``W p(u, w) = sum_ij u_i w_j Wa[i, j]`` with ``Wa [r, r, d]`` the antisymmetric
expansion of ``W [d, C]`` (built in PyTorch, so its gradient flows back to ``W``). (2) ``p(u, w)``
depends on ``w`` only through its part orthogonal to ``u``, ``v = w - (u . w / ||u||^2) u``:
``p(u, w) = p(u, v)`` and ``||p|| = ||u|| ||v||``, an area without cancellation (Lagrange's
``||u||^2 ||w||^2 - (u . w)^2`` loses everything when ``w`` is nearly parallel to ``u``). (3) ``p(u, .)``
is linear, so with ``u = z_t`` shared by every offset the average collapses onto one partner vector,

    w_hat_t = sum_delta c_delta v_delta,      c_delta = valid / (K_t max(||u|| ||v_delta||, eps)),
    g_t     = sum_i u_i (w_hat_t @ Wa[i]).

Each term ``c v`` has norm at most ``1 / (K_t ||u||)``: a degenerate pair (a repeated token, an exact
multiple) has ``v`` = 0, and its ``1 / eps`` coefficient multiplies nothing. ``v`` is projected twice
(the second pass removes the ``~eps_machine / sin`` component along ``u`` the first leaves). Per token:
``O(|W| r)`` for the pairing and norms plus ``2 r^2 d`` for the projection, instead of ``O(|W| r^2 d)``.

Scale. The kernels take ``z_s = s z`` (``attnlib.grassmann._unit_scale`` rescales) with one power of
two ``s_t`` per token (exact) putting ``max_i |z_s,t,i|`` in ``[0.5, 1)``, and ``s``: the normalised
coordinates do not depend on
scale, only the ``eps`` comparison does, and it becomes ``||p_s|| > eps s_u s_w`` (floored at the
smallest normal float32, as the reference). Gradients come back as ``dz = s dz_s``. So ``|z| ~ 1e10`` is as
accurate as ``|z| ~ 1``.

Tiling.

* ``_plucker_fwd_kernel``, grid ``(cdiv(T, BLOCK_T), cdiv(d, BLOCK_D), B)``: a program owns ``BLOCK_T``
  positions and ``BLOCK_D`` output columns. It loads ``u = z_s,t`` as a ``[BLOCK_T, BLOCK_R]`` tile,
  loops over the offsets loading the partner tile ``z_s,t-delta`` (masked to zero where
  ``t - delta < 0``), accumulates ``w_hat`` in registers, then loops over ``i < r``: one
  ``[BLOCK_T, BLOCK_R] x [BLOCK_R, BLOCK_D]`` dot with ``Wa[i]``, scaled by the column ``u_i``.
  Written back: ``g`` tile, and ``w_hat`` (``[B, T, r]`` float32, by the ``d``-block 0 programs),
  saved for the backward pass. Nothing of size ``|W| C`` exists, not even in registers.
* ``_plucker_bwd_partner_kernel``, grid ``(cdiv(T, BLOCK_T), B)``: from ``dg`` (looping over ``d`` in
  ``BLOCK_D`` slices and over ``i``) the gradients of the bilinear form: ``dw_hat_t`` and the direct
  part of ``du_t``; both ``[B, T, r]`` float32.
* ``_plucker_bwd_z_kernel``, grid ``(cdiv(T, BLOCK_T), B)``: ``dz_s`` gathered, without atomics, from the
  two roles ``z_s`` plays -- as ``u`` at ``t = s`` and as the partner of ``t = s + delta`` -- by
  recomputing each pair's ``v``, norm and coefficient (``O(|W| r)`` per token).
* ``_plucker_bwd_weight_kernel``, grid ``(r, cdiv(d, BLOCK_D), SPLIT)``: ``dWa[i] = sum_t u_{t,i} w_hat_t^T dg_t``,
  one ``[BLOCK_R, BLOCK_D]`` accumulator per program over a contiguous share of the ``B T`` rows;
  the ``SPLIT`` partial sums are added in PyTorch (deterministic, no atomics).

Precision: the pairing, norms and accumulators are float32 whatever the input dtype; the matrix
products follow ``kernels/common/precision.py``: IEEE float32 for float32 inputs, 16-bit operands
(the input dtype) with float32 accumulation for float16/bfloat16 inputs. Every operand is bounded:
``|u_s| <= 1`` entrywise, ``||w_hat|| <= 2``, ``Wa`` and ``dg`` are inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.launch import require_launchable
from ..common.precision import dot, io_dtype

TINY = torch.finfo(torch.float32).tiny             # the floor of eps s_u s_w, as the reference's


@triton.jit
def _positions(b, T, R, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr):
    """``(t, tmask, offs_r, rmask, base, m2)`` of a program that owns ``BLOCK_T`` positions (grid axis 0)
    of batch ``b``: the positions and ``t < T``, the ``r`` offsets and ``< R``, and the offsets and mask
    of these rows in a contiguous ``[B, T, r]`` float32 buffer (``z_s``, ``w_hat`` and their kin)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    offs_r = tl.arange(0, BLOCK_R)
    rmask = offs_r < R
    return t, tmask, offs_r, rmask, b * T * R + t[:, None] * R + offs_r[None, :], tmask[:, None] & rmask[None, :]


@triton.jit
def _load_rows(buf, b, rows, valid, offs_r, T, R):
    """Rows ``buf[b, rows, :R]`` of a contiguous ``[B, T, R]`` float32 buffer, zero where not ``valid``."""
    ptr = buf + b * T * R + rows[:, None] * R + offs_r[None, :]
    return tl.load(ptr, mask=valid[:, None] & (offs_r[None, :] < R), other=0.0)


@triton.jit
def _orthogonal(u, uu, su, w, sw, eps, tiny):
    """For ``u`` (``uu = ||u||^2``, scale ``su``) and partners ``w`` (scales ``sw``), per row:
    ``(a, v, vv, n, big)`` -- ``v = w - a u`` orthogonal to ``u`` (projected twice), ``vv = ||v||^2``,
    ``n = max(||u|| ||v||, theta)`` with ``theta = max(eps su sw, tiny)`` (``eps`` in rescaled units),
    ``big``: whether the area exceeds ``theta`` (the norm, not the floor, is in ``n``)."""
    uus = tl.where(uu > 0, uu, 1.0)
    a = tl.sum(u * w, axis=1) / uus
    v = w - a[:, None] * u
    a2 = tl.sum(u * v, axis=1) / uus
    v = v - a2[:, None] * u
    vv = tl.sum(v * v, axis=1)
    area = tl.sqrt(uu * vv)
    theta = tl.maximum(eps * su * sw, tiny)
    big = area > theta
    return a + a2, v, vv, tl.where(big, area, theta), big


@triton.jit
def _dv(c, big, n, uu, v, dwhat):
    """Gradient of the loss with respect to one pair's ``v`` (through ``c v`` and through ``n``, where
    ``n`` is the area ``||u|| ||v||``): ``c = valid / (K n)`` gives ``dL/dn = -c (dwhat . v) / n``,
    and ``dn/dv = uu v / n``, ``dn/du = vv u / n``, so ``dv = c dwhat + qn uu (v / n)`` with
    ``qn = -c (dwhat . v / n)``: every factor is bounded (``|v / n| = 1 / ||u||``) and none is
    ``1 / n^2``, which overflows for a small area at large ``|z|`` (``eps s_u s_w`` tiny). The
    area's pull on ``u`` is ``qn (vv / n) u``; ``qn`` is returned for it."""
    vn = v / n[:, None]
    qn = tl.where(big, -c * tl.sum(dwhat * vn, axis=1), 0.0)
    return c[:, None] * dwhat + (qn * uu)[:, None] * vn, qn


@triton.jit
def _count_valid(t, OFF, NW):
    """``K_t``: the number of offsets with ``t - delta >= 0`` (float32, per row)."""
    cnt = tl.zeros(t.shape, dtype=tl.float32)
    for k in range(NW):
        delta = tl.load(OFF + k)
        cnt += ((t - delta) >= 0).to(tl.float32)
    return cnt


@triton.jit
def _plucker_fwd_kernel(ZS, S, WA, OFF, G, WHAT,
                stride_gb, stride_gt, stride_gd,
                T, R, D, NW, eps, tiny,
                BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, DT: tl.constexpr):
    pid_d = tl.program_id(1)
    b = tl.program_id(2)
    t, tmask, offs_r, rmask, base, m2 = _positions(b, T, R, BLOCK_T, BLOCK_R)
    offs_e = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    emask = offs_e < D

    u = _load_rows(ZS, b, t, tmask, offs_r, T, R)                          # [BLOCK_T, BLOCK_R]
    su = tl.load(S + b * T + t, mask=tmask, other=1.0)
    uu = tl.sum(u * u, axis=1)
    what = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k in range(NW):
        delta = tl.load(OFF + k)
        s = t - delta
        valid = tmask & (s >= 0)
        w = _load_rows(ZS, b, s, valid, offs_r, T, R)
        sw = tl.load(S + b * T + s, mask=valid, other=1.0)
        _, v, _, n, _ = _orthogonal(u, uu, su, w, sw, eps, tiny)
        what += tl.where(valid, 1.0 / n, 0.0)[:, None] * v
        cnt += valid.to(tl.float32)
    what = what / tl.maximum(cnt, 1.0)[:, None]
    if pid_d == 0:
        tl.store(WHAT + base, what, mask=m2)

    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for i in range(R):
        ui = tl.load(ZS + b * T * R + t * R + i, mask=tmask, other=0.0)
        wa = tl.load(WA + i * R * D + offs_r[:, None] * D + offs_e[None, :],
                     mask=rmask[:, None] & emask[None, :], other=0.0)      # Wa[i] slice
        acc += ui[:, None] * dot(what, wa, DT)
    gptr = G + b * stride_gb + t[:, None] * stride_gt + offs_e[None, :] * stride_gd
    tl.store(gptr, acc.to(G.dtype.element_ty), mask=tmask[:, None] & emask[None, :])


@triton.jit
def _plucker_bwd_partner_kernel(ZS, WA, WHAT, DG, DWHAT, DU,
                        stride_gb, stride_gt, stride_gd,
                        T, R, D,
                        BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                        DT: tl.constexpr):
    """dw_hat_t = sum_i u_i (dg_t @ Wa[i]^T);  du_t[i] (direct) = w_hat_t . (dg_t @ Wa[i]^T)."""
    b = tl.program_id(1)
    t, tmask, offs_r, rmask, base, m2 = _positions(b, T, R, BLOCK_T, BLOCK_R)
    what = tl.load(WHAT + base, mask=m2, other=0.0)
    dwhat = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    du = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
    for e0 in range(0, D, BLOCK_D):
        offs_e = e0 + tl.arange(0, BLOCK_D)
        emask = offs_e < D
        dg = tl.load(DG + b * stride_gb + t[:, None] * stride_gt + offs_e[None, :] * stride_gd,
                     mask=tmask[:, None] & emask[None, :], other=0.0)       # [BLOCK_T, BLOCK_D]
        for i in range(R):
            ui = tl.load(ZS + b * T * R + t * R + i, mask=tmask, other=0.0)
            wa_t = tl.load(WA + i * R * D + offs_r[None, :] * D + offs_e[:, None],
                           mask=rmask[None, :] & emask[:, None], other=0.0)  # [BLOCK_D, BLOCK_R]
            y = dot(dg, wa_t, DT)                                            # [BLOCK_T, BLOCK_R]
            dwhat += ui[:, None] * y
            dui = tl.sum(what * y, axis=1)
            du += tl.where(offs_r[None, :] == i, dui[:, None], 0.0)
    tl.store(DWHAT + base, dwhat, mask=m2)
    tl.store(DU + base, du, mask=m2)


@triton.jit
def _plucker_bwd_z_kernel(ZS, S, OFF, DWHAT, DU, DZ,
                  T, R, NW, eps, tiny,
                  BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr):
    """dz_s = du_s (direct) + [z_s as u at t = s: through each v and each norm]
                            + [z_s as the partner w of t = s + delta: through v = P_u w].

    With ``v = w - a u``, ``a = u . w / ||u||^2`` (``P_u`` the projection orthogonal to ``u``):
    ``dw = P_u dv`` and ``du = -a dv - (u . dv / ||u||^2) (w - 2 a u)``."""
    b = tl.program_id(1)
    s, smask, offs_r, rmask, base, m2 = _positions(b, T, R, BLOCK_T, BLOCK_R)

    x = _load_rows(ZS, b, s, smask, offs_r, T, R)                           # z_s (rescaled)
    sx = tl.load(S + b * T + s, mask=smask, other=1.0)
    xx = tl.sum(x * x, axis=1)
    xxs = tl.where(xx > 0, xx, 1.0)
    dz = tl.load(DU + base, mask=m2, other=0.0)
    dwhat_s = tl.load(DWHAT + base, mask=m2, other=0.0)
    k_s = tl.maximum(_count_valid(s, OFF, NW), 1.0)
    for k in range(NW):
        delta = tl.load(OFF + k)
        # role 1: z_s is u, paired with w = z_{s-delta}
        p = s - delta
        valid = smask & (p >= 0)
        w = _load_rows(ZS, b, p, valid, offs_r, T, R)
        sw = tl.load(S + b * T + p, mask=valid, other=1.0)
        a, v, vv, n, big = _orthogonal(x, xx, sx, w, sw, eps, tiny)
        c = tl.where(valid, 1.0 / (k_s * n), 0.0)
        dv, qn = _dv(c, big, n, xx, v, dwhat_s)
        xdv = tl.sum(x * dv, axis=1) / xxs
        dz += (qn * (vv / n))[:, None] * x - a[:, None] * dv - xdv[:, None] * (w - 2.0 * a[:, None] * x)
        # role 2: z_s is the partner w of u = z_{s+delta}
        t = s + delta
        valid2 = smask & (t < T)
        u = _load_rows(ZS, b, t, valid2, offs_r, T, R)
        su = tl.load(S + b * T + t, mask=valid2, other=1.0)
        uu = tl.sum(u * u, axis=1)
        _, v2, _, n2, big2 = _orthogonal(u, uu, su, x, sx, eps, tiny)
        dwhat_t = _load_rows(DWHAT, b, t, valid2, offs_r, T, R)
        k_t = tl.maximum(_count_valid(t, OFF, NW), 1.0)
        c2 = tl.where(valid2, 1.0 / (k_t * n2), 0.0)
        dv2, _ = _dv(c2, big2, n2, uu, v2, dwhat_t)
        udv = tl.sum(u * dv2, axis=1) / tl.where(uu > 0, uu, 1.0)
        dz += dv2 - udv[:, None] * u
    tl.store(DZ + base, dz, mask=m2)


@triton.jit
def _plucker_bwd_weight_kernel(ZS, WHAT, DG, DWA,
                       stride_gn, stride_gd,
                       N, R, D, ROWS_PER_SPLIT,
                       BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                       DT: tl.constexpr):
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
        ui = tl.load(ZS + rows * R + i, mask=nmask, other=0.0)
        what = tl.load(WHAT + rows[:, None] * R + offs_r[None, :], mask=nmask[:, None] & rmask[None, :],
                       other=0.0)
        dg = tl.load(DG + rows[:, None] * stride_gn + offs_e[None, :] * stride_gd,
                     mask=nmask[:, None] & emask[None, :], other=0.0)
        acc += dot(tl.trans(ui[:, None] * what), dg, DT)
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


def _fwd(zs, s, wa, offsets, norm_floor, out_dtype):
    B, T, R = zs.shape
    D = wa.shape[-1]
    g = torch.empty(B, T, D, device=zs.device, dtype=out_dtype)
    what = torch.empty(B, T, R, device=zs.device, dtype=torch.float32)
    if B * T == 0 or D == 0:
        return g.zero_(), what.zero_()
    block_r, block_d = _blocks(R, D)
    grid = (triton.cdiv(T, BLOCK_T), triton.cdiv(D, block_d), B)
    _plucker_fwd_kernel[grid](zs, s, wa, offsets, g, what, *g.stride(), T, R, D, offsets.numel(), float(norm_floor),
                              TINY, BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_D=block_d, DT=io_dtype(out_dtype))
    return g, what


def _bwd(zs, s, wa, offsets, norm_floor, what, dg):
    B, T, R = zs.shape
    D = wa.shape[-1]
    dg = dg.contiguous()
    if B * T == 0 or D == 0:
        return torch.zeros(B, T, R, device=zs.device), torch.zeros(R, R, D, device=zs.device)
    block_r, block_d = _blocks(R, D)
    dt = io_dtype(dg.dtype)
    dwhat = torch.empty(B, T, R, device=zs.device, dtype=torch.float32)
    du = torch.empty_like(dwhat)
    grid = (triton.cdiv(T, BLOCK_T), B)
    _plucker_bwd_partner_kernel[grid](zs, wa, what, dg, dwhat, du, *dg.stride(), T, R, D,
                                      BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_D=block_d, DT=dt)
    dzs = torch.empty_like(dwhat)
    _plucker_bwd_z_kernel[grid](zs, s, offsets, dwhat, du, dzs, T, R, offsets.numel(), float(norm_floor), TINY,
                                BLOCK_T=BLOCK_T, BLOCK_R=block_r)
    N = B * T
    gf = dg.reshape(N, D)
    split = max(1, min(64, triton.cdiv(N, 2048)))
    rows = triton.cdiv(triton.cdiv(N, split), BLOCK_T) * BLOCK_T
    split = triton.cdiv(N, rows)
    dwa = torch.empty(split, R, R, D, device=zs.device, dtype=torch.float32)
    _plucker_bwd_weight_kernel[(R, triton.cdiv(D, block_d), split)](
        zs, what, gf, dwa, *gf.stride(), N, R, D, rows,
        BLOCK_T=BLOCK_T, BLOCK_R=block_r, BLOCK_D=block_d, DT=dt)
    return dzs * s[..., None], dwa.sum(0)                   # dz = s dz_s: s is piecewise constant


def plucker_fused_forward(zs: torch.Tensor, s: torch.Tensor, wa: torch.Tensor, offsets: torch.Tensor,
                          norm_floor: float, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g [B, T, d] in out_dtype, w_hat [B, T, r] float32)`` for the rescaled tokens ``zs [B, T, r]`` and
    their scales ``s [B, T]`` (both float32, contiguous: ``attnlib.grassmann`` rescales, so that the
    scaling rule lives once, beside the reference that uses it), the antisymmetric weight ``wa [r, r, d]``
    (contiguous) and ``offsets`` (int32 on zs's device). ``norm_floor`` is ``plucker_projection``'s, in the
    unscaled units (the ``eps`` of the equations above). ``w_hat`` is in the rescaled units: what
    :func:`plucker_fused_backward` takes."""
    require_launchable(zs)
    return _fwd(zs, s, wa, offsets, norm_floor, out_dtype)


def plucker_fused_backward(zs: torch.Tensor, s: torch.Tensor, wa: torch.Tensor, offsets: torch.Tensor,
                           norm_floor: float, what: torch.Tensor, dg: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients ``(dz [B, T, r] float32, dwa [r, r, d] float32)`` for ``dg [B, T, d]``, the inputs as
    :func:`plucker_fused_forward` took them and its ``w_hat``; ``dz`` is with respect to the unscaled ``z``."""
    require_launchable(zs)
    return _bwd(zs, s, wa, offsets, norm_floor, what, dg)


__all__ = ["plucker_fused_forward", "plucker_fused_backward"]
