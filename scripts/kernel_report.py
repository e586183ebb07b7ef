"""A static performance report of attnlib's attention ops against fla, for the GPUs readers have,
made on a CPU: nothing runs on a GPU, nothing is timed.

What it reports. For softmax attention (causal), linear attention (causal, identity feature map), the
delta rule and the gated delta rule, forward and forward+backward, bfloat16, at the benchmark shapes
(``SHAPES``, ``Dv = D``), on each target GPU (``TARGETS``: sm_75 T4, sm_80 A100, sm_89 L4, sm_90 H100):

* every kernel launch that ``backend="auto"`` makes -- Triton kernels and PyTorch ops alike -- with its
  grid, constexpr tiles, warps and stages, and the bytes of the tensors it touches (``BYTES``);
* the same for fla (``chunk_linear_attn(normalize=False)``, ``chunk_delta_rule``,
  ``chunk_gated_delta_rule``), the anchor of the chunked ops; softmax attention's anchor is SDPA, whose
  bytes are modelled (``SDPA_MODEL``);
* for attnlib's Triton launches on sm_80, sm_89 and sm_90: each distinct specialisation compiled for
  that target -- shared memory, registers and spill bytes (``ptxas -v``), and what each ``tl.dot``
  lowers to (wgmma, mma.sync or FMA; operand types; tf32 or ieee; its source line) read off the TTGIR.

How. A capture runs in its own subprocess per (library, target): :func:`fake_gpu` makes torch and
Triton report the target (capability, name, SMs, shared memory), before fla is imported -- fla reads
the device at import. The public functions then run on fake CUDA tensors (``FakeTensorMode``: shapes
and dtypes, no data), forward and then backward of a loss on the output, while :func:`recording`
records every Triton launch instead of running it (an autotuned kernel: every candidate its pruning
hook keeps for this device, any of which the autotuner may pick) and every PyTorch op that would run
a kernel. Arguments are bound with Triton's own binder, so the specialisation is the one the JIT
would compile. Compiling runs in parallel subprocesses, each distinct specialisation once.

Run from the repository root (TRITON_INTERPRET unset):

    PYTHONPATH=$PWD python scripts/kernel_report.py                     # everything; writes the JSON
    PYTHONPATH=$PWD python scripts/kernel_report.py --ops delta --shapes 4x16x4096x128 --targets sm_90 --no-save
    PYTHONPATH=$PWD python scripts/kernel_report.py --no-compile --no-save  # launches and bytes only

``--json-out FILE`` writes the report elsewhere (``tests/test_kernel_report.py`` reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import functools
import hashlib
import importlib
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

os.environ.pop("TRITON_INTERPRET", None)                   # before attnlib defines its kernels
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")     # the 3.9 default, without its warning
os.environ["TRITON_ALWAYS_COMPILE"] = "1"                  # a cached kernel would skip ptxas and its log
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="kernel-report-"))

import torch  # noqa: E402
import triton  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "kernel_report.json"


# ----------------------------------------------------------------------------- what is measured where

@dataclass(frozen=True)
class Target:
    """A GPU a reader meets (REFERENCES.md, "Performance anchors"): what torch and Triton report for it."""
    sm: int
    gpu: str
    sms: int
    memory_gib: int

    @property
    def capability(self) -> tuple[int, int]:
        return divmod(self.sm, 10)

    @property
    def shared_memory(self) -> int:
        """Opt-in shared memory per block: attnlib's own table, the number its launch code uses."""
        from attnlib.kernels.common.launch import SHARED_MEMORY
        return SHARED_MEMORY[self.capability]


TARGETS = {"sm_75": Target(75, "Tesla T4", 40, 15), "sm_80": Target(80, "NVIDIA A100-SXM4-80GB", 108, 80),
           "sm_89": Target(89, "NVIDIA L4", 58, 22), "sm_90": Target(90, "NVIDIA H100 80GB HBM3", 132, 80)}
COMPILED_TARGETS = ("sm_80", "sm_89", "sm_90")      # where auto takes the Triton kernels
SHAPES = ((4, 16, 4096, 64), (4, 16, 4096, 128), (4, 16, 16384, 128), (1, 8, 65536, 128), (2, 16, 4096, 128))
OPS = ("softmax", "linear", "delta", "gated_delta")
CHUNKED = ("linear", "delta", "gated_delta")       # the ops fla implements
PASSES = ("fwd", "fwd+bwd")
DTYPE = torch.bfloat16

BYTES = ("bytes of a launch: the sum, over the distinct tensors passed to the kernel's arguments that it "
         "uses, of numel x element size -- each tensor once per launch, whether read, written or both; "
         "a lower bound on the launch's DRAM traffic (a tile re-read by several programs, or from L2, counts "
         "once). A Triton argument whose pointer the compiled kernel never dereferences (a dummy standing in "
         "for an absent tensor) is not counted: attnlib's are listed under 'dummies'. A PyTorch op counts its "
         "distinct input and output tensors; views, allocations and metadata ops launch nothing and are "
         "not recorded. A pass's bytes are the sum over its launches.")
SDPA_MODEL = ("SDPA (softmax attention's anchor) is not captured but modelled as an ideal fused kernel: "
              "forward reads q, k, v and writes o and lse (float32 [B, H, T]); backward reads q, k, v, o, "
              "do, lse and writes dq, dk, dv; forward+backward is their sum")
TORCH_PATHS = ("where attnlib takes a PyTorch path (sm_75), its launches are the aten ops dispatched on fake "
               "tensors: SDPA decomposes there as PyTorch chooses without a device (on a real T4 its backend is "
               "chosen at run time); the rows' bytes for those paths are indicative, not a kernel comparison")
AUTOTUNED = ("an autotuned kernel is recorded with every candidate configuration its pruning hook keeps for "
             "the target (any may be picked; each is compiled); its grid and bytes are those of the first "
             "kept candidate")


def shape_name(shape) -> str:
    return "x".join(map(str, shape))


def parse_shape(text: str) -> tuple[int, ...]:
    B, H, T, D = (int(x) for x in text.lower().split("x"))
    return B, H, T, D


# ----------------------------------------------------------------------------- a fake GPU per target

class FakeDriver:
    """Stands in for ``triton.runtime.driver.active``: the target and its limits, and no device to run
    on (every launch is intercepted before Triton would ask for one)."""

    def __init__(self, target: Target):
        self.target = target
        self.utils = types.SimpleNamespace(get_device_properties=self.device_properties)

    def device_properties(self, device=0) -> dict:
        t = self.target
        return {"max_shared_mem": t.shared_memory, "max_num_regs": 65536, "multiprocessor_count": t.sms,
                "warpSize": 32, "sm_clock_rate": 0, "mem_clock_rate": 0, "mem_bus_width": 0}

    def get_current_target(self):
        return GPUTarget("cuda", self.target.sm, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cuda", 0)

    def is_active(self):
        return True


def _device_properties(target: Target):
    """What ``torch.cuda.get_device_properties`` would say about the target."""
    major, minor = target.capability
    return types.SimpleNamespace(
        name=target.gpu, major=major, minor=minor, total_memory=target.memory_gib << 30,
        multi_processor_count=target.sms, shared_memory_per_block=48 * 1024,
        shared_memory_per_block_optin=target.shared_memory, shared_memory_per_multiprocessor=target.shared_memory,
        max_threads_per_multi_processor=1024 if target.sm == 75 else 2048, regs_per_multiprocessor=65536,
        warp_size=32, L2_cache_size=0, is_integrated=False, is_multi_gpu_board=False, uuid="fake")


@functools.cache
def let_autograd_record_on_fake_cuda() -> None:
    """Register a device guard for CUDA in a CPU-only torch, so that autograd can record a graph on fake
    CUDA tensors (it asks the device's guard for the current stream of every input, and a CPU build has
    none for CUDA: "PyTorch is not linked with support for cuda devices"). The CPU guard stands in: it
    sets no device and has one stream, which is all a graph that never executes needs. The backward is
    then run by :func:`backward`, not by the C++ engine (which synchronises streams across devices).
    This writes into c10's guard registry, so it is done only in the capture subprocesses, and only
    where torch has no CUDA of its own."""
    if torch.backends.cuda.is_built():
        return
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    registry = (ctypes.c_void_p * 2).in_dll(lib, "_ZN3c104impl26device_guard_impl_registryE")
    cpu, cuda = 0, 1                                      # c10::DeviceType
    if registry[cuda] is None:
        registry[cuda] = registry[cpu]


@contextlib.contextmanager
def fake_gpu(target: Target):
    """Make torch and Triton report ``target`` as the one CUDA device: capability, name, properties
    (SMs, opt-in shared memory) and Triton's current target, so that attnlib's dispatch and tile choices
    and fla's import-time device detection see that GPU."""
    from triton.runtime import driver

    let_autograd_record_on_fake_cuda()
    props = _device_properties(target)
    patches = {"is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
               "get_device_capability": lambda device=None: target.capability,
               "get_device_properties": lambda device=None: props,
               "get_device_name": lambda device=None: target.gpu,
               "set_device": lambda device: None, "synchronize": lambda device=None: None,
               "_exchange_device": lambda device: 0, "_maybe_exchange_device": lambda device: 0,
               "is_initialized": lambda: True, "_lazy_init": lambda: None}
    previous = driver._active
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(torch.cuda, name, value, create=True))
        driver.set_active(FakeDriver(target))
        try:
            yield
        finally:
            driver._active = previous


@contextlib.contextmanager
def pointer_loads():
    """The wrappers' pointer path on every target: the fallback of the tensor-descriptor (TMA) loads on
    sm_90, taken for strides TMA cannot address or a Triton without host-side descriptors."""
    from attnlib.kernels.common import launch

    with mock.patch.object(launch, "tma_device", lambda device: False):
        yield


# ----------------------------------------------------------------------------- recording launches

@dataclass
class TritonLaunch:
    """One ``kernel[grid](...)`` call: the arguments as the JIT would bind them (``candidates``: one
    argument set per autotuning candidate, the first used for grid and bytes). For an autotuned kernel
    pruned by ``launch.pruner``: its spill table (``module.NAME``), each candidate's ``config_key`` and the
    head width the table is read at."""
    phase: str
    fn: JITFunction
    candidates: list          # [(args, kwargs, grid)], kwargs including the candidate's configuration
    autotuned: bool
    table: str | None = None
    config_keys: list = field(default_factory=list)
    width: int | None = None


@dataclass
class TorchLaunch:
    """One PyTorch op that runs a kernel: its name and the distinct tensors it reads and writes."""
    phase: str
    name: str
    tensors: list


# Ops that launch no kernel: allocations, views, metadata.
_NO_KERNEL = re.compile(r"^(empty|new_empty|detach|alias|lift_fresh|_local_scalar_dense|sym_|is_|_unsafe_view|"
                        r"_has_compatible_shallow_copy_type|set_|resize_)")


class TorchOps(TorchDispatchMode):
    """Records the PyTorch ops that would launch a CUDA kernel (below autograd: what actually runs,
    including the backward's)."""

    def __init__(self, sink: list, phase: list):
        super().__init__()
        self.sink, self.phase = sink, phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.namespace == "aten" and not func.is_view and not _NO_KERNEL.match(name):
            flat = [x for x in tree_flatten((args, kwargs, out))[0] if isinstance(x, torch.Tensor)]
            if any(x.device.type == "cuda" for x in flat):
                self.sink.append(TorchLaunch(self.phase[0], name, distinct(flat)))
        return out


def distinct(tensors) -> list:
    """The tensors, each once: the same storage, offset, shape, strides and dtype is the same tensor."""
    seen = {}
    for t in tensors:
        key = (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        seen.setdefault(key, t)
    return list(seen.values())


def _descriptor_type():
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:                                   # a Triton without host-side descriptors
        return None
    return TensorDescriptor


TensorDescriptor = _descriptor_type()


def is_descriptor(a) -> bool:
    return TensorDescriptor is not None and isinstance(a, TensorDescriptor)


def _copy_descriptor(a):
    """A descriptor's box is set by each candidate's pre-hook: record a copy, not the shared object."""
    return TensorDescriptor(a.base, list(a.shape), list(a.strides), list(a.block_shape)) if is_descriptor(a) else a


@contextlib.contextmanager
def recording(sink: list, phase: list, every_config: bool = False):
    """Record Triton launches and PyTorch kernels into ``sink`` instead of running them; ``phase[0]``
    tags each record (``"fwd"``/``"bwd"``). An autotuned kernel runs no benchmark: its pruning hook
    (``early_config_prune``, with the real arguments and the fake device) chooses the candidates, and
    each is recorded as the JIT would launch it (``every_config``: all of its ``configs``, unpruned)."""
    jit_run, tuner_run = JITFunction.run, Autotuner.run
    materialize = torch.autograd.function.FunctionCtx.set_materialize_grads
    group: list = []                                      # the candidates of the autotuner call under way

    def record(self, *args, grid, warmup, **kwargs):
        if group:
            group[0].candidates.append((args, kwargs, grid))
        else:
            sink.append(TritonLaunch(phase[0], self, [(args, kwargs, grid)], autotuned=False))

    def record_candidates(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        launch = TritonLaunch(phase[0], None, [], autotuned=True)
        launch.table, launch.width = spill_table(self, {**self.nargs, **kwargs})
        group.append(launch)
        try:
            for config in (self.configs if every_config else self.prune_configs(kwargs)):
                launch.config_keys.append(_config_key(config))
                if config.pre_hook is not None:             # e.g. the tensor descriptors' boxes
                    config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
                self.fn.run(*(_copy_descriptor(a) for a in args), **kwargs, **config.all_kwargs())
        finally:
            group.clear()
            self.nargs = None
        launch.fn = jit_function(self)
        sink.append(launch)

    def remember_materialize(ctx, value):
        ctx.materialize = value                           # the flag itself cannot be read back
        return materialize(ctx, value)

    JITFunction.run, Autotuner.run = record, record_candidates
    torch.autograd.function.FunctionCtx.set_materialize_grads = remember_materialize
    try:
        with TorchOps(sink, phase):
            yield
    finally:
        JITFunction.run, Autotuner.run = jit_run, tuner_run
        torch.autograd.function.FunctionCtx.set_materialize_grads = materialize


def _config_key(config) -> list:
    from attnlib.kernels.common.launch import config_key
    return list(config_key(config))


def spill_table(tuner, args: dict) -> tuple[str | None, int | None]:
    """``(module.NAME, width)`` of the ``SPILLS`` table an autotuner's pruning hook reads (a
    ``launch.pruner`` closure: its ``spills`` dict, found among the kernel modules' globals) and the head
    width it reads it at for these arguments; ``(None, None)`` for another hook."""
    prune = getattr(tuner, "early_config_prune", None)
    cells = dict(zip(getattr(getattr(prune, "__code__", None), "co_freevars", ()),
                     (c.cell_contents for c in (getattr(prune, "__closure__", None) or ()))))
    if "spills" not in cells or "width" not in cells:
        return None, None
    for name, module in sorted(sys.modules.items()):
        if name.startswith("attnlib.kernels"):
            for attr, value in vars(module).items():
                if value is cells["spills"]:
                    return f"{name}.{attr}", int(cells["width"](args))
    return None, None


def jit_function(kernel) -> JITFunction:
    """The ``JITFunction`` under autotuning / heuristics wrappers."""
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def backward(roots) -> None:
    """Run the backward of the graph below ``roots`` (``(output, grad)`` pairs) node by node, as the
    autograd engine would: each node once all its consumers have run, gradients of a node's input added
    up (as the engine's input buffers do), a gradient cast to the dtype its consumer recorded (the
    engine's ``validate_outputs``), an absent gradient of a custom Function's output materialised as
    zeros (``materialize_grads``). Leaves' ``AccumulateGrad`` nodes are not run (the first gradient of a
    leaf is stored, not copied). The engine itself cannot run on fake CUDA tensors in a CPU-only torch."""
    order, seen = [], set()
    for out, _ in roots:
        stack = [(out.grad_fn, False)]
        while stack:                                      # iterative post-order DFS over next_functions
            node, done = stack.pop()
            if node is None or (not done and node in seen):
                continue
            if done:
                order.append(node)
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((nxt, False) for nxt, _ in node.next_functions)
    pending: dict = {}
    for out, grad in roots:
        pending.setdefault(out.grad_fn, {})[out.output_nr] = grad
    for node in reversed(order):                          # consumers before producers
        grads = pending.pop(node, {})
        if not grads or node.name().endswith("AccumulateGrad"):
            continue
        meta = node._input_metadata
        inputs = [grads.get(i) for i in range(len(meta))]
        if hasattr(node, "_forward_cls"):                 # a custom autograd.Function
            if getattr(node, "materialize", True):       # set by set_materialize_grads (see recording)
                inputs = [g if g is not None else torch.zeros(m.shape, dtype=m.dtype, device=m.device)
                          for g, m in zip(inputs, meta)]
            outs = node.apply(*inputs)
        else:
            outs = node(*inputs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for (nxt, i), g in zip(node.next_functions, outs):
            if nxt is None or g is None:
                continue
            want = nxt._input_metadata[i]
            if tuple(g.shape) != tuple(want.shape):
                g = g.sum_to_size(want.shape)             # a broadcast input: the engine reduces too
            g = g if g.dtype == want.dtype else g.to(want.dtype)
            slot = pending.setdefault(nxt, {})
            slot[i] = g if i not in slot else slot[i] + g


# ----------------------------------------------------------------------------- the workloads

def _inputs(shape, layout: str, gated: bool, delta: bool):
    """Fake CUDA inputs that require grad, as the benchmarks make them: ``q, k, v`` in bf16, ``beta`` in
    bf16 and ``g`` (log-decay) in float32; ``layout`` ``"BHTD"`` (attnlib) or ``"BTHD"`` (fla)."""
    B, H, T, D = shape
    rows = (B, H, T) if layout == "BHTD" else (B, T, H)

    def x(*s, dtype=DTYPE):
        return torch.empty(*s, device="cuda", dtype=dtype, requires_grad=True)

    q, k, v = x(*rows, D), x(*rows, D), x(*rows, D)
    beta = x(*rows) if delta else None
    g = x(*rows, dtype=torch.float32) if gated else None
    return q, k, v, beta, g


# Variants of the ops that launch other specialisations, captured only for the spill tables.
VARIANTS = ("softmax_noncausal", "softmax_fused", "softmax_fused_noncausal", "linear_noncausal",
            "gated_delta_dq_only")


def run_attnlib(op: str, shape) -> torch.Tensor:
    """The public function, ``backend="auto"``, at its defaults (chunk 64, scale 1/sqrt(D)); or one of its
    :data:`VARIANTS`: non-causal, the fused softmax backward, a gradient for ``q`` alone."""
    import attnlib

    base = op.split("_noncausal")[0].split("_fused")[0].split("_dq_only")[0]
    q, k, v, beta, g = _inputs(shape, "BHTD", gated=base == "gated_delta", delta=base != "linear")
    causal = "noncausal" not in op
    if "dq_only" in op:
        k, v, beta, g = (None if x is None else x.detach() for x in (k, v, beta, g))
    if base == "softmax":
        return attnlib.softmax_attention(q, k, v, causal=causal, deterministic="fused" not in op)
    if base == "linear":
        return attnlib.linear_attention(q, k, v, causal=causal)   # identity feature map, not normalised
    return attnlib.delta_rule(q, k, v, beta, g=g)


def run_fla(op: str, shape) -> torch.Tensor:
    """fla's chunked op on the same logical problem, in its ``[B, T, H, D]`` layout."""
    q, k, v, beta, g = _inputs(shape, "BTHD", gated=op == "gated_delta", delta=op != "linear")
    scale = shape[3] ** -0.5
    if op == "linear":
        from fla.ops.linear_attn import chunk_linear_attn
        return chunk_linear_attn(q, k, v, scale=scale, normalize=False)[0]
    if op == "delta":
        from fla.ops.delta_rule import chunk_delta_rule
        return chunk_delta_rule(q, k, v, beta, scale=scale)[0]
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale)[0]


RUNNERS = {"attnlib": run_attnlib, "fla": run_fla}


def capture(lib: str, op: str, shape, every_config: bool = False) -> tuple[list, list]:
    """Every launch of the forward, then of the backward of ``<o, do>`` (one record list, tagged), and
    what the public function called (:func:`direct_calls`). ``every_config``: every autotuning candidate,
    not only those the pruning hook keeps (for the spill tables)."""
    sink, phase, calls = [], ["fwd"], []
    with FakeTensorMode(), recording(sink, phase, every_config):
        with direct_calls(RUNNERS[lib].__code__, calls):
            o = RUNNERS[lib](op, shape)
        do = torch.empty_like(o)
        phase[0] = "bwd"
        backward([(o, do)])
    return sink, calls


_FUNCTION_APPLY = torch.autograd.Function.apply.__func__.__code__


@contextlib.contextmanager
def direct_calls(caller, sink: list):
    """Record the Python functions (and ``torch.nn.functional`` builtins) that the public function --
    the function ``caller`` calls -- calls itself: its dispatch, e.g. the backend choice and then a
    PyTorch reference or SDPA, or the autograd Function of the kernels."""
    public = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_back is not None:
            module = frame.f_globals.get("__name__", "")
            if frame.f_back.f_code is caller and module.startswith("attnlib"):
                public.append(frame)
            elif public and frame.f_back is public[-1]:
                name = f"{module}.{frame.f_code.co_qualname}"
                if frame.f_code is _FUNCTION_APPLY:       # name the autograd Function, not Function.apply
                    cls = frame.f_locals.get("cls")
                    name = f"{cls.__module__}.{cls.__qualname__}.apply"
                if name.startswith("attnlib.") and name not in sink:
                    sink.append(name)
        elif event == "c_call" and public and frame is public[-1]:
            module = getattr(arg, "__module__", None) or ""
            if module.startswith(("torch._C._nn", "torch.nn.functional")):
                name = f"torch.nn.functional.{arg.__name__}"
                if name not in sink:
                    sink.append(name)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(previous)


# ----------------------------------------------------------------------------- describing a launch

def _stand_in(a):
    """What the binder sees for a fake tensor: a small real CPU tensor of its dtype and its 16-byte
    alignment (the binder specialises pointers on it); a tensor descriptor over such a tensor, with its
    shape, strides and box; anything else as it is."""
    if is_descriptor(a):
        return TensorDescriptor(_stand_in(a.base), list(a.shape), list(a.strides), list(a.block_shape))
    if not isinstance(a, torch.Tensor):
        return a
    size = a.element_size()
    return torch.empty(64, dtype=a.dtype)[a.storage_offset() % max(1, 16 // size):]


@functools.cache
def _binder(fn: JITFunction, sm: int):
    backend = make_backend(GPUTarget("cuda", sm, 32))
    return backend, create_function_from_signature(fn.signature, fn.params, backend)


def specialise(fn: JITFunction, args, kwargs, sm: int) -> dict:
    """The specialisation the JIT would compile for these arguments on ``sm``: signature, constexprs,
    attributes (divisibility, ``== 1``) and options (warps, stages...), as Triton's binder makes them."""
    backend, binder = _binder(fn, sm)
    kwargs = {k: _stand_in(v) for k, v in kwargs.items()}
    kwargs.setdefault("debug", False)
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    bound, spec, options = binder(*[_stand_in(a) for a in args], **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
    ref = f"{fn.fn.__module__}:{fn.fn.__qualname__}"
    key = repr((ref, sorted(signature.items()), sorted(constexprs.items()), sorted(attrs.items()),
                sorted(options.__dict__.items()), sm))
    names = [p.name for p in fn.params]
    declared = {p.name for p in fn.params if p.is_constexpr}       # not the integers specialised to 1
    return {"id": hashlib.sha1(key.encode()).hexdigest()[:16], "ref": ref, "kernel": fn.__name__, "sm": sm,
            "signature": signature, "constexprs": constexprs, "attrs": attrs, "options": options,
            "consts": {names[path[0]]: value for path, value in constexprs.items() if names[path[0]] in declared}}


def frontend_ttir(spec: dict, fn: JITFunction) -> str:
    """The kernel's TTIR for this specialisation (front end and Triton's TTIR passes: helpers inlined,
    dead code removed); no target code is generated."""
    from triton._C.libtriton import ir

    target = GPUTarget("cuda", spec["sm"], 32)
    backend = make_backend(target)
    options = spec["options"]
    src = ASTSource(fn=fn, signature=spec["signature"], constexprs=spec["constexprs"], attrs=spec["attrs"])
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                         context)
    stages: dict = {}
    backend.add_stages(stages, options, src.language)
    return str(stages["ttir"](module, {}))


_USED: dict = {}


def used_parameters(spec: dict, fn: JITFunction) -> set | None:
    """The parameters the specialised kernel refers to (its TTIR's public function body uses ``%NAME``);
    None if the TTIR could not be made (then every argument counts)."""
    if spec["id"] not in _USED:
        try:
            ttir = frontend_ttir(spec, fn)
        except Exception as exc:  # noqa: BLE001 - a kernel that does not build for this target: count all
            print(f"[warn] no TTIR for {spec['kernel']} on sm_{spec['sm']}: {exc}", file=sys.stderr)
            _USED[spec["id"]] = None
        else:
            header, _, body = ttir.partition(") attributes")
            params = re.findall(r"%([A-Za-z_][\w]*):", header.split("tt.func public", 1)[1])
            _USED[spec["id"]] = {p for p in params if re.search(rf"%{re.escape(p)}(?![\w])", body)}
    return _USED[spec["id"]]


def _named_arguments(fn: JITFunction, args, kwargs) -> dict:
    """Parameter name -> value, defaults applied (the values the grid function and the kernel see)."""
    params = fn.signature.parameters
    bound = fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
    bound.apply_defaults()
    return dict(bound.arguments)


def _tensor_name(t) -> str:
    """``bf16[4,16,4096,64]``: dtype and shape."""
    return f"{_DTYPE_NAMES.get(t.dtype, t.dtype)}[{','.join(map(str, t.shape))}]"


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
                torch.int64: "i64", torch.bool: "bool"}


def _plain(value):
    """A JSON-friendly constexpr value."""
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def describe_triton(launch: TritonLaunch, target: Target, specs: dict) -> dict:
    """A Triton launch as the report shows it: kernel, grid, tiles, warps, stages, bytes, dummies; its
    specialisations (one per autotuning candidate) go into ``specs``, by id."""
    fn = launch.fn
    cands = [specialise(fn, a, kw, target.sm) for a, kw, _ in launch.candidates]
    for s in cands:
        specs.setdefault(s["id"], s)
    args, kwargs, grid = launch.candidates[0]
    first = cands[0]
    named = _named_arguments(fn, args, kwargs)
    grid = grid(named) if callable(grid) else grid
    grid = [int(g) for g in grid] + [1] * (3 - len(grid))
    used = used_parameters(first, fn)
    tensors = {name: (v.base if is_descriptor(v) else v) for name, v in named.items()
               if isinstance(v, torch.Tensor) or is_descriptor(v)}
    counted = {n: t for n, t in tensors.items() if used is None or n in used}
    dummies = []
    for name, t in tensors.items():
        if name in counted:
            continue
        alias = next((n for n, u in counted.items() if len(distinct([t, u])) == 1), None)
        dummies.append({"param": name, "bytes": t.numel() * t.element_size(), "same_as": alias})
    programs = grid[0] * grid[1] * grid[2]
    out = {"phase": launch.phase, "kind": "triton", "kernel": fn.__name__, "grid": grid, "programs": programs,
           "waves": round(programs / target.sms, 3),
           "consts": {k: _plain(v) for k, v in first["consts"].items()},
           "num_warps": first["options"].num_warps, "num_stages": first["options"].num_stages,
           "bytes": sum(t.numel() * t.element_size() for t in distinct(counted.values())),
           "tensors": {n: _tensor_name(t) for n, t in counted.items()},
           "dummies": dummies, "specs": [s["id"] for s in cands]}
    if used is None:
        out["unused_arguments_unknown"] = True          # no TTIR: every tensor argument counted
    if launch.autotuned:
        out["candidates"] = [{k: _plain(v) for k, v in kw.items() if k in s["consts"] or k.startswith("num_")}
                             for (_, kw, _), s in zip(launch.candidates, cands)]
    return out


def describe_torch(launches: list) -> list:
    """PyTorch ops, one entry per (phase, op) in order of first appearance: count and bytes summed."""
    out: dict = {}
    for ln in launches:
        e = out.setdefault((ln.phase, ln.name), {"phase": ln.phase, "kind": "torch", "kernel": f"aten.{ln.name}",
                                                 "count": 0, "bytes": 0})
        e["count"] += 1
        e["bytes"] += sum(t.numel() * t.element_size() for t in ln.tensors)
    return list(out.values())


def capture_worker(lib: str, target_name: str, ops, shapes, spec_file: str | None,
                   every_config: bool = False, pointers: bool = False) -> dict:
    """One (library, target): every (op, shape) captured and described; the specialisations of the
    Triton launches pickled into ``spec_file`` for the compile step. ``every_config``: also the spill-table
    entries of every autotuning candidate (``"candidates"``: table, config key, width, specialisation)."""
    target = TARGETS[target_name]
    captures, specs, tabled = [], {}, []
    with fake_gpu(target), (pointer_loads() if pointers else contextlib.nullcontext()):
        for op in ops:
            if lib == "fla" and op not in CHUNKED:
                continue
            for shape in shapes:
                t0 = time.time()
                sink, calls = capture(lib, op, shape, every_config)
                for ln in sink:
                    if isinstance(ln, TritonLaunch) and ln.table:
                        for (a, kw, _), key in zip(ln.candidates, ln.config_keys):
                            tabled.append({"table": ln.table, "config_key": key, "width": ln.width,
                                           "spec": specialise(ln.fn, a, kw, target.sm)["id"]})
                triton_ = [describe_triton(ln, target, specs) for ln in sink if isinstance(ln, TritonLaunch)]
                torch_ = describe_torch([ln for ln in sink if isinstance(ln, TorchLaunch)])
                captures.append({"lib": lib, "op": op, "shape": list(shape), "target": target_name,
                                 "backend": "triton" if triton_ else "torch", "calls": calls,
                                 "launches": triton_ + torch_,
                                 "capture_s": round(time.time() - t0, 2)})
    if spec_file:
        with open(spec_file, "wb") as f:
            pickle.dump(specs, f)
    summary = {k: {"kernel": s["kernel"], "sm": s["sm"], "ref": s["ref"],
                   "consts": {c: _plain(v) for c, v in s["consts"].items()},
                   "num_warps": s["options"].num_warps, "num_stages": s["options"].num_stages}
               for k, s in specs.items()}
    return {"captures": captures, "specs": summary, "candidates": tabled}


# ----------------------------------------------------------------------------- compiling for a target

PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGS = re.compile(r"Used (\d+) registers")


def resolve_kernel(ref: str) -> JITFunction:
    """The ``JITFunction`` named ``module:qualname`` (as :func:`specialise` names it)."""
    module, name = ref.split(":")
    return jit_function(getattr(importlib.import_module(module), name))


def compile_spec(spec: dict) -> dict:
    """Compile one specialisation for its target: shared memory (Triton's metadata), registers and spill
    bytes (``ptxas -v``, captured from its log) and the dots of the TTGIR."""
    fn = resolve_kernel(spec["ref"])
    src = ASTSource(fn=fn, signature=spec["signature"], constexprs=spec["constexprs"], attrs=spec["attrs"])
    log = io.StringIO()
    knobs.nvidia.dump_ptxas_log = True
    with contextlib.redirect_stdout(log):
        compiled = triton.compile(src, target=GPUTarget("cuda", spec["sm"], 32), options=spec["options"].__dict__)
    text = log.getvalue()
    regs, spill = PTXAS_REGS.search(text), PTXAS_SPILL.search(text)
    if regs is None or spill is None:
        raise RuntimeError(f"no ptxas -v report for {spec['kernel']} (was it cached?):\n{text[-2000:]}")
    ptx = compiled.asm["ptx"]
    return {"shared_bytes": compiled.metadata.shared, "registers": int(regs.group(1)),
            "spill_store_bytes": int(spill.group(1)), "spill_load_bytes": int(spill.group(2)),
            "dots": ttgir_dots(compiled.asm["ttgir"]), "tma": "cp.async.bulk.tensor" in ptx,
            "mma": "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "fma"}


_DOT = re.compile(r"= (tt\.dot|ttng\.warp_group_dot) .*? : (.*?) -> (.*?) loc\((#loc\d*)\)\s*$")
_ELEM = re.compile(r"(?:tensor|memdesc)<((?:\d+x)+)(\w+?)[,>]")


def ttgir_dots(ttgir: str) -> list[dict]:
    """What each matrix product of a TTGIR lowers to.

    ``ttng.warp_group_dot`` is wgmma (sm_90); a ``tt.dot`` whose result has an ``nvidia_mma`` encoding is
    ``mma.sync`` (tensor cores, sm_80/sm_89); one with a ``blocked`` result runs on FMA units. Operand
    element types are read off the op's type signature; ``inputPrecision`` (absent: ieee) says whether
    float32 operands go through tf32. The source line is the innermost attnlib frame of the op's
    location, with the call chain (helpers are inlined: ``callsite(callee at caller)``)."""
    aliases = dict(re.findall(r"^(#\w+) = (#ttg\.\w+)<", ttgir, flags=re.M))
    locs = dict(re.findall(r"^(#loc\d*) = (loc\(.*\))\s*$", ttgir, flags=re.M))
    dots = []
    for line in ttgir.splitlines():
        m = _DOT.search(line)
        if not m:
            continue
        op, operands, result, loc = m.groups()
        (a_shape, a), (_, b) = _ELEM.findall(operands)[:2]
        (c_shape, c), = _ELEM.findall(result)[:1]
        encoding = re.search(r",\s*(#\w+)>\s*$", result).group(1)
        kind = ("wgmma" if op == "ttng.warp_group_dot" else
                "mma.sync" if aliases.get(encoding) == "#ttg.nvidia_mma" else "fma")
        precision = _input_precision(line) if "f32" in (a, b) else None   # meaningless for 16-bit operands
        m_, n_ = c_shape.rstrip("x").split("x")[-2:]
        k_ = a_shape.rstrip("x").split("x")[-1]
        frames = _frames(loc, locs)
        dots.append({"kind": kind, "a": a, "b": b, "acc": c, "precision": precision,
                     "tf32": "f32" in (a, b) and precision.startswith("tf32"), "mnk": f"{m_}x{n_}x{k_}",
                     "line": frames[0] if frames else None, "stack": frames})
    return dots


def _input_precision(line: str) -> str:
    """A dot's ``inputPrecision``: written out on ``tt.dot`` (absent when it is the default, ieee), an
    enum value on ``ttng.warp_group_dot``."""
    p = re.search(r"inputPrecision = (\w+)", line)
    if p is None:
        return "ieee"
    if not p.group(1).isdigit():
        return p.group(1).lower()
    names = {int(v.value): k.lower() for k, v in triton._C.libtriton.ir.INPUT_PRECISION.__members__.items()}
    return names[int(p.group(1))]


def _frames(ref: str, locs: dict) -> list[str]:
    """``attnlib/...py:LINE`` frames of a location, innermost first: every ``#locN`` expanded, then the
    file positions in textual order (``callsite(callee at caller)`` puts the callee first)."""
    seen: dict = {}

    def expand(r: str, depth=0) -> str:
        if r not in seen:
            text = locs.get(r, "")
            seen[r] = text if depth > 50 else re.sub(r"#loc\d*", lambda m: expand(m.group(0), depth + 1), text)
        return seen[r]

    frames = []
    for file, line in re.findall(r'"([^"]+\.py)":(\d+):\d+', expand(ref)):
        parts = Path(file).parts
        if "attnlib" in parts:                            # attnlib/..., wherever the checkout is
            frame = "/".join(parts[len(parts) - 1 - parts[::-1].index("attnlib"):]) + f":{line}"
            if frame not in frames:
                frames.append(frame)
    return frames


def compile_worker(spec_file: str) -> dict:
    """Compile every specialisation pickled in ``spec_file`` (a list of ``(id, spec)``)."""
    with open(spec_file, "rb") as f:
        jobs = pickle.load(f)
    out = {}
    for sid, spec in jobs:
        t0 = time.time()
        try:
            out[sid] = compile_spec(spec)
        except Exception as exc:  # noqa: BLE001 - reported per specialisation; the test fails on it
            out[sid] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        out[sid]["compile_s"] = round(time.time() - t0, 2)
    return out


# ----------------------------------------------------------------------------- running the workers

def _worker_env() -> dict:
    """The workers' environment: no interpreter; attnlib from PYTHONPATH if given (another checkout's
    kernels), else from this repository."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT)]))
    env["OMP_NUM_THREADS"] = "1"                          # each worker is one process on one core
    return env


@dataclass
class Job:
    """A worker subprocess: its command, and what to do with its output when it has finished."""
    what: str
    cmd: list
    done: object = None


def run_jobs(jobs: list[Job], parallel: int) -> None:
    """Run the jobs, at most ``parallel`` at a time, in list order; a finished job's ``done`` may add jobs
    (they run next). Raise with a worker's stderr if one fails."""
    running = []
    while jobs or running:
        while jobs and len(running) < parallel:
            job = jobs.pop(0)
            err = tempfile.TemporaryFile()
            running.append((job, err, subprocess.Popen(job.cmd, stdout=subprocess.DEVNULL, stderr=err,
                                                       env=_worker_env(), cwd=ROOT)))
        time.sleep(0.1)
        for item in list(running):
            job, err, proc = item
            if proc.poll() is None:
                continue
            running.remove(item)
            if proc.returncode:
                err.seek(0)
                for _, _, other in running:
                    other.kill()
                raise RuntimeError(f"{job.what} failed:\n{err.read().decode(errors='replace')[-6000:]}")
            if job.done:
                jobs[:0] = job.done() or []


def fla_available() -> str | None:
    """fla's version, or None where it is not installed."""
    try:
        from importlib.metadata import version
        return version("fla-core")
    except Exception:  # noqa: BLE001
        return None


COMPILE_BATCH = 12          # specialisations per compile worker: ~30 s of work for one ~2 s start-up


def collect(ops, shapes, targets, libs, compile_: bool, parallel: int, fla_targets=None,
            progress=sys.stderr, every_config: bool = False, pointer_targets=()) -> dict:
    """Capture every (library, target) in its own subprocess and compile attnlib's distinct
    specialisations for the compiled targets in batches, ``parallel`` subprocesses at a time. A target's
    compile batches start as soon as its capture is done (they run beside the other captures): attnlib's
    captures on the compiled targets go first, then the slow one (sm_75's PyTorch reference paths),
    then fla's."""
    work = Path(tempfile.mkdtemp(prefix="kernel-report-work-"))
    script = str(Path(__file__).resolve())
    data = {"captures": [], "specs": {}, "compiled": {}, "candidates": {}}
    queued: set = set()
    t0 = time.time()

    def compile_batches(spec_file: Path) -> list[Job]:
        with open(spec_file, "rb") as f:
            todo = [(k, s) for k, s in pickle.load(f).items() if k not in queued]
        queued.update(k for k, _ in todo)
        todo.sort(key=lambda ks: ks[1]["kernel"])
        batches = []
        for i in range(0, len(todo), COMPILE_BATCH):
            path = work / f"compile-{len(queued)}-{i}.pkl"
            with open(path, "wb") as f:
                pickle.dump(todo[i:i + COMPILE_BATCH], f)
            batches.append(Job(f"compile {path.name}", [sys.executable, script, "--worker", "compile",
                                                         "--spec-file", str(path), "--worker-out",
                                                         str(path.with_suffix(".json"))],
                               functools.partial(read_compiled, path.with_suffix(".json"))))
        return batches

    def read_compiled(path: Path) -> None:
        data["compiled"].update(json.loads(path.read_text()))

    def read_capture(lib: str, target: str, out: Path, spec_file: Path) -> list[Job]:
        part = json.loads(out.read_text())
        data["captures"] += part["captures"]
        data["specs"].update(part["specs"])
        data["candidates"][target] = data["candidates"].get(target, []) + part["candidates"]
        print(f"  captured {lib} on {target} ({time.time() - t0:.0f} s)", file=progress)
        return compile_batches(spec_file) if compile_ and lib == "attnlib" and target in COMPILED_TARGETS else []

    # attnlib on the targets it runs PyTorch paths on first (the reference loops make the longest
    # capture), then on the compiled targets (their compile batches queue up as each finishes), then fla.
    order = [("attnlib", t) for t in targets if t not in COMPILED_TARGETS]
    order += [("attnlib", t) for t in targets if t in COMPILED_TARGETS]
    order += [("fla", t) for t in (fla_targets or targets) if "fla" in libs]
    order = [(lib, t, False) for lib, t in order] + [("attnlib", t, True) for t in pointer_targets]
    jobs = []
    for lib, target, pointers in order:
        lib_ops = [op for op in ops if lib == "attnlib" or op in CHUNKED]
        if not lib_ops:
            continue
        tag = f"{lib}-{target}" + ("-pointers" if pointers else "")
        out, spec_file = work / f"capture-{tag}.json", work / f"specs-{tag}.pkl"
        jobs.append(Job(f"capture {tag}",
                        [sys.executable, script, "--worker", "capture", "--lib", lib, "--targets", target,
                         "--ops", ",".join(lib_ops), "--shapes", ",".join(map(shape_name, shapes)),
                         "--worker-out", str(out), "--spec-file", str(spec_file)]
                        + (["--every-config"] if every_config else []) + (["--pointer-loads"] if pointers else []),
                        functools.partial(read_capture, lib, target, out, spec_file)))
    run_jobs(jobs, parallel)
    print(f"captured {len(data['captures'])} (library, op, shape, target), compiled {len(data['compiled'])} "
          f"distinct specialisations in {time.time() - t0:.0f} s", file=progress)
    return data


# ----------------------------------------------------------------------------- the report

def sdpa_model(shape) -> dict:
    """Bytes of the ideal fused softmax attention (``SDPA_MODEL``) per pass."""
    B, H, T, D = shape
    x, lse = B * H * T * D * DTYPE.itemsize, B * H * T * 4
    fwd = 4 * x + lse                                     # q, k, v read; o, lse written
    bwd = 5 * x + lse + 3 * x                             # q, k, v, o, do, lse read; dq, dk, dv written
    return {"fwd": {"bytes": fwd, "launches": 1}, "fwd+bwd": {"bytes": fwd + bwd, "launches": 2}}


def totals(launches: list, target: Target) -> dict:
    """A pass's sums: launches (Triton, PyTorch), bytes (and the dummies' bytes, not counted), and the
    Triton launches with fewer programs than the target has SMs (they leave SMs idle)."""
    tri = [ln for ln in launches if ln["kind"] == "triton"]
    ops = [ln for ln in launches if ln["kind"] == "torch"]
    return {"launches": len(tri) + sum(ln["count"] for ln in ops), "triton_launches": len(tri),
            "torch_launches": sum(ln["count"] for ln in ops),
            "bytes": sum(ln["bytes"] for ln in launches), "triton_bytes": sum(ln["bytes"] for ln in tri),
            "torch_bytes": sum(ln["bytes"] for ln in ops),
            "dummy_bytes": sum(d["bytes"] for ln in tri for d in ln["dummies"]),
            "min_programs": min((ln["programs"] for ln in tri), default=None),
            "below_one_wave": sorted({ln["kernel"] for ln in tri if ln["programs"] < target.sms})}


def build_report(data: dict, ops, shapes, targets) -> dict:
    """Rows per op x shape x target x pass; launches per (library, op, shape, target); one entry per
    compiled specialisation; and a summary per compiled target."""
    by_key = {(c["lib"], c["op"], tuple(c["shape"]), c["target"]): c for c in data["captures"]}
    rows, launches = [], {}
    for c in sorted(data["captures"], key=lambda c: (c["lib"], c["op"], c["target"], c["shape"])):
        launches[f"{c['lib']}|{c['op']}|{shape_name(c['shape'])}|{c['target']}"] = {
            k: c[k] for k in ("backend", "calls", "launches", "capture_s")}
    for op in ops:
        for shape in shapes:
            for tname in targets:
                target, mine = TARGETS[tname], by_key.get(("attnlib", op, tuple(shape), tname))
                anchor = by_key.get(("fla", op, tuple(shape), tname))
                for pass_ in PASSES:
                    def pick(c):
                        return [ln for ln in c["launches"] if pass_ == "fwd+bwd" or ln["phase"] == "fwd"]
                    row = {"op": op, "shape": dict(zip("BHTD", shape), Dv=shape[3]), "target": tname,
                           "pass": pass_, "attnlib": {"backend": mine["backend"], **totals(pick(mine), target)}}
                    if op == "softmax":
                        row["anchor"] = {"name": "sdpa (model)", **sdpa_model(shape)[pass_]}
                    elif anchor is not None:
                        row["anchor"] = {"name": "fla", **totals(pick(anchor), target)}
                    if "anchor" in row:
                        row["ratio"] = round(row["attnlib"]["bytes"] / row["anchor"]["bytes"], 4)
                    rows.append(row)
    used_by: dict = {}                                    # specialisation -> the (op, D, phase) launching it
    for c in data["captures"]:
        for ln in c["launches"]:
            for sid in ln.get("specs", ()):
                used_by.setdefault(sid, set()).add(f"{c['op']} D{c['shape'][3]} {ln['phase']}")
    specs = {}
    for sid, s in sorted(data["specs"].items(), key=lambda kv: (kv[1]["sm"], kv[1]["kernel"], kv[0])):
        if sid in data["compiled"]:
            tname = f"sm_{s['sm']}"
            res = data["compiled"][sid]
            specs[sid] = {**s, "target": tname, "label": spec_label(s), "used_by": sorted(used_by.get(sid, ())), **res,
                          "shared_limit": TARGETS[tname].shared_memory,
                          "fits": "shared_bytes" in res and res["shared_bytes"] <= TARGETS[tname].shared_memory}
    return {"rows": rows, "launches": launches, "specialisations": specs,
            "summary": {t: target_summary(specs, t) for t in targets if t in COMPILED_TARGETS and specs},
            "dummy_arguments": dummy_arguments(data["captures"]),
            "pytorch_ops": pytorch_ops(data["captures"], [tuple(x) for x in shapes])}


def dummy_arguments(captures) -> list[str]:
    """attnlib's kernel arguments that the specialised kernel never uses (``kernel.PARAM = the tensor it
    stands in for``): they could be passed as None."""
    return sorted({f"{ln['kernel']}.{d['param']} = {d['same_as'] or 'a separate tensor'}" for c in captures
                   if c["lib"] == "attnlib" for ln in c["launches"] if ln["kind"] == "triton" for d in ln["dummies"]})


def pytorch_ops(captures, shapes) -> dict:
    """Per op, the PyTorch kernels that attnlib's Triton path launches around its kernels (casts,
    memsets...), at the first shape, on sm_90 if captured: ``phase aten.op xcount: bytes``."""
    out = {}
    mine = [c for c in captures if c["lib"] == "attnlib" and c["backend"] == "triton"]
    for c in sorted(mine, key=lambda c: (c["target"] != "sm_90", c["target"], shapes.index(tuple(c["shape"])))):
        out.setdefault(c["op"], [f"{ln['phase']} {ln['kernel']} x{ln['count']}: {ln['bytes']:,} B "
                                 f"({shape_name(c['shape'])}, {c['target']})"
                                 for ln in c["launches"] if ln["kind"] == "torch"])
    return out


def spec_label(s: dict) -> str:
    """``kernel[CHUNK=64 BLOCK_D=128 DELTA; 8 warps, 2 stages]``: the tiles and flags that tell one
    specialisation of a kernel from another."""
    consts = " ".join(k if v is True else f"{k}={v}" for k, v in s["consts"].items()
                      if v is True or (isinstance(v, int) and not isinstance(v, bool)))
    stages = f"{s['num_stages']} stage" + ("s" if s["num_stages"] != 1 else "")
    return f"{s['kernel']}[{consts}; {s['num_warps']} warps, {stages}]"


def target_summary(specs: dict, tname: str) -> dict:
    """Per target: what was compiled, what does not fit, what spills, what the dots lower to."""
    mine = {k: s for k, s in specs.items() if s["target"] == tname}
    ok = {k: s for k, s in mine.items() if "error" not in s}
    dots = [(s["kernel"], d) for s in ok.values() for d in s["dots"]]
    kinds: dict = {}
    for _, d in dots:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    return {"specialisations": len(mine), "errors": sorted(f"{s['kernel']}: {s['error']}" for s in mine.values()
                                                             if "error" in s),
            "max_shared_bytes": max((s["shared_bytes"] for s in ok.values()), default=0),
            "shared_limit": TARGETS[tname].shared_memory,
            "not_fitting": sorted({f"{s['label']}: {s['shared_bytes']} B" for s in ok.values() if not s["fits"]}),
            "spilling": sorted({f"{s['label']}: {s['spill_store_bytes']}/{s['spill_load_bytes']} B "
                                f"({', '.join(s['used_by'])})"
                                for s in ok.values() if s["spill_store_bytes"] or s["spill_load_bytes"]}),
            "max_registers": max((s["registers"] for s in ok.values()), default=0),
            "dots": kinds, "tf32_dots": sorted({f"{k} {d['line']}" for k, d in dots if d["tf32"]}),
            "fma_dots": sorted({f"{k} {d['line']}" for k, d in dots if d["kind"] == "fma"})}


def mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f}"


def print_report(report: dict, out=sys.stdout) -> None:
    """The table: on sm_90 (else the first target captured) one line per op x shape x pass -- launches,
    bytes of attnlib vs its anchor, ratio; then sm_75's dispatch; then per compiled target the fit, spill
    and dot summary."""
    rows = report["rows"]
    shown = "sm_90" if any(r["target"] == "sm_90" for r in rows) else rows[0]["target"]
    print(f"\n{shown}: bytes touched (MB), attnlib vs anchor (fla; softmax: the SDPA model)", file=out)
    print(f"{'op':<12} {'B x H x T x D':<17} {'pass':<8} {'launches':>10} {'attnlib MB':>11} {'anchor MB':>10} "
          f"{'ratio':>6}  {'dummies MB':>10}  below one wave", file=out)
    for r in rows:
        if r["target"] != shown:
            continue
        a, n = r["attnlib"], r.get("anchor", {})
        shape = "x".join(str(r["shape"][k]) for k in "BHTD")
        print(f"{r['op']:<12} {shape:<17} {r['pass']:<8} {a['triton_launches']:>5}+{a['torch_launches']:<4} "
              f"{mb(a['bytes']):>11} {mb(n.get('bytes')):>10} {r.get('ratio', '-'):>6}  {mb(a['dummy_bytes']):>10}  "
              f"{','.join(a['below_one_wave'])}", file=out)
    print("(launches: Triton + PyTorch ops)", file=out)
    if any(r["target"] == "sm_75" for r in rows):
        print("\nsm_75 (T4): what auto runs (the public function's calls, first shape; Triton launches at every shape)",
              file=out)
        for op in report["ops"]:
            caps = [c for key, c in report["launches"].items() if key.startswith(f"attnlib|{op}|")
                    and key.endswith("|sm_75")]
            if caps:
                tri = sum(ln["kind"] == "triton" for c in caps for ln in c["launches"])
                calls = ", ".join(x.removeprefix("attnlib.") for x in caps[0]["calls"])
                print(f"  {op:<12} Triton launches {tri}; backend {caps[0]['backend']}: {calls}", file=out)
    if report["pytorch_ops"]:
        print("\nattnlib's PyTorch ops around its kernels (bytes):", file=out)
        for op, lines in report["pytorch_ops"].items():
            print(f"  {op:<12} " + ("; ".join(lines) or "none"), file=out)
    if report["dummy_arguments"]:
        print(f"\nattnlib's unused (dummy) kernel arguments, not counted ({len(report['dummy_arguments'])}): "
              + "; ".join(report["dummy_arguments"]), file=out)
    for tname, s in report["summary"].items():
        print(f"\n{tname}: {s['specialisations']} specialisations compiled; shared memory max {s['max_shared_bytes']} "
              f"of {s['shared_limit']} B; registers max {s['max_registers']}; dots {s['dots']}", file=out)
        for label in ("errors", "not_fitting", "spilling", "tf32_dots", "fma_dots"):
            if s[label]:
                print(f"  {label} ({len(s[label])}): " + "; ".join(s[label]), file=out)


def dumps(report: dict) -> str:
    """The report as JSON, one line per row, per capture's launch list and per specialisation (readable in
    a diff, a few MB rather than tens)."""
    def entries(d, brackets):
        items = d.items() if isinstance(d, dict) else enumerate(d)
        lines = [(f"  {json.dumps(k)}: " if isinstance(d, dict) else "  ") + json.dumps(v, separators=(",", ":"))
                 for k, v in items]
        return brackets[0] + "\n" + ",\n".join(lines) + "\n " + brackets[1]

    parts = []
    for key, value in report.items():
        if key in ("rows", "launches", "specialisations"):
            text = entries(value, "[]" if isinstance(value, list) else "{}")
        else:
            text = json.dumps(value, indent=1).replace("\n", "\n ")
        parts.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


SPILL_SHAPES = ((1, 2, 4096, 64), (1, 2, 4096, 128), (1, 2, 4096, 256))


def spill_tables(data: dict) -> dict:
    """``{table: {family: {config_key: narrowest width that spilled}}}`` from every candidate compiled on
    each target: the ``SPILLS`` tables ``launch.pruner`` reads (a candidate that spills at some head width
    is pruned at that width and wider)."""
    from attnlib.kernels.common.launch import family as family_of

    tables: dict = {}
    for tname, cands in data["candidates"].items():
        family = family_of(TARGETS[tname].capability)
        for c in cands:
            res = data["compiled"].get(c["spec"], {})
            table = tables.setdefault(c["table"], {}).setdefault(family, {})
            if res.get("spill_store_bytes") or res.get("spill_load_bytes") or "error" in res:
                key = tuple(c["config_key"])
                table[key] = min(table.get(key, c["width"]), c["width"])
    return tables


def print_spill_tables(tables: dict, out=sys.stdout) -> None:
    """The tables as Python literals, one per module constant, to paste into the kernel modules."""
    for name in sorted(tables):
        print(f"# {name}", file=out)
        body = ", ".join(f'"{fam}": {{' + ", ".join(f"{k}: {w}" for k, w in sorted(entries.items())) + "}"
                         for fam, entries in sorted(tables[name].items()))
        print(f"{name.rsplit('.', 1)[1]} = {{{body}}}", file=out)


def inputs_fingerprint() -> str:
    """A hash of everything the default report is a function of: the library's ops and kernels
    (attnlib's source, less the figures, experiments and lab helpers, which launch nothing), this script
    and ``kernel_resources.py``, and the torch, triton (whose ptxas compiles), fla and Python versions.
    Two runs with the same fingerprint make the same report, less its date and time:
    ``tests/test_kernel_report.py`` reuses the committed report when the fingerprint matches instead of
    compiling every specialisation again, and ``tests/test_kernel_registers.py`` its committed compile
    counts likewise."""
    import importlib.metadata
    h = hashlib.sha256()
    skip = ("widgets", "experiments")
    files = sorted(f for f in (ROOT / "attnlib").rglob("*.py")
                   if not set(f.relative_to(ROOT / "attnlib").parts[:1]) & set(skip) and f.name != "lab.py")
    for f in [*files, Path(__file__).resolve(), ROOT / "scripts" / "kernel_resources.py"]:
        h.update(f.relative_to(ROOT).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    for pkg in ("torch", "triton", "fla-core"):
        try:
            h.update(f"{pkg}={importlib.metadata.version(pkg)}\0".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{pkg}=-\0".encode())
    h.update(f"python={sys.version_info[0]}.{sys.version_info[1]}".encode())
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, from {','.join(OPS)}")
    ap.add_argument("--shapes", default=",".join(map(shape_name, SHAPES)), help="comma-separated BxHxTxD")
    ap.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, from {','.join(TARGETS)}")
    ap.add_argument("--no-fla", action="store_true", help="attnlib only")
    ap.add_argument("--fla-targets", help="capture fla on these targets only (default: every --targets)")
    ap.add_argument("--no-compile", action="store_true", help="capture only: launches and bytes")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel worker processes")
    ap.add_argument("--no-save", action="store_true", help=f"do not write {RESULT.relative_to(ROOT)}")
    ap.add_argument("--json-out", help="write the report to this file (as well)")
    ap.add_argument("--fingerprint", action="store_true", help="print the inputs' fingerprint and exit")
    ap.add_argument("--spill-tables", action="store_true",
                    help="compile every autotuning candidate of attnlib's kernels (every op and variant, D "
                         "64/128/256, sm_80/89/90, on sm_90 both load paths) and print the SPILLS tables "
                         "their pruning hooks read")
    ap.add_argument("--every-config", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pointer-loads", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=("capture", "compile"), help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    ap.add_argument("--spec-file", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.fingerprint:
        print(inputs_fingerprint())
        return 0
    ops = [o for o in a.ops.split(",") if o]
    shapes = [parse_shape(s) for s in a.shapes.split(",") if s]
    targets = [t for t in a.targets.split(",") if t]
    for o in ops:
        if o not in OPS + VARIANTS:
            ap.error(f"unknown op {o!r}")
    for t in targets:
        if t not in TARGETS:
            ap.error(f"unknown target {t!r}")
    if a.worker == "capture":
        out = capture_worker(a.lib, targets[0], ops, shapes, a.spec_file, a.every_config, a.pointer_loads)
        Path(a.worker_out).write_text(json.dumps(out))
        return 0
    if a.worker == "compile":
        Path(a.worker_out).write_text(json.dumps(compile_worker(a.spec_file)))
        return 0

    if a.spill_tables:               # every op and variant; on sm_90 both load paths (descriptors, pointers)
        data = collect(list(OPS + VARIANTS), SPILL_SHAPES, COMPILED_TARGETS, ["attnlib"], True, max(1, a.jobs),
                       every_config=True, pointer_targets=["sm_90"])
        print_spill_tables(spill_tables(data))
        return 0
    fla = None if a.no_fla else fla_available()
    if fla is None and not a.no_fla:
        print("[warn] fla-core is not installed: the report has no anchor for the chunked ops", file=sys.stderr)
    libs = ["attnlib"] + (["fla"] if fla else [])
    t0 = time.time()
    fla_targets = [t for t in (a.fla_targets or "").split(",") if t in targets] or None
    data = collect(ops, shapes, targets, libs, not a.no_compile, max(1, a.jobs), fla_targets)
    report = {"what": "static performance report: every kernel launch of attnlib's ops (backend='auto') and "
                      "of fla's, on fake GPUs of the targets; attnlib's Triton launches compiled for sm_80/89/90. "
                      "Nothing ran on a GPU; nothing is timed.",
              "dtype": "bf16", "ops": ops, "shapes": [shape_name(s) for s in shapes],
              "targets": {t: {"gpu": TARGETS[t].gpu, "sms": TARGETS[t].sms,
                              "shared_memory_per_block": TARGETS[t].shared_memory} for t in targets},
              "bytes": BYTES, "softmax_anchor": SDPA_MODEL, "autotuned": AUTOTUNED, "torch_paths": TORCH_PATHS,
              "triton": triton.__version__, "torch": torch.__version__, "fla": fla,
              "date": datetime.date.today().isoformat(), "seconds": round(time.time() - t0, 1),
              **build_report(data, ops, shapes, targets)}
    everything = (ops == list(OPS) and shapes == list(SHAPES) and targets == list(TARGETS) and fla
                  and fla_targets is None and not a.no_compile)
    if everything:                   # the default, complete report: reusable while its inputs are unchanged
        report["inputs_sha256"] = inputs_fingerprint()
    print_report(report)
    text = dumps(report)
    if a.json_out:
        Path(a.json_out).write_text(text)
    if not a.no_save:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(text)
        print(f"\nwrote {RESULT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
