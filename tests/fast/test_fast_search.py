"""The fast tier's searches against the plain core's: the same outputs, n-best lists and prefixed outputs
for greedy and beam search, on a model with and without its fast twins; and the kernels under them
(blocks of rows, the two-pass top-k, the in-place log-softmax) bit for bit."""

import copy

import pytest
import torch
from helpers import BOS, PAD, random_model, random_sources

from transformer.core.decoding import PLAIN, beam_search, greedy_decode
from transformer.fast import search as fast_search
from transformer.fast import topk
from transformer.fast.attention import FastMultiHeadAttention
from transformer.fast.search import FAST
from transformer.fast.twins import speed_up
from transformer.inference.nbest import beam_search_nbest
from transformer.inference.prefix import Prefix


def prefixes(batch: int) -> torch.Tensor:
    prefix = torch.full((batch, 2), -1)
    prefix[::2, 0], prefix[::4, 1] = 7, 9  # half the sentences must start with 7, a quarter with 7 9
    return prefix


def searches(model, src, K, kernels):
    """(n-best lists, prefixed outputs, greedy outputs, prefixed greedy outputs); beam search with
    ``kernels``."""
    pos = model.config.max_positions
    return (
        beam_search_nbest(model, src, K, 0.6, 8, K, kernels=kernels),
        beam_search(model, src, K, 0.6, 8, steering=Prefix(prefixes(src.size(0)), pos), kernels=kernels),
        greedy_decode(model, src, 8),
        greedy_decode(model, src, 8, steering=Prefix(prefixes(src.size(0)), pos)),
    )


def assert_same(got, want):
    nbest, prefixed, greedy, greedy_prefixed = got
    assert (prefixed, greedy, greedy_prefixed) == want[1:]
    for hyps, wanted in zip(nbest, want[0]):
        assert [ids for ids, _ in hyps] == [ids for ids, _ in wanted]
        assert [p for _, p in hyps] == pytest.approx([p for _, p in wanted], rel=1e-12)


@pytest.mark.parametrize("K", [1, 4])
def test_the_fast_twins_and_kernels_search_as_the_plain_core(K):
    model, src = random_model(1, eos_bias=1.0, vocab_size=100), random_sources(1, batch=8, vocab_size=100)
    plain = searches(model, src, K, PLAIN)
    fast = speed_up(copy.deepcopy(model))
    assert all(layer.cross_attn.beams_share_memory for layer in fast.decoder.layers)
    assert not any(layer.cross_attn.beams_share_memory for layer in model.decoder.layers)
    assert_same(searches(fast, src, K, FAST), plain)  # beams sharing one memory, the first step once
    assert any(out[:1] == [7] for out in plain[1]) and all(out[:1] == [7] for out in plain[1][::2])


@pytest.mark.parametrize("K", [1, 4])
def test_beam_scored_by_blocks_of_rows_with_the_two_pass_top_k_equals_all_at_once(monkeypatch, K):
    """The fast output layer and scoring 3 rows at a time, and its top-k in blocks of 2 (V = 100: 50 blocks,
    so ``topk.top_k`` takes its two-pass path), give what all rows at once and ``torch.topk`` give."""
    model = speed_up(random_model(1, vocab_size=100))
    src = random_sources(1, batch=8, vocab_size=100)
    monkeypatch.setattr(fast_search, "SCORE_ROWS", 10**6)
    monkeypatch.setattr(topk, "BLOCK", 10**6)  # no whole block: torch.topk
    whole = searches(model, src, K, FAST)
    monkeypatch.setattr(fast_search, "SCORE_ROWS", 3)
    monkeypatch.setattr(topk, "BLOCK", 2)
    assert_same(searches(model, src, K, FAST), whole)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_scores_are_a_fresh_log_softmax_and_topk_to_the_bit(monkeypatch, dtype):
    """The fast ``row_best`` writes the log-softmax over the logits in place: each row's k best (log p,
    token) must be those of a fresh ``torch.log_softmax`` and ``torch.topk``, bit for bit, whatever the
    block of rows (V = 3000: the two-pass top-k and the vectorised log-softmax), PAD and BOS ruled out."""
    model = random_model(3, vocab_size=3000).to(dtype)
    features = torch.randn(37, 1, 16, dtype=dtype)  # (N, 1, D)
    for rows in (5, 37):
        with torch.no_grad():  # the products by the same blocks of rows, which float32 rounds by block
            blocks = [model.output_proj(features[i : i + rows]) for i in range(0, 37, rows)]
        logits = torch.cat(blocks)[:, -1].to(dtype)  # (N, V) (the hook's bias is float64)
        logits[:, [PAD, BOS]] = float("-inf")
        want_log_probs, want_tokens = torch.log_softmax(logits, dim=-1).topk(8, dim=-1)  # (N, 8) each
        monkeypatch.setattr(fast_search, "SCORE_ROWS", rows)
        with torch.no_grad():
            log_probs, tokens = FAST.row_best(features, model, 8, dtype)
        assert torch.equal(tokens, want_tokens) and torch.equal(log_probs, want_log_probs)


def test_speed_up_swaps_every_module_for_its_twin_and_keeps_the_parameters():
    model = random_model(2)
    before = {name: p for name, p in model.named_parameters()}
    speed_up(model)
    assert {name: p for name, p in model.named_parameters()} == before  # the same tensors, the same names
    kinds = {type(m).__name__ for m in model.modules()}
    assert "Dropout" in kinds and not any(type(m) is torch.nn.Dropout for m in model.modules())
    assert all(isinstance(layer.cross_attn, FastMultiHeadAttention) for layer in model.decoder.layers)
    assert {"FastFeedForward", "FastMultiHeadAttention"} <= kinds
    assert speed_up(model) is model and {type(m).__name__ for m in model.modules()} == kinds  # idempotent
