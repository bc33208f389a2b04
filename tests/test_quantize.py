"""int8 decoding (transformer/quantize.py, translate.py --precision int8 | int8-bf16): every linear layer of a
copy of the model holds int8 weights with a scale per output channel, the rest of the copy is fp32 (int8) or
bf16 (int8-bf16), the model itself is left untouched, the logits stay close to fp32's while really
differing, and the quantized translator translates and scores like the fp32 one."""

import dataclasses
import os
import sys

import pytest
import torch
from torch import nn

import translate
from transformer.checkpoint import load_for_inference
from transformer.config import ModelConfig
from transformer.model import Transformer
from transformer.quantize import QUANTIZED, quantized_model
from transformer.translator import Translator

pytest.importorskip("torchao")

LINES = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
    "Ein Mädchen in einem Karateanzug bricht einen Stock mit einem Tritt.",
    "Fünf Leute in Winterjacken und mit Helmen stehen im Schnee mit Schneemobilen im Hintergrund.",
    "Leute Reparieren das Dach eines Hauses.",
    "Ein hell gekleideter Mann fotografiert eine Gruppe von Männern in dunklen Anzügen und mit Hüten.",
]


@pytest.mark.parametrize("precision", QUANTIZED)
def test_every_linear_layer_is_int8_per_channel_and_the_model_is_untouched(tiny_checkpoint, precision):
    model, tokenizer, _ = load_for_inference(tiny_checkpoint)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    quantized = quantized_model(model, precision)
    linears = {name: m for name, m in quantized.named_modules() if isinstance(m, nn.Linear)}
    assert {"encoder.layers.0.ffn.linear1", "decoder.layers.0.cross_attn.qkv_proj"} <= set(linears)
    tied = quantized.output_proj.weight  # the target embedding's matrix (§3.4): stored once, not quantized
    assert tied is quantized.decoder.embedding.embedding.weight and not hasattr(tied, "qdata")
    for name, linear in linears.items():
        if name != "output_proj":
            assert linear.weight.qdata.dtype == torch.int8, name
            assert linear.weight.scale.numel() == linear.out_features, name  # one scale per output channel
    rest = {name: p for name, p in quantized.named_parameters() if not hasattr(p, "qdata")}
    assert "encoder.layers.0.ffn_norm.weight" in rest and "encoder.embedding.embedding.weight" in rest
    for name, tensor in rest.items():  # embeddings, LayerNorm, biases: the dtype of the products
        assert tensor.dtype == (torch.bfloat16 if precision == "int8-bf16" else torch.float32), name
    for name, tensor in model.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, before[name]), name
    src = torch.tensor([tokenizer.encode(line) + [tokenizer.eos_id] for line in LINES[:1]])  # (1, S)
    tgt_in = torch.tensor([[tokenizer.bos_id] + tokenizer.encode("A man in an orange hat.")])  # (1, T)
    with torch.no_grad():
        reference, got = model(src, tgt_in), quantized(src, tgt_in).float()  # (1, T, V)
    error = ((got - reference).abs().max() / reference.abs().max()).item()
    assert 0 < error < 0.05, error


@pytest.mark.parametrize("precision", QUANTIZED)
def test_the_int8_translator_translates_like_fp32(tiny_checkpoint, capsys, tmp_path, precision):
    fp32 = Translator.from_checkpoint(tiny_checkpoint)
    int8 = Translator.from_checkpoint(tiny_checkpoint, precision=precision)
    assert isinstance(int8.model.decoder.layers[0].ffn.linear1.weight.qdata, torch.Tensor)
    same = sum(a == b for a, b in zip(fp32.translate(LINES), int8.translate(LINES)))
    assert same >= len(LINES) - 2, same
    scores = torch.tensor(int8.score(LINES[:2], ["A man in an orange hat.", "A dog runs on the grass."]))
    reference = torch.tensor(fp32.score(LINES[:2], ["A man in an orange hat.", "A dog runs on the grass."]))
    torch.testing.assert_close(scores, reference, rtol=0.05, atol=0.1)
    source = tmp_path / "in.de"
    source.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    argv = ["--checkpoint", str(tiny_checkpoint), "--input", str(source), "--precision", precision]
    assert translate.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == int8.translate(LINES)


@pytest.mark.parametrize("precision", ("bf16", *QUANTIZED))  # bf16 on the CPU: a bf16 copy of the model
def test_beam_search_nbest_and_prefixes_score_in_fp32_like_fp32(tiny_checkpoint, precision):
    """Beam search ranks by sums of log-probabilities: those stay fp32 (bf16 keeps 3 digits), equal to the
    low-precision model's teacher-forced scores and close to fp32's; n-best lists come best first; a prefix
    is kept and counted in the score."""
    fp32 = Translator.from_checkpoint(tiny_checkpoint)
    int8 = Translator.from_checkpoint(tiny_checkpoint, precision=precision)
    got, reference = (t.translate(LINES, beam=3, nbest=2) for t in (int8, fp32))
    assert sum(a[0] == b[0] for a, b in zip(got, reference)) >= len(LINES) - 2
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


def test_a_separate_output_projection_is_quantized():
    """Without shared embeddings (§3.4) the output projection is a linear layer like the others."""
    config = ModelConfig(d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1)
    model = Transformer(dataclasses.replace(config, share_embeddings=False), 50, 60, 0, 2, 3)
    for precision in QUANTIZED:
        quantized = quantized_model(model, precision)
        assert quantized.output_proj.weight.qdata.dtype == torch.int8, precision
        assert quantized.output_proj.weight.scale.numel() == 60, precision
        assert not hasattr(quantized.decoder.embedding.embedding.weight, "qdata"), precision


def test_int8_bf16_keeps_onednn_kernels_as_bf16_does(tiny_checkpoint, onednn_env):
    """Its products are bf16 matmuls, through oneDNN: the kernel cache is sized as for bf16 (runtime.py)."""
    Translator.from_checkpoint(tiny_checkpoint, precision="int8")
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ  # int8 multiplies in int8 and fp32
    Translator.from_checkpoint(tiny_checkpoint, precision="int8-bf16")
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "16384"


@pytest.mark.parametrize("precision", QUANTIZED)
def test_quantizing_needs_torchao_and_a_cpu_and_says_so(tiny_checkpoint, monkeypatch, precision):
    model, tokenizer, config = load_for_inference(tiny_checkpoint)
    with pytest.raises(ValueError, match=f"precision {precision} decodes on the CPU, not on cuda"):
        Translator(model, tokenizer, config.eval, "cuda", precision)  # refused before anything moves
    with pytest.raises(ValueError, match="quantized precisions are int8, int8-bf16, got 'fp8'"):
        quantized_model(model, "fp8")
    monkeypatch.setitem(sys.modules, "torchao.quantization", None)  # as if torchao were not installed
    with pytest.raises(ValueError, match=rf"--precision {precision} needs torchao: pip install -e \S+int8"):
        quantized_model(model, precision)
