"""Validation and test sets carved off the training split, for a corpus that ships without them (many hub
datasets; a single pair of text files).

``data.valid_size`` and ``data.test_size`` pairs are drawn at random, without replacement, from the training
split with ``random.Random(data.split_seed)``: the same pairs for every run on the same corpus, whatever
``train.seed`` is. They are kept in corpus order, and the training split goes on without them (``Carved``),
streamed as before, so a corpus of millions of pairs is never held as text for this.

Disjoint by content, not only by position: a corpus may repeat a pair, so every training pair equal to a
carved one (both sides) is left out of training too, and a drawn pair equal to one drawn before it is not
carved twice (the test set holds none of the validation set's pairs); the run says how many pairs that
drops from the sets, and its cleaning line how many copies it left out of training.
"""

import hashlib
import random
from collections.abc import Iterator
from functools import cached_property

from transformer.runtime.configs import DataConfig
from transformer.training.corpus import (
    Corpus,
    DataError,
    ParallelArrow,
    ParallelFiles,
    ParallelText,
    ReadWhole,
    Split,
)
from transformer.training.token_store import pair_hash

SIZE_KEYS = {"validation": "valid_size", "test": "test_size"}  # split -> the data.* key that carves it
CHUNK = 100_000  # pairs read at a time


class Carved(ReadWhole):
    """The training split ``source`` (``size`` pairs) without the pairs at the indices ``removed`` nor any
    other copy of their ``contents`` (``pair_hash``): streamed like it."""

    def __init__(self, source: Split, size: int, removed: frozenset[int], settings: str,
                 contents: frozenset[int]):  # fmt: skip
        self.source, self.size, self.removed, self.settings = source, size, removed, settings
        self.contents = contents

    def copies_left_out(self, kept: int) -> int:
        """How many pairs besides the drawn ones were left out, as copies of carved pairs, when the split
        streams ``kept`` pairs (its token store's length: no pass over the text)."""
        return self.size - len(self.removed) - kept

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        start = 0
        for src, tgt in self.source.chunks(size):
            kept = [i for i in range(len(src)) if start + i not in self.removed
                    and pair_hash(src[i], tgt[i]) not in self.contents]  # fmt: skip
            start += len(src)
            if kept:
                yield [src[i] for i in kept], [tgt[i] for i in kept]

    def sentences(self) -> Iterator[str]:
        """Every kept source line, then every kept target line."""
        for side in (0, 1):
            for chunk in self.chunks(CHUNK):
                yield from chunk[side]

    def fingerprint(self) -> str:
        """The source's fingerprint and the carving settings: another seed or size, another token store."""
        settings = f"{self.settings} by content"
        return hashlib.sha256(f"{self.source.fingerprint()} carved {settings}".encode()).hexdigest()

    @cached_property
    def whole(self) -> ParallelText:
        pairs = [chunk for chunk in self.chunks(CHUNK)]
        return ParallelText([s for src, _ in pairs for s in src], [t for _, tgt in pairs for t in tgt])

    @cached_property
    def length(self) -> int:
        return sum(len(src) for src, _ in self.chunks(CHUNK))

    def __len__(self) -> int:
        return self.length

    def head(self, n: int) -> ParallelText:
        return ParallelText(self.whole.src[:n], self.whole.tgt[:n]) if n > 0 else self.whole


def count_pairs(split: Split) -> int:
    """The number of pairs, without holding a streamed split's text (a file's lines are counted)."""
    if isinstance(split, Carved):
        return len(split)
    return split.facts[0][1] if isinstance(split, ParallelFiles) else len(split)  # what fingerprint reads


def pairs_at(split: Split, indices: list[int]) -> ParallelText:
    """The pairs at ``indices`` (ascending), in one pass over the split (an Arrow split selects them)."""
    if isinstance(split, ParallelArrow):
        return ParallelArrow(split.dataset.select(indices), split.src_lang, split.tgt_lang).whole
    wanted, src, tgt, start = set(indices), [], [], 0
    for chunk_src, chunk_tgt in split.chunks(CHUNK):
        for i in range(len(chunk_src)):
            if start + i in wanted:
                src.append(chunk_src[i])
                tgt.append(chunk_tgt[i])
        start += len(chunk_src)
    return ParallelText(src, tgt)


def carve_missing_splits(corpus: Corpus, data: DataConfig) -> Corpus:
    """``corpus`` with its missing validation and test splits carved off its training split, as many pairs
    as ``data.valid_size`` / ``data.test_size`` say; a size given for a split the corpus has is an error."""
    sizes = {split: getattr(data, key) for split, key in SIZE_KEYS.items()}
    for split, size in sizes.items():
        if size and split in corpus:
            key = SIZE_KEYS[split]
            raise DataError(f"data.{key}={size}, but the corpus has its own {split} split: set data.{key}=0")
    wanted = {split: size for split, size in sizes.items() if size}
    if not wanted or "train" not in corpus:
        return corpus
    train = corpus["train"]
    n, total = count_pairs(train), sum(wanted.values())
    if total >= n:
        raise DataError(f"data.valid_size + data.test_size = {total} leave none of the {n} training pairs")
    picked = random.Random(data.split_seed).sample(range(n), total)  # the first valid_size: validation
    carved, start, contents, repeats = dict(corpus), 0, set(), 0
    for split, size in wanted.items():
        pairs = pairs_at(train, sorted(picked[start : start + size]))
        start += size
        carved[split] = first_copies(pairs, contents)
        repeats += len(pairs) - len(carved[split])
    settings = f"seed {data.split_seed} " + " ".join(f"{split} {size}" for split, size in wanted.items())
    carved["train"] = Carved(train, n, frozenset(picked), settings, frozenset(contents))
    if repeats:
        sizes = ", ".join(f"{split} {len(carved[split])}" for split in wanted)
        print(f"data: {repeats} of the {total} pairs drawn repeat pairs drawn before them: carved {sizes} "
              "distinct pairs (every copy of them left out of training)", flush=True)  # fmt: skip
    return carved


def first_copies(pairs: ParallelText, seen: set[int]) -> ParallelText:
    """The pairs not in ``seen`` (their ``pair_hash``), each once, in order; ``seen`` gets their hashes."""
    src, tgt = [], []
    for src_line, tgt_line in zip(pairs.src, pairs.tgt):
        if (content := pair_hash(src_line, tgt_line)) not in seen:
            seen.add(content)
            src.append(src_line)
            tgt.append(tgt_line)
    return ParallelText(src, tgt)
