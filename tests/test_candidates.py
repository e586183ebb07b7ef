"""Every autotuning candidate computes correctly (``scripts/check_candidates.py``), checked without a GPU.

Under the interpreter the wrappers run one tiling; on a GPU the autotuner may pick any candidate a
pruning hook keeps. The script forces each tiling the hooks keep for sm_75/sm_80/sm_89/sm_90 at head dims
64 and 128 through the interpreter, forward and backward through the public op, against float64 -- too
slow for every run of the suite (the JSON's ``candidates``, ``tilings`` and ``seconds``: 207 candidates
in 144 tilings, 110 s on two cores, at its last making), so its result is committed
(``benchmarks/results/candidates_executed.json``) stamped with the inputs it was made from
(``benchmarks/_artifacts.py``); here:

* the committed result is of this code (the same stamp: kernels, ops, script, versions), lists exactly
  the tilings the hooks keep now, and every one passed;
* one tiling per launch runs live (:func:`_sample`), about a minute (measured 67 s);
* the check catches a planted tiling bug: a tile offset that is wrong only when the key and value tiles
  differ (the segment-sum kernel's 128 x 64 candidate), and a candidate whose tile breaks a compile-time
  invariant (a value tile of 8).

After changing a kernel, a wrapper or a candidate list: ``TRITON_INTERPRET=1 python
scripts/check_candidates.py`` (writes the JSON) and commit the result.
"""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import triton
import triton.language as tl

from attnlib.kernels.linear import segments
from benchmarks import _artifacts as artifacts

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_candidates", ROOT / "scripts" / "check_candidates.py")
cc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cc)


def _key(entry: dict) -> tuple:
    return entry["launch"], tuple(sorted(entry["tiles"].items())), entry["head_dim"]


def _sample() -> list[dict]:
    """One tiling per launch at head dim 64, the farthest from what the interpreter runs by itself: for
    the chunked kernels (head-wide tiles there) the one with the most tiles over the head, for flash and
    sliding-window (small tiles there) the largest; the dq/dk kernel's is then its 32-wide key tile of
    sm_80/sm_89."""
    picked = {}
    for e in sorted(cc.tilings(), key=lambda e: (e["head_dim"] != 64, math.prod(e["tiles"].values())
                                                 * (-1 if cc.block_tiled(e["launch"]) else 1))):
        picked.setdefault(e["launch"], e)
    return list(picked.values())


def test_the_committed_result_is_of_this_code_and_every_candidate_passed():
    committed = json.loads(cc.RESULT.read_text())
    result = artifacts.BY_NAME["every autotuning candidate run"]
    why = artifacts.staleness(result, committed)
    assert not why, artifacts.stale_message(result, why)
    now = {_key(e) for e in cc.tilings()}
    assert {_key(e) for e in committed["tilings"]} == now
    bad = [(cc.label(e), e["failure"]) for e in committed["tilings"] if e["failure"]]
    assert not bad and committed["failed"] == 0, bad
    for e in committed["tilings"]:
        assert e["launches"] > 0 and e["error"] <= cc.TOLERANCE[e["dtype"]], cc.label(e)


@pytest.mark.parametrize("entry", _sample(), ids=cc.label)
def test_a_sample_of_the_candidates_runs_live(entry):
    result = cc.run(entry)
    assert result["failure"] is None, result
    assert result["launches"] > 0


@triton.jit
def _tile_with_the_key_stride(pid, D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    # segments._tile with a planted bug: the value offset steps by BLOCK_D, right only when BLOCK_D == BLOCK_DV.
    nv = tl.cdiv(DV, BLOCK_DV)
    offs_k = (pid // nv) * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_v = (pid % nv) * BLOCK_D + tl.arange(0, BLOCK_DV)
    return offs_k, offs_v, (offs_k < D)[:, None] & (offs_v < DV)[None, :]


def test_a_planted_tile_offset_bug_fails_the_check(monkeypatch):
    """The interpreter's own tiles (key and value tiles both head-wide) never show this bug; the 128 x 64
    candidate of the segment-sum kernel does."""
    entry = next(e for e in cc.tilings() if e["launch"] == "segments._sum" and e["head_dim"] == 128
                 and e["tiles"] == {"BLOCK_D": 128, "BLOCK_DV": 64})
    monkeypatch.setattr(segments, "_tile", _tile_with_the_key_stride)
    result = cc.run(entry)
    assert result["failure"] is not None and result["error"] > 1e-2, result


def test_a_candidate_breaking_a_tile_invariant_fails_the_check():
    entry = {"launch": "chunk_o._fwd_o", "tiles": {"BLOCK_D": 64, "BLOCK_DV": 8}, "head_dim": 64, "candidates": []}
    result = cc.run(entry)
    assert result["failure"] is not None and "BLOCK_DV must be a power of two >= 16" in result["failure"], result


@pytest.mark.parametrize("first", ["M", "N"])
def test_a_halving_search_is_the_first_candidate_kept(first):
    """``launch.halvings`` + ``launch.keep`` (what ``launch.choose`` runs on a GPU) pick what the halving
    loops of the block-sparse and indexer wrappers picked: the wider side halved (the ``first`` one on a
    tie) until the estimate fits, never below 16 -- and 16 x 16 when nothing fits."""
    from attnlib.kernels.common import launch

    def loop(bm, bn, smem, limit):
        while max(bm, bn) > 16 and smem(bm, bn) > limit:
            if bm > bn or (bm == bn and first == "M"):
                bm //= 2
            else:
                bn //= 2
        return bm, bn

    smem = lambda bm, bn: 3 * bm * 64 + 5 * bn * 64  # noqa: E731
    for bm in (16, 32, 64, 128):
        for bn in (16, 32, 64, 128):
            for limit in (0, 4000, 9000, 20000, 1 << 20):
                kept = launch.keep(launch.halvings(bm, bn, first=first), lambda c, a: smem(*c.kwargs.values()), None,
                                   None, {}, limit=limit, target="sm90")
                assert tuple(kept[0].kwargs.values()) == loop(bm, bn, smem, limit), (bm, bn, limit)
