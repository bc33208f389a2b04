"""A from-scratch Transformer for machine translation (Vaswani et al., 2017), on plain PyTorch tensors."""
