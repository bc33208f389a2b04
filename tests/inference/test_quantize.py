"""int8 decoding (transformer/inference/quantize.py, translate.py --precision int8 | int8-bf16): every
linear layer of a
copy of the model multiplies in int8 (torchao's per-channel weights, inputs quantized per row as torchao
does, oneDNN's int8 kernel summing exactly what the int8 values say), the rest of the copy is fp32 (int8) or
bf16 (int8-bf16), the model itself is left untouched, the logits stay close to fp32's while really
differing, and the quantized translator translates and scores like the fp32 one."""

import dataclasses
import os
import sys

import pytest
import torch
from helpers import cpu_with
from torch import nn

from transformer.commands import translate
from transformer.core.config import ModelConfig
from transformer.core.model import Transformer
from transformer.inference import quantize
from transformer.inference.quantize import (
    QUANTIZED,
    Int8Attention,
    Int8Linear,
    quantize_per_row,
    quantized_model,
)
from transformer.inference.translator import Translator
from transformer.runtime.checkpoints import load_for_inference

pytest.importorskip("torchao")
from torchao.quantization.quant_primitives import (  # noqa: E402  (after the skip)
    MappingType,
    choose_qparams_affine,
    quantize_affine,
)

LINES = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
    "Ein Mädchen in einem Karateanzug bricht einen Stock mit einem Tritt.",
    "Fünf Leute in Winterjacken und mit Helmen stehen im Schnee mit Schneemobilen im Hintergrund.",
    "Leute Reparieren das Dach eines Hauses.",
    "Ein hell gekleideter Mann fotografiert eine Gruppe von Männern in dunklen Anzügen und mit Hüten.",
]


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("qmax", (127, 63))  # 63: a CPU without VNNI (torchao's reduce_range)
def test_inputs_are_quantized_per_row_as_torchao_quantizes_them(dtype, qmax):
    """As torchao quantizes an fp32 input; a bf16 input as its exact fp32 values (torchao would compute
    a bf16 input's scales in bf16)."""
    torch.manual_seed(0)
    x = torch.cat([torch.randn(30, 64) * 3 + 1, torch.rand(5, 64) + 0.5, torch.zeros(1, 64)]).to(dtype)
    values, scale = quantize_per_row(x, qmax)  # (36, 64) uint8, (36, 1)
    theirs = choose_qparams_affine(
        x.float(), MappingType.SYMMETRIC, (1, 64), torch.int8, quant_min=-qmax - 1, quant_max=qmax,
        eps=torch.finfo(torch.float32).eps,
    )  # fmt: skip
    assert values.dtype == torch.uint8 and scale.shape == (36, 1)
    torch.testing.assert_close(scale, theirs[0].reshape(36, 1), rtol=0, atol=0)
    expected = quantize_affine(x.float(), (1, 64), *theirs, torch.int8, quant_min=-qmax - 1, quant_max=qmax)
    assert torch.equal(values.int() - 128, expected.int())  # int8 values, shifted into uint8 by 128
    assert int(values.max()) == 128 + qmax  # each row's largest magnitude uses the whole range


@pytest.mark.parametrize("out_dtype", (torch.float32, torch.bfloat16))
@pytest.mark.parametrize("bias", (True, False))
def test_an_int8_linear_layer_sums_exactly_its_int8_values(out_dtype, bias):
    """oneDNN's products = the dequantized input times the dequantized weight, + the bias, to float
    rounding: no scale, zero point or bias lost or applied twice; and close to the fp32 layer."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    x = torch.randn(3, 7, 64) * 2 + 0.5  # (B, T, in)
    layer = Int8Linear.quantize(linear.weight, linear.bias, out_dtype, "int8")
    got = layer(x)  # (3, 7, 48)
    assert got.shape == (3, 7, 48) and got.dtype == out_dtype
    values, scale = quantize_per_row(x.reshape(-1, 64), layer.input_max)  # (21, 64), (21, 1)
    inputs = (values.double() - 128) * scale.double()  # (21, 64) what the int8 values say
    weight = layer.weight_int8.double() * layer.weight_scale.double()[:, None]  # (48, 64)
    exact = inputs @ weight.T + (linear.bias.double() if bias else 0)  # (21, 48)
    tolerance = 1e-5 if out_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), exact.reshape(3, 7, 48), rtol=tolerance, atol=tolerance)
    assert int(layer.weight_int8.abs().max()) >= layer.input_max  # the largest weight uses the whole range
    reference = linear(x).detach()  # (3, 7, 48)
    error = ((got.float() - reference).abs().max() / reference.abs().max()).item()
    assert 0 < error < 0.03, error


def test_a_row_is_multiplied_the_same_whatever_the_other_rows():
    """One scale per row: a sentence's int8 products do not depend on the other sentences of its batch
    (with one scale per tensor, a row with larger values would coarsen every other row)."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    layer = Int8Linear.quantize(linear.weight, linear.bias, torch.float32, "int8")
    x = torch.randn(6, 64)
    x[5] *= 50  # (6, 64) one row of much larger values
    together = layer(x)  # (6, 48)
    for row in range(6):
        assert torch.equal(layer(x[row : row + 1]), together[row : row + 1]), row


def test_a_cpu_without_vnni_keeps_one_bit_less(monkeypatch):
    """torchao's reduce_range: weights in [-64, 63], inputs in [-64, 63] (64 to 191 shifted), so that
    16-bit sums cannot overflow."""
    import torchao.utils

    monkeypatch.setattr(torchao.utils, "should_reduce_range", lambda device: True)
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    layer = Int8Linear.quantize(linear.weight, linear.bias, torch.float32, "int8")
    assert layer.input_max == 63
    assert int(layer.weight_int8.min()) >= -64 and int(layer.weight_int8.max()) <= 63
    x = torch.randn(5, 64)
    values, _ = quantize_per_row(x, layer.input_max)  # (5, 64)
    assert int(values.min()) >= 64 and int(values.max()) <= 191  # -64..63, shifted by 128
    torch.testing.assert_close(layer(x), linear(x).detach(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("precision", QUANTIZED)
def test_every_linear_layer_is_int8_per_channel_and_the_model_is_untouched(tiny_checkpoint, precision):
    model, tokenizer, _ = load_for_inference(tiny_checkpoint)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    quantized = quantized_model(model, precision)
    assert not any(isinstance(m, nn.Linear) for m in quantized.modules())
    int8 = {name: m for name, m in quantized.named_modules() if isinstance(m, Int8Linear)}
    named = {"encoder.layers.0.ffn.linear1", "decoder.layers.0.cross_attn.qkv_proj", "output_proj"}
    assert named <= int8.keys()
    originals = dict(model.named_modules())
    for name, layer in int8.items():
        weight = originals[name].weight.detach()  # (out, in) fp32
        assert layer.weight_int8.dtype == torch.int8 and layer.weight_scale.shape == (layer.out_features,)
        restored = layer.weight_int8.float() * layer.weight_scale[:, None]  # one scale per output channel
        assert ((restored - weight).abs() <= layer.weight_scale[:, None] / 2 + 1e-7).all(), name
    low = torch.bfloat16 if precision == "int8-bf16" else torch.float32
    assert int8["output_proj"].out_dtype == torch.float32  # fp32 logits
    assert int8["decoder.layers.0.ffn.linear1"].out_dtype == low
    rest = dict(quantized.named_parameters())  # embeddings, LayerNorm: the precision of the rest
    assert "encoder.layers.0.ffn_norm.weight" in rest and "encoder.embedding.embedding.weight" in rest
    assert all(tensor.dtype == low for tensor in rest.values())
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, before[name]), name
    src = torch.tensor([tokenizer.encode(line) + [tokenizer.eos_id] for line in LINES[:1]])  # (1, S)
    tgt_in = torch.tensor([[tokenizer.bos_id] + tokenizer.encode("A man in an orange hat.")])  # (1, T)
    with torch.no_grad():
        reference, got = model(src, tgt_in), quantized(src, tgt_in)  # (1, T, V)
    assert got.dtype == torch.float32
    error = ((got - reference).abs().max() / reference.abs().max()).item()
    assert 0 < error < 0.05, error


def test_cross_attention_projects_keys_and_values_in_int8():
    """Cross-attention multiplies parts of the packed projection (``input_projection``): those are int8
    too, each the right rows, in a module swapped for its int8 twin."""
    torch.manual_seed(0)
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1)
    model = Transformer(config, 50, 50, 0, 2, 3).eval()
    quantized = quantized_model(model, "int8")
    attention, reference = quantized.decoder.layers[0].cross_attn, model.decoder.layers[0].cross_attn
    query, memory = torch.randn(2, 3, 32), torch.randn(2, 5, 32)  # (B, T, D), (B, S, D)
    with torch.no_grad():
        got, expected = attention(query, memory, memory)[0], reference(query, memory, memory)[0]  # (2, 3, 32)
        for part in (slice(0, 32), slice(32, 96), slice(64, 96)):
            torch.testing.assert_close(
                attention.input_projection(memory, part),
                reference.input_projection(memory, part),
                rtol=0.05,
                atol=0.05,
            )
            # the part's rows of the whole int8 projection, exactly: the same int8 values and scales
            assert torch.equal(
                attention.input_projection(memory, part), attention.qkv_proj(memory)[..., part]
            )
    assert isinstance(attention, Int8Attention) and not any(
        isinstance(m, nn.Linear) for m in attention.modules()
    )
    torch.testing.assert_close(got, expected, rtol=0.05, atol=0.05)
    assert not torch.equal(got, expected)


@pytest.mark.parametrize("precision", QUANTIZED)
def test_the_int8_translator_translates_like_fp32(tiny_checkpoint, capsys, tmp_path, monkeypatch, precision):
    fp32 = Translator.from_checkpoint(tiny_checkpoint)
    int8 = Translator.from_checkpoint(tiny_checkpoint, precision=precision)
    assert isinstance(int8.model.decoder.layers[0].ffn.linear1, Int8Linear)
    same = sum(a == b for a, b in zip(fp32.translate(LINES), int8.translate(LINES)))
    assert same >= len(LINES) - 2, same
    scores = torch.tensor(int8.score(LINES[:2], ["A man in an orange hat.", "A dog runs on the grass."]))
    reference = torch.tensor(fp32.score(LINES[:2], ["A man in an orange hat.", "A dog runs on the grass."]))
    torch.testing.assert_close(scores, reference, rtol=0.05, atol=0.1)
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(source), "--precision", precision]
    cpu_with(monkeypatch, "amx_tile")  # bf16 is the faster choice there, and the command says so
    assert translate.main(argv) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == int8.translate(LINES)
    assert f"warning: --precision {precision}: this CPU multiplies bf16 matrices with AMX" in err
    cpu_with(monkeypatch, "avx512_bf16", "vnni")  # bf16 and int8 level there: no such claim
    assert translate.main(argv) == 0 and "bf16 decodes faster" not in capsys.readouterr().err


@pytest.mark.parametrize("precision", ("bf16", *QUANTIZED))  # bf16 on the CPU: a bf16 copy of the model
def test_beam_search_nbest_and_prefixes_score_in_fp32_like_fp32(tiny_checkpoint, precision):
    """Beam search ranks by sums of log-probabilities: those stay fp32 (bf16 keeps 3 digits), equal to the
    low-precision model's teacher-forced scores and close to fp32's; n-best lists come best first; a prefix
    is kept and counted in the score."""
    fp32 = Translator.from_checkpoint(tiny_checkpoint)
    int8 = Translator.from_checkpoint(tiny_checkpoint, precision=precision)
    got, reference = (t.translate(LINES, beam=3, nbest=2) for t in (int8, fp32))
    # the tiny model's beams end in runs of "a a a": near ties, which bf16 alone flips in 2 of 6
    assert sum(a[0] == b[0] for a, b in zip(got, reference)) >= len(LINES) // 2
    sources = int8.encode(LINES)
    prefixes = [int8.tokenizer.encode("A dog")] + [[]] * (len(LINES) - 1)
    for found in (int8.translate_ids(sources, 3, 2), int8.translate_ids(sources, 3, 2, prefixes=prefixes)):
        assert all(len(hyps) == 2 and hyps[0].score >= hyps[1].score for hyps in found)
        pairs = [(src, h) for src, hyps in zip(sources, found) for h in hyps]  # both of each n-best list
        args = [src for src, _ in pairs], [h.ids for _, h in pairs], [h.ended for _, h in pairs]
        searched = torch.tensor([h.log_prob for _, h in pairs])
        torch.testing.assert_close(searched, torch.tensor(int8.score_ids(*args)), rtol=0.01, atol=0.01)
        torch.testing.assert_close(searched, torch.tensor(fp32.score_ids(*args)), rtol=0.05, atol=0.1)
    assert all(h.ids[: len(prefixes[0])] == prefixes[0] for h in found[0])


def test_a_separate_output_projection_is_quantized_like_a_tied_one():
    """Tied to the target embedding (§3.4) or not, the output projection multiplies in int8 and the
    embedding keeps its own float matrix."""
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1)
    model = Transformer(dataclasses.replace(config, share_embeddings=False), 50, 60, 0, 2, 3)
    for precision in QUANTIZED:
        quantized = quantized_model(model, precision)
        assert isinstance(quantized.output_proj, Int8Linear), precision
        assert quantized.output_proj.weight_scale.numel() == 60, precision
        assert quantized.decoder.embedding.weight.dtype.is_floating_point, precision


@pytest.mark.parametrize("precision", QUANTIZED)
def test_int8_keeps_onednn_kernels_as_bf16_does(tiny_checkpoint, onednn_env, monkeypatch, precision):
    """Its products are oneDNN kernels, one per shape: the kernel cache is sized as for bf16 (runtime.py),
    before the first int8 layer is built (laying out its weight is oneDNN's first primitive)."""
    sized_before = []
    building = quantize.Int8Linear.__init__

    def build(self, *args, **kwargs):
        sized_before.append(os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"))
        building(self, *args, **kwargs)

    monkeypatch.setattr(quantize.Int8Linear, "__init__", build)
    Translator.from_checkpoint(tiny_checkpoint, precision=precision)
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16384"
    assert sized_before and set(sized_before) == {"16384"}


@pytest.mark.parametrize("precision", QUANTIZED)
def test_quantizing_needs_torchao_and_a_cpu_and_says_so(tiny_checkpoint, monkeypatch, precision):
    model, tokenizer, config = load_for_inference(tiny_checkpoint)
    with pytest.raises(ValueError, match=f"precision {precision} decodes on the CPU, not on cuda"):
        Translator(model, tokenizer, config.eval, "cuda", precision)  # refused before anything moves
    with pytest.raises(ValueError, match="quantized precisions are int8, int8-bf16, got 'fp8'"):
        quantized_model(model, "fp8")
    monkeypatch.setattr(quantize, "has_onednn_int8", lambda: False)  # a PyTorch without oneDNN's int8
    with pytest.raises(ValueError, match=rf"--precision {precision} needs PyTorch's oneDNN int8 kernels"):
        quantized_model(model, precision)
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # as if torchao were not installed
    with pytest.raises(ValueError, match=rf"--precision {precision} needs torchao: pip install -e \S+int8"):
        quantized_model(model, precision)
