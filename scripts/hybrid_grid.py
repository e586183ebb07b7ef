"""Chapter 7's hybrid grid: MQAR recall of 8-layer hybrids of softmax and Gated DeltaNet layers, at every
ratio (all-linear, 7:1, 3:1, 1:1, all-softmax), several learning rates and seeds, with a learning curve
per run, on two tasks: 8 pairs (``fits``, the lab's task) and 36 pairs (``exceeds``). The names are the
experiment's; a Gated DeltaNet head of these models holds a 4 x 4 state, fewer key dimensions than either
task has pairs, and ``exceeds`` also differs in length and values (see TASKS).

    python scripts/hybrid_grid.py                      # the whole grid (hours on one CPU core)
    python scripts/hybrid_grid.py --pilot              # calibrate the `exceeds` task first (all-softmax)
    python scripts/hybrid_grid.py --tasks fits --lrs 1e-2 --seeds 0 --ratios all-linear 1:1
    python scripts/hybrid_grid.py --tasks exceeds-long --lrs 1e-2 --ratios 3:1 --seeds 0 1
                                                       # a longer budget, to hybrid_grid_long.json
    python scripts/hybrid_grid.py --smoke --out /tmp/grid.json
    python scripts/hybrid_grid.py --summary            # the committed grid as a table

Writes ``benchmarks/results/hybrid_grid.json`` (``--pilot``: ``hybrid_grid_pilot.json``): date,
versions, machine, the git commit of the code, the model's and each task's settings, and one row per
run (task, ratio, learning rate, seed, learning curve, final recall and loss, wall seconds). The JSON
is rewritten after every run, so a run cut short keeps what it finished, and a rerun skips the runs
already in the file (a file written with other settings is refused rather than mixed with).

Order: the `fits` task first; within a task, one learning rate at a time with every ratio and seed, so
that a partial file is a complete grid at the learning rates it has. Every random choice flows from
the run's seed (:func:`run_seed`) through :func:`attnbook.experiments.mqar.train_recall`. One thread:
wall seconds are recorded for information, never asserted on.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from attnbook.experiments import hybrid as hx
from attnbook.experiments.mqar import train_recall
from benchmarks._common import versions  # the benchmarks' record of versions

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "results"
OUT = RESULTS / "hybrid_grid.json"
PILOT_OUT = RESULTS / "hybrid_grid_pilot.json"

# The lab's models (notebooks/07_landscape_lab.ipynb): 8 layers, 8 heads of width 4, so each Gated
# DeltaNet head holds a 4 x 4 state (four key dimensions), eight such heads to a layer.
MODEL = dict(n_layers=8, d_model=32, n_heads=8, batch=16, chunk_size=32, linear_mixer="gated_deltanet",
             recipe="train_recall: AdamW (weight decay 0.01), gradient norm clipped at 1, 20 warm-up steps, "
                    "cosine decay to 0 at the task's budget; fresh batches every step")
RATIOS = [hx.ALL_LINEAR, 7, 3, 1, 0]
LRS = [3e-3, 1e-2, 3e-2]
N_SEEDS = 3
BASE_SEED = 7700
SEED_STRIDE = 100_003    # train_recall uses seed, seed + 1, 10_000 + seed, 20_000 + seed: runs never share a stream

# `fits`: the lab's task. `exceeds`: 36 pairs from 16 values, T = 108 where `fits` has T = 24 (T = 3 x pairs:
# every key asked once): pairs, length and values change together, and a 3:1 model's two softmax layers can
# hold every pair, so the task does not isolate a state's capacity. The
# task was calibrated by the pilot (--pilot, hybrid_grid_pilot.json; PILOT_TASKS): all-softmax must learn
# it within the budget at some learning rate, or the task says nothing. With 64 keys and 64 values it did
# not; with every key used (n_keys = n_pairs) and 16 values it did not within 450 steps either, so its
# budget is 600. Its evaluation batch is smaller: a step at T = 108 costs several of the short task's.
TASKS = {
    "fits": dict(n_pairs=8, n_keys=8, n_values=8, steps=600, eval_every=25, eval_batch=128, test_batch=256),
    "exceeds": dict(n_pairs=36, n_keys=36, n_values=16, steps=600, eval_every=25, eval_batch=64, test_batch=128),
}
# A longer budget on `exceeds`, for the ratios that did not learn it in 600 steps: is it capacity or time? On
# `fits` the slower ratios needed at least 1.5 times the steps of 1:1 and all-softmax, which on `exceeds` would
# pass 600. Run apart from the grid (--tasks exceeds-long --out benchmarks/results/hybrid_grid_long.json).
LONG_TASKS = {"exceeds-long": dict(TASKS["exceeds"], steps=1500, eval_every=50)}
LONG_OUT = RESULTS / "hybrid_grid_long.json"
# The pilot's candidates for `exceeds`, all-softmax only, in the order they were tried: the brief's first
# suggestion (40 pairs from 64 keys and 64 values), the task chosen on the grid's least budget (450
# steps), and on the budget chosen.
PILOT_TASKS = {
    "exceeds-64-keys": dict(n_pairs=40, n_keys=64, n_values=64, steps=600, eval_every=25, eval_batch=64,
                            test_batch=128),
    "exceeds-450-steps": dict(TASKS["exceeds"], steps=450),
    "exceeds": TASKS["exceeds"],
}
SMOKE = dict(steps=4, eval_every=2, eval_batch=8, test_batch=16)
RECALL_THRESHOLD = 0.9


def run_seed(index: int, base: int = BASE_SEED) -> int:
    """The seed of the ``index``-th seed of every (task, ratio, lr) cell: the same seeds across cells, so
    that the ratios and learning rates are compared on the same training and test batches."""
    return base + SEED_STRIDE * index


def ratio_json(ratio: float) -> str | int:
    """A ratio as JSON can hold it: ``"all-linear"`` for :data:`attnbook.experiments.hybrid.ALL_LINEAR`
    (JSON has no inf), else the int."""
    return "all-linear" if ratio == hx.ALL_LINEAR else int(ratio)


def parse_ratio(label: str) -> float:
    """``"all-linear"``, ``"7:1"``, ..., ``"all-softmax"`` (as :func:`hx.ratio_label` writes them) or a bare int."""
    by_label = {hx.ratio_label(r): r for r in RATIOS}
    if label in by_label:
        return by_label[label]
    try:
        return int(label.removesuffix(":1"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"ratio must be one of {sorted(by_label)} or an int; got {label!r}") from None


def machine() -> dict:
    """The CPU's model name, its logical CPUs, and the threads torch uses."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": "cpu"}


def git_state() -> dict:
    """The commit checked out, and the files the results depend on that differ from it (uncommitted)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--", "attnlib", "attnbook", "scripts/hybrid_grid.py")
    return {"commit": commit.strip() if commit else None,
            "uncommitted": sorted(line[3:] for line in changed.splitlines()) if changed else []}


def run_key(row: dict) -> tuple:
    return row["task"], str(row["ratio"]), float(row["lr"]), int(row["seed"])


def load(out: Path, doc: dict) -> list[dict]:
    """The runs already in ``out`` (none if it does not exist), after checking that they were made with
    the settings of this invocation for every task it will run: a rerun resumes, it never mixes grids."""
    if not out.exists():
        return []
    old = json.loads(out.read_text())
    if old.get("model") != doc["model"]:
        raise SystemExit(f"{out} was written with model settings {old.get('model')}; these are {doc['model']}. "
                         f"Pass another --out.")
    for name, settings in doc["tasks"].items():
        if name in old.get("tasks", {}) and old["tasks"][name] != settings:
            raise SystemExit(f"{out} has task {name!r} with settings {old['tasks'][name]}; these are {settings}. "
                             f"Pass another --out.")
    doc["tasks"] = {**old.get("tasks", {}), **doc["tasks"]}       # tasks run before, and not now, stay described
    return old.get("runs", [])


def pilot_summary(path: Path) -> dict | None:
    """What the calibration of the `exceeds` task found (``--pilot``'s file): per candidate task, its
    settings, each all-softmax run's final recall and first evaluated step with recall >= 0.9, and the
    learning rates at which all-softmax ended above 0.9."""
    if not path.exists():
        return None
    pilot = json.loads(path.read_text())
    out = {"file": path.name, "candidates": {}}
    for name, settings in pilot["tasks"].items():
        runs = [{"ratio": r["ratio"], "lr": r["lr"], "seed": r["seed"], "steps": r["steps"],
                 "final_recall": r["final_recall"], "final_loss": r["final_loss"],
                 "steps_to_threshold": hx.steps_to_recall(r["curve"], RECALL_THRESHOLD)}
                for r in pilot["runs"] if r["task"] == name]
        learned = sorted({r["lr"] for r in runs if r["ratio"] == 0 and r["final_recall"] > RECALL_THRESHOLD})
        tried = sorted({r["lr"] for r in runs if r["ratio"] == 0})
        out["candidates"][name] = {
            "settings": settings, "is_the_grids_exceeds_task": settings == TASKS["exceeds"], "runs": runs,
            "all_softmax_learns_at_lrs": learned,
            "finding": (f"all-softmax ends above recall {RECALL_THRESHOLD} at lr {learned} of {tried}" if learned
                        else f"all-softmax stays below recall {RECALL_THRESHOLD} at every lr tried ({tried})")}
    return out


def print_summary(path: Path) -> None:
    """The grid in ``path`` as a table (:func:`attnbook.experiments.hybrid.grid_summary`): per task, lr and
    ratio, final recall mean +- sd over seeds, how many seeds reached 0.9 and the median step they did."""
    doc = json.loads(path.read_text())
    print(f"{path.name}: {len(doc['runs'])} runs; recall threshold {RECALL_THRESHOLD}")
    print(f"{'task':>18} {'lr':>6} {'ratio':>11}  final recall (mean +- sd)  reached  median step  steps per seed")
    for row in hx.grid_summary(doc["runs"], RECALL_THRESHOLD):
        sd = "" if row["final_recall_sd"] is None else f" +- {row['final_recall_sd']:.3f}"
        med = "-" if row["median_steps_to_threshold"] is None else f"{row['median_steps_to_threshold']:g}"
        cell = f"{row['final_recall_mean']:.3f}{sd}"
        print(f"{row['task']:>18} {row['lr']:>6g} {row['ratio_label']:>11}  {cell:<25}  "
              f"{row['reached']:>3}/{row['n_seeds']:<3}  {med:>11}  {row['steps_to_threshold']}")


def plan(tasks, lrs, seed_indices, ratios, base_seed):
    """The runs in the order they are trained: task, then lr, then seed, then ratio."""
    for task in tasks:
        for lr in lrs:
            for i in seed_indices:
                for ratio in ratios:
                    yield task, lr, i, run_seed(i, base_seed), ratio


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", nargs="+", default=None,
                    help=f"default: {list(TASKS)} ({list(PILOT_TASKS)} with --pilot)")
    ap.add_argument("--ratios", nargs="+", type=parse_ratio, default=None,
                    help="linear:full ratios as labels: all-linear 7:1 3:1 1:1 all-softmax (default: all)")
    ap.add_argument("--lrs", nargs="+", type=float, default=None, help=f"default: {LRS}")
    ap.add_argument("--seeds", nargs="+", type=int, default=None,
                    help=f"seed indices (default: 0 .. {N_SEEDS - 1}); seed i is base + {SEED_STRIDE} i")
    ap.add_argument("--base-seed", type=int, default=BASE_SEED)
    ap.add_argument("--pilot", action="store_true",
                    help="calibrate the exceeds task: its candidates (PILOT_TASKS), all-softmax, every lr, seed 0, "
                         "to hybrid_grid_pilot.json")
    ap.add_argument("--smoke", action="store_true",
                    help=f"tiny runs ({SMOKE['steps']} steps, one lr, one seed) for tests; needs --out")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--summary", action="store_true", help="print the grid in --out (or the pilot's) as a table; "
                                                           "train nothing")
    args = ap.parse_args(argv)
    if args.summary:
        print_summary(args.out or (PILOT_OUT if args.pilot else OUT))
        return
    if args.smoke and args.out is None:
        ap.error("--smoke needs --out (it must not overwrite the committed grid)")

    table = PILOT_TASKS if args.pilot else {**TASKS, **LONG_TASKS}
    unknown = sorted(set(args.tasks or ()) - set(table))
    if unknown:
        ap.error(f"--tasks must be among {list(table)}; got {unknown}")
    long = sorted(set(args.tasks or ()) & set(LONG_TASKS))
    if long and set(args.tasks) - set(LONG_TASKS):
        ap.error(f"--tasks {long} are run apart from the grid: pass them alone")

    torch.set_num_threads(1)
    tasks = {name: dict(table[name], **(SMOKE if args.smoke else {}))
             for name in args.tasks or (PILOT_TASKS if args.pilot else TASKS)}
    ratios = args.ratios or (RATIOS if not args.pilot else [0])
    lrs = args.lrs or ([1e-2] if args.smoke else LRS)
    seeds = args.seeds or ([0] if args.smoke or args.pilot else list(range(N_SEEDS)))
    out = args.out or (PILOT_OUT if args.pilot else LONG_OUT if long else OUT)

    doc = {"experiment": "hybrid_grid" + ("_pilot" if args.pilot else ""),
           "description": __doc__.split("\n\n")[0].replace("\n", " "),
           "date": datetime.date.today().isoformat(),
           "versions": {**versions(), "numpy": np.__version__},
           "machine": machine(), "git": git_state(),
           "model": MODEL,
           "seeds": {"base": args.base_seed, "stride": SEED_STRIDE,
                     "streams": "train_recall(seed): torch.manual_seed(seed) initialises the weights, "
                                "Generator(seed + 1) draws the training batches, Generator(10_000 + seed) "
                                "the test batch, Generator(20_000 + seed) the learning curve's batch"},
           "recall_threshold": RECALL_THRESHOLD,
           "tasks": tasks}
    runs = load(out, doc)
    if not args.pilot:
        doc["pilot"] = pilot_summary(PILOT_OUT)
    done = {run_key(r) for r in runs}
    todo = [p for p in plan(list(tasks), lrs, seeds, ratios, args.base_seed)
            if (p[0], str(ratio_json(p[4])), float(p[1]), p[3]) not in done]
    print(f"{len(todo)} runs to train ({len(runs)} already in {out})", flush=True)

    def write():
        doc["date"] = datetime.date.today().isoformat()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({**doc, "runs": runs}, indent=1) + "\n")
        tmp.replace(out)                          # never a half-written file, even if killed while writing

    for n, (task, lr, index, seed, ratio) in enumerate(todo, 1):
        t = tasks[task]
        pattern = hx.hybrid_pattern(MODEL["n_layers"], ratio, MODEL["linear_mixer"])
        t0 = time.perf_counter()
        res = train_recall(pattern, t["n_pairs"], steps=t["steps"], batch=MODEL["batch"], d_model=MODEL["d_model"],
                           n_heads=MODEL["n_heads"], lr=lr, n_keys=t["n_keys"], n_values=t["n_values"], seed=seed,
                           test_batch=t["test_batch"], chunk_size=MODEL["chunk_size"], eval_every=t["eval_every"],
                           eval_batch=t["eval_batch"])
        wall = time.perf_counter() - t0
        runs.append({"task": task, "ratio": ratio_json(ratio), "ratio_label": hx.ratio_label(ratio),
                     "full_fraction": hx.full_fraction(pattern), "lr": lr, "seed_index": index, "seed": seed,
                     "steps": res.steps, "curve": [[s, round(r, 6)] for s, r in res.curve],
                     "final_recall": res.accuracy, "final_loss": res.final_loss, "params": res.params,
                     "wall_seconds": round(wall, 1)})
        write()
        reached = hx.steps_to_recall(res.curve, RECALL_THRESHOLD)
        print(f"[{n}/{len(todo)}] {task} lr {lr:g} seed {index} {hx.ratio_label(ratio):>11}: recall "
              f"{res.accuracy:.3f}, loss {res.final_loss:.3f}, {RECALL_THRESHOLD} at step {reached} ({wall:.0f} s)",
              flush=True)
    print(f"wrote {out}" if todo else f"nothing to do: {out} is unchanged")


if __name__ == "__main__":
    main()
