"""Data: parallel text -> `datasets.DatasetDict` -> token ids -> token-bucket batches (§5.1).

Every loader returns a `DatasetDict` with splits `train` / `validation` / `test` (those that exist)
and one column, `translation`, holding `{src_lang: str, tgt_lang: str}` per sentence pair.

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

import gzip
import hashlib
import math
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import datasets
import torch
from datasets import Dataset, DatasetDict, Features, Translation

from .tokenizer import Tokenizer

MULTI30K_LANGUAGES = ("en", "de", "fr", "cs")
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}  # split: stem
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_CACHE_DIR = "~/.cache/transformer_mt/multi30k"
SPLIT_ALIASES = {"valid": "validation", "dev": "validation", "val": "validation"}

Item = TypeVar("Item")  # not `T`, which is the target length here


class DataError(ValueError):
    """A data file is missing, malformed, or not the file we expected."""


# -------- text files -----------------------------------------------------------------------------


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (plain, or gzip if the name ends in `.gz`).

    Only the line ending ("\\n" or "\\r\\n") is removed. We split on "\\n" alone, not with
    `str.splitlines`, which also breaks at "\\x0b", "\\x1c", "\\u2028", ... and would silently
    misalign a parallel corpus.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as f:
                data = f.read()
        except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
            raise DataError(f"{path}: corrupted gzip file ({error})") from error
    else:
        data = path.read_bytes()
    if not data:
        raise DataError(f"{path}: file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(f"{path}: line {line} is not valid UTF-8 ({error.reason})") from error
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line does not start another one
    return [line.removesuffix("\r") for line in lines]


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Source and target lines of a parallel corpus; line i of each is a translation pair."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"parallel files differ in length: {src_path} has {len(src_lines)} lines, "
            f"{tgt_path} has {len(tgt_lines)}"
        )
    return src_lines, tgt_lines


def _to_dataset(
    src_lines: list[str],
    tgt_lines: list[str],
    src_lang: str,
    tgt_lang: str,
) -> Dataset:
    pairs = [{src_lang: s, tgt_lang: t} for s, t in zip(src_lines, tgt_lines, strict=True)]
    features = Features({"translation": Translation(languages=[src_lang, tgt_lang])})
    return Dataset.from_dict({"translation": pairs}, features=features)


def _check_languages(src_lang: str, tgt_lang: str, valid: Sequence[str]) -> None:
    for lang in (src_lang, tgt_lang):
        if lang not in valid:
            raise DataError(f"language {lang!r} not available; valid: {', '.join(valid)}")
    if src_lang == tgt_lang:
        raise DataError(f"src_lang and tgt_lang are both {src_lang!r}; valid: {', '.join(valid)}")


# -------- loaders --------------------------------------------------------------------------------


def load_parallel_text(
    files: dict[str, tuple[str | Path, str | Path]], src_lang: str, tgt_lang: str
) -> DatasetDict:
    """Local parallel text files: `{split: (src_path, tgt_path)}`, plain or `.gz`.

    Split names "valid", "dev" and "val" are renamed "validation".
    """
    if src_lang == tgt_lang:
        raise DataError(f"src_lang and tgt_lang are both {src_lang!r}")
    splits = {}
    for split, (src_path, tgt_path) in files.items():
        src_lines, tgt_lines = read_parallel(src_path, tgt_path)
        name = SPLIT_ALIASES.get(split, split)
        splits[name] = _to_dataset(src_lines, tgt_lines, src_lang, tgt_lang)
    return DatasetDict(splits)


def load_multi30k(
    src_lang: str = "de",
    tgt_lang: str = "en",
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> DatasetDict:
    """Multi30k task 1 (train 29000, validation 1014, test = test_2016_flickr 1000 sentences).

    Files come from `data_dir`, else the `MULTI30K_DIR` environment variable, else they are
    downloaded once into `cache_dir` (default ~/.cache/transformer_mt/multi30k). Either way each
    file must match its SHA-256 in `multi30k_sha256sums.txt`.
    """
    _check_languages(src_lang, tgt_lang, valid=MULTI30K_LANGUAGES)
    data_dir = data_dir if data_dir is not None else os.environ.get("MULTI30K_DIR")
    cache_dir = Path(cache_dir if cache_dir is not None else MULTI30K_CACHE_DIR).expanduser()
    expected = _multi30k_sha256sums()
    files = {}
    for split, stem in MULTI30K_SPLITS.items():
        names = [f"{stem}.{src_lang}.gz", f"{stem}.{tgt_lang}.gz"]
        if data_dir is not None:
            paths = [Path(data_dir) / name for name in names]
        else:
            paths = [_download(name, cache_dir, expected[name]) for name in names]
        for name, path in zip(names, paths, strict=True):
            if not path.is_file():
                raise DataError(f"{path}: file not found (Multi30k data_dir {data_dir})")
            _check_sha256(path, expected[name])
        files[split] = (paths[0], paths[1])
    return load_parallel_text(files, src_lang, tgt_lang)


def _multi30k_sha256sums() -> dict[str, str]:
    """{file name: hex digest} from the `sha256sum`-format file shipped next to this module."""
    text = Path(__file__).with_name("multi30k_sha256sums.txt").read_text(encoding="utf-8")
    return {name: digest for digest, name in (line.split() for line in text.splitlines() if line)}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(path: Path, expected: str, name: str | None = None) -> None:
    actual = _sha256(path)
    if actual != expected:
        raise DataError(
            f"{name or path}: SHA-256 mismatch, expected {expected}, got {actual} "
            "(a truncated or different file?)"
        )


def _download(name: str, cache_dir: Path, expected_sha256: str) -> Path:
    """Fetch Multi30k file `name` into `cache_dir` unless it is already there.

    The bytes go to a temp file that is checked, then renamed: never a half-written `name`.
    """
    path, url = cache_dir / name, MULTI30K_URL + name
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            shutil.copyfileobj(response, out)
        _check_sha256(Path(tmp_name), expected_sha256, name=url)
        os.replace(tmp_name, path)
    except (urllib.error.URLError, OSError) as error:
        raise DataError(f"cannot download {url}: {error} (or set MULTI30K_DIR)") from error
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    return path


def load_hub_dataset(
    name: str,
    config: str | None,
    src_lang: str,
    tgt_lang: str,
    **kwargs,
) -> DatasetDict:
    """A Hugging Face Hub translation dataset: `load_hub_dataset("wmt14", "de-en", "de", "en")`.

    `kwargs` go to `datasets.load_dataset` (e.g. `cache_dir`). Only `translation` is kept.
    """
    dataset = datasets.load_dataset(name, config, **kwargs)
    dataset = DatasetDict({SPLIT_ALIASES.get(split, split): ds for split, ds in dataset.items()})
    for split, ds in dataset.items():
        if "translation" not in ds.column_names:
            raise DataError(
                f"{name}/{config} split {split!r} has no 'translation' column; "
                f"columns: {', '.join(ds.column_names)}"
            )
        feature = ds.features["translation"]
        available = feature.languages if isinstance(feature, Translation) else list(feature)
        _check_languages(src_lang, tgt_lang, valid=available)
    return dataset.select_columns(["translation"])


# -------- ids ------------------------------------------------------------------------------------


def encode_split(
    split: Dataset, tokenizer: Tokenizer, src_lang: str, tgt_lang: str
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of every source and target sentence, without BOS / EOS (`collate` adds them)."""
    pairs = split.with_format("arrow")["translation"].combine_chunks()  # pyarrow: ~50x faster
    src_ids = tokenizer.encode_batch(pairs.field(src_lang).to_pylist())
    tgt_ids = tokenizer.encode_batch(pairs.field(tgt_lang).to_pylist())
    return src_ids, tgt_ids


def filter_by_length(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    max_len: int,
) -> list[int]:
    """Indices of the pairs whose `src` and `tgt_in` / `tgt_out` rows (length + 1) fit in max_len.

    For training data only: validation and test sets are never filtered.
    """
    pairs = zip(src_lengths, tgt_lengths, strict=True)
    return [i for i, (s, t) in enumerate(pairs) if s + 1 <= max_len and t + 1 <= max_len]


# -------- batches --------------------------------------------------------------------------------


@dataclass
class Batch:
    """One padded batch of sentence pairs, laid out as in the picture at the top."""

    src: torch.Tensor  # (B, S) long: source + EOS, PAD at the end
    tgt_in: torch.Tensor  # (B, T) long: BOS + target, PAD at the end
    tgt_out: torch.Tensor  # (B, T) long: target + EOS, PAD at the end
    indices: torch.Tensor  # (B,) long: positions of these pairs in their dataset split
    n_src_tokens: int  # non-PAD tokens in src
    n_tgt_tokens: int  # non-PAD tokens in tgt_out: what the summed loss is divided by

    def to(self, device: torch.device | str) -> "Batch":
        """Move the model inputs and labels; `indices` stays on the CPU for bookkeeping."""
        return Batch(
            self.src.to(device),
            self.tgt_in.to(device),
            self.tgt_out.to(device),
            self.indices,
            self.n_src_tokens,
            self.n_tgt_tokens,
        )


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
        indices=torch.tensor(list(indices), dtype=torch.long),  # (B,)
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
    rank: int = 0,
    world_size: int = 1,
    indices: Sequence[int] | None = None,
    chunk_batches: int = 100,
) -> list[list[int]]:
    """Group sentence pairs of similar length into batches of at most `max_tokens` padded tokens.

    `src_lengths` / `tgt_lengths` are token counts without BOS / EOS; `indices` (default: all)
    selects the pairs to batch, e.g. the output of `filter_by_length`. Returns this rank's batches,
    each a list of indices. A batch costs B * (S + T) tokens including padding and the added
    EOS / BOS, as `collate` will build it; only a single pair longer than the budget exceeds it,
    as a batch of one.

    shuffle=True (training): shuffle the pairs with a generator seeded by (seed, epoch), cut them
    into chunks of about `chunk_batches` batches, sort each chunk by length, cut it into batches,
    and shuffle the batch order. The same arguments give the same batches.
    shuffle=False (evaluation): sort all pairs by length and batch them in that order; recover
    the input order with `restore_order`. Pairs sort by source length, then target length: to
    translate text without references, pass zeros as `tgt_lengths`.
    The paper's batches of ~25000 source + ~25000 target tokens are about max_tokens=50000 here.

    Sharding: every rank must call with the same arguments but `rank`. Rank r takes batches
    r, r + world_size, ...; so that all ranks take the same number of steps, the list is first
    padded by repeating batches from its start, which then appear twice in the epoch.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    order = list(range(len(src_lengths))) if indices is None else list(indices)

    def length(i: int) -> tuple[int, int]:
        return src_lengths[i], tgt_lengths[i]

    if shuffle:
        # one random stream per (seed, epoch): the same on every rank, different every epoch
        generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        order = [order[j] for j in torch.randperm(len(order), generator=generator).tolist()]
        batches = []
        for chunk in _chunks(order, src_lengths, tgt_lengths, chunk_batches * max_tokens):
            chunk = sorted(chunk, key=length)
            batches += cut_into_batches(chunk, src_lengths, tgt_lengths, max_tokens)
        batches = [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]
    else:
        batches = cut_into_batches(sorted(order, key=length), src_lengths, tgt_lengths, max_tokens)
    return _shard(batches, rank, world_size)


def _chunks(
    order: list[int], src_lengths: Sequence[int], tgt_lengths: Sequence[int], chunk_tokens: int
) -> Iterator[list[int]]:
    """Consecutive runs of `order` holding about `chunk_tokens` real tokens each."""
    chunk, tokens = [], 0
    for i in order:
        chunk.append(i)
        tokens += src_lengths[i] + tgt_lengths[i] + 2
        if tokens >= chunk_tokens:
            yield chunk
            chunk, tokens = [], 0
    if chunk:
        yield chunk


def cut_into_batches(
    order: list[int],
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    max_tokens: int,
) -> list[list[int]]:
    """Cut `order`, as it is, into consecutive batches of padded size B * (S + T) <= max_tokens.

    `make_batches` sorts by length first; without that (a random order) most tokens are padding.
    """
    batches, batch, S, T = [], [], 0, 0
    for i in order:
        s, t = src_lengths[i] + 1, tgt_lengths[i] + 1  # + EOS; + BOS or EOS
        if batch and (len(batch) + 1) * (max(S, s) + max(T, t)) > max_tokens:
            batches.append(batch)
            batch, S, T = [], 0, 0
        batch.append(i)
        S, T = max(S, s), max(T, t)
    if batch:
        batches.append(batch)
    return batches


def _shard(batches: list[list[int]], rank: int, world_size: int) -> list[list[int]]:
    if not batches:
        return []
    n_per_rank = math.ceil(len(batches) / world_size)
    padded = [batches[k % len(batches)] for k in range(n_per_rank * world_size)]
    return padded[rank::world_size]


def iter_batches(
    src_ids: list[list[int]],
    tgt_ids: list[list[int]],
    batches: list[list[int]],
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
