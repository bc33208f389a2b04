"""The training loss: ``token_loss`` (the definition, on logits) against PyTorch's label smoothing."""

import torch
import torch.nn.functional as F

from transformer.core.loss import token_loss

PAD, BOS, EOS = 0, 2, 1


def random_batch(seed, B=3, T=5, D=6, V=11):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(B, T, D, generator=generator, requires_grad=True)
    proj = torch.nn.Linear(D, V)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(V, D, generator=generator))
        proj.bias.copy_(torch.randn(V, generator=generator))
    tgt_out = torch.randint(3, V, (B, T), generator=generator)
    tgt_out[0, 3:] = PAD  # padding at the end of one row
    tgt_out[1, 4] = PAD
    return features, proj, tgt_out


def test_token_loss_without_never_produced_is_pytorchs_label_smoothing():
    features, proj, tgt_out = random_batch(1)
    logits = proj(features)
    expected = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, label_smoothing=0.1,
                               reduction="sum")  # fmt: skip
    torch.testing.assert_close(token_loss(logits, tgt_out, PAD, 0.1), expected, rtol=1e-6, atol=0)
