"""A corpus's splits as token ids: the training split from its token store, cleaned (``clean_pairs``);
validation and test encoded from their text, every pair kept, in order.
"""

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from transformer.core.config import Config, DataConfig, source_token_limit
from transformer.core.tokenizer import Tokenizer
from transformer.training.corpus import Corpus, ParallelText
from transformer.training.token_store import Side, TokenStore


def encode_split(split: ParallelText, tokenizer: Tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of every source and target sentence, without BOS / EOS (`collate` adds them); targets by the
    tokenizer's ``target_side`` (the same one for a joint SentencePiece model)."""
    return tokenizer.encode_batch(split.src), tokenizer.target_side.encode_batch(split.tgt)


CLEANING_RULES = ("empty", "too_long", "ratio", "duplicate")


def clean_pairs(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, hashes: np.ndarray | None, data: DataConfig
) -> tuple[np.ndarray, dict[str, int]]:
    """Training pairs kept by the cleaning rules (indices, in order), and how many each rule dropped (rules in
    ``CLEANING_RULES`` order, a pair counted by the first that drops it):

      empty      a side with no token
      too_long   a ``src`` or ``tgt_in`` / ``tgt_out`` row (length + 1) over ``data.max_len``
      ratio      the longer side over ``data.max_ratio`` times the shorter (``max_ratio`` > 0)
      duplicate  the same pair seen before (``data.dedup``; ``hashes``: one 64-bit hash per pair)

    Lengths are token counts without BOS / EOS. Validation and test sets are never cleaned."""
    s, t = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    drops = {"empty": (s == 0) | (t == 0), "too_long": (s + 1 > data.max_len) | (t + 1 > data.max_len)}
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
    dropped = ", ".join(f"{counts[rule]} {text}" for rule, text in rules.items())
    return f"data: {counts['pairs']} training pairs, dropped {dropped}; kept {counts['kept']}"


@dataclass
class Splits:
    """Token ids of each split: train filtered by length; validation / test complete and in order."""

    train: tuple[Sequence[list[int]], Sequence[list[int]]]  # the token store's two sides (or lists)
    train_indices: np.ndarray  # (kept,) the training pairs the cleaning rules keep
    cleaning: dict[str, int]  # how many pairs each cleaning rule dropped (``clean_pairs``)
    valid: tuple[list[list[int]], list[list[int]]]
    valid_refs: list[str]
    test: tuple[list[list[int]], list[list[int]]]
    test_refs: list[str]
    other_tests: dict[str, tuple[tuple[list[list[int]], list[list[int]]], list[str]]]  # eval.test_sets


def encode_corpus(corpus: Corpus, tokenizer: Tokenizer, config: Config, store: TokenStore) -> Splits:
    """The training split from its token store (the first ``data.train_limit`` pairs for smoke runs),
    cleaned (``clean_pairs``); validation and test encoded here, every pair kept (``data.eval_limit`` slices
    them), their sources cut to what the model can translate (``source_token_limit``) and their targets to
    what it can be scored on (``model.max_positions`` - 1), with a warning that counts them."""
    data = config.data
    n = min(len(store), data.train_limit) if data.train_limit > 0 else len(store)
    keep, counts = clean_pairs(store.src.lengths[:n], store.tgt.lengths[:n], store.hashes[:n], data)
    evaluation = {}
    for name in ["validation", "test"] + [name for name in corpus if name.startswith("test/")]:
        split = corpus[name].head(data.eval_limit)
        src_ids, tgt_ids = encode_split(split, tokenizer)
        src_ids = _truncate(src_ids, source_token_limit(config.model, config.eval), f"{name} sources")
        tgt_ids = _truncate(tgt_ids, config.model.max_positions - 1, f"{name} targets (for the loss)")
        evaluation[name] = ((src_ids, tgt_ids), split.tgt)
    others = {name.removeprefix("test/"): evaluation[name] for name in evaluation if name.startswith("test/")}
    return Splits(
        (store.src, store.tgt), keep, counts, *evaluation["validation"], *evaluation["test"], others
    )


def lengths_of(ids: Sequence[list[int]]) -> Sequence[int]:
    """Tokens per sentence: a token store's side knows them without reading a sentence."""
    return ids.lengths if isinstance(ids, Side) else [len(sentence) for sentence in ids]


def _truncate(ids: list[list[int]], limit: int, what: str) -> list[list[int]]:
    long = sum(len(sentence) > limit for sentence in ids)
    if long:
        warnings.warn(
            f"{long} {what} longer than {limit} tokens truncated to the model's limit", stacklevel=3
        )
    return [sentence[:limit] for sentence in ids]
