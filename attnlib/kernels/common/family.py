"""What a kernel package launches, declared once in the package (its ``FAMILY``), for the checks that
compile its kernels without a GPU.

``scripts/kernel_resources.py`` runs each family's :attr:`KernelFamily.workloads` on fake CUDA tensors
and compiles every launch they make for sm_80, sm_89 and sm_90 (registers, spills, shared memory); the
committed runs behind ``tests/test_kernel_registers.py`` are built from the families
(``benchmarks/_register_runs.py``); ``scripts/check_candidates.py`` and ``tests/test_candidates.py`` read
:attr:`KernelFamily.tiles` to size the inputs that fill a candidate's tiles. The packages are found
through ``attnlib.mechanisms.REGISTRY`` (each mechanism's ``kernels``: ``attnlib.mechanisms.kernel_families``).
A kernel package without a ``FAMILY``, or a ``@triton.jit`` kernel of a package its family does not name,
fails ``tests/test_kernel_families.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# How a family's tiles are chosen, which decides how its launches are checked:
TILES = {
    # tiles span the head dimension (the chunked kernels): the widest head a launch takes is its worst case
    "head": "tiles over the head dimension: checked at the widest head",
    # autotuned query x key tiles pruned by the flash hooks: every kept candidate, every head width
    "blocks": "autotuned query x key tiles: every candidate a pruning hook keeps",
    # tiles the wrapper fixes for the device (no autotuning): checked at each head width and dtype
    "fixed": "tiles the wrapper fixes for the device",
}


@dataclass(frozen=True)
class KernelFamily:
    """``kernels``: every ``@triton.jit`` kernel the package's wrappers launch (helpers inlined into them are
    not kernels). ``tiles``: a key of :data:`TILES`. ``workloads(D, dtype, device, T)``: the forward and
    backward through the package's launch wrappers at head dim ``D``, sequence length ``T``, on empty
    tensors of ``device`` (nothing is read: the compile-time report runs them on fake tensors), as
    ``{name: callable}``; a name ending in ``" non-causal"`` is the non-causal form. ``max_head_dim``: the
    widest head the wrappers take (wider heads take the PyTorch path)."""
    package: str
    kernels: tuple[str, ...]
    tiles: str
    workloads: Callable[[int, torch.dtype, torch.device, int], dict[str, Callable[[], object]]]
    max_head_dim: int = 256

    def __post_init__(self):
        if self.tiles not in TILES:
            raise ValueError(f"tiles must be one of {sorted(TILES)}; got {self.tiles!r}")

    def workloads_at(self, D: int, dtype: torch.dtype, device: torch.device, T: int) -> dict:
        """:attr:`workloads`, or none where ``D`` is wider than the family's kernels take."""
        return self.workloads(D, dtype, device, T) if D <= self.max_head_dim else {}

    def workload_names(self) -> list[str]:
        """The names of its workloads (at the narrowest head, where every one of them exists): built, not run
        -- their tensors are made when one is called."""
        return list(self.workloads(16, torch.bfloat16, torch.device("meta"), 16))


def empty(device: torch.device, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """``x(*shape, dt=dtype)``: an uninitialised tensor on ``device`` (the workloads' inputs)."""
    def x(*shape, dt=dtype):
        return torch.empty(*shape, device=device, dtype=dt)
    return x


def attention_inputs(x: Callable[..., torch.Tensor], T: int, D: int) -> tuple[torch.Tensor, ...]:
    """``q, k, v, do`` ``[1, 2, T, D]`` and ``dlse`` float32 ``[1, 2, T]`` for the softmax-family workloads. Two
    heads: with one, the JIT would specialise ``H = 1`` away."""
    B, H = 1, 2
    return x(B, H, T, D), x(B, H, T, D), x(B, H, T, D), x(B, H, T, D), x(B, H, T, dt=torch.float32)
