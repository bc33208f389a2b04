"""Shared test helpers: deterministic seeds and the PyTorch reference modules with our weights copied in."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
