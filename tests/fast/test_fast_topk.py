"""``topk.top_k`` (beam search's two-pass top-k) against ``torch.topk``."""

import pytest
import torch

from transformer.fast.topk import BLOCK, top_k


def assert_same_as_torch(scores: torch.Tensor, k: int):
    values, indices = top_k(scores, k)
    expected = scores.topk(k, dim=-1).values
    torch.testing.assert_close(values, expected, rtol=0, atol=0)  # the same values, in the same order
    torch.testing.assert_close(scores.gather(1, indices), values, rtol=0, atol=0)  # indices that hold them
    assert all(len(set(row)) == k for row in indices.tolist()), "an index taken twice"


@pytest.mark.parametrize("V", [8000, 8000 + BLOCK - 1, 32000, 100])  # whole blocks, a tail, small: torch.topk
@pytest.mark.parametrize("k", [1, 8])
def test_random_scores(V, k):
    torch.manual_seed(V + k)
    assert_same_as_torch(torch.randn(37, V), k)


def test_the_k_largest_in_one_block_and_in_the_tail():
    """All of a row's k largest in one block (the other chosen blocks hold none of them), or after the last
    whole block: both must still be found."""
    torch.manual_seed(0)
    V, k = 40 * BLOCK + 5, 8  # 40 whole blocks: not the small-vocabulary path
    scores = torch.randn(3, V)
    scores[0, 3 * BLOCK : 3 * BLOCK + k] = 10.0 + torch.arange(k, dtype=torch.float)
    scores[1, -5:] = 10.0 + torch.arange(5, dtype=torch.float)  # the 5 largest are the tail
    scores[2, -1] = 100.0
    assert_same_as_torch(scores, k)
    assert set(top_k(scores, k)[1][1, :5].tolist()) == set(range(V - 5, V))


def test_ruled_out_tokens_and_ties():
    """Rows of -inf but for a few tokens (PAD and the start token ruled out, a forced prefix token), and tied
    scores: the same values as torch.topk, never a ruled-out token before a finite one."""
    torch.manual_seed(1)
    V, k = 4000, 8
    scores = torch.randn(4, V).round()  # many ties
    scores[:, :2] = float("-inf")
    scores[1] = float("-inf")
    scores[1, 1234] = -3.0  # a forced token: one finite score
    scores[2, 100:200] = 5.0  # a tie across block boundaries
    assert_same_as_torch(scores, k)
    assert top_k(scores, k)[1][1, 0].item() == 1234
