"""Linear attention -- chapter 3's operator: attention by associativity.

Drop the softmax and attention is a product of three matrices, which may be bracketed either way:

    O = (Q K^T) V = Q (K^T V)        O(T^2 D) work  versus  O(T D^2) work.

With a causal mask the bracket cannot move freely, but the same identity, applied one query at a
time, gives a recurrence with a fixed-size state (the book's convention: ``S`` is ``[Dv, D]``):

    S_t = S_{t-1} + v_t k_t^T,      o_t = S_t q_t.

Three ways to compute the same thing, each a short reference below (``linear_attention_<mode>_reference``;
the modes in the same order as DeltaNet's):

* ``parallel``  -- the masked quadratic form ``O = (Q K^T . M) V`` (M: causal mask, diagonal kept);
* ``recurrent`` -- the loop above (an RNN whose hidden state is the matrix ``S_t``);
* ``chunk``     -- split time into chunks of ``C``: inside a chunk the masked quadratic form, across
  chunks the state. Cost ``O(T C D + T D^2)``. The Triton kernels (``kernels/linear/``, forward
  and backward) implement this one.

Queries and keys may first go through a feature map ``phi`` (``"elu1"``, ``"relu"``, ``"favor+"``
or any callable): ``phi(q)`` and ``phi(k)`` then replace ``q`` and ``k`` everywhere. ``scale``
multiplies ``q`` *before* the map, as in softmax attention, so that ``phi(scale q) . phi(k)``
approximates ``exp(scale q . k)`` for ``"favor+"``. ``normalize=True`` divides by the running
normaliser ``z_t . phi(q_t)`` with ``z_t = sum_{j<=t} phi(k_j)``; it is carried as one extra row of
the state (a ones column appended to ``v``), so with ``normalize=True`` the state is
``[B, H, Dv + 1, D']`` and its last row is ``z_t^T``.

All arithmetic runs in float32 (float64 for float64 inputs), whatever the inputs' dtype: the state
of a long half-precision sequence is a sum of thousands of outer products and would overflow or
lose its small terms in float16.

Masked positions. On the PyTorch path a position ``j > t`` contributes exactly nothing to ``o_t``, even
when ``k`` or ``v`` hold NaN or inf there (e.g. uninitialised right padding): the references mask the
scores with ``tril`` (a selection), and :func:`linear_attention` hands them only the finite part of
``v``, then marks NaN the rows (and the final state's rows) that met a non-finite value
(:mod:`attnlib._numerics`) -- never 0 times NaN.
The Triton kernel multiplies within a chunk, so there a non-finite value reaches the rows of its own
chunk that precede it (not earlier chunks): pad with zeros.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import _validate
from ._backend import KERNEL_CHUNKS, KERNEL_DTYPES, MAX_HEAD_DIM, choose_backend
from ._numerics import acc_dtype, split_nonfinite

MODES = ("parallel", "recurrent", "chunk")
KERNEL_CHUNK_SIZES = KERNEL_CHUNKS      # the chunk sizes the chunked kernels run
FEATURE_MAPS = ("identity", "elu1", "relu", "favor+")
NORMALIZE_EPS = 1e-6


# ---------------------------------------------------------------------------------------------
# Feature maps
# ---------------------------------------------------------------------------------------------

def elu1(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020): positive, and ``~ x + 1`` near zero."""
    return F.elu(x) + 1.0


def relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


class FavorPlus:
    """Performer's positive random features (FAVOR+) for the softmax kernel ``exp(x . y)``.

        phi(x) = exp(W x - |x|^2 / 2) / sqrt(m),     W: [m, dim], rows ~ N(0, I)

    so that ``E_W[phi(x) . phi(y)] = exp(x . y)`` exactly (unbiased), for any ``x, y``. With
    ``orthogonal=True`` the rows are drawn in orthogonal blocks and rescaled to Gaussian lengths,
    which keeps the estimate unbiased and lowers its variance (Choromanski et al. 2021).

    Args:
        dim: input size ``D``.  num_features: ``m`` (default ``dim``).  seed: fixes ``W``: the same
        seed gives the same features on every call (needed to continue a sequence or decode).
    """

    def __init__(self, dim: int, num_features: int | None = None, seed: int = 0, *,
                 orthogonal: bool = True):
        dim = _validate.check_int("dim", dim, lo=1)
        m = _validate.check_int("num_features", dim if num_features is None else num_features, lo=1)
        seed = _validate.check_int("seed", seed, lo=0)
        self.dim, self.num_features, self.seed, self.orthogonal = dim, m, seed, orthogonal
        g = torch.Generator().manual_seed(seed)
        if orthogonal:
            blocks = []
            for _ in range(math.ceil(m / dim)):
                qmat, r = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
                qmat = qmat * torch.sign(torch.diagonal(r))  # sign fix: makes Q Haar-distributed
                blocks.append(qmat.T)                        # orthonormal rows
            w = torch.cat(blocks)[:m]
            lengths = torch.randn(m, dim, generator=g, dtype=torch.float64).norm(dim=1)
            w = w * lengths[:, None]                         # each row distributed as N(0, I)
        else:
            w = torch.randn(m, dim, generator=g, dtype=torch.float64)
        self.weight = w                                      # [m, dim], float64 on the CPU

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"FavorPlus(dim={self.dim}) got inputs of last dim {x.shape[-1]}")
        acc = acc_dtype(x.dtype)
        x = x.to(acc)
        w = self.weight.to(device=x.device, dtype=acc)
        return torch.exp(x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(self.num_features)

    def __repr__(self) -> str:
        return (f"FavorPlus(dim={self.dim}, num_features={self.num_features}, seed={self.seed}, "
                f"orthogonal={self.orthogonal})")


def resolve_feature_map(feature_map, dim: int, feature_kwargs: dict | None = None
                        ) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """``None``/``"identity"`` -> ``None``; a name -> its function; a callable -> itself.

    ``"favor+"`` builds ``FavorPlus(dim, **feature_kwargs)`` (``num_features``, ``seed``,
    ``orthogonal``); ``feature_kwargs`` is refused for the other maps.
    """
    if feature_kwargs is not None and feature_map != "favor+":
        raise ValueError(f"feature_kwargs only applies to feature_map='favor+'; got feature_map="
                         f"{feature_map!r}")
    if feature_map is None or feature_map == "identity":
        return None
    if callable(feature_map):
        return feature_map
    if feature_map == "elu1":
        return elu1
    if feature_map == "relu":
        return relu
    if feature_map == "favor+":
        kw = dict(feature_kwargs or {})
        unknown = set(kw) - {"num_features", "seed", "orthogonal"}
        if unknown:
            raise ValueError(f"feature_kwargs for 'favor+' takes num_features, seed, orthogonal; "
                             f"got {sorted(unknown)}")
        return FavorPlus(dim, **kw)
    raise ValueError(f"feature_map must be None, one of {FEATURE_MAPS} or a callable; got {feature_map!r}")


# ---------------------------------------------------------------------------------------------
# The three references. Inputs are already mapped (phi(q), phi(k)), scaled, and in the
# accumulation dtype; ``initial_state`` (``S_0``) is ``[B, H, Dv, D]`` or None. Each returns ``(o, S_T)``.
# ---------------------------------------------------------------------------------------------

def linear_attention_parallel_reference(q, k, v, *, initial_state=None, causal: bool):
    """``O = (Q K^T . M) V + Q S_0^T``,  ``S_T = S_0 + V^T K``.  O(T^2 D): the quadratic form."""
    a = q @ k.transpose(-1, -2)                               # [B, H, T, T] scores, no softmax
    o = (a.tril() if causal else a) @ v                     # M: keep j <= t
    S = v.transpose(-1, -2) @ k                               # sum_j v_j k_j^T  [B, H, Dv, D]
    if initial_state is not None:
        o = o + q @ initial_state.transpose(-1, -2)
        S = initial_state + S
    return o, S


def linear_attention_recurrent_reference(q, k, v, *, initial_state=None,
                                         causal: bool):
    """``S_t = S_{t-1} + v_t k_t^T``, ``o_t = S_t q_t``: the RNN. O(T D^2), one
    token at a time.

    Non-causal: every query reads the final state, ``o_t = S_T q_t``.
    """
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    outs = []
    for t in range(T):
        # outer product v_t k_t^T
        S = S + v[:, :, t, :, None] * k[:, :, t, None, :]
        outs.append(S @ q[:, :, t, :, None])        # [B, H, Dv, 1]
    if not causal:
        return q @ S.transpose(-1, -2), S
    o = (torch.cat(outs, dim=-1).transpose(-1, -2) if T
         else q.new_zeros(B, H, 0, v.shape[-1]))
    return o, S


def linear_attention_chunk_reference(q, k, v, *, initial_state=None,
                                     causal: bool, chunk_size: int = 64):
    """Chunkwise: for each chunk ``c`` of ``C`` rows,
    ``O_c = (Q_c K_c^T . M) V_c + Q_c S_{c-1}^T`` (this chunk by the quadratic
    form, earlier chunks through the state), then ``S_c = S_{c-1} + V_c^T K_c``.
    Cost ``O(T C D + T D^2)``; memory: one state.

    Any ``T``: the last chunk is simply shorter. Non-causal:
    ``O = Q (S_0 + V^T K)^T``.
    """
    B, H, T, D = q.shape
    S = (q.new_zeros(B, H, v.shape[-1], D) if initial_state is None
         else initial_state)
    if not causal:          # no mask: the bracket moves freely
        S = S + v.transpose(-1, -2) @ k
        return q @ S.transpose(-1, -2), S
    outs = []
    for s in range(0, T, chunk_size):
        qc, kc, vc = (q[:, :, s:s + chunk_size],
                      k[:, :, s:s + chunk_size],
                      v[:, :, s:s + chunk_size])
        # (Q_c K_c^T . M) V_c
        intra = (qc @ kc.transpose(-1, -2)).tril() @ vc
        # plus everything before it: Q_c S^T
        outs.append(intra + qc @ S.transpose(-1, -2))
        # write the chunk into the state
        S = S + vc.transpose(-1, -2) @ kc
    o = torch.cat(outs, dim=2) if outs else q.new_zeros(B, H, 0, v.shape[-1])
    return o, S


_REFERENCES = {"parallel": linear_attention_parallel_reference, "recurrent": linear_attention_recurrent_reference,
               "chunk": linear_attention_chunk_reference}


# ---------------------------------------------------------------------------------------------
# Triton path: forward and backward kernels (kernels/linear/chunk.py)
# ---------------------------------------------------------------------------------------------

class _TritonLinear(torch.autograd.Function):
    """Forward and backward by the chunked kernels. The backward recomputes the per-chunk states
    from ``q, k, v, S_0`` (nothing but the inputs is saved) and returns a gradient for exactly the
    inputs that require one."""

    @staticmethod
    def forward(ctx, q, k, v, initial_state, scale, causal, chunk_size, out_dtype, output_final_state):
        from .kernels.linear import linear_chunk_forward
        o, S = linear_chunk_forward(q, k, v, initial_state, scale=scale, causal=causal, chunk_size=chunk_size,
                                    out_dtype=out_dtype, output_final_state=output_final_state)
        ctx.save_for_backward(q, k, v, initial_state)
        ctx.scale, ctx.causal, ctx.chunk_size = scale, causal, chunk_size
        ctx.set_materialize_grads(False)        # an unused output's gradient: None, not a zero-filled tensor
        return o, S

    @staticmethod
    def backward(ctx, do, dS):
        from .kernels.linear import linear_chunk_backward
        q, k, v, initial_state = ctx.saved_tensors
        need = ctx.needs_input_grad
        if not any(need[:4]):
            return (None,) * 9
        if do is None:                          # a loss on the final state alone
            do = q.new_zeros(*q.shape[:-1], v.shape[-1])
        dq, dk, dv, d_initial_state = linear_chunk_backward(q, k, v, initial_state, do, dS, scale=ctx.scale,
                                                            causal=ctx.causal,
                                                chunk_size=ctx.chunk_size, need_state_grad=need[3])
        grads = [g.to(t.dtype) if n else None for g, t, n in zip((dq, dk, dv), (q, k, v), need[:3])]
        return (*grads, d_initial_state.to(initial_state.dtype) if need[3] else None, None, None, None, None, None)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

def _check_inputs(q, k, v, scale, feature_map, feature_kwargs):
    """Validate q, k, v and the scale; return ``(scale, phi)`` (``phi`` None for the identity)."""
    _validate.check_qkv(q, k, v, same_length=True)
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else _validate.check_positive("scale", scale)
    return scale, resolve_feature_map(feature_map, D, feature_kwargs)


def _map(q, k, scale, phi):
    """``(phi(scale q), phi(k), D')`` in the accumulation dtype, with the map's output checked."""
    acc = acc_dtype(q.dtype)
    qf, kf = q.to(acc) * scale, k.to(acc)
    if phi is not None:
        qf, kf = phi(qf), phi(kf)
        for name, x in (("phi(q)", qf), ("phi(k)", kf)):
            if not isinstance(x, torch.Tensor) or x.shape[:-1] != q.shape[:-1]:
                raise ValueError(f"feature_map must map [B, H, T, D] to [B, H, T, D']; {name} has "
                                 f"shape {tuple(getattr(x, 'shape', ()))}")
        if qf.shape[-1] != kf.shape[-1]:
            raise ValueError(f"feature_map gave phi(q) with {qf.shape[-1]} features but phi(k) with "
                             f"{kf.shape[-1]}")
        qf, kf = qf.to(acc), kf.to(acc)
    return qf, kf, qf.shape[-1]


def _check_state(name, state, q, v, Dphi, normalize):
    B, H = q.shape[:2]
    rows = v.shape[-1] + (1 if normalize else 0)
    layout = ("(B, H, Dv + 1, D') (normalize=True carries the normaliser z as one extra row)" if normalize
              else "(B, H, Dv, D')")
    _validate.check_state(name, state, q=q, shape=(B, H, rows, Dphi), layout=layout)


def _augment(v, normalize):
    """Append the ones column that makes the normaliser ride along in the state."""
    return torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1) if normalize else v


def _split_normaliser(o_aug, normalize, eps=NORMALIZE_EPS):
    if not normalize:
        return o_aug
    return o_aug[..., :-1] / (o_aug[..., -1:] + eps)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                     scale: float | None = None, feature_map=None, feature_kwargs: dict | None = None,
                     causal: bool, normalize: bool = False, mode: str = "chunk",
                     chunk_size: int = 64, initial_state: torch.Tensor | None = None,
                     output_final_state: bool = False, backend: str = "auto"):
    """Linear attention, ``o_t = S_t phi(scale q_t)`` with ``S_t = S_0 + sum_{j<=t} v_j phi(k_j)^T``.

    Args:
        q, k: ``[B, H, T, D]``.  v: ``[B, H, T, Dv]``.  Same dtype and device.
        scale: multiplies ``q`` before the feature map; ``None`` means ``1 / sqrt(D)``.
        feature_map: ``None`` (identity), ``"elu1"``, ``"relu"``, ``"favor+"``, a ``FavorPlus``
            or any callable ``[..., D] -> [..., D']``. ``feature_kwargs`` configures ``"favor+"``
            (``num_features``, ``seed``, ``orthogonal``).
        causal: ``o_t`` sees ``j <= t``; otherwise every query reads the final state ``S_T``.
        normalize: divide by ``z_t . phi(scale q_t) + 1e-6`` with ``z_t = sum_{j<=t} phi(k_j)``
            (the linear analogue of the softmax denominator). The state then has ``Dv + 1`` rows,
            the last being ``z_t^T``.
        mode: ``"parallel"``, ``"recurrent"`` or ``"chunk"`` -- the same answer three ways.
        chunk_size: a power of two in [1, 4096] for the chunk reference; the Triton kernel takes
            16, 32 or 64.
        initial_state: ``S_0`` of shape ``[B, H, Dv (+1), D']``, float32 (float64 for float64
            inputs) -- e.g. a previous call's final state, which continues that sequence exactly.
        output_final_state: also return ``S_T`` (float32 / float64), a new tensor even when ``T = 0``.
        backend: ``"auto"`` (the Triton chunk kernel for CUDA tensors when it applies: ``mode="chunk"``,
            fp16/bf16/fp32, chunk 16..64, dims up to 256; the reference otherwise), ``"torch"`` or
            ``"triton"`` (``mode="chunk"`` only).

    Returns:
        ``o [B, H, T, Dv]`` in ``q``'s dtype, or ``(o, S_T)``.

    Precision of the Triton kernel (``kernels/common/precision.py``), as relative RMS error of the output
    and of every gradient against the float64 computation on the same inputs: float32, exact float32
    products (measured 2e-7); float16 and bfloat16, below 1e-2 (measured 6e-3 for both at T = 1024,
    D = 64, chunk 64: ``tests/test_linear_half_precision.py``). Half inputs share one bound because the
    products with the state and the score tile take bfloat16 operands for both -- a float16 state
    overflows past 65504 on long sequences -- so float16 inputs get bfloat16's 8-bit significand there,
    not float16's 11. ``S_T`` is accumulated in float32 registers in every case.

    Non-finite inputs reach exactly what the recurrence lets them reach, in the kernel as in the
    references: with ``causal``, a NaN or inf in row ``t`` of ``k`` or ``v`` makes the outputs from ``t`` on
    non-finite (only their column ``c`` for one in ``v[..., t, c]``) and none before ``t``; one in ``q``
    only row ``t``.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
    for name, flag in (("causal", causal), ("normalize", normalize),
                       ("output_final_state", output_final_state)):
        _validate.check_bool(name, flag)
    chunk_size = _validate.check_chunk_size(chunk_size)
    scale, phi = _check_inputs(q, k, v, scale, feature_map, feature_kwargs)
    why_not = (f"the kernel implements mode='chunk'; got mode={mode!r}" if mode != "chunk"
               else f"the kernel takes chunk_size in {KERNEL_CHUNKS}; got {chunk_size}"
               if chunk_size not in KERNEL_CHUNKS
               else None)
    # The kernel scales q itself: with the identity map, q and k go to it untouched.
    identity_to_kernel = phi is None and backend != "torch" and q.dtype in KERNEL_DTYPES
    if identity_to_kernel:
        qf, kf, Dphi = q, k, q.shape[-1]
    else:
        qf, kf, Dphi = _map(q, k, scale, phi)
    if why_not is None and max(Dphi, v.shape[-1] + normalize) > MAX_HEAD_DIM:
        why_not = (f"the kernel takes feature and value dims up to {MAX_HEAD_DIM}; got {Dphi} and "
                   f"{v.shape[-1] + normalize}")
    if initial_state is not None:
        _check_state("initial_state", initial_state, q, v, Dphi, normalize)
    which = choose_backend(backend, q, why_not=why_not)

    if which == "triton":
        # The kernel takes already-mapped inputs in the inputs' dtype and accumulates in float32.
        kernel_scale = scale if identity_to_kernel else 1.0
        qk = (qf.to(q.dtype), kf.to(q.dtype))
        out_dtype = torch.float32 if normalize else q.dtype    # the normaliser column can exceed fp16
        o, S = _TritonLinear.apply(*qk, _augment(v, normalize), initial_state, kernel_scale, causal,
                                   chunk_size, out_dtype, output_final_state)
    else:
        if identity_to_kernel:                                 # "auto" chose the reference after all
            qf, kf, Dphi = _map(q, k, scale, phi)
        acc = acc_dtype(q.dtype)
        v_in, poison = _augment(v.to(acc), normalize), None
        if causal:              # the chunk mask multiplies, and 0 * NaN is NaN: the references get finite v
            v_in, poison = split_nonfinite(v_in)
        o, S = _REFERENCES[mode](qf, kf, v_in, initial_state=initial_state,
                                 causal=causal, **({"chunk_size": chunk_size} if mode == "chunk" else {}))
        if poison is not None and poison.shape[-2]:
            o = o + poison                                     # NaN where a row met a non-finite value
            S = S + poison[..., -1, :, None]                   # and the final state: what the last row met
    if normalize:                            # (the kernel wrote o in float32: see out_dtype above)
        o = _split_normaliser(o.to(acc_dtype(q.dtype)), normalize)
    o = o.to(q.dtype)
    if output_final_state and initial_state is not None and S.data_ptr() == initial_state.data_ptr():
        S = S.clone()                        # T = 0: a new tensor, never the caller's state itself
    return (o, S) if output_final_state else o


def linear_attention_decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                                 initial_state: torch.Tensor | None = None, scale: float | None = None,
                                 feature_map=None, feature_kwargs: dict | None = None,
                                 normalize: bool = False):
    """One generated token: ``S <- S + v phi(k)^T``, ``o = S phi(scale q)``. O(Dv D), whatever t is.

    Shaped as :func:`linear_attention` with ``T = 1`` (as :func:`attnlib.delta_rule_decode_step`).

    Args:
        q, k: ``[B, H, 1, D]`` -- this token's query and key.  v: ``[B, H, 1, Dv]``.
        initial_state: ``[B, H, Dv (+1 if normalize), D']`` float32 (float64 for float64 inputs), or
            ``None`` for the first token. Same meaning as ``linear_attention``'s states.

    Returns:
        ``(o [B, H, 1, Dv] in q's dtype, new_state)``.
    """
    _validate.check_bool("normalize", normalize)
    scale, phi = _check_inputs(q, k, v, scale, feature_map, feature_kwargs)
    if q.shape[2] != 1:
        raise ValueError(f"q has shape {tuple(q.shape)}; the decode step takes one token: "
                         "expected [B, H, 1, D]")
    qf, kf, Dphi = _map(q, k, scale, phi)
    acc = acc_dtype(q.dtype)
    vf = _augment(v.to(acc), normalize)
    if initial_state is None:
        S = qf.new_zeros(q.shape[0], q.shape[1], vf.shape[-1], Dphi)
    else:
        _check_state("initial_state", initial_state, q, v, Dphi, normalize)
        S = initial_state
    S = S + vf.transpose(-1, -2) @ kf                         # S + v_t k_t^T  ([Dv,1] @ [1,D])
    o = qf @ S.transpose(-1, -2)                              # (S q_t)^T
    return _split_normaliser(o, normalize).to(q.dtype), S


__all__ = ["linear_attention", "linear_attention_decode_step", "linear_attention_parallel_reference",
           "linear_attention_recurrent_reference", "linear_attention_chunk_reference", "FavorPlus", "elu1", "relu",
           "resolve_feature_map", "MODES", "FEATURE_MAPS"]
