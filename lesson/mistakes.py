"""The eight classic attention mistakes, written on purpose, for the lesson and the released-model script.

The package's attention (``transformer/core/attention.py``) stays correct; these functions redo its work
with one
mistake patched in, so that a reader can see the size of each error beside the right answer:

    no_scale             scores not divided by √d_k
    sqrt_d_model         divided by √D (the model width) instead of √d_k (the head size)
    mask_after_softmax   softmax first, then the masked weights set to 0 (rows no longer sum to 1)
    mask_with_zero       masked scores set to 0 instead of -inf (e^0 = 1: the future still gets weight)
    split_no_transpose   heads split by a plain reshape to (B, H, T, Dh): tokens and features mixed
    merge_no_transpose   heads merged by a plain reshape to (B, T, D), without the transpose back
    flipped_mask         True read as "blocked" (nn.MultiheadAttention's convention) in a True = "attend" API
    causal_everywhere    a causal mask in the encoder and in cross-attention, where only the decoder's
                         self-attention may have one

Masked scores get the dtype's most negative number (the package's choice), so a row the mistake leaves
fully masked gives a uniform row instead of NaN and its size of error stays a number.
"""

import math

import torch
import torch.nn.functional as F

from transformer.core.attention import MultiHeadAttention, merge_heads, split_heads

MISTAKES = {
    "no_scale": "no 1/√d_k",
    "sqrt_d_model": "√D, not √d_k",
    "mask_after_softmax": "mask after softmax",
    "mask_with_zero": "mask with 0",
    "split_no_transpose": "split w/o transpose",
    "merge_no_transpose": "merge w/o transpose",
    "flipped_mask": "flipped mask",
    "causal_everywhere": "causal enc/cross",
}


def split_no_transpose(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.reshape(B, n_heads, T, D // n_heads)  # (B, H, T, Dh): each "head" holds pieces of several tokens


def merge_no_transpose(x: torch.Tensor) -> torch.Tensor:
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)  # (B, T, D): each "token" holds pieces of several tokens


def attend(q, k, v, mask=None, mistake: str | None = None, scale_dim: int | None = None):
    """Eq. 1 with ``mistake`` (None: done right) -> (output (..., Tq, Dv), weights (..., Tq, Tk)).

    ``mask``: bool, True = attend. ``scale_dim``: the width √ of which the scores are divided by when the
    mistake is ``sqrt_d_model`` (the model width D).
    """
    scores = q @ k.transpose(-2, -1)  # (..., Tq, Tk)
    if mistake == "sqrt_d_model":
        scores = scores / math.sqrt(scale_dim)
    elif mistake != "no_scale":
        scores = scores / math.sqrt(q.size(-1))
    if mask is not None and mistake == "flipped_mask":
        mask = ~mask
    if mask is None:
        weights = torch.softmax(scores, dim=-1)
    elif mistake == "mask_after_softmax":
        weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)  # not renormalised
    elif mistake == "mask_with_zero":
        weights = torch.softmax(scores.masked_fill(~mask, 0.0), dim=-1)  # e^0 = 1, not 0
    else:
        weights = torch.softmax(scores.masked_fill(~mask, torch.finfo(scores.dtype).min), dim=-1)
    return weights @ v, weights  # (..., Tq, Dv), (..., Tq, Tk)


def block_mask(mask: torch.Tensor | None, kind: str, n_queries: int, n_keys: int, mistake: str | None):
    """The mask a block of ``kind`` (encoder | decoder | cross) gets: with ``causal_everywhere`` the
    encoder's and the cross-attention's get a causal triangle too (query i sees keys j <= i)."""
    if mistake != "causal_everywhere" or kind == "decoder":
        return mask
    causal = torch.ones(n_queries, n_keys, dtype=torch.bool).tril()  # (Tq, Tk)
    return causal if mask is None else mask & causal


def multi_head_with(block: MultiHeadAttention, query, key, mask, kind: str, mistake: str | None = None):
    """``block``'s multi-head attention, done right (``mistake=None``) or with one mistake.

    query (B, Tq, D), key = value (B, Tk, D); mask bool (True = attend) broadcastable to (B, H, Tq, Tk);
    kind: encoder | decoder | cross. -> (output (B, Tq, D), weights (B, H, Tq, Tk)).
    """
    H, D = block.n_heads, block.d_model
    w, b = block.qkv_proj.weight, block.qkv_proj.bias
    split = split_no_transpose if mistake == "split_no_transpose" else split_heads
    merge = merge_no_transpose if mistake == "merge_no_transpose" else merge_heads
    q = split(F.linear(query, w[:D], b[:D]), H)  # (B, H, Tq, Dh)
    k = split(F.linear(key, w[D : 2 * D], b[D : 2 * D]), H)  # (B, H, Tk, Dh)
    v = split(F.linear(key, w[2 * D :], b[2 * D :]), H)  # (B, H, Tk, Dh)
    mask = block_mask(mask, kind, query.size(1), key.size(1), mistake)
    heads, weights = attend(q, k, v, mask, mistake, scale_dim=D)  # (B, H, Tq, Dh), (B, H, Tq, Tk)
    return block.out_proj(merge(heads)), weights  # (B, Tq, D), (B, H, Tq, Tk)
