"""Registers, spills and shared memory of the chunked, flash and block-sparse Triton kernels, compiled
on the CPU for an A100 (sm_80), an L4 (sm_89) or an H100 (sm_90; the default). A compile-time resource
report, not a timing: nothing runs on a GPU.

How. The public wrappers (``linear_chunk_forward/backward``, ``delta_rule_chunk_forward/backward``,
``flash_attention_forward/backward``, ``block_sparse_attention_forward/backward``) run under
``FakeTensorMode`` on a fake CUDA device, so every block size, warp count and stage count is the one
they would choose on a GPU of the target (``common/launch.py``; the device queries -- compute
capability, shared memory per block -- answer for the target, ``--sm``). Each kernel launch is
intercepted instead of run; its arguments go through Triton's own binder (the specialisation the JIT
would make: pointer and integer divisibility by 16, integers equal to 1 as constants; a tensor
descriptor's dtype and box) and the kernel is compiled with ``triton.compile`` for
``GPUTarget("cuda", sm, 32)``. Triton hands the PTX to its bundled ``ptxas -v``; we capture that log
(``TRITON_DUMP_PTXAS_LOG``) for registers per thread and spill bytes, read the shared memory Triton
allocates from the compiled metadata, and from the PTX which instruction the products lower to
(``wgmma``, ``mma.sync`` or neither: FMA) and whether tiles are loaded by TMA (``cp.async.bulk.tensor``).

Autotuned kernels (the flash forward and backward) would benchmark on a GPU. Here the autotuner's
launch is intercepted too: its ``early_config_prune`` hook runs (with the real arguments: D, dtype, and
the target's shared memory and spill table) and every configuration it keeps -- any of which the
autotuner may pick -- is captured as its own launch, after the configuration's pre-hook (which sets the
tensor descriptors' boxes).
``--every-config`` skips the hook and captures the whole ``configs`` list (to see what the hook removes).
The block-sparse wrappers are run with ``block_size`` 128, the largest tiles they launch.

Run with TRITON_INTERPRET unset, from the repository root:

    PYTHONPATH=$PWD python scripts/kernel_resources.py                       # D 64/128/256, bf16+fp16
    PYTHONPATH=$PWD python scripts/kernel_resources.py --dims 128 --dtypes bf16 --kernels _bwd_dqk_kernel --no-save
    PYTHONPATH=$PWD python scripts/kernel_resources.py --kernels _flash_fwd_kernel --every-config --no-save
    PYTHONPATH=$PWD python scripts/kernel_resources.py --sm 80 89 90 --dtypes bf16 --every-config --no-save \
        --workloads "flash,flash non-causal,flash fused,flash fused non-causal" --spill-tables

The last, run once more with ``--sm 90 --no-tma`` (the pointer path on sm_90) and the rows of both
passed through :func:`spill_tables`, gives the flash kernels' ``SPILLS`` tables (``--spill-tables``
prints those of one run). ``--json-stdout`` prints the rows as one JSON line
(``tests/test_kernel_registers.py`` reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import io
import json
import os
import re
import sys
import tempfile
import types
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)          # before attnlib imports its kernels
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")          # the 3.9 default, without its warning
os.environ["TRITON_ALWAYS_COMPILE"] = "1"                    # a cached kernel would skip ptxas and its log
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="kernel-resources-"))   # always run ptxas

import torch  # noqa: E402
import triton  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGET = GPUTarget("cuda", 90, 32)               # set by --sm (main) or use_target()
RESULT = ROOT / "benchmarks" / "results" / "kernel_resources.json"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SEQ_LEN = 4096                                    # the length the integers are specialised for (T % 16 == 0)
BLOCK_SIZE = 128                                  # the block-sparse mask's block: the widest kernel tiles


# ----------------------------------------------------------------------------- what the wrappers launch

def workloads(D: int, dtype: torch.dtype) -> dict:
    """Forward and backward of each chunked, flash and block-sparse mechanism at head dim ``D`` (Dv = D),
    as callables (the flash backward in both forms: deterministic and fused)."""
    from attnlib.kernels.block_sparse import block_sparse_attention_backward, block_sparse_attention_forward
    from attnlib.kernels.delta.chunk import delta_rule_chunk_backward, delta_rule_chunk_forward
    from attnlib.kernels.flash import flash_attention_backward, flash_attention_forward
    from attnlib.kernels.linear.chunk import linear_chunk_backward, linear_chunk_forward

    B, H, T = 1, 1, SEQ_LEN
    dev = torch.device("cuda")

    def x(*shape, dt=dtype):
        return torch.empty(*shape, device=dev, dtype=dt)

    def linear(causal):
        q, k, v, do = x(B, H, T, D), x(B, H, T, D), x(B, H, T, D), x(B, H, T, D)
        s0, dS = x(B, H, D, D, dt=torch.float32), x(B, H, D, D, dt=torch.float32)
        linear_chunk_forward(q, k, v, s0, scale=D ** -0.5, causal=causal)
        linear_chunk_backward(q, k, v, s0, do, dS, scale=D ** -0.5, causal=causal)

    def delta(gated, only_dq=False):
        q, k, v, do = x(B, H, T, D), x(B, H, T, D), x(B, H, T, D), x(B, H, T, D)
        beta = x(B, H, T)
        g = x(B, H, T, dt=torch.float32) if gated else None
        s0, dS = x(B, H, D, D, dt=torch.float32), x(B, H, D, D, dt=torch.float32)
        _, _, saved = delta_rule_chunk_forward(q, k, v, beta, g, scale=D ** -0.5, initial_state=s0)
        delta_rule_chunk_backward(q, k, v, beta, s0, saved, do, dS, scale=D ** -0.5, chunk_size=64, only_dq=only_dq)

    # Two heads: with one, the JIT would specialise ``H = 1`` away (the chunked kernels take no H).
    def attention(B=1, H=2):
        return x(B, H, T, D), x(B, H, T, D), x(B, H, T, D), x(B, H, T, D), x(B, H, T, dt=torch.float32)

    def flash(causal, deterministic=True):
        q, k, v, do, dlse = attention()
        o, lse = flash_attention_forward(q, k, v, scale=D ** -0.5, causal=causal)
        flash_attention_backward(q, k, v, o, lse, do, dlse, scale=D ** -0.5, causal=causal,
                                 deterministic=deterministic)

    def block_sparse(causal):
        q, k, v, do, dlse = attention()
        n = T // BLOCK_SIZE
        mask = torch.empty(q.shape[1], n, n, device=dev, dtype=torch.bool)
        kw = dict(block_size=BLOCK_SIZE, scale=D ** -0.5, causal=causal)
        o, lse = block_sparse_attention_forward(q, k, v, mask, **kw)
        block_sparse_attention_backward(q, k, v, o, lse, do, dlse, mask, **kw)

    return {"linear": lambda: linear(True), "linear non-causal": lambda: linear(False),
            "delta": lambda: delta(False), "gated delta": lambda: delta(True),
            "gated delta, dq only": lambda: delta(True, only_dq=True),
            "flash": lambda: flash(True), "flash non-causal": lambda: flash(False),
            "flash fused": lambda: flash(True, False), "flash fused non-causal": lambda: flash(False, False),
            "block-sparse": lambda: block_sparse(True), "block-sparse non-causal": lambda: block_sparse(False)}


@contextlib.contextmanager
def intercept_launches(sink: list, every_config: bool = False):
    """Record ``(kernel, args, kwargs)`` for every ``kernel[grid](...)`` instead of launching it. An
    autotuned kernel is recorded once per candidate configuration: those its ``early_config_prune``
    keeps for these arguments, or all of its ``configs`` with ``every_config``."""
    original, contiguous, autotuned = JITFunction.run, torch.Tensor.contiguous, Autotuner.run

    def record(self, *args, grid, warmup, **kwargs):
        sink.append((self, args, kwargs))

    def record_candidates(self, *args, **kwargs):
        self.nargs = dict(zip(self.arg_names, args))
        candidates = self.configs if every_config else self.prune_configs(kwargs)
        for config in candidates:
            if config.pre_hook is not None:          # e.g. the tensor descriptors' boxes
                config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
            # A descriptor is mutated by the next candidate's hook: record a copy of this one's.
            self.fn.run(*(_copy_descriptor(a) for a in args), **kwargs, **config.all_kwargs())
        self.nargs = None

    def fake_contiguous(self, memory_format=torch.contiguous_format):
        # A fake CUDA tensor's .contiguous() of a transposed view asks for a CUDA device; a clone does not.
        return self if self.is_contiguous() else self.clone(memory_format=memory_format)

    JITFunction.run, torch.Tensor.contiguous, Autotuner.run = record, fake_contiguous, record_candidates
    try:
        yield
    finally:
        JITFunction.run, torch.Tensor.contiguous, Autotuner.run = original, contiguous, autotuned


def _copy_descriptor(a):
    return dataclasses.replace(a, block_shape=list(a.block_shape)) if isinstance(a, TensorDescriptor) else a


def _real(a):
    """A small real CPU tensor standing in for a fake one (the binder reads its dtype and alignment); a
    tensor descriptor keeps its shape, strides and box over such a tensor."""
    if isinstance(a, TensorDescriptor):
        return TensorDescriptor(_real(a.base), list(a.shape), list(a.strides), list(a.block_shape))
    return torch.empty(16, dtype=a.dtype) if isinstance(a, torch.Tensor) else a


CAPABILITY = {80: (8, 0), 86: (8, 6), 89: (8, 9), 90: (9, 0)}


@contextlib.contextmanager
def pointer_loads():
    """The wrappers' pointer path on every target: the fallback of the tensor-descriptor (TMA) loads on
    sm_90, taken for strides TMA cannot address or a Triton without host-side descriptors."""
    from attnlib.kernels.common import launch

    saved = launch.tma_device
    launch.tma_device = lambda device: False
    try:
        yield
    finally:
        launch.tma_device = saved


@contextlib.contextmanager
def use_target(sm: int):
    """Compile for ``sm_<sm>``, and let the wrappers' device queries answer for that GPU: its compute
    capability (``launch.target_family``, ``launch.tma_device``) and its shared memory per block
    (``launch.shared_memory_limit``, from ``launch.SHARED_MEMORY``)."""
    from attnlib.kernels.common.launch import SHARED_MEMORY

    global TARGET
    cap = CAPABILITY[sm]
    props = types.SimpleNamespace(shared_memory_per_block_optin=SHARED_MEMORY[cap], shared_memory_per_block=48 * 1024,
                                  multi_processor_count=132, major=cap[0], minor=cap[1], name=f"sm_{sm}")
    saved = TARGET, torch.cuda.get_device_capability, torch.cuda.get_device_properties
    TARGET = GPUTarget("cuda", sm, 32)
    torch.cuda.get_device_capability = lambda device=None: cap
    torch.cuda.get_device_properties = lambda device=None: props
    try:
        yield
    finally:
        TARGET, torch.cuda.get_device_capability, torch.cuda.get_device_properties = saved


def launches(D: int, dtype: torch.dtype, names=None, every_config: bool = False, only=None) -> list[dict]:
    """Every distinct kernel specialisation the wrappers launch at ``D`` in ``dtype`` (for an autotuned
    kernel: every candidate configuration, see :func:`intercept_launches`); ``only``: these workloads."""
    backend = make_backend(TARGET)
    seen, out = {}, []
    for workload, run in workloads(D, dtype).items():
        if only and workload not in only:
            continue
        sink: list = []
        with FakeTensorMode(), intercept_launches(sink, every_config):
            run()
        for fn, args, kwargs in sink:
            if names and fn.__name__ not in names:
                continue
            args = [_real(a) for a in args]
            kwargs = {k: _real(v) for k, v in kwargs.items()}
            kwargs.setdefault("debug", False)
            kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
            kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
            binder = create_function_from_signature(fn.signature, fn.params, backend)
            bound, spec, options = binder(*args, **kwargs)
            options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, options)
            key = (fn.__name__, repr(sorted(signature.items())), repr(sorted(constexprs.items())),
                   options.num_warps, options.num_stages)
            if key in seen:
                seen[key]["used_by"].append(workload)
                continue
            names_ = [p.name for p in fn.params]
            consts = {names_[k[0]]: v for k, v in constexprs.items()}
            entry = dict(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs, options=options,
                         kernel=fn.__name__, consts=consts, used_by=[workload])
            seen[key] = entry
            out.append(entry)
    return out


# ----------------------------------------------------------------------------- compile and count

PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_REGS = re.compile(r"Used (\d+) registers")


_COUNTED: dict = {}


def compile_and_count(entry: dict) -> dict:
    """Compile one launch for the target and read ptxas's counts (memoised: the same specialisation recurs
    across D, e.g. the triangular solve, and Triton would not run ptxas again for it)."""
    key = (TARGET.arch, entry["kernel"], repr(sorted(entry["signature"].items())),
           repr(sorted(entry["constexprs"].items())), repr(sorted(entry["options"].__dict__.items())))
    if key not in _COUNTED:
        _COUNTED[key] = _compile_and_count(entry)
    return {**_COUNTED[key], "used_by": entry["used_by"]}


def _compile_and_count(entry: dict) -> dict:
    src = ASTSource(fn=entry["fn"], signature=entry["signature"], constexprs=entry["constexprs"],
                    attrs=entry["attrs"])
    log = io.StringIO()
    knobs.nvidia.dump_ptxas_log = True
    with contextlib.redirect_stdout(log):
        ck = triton.compile(src, target=TARGET, options=entry["options"].__dict__)
    text = log.getvalue()
    regs, spill = PTXAS_REGS.search(text), PTXAS_SPILL.search(text)
    if regs is None or spill is None:
        raise RuntimeError(f"no ptxas -v report for {entry['kernel']} (was it cached?):\n{text[-2000:]}")
    c = entry["consts"]
    flags = [k for k, v in c.items() if v is True]
    tiles = ("CHUNK", "BLOCK_D", "BLOCK_K", "BLOCK_V", "BLOCK_DV")    # BLOCK_M, BLOCK_N, BS: in the flags
    flags += [f"{k}={v}" for k, v in c.items() if type(v) is int and k not in tiles]
    flags += [f"{k}={v}" for k, v in entry["signature"].items() if k in ("O", "V") and v == "*fp32"]
    ptx = ck.asm["ptx"]
    mma = "wgmma" if "wgmma.mma_async" in ptx else "mma.sync" if "mma.sync" in ptx else "fma"
    return {"kernel": entry["kernel"], "sm": TARGET.arch, "flags": flags, "mma": mma,
            "tma": "cp.async.bulk.tensor" in ptx,
            "chunk": c.get("CHUNK"), "block_d": c.get("BLOCK_D", c.get("BLOCK_K")),
            "block_v": c.get("BLOCK_V", c.get("BLOCK_DV")),
            "num_warps": entry["options"].num_warps, "num_stages": entry["options"].num_stages,
            "registers": int(regs.group(1)), "spill_store_bytes": int(spill.group(1)),
            "spill_load_bytes": int(spill.group(2)), "shared_bytes": ck.metadata.shared}


def _launch_shape(entry: dict) -> tuple:
    """A launch up to its head width: kernel, constants other than the head tiles, warps and stages."""
    consts = {k: v for k, v in entry["consts"].items() if k not in ("BLOCK_D", "BLOCK_DV", "BLOCK_K", "BLOCK_V")}
    return entry["kernel"], repr(sorted(consts.items())), entry["options"].num_warps, entry["options"].num_stages


def report(dims, dtypes, names=None, progress=sys.stderr, every_config: bool = False, only=None,
           widest_only: bool = False, sms=(90,), tma: bool = True) -> list[dict]:
    """Compile and count every launch, for each target in ``sms``. ``widest_only``: a launch that recurs
    at several head widths (the same autotuning candidate kept at D 64 and 128) is compiled at the
    widest only -- the registers of a configuration never fell when D shrank, in every row of the
    saved report. ``tma=False``: the pointer path on sm_90 too (:func:`pointer_loads`)."""
    rows = []
    for sm in sms:
        with use_target(sm), (contextlib.nullcontext() if tma else pointer_loads()):
            for dt in dtypes:
                done = set()
                for D in sorted(dims, reverse=widest_only):
                    for entry in launches(D, DTYPES[dt], names, every_config, only):
                        if widest_only:
                            if _launch_shape(entry) in done:
                                continue
                            done.add(_launch_shape(entry))
                        row = {"D": D, "dtype": dt, **compile_and_count(entry)}
                        rows.append(row)
                        if progress:
                            print(fmt_row(row), file=progress, flush=True)
    return rows


HEADER = (f"{'sm':>3} {'kernel':<29} {'flags':<40} {'D':>4} {'dtype':<5} {'chunk':>5} {'BD':>4} {'BV':>4} "
          f"{'warps':>5} {'stages':>6} {'regs':>4} {'spill st/ld B':>14} {'smem B':>7} {'mma':>8} tma")


def fmt_row(r: dict) -> str:
    return (f"{r['sm']:>3} {r['kernel']:<29} {','.join(r['flags']):<40} {r['D']:>4} {r['dtype']:<5} "
            f"{r['chunk'] or '-':>5} "
            f"{r['block_d'] or '-':>4} {r['block_v'] or '-':>4} {r['num_warps']:>5} {r['num_stages']:>6} "
            f"{r['registers']:>4} "
            f"{str(r['spill_store_bytes']) + '/' + str(r['spill_load_bytes']):>14} {r['shared_bytes']:>7} "
            f"{r['mma']:>8} {'yes' if r['tma'] else 'no'}")


SPILL_TABLES = {"_flash_fwd_kernel": "_FWD_SPILLS", "_flash_bwd_dkdv_kernel": "_DKDV_SPILLS",
                "_flash_bwd_dkdv_kernel+ATOMIC_DQ": "_FUSED_SPILLS", "_flash_bwd_dq_kernel": "_DQ_SPILLS"}


def spill_tables(rows: list[dict]) -> dict:
    """The flash kernels' ``SPILLS`` tables from ``--every-config`` rows: for each table, target family
    (``launch.target_family``) and configuration (``launch.config_key``), the narrowest head block at
    which ptxas reported a spill -- any causality, either load path the wrappers can take there (on
    sm_90 pointers and descriptors; the backward's descriptors only up to ``TMA_MAX_HEAD``)."""
    from attnlib.kernels.common.launch import target_family
    from attnlib.kernels.flash.backward import TMA_MAX_HEAD

    tables: dict = {}
    for r in rows:
        kernel = r["kernel"] + ("+ATOMIC_DQ" if "ATOMIC_DQ" in r["flags"] else "")
        if kernel not in SPILL_TABLES:
            continue
        if r["tma"] and "bwd" in kernel and max(r["block_d"], r["block_v"]) > TMA_MAX_HEAD:
            continue                                   # a launch the wrapper never makes
        with use_target(r["sm"]):
            family = target_family(torch.device("cuda"))
        table = tables.setdefault(SPILL_TABLES[kernel], {}).setdefault(family, {})
        if r["spill_store_bytes"] or r["spill_load_bytes"]:
            flags = dict(f.split("=") for f in r["flags"] if "=" in f)
            key = (int(flags["BLOCK_M"]), int(flags["BLOCK_N"]), r["num_warps"], r["num_stages"])
            width = max(r["block_d"], r["block_v"])
            table[key] = min(width, table.get(key, width))
    return {name: {fam: dict(sorted(t.items())) for fam, t in sorted(fams.items())}
            for name, fams in sorted(tables.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--sm", type=int, nargs="+", default=[90], choices=sorted(CAPABILITY),
                    help="targets: 80 (A100), 86/89 (Ampere/Ada: A10, L4), 90 (H100); default 90")
    ap.add_argument("--spill-tables", action="store_true",
                    help="print the flash kernels' SPILLS tables derived from the rows (use with --every-config)")
    ap.add_argument("--no-tma", action="store_true",
                    help="the pointer loads on sm_90 too (the fallback of the tensor-descriptor path; not saved)")
    ap.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"], choices=sorted(DTYPES))
    ap.add_argument("--kernels", default="", help="comma-separated kernel names (default: all)")
    ap.add_argument("--no-save", action="store_true", help=f"do not write {RESULT.relative_to(ROOT)}")
    ap.add_argument("--json-stdout", action="store_true", help="print the rows as one JSON line")
    ap.add_argument("--every-config", action="store_true",
                    help="autotuned kernels: every configuration, not only those the pruning hook keeps (not saved)")
    ap.add_argument("--workloads", default="", help="comma-separated workloads, e.g. 'flash non-causal' (default: all)")
    ap.add_argument("--widest-only", action="store_true",
                    help="compile a launch that recurs at several --dims at the widest only (not saved)")
    a = ap.parse_args(argv)
    names = set(filter(None, a.kernels.split(",")))
    only = set(filter(None, a.workloads.split(",")))
    print(HEADER, file=sys.stderr)
    rows = report(a.dims, a.dtypes, names or None, every_config=a.every_config, only=only or None,
                  widest_only=a.widest_only, sms=a.sm, tma=not a.no_tma)
    if a.json_stdout:
        print(json.dumps(rows))
    if a.spill_tables:
        for name, table in spill_tables(rows).items():
            print(f"{name} = {table}")
    if not (a.no_save or a.every_config or a.widest_only or only or a.no_tma):
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        meta = {"what": "compile-time resources of the chunked, flash and block-sparse kernels (ptxas -v), "
                        "not a timing; autotuned kernels: one row per candidate the pruning hook keeps",
                "target": ", ".join(f"cuda sm_{sm}" for sm in a.sm) + ", warp size 32", "triton": triton.__version__,
                "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                "seq_len_specialised": SEQ_LEN, "block_sparse_block_size": BLOCK_SIZE, "rows": rows}
        RESULT.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"wrote {RESULT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
