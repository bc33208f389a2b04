"""Multi-head attention for the fast tier: ``MultiHeadAttention`` with four of its steps done faster, the
same numbers (tests/fast/test_fast_attention.py):

- ``attend``: dropout on the weights with the CPU's cheaper random mask (``dropout.py``);
- beam search's cross-attention: the K beams of each of n sentences attend to that sentence's one memory
  (``beams_attention``), without repeating its keys and values K times;
- ``select_cache_rows`` + ``extend_cache``: a search's choice of rows is kept in ``cache["rows"]`` and taken
  when the next step appends its keys / values, the self-attention cache one step longer in one copy
  (``append_step``) where ``index_select`` + ``cat`` make two;
- ``cached_memory``: the memory's keys / values, views of one fused projection on the first step, are
  stored contiguously from the second on, so that no later step copies them.
"""

import torch

from transformer.core.attention import MultiHeadAttention, attention_weights, scaled_dot_product_attention
from transformer.fast.dropout import dropout


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


class FastMultiHeadAttention(MultiHeadAttention):
    """``MultiHeadAttention`` (the same parameters), with the steps of the module docstring."""

    beams_share_memory = True

    def select_cache_rows(self, cache: dict, rows: torch.Tensor) -> None:
        if not self.self_attention:
            return super().select_cache_rows(cache, rows)
        # taken by the next step's append, composed with any rows selected since the last one
        cache["rows"] = rows if "rows" not in cache else cache["rows"][rows]  # (B',) each new row's past row

    def cached_memory(self, cache: dict) -> tuple[torch.Tensor, torch.Tensor]:
        if not cache["k"].is_contiguous():
            cache["k"], cache["v"] = cache["k"].contiguous(), cache["v"].contiguous()  # (B, H, S, Dh) each
        return cache["k"], cache["v"]  # 2 × (B, H, S, Dh)

    def extend_cache(
        self, cache: dict, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = cache.pop("rows", None)  # left by select_cache_rows
        return append_step(cache["k"], k, rows), append_step(cache["v"], v, rows)  # (B, H, T + 1, Dh) each

    def attend(self, q, k, v, mask) -> tuple[torch.Tensor, torch.Tensor]:
        if k.size(0) != q.size(0):  # beam search: a sentence's memory serves its K beams
            assert not self.training, "beams share a memory only in decoding"
            return beams_attention(q, k, v, mask)  # (n·K, H, 1, Dh), (n·K, H, 1, S)
        weights = attention_weights(q, k, mask)  # (B, H, Tq, Tk)
        if self.training and self.dropout > 0.0:
            weights = dropout(weights, self.dropout)
        return torch.matmul(weights, v), weights  # (B, H, Tq, Dh), (B, H, Tq, Tk)
