"""The order test files and labs start in when `make test` runs them together on two workers.

pytest-xdist (``--dist loadfile --no-loadscope-reorder``) hands whole files to its workers in collection
order, so the costliest start first and the short ones fill in at the end (longest processing time
first: two workers finish close together instead of one waiting on a long lab started last). The costs
are seconds measured in an earlier run (``tests/file_costs.json``, written by ``python
scripts/test_budget.py report --save-costs``); a file not listed there counts as a short one. Only the
order depends on them: a stale table makes the run a little longer, never red.
"""

from __future__ import annotations

import json
from pathlib import Path

COSTS = Path(__file__).resolve().parent / "tests" / "file_costs.json"


def pytest_collection_modifyitems(session, config, items):
    if not COSTS.exists():
        return
    costs = json.loads(COSTS.read_text())
    order = {}                                    # a file's first position: its items stay together
    for i, item in enumerate(items):
        order.setdefault(item.nodeid.split("::")[0], i)
    items.sort(key=lambda it: (-costs.get(it.nodeid.split("::")[0], 0.0), order[it.nodeid.split("::")[0]]))
