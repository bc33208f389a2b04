"""Encoder and decoder stacks against nn.TransformerEncoder / nn.TransformerDecoder with copied weights."""

import pytest
import torch

from transformer.core.config import ModelConfig
from transformer.core.layers import EncoderLayer
from transformer.core.masks import causal_mask, decoder_self_mask, padding_mask
from transformer.reference.pytorch_oracle import FF, D, H, build_stacks, tokens_with_padding


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_match_torch(norm_first):
    ours_enc, ours_dec, ref_enc, ref_dec, (enc_norm, dec_norm) = build_stacks(norm_first)
    B, S, T = 3, 7, 6
    src = tokens_with_padding(B, S, [7, 4, 2])
    tgt = tokens_with_padding(B, T, [6, 6, 3])
    x_src, x_tgt = torch.randn(B, S, D), torch.randn(B, T, D)

    memory = x_src
    for layer in ours_enc:
        memory, _ = layer(memory, padding_mask(src, 0))
    if norm_first:
        memory = enc_norm(memory)
    ref_memory = ref_enc(x_src, src_key_padding_mask=src == 0)  # PyTorch: True = padding
    assert (memory - ref_memory).abs().max() < 1e-5

    out = x_tgt
    for layer in ours_dec:
        out, _, _ = layer(out, memory, decoder_self_mask(tgt, 0), padding_mask(src, 0))
    if norm_first:
        out = dec_norm(out)
    ref_out = ref_dec(
        x_tgt,
        ref_memory,
        tgt_mask=~causal_mask(T),  # PyTorch: True = blocked
        tgt_key_padding_mask=tgt == 0,
        memory_key_padding_mask=src == 0,
    )
    assert (out - ref_out).abs().max() < 1e-5


def test_layer_norm_placement_differs():
    """Pre-norm and post-norm really are different computations (the flag is not ignored)."""
    torch.manual_seed(0)
    post = EncoderLayer(D, H, FF, 0.0, norm_first=False)
    pre = EncoderLayer(D, H, FF, 0.0, norm_first=True)
    pre.load_state_dict(post.state_dict())
    x = torch.randn(2, 5, D)
    assert (post(x, None)[0] - pre(x, None)[0]).abs().max() > 1e-2


def test_invalid_sizes_name_the_value():
    with pytest.raises(ValueError, match=r"model.d_model=100 is not divisible by model.n_heads=8"):
        ModelConfig(d_model=100, n_heads=8)
    with pytest.raises(ValueError, match=r"model.n_encoder_layers=0"):
        ModelConfig(n_encoder_layers=0)
    with pytest.raises(ValueError, match=r"model.dropout=1.5"):
        ModelConfig(dropout=1.5)
