"""Hybrids of full and linear layers: the layout helper, models with a layer pattern, the quadratic
share counted on FLOPs, and the probes."""

import math

import numpy as np
import pytest
import torch

from attnbook.experiments.hybrid import (
    ALL_LINEAR,
    LINEAR_MIXERS,
    answers_a_commonest_value,
    full_fraction,
    hybrid_pattern,
    mixer_flops,
    quadratic_coefficient,
    ratio_label,
    recall_by_pair,
    recall_without,
)
from attnbook.experiments.mqar import RecallModel, mqar_batch, recall_accuracy, train_recall


def test_pattern_closes_each_group_with_one_full_layer():
    # Qwen3-Next's layout (full_attention_interval=4): layers 4, 8, ... (1-based) are full
    p = hybrid_pattern(8, 3, "gated_deltanet")
    assert p == ("gated_deltanet",) * 3 + ("softmax",) + ("gated_deltanet",) * 3 + ("softmax",)
    assert [i + 1 for i, m in enumerate(p) if m == "softmax"] == [4, 8]
    assert hybrid_pattern(8, 7, "linear") == ("linear",) * 7 + ("softmax",)          # MiniMax-01's 7:1
    assert hybrid_pattern(4, 1, "deltanet") == ("deltanet", "softmax") * 2
    assert hybrid_pattern(3, 0) == ("softmax",) * 3
    assert hybrid_pattern(5, ALL_LINEAR, "deltanet") == ("deltanet",) * 5


@pytest.mark.parametrize("ratio", [0, 1, 3, 7, 15, ALL_LINEAR])
@pytest.mark.parametrize("mixer", LINEAR_MIXERS)
def test_pattern_counts(ratio, mixer):
    p = hybrid_pattern(16, ratio, mixer)
    assert len(p) == 16 and set(p) <= {"softmax", mixer}
    assert full_fraction(p) == 1 / (ratio + 1)                                        # 0 for all-linear
    assert p.count("softmax") == (0 if ratio == ALL_LINEAR else 16 // (ratio + 1))


def test_pattern_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"ratio must be an int >= 0 .*got -1"):
        hybrid_pattern(8, -1)
    with pytest.raises(ValueError, match=r"ratio must be an int >= 0 .*got 2\.5"):
        hybrid_pattern(8, 2.5)
    with pytest.raises(ValueError, match=r"ratio must be an int"):
        hybrid_pattern(8, True)
    with pytest.raises(ValueError, match=r"ratio=7 puts one full layer in every 8: n_layers must be a "
                                         r"multiple of 8; got n_layers=4"):
        hybrid_pattern(4, 7)
    with pytest.raises(ValueError, match="n_layers must be >= 1"):
        hybrid_pattern(0, 1)
    with pytest.raises(ValueError, match="linear_mixer must be one of"):
        hybrid_pattern(4, 1, "softmax")


def test_ratio_labels():
    assert [ratio_label(r) for r in (ALL_LINEAR, 7, 3, 1, 0)] == ["all-linear", "7:1", "3:1", "1:1", "all-softmax"]


def test_a_model_takes_one_mixer_per_layer():
    pattern = hybrid_pattern(4, 1, "gated_deltanet")
    model = RecallModel(16, d_model=16, n_heads=2, mixer=pattern)
    assert model.mixers == pattern and len(model.blocks) == 4
    assert [blk.mixer.kind for blk in model.blocks] == list(pattern)
    assert RecallModel(16, d_model=16, mixer="linear").mixers == ("linear", "linear")   # the default depth
    with pytest.raises(ValueError, match="n_layers=3 but the mixer pattern has 4 layers"):
        RecallModel(16, d_model=16, n_layers=3, mixer=pattern)
    with pytest.raises(ValueError, match="mixer must be one of"):
        RecallModel(16, d_model=16, mixer=("softmax", "mamba"))
    with pytest.raises(ValueError, match="non-empty sequence of names"):
        RecallModel(16, d_model=16, mixer=())


def test_a_hybrid_is_causal_and_trains():
    pattern = hybrid_pattern(4, 3, "deltanet")
    torch.manual_seed(0)
    model = RecallModel(20, d_model=16, n_heads=2, mixer=pattern)
    x, _ = mqar_batch(3, 5, n_keys=10, n_values=10, generator=torch.Generator().manual_seed(1))
    logits = model(x)
    x2 = x.clone()
    x2[:, 9:] = (x2[:, 9:] + 1) % 10                                # change the future only
    torch.testing.assert_close(model(x2)[:, :9], logits[:, :9])
    res = train_recall(pattern, 4, steps=30, batch=8, d_model=16, n_heads=2, n_keys=8, n_values=8, lr=1e-2,
                       test_batch=32, seed=0)
    assert res.mixer == pattern and res.steps == 30 and math.isfinite(res.final_loss)
    assert res.final_loss < math.log(8) + 0.5                       # it moved off the uniform guess (log 8)
    assert res.model is not None and not res.model.training
    again = train_recall(pattern, 4, steps=30, batch=8, d_model=16, n_heads=2, n_keys=8, n_values=8, lr=1e-2,
                         test_batch=32, seed=0)
    assert again.accuracy == res.accuracy and again.final_loss == res.final_loss      # seeded


@pytest.mark.parametrize("ratio", [0, 1, 3, 7, ALL_LINEAR])
def test_counted_quadratic_share_is_one_over_r_plus_one(ratio):
    # a softmax layer's scores grow like T^2, the chunked linear layers like T: the hybrid keeps the
    # all-softmax model's quadratic term times f = 1 / (r + 1) (lengths multiples of the chunk)
    lengths = (64, 128)
    torch.manual_seed(0)
    hybrid = RecallModel(16, d_model=16, n_heads=2, mixer=hybrid_pattern(8, ratio, "gated_deltanet"))
    full = RecallModel(16, d_model=16, n_heads=2, mixer=hybrid_pattern(8, 0))
    a_hyb = quadratic_coefficient(lengths, tuple(mixer_flops(hybrid, T) for T in lengths))
    a_full = quadratic_coefficient(lengths, tuple(mixer_flops(full, T) for T in lengths))
    assert a_full > 0
    assert a_hyb / a_full == pytest.approx(1 / (ratio + 1), abs=1e-12)


def test_quadratic_coefficient_reads_a_off_two_points():
    F = lambda T: 3 * T * T + 7 * T                                 # noqa: E731
    assert quadratic_coefficient((10, 30), (F(10), F(30))) == pytest.approx(3)
    with pytest.raises(ValueError, match="lengths must differ"):
        quadratic_coefficient((8, 8), (1, 1))


class _Lookup(torch.nn.Module):
    """An exact MQAR solver with the interface the probes use (emb, blocks): the answer is looked up."""

    def __init__(self, vocab, forget_first=0):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 4)
        self.blocks = torch.nn.ModuleList()
        self.vocab, self.forget_first = vocab, forget_first

    def forward(self, tokens):
        B, T = tokens.shape
        out = torch.zeros(B, T, self.vocab)
        n = (T // 3)                                                # every key asked once: T = 3 n
        for b in range(B):
            table = {tokens[b, 2 * i].item(): (i, tokens[b, 2 * i + 1].item()) for i in range(n)}
            for t in range(2 * n, T):
                i, val = table[tokens[b, t].item()]
                out[b, t, val if i >= self.forget_first else 0] = 1.0
        return out


def test_recall_by_pair_finds_the_pair_asked():
    exact = recall_by_pair(_Lookup(16), 6, batch=20, n_keys=8, n_values=8,
                           generator=torch.Generator().manual_seed(0))
    assert exact.shape == (6,) and (exact == 1).all()
    forgets = recall_by_pair(_Lookup(16, forget_first=2), 6, batch=20, n_keys=8, n_values=8,
                             generator=torch.Generator().manual_seed(0))
    assert (forgets[:2] == 0).all() and (forgets[2:] == 1).all()    # value tokens are >= 8: 0 is wrong


def test_recall_without_switches_layers_off_and_restores_them():
    torch.manual_seed(0)
    model = RecallModel(16, d_model=16, n_heads=2, mixer=hybrid_pattern(2, 1, "linear")).eval()
    x, y = mqar_batch(64, 4, n_keys=8, n_values=8, generator=torch.Generator().manual_seed(0))
    before = model(x)
    assert recall_without(model, [], x, y) == recall_accuracy(model, x, y)

    def without_mixers(tokens, off):                              # the block, written out
        h = model.emb(tokens)
        for i, blk in enumerate(model.blocks):
            if i not in off:
                h = h + blk.mixer(blk.conv(blk.norm1(h)))
            h = h + blk.mlp(blk.norm2(h))
        return model.head(model.norm(h))

    for off in ([0], [1], [0, 1]):
        pred = without_mixers(x, off).argmax(-1)
        keep = y != -100
        assert recall_without(model, off, x, y) == (pred[keep] == y[keep]).float().mean().item()
    torch.testing.assert_close(model(x), before)                    # the hooks are gone


def test_hybrid_recall_figure_draws_seeds_and_means_with_a_step_per_mixer():
    from attnbook.widgets.hybrid import hybrid_recall_figure
    recall = {"Gated DeltaNet": {0.0: [0.3, 0.4, 0.2], 0.125: [0.3, 0.3, 0.3], 1.0: [1.0, 0.9, 0.95]},
              "linear": {0.0: [0.1, 0.2, 0.3], 1.0: [1.0, 0.9, 0.95]}}
    fig = hybrid_recall_figure(recall, title="t", chance=0.125, ratio_labels={0.0: "all-linear"})
    assert [f.name for f in fig.frames] == ["Gated DeltaNet", "linear"]
    mean, seeds, chance = fig.frames[1].data
    assert list(mean.x) == [0.0, 1.0] and np.allclose(mean.y, [0.2, 0.95])
    assert len(seeds.y) == 6 and sorted(seeds.y) == sorted([0.1, 0.2, 0.3, 1.0, 0.9, 0.95])
    assert np.allclose(sorted(seeds.x)[:3], 0.0, atol=0.02)            # the seeds sit at their fraction
    assert list(chance.y) == [0.125, 0.125]
    assert fig.layout.xaxis.ticktext[0] == "all-linear"
    single = hybrid_recall_figure({"linear": recall["linear"]}, title="t")
    assert not single.frames and len(single.data) == 2
    with pytest.raises(ValueError, match="at least one mixer"):
        hybrid_recall_figure({}, title="t")


def test_answers_a_commonest_value():
    #            k  v  k  v  k  v  k  v | queries
    x = torch.tensor([[0, 5, 1, 5, 2, 6, 3, 7, 0, 1, 2, 3]])
    y = torch.tensor([[-100] * 8 + [5, 5, 6, 7]])
    assert answers_a_commonest_value(x, y, 4).tolist() == [[True, True, False, False]]
    guess = torch.tensor([[0] * 8 + [5, 6, 5, 9]])
    assert answers_a_commonest_value(x, guess, 4).tolist() == [[True, False, True, False]]
    tie = torch.tensor([[0, 5, 1, 6, 0, 1]])                      # two values once each: both commonest
    assert answers_a_commonest_value(tie, torch.tensor([[0, 0, 0, 0, 6, 5]]), 2).tolist() == [[True, True]]
