"""The fast tier's multi-head attention against the plain module: cache appends that take the rows a search
left (one copy), and beams that share their sentence's memory in cross-attention."""

import pytest
import torch

from transformer.core.attention import MultiHeadAttention
from transformer.fast.attention import FastMultiHeadAttention, append_step
from transformer.fast.twins import twin


def test_cached_self_attention_with_reordered_rows_equals_reordering_first():
    """A fast search that reorders its hypotheses leaves ``rows`` in the cache (``select_cache_rows``); the
    next step takes those rows of the past keys / values and appends its own: the same as the plain
    module's index_select, then cat (rows repeated, dropped and swapped, two selections before one step as
    beam search makes when sentences finish, and a first step that grows a row per sentence into several)."""
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4).eval().requires_grad_(False)  # as in decoding
    mha = twin(plain, FastMultiHeadAttention)
    x = torch.randn(2, 1, 32)
    deferred, eager = {}, {}
    mha(x, x, x, None, deferred), plain(x, x, x, None, eager)
    selections = [[torch.tensor([1, 1, 0])], [torch.tensor([2, 0, 0, 1]), torch.tensor([3, 1])]]
    selections.append([torch.tensor([1])])
    for selections_before_step in selections:
        for rows in selections_before_step:
            mha.select_cache_rows(deferred, rows), plain.select_cache_rows(eager, rows)
        y = torch.randn(selections_before_step[-1].numel(), 1, 32)
        out_deferred, _ = mha(y, y, y, None, deferred)
        out_eager, _ = plain(y, y, y, None, eager)
        assert "rows" not in deferred and deferred["k"].is_contiguous()
        assert torch.equal(out_deferred, out_eager)
        assert torch.equal(deferred["k"], eager["k"]) and torch.equal(deferred["v"], eager["v"])


def test_cross_attention_cache_is_stored_contiguously_from_the_second_step_with_the_same_results():
    """The memory's keys / values are views of one projection on the first step; the fast twin stores them
    contiguously when it reuses them (so no later step copies them), with the same outputs as the plain
    module, and selects their rows as the plain module does."""
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4, self_attention=False).eval().requires_grad_(False)
    mha = twin(plain, FastMultiHeadAttention)
    memory, fast_cache, plain_cache = torch.randn(3, 5, 32), {}, {}
    for step, rows in enumerate((None, None, torch.tensor([2, 0]), None)):
        if rows is not None:
            mha.select_cache_rows(fast_cache, rows), plain.select_cache_rows(plain_cache, rows)
        y = torch.randn(fast_cache["k"].size(0) if fast_cache else 3, 1, 32)
        out_fast, _ = mha(y, memory, memory, None, fast_cache)
        out_plain, _ = plain(y, memory, memory, None, plain_cache)
        assert torch.equal(out_fast, out_plain) and torch.equal(fast_cache["k"], plain_cache["k"])
        assert fast_cache["k"].is_contiguous() == (step > 0) and fast_cache["v"].is_contiguous() == (step > 0)


def test_append_step_takes_the_rows_then_the_new_step():
    past, new = torch.randn(3, 2, 4, 5), torch.randn(4, 2, 1, 5)  # (B', H, T, Dh), (B, H, 1, Dh)
    rows = torch.tensor([2, 0, 2, 1])
    expected = torch.cat([past[rows], new], dim=2)  # (B, H, T + 1, Dh)
    assert torch.equal(append_step(past, new, rows), expected)
    past.requires_grad_(True)  # out= has no backward: with gradients, the two-copy way
    torch.testing.assert_close(append_step(past, new, rows), expected)
    with pytest.raises(ValueError, match="3 cache rows selected for a step of 4 rows"):
        append_step(past.detach(), new, rows[:3])
    assert torch.equal(append_step(past, new[:3]), torch.cat([past, new[:3]], dim=2))


def test_beams_sharing_a_memory_attend_as_beams_with_a_copy_each():
    """n sentences of K beams: cross-attention over one memory per sentence equals the plain module's over
    the memory repeated K times (values and weights)."""
    torch.manual_seed(0)
    plain = MultiHeadAttention(32, 4, self_attention=False).eval().requires_grad_(False)
    fast = twin(plain, FastMultiHeadAttention)
    n, K, S = 3, 4, 6
    memory, query = torch.randn(n, S, 32), torch.randn(n * K, 1, 32)  # (n, S, D), (n·K, 1, D)
    mask = torch.ones(n, 1, 1, S, dtype=torch.bool)
    mask[1, ..., 4:] = False  # sentence 1 is padded
    shared, shared_weights = fast(query, memory, memory, mask, {})
    repeated = memory.repeat_interleave(K, dim=0)  # (n·K, S, D)
    want, want_weights = plain(query, repeated, repeated, mask.repeat_interleave(K, dim=0), {})
    torch.testing.assert_close(shared, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(shared_weights, want_weights, rtol=1e-6, atol=1e-6)
    assert shared_weights[K : 2 * K, ..., 4:].abs().max() == 0  # the padding of sentence 1, in each beam
