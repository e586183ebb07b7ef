"""What the chunked kernels move, read from the static kernel report (``scripts/kernel_report.py``,
committed as ``benchmarks/results/kernel_report.json``): the launches each op makes on a target GPU
and the bytes of the tensors each launch touches, for attnlib and for fla at the same shape.

Nothing here runs a kernel: the report was made on a CPU by capturing the launches the public
functions make on a fake GPU of each target and compiling them for it. Bytes are each tensor a launch
reads or writes counted once per launch -- a lower bound on its memory traffic (the report's ``bytes``
says exactly what is counted).
"""

from __future__ import annotations

from dataclasses import dataclass

PASSES = ("fwd", "bwd")


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a pass: its phase (``fwd``/``bwd``), kernel name, bytes touched, programs."""
    phase: str
    kernel: str
    bytes: int
    programs: int | None


def launches(report: dict, lib: str, op: str, shape: str, target: str = "sm_90") -> list[Launch]:
    """The Triton launches of ``lib`` (``"attnlib"`` or ``"fla"``) for ``op`` at ``shape``
    (``"BxHxTxD"``) on ``target``, forward then backward, in order. PyTorch ops around the kernels
    (casts, fills) are included with ``programs=None``."""
    key = f"{lib}|{op}|{shape}|{target}"
    if key not in report["launches"]:
        raise KeyError(f"the report has no capture {key!r}; it has shapes {report['shapes']} and ops {report['ops']}")
    return [Launch(ln["phase"], ln["kernel"], int(ln["bytes"]), ln.get("programs"))
            for ln in report["launches"][key]["launches"]]


def pass_bytes(report: dict, lib: str, op: str, shape: str, target: str = "sm_90") -> dict[str, int]:
    """Bytes per pass: ``{"fwd": ..., "bwd": ...}`` (``bwd``: the backward's launches alone)."""
    out = dict.fromkeys(PASSES, 0)
    for ln in launches(report, lib, op, shape, target):
        out[ln.phase] += ln.bytes
    return out


def ratio_rows(report: dict, op: str, target: str = "sm_90") -> list[dict]:
    """The report's rows for ``op`` on ``target``: shape, pass (``fwd`` or ``fwd+bwd``), attnlib's and the
    anchor's bytes and their ratio."""
    return [{"shape": "x".join(str(r["shape"][k]) for k in "BHTD"), "pass": r["pass"],
             "attnlib": r["attnlib"]["bytes"], "anchor": r["anchor"]["bytes"], "ratio": r["ratio"],
             "anchor_name": r["anchor"]["name"]}
            for r in report["rows"] if r["op"] == op and r["target"] == target and "anchor" in r]


__all__ = ["Launch", "launches", "pass_bytes", "ratio_rows"]
