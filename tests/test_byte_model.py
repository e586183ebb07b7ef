"""Chapter 1's real input: the committed byte-level model has learned something (it beats a bigram model,
defined here, on a fixed slice of the validation text), its attention on a snippet is causal rows of
probabilities that reproduce the model's own attention outputs, the committed JSON describes the committed
weights, and the figure draws what it says."""

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from attnbook.experiments import byte_model as bm
from attnbook.experiments.grassmann import stdlib_corpus

ROOT = Path(__file__).resolve().parents[1]
SLICE_WINDOWS, SLICE_BYTES = 48, 64          # the fixed slice: the validation text's first 48 x 64 bytes


@pytest.fixture(scope="module")
def model():
    return bm.load(ROOT / bm.WEIGHTS)


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus()


@pytest.fixture(scope="module")
def att(model):
    return bm.snippet_attention(bm.SNIPPET, model)


def _bigram_bits(train: np.ndarray, prev: np.ndarray, nxt: np.ndarray) -> float:
    """Add-one smoothed bigram: p(b | a) = (count(a b) + 1) / (count(a) + 256), counts over ``train``."""
    pairs = np.bincount(train[:-1].astype(np.int64) * 256 + train[1:], minlength=256 * 256).reshape(256, 256)
    p = (pairs[prev, nxt] + 1) / (pairs[prev].sum(1) + 256)
    return float(-np.log2(p).mean())


def test_model_beats_the_bigram_baseline_on_a_fixed_validation_slice(model, corpus):
    train, val, _ = corpus
    v = val[: SLICE_WINDOWS * SLICE_BYTES + 1].numpy().astype(np.int64)
    x = torch.from_numpy(v[:-1].reshape(SLICE_WINDOWS, SLICE_BYTES))
    y = v[1:].reshape(SLICE_WINDOWS, SLICE_BYTES)
    with torch.no_grad():
        logp = torch.log_softmax(model(x).double(), -1).numpy()
    model_bits = float(-(np.take_along_axis(logp, y[..., None], -1)).mean() / math.log(2))
    bigram_bits = _bigram_bits(train.numpy(), x.numpy().ravel(), y.ravel())
    assert model_bits < bigram_bits - 0.3, (model_bits, bigram_bits)


def test_snippet_rows_are_causal_distributions(att):
    W = att.weights
    T = len(bm.SNIPPET)
    assert W.shape == (2, 4, T, T) and att.q.shape == att.k.shape == (2, 4, T, 16)
    assert att.labels[3] == "␣" and att.labels[17] == "↵" and len(att.labels) == T
    assert (W >= 0).all()
    assert torch.count_nonzero(torch.triu(W, 1)) == 0
    torch.testing.assert_close(W.sum(-1), torch.ones(2, 4, T, dtype=torch.float64))


def test_snippet_weights_are_the_models_own_attention(model, att):
    # the definition, written out: softmax(q k^T / sqrt(d)) over keys j <= t
    s = att.q @ att.k.transpose(-1, -2) / math.sqrt(att.q.shape[-1])
    s = s.masked_fill(~torch.ones(s.shape[-1], s.shape[-1], dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(att.weights, torch.softmax(s, -1))
    # and the outputs the model's attention layers computed while running on the snippet
    outs = []
    hooks = [blk.attn.register_forward_hook(lambda m, a, o: outs.append(o)) for blk in model.blocks]
    with torch.no_grad():
        model(att.tokens[None])
    for h in hooks:
        h.remove()
    for layer, blk in enumerate(model.blocks):
        o = (att.weights[layer] @ att.v[layer]).transpose(0, 1).reshape(len(bm.SNIPPET), -1)
        mine = blk.attn.out(o.float())
        torch.testing.assert_close(mine, outs[layer][0], atol=1e-5, rtol=1e-4)


def test_committed_json_matches_the_weights(model):
    result = json.loads((ROOT / bm.RESULT).read_text())
    blob = torch.load(ROOT / bm.WEIGHTS, map_location="cpu", weights_only=True)
    assert result["config"] == blob["config"]
    assert bm.ByteModelConfig(**result["config"]) == model.config
    assert result["params"] == sum(p.numel() for p in model.parameters())
    assert result["weights_bytes"] == (ROOT / bm.WEIGHTS).stat().st_size <= 1_100_000
    assert all(v.dtype == torch.float16 for v in blob["state_dict"].values())
    base = result["baselines_bits_per_byte"]
    assert result["val_bits_per_byte"] < base["bigram"] < base["unigram"]
    if result["corpus"]["python"] == sys.version.split()[0]:       # the same corpus: the same number
        corpus = stdlib_corpus()
        xv, yv = bm.validation_windows(model.config, corpus)
        assert bm.bits_per_byte(model, xv, yv) == pytest.approx(result["val_bits_per_byte"], abs=1e-6)
    heads = {(r["layer"], r["head"]) for r in result["head_roles_validation"]}
    assert heads == {(la, h) for la in range(model.config.n_layers) for h in range(model.config.n_heads)}


def test_head_roles_on_made_up_plans():
    tokens = torch.tensor([1, 2, 1, 2, 3])
    T = 5
    prev = torch.zeros(T, T, dtype=torch.float64)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1
    induct = torch.eye(T, dtype=torch.float64)
    induct[2] = 0
    induct[2, 1] = 1                                     # query 1 at t=2: its earlier copy at 0, then 1
    induct[3] = 0
    induct[3, 2] = 1
    W = torch.stack([prev, induct])[None]                # [1 layer, 2 heads, T, T]
    roles = bm.head_roles(W, tokens)
    assert roles["previous"][0, 0] == 1 and roles["after_same_byte"][0, 1] == 1
    assert roles["self"][0, 1] == pytest.approx(0.5)     # queries t = 1, 4 keep themselves
    with pytest.raises(ValueError, match="weights has shape"):
        bm.head_roles(W, tokens[:4])


def test_structure_roles_find_the_line_start_and_the_open_bracket():
    text = "f(a[1])\n  x"
    masks = bm.role_masks(torch.tensor(list(text.encode())))
    keys, queries = masks["open_bracket"]
    # queries inside "(...)": keys at "(" (position 1); inside "[...]": "[" (position 3); ")" closes "("
    assert [int(k.nonzero()) if q else None for k, q in zip(keys, queries)] == \
        [None, None, 1, 1, 3, 3, 1, None, None, None, None]
    keys, queries = masks["newline"]
    assert queries.tolist() == [False] * 8 + [True] * 3 and keys[8:, 7].all()


def test_bad_inputs_are_named(model, att):
    with pytest.raises(TypeError, match="text"):
        bm.snippet_attention(b"def f(): pass", model)
    with pytest.raises(ValueError, match="text is 65 bytes"):
        bm.snippet_attention("x" * 65, model)
    with pytest.raises(ValueError, match="ASCII"):
        bm.snippet_attention("λ = 1", model)
    with pytest.raises(TypeError, match="model"):
        bm.snippet_attention("x = 1", model=object())
    with pytest.raises(ValueError, match="layer"):
        bm.linear_weights(att, 2, 0)
    with pytest.raises(ValueError, match="head"):
        bm.linear_weights(att, 0, 4)


def test_linear_weights_are_a_causal_plan_on_the_same_queries(att):
    L = bm.linear_weights(att, 0, 1)
    assert torch.count_nonzero(torch.triu(L, 1)) == 0 and (L >= 0).all()
    torch.testing.assert_close(L.sum(-1), torch.ones(len(bm.SNIPPET), dtype=torch.float64))


def test_real_input_figure(att):
    from attnbook.widgets.real_input import real_input_figure

    views = bm.head_views(att)
    fig = real_input_figure(att, views, active=1)
    T = len(bm.SNIPPET)
    assert len(fig.data) == 2 and [t.name for t in fig.data] == ["softmax", "linear (elu+1)"]
    assert len(fig.frames) == 8 and len(fig.layout.sliders[0].steps) == 8
    assert fig.layout.sliders[0].active == 1
    assert len(fig.layout.updatemenus[0].buttons) == 2
    assert list(fig.layout.xaxis.ticktext) == list(fig.layout.yaxis.ticktext) == att.labels
    assert "␣" in att.labels and "↵" in att.labels
    for tr in fig.data:
        z = np.asarray(tr.z, dtype=np.float64)
        upper = np.triu_indices(T, 1)
        assert np.isnan(z[upper]).all() and not np.isnan(z[np.tril_indices(T)]).any()
        assert "query %{y}, ending “%{customdata[0]}”" in tr.hovertemplate and "%{z:.3f}" in tr.hovertemplate
        assert "key %{x}, ending “%{customdata[1]}”" in tr.hovertemplate
        # cell [t, j]: the text the query ends, then the text the key ends (which ␣ of the snippet it is)
        assert tr.customdata[5][0][0] == "def␣to" and tr.customdata[12][3][0] == "…␣total(ite"
        assert tr.customdata[12][5][1] == "def␣to" and tr.customdata[0][12][1] == "…␣total(ite"
    assert "under softmax" in fig.layout.title.subtitle.text
    z0 = np.asarray(fig.frames[1].data[0].z, dtype=np.float64)
    np.testing.assert_allclose(np.nan_to_num(z0), views[1].softmax.numpy(), atol=1e-3)
    with pytest.raises(TypeError, match="views"):
        real_input_figure(att, [att])
    with pytest.raises(ValueError, match="active"):
        real_input_figure(att, views, active=8)
