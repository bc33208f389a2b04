"""Released models in and out: Hugging Face Marian (opus-mt) <-> our Transformer; export to CTranslate2.

    from_marian(hf_model) -> Transformer          the same function with the same weights
    to_marian(model)      -> MarianMTModel         the exact inverse (round trip exact), or for a
                                                   pre-norm model PegasusForConditionalGeneration
    python -m transformer.interop.marian export RUN_DIR/best.pt OUT_DIR [--ct2 CT2_DIR]

Weights (ours <- Marian's; the rest is the same name for name):

    qkv_proj (3D, D), rows Q, K, V   <- cat(q_proj, k_proj, v_proj)       (self_attn, encoder_attn)
    self_attn_norm / cross_attn_norm <- self_attn_layer_norm / encoder_attn_layer_norm
    ffn.linear1 / linear2, ffn_norm  <- fc1 / fc2, final_layer_norm
    embeddings, output_proj          <- model.shared (tied, shared vocabulary) or the separate three
    output_proj.bias                 <- final_logits_bias (1, V)          (variant.output_bias: true)

Pre-norm (``model.norm_first: true``) goes through Pegasus, Marian's pre-norm sibling in transformers: the
same layers and names, each block ``x + Sublayer(LayerNorm(x))``, and a final LayerNorm on each stack
(``model.{encoder,decoder}.layer_norm`` <- our ``final_norm``); it has one vocabulary. Both have sinusoidal
positions laid out in HALVES (sin features first, then cos), ours are INTERLEAVED by default (§3.5).
``from_marian`` gives a ``variant.sinusoid_layout: halves`` model (interop/variant.py). For an interleaved
model, ``to_marian`` reorders the d_model features: with the permutation p = (0, 2, 4, ..., 1, 3, 5, ...),
interleaved[:, p] IS Marian's table (bit for bit), and giving every vector of the residual stream the order p
is an exact reparametrisation: embedding columns, the input columns of qkv_proj / linear1 / output_proj, the
output rows and biases of out_proj / linear2, and the LayerNorm weights and biases all take the order p
(LayerNorm's mean and variance do not depend on the order; the head space and d_ff are untouched). Logits are
the same function; only the order of the sums inside the matmuls changes (float rounding). The CTranslate2
model needs no reordering: its position table is set to ours.

Special ids and the decoder start token. Marian starts the decoder from the pad id
(``variant.decoder_start_token: pad``); our checkpoints from BOS (pad 0, unk 1, bos 2, eos 3). Our decoders
never produce PAD or the start token; the export says so with ``bad_words_ids`` in generation_config.json, and
in CTranslate2 with a -inf output bias on those two ids (CTranslate2 keeps no decoding settings).

Lengths. Our decoders stop a sentence at ``source length + eval.max_len_offset`` tokens (EOS included).
``generate()`` and CTranslate2 only know one limit per call: the export sets max_length to
``max_positions + 1`` (the start token + every position); pass ``max_new_tokens`` / ``max_decoding_length``
per sentence for the same cut, and ``min_decoding_length=0`` to CTranslate2 (its default 1 forbids an
empty translation, which ours allows). Beam search is not exported: generate()'s length penalty is not ours.

Refused, with one line naming the setting: pre-norm Marian configs (normalize_before, add_final_layer_norm;
pre-norm goes through Pegasus), a pre-norm model with untied embeddings (Pegasus ties them), a layer norm on
the embeddings, learned positions, different encoder / decoder head counts or FFN widths, activations other
than relu / gelu / swish, and embeddings shared between encoder and decoder but not with the output.
``transformers`` and ``ctranslate2`` are imported only here, when called (``pip install -e ".[hf]"``).
"""

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import torch

from transformer.core.checkpoint import CheckpointError
from transformer.core.config import ModelConfig
from transformer.core.model import Transformer
from transformer.core.tokenizer import Tokenizer
from transformer.interop.marian_text import MarianText, read_either
from transformer.interop.variant import VariantTransformer, build_model, halves_positions, variant_of
from transformer.runtime.checkpoints import load_for_inference
from transformer.runtime.configs import VariantConfig
from transformer.runtime.corpora import directions
from transformer.runtime.quiet import quiet_libraries

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # Marian's -> ours


class MarianError(ValueError):
    """A model that cannot be mapped, or a missing dependency; the one-line message says which setting."""


def _transformers():
    try:
        with quiet_libraries():  # it imports torchao where installed, whose import is noisy on a CPU
            import transformers
    except ImportError:
        raise MarianError('Marian interop needs transformers: pip install -e ".[hf]"') from None
    return transformers


def _halves_permutation(d_model: int) -> torch.Tensor:
    """p with interleaved[:, p] == halves: the sin features (even), then the cos ones (odd)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])  # (D,)


# -------- Marian config <-> ModelConfig ---------------------------------------------------------------


MODEL_TYPES = {"marian": "MarianMTModel", "pegasus": "PegasusForConditionalGeneration"}  # post-, pre-norm


def model_class(model_type: str):
    """The transformers class of a folder's config.json ``model_type``: Marian or its pre-norm sibling."""
    if model_type not in MODEL_TYPES:
        raise MarianError(f"model_type={model_type!r} is not a Marian model (expected marian or pegasus)")
    with quiet_libraries():  # the first model class loads transformers' modelling code, and torchao with it
        return getattr(_transformers(), MODEL_TYPES[model_type])


def model_type_of(hf_model) -> str:
    """marian or pegasus, from the model's class (what it computes), checked against its config's."""
    class_name = type(hf_model).__name__
    model_type = {name: key for key, name in MODEL_TYPES.items()}.get(class_name)
    if model_type is None:
        raise MarianError(f"cannot map a {class_name} (expected {' or '.join(MODEL_TYPES.values())})")
    if hf_model.config.model_type != model_type:
        raise MarianError(
            f"a {class_name} with model_type={hf_model.config.model_type!r} in its config: load the folder "
            "with the class its config.json names (AutoModelForSeq2SeqLM)"
        )
    return model_type


def configs_from_marian(hf_config, model_type: str = "marian") -> tuple[ModelConfig, VariantConfig]:
    """The model and variant configs of a Marian (or, ``model_type="pegasus"``, a Pegasus) config, or a
    MarianError naming what cannot be mapped."""
    c, pre_norm = hf_config, model_type == "pegasus"
    share = getattr(c, "share_encoder_decoder_embeddings", True)  # Pegasus: always one vocabulary
    # Pegasus' config.json files still carry normalize_before / add_final_layer_norm = true: what it does
    marian_only = [] if pre_norm else [
        (getattr(c, "normalize_before", False), "normalize_before=True (pre-norm Marian variant)"),
        (getattr(c, "add_final_layer_norm", False), "add_final_layer_norm=True"),
    ]  # fmt: skip
    tied = f"tie_word_embeddings={c.tie_word_embeddings}"
    tying = f"share_encoder_decoder_embeddings={share} with {tied} (we tie all three or none)"
    if pre_norm:
        tying = f"{tied} (Pegasus ties its encoder and decoder embeddings; we tie the output to them too)"
    refusals = marian_only + [
        (getattr(c, "normalize_embedding", False), "normalize_embedding=True (layer norm on embeddings)"),
        (not getattr(c, "static_position_embeddings", True), "static_position_embeddings=False (learned)"),
        (c.encoder_attention_heads != c.decoder_attention_heads, "encoder_attention_heads="
         f"{c.encoder_attention_heads} != decoder_attention_heads={c.decoder_attention_heads}"),
        (c.encoder_ffn_dim != c.decoder_ffn_dim,
         f"encoder_ffn_dim={c.encoder_ffn_dim} != decoder_ffn_dim={c.decoder_ffn_dim}"),
        (c.activation_function not in ACTIVATIONS, f"activation_function={c.activation_function!r} "
         f"(expected one of {', '.join(ACTIVATIONS)})"),
        (share != c.tie_word_embeddings, tying),
    ]  # fmt: skip
    for refused, setting in refusals:
        if refused:
            raise MarianError(f"cannot map this {'Pegasus' if pre_norm else 'Marian'} model: {setting}")
    model = ModelConfig(
        d_model=c.d_model,
        n_heads=c.encoder_attention_heads,
        d_ff=c.encoder_ffn_dim,
        n_encoder_layers=c.encoder_layers,
        n_decoder_layers=c.decoder_layers,
        dropout=float(c.dropout),
        norm_first=pre_norm,
        share_embeddings=bool(share),
        max_positions=c.max_position_embeddings,
    )
    variant = VariantConfig(
        activation=ACTIVATIONS[c.activation_function],
        sinusoid_layout="halves",
        scale_embeddings=bool(c.scale_embedding),
        output_bias=True,
        decoder_start_token="pad" if c.decoder_start_token_id == c.pad_token_id else "bos",
    )
    return model, variant


def marian_config(model: Transformer):
    """The MarianConfig of our model, a PegasusConfig if it is pre-norm (special ids from
    ``model.hf_config`` when it came from transformers)."""
    c, variant = model.config, variant_of(model)
    if c.norm_first and not c.share_embeddings:
        raise MarianError(
            "cannot map to Pegasus (the pre-norm Marian): model.norm_first=True with "
            "model.share_embeddings=False (Pegasus ties its encoder and decoder embeddings)"
        )
    hf_config = getattr(model, "hf_config", None)
    if hf_config is not None:  # it came from Marian: keep its special ids, dropouts and settings
        values = hf_config.to_dict()
        for key in ("model_type", "architectures"):  # ours come from norm_first
            values.pop(key, None)
    else:  # ours drops the residual, the attention weights and the FFN's hidden layer alike
        values = {
            "pad_token_id": model.pad_id, "bos_token_id": model.bos_id, "eos_token_id": model.eos_id,
            "decoder_start_token_id": model.start_id, "forced_eos_token_id": None,
            "dropout": c.dropout, "attention_dropout": c.dropout, "activation_dropout": c.dropout,
        }  # fmt: skip
    activation = variant.activation
    if hf_config is not None and ACTIVATIONS.get(hf_config.activation_function) == variant.activation:
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
        scale_embedding=variant.scale_embeddings,
        tie_word_embeddings=c.share_embeddings,
    )
    if c.norm_first:
        values.pop("decoder_vocab_size")
        return _transformers().PegasusConfig.from_dict(values)
    values["share_encoder_decoder_embeddings"] = c.share_embeddings
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
        if config.norm_first:  # Pegasus: the stack's final LayerNorm
            for p in ("weight", "bias"):
                pairs.append((f"{stack}.final_norm.{p}", [f"model.{stack}.layer_norm.{p}"]))
    return pairs


def _marian_tensors(hf_model) -> dict[str, torch.Tensor]:
    return dict(hf_model.named_parameters(remove_duplicate=False)) | dict(hf_model.named_buffers())


def _check_positions(hf_model, config: ModelConfig) -> None:
    """Marian's position tables must be the sinusoids (ours, halves layout), not learned ones."""
    expected = halves_positions(config.max_positions, config.d_model)  # (P, D)
    for stack in ("encoder", "decoder"):
        table = getattr(hf_model.model, stack).embed_positions.weight.detach().float().cpu()
        if table.shape != expected.shape or not torch.allclose(table, expected, rtol=0.0, atol=1e-6):
            raise MarianError(
                f"cannot map this Marian model: model.{stack}.embed_positions is not sinusoidal"
            )


def from_marian(hf_model) -> Transformer:
    """A MarianMTModel (or Pegasus) -> our Transformer, the same function: ``model(src, tgt_in)`` equals
    ``hf_model(input_ids=src, attention_mask=src != pad, decoder_input_ids=tgt_in).logits``."""
    hf_config = hf_model.config
    config, variant = configs_from_marian(hf_config, model_type_of(hf_model))
    _check_positions(hf_model, config)
    theirs = _marian_tensors(hf_model)
    state = {}
    for key, names in _weight_pairs(config):
        tensor = torch.cat([theirs[name].detach() for name in names])  # q, k, v stacked by rows
        state[key] = tensor.reshape(-1) if key == "output_proj.bias" else tensor  # (1, V) -> (V,)
    src_vocab = hf_config.vocab_size
    tgt_vocab = getattr(hf_config, "decoder_vocab_size", None) or src_vocab  # Pegasus: one vocabulary
    pad, start = hf_config.pad_token_id, hf_config.decoder_start_token_id
    marian_bos = getattr(hf_config, "bos_token_id", None)  # Marian: often = EOS
    bos = start if variant.decoder_start_token == "bos" else marian_bos
    bos = pad if bos is None else bos
    try:
        model = VariantTransformer(config, variant, src_vocab, tgt_vocab, pad, bos, hf_config.eos_token_id)
    except ValueError as error:  # special ids that cannot work together
        raise MarianError(f"cannot map this Marian model: {error}") from None
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


def to_marian(model: Transformer):
    """Our Transformer -> a ``transformers.MarianMTModel`` (``PegasusForConditionalGeneration`` if it is
    pre-norm) computing the same function; the exact inverse of ``from_marian``; the special ids are the
    model's."""
    config = marian_config(model)
    state = {key: tensor.detach() for key, tensor in model.state_dict().items()}
    if variant_of(model).sinusoid_layout == "interleaved":
        state = interleaved_to_halves(state, model.config.d_model)
    hf_model = model_class("pegasus" if model.config.norm_first else "marian")(config)
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


# -------- export: a transformers folder and a CTranslate2 model --------------------------------------


def generation_config(model: Transformer):
    """generate() defaults that decode as our greedy search: start token, never PAD or the start token,
    no forced EOS at the limit, one limit for all sentences (see the module docstring)."""
    start_id = model.start_id
    return _transformers().GenerationConfig(
        decoder_start_token_id=start_id,
        bos_token_id=model.bos_id,
        eos_token_id=model.eos_id,
        pad_token_id=model.pad_id,
        forced_eos_token_id=None,
        bad_words_ids=[[token] for token in model.never_produced],
        max_length=model.config.max_positions + 1,
        num_beams=1,
        do_sample=False,
    )


def save_marian_tokenizer(tokenizer: Tokenizer, out_dir: Path, src_lang: str, tgt_lang: str) -> None:
    """source.spm = target.spm = our joint SentencePiece model, vocab.json = its pieces -> ids; a model
    fine-tuned from a Marian one keeps its own tokenizer files (``marian_text.MarianText``)."""
    if isinstance(tokenizer, MarianText):
        tokenizer.save(out_dir)
        return
    pieces = tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))
    for name in ("source.spm", "target.spm"):
        (out_dir / name).write_bytes(tokenizer.to_bytes())
    (out_dir / "vocab.json").write_text(json.dumps(dict(zip(pieces, range(len(pieces)))), ensure_ascii=False))
    special = {"unk_token": pieces[tokenizer.unk_id], "eos_token": pieces[tokenizer.eos_id]}
    settings = {"tokenizer_class": "MarianTokenizer", "source_lang": src_lang, "target_lang": tgt_lang}
    settings |= special | {"pad_token": pieces[tokenizer.pad_id], "separate_vocabs": False}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False))


def _ct2_linear(spec, state: dict, prefix: str, rows: slice = slice(None)) -> None:
    spec.weight = state[f"{prefix}.weight"][rows]
    spec.bias = state[f"{prefix}.bias"][rows]


def _ct2_norm(spec, state: dict, prefix: str) -> None:
    spec.gamma, spec.beta = state[f"{prefix}.weight"], state[f"{prefix}.bias"]


def _ct2_stack(spec, state: dict, stack: str, model: Transformer) -> None:
    """Embeddings, positions (our table as it is) and every layer of one stack into its spec."""
    c, D = model.config, model.config.d_model
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = state[f"{stack}.embedding.embedding.weight"]
    spec.scale_embeddings = math.sqrt(D) if variant_of(model).scale_embeddings else 1.0
    spec.position_encodings.encodings = getattr(model, stack).positions.table.float().cpu().numpy()  # (P, D)
    if c.norm_first:
        _ct2_norm(spec.layer_norm, state, f"{stack}.final_norm")
    for i, layer in enumerate(spec.layer):
        p = f"{stack}.layers.{i}"
        _ct2_linear(layer.self_attention.linear[0], state, f"{p}.self_attn.qkv_proj")  # fused Q, K, V
        _ct2_linear(layer.self_attention.linear[1], state, f"{p}.self_attn.out_proj")
        _ct2_norm(layer.self_attention.layer_norm, state, f"{p}.self_attn_norm")
        if stack == "decoder":
            _ct2_linear(layer.attention.linear[0], state, f"{p}.cross_attn.qkv_proj", slice(0, D))  # Q
            _ct2_linear(layer.attention.linear[1], state, f"{p}.cross_attn.qkv_proj", slice(D, None))  # K, V
            _ct2_linear(layer.attention.linear[2], state, f"{p}.cross_attn.out_proj")
            _ct2_norm(layer.attention.layer_norm, state, f"{p}.cross_attn_norm")
        _ct2_linear(layer.ffn.linear_0, state, f"{p}.ffn.linear1")
        _ct2_linear(layer.ffn.linear_1, state, f"{p}.ffn.linear2")
        _ct2_norm(layer.ffn.layer_norm, state, f"{p}.ffn_norm")


def to_ctranslate2(model: Transformer, tokenizer: Tokenizer, out_dir: str | Path) -> None:
    """Write a CTranslate2 model built through its spec API: our norm placement, activation, position
    table, start token and vocabulary (the SentencePiece pieces). PAD and the start token get a -inf
    output bias, as our decoders rule them out."""
    try:
        with quiet_libraries():
            from ctranslate2.specs import common_spec, transformer_spec
    except ImportError:
        raise MarianError('CTranslate2 export needs ctranslate2: pip install -e ".[hf]"') from None
    c = model.config
    activation = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}[variant_of(model).activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (c.n_encoder_layers, c.n_decoder_layers),
        c.n_heads,
        pre_norm=c.norm_first,
        activation=getattr(common_spec.Activation, activation),
    )
    state = {key: tensor.detach().float().cpu().numpy() for key, tensor in model.state_dict().items()}
    _ct2_stack(spec.encoder, state, "encoder", model)
    _ct2_stack(spec.decoder, state, "decoder", model)
    start_id = model.start_id
    bias = state.get("output_proj.bias", 0.0 * state["output_proj.weight"][:, 0]).copy()  # (V,)
    bias[model.never_produced] = -math.inf
    spec.decoder.projection.weight, spec.decoder.projection.bias = state["output_proj.weight"], bias
    pieces = tokenizer.id_to_piece(list(range(tokenizer.vocab_size)))
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.unk_token, spec.config.eos_token = pieces[tokenizer.unk_id], pieces[tokenizer.eos_id]
    spec.config.bos_token, spec.config.decoder_start_token = pieces[tokenizer.bos_id], pieces[start_id]
    spec.validate()
    spec.optimize(quantization=None)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))


def export(checkpoint: str | Path, out_dir: str | Path, ct2_dir: str | Path | None = None) -> None:
    """best.pt -> a folder for AutoModelForSeq2SeqLM (Marian, or Pegasus if pre-norm) /
    MarianTokenizer.from_pretrained [+ a CTranslate2 model]."""
    model, tokenizer, config = load_for_inference(checkpoint, read_tokenizer=read_either, build=build_model)
    hf_model = to_marian(model)
    hf_model.generation_config = generation_config(model)
    out_dir = Path(out_dir)
    with quiet_libraries():  # no progress bar for a one-file save
        hf_model.save_pretrained(out_dir)
    save_marian_tokenizer(tokenizer, out_dir, *directions(config.data)[0])  # a multilingual model: its first
    if ct2_dir is not None:
        to_ctranslate2(model, tokenizer, ct2_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m transformer.interop.marian", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    export_parser = commands.add_parser("export", help="checkpoint -> transformers folder [+ CTranslate2]")
    export_parser.add_argument("checkpoint", help="RUN_DIR/best.pt")
    export_parser.add_argument(
        "out_dir", help="folder for AutoModelForSeq2SeqLM / MarianTokenizer.from_pretrained"
    )
    export_parser.add_argument("--ct2", metavar="CT2_DIR", help="also write a CTranslate2 model here")
    args = parser.parse_args(argv)
    try:
        export(args.checkpoint, args.out_dir, args.ct2)
    except (MarianError, CheckpointError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir}" + (f" and {args.ct2}" if args.ct2 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
