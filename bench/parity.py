"""Largest differences between our modules and PyTorch's references, as pinned by the tests.

python bench/parity.py
"""

import torch

from transformer.core.attention import scaled_dot_product_attention
from transformer.reference.pytorch_oracle import max_diff_vs_reference, mha_max_diff_vs_torch, stacks_max_diff


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
