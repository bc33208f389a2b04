"""A corpus's splits as token ids: the training split from its token store, cleaned (``clean_pairs``);
validation and test encoded from their text, every pair kept, in order.
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from transformer.core.tokenizer import Tokenizer
from transformer.interop.formats import target_tokenizer
from transformer.runtime.configs import Config, DataConfig, source_token_limit
from transformer.training.carving import Carved
from transformer.training.corpus import ParallelText
from transformer.training.mixing import epoch_counts, epoch_indices
from transformer.training.token_store import Side, TokenStore


def encode_split(split: ParallelText, tokenizer: Tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of every source and target sentence, without BOS / EOS (`collate` adds them); targets by the
    ``target_tokenizer`` (the same one for a joint SentencePiece model)."""
    return tokenizer.encode_batch(split.src), target_tokenizer(tokenizer).encode_batch(split.tgt)


CLEANING_RULES = ("empty", "too_long", "ratio", "duplicate")


def clean_pairs(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, hashes: np.ndarray | None, data: DataConfig,
    prefix_tokens: int = 0,
) -> tuple[np.ndarray, dict[str, int]]:  # fmt: skip
    """Training pairs kept by the cleaning rules (indices, in order), and how many each rule dropped (rules in
    ``CLEANING_RULES`` order, a pair counted by the first that drops it):

      empty      a side with no token
      too_long   a ``src`` or ``tgt_in`` / ``tgt_out`` row (length + 1) over ``data.max_len``
      ratio      the longer side over ``data.max_ratio`` times the shorter (``max_ratio`` > 0)
      duplicate  the same pair seen before (``data.dedup``; ``hashes``: one 64-bit hash per pair)

    Lengths are token counts without BOS / EOS, nor the ``prefix_tokens`` a source gets in front (a tag, a
    target-language token), which count only for ``too_long``. Validation and test sets are never cleaned."""
    s, t = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    too_long = (s + prefix_tokens + 1 > data.max_len) | (t + 1 > data.max_len)
    drops = {"empty": (s == 0) | (t == 0), "too_long": too_long}
    drops["ratio"] = np.maximum(s, t) > data.max_ratio * np.minimum(s, t) if data.max_ratio > 0 else None
    alive = np.ones(len(s), dtype=bool)
    counts = {"pairs": len(s)}
    for rule in CLEANING_RULES[:-1]:
        dropped = alive & drops[rule] if drops[rule] is not None else np.zeros_like(alive)
        counts[rule], alive = int(dropped.sum()), alive & ~dropped
    if data.dedup and hashes is not None:
        survivors = np.flatnonzero(alive)
        _, first = np.unique(np.asarray(hashes)[survivors], return_index=True)
        unique = np.zeros_like(alive)
        unique[survivors[first]] = True
        counts["duplicate"], alive = int((alive & ~unique).sum()), unique
    else:
        counts["duplicate"] = 0
    counts["kept"] = int(alive.sum())
    return np.flatnonzero(alive), counts  # (kept,) int64: 8 bytes a pair, not a Python int's 36


def cleaning_line(counts: dict[str, int], data: DataConfig) -> str:
    rules = {
        "empty": "empty",
        "too_long": f"longer than data.max_len={data.max_len}",
        "ratio": f"length ratio over data.max_ratio={data.max_ratio:g}",
        "duplicate": "duplicates",
    }
    if data.corpora:  # each corpus by its own rules
        rules |= {"too_long": "longer than their max_len", "ratio": "length ratio over their max_ratio"}
    dropped = ", ".join(f"{counts[rule]} {text}" for rule, text in rules.items())
    copies = counts.get("carved_copies", 0)  # a corpus that repeats pairs: carving left their copies out
    carving = f" (and {copies} copies of carved validation / test pairs left out)" if copies else ""
    return f"data: {counts['pairs']} training pairs{carving}, dropped {dropped}; kept {counts['kept']}"


@dataclass
class PartSplits:
    """Where one corpus's pairs are in the run's splits: its training pairs kept (indices into the joined
    training sides), its validation and test sentences (slices of the joined validation and test sets)."""

    name: str
    kept: np.ndarray  # (kept,) int64
    valid: slice
    test: slice


@dataclass
class Splits:
    """Token ids of each split: train filtered by length; validation / test complete and in order. With
    several corpora each split is theirs one after another (``parts`` says where), every source with its
    corpus's prefix (``corpora.prefix_pieces``)."""

    train: tuple[Sequence[list[int]], Sequence[list[int]]]  # the token store's two sides (or joined ones)
    train_indices: np.ndarray  # (kept,) the training pairs the cleaning rules keep
    cleaning: dict[str, int]  # how many pairs each cleaning rule dropped (``clean_pairs``)
    valid: tuple[list[list[int]], list[list[int]]]
    valid_refs: list[str]
    test: tuple[list[list[int]], list[list[int]]]
    test_refs: list[str]
    other_tests: dict[str, tuple[tuple[list[list[int]], list[list[int]]], list[str]]]  # eval.test_sets
    parts: list[PartSplits] = field(default_factory=list)
    epoch_counts: list[int] = field(default_factory=list)  # pairs of each corpus in an epoch (weights)

    def epoch_indices(self, seed: int, epoch: int) -> np.ndarray:
        """The training pairs of an epoch: the kept ones, or their weighted mixture (``data.corpora``)."""
        if self.epoch_counts == [len(part.kept) for part in self.parts]:  # every pair once: no mixing
            return self.train_indices
        return epoch_indices([part.kept for part in self.parts], self.epoch_counts, seed, epoch)


class Joined(Sequence):
    """The training sides of several corpora as one sequence: sentence i is sentence i - start of its corpus,
    with that corpus's ``prefix`` ids in front."""

    def __init__(self, sides: list[Side], prefixes: list[list[int]]):
        self.sides, self.prefixes = sides, prefixes
        self.lengths = np.concatenate([side.lengths + len(prefix) for side, prefix in zip(sides, prefixes)])
        self.starts = np.cumsum([0] + [len(side) for side in sides])  # (corpora + 1,)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> list[int]:
        if not 0 <= i < len(self):
            raise IndexError(f"sentence {i} of {len(self)}")
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.prefixes[k] + self.sides[k][i - int(self.starts[k])]


def encode_corpus(loaded: list, stores: list[TokenStore], prefixes: list[list[int]], tokenizer: Tokenizer,
                  config: Config) -> Splits:  # fmt: skip
    """Each corpus's training split from its token store (the first ``data.train_limit`` pairs for smoke
    runs), cleaned by its own rules (``clean_pairs``); validation and test encoded here, every pair kept
    (``data.eval_limit`` slices them), their sources cut to what the model can translate
    (``source_token_limit``, its ``prefixes`` included) and their targets to what it can be scored on
    (``model.max_positions`` - 1), with a warning that counts them. One corpus: its store's sides as such."""
    joined = len(loaded) > 1 or any(prefixes)
    src_side = Joined([store.src for store in stores], prefixes) if joined else stores[0].src
    tgt_side = Joined([store.tgt for store in stores], [[] for _ in stores]) if joined else stores[0].tgt
    evaluation = {"validation": EvalSet(), "test": EvalSet()}
    others, parts, counts, start = {}, [], {}, 0
    for one, store, prefix in zip(loaded, stores, prefixes):
        data = one.part.data
        n = min(len(store), data.train_limit) if data.train_limit > 0 else len(store)
        keep, dropped = clean_pairs(store.src.lengths[:n], store.tgt.lengths[:n], store.hashes[:n], data,
                                    len(prefix))  # fmt: skip
        train = one.corpus["train"]
        dropped["carved_copies"] = train.copies_left_out(len(store)) if isinstance(train, Carved) else 0
        counts = {rule: counts.get(rule, 0) + dropped[rule] for rule in dropped}
        where = {name: evaluation[name].add(one.corpus.get(name), prefix, tokenizer, config, data, name)
                 for name in evaluation}  # fmt: skip
        for name in [name for name in one.corpus if name.startswith("test/")]:
            encoded = encode_eval(one.corpus[name], prefix, tokenizer, config, data, name)
            others[name.removeprefix("test/")] = encoded
        parts.append(PartSplits(one.part.name, keep + start, where["validation"], where["test"]))
        start += len(store)
    sizes, weights = [len(part.kept) for part in parts], [one.part.weight for one in loaded]
    return Splits(
        (src_side, tgt_side), np.concatenate([part.kept for part in parts]), counts,
        *evaluation["validation"].split, *evaluation["test"].split, others, parts,
        epoch_counts(sizes, weights, config.data.sampling_temperature),
    )  # fmt: skip


class EvalSet:
    """A validation or test set of several corpora, one after another."""

    def __init__(self):
        self.sources, self.targets, self.refs = [], [], []

    def add(self, split, prefix: list[int], tokenizer: Tokenizer, config: Config, data: DataConfig,
            name: str) -> slice:  # fmt: skip
        """Encode a corpus's ``split`` (None: it has none) after the others; where it is."""
        start = len(self.refs)
        if split is not None:
            (src_ids, tgt_ids), refs = encode_eval(split, prefix, tokenizer, config, data, name)
            self.sources.extend(src_ids)
            self.targets.extend(tgt_ids)
            self.refs.extend(refs)
        return slice(start, len(self.refs))

    @property
    def split(self) -> tuple[tuple[list, list], list]:
        """((source ids, target ids), references), as ``Splits`` holds them."""
        return (self.sources, self.targets), self.refs


def mixture_line(loaded: list, splits: Splits) -> str:
    """What an epoch of several corpora holds: each corpus's kept pairs, weight and pairs an epoch."""
    each = ", ".join(f"{part.name} {len(part.kept)} × {one.part.weight:g} -> {count}"
                     for one, part, count in zip(loaded, splits.parts, splits.epoch_counts))  # fmt: skip
    return f"data: an epoch holds {sum(splits.epoch_counts)} pairs: {each}"


def encode_eval(split, prefix: list[int], tokenizer: Tokenizer, config: Config, data: DataConfig, name: str):
    """((source ids with ``prefix`` in front, target ids), references) of a validation or test split."""
    split = split.head(data.eval_limit)
    src_ids, tgt_ids = encode_split(split, tokenizer)
    limit = source_token_limit(config.model, config.eval) - len(prefix)
    src_ids = [prefix + ids for ids in _truncate(src_ids, limit, f"{name} sources")]
    tgt_ids = _truncate(tgt_ids, config.model.max_positions - 1, f"{name} targets (for the loss)")
    return (src_ids, tgt_ids), split.tgt


def lengths_of(ids: Sequence[list[int]]) -> Sequence[int]:
    """Tokens per sentence: a token store's side knows them without reading a sentence."""
    return ids.lengths if isinstance(ids, (Side, Joined)) else [len(sentence) for sentence in ids]


def _truncate(ids: list[list[int]], limit: int, what: str) -> list[list[int]]:
    long = sum(len(sentence) > limit for sentence in ids)
    if long:
        warnings.warn(
            f"{long} {what} longer than {limit} tokens truncated to the model's limit", stacklevel=3
        )
    return [sentence[:limit] for sentence in ids]
