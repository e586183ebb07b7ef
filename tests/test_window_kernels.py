"""The sliding-window kernels (forward and FlashAttention-2 backward, ``attnlib/kernels/window``) through
Triton's interpreter, fp32, on small odd shapes, against the float64 reference -- o, lse and every
gradient of a loss on both (dq, dk, dv) -- by the pointer path and by the tensor-descriptor (TMA) path;
the tile walk itself (every band pair visited, no tile without one, inner tiles unmasked only where every
pair is on the band); and the non-finite contract: a NaN or inf reaches exactly the rows whose band holds it.

Tolerance: relative RMS error 1e-5 (IEEE fp32 products; measured errors sit near 3e-7). The interpreter
runs 16 x 16 tiles (``INTERPRET_FWD`` ...), so lengths of a few dozen have edge and inner tiles both.
GPU runs in fp16/bf16/fp32 live in tests/test_gpu.py.
"""

import math

import pytest
import torch
import triton
import triton.language as tl

from attnlib import _backend
from attnlib.kernels.common import launch
from attnlib.kernels.window.band import band_tiles, edge_tile
from attnlib.window import band, sliding_window_attention, sliding_window_attention_reference

from .conftest import rel_rms

pytestmark = [pytest.mark.skipif(not _backend.INTERPRET, reason="needs TRITON_INTERPRET=1 at import"),
              # NaN and inf arithmetic is the point of some tests: numpy, under the interpreter, warns at each.
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]

TOL = 1e-5


def _inputs(B, H, T, D, Dv, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)
    w_o = torch.randn(B, H, T, Dv, generator=g, dtype=torch.float64)      # a loss that weighs every output
    w_lse = torch.randn(B, H, T, generator=g, dtype=torch.float64)        # ... and every lse
    return q, k, v, w_o, w_lse


def _run(q, k, v, w_o, w_lse, *, window, causal, backend, dtype):
    """``(o, lse, dq, dk, dv)`` of the loss ``<w_o, o> + <w_lse, lse>``."""
    q, k, v = (t.to(dtype).requires_grad_() for t in (q, k, v))
    if backend == "reference":
        o, lse = sliding_window_attention_reference(q, k, v, window=window, scale=q.shape[-1] ** -0.5, causal=causal)
    else:
        o, lse = sliding_window_attention(q, k, v, window=window, causal=causal, return_lse=True, backend="triton")
    ((o * w_o.to(dtype)).sum() + (lse * w_lse.to(lse.dtype)).sum()).backward()
    return o, lse, q.grad, k.grad, v.grad


def _assert_matches_reference(q, k, v, w_o, w_lse, *, window, causal):
    got = _run(q, k, v, w_o, w_lse, window=window, causal=causal, backend="triton", dtype=torch.float32)
    want = _run(q, k, v, w_o, w_lse, window=window, causal=causal, backend="reference", dtype=torch.float64)
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.dtype == torch.float32, name
        assert torch.isfinite(a).all(), name
        if b.numel():
            assert rel_rms(a, b) < TOL, f"{name}: rel RMS {rel_rms(a, b):.2e}"


@pytest.mark.parametrize("B,H,T,D,Dv,window,causal", [
    (1, 2, 37, 8, 5, 1, True),        # a band of one key: o = v
    (2, 1, 37, 8, 5, 1, False),
    (1, 2, 37, 24, 12, 3, True),      # narrower than a tile: every tile an edge tile; Dv != D, not powers of two
    (1, 1, 61, 16, 24, 21, True),     # not dividing the tile; T not a multiple of it
    (1, 1, 61, 16, 24, 21, False),
    (1, 1, 70, 8, 8, 40, True),       # wide enough for inner (unmasked) tiles between the edges
    (1, 2, 33, 16, 16, 33, False),    # window = T: softmax attention
    (1, 1, 21, 8, 12, 1000, True),    # window > T
    (1, 2, 1, 8, 8, 5, True),         # T = 1
])
def test_forward_and_every_gradient_match_the_float64_reference(B, H, T, D, Dv, window, causal):
    _assert_matches_reference(*_inputs(B, H, T, D, Dv, seed=T + window + D), window=window, causal=causal)


def test_gradient_through_the_lse_alone_is_exact():
    """A loss on lse only: dS = P * dlse, folded into delta."""
    q, k, v, w_o, w_lse = _inputs(1, 2, 29, 8, 12, seed=11)
    _assert_matches_reference(q, k, v, torch.zeros_like(w_o), w_lse, window=6, causal=False)


def test_descriptor_loads_match_the_float64_reference(monkeypatch):
    """The tensor-descriptor (TMA, sm_90) path, which the interpreter also runs when a test forces it:
    q, k, v and dO through descriptors (float32 rows of 16-byte multiples)."""
    used = []
    make = launch.head_descriptors
    monkeypatch.setattr(launch, "tma_device", lambda device: True)
    monkeypatch.setattr(launch, "head_descriptors", lambda use_tma, *t: used.append(use_tma) or make(use_tma, *t))
    _assert_matches_reference(*_inputs(1, 2, 45, 24, 12, seed=3), window=19, causal=True)
    assert used == [True, True]          # the forward and the backward


def test_no_positions_and_no_heads_give_empty_outputs_and_zero_gradients():
    for shape in [(0, 2, 9, 8), (1, 2, 0, 8)]:
        q, k, v = (torch.randn(*shape, requires_grad=True) for _ in range(3))
        o, lse = sliding_window_attention(q, k, v, window=3, causal=True, return_lse=True, backend="triton")
        (o.sum() + lse.sum()).backward()
        assert o.shape == shape and lse.shape == shape[:3]
        assert all(t.grad.shape == shape and not t.grad.any() for t in (q, k, v))


# ---------------------------------------------------------------------------- the tile walk

@triton.jit
def _walk_kernel(OUT, T, before, after, BLOCK_OWN: tl.constexpr, BLOCK_WALK: tl.constexpr):
    # Each program writes its (lo, edge_end, full_end, hi, n_edge) and its edge tiles' starts.
    pid = tl.program_id(0)
    lo, edge_end, full_end, hi, n_edge = band_tiles(pid * BLOCK_OWN, before, after, T, BLOCK_OWN, BLOCK_WALK)
    row = OUT + pid * 64
    tl.store(row + 0, lo)
    tl.store(row + 1, edge_end)
    tl.store(row + 2, full_end)
    tl.store(row + 3, hi)
    tl.store(row + 4, n_edge)
    for t in range(0, n_edge):
        tl.store(row + 5 + t, edge_tile(t, lo, edge_end, full_end, BLOCK_WALK))


@pytest.mark.parametrize("own,walk", [(32, 16), (16, 64)])
def test_the_walk_visits_every_band_pair_once_and_no_tile_off_the_band(own, walk):
    """For the forward/dQ side (``before = window - 1``) and the dK/dV side (``after = window - 1``), causal
    and not: the tiles visited cover every pair of the band, each once, none is off every owned position's
    band, the unmasked ones are on every owned position's band, and there are at most
    ``(BLOCK_OWN + before + after) / BLOCK_WALK + 2`` of them -- ``O(T window)`` work."""
    for T in (1, 17, 83):
        for window in sorted({1, 3, 17, 40, T + 9}):
            for causal in (True, False):
                near = window - 1
                for before, after in ((near, 0 if causal else near), (0 if causal else near, near)):
                    n_prog = triton.cdiv(T, own)
                    out = torch.full((n_prog, 64), -1, dtype=torch.int32)
                    _walk_kernel[(n_prog,)](out, T, before, after, BLOCK_OWN=own, BLOCK_WALK=walk)
                    for p in range(n_prog):
                        lo, edge_end, full_end, hi, n_edge = out[p, :5].tolist()
                        edges, inner = out[p, 5:5 + n_edge].tolist(), list(range(edge_end, full_end, walk))
                        tiles = edges + inner
                        what = (T, window, causal, before, after, p)
                        assert len(set(tiles)) == len(tiles) and all(x % walk == 0 for x in tiles), what
                        assert len(tiles) <= (own + before + after) // walk + 2, what
                        rows = range(p * own, min(p * own + own, T))
                        need = {j for i in rows for j in range(max(0, i - before), min(T, i + after + 1))}
                        got = {j for x in tiles for j in range(x, min(x + walk, T))}
                        assert need <= got, what
                        assert all(need & set(range(x, x + walk)) for x in tiles), what
                        assert all(i - before <= j <= i + after and j < T for x in inner
                                   for i in range(p * own, p * own + own) for j in range(x, x + walk)), what


# ---------------------------------------------------------------------------- non-finite inputs

B, H, T, D, DV = 1, 2, 37, 24, 20


def _definition(q, k, v, keep, scale):
    """``(o, lse)`` in float64, row by row over the keys ``keep[i]`` selects, by indexing: a key a row does
    not see never meets it, not even multiplied by a 0 weight."""
    o_rows, lse_rows = [], []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                idx = keep[i].nonzero().squeeze(-1)
                s = scale * (k[b, h].index_select(0, idx) @ q[b, h, i])
                lse = torch.logsumexp(s, 0)
                o_rows.append(torch.exp(s - lse) @ v[b, h].index_select(0, idx))
                lse_rows.append(lse)
    return torch.stack(o_rows).view(*q.shape[:3], v.shape[-1]), torch.stack(lse_rows).view(q.shape[:3])


def _agrees(got, want, what, *, same_nonfinite):
    fin = torch.isfinite(want)
    leaked = int((fin & ~torch.isfinite(got)).sum())
    assert leaked == 0, f"{what}: {leaked} entries non-finite where the definition is finite"
    if same_nonfinite:
        silent = int((~fin & torch.isfinite(got)).sum())
        assert silent == 0, f"{what}: {silent} entries finite where the definition is not"
    assert rel_rms(got[fin], want[fin].to(got.dtype)) < TOL, what


@pytest.mark.parametrize("window,causal", [(3, True), (20, False)])
def test_a_nonfinite_key_or_value_reaches_exactly_the_rows_whose_band_holds_it(window, causal):
    """NaN and +-inf planted in k and v (and a -inf in q): in o and lse, the non-finite entries are exactly
    the definition's; every other row and gradient entry is finite and right. Plants sit in edge tiles of
    the rows around them (and, at window 20, in inner tiles of others: the unmasked path)."""
    g = torch.Generator().manual_seed(window)
    q, k, v = (torch.randn(B, H, T, d, generator=g) for d in (D, D, DV))
    v[0, 0, 20, 3] = float("nan")
    v[0, 1, 5, 7] = float("inf")
    k[0, 1, 30, 5] = float("inf")
    k[0, 0, 9, 1] = float("-inf")
    q[0, 0, 33, 2] = float("-inf")
    do = torch.randn(B, H, T, DV, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = sliding_window_attention(*leaves, window=window, causal=causal, return_lse=True, backend="triton")
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref = _definition(*ref, band(T, T, window, causal=causal), 1 / math.sqrt(D))
    _agrees(o, o_ref, "o", same_nonfinite=True)
    _agrees(lse, lse_ref, "lse", same_nonfinite=True)
    assert not torch.isfinite(o_ref).all()                              # the plants do reach some rows
    grads = torch.autograd.grad(o, leaves, do)
    grads_ref = torch.autograd.grad(o_ref, ref, do.double())
    for name, a, b in zip("qkv", grads, grads_ref):
        _agrees(a, b, f"d{name}", same_nonfinite=False)
