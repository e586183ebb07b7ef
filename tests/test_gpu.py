"""Every Triton kernel on a CUDA GPU, in float16, bfloat16 and float32, against float64 references.

Skipped without a GPU (CI has none); run on one with the interpreter off:

    TRITON_INTERPRET=0 python -m pytest tests/test_gpu.py

The reference is always computed in float64 from the *same* (already rounded) inputs, so the error
measured is the kernel's own arithmetic plus the rounding of its output. Tolerances (relative RMS):

* float32: the kernels use IEEE fp32 products (no tf32), so errors sit near 1e-6; bound 2e-5;
* float16: output rounding alone is ~3e-4 (2^-11 / sqrt(3)); bound 3e-3;
* bfloat16: output rounding alone is ~2e-3 (2^-8 / sqrt(3)); bound 2e-2.

With ``ATTNLIB_GPU_ERRORS=path.json`` set, every measured error is also written to that file (the
table quoted in the notes comes from there).
"""

import json
import math
import os

import pytest
import torch

import attnlib
from attnlib.attention import softmax_attention_reference
from attnlib.deltanet import delta_rule_recurrent_reference
from attnlib.sparse import block_sparse_attention_reference, n_blocks
from attnlib.window import sliding_window_attention_reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
# Gradients against float64 autograd of the references, from the same rounded inputs: looser than the
# forward's, since a gradient sums more rounded products. One bound per op family:
GRAD_TOL = {
    # flash and block-sparse: P and dS are rounded to the input dtype before their matmuls (as in
    # FlashAttention); the fused backward's float32 atomics only reorder dQ's float32 sums.
    "softmax": {torch.float32: 5e-5, torch.float16: 1e-2, torch.bfloat16: 6e-2},
    # linear, delta, gated delta: 16-bit tensor-core products, those with a state or a score tile in
    # bfloat16 even for float16 inputs (CHUNKED_TOL below): a gradient sums more rounded products.
    "chunked": {torch.float32: 5e-5, torch.float16: 2e-2, torch.bfloat16: 5e-2},
}
_ERRORS: list[dict] = []


@pytest.fixture(scope="module", autouse=True)
def _write_errors():
    yield
    path = os.environ.get("ATTNLIB_GPU_ERRORS")
    if path and _ERRORS:
        info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
        try:
            import triton
            info["triton"] = triton.__version__
        except ImportError:  # pragma: no cover
            pass
        with open(path, "w") as f:
            json.dump({**info, "errors": _ERRORS}, f, indent=1)


def _check(op, dtype, got, ref, tol=None, **shape):
    """Relative RMS error in float64; recorded, then asserted (NaN never passes)."""
    got, ref = got.double(), ref.double()
    err = ((got - ref).norm() / ref.norm().clamp_min(1e-300)).item()
    _ERRORS.append({"op": op, "dtype": str(dtype).replace("torch.", ""), "rel_rms": err, **shape})
    assert torch.isfinite(got).all(), f"{op}: non-finite output"
    assert err < (tol or TOL[dtype]), f"{op} {dtype} {shape}: rel RMS {err:.2e}"


def _randn(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device="cuda", dtype=dtype)


# ---------------------------------------------------------------------------- chapter 1

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,D", [(1, 64), (129, 64), (1000, 128), (257, 80), (77, 16), (300, 256)])
def test_softmax_attention(dtype, causal, T, D):
    q, k, v = (_randn(2, 3, T, D, dtype=dtype, seed=T + i) for i in range(3))
    o, lse = attnlib.softmax_attention(q, k, v, causal=causal, return_lse=True, backend="triton")
    o_ref, lse_ref = softmax_attention_reference(q.double(), k.double(), v.double(),
                                                 scale=D ** -0.5, causal=causal)
    _check("softmax_attention", dtype, o, o_ref, T=T, D=D, causal=causal)
    _check("softmax_attention.lse", dtype, lse, lse_ref, tol=1e-5, T=T, D=D, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_attention_cross_lengths(dtype):
    q = _randn(1, 2, 37, 48, dtype=dtype, seed=1)
    k, v = _randn(1, 2, 301, 48, dtype=dtype, seed=2), _randn(1, 2, 301, 24, dtype=dtype, seed=3)
    o = attnlib.softmax_attention(q, k, v, backend="triton", causal=False)
    o_ref, _ = softmax_attention_reference(q.double(), k.double(), v.double(), scale=48 ** -0.5, causal=False)
    _check("softmax_attention.cross", dtype, o, o_ref, Tq=37, Tk=301, D=48, Dv=24)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_softmax_attention_huge_logits(dtype):
    """Logits of order 1e4 (beyond what exp can hold in any dtype): finite, and right."""
    q = _randn(1, 2, 64, 32, dtype=dtype, seed=5) * 20
    k = _randn(1, 2, 64, 32, dtype=dtype, seed=6) * 20
    v = _randn(1, 2, 64, 32, dtype=dtype, seed=7)
    o = attnlib.softmax_attention(q, k, v, scale=1.0, causal=True, backend="triton")
    o_ref, _ = softmax_attention_reference(q.double(), k.double(), v.double(), scale=1.0, causal=True)
    assert (q.double() @ k.double().transpose(-1, -2)).abs().max() > 5e3
    _check("softmax_attention.huge_logits", dtype, o, o_ref, T=64, D=32)


def _grads_vs_float64(op, fn, ref_fn, tensors, dtype, **shape):
    """Output, lse and (dq, dk, dv) of ``<w_o, o> + <w_lse, lse>`` against the float64 reference."""
    g = torch.Generator().manual_seed(99)
    o64, lse64 = ref_fn(*(t.double() for t in tensors))
    w_o = torch.randn(o64.shape, generator=g).cuda()
    w_lse = torch.randn(lse64.shape, generator=g).cuda()
    results = []
    for f, cast in ((fn, lambda t: t), (ref_fn, lambda t: t.double())):
        xs = [cast(t).detach().requires_grad_() for t in tensors]
        o, lse = f(*xs)
        fin = torch.isfinite(lse)
        loss = (o * w_o.to(o.dtype)).sum() + (torch.where(fin, lse, 0) * w_lse.to(lse.dtype)).sum()
        results.append([o, torch.where(fin, lse, 0), *torch.autograd.grad(loss, xs)])
    for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), *results):
        if b.numel():
            tol = TOL[dtype] if name == "o" else 1e-5 if name == "lse" else GRAD_TOL["softmax"][dtype]
            _check(f"{op}.{name}", dtype, a, b, tol=tol, **shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [True, False], ids=["two-kernel", "fused"])
@pytest.mark.parametrize("Tq,Tk,D,Dv", [(1, 1, 64, 64), (129, 129, 64, 64), (1000, 1000, 128, 128),
                                        (257, 257, 80, 48), (300, 300, 256, 256), (77, 500, 40, 24)])
def test_softmax_attention_backward(dtype, causal, deterministic, Tq, Tk, D, Dv):
    if causal and Tq != Tk:
        pytest.skip("causal needs Tq == Tk")
    q, k = _randn(2, 3, Tq, D, dtype=dtype, seed=Tq), _randn(2, 3, Tk, D, dtype=dtype, seed=Tk + 1)
    v = _randn(2, 3, Tk, Dv, dtype=dtype, seed=Tk + 2)
    _grads_vs_float64(
        "softmax_attention.bwd" + ("" if deterministic else ".fused"),
        lambda q, k, v: attnlib.softmax_attention(q, k, v, causal=causal, return_lse=True, backend="triton",
                                                  deterministic=deterministic),
        lambda q, k, v: softmax_attention_reference(q, k, v, scale=D ** -0.5, causal=causal),
        (q, k, v), dtype, Tq=Tq, Tk=Tk, D=D, Dv=Dv, causal=causal)


@pytest.mark.parametrize("deterministic", [True, False], ids=["two-kernel", "fused"])
def test_softmax_attention_backward_on_strided_inputs(deterministic):
    """[B, T, H, D] storage seen as [B, H, T, D] (tensor descriptors on sm_90 take any 16-byte strides) and
    a head dim whose rows are not 16-byte multiples in fp16 (D = 20: the pointer path everywhere)."""
    for D in (64, 20):
        q, k, v = (_randn(2, 333, 3, D, dtype=torch.float16, seed=D + i).transpose(1, 2) for i in range(3))
        _grads_vs_float64(
            "softmax_attention.bwd.strided" + ("" if deterministic else ".fused"),
            lambda q, k, v: attnlib.softmax_attention(q, k, v, causal=True, return_lse=True, backend="triton",
                                                      deterministic=deterministic),
            lambda q, k, v: softmax_attention_reference(q, k, v, scale=D ** -0.5, causal=True),
            (q, k, v), torch.float16, T=333, D=D)


def test_softmax_attention_deterministic_backward_repeats_bit_for_bit():
    q, k, v = (_randn(2, 3, 1000, 64, dtype=torch.bfloat16, seed=i).requires_grad_() for i in range(3))
    do = _randn(2, 3, 1000, 64, dtype=torch.bfloat16, seed=9)
    runs = [torch.autograd.grad(attnlib.softmax_attention(q, k, v, causal=True, backend="triton"), (q, k, v), do)
            for _ in range(3)]
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(run, runs[0]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_attention_value_dim_zero_gives_the_lse(dtype):
    q, k = _randn(1, 2, 100, 64, dtype=dtype, seed=1), _randn(1, 2, 100, 64, dtype=dtype, seed=2)
    v = torch.empty(1, 2, 100, 0, device="cuda", dtype=dtype)
    _, lse = attnlib.softmax_attention(q, k, v, causal=True, return_lse=True, backend="triton")
    _, lse_ref = softmax_attention_reference(q.double(), k.double(), v.double(), scale=0.125, causal=True)
    _check("softmax_attention.lse_dv0", dtype, lse, lse_ref, tol=1e-5)


def test_softmax_attention_training_never_materialises_the_T_by_T_matrix():
    """Counted bytes, not time: forward + backward at T = 16384 needs a small multiple of the inputs,
    while one fp32 T x T matrix alone would take 1 GiB."""
    T = 16384
    q, k, v = (_randn(1, 1, T, 64, dtype=torch.float16, seed=i).requires_grad_() for i in range(3))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o = attnlib.softmax_attention(q, k, v, causal=True, backend="triton")
    torch.autograd.grad(o.float().square().sum(), (q, k, v))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak < 64 * q.numel() * q.element_size(), f"peak {peak / 2**20:.1f} MiB"


# ---------------------------------------------------------------------------- chapter 2

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D,bs,causal", [(200, 64, 16, False), (333, 64, 32, True),
                                           (1000, 128, 64, True), (95, 40, 16, False)])
def test_block_sparse_attention(dtype, T, D, bs, causal):
    q, k = _randn(2, 3, T, D, dtype=dtype, seed=T), _randn(2, 3, T, D, dtype=dtype, seed=T + 1)
    v = _randn(2, 3, T, D, dtype=dtype, seed=T + 2)
    nb = n_blocks(T, bs)
    g = torch.Generator().manual_seed(T)
    mask = ((torch.rand(3, nb, nb, generator=g) < 0.4) | torch.eye(nb, dtype=torch.bool)).cuda()
    o, lse = attnlib.block_sparse_attention(q, k, v, mask, block_size=bs, causal=causal,
                                            return_lse=True, backend="triton")
    o_ref, lse_ref = block_sparse_attention_reference(q.double(), k.double(), v.double(), mask,
                                                      block_size=bs, scale=D ** -0.5, causal=causal)
    _check("block_sparse_attention", dtype, o, o_ref, T=T, D=D, block=bs, causal=causal)
    _check("block_sparse_attention.lse", dtype, lse, lse_ref, tol=1e-5, T=T, D=D, block=bs, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D,Dv,bs,causal", [(200, 64, 64, 16, False), (333, 64, 40, 32, True),
                                              (1000, 128, 128, 64, True), (95, 40, 24, 16, False),
                                              (700, 64, 64, 256, True), (1100, 256, 256, 1024, False)])
def test_block_sparse_attention_backward(dtype, T, D, Dv, bs, causal):
    q, k = _randn(1, 3, T, D, dtype=dtype, seed=T), _randn(1, 3, T, D, dtype=dtype, seed=T + 1)
    v = _randn(1, 3, T, Dv, dtype=dtype, seed=T + 2)
    nb = n_blocks(T, bs)
    g = torch.Generator().manual_seed(T)
    mask = (torch.rand(3, nb, nb, generator=g) < 0.4).cuda()          # some rows visit nothing
    _grads_vs_float64(
        "block_sparse_attention.bwd",
        lambda q, k, v: attnlib.block_sparse_attention(q, k, v, mask, block_size=bs, causal=causal,
                                                       return_lse=True, backend="triton"),
        lambda q, k, v: block_sparse_attention_reference(q, k, v, mask, block_size=bs, scale=D ** -0.5,
                                                         causal=causal),
        (q, k, v), dtype, T=T, D=D, Dv=Dv, block=bs, causal=causal)


# Sliding-window attention: the flash kernels over each tile's band (attnlib/kernels/window). Windows
# narrower than a tile (every tile an edge tile), not dividing one, wide enough for unmasked inner tiles,
# and at least T (softmax attention); ragged lengths; D != Dv; head dims up to the 128 the kernels take.
_WINDOW_CASES = [(1, 64, 64, 4, True), (200, 64, 64, 1, False), (333, 64, 40, 17, True), (333, 64, 64, 100, False),
                 (1000, 128, 128, 256, True), (257, 80, 48, 1000, False), (300, 128, 96, 77, True)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D,Dv,window,causal", _WINDOW_CASES)
def test_sliding_window_attention(dtype, T, D, Dv, window, causal):
    q, k = _randn(2, 3, T, D, dtype=dtype, seed=T), _randn(2, 3, T, D, dtype=dtype, seed=T + 1)
    v = _randn(2, 3, T, Dv, dtype=dtype, seed=T + 2)
    o, lse = attnlib.sliding_window_attention(q, k, v, window=window, causal=causal, return_lse=True,
                                              backend="triton")
    o_ref, lse_ref = sliding_window_attention_reference(q.double(), k.double(), v.double(), window=window,
                                                        scale=D ** -0.5, causal=causal)
    _check("sliding_window_attention", dtype, o, o_ref, T=T, D=D, Dv=Dv, window=window, causal=causal)
    _check("sliding_window_attention.lse", dtype, lse, lse_ref, tol=1e-5, T=T, D=D, Dv=Dv, window=window,
           causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D,Dv,window,causal", _WINDOW_CASES)
def test_sliding_window_attention_backward(dtype, T, D, Dv, window, causal):
    q, k = _randn(1, 3, T, D, dtype=dtype, seed=T), _randn(1, 3, T, D, dtype=dtype, seed=T + 1)
    v = _randn(1, 3, T, Dv, dtype=dtype, seed=T + 2)
    _grads_vs_float64(
        "sliding_window_attention.bwd",
        lambda q, k, v: attnlib.sliding_window_attention(q, k, v, window=window, causal=causal, return_lse=True,
                                                         backend="triton"),
        lambda q, k, v: sliding_window_attention_reference(q, k, v, window=window, scale=D ** -0.5, causal=causal),
        (q, k, v), dtype, T=T, D=D, Dv=Dv, window=window, causal=causal)


# ---------------------------------------------------------------------------- chapter 3

# The chunked kernels (linear, delta, gated delta). In half precision every product runs on the tensor
# cores with 16-bit operands; those with a state or a score tile take bfloat16 operands even for float16
# inputs (kernels/common/precision.py: a state can exceed float16's range), so float16 results carry
# bfloat16's rounding (2^-9) in those products: the float16 bound is bfloat16-like. Gradients sum more
# rounded products than the forward: looser bounds (GRAD_TOL["chunked"]).
CHUNKED_TOL = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D,Dv,causal,cs", [(1, 64, 64, True, 64), (1000, 64, 64, True, 64),
                                              (777, 128, 128, True, 32), (300, 48, 24, False, 64),
                                              (4097, 64, 64, True, 16), (600, 256, 256, True, 64)])
def test_linear_attention(dtype, T, D, Dv, causal, cs):
    q, k = _randn(2, 3, T, D, dtype=dtype, seed=T), _randn(2, 3, T, D, dtype=dtype, seed=T + 1)
    v = _randn(2, 3, T, Dv, dtype=dtype, seed=T + 2)
    S0 = _randn(2, 3, Dv, D, dtype=torch.float32, seed=T + 3)
    o, S = attnlib.linear_attention(q, k, v, causal=causal, chunk_size=cs, initial_state=S0,
                                    output_final_state=True, backend="triton")
    o_ref, S_ref = attnlib.linear_attention(q.double(), k.double(), v.double(), causal=causal,
                                            initial_state=S0.double(), output_final_state=True,
                                            mode="parallel", backend="torch")
    _check("linear_attention", dtype, o, o_ref, tol=CHUNKED_TOL[dtype], T=T, D=D, Dv=Dv, causal=causal, chunk=cs)
    _check("linear_attention.state", dtype, S, S_ref, tol=1e-5, T=T, D=D, Dv=Dv, causal=causal, chunk=cs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_attention_normalized_feature_map(dtype):
    q, k, v = (_randn(1, 2, 513, 32, dtype=dtype, seed=20 + i) for i in range(3))
    o = attnlib.linear_attention(q, k, v, feature_map="elu1", normalize=True, backend="triton", causal=True)
    o_ref = attnlib.linear_attention(q.double(), k.double(), v.double(), feature_map="elu1",
                                     normalize=True, mode="recurrent", backend="torch", causal=True)
    _check("linear_attention.elu1_normalized", dtype, o, o_ref, tol=CHUNKED_TOL[dtype], T=513, D=32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,D,Dv,cs", [(1, 64, 64, 64), (200, 32, 32, 64), (777, 128, 128, 64),
                                       (300, 48, 24, 32)])
def test_linear_attention_backward(dtype, causal, T, D, Dv, cs):
    q, k = _randn(2, 3, T, D, dtype=dtype, seed=30 + T), _randn(2, 3, T, D, dtype=dtype, seed=31 + T)
    v = _randn(2, 3, T, Dv, dtype=dtype, seed=32 + T)
    S0 = _randn(2, 3, Dv, D, dtype=torch.float32, seed=33 + T)
    do, dS = _randn(2, 3, T, Dv, dtype=dtype, seed=34 + T), _randn(2, 3, Dv, D, dtype=torch.float32, seed=35 + T)
    grads = []
    for backend, cast in (("triton", lambda t: t), ("torch", lambda t: t.double())):
        ins = [cast(t).requires_grad_() for t in (q, k, v, S0)]
        o, S = attnlib.linear_attention(*ins[:3], causal=causal, chunk_size=cs, initial_state=ins[3],
                                        output_final_state=True, backend=backend)
        grads.append(torch.autograd.grad([o, S], ins, [cast(do), cast(dS)]))
    for name, a, b in zip(("dq", "dk", "dv", "dS0"), *grads):
        _check(f"linear_attention.grad.{name}", dtype, a, b, tol=GRAD_TOL["chunked"][dtype], T=T, D=D, Dv=Dv,
               causal=causal, chunk=cs)


# ---------------------------------------------------------------------------- chapter 4

def _delta_inputs(B, H, T, D, Dv, dtype, gated, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=g)
    k = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=g), dim=-1)
    v = torch.randn(B, H, T, Dv, generator=g)
    beta = torch.rand(B, H, T, generator=g) * 2
    gg = -0.3 * torch.rand(B, H, T, generator=g) if gated else None
    cast = [t.to(device="cuda", dtype=dtype) if t is not None else None for t in (q, k, v, beta, gg)]
    return cast


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("T,D,Dv,cs", [(1, 64, 64, 64), (1000, 64, 64, 64), (777, 128, 128, 64),
                                       (300, 40, 24, 32), (2049, 128, 128, 16), (600, 256, 256, 64)])
def test_delta_rule(dtype, gated, T, D, Dv, cs):
    q, k, v, beta, g = _delta_inputs(2, 3, T, D, Dv, dtype, gated, seed=T)
    S0 = _randn(2, 3, Dv, D, dtype=torch.float32, seed=T + 9) * 0.1
    o, S = attnlib.delta_rule(q, k, v, beta, g=g, chunk_size=cs, initial_state=S0,
                              output_final_state=True, backend="triton")
    o_ref, S_ref = delta_rule_recurrent_reference(q.double(), k.double(), v.double(), beta.double(),
                                                  None if g is None else g.double(), scale=D ** -0.5,
                                                  initial_state=S0.double())
    shape = dict(T=T, D=D, Dv=Dv, gated=gated, chunk=cs)
    _check("delta_rule", dtype, o, o_ref, tol=CHUNKED_TOL[dtype], **shape)
    _check("delta_rule.state", dtype, S, S_ref, tol=max(CHUNKED_TOL[dtype], 1e-4), **shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("T,D,Dv,cs", [(1, 64, 64, 64), (150, 32, 32, 64), (777, 128, 128, 64),
                                       (300, 40, 24, 32), (400, 256, 256, 64)])
def test_delta_rule_backward(dtype, gated, T, D, Dv, cs):
    q, k, v, beta, g = _delta_inputs(2, 3, T, D, Dv, dtype, gated, seed=40 + T)
    S0 = _randn(2, 3, Dv, D, dtype=torch.float32, seed=41 + T) * 0.1
    do, dS = _randn(2, 3, T, Dv, dtype=dtype, seed=42 + T), _randn(2, 3, Dv, D, dtype=torch.float32, seed=43 + T)
    names = ["dq", "dk", "dv", "dbeta", "dS0"] + (["dg"] if gated else [])
    grads = []
    for backend, cast in (("triton", lambda t: t), ("torch", lambda t: t.double())):
        ins = [cast(t).requires_grad_() for t in (q, k, v, beta, S0)] + ([cast(g).requires_grad_()] if gated else [])
        o, S = attnlib.delta_rule(*ins[:4], g=ins[5] if gated else None, chunk_size=cs, initial_state=ins[4],
                                  output_final_state=True, backend=backend,
                                  mode="chunk" if backend == "triton" else "recurrent")
        grads.append(torch.autograd.grad([o, S], ins, [cast(do), cast(dS)]))
    for name, a, b in zip(names, *grads):
        _check(f"delta_rule.grad.{name}", dtype, a, b, tol=GRAD_TOL["chunked"][dtype], T=T, D=D, Dv=Dv, gated=gated,
               chunk=cs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_delta_rule_backward_when_only_q_requires_grad(dtype):
    q, k, v, beta, g = _delta_inputs(1, 2, 200, 64, 64, dtype, True, seed=50)
    grads = []
    for backend, cast in (("triton", lambda t: t), ("torch", lambda t: t.double())):
        qq = cast(q).requires_grad_()
        o = attnlib.delta_rule(qq, cast(k), cast(v), cast(beta), g=cast(g), backend=backend)
        grads.append(torch.autograd.grad(o.float().square().sum(), qq)[0])
    _check("delta_rule.grad.only_q", dtype, grads[0], grads[1], tol=GRAD_TOL["chunked"][dtype], T=200, D=64)


# ---------------------------------------------------------------------------- edge cases, every op

@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_batch_and_zero_length(dtype):
    for B, T in ((0, 16), (2, 0)):
        q, k, v = (torch.randn(B, 2, T, 32, device="cuda").to(dtype) for _ in range(3))
        beta = torch.ones(B, 2, T, device="cuda", dtype=dtype)
        outs = [attnlib.linear_attention(q, k, v, backend="triton", causal=True),
                attnlib.delta_rule(q, k, v, beta, backend="triton")]
        if T:
            outs.append(attnlib.softmax_attention(q, k, v, backend="triton", causal=False))
            mask = torch.ones(2, 1, 1, dtype=torch.bool, device="cuda")
            outs.append(attnlib.block_sparse_attention(q, k, v, mask, block_size=16, backend="triton", causal=False))
        for o in outs:
            assert o.shape == (B, 2, T, 32) and o.dtype == dtype


def test_auto_backend_picks_the_kernel_on_cuda():
    from attnlib._backend import choose_backend
    assert choose_backend("auto", torch.zeros(1, device="cuda")) == "triton"
    assert math.isfinite(float(attnlib.softmax_attention(*(torch.randn(1, 1, 3, 8, device="cuda"),) * 3,
                                                         causal=False).sum()))


# ---------------------------------------------------------------------------- chapter 5: ANNA

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,D,Dv", [(1000, 64, 64), (4099, 128, 96)])
def test_anna_kernel_matches_reference(dtype, causal, T, D, Dv):
    from attnlib.anna import lsh_codes, lsh_projections
    from attnlib.kernels.anna import simhash_codes
    q, k, v = (_randn(2, 3, T, d, dtype=dtype, seed=50 + i) for i, d in enumerate((D, D, Dv)))
    planes = lsh_projections("simhash", 8, 6, D, 1)
    # Bucket keys: the kernel's fp32 projections and torch's may round a near-zero projection to
    # opposite signs; they must agree almost everywhere.
    same = (simhash_codes(k, planes) == lsh_codes(k, planes, "simhash")).double().mean().item()
    assert same > 0.999, f"anna codes agree on {same:.4%}"
    kw = dict(n_tables=8, n_bits=6, seed=1, causal=causal)
    o = attnlib.anna_attention(q, k, v, backend="triton", **kw)
    o_ref = attnlib.anna_attention(q, k, v, backend="torch", **kw)
    _check("anna_attention", dtype, o, o_ref, tol=max(TOL[dtype], 2e-2), T=T, D=D, Dv=Dv, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_anna_crosspolytope_kernel_matches_reference(dtype, causal):
    q, k, v = (_randn(2, 3, 1000, 64, dtype=dtype, seed=60 + i) for i in range(3))
    kw = dict(n_tables=4, n_bits=2, seed=2, causal=causal, family="crosspolytope")
    o = attnlib.anna_attention(q, k, v, backend="triton", **kw)
    o_ref = attnlib.anna_attention(q, k, v, backend="torch", **kw)
    _check("anna_attention.crosspolytope", dtype, o, o_ref, tol=max(TOL[dtype], 2e-2), T=1000, D=64, causal=causal)
# ---------------------------------------------------------------------------- grassmann (chapter 6)

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,r,d", [(1, 32, 256), (300, 32, 256), (1000, 6, 100), (257, 17, 64)])
def test_grassmann_fused_projection(dtype, T, r, d):
    from attnlib.grassmann import n_pairs, plucker_projection_reference
    g = torch.Generator(device="cuda").manual_seed(T + r)
    z = torch.randn(2, T, r, device="cuda", generator=g).to(dtype)
    W = (torch.randn(d, n_pairs(r), device="cuda", generator=g) / n_pairs(r) ** 0.5).to(dtype)
    offsets = (1, 2, 4, 8, 12, 16)
    out = attnlib.plucker_projection(z, W, offsets, backend="triton")
    ref = plucker_projection_reference(z.double(), W.double(), offsets)
    if T == 1:
        assert torch.equal(out, torch.zeros_like(out))
        return
    _check("plucker_projection", dtype, out, ref, T=T, r=r, d=d)


def test_grassmann_fused_projection_backward():
    from attnlib.grassmann import n_pairs
    g = torch.Generator(device="cuda").manual_seed(7)
    z = torch.randn(2, 500, 32, device="cuda", generator=g).requires_grad_()
    W = torch.randn(256, n_pairs(32), device="cuda", generator=g).requires_grad_()
    grads = []
    for backend in ("triton", "torch"):
        out = attnlib.plucker_projection(z, W, (1, 2, 4, 8, 12, 16), backend=backend)
        grads.append(torch.autograd.grad(out.square().sum(), (z, W)))
    for a, b in zip(*grads):
        _check("plucker_projection.grad", torch.float32, a, b, T=500, r=32, d=256)


# ---------------------------------------------------------------------------- top-k attention (chapter 7)

# The indexer's scores: 16-bit tensor-core products (exact in float32) summed in float32, so every dtype
# is float32-accurate; its gradients take dI in bfloat16 for half inputs (kernels/common/precision.py's
# WIDE operands): the chunked bounds. The attention gathers rows and computes in float32 (no tensor core):
# only the output rounding and the float32 atomics' order remain.

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H_I,T,d_I", [(2, 4, 1, 64), (1, 8, 333, 128), (2, 3, 200, 40), (1, 2, 130, 256)])
def test_topk_index_scores_and_gradients(dtype, B, H_I, T, d_I):
    from attnlib.topk import index_scores_reference
    iq, ik = _randn(B, H_I, T, d_I, dtype=dtype, seed=T), _randn(B, 1, T, d_I, dtype=dtype, seed=T + 1)
    iw = _randn(B, H_I, T, dtype=dtype, seed=T + 2)
    w = _randn(B, 1, T, T, dtype=torch.float32, seed=T + 3)
    outs = []
    for backend, cast in (("triton", lambda t: t), ("torch", lambda t: t.double())):
        xs = [cast(t).detach().requires_grad_() for t in (iq, ik, iw)]
        I = attnlib.index_scores(*xs, backend=backend) if backend == "triton" else index_scores_reference(*xs)
        outs.append([I, *torch.autograd.grad((I * w.to(I.dtype)).sum(), xs)])
    for name, a, b in zip(("I", "d index_q", "d index_k", "d index_w"), *outs):
        tol = (2e-5 if dtype == torch.float32 else 1e-4) if name == "I" else GRAD_TOL["chunked"][dtype]
        _check(f"index_scores.{name}", dtype, a, b, tol=tol, B=B, H_I=H_I, T=T, d_I=d_I)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,D,Dv,top_k,causal", [(1, 64, 64, 8, True), (333, 64, 40, 32, True),
                                                 (1000, 128, 128, 64, True), (300, 256, 256, 17, False),
                                                 (95, 40, 24, 200, True)])
def test_topk_attention_forward_and_backward(dtype, T, D, Dv, top_k, causal):
    from attnlib.topk import _TritonTopkAttention, index_scores_reference, topk_attention_reference, topk_select
    q, k = _randn(2, 3, T, D, dtype=dtype, seed=T), _randn(2, 3, T, D, dtype=dtype, seed=T + 1)
    v = _randn(2, 3, T, Dv, dtype=dtype, seed=T + 2)
    iq, ik, iw = (_randn(*s, dtype=torch.float32, seed=T + 3 + i) for i, s in
                  enumerate([(2, 4, T, 32), (2, 1, T, 32), (2, 4, T)]))
    idx = topk_select(index_scores_reference(iq, ik, iw), top_k, causal=causal)
    _grads_vs_float64(
        "topk_attention",
        lambda q, k, v: _TritonTopkAttention.apply(q, k, v, idx, D ** -0.5),
        lambda q, k, v: topk_attention_reference(q, k, v, idx, scale=D ** -0.5),
        (q, k, v), dtype, T=T, D=D, Dv=Dv, top_k=top_k, causal=causal)


def test_topk_attention_auto_takes_the_kernels_and_leaks_nothing_from_unselected_keys():
    from attnlib.topk import selection_mask
    q, k, v = (_randn(1, 2, 500, 64, dtype=torch.bfloat16, seed=s) for s in (1, 2, 3))
    iq, ik, iw = (_randn(*s, dtype=torch.bfloat16, seed=4 + i) for i, s in
                  enumerate([(1, 4, 500, 64), (1, 1, 500, 64), (1, 4, 500)]))
    o, idx = attnlib.topk_attention(q, k, v, iq, ik, iw, top_k=16, return_indices=True, causal=True)
    ref = attnlib.topk_attention(q, k, v, iq, ik, iw, top_k=16, backend="torch", causal=True)
    chosen = selection_mask(idx, 500).any(dim=2)[0, 0]            # keys some query selected
    kp, vp = k.clone(), v.clone()
    kp[:, :, ~chosen], vp[:, :, ~chosen] = float("nan"), float("inf")
    o_poisoned = attnlib.topk_attention(q, kp, vp, iq, ik, iw, top_k=16, causal=True)
    assert torch.equal(o, o_poisoned) and (~chosen).any()
    _check("topk_attention.auto", torch.bfloat16, o, ref.double(), T=500, D=64, top_k=16)
