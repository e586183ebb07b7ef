"""Top-k attention with a lightning indexer -- DeepSeek Sparse Attention's operator.

A cheap indexer scores every (query, key) pair; each query then attends, by exact softmax, to the
``k`` keys with the highest index scores only.

Index scores. With ``H_I`` index heads, an index query ``q^I_{t,j}`` and a weight ``w_{t,j}`` per query
and head, and **one index key ``k^I_s`` per token, shared by all index heads** (an MQA-shaped product),

    I_{t,s} = sum_{j=1..H_I} w_{t,j} ReLU(q^I_{t,j} . k^I_s).

No scale is applied here: DeepSeek-V3.2's ``Indexer`` folds ``H_I^{-1/2} d_I^{-1/2}`` (and its fp8 scales)
into ``w``, and so should a caller who wants the same numbers. A positive factor common to a row does
not change the selection; it does change ``softmax(I_t)`` in :func:`indexer_kl_loss`.

Layout (the house's ``[B, H, T, D]``): ``index_q [B, H_I, Tq, d_I]``, ``index_k [B, 1, Tk, d_I]`` (the
heads dim of 1 is the shared key), ``index_w [B, H_I, Tq]``, and ``I [B, 1, Tq, Tk]``: one score matrix
per sequence, shared by all ``H`` attention heads, as in DeepSeek's MLA in its MQA mode.

Selection. :func:`topk_select` returns the indices ``[B, 1, Tq, min(top_k, Tk)]`` of each query's top
keys, highest score first; with ``causal=True`` only keys ``s <= t`` are candidates, and a row with fewer
than ``top_k`` visible keys takes all of them and pads with ``-1``. So ``top_k >= Tk`` is dense attention,
whatever the scores. Ties go to the earlier key (a stable sort), so the selection is deterministic;
a NaN score counts as ``-inf`` (below every finite score).

Attention. With ``S_t`` the selected set, ``o_t = sum_{s in S_t} exp(s_ts - lse_t) v_s``, ``lse_t =
log sum_{s in S_t} exp(s_ts)``, ``s_ts = scale q_t . k_s``: the exact softmax restricted to ``S_t``. In
chapter 1's terms it is the one-sided entropic plan with support ``S_t``, i.e. the dense row ``p_t``
restricted to ``S_t`` and renormalised; ``||p_t - p~_t||_1 = 2 (1 - p_t(S_t))``, so the output moves by
at most ``2 (1 - p_t(S_t)) max_s ||v_s||``.

Cost, honestly. The attention reference gathers the ``k`` selected keys and values of every query:
``O(B H Tq k D)`` work (each query reads ``k`` keys: ``O(L k)``, not ``O(L^2)`` and not ``O(k^2)``), and it
*stores* the gathered ``[B, H, Tq, k, D]`` tensors, which the kernel does not. The indexer stays
quadratic: ``2 H_I d_I`` FLOPs per pair, ``O(B H_I Tq Tk d_I)``, and :func:`index_scores_reference`
builds ``[B, H_I, Tq, Tk]``. The selection sorts each row (``O(Tk log Tk)``; a top-k kernel would not
sort). The KV cache does not shrink: every key stays a candidate for later queries.

Gradients. ``q``, ``k`` and ``v`` get exact gradients through autograd (the gathered keys scatter their
gradients back). The selection is discrete, so the attention output gives the indexer **no gradient**;
the indexer learns from its own loss, :func:`indexer_kl_loss` -- DeepSeek trains it with
``KL(p_t || softmax(I_t))`` against the main attention (dense warm-up), then with the KL restricted to
the selected set (sparse stage), the indexer's input detached from the main model.

Masked positions. A key outside ``S_t`` contributes exactly nothing to row ``t``, even if ``k`` or ``v``
hold NaN or inf there: it is never gathered, and padded slots are replaced by zeros with ``torch.where``
before any product. A non-finite value *inside* ``S_t`` makes row ``t`` NaN, as in dense attention --
a row whose selected logits are all ``-inf`` too (``o`` NaN, ``lse = -inf``, on both backends). A row
with no selected key (never produced by the selection; indices given directly) is empty: ``o = 0``,
``lse = -inf``.

Kernels (``attnlib/kernels/topk/``; ``backend="auto"`` takes them where the house rule allows, see
``attnlib/_backend.py``). :func:`index_scores` has a fused kernel that never writes the per-head
``[B, H_I, Tq, Tk]`` scores: one program per (query tile, key tile) loads the shared index-key tile
once and loops over the index heads (one ``tl.dot`` each), and its backward is two kernels that
recompute the per-head products (``d index_q``, ``d index_w`` per (query tile, head); ``d index_k`` per
key tile, summed over heads and queries in registers). Inside :func:`topk_attention` the same forward
skips the tiles wholly above the diagonal (the causal selection never reads them). The selection
stays torch's stable sort. The attention kernel runs one program per (query, head), gathers only the
selected key and value rows (masked loads: a padded slot or an unselected key is never read), and
keeps an online softmax over blocks of slots; its backward recomputes ``P`` from the saved LSE, keeps
``dq`` in registers and scatters ``dk``, ``dv`` with float32 atomic adds (so their last bits may vary
from run to run). The kernels take head dims (``D``, ``Dv``, ``d_I``) up to 256 and float16, bfloat16 or
float32; an indexer in another dtype (float64) gets the reference scores, its attention the kernel.
"""

from __future__ import annotations

import math

import torch

from . import _validate
from ._backend import KERNEL_DTYPES, MAX_HEAD_DIM, choose_backend
from ._numerics import acc_dtype

MAX_KERNEL_DIM = MAX_HEAD_DIM       # the kernels hold a whole head row (q, k, v, index q/k) in one tile


def _why_not_attention(D: int, Dv: int) -> str | None:
    """The attention kernel's own condition (the dtype and device rule is common to every op)."""
    if max(D, Dv) > MAX_KERNEL_DIM:
        return f"the top-k attention kernel takes head dims up to {MAX_KERNEL_DIM}; got D={D}, Dv={Dv}"
    return None


def _why_not_indexer(d_I: int) -> str | None:
    """The index-score kernel's own condition."""
    if d_I > MAX_KERNEL_DIM:
        return f"the index-score kernel takes index head dims up to {MAX_KERNEL_DIM}; got d_I={d_I}"
    return None


# ----------------------------------------------------------------------------- references: the equations

def index_scores_reference(index_q: torch.Tensor, index_k: torch.Tensor, index_w: torch.Tensor) -> torch.Tensor:
    """``I_{t,s} = sum_j w_{t,j} ReLU(q^I_{t,j} . k^I_s)`` for every pair (no causal mask: see
    :func:`topk_select`). ``index_q [B, H_I, Tq, d_I]``, ``index_k [B, 1, Tk, d_I]``, ``index_w [B, H_I, Tq]``.

    Computes in float32 (float64 for float64 inputs) and returns ``I [B, 1, Tq, Tk]`` in that dtype.
    Builds ``[B, H_I, Tq, Tk]``: ``2 H_I d_I`` FLOPs per pair plus the weighted ReLU sum.
    """
    acc = acc_dtype(index_q.dtype)
    per_head = torch.relu(index_q.to(acc) @ index_k.to(acc).transpose(-1, -2))   # [B, H_I, Tq, Tk]
    return (index_w.to(acc).unsqueeze(-1) * per_head).sum(dim=1, keepdim=True)   # [B, 1, Tq, Tk]


def topk_select_reference(I: torch.Tensor, top_k: int, *, causal: bool) -> torch.Tensor:
    """Indices ``[B, 1, Tq, min(top_k, Tk)]`` (int64) of each row's highest scores, highest first.

    With ``causal``, keys ``s > t`` are never selected; a row with fewer visible keys than slots pads
    with ``-1``. Ties go to the earlier key and NaN counts as ``-inf``, by a stable descending sort on scores
    in which NaN and the invisible keys are ``-inf``: among equal scores the earlier key comes first,
    so every visible key precedes every invisible one.
    """
    Tq, Tk = I.shape[-2:]
    n = min(top_k, Tk)
    score = torch.nan_to_num(I, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    cols = torch.arange(Tk, device=I.device)
    if causal:
        visible = cols[None, :] <= torch.arange(Tq, device=I.device)[:, None]   # [Tq, Tk]
        score = score.masked_fill(~visible, float("-inf"))
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :n]
    if causal:
        rows = torch.arange(Tq, device=I.device)[:, None]
        order = torch.where(order <= rows, order, torch.full_like(order, -1))
    return order


def selection_mask(indices: torch.Tensor, n_keys: int) -> torch.Tensor:
    """The selected set as a boolean mask ``[..., Tq, n_keys]`` (``-1`` slots select nothing)."""
    n_keys = _validate.check_int("n_keys", n_keys, lo=0)
    mask = torch.zeros(*indices.shape[:-1], n_keys + 1, dtype=torch.bool, device=indices.device)
    mask.scatter_(-1, torch.where(indices < 0, torch.full_like(indices, n_keys), indices), True)
    return mask[..., :n_keys]


def _gather_rows(x: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``x [B, H, Tk, D]``, ``indices [B, 1, Tq, n]`` (no -1) -> ``x[b, h, indices[b, 0, t, i]]`` as
    ``[B, H, Tq, n, D]``."""
    B, H, _, D = x.shape
    Tq, n = indices.shape[-2:]
    flat = indices.expand(B, H, Tq, n).reshape(B, H, Tq * n, 1).expand(B, H, Tq * n, D)
    return x.gather(2, flat).view(B, H, Tq, n, D)


def topk_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *,
                             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the selected keys only, written with gathered keys (``O(Tq k D)`` per head).

    ``q [B, H, Tq, D]``, ``k [B, H, Tk, D]``, ``v [B, H, Tk, Dv]``, ``indices [B, 1, Tq, n]`` from
    :func:`topk_select` (``-1`` = no key). Computes in float32 (float64 for float64 inputs); returns
    ``(o [B, H, Tq, Dv] in q's dtype, lse [B, H, Tq])``. A row with no selected key (every slot ``-1``)
    is empty: ``o = 0``, ``lse = -inf``, as in the kernel; a row whose selected logits are all ``-inf``
    (an infinite input) gives NaN (``exp(-inf - (-inf))``) and ``lse = -inf``.
    """
    acc = acc_dtype(q.dtype)
    slot = (indices >= 0).unsqueeze(-1)                                           # [B, 1, Tq, n, 1]
    safe = indices.clamp_min(0)
    # Padded slots point at key 0; where() (not a 0 weight: 0 * NaN is NaN) drops what they gathered.
    k_sel = torch.where(slot, _gather_rows(k.to(acc), safe), 0.0)                 # [B, H, Tq, n, D]
    v_sel = torch.where(slot, _gather_rows(v.to(acc), safe), 0.0)                 # [B, H, Tq, n, Dv]
    s = scale * torch.einsum("bhtd,bhtnd->bhtn", q.to(acc), k_sel)
    s = s.masked_fill(~slot.squeeze(-1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)                                              # [B, H, Tq]
    empty = ~slot.squeeze(-1).any(-1)                                             # [B, 1, Tq]: no key at all
    p = torch.exp(s - torch.where(empty, 0.0, lse).unsqueeze(-1))                 # 0 on padded slots
    o = torch.einsum("bhtn,bhtnd->bhtd", p, v_sel)
    return o.to(q.dtype), lse


# ----------------------------------------------------------------------------- validation

def _check_indexer(index_q, index_k, index_w, *, B: int | None = None, Tq: int | None = None,
                   Tk: int | None = None, device=None) -> tuple[int, int, int, int, int]:
    """``index_q [B, H_I, Tq, d_I]``, ``index_k [B, 1, Tk, d_I]``, ``index_w [B, H_I, Tq]``: one float dtype
    and one device among them (the indexer may run in another precision than the attention). ``B, Tq,
    Tk, device``, when given, are the attention's. Returns ``(B, H_I, Tq, Tk, d_I)``."""
    _validate.check_tensor("index_q", index_q, ndim=4)
    _validate.check_tensor("index_k", index_k, ndim=4)
    _validate.check_tensor("index_w", index_w, ndim=3)
    _validate.check_same_device_dtype([("index_q", index_q), ("index_k", index_k), ("index_w", index_w)])
    if device is not None and index_q.device != device:
        raise ValueError(f"index_q is on {index_q.device}; expected {device} to match q")
    b, H_I, tq, d_I = index_q.shape
    want_q = (B if B is not None else b, H_I, Tq if Tq is not None else tq, d_I)
    if tuple(index_q.shape) != want_q:
        raise ValueError(f"index_q has shape {tuple(index_q.shape)}; expected {want_q} = [B, H_I, Tq, d_I] "
                         "to match q (batch, time)")
    if H_I == 0 or d_I == 0:
        raise ValueError(f"index_q has shape {tuple(index_q.shape)}; expected at least one index head and a "
                         "head dim of at least 1")
    tk = index_k.shape[2]
    want_k = (b, 1, Tk if Tk is not None else tk, d_I)
    if tuple(index_k.shape) != want_k:
        raise ValueError(f"index_k has shape {tuple(index_k.shape)}; expected {want_k} = [B, 1, Tk, d_I] "
                         "(one index key per token, shared by the index heads; batch, time and dim of "
                         "index_q and k)")
    if tuple(index_w.shape) != (b, H_I, tq):
        raise ValueError(f"index_w has shape {tuple(index_w.shape)}; expected {(b, H_I, tq)} = [B, H_I, Tq] "
                         "to match index_q")
    return b, H_I, tq, want_k[2], d_I


def _check_scores(name: str, I, *, causal: bool) -> tuple[int, int, int]:
    _validate.check_tensor(name, I, ndim=4)
    B, one, Tq, Tk = I.shape
    if one != 1:
        raise ValueError(f"{name} has shape {tuple(I.shape)}; expected (B, 1, Tq, Tk): one score matrix per "
                         "sequence, shared by the heads")
    if causal and Tq != Tk:
        raise ValueError(f"causal selection needs as many queries as keys; {name} has Tq={Tq}, Tk={Tk}")
    return B, Tq, Tk


# ----------------------------------------------------------------------------- the kernels' autograd

class _TritonIndexScores(torch.autograd.Function):
    """Forward: the fused index-score kernel (no per-head scores stored). Backward: two kernels that
    recompute the per-head products from the saved inputs (``attnlib/kernels/topk/indexer.py``)."""

    @staticmethod
    def forward(ctx, index_q, index_k, index_w):
        from .kernels.topk import index_scores_forward
        ctx.save_for_backward(index_q, index_k, index_w)
        return index_scores_forward(index_q, index_k, index_w, causal=False)

    @staticmethod
    def backward(ctx, dI):
        from .kernels.topk import index_scores_backward
        return index_scores_backward(*ctx.saved_tensors, dI)


class _TritonTopkAttention(torch.autograd.Function):
    """Forward: the gathered online-softmax kernel, saving ``o`` and ``lse``. Backward: one kernel that
    recomputes ``P`` from the LSE, keeps ``dq`` per query and scatters ``dk``, ``dv`` with float32 atomics
    (``attnlib/kernels/topk/attention.py``). A loss on the returned ``lse`` is folded into the baseline
    ``delta``, as in the flash backward."""

    @staticmethod
    def forward(ctx, q, k, v, indices, scale):
        from .kernels.topk import topk_attention_forward
        o, lse = topk_attention_forward(q, k, v, indices, scale=scale)
        ctx.save_for_backward(q, k, v, indices, o, lse)
        ctx.scale = scale
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        from .kernels.topk import topk_attention_backward
        q, k, v, indices, o, lse = ctx.saved_tensors
        dq, dk, dv = topk_attention_backward(q, k, v, indices, o, lse, do, dlse, scale=ctx.scale)
        return dq, dk, dv, None, None


def _selection_scores(index_q, index_k, index_w, *, causal: bool, kernel: bool) -> torch.Tensor:
    """The scores the selection reads, without gradient. With ``kernel`` (the attention runs its kernel)
    the fused index-score kernel where it applies to the indexer's own dtype and width -- skipping, when
    ``causal``, the tiles above the diagonal, which the selection never reads -- else the reference."""
    if kernel and index_q.dtype in KERNEL_DTYPES and _why_not_indexer(index_q.shape[-1]) is None:
        from .kernels.topk import index_scores_forward
        return index_scores_forward(index_q, index_k, index_w, causal=causal)
    return index_scores_reference(index_q, index_k, index_w)


# ----------------------------------------------------------------------------- public functions

def index_scores(index_q: torch.Tensor, index_k: torch.Tensor, index_w: torch.Tensor, *,
                 backend: str = "auto") -> torch.Tensor:
    """The lightning indexer's scores ``I [B, 1, Tq, Tk]`` (float32; float64 for float64 inputs),
    differentiable in all three inputs. See the module docstring for the formula and the layout.

    Args:
        index_q: ``[B, H_I, Tq, d_I]``.  index_k: ``[B, 1, Tk, d_I]``.  index_w: ``[B, H_I, Tq]``.
        backend: ``"auto"`` | ``"torch"`` | ``"triton"``. The kernel (``d_I <= 256``) never stores the
            per-head ``[B, H_I, Tq, Tk]`` scores, forward or backward; the reference builds them.
    """
    d_I = _check_indexer(index_q, index_k, index_w)[4]
    if choose_backend(backend, index_q, why_not=_why_not_indexer(d_I)) == "triton":
        return _TritonIndexScores.apply(index_q, index_k, index_w)
    return index_scores_reference(index_q, index_k, index_w)


def topk_select(I: torch.Tensor, top_k: int, *, causal: bool) -> torch.Tensor:
    """Indices ``[B, 1, Tq, min(top_k, Tk)]`` (int64) of each query's ``top_k`` highest-scoring keys.

    Highest score first; ties go to the earlier key; NaN counts as ``-inf``. With ``causal`` only keys
    ``s <= t`` are candidates and a row with fewer visible keys than slots takes them all and pads
    with ``-1``. ``top_k >= Tk`` selects every (visible) key. :func:`selection_mask` turns the result
    into a boolean ``[B, 1, Tq, Tk]`` mask.
    """
    _validate.check_bool("causal", causal)
    _check_scores("I", I, causal=causal)
    top_k = _validate.check_int("top_k", top_k, lo=1)
    return topk_select_reference(I, top_k, causal=causal)


def topk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, index_q: torch.Tensor,
                   index_k: torch.Tensor, index_w: torch.Tensor, *, top_k: int, causal: bool,
                   scale: float | None = None, return_lse: bool = False, return_indices: bool = False,
                   backend: str = "auto"):
    """Softmax attention over each query's ``top_k`` keys, chosen by the lightning indexer.

    Args:
        q: ``[B, H, Tq, D]``.  k: ``[B, H, Tk, D]``.  v: ``[B, H, Tk, Dv]``.
        index_q: ``[B, H_I, Tq, d_I]`` index queries.  index_k: ``[B, 1, Tk, d_I]``, one index key per
            token.  index_w: ``[B, H_I, Tq]`` head weights. One float dtype and q's device among the three
            (the indexer's dtype may differ from the attention's).
        top_k: keys per query, an int ``>= 1``; ``top_k >= Tk`` is dense (causal) softmax attention.
        causal: query ``t`` selects among keys ``s <= t`` only (needs ``Tq == Tk``).
        scale: multiplies ``q . k``; ``None`` means ``1 / sqrt(D)``.
        return_lse: also return ``lse [B, H, Tq]`` over the selected keys (float32; float64 for float64).
        return_indices: also return the selection ``[B, 1, Tq, min(top_k, Tk)]`` (``-1`` = empty slot),
            shared by all heads -- what :func:`indexer_kl_loss` takes as ``selected``.
        backend: ``"auto"`` | ``"torch"`` | ``"triton"``. The kernels (head dims up to 256) read only the
            selected keys and values and store no gathered copy; the indexer's scores come from the
            fused index kernel when the indexer's dtype is one it takes (else from the reference).

    Returns:
        ``o [B, H, Tq, Dv]`` in q's dtype, or the tuple ``(o, lse, indices)`` with only the requested
        extras. ``q, k, v`` get gradients; the index inputs get none through ``o`` (the selection is
        discrete): train the indexer with :func:`indexer_kl_loss`.
    """
    _validate.check_bool("causal", causal)
    for name, flag in (("return_lse", return_lse), ("return_indices", return_indices)):
        _validate.check_bool(name, flag)
    B, H, Tq, Tk, D, Dv = _validate.check_qkv(q, k, v, same_length=causal)
    _check_indexer(index_q, index_k, index_w, B=B, Tq=Tq, Tk=Tk, device=q.device)
    top_k = _validate.check_int("top_k", top_k, lo=1)
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    kernel = choose_backend(backend, q, why_not=_why_not_attention(D, Dv)) == "triton"
    with torch.no_grad():                       # the selection is discrete: no gradient flows through it
        scores = _selection_scores(index_q, index_k, index_w, causal=causal, kernel=kernel)
        indices = topk_select_reference(scores, top_k, causal=causal)
    if kernel:
        o, lse = _TritonTopkAttention.apply(q, k, v, indices, scale)
    else:
        o, lse = topk_attention_reference(q, k, v, indices, scale=scale)
    extras = [x for x, wanted in ((lse, return_lse), (indices, return_indices)) if wanted]
    return (o, *extras) if extras else o


def indexer_kl_loss(attention_weights: torch.Tensor, I: torch.Tensor, selected: torch.Tensor | None = None, *,
                    causal: bool) -> torch.Tensor:
    """The indexer's training loss, per query: ``KL(p_t || softmax(I_t))`` -- DeepSeek-V3.2's.

    The target ``p_t`` is the main attention summed over its heads and L1-normalised along the keys.
    It is a fixed target (detached): the indexer learns from the attention, never the reverse.

    * ``selected=None`` -- the dense warm-up: ``softmax(I_t)`` over every visible key (``s <= t`` when
      causal).
    * ``selected`` = the indices from :func:`topk_select` / ``topk_attention(..., return_indices=True)``
      -- the sparse stage: both distributions restricted to ``S_t`` and renormalised there,
      ``KL(p_t|S_t || softmax(I_t|S_t))``. (In DeepSeek's sparse stage ``p_t`` comes from the sparse
      attention itself and already lives on ``S_t``.) A row with ``p_t(S_t) = 0`` has no target on its
      selected set and contributes 0.

    Args:
        attention_weights: ``[B, H, Tq, Tk]``, non-negative (any number of heads ``H >= 1``).
        I: ``[B, 1, Tq, Tk]`` index scores, as :func:`index_scores` returns them (unmasked).
        selected: ``None`` or int64 indices ``[B, 1, Tq, n]`` (``-1`` = empty slot).
        causal: keys ``s > t`` are outside the support of both distributions (needs ``Tq == Tk``).

    Returns:
        ``[B, Tq]`` per-query KL divergences in I's dtype; sum them (DeepSeek's ``L^I = sum_t KL``) or
        average them. ``+inf`` where ``p_t`` puts mass on a key whose index score is ``-inf``.
    """
    _validate.check_bool("causal", causal)
    _validate.check_tensor("attention_weights", attention_weights, ndim=4)
    B, Tq, Tk = _check_scores("I", I, causal=causal)
    if attention_weights.shape[0] != B or tuple(attention_weights.shape[2:]) != (Tq, Tk) \
            or attention_weights.shape[1] == 0:
        raise ValueError(f"attention_weights has shape {tuple(attention_weights.shape)}; expected "
                         f"({B}, H >= 1, {Tq}, {Tk}) to match I")
    if attention_weights.device != I.device:
        raise ValueError(f"attention_weights is on {attention_weights.device}; expected {I.device} to match I")
    if _validate.checks_values(attention_weights) and attention_weights.numel() \
            and not ((attention_weights >= 0) & torch.isfinite(attention_weights)).all():
        # +inf would normalise its row to NaN/0 and silently zero that row's loss and gradient
        raise ValueError("attention_weights has negative, infinite or NaN entries; expected finite "
                         "attention weights >= 0")
    support = torch.ones(Tq, Tk, dtype=torch.bool, device=I.device)
    if causal:
        support = support.tril()
    support = support.expand(B, 1, Tq, Tk)
    if selected is not None:
        if not isinstance(selected, torch.Tensor) or selected.dtype != torch.int64:
            raise TypeError(f"selected must be an int64 tensor of key indices (from topk_select); got "
                            f"{type(selected).__name__ if not isinstance(selected, torch.Tensor) else selected.dtype}")
        if selected.dim() != 4 or tuple(selected.shape[:3]) != (B, 1, Tq) or selected.shape[3] > Tk:
            raise ValueError(f"selected has shape {tuple(selected.shape)}; expected ({B}, 1, {Tq}, n <= {Tk}) "
                             "to match I")
        if selected.device != I.device:
            raise ValueError(f"selected is on {selected.device}; expected {I.device} to match I")
        if _validate.checks_values(selected) and selected.numel() \
                and not ((selected >= -1) & (selected < Tk)).all():
            bad = selected[(selected < -1) | (selected >= Tk)]
            raise ValueError(f"selected must hold key indices in [0, {Tk - 1}] or -1 (an empty slot); "
                             f"got {bad.unique()[:5].tolist()}")
        support = support & selection_mask(selected, Tk)
    acc = acc_dtype(I.dtype)
    mass = attention_weights.detach().to(acc).sum(dim=1, keepdim=True).masked_fill(~support, 0.0)
    total = mass.sum(dim=-1, keepdim=True)
    p = mass / torch.where(total > 0, total, torch.ones_like(total))              # rows with no mass: all 0
    log_q = torch.log_softmax(I.to(acc).masked_fill(~support, float("-inf")), dim=-1)
    # sum_{p > 0} p (log p - log q), taking only the terms with p > 0 (0 log 0 = 0; log q = -inf off S).
    terms = torch.where(p > 0, p * (torch.log(torch.where(p > 0, p, 1.0)) - log_q), 0.0)
    return terms.sum(dim=-1).squeeze(1).to(I.dtype)


__all__ = ["topk_attention", "index_scores", "topk_select", "indexer_kl_loss", "selection_mask",
           "index_scores_reference", "topk_select_reference", "topk_attention_reference"]
