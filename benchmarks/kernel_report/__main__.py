"""``python -m benchmarks.kernel_report``: the command line (:mod:`.cli`); the workers run this way too."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
