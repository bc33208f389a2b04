"""The training split as token ids on disk: tokenized once, memory-mapped, shared by every run that reads the
same files with the same tokenizer (another run folder, a ``--resume``, every DDP rank).

A store is a folder of flat NumPy arrays, written once and never changed:

    src.bin, tgt.bin   every sentence's token ids one after another (uint16 while the vocabulary fits, else
                       uint32), read through ``np.memmap``: a batch touches only its own sentences' pages
    src.len, tgt.len   int32 tokens per sentence; a sentence's offset is the sum of the lengths before it
    pairs.hash         uint64 per pair, a hash of its two lines (exact duplicates, for ``data.dedup``)
    manifest.json      the counts, the dtype and the SHA-256 of every file above; written last

Why NumPy rather than Arrow: the core package needs no new dependency, a sentence is one slice of one array,
and the operating system's page cache shares the pages between the processes of one machine. A store is built
in a temporary folder and renamed into place, so a reader never sees half of one; ``open_store`` checks the
manifest, every file's size and its SHA-256, and answers why it will not use a store that fails (it is then
rebuilt, never used). Tokenizing runs in worker processes, a chunk of pairs at a time, with a progress bar.
"""

import contextlib
import hashlib
import itertools
import json
import multiprocessing
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from transformer.interop.formats import read_tokenizer as tokenizer_from_bytes
from transformer.interop.formats import target_tokenizer

try:
    import fcntl
except ImportError:  # not on Windows: no lock there
    fcntl = None

FORMAT = 1
FILES = ("src.bin", "tgt.bin", "src.len", "tgt.len", "pairs.hash")
CHUNK_PAIRS = 20_000  # pairs per task sent to a worker


class Side(Sequence):
    """One side of a store as a sequence of token-id lists: ``side[i]`` reads sentence i only."""

    def __init__(self, tokens: np.ndarray, lengths: np.ndarray):
        self.tokens, self.lengths = tokens, lengths  # (total tokens,), (pairs,)
        self.offsets = np.zeros(len(lengths) + 1, dtype=np.int64)  # (pairs + 1,)
        np.cumsum(lengths, out=self.offsets[1:])

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> list[int]:
        if not 0 <= i < len(self.lengths):
            raise IndexError(f"sentence {i} of {len(self.lengths)}")
        return self.tokens[self.offsets[i] : self.offsets[i + 1]].tolist()


@dataclass
class TokenStore:
    folder: Path
    src: Side
    tgt: Side
    hashes: np.ndarray  # (pairs,) uint64
    manifest: dict

    def __len__(self) -> int:
        return len(self.src)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            sha.update(block)
    return sha.hexdigest()


# -------- reading -------------------------------------------------------------------------------------------


def open_store(folder: Path) -> tuple[TokenStore | None, str]:
    """(the store in ``folder``, "") or (None, why it cannot be used: missing, partial, corrupted, old)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "no store yet" if not folder.exists() else "no manifest (a partial store)"
    except (OSError, ValueError) as error:
        return None, f"unreadable manifest ({error})"
    found = manifest.get("format") if isinstance(manifest, dict) else None
    if found != FORMAT:
        return None, f"store format {found}, this code reads {FORMAT}"
    try:
        dtype, pairs = np.dtype(manifest["dtype"]), int(manifest["pairs"])
        tokens = manifest["tokens"]
        sizes = {"src.bin": tokens["src"] * dtype.itemsize, "tgt.bin": tokens["tgt"] * dtype.itemsize,
                 "src.len": 4 * pairs, "tgt.len": 4 * pairs, "pairs.hash": 8 * pairs}  # fmt: skip
        digests = {name: manifest["sha256"][name] for name in FILES}
    except (KeyError, TypeError, ValueError) as error:
        return None, f"an incomplete manifest ({error!r})"
    for name in FILES:
        path = folder / name
        if not path.is_file() or path.stat().st_size != sizes[name]:
            return None, f"{name} is missing or has the wrong size (a partial or damaged store)"
        if file_digest(path) != digests[name]:
            return None, f"{name} does not match its SHA-256 (a corrupted store)"

    def array(name: str, kind) -> np.ndarray:
        return np.memmap(folder / name, dtype=kind, mode="r") if sizes[name] else np.zeros(0, kind)

    src = Side(array("src.bin", dtype), np.fromfile(folder / "src.len", dtype=np.int32))
    tgt = Side(array("tgt.bin", dtype), np.fromfile(folder / "tgt.len", dtype=np.int32))
    return TokenStore(folder, src, tgt, np.fromfile(folder / "pairs.hash", dtype=np.uint64), manifest), ""


# -------- writing -------------------------------------------------------------------------------------------

_sides = None  # (source tokenizer, target tokenizer) of this process: the same SentencePiece model, or
#                 a released Marian model's source and target sides
_threads = -1  # SentencePiece's own threads per batch: all cores in this process, one in a pool worker


def _start_worker(tokenizer_bytes: bytes, threads: int = 1) -> None:
    global _sides, _threads
    tokenizer = tokenizer_from_bytes(tokenizer_bytes)
    _sides, _threads = (tokenizer, target_tokenizer(tokenizer)), threads


def pair_hash(src: str, tgt: str) -> int:
    """A 64-bit hash of a pair (lines hold no newline, so joining them with one is unambiguous)."""
    return int.from_bytes(hashlib.blake2b(f"{src}\n{tgt}".encode(), digest_size=8).digest(), "little")


def _encode_chunk(chunk: tuple[list[str], list[str]]) -> tuple[np.ndarray, ...]:
    """(source lines, target lines) -> flat source ids, source lengths, flat target ids, lengths, hashes."""
    src_lines, tgt_lines = chunk
    arrays = []
    for side, lines in zip(_sides, (src_lines, tgt_lines)):
        ids = side.encode_batch(lines, threads=_threads)
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32)
        arrays += [flat, np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))]
    hashes = np.fromiter((pair_hash(s, t) for s, t in zip(src_lines, tgt_lines)), np.uint64, len(src_lines))
    return (*arrays, hashes)


def _encoded(chunks: Iterable, tokenizer_bytes: bytes, workers: int) -> Iterator[tuple[np.ndarray, ...]]:
    """The chunks encoded in order, by ``workers`` processes (0: in this one)."""
    if workers <= 0:
        _start_worker(tokenizer_bytes, threads=-1)
        yield from map(_encode_chunk, chunks)
        return
    # fork where there is one: a spawned worker would import the training script again (torch and all); the
    # workers run SentencePiece only, never torch, so no thread of the parent is needed in them
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(workers, initializer=_start_worker, initargs=(tokenizer_bytes,)) as pool:
        yield from pool.imap(_encode_chunk, chunks)


def _open_lock(path: Path):
    return open(path, "a")


@contextlib.contextmanager
def cache_lock(folder: Path) -> Iterator[bool]:
    """Hold ``<folder>.lock`` while checking and building ``folder``: a second process that wants the same
    entry waits for the first one's, then opens it (no lock where the platform has no ``fcntl``). Yields
    whether this process may build the entry: False in a cache it cannot write (another user's, or on a
    read-only disk), where a complete entry is still read, without the lock (a published entry never
    changes)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = _open_lock(folder.parent / f".{folder.name}.lock")
    except OSError:
        yield False
        return
    with lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)


PARTIAL = re.compile(r"\.((?:store|tokenizer)-[0-9a-f]+)-")  # .<entry>-<random>: an entry being built


def remove_stale_partials(cache: Path, building_entry: str) -> None:
    """Delete the partial folders of builds that were killed: those of ``building_entry`` (whose lock the
    caller holds, so nobody else builds it) and those of any entry whose lock no live process holds."""
    for partial in cache.glob(".*-*"):
        match = PARTIAL.match(partial.name)
        if not partial.is_dir() or match is None:
            continue
        entry = match.group(1)
        if entry != building_entry and not _unheld(cache / f".{entry}.lock"):
            continue  # another process is building that entry now
        shutil.rmtree(partial, ignore_errors=True)


def _unheld(lock_path: Path) -> bool:
    """Whether no process holds this entry's lock (taken and given back at once to find out)."""
    if fcntl is None:
        return False
    try:
        with _open_lock(lock_path) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
            return True
    except OSError:
        return False


def publish(building: Path, folder: Path) -> None:
    """Move a finished folder into place (the caller holds ``cache_lock``); a damaged one in the way is moved
    aside and deleted first. Readable by everyone the umask allows, not only by its owner."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(building, 0o777 & ~umask)
    if folder.exists():
        stale = folder.with_name(f".{folder.name}-stale-{os.getpid()}")
        os.rename(folder, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(building, folder)


def build_store(
    folder: Path, chunks: Iterable[tuple[list[str], list[str]]], tokenizer_bytes: bytes, vocab_size: int,
    workers: int, description: str = "tokenizing",
) -> TokenStore:  # fmt: skip
    """Tokenize every pair of ``chunks`` into a store at ``folder`` (built aside, then renamed into place;
    the caller holds ``cache_lock(folder)``)."""
    dtype = np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_partials(folder.parent, folder.name)
    building = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        files = {name: open(building / name, "wb") for name in FILES}
        counts = {"src": 0, "tgt": 0, "pairs": 0}
        with tqdm(desc=description, unit=" pairs", unit_scale=True, mininterval=2.0) as bar:
            for src, src_len, tgt, tgt_len, hashes in _encoded(chunks, tokenizer_bytes, workers):
                for name, array in zip(
                    FILES, (src.astype(dtype), tgt.astype(dtype), src_len, tgt_len, hashes)
                ):
                    files[name].write(array.tobytes())
                counts["src"] += len(src)
                counts["tgt"] += len(tgt)
                counts["pairs"] += len(hashes)
                bar.update(len(hashes))
        for f in files.values():
            f.close()
        manifest = {"format": FORMAT, "dtype": dtype.name, "pairs": counts["pairs"], "vocab_size": vocab_size,
                    "tokens": {"src": counts["src"], "tgt": counts["tgt"]},
                    "sha256": {name: file_digest(building / name) for name in FILES}}  # fmt: skip
        (building / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        publish(building, folder)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    store, why = open_store(folder)
    if store is None:
        raise RuntimeError(f"the store just built in {folder} cannot be read: {why}")
    return store
