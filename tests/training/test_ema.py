"""The moving average of the weights (transformer/training/ema.py): its decay schedule, what ``applied``
swaps in."""

import torch
from torch import nn

from transformer.training.ema import EMA


def test_the_decay_is_the_warm_up_until_it_reaches_the_cap():
    """shadow_n = d_n · shadow_{n-1} + (1 − d_n) · θ_n with d_n = min(decay, (1 + n) / (10 + n)), by hand.
    With decay 0.5 the warm-up binds for n < 8 and the cap after: both regimes are crossed."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ema = EMA(model, decay=0.5)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(1, 13):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update(model)
        d = min(0.5, (1 + n) / (10 + n))
        expected = [d * e + (1 - d) * p.detach() for e, p in zip(expected, model.parameters())]
        for shadow, want in zip(ema.shadow, expected, strict=True):
            torch.testing.assert_close(shadow, want)


def test_applied_swaps_the_average_in_and_the_training_weights_back():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    ema = EMA(model, decay=0.9)
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    trained = model.weight.detach().clone()
    with ema.applied(model):
        torch.testing.assert_close(model.weight, ema.shadow[0])
        assert not torch.equal(model.weight, trained)
    torch.testing.assert_close(model.weight, trained)
