"""The exercise checker: run a reader's function on the inputs an exercise lists, compare with the
library's answer, and say in a few lines what happened.

An :class:`Exercise` holds what the reader is asked (``statement``), the signature and docstring they
fill in (taken from ``solution``), a function that makes the inputs (``cases``: random ones, then the
degenerate and adversarial ones the library's own tests use), the worked ``solution`` and at least one
plausible ``wrong`` answer with the words its failure must show. :func:`run` returns an
:class:`Outcome`: ``passed``, ``failed`` (the first failing input, what was expected, what came back,
and a hint where the mistake is recognised, otherwise where the values differ) or ``not attempted``
(the stub still raises ``NotImplementedError``).

A :class:`Case` is judged by comparing with ``expected`` (relative RMS error, the tolerance set per
case for its dtype) or, when the answer is not unique (an adversary, a construction), by its own
``judge``: a function of the reader's output that returns ``None`` when it is right and a sentence
saying what is wrong otherwise.
"""

from __future__ import annotations

import ast
import copy
import inspect
import linecache
import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from attnlib.metrics import rel_rms

WIDTH = 80                     # the width of a lab's output box (attnbook.lab.OUTPUT_WIDTH)

# Relative RMS error allowed by default, per dtype of the inputs: the checker tests the mathematics, so
# an answer computed in float32 from float64 inputs passes.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}


@dataclass(frozen=True)
class Case:
    """One input: ``args`` passed positionally to the reader's function.

    ``label`` says what the input is, in the reader's words ("T = 1", "logits of 1e4 in float16").
    ``expected``: the library's answer (a tensor, a number, or a tuple of them), compared by relative
    RMS error within ``tol`` (default: :data:`TOLERANCE` of the first tensor argument's dtype).
    ``judge``: instead of ``expected``, a function ``judge(got) -> None | str`` (the string says what
    is wrong). ``hint``: the usual mistake behind a failure on this input, about what is special in
    it; shown only when the answer fails no input without a hint (see :func:`_failed`)."""

    label: str
    args: tuple
    expected: Any = None
    judge: Callable[[Any], str | None] | None = None
    tol: float | None = None
    hint: str = ""


@dataclass(frozen=True)
class Wrong:
    """A plausible wrong answer and the words (``shows``, lower-case substring) its failure message
    must contain: CI runs it and fails if the checker passes it or says something else."""

    fn: Callable
    shows: str


@dataclass(frozen=True)
class Freedom:
    """Something the statement lets vary, and a test on a case saying whether its inputs exercise it
    (``present(case) -> bool``). Every freedom an exercise lists must be exercised by one of its cases:
    an answer that ignores it then meets an input it gets wrong."""

    name: str                  # in the statement's words: "D ≠ Dv with no initial state"
    present: Callable[[Case], bool]


@dataclass(frozen=True)
class Exercise:
    name: str                  # what the page passes to the checker, e.g. "softmax from the dual"
    chapter: str               # "1" .. "7", or "A" for the appendix's kernel puzzles
    title: str                 # the heading in the exercises notebook
    statement: str             # markdown: what the function must compute (MyST math allowed)
    solution: Callable         # the worked answer; its name, signature and docstring are the stub's
    cases: Callable[[torch.Generator], list[Case]]
    wrong: tuple[Wrong, ...]
    diagnose: tuple[tuple[Callable[[Any, Any, Case], bool], str], ...] = ()   # (got, expected, case) -> bool
    imports: str = "import torch"   # the lines the stub and the solution need above them
    stub: str = ""             # the reader's starting code; default: the solution's signature and docstring
    harness: Callable[[Callable], Callable] | None = None   # turns the reader's answer into the callable
    #                            run on each case's args (a kernel puzzle: launches the reader's @triton.jit)
    freedoms: tuple[Freedom, ...] = ()   # what the statement lets vary, each exercised by some case
    out_dtype: str | torch.dtype | None = None   # "input": every output tensor in the first floating input's
    #                            dtype; a dtype: that one; None: the dtype is not part of the answer
    fresh_output: bool = False # the statement asks for new tensors: an output may not share an input's memory
    may_write_inputs: bool = False   # the statement lets the function write into its inputs (a kernel's
    #                            output buffer); otherwise every input must come back unchanged

    @property
    def function_name(self) -> str:
        return getattr(self.solution, "__name__", None) or self.solution.fn.__name__

    def solution_source(self) -> str:
        """The solution as the reader sees it (a Triton kernel's decorator included)."""
        return textwrap.dedent(inspect.getsource(getattr(self.solution, "fn", self.solution))).rstrip() + "\n"

    def define(self, source: str) -> Callable:
        """The reader's function: ``source`` executed below the exercise's imports in a fresh namespace,
        as a notebook cell would run it. The code gets a file name in ``linecache``, since Triton reads
        a kernel's source from its file."""
        code = f"{self.imports}\n\n{source}"
        filename = f"<exercise {self.name}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
        namespace: dict = {}
        exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - the book's own code
        return namespace[self.function_name]

    def argument_names(self) -> list[str]:
        """The names of the reader's function's arguments (for messages about an input)."""
        try:
            return list(inspect.signature(getattr(self.solution, "fn", self.solution)).parameters)
        except (TypeError, ValueError):
            return []

    def promises(self, generator: torch.Generator | None = None) -> str:
        """What the checker checks and what it does not, in a sentence for the exercises page."""
        cases = self.cases(generator if generator is not None else torch.Generator().manual_seed(0))
        checked = [f"your outputs on {len(cases)} inputs"]
        if self.freedoms:
            checked[0] += " (among them " + "; ".join(f.name for f in self.freedoms) + ")"
        if not self.may_write_inputs:
            checked.append("that your function leaves its inputs unchanged")
        if self.fresh_output:
            checked.append("that it returns new tensors, not its inputs")
        if self.out_dtype == "input":
            checked.append("that its outputs are in the inputs' dtype")
        elif isinstance(self.out_dtype, torch.dtype):
            checked.append(f"that its outputs are {str(self.out_dtype).replace('torch.', '')}")
        listed = ", ".join(checked[:-1]) + (" and " if len(checked) > 1 else "") + checked[-1]
        return (f"The checker checks {listed}. It does not check how you computed them: a rule the "
                "statement sets on the method is yours to keep.")

    def stub_source(self) -> str:
        """The code the reader starts from: ``stub``, or the solution's signature and docstring with
        ``raise NotImplementedError`` for its body."""
        if self.stub:
            return textwrap.dedent(self.stub).strip("\n") + "\n"
        fn = getattr(self.solution, "fn", self.solution)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        node = tree.body[0]
        lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
        doc = node.body[0]
        has_doc = isinstance(doc, ast.Expr) and isinstance(getattr(doc, "value", None), ast.Constant)
        end = doc.end_lineno if has_doc else node.body[0].lineno - 1
        head = lines[:end]
        return "\n".join(head + ["    raise NotImplementedError  # your code here"]) + "\n"


@dataclass
class Outcome:
    name: str
    status: str                # "passed", "failed" or "not attempted"
    tried: list[str] = field(default_factory=list)
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def __str__(self) -> str:
        return self.message


def relative_rms(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The library's measure, :func:`attnlib.metrics.rel_rms`, of ``got`` against ``expected``, with
    what a reader's answer needs besides: equal infinities agree, a NaN or an infinity where
    ``expected`` is finite is infinitely wrong, and against an all-zero ``expected`` (a residual, a
    derivative at a tie) the error is absolute rather than divided by ``1e-300``."""
    g = got.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    both_inf = torch.isinf(e) & (g == e)
    g = torch.where(both_inf, 0.0, g)
    e = torch.where(both_inf, 0.0, e)
    if not torch.isfinite(g).all():
        return math.inf
    return rel_rms(g, e) if e.norm().item() > 0 else (g - e).norm().item()


def _leaves(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _as_tensor(x) -> torch.Tensor | None:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return torch.tensor(float(x), dtype=torch.float64)
    return None


def agree(a, b, tol: float = 1e-6) -> bool:
    """Whether ``a`` and ``b`` (tensors, numbers, or tuples of them) agree leaf by leaf: same shapes,
    NaN in the same places, the rest within ``tol`` in relative RMS error. An output that is all NaN
    agrees with nothing (it says nothing about which mistake made it)."""
    a_leaves, b_leaves = _leaves(a), _leaves(b)
    if len(a_leaves) != len(b_leaves):
        return False
    for x, y in zip(a_leaves, b_leaves):
        x, y = _as_tensor(x), _as_tensor(y)
        if x is None or y is None or tuple(x.shape) != tuple(y.shape):
            return False
        x, y = x.detach().to(torch.float64).cpu(), y.detach().to(torch.float64).cpu()
        nan = x.isnan()
        if not torch.equal(nan, y.isnan()) or (nan.numel() and nan.all()):
            return False
        if not relative_rms(x.nan_to_num(nan=0.0), y.nan_to_num(nan=0.0)) <= tol:
            return False
    return True


def matches(wrong: Callable, tol: float = 1e-6, leaf: int | None = None):
    """A diagnosis for :attr:`Exercise.diagnose`: the reader's output is what the wrong answer
    ``wrong`` gives on this case's inputs (output ``leaf`` only, when given), and that is not the
    right answer here."""
    def predicate(got, expected, case) -> bool:
        want = wrong(*case.args)
        pick = (lambda x: x[leaf]) if leaf is not None else (lambda x: x)
        return agree(pick(got), pick(want), tol) and not agree(pick(want), pick(expected), tol)
    return predicate


def default_tol(case: Case) -> float:
    if case.tol is not None:
        return case.tol
    for a in case.args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return TOLERANCE.get(a.dtype, 1e-4)
    return 1e-6


def compare(got, case: Case) -> str | None:
    """None when ``got`` matches ``case.expected``; otherwise what differs (shape, NaN, error)."""
    want_leaves, got_leaves = _leaves(case.expected), _leaves(got)
    if len(want_leaves) != len(got_leaves):
        return f"expected {len(want_leaves)} output(s), got {len(got_leaves)}"
    tol = default_tol(case)
    for i, (w, g) in enumerate(zip(want_leaves, got_leaves)):
        which = f"output {i}: " if len(want_leaves) > 1 else ""
        wt, gt = _as_tensor(w), _as_tensor(g)
        if gt is None:
            return f"{which}expected a tensor or a number, got {type(g).__name__}"
        if wt.numel() != gt.numel() or (wt.dim() > 0 and tuple(wt.shape) != tuple(gt.shape)):
            return f"{which}expected shape {tuple(wt.shape)}, got {tuple(gt.shape)}"
        if gt.is_complex():
            return f"{which}expected a real tensor, got {gt.dtype}"
        if torch.isnan(gt.to(torch.float64)).any() and not torch.isnan(wt.to(torch.float64)).any():
            n = int(torch.isnan(gt.to(torch.float64)).sum())
            return f"{which}{n} NaN(s) where the answer is finite"
        err = relative_rms(gt.reshape(wt.shape), wt)
        if not err <= tol:
            return f"{which}relative RMS error {err:.2g} (allowed {tol:.0e})"
    return None


def preview(x, width: int = WIDTH - 12) -> str:
    """A tensor, number or tuple as one short line: its first few values (and shape)."""
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(preview(v, width // max(len(x), 1)) for v in x) + ")"
    t = _as_tensor(x)
    if t is None:
        return textwrap.shorten(repr(x), width)
    if t.dim() == 0:
        return f"{t.item():.4g}"
    flat = t.detach().reshape(-1).to(torch.float64).cpu()
    shown = []
    for v in flat.tolist():
        shown.append(f"{v:.4g}")
        if len(", ".join(shown)) > width - 24:
            break
    more = ", ..." if len(shown) < flat.numel() else ""
    return f"[{', '.join(shown)}{more}] shape {tuple(t.shape)}"


def _clone(args: tuple) -> tuple:
    """The inputs handed to the reader: copies, so that an in-place edit cannot change the answer."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else copy.deepcopy(a) for a in args)


def _same_tensor_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal entry for entry, a NaN equal to a NaN in the same place."""
    if not a.is_floating_point():
        return torch.equal(a, b)
    inf = float("inf")
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0, inf, -inf), b.nan_to_num(0.0, inf, -inf))


def _arg_name(ex: Exercise, i: int) -> str:
    names = ex.argument_names() if ex.harness is None else []
    return f"`{names[i]}`" if i < len(names) else f"input {i + 1}"


def changed_inputs(ex: Exercise, original: tuple, given: tuple) -> list[str]:
    """The arguments the reader's function changed (tensors compared value by value)."""
    return [_arg_name(ex, i) for i, (a, b) in enumerate(zip(original, given))
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and not _same_tensor_values(a, b)]


def aliased_inputs(ex: Exercise, got, given: tuple) -> list[str]:
    """The arguments whose memory an output shares (the input itself, or a view of it)."""
    outs = [t for t in _leaves(got) if isinstance(t, torch.Tensor) and t.numel()]
    found = []
    for i, a in enumerate(given):
        if isinstance(a, torch.Tensor) and a.numel():
            ptr = a.untyped_storage().data_ptr()
            if any(t.untyped_storage().data_ptr() == ptr for t in outs):
                found.append(_arg_name(ex, i))
    return found


def wrong_dtype(ex: Exercise, got, case: Case) -> str | None:
    """What is wrong with the outputs' dtypes, where the statement fixes them (``ex.out_dtype``)."""
    if ex.out_dtype is None:
        return None
    if ex.out_dtype == "input":
        want = next((a.dtype for a in case.args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        why = " (the inputs')"
    else:
        want, why = ex.out_dtype, ""
    for i, g in enumerate(_leaves(got)):
        if isinstance(g, torch.Tensor) and want is not None and g.dtype != want:
            which = f"output {i}: " if len(_leaves(got)) > 1 else ""
            return (f"{which}expected dtype {str(want).replace('torch.', '')}{why}, got "
                    f"{str(g.dtype).replace('torch.', '')}")
    return None


def where_it_differs(got, expected, tol: float) -> str:
    """Where ``got`` differs from ``expected``: how many entries, the first one (its index, both values and
    the signed error) and, for a tensor of two or more dimensions, the indices along the last-but-one
    dimension (rows, positions, time steps) that differ. Empty when it cannot say."""
    parts = []
    for i, (w, g) in enumerate(zip(_leaves(expected), _leaves(got))):
        wt, gt = _as_tensor(w), _as_tensor(g)
        if wt is None or gt is None or wt.numel() != gt.numel() or wt.numel() == 0:
            continue
        e = wt.detach().to(torch.float64).cpu()
        x = gt.detach().to(torch.float64).cpu().reshape(e.shape)
        scale = e[torch.isfinite(e)].abs().pow(2).mean().sqrt().item() if torch.isfinite(e).any() else 1.0
        bad = ~((x == e) | (x - e).abs().le(max(tol, 1e-12) * max(scale, 1e-300))) | (x.isnan() ^ e.isnan())
        bad &= ~(x.isnan() & e.isnan())
        n = int(bad.sum())
        if n == 0:
            continue
        which = f"output {i}: " if len(_leaves(expected)) > 1 else ""
        first = [int(j) for j in torch.nonzero(bad)[0]] if e.dim() else []
        ev, xv = e[tuple(first)].item(), x[tuple(first)].item()
        at = f"[{', '.join(map(str, first))}]" if first else ""
        text = (f"{which}{n} of {e.numel()} entries differ; first{(' at ' + at) if at else ''}: "
                f"expected {ev:.6g}, got {xv:.6g}")
        if math.isfinite(ev) and math.isfinite(xv):
            text += f" ({xv - ev:+.3g})"
            if f"{ev:.6g}" == f"{xv:.6g}":
                text += f"; to the last bit: {ev!r} against {xv!r}"
        if e.dim() >= 2:
            rows = torch.nonzero(bad.reshape(-1, *e.shape[-2:]).any(0).any(-1)).flatten().tolist()
            text += f"; along dim {e.dim() - 2} (size {e.shape[-2]}): {_ranges(rows)}"
        parts.append(text)
    return "; ".join(parts)


def _ranges(idx: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``0..2, 5, 7..8``."""
    out, start = [], None
    for j, v in enumerate(idx):
        if start is None:
            start = v
        if j + 1 == len(idx) or idx[j + 1] != v + 1:
            out.append(f"{start}..{v}" if v > start else f"{v}")
            start = None
    return ", ".join(out[:6]) + (", ..." if len(out) > 6 else "")


def _lines(*parts: str) -> str:
    out = []
    for p in parts:
        if p:
            out.extend(textwrap.wrap(p, WIDTH, subsequent_indent="    ", break_on_hyphens=False) or [""])
    return "\n".join(out)


def _verdict(ex: Exercise, call: Callable, case: Case):
    """``(problem or None, output, error)`` of the reader's function on one case: the value against the
    answer (or the judge), the inputs left unchanged, outputs apart from the inputs, the dtype."""
    given = _clone(case.args)
    try:
        got = call(*given)
    except NotImplementedError:
        raise
    except Exception as e:  # noqa: BLE001 - the reader's error is the report
        return f"raised {type(e).__name__}: {e}", None, e
    if got is None:
        return "returned None (a missing `return`?)", None, None
    if not ex.may_write_inputs:
        changed = changed_inputs(ex, case.args, given)
        if changed:
            return (f"changed its input {', '.join(changed)} in place; the statement asks for a result, "
                    "not an edit of the inputs"), got, None
    if ex.fresh_output:
        shared = aliased_inputs(ex, got, given)
        if shared:
            return f"returned {', '.join(shared)} itself (or a view of it); return a new tensor", got, None
    problem = case.judge(got) if case.judge is not None else compare(got, case)
    if problem is None:
        problem = wrong_dtype(ex, got, case)
    return problem, got, None


def run(ex: Exercise, fn: Callable, generator: torch.Generator) -> Outcome:
    """Run ``fn`` on every case of ``ex`` (made from ``generator``) until one fails."""
    if not callable(fn):
        raise TypeError(f"exercise {ex.name!r}: expected your function (a callable); got {type(fn).__name__}")
    cases = ex.cases(generator)
    call = ex.harness(fn) if ex.harness is not None else fn
    tried: list[str] = []
    for n, case in enumerate(cases, start=1):
        try:
            problem, got, error = _verdict(ex, call, case)
        except NotImplementedError:
            return Outcome(ex.name, "not attempted", tried, _lines(
                f"· {ex.name}: not attempted yet (fill in {ex.function_name})"))
        if problem:
            return _failed(ex, call, cases, case, n, tried, problem, got, error)
        tried.append(case.label)
    head = f"✓ {ex.name}: right on all {len(cases)} inputs"
    return Outcome(ex.name, "passed", tried, _lines(head, f"  ({'; '.join(tried)})"))


def _wrong_elsewhere(ex: Exercise, call: Callable, cases: list[Case], case: Case) -> bool:
    """Whether the reader's function also fails a plain input (one that carries no hint, so is about no
    special case), or fails every input: then its mistake is not the one ``case``'s hint names."""
    failures = 0
    for other in cases:
        if other is case:
            failures += 1
            continue
        try:
            problem, _, _ = _verdict(ex, call, other)
        except Exception:  # noqa: BLE001 - NotImplementedError half-way through: wrong elsewhere too
            return True
        if problem and not other.hint:
            return True
        failures += bool(problem)
    return failures == len(cases)


def _failed(ex: Exercise, call: Callable, cases: list[Case], case: Case, n: int, tried: list[str],
            problem: str, got, error: BaseException | None) -> Outcome:
    """The report of the first failure: the input, what is wrong, the answer and what came back, and a
    hint only where the mistake is recognised -- a diagnosis that matches it, or the input's own hint
    when the function fails nowhere but on inputs of that kind. Otherwise, where the values differ."""
    hint = ""
    compared = got is not None and case.judge is None
    if compared:
        for predicate, text in ex.diagnose:
            try:
                hit = predicate(got, case.expected, case)
            except Exception:  # noqa: BLE001 - a diagnosis that does not apply says nothing
                hit = False
            if hit:
                hint = text
                break
    # a name the code never defined is not what this input's hint is about
    if (not hint and case.hint and not isinstance(error, (NameError, ImportError))
            and not _wrong_elsewhere(ex, call, cases, case)):
        hint = case.hint
    parts = [f"✗ {ex.name}: wrong on input {n} of {len(cases)}: {case.label}", f"  {problem}"]
    if compared:
        parts += [f"  expected {preview(case.expected)}", f"  got      {preview(got)}"]
        if not hint and problem.startswith(("relative RMS", "output")) and "shape" not in problem:
            where = where_it_differs(got, case.expected, default_tol(case))
            if where:
                parts.append(f"  where: {where}")
    if hint:
        parts.append(f"  hint: {hint}")
    if tried:
        parts.append(f"  (right on: {'; '.join(tried)})")
    return Outcome(ex.name, "failed", tried, _lines(*parts))
