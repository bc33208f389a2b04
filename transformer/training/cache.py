"""Where a run's tokenizer and training ids come from: made once, kept in ``data.cache_dir``, reused.

    data.cache_dir, else $TRANSFORMER_MT_CACHE, else $XDG_CACHE_HOME/transformer-mt (~/.cache/transformer-mt)
      tokenizer-<key>/tokenizer.model   key: the training files' SHA-256 (each corpus's, with its languages,
                                        when there are several) and the tokenizer settings
      store-<key>/                      key: one corpus's training files' SHA-256 and the tokenizer's own
                                        SHA-256: one store per corpus (with the same tokenizer, e.g.
                                        data.tokenizer, a corpus added to a run is the only one tokenized)

So a second run on the same files and settings — into another run folder, a ``--resume``, every DDP rank —
trains no tokenizer and tokenizes nothing: it opens both (``token_store.open_store`` checks the store
first). Changing a file's content or a tokenizer setting changes the key, so a stale entry is never used;
a damaged store is rebuilt. ``data.tokenizer: PATH`` uses that SentencePiece model instead of training one.
"""

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from transformer.core.tokenizer import Tokenizer
from transformer.runtime.configs import DataConfig
from transformer.runtime.lines import DataError
from transformer.training.carving import Carved
from transformer.training.corpus import ParallelArrow, ParallelFiles, Split, iter_lines
from transformer.training.ranks import Runtime
from transformer.training.token_store import (
    CHUNK_PAIRS,
    FORMAT,
    TokenStore,
    build_store,
    cache_lock,
    open_store,
    publish,
    remove_stale_partials,
)
from transformer.training.tokenizer_job import train_elsewhere

CACHE_VARIABLE = "TRANSFORMER_MT_CACHE"  # moves the default cache (data.cache_dir still wins)
AUTO_WORKERS_BYTES = 32 << 20  # a corpus smaller than this is tokenized in the training process


def cache_root(data: DataConfig) -> Path:
    """The cache folder: ``data.cache_dir``, else $TRANSFORMER_MT_CACHE, else the user's cache folder
    ($XDG_CACHE_HOME, by default ~/.cache) / transformer-mt; never inside the checkout."""
    if data.cache_dir:
        return Path(data.cache_dir).expanduser()
    if os.environ.get(CACHE_VARIABLE):
        return Path(os.environ[CACHE_VARIABLE]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "transformer-mt"


def key_of(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]


def cannot_build(folder: Path, why: str) -> DataError:
    """The error of a cache that cannot be written (another user's, a read-only disk) missing an entry."""
    return DataError(
        f"the cache {folder.parent} cannot be written, and its entry {folder.name} {why}: set data.cache_dir "
        "to a folder you can write"
    )


def given_tokenizer(path: str) -> Path:
    """``data.tokenizer``: a SentencePiece model with this project's special ids, or a ``DataError``."""
    model = Path(path).expanduser()
    if not model.is_file():
        raise DataError(f"data.tokenizer={path}: file not found")
    try:
        Tokenizer(model)
    except (ValueError, RuntimeError, OSError) as error:  # wrong special ids, or not a SentencePiece model
        raise DataError(f"data.tokenizer={path}: {error}") from None
    return model


def cached_tokenizer(loaded: list, symbols: list[str], data: DataConfig, log=print) -> Path:
    """The SentencePiece model for these corpora (``datasets.Loaded``) and settings, with ``symbols`` as
    user-defined pieces: from the cache, else trained there. One corpus without symbols learns from its
    training files as they are; several learn from ``balanced_sentences``."""
    if data.tokenizer:
        return given_tokenizer(data.tokenizer)
    settings = (data.vocab_size, data.tokenizer_type, data.character_coverage, data.tokenizer_sample)
    if key_alone(loaded, symbols):
        key = key_of("tokenizer", loaded[0].fingerprint, *settings)
    else:
        corpora = [[one.fingerprint, one.part.data.src_lang, one.part.data.tgt_lang] for one in loaded]
        key = key_of("tokenizer", corpora, *settings, symbols)
    folder = cache_root(data) / f"tokenizer-{key}"
    model = folder / "tokenizer.model"
    with cache_lock(folder) as writable:
        if model.is_file():
            try:
                Tokenizer(model)
                return model
            except (ValueError, RuntimeError, OSError):
                if not writable:
                    raise cannot_build(folder, "cannot be read") from None
                log(f"data: {model} cannot be read: training it again")
        if not writable:
            raise cannot_build(folder, "does not exist yet")
        remove_stale_partials(folder.parent, folder.name)
        building = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
        try:
            with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}-text-") as text:
                files = (sentence_files(loaded[0].corpus["train"], Path(text)) if key_alone(loaded, symbols)
                         else balanced_sentences(loaded, Path(text), data.tokenizer_sample))  # fmt: skip
                train_elsewhere(files, building / "tokenizer", *settings, tuple(symbols))
            (building / "tokenizer.vocab").unlink(missing_ok=True)  # later runs read the model alone
            publish(building, folder)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return model


def key_alone(loaded: list, symbols: list[str]) -> bool:
    """Whether the tokenizer is one corpus's alone (learnt from its files as they are, keyed by them)."""
    return len(loaded) == 1 and not symbols


def sentence_files(train: Split, folder: Path) -> list[Path]:
    """The files a tokenizer learns from, in the order it always has: every source line, then every target
    line. A split held in memory is written to ``folder`` first."""
    if isinstance(train, ParallelFiles):
        return [train.src_path, train.tgt_path]
    path = folder / "sentences.txt"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line.replace("\n", " ") + "\n" for line in train.sentences())
    return [path]


def balanced_sentences(loaded: list, folder: Path, sample: int, seed: int = 1) -> list[Path]:
    """One file with as many sentences of every language of the corpora: up to ``sample`` / languages
    each, drawn at random from that language's text (a file two corpora share, read once); a language with
    fewer is repeated up to the largest one's count, so that each weighs the same in the vocabulary."""
    sides: dict[str, dict] = {}  # language -> {what identifies a side: (split, 0 source / 1 target)}
    for one in loaded:
        train = one.corpus["train"]
        for side, lang in enumerate((one.part.data.src_lang, one.part.data.tgt_lang)):
            same = train.facts[side][0] if isinstance(train, ParallelFiles) else (one.fingerprint, side)
            sides.setdefault(lang, {})[same] = (train, side)
    cap, rng = max(1, sample // len(sides)), random.Random(seed)
    drawn = {lang: reservoir(side_lines(found.values()), cap, rng) for lang, found in sides.items()}
    if empty := [lang for lang, lines in drawn.items() if not lines]:
        raise DataError(
            f"data.corpora: no training sentence in {', '.join(empty)} to learn the tokenizer from"
        )
    each = max(len(lines) for lines in drawn.values())
    path = folder / "sentences.txt"
    with open(path, "w", encoding="utf-8") as f:
        for lang in sorted(drawn):
            lines = drawn[lang]
            copies, rest = divmod(each, len(lines))
            for line in lines * copies + rng.sample(lines, rest):
                f.write(line.replace("\n", " ") + "\n")
    return [path]


def side_lines(sides) -> Iterator[str]:
    """The lines of one side of each split: ``(split, 0)`` its sources, ``(split, 1)`` its targets."""
    for split, side in sides:
        if isinstance(split, ParallelFiles):
            yield from iter_lines((split.src_path, split.tgt_path)[side])
        else:
            for chunk in split.chunks(CHUNK_PAIRS):
                yield from chunk[side]


def reservoir(lines: Iterator[str], size: int, rng: random.Random) -> list[str]:
    """A uniform random sample of at most ``size`` of ``lines`` (Algorithm R), in memory ``size`` lines."""
    kept = []
    for n, line in enumerate(lines):
        if n < size:
            kept.append(line)
        elif (j := rng.randrange(n + 1)) < size:
            kept[j] = line
    return kept


def workers_for(train: Split, data: DataConfig) -> int:
    if data.workers >= 0:
        return data.workers
    if isinstance(train, Carved):
        train = train.source  # a few pairs fewer: the same choice
    if isinstance(train, ParallelFiles):
        size = train.src_path.stat().st_size + train.tgt_path.stat().st_size
    elif isinstance(train, ParallelArrow):
        size = train.dataset.data.nbytes  # the Arrow table's bytes: no text is read for this
    else:
        size = sum(map(len, train.src)) + sum(map(len, train.tgt))
    return min(os.cpu_count() or 1, 8) if size > AUTO_WORKERS_BYTES else 0


def train_store(
    train: Split, fingerprint: str, tokenizer: Tokenizer, data: DataConfig,
    runtime: Runtime, log=print,
) -> TokenStore:  # fmt: skip
    """The training split's token store for this tokenizer: opened from the cache, else built there by
    rank 0 while the other ranks wait."""
    tokenizer_bytes = tokenizer.to_bytes()  # a Marian tokenizer's are a zip made on each call: once
    model_sha = hashlib.sha256(tokenizer_bytes).hexdigest()
    # a Marian tokenizer's Python code is part of what it is; a SentencePiece model is its bytes alone
    encoder = [tokenizer.encoder_version] if hasattr(tokenizer, "encoder_version") else []
    folder = cache_root(data) / f"store-{key_of('store', FORMAT, fingerprint, model_sha, *encoder)}"
    store = None
    if runtime.is_main:
        with cache_lock(folder) as writable:
            store, why = open_store(folder)
            if store is None:
                if not writable:
                    raise cannot_build(folder, f"cannot be used ({why})")
                if folder.exists():
                    log(f"data: the store in {folder} cannot be used ({why}): building it again")
                chunks = train.chunks(CHUNK_PAIRS)
                workers = workers_for(train, data)
                store = build_store(folder, chunks, tokenizer_bytes, tokenizer.vocab_size, workers)
    runtime.wait_for_main()
    if store is None:
        store, why = open_store(folder)
        if store is None:
            raise DataError(f"the token store in {folder} cannot be used: {why}")
    return store
