"""Run every autotuning candidate once, through the interpreter, against a float64 reference.

On a GPU the autotuner may pick any candidate a kernel's pruning hook keeps (``launch.pruner``); under
Triton's interpreter the wrappers run one fixed tiling. So this script lists, for each target GPU
(sm_75, sm_80, sm_89, sm_90: its shared memory in ``launch.SHARED_MEMORY``, its ``SPILLS`` table by
``launch.family``) and head dims 64 and 128, the candidates each autotuned launch keeps
(``launch.kept_candidates``, at chunk 64 -- the ops' default -- for half-precision inputs, what runs on a
GPU), and forces each distinct one (``launch.forcing``) through the public op it serves, forward and
backward, at the smallest shape that fills its tiles: head dims = the listed head dim, the sequence
two full tiles and a ragged one (three chunks; the segmented forward in two segments, so that its
segment-sum kernel runs too; the sliding-window kernels with a window that leaves them edge tiles at both
ends and inner tiles between). The chunked kernels run float32, the flash and sliding-window kernels
float16 (what they run on a GPU); every output and gradient is compared (relative RMS) with the op on float64 inputs
through ``backend="torch"``.

    TRITON_INTERPRET=1 python scripts/check_candidates.py            # all; writes the JSON
    TRITON_INTERPRET=1 python scripts/check_candidates.py --list     # the candidates only

The result, ``benchmarks/results/candidates_executed.json``, holds per candidate its targets, its error
and its time, with the versions, the date and the inputs it was made from (:func:`stamp`: every
repository file this script executes, torch, triton, Python); ``tests/test_candidates.py`` checks that
the committed result is of the present code and passed, and runs one candidate per launch live.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import sys
import time
from pathlib import Path
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

import attnlib  # noqa: E402
from attnlib.kernels.common import chunk_o, launch  # noqa: E402
from attnlib.kernels.linear import segments  # noqa: E402
from attnlib.mechanisms import kernel_families  # noqa: E402
from attnlib.metrics import rel_rms  # noqa: E402
from attnlib.window import sliding_window_attention  # noqa: E402
from benchmarks import _artifacts as artifacts  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "candidates_executed.json"
TARGETS = {"sm_75": (7, 5), "sm_80": (8, 0), "sm_89": (8, 9), "sm_90": (9, 0)}
HEAD_DIMS = (64, 128)
CHUNK = 64                  # the ops' default chunk, at which the candidates are listed and run
F64 = torch.float64
# Relative RMS error allowed against float64: float32 chunked kernels measured ~1e-7 to 1e-6 (the tests
# allow 2e-5); float16 flash kernels ~3e-4 to 1e-3 (tests/test_flash_kernels.py allows 5e-3).
TOLERANCE = {"float32": 2e-5, "float16": 5e-3}

# Which public op runs each autotuned launch, forward and backward.
OP = {"chunk_state._fwd_h_split": "linear", "chunk_state._fwd_h_full": "gated_delta",
      "chunk_state._bwd_dh": "gated_delta", "chunk_o._fwd_o": "gated_delta", "chunk_o._dv_local": "gated_delta",
      "chunk_o._dqk": "gated_delta", "wy._wy_fwd": "gated_delta", "wy._wy_bwd": "gated_delta",
      "segments._output": "linear", "segments._sum": "linear", "flash.forward._flash_fwd": "softmax",
      "flash.backward._dkdv": "softmax", "flash.backward._dq": "softmax", "flash.backward._fused": "softmax_fused",
      "window.forward._window_fwd": "window", "window.backward._dkdv": "window", "window.backward._dq": "window"}
# The softmax-family ops: q, k, v in, (o, lse) out, float16 on a GPU.
SOFTMAX_OPS = ("softmax", "softmax_fused", "window")
# Every kernel package, imported through its mechanism's record: each registers its autotuned launches
# (launch.TUNED) as it is imported. The kernels tiled in query x key blocks (the "blocks" families) get
# inputs sized by their tiles; the others (tiles over the head) by the chunk.
BLOCK_TILED = {k for f in kernel_families() if f.tiles == "blocks" for k in f.kernels}


def block_tiled(name: str) -> bool:
    """Whether the autotuned launch ``name`` runs a kernel tiled in query x key blocks."""
    return launch.TUNED_KERNEL[name] in BLOCK_TILED


def stamp() -> dict:
    """What the result is made from (:mod:`benchmarks._artifacts`): every repository file this script executes
    -- the kernels, the ops that run them, this script -- by hash, and the torch, triton and Python versions."""
    return artifacts.stamp(artifacts.by_script(__file__))


def versions() -> dict:
    return {"torch": torch.__version__, "triton": importlib.metadata.version("triton"),
            "python": platform.python_version()}


def _args(name: str, head_dim: int, dtype: torch.dtype, key_block: int) -> dict:
    """The arguments a launch's pruning hook reads (sizes, tiles the wrapper fixes, dtypes)."""
    x = torch.empty(0, dtype=dtype)
    hb = launch.head_block(head_dim)
    return {"Q": x, "K": x, "O": x, "DK": x, "DQ": x, "LSE": x, "D": head_dim, "DV": head_dim, "CHUNK": CHUNK,
            "BLOCK_D": key_block if name == "chunk_o._dqk" else hb, "BLOCK_DV": hb}


def _dqk_key_block(head_dim: int, target: tuple[int, int]) -> int:
    """The dq/dk kernel's key tile on ``target``: what ``chunk_o.dqk_key_block`` chooses there (not autotuned)."""
    kept = launch.keep(chunk_o.DQK_KEY_CONFIGS, None, chunk_o.DQK_KEY_SPILLS, lambda args: 0, {},
                       limit=launch.SHARED_MEMORY[target], target=launch.family(target))
    return min(kept[0].kwargs["BLOCK_D"], launch.head_block(head_dim))


def tilings() -> list[dict]:
    """Every distinct ``(launch, tiles, head dim)`` among the candidates some target keeps, with those
    candidates (warps, stages -- which the interpreter does not model: one run covers them all -- and the
    targets that keep each)."""
    found: dict[tuple, dict] = {}
    for name in sorted(launch.TUNED):
        for hd in HEAD_DIMS:
            for tname, cap in TARGETS.items():
                kb = _dqk_key_block(hd, cap)
                for cfg in launch.kept_candidates(name, _args(name, hd, torch.float16, kb), cap):
                    tiles = {**cfg.kwargs, **({"BLOCK_D": kb} if name == "chunk_o._dqk" else {})}
                    entry = found.setdefault((name, tuple(sorted(tiles.items())), hd),
                                             {"launch": name, "tiles": dict(sorted(tiles.items())), "head_dim": hd,
                                              "candidates": {}})
                    cand = entry["candidates"].setdefault((cfg.num_warps, cfg.num_stages),
                                                          {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                                                           "targets": []})
                    cand["targets"].append(tname)
    return [{**e, "candidates": list(e["candidates"].values())} for e in found.values()]


def _config(entry: dict):
    import triton
    return triton.Config(dict(entry["tiles"]))


def _length(entry: dict) -> int:
    """Two full tiles and a ragged one: three chunks for the chunked kernels; for flash, of its widest
    tile (so every program of the candidate's grid, the diagonal and the tail, is exercised); the same for
    the sliding-window kernels (whose window, :func:`_run_op`, then leaves them every kind of tile)."""
    if block_tiled(entry["launch"]):
        return 2 * max(entry["tiles"]["BLOCK_M"], entry["tiles"]["BLOCK_N"]) + 7
    return 2 * CHUNK + 7


def _inputs(op: str, T: int, hd: int, seed: int) -> tuple[list, list]:
    """float64 ``(inputs, output gradients)`` of ``op`` at ``B = H = 1``, head dims ``hd``."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    q, v = r(1, 1, T, hd), r(1, 1, T, hd)
    k = torch.nn.functional.normalize(r(1, 1, T, hd), dim=-1)
    if op in SOFTMAX_OPS:
        return [q, r(1, 1, T, hd), v], [r(1, 1, T, hd), r(1, 1, T)]
    S0 = r(1, 1, hd, hd)
    if op == "linear":
        return [q / hd ** 0.5, k, v, S0], [r(1, 1, T, hd), r(1, 1, hd, hd)]
    beta = 2 * torch.rand(1, 1, T, generator=gen, dtype=F64)
    g = torch.log(0.5 + 0.5 * torch.rand(1, 1, T, generator=gen, dtype=F64))
    return [q, k, v, beta, g, S0], [r(1, 1, T, hd), r(1, 1, hd, hd)]


def _run_op(op: str, ins: list, backend: str) -> list:
    """The op's outputs on ``ins`` through ``backend``."""
    if op.startswith("softmax"):
        q, k, v = ins
        return list(attnlib.softmax_attention(q, k, v, causal=True, return_lse=True, backend=backend,
                                              deterministic=op != "softmax_fused"))
    if op == "window":
        # T - 4 at T = 2 max(tiles) + 7: at least BLOCK_M + BLOCK_N, so that the last programs have edge tiles
        # at both ends of the band (the last rows do not see the first keys) and inner tiles between.
        q, k, v = ins
        return list(sliding_window_attention(q, k, v, window=q.shape[2] - 4, causal=True, return_lse=True,
                                             backend=backend))
    if op == "linear":
        q, k, v, S0 = ins
        return list(attnlib.linear_attention(q, k, v, scale=1.0, causal=True, chunk_size=CHUNK, initial_state=S0,
                                             output_final_state=True, backend=backend))
    q, k, v, beta, g, S0 = ins
    return list(attnlib.delta_rule(q, k, v, beta, g=g, scale=0.7, chunk_size=CHUNK, initial_state=S0,
                                   output_final_state=True, backend=backend))


_REFERENCES: dict[tuple, list] = {}


def _reference(op: str, T: int, hd: int, seed: int) -> tuple[list, list, list]:
    """``(inputs, output gradients, float64 outputs and gradients)``, computed once per shape."""
    key = (op, T, hd, seed)
    if key not in _REFERENCES:
        ins, grads_out = _inputs(op, T, hd, seed)
        _REFERENCES[key] = [ins, grads_out, _values_and_grads(op, ins, grads_out, "torch", F64)]
    return tuple(_REFERENCES[key])


def _values_and_grads(op: str, ins: list, grads_out: list, backend: str, dtype: torch.dtype) -> list:
    leaves = [x.to(dtype).requires_grad_() for x in ins]
    outs = _run_op(op, leaves, backend)
    got = torch.autograd.grad(outs, leaves, [g.to(o.dtype) for g, o in zip(grads_out, outs)])
    return [o.detach().double() for o in outs] + [g.double() for g in got]


@contextlib.contextmanager
def _two_segments():
    """The segmented forward in two segments (one is what the interpreter's single 'multiprocessor' gets):
    its segment-sum and scan kernels run only with more than one."""
    with mock.patch.object(segments, "segment_count", lambda *a, **k: 2):
        yield


def run(entry: dict, seed: int = 0) -> dict:
    """Force ``entry`` 's candidate through its op, forward and backward; ``{"error", "dtype", "seconds",
    "launches", "failure"}`` -- ``error`` the largest relative RMS error over the outputs and gradients."""
    name, hd = entry["launch"], entry["head_dim"]
    op = OP[name]
    dtype = torch.float16 if op in SOFTMAX_OPS else torch.float32
    ins, grads_out, want = _reference(op, _length(entry), hd, seed)
    start = time.perf_counter()
    before = launch.FORCED_LAUNCHES.get(name, 0)
    out = {"dtype": str(dtype).replace("torch.", ""), "failure": None}
    try:
        with launch.forcing(name, _config(entry)), _two_segments():
            got = _values_and_grads(op, ins, grads_out, "triton", dtype)
        errors = [float(rel_rms(a, b)) if torch.isfinite(a).all() else float("inf") for a, b in zip(got, want)]
        out["error"] = max(errors)
    except Exception as exc:  # noqa: BLE001 - a candidate that does not run is a failed check, with its reason
        out["error"], out["failure"] = float("inf"), f"{type(exc).__name__}: {str(exc)[:300]}"
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["launches"] = launch.FORCED_LAUNCHES.get(name, 0) - before
    if out["failure"] is None and out["launches"] == 0:
        out["failure"] = f"{name} never launched through op {op!r}: the candidate was not executed"
    if out["failure"] is None and not out["error"] <= TOLERANCE[out["dtype"]]:
        out["failure"] = f"error {out['error']:.3g} above {TOLERANCE[out['dtype']]:g}"
    return out


def warm_up() -> None:
    """Run every op the check uses once, at a small shape: the interpreter reads a kernel's source at its
    first call (and keeps it), so after this the code that runs is the code on disk now -- whatever is
    edited later in the run."""
    for op in sorted(set(OP.values())):
        ins, grads_out = _inputs(op, 2 * CHUNK + 7 if op not in SOFTMAX_OPS else 40, 16, seed=1)
        with _two_segments():
            _values_and_grads(op, ins, grads_out, "triton", torch.float32)


def label(entry: dict) -> str:
    tiles = ",".join(f"{k}={v}" for k, v in sorted(entry["tiles"].items()))
    return f"{entry['launch']}[{tiles}]@D{entry['head_dim']}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the candidates and exit")
    ap.add_argument("--launch", help="only this launch (e.g. chunk_o._dqk)")
    ap.add_argument("--out", default=str(RESULT), help="where to write the JSON (default: the committed result)")
    a = ap.parse_args(argv)
    if not launch.INTERPRET:
        ap.error("set TRITON_INTERPRET=1: the candidates are forced through Triton's interpreter")
    # The interpreter reads each kernel's source at its first call: fingerprint the files, make every
    # kernel read (warm_up), and check that nothing changed meanwhile -- then the run is of that code.
    inputs = stamp()
    warm_up()
    if stamp() != inputs:
        print("the kernels, ops or this script changed while they were read: run it again", file=sys.stderr)
        return 2
    todo = [e for e in tilings() if a.launch in (None, e["launch"])]
    n_candidates = sum(len(e["candidates"]) for e in todo)
    if a.list:
        for e in todo:
            print(label(e), "; ".join(f"w{c['num_warps']}s{c['num_stages']}: {' '.join(c['targets'])}"
                                      for c in e["candidates"]))
        print(f"{n_candidates} candidates in {len(todo)} tilings")
        return 0
    start = time.perf_counter()
    for i, e in enumerate(todo):
        e.update(run(e))
        print(f"[{i + 1}/{len(todo)}] {label(e)}: {e['error']:.2e} {e['seconds']}s"
              + (f"  FAILED {e['failure']}" if e["failure"] else ""), flush=True)
    total = round(time.perf_counter() - start, 1)
    failed = [e for e in todo if e["failure"]]
    per_target = {t: {n: sum(t in c["targets"] for e in todo if e["launch"] == n for c in e["candidates"])
                      for n in sorted(launch.TUNED)} for t in TARGETS}
    # Edited since (another change under way)? The result stands for the code fingerprinted, not the new one.
    result = {**inputs, "edited_during_run": stamp() != inputs, "versions": versions(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "head_dims": list(HEAD_DIMS), "chunk": CHUNK, "tolerance": TOLERANCE, "seconds": total,
              "candidates": n_candidates, "candidates_per_target": per_target,
              "worst_error": max((e["error"] for e in todo), default=0.0), "failed": len(failed), "tilings": todo}
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{n_candidates} candidates in {len(todo)} tilings, {total} s, worst error {result['worst_error']:.2e}, "
          f"{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
