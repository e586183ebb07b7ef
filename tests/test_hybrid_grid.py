"""Chapter 7's hybrid grid: learning curves in train_recall (which must not change the training), the
pure functions that read the grid, its figure, the script's smoke mode and resumption, and the
committed grid itself (complete: both tasks, every ratio, >= 3 learning rates and seeds)."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnbook.experiments.hybrid import ALL_LINEAR, grid_curves, grid_summary, hybrid_pattern, steps_to_recall
from attnbook.experiments.mqar import curve_steps, train_recall

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "results" / "hybrid_grid.json"
RATIO_LABELS = ["all-linear", "7:1", "3:1", "1:1", "all-softmax"]
TINY = dict(steps=12, batch=4, d_model=8, n_heads=2, n_keys=6, n_values=6, lr=1e-2, test_batch=16, chunk_size=8,
            seed=5)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine its waits cost seconds a step;
    the script sets one thread too. The session's setting is restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _load_script():
    spec = importlib.util.spec_from_file_location("hybrid_grid", ROOT / "scripts" / "hybrid_grid.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# train_recall's learning curve
# ---------------------------------------------------------------------------------------------

def test_a_learning_curve_does_not_change_the_training():
    pattern = hybrid_pattern(2, 1, "gated_deltanet")
    torch.manual_seed(123)
    plain = train_recall(pattern, 4, **TINY)
    rng_plain = torch.get_rng_state()
    torch.manual_seed(123)
    traced = train_recall(pattern, 4, **TINY, eval_every=5, eval_batch=8)
    rng_traced = torch.get_rng_state()
    assert plain.curve == [] and traced.curve
    assert traced.accuracy == plain.accuracy and traced.final_loss == plain.final_loss      # bit for bit
    for a, b in zip(plain.model.parameters(), traced.model.parameters()):
        assert torch.equal(a, b)
    assert torch.equal(rng_plain, rng_traced)              # the global generator: not drawn from by the curve
    assert not traced.model.training                        # left in eval mode at the end, as before


def test_the_curve_evaluates_in_eval_mode_and_trains_in_train_mode(monkeypatch):
    from attnbook.experiments import mqar
    seen = []
    forward = mqar.RecallModel.forward

    def spy(self, tokens):
        seen.append((torch.is_grad_enabled(), self.training))
        return forward(self, tokens)
    monkeypatch.setattr(mqar.RecallModel, "forward", spy)
    train_recall("linear", 4, **{**TINY, "steps": 6}, n_layers=1, eval_every=2, eval_batch=8)
    assert [mode for grad, mode in seen if grad] == [True] * 6                 # every training step: train mode
    assert [mode for grad, mode in seen if not grad] == [False] * (4 + 1)      # 0, 2, 4, 6 and the test batch


def test_the_curve_starts_at_step_0_and_ends_at_the_budget():
    res = train_recall("linear", 4, **{**TINY, "steps": 12}, n_layers=1, eval_every=5, eval_batch=8)
    assert [s for s, _ in res.curve] == [0, 5, 10, 12] == curve_steps(12, 5)
    assert all(0.0 <= r <= 1.0 for _, r in res.curve)
    assert curve_steps(10, 5) == [0, 5, 10]                 # the end once, not twice
    assert curve_steps(3, 10) == [0, 3]
    again = train_recall("linear", 4, **{**TINY, "steps": 12}, n_layers=1, eval_every=5, eval_batch=8)
    assert again.curve == res.curve                         # one fixed held-out batch, seeded


def test_curve_arguments_are_checked():
    with pytest.raises(ValueError, match=r"eval_every must be >= 1 \(or None: no curve\); got 0"):
        train_recall("linear", 2, **TINY, eval_every=0)
    with pytest.raises(TypeError, match="eval_every must be an int; got float 2.5"):
        train_recall("linear", 2, **TINY, eval_every=2.5)
    with pytest.raises(ValueError, match="eval_batch must be >= 1; got 0"):
        train_recall("linear", 2, **TINY, eval_every=2, eval_batch=0)
    with pytest.raises(ValueError, match="steps must be >= 1; got 0"):
        train_recall("linear", 2, **{**TINY, "steps": 0})


# ---------------------------------------------------------------------------------------------
# Reading a grid: steps to recall, the summary, the curves grouped for drawing
# ---------------------------------------------------------------------------------------------

def test_steps_to_recall_is_the_first_evaluated_step_at_the_threshold():
    curve = [(0, 0.1), (25, 0.5), (50, 0.9), (75, 0.85), (100, 0.99)]
    assert steps_to_recall(curve, 0.9) == 50                # reached exactly counts; a later dip does not matter
    assert steps_to_recall(curve, 0.95) == 100
    assert steps_to_recall(curve, 0.05) == 0
    assert steps_to_recall([(0, 0.1), (25, 0.3), (50, 0.89)], 0.9) is None       # never
    assert steps_to_recall([], 0.9) is None
    assert steps_to_recall([[0, 0.2], [10, 1.0]]) == 10     # JSON's lists, the default threshold 0.9


def _run(task, ratio, label, fraction, lr, seed, curve):
    return {"task": task, "ratio": ratio, "ratio_label": label, "full_fraction": fraction, "lr": lr, "seed": seed,
            "curve": [list(p) for p in curve], "final_recall": curve[-1][1]}


SYNTHETIC = [
    # all-softmax reaches 0.9 in every seed, at steps 25, 50, 50
    *[_run("fits", 0, "all-softmax", 1.0, 1e-2, s, [(0, .1), (25, a), (50, .95), (75, .97)])
      for s, a in ((1, .92), (2, .5), (3, .6))],
    # all-linear: one seed of three gets there (at 75), the others never do
    *[_run("fits", "all-linear", "all-linear", 0.0, 1e-2, s, [(0, .1), (25, .2), (50, .3), (75, f)])
      for s, f in ((1, .3), (2, .95), (3, .4))],
    _run("exceeds", 1, "1:1", 0.5, 3e-3, 1, [(0, .0), (50, .0)]),
]


def test_grid_summary_pools_the_seeds_of_each_cell():
    rows = grid_summary(SYNTHETIC, threshold=0.9)
    assert [(r["task"], r["ratio_label"], r["lr"]) for r in rows] == [
        ("fits", "all-linear", 1e-2), ("fits", "all-softmax", 1e-2), ("exceeds", "1:1", 3e-3)]
    lin, soft, one = rows
    assert lin["final_recall"] == [.3, .95, .4] and lin["seeds"] == [1, 2, 3]
    assert lin["final_recall_mean"] == pytest.approx(np.mean([.3, .95, .4]))
    assert lin["final_recall_sd"] == pytest.approx(np.std([.3, .95, .4], ddof=1))
    assert lin["steps_to_threshold"] == [None, 75, None] and lin["reached"] == 1
    assert lin["reached_fraction"] == pytest.approx(1 / 3) and lin["median_steps_to_threshold"] == 75
    assert soft["steps_to_threshold"] == [25, 50, 50] and soft["reached"] == 3
    assert soft["median_steps_to_threshold"] == 50 and soft["final_recall_mean"] == pytest.approx(.97)
    assert one["n_seeds"] == 1 and one["final_recall_sd"] is None                  # no spread from one seed
    assert one["reached"] == 0 and one["median_steps_to_threshold"] is None      # never reached


def test_grid_curves_groups_by_task_lr_and_ratio():
    curves = grid_curves(SYNTHETIC)
    assert list(curves) == ["fits", "exceeds"]
    assert list(curves["fits"]) == [1e-2] and list(curves["fits"][1e-2]) == ["all-linear", "all-softmax"]
    assert len(curves["fits"][1e-2]["all-linear"]) == 3
    assert curves["fits"][1e-2]["all-linear"][1][-1] == (75, .95)               # seed 2's curve, second
    assert curves["exceeds"][3e-3]["1:1"] == [[(0, 0.0), (50, 0.0)]]


def test_the_curves_figure_draws_every_ratio_with_a_step_per_task_and_lr():
    from attnbook.widgets.hybrid import hybrid_curves_figure
    curves = grid_curves(SYNTHETIC + [_run("fits", 0, "all-softmax", 1.0, 3e-2, 1, [(0, .1), (75, .2)])])
    fig = hybrid_curves_figure(curves, title="Recall while training", chance={"fits": 1 / 8, "exceeds": 1 / 64})
    assert [f.name for f in fig.frames] == ["fits, lr 0.01", "fits, lr 0.03", "exceeds, lr 0.003"]
    assert len({len(f.data) for f in fig.frames}) == 1                             # a fixed trace count
    lin_seeds, lin_mean, soft_seeds, soft_mean, *_ = fig.frames[0].data
    assert lin_mean.name == "all-linear" and list(lin_mean.x) == [0, 25, 50, 75]
    assert np.allclose(lin_mean.y, [.1, .2, .3, np.mean([.3, .95, .4])])
    assert sum(v is None for v in lin_seeds.x) == 3                                # three seeds, one trace
    assert lin_seeds.line.color == lin_mean.line.color != soft_mean.line.color
    assert len(fig.frames[1].data[1].x) == 0                                        # all-linear not run at 0.03
    assert fig.frames[2].data[-1].y == (1 / 64, 1 / 64)                             # each task's own chance
    assert "exceeds, lr 0.003" in fig.frames[2].layout.title.subtitle.text
    single = hybrid_curves_figure({"fits": {1e-2: {"1:1": [[(0, .1), (5, .9)]]}}}, title="t", threshold=None)
    assert not single.frames and len(single.data) == 2
    with pytest.raises(ValueError, match="at least one"):
        hybrid_curves_figure({}, title="t")


# ---------------------------------------------------------------------------------------------
# The script: smoke mode, resumption; the committed grid
# ---------------------------------------------------------------------------------------------

def _check_schema(doc):
    assert {"date", "versions", "machine", "git", "model", "tasks", "seeds", "runs"} <= set(doc)
    assert {"torch", "python", "numpy"} <= set(doc["versions"])
    assert {"cpu", "torch_threads"} <= set(doc["machine"]) and doc["machine"]["torch_threads"] == 1
    assert "commit" in doc["git"]
    for name, t in doc["tasks"].items():
        assert {"n_pairs", "n_keys", "n_values", "steps", "eval_every", "eval_batch"} <= set(t), name
    for run in doc["runs"]:
        assert {"task", "ratio", "ratio_label", "full_fraction", "lr", "seed", "steps", "curve", "final_recall",
                "final_loss", "wall_seconds"} <= set(run)
        assert run["ratio"] == "all-linear" or isinstance(run["ratio"], int)    # JSON has no inf
        assert run["curve"][0][0] == 0 and run["curve"][-1][0] == run["steps"]
        assert 0.0 <= run["final_recall"] <= 1.0 and math.isfinite(run["final_loss"])


def test_smoke_mode_writes_the_schema_and_a_rerun_skips_the_done_runs(tmp_path, capsys):
    grid = _load_script()
    out = tmp_path / "grid.json"
    grid.main(["--smoke", "--out", str(out), "--tasks", "fits", "--ratios", "all-linear", "1:1"])
    doc = json.loads(out.read_text())
    _check_schema(doc)
    assert [(r["ratio"], r["ratio_label"], r["full_fraction"]) for r in doc["runs"]] == [
        ("all-linear", "all-linear", 0.0), (1, "1:1", 0.5)]
    assert doc["tasks"]["fits"]["steps"] == grid.SMOKE["steps"] and doc["tasks"]["fits"]["n_pairs"] == 8
    assert all(r["seed"] == grid.run_seed(0) for r in doc["runs"])
    capsys.readouterr()
    grid.main(["--smoke", "--out", str(out), "--tasks", "fits", "--ratios", "all-linear", "1:1"])
    assert "0 runs to train" in capsys.readouterr().out
    assert json.loads(out.read_text()) == doc                                   # untouched
    grid.main(["--smoke", "--out", str(out), "--tasks", "fits", "--ratios", "all-linear", "1:1", "all-softmax"])
    runs = json.loads(out.read_text())["runs"]
    assert runs[:2] == doc["runs"] and [r["ratio"] for r in runs[2:]] == [0]    # only the new one trained
    with pytest.raises(SystemExit, match="Pass another --out"):               # other settings: not mixed
        grid.main(["--out", str(out), "--tasks", "fits", "--ratios", "all-linear", "--lrs", "1e-2"])
    capsys.readouterr()
    grid.main(["--summary", "--out", str(out)])                                 # reads, trains nothing
    table = capsys.readouterr().out.splitlines()
    assert "3 runs" in table[0] and len(table) == 2 + 3 and "1:1" in table[3]
    assert json.loads(out.read_text())["runs"] == runs


def test_the_longer_budget_runs_apart_from_the_grid(tmp_path, capsys):
    grid = _load_script()
    long = grid.LONG_TASKS["exceeds-long"]
    assert long["steps"] > grid.TASKS["exceeds"]["steps"]
    assert {k: v for k, v in long.items() if k not in ("steps", "eval_every")} == \
        {k: v for k, v in grid.TASKS["exceeds"].items() if k not in ("steps", "eval_every")}   # the same task
    with pytest.raises(SystemExit):                                              # never mixed into one file
        grid.main(["--smoke", "--out", str(tmp_path / "g.json"), "--tasks", "exceeds", "exceeds-long"])
    out = tmp_path / "long.json"
    grid.main(["--smoke", "--out", str(out), "--tasks", "exceeds-long", "--ratios", "3:1"])
    doc = json.loads(out.read_text())
    _check_schema(doc)
    assert list(doc["tasks"]) == ["exceeds-long"] and [r["ratio"] for r in doc["runs"]] == [3]
    capsys.readouterr()


def test_the_committed_longer_budget_is_the_grids_task_trained_longer():
    path = GRID.with_name("hybrid_grid_long.json")
    if not path.exists():
        pytest.skip(f"{path.name} not written yet")
    doc, grid_doc = json.loads(path.read_text()), json.loads(GRID.read_text())
    _check_schema(doc)
    assert doc["model"] == grid_doc["model"]
    task = doc["tasks"]["exceeds-long"]
    assert task["n_pairs"] == grid_doc["tasks"]["exceeds"]["n_pairs"] and task["steps"] > 2 * 600
    assert len({r["seed"] for r in doc["runs"]}) >= 2


def test_the_script_names_ratios_as_the_chapter_does():
    grid = _load_script()
    assert [grid.parse_ratio(label) for label in RATIO_LABELS] == [ALL_LINEAR, 7, 3, 1, 0]
    assert grid.ratio_json(ALL_LINEAR) == "all-linear" and grid.ratio_json(3) == 3
    assert len({grid.run_seed(i) for i in range(5)}) == 5
    with pytest.raises(SystemExit):
        grid.main(["--smoke"])                                                      # never onto the committed file


def test_the_committed_grid_is_complete():
    if not GRID.exists():
        pytest.skip(f"{GRID.name} not written yet (scripts/hybrid_grid.py)")
    doc = json.loads(GRID.read_text())
    _check_schema(doc)
    assert set(doc["tasks"]) == {"fits", "exceeds"}
    assert doc["tasks"]["exceeds"]["n_pairs"] > doc["model"]["d_model"]     # more pairs than a layer's key dims
    for name, task in doc["tasks"].items():
        runs = [r for r in doc["runs"] if r["task"] == name]
        lrs = sorted({r["lr"] for r in runs})
        seeds = sorted({r["seed"] for r in runs})
        assert len(lrs) >= 3 and len(seeds) >= 3, name
        cells = {(r["ratio_label"], r["lr"], r["seed"]) for r in runs}
        assert cells == {(label, lr, s) for label in RATIO_LABELS for lr in lrs for s in seeds}, name
        assert len(runs) == len(cells), f"{name}: a run recorded twice"
        assert task["steps"] >= 450 and all(r["steps"] == task["steps"] for r in runs), name
        for r in runs:                                                           # evaluated along the way
            assert len(r["curve"]) >= 10 and [s for s, _ in r["curve"]] == curve_steps(r["steps"], task["eval_every"])
    rows = grid_summary(doc["runs"])
    assert len(rows) == 5 * sum(len({r["lr"] for r in doc["runs"] if r["task"] == t}) for t in doc["tasks"])


def test_the_pilot_summary_says_at_which_lrs_all_softmax_learned(tmp_path):
    grid = _load_script()
    runs = [{"task": "exceeds", "ratio": 0, "lr": lr, "seed": 1, "steps": 50, "final_recall": f, "final_loss": 0.1,
             "curve": [[0, 0.0], [50, f]]} for lr, f in ((3e-3, 0.2), (1e-2, 0.95))]
    runs.append({**runs[0], "task": "hard", "lr": 1e-2})
    path = tmp_path / "pilot.json"
    path.write_text(json.dumps({"tasks": {"exceeds": grid.TASKS["exceeds"], "hard": {"n_pairs": 40}}, "runs": runs}))
    summary = grid.pilot_summary(path)["candidates"]
    assert summary["exceeds"]["all_softmax_learns_at_lrs"] == [1e-2] and summary["exceeds"]["is_the_grids_exceeds_task"]
    assert summary["exceeds"]["runs"][1]["steps_to_threshold"] == 50
    assert summary["hard"]["all_softmax_learns_at_lrs"] == [] and "stays below" in summary["hard"]["finding"]
    assert grid.pilot_summary(tmp_path / "absent.json") is None
