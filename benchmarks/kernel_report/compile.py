"""Specialising and compiling: the specialisation the JIT would compile for each recorded launch, the
launch as the report describes it (grid, tiles, bytes, dummies), and each specialisation compiled for
its target (shared memory, ``ptxas -v`` registers and spills, what the TTGIR's dots lower to)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import io
import pickle
import re
import sys
import time
from pathlib import Path

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from .record import TensorDescriptor, TritonLaunch, distinct, is_descriptor, jit_function
from .targets import Target


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
