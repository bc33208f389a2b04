"""The training loss: ``token_loss`` (the definition, on logits) against PyTorch's label smoothing."""

import torch
import torch.nn.functional as F
from helpers import PAD, random_batch

from transformer.core.loss import token_loss


def test_token_loss_without_never_produced_is_pytorchs_label_smoothing():
    features, proj, tgt_out = random_batch(1)
    logits = proj(features)
    expected = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD, label_smoothing=0.1,
                               reduction="sum")  # fmt: skip
    torch.testing.assert_close(token_loss(logits, tgt_out, PAD, 0.1), expected, rtol=1e-6, atol=0)
