"""Scaled dot-product attention (Eq. 1, §3.2.1) and multi-head attention (§3.2.2), by hand.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V

Masks are boolean, True = may attend (see ``masks.py``), applied to the scores before the softmax. An
additive float mask (0 = attend, -inf = blocked, finite numbers added to the scores, the form of PyTorch's
``nn.Transformer.generate_square_subsequent_mask``) is accepted too, with ``F.scaled_dot_product_attention``'s
meaning. A query whose keys are ALL masked gets zero weights and a zero output, never NaN (docs/attention.md,
"A fully masked row", says why; the batches the project builds never have one).

Shapes: B batch, H heads, Tq query length, Tk key length, D d_model, Dh head size (D / H).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def attention_weights(
    query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """softmax(Q Kᵀ / √d_k) of Eq. 1: (..., Tq, Dk), (..., Tk, Dk) -> weights (..., Tq, Tk).

    ``mask``: broadcastable to (..., Tq, Tk); bool, True = attend, or float, added to the scores (-inf =
    blocked).
    """
    scale = 1.0 / math.sqrt(query.size(-1))
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale  # (..., Tq, Tk)
    if mask is not None and mask.dtype != torch.bool:  # additive: its -inf entries become the bool mask
        blocked = torch.isneginf(mask)  # (..., Tq, Tk)
        scores = scores + mask.masked_fill(blocked, 0.0)  # (..., Tq, Tk), the finite part added
        mask = ~blocked
    if mask is None:
        return torch.softmax(scores, dim=-1)  # (..., Tq, Tk)
    # The most negative finite number rather than -inf: a masked key gets exactly zero weight, and a
    # fully masked row softmaxes to a uniform row instead of 0/0 = NaN (also in fp16/bf16)...
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., Tq, Tk)
    # ...which is then zeroed: on the CPU (no device sync to ask) only when there is one, unless compiled
    fully_masked = ~mask.any(dim=-1, keepdim=True)  # (..., Tq | 1, 1)
    if weights.device.type != "cpu" or torch.compiler.is_compiling() or bool(fully_masked.any()):
        weights = weights.masked_fill(fully_masked, 0.0)
    return weights


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1 on (..., Tq, Dk), (..., Tk, Dk), (..., Tk, Dv) -> (output (..., Tq, Dv), weights (..., Tq, Tk)).

    ``mask``: see ``attention_weights``. ``dropout`` drops attention weights (training only; the caller
    passes 0.0 in eval mode).
    """
    weights = attention_weights(query, key, mask)  # (..., Tq, Tk)
    if dropout > 0.0:
        weights = F.dropout(weights, dropout)
    return torch.matmul(weights, value), weights  # (..., Tq, Dv), (..., Tq, Tk)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, Dh): view the last dim as H heads, THEN move heads before time."""
    B, T, D = x.shape
    return x.view(B, T, n_heads, D // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, Dh) -> (B, T, D), the inverse of ``split_heads``."""
    B, H, T, Dh = x.shape
    return x.transpose(1, 2).reshape(B, T, H * Dh)  # (B, T, D)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The three input projections are stored as one (3D, D) matrix ``qkv_proj`` (rows: Q, then K, then V,
    the packing of ``nn.MultiheadAttention.in_proj_weight``), so self-attention is one matmul.
    When ``query is key is value`` the projection is one matmul; the math is the same either way.

    Incremental decoding: pass a dict as ``cache``. A self-attention module (``self_attention=True``)
    appends this step's keys/values to ``cache["k"]``, ``cache["v"]``; a cross-attention module computes
    the memory's keys/values on the first call and reuses them afterwards. The module owns its cache's
    layout: a search that reorders its hypotheses or drops finished sentences calls ``select_cache_rows``.
    """

    # whether beam search's K beams of a sentence may attend to one copy of its memory (this module: no,
    # the memory and its keys / values are repeated K times)
    beams_share_memory = False

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, self_attention: bool = True):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, dropout
        self.self_attention = self_attention
        self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        nn.init.xavier_uniform_(self.qkv_proj.weight)
        nn.init.zeros_(self.qkv_proj.bias)
        nn.init.zeros_(self.out_proj.bias)

    def input_projection(self, x: torch.Tensor, part: slice) -> torch.Tensor:
        """x (B, T, D) -> (B, T, rows in ``part``): the rows ``part`` of the packed projection (Q: 0 to D,
        K: D to 2D, V: 2D to 3D)."""
        return F.linear(x, self.qkv_proj.weight[part], self.qkv_proj.bias[part])

    def extend_cache(
        self, cache: dict, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The past tokens' keys / values (B, H, T, Dh) in ``cache``, then this step's (B, H, 1, Dh)."""
        return torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)  # (B, H, T + 1, Dh) each

    def select_cache_rows(self, cache: dict, rows: torch.Tensor) -> None:
        """Keep (and reorder) the batch rows ``rows`` (B',) of this module's ``cache``, in place."""
        cache["k"] = cache["k"].index_select(0, rows)  # (B', H, T, Dh)
        cache["v"] = cache["v"].index_select(0, rows)  # (B', H, T, Dh)

    def cached_memory(self, cache: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """A cross-attention module's memory keys / values (B, H, S, Dh), computed on the first step."""
        return cache["k"], cache["v"]  # 2 × (B, H, S, Dh)

    def attend(self, q, k, v, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 1 on every head at once, with dropout on the weights in training."""
        return scaled_dot_product_attention(q, k, v, mask, self.dropout if self.training else 0.0)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Tq, D), key/value (B, Tk, D), mask (B|1, 1|H, Tq|1, Tk): bool, True = attend, or float.

        Returns (output (B, Tq, D), per-head weights (B, H, Tq, Tk)).
        """
        H, D = self.n_heads, self.d_model
        if query is key and key is value:  # one fused projection
            q, k, v = self.qkv_proj(query).chunk(3, dim=-1)  # 3 × (B, Tq, D)
            q, k, v = (split_heads(x, H) for x in (q, k, v))  # 3 × (B, H, Tq, Dh)
        else:
            q = split_heads(self.input_projection(query, slice(0, D)), H)  # (B, H, Tq, Dh)
            if cache is not None and not self.self_attention and "k" in cache:
                k, v = self.cached_memory(cache)  # 2 × (B, H, S, Dh)
            elif key is value:
                k, v = self.input_projection(key, slice(D, 3 * D)).chunk(2, dim=-1)  # 2 × (B, Tk, D)
                k, v = split_heads(k, H), split_heads(v, H)  # 2 × (B, H, Tk, Dh)
            else:
                k = split_heads(self.input_projection(key, slice(D, 2 * D)), H)  # (B, H, Tk, Dh)
                v = split_heads(self.input_projection(value, slice(2 * D, 3 * D)), H)  # (B, H, Tk, Dh)
        if cache is not None:
            if self.self_attention and "k" in cache:  # the past target tokens, then this step's
                k, v = self.extend_cache(cache, k, v)  # 2 × (B, H, Tk, Dh)
            cache["k"], cache["v"] = k, v
        out, weights = self.attend(q, k, v, mask)  # (B, H, Tq, Dh), (B, H, Tq, Tk)
        return self.out_proj(merge_heads(out)), weights  # (B, Tq, D), (B, H, Tq, Tk)
