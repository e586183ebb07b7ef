"""``scripts/test_budget.py``: each step of ``make test`` timed, and the report against the budget."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("test_budget", ROOT / "scripts" / "test_budget.py")
tb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tb)


def test_steps_are_recorded_with_their_exit_and_the_report_names_the_costliest_files(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tb, "DIR", tmp_path / "budget")
    monkeypatch.setattr(tb, "STEPS", tmp_path / "budget" / "steps.json")
    monkeypatch.setattr(tb, "COSTS", tmp_path / "costs.json")
    assert tb.main(["begin"]) == 0
    assert tb.main(["step", "fine", "--", sys.executable, "-c", "pass"]) == 0
    assert tb.main(["step", "broken", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    steps = json.loads(tb.STEPS.read_text())
    assert [(s["step"], s["exit"]) for s in steps] == [("fine", 0), ("broken", 3)]
    assert all(s["wall_s"] >= 0 and s["cpu_s"] >= 0 for s in steps)
    (tb.DIR / "checks.xml").write_text(
        '<testsuites><testsuite><testcase file="tests/test_a.py" name="x" time="2.5"/>'
        '<testcase file="tests/test_a.py" name="y" time="1.0"/>'
        '<testcase file="notebooks/07_lab.ipynb" name="Cell 3" time="9.0"/></testsuite></testsuites>')
    capsys.readouterr()
    assert tb.main(["report", "--budget", "1000", "--save-costs"]) == 0
    out = capsys.readouterr().out
    assert "broken" in out and "(exit 3)" in out and "within budget" in out
    assert out.index("notebooks/07_lab.ipynb") < out.index("tests/test_a.py")        # costliest first
    assert json.loads(tb.COSTS.read_text()) == {"notebooks/07_lab.ipynb": 9.0, "tests/test_a.py": 3.5}
    assert tb.main(["report", "--budget", "0.0001", "--strict"]) == 1                # over: red only if asked
    assert tb.main(["report", "--budget", "0.0001"]) == 0
