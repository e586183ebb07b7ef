"""The softmax tile updates shared by the dense (flash) and block-sparse kernels, forward and backward.

Units. Every kernel works in base 2: scores are multiplied by ``qk_scale = scale * LOG2E`` so that one
``exp2`` instruction replaces ``exp``, and the saved natural-log LSE is turned into base 2 by ``* LOG2E``
before the backward recomputes ``P = exp2(s2 - lse2)``. ``LN2`` turns the base-2 LSE back at the end.

Forward (one query tile ``[BLOCK_M]`` against one key tile ``[BLOCK_N]``): :func:`online_softmax_update`
folds a tile of base-2 scores into the running ``(acc, l, m)`` -- the max, the sum of ``exp2(s - m)``
and the ``exp2(s - m)``-weighted values -- rescaling the old sums by ``exp2(m_old - m_new)``.

:func:`attend_keys` is the forward's loop over a range of keys (load, score, mask, update), shared by the
dense kernel's two stages and by every visited block of the block-sparse kernel; :func:`softmax_init`
and :func:`store_o_lse` (``o = acc / l``, ``lse``) open and close it.

Loads: every q, k, v, dO tile goes through :func:`load_rows` (``load_key_tile``: a key tile, k
transposed), from a base made by :func:`head_base`. Two paths, chosen by the constexpr ``TMA`` in one
kernel body: a pointer tile built from a scalar base on every call (never a live tile of 64-bit
pointers across a loop: that spilled registers on sm_90), bounds masked; or, when the wrapper passes
host-side tensor descriptors of the whole ``[B, H, T, X]`` tensors (sm_90, ``launch.tma_device``), one
descriptor load of the box at ``(b, h, start, 0)`` -- the copy engine (TMA) zero-fills past ``T`` and
``X``, so no mask. The block-sparse kernels take the pointer path. Results are stored with pointers
(``tiles.store_tile``).

Backward (FlashAttention-2): with ``P`` recomputed from the LSE, ``dP = dO V^T`` and
``delta_i = rowsum(dO * O)_i - dlse_i`` (precomputed once per row),

    dS = P * (dP - delta),   dV = P^T dO,   dK = scale * dS^T Q,   dQ = scale * dS K.

:func:`dkdv_tile` does one (key tile, query tile) step of the dK/dV program, in the transposed layout
(``[BLOCK_N, BLOCK_M]``: the key tile is the row side, so ``dv += pT @ dO`` needs no transpose of pT);
:func:`dq_tile` does one (query tile, key tile) step of the dQ program; :func:`dkdv_over_queries` and
:func:`dq_over_keys` loop them over a range of tiles (the dense and the block-sparse kernels differ only
in which ranges they walk); :func:`dkdv_program_init` and :func:`dq_program_init` load what each program
keeps. The flash backward's fused form runs the dK/dV loop with ``ATOMIC_DQ``: each step also adds
``scale * dS K`` to a float32 dQ buffer (:func:`add_dq`, ``tl.atomic_add``).

Masked and padded elements contribute exactly 0, whatever q, k, v hold there: a masked pair's ``P``
and ``dS`` are set to 0 with ``tl.where`` (not computed as ``exp2(-inf)``, which a ``-inf`` or NaN lse
would turn into NaN), and in a tile that masks some pairs but not others (the causal diagonal) the
product with the other operand -- ``P V``, ``dS K``, ``dS^T Q`` -- takes that operand's finite part,
the rows that do see a non-finite entry being made NaN there (:func:`finite_part`). Rows past ``Tq``
and rows with an empty visited set -- for which the wrappers pass ``lse = +inf`` -- contribute nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import head_block
from .tiles import load_tile, split_bh, store_tile

# constexpr, so that compiled kernels may read them (a plain global float is refused by Triton's
# compiler, though the interpreter accepts it); the host reads ``LOG2E.value``.
LOG2E = tl.constexpr(1.4426950408889634)   # log2(e): exp(x) = exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)     # ln(2):   log(x) = log2(x) * LN2


@triton.jit
def head_base(X, b, h, stride_b, stride_h, TMA: tl.constexpr):
    """Where a program finds head ``(b, h)`` of ``X``: a pointer to its row 0, or with ``TMA`` the
    tensor descriptor of all of ``X`` (indexed ``[b, h, t, d]`` at each load, so it stays as it is)."""
    base = X
    if not TMA:
        base = X + b * stride_b + h * stride_h
    return base


@triton.jit
def load_rows(base, b, h, start, offs_t, offs_c, stride_t, stride_c, T, C, MASK_T: tl.constexpr,
              EVEN_C: tl.constexpr, TMA: tl.constexpr):
    """A ``[BLOCK, BLOCK_C]`` tile of rows ``start + offs_t`` (zeros past ``T`` and past ``C`` columns).

    With ``TMA`` one tensor-descriptor load of the ``[1, 1, BLOCK, BLOCK_C]`` box at ``(b, h, start, 0)``:
    the copy engine fills what lies past the tensor's ``T`` rows and ``C`` columns with zeros, so no
    mask is needed. Otherwise the pointer tile is rebuilt from the scalar base on every call rather
    than kept live across the loop (a tile of 64-bit pointers costs two registers per element and made
    the compiled flash forward spill: 255 registers at D = 128 on sm_90)."""
    if TMA:
        x = base.load([b, h, start, 0]).reshape(offs_t.shape[0], offs_c.shape[0])
    else:
        rows = start + offs_t
        ptrs = base + rows[:, None] * stride_t + offs_c[None, :] * stride_c
        if MASK_T:
            x = tl.load(ptrs, mask=(rows[:, None] < T) & (offs_c[None, :] < C), other=0.0)
        elif EVEN_C:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_c[None, :] < C, other=0.0)
    return x


@triton.jit
def load_key_tile(K_base, V_base, b, h, start_n, offs_n, offs_d, offs_dv, stride_kt, stride_kd, stride_vt,
                  stride_vd, T_K, D, DV, MASK_T: tl.constexpr, EVEN_D: tl.constexpr, TMA: tl.constexpr):
    """k transposed ``[BLOCK_D, BLOCK_N]`` and v ``[BLOCK_N, BLOCK_DV]`` for keys ``start_n + offs_n``.

    The pointer path reads k already transposed (its pointer tile is built that way, so ``q @ k`` needs
    no transpose); a descriptor reads rows, so with ``TMA`` k is loaded ``[BLOCK_N, BLOCK_D]`` and
    transposed -- in shared memory, which is where the sm_90 product reads it from anyway."""
    if TMA:
        k = tl.trans(load_rows(K_base, b, h, start_n, offs_n, offs_d, stride_kt, stride_kd, T_K, D, MASK_T=MASK_T,
                               EVEN_C=EVEN_D, TMA=True))
        v = load_rows(V_base, b, h, start_n, offs_n, offs_dv, stride_vt, stride_vd, T_K, DV, MASK_T=MASK_T,
                      EVEN_C=EVEN_D, TMA=True)
    else:
        offs_kn = start_n + offs_n
        k_ptrs = K_base + offs_kn[None, :] * stride_kt + offs_d[:, None] * stride_kd
        v_ptrs = V_base + offs_kn[:, None] * stride_vt + offs_dv[None, :] * stride_vd
        if MASK_T:
            k = tl.load(k_ptrs, mask=(offs_kn[None, :] < T_K) & (offs_d[:, None] < D), other=0.0)
            v = tl.load(v_ptrs, mask=(offs_kn[:, None] < T_K) & (offs_dv[None, :] < DV), other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=offs_d[:, None] < D, other=0.0)
            v = tl.load(v_ptrs, mask=offs_dv[None, :] < DV, other=0.0)
    return k, v


@triton.jit
def load_row_stats(lse_ptr, delta_ptr, offs_m, T_Q, MASK_T: tl.constexpr):
    """The backward's per-row ``lse * LOG2E`` (base 2) and ``delta`` for rows ``offs_m``; rows past ``T_Q``
    get ``lse = +inf`` (hence ``P = 0``) and ``delta = 0``."""
    if MASK_T:
        lse2 = tl.load(lse_ptr + offs_m, mask=offs_m < T_Q, other=float("inf")) * LOG2E
        delta = tl.load(delta_ptr + offs_m, mask=offs_m < T_Q, other=0.0)
    else:
        lse2 = tl.load(lse_ptr + offs_m) * LOG2E
        delta = tl.load(delta_ptr + offs_m)
    return lse2, delta


@triton.jit
def softmax_init(BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The empty running state ``(acc, l_i, m_i)``: no key seen, ``m = -inf``, ``l = 0``, ``acc = 0``."""
    return (tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32), tl.zeros([BLOCK_M], dtype=tl.float32),
            tl.full([BLOCK_M], float("-inf"), dtype=tl.float32))


@triton.jit
def finite_part(x, offs_rows):
    """``(x with its non-finite entries set to 0, first)`` for a tile ``x [BLOCK, BLOCK_C]`` whose rows are
    ``offs_rows``: ``first [BLOCK_C]`` is the least row holding a non-finite entry in each column (2^31 - 1
    where none). A masked pair multiplies its operand by a 0 weight, and ``0 * NaN`` is NaN: products over
    pair-masked tiles take the finite part, and the rows that do see ``first`` are made NaN."""
    ok = tl.abs(x) < float("inf")                       # False for NaN too
    first = tl.min(tl.where(ok, 2147483647, offs_rows[:, None]), 0)
    return tl.where(ok, x, tl.zeros_like(x)), first


@triton.jit
def no_bad(BLOCK_C: tl.constexpr):
    """The running ``first`` of :func:`finite_part` before any tile: no non-finite entry in any column."""
    return tl.full([BLOCK_C], 2147483647, dtype=tl.int32)


@triton.jit
def poison_rows(x, bad, offs_m):
    """``x [BLOCK_M, BLOCK_C]`` with NaN where row ``offs_m`` is at or after ``bad [BLOCK_C]``, the first
    non-finite entry of its column that the masked tiles set aside. Applied once, after the loop: inside
    it the extra tile of the select made the compiled kernels spill registers."""
    return tl.where(bad[None, :] <= offs_m[:, None], float("nan"), x)


@triton.jit
def online_softmax_update(acc, l_i, m_i, s, v, PRECISION: tl.constexpr):
    """Fold base-2 scores ``s [BLOCK_M, BLOCK_N]`` (masked entries already
    ``-inf``) and values ``v [BLOCK_N, BLOCK_DV]`` into the running
    ``acc [BLOCK_M, BLOCK_DV]``, ``l_i``, ``m_i [BLOCK_M]``.

    A row whose scores so far are all ``-inf`` (masked keys, or real ``-inf``
    logits from a non-finite input, in any tile) keeps ``m = -inf``; its
    reference max is then taken as 0 so that ``exp2(-inf - 0) = 0`` instead of
    ``exp2(-inf + inf) = NaN``, and a later finite logit still counts.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = (acc * alpha[:, None]
           + tl.dot(p.to(v.dtype), v, input_precision=PRECISION))
    return acc, l_i, m_new


@triton.jit
def attend_keys(acc, l_i, m_i, bad, q, K_base, V_base, b, h, lo, hi, offs_m, offs_n, offs_d, offs_dv,
                stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale,
                BLOCK_N: tl.constexpr, MASK_T: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
                PRECISION: tl.constexpr, TMA: tl.constexpr,
                TRACE_M=None, TRACE_L=None, TRACE_ACC=None, T_Q=0, TRACE: tl.constexpr = False):
    """Fold the keys ``[lo, hi)``, in ``BLOCK_N`` tiles, into the running ``(acc, l_i, m_i)`` of the query
    tile ``q [BLOCK_M, BLOCK_D]`` (rows ``offs_m``). ``MASK_T``: bounds-check the keys against ``T_K``
    and, with ``CAUSAL``, mask the keys after each row (scores ``-inf``); without it the loop has no
    ``where`` (every row sees every key of these tiles). ``K_base``, ``V_base``: from :func:`head_base`
    (``TMA``: descriptors). With ``CAUSAL`` the keys masked for some rows of a tile may hold non-finite
    values: ``p @ v`` takes v's finite part, and ``bad [BLOCK_DV]`` keeps the first key of each column
    whose value was set aside (:func:`finite_part`), for :func:`store_o_lse` to make the rows at or after
    it NaN there -- so a value reaches exactly the rows that see it.

    ``TRACE`` (off unless given): after each key tile, store the running state of the rows into the
    trace buffers (:func:`trace_state`) -- for reading the kernel, not for speed. Off, the branch is not
    compiled and the loop is the production one."""
    for start_n in range(lo, hi, BLOCK_N):
        k, v = load_key_tile(K_base, V_base, b, h, start_n, offs_n, offs_d, offs_dv, stride_kt, stride_kd,
                             stride_vt, stride_vd, T_K, D, DV, MASK_T=MASK_T, EVEN_D=EVEN_D, TMA=TMA)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale                # base-2 logits
        if MASK_T:
            offs_kn = start_n + offs_n
            valid = offs_kn[None, :] < T_K
            if CAUSAL:
                valid = valid & (offs_kn[None, :] <= offs_m[:, None])
                v, _ = finite_part(v, offs_kn)
            s = tl.where(valid, s, float("-inf"))
        acc, l_i, m_i = online_softmax_update(acc, l_i, m_i, s, v, PRECISION=PRECISION)
        if TRACE:
            trace_state(TRACE_M, TRACE_L, TRACE_ACC, start_n // BLOCK_N, acc, l_i, m_i, offs_m, offs_dv, T_Q, DV)
    if MASK_T:
        if CAUSAL:
            # The values set aside, found in a second pass over the same (diagonal) tiles: inside the loop
            # above, with p and the scores live, the extra tiles made the compiled kernel spill registers.
            for start_n in range(lo, hi, BLOCK_N):
                _, v = load_key_tile(K_base, V_base, b, h, start_n, offs_n, offs_d, offs_dv, stride_kt, stride_kd,
                                     stride_vt, stride_vd, T_K, D, DV, MASK_T=MASK_T, EVEN_D=EVEN_D, TMA=TMA)
                _, first_bad = finite_part(v, start_n + offs_n)
                bad = tl.minimum(bad, first_bad)
    return acc, l_i, m_i, bad


@triton.jit
def trace_state(TRACE_M, TRACE_L, TRACE_ACC, tile, acc, l_i, m_i, offs_m, offs_dv, T_Q, DV):
    """Store the running state after key tile ``tile``: ``m_i`` (base 2) and ``l_i`` at
    ``[tile, offs_m]`` of the ``[n_tiles, T_Q]`` buffers ``TRACE_M``, ``TRACE_L``, and the unnormalised
    ``acc`` at ``[tile, offs_m, :]`` of the ``[n_tiles, T_Q, DV]`` buffer ``TRACE_ACC`` (all float32,
    contiguous, already offset to the program's (batch, head)). Rows past ``T_Q`` are not stored."""
    rows = tile * T_Q + offs_m
    in_seq = offs_m < T_Q
    tl.store(TRACE_M + rows, m_i, mask=in_seq)
    tl.store(TRACE_L + rows, l_i, mask=in_seq)
    tl.store(TRACE_ACC + rows[:, None] * DV + offs_dv[None, :], acc,
             mask=in_seq[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def store_o_lse(O_base, lse_ptr, acc, l_i, m_i, has_keys, bad, offs_m, offs_dv, stride_ot, stride_od, T_Q, DV):
    """Write ``o = acc / l`` and the natural-log ``lse = (m + log2 l) ln 2`` of rows ``offs_m``.

    ``l = 0`` means ``m = -inf``: every score of the row was ``-inf``. A row with no key at all
    (``has_keys [BLOCK_M]`` False: nothing visited, or nothing left of the causal diagonal) is empty:
    ``o = 0`` (its ``acc`` is 0) and ``lse = -inf``, the log of an empty sum. A row that has keys whose
    logits are all ``-inf`` got them from a non-finite input: ``o`` is NaN (``exp(-inf - (-inf))``, as in
    the definition) and ``lse = -inf``. A ``+inf`` logit gives ``lse = +inf`` (and ``o`` NaN), so that the
    backward's ``P = exp(s - lse)`` is 0 on the row's finite logits, as in the definition. ``bad``: from
    :func:`attend_keys`, the values the masked tiles set aside (:func:`poison_rows`)."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    lse = tl.where(m_i == float("inf"), float("inf"), lse)
    o = poison_rows(tl.where((empty & has_keys)[:, None], float("nan"), acc / l_safe[:, None]), bad, offs_m)
    store_tile(O_base, o, offs_m, offs_dv, stride_ot, stride_od, T_Q, DV)
    tl.store(lse_ptr + offs_m, lse, mask=offs_m < T_Q)


@triton.jit
def dkdv_tile(dk, dv, k, v, q, do, lse2, delta, offs_m, offs_n, qk_scale, T_Q, T_K,
              MASK_T: tl.constexpr, MASK_CAUSAL: tl.constexpr, MASK_KEYS: tl.constexpr, PRECISION: tl.constexpr,
              window=0, MASK_BAND: tl.constexpr = False):
    """One step of the dK/dV program: key tile ``k [BLOCK_N, BLOCK_D]``, ``v [BLOCK_N, BLOCK_DV]``
    against query tile ``q [BLOCK_M, BLOCK_D]``, ``do [BLOCK_M, BLOCK_DV]`` with its base-2 LSE and delta
    ``[BLOCK_M]``. Accumulates into ``dk [BLOCK_N, BLOCK_D]``, ``dv [BLOCK_N, BLOCK_DV]`` (fp32; dk still
    lacks the final ``* scale``) and returns ``dS^T [BLOCK_N, BLOCK_M]`` too (the fused backward's dQ
    term; the two-kernel form ignores it and the compiler drops it).

    Masked pairs get ``P = dS = 0`` by selection, not by arithmetic (a padded row's ``0 * inf`` score, a
    non-finite ``dP`` from a value the row does not see, would otherwise be NaN): ``MASK_T`` the rows past
    ``T_Q``, ``MASK_KEYS`` the keys past ``T_K`` (only the fused dQ term reads their ``dS``),
    ``MASK_CAUSAL`` the pairs with key after query -- and there ``dS q`` takes q's finite part, since a
    query row that is not finite would reach, through a 0 weight, keys it does not see.

    ``MASK_BAND`` (off unless given; the sliding-window kernels, ``attnlib/kernels/window``) also masks
    the pairs off the band of width ``window``: key ``<= query - window``, and without ``MASK_CAUSAL``
    key ``>= query + window``; q's finite part as with ``MASK_CAUSAL``. Off, its code is not compiled."""
    sT = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale          # [BLOCK_N, BLOCK_M]
    MASKED: tl.constexpr = MASK_T or MASK_KEYS or MASK_CAUSAL or MASK_BAND
    if MASKED:
        valid = offs_n[:, None] >= 0
        if MASK_T:
            valid = valid & (offs_m[None, :] < T_Q)
        if MASK_KEYS:
            valid = valid & (offs_n[:, None] < T_K)
        if MASK_CAUSAL:
            valid = valid & (offs_n[:, None] <= offs_m[None, :])
        if MASK_BAND:
            valid = valid & (offs_n[:, None] > offs_m[None, :] - window)
            if not MASK_CAUSAL:
                valid = valid & (offs_n[:, None] < offs_m[None, :] + window)
        # mask before the exp2 (a masked score may exceed the row's lse: exp2 -> inf) and after it (an
        # lse of -inf or NaN makes exp2(-inf - lse) NaN)
        sT = tl.where(valid, sT, float("-inf"))
        pT = tl.where(valid, tl.exp2(sT - lse2[None, :]), 0.0)
    else:
        pT = tl.exp2(sT - lse2[None, :])
    dv += tl.dot(pT.to(do.dtype), do, input_precision=PRECISION)
    dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)                   # [BLOCK_N, BLOCK_M]
    dsT = pT * (dpT - delta[None, :])
    if MASKED:
        dsT = tl.where(valid, dsT, 0.0)
    if MASK_CAUSAL or MASK_BAND:
        # A row whose q is not finite has a NaN o, hence a NaN delta and dS on every pair it sees: q's
        # finite part loses nothing there.
        q, _ = finite_part(q, offs_m)
    dk += tl.dot(dsT.to(q.dtype), q, input_precision=PRECISION)
    return dk, dv, dsT


@triton.jit
def dq_tile(dq, q, do, lse2, delta, k, v, offs_m, offs_n, qk_scale, T_K,
            MASK_T: tl.constexpr, MASK_CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
            window=0, MASK_BAND: tl.constexpr = False):
    """One step of the dQ program: query tile against key tile ``k [BLOCK_N, BLOCK_D]``,
    ``v [BLOCK_N, BLOCK_DV]``; accumulates ``dq [BLOCK_M, BLOCK_D]`` (fp32, still lacking ``* scale``).

    Masked pairs (``MASK_T``: keys past ``T_K``; ``MASK_CAUSAL``: key after query) get ``dS = 0`` by
    selection. With ``MASK_CAUSAL`` a key that is not finite would reach, through a 0 weight, the rows
    before it: ``dS K`` takes k's finite part (:func:`dq_over_keys` finds what was set aside, for the
    kernel to make the rows at or after it NaN: :func:`poison_rows`) -- as in the definition, where
    ``dS * inf`` is not finite even when ``dS`` is 0.

    ``MASK_BAND`` (off unless given): also the pairs off the band of width ``window``, as in
    :func:`dkdv_tile`, with k's finite part (the sliding-window kernel finds the rows that see what
    was set aside itself: on a band they are not "every row at or after it")."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale           # [BLOCK_M, BLOCK_N]
    MASKED: tl.constexpr = MASK_T or MASK_CAUSAL or MASK_BAND
    if MASKED:
        valid = offs_n[None, :] >= 0
        if MASK_T:
            valid = valid & (offs_n[None, :] < T_K)
        if MASK_CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None])
        if MASK_BAND:
            valid = valid & (offs_n[None, :] > offs_m[:, None] - window)
            if not MASK_CAUSAL:
                valid = valid & (offs_n[None, :] < offs_m[:, None] + window)
        s = tl.where(valid, s, float("-inf"))
        p = tl.where(valid, tl.exp2(s - lse2[:, None]), 0.0)
    else:
        p = tl.exp2(s - lse2[:, None])
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    if MASKED:
        ds = tl.where(valid, ds, 0.0)
    if MASK_CAUSAL or MASK_BAND:
        k, _ = finite_part(k, offs_n)
    dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    return dq


@triton.jit
def dkdv_program_init(K_base, V_base, b, h, start_n, offs_n, offs_d, offs_dv, stride_kt, stride_kd, stride_vt,
                      stride_vd, T_K, D, DV, TMA: tl.constexpr):
    """What the dK/dV program keeps for its keys ``offs_n`` (``start_n + arange``): ``(k, v, dk, dv)``,
    the last two zeroed fp32 accumulators of k's and v's shapes."""
    k = load_rows(K_base, b, h, start_n, offs_n - start_n, offs_d, stride_kt, stride_kd, T_K, D, MASK_T=True,
                  EVEN_C=False, TMA=TMA)
    v = load_rows(V_base, b, h, start_n, offs_n - start_n, offs_dv, stride_vt, stride_vd, T_K, DV, MASK_T=True,
                  EVEN_C=False, TMA=TMA)
    return k, v, tl.zeros(k.shape, dtype=tl.float32), tl.zeros(v.shape, dtype=tl.float32)


@triton.jit
def dq_program_init(Q_base, DO_base, b, h, lse_ptr, delta_ptr, start_m, offs_m, offs_d, offs_dv, stride_qt,
                    stride_qd, stride_dot, stride_dod, T_Q, D, DV, TMA: tl.constexpr):
    """What the dQ program keeps for its rows ``offs_m`` (``start_m + arange``): ``(q, dO, lse2, delta,
    dq)`` -- the tiles, their base-2 LSE and delta, and the zeroed fp32 accumulator of q's shape."""
    q = load_rows(Q_base, b, h, start_m, offs_m - start_m, offs_d, stride_qt, stride_qd, T_Q, D, MASK_T=True,
                  EVEN_C=False, TMA=TMA)
    do = load_rows(DO_base, b, h, start_m, offs_m - start_m, offs_dv, stride_dot, stride_dod, T_Q, DV, MASK_T=True,
                   EVEN_C=False, TMA=TMA)
    lse2, delta = load_row_stats(lse_ptr, delta_ptr, offs_m, T_Q, MASK_T=True)
    return q, do, lse2, delta, tl.zeros(q.shape, dtype=tl.float32)


@triton.jit
def add_dq(DQ_base, dq, offs_m, offs_d, stride_dqt, stride_dqd, T_Q, D, MASK_T: tl.constexpr, EVEN_D: tl.constexpr):
    """``DQ[offs_m, offs_d] += dq`` with float32 atomics (the fused backward: several key programs add to
    the same rows, in an order that varies from run to run)."""
    ptrs = DQ_base + offs_m[:, None] * stride_dqt + offs_d[None, :] * stride_dqd
    if MASK_T:
        tl.atomic_add(ptrs, dq, mask=(offs_m[:, None] < T_Q) & (offs_d[None, :] < D), sem="relaxed")
    elif EVEN_D:
        tl.atomic_add(ptrs, dq, sem="relaxed")
    else:
        tl.atomic_add(ptrs, dq, mask=offs_d[None, :] < D, sem="relaxed")


@triton.jit
def dkdv_over_queries(dk, dv, k, v, Q_base, DO_base, b, h, lse_ptr, delta_ptr, DQ_base, lo, hi, offs_n, offs_mb,
                      offs_d, offs_dv, stride_qt, stride_qd, stride_dot, stride_dod, stride_dqt, stride_dqd,
                      T_Q, T_K, D, DV, qk_scale, sm_scale,
                      BLOCK_M: tl.constexpr, MASK_T: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                      EVEN_D: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr):
    """:func:`dkdv_tile` over the query tiles ``[lo, hi)`` (``BLOCK_M`` rows each), loading ``q``, ``dO``
    and the row statistics of each; ``MASK_T`` bounds-checks the rows against ``T_Q``. With
    ``ATOMIC_DQ`` (the fused backward) each step also adds its ``scale * dS K`` to the float32 rows of
    ``DQ_base`` (:func:`add_dq`); otherwise ``DQ_base`` is unused (None)."""
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_mb
        q = load_rows(Q_base, b, h, start_m, offs_mb, offs_d, stride_qt, stride_qd, T_Q, D, MASK_T=MASK_T,
                      EVEN_C=EVEN_D, TMA=TMA)
        do = load_rows(DO_base, b, h, start_m, offs_mb, offs_dv, stride_dot, stride_dod, T_Q, DV, MASK_T=MASK_T,
                       EVEN_C=EVEN_D, TMA=TMA)
        lse2, delta = load_row_stats(lse_ptr, delta_ptr, offs_m, T_Q, MASK_T=MASK_T)
        dk, dv, dsT = dkdv_tile(dk, dv, k, v, q, do, lse2, delta, offs_m, offs_n, qk_scale, T_Q, T_K,
                                MASK_T=MASK_T, MASK_CAUSAL=MASK_CAUSAL, MASK_KEYS=ATOMIC_DQ, PRECISION=PRECISION)
        if ATOMIC_DQ:
            k_dq = k
            if MASK_CAUSAL:         # k's finite part, as in dq_tile
                k_dq, _ = finite_part(k, offs_n)
            dq = tl.dot(tl.trans(dsT.to(k.dtype)), k_dq, input_precision=PRECISION) * sm_scale   # [BLOCK_M, BLOCK_D]
            add_dq(DQ_base, dq, offs_m, offs_d, stride_dqt, stride_dqd, T_Q, D, MASK_T=MASK_T, EVEN_D=EVEN_D)
    if ATOMIC_DQ:
        if MASK_CAUSAL:
            # What k's finite part set aside: NaN into the dQ rows at or after it, after the loop (a select
            # per step made the compiled kernel spill registers).
            _, bad = finite_part(k, offs_n)
            for start_m in range(lo, hi, BLOCK_M):
                offs_m = start_m + offs_mb
                hit = (bad[None, :] <= offs_m[:, None]) & (offs_m[:, None] < T_Q) & (offs_d[None, :] < D)
                tl.atomic_add(DQ_base + offs_m[:, None] * stride_dqt + offs_d[None, :] * stride_dqd,
                              tl.full([BLOCK_M, k.shape[1]], float("nan"), dtype=tl.float32), mask=hit, sem="relaxed")
    return dk, dv


@triton.jit
def dq_over_keys(dq, bad, q, do, lse2, delta, K_base, V_base, b, h, lo, hi, offs_m, offs_nb, offs_d, offs_dv,
                 stride_kt, stride_kd, stride_vt, stride_vd, T_K, D, DV, qk_scale,
                 BLOCK_N: tl.constexpr, MASK_T: tl.constexpr, MASK_CAUSAL: tl.constexpr,
                 EVEN_D: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr):
    """:func:`dq_tile` over the key tiles ``[lo, hi)`` (``BLOCK_N`` keys each); returns ``(dq, bad)``, with
    ``MASK_CAUSAL`` ``bad`` updated with the first non-finite key of each column in these tiles (found in a
    second pass, as in :func:`attend_keys`)."""
    for start_n in range(lo, hi, BLOCK_N):
        k = load_rows(K_base, b, h, start_n, offs_nb, offs_d, stride_kt, stride_kd, T_K, D, MASK_T=MASK_T,
                      EVEN_C=EVEN_D, TMA=TMA)
        v = load_rows(V_base, b, h, start_n, offs_nb, offs_dv, stride_vt, stride_vd, T_K, DV, MASK_T=MASK_T,
                      EVEN_C=EVEN_D, TMA=TMA)
        dq = dq_tile(dq, q, do, lse2, delta, k, v, offs_m, start_n + offs_nb, qk_scale, T_K,
                     MASK_T=MASK_T, MASK_CAUSAL=MASK_CAUSAL, PRECISION=PRECISION)
    if MASK_CAUSAL:
        for start_n in range(lo, hi, BLOCK_N):
            k = load_rows(K_base, b, h, start_n, offs_nb, offs_d, stride_kt, stride_kd, T_K, D, MASK_T=MASK_T,
                          EVEN_C=EVEN_D, TMA=TMA)
            _, first_bad = finite_part(k, start_n + offs_nb)
            bad = tl.minimum(bad, first_bad)
    return dq, bad


@triton.jit
def softmax_bwd_preprocess_kernel(O, DO, DLSE, DELTA,
                                  stride_ob, stride_oh, stride_ot, stride_od,
                                  stride_db, stride_dh, stride_dt, stride_dd,
                                  H, T_Q, DV,
                                  BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_DLSE: tl.constexpr):
    """``delta[b, h, i] = sum_d dO[i, d] * O[i, d] - dlse[i]`` for ``BLOCK_M`` rows of one (batch, head)
    (``- dlse`` only with ``HAS_DLSE``: no loss on the LSE, no zero tensor to read).

    Grid ``(cdiv(Tq, BLOCK_M), B * H)``. ``DELTA`` and ``DLSE`` are contiguous ``[B, H, Tq]`` fp32."""
    pid_bh = tl.program_id(1)
    b, h = split_bh(pid_bh, H)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    o = load_tile(O + b * stride_ob + h * stride_oh, offs_m, offs_dv, stride_ot, stride_od, T_Q, DV).to(tl.float32)
    do = load_tile(DO + b * stride_db + h * stride_dh, offs_m, offs_dv, stride_dt, stride_dd, T_Q, DV).to(tl.float32)
    row = pid_bh * T_Q + offs_m
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + row, mask=offs_m < T_Q, other=0.0)
    tl.store(DELTA + row, delta, mask=offs_m < T_Q)


def backward_delta(o, do, dlse):
    """``delta = rowsum(dO * O) - dlse`` as a contiguous fp32 ``[B, H, Tq]`` (one small kernel).

    ``o, do: [B, H, Tq, Dv]`` (any strides); ``dlse: [B, H, Tq]`` or ``None`` (no loss on the LSE).
    Folding ``dlse`` in here is what makes the gradient through ``lse`` exact: ``d lse_i / d s_ij =
    P_ij``, so ``dS_ij = P_ij (dP_ij - delta_i) + P_ij dlse_i = P_ij (dP_ij - (delta_i - dlse_i))``.
    """
    B, H, T_Q, DV = o.shape
    delta = torch.empty(B, H, T_Q, device=o.device, dtype=torch.float32)
    if dlse is not None:
        dlse = dlse.to(torch.float32).contiguous()
    if delta.numel() == 0:
        return delta
    block_m = 64
    grid = (triton.cdiv(T_Q, block_m), B * H)
    softmax_bwd_preprocess_kernel[grid](o, do, dlse, delta, *o.stride(), *do.stride(), H, T_Q, DV,
                                        BLOCK_M=block_m, BLOCK_DV=head_block(DV), HAS_DLSE=dlse is not None)
    return delta


__all__ = ["LN2", "LOG2E", "add_dq", "attend_keys", "backward_delta", "dkdv_over_queries",
           "dkdv_program_init", "dkdv_tile", "dq_over_keys", "dq_program_init", "dq_tile", "finite_part", "head_base",
           "load_key_tile", "load_row_stats", "load_rows", "no_bad", "online_softmax_update", "poison_rows",
           "softmax_bwd_preprocess_kernel", "softmax_init", "store_o_lse", "trace_state"]
