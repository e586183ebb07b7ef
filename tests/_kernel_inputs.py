"""What the kernel compile checks share: the environment their subprocesses compile in, and the inputs
fingerprint (``scripts/kernel_report.py --fingerprint``) under which committed compile results are reused."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def compile_env() -> dict:
    """This process's environment with Triton's interpreter off (kernels are compiled, not interpreted)
    and the repository on the path."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def inputs_fingerprint() -> str:
    """The hash of attnlib's ops and kernels, the two kernel scripts and the torch/triton/fla versions."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "kernel_report.py"), "--fingerprint"],
                          capture_output=True, text=True, env=compile_env(), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip()
