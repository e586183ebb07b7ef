"""What every module of the package shares: the float64 dtype of the measured rows and the check that a
random choice has a ``torch.Generator`` to come from."""

from __future__ import annotations

import torch

F64 = torch.float64


def _check_generator(generator) -> torch.Generator:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (every random choice flows from it); "
                        f"got {type(generator).__name__}")
    return generator
