"""The corpus a run trains on (``data.dataset``: Multi30k, local text files or a hub dataset), and the
extra test sets of ``eval.test_sets``: each a ``Corpus`` of named splits.
"""

from transformer.core.config import DataConfig
from transformer.training.corpus import (
    SPLITS,
    Corpus,
    DataError,
    load_hub_dataset,
    load_parallel_text,
    read_parallel,
    split_name,
)
from transformer.training.multi30k import load_multi30k

TEXT_FILES = {"train": "train", "validation": "valid", "test": "test"}  # <text_prefix>.<stem>.<lang>


HUB_TEST_SET = "hub:"  # eval.test_sets value hub:NAME[:CONFIG]:SPLIT, e.g. hub:wmt14:de-en:validation


def load_test_sets(test_sets: dict[str, str], data: DataConfig) -> Corpus:
    """``eval.test_sets`` read now, so that a missing file stops the run before it trains: {"test/NAME":
    pairs}, from <prefix>.<src_lang> and <prefix>.<tgt_lang>, or from a hub split
    (``hub:NAME[:CONFIG]:SPLIT``, NAME may hold a ``/``; through ``datasets`` as ``data.dataset: hub``)."""
    corpus = {}
    for name, where in test_sets.items():
        if not where.startswith(HUB_TEST_SET):
            corpus[f"test/{name}"] = read_parallel(f"{where}.{data.src_lang}", f"{where}.{data.tgt_lang}")
            continue
        parts = where.removeprefix(HUB_TEST_SET).split(":")
        if len(parts) not in (2, 3) or not all(parts):
            raise DataError(f"eval.test_sets: {name}={where}: expected hub:NAME[:CONFIG]:SPLIT")
        hub_name, hub_config, split = parts if len(parts) == 3 else (parts[0], None, parts[1])
        try:  # that split alone: WMT14's validation set without its 4.5M training pairs
            splits = load_hub_dataset(hub_name, hub_config, data.src_lang, data.tgt_lang, split=split)
        except DataError as error:
            raise DataError(f"eval.test_sets: {name}={where}: {error}") from None
        corpus[f"test/{name}"] = splits[split_name(split)]
    return corpus


def load_corpus(data: DataConfig) -> Corpus:
    """The configured corpus (``data.dataset``) with its train / validation / test splits."""
    if data.dataset == "multi30k":
        corpus = load_multi30k(data.src_lang, data.tgt_lang, data.data_dir)
    elif data.dataset == "hub":
        if not data.hub_name:
            raise DataError("data.dataset=hub needs data.hub_name (e.g. wmt14) and data.hub_config (de-en)")
        corpus = load_hub_dataset(data.hub_name, data.hub_config, data.src_lang, data.tgt_lang)
    else:
        if not data.text_prefix:
            raise DataError("data.dataset=text needs data.text_prefix: files <prefix>.<split>.<lang>")
        if data.src_lang == data.tgt_lang:
            raise DataError(f"src_lang and tgt_lang are both {data.src_lang!r}")
        files = {
            split: tuple(f"{data.text_prefix}.{stem}.{lang}" for lang in (data.src_lang, data.tgt_lang))
            for split, stem in TEXT_FILES.items()
        }
        corpus = load_parallel_text(files)
    missing = [split for split in SPLITS if split not in corpus]
    if missing:
        raise DataError(
            f"data.dataset={data.dataset}: no {', '.join(missing)} split (it has: {', '.join(corpus)})"
        )
    return corpus
