"""Recording launches: every Triton launch and PyTorch kernel of a public function's forward and backward,
recorded on fake CUDA tensors instead of run; the workloads (attnlib's ops and fla's) and the capture."""

from __future__ import annotations

import contextlib
import re
import sys
from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from triton.runtime.autotuner import Autotuner
from triton.runtime.jit import JITFunction

from .targets import DTYPE


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
            "gated_delta_dq_only", "window", "window_noncausal")


def run_attnlib(op: str, shape) -> torch.Tensor:
    """The public function, ``backend="auto"``, at its defaults (chunk 64, scale 1/sqrt(D)); or one of its
    :data:`VARIANTS`: non-causal, the fused softmax backward, a gradient for ``q`` alone, sliding-window
    attention (whose kernels have SPILLS tables of their own)."""
    import attnlib

    base = op.split("_noncausal")[0].split("_fused")[0].split("_dq_only")[0]
    q, k, v, beta, g = _inputs(shape, "BHTD", gated=base == "gated_delta", delta=base != "linear")
    causal = "noncausal" not in op
    if "dq_only" in op:
        k, v, beta, g = (None if x is None else x.detach() for x in (k, v, beta, g))
    if base == "softmax":
        return attnlib.softmax_attention(q, k, v, causal=causal, deterministic="fused" not in op)
    if base == "window":
        # the band of the window kernels' compile workloads (a runtime integer: registers do not depend on it)
        from attnlib.kernels.window import WINDOW
        from attnlib.window import sliding_window_attention
        return sliding_window_attention(q, k, v, window=WINDOW, causal=causal)
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
