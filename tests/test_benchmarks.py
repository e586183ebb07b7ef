"""The benchmark scripts run end to end (a tiny CPU smoke configuration) and write the schema."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
ROW_KEYS = {"op", "impl", "dtype", "B", "H", "T", "D", "causal", "pass", "ms", "tflops", "peak_mem_bytes"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_benchmark_smoke_run_writes_the_schema(script, tmp_path):
    res = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert {"device", "date", "versions", "rows"} <= set(data)
    assert data["rows"] and all(ROW_KEYS <= set(r) for r in data["rows"])
    assert all(r["ms"] > 0 for r in data["rows"])
    assert all(r["pass"] in ("fwd", "fwd+bwd") for r in data["rows"])
    assert all(r["peak_mem_bytes"] is None or r["peak_mem_bytes"] >= 0 for r in data["rows"])
