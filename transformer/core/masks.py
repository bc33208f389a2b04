"""Attention masks: the ONLY place the mask convention lives (§3.2.3).

Convention (the one of ``F.scaled_dot_product_attention``): a boolean mask, ``True`` = the query
MAY attend to this key. Masks are returned already broadcastable to the scores' shape (B, H, Tq, Tk).
"""

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Keys that are padding are never attended. tokens: (B, Tk) -> (B, 1, 1, Tk) bool, True = attend."""
    return (tokens != pad_id)[:, None, None, :]  # (B, 1, 1, Tk)


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """Query i sees keys j <= i (no peeking at the future). -> (T, T) bool, True = attend."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()  # (T, T)


def decoder_self_mask(tgt_in: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Causal AND key padding, for decoder self-attention. tgt_in: (B, T) -> (B, 1, T, T) bool.

    Position 0 holds the decoder start token, never padding (padding is on the right), so it is always
    attended, whatever id the start token has.
    """
    T = tgt_in.size(1)
    keys = tgt_in != pad_id  # (B, T)
    keys[:, :1] = True  # the start token
    return causal_mask(T, tgt_in.device) & keys[:, None, None, :]  # (B, 1, T, T)
