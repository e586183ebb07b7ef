"""Where the book shows each mechanism of :data:`attnlib.mechanisms.REGISTRY`, and where it does not yet.

A mechanism's library facts (operator, reference, kernels, decode step, benchmark) are its record in
``attnlib.mechanisms``; its book facts are here: the chapter whose lab runs it, the module of its figures
and of its exercises, and -- for each list elsewhere that it is missing from -- why. The lists that name
mechanisms (:data:`CONSUMERS`: the landscape, the roofline, the kernel report, the GPU ledger, the tests
of bad and non-finite inputs ...) are checked against both records by ``tests/test_mechanisms.py``: a
mechanism absent from one of them, with no reason given here, fails that test, naming the list.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The lists a mechanism appears in (tests/test_mechanisms.py says how each is read).
CONSUMERS = {
    "landscape": "chapter 7's table and figures (attnbook.experiments.landscape.REGISTRY): costs, counts, adversary",
    "needle": "chapter 2's adversary aimed at it (the landscape record's algorithm, in needle.ALGORITHMS)",
    "recall": "the capacity experiment's rule that stands for it (attnbook.experiments.recall.MECHANISMS)",
    "roofline": "the appendix's roofline (attnbook.experiments.roofline.OPS)",
    "kernel report": "the static kernel report's ops (benchmarks/results/kernel_report.json)",
    "gpu tests": "the GPU ledger's test slices (scripts/gpu_session.py TEST_FAMILIES, tests/test_gpu.py)",
    "benchmark": "the GPU ledger's benchmarks (scripts/gpu_session.py BENCH, benchmarks/<script>.py)",
    "bad inputs": "a test that the operator refuses a bad input (pytest.raises, in a tests/ file calling it)",
    "non-finite": "a test of a non-finite input (a test named for NaN or non-finite, in a file calling it)",
    "exercises": "the chapter's exercises (attnbook.exercises.<module>, calling the operator or its module)",
    "figures": "the chapter's figures (attnbook.widgets.<module>)",
    "lab": "the chapter's lab (notebooks/<chapter>_*_lab.ipynb, which calls the operator)",
}


@dataclass(frozen=True)
class InTheBook:
    """``chapter`` is the lab's prefix (``"03"``, ``"a1"``); ``figures`` and ``exercises`` modules of
    :mod:`attnbook.widgets` and :mod:`attnbook.exercises`; ``gpu_keyword`` the word that selects its
    tests in ``tests/test_gpu.py``; ``absent`` the consumers (:data:`CONSUMERS`) it is missing from, and why."""
    chapter: str
    figures: str
    exercises: str
    gpu_keyword: str
    absent: dict[str, str] = field(default_factory=dict)


_NO_ROOFLINE = "the appendix puts the four chunked or dense ops compared against fla and SDPA on it; not yet this one"
_NO_REPORT = ("the static report counts bytes against an anchor kernel (fla, SDPA); this op has no anchor "
              "captured there yet")
_NOT_SOFTMAX = "chapter 2's adversary defeats approximations of softmax; this is none"

BOOK: dict[str, InTheBook] = {
    "softmax": InTheBook("01", "eot", "ch01", "softmax"),
    "block_sparse": InTheBook("02", "needle", "ch02", "block_sparse", absent={
        "recall": "a fixed band recalls what lies inside it and nothing else: no capacity to measure",
        "roofline": _NO_ROOFLINE, "kernel report": _NO_REPORT}),
    "sliding_window": InTheBook("02", "needle", "ch02", "sliding_window", absent={
        "landscape": "chapter 7 has it as block-sparse (local band): the same band at block granularity, whose "
                     "adversary is this one",
        "recall": "it recalls exactly the pairs inside its window and none outside: no capacity to measure",
        "roofline": _NO_ROOFLINE, "kernel report": _NO_REPORT}),
    "linear": InTheBook("03", "linear", "ch03", "linear"),
    "delta": InTheBook("04", "deltanet", "ch04", "delta", absent={"needle": _NOT_SOFTMAX}),
    "gated_delta": InTheBook("04", "deltanet", "ch04", "delta", absent={"needle": _NOT_SOFTMAX}),
    "anna": InTheBook("05", "anna", "ch05", "anna", absent={
        "recall": "its recall is chapter 5's own task (match2, k-hop induction), not the key-value store's",
        "roofline": _NO_ROOFLINE, "kernel report": _NO_REPORT}),
    "grassmann": InTheBook("06", "grassmann", "ch06", "grassmann", absent={
        "needle": "no attention rows: it mixes fixed offsets, not a softmax over keys",
        "recall": "no key-value store: it keeps the last max(offsets) tokens",
        "roofline": _NO_ROOFLINE, "kernel report": _NO_REPORT}),
    "topk": InTheBook("07", "topk", "ch07", "topk", absent={
        "recall": "exact over the keys its indexer selects: the capacity experiment has no indexer to train",
        "roofline": _NO_ROOFLINE, "kernel report": _NO_REPORT}),
}

# The mechanisms the book composes from the library's, with no operator of their own.
COMPOSED = {"hybrid": "chapter 7's stacks of softmax and Gated DeltaNet layers (attnbook.experiments.hybrid)"}
