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

The parts: ``targets`` (the GPUs, ops and shapes), ``fake_gpu`` (torch and Triton reporting a target),
``record`` (launches recorded instead of run; the workloads), ``compile`` (specialisations, ptxas, TTGIR),
``jobs`` (the capture and compile subprocesses), ``report`` (rows, summaries, JSON, the inputs'
fingerprint) and ``cli`` (the command line). Importing the package sets Triton's environment for all of
them (interpreter off, ptxas on every compile), so it must come before attnlib's kernels are imported.

Run from the repository root (TRITON_INTERPRET unset); ``scripts/kernel_report.py`` and
``python -m benchmarks.kernel_report`` are the same command:

    PYTHONPATH=$PWD python scripts/kernel_report.py                     # everything; writes the JSON
    PYTHONPATH=$PWD python scripts/kernel_report.py --ops delta --shapes 4x16x4096x128 --targets sm_90 --no-save
    PYTHONPATH=$PWD python scripts/kernel_report.py --no-compile --no-save  # launches and bytes only

``--json-out FILE`` writes the report elsewhere (``tests/test_kernel_report.py`` reads it).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)                   # before attnlib defines its kernels
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")     # the 3.9 default, without its warning
os.environ["TRITON_ALWAYS_COMPILE"] = "1"                  # a cached kernel would skip ptxas and its log
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="kernel-report-"))

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "kernel_report.json"
