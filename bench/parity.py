"""Largest differences between our modules and PyTorch's references, as pinned by the tests.

python bench/parity.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_attention import max_diff_vs_reference, mha_max_diff_vs_torch  # noqa: E402
from test_stacks import build_stacks, tokens_with_padding  # noqa: E402

from transformer.attention import scaled_dot_product_attention  # noqa: E402
from transformer.masks import causal_mask, decoder_self_mask, padding_mask  # noqa: E402


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


def main():
    torch.manual_seed(0)
    for dtype in (torch.float64, torch.float32):
        worst = max(
            max_diff_vs_reference(scaled_dot_product_attention, dtype, kind)
            for kind in ("none", "padding", "causal", "random")
        )
        print(f"scaled_dot_product_attention vs F.scaled_dot_product_attention, {dtype}: {worst:.2e}")
    mha = mha_max_diff_vs_torch()
    print(f"MultiHeadAttention vs nn.MultiheadAttention (float32, outputs + weights): {mha:.2e}")
    for norm_first in (False, True):
        enc, dec = stacks_max_diff(norm_first)
        name = "pre-norm" if norm_first else "post-norm"
        print(f"{name} stacks vs nn.TransformerEncoder / Decoder (float32): enc {enc:.2e}, dec {dec:.2e}")


if __name__ == "__main__":
    main()
