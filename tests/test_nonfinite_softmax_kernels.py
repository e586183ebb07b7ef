"""The softmax-family kernels give no silent answers on non-finite inputs (issue 31).

One NaN, +inf or -inf is planted in q, k or v; the definition -- a float64 loop that computes each row
from its own key set only, selected by indexing, so that a key a row does not see never meets it, not
even multiplied by a 0 weight -- says which outputs and gradients stay finite. Wherever it is finite the
Triton kernel must be finite and agree with it; in the forward the non-finite outputs must also be the
same (a non-finite input that a row does see is never turned into a number, 0 included).

A row with no key at all is empty, not undefined: ``o = 0``, ``lse = -inf`` on both backends. A row
whose keys all have the logit ``-inf`` (from an infinite input) is ``inf - inf``: ``o`` NaN,
``lse = -inf``, on both backends.
"""

import math

import pytest
import torch

from attnlib import block_sparse_attention, softmax_attention, topk_attention
from attnlib.metrics import rel_rms
from attnlib.sparse import expand_block_mask
from attnlib.topk import selection_mask, topk_attention_reference

# NaN and inf arithmetic is the point here: numpy, under Triton's interpreter, warns at every one.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

B, H, T, D, DV = 1, 2, 37, 24, 20          # odd lengths: ragged tiles; D, Dv not powers of two: padded columns
BS = 16
TOL = 1e-5

# (tensor, position, value): a v entry that rows before it must never meet; keys whose +-inf logits make
# some rows NaN and leave others finite (a -inf logit weighs 0); a query row of +-inf logits.
PLANTS = {
    "v_nan": ("v", (0, 0, 20, 3), float("nan")),
    "v_posinf": ("v", (0, 1, 5, 7), float("inf")),
    "k_posinf": ("k", (0, 1, 9, 5), float("inf")),
    "k_neginf": ("k", (0, 0, 26, 1), float("-inf")),
    "q_neginf": ("q", (0, 0, 30, 2), float("-inf")),
}


def _inputs(plant: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, H, T, D, generator=g), "k": torch.randn(B, H, T, D, generator=g),
         "v": torch.randn(B, H, T, DV, generator=g)}
    name, pos, value = PLANTS[plant]
    x[name][pos] = value
    return x["q"], x["k"], x["v"], torch.randn(B, H, T, DV, generator=g)


def definition(q, k, v, keep, scale):
    """``(o, lse)`` in float64, row by row over the keys ``keep[b, h, i]`` selects (bool ``[B, H, Tq, Tk]``).
    Differentiable; an empty row is ``o = 0``, ``lse = -inf``."""
    q, k, v = q.double(), k.double(), v.double()
    o_rows, lse_rows = [], []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                idx = keep[b, h, i].nonzero().squeeze(-1)
                if idx.numel() == 0:
                    o_rows.append(torch.zeros(v.shape[-1], dtype=v.dtype))
                    lse_rows.append(torch.tensor(float("-inf"), dtype=v.dtype))
                    continue
                s = scale * (k[b, h].index_select(0, idx) @ q[b, h, i])
                lse = torch.logsumexp(s, 0)
                o_rows.append(torch.exp(s - lse) @ v[b, h].index_select(0, idx))
                lse_rows.append(lse)
    shape = q.shape[:3]
    return torch.stack(o_rows).view(*shape, v.shape[-1]), torch.stack(lse_rows).view(shape)


def leaks(got: torch.Tensor, want: torch.Tensor) -> int:
    """Entries where the definition is finite and the kernel is not."""
    return int((torch.isfinite(want) & ~torch.isfinite(got)).sum())


def check_agrees(got: torch.Tensor, want: torch.Tensor, what: str, *, same_nonfinite: bool) -> None:
    fin = torch.isfinite(want)
    assert leaks(got, want) == 0, f"{what}: {leaks(got, want)} entries non-finite where the definition is finite"
    if same_nonfinite:
        silent = int((~fin & torch.isfinite(got)).sum())
        assert silent == 0, f"{what}: {silent} entries finite where the definition is not"
    if fin.any():
        err = rel_rms(got[fin], want[fin].to(got.dtype))
        assert err < TOL, f"{what}: rel RMS {err:.2e} over the finite entries"


def run_and_check(op, keep, plant: str, scale: float) -> None:
    """Forward (o and lse) and backward (dq, dk, dv of ``sum(o * do)``) of ``op(q, k, v) -> (o, lse)``
    against the definition on the key sets ``keep``."""
    q, k, v, do = _inputs(plant)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o, lse = op(*leaves)
    ref_leaves = [t.double().requires_grad_(True) for t in (q, k, v)]
    o_ref, lse_ref = definition(*ref_leaves, keep, scale)
    check_agrees(o, o_ref, "o", same_nonfinite=True)
    check_agrees(lse, lse_ref, "lse", same_nonfinite=True)
    grads = torch.autograd.grad(o, leaves, do)
    grads_ref = torch.autograd.grad(o_ref, ref_leaves, do.double())
    for name, g, g_ref in zip("qkv", grads, grads_ref):
        check_agrees(g, g_ref, f"d{name}", same_nonfinite=False)


def causal_keep():
    return torch.ones(T, T, dtype=torch.bool).tril().expand(B, H, T, T)


@pytest.mark.parametrize("plant", sorted(PLANTS))
@pytest.mark.parametrize("causal, deterministic", [(True, True), (True, False), (False, True), (False, False)])
def test_flash_kernel_nonfinite_input_reaches_only_the_rows_that_see_it(plant, causal, deterministic):
    scale = 1 / math.sqrt(D)
    keep = causal_keep() if causal else torch.ones(B, H, T, T, dtype=torch.bool)
    run_and_check(lambda q, k, v: softmax_attention(q, k, v, causal=causal, return_lse=True, backend="triton",
                                                    deterministic=deterministic),
                  keep, plant, scale)


def _block_mask():
    # Head 0 visits every block on and below the diagonal (the plants of head 0 sit in block 1, which the
    # causal diagonal cuts) but not block 2 from block 0; head 1 leaves out its first diagonal block
    # (rows 0..15 visit nothing when causal: empty rows).
    m = torch.ones(H, 3, 3, dtype=torch.bool)
    m[0, 0, 2] = False
    m[1, 0, 0] = False
    return m


@pytest.mark.parametrize("plant", sorted(PLANTS))
@pytest.mark.parametrize("causal", [True, False])
def test_block_sparse_kernel_nonfinite_input_reaches_only_the_rows_that_see_it(plant, causal):
    scale = 1 / math.sqrt(D)
    bm = _block_mask()
    keep = expand_block_mask(bm, BS, T, T).unsqueeze(0).expand(B, H, T, T)
    if causal:
        keep = keep & causal_keep()
    run_and_check(lambda q, k, v: block_sparse_attention(q, k, v, bm, block_size=BS, causal=causal,
                                                         return_lse=True, backend="triton"),
                  keep, plant, scale)


def _indexer(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 2, T, 8, generator=g), torch.randn(B, 1, T, 8, generator=g), torch.rand(B, 2, T,
                                                                                                   generator=g)


@pytest.mark.parametrize("plant", ["k_posinf", "q_neginf", "v_nan"])       # one of each; the kernel is slow here
def test_topk_kernel_nonfinite_input_reaches_only_the_rows_that_see_it(plant):
    scale = 1 / math.sqrt(D)
    iq, ik, iw = _indexer()
    _, idx = topk_attention(*_inputs(plant)[:3], iq, ik, iw, top_k=9, causal=True, return_indices=True,
                               backend="torch")
    keep = selection_mask(idx, T).expand(B, H, T, T)
    run_and_check(lambda q, k, v: topk_attention(q, k, v, iq, ik, iw, top_k=9, causal=True, return_lse=True,
                                                 backend="triton"),
                  keep, plant, scale)


# ----------------------------------------------------------------------------- the all -inf row, both backends

def _all_neginf_row():
    """Row 30 of head 0: every logit -inf (its q is -inf along a direction every key points along)."""
    q, k, v, _ = _inputs("v_nan")
    v[0, 0, 20, 3] = 0.5
    k[..., 0] = k[..., 0].abs() + 0.1
    q[0, 0, 30, 0] = float("-inf")
    return q, k, v


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("op", ["softmax", "block_sparse", "topk"])
def test_row_of_infinite_logits_is_nan_and_row_of_no_keys_is_zero(op, backend):
    q, k, v = _all_neginf_row()
    iq, ik, iw = _indexer()
    if op == "softmax":
        run = lambda q, k, v: softmax_attention(q, k, v, causal=True, return_lse=True, backend=backend)  # noqa: E731
    elif op == "block_sparse":
        bm = _block_mask()
        run = lambda q, k, v: block_sparse_attention(q, k, v, bm, block_size=BS, causal=True,  # noqa: E731
                                                     return_lse=True, backend=backend)
    else:
        run = lambda q, k, v: topk_attention(q, k, v, iq, ik, iw, top_k=9, causal=True,  # noqa: E731
                                             return_lse=True, backend=backend)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    o, lse = run(*leaves)
    assert torch.isnan(o[0, 0, 30]).all() and lse[0, 0, 30] == float("-inf")
    rest = torch.ones(B, H, T, dtype=torch.bool)
    rest[0, 0, 30] = False
    assert torch.isfinite(o[rest]).all()
    if op == "block_sparse":
        # head 1, rows 0..15 visit no key when causal: empty, not undefined
        assert (o[0, 1, :BS] == 0).all() and (lse[0, 1, :BS] == float("-inf")).all()
    do = torch.randn_like(o)
    dq, dk, dv = torch.autograd.grad(o, leaves, do)
    # the NaN row's gradient stays its own: every other query's dq, the other head's keys and values ...
    assert torch.isfinite(dq[rest]).all()
    assert torch.isfinite(dk[0, 1]).all() and torch.isfinite(dv[0, 1]).all()
    if backend == "triton":
        # ... and, in the kernels, the keys after the row, which it does not see (the torch paths'
        # autograd multiplies their 0 gradient by the row's -inf query)
        assert torch.isfinite(dk[0, 0, 31:]).all() and torch.isfinite(dv[0, 0, 31:]).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_topk_row_with_no_selected_key_is_zero_on_both_backends(backend):
    q, k, v, _ = _inputs("v_nan")
    v[0, 0, 20, 3] = 0.5
    idx = torch.arange(T).view(1, 1, T, 1).repeat(B, 1, 1, 3).clone()
    idx[0, 0, 7] = -1                                   # row 7 selects nothing
    idx[0, 0, :, 1:] = -1
    if backend == "torch":
        o, lse = topk_attention_reference(q, k, v, idx, scale=0.3)
    else:
        from attnlib.kernels.topk import topk_attention_forward
        o, lse = topk_attention_forward(q, k, v, idx, scale=0.3)
    assert (o[:, :, 7] == 0).all() and (lse[:, :, 7] == float("-inf")).all()
    assert torch.isfinite(o).all()
