"""The float64 definition the Grassmann tests compare against, written from the equations and
independently of ``attnlib.grassmann``: Plücker coordinates as the 2x2 minors ``u_i w_j - u_j w_i``,
normalised by ``max(||p||, eps)``, averaged over the valid offsets, projected by ``W``.
Also the degenerate token sequences the review asked for."""

import torch

F64 = torch.float64


def definition(z, W, offsets, eps=1e-6):
    """``g [B, T, d]`` in float64 (differentiable in ``z``, ``W`` when they require grad)."""
    z, W = z.to(F64), W.to(F64)
    B, T, r = z.shape
    i, j = torch.triu_indices(r, r, 1)            # every pair i < j, in the order (0, 1), (0, 2), ..., (1, 2), ...
    rows = []
    for t in range(T):
        feats = []
        for delta in offsets:
            if t - delta < 0:
                continue
            u, w = z[:, t], z[:, t - delta]
            p = u[:, i] * w[:, j] - u[:, j] * w[:, i]                          # the 2x2 minors, [B, r(r-1)/2]
            n = p.norm(dim=-1, keepdim=True)
            feats.append(p / torch.maximum(n, torch.full_like(n, eps)))
        rows.append(torch.stack(feats).mean(0) @ W.T if feats else torch.zeros(B, W.shape[0], dtype=F64))
    return torch.stack(rows, 1)


KINDS = ("repeated", "parallel", "near1e-3", "near1e-5", "scale1e10", "scale1e-10")
# Relative RMS error allowed in float32 against the definition. A pair at angle phi is ill-conditioned:
# rounding the coordinates alone costs ~eps_machine / sin(phi) (the features path too); the rest are
# rounding-level.
TOL32 = {"repeated": 2e-6, "parallel": 2e-6, "near1e-3": 2e-4, "near1e-5": 2e-2, "scale1e10": 2e-6,
         "scale1e-10": 2e-6}


def degenerate_tokens(kind, r, T=24, B=2, seed=0, dtype=torch.float32):
    """``z [B, T, r]``: random tokens with repeated ones (z_t = z_{t-1}, z_t = z_{t-2}), exactly parallel
    ones (z_t = 2 z_{t-1}, z_t = z_{t-2} / 2, z_t = 0), all tokens within ``1e-3``/``1e-5`` of one
    vector, or random tokens of size 1e10 / 1e-10 (with a repeated pair)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, T, r, generator=g, dtype=dtype)
    if kind.startswith("near"):
        z = z[:, :1] + float(kind[4:]) * torch.randn(B, T, r, generator=g, dtype=dtype)
    elif kind.startswith("scale"):
        z = z * float(kind[5:])
        z[:, 7] = z[:, 6]
    elif kind == "repeated":
        z[:, 5] = z[:, 4]
        z[:, 9] = z[:, 8]
        z[:, 10] = z[:, 8]
        z[:, 11:15] = z[:, 10:11]                      # a run: every offset of t = 12..14 is degenerate
    elif kind == "parallel":
        z[:, 5] = 2 * z[:, 4]
        z[:, 12] = z[:, 10] / 2
        z[:, 16] = -4 * z[:, 15]
        z[:, 18] = 0.0
    return z
