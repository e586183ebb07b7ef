"""Launch helpers shared by every kernel: the device check, tile widths, what the device offers, and
the pruning of autotuning candidates. Not a kernel.

Device limits. A launch must fit the shared memory of the GPU it runs on -- 64 KB per block on a T4
(sm_75), about 99 KB on an L4 (sm_89), 163 KB on an A100 (sm_80), 227 KB on an H100 (sm_90) -- so the
wrappers read it from the device (:func:`shared_memory_limit`) rather than assume an H100. Under
Triton's interpreter there is no limit.

Autotuning. Each kernel with several good tilings lists candidate ``triton.Config`` s and a
``SPILLS`` table: for each GPU generation (:func:`target_family`), the candidates that ptxas showed
spilling registers, with the narrowest head block at which they did (``scripts/kernel_report.py``
compiles every candidate for sm_80, sm_89 and sm_90 on the CPU). :func:`pruner` keeps the candidates
that fit the device's shared memory (by the kernel's own estimate) and are not listed as spilling
there; ``tests/test_kernel_report.py`` compiles every candidate the pruner keeps for every target and
fails if one does not fit or spills, so the estimates and the tables stay honest.

Chunked kernels read contiguous ``[B, H, T, X]`` tensors (``beta``, gates: ``[B, H, T]``) and flatten
``(B, H)`` into one grid axis, so a kernel addresses row ``t`` of head ``bh`` at ``(bh * T + t) * X``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton

from ..._backend import INTERPRET

MAX_HEAD_DIM = 256          # one tile holds a whole head row: beyond 256 the registers spill
MIN_DOT = 16                # tl.dot needs every tile side >= 16
# Shared memory a kernel's estimate adds to its tiles for Triton's own use: compiled for sm_80, sm_89 and
# sm_90, the softmax kernels took at most 1 KB beyond their tiles (sm_90's TMA pipeline barriers).
SMEM_MARGIN = 2 * 1024

# Shared memory per block (the opt-in maximum), by compute capability, for the GPUs a reader meets;
# a real device is asked (:func:`shared_memory_limit`), this table serves the static report.
SHARED_MEMORY = {(7, 5): 64 * 1024, (8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 9): 99 * 1024,
                 (9, 0): 227 * 1024}


def require_launchable(x: torch.Tensor, *dims: int, limit: int = MAX_HEAD_DIM, what: str = "head dims") -> None:
    """The one device and size check of every kernel wrapper: a CUDA tensor (or the interpreter), and
    every dim in ``dims`` at most ``limit``."""
    if x.device.type != "cuda" and not INTERPRET:
        raise RuntimeError(f"the Triton kernel needs a CUDA tensor or TRITON_INTERPRET=1; got a tensor on "
                           f"{x.device.type}")
    if dims and max(dims) > limit:
        raise ValueError(f"the Triton kernel takes {what} up to {limit}; got {', '.join(map(str, dims))} "
                         "(use backend='torch')")


def head_block(n: int) -> int:
    """A power-of-two tile side covering ``n`` (at least 16, tl.dot's minimum)."""
    return max(MIN_DOT, triton.next_power_of_2(max(n, 1)))


def capability(device: torch.device) -> tuple[int, int] | None:
    """``(major, minor)`` of a CUDA device; None under the interpreter."""
    return tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None


def shared_memory_limit(device: torch.device) -> int:
    """Bytes of shared memory one block may use on ``device`` (no limit under the interpreter)."""
    if device.type != "cuda":
        return 1 << 30
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or props.shared_memory_per_block)


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (1 under the interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def family(cap: tuple[int, int] | None) -> str:
    """The ``SPILLS`` table a compute capability reads: ``"sm90"`` (Hopper and newer: wgmma; also the
    interpreter, ``None``), ``"sm80"`` (A100), ``"sm89"`` (the other Ampere and Ada parts: sm_86, sm_87,
    sm_89)."""
    if cap is None or tuple(cap) >= (9, 0):
        return "sm90"
    return "sm80" if tuple(cap) == (8, 0) else "sm89"


def target_family(device: torch.device) -> str:
    """:func:`family` of a device."""
    return family(capability(device))


def config_key(cfg: triton.Config) -> tuple:
    """A candidate's identity in a ``SPILLS`` table: its tile sizes (sorted by name), warps, stages."""
    return (*(v for _, v in sorted(cfg.kwargs.items())), cfg.num_warps, cfg.num_stages)


def pruner(smem: Callable[[triton.Config, dict], int], spills: dict, width: Callable[[dict], int],
           device_arg: str) -> Callable:
    """An ``early_config_prune`` hook: keep the candidates whose ``smem(cfg, args)`` fits the device
    of argument ``device_arg`` and that its ``spills[target_family][config_key]`` table does not list
    as spilling at a head block of ``width(args)`` or wider. If none is left, the last candidate
    (each list ends with a small, safe one)."""

    def prune(configs, nargs, **kwargs):
        args = {**nargs, **kwargs}
        dev = args[device_arg].device
        limit = shared_memory_limit(dev)
        measured = spills.get(target_family(dev), {})
        keep = []
        for c in configs:
            narrowest = measured.get(config_key(c))
            if smem(c, args) <= limit and (narrowest is None or width(args) < narrowest):
                keep.append(c)
        return keep or configs[-1:]

    return prune


# ---- tensor-descriptor (TMA) loads ----

def _tensor_descriptor_type():
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:                     # a Triton without host-side tensor descriptors
        return None
    return TensorDescriptor


TensorDescriptor = _tensor_descriptor_type()


def tma_device(device: torch.device) -> bool:
    """Whether kernels on ``device`` may read their tiles through tensor descriptors (the copy engine,
    TMA): an sm_90 GPU -- the one target their descriptor path is compiled and checked for -- and a
    Triton with host-side descriptors (``triton.tools.tensor_descriptor``). Never under the interpreter,
    and on sm_80/sm_89 (no TMA) the pointer path."""
    cap = capability(device)
    return TensorDescriptor is not None and not INTERPRET and cap is not None and cap[0] == 9


def tma_compatible(*tensors: torch.Tensor) -> bool:
    """Whether TMA can address every tensor: a contiguous last dim, every other stride a non-zero
    multiple of 16 bytes (size-1 dims included), a 16-byte-aligned base address, no empty dim."""
    for x in tensors:
        if x.numel() == 0 or x.stride(-1) != 1:
            return False
        if any(s == 0 or (s * x.element_size()) % 16 for s in x.stride()[:-1]):
            return False
        # A fake tensor (the compile-time resource report) has no address; a fresh allocation is aligned.
        if type(x).__name__ not in ("FakeTensor", "FunctionalTensor") and x.data_ptr() % 16:
            return False
    return True


def head_descriptors(use_tma: bool, *tensors: torch.Tensor) -> tuple:
    """The kernel arguments for ``[B, H, T, X]`` tensors: with ``use_tma`` a host-side tensor descriptor of
    each (all four dims, so any such strides; the box is set per configuration by
    :func:`descriptor_blocks`), otherwise the tensors themselves (the pointer path)."""
    if not use_tma:
        return tensors
    return tuple(TensorDescriptor(x, list(x.shape), list(x.stride()), [1, 1, MIN_DOT, head_block(x.shape[-1])])
                 for x in tensors)


def descriptor_blocks(blocks: dict[str, tuple[str, str]]) -> Callable[[dict], None]:
    """A ``triton.Config`` pre-hook: set the box of each argument passed as a tensor descriptor to
    ``[1, 1, nargs[rows], nargs[cols]]`` for ``name -> (rows, cols)`` in ``blocks``. A host-side
    descriptor carries its box, but the autotuner picks the tiles, so the box is set before each launch
    it makes (as Triton's own attention tutorial does). Arguments passed as pointers are left alone."""

    def hook(nargs: dict) -> None:
        for name, (rows, cols) in blocks.items():
            arg = nargs[name]
            if TensorDescriptor is not None and isinstance(arg, TensorDescriptor):
                arg.block_shape = [1, 1, nargs[rows], nargs[cols]]

    return hook


def autotuned(kernel, configs, key, prune, **options):
    """``triton.autotune`` on a GPU; under the interpreter the kernel itself (the launch passes one fixed
    configuration: autotuning would time numpy). ``options``: more ``triton.autotune`` arguments, e.g.
    ``reset_to_zero`` for a kernel that accumulates into an output (each timed run must start from 0)."""
    if INTERPRET:
        return kernel
    return triton.autotune(configs, key=key, prune_configs_by={"early_config_prune": prune}, **options)(kernel)


def interpret_config(configs, **fixed) -> dict:
    """Under the interpreter, the launch keywords of one configuration: ``fixed`` (e.g. tile widths a
    test forces) over the last candidate's; on a GPU, nothing (the autotuner chooses)."""
    if not INTERPRET:
        return {}
    last = configs[-1]
    return {**last.kwargs, **{k: v for k, v in fixed.items() if v is not None}}


def num_chunks(T: int, chunk: int) -> int:
    return triton.cdiv(T, chunk)


KERNEL_CHUNKS = (16, 32, 64)     # chunk sizes of the chunked kernels (the triangular solve works on 16-blocks)


def check_chunk(chunk_size: int) -> None:
    """The chunked kernels run exactly the chunk asked for, one of :data:`KERNEL_CHUNKS`: the ops report
    any other as the reason the kernel does not apply, so this only guards direct calls."""
    if chunk_size not in KERNEL_CHUNKS:
        raise ValueError(f"chunk_size must be one of {KERNEL_CHUNKS} for the kernel; got {chunk_size}")


__all__ = ["KERNEL_CHUNKS", "MAX_HEAD_DIM", "MIN_DOT", "SHARED_MEMORY", "SMEM_MARGIN", "TensorDescriptor", "autotuned",
           "capability", "check_chunk", "config_key", "descriptor_blocks", "family", "head_block", "head_descriptors",
           "interpret_config", "num_chunks", "pruner", "require_launchable", "shared_memory_limit", "sm_count",
           "target_family", "tma_compatible", "tma_device"]
