"""A ✓ (``lab.check``) tells the reader that something independent agreed with the claim. This test
reads every lab's code cells (``ast`` only, nothing is run) and fails a ``lab.check`` whose condition
cannot fail because it compares a quantity with itself:

(a) a constant: the condition refers to no variable and calls nothing (``True``, ``2 < 3``);
(b) one expression on both sides: a comparison (``==``, ``<``, ...), ``math.isclose``, ``np.isclose``,
    ``torch.allclose``, ``torch.equal`` and the like, whose two sides are the same expression
    (compared as ``ast.dump``);
(c) typed constants against typed constants: a comparison whose every name the notebook assigns only
    from literals (``x = 3``, ``x = (1, 2)``, ``x = 2 * 3``, or from such names), calling nothing but
    pure built-ins on them.

(d) the library against itself: a comparison whose two sides both come, through the notebook's
    assignments and loops, out of one library module and nothing else -- one function's result held to
    another part of it, a module's closed form against its own search, two committed constants -- and
    no computation written in the lab (a ``torch``/``numpy`` call), unless the check names the
    independent thing with ``against=`` (a measurement and the model it is held to often come out of
    one function: then ``against`` says what was measured, and the reader sees it).

``lab.identity`` (≡) and ``lab.illustrate`` (◦) are not read: an identity or a worked number is allowed
to hold by construction, and says so with its mark. The rules are syntactic: they catch the forms
above, not every check that cannot fail, which is what a reviewer's eye is for.
"""

from __future__ import annotations

import ast
import builtins
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "notebooks").glob("*_lab.ipynb"))   # the exercises notebooks make no claims

# calls whose two first arguments are compared (rule b)
CLOSE_CALLS = {"isclose", "allclose", "equal", "array_equal", "assert_close", "assert_allclose"}
# pure built-ins that keep typed constants typed constants (rule c)
PURE_BUILTINS = {"abs", "min", "max", "round", "len", "int", "float", "bool", "sum", "pow", "divmod"}
MODULES = {"math", "np", "numpy", "torch"}


def parse_cells(sources: list[str]) -> list[ast.Module]:
    """The code cells as modules; IPython lines (``%magic``, ``!shell``) become ``pass``."""
    modules = []
    for source in sources:
        lines = [line[:len(line) - len(line.lstrip())] + "pass" if line.lstrip().startswith(("%", "!"))
                 else line for line in source.split("\n")]
        modules.append(ast.parse("\n".join(lines)))
    return modules


def notebook_sources(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _bindings(modules: list[ast.Module]) -> dict[str, list[ast.expr | None]]:
    """Every name the notebook binds, with the expression assigned to it (None for a binding that is not
    a simple assignment: a loop variable, an argument, an import, ``+=``, unpacking of a non-tuple)."""
    found: dict[str, list[ast.expr | None]] = {}

    def bind(target, value):
        if isinstance(target, ast.Name):
            found.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            paired = (isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
                      and not any(isinstance(e, ast.Starred) for e in target.elts))
            for i, elt in enumerate(target.elts):
                bind(elt.value if isinstance(elt, ast.Starred) else elt, value.elts[i] if paired else None)

    for module in modules:
        for node in ast.walk(module):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target, node.value)
            elif isinstance(node, ast.AnnAssign):
                bind(node.target, node.value)
            elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor, ast.comprehension)):
                bind(node.target, None)
            elif isinstance(node, ast.NamedExpr):
                bind(node.target, None)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        bind(item.optional_vars, None)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.setdefault(node.name, []).append(None)
            elif isinstance(node, ast.arg):
                found.setdefault(node.arg, []).append(None)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    found.setdefault((alias.asname or alias.name).split(".")[0], []).append(None)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                found.setdefault(node.name, []).append(None)
    return found


def literal_names(modules: list[ast.Module]) -> set[str]:
    """The names the notebook assigns only from literals (or from other such names), every time."""
    bindings = _bindings(modules)
    mutated = _mutated(modules)
    literal: set[str] = set()
    changed = True
    while changed:                                   # a fixed point: x = 3; y = 2 * x
        changed = False
        for name, values in bindings.items():
            if (name not in literal and name not in mutated
                    and all(v is not None and _is_literal(v, literal) for v in values)):
                literal.add(name)
                changed = True
    return literal


MUTATORS = {"append", "extend", "insert", "update", "add", "pop", "popitem", "remove", "clear",
            "setdefault", "sort", "reverse", "discard"}


def _mutated(modules: list[ast.Module]) -> set[str]:
    """Names changed in place (``x.append(...)``, ``x[i] = ...``, ``del x[i]``): a list that is filled
    later is not a typed constant."""
    found = set()
    for module in modules:
        for node in ast.walk(module):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name)):
                found.add(node.func.value.id)
            elif (isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del))
                  and isinstance(node.value, ast.Name)):
                found.add(node.value.id)
    return found


def _is_literal(node: ast.AST, literal: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in literal
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_literal(e, literal) for e in node.elts)
    if isinstance(node, ast.UnaryOp):
        return _is_literal(node.operand, literal)
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left, literal) and _is_literal(node.right, literal)
    return False


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _same_sides(cond: ast.expr) -> bool:
    """Rule (b): some comparison in the condition has the same expression on both sides."""
    for node in ast.walk(cond):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(ast.dump(a) == ast.dump(b) for a, b in zip(sides, sides[1:])):
                return True
        elif isinstance(node, ast.Call) and _call_name(node) in CLOSE_CALLS and len(node.args) >= 2:
            if ast.dump(node.args[0]) == ast.dump(node.args[1]):
                return True
    return False


def _typed_constants_only(cond: ast.expr, literal: set[str]) -> bool:
    """Rule (c): the condition compares, and every name in it is a typed constant (calls: pure
    built-ins only, and the comparison calls of rule (b))."""
    compares = False
    names = []
    for node in ast.walk(cond):
        if isinstance(node, ast.Compare):
            compares = True
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name in CLOSE_CALLS:
                compares = True
            elif name not in PURE_BUILTINS:
                return False
            func = node.func                             # the function's own name is not data
            if isinstance(func, ast.Attribute) and not (isinstance(func.value, ast.Name)
                                                         and func.value.id in MODULES):
                return False
        elif isinstance(node, (ast.Attribute, ast.Subscript, ast.Lambda, ast.GeneratorExp,
                               ast.ListComp, ast.SetComp, ast.DictComp)):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in MODULES):
                return False
        elif isinstance(node, ast.Name):
            names.append(node)
    data = [n for n in names if not _is_function_name(n, cond) and n.id not in MODULES]
    return compares and bool(data) and all(n.id in literal for n in data)


def _is_function_name(name: ast.Name, cond: ast.expr) -> bool:
    return any(isinstance(node, ast.Call) and node.func is name for node in ast.walk(cond))


def _constant(cond: ast.expr) -> bool:
    """Rule (a): no variable, no call -- the condition is a constant."""
    return not any(isinstance(node, (ast.Name, ast.Call)) for node in ast.walk(cond))


# --- rule (d): where each side of a comparison comes from ------------------------------------------

LAB_COMPUTATION = {"torch", "np", "numpy", "F", "scipy"}   # a call on these is computation written in the lab
PACKAGES = ("attnlib", "attnbook")                           # the library and the book's code beside it
NEUTRAL = {"lab", "math"}                                    # seeds and generators; scalar arithmetic
BUILTIN_NAMES = set(dir(builtins))


def _library_aliases(modules: list[ast.Module]) -> dict[str, str]:
    """Every name the notebook imports from attnlib or the book's package (code not written in the lab), with
    the module (or module.attribute) it names."""
    found = {}
    for module in modules:
        for node in ast.walk(module):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES:
                for alias in node.names:
                    found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in PACKAGES:
                        found[alias.asname or alias.name.split(".")[0]] = alias.name
    return {name: where for name, where in found.items() if name not in NEUTRAL}


class Origins:
    """Where a value comes from: the library modules, lab computations and unknowns (an argument, an
    exception) behind an expression, following each name to the last assignment before its use (a
    loop variable to what it loops over)."""

    def __init__(self, modules: list[ast.Module]):
        self.library = _library_aliases(modules)
        self.bound: dict[str, list[tuple[tuple[int, int], ast.AST | None]]] = {}
        for cell, module in enumerate(modules):
            lambda_args = {id(a) for node in ast.walk(module) if isinstance(node, ast.Lambda)
                           for a in node.args.args}
            for node in ast.walk(module):
                at = (cell, getattr(node, "lineno", 0))
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                    for target in getattr(node, "targets", None) or [node.target]:
                        self._bind(target, node.value, at)
                elif isinstance(node, (ast.For, ast.comprehension)):
                    self._bind(node.target, node.iter, (cell, node.iter.lineno))
                elif isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        if item.optional_vars is not None:
                            self._bind(item.optional_vars, item.context_expr, at)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    self.bound.setdefault(node.name, []).append((at, node))
                elif isinstance(node, ast.arg) and id(node) not in lambda_args:
                    self.bound.setdefault(node.arg, []).append((at, None))
                elif isinstance(node, ast.ExceptHandler) and node.name:
                    self.bound.setdefault(node.name, []).append((at, None))
        self._memo: dict[tuple, frozenset] = {}

    def _bind(self, target, value, at) -> None:
        if isinstance(target, ast.Name):
            self.bound.setdefault(target.id, []).append((at, value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            paired = isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts)
            for i, elt in enumerate(target.elts):
                self._bind(elt.value if isinstance(elt, ast.Starred) else elt,
                           value.elts[i] if paired else value, at)

    def of(self, expr: ast.AST, at: tuple[int, int]) -> frozenset:
        """``("library", module)``, ``("lab", call)`` and ``("unknown", name)`` items behind ``expr``."""
        local = {a.arg for node in ast.walk(expr) if isinstance(node, ast.Lambda) for a in node.args.args}
        found: set = set()
        for node in ast.walk(expr):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in LAB_COMPUTATION):
                found.add(("lab", ast.unparse(node.func)))
            elif (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in local
                  and node.id not in LAB_COMPUTATION | NEUTRAL):
                found |= self._name(node.id, at)
        return frozenset(found)

    def _name(self, name: str, at: tuple[int, int]) -> frozenset:
        if name in self.library:
            return frozenset({("library", self.library[name])})
        bindings = self.bound.get(name)
        if not bindings:
            return frozenset() if name in BUILTIN_NAMES else frozenset({("unknown", name)})
        before = [b for b in bindings if b[0] <= at]
        chosen = [max(before, key=lambda b: b[0])] if before else bindings
        key = (name, tuple(where for where, _ in chosen))
        if key not in self._memo:
            self._memo[key] = frozenset()                    # a name defined through itself adds nothing
            self._memo[key] = frozenset().union(*(
                {("unknown", name)} if value is None else self.of(value, where) for where, value in chosen))
        return self._memo[key]

    def one_module(self, cond: ast.expr, at: tuple[int, int]) -> bool:
        """Some comparison (or difference, or ratio) in ``cond`` has two sides that come from the library
        alone and share a module."""
        pairs = []
        for node in ast.walk(cond):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                pairs += zip(sides, sides[1:])
            elif isinstance(node, ast.Call) and _call_name(node) in CLOSE_CALLS and len(node.args) >= 2:
                pairs.append((node.args[0], node.args[1]))
            elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.Div)):
                pairs.append((node.left, node.right))
        for a, b in pairs:
            left, right = self.of(a, at), self.of(b, at)
            if {kind for kind, _ in left | right} != {"library"}:
                continue
            if {m for _, m in left} & {m for _, m in right}:
                return True
        return False


def vacuous_checks(sources: list[str]) -> list[tuple[int, int, str, str]]:
    """``(cell, line, rule, condition)`` for each ``lab.check`` whose condition cannot fail by rules
    (a)-(c); ``cell`` counts code cells from 0."""
    modules = parse_cells(sources)
    literal = literal_names(modules)
    origins = Origins(modules)
    found = []
    for cell, module in enumerate(modules):
        for node in ast.walk(module):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "check" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "lab"):
                continue
            cond = node.args[1] if len(node.args) >= 2 else next(
                (kw.value for kw in node.keywords if kw.arg == "condition"), None)
            if cond is None:
                continue
            named = any(kw.arg == "against" for kw in node.keywords)
            rule = ("a constant" if _constant(cond)
                    else "the same expression on both sides" if _same_sides(cond)
                    else "typed constants against typed constants" if _typed_constants_only(cond, literal)
                    else "the library against itself" if not named and origins.one_module(cond, (cell, node.lineno))
                    else None)
            if rule:
                found.append((cell, node.lineno, rule, ast.unparse(cond)))
    return found


# --- the detector, on planted snippets -------------------------------------------------------------

BAD = {
    "constant": 'lab.check("always", True)',
    "constant comparison": 'lab.check("arithmetic", 2 * 3 == 6, "six")',
    "same name": 'err = f(x)\nlab.check("equal to itself", err == err)',
    "same expression": 'lab.check("p is p", P.sum(1) <= P.sum(1))',
    "same in a conjunction": 'lab.check("x", a < 1e-9 and (b - c).abs().max() == (b - c).abs().max())',
    "isclose": 'import math\nlab.check("close", math.isclose(y.item(), y.item()))',
    "allclose": 'lab.check("close", torch.allclose(A @ B, A @ B, atol=1e-12))',
    "equal": 'lab.check("equal", torch.equal(z, z))',
    "np.isclose": 'lab.check("close", bool(np.isclose(v[0], v[0])))',
    "typed names": 'd = 16\nt_star = d\nlab.check("t* = d", t_star == d, "the definition")',
    "typed tuple": 'shape = (2, 3)\nexpected = (2, 3)\nlab.check("shape", shape == expected)',
    "typed arithmetic": 'T, D = 4096, 64\nratio = T // D\nlab.check("saves T/D", ratio == T / D)',
    "typed through abs": 'a = 2 * 3\nb = 6.0\nlab.check("a is b", abs(a - b) < 1e-12)',
    "keyword condition": 'lab.check("k", condition=1 < 2)',
    "typed list": 'Ms = [1, 2, 5]\nlab.check("three scores", len(Ms) == 3)',
    "a module's closed form against its own search": (
        "from attnbook.experiments import landscape as land\ncfg = land.HeadConfig()\n"
        "t = land.memory_crossover(cfg)\n"
        "found = land.first_length_where(lambda T: land.memory_bytes('softmax', T, cfg), lambda T: 1)\n"
        'lab.check("closed form = search", found == math.ceil(t))'),
    "one function's two outputs": (
        "from attnbook.experiments import topk as idx_x\nvs = idx_x.cost_model_vs_figure()\n"
        "kink = vs['prefill_kink']\n"
        'lab.check("read = predicted", abs(kink["predicted"] / kink["read"] - 1) < 0.1)'),
    "two committed constants": (
        "from attnbook.experiments.roofline import DEVICES\nh100 = DEVICES['H100']\n"
        'lab.check("ridge", h100.ridge > h100.peak_flops / 1e15)'),
    "a loop over the module's own list": (
        "from attnbook.experiments import landscape as land\nfor m in land.RECURRENT:\n"
        "    closed = land.decode_break_even(m)\n"
        "    found = land.first_length_where(lambda t: land.decode_flops(m, t), lambda t: 0)\n"
        '    lab.check("closed form = search", found == math.ceil(closed))'),
}
GOOD = {
    "measured": 'err = (P - A).abs().max().item()\nlab.check("P is softmax", err < 1e-12)',
    "two computations": 'lab.check("same", torch.allclose(left, right))',
    "measured against a closed form": 'd = 16\nt_star = measure(d)\nlab.check("t* = d", t_star == d)',
    "reassigned from a measurement": 'n = 3\nn = len(runs)\nlab.check("n", n == 3)',
    "loop variable": 'for T in (1, 2):\n    lab.check("T", T < 3)',
    "unpacked from a call": 'a, b = f()\nc = 1\nlab.check("a", a == c)',
    "attribute": 'x = 3\nlab.check("shape", S.shape == (x, 2))',
    "comprehension": 'tol = 1e-9\nlab.check("all", all(e < tol for e in errs))',
    "identity is not read": 'lab.identity("rows sum to 1", True)\nx = 1\nlab.illustrate("x", x == x)',
    "magic line": '%timeit f()\nerr = g()\nlab.check("g", err < 1)',
    "indented magic": 'for s in seeds:\n    !echo {s}\n    err = g(s)\n    lab.check("g", err < 1)',
    "list filled later": 'errs = []\nerrs.append(f())\nlab.check("one", len(errs) == 1)',
    "list item set later": 'w = [0, 0]\nw[1] = f()\nlab.check("w", max(w) < 1)',
    "the library against a definition written in the lab": (
        "from attnlib import softmax_attention\nimport torch\nout = softmax_attention(q, k, v)\n"
        "ref = torch.softmax(q @ k.mT, -1) @ v\n"
        'lab.check("the operator is its definition", (out - ref).abs().max() < 1e-6)'),
    "two modules": (
        "from attnbook.experiments import topk as idx_x\nfrom attnbook.experiments import roofline as rl\n"
        "a = idx_x.decode_flops(4096)\nb = rl.counted(4096)\n"
        'lab.check("two models agree", a == b)'),
    "the independent thing named": (
        "from attnbook.experiments import landscape as land\ncounted = land.counted_flops((16, 32))\n"
        'lab.check("model = count", counted["softmax"] == counted["softmax:model"],'
        ' against="torch\'s FLOP counter on the references")'),
    "a measurement against a threshold": (
        "from attnbook.experiments import needle\nerr = needle.row_error(algo, case)\n"
        'lab.check("missed", err > 1.9)'),
}


@pytest.mark.parametrize("name", BAD)
def test_the_detector_flags_a_check_that_cannot_fail(name):
    assert vacuous_checks([BAD[name]]), BAD[name]


@pytest.mark.parametrize("name", GOOD)
def test_the_detector_leaves_real_checks_alone(name):
    assert not vacuous_checks([GOOD[name]]), GOOD[name]


def test_the_detector_follows_assignments_across_cells():
    assert vacuous_checks(["C = 64\nD = 16", 'lab.check("crossover", C + D == 80)'])
    assert not vacuous_checks(["C = 64", "C = chunk()", 'lab.check("crossover", C == 64)'])


def test_the_detector_follows_a_name_to_its_last_assignment_before_the_check():
    src = "from attnbook.experiments import landscape as land\nimport torch\n"
    assert vacuous_checks([src + "x = torch.ones(1)\nx = land.f()\ny = land.g()\nlab.check('x', x == y)"])
    assert not vacuous_checks([src + "x = land.f()\ny = land.g()\nlab.check('x', x == y)\nx = torch.ones(1)"
                               .replace("lab.check('x', x == y)\nx = torch.ones(1)",
                                        "x = torch.ones(1)\nlab.check('x', x == y)")])


def test_the_detector_reports_cell_line_rule_and_condition():
    (cell, line, rule, cond), = vacuous_checks(["x = 1", 'y = 2\nlab.check("x", x == x)'])
    assert (cell, line, rule, cond) == (1, 2, "the same expression on both sides", "x == x")


# --- the labs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", LABS, ids=lambda p: p.name)
def test_no_lab_check_compares_a_quantity_with_itself(path):
    """A ✓ must be able to fail: a constant, one expression on both sides, or typed constants against
    typed constants is an identity (``lab.identity``, ≡) or worked numbers (``lab.illustrate``, ◦)."""
    sources = notebook_sources(path)
    marks = [node for module in parse_cells(sources) for node in ast.walk(module)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr in ("check", "identity", "illustrate")
             and isinstance(node.func.value, ast.Name) and node.func.value.id == "lab"]
    assert marks, f"{path.name}: no lab.check, lab.identity or lab.illustrate found: is the parser reading it?"
    found = vacuous_checks(sources)
    assert not found, (f"{path.name}: lab.check conditions that cannot fail (code cell, line, rule, "
                       f"condition): {found}; use lab.identity or lab.illustrate, check against something "
                       "independent, or name it with against= where both sides come out of the library")
