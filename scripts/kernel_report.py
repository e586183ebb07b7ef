"""The static performance report of attnlib's attention ops against fla, made on a CPU for the GPUs
readers have (``benchmarks/kernel_report/``: what it reports, how, and the options). From the
repository root, TRITON_INTERPRET unset:

    python scripts/kernel_report.py                     # everything; writes benchmarks/results/kernel_report.json
    python scripts/kernel_report.py --ops delta --shapes 4x16x4096x128 --targets sm_90 --no-save
    python scripts/kernel_report.py --no-compile --no-save  # launches and bytes only
    python scripts/kernel_report.py --help
"""

import sys

from benchmarks.kernel_report.cli import main

if __name__ == "__main__":
    sys.exit(main())
