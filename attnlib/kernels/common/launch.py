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


def target_family(device: torch.device) -> str:
    """The ``SPILLS`` table a device reads: ``"sm90"`` (Hopper and newer: wgmma), ``"sm80"`` (A100),
    ``"sm89"`` (the other Ampere and Ada parts: sm_86, sm_87, sm_89)."""
    cap = capability(device)
    if cap is None or cap >= (9, 0):
        return "sm90"
    return "sm80" if cap == (8, 0) else "sm89"


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


# ---- the chunked kernels' former sizing helpers (replaced by autotuning in this rewrite) ----

def require_device(x: torch.Tensor) -> None:
    if x.device.type == "cpu" and not INTERPRET:
        raise RuntimeError("the Triton kernel needs a CUDA device or TRITON_INTERPRET=1")


def dim_block(n: int) -> int:
    """A power-of-two tile side covering ``n`` (at least 16, tl.dot's minimum)."""
    return max(MIN_DOT, triton.next_power_of_2(max(n, 1)))


def value_block(dv: int, d: int, device: torch.device, override: int | None = None, widest: int = 64) -> int:
    """Width of a value tile. Under the interpreter one tile takes all of Dv (fewer programs run
    faster in numpy); on a GPU ``widest`` columns (64; 32 for the reverse state pass, whose float32
    tiles spilled registers at 64), and 32 when the [D, BV] fp32 state tile would be 256 x 64.
    ``override`` (a power of two >= 16) forces a width: tests use it to split Dv under the interpreter."""
    if override is not None:
        return override
    full = dim_block(dv)
    if device.type != "cuda":
        return full
    return min(32 if d > 128 else widest, full)


def key_block(d: int, device: torch.device, override: int | None = None, widest: int = 64) -> int:
    """Width of a key tile, for the kernels that walk the head dimension ``D`` in tiles (the dq/dk and
    WY backward kernels). On a GPU at most ``widest`` (64) columns: holding all of ``D = 128`` in
    ``[CHUNK, D]`` float32 tiles made ptxas spill registers (``scripts/kernel_resources.py`` counts
    them). Under the interpreter all of ``D`` (fewer, larger numpy operations). ``override`` as in
    :func:`value_block`."""
    if override is not None:
        return override
    full = dim_block(d)
    return full if device.type != "cuda" else min(widest, full)


def warps(*tile_sides: int) -> int:
    """4 warps for small tiles, 8 once the largest product of tile sides reaches 128 x 64."""
    size = 1
    for s in tile_sides:
        size *= s
    return 8 if size >= 128 * 64 else 4


def precisions(dtype: torch.dtype) -> tuple[str, str]:
    """``(input_precision, fp32_precision)`` for tl.dot.

    ``input_precision`` is for products of two loaded inputs (Q K^T, K K^T): exact fp32 ("ieee") for
    fp32 inputs; for half inputs it is unused (half x half runs on tensor cores, fp32 accumulation).
    ``fp32_precision`` is for products with an operand computed in float32 (the state, the score tile,
    the triangular inverse): "ieee" for fp32 inputs, "tf32" for half inputs -- never a cast of the
    state or the scores to float16, whose range (65504) a long sequence's state exceeds.
    """
    exact = dtype == torch.float32
    return ("ieee" if exact else "tf32"), ("ieee" if exact else "tf32")


def check_chunk(chunk_size: int) -> None:
    if chunk_size < 16 or chunk_size > 128 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power of two in [16, 128] for the kernel; got {chunk_size}")


def kernel_chunk(chunk_size: int, D: int) -> int:
    """The chunk the kernels actually use: ``chunk_size``, capped at 64 rows (32 when D > 128).

    The answer does not depend on the chunk (every chunk size computes the same recurrence), but the
    kernels hold several ``[CHUNK, BLOCK]`` and ``[CHUNK, CHUNK]`` float32 tiles at once: when the
    dq/dk and WY backward kernels held all of ``D``, compiled for sm_90 they needed 131-197 KB of
    shared memory at chunk 64 and D 128 (one pipeline stage), but 262-786 KB at chunk 64 / D 256 or
    chunk 128, beyond the H100's 227 KB (they now walk ``D`` in key tiles: ``scripts/kernel_resources.py``
    reports today's figures). The forward and the backward must use the same chunk (the backward reads
    the forward's per-chunk inverses), so both call this.
    """
    return min(chunk_size, 64, max(MIN_DOT, 64 * 128 // dim_block(D)))


def check_dims(D: int, Dv: int) -> None:
    if D > MAX_HEAD_DIM or Dv > MAX_HEAD_DIM:
        raise ValueError(f"the Triton kernel supports D and Dv up to {MAX_HEAD_DIM}; got D={D}, Dv={Dv} "
                         "(use backend='torch')")


def stages(device: torch.device) -> int:
    return 2 if device.type == "cuda" else 1


__all__ = ["MAX_HEAD_DIM", "MIN_DOT", "SHARED_MEMORY", "SMEM_MARGIN", "TensorDescriptor", "autotuned", "capability",
           "config_key", "descriptor_blocks", "head_block", "head_descriptors", "interpret_config", "num_chunks",
           "pruner", "require_launchable", "shared_memory_limit", "sm_count", "target_family", "tma_compatible",
           "tma_device"]
