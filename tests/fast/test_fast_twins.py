"""The fast twins against the plain modules: a model's outputs and every gradient equal to float rounding
with dropout off (a float64 model; the losses are computed in fp32); with dropout on, other masks from the
same generator, the same distribution (tests/fast/test_fast_dropout.py), so the losses agree on average."""

import copy

import pytest
import torch

from transformer.core.config import ModelConfig
from transformer.core.loss import token_loss
from transformer.fast.output_loss import output_loss
from transformer.fast.twins import speed_up
from transformer.interop.variant import VariantTransformer
from transformer.runtime.configs import VariantConfig


def model_pair(norm_first: bool, dropout: float, activation: str = "relu"):
    torch.manual_seed(0)
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2, n_decoder_layers=2,
                         dropout=dropout, norm_first=norm_first)  # fmt: skip
    variant = VariantConfig(activation=activation)  # a released model's GELU: the fast tier's plain path
    plain = VariantTransformer(config, variant, 30, 30, pad_id=0, bos_id=2, eos_id=3).double()
    return plain, speed_up(copy.deepcopy(plain))


def batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 30, (5, 7), generator=g)
    tgt_in = torch.randint(4, 30, (5, 6), generator=g)
    tgt_in[:, 0], src[3, 5:], tgt_in[2, 4:] = 2, 0, 0  # the start token, and some padding
    tgt_out = torch.roll(tgt_in, -1, dims=1)
    tgt_out[:, -1] = 3
    return src, tgt_in, tgt_out


def gradients(model, loss) -> dict[str, torch.Tensor]:
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return {name: g for (name, _), g in zip(model.named_parameters(), grads)}


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_the_fast_model_and_loss_equal_the_plain_ones_values_and_gradients(norm_first, activation):
    plain, fast = model_pair(norm_first, dropout=0.0, activation=activation)
    src, tgt_in, tgt_out = batch()
    plain.train(), fast.train()
    want = token_loss(plain(src, tgt_in), tgt_out, 0, 0.1, plain.never_produced)
    features = fast(src, tgt_in, project=False)  # (B, T, D)
    got = output_loss(features, fast.output_proj, tgt_out, 0, 0.1, fast.never_produced)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # both losses are computed in fp32
    want_grads, got_grads = gradients(plain, want), gradients(fast, got)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_with_dropout_the_two_train_alike():
    """Other random masks, the same distribution: the mean loss over many draws within 1 %."""
    plain, fast = model_pair(False, dropout=0.3)
    src, tgt_in, tgt_out = batch()
    plain.train(), fast.train()
    with torch.no_grad():
        losses = [token_loss(m(src, tgt_in), tgt_out, 0, 0.1) for m in (plain, fast) for _ in range(200)]
    plain_mean, fast_mean = torch.stack(losses[:200]).mean(), torch.stack(losses[200:]).mean()
    assert fast_mean == pytest.approx(plain_mean.item(), rel=0.01)
    plain.eval(), fast.eval()
    torch.testing.assert_close(fast(src, tgt_in), plain(src, tgt_in), rtol=1e-12, atol=1e-12)
