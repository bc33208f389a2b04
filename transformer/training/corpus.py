"""Parallel text: local text files (plain or gzip) and Hugging Face hub datasets, read line by line with
one line policy. Text in, text out: tokenizing is ``splits.py``'s job, the choice of corpus
``datasets.py``'s.

A corpus is a plain ``dict`` from split name to ``ParallelText`` (two equally long lists of lines), whatever
its source; a training split read from files is a ``ParallelFiles`` instead, streamed a chunk at a time, and
a hub split a ``ParallelArrow``, read from its memory-mapped Arrow table a slice at a time (a corpus of
millions of pairs is never held as text: the token store, ``token_store.py``, holds its ids).
Split names are ``SPLITS``; a file's other names for them (``val``, ``valid``, ``dev``) are
mapped once, in ``split_name``. The ``datasets`` package is needed only for ``data.dataset: hub``.

Every error is a ``DataError`` that names the file and, where it applies, the line.
"""

import gzip
import hashlib
import itertools
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from transformer.runtime.lines import BOM, DataError, decode_line
from transformer.training.token_store import file_digest

SPLITS = ("train", "validation", "test")
SPLIT_ALIASES = {"valid": "validation", "dev": "validation", "val": "validation"}


@dataclass
class ParallelText:
    """One split of a parallel corpus: ``src[i]`` translates to ``tgt[i]``."""

    src: list[str]
    tgt: list[str]

    def __post_init__(self):
        if len(self.src) != len(self.tgt):
            raise ValueError(f"{len(self.src)} source lines but {len(self.tgt)} target lines")

    def __len__(self) -> int:
        return len(self.src)

    def head(self, n: int) -> "ParallelText":
        """The first ``n`` pairs (all of them for n <= 0)."""
        return ParallelText(self.src[:n], self.tgt[:n]) if n > 0 else self

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        """(source lines, target lines) of ``size`` pairs at a time."""
        for start in range(0, len(self.src), size):
            yield self.src[start : start + size], self.tgt[start : start + size]

    def sentences(self) -> Iterator[str]:
        """Every source line, then every target line (what a joint tokenizer learns from)."""
        return itertools.chain(self.src, self.tgt)

    def fingerprint(self) -> str:
        """SHA-256 of the pairs' text: equal text, equal fingerprint."""
        sha = hashlib.sha256()
        for src, tgt in zip(self.src, self.tgt):
            sha.update(f"{src}\n{tgt}\n".encode())
        return sha.hexdigest()


class ReadWhole:
    """``src`` / ``tgt`` of a streamed split: its ``whole`` text, read when first asked (small splits)."""

    @property
    def src(self) -> list[str]:
        return self.whole.src

    @property
    def tgt(self) -> list[str]:
        return self.whole.tgt


@dataclass
class ParallelFiles(ReadWhole):
    """A split in two line-aligned files (plain or `.gz`), read only when asked: ``chunks`` and ``sentences``
    stream it; ``src`` / ``tgt`` read it whole (for small splits and tools)."""

    src_path: Path
    tgt_path: Path

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        """(source lines, target lines) of ``size`` pairs at a time; files of different lengths are a
        ``DataError`` naming both, raised when the shorter one ends."""
        src_lines, tgt_lines = iter_lines(self.src_path), iter_lines(self.tgt_path)
        n = 0
        while True:
            src = list(itertools.islice(src_lines, size))
            tgt = list(itertools.islice(tgt_lines, size))
            n += min(len(src), len(tgt))
            if len(src) != len(tgt):
                longer, shorter = (self.src_path, self.tgt_path)[:: 1 if len(src) > len(tgt) else -1]
                raise DataError(f"parallel files differ in length: {shorter} ends after line {n}, {longer} "
                                "goes on")  # fmt: skip
            if not src:
                return
            yield src, tgt

    def sentences(self) -> Iterator[str]:
        return itertools.chain(iter_lines(self.src_path), iter_lines(self.tgt_path))

    @cached_property
    def facts(self) -> tuple[tuple[str, int], tuple[str, int]]:
        """(SHA-256, lines) of each file (``file_facts``), read once."""
        return file_facts(self.src_path), file_facts(self.tgt_path)

    def fingerprint(self) -> str:
        """SHA-256 over the two files' own SHA-256 (their bytes, wherever they are); an empty file, or files
        of different lengths, are a ``DataError`` here, before any run folder is written."""
        (src_sha, src_lines), (tgt_sha, tgt_lines) = self.facts
        if src_lines != tgt_lines:
            raise DataError(f"parallel files differ in length: {self.src_path} has {src_lines} lines, "
                            f"{self.tgt_path} has {tgt_lines}")  # fmt: skip
        return hashlib.sha256(f"{src_sha} {tgt_sha}".encode()).hexdigest()

    @cached_property
    def whole(self) -> ParallelText:
        return read_parallel(self.src_path, self.tgt_path)

    def __len__(self) -> int:
        return len(self.whole)

    def head(self, n: int) -> ParallelText:
        return self.whole.head(n)


@dataclass
class ParallelArrow(ReadWhole):
    """A hub split read from the Arrow table ``datasets`` keeps on disk (memory-mapped): ``chunks`` and
    ``sentences`` turn a slice at a time into Python strings, so a split of millions of pairs is never held
    as text; ``src`` / ``tgt`` read it whole (validation and test)."""

    dataset: object  # a datasets.Dataset with a "translation" column of {language: sentence}
    src_lang: str
    tgt_lang: str

    def _lines(self, start: int, stop: int, lang: str) -> list[str]:
        column = self.dataset.with_format("arrow")[start:stop]["translation"].combine_chunks()  # pyarrow
        return column.field(lang).to_pylist()

    def _pairs(self, start: int, stop: int) -> tuple[list[str], list[str]]:
        return self._lines(start, stop, self.src_lang), self._lines(start, stop, self.tgt_lang)

    def chunks(self, size: int) -> Iterator[tuple[list[str], list[str]]]:
        for start in range(0, len(self), size):
            yield self._pairs(start, start + size)

    def sentences(self) -> Iterator[str]:
        """Every source line, then every target line: one pass per side, a slice at a time."""
        slices = range(0, len(self), 100_000)
        return (line for lang in (self.src_lang, self.tgt_lang) for start in slices
                for line in self._lines(start, start + 100_000, lang))  # fmt: skip

    def fingerprint(self) -> str:
        """SHA-256 over the languages, the number of pairs, ``datasets``' own fingerprint (which changes with
        a selection or a shard of the same files) and the SHA-256 of the Arrow files that hold the split; over
        the pairs' text instead when there is no file (a dataset made in memory) or an indices mapping."""
        sha = hashlib.sha256(f"{self.src_lang} {self.tgt_lang} {len(self)}\n".encode())
        files = [Path(f["filename"]) for f in self.dataset.cache_files]
        if files and getattr(self.dataset, "_indices", None) is None:
            sha.update(str(getattr(self.dataset, "_fingerprint", "")).encode())
            for path in files:
                sha.update(file_digest(path).encode())
            return sha.hexdigest()
        for src, tgt in self.chunks(100_000):
            sha.update(ParallelText(src, tgt).fingerprint().encode())
        return sha.hexdigest()

    @cached_property
    def whole(self) -> ParallelText:
        return ParallelText(*self._pairs(0, len(self)))

    def __len__(self) -> int:
        return len(self.dataset)

    def head(self, n: int) -> ParallelText:
        return ParallelText(*self._pairs(0, n)) if n > 0 else self.whole


Split = ParallelText | ParallelFiles | ParallelArrow
Corpus = dict[str, Split]


def split_name(name: str) -> str:
    """A split's canonical name: 'val', 'valid' and 'dev' are 'validation'."""
    return SPLIT_ALIASES.get(name, name)


# -------- files of lines, with runtime/lines.py's rules ---------------------------------------------


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (plain, or gzip if the name ends in `.gz`); see ``split_lines``."""
    return list(iter_lines(path))


def file_facts(path: Path) -> tuple[str, int]:
    """(SHA-256 of a text file's bytes, its number of lines); an empty file is a ``DataError``. A plain file
    is read once; a `.gz` one is also read decompressed, to count its lines."""
    if path.suffix != ".gz":
        sha, lines, last = hashlib.sha256(), 0, b"\n"
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                sha.update(block)
                lines, last = lines + block.count(b"\n"), block[-1:]
        digest = sha.hexdigest()
        lines += last != b"\n"  # a last line without its newline
    else:
        digest, lines = file_digest(path), sum(1 for _ in iter_lines(path))
    if lines == 0:
        raise DataError(f"{path}: file is empty")
    return digest, lines


def iter_lines(path: str | Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (plain or `.gz`) one at a time, with ``split_lines``'s rules (a
    byte-order mark dropped): THE reader of text files; an empty or missing file is a ``DataError``."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    n = 0
    try:
        with opener(path, "rb") as f:
            for n, raw in enumerate(f, start=1):  # binary lines end at b"\n" only
                if n == 1:
                    raw = raw.removeprefix(BOM)
                yield decode_line(raw.removesuffix(b"\n"), n, str(path))
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        what = "corrupted gzip file" if path.suffix == ".gz" else "cannot be read"
        raise DataError(f"{path}: {what} ({error})") from error
    if n == 0:
        raise DataError(f"{path}: file is empty")


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> ParallelText:
    """Source and target lines of a parallel corpus; line i of each is a translation pair."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"parallel files differ in length: {src_path} has {len(src_lines)} lines, "
            f"{tgt_path} has {len(tgt_lines)}"
        )
    return ParallelText(src_lines, tgt_lines)


def check_languages(src_lang: str, tgt_lang: str, valid: Sequence[str]) -> None:
    for lang in (src_lang, tgt_lang):
        if lang not in valid:
            raise DataError(f"language {lang!r} not available; valid: {', '.join(valid)}")
    if src_lang == tgt_lang:
        raise DataError(f"src_lang and tgt_lang are both {src_lang!r}; valid: {', '.join(valid)}")


# -------- sources --------------------------------------------------------------------------------


def load_parallel_text(files: dict[str, tuple[str | Path, str | Path]]) -> Corpus:
    """Local parallel text files: ``{split: (src_path, tgt_path)}``, plain or `.gz`. The training split is
    streamed (``ParallelFiles``, its files checked to exist now), the others read whole."""
    corpus = {}
    for split, (src, tgt) in files.items():
        if split_name(split) == "train":
            for path in (src, tgt):
                if not Path(path).is_file():
                    raise DataError(f"{path}: file not found")
            corpus["train"] = ParallelFiles(Path(src), Path(tgt))
        else:
            corpus[split_name(split)] = read_parallel(src, tgt)
    return corpus


def load_hub_dataset(
    name: str, config: str | None, src_lang: str, tgt_lang: str, split: str | None = None, **kwargs
) -> Corpus:
    """A Hugging Face hub translation dataset: ``load_hub_dataset("wmt14", "de-en", "de", "en")``;
    with ``split``, that split alone is prepared (a test set of a corpus whose training split is millions
    of pairs).

    ``kwargs`` go to ``datasets.load_dataset`` (e.g. ``cache_dir``, ``data_files``); ``name`` may also be
    a builder such as "json" or "parquet" for local files. Only the ``translation`` column is read.
    """
    try:
        import datasets  # only this source needs it
    except ImportError:
        raise DataError('data.dataset=hub needs the datasets package: pip install -e ".[hub]"') from None

    try:
        dataset = datasets.load_dataset(name, config, **({"split": split} if split else {}), **kwargs)
    except (
        OSError,
        ValueError,
        ConnectionError,
    ) as error:  # not found, an unknown config or split, no network
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if split and "split" in first.lower():
            raise DataError(f"no split {split!r}: {first}") from None
        raise DataError(f"hub dataset {name} ({config or 'no config'}) cannot be loaded: {first}") from None
    if split:
        dataset = {split: dataset}
    corpus = {}
    for split, ds in dataset.items():
        if "translation" not in ds.column_names:
            raise DataError(
                f"{name}/{config} split {split!r} has no 'translation' column; "
                f"columns: {', '.join(ds.column_names)}"
            )
        feature = ds.features["translation"]
        available = feature.languages if isinstance(feature, datasets.Translation) else list(feature)
        check_languages(src_lang, tgt_lang, valid=available)
        corpus[split_name(split)] = ParallelArrow(ds, src_lang, tgt_lang)  # read a slice at a time
    return corpus
