"""Our modules beside PyTorch's reference implementations: copy our weights into ``nn.MultiheadAttention`` /
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` and measure the largest difference.

The oracle of the parity tests (tests/core/test_attention.py, tests/core/test_stacks.py), of the lessons
and of ``bench/parity.py``: a module of the package, so that each imports it as it is.
PyTorch's masks mean the opposite of ours (True = blocked): they are translated here, at the boundary.
"""

import torch
import torch.nn.functional as F
from torch import nn

from transformer.core.attention import MultiHeadAttention
from transformer.core.layers import DecoderLayer, EncoderLayer
from transformer.core.masks import causal_mask, decoder_self_mask, padding_mask

D, H, FF, N = 32, 4, 64, 3  # sizes of the stacks compared by build_stacks


def copy_attention(ours, theirs: torch.nn.MultiheadAttention) -> None:
    """Our fused (3D, D) qkv_proj has nn.MultiheadAttention's in_proj packing: rows Q, K, V."""
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.qkv_proj.weight)
        theirs.in_proj_bias.copy_(ours.qkv_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)  # nn.Linear stores (out, in) on both sides
        theirs.out_proj.bias.copy_(ours.out_proj.bias)


def copy_norm(ours: torch.nn.LayerNorm, theirs: torch.nn.LayerNorm) -> None:
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)


def copy_ffn(ours, theirs) -> None:
    with torch.no_grad():
        theirs.linear1.weight.copy_(ours.linear1.weight)
        theirs.linear1.bias.copy_(ours.linear1.bias)
        theirs.linear2.weight.copy_(ours.linear2.weight)
        theirs.linear2.bias.copy_(ours.linear2.bias)


def copy_encoder_layer(ours, theirs: torch.nn.TransformerEncoderLayer) -> None:
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_ffn(ours.ffn, theirs)
    copy_norm(ours.self_attn_norm, theirs.norm1)
    copy_norm(ours.ffn_norm, theirs.norm2)


def copy_decoder_layer(ours, theirs: torch.nn.TransformerDecoderLayer) -> None:
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_attention(ours.cross_attn, theirs.multihead_attn)
    copy_ffn(ours.ffn, theirs)
    copy_norm(ours.self_attn_norm, theirs.norm1)
    copy_norm(ours.cross_attn_norm, theirs.norm2)
    copy_norm(ours.ffn_norm, theirs.norm3)


def random_qkv(batch, heads, n_q, n_k, d_k, d_v, dtype, requires_grad=False):
    shape = lambda n, d: (*batch, heads, n, d)  # noqa: E731
    return tuple(
        torch.randn(shape(n, d), dtype=dtype, requires_grad=requires_grad)
        for n, d in ((n_q, d_k), (n_k, d_k), (n_k, d_v))
    )


def random_padding_mask(batch: int, n_k: int) -> torch.Tensor:
    """(B, 1, 1, Tk) True = attend, each row with a different number of real keys (at least one)."""
    lengths = torch.randint(1, n_k + 1, (batch,))
    return (torch.arange(n_k)[None, :] < lengths[:, None])[:, None, None, :]


def max_diff_vs_reference(attention_fn, dtype=torch.float64, mask_kind="padding") -> float:
    """Largest |ours - F.scaled_dot_product_attention| over several shapes (Tq != Tk included)."""
    worst = 0.0
    for B, H, n_q, n_k, d_k, d_v in [(2, 3, 5, 7, 8, 8), (1, 1, 4, 4, 16, 4), (3, 4, 9, 6, 32, 16)]:
        q, k, v = random_qkv((B,), H, n_q, n_k, d_k, d_v, dtype)
        if mask_kind == "none":
            mask = None
        elif mask_kind == "causal":
            n_k = n_q
            q, k, v = random_qkv((B,), H, n_q, n_q, d_k, d_v, dtype)
            mask = causal_mask(n_q)
        elif mask_kind == "random":
            mask = torch.rand(B, H, n_q, n_k) > 0.3
            mask[..., 0] = True  # keep every row attendable (the reference gives NaN otherwise)
        else:
            mask = random_padding_mask(B, n_k)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out, _ = attention_fn(q, k, v, mask)
        worst = max(worst, (out - expected).abs().max().item())
    return worst


def mha_max_diff_vs_torch(d_model=32, n_heads=4) -> float:
    """Self-attention (causal + key padding) and cross-attention (key padding), outputs and weights."""
    ours = MultiHeadAttention(d_model, n_heads)
    theirs = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    copy_attention(ours, theirs)
    B, T, S = 3, 6, 8
    x, memory = torch.randn(B, T, d_model), torch.randn(B, S, d_model)
    tgt_tokens = torch.randint(1, 9, (B, T))
    tgt_tokens[1, 4:] = 0  # padding at the end of sentence 1
    src_tokens = torch.randint(1, 9, (B, S))
    src_tokens[0, 5:] = 0
    worst = 0.0
    # self-attention: ours True = attend; PyTorch's attn_mask / key_padding_mask True = BLOCKED
    out, w = ours(x, x, x, causal_mask(T) & padding_mask(tgt_tokens, 0))
    ref, ref_w = theirs(
        x, x, x,
        attn_mask=~causal_mask(T),
        key_padding_mask=tgt_tokens == 0,
        need_weights=True,
        average_attn_weights=False,
    )  # fmt: skip
    worst = max(worst, (out - ref).abs().max().item(), (w - ref_w).abs().max().item())
    # cross-attention: queries from x, keys/values from memory
    out, w = ours(x, memory, memory, padding_mask(src_tokens, 0))
    ref, ref_w = theirs(x, memory, memory, key_padding_mask=src_tokens == 0, average_attn_weights=False)
    worst = max(worst, (out - ref).abs().max().item(), (w - ref_w).abs().max().item())
    # distinct key and value tensors
    other = torch.randn(B, S, d_model)
    out, w = ours(x, memory, other)
    ref, ref_w = theirs(x, memory, other, average_attn_weights=False)
    return max(worst, (out - ref).abs().max().item(), (w - ref_w).abs().max().item())


def tokens_with_padding(B: int, T: int, lengths: list[int]) -> torch.Tensor:
    tokens = torch.randint(1, 20, (B, T))
    for row, length in enumerate(lengths):
        tokens[row, length:] = 0
    return tokens


def build_stacks(norm_first: bool):
    ours_enc = nn.ModuleList(EncoderLayer(D, H, FF, 0.0, norm_first) for _ in range(N))
    ours_dec = nn.ModuleList(DecoderLayer(D, H, FF, 0.0, norm_first) for _ in range(N))
    ref_enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(D, H, FF, 0.0, batch_first=True, norm_first=norm_first),
        N,
        norm=nn.LayerNorm(D) if norm_first else None,
        enable_nested_tensor=False,
    )
    ref_dec = nn.TransformerDecoder(
        nn.TransformerDecoderLayer(D, H, FF, 0.0, batch_first=True, norm_first=norm_first),
        N,
        norm=nn.LayerNorm(D) if norm_first else None,
    )
    for ours, theirs in zip(ours_enc, ref_enc.layers):
        copy_encoder_layer(ours, theirs)
    for ours, theirs in zip(ours_dec, ref_dec.layers):
        copy_decoder_layer(ours, theirs)
    final_norms = (nn.LayerNorm(D), nn.LayerNorm(D))
    if norm_first:  # our stacks end with a final LayerNorm in pre-norm, like the reference's `norm`
        for ours, theirs in zip(final_norms, (ref_enc.norm, ref_dec.norm)):
            nn.init.normal_(ours.weight)
            nn.init.normal_(ours.bias)
            copy_norm(ours, theirs)
    return ours_enc, ours_dec, ref_enc, ref_dec, final_norms


def stacks_max_diff(norm_first: bool) -> tuple[float, float]:
    ours_enc, ours_dec, ref_enc, ref_dec, (enc_norm, dec_norm) = build_stacks(norm_first)
    src, tgt = tokens_with_padding(3, 7, [7, 4, 2]), tokens_with_padding(3, 6, [6, 6, 3])
    x_src, x_tgt = torch.randn(3, 7, 32), torch.randn(3, 6, 32)
    memory = x_src
    for layer in ours_enc:
        memory, _ = layer(memory, padding_mask(src, 0))
    memory = enc_norm(memory) if norm_first else memory
    ref_memory = ref_enc(x_src, src_key_padding_mask=src == 0)
    out = x_tgt
    for layer in ours_dec:
        out, _, _ = layer(out, memory, decoder_self_mask(tgt, 0), padding_mask(src, 0))
    out = dec_norm(out) if norm_first else out
    ref_out = ref_dec(
        x_tgt, ref_memory, tgt_mask=~causal_mask(6), tgt_key_padding_mask=tgt == 0,
        memory_key_padding_mask=src == 0,
    )  # fmt: skip
    return (memory - ref_memory).abs().max().item(), (out - ref_out).abs().max().item()
