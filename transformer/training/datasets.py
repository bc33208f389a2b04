"""The corpora a run trains on (``data.dataset``: Multi30k, local text files or a hub dataset; or several,
``data.corpora``), and the extra test sets of ``eval.test_sets``: each a ``Corpus`` of named splits.
"""

from dataclasses import dataclass
from pathlib import Path

from transformer.core.config import ConfigError, EvalConfig
from transformer.runtime.configs import DataConfig
from transformer.runtime.corpora import Part
from transformer.training.carving import SIZE_KEYS, carve_missing_splits
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

# data.text_prefix: <prefix>.<name>.<lang>, plain or .gz, under any of a split's names
TEXT_NAMES = {"train": ("train",), "validation": ("valid", "dev", "val", "validation"), "test": ("test",)}
PREFIX_KEYS = {"train": "train_prefix", "validation": "valid_prefix", "test": "test_prefix"}


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


@dataclass
class Loaded:
    """A corpus of the run, read: its ``Part`` (settings), its splits (with its extra test sets, "test/NAME")
    and its training files' fingerprint (``Split.fingerprint``: the cache's key, the files checked)."""

    part: Part
    corpus: Corpus
    fingerprint: str


def load_parts(parts: list[Part], settings: EvalConfig) -> list[Loaded]:
    """Every corpus of the run with its test sets: the one corpus's ``eval.test_sets``, or each of
    ``data.corpora``'s own ``test_sets`` (named ``<corpus>.<set>``); an error names the corpus's key."""
    if len(parts) == 1 and parts[0].key == "data":
        corpus = load_corpus(parts[0].data) | load_test_sets(settings.test_sets, parts[0].data)
        return [Loaded(parts[0], corpus, corpus["train"].fingerprint())]
    if settings.test_sets:
        raise ConfigError(
            "eval.test_sets with data.corpora: give each corpus its own, data.corpora[i].test_sets"
        )
    loaded = []
    for part in parts:
        try:  # a corpus without validation and test sets trains only (back-translations, say)
            corpus = load_corpus(part.data, required=("train",))
            tests = load_test_sets(part.test_sets, part.data)
            corpus |= {
                f"test/{part.name}.{name.removeprefix('test/')}": split for name, split in tests.items()
            }
            loaded.append(Loaded(part, corpus, corpus["train"].fingerprint()))
        except DataError as error:
            raise DataError(f"{part.key} ({part.name}): {error}") from None
    for split, key in (("validation", "valid"), ("test", "test")):
        if not any(split in one.corpus for one in loaded):
            raise DataError(f"data.corpora: no corpus has a {split} split; give one its {key}_prefix (or "
                            f"text_prefix, or {key}_size to carve it off its training split)")  # fmt: skip
    return loaded


def load_corpus(data: DataConfig, required: tuple[str, ...] = SPLITS) -> Corpus:
    """The configured corpus (``data.dataset``) with its train / validation / test splits; a split it lacks
    is carved off the training split when ``data.valid_size`` / ``data.test_size`` say so. A ``required``
    split it still lacks is an error."""
    if data.dataset == "multi30k":
        corpus = load_multi30k(data.src_lang, data.tgt_lang, data.data_dir)
    elif data.dataset == "hub":
        if not data.hub_name:
            raise DataError("data.dataset=hub needs data.hub_name (e.g. wmt14) and data.hub_config (de-en)")
        corpus = load_hub_dataset(data.hub_name, data.hub_config, data.src_lang, data.tgt_lang)
    else:
        if data.src_lang == data.tgt_lang:
            raise DataError(f"src_lang and tgt_lang are both {data.src_lang!r}")
        corpus = load_parallel_text(text_files(data))
    corpus = carve_missing_splits(corpus, data)
    missing = [split for split in required if split not in corpus]
    if missing:
        carve = " and ".join(f"data.{SIZE_KEYS[split]}" for split in missing if split in SIZE_KEYS)
        raise DataError(
            f"data.dataset={data.dataset}: no {' or '.join(missing)} split (it has: {', '.join(corpus)}); "
            + (f"set {carve} (e.g. 1000) to carve one off the training split" if carve else "")
        )
    return corpus


def text_files(data: DataConfig) -> dict[str, tuple[Path, Path]]:
    """The files of each split of a text corpus: ``data.<split>_prefix``'s <prefix>.<lang>, else
    ``data.text_prefix``'s <prefix>.<name>.<lang> under any name of ``TEXT_NAMES`` (each plain or .gz)."""
    if not (data.text_prefix or data.train_prefix):
        raise DataError("data.dataset=text needs data.text_prefix (files <prefix>.<split>.<lang>) or "
                        "data.train_prefix (files <prefix>.<lang>)")  # fmt: skip
    files = {}
    for split, names in TEXT_NAMES.items():
        key = PREFIX_KEYS[split]
        if getattr(data, key):
            files[split] = pair_of(getattr(data, key), data, f"data.{key}")
        elif data.text_prefix:
            found = {name: pair for name in names if (pair := pair_of(f"{data.text_prefix}.{name}", data))}
            if len(found) > 1:
                raise DataError(f"data.text_prefix={data.text_prefix}: {' and '.join(found)} each name a "
                                f"{split} split; keep one, or choose with data.{key}")  # fmt: skip
            if found:
                files[split] = next(iter(found.values()))
    if "train" not in files:
        stem = f"{data.text_prefix}.train"
        raise DataError(f"data.text_prefix={data.text_prefix}: no training files {stem}.{data.src_lang}[.gz] "
                        f"and {stem}.{data.tgt_lang}[.gz]")  # fmt: skip
    return files


def pair_of(prefix: str, data: DataConfig, key: str | None = None) -> tuple[Path, Path] | None:
    """<prefix>.<src_lang> and <prefix>.<tgt_lang>, each plain or .gz. Neither there: None (a DataError
    naming ``key`` if given); one side alone: a DataError naming the missing file."""
    langs = (data.src_lang, data.tgt_lang)
    paths = [file_of(f"{prefix}.{lang}") for lang in langs]
    if paths == [None, None] and key is None:
        return None
    missing = [f"{prefix}.{lang}[.gz]" for lang, path in zip(langs, paths) if path is None]
    if missing:
        raise DataError(f"{key or 'data.text_prefix'}: no file {' or '.join(missing)}")
    return paths[0], paths[1]


def file_of(name: str) -> Path | None:
    """The file ``name`` or ``name``.gz, whichever exists (both: a DataError, as either could be meant)."""
    found = [Path(path) for path in (name, f"{name}.gz") if Path(path).is_file()]
    if len(found) > 1:
        raise DataError(f"both {found[0]} and {found[1]} exist: keep one")
    return found[0] if found else None
