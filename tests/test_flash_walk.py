"""The flash forward's trace (``attnbook.experiments.flash_walk``) and the roofline's counts
(``attnbook.experiments.roofline``): the trace is the real kernel's state, its last tile is the kernel's
output, and the counts are what they say."""

import math

import pytest
import torch

from attnbook.experiments import roofline
from attnbook.experiments.flash_walk import flash_walk
from attnlib import _backend, softmax_attention

needs_kernel = pytest.mark.skipif(not (_backend.INTERPRET or torch.cuda.is_available()),
                                  reason="the kernel runs on a GPU or through TRITON_INTERPRET=1")


def _qkv(T=40, D=16, Dv=8, B=2, H=2, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, D, generator=g) for _ in range(2))
    return q.to(device), k.to(device), torch.randn(B, H, T, Dv, generator=g).to(device)


def _device():
    return "cuda" if torch.cuda.is_available() and not _backend.INTERPRET else "cpu"


@needs_kernel
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_m, block_n, tile", [(32, 16, 0), (16, 16, 2), (32, 32, 1)])
def test_the_last_tile_is_the_kernels_output(causal, block_m, block_n, tile):
    q, k, v = _qkv(device=_device())
    w = flash_walk(q, k, v, causal=causal, block_m=block_m, block_n=block_n, query_tile=tile, batch=1, head=1)
    rows = torch.arange(tile * block_m, min((tile + 1) * block_m, 40))
    assert torch.equal(w.rows, rows)
    n = w.m.shape[0]
    # non-causal: every key tile; causal: the tiles up to the one holding the tile's last row
    n_expected = math.ceil(40 / block_n) if not causal else math.ceil(int(rows[-1] + 1) / block_n)
    assert n == n_expected and w.key_end[-1] == (40 if not causal else min(40, n * block_n))
    assert w.l.shape == (n, len(rows)) and w.acc.shape == (n, len(rows), 8) and w.plans.shape == (n, len(rows), 40)
    # the traced state after the last tile is what the kernel wrote back (o = acc / l, lse = m + log l)
    assert torch.allclose(w.o_partial[-1], w.o.double(), rtol=1e-6, atol=1e-6)
    assert torch.allclose(w.lse_partial[-1], w.lse.double(), rtol=1e-6, atol=1e-6)
    # ... which is the production launch's output (softmax_attention's kernel path, same inputs)
    o, lse = softmax_attention(q, k, v, causal=causal, return_lse=True, backend="triton")
    assert torch.allclose(w.o, o[1, 1, rows].cpu(), rtol=1e-5, atol=1e-5)
    assert torch.allclose(w.lse, lse[1, 1, rows].cpu(), rtol=1e-5, atol=1e-5)
    # the running max never decreases, and each partial plan's rows sum to one over the keys seen
    assert (w.m.diff(dim=0) >= 0).all()
    assert torch.allclose(w.plans.sum(-1), torch.ones(n, len(rows), dtype=torch.float64), atol=1e-5)


@needs_kernel
def test_trace_is_the_definition_on_each_prefix_of_keys():
    q, k, v = _qkv(T=48, D=16, Dv=4, B=1, H=1, device=_device())
    w = flash_walk(q, k, v, block_m=16, block_n=16, query_tile=1)
    for t, end in enumerate(w.key_end.tolist()):
        s = w.scores[:, :end]
        assert torch.allclose(w.m[t], s.max(dim=1).values, atol=1e-5)
        assert torch.allclose(w.lse_partial[t], torch.logsumexp(s, dim=1), atol=1e-5)
        ref = torch.softmax(s, dim=1) @ v[0, 0, :end].double().cpu()
        assert torch.allclose(w.o_partial[t], ref, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("kwargs, name", [
    (dict(block_m=24), "block_m"), (dict(block_m=256), "block_m"), (dict(block_n=8), "block_n"),
    (dict(query_tile=2), "query_tile"), (dict(query_tile=-1), "query_tile"), (dict(batch=2), "batch"),
    (dict(head=5), "head"), (dict(scale=-1.0), "scale"), (dict(causal=True, block_m=16, block_n=32), "block_n"),
])
def test_bad_arguments_raise_value_errors_naming_the_argument(kwargs, name):
    q, k, v = _qkv(device=_device())
    with pytest.raises(ValueError, match=name):
        flash_walk(q, k, v, **kwargs)


def test_bad_tensors_raise():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="k has shape"):
        flash_walk(q, k[..., :4], v)
    with pytest.raises(ValueError, match="causal"):
        flash_walk(q, k[:, :, :20], v[:, :, :20], causal=True)
    with pytest.raises(TypeError, match="causal"):
        flash_walk(q, k, v, causal=1)


@pytest.mark.skipif(_backend.INTERPRET or torch.cuda.is_available(), reason="the kernel can run here")
def test_without_the_interpreter_a_cpu_walk_says_how_to_enable_it():
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        flash_walk(*_qkv())


def test_counted_flops_match_the_formulas():
    B, H, T, D = 2, 3, 128, 32
    assert roofline.count_forward_flops("softmax", B, H, T, D, causal=False) == 4 * B * H * T * T * D
    assert roofline.count_forward_flops("softmax", B, H, T, D) == 2 * B * H * T * T * D
    # linear attention, chunk 64: intra-chunk scores and their product with v (4 C D per token), then the
    # state's read-out and update (4 D^2 per token)
    assert roofline.count_forward_flops("linear", B, H, T, D) == B * H * T * (4 * 64 * D + 4 * D * D)
    with pytest.raises(ValueError, match="op"):
        roofline.count_forward_flops("sparse", B, H, T, D)
    with pytest.raises(ValueError, match="T"):
        roofline.count_forward_flops("linear", B, H, 0, D)


def test_roofline_points_read_the_report_and_the_benchmark():
    report = {"targets": {"sm_90": {}}, "rows": [
        {"op": "softmax", "shape": dict(B=1, H=2, T=128, D=32), "target": "sm_90", "pass": "fwd",
         "attnlib": {"bytes": 1000}},
        {"op": "softmax", "shape": dict(B=1, H=2, T=128, D=32), "target": "sm_80", "pass": "fwd",
         "attnlib": {"bytes": 5}},
        {"op": "softmax", "shape": dict(B=1, H=2, T=128, D=32), "target": "sm_90", "pass": "fwd+bwd",
         "attnlib": {"bytes": 7}}]}
    (p,) = roofline.static_points(report)
    assert p["bytes"] == 1000 and p["flops"] == 2 * 2 * 128 * 128 * 32 and p["intensity"] == p["flops"] / 1000
    bench = {"device": "NVIDIA H200", "rows": [
        dict(impl="attnlib", B=1, H=2, T=128, D=32, dtype="bf16", causal=True, tflops=3.0),
        dict(impl="sdpa", B=1, H=2, T=128, D=32, dtype="bf16", causal=True, tflops=4.0),
        dict(impl="attnlib", B=1, H=2, T=256, D=32, dtype="bf16", causal=True, tflops=5.0)]}
    (m,) = roofline.measured_points(bench, report)
    assert m["device"] == "NVIDIA H200" and m["tflops"] == 3.0 and m["intensity"] == p["intensity"]
    with pytest.raises(KeyError, match="sm_75"):
        roofline.static_points(report, target="sm_75")


def test_roofs_are_the_datasheets():
    h100, h200 = roofline.PEAKS["NVIDIA H100"], roofline.PEAKS["NVIDIA H200"]
    assert (h100.tflops, h100.tb_per_s, h200.tflops, h200.tb_per_s) == (989.0, 3.35, 989.0, 4.8)
    assert h100.ridge == pytest.approx(989 / 3.35)
    assert h100.attainable([1.0, 1e4]).tolist() == pytest.approx([3.35, 989.0])
