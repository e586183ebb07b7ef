"""Chapter 4's figures' numbers: the state's spectrum under the two rules, and the delta rule's stability.

* :func:`state_spectra` -- the singular values of ``S_t`` after every write, for linear attention and
  the delta rule on the same keys and values (:func:`attnbook.experiments.recall.state_trajectory`).
* :func:`norm_history` / :func:`stability_histories` -- ``||S_t||`` of the delta rule on random keys of
  a given norm, at a given ``beta``: stable while ``beta ||k||^2 <= 2``.

:mod:`attnbook.widgets.deltanet` draws what these return; it computes nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from attnlib import _validate

from .recall import state_trajectory


def state_spectra(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor | float) -> dict[str, np.ndarray]:
    """``{"linear" | "delta": [T, min(D, Dv)]}``: row ``t - 1`` holds the singular values of ``S_t``
    (largest first) after ``t`` writes of ``k: [T, D]``, ``v: [T, Dv]`` (``beta``: the delta rule's
    learning rate, ``[T]`` or a number)."""
    return {r: torch.linalg.svdvals(state_trajectory(k, v, beta, rule=r)).numpy() for r in ("linear", "delta")}


def norm_history(beta: float, key_norm: float, *, T: int, D: int, seed: int) -> np.ndarray:
    """``||S_t||`` (Frobenius), ``t = 1 .. T``, of the delta rule at learning rate ``beta`` writing random
    keys of norm ``key_norm`` (uniform directions in ``R^D``) and Gaussian values, both drawn from
    ``seed``. The transition's eigenvalue along a key is ``1 - beta ||k||^2``."""
    T, D = _validate.check_int("T", T, lo=1), _validate.check_int("D", D, lo=1)
    gen = torch.Generator().manual_seed(_validate.check_int("seed", seed, lo=0))
    k = torch.nn.functional.normalize(torch.randn(T, D, generator=gen, dtype=torch.float64), dim=-1) * key_norm
    v = torch.randn(T, D, generator=gen, dtype=torch.float64)
    S = state_trajectory(k, v, beta, rule="delta")
    return S.flatten(1).norm(dim=1).numpy()


def stability_histories(betas: Sequence[float] = (0.5, 1.0, 1.5, 1.9, 2.1, 2.5), key_norms: Sequence[float] = (1.0,),
                        *, T: int = 200, D: int = 16, seed: int = 0) -> dict[tuple[float, float], np.ndarray]:
    """:func:`norm_history` for every ``(beta, key_norm)``, key norms outermost: ``{(beta, key_norm): [T]}``
    (every pair on the same draw of directions and values)."""
    return {(b, n): norm_history(b, n, T=T, D=D, seed=seed) for n in key_norms for b in betas}


__all__ = ["norm_history", "stability_histories", "state_spectra"]
