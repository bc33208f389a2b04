"""Token-bucket batches (``core/batches.py``): collate's shift and padding, the invariants every batch keeps,
every sentence once within the token budget, sorted by length, the order restored after decoding, and the
NumPy batching equal to a plain-Python reference."""

from functools import partial
from itertools import accumulate

import pytest
import torch
from helpers import as_lists, fake_ids

from transformer.core.batches import Batch, collate, iter_batches, make_batches, restore_order
from transformer.core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.runtime.configs import DataConfig
from transformer.training.ranks import shard
from transformer.training.splits import clean_pairs, encode_split

# -------- helpers --------------------------------------------------------------------------------


def padding_fraction(batches, src_lengths, tgt_lengths) -> float:
    """PAD tokens / all tokens of the batches as ``collate`` builds them (EOS on the source, BOS / EOS on the
    target: one more token a side)."""
    real = sum(src_lengths[i] + tgt_lengths[i] + 2 for batch in batches for i in batch)
    padded = sum(
        len(batch) * (max(src_lengths[i] for i in batch) + max(tgt_lengths[i] for i in batch) + 2)
        for batch in batches
    )
    return 1 - real / padded


# -------- Multi30k -------------------------------------------------------------------------------


# -------- read_lines -----------------------------------------------------------------------------


# -------- other loaders --------------------------------------------------------------------------


# -------- ids ------------------------------------------------------------------------------------


# -------- collate --------------------------------------------------------------------------------


def test_collate_shift_and_padding():
    batch = collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])], [4, 0], PAD_ID, BOS_ID, EOS_ID)
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]]
    assert batch.indices.tolist() == [4, 0]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (6, 8)
    assert batch.src.dtype == batch.tgt_in.dtype == batch.indices.dtype == torch.long
    assert isinstance(batch.to("cpu"), Batch)


def check_batch(batch: Batch) -> None:
    """The invariants every Batch must satisfy."""
    for tensor in (batch.src, batch.tgt_in, batch.tgt_out):
        real = tensor != PAD_ID  # (B, L) bool
        assert torch.equal(real, real.cummin(dim=1).values), "padding only at the end of a row"
    real_tgt = batch.tgt_out != PAD_ID  # (B, T)
    assert torch.equal(real_tgt, batch.tgt_in != PAD_ID)  # same lengths, in and out
    assert (batch.tgt_in[:, 0] == BOS_ID).all()
    shifted = real_tgt[:, 1:]
    assert torch.equal(batch.tgt_in[:, 1:][shifted], batch.tgt_out[:, :-1][shifted])
    rows = torch.arange(len(batch.tgt_out))
    assert (batch.tgt_out[rows, real_tgt.sum(1) - 1] == EOS_ID).all()  # EOS ends each real row
    assert (batch.src[rows, (batch.src != PAD_ID).sum(1) - 1] == EOS_ID).all()
    assert batch.n_tgt_tokens == int(real_tgt.sum())
    assert batch.n_src_tokens == int((batch.src != PAD_ID).sum())


# -------- batches --------------------------------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_cover_each_sentence_once_within_budget(lengths, shuffle):
    src_lengths, tgt_lengths = lengths
    batches = make_batches(src_lengths, tgt_lengths, max_tokens=1000, shuffle=shuffle, seed=3)
    assert sorted(i for batch in batches for i in batch) == list(range(len(src_lengths)))
    src_ids, tgt_ids = fake_ids(src_lengths, tgt_lengths)
    collated = iter_batches(src_ids, tgt_ids, batches, PAD_ID, BOS_ID, EOS_ID)
    for indices, batch in zip(batches, collated, strict=True):
        check_batch(batch)
        assert batch.indices.tolist() == indices.tolist()
        cost = batch.src.numel() + batch.tgt_in.numel()  # B * (S + T), padding included
        assert cost <= 1000 or len(indices) == 1  # a pair over budget comes alone
    alone = [batch.tolist() for batch in batches if len(batch) == 1]
    assert [3000] in alone and [3001] in alone


def test_batches_are_sorted_by_length(lengths):
    """Bucketing works: sorted batching wastes far less on padding than random batches."""
    src_lengths, tgt_lengths = lengths
    padding = partial(padding_fraction, src_lengths=src_lengths, tgt_lengths=tgt_lengths)

    bucketed = make_batches(src_lengths, tgt_lengths, max_tokens=2000, shuffle=True)
    sizes = [len(batch) for batch in bucketed]
    order = torch.randperm(len(src_lengths)).tolist()  # the same batch sizes, random members
    starts = list(accumulate([0] + sizes[:-1]))
    random = [order[start : start + size] for start, size in zip(starts, sizes, strict=True)]
    assert padding(bucketed) < 0.5 * padding(random)


def test_training_batches_pad_as_little_as_sorting_the_whole_epoch():
    """A Multi30k-sized epoch (29000 pairs, 4000-token batches) is sorted as one chunk: its shuffled
    training batches carry no more padding than the evaluation order's batches (all pairs sorted)."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(5, 40, (29000,), generator=generator)
    tgt = (src + torch.randint(-6, 7, (29000,), generator=generator)).clamp(min=1)
    src_lengths, tgt_lengths = src.tolist(), tgt.tolist()
    padding = partial(padding_fraction, src_lengths=src_lengths, tgt_lengths=tgt_lengths)

    training = make_batches(src_lengths, tgt_lengths, max_tokens=4000, shuffle=True, seed=1)
    evaluation = make_batches(src_lengths, tgt_lengths, max_tokens=4000, shuffle=False)
    assert padding(training) <= 1.05 * padding(evaluation) < 0.04  # chunks of 100 batches: 0.077


def test_training_batches_deterministic_per_epoch(lengths):
    def epoch_batches(seed, epoch):
        return as_lists(make_batches(*lengths, max_tokens=1000, shuffle=True, seed=seed, epoch=epoch))

    assert epoch_batches(seed=1, epoch=0) == epoch_batches(seed=1, epoch=0)
    assert epoch_batches(seed=1, epoch=0) != epoch_batches(seed=1, epoch=1)
    assert epoch_batches(seed=1, epoch=0) != epoch_batches(seed=2, epoch=0)


def test_batches_respect_indices(lengths):
    kept, _ = clean_pairs(*lengths, None, DataConfig(max_len=40))
    batches = make_batches(*lengths, max_tokens=1000, shuffle=True, indices=kept)
    assert sorted(i for batch in batches for i in batch) == kept.tolist()


def test_eval_batches_keep_everything_and_restore_order(lengths):
    src_lengths, tgt_lengths = lengths
    n = len(src_lengths)
    for world_size in (1, 3):
        batches = make_batches(*lengths, max_tokens=500, shuffle=False)
        rank_batches = [shard(batches, rank, world_size) for rank in range(world_size)]
        indices = [i for batches in rank_batches for batch in batches for i in batch]
        results = [f"result for {i}" for i in indices]  # what a translation loop would produce
        assert restore_order(results, indices, size=n) == [f"result for {i}" for i in range(n)]
    with pytest.raises(ValueError, match="no result for 1 of 4 sentences"):
        restore_order(["a", "b", "c"], [0, 2, 3], size=4)


def test_real_validation_batches(de_en, tokenizer):
    """End to end on Multi30k validation: every row of tgt_out decodes back to its sentence."""
    split = de_en["validation"]
    src_ids, tgt_ids = encode_split(split, tokenizer)
    src_lengths, tgt_lengths = [len(s) for s in src_ids], [len(t) for t in tgt_ids]
    batches = make_batches(src_lengths, tgt_lengths, max_tokens=2000, shuffle=False)
    decoded, indices = [], []
    for batch in iter_batches(src_ids, tgt_ids, batches, PAD_ID, BOS_ID, EOS_ID):
        check_batch(batch)
        decoded += tokenizer.decode_batch(batch.tgt_out.tolist())
        indices += batch.indices.tolist()
    assert restore_order(decoded, indices, len(split)) == tokenizer.decode_batch(tgt_ids)


# -------- prefetch ---------------------------------------------------------------------------------


def reference_batches(src_lengths, tgt_lengths, max_tokens, shuffle, seed, epoch, indices, chunk_batches):
    """make_batches as first written, in plain Python (one process): what the NumPy version must equal."""
    order = list(range(len(src_lengths))) if indices is None else list(indices)
    length = lambda i: (src_lengths[i], tgt_lengths[i])  # noqa: E731

    def cut(pairs):
        batches, batch, S, T = [], [], 0, 0
        for i in pairs:
            s, t = src_lengths[i] + 1, tgt_lengths[i] + 1
            if batch and (len(batch) + 1) * (max(S, s) + max(T, t)) > max_tokens:
                batches.append(batch)
                batch, S, T = [], 0, 0
            batch.append(i)
            S, T = max(S, s), max(T, t)
        return batches + [batch] if batch else batches

    if not shuffle:
        return cut(sorted(order, key=length))
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = [order[j] for j in torch.randperm(len(order), generator=generator).tolist()]
    batches, chunk, tokens = [], [], 0
    for i in order:
        chunk.append(i)
        tokens += src_lengths[i] + tgt_lengths[i] + 2
        if tokens >= chunk_batches * max_tokens:
            batches += cut(sorted(chunk, key=length))
            chunk, tokens = [], 0
    batches += cut(sorted(chunk, key=length)) if chunk else []
    return [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]


@pytest.mark.parametrize("case", range(12))
def test_make_batches_equals_the_plain_python_reference(case):
    g = torch.Generator().manual_seed(case)
    n = [0, 1, 7, 300, 5000, 29000][case % 6]
    src, tgt = (
        torch.randint(0, 60, (n,), generator=g).tolist(),
        torch.randint(0, 60, (n,), generator=g).tolist(),
    )
    indices = None if case % 2 else sorted(torch.randperm(n, generator=g)[: n // 2].tolist())
    args = dict(max_tokens=[200, 4000][case % 2], shuffle=case % 3 != 0, seed=case, epoch=case % 4,
                indices=indices, chunk_batches=[1, 100][case // 6])  # fmt: skip
    assert as_lists(make_batches(src, tgt, **args)) == reference_batches(src, tgt, **args)
