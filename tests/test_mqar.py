"""MQAR data and the tiny recall models: the data is what it says, every mixer runs and learns."""

import pytest
import torch

from attnbook.experiments.mqar import IGNORE, MIXERS, RecallModel, mqar_batch, recall_accuracy, train_recall


def test_mqar_batch_layout_and_answers():
    gen = torch.Generator().manual_seed(0)
    x, y = mqar_batch(16, 6, n_keys=10, n_values=7, n_queries=4, generator=gen)
    assert x.shape == y.shape == (16, 16)
    assert (y[:, :12] == IGNORE).all() and (y[:, 12:] != IGNORE).all()
    keys, values = x[:, 0:12:2], x[:, 1:12:2]
    assert (keys < 10).all() and (values >= 10).all() and (values < 17).all()
    for b in range(16):
        assert len(set(keys[b].tolist())) == 6                     # distinct keys
        table = dict(zip(keys[b].tolist(), values[b].tolist()))
        for t in range(12, 16):
            assert y[b, t].item() == table[x[b, t].item()]         # the answer is the paired value


def test_mqar_batch_is_reproducible_from_the_generator():
    a = mqar_batch(4, 5, generator=torch.Generator().manual_seed(3))
    b = mqar_batch(4, 5, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(s, t) for s, t in zip(a, b))


def test_mqar_bad_arguments():
    with pytest.raises(ValueError, match="n_pairs=9 distinct keys need n_keys >= n_pairs"):
        mqar_batch(2, 9, n_keys=8)
    with pytest.raises(ValueError, match=r"n_queries must be in \[1, 3\] \(at most n_pairs\)"):
        mqar_batch(2, 3, n_queries=4)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        mqar_batch(0, 3)
    with pytest.raises(ValueError, match="mixer must be one of"):
        RecallModel(10, mixer="mamba")


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_mixer_is_causal_and_runs_forward_and_backward(mixer):
    torch.manual_seed(0)
    model = RecallModel(20, d_model=32, n_layers=1, n_heads=2, mixer=mixer)
    x, _ = mqar_batch(3, 5, n_keys=10, n_values=10)
    logits = model(x)
    assert logits.shape == (3, 15, 20) and torch.isfinite(logits).all()
    x2 = x.clone()
    x2[:, 9:] = (x2[:, 9:] + 1) % 10                                # change the future only
    torch.testing.assert_close(model(x2)[:, :9], logits[:, :9])
    logits.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_deltanet_model_learns_small_mqar():
    res = train_recall("deltanet", 4, steps=150, d_model=32, n_layers=1, n_heads=2, n_keys=16,
                       n_values=16, lr=1e-2, test_batch=128)
    assert res.accuracy > 0.5        # chance is 1/16


def test_recall_accuracy_counts_only_query_positions():
    class Oracle(torch.nn.Module):
        def forward(self, tokens):
            return torch.nn.functional.one_hot(self.answer, 20).float()
    x, y = mqar_batch(2, 3, n_keys=10, n_values=10)
    m = Oracle()
    m.answer = torch.where(y == IGNORE, 0, y)
    assert recall_accuracy(m, x, y) == 1.0
    m.answer = torch.zeros_like(y)
    assert recall_accuracy(m, x, y) == 0.0
