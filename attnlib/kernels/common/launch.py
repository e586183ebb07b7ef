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

Tiles, one way for every launch: a list of candidate configurations and :func:`keep` -- the autotuner
times those kept (:func:`autotuned`, :func:`pruner`); a launch that cannot be autotuned (its tiles shape
a buffer allocated before it, or its warps) takes the first kept (:func:`choose`; a halving search is the
list :func:`halvings`); under the interpreter the tiles :func:`interpret_config` gives. Since the
interpreter runs one tiling, ``scripts/check_candidates.py`` forces every candidate :func:`keep` leaves
for sm_75/sm_80/sm_89/sm_90 through it (:func:`kept_candidates`, :func:`forcing`) against float64.

Chunked kernels read contiguous ``[B, H, T, X]`` tensors (``beta``, gates: ``[B, H, T]``) and flatten
``(B, H)`` into one grid axis, so a kernel addresses row ``t`` of head ``bh`` at ``(bh * T + t) * X``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from ..._backend import INTERPRET, KERNEL_CHUNKS, MAX_HEAD_DIM

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


# ---- choosing tiles: the one way ----
# Every launch takes its tiles from a list of candidate ``triton.Config`` s through one rule, :func:`keep`
# (fits the target's shared memory by the kernel's own estimate, not listed as spilling in its ``SPILLS``
# table there; else the list's last, safe candidate). An autotuned kernel (:func:`autotuned`) times the
# kept candidates on the GPU (:func:`pruner` is the autotuner's hook around :func:`keep`); a launch
# whose tiles fix a buffer's shape or its warps takes the first one kept (:func:`choose`; a halving
# search is the candidate list :func:`halvings`). Under the interpreter every launch runs the tiles
# :func:`interpret_config` gives. :func:`kept_candidates` is the same rule for a named target, which
# ``scripts/check_candidates.py`` uses to run every candidate once.

def keep(configs: list, smem: Callable[[triton.Config, dict], int] | None, spills: dict | None,
         width: Callable[[dict], int] | None, args: dict, *, limit: int, target: str) -> list:
    """The candidates of ``configs`` a launch with arguments ``args`` may run on a target offering
    ``limit`` bytes of shared memory per block, of family ``target`` (:func:`family`): those whose
    ``smem(cfg, args)`` fits and that ``spills[target][config_key]`` does not list as spilling at a head
    block of ``width(args)`` or wider. If none is left, the last candidate (each list ends with a small,
    safe one). ``args`` reaches ``smem`` with ``TARGET`` set to ``target`` (an estimate may depend on it)."""
    args = {**args, "TARGET": target}
    measured = (spills or {}).get(target, {})
    at = width(args) if width is not None else 0
    kept = [c for c in configs
            if (smem is None or smem(c, args) <= limit) and at < measured.get(config_key(c), 1 << 30)]
    return kept or configs[-1:]


def pruner(smem: Callable[[triton.Config, dict], int], spills: dict, width: Callable[[dict], int],
           device_arg: str) -> Callable:
    """An ``early_config_prune`` hook: :func:`keep` for the device of argument ``device_arg``. The hook
    carries its parts (``.smem``, ``.spills``, ``.width``) for :func:`kept_candidates`."""

    def prune(configs, nargs, **kwargs):
        args = {**nargs, **kwargs}
        dev = args[device_arg].device
        return keep(configs, smem, spills, width, args, limit=shared_memory_limit(dev), target=target_family(dev))

    prune.smem, prune.spills, prune.width = smem, spills, width
    return prune


def choose(configs: list, args: dict, device: torch.device, *, smem=None, spills=None, width=None,
           interpret: dict | None = None) -> dict:
    """The launch keywords of a launch that is not autotuned: on a GPU, the first candidate :func:`keep`
    leaves for ``device`` (its tiles, ``num_warps``, ``num_stages``); under the interpreter,
    :func:`interpret_config` of ``configs`` with ``interpret`` over it."""
    if INTERPRET:
        return interpret_config(configs, **(interpret or {}))
    c = keep(configs, smem, spills, width, args, limit=shared_memory_limit(device), target=target_family(device))[0]
    return {**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages}


def halvings(bm: int, bn: int, *, first: str = "M", num_warps=4, num_stages: int = 2) -> list:
    """Candidates ``BLOCK_M x BLOCK_N`` from ``bm x bn`` down, halving the wider side each step (on a tie
    ``BLOCK_M`` when ``first == "M"``, else ``BLOCK_N``) until both are :data:`MIN_DOT` -- the search
    a launch makes when only shared memory may shrink its tiles. ``num_warps``: an int, or a function of
    ``(bm, bn)``."""
    out = []
    while True:
        warps = num_warps(bm, bn) if callable(num_warps) else num_warps
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=num_stages))
        if max(bm, bn) <= MIN_DOT:
            return out
        if bm > bn or (bm == bn and first == "M"):
            bm //= 2
        else:
            bn //= 2


# The autotuned launches by name (``module.attribute``), for :func:`kept_candidates`: ``(configs, prune)``;
# and the kernel each launches, by its function's name (for the compile checks, which see kernels by name).
TUNED: dict[str, tuple[list, Callable]] = {}
TUNED_KERNEL: dict[str, str] = {}


def kept_candidates(name: str, args: dict, capability: tuple[int, int]) -> list:
    """The candidates the autotuned launch ``name`` (a key of :data:`TUNED`) may run with arguments
    ``args`` on a GPU of compute ``capability`` (:data:`SHARED_MEMORY`, :func:`family`) -- what its
    pruning hook keeps there."""
    configs, prune = TUNED[name]
    return keep(configs, prune.smem, prune.spills, prune.width, args, limit=SHARED_MEMORY[tuple(capability)],
                target=family(capability))


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


def autotuned(kernel, configs, key, prune, *, name: str | None = None, **options):
    """``triton.autotune`` on a GPU; under the interpreter the kernel itself (the launch passes one fixed
    configuration: autotuning would time numpy). ``options``: more ``triton.autotune`` arguments, e.g.
    ``reset_to_zero`` for a kernel that accumulates into an output (each timed run must start from 0).
    ``name`` (``module.attribute``) registers the launch in :data:`TUNED`."""
    if name is not None:
        TUNED[name] = (configs, prune)
        TUNED_KERNEL[name] = kernel.__name__
    if INTERPRET:
        return _Interpreted(kernel, name) if name is not None else kernel
    return triton.autotune(configs, key=key, prune_configs_by={"early_config_prune": prune}, **options)(kernel)


# Under the interpreter, the candidate each named launch must run (:func:`forcing`), over the wrapper's tiles,
# and how many launches ran one (so that a check knows its candidate was executed, not merely set).
FORCED: dict[str, triton.Config] = {}
FORCED_LAUNCHES: dict[str, int] = {}


@contextlib.contextmanager
def forcing(name: str, config: triton.Config):
    """Run the launch ``name`` (a key of :data:`TUNED`) with ``config`` 's tiles while in this block, whatever
    tiles its wrapper passes -- how ``scripts/check_candidates.py`` runs, through the interpreter, each
    candidate the autotuner may pick on a GPU. Interpreter only: on a GPU the autotuner chooses."""
    if not INTERPRET:
        raise RuntimeError("launch.forcing needs TRITON_INTERPRET=1 (on a GPU the autotuner chooses the tiles)")
    if name not in TUNED:
        raise ValueError(f"name must be an autotuned launch, one of {sorted(TUNED)}; got {name!r}")
    FORCED[name] = config
    try:
        yield
    finally:
        FORCED.pop(name, None)


def forced(name: str) -> dict:
    """The tiles :func:`forcing` imposes on the launch ``name`` now (empty when none)."""
    return dict(FORCED[name].kwargs) if name in FORCED else {}


class _Interpreted:
    """An autotuned launch under the interpreter: the kernel itself, with the tiles :func:`forcing` imposes
    (if any) over those the wrapper passes. Everything else is the kernel's."""

    def __init__(self, kernel, name: str):
        self.kernel, self.name = kernel, name

    def __getattr__(self, attr):
        return getattr(self.kernel, attr)

    def __getitem__(self, grid):
        run = self.kernel[grid]

        def launch_(*args, **kwargs):
            tiles = forced(self.name)
            if tiles:
                FORCED_LAUNCHES[self.name] = FORCED_LAUNCHES.get(self.name, 0) + 1
            return run(*args, **{**kwargs, **tiles})

        return launch_


def interpret_config(configs, **fixed) -> dict:
    """Under the interpreter, the launch keywords of one configuration: ``fixed`` (e.g. tile widths a
    test forces) over the last candidate's; on a GPU, nothing (the autotuner chooses)."""
    if not INTERPRET:
        return {}
    last = configs[-1]
    return {**last.kwargs, **{k: v for k, v in fixed.items() if v is not None}}


def num_chunks(T: int, chunk_size: int) -> int:
    return triton.cdiv(T, chunk_size)


# The compile-time bounds of the chunked kernels' tiles, as constexprs a @triton.jit function may read.
_MIN_CHUNK = tl.constexpr(KERNEL_CHUNKS[0])
_MAX_CHUNK = tl.constexpr(KERNEL_CHUNKS[-1])
_MIN_DOT = tl.constexpr(MIN_DOT)


@triton.jit
def chunk_invariants(CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The tiling invariants of every chunked kernel, checked at compile time (and by the interpreter at
    the launch): the chunk is one of :data:`KERNEL_CHUNKS` (a power of two in their range), and both tile
    sides are powers of two of at least :data:`MIN_DOT` (``tl.dot``'s minimum; ``tl.arange`` needs powers
    of two). Whether a tile covers the head is a runtime fact (the head dims are not constexprs): the
    wrappers pass :func:`head_block` where it must."""
    tl.static_assert((CHUNK >= _MIN_CHUNK) & (CHUNK <= _MAX_CHUNK) & ((CHUNK & (CHUNK - 1)) == 0),
                     "chunked kernel: CHUNK must be one of KERNEL_CHUNKS (16, 32, 64)")
    tl.static_assert((BLOCK_D >= _MIN_DOT) & ((BLOCK_D & (BLOCK_D - 1)) == 0),
                     "chunked kernel: BLOCK_D must be a power of two >= 16")
    tl.static_assert((BLOCK_DV >= _MIN_DOT) & ((BLOCK_DV & (BLOCK_DV - 1)) == 0),
                     "chunked kernel: BLOCK_DV must be a power of two >= 16")


def check_chunk(chunk_size: int) -> None:
    """The chunked kernels run exactly the chunk asked for, one of :data:`KERNEL_CHUNKS`: the ops report
    any other as the reason the kernel does not apply, so this only guards direct calls."""
    if chunk_size not in KERNEL_CHUNKS:
        raise ValueError(f"chunk_size must be one of {KERNEL_CHUNKS} for the kernel; got {chunk_size}")


__all__ = ["FORCED", "FORCED_LAUNCHES", "KERNEL_CHUNKS", "MAX_HEAD_DIM", "MIN_DOT", "SHARED_MEMORY", "SMEM_MARGIN",
           "TUNED", "TUNED_KERNEL", "TensorDescriptor", "autotuned", "capability", "check_chunk", "choose",
           "chunk_invariants", "config_key", "descriptor_blocks", "family", "forced", "forcing", "halvings",
           "head_block", "head_descriptors", "interpret_config", "keep", "kept_candidates", "num_chunks", "pruner",
           "require_launchable", "shared_memory_limit", "sm_count", "target_family", "tma_compatible", "tma_device"]
