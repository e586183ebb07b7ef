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

How it is computed without a T x T matrix (``anna_attention_reference``). Per (batch, head, table):
sort the keys' codes (stably, so time order survives inside a bucket); a bucket is then a segment
``[lo, hi)`` of the sorted order, found for a query by two binary searches, and its value sum is a
difference of prefix sums ``P[hi] - P[lo]``. For the causal form, ``hi`` is instead the end of the
bucket's keys at or before time ``i``: one more binary search on the sorted pairs (bucket, time).
Memory ``O(l T Dv)``; time ``O(l T (z D + log T + Dv))``.
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._backend import choose_backend

FAMILIES = ("simhash", "crosspolytope")
MAX_WEIGHT_ENTRIES = 1 << 24      # return_weights: at most this many entries of T_q x T_k per head
MAX_CODE_BITS = 62                # a table's bucket key is one int64; composite keys need headroom
SURROGATE = ("train the differentiable surrogate instead -- softmax attention on unit-norm q and k with a "
             "learned temperature beta, softmax(beta * q_hat k_hat^T) v (attnlib.softmax_attention with "
             "scale=beta) -- and evaluate ANNA on the trained q, k, v under torch.no_grad() or on detached "
             "tensors (the bucket assignment is piecewise constant in q and k: no useful gradient)")


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
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
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


def simhash_collision_probability(theta, n_bits: int = 1):
    """``Pr[g(x) = g(y)] = (1 - theta / pi)^z`` for two vectors at angle ``theta`` (exact, any ``D``)."""
    theta = torch.as_tensor(theta, dtype=torch.float64)
    return (1.0 - theta / math.pi) ** n_bits


def table_collision_probability(p_one, n_bits: int, n_tables: int):
    """From one hash's collision probability ``p``: collide in a table ``p^z``; in at least one of
    ``l`` tables ``1 - (1 - p^z)^l`` (the tables are independent)."""
    p_one = torch.as_tensor(p_one, dtype=torch.float64)
    return 1.0 - (1.0 - p_one ** n_bits) ** n_tables


# ----------------------------------------------------------------------------------------------
# The definition (dense; the test oracle) and the reference (sort + segment, no T x T)
# ----------------------------------------------------------------------------------------------

def anna_collision_counts(q_codes: torch.Tensor, k_codes: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
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
    """Per (batch, head, table): the stable sort of the keys by code, and each query's segment
    ``[lo, hi)`` of that order (its bucket; causal: the bucket's keys at times ``<= i``)."""
    sorted_codes, perm = torch.sort(k_codes, dim=-1, stable=True)            # [B, H, l, Tk]
    lo = torch.searchsorted(sorted_codes, q_codes, side="left")
    end = torch.searchsorted(sorted_codes, q_codes, side="right")          # the bucket is [lo, end)
    if not causal:
        return perm, lo, end
    # Bucket starts are positions < Tk; (bucket start, time) is nondecreasing along the sorted order,
    # because the stable sort keeps time order inside a bucket. One more binary search finds the end.
    Tk = k_codes.shape[-1]
    start = torch.searchsorted(sorted_codes, sorted_codes, side="left")
    composite = start * Tk + perm
    t = torch.arange(q_codes.shape[-1], device=q_codes.device)
    hi = torch.searchsorted(composite, lo * Tk + t, side="right")
    # An absent bucket (lo == end) would otherwise borrow the keys of the bucket that starts at lo.
    hi = torch.minimum(torch.maximum(hi, lo), end)
    return perm, lo, hi


def _prefix_sums(v: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``P [B, H, l, Tk + 1, Dv]``: per table, the running sums of the values in bucket-sorted order
    (``P[0] = 0``), in float32 (float64 for float64 values)."""
    acc = torch.float64 if v.dtype == torch.float64 else torch.float32
    B, H, l, Tk = perm.shape
    Dv = v.shape[-1]
    v_sorted = torch.gather(v.to(acc).unsqueeze(2).expand(B, H, l, Tk, Dv), 3,
                            perm.unsqueeze(-1).expand(B, H, l, Tk, Dv))
    return torch.nn.functional.pad(v_sorted.cumsum(3), (0, 0, 1, 0))


def _gather_reference(prefix: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, out_dtype) -> torch.Tensor:
    """``o_i = sum_t (P_t[hi] - P_t[lo]) / max(1, sum_t (hi - lo))`` -- the kernel ``anna_gather`` in torch."""
    B, H, l, _, Dv = prefix.shape
    Tq = lo.shape[-1]
    take = lambda idx: torch.gather(prefix, 3, idx.unsqueeze(-1).expand(B, H, l, Tq, Dv))  # noqa: E731
    num = (take(hi) - take(lo)).sum(2)                                        # [B, H, Tq, Dv]
    cnt = (hi - lo).sum(2).to(prefix.dtype)                                   # [B, H, Tq]
    return (num / cnt.clamp_min(1).unsqueeze(-1)).to(out_dtype)


def anna_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, proj: torch.Tensor, *,
                             family: str, causal: bool = False) -> torch.Tensor:
    """ANNA by sort and segment, in plain PyTorch: memory ``O(l T Dv)``, never ``T x T``.

    Sums accumulate in float32 (float64 for float64 inputs). Returns ``o [B, H, Tq, Dv]`` in v's dtype.
    Prefix sums are differenced, so a bucket's sum carries an absolute error of about
    ``eps * |P|``, with ``P`` the running sum of the values in sorted order (float32: fine for values
    of mixed sign; for long sequences of same-sign values, pass float64).
    """
    B, H, Tq, _ = q.shape
    Tk, Dv = k.shape[2], v.shape[3]
    if Tq == 0 or Tk == 0 or B * H == 0:
        return v.new_zeros(B, H, Tq, Dv)
    qc, kc = lsh_codes(q, proj, family), lsh_codes(k, proj, family)        # [B, H, l, T]
    perm, lo, hi = _segments(qc, kc, causal)
    return _gather_reference(_prefix_sums(v, perm), lo, hi, v.dtype)


def _anna_attention_triton(q, k, v, proj, *, family: str, causal: bool) -> torch.Tensor:
    """The kernel path: hash (Triton) -> sort and segment (torch) -> gather (Triton)."""
    from .kernels.anna import anna_gather, crosspolytope_codes, simhash_codes

    hash_codes = simhash_codes if family == "simhash" else crosspolytope_codes
    qc, kc = hash_codes(q, proj), hash_codes(k, proj)
    perm, lo, hi = _segments(qc, kc, causal)
    return anna_gather(_prefix_sums(v, perm), lo.contiguous(), hi.contiguous(), v.dtype)


# ----------------------------------------------------------------------------------------------
# The public op
# ----------------------------------------------------------------------------------------------

def _check_inputs(q, k, v, causal: bool) -> tuple[int, int, int, int, int, int]:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _validate.check_tensor(name, t, ndim=4)
    _validate.check_same_device_dtype([("q", q), ("k", k), ("v", v)])
    B, H, Tq, D = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != D:
        raise ValueError(f"k has shape {tuple(k.shape)}; expected ({B}, {H}, *, {D}) to match q (batch, heads, dim)")
    Tk = k.shape[2]
    if v.shape[0] != B or v.shape[1] != H or v.shape[2] != Tk:
        raise ValueError(f"v has shape {tuple(v.shape)}; expected ({B}, {H}, {Tk}, *) to match k (batch, heads, time)")
    if D == 0:
        raise ValueError(f"q has shape {tuple(q.shape)}; expected a head dimension of at least 1")
    if causal and Tq != Tk:
        raise ValueError(f"causal ANNA needs as many queries as keys; q has T={Tq}, k has T={Tk}")
    return B, H, Tq, Tk, D, v.shape[3]


def anna_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, n_tables: int, n_bits: int,
                   family: str = "simhash", seed: int = 0, causal: bool = False,
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
        backend: ``"auto"`` (the Triton kernels on CUDA -- cross-polytope for ``D <= 128`` -- the
            reference otherwise), ``"torch"`` or ``"triton"``.

    Returns ``o [B, H, Tq, Dv]`` in v's dtype, or ``(o, w)``. Not differentiable: inputs that
    require grad (with grad mode on) raise, naming the surrogate to train instead.
    """
    B, H, Tq, Tk, D, Dv = _check_inputs(q, k, v, causal)
    _validate.check_int("n_tables", n_tables, lo=1, hi=4096)
    if not isinstance(family, str) or family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")
    nb_max = max_n_bits(family, D)
    why = "" if family == "simhash" else (f" (cross-polytope at D={D}: {bits_per_hash(family, D):.1f} bits per "
                                          "hash, the table key must fit in 62 bits)")
    _validate.check_int("n_bits", n_bits, lo=1, hi=nb_max, why=why)
    _validate.check_int("seed", seed, lo=0)
    _validate.check_bool("causal", causal)
    _validate.check_bool("return_weights", return_weights)
    if return_weights and Tq * Tk > MAX_WEIGHT_ENTRIES:
        raise ValueError(f"return_weights=True builds the Tq x Tk weight matrix; Tq * Tk = {Tq * Tk} exceeds "
                         f"{MAX_WEIGHT_ENTRIES} (2^24): use return_weights=False at this length")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise RuntimeError("anna_attention is not differentiable and got inputs that require grad: " + SURROGATE)

    proj = lsh_projections(family, n_tables, n_bits, D, seed)
    why_not = None
    if family == "crosspolytope" and D > 128:
        why_not = f"the cross-polytope hashing kernel holds a [D, D] tile on chip and takes D up to 128; got D={D}"
    elif max(D, Dv) > 256:
        why_not = f"the kernel takes head dims up to 256; got D={D}, Dv={Dv}"
    which = choose_backend(backend, q, why_not=why_not)
    if which == "triton" and B * H * Tq * Tk > 0:
        o = _anna_attention_triton(q, k, v, proj, family=family, causal=causal)
    else:
        o = anna_attention_reference(q, k, v, proj, family=family, causal=causal)
    if not return_weights:
        return o
    qc, kc = lsh_codes(q, proj, family), lsh_codes(k, proj, family)
    w = anna_weights_from_counts(anna_collision_counts(qc, kc, causal=causal))
    return o, w
