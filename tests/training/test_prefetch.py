"""Prefetching batches in a thread (``training/prefetch.py``): the same batches in the same order, and an
error in the producer raised in the consumer."""

import pytest
import torch
from helpers import fake_ids

from transformer.core.batches import iter_batches, make_batches
from transformer.core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.training.corpus import (
    DataError,
)


def test_prefetch_yields_the_same_batches_in_order_and_passes_errors_on(lengths):
    from transformer.training.prefetch import prefetch

    src, tgt = fake_ids(*lengths)
    batches = make_batches(*lengths, max_tokens=800, shuffle=True, seed=1)[:40]
    expected = list(iter_batches(src, tgt, batches, PAD_ID, BOS_ID, EOS_ID))
    got = list(prefetch(iter_batches(src, tgt, batches, PAD_ID, BOS_ID, EOS_ID), torch.device("cpu")))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert (
            torch.equal(a.src, b.src)
            and torch.equal(a.tgt_in, b.tgt_in)
            and torch.equal(a.indices, b.indices)
        )

    def broken():
        yield expected[0]
        raise DataError("line 7 of something is broken")

    stream = prefetch(broken(), torch.device("cpu"))
    assert torch.equal(next(stream).src, expected[0].src)
    with pytest.raises(DataError, match="line 7"):
        next(stream)
