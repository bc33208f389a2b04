"""A from-scratch Transformer for machine translation (Vaswani et al., 2017), on plain PyTorch tensors.

The package in tiers, each importing only the ones before it (``transformer/core/__init__.py`` gives the
core's reading order):

    core/        the paper in plain PyTorch: attention, layers, model, loss, optimizer, tokenizer, batches,
                 config, checkpoints, greedy and beam search
    reference/   PyTorch's own modules with our weights: the oracle the core is measured against
    fast/        the speed beside it: faster twins of core modules and search kernels, the same numbers
    runtime/     what the tiers above share: configs and checkpoints, devices and precisions, the
                 batched search, lines, metrics, attention maps, languages
    interop/     other people's formats: Marian / transformers, CTranslate2 (needs the ``hf`` extra),
                 behind one door (``formats.py``) that reads any model
    training/    a run: data sources, token store, cleaning, run folder, validation, reporting, averaging
    inference/   the Translator API: precisions and int8, sampling, prefixes, n-best, alignments
    serving/     the HTTP service

The names users import live here, so that a file moving inside the package breaks no one's code:

    from transformer import Transformer, Translator, load_config, scaled_dot_product_attention

Each is imported when first used; the interop ones (``from_marian``, ``to_marian``, ``export``) need the
``hf`` extra.
"""

import importlib

# name users import: the module that holds it. Imported on first use (PEP 562), so that importing one module
# of the package (a tokenizing worker process, say) does not import all of them; the interop names need
# the optional ``hf`` extra only when used.
EXPORTS = {
    "scaled_dot_product_attention": "core.attention", "MultiHeadAttention": "core.attention",
    "padding_mask": "core.masks", "causal_mask": "core.masks", "decoder_self_mask": "core.masks",
    "FeedForward": "core.layers", "EncoderLayer": "core.layers", "DecoderLayer": "core.layers",
    "Encoder": "core.model", "Decoder": "core.model", "Transformer": "core.model",
    "build_model": "core.model",
    "Tokenizer": "core.tokenizer", "train_tokenizer": "training.tokenizer_job",
    "Batch": "core.batches", "make_batches": "core.batches",
    "Config": "runtime.configs", "ConfigError": "core.config", "load_config": "runtime.configs",
    "CheckpointError": "core.checkpoint", "load_checkpoint": "core.checkpoint",
    "load_for_inference": "runtime.checkpoints",
    "greedy_decode": "core.decoding", "beam_search": "core.decoding",
    "Translator": "inference.translator", "Sampling": "inference.sampling",
    "from_marian": "interop.marian", "to_marian": "interop.marian", "export": "interop.marian",
}  # fmt: skip
__all__ = list(EXPORTS)


def __getattr__(name: str):
    if name in EXPORTS:
        return getattr(importlib.import_module(f"transformer.{EXPORTS[name]}"), name)
    raise AttributeError(f"module 'transformer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
