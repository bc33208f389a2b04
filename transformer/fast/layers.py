"""The feed-forward network for the fast tier: ``FeedForward`` (the same parameters) whose ReLU and dropout
share one random mask (``dropout.relu_dropout``): the same numbers, and one 1-byte mask kept for the
backward pass instead of ReLU's output and dropout's mask."""

import torch
from torch import nn

from transformer.core.layers import FeedForward
from transformer.fast.dropout import relu_dropout


class FastFeedForward(FeedForward):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(self.activation) is not nn.ReLU:
            return super().forward(x)  # GELU / swish: the plain network (with the fast tier's dropout)
        hidden = relu_dropout(self.linear1(x), self.dropout.p, self.training)  # (B, T, F)
        return self.linear2(hidden)  # (B, T, D)
