"""ANNA's Triton kernels through the interpreter on the CPU (fp32, odd shapes: T not a multiple of the
block, D not a power of two, Dv != D): the hashing kernels against the reference's codes, the op against
the torch reference and against the float64 definition (dense counts -> weights -> W @ v), on random
and on degenerate buckets (one bucket over several scan tiles, singletons, interleaved buckets)."""

import pytest
import torch

from attnlib import anna_attention
from attnlib.anna import anna_collision_counts, anna_weights_from_counts, lsh_codes, lsh_projections
from attnlib.kernels.anna import anna_gather, anna_segmented_scan, crosspolytope_codes, simhash_codes


def _qkv(B, H, Tq, Tk, D, Dv, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, Tk, D, generator=g)
    q = k[:, :, torch.randint(0, Tk, (Tq,), generator=g)] + 0.4 * torch.randn(B, H, Tq, D, generator=g)
    return q, k, torch.randn(B, H, Tk, Dv, generator=g)


@pytest.mark.parametrize("D,n_bits", [(5, 1), (12, 7), (33, 20)])
def test_simhash_kernel_codes_equal_reference_codes(D, n_bits):
    x = torch.randn(2, 3, 37, D, generator=torch.Generator().manual_seed(D))
    planes = lsh_projections("simhash", 3, n_bits, D, 4)
    assert torch.equal(simhash_codes(x, planes), lsh_codes(x, planes, "simhash"))


# (70: the projection columns in five blocks of 16, the last partly padded; 6^20 > 2^31)
@pytest.mark.parametrize("D,n_bits", [(3, 1), (12, 4), (20, 2), (70, 3), (3, 20)])
def test_crosspolytope_kernel_codes_equal_reference_codes(D, n_bits):
    x = torch.randn(2, 1, 37, D, generator=torch.Generator().manual_seed(D))
    rot = lsh_projections("crosspolytope", 3, n_bits, D, 4)
    assert torch.equal(crosspolytope_codes(x, rot), lsh_codes(x, rot, "crosspolytope"))


@pytest.mark.parametrize("D", [16, 40])
def test_crosspolytope_kernel_breaks_ties_as_the_reference_across_column_blocks(D):
    """Equal projections in different blocks of columns (column 20 or 3 + 16 a copy of column 3) and a
    negated copy (+p_3 = -p_c) tie for the maximum when x is column 3 itself: the first index wins, and the
    positive half over the negative, as the reference's arg-max over [p, -p]; an all-zero rotation makes
    every projection 0 (and -0): digit 0."""
    g = torch.Generator().manual_seed(D)
    rot = torch.randn(2, 2, D, D, generator=g)
    twin, negated = (20, D - 5) if D > 20 else (3 + D // 2, D - 1)
    rot[0, :, :, twin] = rot[0, :, :, 3]
    rot[0, :, :, negated] = -rot[0, :, :, 3]
    rot[1] = 0.0
    x = torch.randn(1, 1, 21, D, generator=g)
    x[0, 0, :4] = rot[0, 0, :, 3]                               # rows whose first hash ties at column 3
    got, want = crosspolytope_codes(x, rot), lsh_codes(x, rot, "crosspolytope")
    assert torch.equal(got, want)
    assert (got[0, 0, 0, :4] % (2 * D) == 3).all()              # the first digit: the positive column 3
    assert (got[0, 0, 1] == 0).all()                           # all-zero rotations: every digit 0


@pytest.mark.parametrize("D", [16, 40])
def test_crosspolytope_kernel_takes_a_nan_row(D):
    """A row with a NaN has no direction (the op replaces its key); the kernel must still run -- a NaN
    projection never wins an arg-max, so no block of columns is all NaN -- and leave the other rows'
    keys equal to the reference's."""
    x = torch.randn(1, 1, 19, D, generator=torch.Generator().manual_seed(D))
    x[0, 0, 5, 2] = float("nan")
    rot = lsh_projections("crosspolytope", 2, 3, D, 1)
    got, want = crosspolytope_codes(x, rot), lsh_codes(x, rot, "crosspolytope")
    rows = [t for t in range(19) if t != 5]
    assert torch.equal(got[..., rows], want[..., rows])


@pytest.mark.parametrize("causal", [False, True])
def test_crosspolytope_kernel_path_matches_reference(causal, rel_err):
    q, k, v = _qkv(1, 2, 41, 41, 10, 6, 5)
    kw = dict(n_tables=3, n_bits=2, seed=9, causal=causal, family="crosspolytope")
    o_ref = anna_attention(q, k, v, backend="torch", **kw)
    assert rel_err(anna_attention(q, k, v, backend="triton", **kw), o_ref) < 1e-6


@pytest.mark.parametrize("causal,Tq,Tk,D,Dv,n_tables,n_bits", [
    (False, 37, 37, 12, 7, 3, 3), (True, 37, 37, 12, 7, 3, 3), (False, 50, 50, 5, 20, 1, 1),
    (True, 50, 50, 5, 20, 1, 1), (False, 23, 41, 24, 3, 5, 6), (True, 70, 70, 24, 3, 5, 6)])
def test_kernel_matches_reference_on_odd_shapes(causal, Tq, Tk, D, Dv, n_tables, n_bits, rel_err):
    q, k, v = _qkv(2, 2, Tq, Tk, D, Dv, Tq + D)
    kw = dict(n_tables=n_tables, n_bits=n_bits, seed=7, causal=causal)
    o_ref = anna_attention(q, k, v, backend="torch", **kw)
    o_ker = anna_attention(q, k, v, backend="triton", **kw)
    assert o_ker.dtype == torch.float32
    assert rel_err(o_ker, o_ref) < 1e-6


def test_kernel_gives_zero_rows_for_queries_that_collide_with_nothing():
    k = torch.randn(1, 1, 20, 8, generator=torch.Generator().manual_seed(0))
    q = -k[:, :, :5]                                     # antipodal: every SimHash bit differs
    o = anna_attention(q, k, torch.ones(1, 1, 20, 3), n_tables=4, n_bits=16, backend="triton", causal=False)
    assert torch.equal(o, torch.zeros_like(o))


def test_kernel_in_float16_matches_reference_on_the_same_inputs(rel_err):
    q, k, v = _qkv(1, 2, 33, 33, 16, 16, 3)
    q, k, v = q.half(), k.half(), v.half()
    o_ref = anna_attention(q, k, v, n_tables=2, n_bits=4, backend="torch", causal=True)
    o_ker = anna_attention(q, k, v, n_tables=2, n_bits=4, backend="triton", causal=True)
    assert o_ker.dtype == torch.float16 and rel_err(o_ker, o_ref) < 1e-3


def _definition(q, k, v, *, n_tables, n_bits, seed, causal, family="simhash"):
    """The float64 definition: dense collision counts -> weights -> ``W @ v``."""
    proj = lsh_projections(family, n_tables, n_bits, q.shape[-1], seed)
    m = anna_collision_counts(lsh_codes(q, proj, family), lsh_codes(k, proj, family), causal=causal)
    return anna_weights_from_counts(m) @ v.double()


def _degenerate(kind, T, D=6, Dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(1, 2, T, Dv, generator=g)
    if kind == "one_bucket":                # every key identical: one bucket across several scan tiles
        k = torch.randn(1, 2, 1, D, generator=g).expand(1, 2, T, D).contiguous()
        return k.clone(), k, v
    if kind == "own_buckets":               # keys far apart at many bits: mostly singleton buckets
        k = torch.randn(1, 2, T, D, generator=g)
        return k.clone(), k, v
    if kind == "two_alternating":           # two buckets interleaved in time: every sorted tile switches
        a = torch.randn(1, 2, 1, D, generator=g)
        k = torch.where((torch.arange(T) % 2 == 0)[None, None, :, None], a, -a)
        return k.clone(), k, v
    raise ValueError(kind)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind,T,n_bits", [("one_bucket", 53, 4), ("own_buckets", 37, 20),
                                            ("two_alternating", 41, 3), ("one_bucket", 1, 2)])
def test_kernel_matches_the_float64_definition_on_degenerate_buckets(kind, T, n_bits, causal, rel_err):
    q, k, v = _degenerate(kind, T)
    kw = dict(n_tables=3, n_bits=n_bits, seed=2, causal=causal)
    want = _definition(q, k, v, **kw)
    assert rel_err(anna_attention(q, k, v, backend="triton", **kw), want.float()) < 1e-6
    assert rel_err(anna_attention(q, k, v, backend="torch", **kw), want.float()) < 1e-6


@pytest.mark.parametrize("causal", [False, True])
def test_kernel_matches_the_float64_definition_on_random_inputs(causal, rel_err):
    q, k, v = _qkv(2, 2, 45, 45, 12, 7, 11)
    kw = dict(n_tables=4, n_bits=3, seed=5, causal=causal)
    want = _definition(q.double(), k.double(), v, **kw)
    assert rel_err(anna_attention(q, k, v, backend="triton", **kw), want.float()) < 1e-6


def test_segmented_scan_kernel_sums_each_bucket_from_its_start():
    """``S[p] = sum of v[perm[r]]`` over ``start[p] <= r <= p``, written out row by row in float64."""
    g = torch.Generator().manual_seed(0)
    T, Dv = 50, 3
    v = torch.randn(1, 1, T, Dv, generator=g)
    codes = torch.randint(0, 4, (1, 1, 2, T), generator=g)
    sorted_codes, perm = torch.sort(codes, dim=-1, stable=True)
    start = torch.searchsorted(sorted_codes, sorted_codes, side="left")
    S = anna_segmented_scan(v, perm, start)
    for t in range(2):
        for p in range(T):
            rows = perm[0, 0, t, start[0, 0, t, p]:p + 1]
            assert torch.allclose(S[0, 0, t, p].double(), v[0, 0, rows].double().sum(0), atol=1e-6)
    lo = hi = torch.zeros(1, 1, 2, 4, dtype=torch.int64)
    assert torch.equal(anna_gather(S, lo, hi, torch.float32), torch.zeros(1, 1, 4, Dv))     # no collision: 0
