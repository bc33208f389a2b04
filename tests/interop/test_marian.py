"""Marian (opus-mt) interop and export: our attention inside seeded random MarianMTModels, greedy decoding
against generate(), exact round trips, refusals, and the export of a tiny trained checkpoint to
transformers and CTranslate2. The Hub is never contacted."""

import dataclasses
import gzip

import pytest
import torch

from transformer.core.config import ConfigError, ModelConfig
from transformer.core.decoding import greedy_decode, max_lengths
from transformer.core.masks import decoder_self_mask
from transformer.core.model import Transformer
from transformer.interop.variant import VariantTransformer, halves_positions
from transformer.runtime.configs import VariantConfig

transformers = pytest.importorskip("transformers")
from transformer.interop.marian import MarianError, from_marian, main, to_marian  # noqa: E402

V, PAD, EOS = 40, 39, 0  # Marian's layout: EOS 0, PAD last, the decoder starts from PAD
VARIANT_KEYS = {field.name for field in dataclasses.fields(VariantConfig)}


def our_model(ids=(0, 2, 3), **options) -> VariantTransformer:
    """A random model of ours (pad, bos, eos: ``ids``); ``options``: keys of ModelConfig and VariantConfig."""
    variant = {key: value for key, value in options.items() if key in VARIANT_KEYS}
    model = {key: value for key, value in options.items() if key not in VARIANT_KEYS}
    return VariantTransformer(ModelConfig(**model), VariantConfig(**variant), V, V, *ids)


def random_marian(
    seed: int = 0, dtype=torch.float64, activation: str = "swish", scale: bool = True, pegasus=False, **config
):
    """A small MarianMTModel with every weight random: LayerNorms off 1 / 0, a random final_logits_bias;
    ``pegasus``: the same as a PegasusForConditionalGeneration (pre-norm, a final LayerNorm per stack)."""
    values = dict(
        vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, forced_eos_token_id=None,
        activation_function=activation, scale_embedding=scale,
    )  # fmt: skip
    name = "Pegasus" if pegasus else "Marian"
    hf_config = getattr(transformers, f"{name}Config")(**(values | config))
    hf_config._attn_implementation = "eager"  # weights come back through the hooks
    torch.manual_seed(seed)
    model_class = transformers.PegasusForConditionalGeneration if pegasus else transformers.MarianMTModel
    hf_model = model_class(hf_config).to(dtype).eval()
    with torch.no_grad():
        for name, parameter in hf_model.named_parameters():
            if "embed_positions" in name:
                continue
            offset = 1.0 if name.endswith("layer_norm.weight") else 0.0  # also Pegasus' final layer_norm
            parameter.copy_(offset + 0.4 * torch.randn_like(parameter))
        hf_model.final_logits_bias.normal_()
    return hf_model


def sources(seed: int = 1, B: int = 4, S: int = 9) -> torch.Tensor:
    """(B, S) random sources ending in EOS, right-padded to different lengths."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, PAD, (B, S), generator=g)
    for row, length in enumerate(torch.randint(3, S + 1, (B,), generator=g).tolist()):
        src[row, length - 1] = EOS
        src[row, length:] = PAD
    return src


def relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()


VARIANTS = [
    ("swish", True, False),
    ("relu", False, False),
    ("gelu", True, False),
    ("relu", True, True),
    ("gelu", False, True),
]  # (activation, scale_embedding, Pegasus)


def block_outputs(model, modules: dict[str, torch.nn.Module], run) -> dict[str, tuple]:
    """Run ``run()`` and catch each attention module's (output, weights) with forward hooks."""
    caught = {}
    hooks = [
        module.register_forward_hook(lambda m, args, out, name=name: caught.setdefault(name, out))
        for name, module in modules.items()
    ]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return caught


def attention_blocks(ours: Transformer, hf_model) -> tuple[dict, dict]:
    mine, theirs = {}, {}
    for i, (a, b) in enumerate(zip(ours.encoder.layers, hf_model.model.encoder.layers)):
        mine[f"encoder.{i}.self"], theirs[f"encoder.{i}.self"] = a.self_attn, b.self_attn
    for i, (a, b) in enumerate(zip(ours.decoder.layers, hf_model.model.decoder.layers)):
        mine[f"decoder.{i}.self"], theirs[f"decoder.{i}.self"] = a.self_attn, b.self_attn
        mine[f"decoder.{i}.cross"], theirs[f"decoder.{i}.cross"] = a.cross_attn, b.encoder_attn
    return mine, theirs


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("activation, scale, pegasus", VARIANTS)
def test_every_attention_block_matches_marian(dtype, tolerance, activation, scale, pegasus):
    hf_model = random_marian(0, dtype, activation, scale, pegasus)
    assert from_marian(hf_model).config.norm_first == pegasus
    ours = from_marian(hf_model)
    src = sources()
    tgt_in = torch.cat([torch.full((4, 1), PAD), sources(2, S=6)[:, :5].clamp(max=PAD - 1)], dim=1)  # (B, 6)
    mine, theirs = attention_blocks(ours, hf_model)
    got = block_outputs(ours, mine, lambda: ours(src, tgt_in))
    hf_inputs = dict(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt_in)
    want = block_outputs(hf_model, theirs, lambda: hf_model(**hf_inputs))
    assert got.keys() == want.keys() == mine.keys()
    for name in mine:
        (out, weights), (their_out, their_weights) = got[name], want[name]
        assert relative(out, their_out) <= tolerance, name
        assert relative(weights, their_weights) <= tolerance, name
    logits = hf_model(**hf_inputs).logits
    assert relative(ours(src, tgt_in), logits) <= tolerance


def test_greedy_equals_generate():
    """Token for token, per sentence with the same length limit (generate has one per call)."""
    hf_model = random_marian(13, torch.float64, "swish", True)
    with torch.no_grad():
        hf_model.final_logits_bias[0, EOS] += 5.0  # so that one sentence ends (at 9 tokens) before its limit
    ours = from_marian(hf_model)
    src = sources(4, B=6)
    limits = max_lengths(ours, src, max_len_offset=4).tolist()
    ends = 0
    for row, limit in zip(src, limits):
        row = row[row != PAD][None]  # (1, S)
        mine = greedy_decode(ours, row, max_len_offset=4)[0]
        theirs = hf_model.generate(
            input_ids=row, num_beams=1, do_sample=False, max_new_tokens=limit, bad_words_ids=[[PAD]]
        )[0].tolist()
        assert theirs[0] == PAD
        ends += theirs[-1] == EOS
        assert mine == (theirs[1:-1] if theirs[-1] == EOS else theirs[1:])
    assert 0 < ends < len(limits)  # both endings are checked


@pytest.mark.parametrize("activation, scale, pegasus", VARIANTS)
def test_round_trip_is_exact(activation, scale, pegasus):
    hf_model = random_marian(5, torch.float32, activation, scale, pegasus)
    back = to_marian(from_marian(hf_model))
    assert type(back) is type(hf_model)
    want, got = hf_model.state_dict(), back.state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), key
    for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id", "activation_function"):
        assert getattr(back.config, name) == getattr(hf_model.config, name)


def test_unshared_vocabularies_round_trip():
    hf_model = random_marian(6, share_encoder_decoder_embeddings=False, tie_word_embeddings=False)
    ours = from_marian(hf_model)
    assert not ours.config.share_embeddings
    src, tgt_in = sources(), torch.full((4, 1), PAD)
    logits = hf_model(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt_in).logits
    assert relative(ours(src, tgt_in), logits) <= 1e-12
    back = to_marian(ours).state_dict()
    assert all(torch.equal(back[key], value) for key, value in hf_model.state_dict().items())


@pytest.mark.parametrize("activation, pre_norm", [("relu", False), ("swish", False), ("relu", True)])
def test_our_interleaved_model_exports_as_the_same_function(activation, pre_norm):
    """to_marian reorders the features of an interleaved model; logits and greedy output stay the same.
    A pre-norm model becomes a Pegasus one."""
    torch.manual_seed(7)
    sizes = dict(d_model=16, n_heads=4, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, max_positions=64)
    ours = our_model(**sizes, activation=activation, output_bias=True, norm_first=pre_norm).double().eval()
    with torch.no_grad():
        for parameter in ours.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    hf_model = to_marian(ours)  # our ids: pad 0, bos 2, eos 3; starts from BOS
    assert hf_model.config.model_type == ("pegasus" if pre_norm else "marian")
    src = sources(8).masked_fill(sources(8) == PAD, 0).masked_fill(sources(8) == EOS, 3)
    tgt_in = torch.cat([torch.full((4, 1), 2), torch.randint(4, V, (4, 5))], dim=1)
    logits = hf_model(input_ids=src, attention_mask=src != 0, decoder_input_ids=tgt_in).logits
    assert relative(ours(src, tgt_in), logits) <= 1e-12
    assert relative(from_marian(hf_model)(src, tgt_in), logits) <= 1e-12
    for row in src:
        row = row[row != 0][None]
        mine = greedy_decode(ours, row, max_len_offset=5)[0]
        theirs = hf_model.generate(input_ids=row, max_new_tokens=row.size(1) + 5, bad_words_ids=[[0], [2]])
        theirs = theirs[0, 1:].tolist()
        assert mine == (theirs[:-1] if theirs[-1] == 3 else theirs)


def test_halves_table_is_marians_bit_for_bit():
    for P, D in [(64, 16), (1024, 512), (50, 9)]:
        theirs = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(P, D)
        assert torch.equal(halves_positions(P, D), theirs.create_weight())


@pytest.mark.parametrize(
    "settings, named",
    [
        (dict(normalize_before=True), "normalize_before"),
        (dict(decoder_attention_heads=2), "decoder_attention_heads"),
        (dict(decoder_ffn_dim=64), "decoder_ffn_dim"),
        (dict(activation_function="gelu_new"), "activation_function"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings"),
        (dict(normalize_embedding=True), "normalize_embedding"),
    ],
)
def test_unmappable_models_are_refused_in_one_line(settings, named):
    hf_model = random_marian(9, torch.float32)
    hf_model.config.update(settings)
    with pytest.raises(MarianError, match=named) as error:
        from_marian(hf_model)
    assert "\n" not in str(error.value)


def test_special_ids_that_cannot_work_are_a_marian_error():
    """A config whose decoder would start from EOS: refused in one line, not a ValueError traceback."""
    hf_model = random_marian(9, torch.float32)
    hf_model.config.update(dict(decoder_start_token_id=EOS))
    with pytest.raises(MarianError, match="the decoder starts from id 0, which is also eos_id") as error:
        from_marian(hf_model)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("pegasus", [False, True])
def test_learned_positions_are_refused(pegasus):
    hf_model = random_marian(10, torch.float32, pegasus=pegasus)
    with torch.no_grad():
        hf_model.model.decoder.embed_positions.weight.normal_()
    with pytest.raises(MarianError, match="decoder.embed_positions"):
        from_marian(hf_model)


def test_pre_norm_with_separate_vocabularies_is_refused():
    """Pegasus has one vocabulary: a pre-norm model with three embeddings has no transformers form."""
    config = ModelConfig(d_model=16, n_heads=4, d_ff=32, norm_first=True, share_embeddings=False)
    with pytest.raises(MarianError, match="norm_first=True with model.share_embeddings=False") as error:
        to_marian(Transformer(config, V, V + 2, 0, 2, 3))
    assert "\n" not in str(error.value)
    to_marian(Transformer(dataclasses.replace(config, share_embeddings=True), V, V, 0, 2, 3))


def test_other_models_and_mismatched_configs_are_refused_by_name():
    """What a model computes is its class's: a Marian class with a Pegasus config (or the reverse) is
    refused, not read as the config says; another architecture is refused by its class name."""
    for pegasus, other in [(False, "pegasus"), (True, "marian")]:
        hf_model = random_marian(10, torch.float32, pegasus=pegasus)
        hf_model.config.model_type = other
        with pytest.raises(MarianError, match=f"with model_type='{other}' in its config"):
            from_marian(hf_model)
    bart = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
    ))  # fmt: skip
    with pytest.raises(MarianError, match="cannot map a BartForConditionalGeneration"):
        from_marian(bart)


def test_pegasus_config_keys_that_describe_pegasus_are_accepted():
    """Released Pegasus config.json files say normalize_before / add_final_layer_norm = true (what the
    class does): not a refusal; untied output embeddings are, in Pegasus' words."""
    hf_model = random_marian(11, pegasus=True, normalize_before=True, add_final_layer_norm=True)
    src, tgt_in = sources(), torch.full((4, 1), PAD)
    logits = hf_model(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt_in).logits
    assert relative(from_marian(hf_model)(src, tgt_in), logits) <= 1e-12
    untied = random_marian(11, torch.float32, pegasus=True, tie_word_embeddings=False)
    with pytest.raises(MarianError, match="cannot map this Pegasus model: tie_word_embeddings=False"):
        from_marian(untied)


@pytest.mark.parametrize(
    "key, value",
    [("activation", "tanh"), ("sinusoid_layout", "blocks"), ("decoder_start_token", "eos")],
)
def test_the_variants_options_are_validated(key, value):
    with pytest.raises(ConfigError, match=f"variant.{key}"):
        VariantConfig(**{key: value})


def test_start_token_equal_to_pad_is_attended():
    """Marian starts from <pad>: it must stay visible (today's padding mask hid it from every query)."""
    tgt_in = torch.tensor([[PAD, 5, 6, PAD], [PAD, 7, PAD, PAD]])
    mask = decoder_self_mask(tgt_in, PAD)  # (B, 1, T, T)
    assert mask[:, 0, :, 0].all()  # every query sees the start token
    assert not mask[0, 0, 3, 3] and not mask[1, 0, 3, 2]  # real padding stays hidden
    assert mask[0, 0, 2].tolist() == [True, True, True, False]


def test_eos_is_never_ruled_out():
    """EOS is never banned, even when BOS shares its id (bos_token_id == eos_token_id in Marian configs); a
    model that would START from EOS is refused by name."""
    torch.manual_seed(11)
    options = dict(d_model=16, n_heads=4, d_ff=32, output_bias=True)
    model = our_model((0, 3, 3), **options, decoder_start_token="pad").eval()
    assert model.never_produced == [0]
    with pytest.raises(ValueError, match="the decoder starts from id 3, which is also eos_id"):
        our_model((0, 3, 3), **options, decoder_start_token="bos")
    with torch.no_grad():
        model.output_proj.bias[3] = 100.0
    src = torch.tensor([[5, 6, 3], [7, 3, 0]])
    assert greedy_decode(model, src, max_len_offset=5) == [[], []]


class PiecesTokenizer:
    """What to_ctranslate2 needs from a tokenizer: our special ids and a piece per id."""

    pad_id, unk_id, bos_id, eos_id, vocab_size = 0, 1, 2, 3, V

    def id_to_piece(self, ids: list[int]) -> list[str]:
        return [["<pad>", "<unk>", "<s>", "</s>"][i] if i < 4 else f"t{i}" for i in ids]


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(activation="swish", norm_first=True, output_bias=True),
        dict(activation="gelu", sinusoid_layout="halves", scale_embeddings=False, output_bias=True),
    ],
)
def test_ctranslate2_model_decodes_as_our_greedy(tmp_path, options):
    """Random models, with PAD and BOS made likely: CTranslate2 must rule them out as ours does."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformer.interop.marian import to_ctranslate2

    torch.manual_seed(12)
    sizes = dict(d_model=16, n_heads=4, d_ff=32, n_encoder_layers=2, n_decoder_layers=2, max_positions=64)
    model = our_model(**sizes, **options).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
        if model.variant.output_bias:
            model.output_proj.bias[[0, 2]] += 3.0
            model.output_proj.bias[3] += 2.5
    tokenizer = PiecesTokenizer()
    ids = {piece: i for i, piece in enumerate(tokenizer.id_to_piece(list(range(V))))}
    to_ctranslate2(model, tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    src = sources(13, B=6).masked_fill(sources(13, B=6) == PAD, 0).masked_fill(sources(13, B=6) == EOS, 3)
    ours = greedy_decode(model, src, max_len_offset=6)
    for row, limit, mine in zip(src, max_lengths(model, src, 6).tolist(), ours):
        pieces = tokenizer.id_to_piece(row[row != 0].tolist())
        result = translator.translate_batch(
            [pieces], beam_size=1, max_decoding_length=limit, min_decoding_length=0
        )[0]
        assert [ids[piece] for piece in result.hypotheses[0]] == mine
    assert not model.variant.output_bias or any(
        len(mine) < limit for mine, limit in zip(ours, max_lengths(model, src, 6).tolist())
    )


# -------- export of a trained checkpoint ------------------------------------------------------------


def with_eos_bias(checkpoint, path, eos_bias: float):
    """The checkpoint with ``variant.output_bias`` on and ``eos_bias`` on EOS: the tiny model never stops
    by itself within its limit; with 2.25, 19 of the 24 test lines end (2.0: none, 2.5: all), so both
    endings are compared (and a bias is exported)."""
    state = torch.load(checkpoint, weights_only=True)
    state["config"]["variant"]["output_bias"] = True
    bias = torch.zeros(state["model"]["output_proj.weight"].size(0))  # (V,)
    bias[3] = eos_bias
    state["model"]["output_proj.bias"] = bias
    torch.save(state, path)
    return path


def test_a_checkpoint_with_the_variant_under_model_reads_as_the_same_model(tiny_checkpoint, tmp_path):
    """A checkpoint written when the variant's keys were ``model`` keys (``model.output_bias``, ...)."""
    from transformer.interop.formats import load_model

    now = with_eos_bias(tiny_checkpoint, tmp_path / "now.pt", 2.25)
    state = torch.load(now, weights_only=True)
    state["config"]["model"].update(state["config"].pop("variant"))
    torch.save(state, tmp_path / "before.pt")
    (model, _, config), (old_model, _, old_config) = load_model(now), load_model(tmp_path / "before.pt")
    assert old_config == config and old_model.variant.output_bias and int(old_model.output_proj.bias[3]) == 2
    src = torch.tensor([[5, 6, 7, 3]])
    assert torch.equal(old_model(src, src), model(src, src))


@pytest.mark.parametrize("eos_bias, pre_norm", [(None, False), (2.25, False), (None, True), (2.25, True)])
def test_export_decodes_as_our_greedy_in_transformers_and_ctranslate2(
    tiny_checkpoint, tmp_path, eos_bias, pre_norm
):
    """Post-norm exports as MarianMTModel, pre-norm as PegasusForConditionalGeneration (the Auto class
    reads which from config.json); both with the Marian tokenizer and the CTranslate2 model."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from helpers import DATA_DIR, as_pre_norm

    from transformer.interop.formats import load_model

    if eos_bias is not None:
        tiny_checkpoint = with_eos_bias(tiny_checkpoint, tmp_path / "biased.pt", eos_bias)
    if pre_norm:
        tiny_checkpoint = as_pre_norm(tiny_checkpoint, tmp_path / "pre_norm.pt")
    model, tokenizer, config = load_model(tiny_checkpoint)  # with a bias: a variant of the paper's model
    assert main(["export", str(tiny_checkpoint), str(tmp_path / "hf"), "--ct2", str(tmp_path / "ct2")]) == 0
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf_model).__name__ == ("PegasusForConditionalGeneration" if pre_norm else "MarianMTModel")
    hf_tokenizer = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    settings = hf_model.generation_config  # our greedy: start from BOS, never PAD or BOS, no forced EOS
    assert (settings.decoder_start_token_id, settings.pad_token_id, settings.eos_token_id) == (2, 0, 3)
    assert settings.bad_words_ids == [[0], [2]] and settings.forced_eos_token_id is None
    assert (hf_model.config.pad_token_id, hf_model.config.decoder_start_token_id) == (0, 2)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    with gzip.open(DATA_DIR / f"test_2016_flickr.{config.data.src_lang}.gz", "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(24)]
    offset, eos = config.eval.max_len_offset, tokenizer.eos_id
    ends = 0
    for line in lines:
        ids = hf_tokenizer(line).input_ids
        assert ids == tokenizer.encode(line) + [eos]  # the Marian tokenizer reads our pieces
        src = torch.tensor([ids])
        ours = greedy_decode(model, src, offset)[0]
        limit = int(max_lengths(model, src, offset)[0])
        theirs = hf_model.generate(input_ids=src, max_length=limit + 1)[0, 1:].tolist()  # saved settings
        ends += theirs[-1] == eos
        if theirs[-1] == eos:  # the saved limit (max_positions) only matters for sentences that run on
            assert hf_model.generate(input_ids=src)[0, 1:].tolist() == theirs
        assert ours == (theirs[:-1] if theirs[-1] == eos else theirs), line
        pieces = hf_tokenizer.convert_ids_to_tokens(ids)
        result = translator.translate_batch(
            [pieces], beam_size=1, max_decoding_length=limit, min_decoding_length=0
        )[0]
        assert hf_tokenizer.convert_tokens_to_ids(result.hypotheses[0]) == ours, line
    assert ends == 0 if eos_bias is None else 0 < ends < len(lines)  # the limit, and both endings
