"""Decoding on prepacked weights (transformer/fast/prepacked.py): inside ``packed_decoder`` the decoder's
linear layers and the output layer give F.linear's numbers, the searches give the same tokens, the weights
are the ones of the moment the block is entered, and the layers get their own forward back, whatever
happens in the block. Where packing cannot be used (autograd, bf16, quantized weights), nothing is touched."""

import dataclasses

import pytest
import torch
from helpers import random_model, random_sources
from torch import nn

from transformer.core.decoding import beam_search, greedy_decode
from transformer.fast import prepacked as packed
from transformer.fast.prepacked import WORTH_PACKING, packed_decoder
from transformer.inference.translator import Translator
from transformer.runtime.search import search

if not torch.backends.mkldnn.is_available():  # every PyTorch wheel for x86 and ARM CPUs has oneDNN
    pytest.fail("this PyTorch has no oneDNN: decoding runs on F.linear, and these tests cannot check packing")


def fp32_model(seed: int = 0):
    return random_model(seed, eos_bias=1.0).float()


def packed_layers(model) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, packed.PackedLinear)]


def test_inside_the_block_the_decoder_and_output_layers_are_packed_and_give_f_linear(monkeypatch):
    model = fp32_model()
    x = torch.randn(5, 1, model.config.d_model)  # (rows, 1, D): a decoding step
    decoder_linears = [m for m in model.decoder.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        reference = [model.output_proj(x), model.decoder.layers[0].ffn.linear1(x)]
        with packed_decoder(model):
            packed = packed_layers(model)
            got = [model.output_proj(x), model.decoder.layers[0].ffn.linear1(x)]
    assert len(packed) == len(decoder_linears) + 1  # the decoder's and the output layer, not the encoder's
    assert {id(m.weight) for m in packed} == {id(m.weight) for m in decoder_linears + [model.output_proj]}
    for want, have in zip(reference, got):
        torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
    assert packed_layers(model) == []  # each layer back in its place
    assert [m for m in model.decoder.modules() if isinstance(m, nn.Linear)] == decoder_linears


def test_greedy_and_beam_search_give_the_same_tokens_packed():
    model, src = fp32_model(1), random_sources(1, batch=12)
    with torch.no_grad():
        plain = greedy_decode(model, src, 10), beam_search(model, src, 3, 0.6, 10)
        with packed_decoder(model):
            packed = greedy_decode(model, src, 10), beam_search(model, src, 3, 0.6, 10)
    assert packed == plain


def test_the_weights_are_those_of_the_moment_the_block_is_entered():
    """As validation between training updates: the fused Adam step changes the weights in place without
    bumping their version counter, so the second block must pack them again, not reuse the first's."""
    model, x = fp32_model(2), torch.randn(3, 1, 16)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    with torch.no_grad(), packed_decoder(model):
        before = model.output_proj(x)
    model.train()
    model(random_sources(2), random_sources(3)).sum().backward()
    optimizer.step()
    model.eval()
    with torch.no_grad():
        want = model.output_proj(x)
        with packed_decoder(model):
            got = model.output_proj(x)
    assert not torch.allclose(want, before)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_layers_get_their_forward_back_after_an_error():
    model = fp32_model()
    with pytest.raises(RuntimeError, match="stop"), torch.no_grad(), packed_decoder(model):
        assert packed_layers(model)
        raise RuntimeError("stop")
    assert packed_layers(model) == []


def test_nothing_is_packed_with_autograd_in_bf16_or_when_not_enabled():
    model = fp32_model()
    with packed_decoder(model):  # autograd on: the packed kernel has no backward
        assert packed_layers(model) == []
    with torch.no_grad():
        with packed_decoder(model, enabled=False):
            assert packed_layers(model) == []
        bf16 = model.to(torch.bfloat16)
        with packed_decoder(bf16):
            assert packed_layers(bf16) == []


def test_quantized_weights_are_not_packed(tiny_checkpoint):
    pytest.importorskip("torchao")
    translator = Translator.from_checkpoint(tiny_checkpoint, precision="int8")
    with torch.no_grad(), packed_decoder(translator.model):
        assert packed_layers(translator.model) == []


def test_the_translator_packs_the_searches_worth_it(tiny_checkpoint, monkeypatch):
    translator = Translator.from_checkpoint(tiny_checkpoint)
    packs = []
    real = packed.PackedLinear
    monkeypatch.setattr(packed, "PackedLinear", lambda linear: packs.append(linear) or real(linear))
    many = translator.translate(["Ein Hund läuft."] * WORTH_PACKING, beam=2)
    n_linears = len([m for m in translator.model.decoder.modules() if isinstance(m, nn.Linear)]) + 1
    assert len(packs) == n_linears  # each decoder linear and the output layer, once for the whole search
    few = translator.translate(["Ein Hund läuft."] * (WORTH_PACKING - 1), beam=2)
    assert len(packs) == n_linears and few[0] == many[0]  # not worth packing: F.linear, the same line
    translator.translate(["Ein Hund läuft."] * WORTH_PACKING)  # greedy: not packed
    assert len(packs) == n_linears


def test_the_core_search_packs_as_the_translator_does_so_the_final_test_and_translate_py_agree(
    tiny_checkpoint, monkeypatch
):
    translator = Translator.from_checkpoint(tiny_checkpoint)
    packs = []
    real = packed.PackedLinear
    monkeypatch.setattr(packed, "PackedLinear", lambda linear: packs.append(linear) or real(linear))
    sources = translator.encode(["Ein Hund läuft.", "Zwei Männer sitzen."] * (WORTH_PACKING // 2))
    beam2 = dataclasses.replace(translator.settings, beam_size=2)
    ours = search(translator.model, sources, beam2, kernels=translator.kernels)
    assert len(packs) == len(packed_layers_of(translator.model))  # packed once, for the whole search
    assert ours == translator.search(sources, beam2)  # the Translator's lines
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast: never on fp32 prepacked weights
        search(translator.model, sources, beam2, kernels=translator.kernels)
    greedy = dataclasses.replace(beam2, beam_size=1)
    search(translator.model, sources, greedy, kernels=translator.kernels)  # greedy: not packed
    assert len(packs) == 2 * len(packed_layers_of(translator.model))  # the Translator's own search only


def packed_layers_of(model) -> list[nn.Linear]:
    return [m for m in model.decoder.modules() if isinstance(m, nn.Linear)] + [model.output_proj]
