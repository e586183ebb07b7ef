"""One argument vocabulary across attnlib's public functions.

Chapter 7 swaps one mechanism for another on shared axes; that is only safe if the same argument means
the same thing, with the same default, in every op. This test reads every public signature of the
operator modules and fails on a new mismatch: a synonym for a name the library already uses, a
default that differs from another op's, ``causal`` with a default, or a name used for two things.
Below the public API, the kernel wrappers (``attnlib.kernels``) keep the same names, and take the flags
whose default could differ from the op's only as required arguments: the op always states them.
"""

import importlib
import inspect
import pkgutil
from collections import defaultdict

import pytest

from attnlib.mechanisms import REGISTRY, SUPPORT_MODULES

# every mechanism's operator module (attnlib.mechanisms), and the modules that support them
OPERATOR_MODULES = tuple(dict.fromkeys([*(m.module for m in REGISTRY.values()), *SUPPORT_MODULES]))

# A synonym the library does not use, and the name it uses instead.
SYNONYMS = {
    "S0": "initial_state", "state": "initial_state", "init_state": "initial_state", "h0": "initial_state",
    "return_state": "output_final_state", "return_final_state": "output_final_state",
    "n_iter": "max_iter", "num_iter": "max_iter", "iters": "max_iter", "n_iters": "max_iter",
    "L": "T", "seq_len": "T", "length": "T",
    "is_causal": "causal", "causal_mask": "causal",
    "chunk": "chunk_size", "block": "block_size", "temperature": "eps",
    "log_alpha": "g", "alpha": "g", "log_decay": "g",
    "sm_scale": "scale", "softmax_scale": "scale", "BT": "chunk_size",
    "store_final": "output_final_state", "need_dh0": "need_state_grad",
}

# Names kept for one meaning, and the only modules that may use them.
RESERVED = {
    "eps": ("attnlib.eot",),        # the entropic temperature of chapter 1 (a numerical floor is another name)
}

# Names whose defaults differ between functions on purpose, and why.
DIFFERENT_ON_PURPOSE = {
    "tol": "each solver's own stopping residual: Newton converges quadratically (1e-12 costs one step "
           "more than 1e-9), Sinkhorn linearly",
    "mode": "each op lists its own forms of the same answer; the default is the form its kernel computes",
}

# Names that must be keyword-only wherever they appear, with the default each must have (REQUIRED: none).
REQUIRED = object()
KEYWORD_ONLY = {"causal": REQUIRED, "initial_state": None, "output_final_state": False, "backend": "auto",
                "scale": (None, REQUIRED), "chunk_size": (64, REQUIRED), "return_lse": False,
                "return_indices": False, "return_weights": False, "return_potentials": False,
                "return_history": False}


def _public_signatures():
    out = []
    for name in OPERATOR_MODULES:
        mod = importlib.import_module(f"attnlib.{name}")
        for attr, obj in vars(mod).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
                continue
            if inspect.isclass(obj):
                if not callable(getattr(obj, "__init__", None)) or obj.__init__ is object.__init__:
                    continue
                fn, label = obj.__init__, f"{mod.__name__}.{attr}"
            elif inspect.isfunction(obj):
                fn, label = obj, f"{mod.__name__}.{attr}"
            else:
                continue
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            out.append((label, mod.__name__, params))
    return out


SIGNATURES = _public_signatures()


def _default(p):
    return REQUIRED if p.default is inspect.Parameter.empty else p.default


def test_the_signatures_were_read():
    labels = {label for label, _, _ in SIGNATURES}
    for must in ("attnlib.attention.softmax_attention", "attnlib.linear.linear_attention",
                 "attnlib.deltanet.delta_rule", "attnlib.topk.topk_attention", "attnlib.eot.sinkhorn"):
        assert must in labels


def test_no_public_argument_uses_a_synonym():
    bad = [f"{label}({p.name}): use {SYNONYMS[p.name]!r}" for label, _, params in SIGNATURES
           for p in params if p.name in SYNONYMS]
    assert not bad, "\n".join(bad)


def test_reserved_names_mean_one_thing():
    bad = [f"{label}({p.name}): {p.name!r} is kept for {RESERVED[p.name]}" for label, module, params in SIGNATURES
           for p in params if p.name in RESERVED and module not in RESERVED[p.name]]
    assert not bad, "\n".join(bad)


def test_shared_names_have_one_default():
    """Where several public functions give an argument a default, it is the same default (a function may
    require an argument that others default: leaving it out then fails loudly, never silently)."""
    defaults = defaultdict(dict)
    for label, _, params in SIGNATURES:
        for p in params:
            if p.default is not inspect.Parameter.empty:
                defaults[p.name][label] = p.default
    bad = []
    for name, by_fn in defaults.items():
        if name in DIFFERENT_ON_PURPOSE:
            continue
        if len({repr(v) for v in by_fn.values()}) > 1:
            bad.append(f"{name}: " + ", ".join(f"{fn}={v!r}" for fn, v in sorted(by_fn.items())))
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", sorted(KEYWORD_ONLY))
def test_keyword_only_arguments_and_their_defaults(name):
    allowed = KEYWORD_ONLY[name] if isinstance(KEYWORD_ONLY[name], tuple) else (KEYWORD_ONLY[name],)
    seen, bad = 0, []
    for label, _, params in SIGNATURES:
        for p in params:
            if p.name != name:
                continue
            seen += 1
            if p.kind is not p.KEYWORD_ONLY:
                bad.append(f"{label}: {name} is {p.kind.description}, expected keyword-only")
            if not any(_default(p) is a or _default(p) == a for a in allowed):
                got = "no default" if _default(p) is REQUIRED else repr(p.default)
                bad.append(f"{label}: {name} has {got}")
    assert seen, f"no public function takes {name!r}: remove it from KEYWORD_ONLY"
    assert not bad, "\n".join(bad)


def test_causal_has_no_default_anywhere():
    """Causal and non-causal attention are different answers: every op that offers both makes the caller say
    which, so swapping one op for another cannot change the mask silently."""
    takes = [label for label, _, params in SIGNATURES for p in params if p.name == "causal"]
    assert len(takes) >= 10, takes


# ----------------------------------------------------------------------------- the kernel wrappers

# Arguments a kernel wrapper may not default: the op above it always passes them, so no default of the
# wrapper's can differ silently from the op's. ``causal`` and ``output_final_state`` are flags, so also
# keyword-only (a bare True in a call says nothing).
KERNEL_REQUIRED = ("causal", "output_final_state", "scale", "chunk_size")
KERNEL_KEYWORD_ONLY = ("causal", "output_final_state")


def _kernel_wrappers():
    """``(label, module, params)`` of every public Python function of every ``attnlib.kernels`` module;
    ``@triton.jit`` kernels are ``JITFunction`` objects, not functions, and are left out (their
    constexpr names follow Triton's conventions)."""
    import attnlib.kernels

    out = []
    for info in pkgutil.walk_packages(attnlib.kernels.__path__, "attnlib.kernels."):
        mod = importlib.import_module(info.name)
        for attr, obj in vars(mod).items():
            if attr.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != mod.__name__:
                continue
            params = [p for p in inspect.signature(obj).parameters.values()
                      if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
            out.append((f"{mod.__name__}.{attr}", mod.__name__, params))
    return out


def kernel_vocabulary_problems(label, module, params):
    """What is wrong with one kernel wrapper's signature: a synonym, a reserved name out of its module,
    or a :data:`KERNEL_REQUIRED` argument with a default (or a flag that is not keyword-only)."""
    bad = []
    for p in params:
        if p.name in SYNONYMS:
            bad.append(f"{label}({p.name}): use {SYNONYMS[p.name]!r}")
        if p.name in RESERVED and module not in RESERVED[p.name]:
            bad.append(f"{label}({p.name}): {p.name!r} is kept for {RESERVED[p.name]}")
        if p.name in KERNEL_REQUIRED and p.default is not inspect.Parameter.empty:
            bad.append(f"{label}({p.name}={p.default!r}): the caller must state {p.name}")
        if p.name in KERNEL_KEYWORD_ONLY and p.kind is not p.KEYWORD_ONLY:
            bad.append(f"{label}({p.name}): {p.kind.description}, expected keyword-only")
    return bad


KERNEL_SIGNATURES = _kernel_wrappers()


def test_the_kernel_wrappers_were_read():
    labels = {label.removeprefix("attnlib.kernels.") for label, _, _ in KERNEL_SIGNATURES}
    for must in ("linear.chunk.linear_chunk_forward", "linear.segments.linear_segments_forward",
                 "delta.chunk.delta_rule_chunk_forward", "topk.indexer.index_scores_forward",
                 "flash.forward.flash_attention_forward", "common.chunk_state.chunk_fwd_h",
                 "grassmann.plucker_fused.plucker_fused_forward", "anna.simhash.simhash_codes"):
        assert must in labels
    assert "common.launch.chunk_invariants" not in labels          # public, but a @triton.jit function


def test_kernel_wrappers_use_the_public_names_and_require_causal_and_output_final_state():
    bad = [problem for sig in KERNEL_SIGNATURES for problem in kernel_vocabulary_problems(*sig)]
    assert not bad, "\n".join(bad)


def test_the_kernel_wrapper_check_flags_a_planted_default():
    """The checker finds each kind of problem in a fake wrapper, and passes its corrected form."""
    def planted(q, k, v, S0, *, log_alpha=None, sm_scale: float = 1.0, eps: float = 1e-6,
                causal: bool = True, chunk_size: int = 64):
        pass

    def positional_flag(q, k, v, output_final_state):
        pass

    def fixed(q, k, v, initial_state=None, *, g=None, scale: float, norm_floor: float, causal: bool,
              chunk_size: int):
        pass

    def check(fn):
        params = list(inspect.signature(fn).parameters.values())
        return kernel_vocabulary_problems(fn.__name__, "attnlib.kernels.fake", params)

    found = "\n".join(check(planted))
    for expected in ("planted(S0)", "planted(log_alpha)", "planted(sm_scale)", "planted(eps)",
                     "planted(causal=True)", "planted(chunk_size=64)"):
        assert expected in found, (expected, found)
    assert check(positional_flag) == ["positional_flag(output_final_state): positional or keyword, "
                                      "expected keyword-only"]
    assert check(fixed) == []
