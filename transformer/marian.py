"""Released models in and out: Hugging Face Marian (opus-mt) <-> our Transformer; export to CTranslate2.

    from_marian(hf_model) -> Transformer          the same function with the same weights
    to_marian(model)      -> MarianMTModel         the exact inverse (round trip exact)
    python -m transformer.marian export RUN_DIR/best.pt OUT_DIR [--ct2 CT2_DIR]

Weights (ours <- Marian's; the rest is the same name for name):

    qkv_proj (3D, D), rows Q, K, V   <- cat(q_proj, k_proj, v_proj)       (self_attn, encoder_attn)
    self_attn_norm / cross_attn_norm <- self_attn_layer_norm / encoder_attn_layer_norm
    ffn.linear1 / linear2, ffn_norm  <- fc1 / fc2, final_layer_norm
    embeddings, output_proj          <- model.shared (tied, shared vocabulary) or the separate three
    output_proj.bias                 <- final_logits_bias (1, V)          (model.output_bias: true)

Both are post-norm with sinusoidal positions; Marian's are laid out in HALVES (sin features first, then
cos), ours INTERLEAVED by default (§3.5). ``from_marian`` gives a ``sinusoid_layout: halves`` model. For
an interleaved model, ``to_marian`` reorders the d_model features: with the permutation
p = (0, 2, 4, ..., 1, 3, 5, ...), interleaved[:, p] IS Marian's table (bit for bit), and giving every
vector of the residual stream the order p is an exact reparametrisation: embedding columns, the input
columns of qkv_proj / linear1 / output_proj, the output rows and biases of out_proj / linear2, and the
LayerNorm weights and biases all take the order p (LayerNorm's mean and variance do not depend on the
order; the head space and d_ff are untouched). Logits are the same function; only the order of the sums
inside the matmuls changes (float rounding). The CTranslate2 model needs no reordering: its position table
is set to ours.

Special ids and the decoder start token. Marian starts the decoder from the pad id
(``decoder_start_token: pad``); our checkpoints from BOS (pad 0, unk 1, bos 2, eos 3). Our decoders never
produce PAD or the start token; the export says so with ``bad_words_ids`` in generation_config.json, and
in CTranslate2 with a -inf output bias on those two ids (CTranslate2 keeps no decoding settings).

Lengths. Our decoders stop a sentence at ``source length + eval.max_len_offset`` tokens (EOS included).
``generate()`` and CTranslate2 only know one limit per call: the export sets max_length to
``max_positions + 1`` (the start token + every position); pass ``max_new_tokens`` / ``max_decoding_length``
per sentence for the same cut, and ``min_decoding_length=0`` to CTranslate2 (its default 1 forbids an
empty translation, which ours allows). Beam search is not exported: generate()'s length penalty is not ours.

Refused, with one line naming the setting: pre-norm Marian variants (normalize_before), a layer norm on
the embeddings, learned positions, different encoder / decoder head counts or FFN widths, activations other
than relu / gelu / swish, and embeddings shared between encoder and decoder but not with the output.
``transformers`` and ``ctranslate2`` are imported only here, when called (``pip install -e ".[hf]"``).
"""

import copy

import torch

from transformer.config import ModelConfig
from transformer.embeddings import sinusoidal_positions
from transformer.model import Transformer
from transformer.tokenizer import BOS_ID, EOS_ID

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # Marian's -> ours


class MarianError(ValueError):
    """A model that cannot be mapped, or a missing dependency; the one-line message says which setting."""


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MarianError('Marian interop needs transformers: pip install -e ".[hf]"') from None
    return transformers


def _halves_permutation(d_model: int) -> torch.Tensor:
    """p with interleaved[:, p] == halves: the sin features (even), then the cos ones (odd)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])  # (D,)


# -------- Marian config <-> ModelConfig ---------------------------------------------------------------


def model_config_from_marian(hf_config) -> ModelConfig:
    """The ModelConfig of a Marian config, or a MarianError naming what cannot be mapped."""
    c = hf_config
    refusals = [
        (getattr(c, "normalize_before", False), "normalize_before=True (pre-norm Marian variant)"),
        (getattr(c, "normalize_embedding", False), "normalize_embedding=True (layer norm on embeddings)"),
        (getattr(c, "add_final_layer_norm", False), "add_final_layer_norm=True"),
        (not getattr(c, "static_position_embeddings", True), "static_position_embeddings=False (learned)"),
        (c.encoder_attention_heads != c.decoder_attention_heads, "encoder_attention_heads="
         f"{c.encoder_attention_heads} != decoder_attention_heads={c.decoder_attention_heads}"),
        (c.encoder_ffn_dim != c.decoder_ffn_dim,
         f"encoder_ffn_dim={c.encoder_ffn_dim} != decoder_ffn_dim={c.decoder_ffn_dim}"),
        (c.activation_function not in ACTIVATIONS, f"activation_function={c.activation_function!r} "
         f"(expected one of {', '.join(ACTIVATIONS)})"),
        (c.share_encoder_decoder_embeddings != c.tie_word_embeddings,
         f"share_encoder_decoder_embeddings={c.share_encoder_decoder_embeddings} with "
         f"tie_word_embeddings={c.tie_word_embeddings} (we tie all three or none)"),
    ]  # fmt: skip
    for refused, setting in refusals:
        if refused:
            raise MarianError(f"cannot map this Marian model: {setting}")
    return ModelConfig(
        d_model=c.d_model,
        n_heads=c.encoder_attention_heads,
        d_ff=c.encoder_ffn_dim,
        n_encoder_layers=c.encoder_layers,
        n_decoder_layers=c.decoder_layers,
        dropout=float(c.dropout),
        norm_first=False,
        share_embeddings=bool(c.share_encoder_decoder_embeddings),
        max_positions=c.max_position_embeddings,
        activation=ACTIVATIONS[c.activation_function],
        sinusoid_layout="halves",
        scale_embeddings=bool(c.scale_embedding),
        output_bias=True,
        decoder_start_token="pad" if c.decoder_start_token_id == c.pad_token_id else "bos",
    )


def marian_config(model: Transformer, bos_id: int = BOS_ID, eos_id: int = EOS_ID):
    """The MarianConfig of our model (special ids from ``model.hf_config`` when it came from Marian)."""
    c = model.config
    if c.norm_first:
        raise MarianError("cannot map to Marian: model.norm_first=True (Marian is post-norm)")
    hf_config = getattr(model, "hf_config", None)
    if hf_config is not None:  # it came from Marian: keep its special ids, dropouts and settings
        values = hf_config.to_dict()
    else:  # ours drops the residual, the attention weights and the FFN's hidden layer alike
        values = {
            "pad_token_id": model.pad_id, "bos_token_id": bos_id, "eos_token_id": eos_id,
            "decoder_start_token_id": model.start_id(bos_id), "forced_eos_token_id": None,
            "dropout": c.dropout, "attention_dropout": c.dropout, "activation_dropout": c.dropout,
        }  # fmt: skip
    activation = c.activation
    if hf_config is not None and ACTIVATIONS.get(hf_config.activation_function) == c.activation:
        activation = hf_config.activation_function  # "silu" stays "silu"
    values.update(
        vocab_size=model.encoder.embedding.weight.size(0),
        decoder_vocab_size=model.output_proj.weight.size(0),
        d_model=c.d_model,
        encoder_layers=c.n_encoder_layers,
        decoder_layers=c.n_decoder_layers,
        encoder_attention_heads=c.n_heads,
        decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.d_ff,
        decoder_ffn_dim=c.d_ff,
        activation_function=activation,
        max_position_embeddings=c.max_positions,
        scale_embedding=c.scale_embeddings,
        share_encoder_decoder_embeddings=c.share_embeddings,
        tie_word_embeddings=c.share_embeddings,
    )
    return _transformers().MarianConfig.from_dict(values)


# -------- weights -----------------------------------------------------------------------------------


def _weight_pairs(config: ModelConfig) -> list[tuple[str, list[str]]]:
    """(our state_dict key, the Marian keys it is made of); q, k, v are stacked into qkv_proj."""
    embeddings = ["model.shared.weight"] * 3 if config.share_embeddings else [
        "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"
    ]  # fmt: skip
    ours = ["encoder.embedding.embedding.weight", "decoder.embedding.embedding.weight", "output_proj.weight"]
    pairs = [(a, [b]) for a, b in zip(ours, embeddings)] + [("output_proj.bias", ["final_logits_bias"])]
    stacks = (("encoder", config.n_encoder_layers), ("decoder", config.n_decoder_layers))
    for stack, n_layers in stacks:
        blocks = [("self_attn", "self_attn")] + [("cross_attn", "encoder_attn")] * (stack == "decoder")
        for i in range(n_layers):
            a, b = f"{stack}.layers.{i}.", f"model.{stack}.layers.{i}."
            for p in ("weight", "bias"):
                for ours_block, theirs in blocks:
                    pairs.append(
                        (f"{a}{ours_block}.qkv_proj.{p}", [f"{b}{theirs}.{x}_proj.{p}" for x in "qkv"])
                    )
                    pairs.append((f"{a}{ours_block}.out_proj.{p}", [f"{b}{theirs}.out_proj.{p}"]))
                    pairs.append((f"{a}{ours_block}_norm.{p}", [f"{b}{theirs}_layer_norm.{p}"]))
                pairs.append((f"{a}ffn.linear1.{p}", [f"{b}fc1.{p}"]))
                pairs.append((f"{a}ffn.linear2.{p}", [f"{b}fc2.{p}"]))
                pairs.append((f"{a}ffn_norm.{p}", [f"{b}final_layer_norm.{p}"]))
    return pairs


def _marian_tensors(hf_model) -> dict[str, torch.Tensor]:
    return dict(hf_model.named_parameters(remove_duplicate=False)) | dict(hf_model.named_buffers())


def _check_positions(hf_model, config: ModelConfig) -> None:
    """Marian's position tables must be the sinusoids (ours, halves layout), not learned ones."""
    expected = sinusoidal_positions(config.max_positions, config.d_model, "halves")  # (P, D)
    for stack in ("encoder", "decoder"):
        table = getattr(hf_model.model, stack).embed_positions.weight.detach().float().cpu()
        if table.shape != expected.shape or not torch.allclose(table, expected, rtol=0.0, atol=1e-6):
            raise MarianError(
                f"cannot map this Marian model: model.{stack}.embed_positions is not sinusoidal"
            )


def from_marian(hf_model) -> Transformer:
    """A MarianMTModel -> our Transformer, the same function: ``model(src, tgt_in)`` equals
    ``hf_model(input_ids=src, attention_mask=src != pad, decoder_input_ids=tgt_in).logits``."""
    hf_config = hf_model.config
    config = model_config_from_marian(hf_config)
    _check_positions(hf_model, config)
    theirs = _marian_tensors(hf_model)
    state = {}
    for key, names in _weight_pairs(config):
        tensor = torch.cat([theirs[name].detach() for name in names])  # q, k, v stacked by rows
        state[key] = tensor.reshape(-1) if key == "output_proj.bias" else tensor  # (1, V) -> (V,)
    src_vocab, tgt_vocab = hf_config.vocab_size, hf_config.decoder_vocab_size or hf_config.vocab_size
    model = Transformer(config, src_vocab, tgt_vocab, hf_config.pad_token_id)
    dtype = theirs["model.encoder.layers.0.fc1.weight"].dtype if config.n_encoder_layers else torch.float32
    model.to(dtype).load_state_dict(state)
    model.hf_config = copy.deepcopy(hf_config)  # special ids and decoding settings, for to_marian
    return model.train(hf_model.training)


# Keys whose d_model axis is an input (dim 1) or an output (dim 0) in the residual stream's feature order.
_FEATURES_IN = (".qkv_proj.weight", ".linear1.weight", "embedding.weight", "output_proj.weight")
_FEATURES_OUT = (
    ".out_proj.weight",
    ".out_proj.bias",
    ".linear2.weight",
    ".linear2.bias",
    "_norm.weight",
    "_norm.bias",
)


def interleaved_to_halves(state: dict[str, torch.Tensor], d_model: int) -> dict[str, torch.Tensor]:
    """The same function with the d_model features in the halves order (see the module docstring)."""
    p = _halves_permutation(d_model)  # (D,)
    reordered = {}
    for key, tensor in state.items():
        if key.endswith(_FEATURES_IN):
            tensor = tensor[:, p]  # (out, D) columns
        elif key.endswith(_FEATURES_OUT):
            tensor = tensor[p]  # (D, ...) rows
        reordered[key] = tensor
    return reordered


def to_marian(model: Transformer, bos_id: int = BOS_ID, eos_id: int = EOS_ID):
    """Our Transformer -> a ``transformers.MarianMTModel`` computing the same function; the exact inverse
    of ``from_marian``. ``bos_id`` / ``eos_id``: for a model that did not come from Marian (ours: 2, 3)."""
    config = marian_config(model, bos_id, eos_id)
    state = {key: tensor.detach() for key, tensor in model.state_dict().items()}
    if model.config.sinusoid_layout == "interleaved":
        state = interleaved_to_halves(state, model.config.d_model)
    hf_model = _transformers().MarianMTModel(config)
    hf_model.to(device=model.output_proj.weight.device, dtype=model.output_proj.weight.dtype)
    theirs = _marian_tensors(hf_model)
    with torch.no_grad():
        for key, names in _weight_pairs(model.config):
            if key not in state:  # no output bias: Marian's final_logits_bias stays zero
                theirs["final_logits_bias"].zero_()
                continue
            for name, part in zip(names, state[key].chunk(len(names))):  # qkv_proj -> q, k, v rows
                theirs[name].copy_(part.reshape(theirs[name].shape))
    return hf_model.train(model.training)
