"""The configured corpus: loaded by name, encoded to token ids, the training split filtered by length.

``data.dataset`` picks the source: ``multi30k`` (checksummed files), ``hub`` (``datasets.load_dataset``) or
``text`` (local files ``<data.text_prefix>.{train,valid,test}.<lang>``).
"""

from dataclasses import dataclass

from datasets import DatasetDict

from transformer.config import DataConfig
from transformer.data import (
    DataError,
    encode_split,
    filter_by_length,
    load_hub_dataset,
    load_multi30k,
    load_parallel_text,
)
from transformer.tokenizer import Tokenizer

SPLITS = ("train", "validation", "test")


def load_corpus(data: DataConfig) -> DatasetDict:
    """The configured dataset as a DatasetDict with train / validation / test splits."""
    if data.dataset == "multi30k":
        corpus = load_multi30k(data.src_lang, data.tgt_lang, data.data_dir)
    elif data.dataset == "hub":
        if not data.hub_name:
            raise DataError("data.dataset=hub needs data.hub_name (e.g. wmt14) and data.hub_config (de-en)")
        corpus = load_hub_dataset(data.hub_name, data.hub_config, data.src_lang, data.tgt_lang)
    else:
        if not data.text_prefix:
            raise DataError("data.dataset=text needs data.text_prefix: files <prefix>.<split>.<lang>")
        stems = {"train": "train", "validation": "valid", "test": "test"}
        files = {
            split: tuple(f"{data.text_prefix}.{stem}.{lang}" for lang in (data.src_lang, data.tgt_lang))
            for split, stem in stems.items()
        }
        corpus = load_parallel_text(files, data.src_lang, data.tgt_lang)
    missing = [split for split in SPLITS if split not in corpus]
    if missing:
        raise DataError(
            f"data.dataset={data.dataset}: no {', '.join(missing)} split (it has: {', '.join(corpus)})"
        )
    return corpus


@dataclass
class Splits:
    """Token ids of each split: train filtered by length; validation / test complete and in order."""

    train: tuple[list[list[int]], list[list[int]]]
    train_indices: list[int]
    valid: tuple[list[list[int]], list[list[int]]]
    valid_refs: list[str]
    test: tuple[list[list[int]], list[list[int]]]
    test_refs: list[str]


def encode_corpus(corpus: DatasetDict, tokenizer: Tokenizer, data: DataConfig) -> Splits:
    """Token ids of every split (``data.train_limit`` / ``data.eval_limit`` slice them for smoke runs)."""

    def split(name, limit):
        ds = corpus[name]
        if limit > 0:
            ds = ds.select(range(min(limit, len(ds))))
        ids = encode_split(ds, tokenizer, data.src_lang, data.tgt_lang)
        return ids, [p[data.tgt_lang] for p in ds["translation"]]

    train, _ = split("train", data.train_limit)
    valid, valid_refs = split("validation", data.eval_limit)
    test, test_refs = split("test", data.eval_limit)
    keep = filter_by_length([len(s) for s in train[0]], [len(t) for t in train[1]], data.max_len)
    return Splits(train, keep, valid, valid_refs, test, test_refs)
