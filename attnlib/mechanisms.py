"""One record per attention mechanism the library computes: its operator, its reference, its kernels.

Everything that lists the mechanisms -- the book's landscape and GPU ledger, the benchmarks, the tests of
bad inputs and of one argument vocabulary -- reads :data:`REGISTRY` (or is checked against it by
``tests/test_mechanisms.py``), so a mechanism added here and missing from one of them fails a test that
names it. The names are the ones used everywhere (``softmax``, ``linear``, ``gated_delta`` ...).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from . import anna, attention, deltanet, grassmann, linear, sparse, topk, window


@dataclass(frozen=True)
class Mechanism:
    """``operator`` is the public function (``backend="auto" | "torch" | "triton"``) in ``attnlib.<module>``;
    ``reference`` the plain-PyTorch form that reads like the book's equations (what the kernels are
    tested against); ``kernels`` the package under ``attnlib.kernels`` holding its Triton kernels;
    ``decode_step`` the one-token update of a recurrent state (None: the mechanism keeps a cache, not
    a state); ``benchmark`` the script in ``benchmarks/`` that times it against its anchor."""
    name: str
    label: str
    operator: Callable
    reference: Callable
    kernels: str
    benchmark: str
    decode_step: Callable | None = None

    @property
    def kernel_family(self):
        """The ``FAMILY`` (:class:`attnlib.kernels.common.family.KernelFamily`) its kernel package declares:
        what it launches, for the checks that compile it without a GPU. Imported on demand (Triton is
        optional; the package is named here, in the record)."""
        module = importlib.import_module(f"attnlib.kernels.{self.kernels}")
        family = getattr(module, "FAMILY", None)
        if family is None or family.package != self.kernels:
            raise TypeError(f"attnlib.kernels.{self.kernels} must declare FAMILY, its KernelFamily; got {family!r}")
        return family

    @property
    def module(self) -> str:
        """The operator's module, without the package: ``"linear"`` for :mod:`attnlib.linear`."""
        return self.operator.__module__.rpartition(".")[2]


REGISTRY: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("softmax", "softmax", attention.softmax_attention, attention.softmax_attention_reference,
              kernels="flash", benchmark="attention"),
    Mechanism("block_sparse", "block-sparse", sparse.block_sparse_attention, sparse.block_sparse_attention_reference,
              kernels="block_sparse", benchmark="block_sparse"),
    Mechanism("sliding_window", "sliding window", window.sliding_window_attention,
              window.sliding_window_attention_reference, kernels="window", benchmark="window"),
    Mechanism("linear", "linear", linear.linear_attention, linear.linear_attention_parallel_reference,
              kernels="linear", benchmark="linear", decode_step=linear.linear_attention_decode_step),
    Mechanism("delta", "DeltaNet", deltanet.delta_rule, deltanet.delta_rule_recurrent_reference,
              kernels="delta", benchmark="deltanet", decode_step=deltanet.delta_rule_decode_step),
    Mechanism("gated_delta", "Gated DeltaNet", deltanet.delta_rule, deltanet.delta_rule_recurrent_reference,
              kernels="delta", benchmark="deltanet", decode_step=deltanet.delta_rule_decode_step),
    Mechanism("anna", "ANNA (LSH)", anna.anna_attention, anna.anna_attention_reference,
              kernels="anna", benchmark="anna"),
    Mechanism("grassmann", "Grassmann", grassmann.plucker_projection, grassmann.plucker_projection_reference,
              kernels="grassmann", benchmark="grassmann"),
    Mechanism("topk", "top-k + indexer", topk.topk_attention, topk.topk_attention_reference,
              kernels="topk", benchmark="topk"),
)}

# The operator modules that are no mechanism of their own: chapter 1's transport solvers and the error measures.
SUPPORT_MODULES = ("eot", "metrics")


def kernel_families() -> list:
    """Every kernel package's ``FAMILY`` (:attr:`Mechanism.kernel_family`), each once, in the registry's order:
    what ``scripts/kernel_resources.py``, ``benchmarks/_register_runs.py`` and the candidate checks compile
    and run."""
    return list({m.kernels: m.kernel_family for m in REGISTRY.values()}.values())
