"""Where a released Marian (opus-mt) model differs from the paper, built on the core's model.

``VariantTransformer`` is the core's ``Transformer`` with what a ``VariantConfig`` (``variant`` section of
a run's config, runtime/configs.py) asks for swapped in, each a module or a table of its own:

    activation           the feed-forward's ReLU module -> GELU (the exact erf form) or SiLU (Marian's swish)
    sinusoid_layout      halves: the same sinusoids, the sin features first, then the cos ones (fairseq too)
    scale_embeddings     false: token embeddings are not multiplied by √d_model
    output_bias          true: a bias on the output projection (Marian's final_logits_bias), zero at first
    decoder_start_token  pad: the decoder starts from <pad> instead of BOS

Two layouts of the same sinusoids (the same frequencies; only the order of the features differs):

    interleaved (the paper, ours):   sin ω0  cos ω0  sin ω1  cos ω1  ...
    halves (Marian, fairseq):        sin ω0  sin ω1  ...  cos ω0  cos ω1  ...

Our own models keep every default and are the core's ``Transformer`` itself (``build_model``).
"""

import torch
from torch import nn

from transformer.core.config import ModelConfig
from transformer.core.embeddings import sinusoidal_positions
from transformer.core.layers import FeedForward
from transformer.core.model import Transformer
from transformer.core.model import build_model as build_paper_model
from transformer.runtime.configs import Config, VariantConfig

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}  # variant.activation -> its module


def halves_positions(n_positions: int, d_model: int) -> torch.Tensor:
    """The paper's sinusoid table with its sin features first, then its cos ones. -> (P, D)."""
    table = sinusoidal_positions(n_positions, d_model)  # (P, D) interleaved
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)  # (P, D)


class VariantTransformer(Transformer):
    """The core's ``Transformer`` as a released Marian model computes it (the module docstring's table)."""

    def __init__(
        self, config: ModelConfig, variant: VariantConfig, src_vocab_size: int, tgt_vocab_size: int,
        pad_id: int, bos_id: int, eos_id: int,
    ):  # fmt: skip
        start_id = pad_id if variant.decoder_start_token == "pad" else bos_id
        super().__init__(config, src_vocab_size, tgt_vocab_size, pad_id, bos_id, eos_id, start_id)
        self.variant = variant
        for ffn in (module for module in self.modules() if isinstance(module, FeedForward)):
            ffn.activation = ACTIVATIONS[variant.activation]()
        if variant.sinusoid_layout == "halves":
            for stack in (self.encoder, self.decoder):
                stack.positions.table.copy_(halves_positions(config.max_positions, config.d_model))
        if not variant.scale_embeddings:
            for stack in (self.encoder, self.decoder):
                stack.embedding.scale = 1.0
        if variant.output_bias:  # zero until trained or loaded
            self.output_proj.bias = nn.Parameter(torch.zeros(tgt_vocab_size))


def build_model(config: Config, tokenizer) -> Transformer:
    """The model a run's config describes, with random weights: the core's own, or its variant."""
    if config.variant == VariantConfig():
        return build_paper_model(config.model, tokenizer)
    V, ids = tokenizer.vocab_size, (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    return VariantTransformer(config.model, config.variant, V, V, *ids)


def variant_of(model: Transformer) -> VariantConfig:
    """The variant a model computes: the defaults for the core's own ``Transformer``."""
    return model.variant if isinstance(model, VariantTransformer) else VariantConfig()
