"""ANNA -- approximate-nearest-neighbour attention with locality-sensitive hashing (chapter 5).

The family (Liu, Yu, Sanford, Andoni, Hsu 2025): an attention unit is ANNA(r, c, l, eta) if, with
probability at least ``1 - eta``, its weights satisfy (i) ``w_ij > 0`` only if ``||q_i - k_j|| <= c r``
and (ii) ``w_ij >= 1 / ((|N(q_i, c r)| - 1) l + 1)`` whenever ``||q_i - k_j|| <= r``.

The LSH implementation built here. Draw ``l = n_tables`` hash tables; table ``t`` keys a vector
``x`` by ``g_t(x) = (h_{t,1}(x), ..., h_{t,z}(x))``, the concatenation of ``z = n_bits`` hashes from
one LSH family. Per table and bucket keep the sum of the values and the count of the keys; a query
divides the summed values of the buckets it falls into by their summed counts:

    o_i = sum_t sum_{j: g_t(k_j) = g_t(q_i)} v_j  /  sum_t #{j: g_t(k_j) = g_t(q_i)},

i.e. the weights ``w_ij = m_ij / sum_j' m_ij'`` with ``m_ij`` the number of tables in which ``q_i`` and
``k_j`` collide (a key that collides in several tables counts that many times). A query that
collides with nothing gets ``o_i = 0`` (an empty row). The causal form (ours; the paper states none)
keeps only ``j <= i`` in both sums.

Families. ``"simhash"`` (Charikar 2002): ``h(x) = [a . x > 0]`` for a Gaussian vector ``a``; one bit,
``Pr[h(x) = h(y)] = 1 - theta(x, y) / pi``. ``"crosspolytope"`` (Andoni et al. 2015; Reformer's
hash): ``h(x) = argmax over the 2D signed coordinates of [G x, -G x]`` for a Gaussian ``G [D, D]``;
one of ``2D`` values, with no closed-form collision probability at small ``D`` (chapter 5 measures it).

How it is computed without a T x T matrix (``anna_attention_reference``). Hashing ``T`` vectors costs
``2 l z D T`` FLOPs for SimHash (``l z D T`` multiply-adds: one projection per bit) and about
``4 l z D^2 T`` for cross-polytope (a ``D x D`` product per hash). Then, per (batch, head, table): sort
the keys' codes (stably, so time order survives inside a bucket); a bucket is a segment ``[lo, end)``
of the sorted order, found for a query by two binary searches. The values, in that order, go through
a *segmented scan* -- a running sum restarted at every bucket start -- so position ``p`` holds the sum
of its own bucket's values from the bucket's start to ``p``, and a query reads one entry per table:
at ``end - 1`` (its whole bucket), or for the causal form at ``hi - 1``, ``hi`` being the end of the
bucket's keys at times ``<= i`` (one more binary search on the sorted pairs (bucket, time)). No sum is
ever a difference of two sums, so a value reaches only the queries that share its bucket (causal:
and come at or after it). Memory ``O(l T Dv)``; time ``O(l T (z D + log T + Dv log T))`` in the
reference (its scan takes ``log2 T`` doubling steps), ``O(l T (z D + log T + Dv))`` in the kernels.

Non-finite inputs. A value row holding NaN or inf reaches exactly the outputs of the queries that
collide with it (there, in the columns it holds them, the output is NaN or inf, as in ``w @ v``); no
other output changes by a bit. A query or key with a NaN or inf entry has no direction to hash.
Where values are checked (CPU tensors; elsewhere with ``ATTNLIB_CHECK_VALUES=1``, see
:mod:`attnlib._validate`) the op raises a ValueError. Unchecked (a GPU, no host sync), such a key
collides with no query -- every output is that of the sequence without it (in the kernels, up to
rounding: the scan's tiles shift) -- and such a query's output row (and weight row) is NaN, since
which keys it meets is undefined; no other row changes.
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._backend import CROSSPOLYTOPE_MAX_HEAD_DIM, MAX_HEAD_DIM, choose_backend
from ._numerics import acc_dtype

FAMILIES = ("simhash", "crosspolytope")
MAX_WEIGHT_ENTRIES = 1 << 24      # return_weights: at most this many entries of T_q x T_k per head
MAX_CODE_BITS = 62                # a table's bucket key is one int64; composite keys need headroom
SURROGATE = ("train the differentiable surrogate instead -- softmax attention on unit-norm q and k with a "
             "temperature beta (the paper tunes it; attnlib's experiments learn it), "
             "softmax(beta * q_hat k_hat^T) v (attnlib.softmax_attention with scale=beta) -- and evaluate "
             "ANNA on the trained q, k, v under torch.no_grad() or on detached tensors (the bucket "
             "assignment is piecewise constant in q and k: no useful gradient)")
# Codes for rows with a NaN or inf entry (unchecked inputs only): below every real code (those are
# >= 0), and different for queries and keys, so such a row shares a bucket with nothing.
NONFINITE_QUERY_CODE = -2
NONFINITE_KEY_CODE = -1


# ----------------------------------------------------------------------------------------------
# LSH families
# ----------------------------------------------------------------------------------------------

def bits_per_hash(family: str, dim: int) -> float:
    """log2 of the number of values one hash takes: 1 for SimHash, ``log2(2 D)`` for cross-polytope."""
    return 1.0 if family == "simhash" else math.log2(2 * dim)


def max_n_bits(family: str, dim: int) -> int:
    """The largest ``n_bits`` (hashes per table) whose concatenated key fits in a table's int64 code."""
    return min(30, int(MAX_CODE_BITS // bits_per_hash(family, dim))) if family == "crosspolytope" else 30


def lsh_projections(family: str, n_tables: int, n_bits: int, dim: int, seed: int) -> torch.Tensor:
    """The random matrices of ``n_tables x n_bits`` hash functions, drawn on the CPU from ``seed``.

    simhash: ``[n_tables, dim, n_bits]`` (column ``b`` of table ``t`` is the hyperplane normal ``a_{t,b}``).
    crosspolytope: ``[n_tables, n_bits, dim, dim]`` (one Gaussian matrix ``G_{t,b}`` per hash).
    Float64 on the CPU, so the same seed gives the same hashes on every device and in every dtype.
    """
    g = torch.Generator().manual_seed(seed)
    if family == "simhash":
        return torch.randn(n_tables, dim, n_bits, generator=g, dtype=torch.float64)
    return torch.randn(n_tables, n_bits, dim, dim, generator=g, dtype=torch.float64)


def lsh_codes(x: torch.Tensor, proj: torch.Tensor, family: str) -> torch.Tensor:
    """Bucket keys ``g_t(x)`` of ``x [B, H, T, D]`` under the tables ``proj``: int64 ``[B, H, l, T]``.

    simhash: bit ``b`` of the key is ``[x . a_{t,b} > 0]``, so the key is an integer in ``[0, 2^z)``.
    crosspolytope: the ``z`` hashes in ``[0, 2D)`` are digits of a base-``2D`` number.
    Projections are computed in float32 (float64 for float64 inputs) whatever the input dtype.
    """
    acc = acc_dtype(x.dtype)
    xa = x.to(acc)
    if family == "simhash":
        n_bits = proj.shape[-1]
        p = torch.einsum("bhtd,ldz->bhltz", xa, proj.to(device=x.device, dtype=acc))
        weights = torch.ones(n_bits, dtype=torch.int64, device=x.device) << torch.arange(n_bits, device=x.device)
        return ((p > 0).long() * weights).sum(-1)
    n_bits, D = proj.shape[1], proj.shape[-1]
    p = torch.einsum("bhtd,lzde->bhltze", xa, proj.to(device=x.device, dtype=acc))
    h = torch.cat([p, -p], dim=-1).argmax(-1)                                 # [B, H, l, T, z] in [0, 2D)
    radix = torch.full((n_bits,), 2 * D, dtype=torch.int64, device=x.device)
    place = torch.cumprod(torch.cat([radix.new_ones(1), radix[:-1]]), 0)     # (2D)^b
    return (h * place).sum(-1)


def _probability_tensor(name: str, x, lo: float, hi: float, span: str) -> torch.Tensor:
    """``x`` as a float64 tensor, its values checked to lie in ``[lo, hi]`` where values are checked.

    The bounds are compared in ``x``'s own dtype (float32 ``pi`` rounds above ``math.pi``:
    ``torch.linspace(0, math.pi, n)`` must pass), then the float64 copy is clamped to ``[lo, hi]``."""
    if isinstance(x, bool) or not isinstance(x, (int, float, torch.Tensor)):
        raise TypeError(f"{name} must be a number or a tensor; got {type(x).__name__}")
    x = torch.as_tensor(x)
    if not x.dtype.is_floating_point:
        x = x.to(torch.float64)
    inside = (x >= torch.tensor(lo, dtype=x.dtype)) & (x <= torch.tensor(hi, dtype=x.dtype))
    if _validate.checks_values(x) and not bool(inside.all()):
        bad = x[~inside].flatten()[0].item()
        raise ValueError(f"{name} must lie in {span}; got an entry {bad!r}")
    return x.to(torch.float64).clamp(lo, hi)


def simhash_collision_probability(theta, n_bits: int = 1):
    """``Pr[g(x) = g(y)] = (1 - theta / pi)^z`` for two vectors at angle ``theta`` in ``[0, pi]`` (exact,
    any ``D``), with ``z = n_bits >= 0`` hashes per table (``z = 0``: every pair collides)."""
    theta = _probability_tensor("theta", theta, 0.0, math.pi, "[0, pi] (an angle between two vectors)")
    n_bits = _validate.check_int("n_bits", n_bits, lo=0)
    return (1.0 - theta / math.pi) ** n_bits


def table_collision_probability(p_one, n_bits: int, n_tables: int):
    """From one hash's collision probability ``p`` in ``[0, 1]``: collide in a table ``p^z``; in at least
    one of ``l`` tables ``1 - (1 - p^z)^l`` (the tables are independent). ``z, l >= 1``."""
    p_one = _probability_tensor("p_one", p_one, 0.0, 1.0, "[0, 1] (a probability)")
    n_bits = _validate.check_int("n_bits", n_bits, lo=1)
    n_tables = _validate.check_int("n_tables", n_tables, lo=1)
    return 1.0 - (1.0 - p_one ** n_bits) ** n_tables


# ----------------------------------------------------------------------------------------------
# The definition (dense; the test oracle) and the reference (sort + segment, no T x T)
# ----------------------------------------------------------------------------------------------

def anna_collision_counts(q_codes: torch.Tensor, k_codes: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """``m_ij`` = number of tables in which query ``i`` and key ``j`` share a bucket: ``[B, H, Tq, Tk]``
    int64 (causal: zero above the diagonal). Builds the T x T matrix: small T only."""
    m = (q_codes.unsqueeze(-1) == k_codes.unsqueeze(-2)).sum(2)              # [B, H, Tq, Tk]
    if causal:
        Tq, Tk = m.shape[-2:]
        m = m * torch.ones(Tq, Tk, dtype=torch.bool, device=m.device).tril()
    return m


def anna_weights_from_counts(m: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """``w_ij = m_ij / sum_j' m_ij'``; an all-zero row stays zero (the query collided with nothing)."""
    m = m.to(dtype)
    return m / m.sum(-1, keepdim=True).clamp_min(1)


def _segments(q_codes: torch.Tensor, k_codes: torch.Tensor, causal: bool):
    """Per (batch, head, table): ``(perm, start, lo, hi)`` -- the stable sort of the keys by code, the
    sorted position where each sorted key's bucket starts, and each query's segment ``[lo, hi)`` of
    that order (its bucket; causal: the bucket's keys at times ``<= i``). ``hi == lo``: no collision."""
    sorted_codes, perm = torch.sort(k_codes, dim=-1, stable=True)            # [B, H, l, Tk]
    start = torch.searchsorted(sorted_codes, sorted_codes, side="left")
    lo = torch.searchsorted(sorted_codes, q_codes, side="left")
    end = torch.searchsorted(sorted_codes, q_codes, side="right")          # the bucket is [lo, end)
    if not causal:
        return perm, start, lo, end
    # (bucket start, time) is nondecreasing along the sorted order, because the stable sort keeps
    # time order inside a bucket: one more binary search finds the bucket's last key at time <= i.
    Tk = k_codes.shape[-1]
    composite = start * Tk + perm
    t = torch.arange(q_codes.shape[-1], device=q_codes.device)
    hi = torch.searchsorted(composite, lo * Tk + t, side="right")
    # An absent bucket (lo == end) would otherwise borrow the keys of the bucket that starts at lo.
    hi = torch.minimum(torch.maximum(hi, lo), end)
    return perm, start, lo, hi


def _sorted_values(v: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``v`` in each table's bucket-sorted order: ``[B, H, l, Tk, Dv]`` in float32 (float64 for float64)."""
    B, H, l, Tk = perm.shape
    Dv = v.shape[-1]
    return torch.gather(v.to(acc_dtype(v.dtype)).unsqueeze(2).expand(B, H, l, Tk, Dv), 3,
                        perm.unsqueeze(-1).expand(B, H, l, Tk, Dv))


def _segmented_cumsum(x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """``S[p] = sum_{start[p] <= r <= p} x[r]`` along dim 3 of ``x [B, H, l, Tk, Dv]``: a running sum
    restarted at every bucket start, so a row only ever meets the rows of its own bucket.

    Doubling (Hillis--Steele): after the step with shift ``d``, ``S[p]`` covers ``[max(start, p-2d+1), p]``;
    ``S[p-d]`` is added only when ``p - d`` lies in ``p``'s bucket, and selected, never multiplied by a
    0 mask (``0 * NaN`` is NaN). ``log2 Tk`` steps of ``O(l Tk Dv)``."""
    Tk = x.shape[3]
    pos = torch.arange(Tk, device=x.device)
    d = 1
    while d < Tk:
        same_bucket = (pos - d >= start).unsqueeze(-1)                      # [B, H, l, Tk, 1]
        shifted = torch.nn.functional.pad(x, (0, 0, d, 0))[..., :Tk, :]     # shifted[p] = x[p - d]
        x = x + torch.where(same_bucket, shifted, 0.0)
        d *= 2
    return x


def _gather_reference(scan: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out_dtype) -> torch.Tensor:
    """``o_i = sum_t S_t[hi - 1] / max(1, sum_t (hi - lo))`` over the tables where ``hi > lo`` -- the
    kernel ``anna_gather`` in torch. ``S_t[hi - 1]`` is the sum of the query's segment ``[lo, hi)``."""
    B, H, l, _, Dv = scan.shape
    Tq = lo.shape[-1]
    hit = hi > lo
    last = (hi - 1).clamp_min(0).unsqueeze(-1).expand(B, H, l, Tq, Dv)
    seg_sum = torch.where(hit.unsqueeze(-1), torch.gather(scan, 3, last), 0.0)
    num = seg_sum.sum(2)                                                      # [B, H, Tq, Dv]
    cnt = (hi - lo).sum(2).to(scan.dtype)                                     # [B, H, Tq]
    return (num / cnt.clamp_min(1).unsqueeze(-1)).to(out_dtype)


def _codes(x: torch.Tensor, proj: torch.Tensor, family: str, *, nonfinite_code: int, kernel: bool = False):
    """The tables' bucket keys of ``x`` (:func:`lsh_codes`, or the Triton hashing kernel), with
    ``nonfinite_code`` for the rows that hold a NaN or inf (no direction: they collide with nothing)."""
    if kernel:
        from .kernels.anna import crosspolytope_codes, simhash_codes
        codes = (simhash_codes if family == "simhash" else crosspolytope_codes)(x, proj)
    else:
        codes = lsh_codes(x, proj, family)
    finite = torch.isfinite(x).all(-1).unsqueeze(2)                        # [B, H, 1, T]
    return torch.where(finite, codes, nonfinite_code)


def _nan_where_query_nonfinite(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Rows ``i`` of ``x [B, H, Tq, *]`` set to NaN where ``q_i`` has a NaN or inf entry."""
    bad = ~torch.isfinite(q).all(-1, keepdim=True)
    return torch.where(bad, float("nan"), x)


def anna_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, proj: torch.Tensor, *,
                             family: str, causal: bool) -> torch.Tensor:
    """ANNA by sort and segmented scan, in plain PyTorch: memory ``O(l T Dv)``, never ``T x T``.

    Sums accumulate in float32 (float64 for float64 inputs); each bucket's sum is a sum of that
    bucket's values alone, so its rounding error is that of summing them. Returns ``o [B, H, Tq, Dv]``
    in v's dtype. Non-finite rows of q, k are handled as the module docstring states.
    """
    B, H, Tq, _ = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if Tq == 0 or Tk == 0 or B * H == 0:
        return v.new_zeros(B, H, Tq, Dv)
    qc = _codes(q, proj, family, nonfinite_code=NONFINITE_QUERY_CODE)      # [B, H, l, Tq]
    kc = _codes(k, proj, family, nonfinite_code=NONFINITE_KEY_CODE)        # [B, H, l, Tk]
    perm, start, lo, hi = _segments(qc, kc, causal)
    o = _gather_reference(_segmented_cumsum(_sorted_values(v, perm), start), lo, hi, v.dtype)
    return _nan_where_query_nonfinite(o, q)


def _anna_attention_triton(q, k, v, proj, *, family: str, causal: bool) -> torch.Tensor:
    """The kernel path: hash (Triton) -> sort and segment (torch) -> segmented scan (Triton) -> gather (Triton)."""
    from .kernels.anna import anna_gather, anna_segmented_scan

    qc = _codes(q, proj, family, nonfinite_code=NONFINITE_QUERY_CODE, kernel=True)
    kc = _codes(k, proj, family, nonfinite_code=NONFINITE_KEY_CODE, kernel=True)
    perm, start, lo, hi = _segments(qc, kc, causal)
    scan = anna_segmented_scan(v, perm, start)
    return _nan_where_query_nonfinite(anna_gather(scan, lo, hi, v.dtype), q)


# ----------------------------------------------------------------------------------------------
# The public op
# ----------------------------------------------------------------------------------------------

def _check_finite_directions(q: torch.Tensor, k: torch.Tensor) -> None:
    """Refuse NaN or inf in q or k where values are checked (a direction must be finite to hash)."""
    for name, x in (("q", q), ("k", k)):
        if _validate.checks_values(x) and x.numel() and not bool(torch.isfinite(x).all()):
            row = (~torch.isfinite(x)).any(-1).nonzero()[0].tolist()
            raise ValueError(f"{name} has a non-finite entry at [batch, head, time] = {row}; expected finite "
                             f"{'queries' if name == 'q' else 'keys'} (ANNA hashes their directions)")


def anna_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, n_tables: int, n_bits: int,
                   family: str = "simhash", seed: int = 0, causal: bool,
                   return_weights: bool = False, backend: str = "auto"):
    """Approximate-nearest-neighbour attention by LSH.

    Args:
        q: ``[B, H, Tq, D]``.  k: ``[B, H, Tk, D]``.  v: ``[B, H, Tk, Dv]``.
        n_tables: ``l >= 1``, the number of hash tables.
        n_bits: ``z``, hashes concatenated into one table's key (SimHash: bits, 1..30; cross-polytope:
            hashes of ``log2(2D)`` bits each, as many as fit in 62 bits).
        family: ``"simhash"`` or ``"crosspolytope"``.
        seed: an int >= 0; it alone decides the hash functions (same seed, same hashes, any device).
        causal: query ``i`` sees only keys ``j <= i`` (needs ``Tq == Tk``).
        return_weights: also return the implied weights ``w [B, H, Tq, Tk]`` (float64 on q's device;
            rows sum to 1 or are all zero) -- built densely, so only for ``Tq * Tk <= 2^24``.
            ``Tk == 0`` is allowed: every row is empty.
        backend: ``"auto"`` (the Triton kernels on CUDA -- cross-polytope for ``D <= CROSSPOLYTOPE_MAX_HEAD_DIM`` -- the
            reference otherwise), ``"torch"`` or ``"triton"``.

    Returns ``o [B, H, Tq, Dv]`` in v's dtype, or ``(o, w)``. Not differentiable: inputs that
    require grad (with grad mode on) raise, naming the surrogate to train instead. NaN or inf in q
    or k raises where values are checked (CPU tensors, or ``ATTNLIB_CHECK_VALUES=1``); unchecked,
    such a key collides with nothing and such a query's row is NaN. NaN or inf in a value row
    reaches exactly the queries that collide with it (see the module docstring).
    """
    _validate.check_bool("causal", causal)
    B, H, Tq, Tk, D, Dv = _validate.check_qkv(q, k, v, same_length=causal, allow_no_keys=True)
    _check_finite_directions(q, k)
    _validate.check_int("n_tables", n_tables, lo=1, hi=4096)
    if not isinstance(family, str) or family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")
    nb_max = max_n_bits(family, D)
    why = "" if family == "simhash" else (f" (cross-polytope at D={D}: {bits_per_hash(family, D):.1f} bits per "
                                          "hash, the table key must fit in 62 bits)")
    _validate.check_int("n_bits", n_bits, lo=1, hi=nb_max, why=why)
    # the converted int is the one used: a NumPy or torch integer is accepted; torch's seeds are < 2**64
    seed = _validate.check_int("seed", seed, lo=0, hi=2**64 - 1)
    _validate.check_bool("return_weights", return_weights)
    if return_weights and Tq * Tk > MAX_WEIGHT_ENTRIES:
        raise ValueError(f"return_weights=True builds the Tq x Tk weight matrix; Tq * Tk = {Tq * Tk} exceeds "
                         f"{MAX_WEIGHT_ENTRIES} (2^24): use return_weights=False at this length")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("anna_attention is not differentiable and got inputs that require grad: " + SURROGATE)

    proj = lsh_projections(family, n_tables, n_bits, D, seed)
    why_not = None
    if family == "crosspolytope" and D > CROSSPOLYTOPE_MAX_HEAD_DIM:
        why_not = (f"the cross-polytope hashing kernel is compiled and checked for heads up to "
                   f"{CROSSPOLYTOPE_MAX_HEAD_DIM} and takes D up to {CROSSPOLYTOPE_MAX_HEAD_DIM}; got D={D}")
    elif max(D, Dv) > MAX_HEAD_DIM:
        why_not = f"the kernel takes head dims up to {MAX_HEAD_DIM}; got D={D}, Dv={Dv}"
    which = choose_backend(backend, q, why_not=why_not)
    if which == "triton" and B * H * Tq * Tk > 0:
        o = _anna_attention_triton(q, k, v, proj, family=family, causal=causal)
    else:
        o = anna_attention_reference(q, k, v, proj, family=family, causal=causal)
    if not return_weights:
        return o
    qc = _codes(q, proj, family, nonfinite_code=NONFINITE_QUERY_CODE)
    kc = _codes(k, proj, family, nonfinite_code=NONFINITE_KEY_CODE)
    w = anna_weights_from_counts(anna_collision_counts(qc, kc, causal=causal))
    return o, _nan_where_query_nonfinite(w, q)
