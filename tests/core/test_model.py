"""Invariances of the whole model: no leak from the future, padding changes nothing, caching is exact."""

import pytest
import torch

from transformer.core.config import ModelConfig
from transformer.core.layers import EncoderLayer
from transformer.core.masks import causal_mask
from transformer.core.model import Transformer

V, PAD = 50, 0


def small_model(norm_first=False, share=True, **kw) -> Transformer:
    config = ModelConfig(
        d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2, n_decoder_layers=2, dropout=0.0,
        norm_first=norm_first, share_embeddings=share, **kw,
    )  # fmt: skip
    return Transformer(config, V, V, PAD, 2, 3).eval()


def random_tokens(B, T):
    return torch.randint(4, V, (B, T))


@pytest.mark.parametrize("norm_first", [False, True])
def test_future_target_tokens_do_not_change_the_past(norm_first):
    model = small_model(norm_first)
    src, tgt = random_tokens(2, 6), random_tokens(2, 8)
    changed = tgt.clone()
    changed[:, 5] = (changed[:, 5] + 1 - 4) % (V - 4) + 4  # a different token at position 5
    a, b = model(src, tgt), model(src, changed)
    assert (a[:, :5] - b[:, :5]).abs().max() == 0
    assert (a[:, 5:] - b[:, 5:]).abs().max() > 1e-4  # ...but the present and future do change


@pytest.mark.parametrize("norm_first", [False, True])
def test_appending_padding_changes_nothing(norm_first):
    model = small_model(norm_first)
    src, tgt = random_tokens(2, 6), random_tokens(2, 5)
    padded_src = torch.cat([src, torch.full((2, 4), PAD)], dim=1)
    padded_tgt = torch.cat([tgt, torch.full((2, 3), PAD)], dim=1)
    out = model(src, tgt)
    assert (model(padded_src, tgt) - out).abs().max() < 1e-5
    assert (model(padded_src, padded_tgt)[:, :5] - out).abs().max() < 1e-5


def test_padding_in_one_sentence_does_not_touch_another():
    """Batched = one by one: a sentence's output does not depend on its batch mates' lengths."""
    model = small_model()
    src = random_tokens(2, 7)
    src[1, 3:] = PAD
    tgt = random_tokens(2, 4)
    batched = model(src, tgt)
    alone = model(src[1:, :3], tgt[1:])
    assert (batched[1] - alone[0]).abs().max() < 1e-5


def test_encoder_without_positions_is_permutation_equivariant_and_causal_breaks_it():
    layers = [EncoderLayer(32, 4, 64, 0.0, norm_first=False) for _ in range(2)]
    x = torch.randn(2, 6, 32)
    perm = torch.randperm(6)

    def run(inp, mask):
        for layer in layers:
            inp, _ = layer(inp, mask)
        return inp

    assert (run(x, None)[:, perm] - run(x[:, perm], None)).abs().max() < 1e-5
    causal = causal_mask(6)
    assert (run(x, causal)[:, perm] - run(x[:, perm], causal)).abs().max() > 1e-3


@pytest.mark.parametrize("norm_first", [False, True])
def test_incremental_decoding_with_cache_equals_full_forward(norm_first):
    model = small_model(norm_first)
    src = random_tokens(3, 7)
    src[2, 4:] = PAD
    tgt = random_tokens(3, 9)
    full = model(src, tgt)  # (B, T, V)
    memory, src_mask, _ = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache)[0] for t in range(9)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5
    assert cache[0]["self"]["k"].shape == (3, 4, 9, 8)
    assert cache[0]["cross"]["k"].shape == (3, 4, 7, 8)


def test_selecting_cache_rows_continues_those_sentences_as_if_decoded_alone():
    """After 4 cached steps of 3 sentences, keep sentences 2 and 0 (reordered; the memory's rows too): the
    next steps equal decoding those two from the start. Without ``memory_rows`` the memory's are kept."""
    model = small_model(False)
    src, tgt = random_tokens(3, 7), random_tokens(3, 6)
    src[2, 4:] = PAD
    memory, src_mask, _ = model.encode(src)
    cache = model.new_cache()
    for t in range(4):
        model.decode(tgt[:, t : t + 1], memory, src_mask, cache)
    rows = torch.tensor([2, 0])
    model.select_cache_rows(cache, rows, memory_rows=rows)
    assert cache[0]["self"]["k"].shape == (2, 4, 4, 8) and cache[0]["cross"]["k"].shape == (2, 4, 7, 8)
    steps = [model.decode(tgt[rows, t : t + 1], memory[rows], src_mask[rows], cache)[0] for t in (4, 5)]
    alone = model(src[rows], tgt[rows])  # (2, 6, V)
    assert (torch.cat(steps, dim=1) - alone[:, 4:]).abs().max() < 1e-5
    memory_keys = cache[1]["cross"]["k"]
    model.select_cache_rows(cache, torch.tensor([1, 1]))  # the mechanics: row 1 twice, the memory's kept
    assert cache[1]["cross"]["k"] is memory_keys and cache[1]["self"]["k"].shape == (2, 4, 6, 8)
    assert torch.equal(cache[1]["self"]["k"][0], cache[1]["self"]["k"][1])


def test_shared_embeddings_are_tied_to_the_output_projection():
    model = small_model(share=True)
    assert model.output_proj.weight is model.decoder.embedding.weight
    assert model.encoder.embedding is model.decoder.embedding
    untied = small_model(share=False)
    assert untied.output_proj.weight is not untied.decoder.embedding.weight
    assert untied.encoder.embedding is not untied.decoder.embedding
    with pytest.raises(ValueError, match="src_vocab_size=10 and tgt_vocab_size=20"):
        Transformer(ModelConfig(d_model=32, n_heads=4), 10, 20, PAD, 2, 3)


def test_returns_every_layers_attention():
    model = small_model()
    src = random_tokens(2, 6)
    src[0, 4:] = PAD
    logits, attention = model(src, random_tokens(2, 5), return_attention=True)
    assert logits.shape == (2, 5, V)
    assert [w.shape for w in attention.encoder_self] == [(2, 4, 6, 6)] * 2
    assert [w.shape for w in attention.decoder_self] == [(2, 4, 5, 5)] * 2
    assert [w.shape for w in attention.cross] == [(2, 4, 5, 6)] * 2
    for w in attention.cross:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 5))
        assert torch.all(w[0, :, :, 4:] == 0)  # padded source tokens get no attention
    for w in attention.decoder_self:
        assert torch.all(w.triu(1) == 0)


def test_embedding_scale_and_positions():
    model = small_model()
    ids = torch.tensor([[5, 6]])
    torch.testing.assert_close(model.encoder.embedding(ids), model.encoder.embedding.weight[ids] * 32**0.5)
    table = model.encoder.positions.table
    torch.testing.assert_close(table[3, 0], torch.sin(torch.tensor(3.0)))
    torch.testing.assert_close(table[3, 1], torch.cos(torch.tensor(3.0)))
    torch.testing.assert_close(table[3, 2], torch.sin(torch.tensor(3.0 / 10000 ** (2 / 32))))
    with pytest.raises(ValueError, match="max_positions=16"):
        small_model(max_positions=16)(random_tokens(1, 20), random_tokens(1, 3))
