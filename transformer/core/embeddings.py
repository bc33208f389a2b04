"""Token embeddings scaled by √d_model (§3.4) and sinusoidal positional encoding (§3.5)."""

import math

import torch
from torch import nn


class TokenEmbedding(nn.Module):
    """ids (B, T) -> vectors (B, T, D), multiplied by √D so they are not drowned by the positions."""

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)

    @property
    def weight(self) -> nn.Parameter:
        return self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids) * self.scale  # (B, T, D)


def sinusoidal_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)). -> (P, D)."""
    position = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (D/2,)
    table = torch.zeros(n_positions, d_model, dtype=torch.float64)  # (P, D)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table.float()


class PositionalEncoding(nn.Module):
    """Adds the sinusoid of each position, starting at ``start`` (> 0 in incremental decoding)."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        table = sinusoidal_positions(max_positions, d_model)  # (P, D)
        self.register_buffer("table", table, persistent=False)

    def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
        T = x.size(1)
        if start + T > self.table.size(0):
            raise ValueError(
                f"sequence of {start + T} positions exceeds model.max_positions={self.table.size(0)}"
            )
        return x + self.table[start : start + T].to(x.dtype)  # (B, T, D)
