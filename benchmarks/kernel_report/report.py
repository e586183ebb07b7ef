"""The report: rows per op, shape, target and pass against the anchor (fla, or the SDPA model), a summary
per compiled target, the printed table, the JSON, the spill tables and the inputs' fingerprint."""

from __future__ import annotations

import json
import sys

from .targets import COMPILED_TARGETS, DTYPE, PASSES, TARGETS, Target, shape_name

BYTES = ("bytes of a launch: the sum, over the distinct tensors passed to the kernel's arguments that it "
         "uses, of numel x element size -- each tensor once per launch, whether read, written or both; "
         "a lower bound on the launch's DRAM traffic (a tile re-read by several programs, or from L2, counts "
         "once). A Triton argument whose pointer the compiled kernel never dereferences (a dummy standing in "
         "for an absent tensor) is not counted: attnlib's are listed under 'dummies'. A PyTorch op counts its "
         "distinct input and output tensors; views, allocations and metadata ops launch nothing and are "
         "not recorded. A pass's bytes are the sum over its launches.")
SDPA_MODEL = ("SDPA (softmax attention's anchor) is not captured but modelled as an ideal fused kernel: "
              "forward reads q, k, v and writes o and lse (float32 [B, H, T]); backward reads q, k, v, o, "
              "do, lse and writes dq, dk, dv; forward+backward is their sum")
TORCH_PATHS = ("where attnlib takes a PyTorch path (sm_75), its launches are the aten ops dispatched on fake "
               "tensors: SDPA decomposes there as PyTorch chooses without a device (on a real T4 its backend is "
               "chosen at run time); the rows' bytes for those paths are indicative, not a kernel comparison")
AUTOTUNED = ("an autotuned kernel is recorded with every candidate configuration its pruning hook keeps for "
             "the target (any may be picked; each is compiled); its grid and bytes are those of the first "
             "kept candidate")


def sdpa_model(shape) -> dict:
    """Bytes of the ideal fused softmax attention (``SDPA_MODEL``) per pass."""
    B, H, T, D = shape
    x, lse = B * H * T * D * DTYPE.itemsize, B * H * T * 4
    fwd = 4 * x + lse                                     # q, k, v read; o, lse written
    bwd = 5 * x + lse + 3 * x                             # q, k, v, o, do, lse read; dq, dk, dv written
    return {"fwd": {"bytes": fwd, "launches": 1}, "fwd+bwd": {"bytes": fwd + bwd, "launches": 2}}


def totals(launches: list, target: Target) -> dict:
    """A pass's sums: launches (Triton, PyTorch), bytes (and the dummies' bytes, not counted), and the
    Triton launches with fewer programs than the target has SMs (they leave SMs idle)."""
    tri = [ln for ln in launches if ln["kind"] == "triton"]
    ops = [ln for ln in launches if ln["kind"] == "torch"]
    return {"launches": len(tri) + sum(ln["count"] for ln in ops), "triton_launches": len(tri),
            "torch_launches": sum(ln["count"] for ln in ops),
            "bytes": sum(ln["bytes"] for ln in launches), "triton_bytes": sum(ln["bytes"] for ln in tri),
            "torch_bytes": sum(ln["bytes"] for ln in ops),
            "dummy_bytes": sum(d["bytes"] for ln in tri for d in ln["dummies"]),
            "min_programs": min((ln["programs"] for ln in tri), default=None),
            "below_one_wave": sorted({ln["kernel"] for ln in tri if ln["programs"] < target.sms})}


def build_report(data: dict, ops, shapes, targets) -> dict:
    """Rows per op x shape x target x pass; launches per (library, op, shape, target); one entry per
    compiled specialisation; and a summary per compiled target."""
    by_key = {(c["lib"], c["op"], tuple(c["shape"]), c["target"]): c for c in data["captures"]}
    rows, launches = [], {}
    for c in sorted(data["captures"], key=lambda c: (c["lib"], c["op"], c["target"], c["shape"])):
        launches[f"{c['lib']}|{c['op']}|{shape_name(c['shape'])}|{c['target']}"] = {
            k: c[k] for k in ("backend", "calls", "launches", "capture_s")}
    for op in ops:
        for shape in shapes:
            for tname in targets:
                target, mine = TARGETS[tname], by_key.get(("attnlib", op, tuple(shape), tname))
                anchor = by_key.get(("fla", op, tuple(shape), tname))
                for pass_ in PASSES:
                    def pick(c):
                        return [ln for ln in c["launches"] if pass_ == "fwd+bwd" or ln["phase"] == "fwd"]
                    row = {"op": op, "shape": dict(zip("BHTD", shape), Dv=shape[3]), "target": tname,
                           "pass": pass_, "attnlib": {"backend": mine["backend"], **totals(pick(mine), target)}}
                    if op == "softmax":
                        row["anchor"] = {"name": "sdpa (model)", **sdpa_model(shape)[pass_]}
                    elif anchor is not None:
                        row["anchor"] = {"name": "fla", **totals(pick(anchor), target)}
                    if "anchor" in row:
                        row["ratio"] = round(row["attnlib"]["bytes"] / row["anchor"]["bytes"], 4)
                    rows.append(row)
    used_by: dict = {}                                    # specialisation -> the (op, D, phase) launching it
    for c in data["captures"]:
        for ln in c["launches"]:
            for sid in ln.get("specs", ()):
                used_by.setdefault(sid, set()).add(f"{c['op']} D{c['shape'][3]} {ln['phase']}")
    specs = {}
    for sid, s in sorted(data["specs"].items(), key=lambda kv: (kv[1]["sm"], kv[1]["kernel"], kv[0])):
        if sid in data["compiled"]:
            tname = f"sm_{s['sm']}"
            res = data["compiled"][sid]
            specs[sid] = {**s, "target": tname, "label": spec_label(s), "used_by": sorted(used_by.get(sid, ())), **res,
                          "shared_limit": TARGETS[tname].shared_memory,
                          "fits": "shared_bytes" in res and res["shared_bytes"] <= TARGETS[tname].shared_memory}
    return {"rows": rows, "launches": launches, "specialisations": specs,
            "summary": {t: target_summary(specs, t) for t in targets if t in COMPILED_TARGETS and specs},
            "dummy_arguments": dummy_arguments(data["captures"]),
            "pytorch_ops": pytorch_ops(data["captures"], [tuple(x) for x in shapes])}


def dummy_arguments(captures) -> list[str]:
    """attnlib's kernel arguments that the specialised kernel never uses (``kernel.PARAM = the tensor it
    stands in for``): they could be passed as None."""
    return sorted({f"{ln['kernel']}.{d['param']} = {d['same_as'] or 'a separate tensor'}" for c in captures
                   if c["lib"] == "attnlib" for ln in c["launches"] if ln["kind"] == "triton" for d in ln["dummies"]})


def pytorch_ops(captures, shapes) -> dict:
    """Per op, the PyTorch kernels that attnlib's Triton path launches around its kernels (casts,
    memsets...), at the first shape, on sm_90 if captured: ``phase aten.op xcount: bytes``."""
    out = {}
    mine = [c for c in captures if c["lib"] == "attnlib" and c["backend"] == "triton"]
    for c in sorted(mine, key=lambda c: (c["target"] != "sm_90", c["target"], shapes.index(tuple(c["shape"])))):
        out.setdefault(c["op"], [f"{ln['phase']} {ln['kernel']} x{ln['count']}: {ln['bytes']:,} B "
                                 f"({shape_name(c['shape'])}, {c['target']})"
                                 for ln in c["launches"] if ln["kind"] == "torch"])
    return out


def spec_label(s: dict) -> str:
    """``kernel[CHUNK=64 BLOCK_D=128 DELTA_RULE; 8 warps, 2 stages]``: the tiles and flags that tell one
    specialisation of a kernel from another."""
    consts = " ".join(k if v is True else f"{k}={v}" for k, v in s["consts"].items()
                      if v is True or (isinstance(v, int) and not isinstance(v, bool)))
    stages = f"{s['num_stages']} stage" + ("s" if s["num_stages"] != 1 else "")
    return f"{s['kernel']}[{consts}; {s['num_warps']} warps, {stages}]"


def target_summary(specs: dict, tname: str) -> dict:
    """Per target: what was compiled, what does not fit, what spills, what the dots lower to."""
    mine = {k: s for k, s in specs.items() if s["target"] == tname}
    ok = {k: s for k, s in mine.items() if "error" not in s}
    dots = [(s["kernel"], d) for s in ok.values() for d in s["dots"]]
    kinds: dict = {}
    for _, d in dots:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    return {"specialisations": len(mine), "errors": sorted(f"{s['kernel']}: {s['error']}" for s in mine.values()
                                                             if "error" in s),
            "max_shared_bytes": max((s["shared_bytes"] for s in ok.values()), default=0),
            "shared_limit": TARGETS[tname].shared_memory,
            "not_fitting": sorted({f"{s['label']}: {s['shared_bytes']} B" for s in ok.values() if not s["fits"]}),
            "spilling": sorted({f"{s['label']}: {s['spill_store_bytes']}/{s['spill_load_bytes']} B "
                                f"({', '.join(s['used_by'])})"
                                for s in ok.values() if s["spill_store_bytes"] or s["spill_load_bytes"]}),
            "max_registers": max((s["registers"] for s in ok.values()), default=0),
            "dots": kinds, "tf32_dots": sorted({f"{k} {d['line']}" for k, d in dots if d["tf32"]}),
            "fma_dots": sorted({f"{k} {d['line']}" for k, d in dots if d["kind"] == "fma"})}


def mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f}"


def print_report(report: dict, out=sys.stdout) -> None:
    """The table: on sm_90 (else the first target captured) one line per op x shape x pass -- launches,
    bytes of attnlib vs its anchor, ratio; then sm_75's dispatch; then per compiled target the fit, spill
    and dot summary."""
    rows = report["rows"]
    shown = "sm_90" if any(r["target"] == "sm_90" for r in rows) else rows[0]["target"]
    print(f"\n{shown}: bytes touched (MB), attnlib vs anchor (fla; softmax: the SDPA model)", file=out)
    print(f"{'op':<12} {'B x H x T x D':<17} {'pass':<8} {'launches':>10} {'attnlib MB':>11} {'anchor MB':>10} "
          f"{'ratio':>6}  {'dummies MB':>10}  below one wave", file=out)
    for r in rows:
        if r["target"] != shown:
            continue
        a, n = r["attnlib"], r.get("anchor", {})
        shape = "x".join(str(r["shape"][k]) for k in "BHTD")
        print(f"{r['op']:<12} {shape:<17} {r['pass']:<8} {a['triton_launches']:>5}+{a['torch_launches']:<4} "
              f"{mb(a['bytes']):>11} {mb(n.get('bytes')):>10} {r.get('ratio', '-'):>6}  {mb(a['dummy_bytes']):>10}  "
              f"{','.join(a['below_one_wave'])}", file=out)
    print("(launches: Triton + PyTorch ops)", file=out)
    if any(r["target"] == "sm_75" for r in rows):
        print("\nsm_75 (T4): what auto runs (the public function's calls, first shape; Triton launches at every shape)",
              file=out)
        for op in report["ops"]:
            caps = [c for key, c in report["launches"].items() if key.startswith(f"attnlib|{op}|")
                    and key.endswith("|sm_75")]
            if caps:
                tri = sum(ln["kind"] == "triton" for c in caps for ln in c["launches"])
                calls = ", ".join(x.removeprefix("attnlib.") for x in caps[0]["calls"])
                print(f"  {op:<12} Triton launches {tri}; backend {caps[0]['backend']}: {calls}", file=out)
    if report["pytorch_ops"]:
        print("\nattnlib's PyTorch ops around its kernels (bytes):", file=out)
        for op, lines in report["pytorch_ops"].items():
            print(f"  {op:<12} " + ("; ".join(lines) or "none"), file=out)
    if report["dummy_arguments"]:
        print(f"\nattnlib's unused (dummy) kernel arguments, not counted ({len(report['dummy_arguments'])}): "
              + "; ".join(report["dummy_arguments"]), file=out)
    for tname, s in report["summary"].items():
        print(f"\n{tname}: {s['specialisations']} specialisations compiled; shared memory max {s['max_shared_bytes']} "
              f"of {s['shared_limit']} B; registers max {s['max_registers']}; dots {s['dots']}", file=out)
        for label in ("errors", "not_fitting", "spilling", "tf32_dots", "fma_dots"):
            if s[label]:
                print(f"  {label} ({len(s[label])}): " + "; ".join(s[label]), file=out)


def dumps(report: dict) -> str:
    """The report as JSON, one line per row, per capture's launch list and per specialisation (readable in
    a diff, a few MB rather than tens)."""
    def entries(d, brackets):
        items = d.items() if isinstance(d, dict) else enumerate(d)
        lines = [(f"  {json.dumps(k)}: " if isinstance(d, dict) else "  ") + json.dumps(v, separators=(",", ":"))
                 for k, v in items]
        return brackets[0] + "\n" + ",\n".join(lines) + "\n " + brackets[1]

    parts = []
    for key, value in report.items():
        if key in ("rows", "launches", "specialisations"):
            text = entries(value, "[]" if isinstance(value, list) else "{}")
        else:
            text = json.dumps(value, indent=1).replace("\n", "\n ")
        parts.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


SPILL_SHAPES = ((1, 2, 4096, 64), (1, 2, 4096, 128), (1, 2, 4096, 256))


def spill_tables(data: dict) -> dict:
    """``{table: {family: {config_key: narrowest width that spilled}}}`` from every candidate compiled on
    each target: the ``SPILLS`` tables ``launch.pruner`` reads (a candidate that spills at some head width
    is pruned at that width and wider)."""
    from attnlib.kernels.common.launch import family as family_of

    tables: dict = {}
    for tname, cands in data["candidates"].items():
        family = family_of(TARGETS[tname].capability)
        for c in cands:
            res = data["compiled"].get(c["spec"], {})
            table = tables.setdefault(c["table"], {}).setdefault(family, {})
            if res.get("spill_store_bytes") or res.get("spill_load_bytes") or "error" in res:
                key = tuple(c["config_key"])
                table[key] = min(table.get(key, c["width"]), c["width"])
    return tables


def print_spill_tables(tables: dict, out=sys.stdout) -> None:
    """The tables as Python literals, one per module constant, to paste into the kernel modules."""
    for name in sorted(tables):
        print(f"# {name}", file=out)
        body = ", ".join(f'"{fam}": {{' + ", ".join(f"{k}: {w}" for k, w in sorted(entries.items())) + "}"
                         for fam, entries in sorted(tables[name].items()))
        print(f"{name.rsplit('.', 1)[1]} = {{{body}}}", file=out)


def inputs_stamp() -> dict:
    """What the default report is made from (:mod:`benchmarks._artifacts`): every repository file
    ``scripts/kernel_report.py`` executes -- this package, the shapes' home (``benchmarks/_common.py``),
    attnlib's ops and kernels, not the book's code -- by hash, and the torch, triton (whose ptxas
    compiles), fla and Python versions. Two runs with the same stamp make the same report, less its date
    and time: ``tests/test_kernel_report.py`` reads the committed report when its stamp is this one and
    fails, naming the command that makes it again, when it is not."""
    from benchmarks import _artifacts as artifacts

    return artifacts.stamp(artifacts.BY_NAME["kernel report"])
