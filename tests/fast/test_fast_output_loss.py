"""The fast tier's training loss, ``output_loss`` (the projection and the loss a block of rows at a time,
gradients written out), against the core's ``token_loss`` on the projected features, gradients included."""

import pytest
import torch
from helpers import BOS, EOS, PAD, random_batch

from transformer.core.config import ModelConfig
from transformer.core.loss import token_loss
from transformer.fast import output_loss as loss_module
from transformer.fast.output_loss import output_loss
from transformer.interop.variant import VariantTransformer
from transformer.runtime.configs import VariantConfig


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.4])
@pytest.mark.parametrize("never", [[PAD, BOS], [PAD], []])
@pytest.mark.parametrize("rows_per_block", [1, 4, 100])
def test_output_loss_equals_token_loss_and_its_gradients(monkeypatch, eps, never, rows_per_block):
    features, proj, tgt_out = random_batch(0)
    monkeypatch.setattr(loss_module, "BLOCK_ELEMENTS", rows_per_block * proj.out_features)
    inputs = (features, proj.weight, proj.bias)
    got = output_loss(features, proj, tgt_out, PAD, eps, never)
    got_grads = torch.autograd.grad(3.5 * got, inputs)  # an incoming gradient other than 1
    expected = token_loss(proj(features), tgt_out, PAD, eps, never)
    expected_grads = torch.autograd.grad(3.5 * expected, inputs)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    for name, a, b in zip(("features", "weight", "bias"), got_grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert (got_grads[0][0, 3:] == 0).all() and (got_grads[0][1, 4] == 0).all()  # padding: no gradient
    with torch.no_grad():
        torch.testing.assert_close(output_loss(features, proj, tgt_out, PAD, eps, never), expected)


@pytest.mark.parametrize("share_embeddings", [True, False])
def test_a_models_gradients_through_output_loss_equal_those_through_its_logits(share_embeddings):
    """The training path (features, then output_loss) against the plain one (logits, then token_loss), on
    every parameter: the tied embedding / projection matrix gets both of its gradients."""
    torch.manual_seed(0)
    config = ModelConfig(d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=2, dropout=0.0,
                         share_embeddings=share_embeddings)  # fmt: skip
    variant = VariantConfig(output_bias=not share_embeddings)  # the output layer's bias gets its gradient
    model = VariantTransformer(config, variant, 13, 13, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    src, tgt_in = torch.randint(3, 13, (4, 7)), torch.randint(3, 13, (4, 6))
    tgt_out = torch.cat([tgt_in[:, 1:], torch.full((4, 1), EOS)], dim=1)
    tgt_out[2, 3:] = PAD
    grads = []
    for loss in (
        output_loss(model(src, tgt_in, project=False), model.output_proj, tgt_out, PAD, 0.1, [PAD, BOS]),
        token_loss(model(src, tgt_in), tgt_out, PAD, 0.1, [PAD, BOS]),
    ):
        grads.append(
            dict(
                zip(
                    [n for n, _ in model.named_parameters()],
                    torch.autograd.grad(loss, list(model.parameters())),
                    strict=True,
                )
            )
        )
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-6, msg=name)
    (projection,) = [n for n, p in model.named_parameters() if p is model.output_proj.weight]
    assert grads[0][projection].abs().sum() > 0


def test_under_bf16_autocast_it_follows_the_models_precision():
    features, proj, tgt_out = random_batch(2, D=64, V=50)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = output_loss(features, proj, tgt_out, PAD, 0.1, [PAD])
        (grad,) = torch.autograd.grad(got, features)
        expected = token_loss(proj(features), tgt_out, PAD, 0.1, [PAD])
        (expected_grad,) = torch.autograd.grad(expected, features)
    assert grad.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=0.05, atol=0.02)
    fp32 = output_loss(features, proj, tgt_out, PAD, 0.1, [PAD])
    assert fp32 != got  # the matmuls did run in bf16


def test_under_bf16_autocast_weight_and_bias_gradients_match_the_logits_path(monkeypatch):
    """Several blocks of rows: the weight gradient is made once from every block's gradient."""
    monkeypatch.setattr(loss_module, "BLOCK_ELEMENTS", 4 * 50)  # 4 rows a block
    features, proj, tgt_out = random_batch(4, B=4, T=6, D=64, V=50)
    inputs = (features, proj.weight, proj.bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = torch.autograd.grad(output_loss(features, proj, tgt_out, PAD, 0.1, [PAD]), inputs)
        expected = torch.autograd.grad(token_loss(proj(features), tgt_out, PAD, 0.1, [PAD]), inputs)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0.05, atol=0.02)


def test_under_bf16_autocast_the_weight_is_cast_once_for_all_blocks(monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountWeightCasts(TorchDispatchMode):
        def __init__(self, shape):
            super().__init__()
            self.shape, self.casts = shape, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
                self.casts += any(isinstance(a, torch.Tensor) and a.shape == self.shape for a in args)
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(loss_module, "BLOCK_ELEMENTS", 4 * 50)  # 4 rows a block: 6 blocks
    features, proj, tgt_out = random_batch(5, B=4, T=6, D=64, V=50)
    counter = CountWeightCasts(proj.weight.shape)
    with torch.autocast("cpu", dtype=torch.bfloat16), counter:
        output_loss(features, proj, tgt_out, PAD, 0.1, [PAD]).backward()
    assert counter.casts == 1  # to bf16, once (before: once for each of the 6 blocks)


def test_a_float64_model_gets_float64_gradients_equal_to_token_losss():
    features, proj, tgt_out = random_batch(3)
    features, proj = features.detach().double().requires_grad_(), proj.double()
    inputs = (features, proj.weight, proj.bias)
    got_grads = torch.autograd.grad(output_loss(features, proj, tgt_out, PAD, 0.1, [PAD]), inputs)
    expected_grads = torch.autograd.grad(token_loss(proj(features), tgt_out, PAD, 0.1, [PAD]), inputs)
    for a, b in zip(got_grads, expected_grads, strict=True):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the log-probabilities are fp32 in both
