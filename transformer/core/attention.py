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

from transformer.core.dropout import dropout as dropout_fn


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1 on (..., Tq, Dk), (..., Tk, Dk), (..., Tk, Dv) -> (output (..., Tq, Dv), weights (..., Tq, Tk)).

    ``mask``: broadcastable to (..., Tq, Tk); bool, True = attend, or float, added to the scores (-inf =
    blocked). ``dropout`` drops attention weights (training only; the caller passes 0.0 in eval mode).
    """
    scale = 1.0 / math.sqrt(query.size(-1))
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale  # (..., Tq, Tk)
    if mask is not None and mask.dtype != torch.bool:  # additive: its -inf entries become the bool mask
        blocked = torch.isneginf(mask)  # (..., Tq, Tk)
        scores = scores + mask.masked_fill(blocked, 0.0)  # (..., Tq, Tk), the finite part added
        mask = ~blocked
    if mask is None:
        weights = torch.softmax(scores, dim=-1)  # (..., Tq, Tk)
    else:
        # The most negative finite number rather than -inf: a masked key gets exactly zero weight, and a
        # fully masked row softmaxes to a uniform row instead of 0/0 = NaN (also in fp16/bf16)...
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1)  # (..., Tq, Tk)
        # ...which is then zeroed. On the CPU, where asking costs no device sync, only when there is one.
        fully_masked = ~mask.any(dim=-1, keepdim=True)  # (..., Tq | 1, 1)
        if weights.device.type != "cpu" or bool(fully_masked.any()):
            weights = weights.masked_fill(fully_masked, 0.0)
    if dropout > 0.0:
        weights = dropout_fn(weights, dropout)
    return torch.matmul(weights, value), weights  # (..., Tq, Dv), (..., Tq, Tk)


def beams_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1 for beam search's cross-attention: the K beams of each of n sentences attend to that sentence's
    one memory, without repeating its keys and values K times. query (n·K, H, 1, Dh), rows sentence-major;
    key / value (n, H, S, Dh); mask (n, 1, 1, S). -> (output (n·K, H, 1, Dh), weights (n·K, H, 1, S)):
    as ``scaled_dot_product_attention`` with key, value and mask repeated per beam."""
    (n, H, S, Dh), K = key.shape, query.size(0) // key.size(0)
    query = query.reshape(n, K, H, Dh).transpose(1, 2)  # (n, H, K, Dh): a sentence's beams as K queries
    out, weights = scaled_dot_product_attention(query, key, value, mask)  # (n, H, K, Dh), (n, H, K, S)
    return out.transpose(1, 2).reshape(n * K, H, 1, Dh), weights.transpose(1, 2).reshape(n * K, H, 1, S)


def append_step(past: torch.Tensor, new: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """The self-attention cache one step longer: past (B', H, T, Dh), new (B, H, 1, Dh) -> (B, H, T + 1, Dh).

    ``rows`` (B,) long: row b continues past's row ``rows[b]`` (a search that reordered its hypotheses or
    dropped finished sentences); the selected rows are written straight into the longer tensor, one copy
    where ``index_select`` + ``cat`` would make two. None: past's rows as they are (B' = B).
    """
    if rows is not None and rows.numel() != new.size(0):
        raise ValueError(f"{rows.numel()} cache rows selected for a step of {new.size(0)} rows")
    if rows is None:
        return torch.cat([past, new], dim=2)  # (B, H, T + 1, Dh)
    if torch.is_grad_enabled() and (past.requires_grad or new.requires_grad):  # out= has no backward
        return torch.cat([past.index_select(0, rows), new], dim=2)  # (B, H, T + 1, Dh)
    B, H, T, Dh = new.size(0), past.size(1), past.size(2), past.size(3)
    longer = new.new_empty(B, H, T + 1, Dh)
    torch.index_select(past, 0, rows, out=longer[:, :, :T])  # (B, H, T, Dh) the rows, reordered
    longer[:, :, T:] = new
    return longer


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
    appends this step's keys/values to ``cache["k"]``, ``cache["v"]``, after taking (and removing) the
    rows ``cache["rows"]`` of the past ones when a search left it there; a cross-attention module computes
    the memory's keys/values on the first call and reuses them afterwards.
    """

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

    def project(self, x: torch.Tensor, part: slice) -> torch.Tensor:
        """x (B, T, D) -> (B, T, rows in ``part``): the rows ``part`` of the packed projection (Q: 0 to D,
        K: D to 2D, V: 2D to 3D). A quantized copy replaces it (``quantize.py``)."""
        return F.linear(x, self.qkv_proj.weight[part], self.qkv_proj.bias[part])

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
            q = split_heads(self.project(query, slice(0, D)), H)  # (B, H, Tq, Dh)
            if cache is not None and not self.self_attention and "k" in cache:
                k, v = cache["k"], cache["v"]  # the memory's keys/values, computed on the first step
            elif key is value:
                k, v = self.project(key, slice(D, 3 * D)).chunk(2, dim=-1)  # 2 × (B, Tk, D)
                k, v = split_heads(k, H), split_heads(v, H)  # 2 × (B, H, Tk, Dh)
            else:
                k = split_heads(self.project(key, slice(D, 2 * D)), H)  # (B, H, Tk, Dh)
                v = split_heads(self.project(value, slice(2 * D, 3 * D)), H)  # (B, H, Tk, Dh)
        if cache is not None:
            if self.self_attention and "k" in cache:  # the past target tokens, then this step's
                rows = cache.pop("rows", None)  # left by a search that reordered or dropped rows
                k = append_step(cache["k"], k, rows)  # (B, H, Tk, Dh)
                v = append_step(cache["v"], v, rows)  # (B, H, Tk, Dh)
            cache["k"], cache["v"] = k, v
        if k.size(0) != q.size(0):  # beam search: a sentence's memory serves its K beams (decoding.py)
            assert not self.training, "beams share a memory only in decoding"
            out, weights = beams_attention(q, k, v, mask)  # (B, H, 1, Dh)
        else:
            dropout = self.dropout if self.training else 0.0
            out, weights = scaled_dot_product_attention(q, k, v, mask, dropout)  # (B, H, Tq, Dh)
        return self.out_proj(merge_heads(out)), weights  # (B, Tq, D), (B, H, Tq, Tk)
