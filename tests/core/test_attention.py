"""Eq. 1 and multi-head attention against PyTorch's own, plus the mistakes these tests must catch."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.core.attention import (
    MultiHeadAttention,
    attention_weights,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)
from transformer.core.masks import causal_mask
from transformer.reference.pytorch_oracle import (
    max_diff_vs_reference,
    mha_max_diff_vs_torch,
    random_padding_mask,
    random_qkv,
)

# ---------------------------------------------------------------- worked examples (exact numbers)


def test_worked_example_cross():
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    k = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    v = torch.tensor([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])
    out, weights = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(weights[0], torch.tensor([0.576, 0.140, 0.284]), atol=1e-3, rtol=0)
    expected = torch.tensor([[7.18, 2.82], [2.82, 7.18], [5.0, 5.0]])
    torch.testing.assert_close(out, expected, atol=5e-3, rtol=0)


def test_worked_example_self_and_causal():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out, _ = scaled_dot_product_attention(x, x, x)
    expected = torch.tensor([[0.802, 0.599], [0.599, 0.802], [0.752, 0.752]])
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=0)
    out, weights = scaled_dot_product_attention(x, x, x, causal_mask(3))
    expected = torch.tensor([[1.0, 0.0], [0.330, 0.670], [0.752, 0.752]])
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=0)
    assert torch.all(weights.triu(1) == 0), "a query attended to a future key"


# ---------------------------------------------------------------- against F.scaled_dot_product_attention


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "random"])
def test_matches_torch_float64(mask_kind):
    assert max_diff_vs_reference(scaled_dot_product_attention, torch.float64, mask_kind) < 1e-12


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "random"])
def test_matches_torch_float32(mask_kind):
    assert max_diff_vs_reference(scaled_dot_product_attention, torch.float32, mask_kind) < 1e-6


def test_matches_torch_is_causal_and_extra_batch_dims():
    q, k, v = random_qkv((2, 3), 4, 6, 6, 8, 8, torch.float64)  # two leading batch dims
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out, weights = scaled_dot_product_attention(q, k, v, causal_mask(6))
    assert (out - expected).abs().max() < 1e-12
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4, 6, dtype=torch.float64))


# ---------------------------------------------------------------- the additive float mask (0 / -inf)


def test_additive_causal_mask_matches_torch_and_the_boolean_mask():
    q, k, v = random_qkv((2,), 4, 7, 7, 8, 8, torch.float64)
    additive = torch.nn.Transformer.generate_square_subsequent_mask(7, dtype=torch.float64)  # 0 / -inf
    out, weights = scaled_dot_product_attention(q, k, v, additive)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    assert (out - expected).abs().max() < 1e-12
    out_bool, weights_bool = scaled_dot_product_attention(q, k, v, causal_mask(7))
    assert torch.equal(out, out_bool) and torch.equal(weights, weights_bool)
    assert torch.all(weights.triu(1) == 0)


def test_additive_mask_with_finite_biases_matches_torch_values_and_gradients():
    q, k, v = random_qkv((2,), 2, 4, 5, 3, 3, torch.float64, requires_grad=True)
    bias = torch.randn(2, 1, 4, 5, dtype=torch.float64)  # finite numbers added to the scores...
    bias[0, :, :, 3:] = float("-inf")  # ...and blocked keys
    ours = scaled_dot_product_attention(q, k, v, bias)[0]
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert (ours - theirs).abs().max() < 1e-12
    grads = torch.autograd.grad(ours.sum(), (q, k, v)), torch.autograd.grad(theirs.sum(), (q, k, v))
    for a, b in zip(*grads):
        assert (a - b).abs().max() < 1e-12


def test_fully_blocked_row_of_an_additive_mask_gives_zeros_not_nan():
    q, k, v = random_qkv((1,), 1, 3, 4, 8, 8, torch.float32, requires_grad=True)
    additive = torch.zeros(3, 4)
    additive[1] = float("-inf")  # query 1 may attend to nothing
    out, weights = scaled_dot_product_attention(q, k, v, additive)
    assert torch.all(out[0, :, 1] == 0) and torch.all(weights[0, :, 1] == 0)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_gradients_match_gradcheck():
    q, k, v = random_qkv((2,), 2, 4, 5, 3, 3, torch.float64, requires_grad=True)
    mask = random_padding_mask(2, 5)
    assert torch.autograd.gradcheck(lambda *t: scaled_dot_product_attention(*t, mask)[0], (q, k, v))
    # and the gradients equal PyTorch's
    ours = torch.autograd.grad(scaled_dot_product_attention(q, k, v, mask)[0].sum(), (q, k, v))
    theirs = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, mask).sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        assert (a - b).abs().max() < 1e-12


def test_padded_keys_get_exactly_zero_weight():
    q, k, v = random_qkv((3,), 2, 4, 6, 8, 8, torch.float32)
    mask = random_padding_mask(3, 6)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_row_gives_zeros_not_nan(dtype):
    q, k, v = random_qkv((2,), 2, 3, 4, 8, 8, torch.float32, requires_grad=True)
    mask = torch.ones(2, 1, 3, 4, dtype=torch.bool)
    mask[0, :, 1] = False  # query 1 of sentence 0 may attend to nothing
    out, weights = scaled_dot_product_attention(*(t.to(dtype) for t in (q, k, v)), mask)
    assert not torch.isnan(out).any() and not torch.isnan(weights).any()
    assert torch.all(out[0, :, 1] == 0) and torch.all(weights[0, :, 1] == 0)
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fully_masked_row_under_autocast(dtype):
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    mask[1] = True  # sentence 0 is all padding
    with torch.autocast("cpu", dtype=dtype):
        out, weights = mha(x, x, x, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert torch.all(weights[0] == 0)


# ---------------------------------------------------------------- the classic mistakes are caught


def no_scale(q, k, v, mask):
    scores = q @ k.transpose(-2, -1)  # forgot / √d_k
    scores = scores.masked_fill(~mask, float("-inf")) if mask is not None else scores
    return torch.softmax(scores, -1) @ v, None


def mask_after_softmax(q, k, v, mask):
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), -1)
    weights = weights.masked_fill(~mask, 0.0) if mask is not None else weights  # not renormalised
    return weights @ v, None


def mask_with_zero(q, k, v, mask):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~mask, 0.0) if mask is not None else scores  # 0 is not -inf
    return torch.softmax(scores, -1) @ v, None


@pytest.mark.parametrize("mistake", [no_scale, mask_after_softmax, mask_with_zero])
def test_classic_mistakes_are_detected(mistake):
    assert max_diff_vs_reference(mistake, torch.float64, "padding") > 1e-3


def bad_split_heads(x, n_heads):
    B, T, D = x.shape
    return x.reshape(B, n_heads, T, D // n_heads)  # no transpose: mixes time steps into heads


def bad_merge_heads(x):
    B, H, T, Dh = x.shape
    return x.reshape(B, T, H * Dh)


def test_head_split_without_transpose_is_detected(monkeypatch):
    assert mha_max_diff_vs_torch() < 1e-5
    monkeypatch.setattr("transformer.core.attention.split_heads", bad_split_heads)
    monkeypatch.setattr("transformer.core.attention.merge_heads", bad_merge_heads)
    assert mha_max_diff_vs_torch() > 1e-3


def test_split_merge_round_trip_and_layout():
    x = torch.arange(2 * 3 * 8.0).view(2, 3, 8)
    heads = split_heads(x, 4)  # (B, H, T, Dh)
    assert heads.shape == (2, 4, 3, 2)
    torch.testing.assert_close(heads[1, 2, 0], x[1, 0, 4:6])  # head 2 of token 0 = features 4..5
    torch.testing.assert_close(merge_heads(heads), x)


# ---------------------------------------------------------------- MultiHeadAttention vs nn.MultiheadAttention


@pytest.mark.parametrize("d_model,n_heads", [(32, 4), (24, 3), (16, 1)])
def test_multihead_matches_torch(d_model, n_heads):
    assert mha_max_diff_vs_torch(d_model, n_heads) < 1e-5


def test_parameter_count_is_4d2_plus_4d():
    d = 64
    assert sum(p.numel() for p in MultiHeadAttention(d, 8).parameters()) == 4 * d * d + 4 * d


def test_invalid_head_count_names_the_values():
    with pytest.raises(ValueError, match="d_model=30 is not divisible by n_heads=4"):
        MultiHeadAttention(30, 4)


def test_cached_self_attention_equals_full():
    mha = MultiHeadAttention(32, 4).eval()
    x = torch.randn(2, 7, 32)
    full, _ = mha(x, x, x, causal_mask(7))
    cache: dict = {}
    steps = [mha(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], None, cache)[0] for t in range(7)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-6
    assert cache["k"].shape == (2, 4, 7, 8)


def test_cross_attention_cache_computed_once():
    mha = MultiHeadAttention(32, 4, self_attention=False).eval()
    memory, cache = torch.randn(2, 5, 32), {}
    mha(torch.randn(2, 1, 32), memory, memory, None, cache)
    k_first = cache["k"]
    out, _ = mha(torch.randn(2, 1, 32), torch.zeros(0), torch.zeros(0), None, cache)  # memory unused now
    assert cache["k"] is k_first and out.shape == (2, 1, 32)


def test_attention_weights_compile_into_one_graph_with_fully_masked_rows_zeroed():
    """On the CPU the eager code asks whether a row is fully masked before zeroing it; compiled, that
    question would break the graph, so the zeroing is unconditional (the same weights)."""
    import torch._dynamo

    q, k = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 5, 4)  # (B, H, Tq, d_k), (B, H, Tk, d_k)
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    mask[1, :, 2] = False  # a fully masked row
    torch._dynamo.reset()
    explained = torch._dynamo.explain(attention_weights)(q, k, mask)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(attention_weights, backend="eager")(q, k, mask)
    assert torch.equal(compiled, attention_weights(q, k, mask)) and compiled[1, :, 2].abs().sum() == 0
