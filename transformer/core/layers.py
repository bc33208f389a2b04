"""Feed-forward network (§3.3) and the encoder / decoder layers (§3.1) with residuals and LayerNorm.

Norm placement: POST-norm by default, as in the paper and ``nn.Transformer``:
    x = LayerNorm(x + Dropout(Sublayer(x)))
PRE-norm with ``norm_first=True`` (trains more stably in deep stacks; needs a final LayerNorm in the stack):
    x = x + Dropout(Sublayer(LayerNorm(x)))
"""

import torch
from torch import nn

from transformer.core.attention import MultiHeadAttention


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately. (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)
        self.activation = nn.ReLU()  # max(0, ·), a module of its own
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(self.activation(self.linear1(x)))  # (B, T, F)
        return self.linear2(hidden)  # (B, T, D)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped in dropout + residual + LayerNorm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, norm_first: bool):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.self_attn_norm = nn.LayerNorm(d_model)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, S, D), src_mask (B, 1, 1, S) -> (B, S, D), self-attention weights (B, H, S, S)."""
        if self.norm_first:
            h = self.self_attn_norm(x)  # (B, S, D)
            attn, weights = self.self_attn(h, h, h, src_mask)  # (B, S, D), (B, H, S, S)
            x = x + self.dropout(attn)  # (B, S, D)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))  # (B, S, D)
        else:
            attn, weights = self.self_attn(x, x, x, src_mask)  # (B, S, D), (B, H, S, S)
            x = self.self_attn_norm(x + self.dropout(attn))  # (B, S, D)
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))  # (B, S, D)
        return x, weights


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the memory, feed-forward; each with residual + norm."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, norm_first: bool):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout, self_attention=False)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.self_attn_norm = nn.LayerNorm(d_model)
        self.cross_attn_norm = nn.LayerNorm(d_model)
        self.ffn_norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        tgt_mask: torch.Tensor | None,
        src_mask: torch.Tensor | None,
        cache: dict[str, dict[str, torch.Tensor]] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D), memory (B, S, D), tgt_mask (B|1, 1, T, T), src_mask (B, 1, 1, S).

        ``cache``: {"self": {...}, "cross": {...}} for incremental decoding (see MultiHeadAttention).
        Returns (B, T, D), self-attention weights (B, H, T, T), cross-attention weights (B, H, T, S).
        """
        self_cache = cache["self"] if cache is not None else None
        cross_cache = cache["cross"] if cache is not None else None
        if self.norm_first:
            h = self.self_attn_norm(x)  # (B, T, D)
            attn, self_weights = self.self_attn(h, h, h, tgt_mask, self_cache)  # (B, T, D), (B, H, T, T)
            x = x + self.dropout(attn)  # (B, T, D)
            attn, cross_weights = self.cross_attn(
                self.cross_attn_norm(x), memory, memory, src_mask, cross_cache
            )  # (B, T, D), (B, H, T, S)
            x = x + self.dropout(attn)  # (B, T, D)
            x = x + self.dropout(self.ffn(self.ffn_norm(x)))  # (B, T, D)
        else:
            attn, self_weights = self.self_attn(x, x, x, tgt_mask, self_cache)  # (B, T, D), (B, H, T, T)
            x = self.self_attn_norm(x + self.dropout(attn))  # (B, T, D)
            attn, cross_weights = self.cross_attn(
                x, memory, memory, src_mask, cross_cache
            )  # (B, T, D), (B, H, T, S)
            x = self.cross_attn_norm(x + self.dropout(attn))  # (B, T, D)
            x = self.ffn_norm(x + self.dropout(self.ffn(x)))  # (B, T, D)
        return x, self_weights, cross_weights
