"""Batches: token ids -> token-bucket batches of padded tensors (§5.1).

§5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
tokens." `make_batches` does this with a budget on the *padded* size of a batch.

How one target sentence becomes the decoder's input and labels (`collate`), here with T = 5:

    target ids         y1   y2   y3                   (3 subword ids from the tokenizer)
    tgt_in   (input)   BOS  y1   y2   y3   PAD
    tgt_out  (labels)  y1   y2   y3   EOS  PAD     tgt_out[:, t] is predicted from tgt_in[:, :t+1]
                       |<-- len + 1 -->|   |<- PAD at the end, up to the longest row

    source ids         x1   x2   x3   x4
    src                x1   x2   x3   x4   EOS  PAD   (EOS marks the end; no BOS on the source side)
"""

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

Item = TypeVar("Item")  # not `T`, which is the target length here


@dataclass
class Batch:
    """One padded batch of sentence pairs, laid out as in the picture at the top."""

    src: torch.Tensor  # (B, S) long: source + EOS, PAD at the end
    tgt_in: torch.Tensor  # (B, T) long: BOS + target, PAD at the end
    tgt_out: torch.Tensor  # (B, T) long: target + EOS, PAD at the end
    indices: torch.Tensor  # (B,) long: positions of these pairs in their dataset split
    n_src_tokens: int  # non-PAD tokens in src
    n_tgt_tokens: int  # non-PAD tokens in tgt_out: what the summed loss is divided by

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """Move the model inputs and labels; `indices` stays on the CPU for bookkeeping. From pinned memory,
        ``non_blocking`` copies overlap with the GPU's work."""
        src, tgt_in, tgt_out = (
            t.to(device, non_blocking=non_blocking) for t in (self.src, self.tgt_in, self.tgt_out)
        )
        return Batch(src, tgt_in, tgt_out, self.indices, self.n_src_tokens, self.n_tgt_tokens)


def collate(
    pairs: list[tuple[list[int], list[int]]],
    indices: Sequence[int],
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Batch:
    """(source ids, target ids) pairs -> padded tensors, as in the picture at the top."""
    S = max(len(src) for src, _ in pairs) + 1  # + EOS
    T = max(len(tgt) for _, tgt in pairs) + 1  # + BOS (tgt_in) or + EOS (tgt_out)
    src = torch.tensor([s + [eos_id] + [pad_id] * (S - len(s) - 1) for s, _ in pairs])  # (B, S)
    tgt_in = torch.tensor([[bos_id] + t + [pad_id] * (T - len(t) - 1) for _, t in pairs])  # (B, T)
    tgt_out = torch.tensor([t + [eos_id] + [pad_id] * (T - len(t) - 1) for _, t in pairs])  # (B, T)
    return Batch(
        src=src,
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        indices=torch.as_tensor(np.asarray(indices, dtype=np.int64)),  # (B,)
        n_src_tokens=sum(len(s) + 1 for s, _ in pairs),
        n_tgt_tokens=sum(len(t) + 1 for _, t in pairs),
    )


def make_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    max_tokens: int,
    shuffle: bool,
    seed: int = 0,
    epoch: int = 0,
    indices: Sequence[int] | None = None,
    chunk_batches: int = 1000,
) -> list[np.ndarray]:
    """Group sentence pairs of similar length into batches of at most `max_tokens` padded tokens.

    `src_lengths` / `tgt_lengths` are token counts without BOS / EOS; `indices` (default: all)
    selects the pairs to batch, e.g. the output of `clean_pairs`. Returns the batches, each an array
    of indices. A batch costs B * (S + T) tokens including padding and the added
    EOS / BOS, as `collate` will build it; only a single pair longer than the budget exceeds it,
    as a batch of one.

    shuffle=True (training): shuffle the pairs with a generator seeded by (seed, epoch), cut them
    into chunks of about `chunk_batches` batches, sort each chunk by length, cut it into batches,
    and shuffle the batch order. The same arguments give the same batches. The bigger the chunk, the
    less padding, so each step of the same padded size carries more sentence pairs; pairs of equal
    lengths still mix at random.
    shuffle=False (evaluation): sort all pairs by length and batch them in that order; recover
    the input order with `restore_order`. Pairs sort by source length, then target length: to
    translate text without references, pass zeros as `tgt_lengths`.
    The paper's batches of ~25000 source + ~25000 target tokens are about max_tokens=50000 here.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    src_len = np.asarray(src_lengths, dtype=np.int32)  # (N,)
    tgt_len = np.asarray(tgt_lengths, dtype=np.int32)  # (N,)
    order = np.arange(len(src_len)) if indices is None else np.asarray(indices, dtype=np.int64)

    def by_length(pairs: np.ndarray) -> np.ndarray:
        return pairs[np.lexsort((tgt_len[pairs], src_len[pairs]))]  # stable: by source, then target length

    if shuffle:
        # one random stream per (seed, epoch): the same in every process, different every epoch
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = order[torch.randperm(len(order), generator=generator).numpy()]
        batches = []
        for chunk in _chunks(order, src_len, tgt_len, chunk_batches * max_tokens):
            batches += cut_into_batches(by_length(chunk), src_len, tgt_len, max_tokens)
        batches = [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]
    else:
        batches = cut_into_batches(by_length(order), src_len, tgt_len, max_tokens)
    return batches


def _chunks(order: np.ndarray, src_len, tgt_len, chunk_tokens: int) -> Iterator[np.ndarray]:
    """Consecutive runs of `order` holding about `chunk_tokens` real tokens each: a run ends with the pair
    that brings it to `chunk_tokens` or more."""
    cumulative = np.cumsum(src_len[order] + tgt_len[order] + 2, dtype=np.int64)  # (N,) strictly increasing
    start, before = 0, 0
    while start < len(order):
        end = int(np.searchsorted(cumulative, before + chunk_tokens, side="left")) + 1
        yield order[start:end]
        start, before = end, int(cumulative[min(end, len(order)) - 1])


def cut_into_batches(
    order: Sequence[int],
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    max_tokens: int,
) -> list[np.ndarray]:
    """Cut `order`, as it is, into consecutive batches of padded size B * (S + T) <= max_tokens.

    `make_batches` sorts by length first; without that (a random order) most tokens are padding.
    The batches are int64 arrays, views of one array: at millions of pairs, lists of Python ints would
    hold about 40 bytes per pair for the whole epoch.
    """
    order = np.asarray(order, dtype=np.int64)
    padded_src = (np.asarray(src_lengths)[order] + 1).tolist()  # + EOS
    padded_tgt = (np.asarray(tgt_lengths)[order] + 1).tolist()  # + BOS or EOS
    starts, start, S, T = [], 0, 0, 0  # starts: where each batch but the first begins in `order`
    for k, (src, tgt) in enumerate(zip(padded_src, padded_tgt, strict=True)):
        if k > start and (k - start + 1) * (max(S, src) + max(T, tgt)) > max_tokens:
            starts.append(k)
            start, S, T = k, 0, 0
        S, T = max(S, src), max(T, tgt)
    return np.split(order, starts) if len(order) else []


def iter_batches(
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    batches: Sequence[Sequence[int]],
    pad_id: int,
    bos_id: int,
    eos_id: int,
) -> Iterator[Batch]:
    """Collate the batches from `make_batches` one at a time."""
    for indices in batches:
        pairs = [(src_ids[i], tgt_ids[i]) for i in indices]
        yield collate(pairs, indices, pad_id, bos_id, eos_id)


def restore_order(items: Sequence[Item], indices: Sequence[int], size: int) -> list[Item]:
    """Put per-sentence results back in dataset order.

    `items[k]` is the result for sentence `indices[k]` (e.g. `indices` = all `Batch.indices`
    concatenated). Every index in range(size) must occur; repeats, from shard padding, are fine.
    """
    if len(items) != len(indices):
        raise ValueError(f"{len(items)} items but {len(indices)} indices")
    missing = object()
    ordered: list = [missing] * size
    for index, item in zip(indices, items, strict=True):
        ordered[index] = item
    absent = [i for i, item in enumerate(ordered) if item is missing]
    if absent:
        raise ValueError(f"no result for {len(absent)} of {size} sentences, e.g. {absent[:5]}")
    return ordered
