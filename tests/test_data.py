"""Data pipeline: loaders and their errors, checksums, the invariants of token-bucket batches."""

import gzip
import json
import shutil
from functools import partial
from itertools import accumulate
from pathlib import Path

import numpy as np
import pytest
import torch

from transformer.core.batches import Batch, collate, iter_batches, make_batches, restore_order
from transformer.core.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.runtime.configs import DataConfig
from transformer.training.corpus import (
    Corpus,
    DataError,
    load_hub_dataset,
    load_parallel_text,
    read_lines,
    read_parallel,
)
from transformer.training.multi30k import load_multi30k
from transformer.training.ranks import shard
from transformer.training.splits import clean_pairs, encode_split
from transformer.training.tokenizer_job import train_tokenizer

# -------- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def de_en(multi30k_dir) -> Corpus:
    return load_multi30k("de", "en", data_dir=multi30k_dir)


@pytest.fixture(scope="session")
def tokenizer(de_en, tmp_path_factory):
    train = de_en["train"].head(3000)
    sentences = [sentence for pair in zip(train.src, train.tgt) for sentence in pair]
    return train_tokenizer(sentences, tmp_path_factory.mktemp("spm") / "de_en", vocab_size=1000)


@pytest.fixture(scope="session")
def lengths() -> tuple[list[int], list[int]]:
    """3000 synthetic (source, target) lengths in tokens, plus two pairs too long for any budget."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(1, 60, (3000,), generator=generator)
    tgt = (src + torch.randint(-5, 6, (3000,), generator=generator)).clamp(min=1)
    return src.tolist() + [500, 3], tgt.tolist() + [4, 700]


def padding_fraction(batches, src_lengths, tgt_lengths) -> float:
    """PAD tokens / all tokens of the batches as ``collate`` builds them (EOS on the source, BOS / EOS on the
    target: one more token a side)."""
    real = sum(src_lengths[i] + tgt_lengths[i] + 2 for batch in batches for i in batch)
    padded = sum(
        len(batch) * (max(src_lengths[i] for i in batch) + max(tgt_lengths[i] for i in batch) + 2)
        for batch in batches
    )
    return 1 - real / padded


def fake_ids(src_lengths, tgt_lengths):
    """Token ids with the right lengths, none of them special: sentence i is all (i % 50) + 4."""
    src = [[i % 50 + 4] * n for i, n in enumerate(src_lengths)]
    tgt = [[i % 50 + 4] * n for i, n in enumerate(tgt_lengths)]
    return src, tgt


def write_gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


# -------- Multi30k -------------------------------------------------------------------------------


def test_multi30k_de_en(de_en, multi30k_dir):
    assert {split: len(ds) for split, ds in de_en.items()} == {
        "train": 29000,
        "validation": 1014,
        "test": 1000,
    }
    train = de_en["train"]
    assert (train.src[0], train.tgt[0]) == (
        read_lines(multi30k_dir / "train.de.gz")[0],
        read_lines(multi30k_dir / "train.en.gz")[0],
    )
    assert train.src[0].startswith("Zwei junge weiße Männer")


def test_multi30k_other_direction_from_env(multi30k_dir, monkeypatch):
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    fr_cs = load_multi30k("fr", "cs")
    assert [len(ds) for ds in fr_cs.values()] == [29000, 1014, 1000]
    assert fr_cs["test"].src[5] == read_lines(multi30k_dir / "test_2016_flickr.fr.gz")[5]
    assert fr_cs["test"].tgt[5] == read_lines(multi30k_dir / "test_2016_flickr.cs.gz")[5]


@pytest.mark.parametrize(
    ("src_lang", "tgt_lang", "message"),
    [("es", "en", "'es' not available; valid: en, de, fr, cs"), ("de", "de", "both 'de'")],
)
def test_multi30k_bad_language(multi30k_dir, src_lang, tgt_lang, message):
    with pytest.raises(DataError, match=message):
        load_multi30k(src_lang, tgt_lang, data_dir=multi30k_dir)


def copy_mirror(source: Path, target: Path, langs=("de", "en")) -> Path:
    target.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        for lang in langs:
            shutil.copy(source / f"{stem}.{lang}.gz", target / f"{stem}.{lang}.gz")
    return target


def test_multi30k_checksum_mismatch(multi30k_dir, tmp_path):
    mirror = copy_mirror(multi30k_dir, tmp_path / "mirror")
    (mirror / "val.en.gz").chmod(0o644)
    with open(mirror / "val.en.gz", "ab") as f:
        f.write(b"\0")
    message = r"val\.en\.gz: SHA-256 mismatch, expected 14f7d2\w+, got \w+"
    with pytest.raises(DataError, match=message):
        load_multi30k("de", "en", data_dir=mirror)


def test_multi30k_missing_file(multi30k_dir, tmp_path):
    mirror = copy_mirror(multi30k_dir, tmp_path / "mirror")
    (mirror / "test_2016_flickr.de.gz").unlink()
    with pytest.raises(DataError, match=r"test_2016_flickr\.de\.gz: file not found"):
        load_multi30k("de", "en", data_dir=mirror)


# -------- read_lines -----------------------------------------------------------------------------


def test_read_lines_keeps_all_but_the_line_ending(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(" leading\r\ntrailing  \n\nin\u2028line\x0bbreaks\nno final newline".encode())
    assert read_lines(path) == [
        " leading",
        "trailing  ",
        "",
        "in\u2028line\x0bbreaks",
        "no final newline",
    ]
    assert read_lines(write_gz(tmp_path / "a.txt.gz", path.read_text())) == read_lines(path)


def test_read_lines_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.de: file not found"):
        read_lines(tmp_path / "nope.de")


def test_read_lines_empty_file(tmp_path):
    (tmp_path / "empty.en").touch()
    with pytest.raises(DataError, match=r"empty\.en: file is empty"):
        read_lines(tmp_path / "empty.en")
    with pytest.raises(DataError, match=r"empty\.en\.gz: file is empty"):
        read_lines(write_gz(tmp_path / "empty.en.gz", ""))


def test_read_lines_not_utf8(tmp_path):
    text = "Ein Mädchen.\nZwei Männer.\n".encode() + "Drei Größen.\n".encode("latin-1")
    (tmp_path / "latin1.de").write_bytes(text)
    with pytest.raises(DataError, match=r"latin1\.de: line 3 is not valid UTF-8"):
        read_lines(tmp_path / "latin1.de")


def test_read_lines_corrupted_gzip(tmp_path):
    compressed = gzip.compress(("Ein Hund rennt.\n" * 1000).encode())
    (tmp_path / "truncated.gz").write_bytes(compressed[: len(compressed) // 2])
    (tmp_path / "not_gzip.gz").write_bytes(b"plain text, wrong name\n")
    for name in ("truncated.gz", "not_gzip.gz"):
        with pytest.raises(DataError, match=rf"{name}: corrupted gzip file"):
            read_lines(tmp_path / name)


def test_read_parallel_different_line_counts(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    with pytest.raises(DataError, match=r"a\.de has 3 lines, .*a\.en has 2"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")


# -------- other loaders --------------------------------------------------------------------------


def test_load_parallel_text(tmp_path):
    (tmp_path / "train.de").write_text("Ein Hund.\nZwei Katzen.\n")
    write_gz(tmp_path / "train.en.gz", "A dog.\nTwo cats.\n")
    (tmp_path / "dev.de").write_text("Ein Mädchen läuft über die Straße.\n")
    (tmp_path / "dev.en").write_text("A girl runs across the street.\n")
    loaded = load_parallel_text(
        {
            "train": (tmp_path / "train.de", tmp_path / "train.en.gz"),
            "dev": (str(tmp_path / "dev.de"), str(tmp_path / "dev.en")),
        }
    )
    assert list(loaded) == ["train", "validation"]
    assert (loaded["train"].src[1], loaded["train"].tgt[1]) == ("Zwei Katzen.", "Two cats.")
    assert loaded["validation"].src[0] == "Ein Mädchen läuft über die Straße."


def write_json_splits(folder, sizes=(("train", 5), ("valid", 2), ("test", 3))) -> dict[str, str]:
    """JSON-lines files of translation pairs, one per split, with an extra column to be dropped."""
    files = {}
    for split, n in sizes:
        rows = [{"id": str(i), "translation": {"de": f"Satz {i}.", "en": f"Sentence {i}."}} for i in range(n)]
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        files[split] = str(path)
    return files


def test_load_hub_dataset_through_datasets(tmp_path):
    """The real `datasets.load_dataset` on local JSON files (the same code path as a hub name)."""
    files = write_json_splits(tmp_path)
    loaded = load_hub_dataset("json", None, "en", "de", data_files=files, cache_dir=str(tmp_path / "cache"))
    assert {split: len(pairs) for split, pairs in loaded.items()} == {"train": 5, "validation": 2, "test": 3}
    assert (loaded["test"].src[2], loaded["test"].tgt[2]) == ("Sentence 2.", "Satz 2.")  # en -> de


def test_a_hub_split_is_read_from_its_arrow_table_a_slice_at_a_time(tmp_path, monkeypatch):
    """A hub split stays in its memory-mapped Arrow table: its chunks, sentences and head are the pairs in
    order, slice by slice; its fingerprint is that of the Arrow files (the same on a second load, another
    for other text), and a training store built from it holds the ids of the same pairs held as text."""
    from transformer.training.corpus import ParallelArrow, ParallelText
    from transformer.training.token_store import build_store
    from transformer.training.tokenizer_job import train_tokenizer

    files = write_json_splits(tmp_path, sizes=(("train", 23), ("valid", 2), ("test", 3)))
    load = lambda: load_hub_dataset("json", None, "de", "en", data_files=files, cache_dir=str(tmp_path / "c"))
    train = load()["train"]
    assert isinstance(train, ParallelArrow) and len(train) == 23
    text = ParallelText([f"Satz {i}." for i in range(23)], [f"Sentence {i}." for i in range(23)])
    chunks = list(train.chunks(5))
    assert [len(src) for src, _ in chunks] == [5, 5, 5, 5, 3] and chunks == list(text.chunks(5))
    assert list(train.sentences()) == list(text.sentences())
    assert train.head(4) == text.head(4) and (train.src, train.tgt) == (text.src, text.tgt)
    assert train.fingerprint() == load()["train"].fingerprint() != load()["test"].fingerprint()
    read = []
    monkeypatch.setattr(ParallelArrow, "whole", property(lambda self: read.append(1)))  # never read whole
    tokenizer = train_tokenizer(text.sentences(), tmp_path / "sp", 40)
    stores = [build_store(tmp_path / name, split.chunks(4), tokenizer.to_bytes(), tokenizer.vocab_size, 0)
              for name, split in (("arrow", train), ("text", text))]  # fmt: skip
    assert not read and [stores[0].src[i] for i in range(23)] == [stores[1].src[i] for i in range(23)]


def test_load_hub_dataset_missing_language_or_column(tmp_path):
    files = write_json_splits(tmp_path)
    with pytest.raises(DataError, match="'fr' not available; valid: de, en"):
        load_hub_dataset("json", None, "de", "fr", data_files=files, cache_dir=str(tmp_path / "cache"))
    (tmp_path / "plain.jsonl").write_text('{"de": "Satz.", "en": "Sentence."}\n', encoding="utf-8")
    with pytest.raises(
        DataError, match=r"json/None split 'train' has no 'translation' column; columns: de, en"
    ):
        load_hub_dataset("json", None, "de", "en", data_files=str(tmp_path / "plain.jsonl"))
    with pytest.raises(DataError, match=r"hub dataset json \(no config\) cannot be loaded: "):
        load_hub_dataset("json", None, "de", "en", data_files=str(tmp_path / "missing.jsonl"))


# -------- ids ------------------------------------------------------------------------------------


def test_encode_split_matches_encode(de_en, tokenizer):
    split = de_en["validation"]
    src_ids, tgt_ids = encode_split(split, tokenizer)
    assert len(src_ids) == len(tgt_ids) == 1014
    for i in (7, 3, 1000):
        assert src_ids[i] == tokenizer.encode(split.src[i])
        assert tgt_ids[i] == tokenizer.encode(split.tgt[i])


def test_clean_pairs_max_len():
    # rows are length + 1 (EOS / BOS): with max_len 5, lengths up to 4 fit; an empty side is dropped first
    kept, counts = clean_pairs([4, 5, 1, 4], [4, 1, 5, 0], None, DataConfig(max_len=5))
    assert kept.tolist() == [0]
    assert counts == {"pairs": 4, "empty": 1, "too_long": 2, "ratio": 0, "duplicate": 0, "kept": 1}


# -------- collate --------------------------------------------------------------------------------


def test_collate_shift_and_padding():
    batch = collate([([5, 6, 7], [8, 9]), ([10], [11, 12, 13, 14])], [4, 0], PAD_ID, BOS_ID, EOS_ID)
    assert batch.src.tolist() == [[5, 6, 7, EOS_ID], [10, EOS_ID, PAD_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, 9, PAD_ID, PAD_ID], [BOS_ID, 11, 12, 13, 14]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS_ID, PAD_ID, PAD_ID], [11, 12, 13, 14, EOS_ID]]
    assert batch.indices.tolist() == [4, 0]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (6, 8)
    assert batch.src.dtype == batch.tgt_in.dtype == batch.indices.dtype == torch.long
    assert isinstance(batch.to("cpu"), Batch)


def check_batch(batch: Batch) -> None:
    """The invariants every Batch must satisfy."""
    for tensor in (batch.src, batch.tgt_in, batch.tgt_out):
        real = tensor != PAD_ID  # (B, L) bool
        assert torch.equal(real, real.cummin(dim=1).values), "padding only at the end of a row"
    real_tgt = batch.tgt_out != PAD_ID  # (B, T)
    assert torch.equal(real_tgt, batch.tgt_in != PAD_ID)  # same lengths, in and out
    assert (batch.tgt_in[:, 0] == BOS_ID).all()
    shifted = real_tgt[:, 1:]
    assert torch.equal(batch.tgt_in[:, 1:][shifted], batch.tgt_out[:, :-1][shifted])
    rows = torch.arange(len(batch.tgt_out))
    assert (batch.tgt_out[rows, real_tgt.sum(1) - 1] == EOS_ID).all()  # EOS ends each real row
    assert (batch.src[rows, (batch.src != PAD_ID).sum(1) - 1] == EOS_ID).all()
    assert batch.n_tgt_tokens == int(real_tgt.sum())
    assert batch.n_src_tokens == int((batch.src != PAD_ID).sum())


# -------- batches --------------------------------------------------------------------------------


def as_lists(batches):
    """make_batches' int64 arrays as lists of ints, to compare whole epochs."""
    assert all(batch.dtype == np.int64 for batch in batches)
    return [batch.tolist() for batch in batches]


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_cover_each_sentence_once_within_budget(lengths, shuffle):
    src_lengths, tgt_lengths = lengths
    batches = make_batches(src_lengths, tgt_lengths, max_tokens=1000, shuffle=shuffle, seed=3)
    assert sorted(i for batch in batches for i in batch) == list(range(len(src_lengths)))
    src_ids, tgt_ids = fake_ids(src_lengths, tgt_lengths)
    collated = iter_batches(src_ids, tgt_ids, batches, PAD_ID, BOS_ID, EOS_ID)
    for indices, batch in zip(batches, collated, strict=True):
        check_batch(batch)
        assert batch.indices.tolist() == indices.tolist()
        cost = batch.src.numel() + batch.tgt_in.numel()  # B * (S + T), padding included
        assert cost <= 1000 or len(indices) == 1  # a pair over budget comes alone
    alone = [batch.tolist() for batch in batches if len(batch) == 1]
    assert [3000] in alone and [3001] in alone


def test_batches_are_sorted_by_length(lengths):
    """Bucketing works: sorted batching wastes far less on padding than random batches."""
    src_lengths, tgt_lengths = lengths
    padding = partial(padding_fraction, src_lengths=src_lengths, tgt_lengths=tgt_lengths)

    bucketed = make_batches(src_lengths, tgt_lengths, max_tokens=2000, shuffle=True)
    sizes = [len(batch) for batch in bucketed]
    order = torch.randperm(len(src_lengths)).tolist()  # the same batch sizes, random members
    starts = list(accumulate([0] + sizes[:-1]))
    random = [order[start : start + size] for start, size in zip(starts, sizes, strict=True)]
    assert padding(bucketed) < 0.5 * padding(random)


def test_training_batches_pad_as_little_as_sorting_the_whole_epoch():
    """A Multi30k-sized epoch (29000 pairs, 4000-token batches) is sorted as one chunk: its shuffled
    training batches carry no more padding than the evaluation order's batches (all pairs sorted)."""
    generator = torch.Generator().manual_seed(0)
    src = torch.randint(5, 40, (29000,), generator=generator)
    tgt = (src + torch.randint(-6, 7, (29000,), generator=generator)).clamp(min=1)
    src_lengths, tgt_lengths = src.tolist(), tgt.tolist()
    padding = partial(padding_fraction, src_lengths=src_lengths, tgt_lengths=tgt_lengths)

    training = make_batches(src_lengths, tgt_lengths, max_tokens=4000, shuffle=True, seed=1)
    evaluation = make_batches(src_lengths, tgt_lengths, max_tokens=4000, shuffle=False)
    assert padding(training) <= 1.05 * padding(evaluation) < 0.04  # chunks of 100 batches: 0.077


def test_training_batches_deterministic_per_epoch(lengths):
    def epoch_batches(seed, epoch):
        return as_lists(make_batches(*lengths, max_tokens=1000, shuffle=True, seed=seed, epoch=epoch))

    assert epoch_batches(seed=1, epoch=0) == epoch_batches(seed=1, epoch=0)
    assert epoch_batches(seed=1, epoch=0) != epoch_batches(seed=1, epoch=1)
    assert epoch_batches(seed=1, epoch=0) != epoch_batches(seed=2, epoch=0)


def test_batches_respect_indices(lengths):
    kept, _ = clean_pairs(*lengths, None, DataConfig(max_len=40))
    batches = make_batches(*lengths, max_tokens=1000, shuffle=True, indices=kept)
    assert sorted(i for batch in batches for i in batch) == kept.tolist()


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_disjoint_and_covering(lengths, world_size, shuffle):
    batches = make_batches(*lengths, max_tokens=1000, shuffle=shuffle, seed=5, epoch=2)
    whole = as_lists(batches)
    shards = [as_lists(shard(batches, rank, world_size)) for rank in range(world_size)]
    assert len({len(shard) for shard in shards}) == 1  # every rank takes the same number of steps
    n_extra = len(shards[0]) * world_size - len(whole)
    assert 0 <= n_extra < world_size
    taken = [batch for shard in shards for batch in shard]
    assert sorted(taken) == sorted(whole + whole[:n_extra])  # padded by repeating from the start
    with pytest.raises(ValueError, match="rank"):
        shard(batches, world_size, world_size)


def test_eval_batches_keep_everything_and_restore_order(lengths):
    src_lengths, tgt_lengths = lengths
    n = len(src_lengths)
    for world_size in (1, 3):
        batches = make_batches(*lengths, max_tokens=500, shuffle=False)
        rank_batches = [shard(batches, rank, world_size) for rank in range(world_size)]
        indices = [i for batches in rank_batches for batch in batches for i in batch]
        results = [f"result for {i}" for i in indices]  # what a translation loop would produce
        assert restore_order(results, indices, size=n) == [f"result for {i}" for i in range(n)]
    with pytest.raises(ValueError, match="no result for 1 of 4 sentences"):
        restore_order(["a", "b", "c"], [0, 2, 3], size=4)


def test_real_validation_batches(de_en, tokenizer):
    """End to end on Multi30k validation: every row of tgt_out decodes back to its sentence."""
    split = de_en["validation"]
    src_ids, tgt_ids = encode_split(split, tokenizer)
    src_lengths, tgt_lengths = [len(s) for s in src_ids], [len(t) for t in tgt_ids]
    batches = make_batches(src_lengths, tgt_lengths, max_tokens=2000, shuffle=False)
    decoded, indices = [], []
    for batch in iter_batches(src_ids, tgt_ids, batches, PAD_ID, BOS_ID, EOS_ID):
        check_batch(batch)
        decoded += tokenizer.decode_batch(batch.tgt_out.tolist())
        indices += batch.indices.tolist()
    assert restore_order(decoded, indices, len(split)) == tokenizer.decode_batch(tgt_ids)


# -------- prefetch ---------------------------------------------------------------------------------


def test_prefetch_yields_the_same_batches_in_order_and_passes_errors_on(lengths):
    from transformer.training.prefetch import prefetch

    src, tgt = fake_ids(*lengths)
    batches = make_batches(*lengths, max_tokens=800, shuffle=True, seed=1)[:40]
    expected = list(iter_batches(src, tgt, batches, PAD_ID, BOS_ID, EOS_ID))
    got = list(prefetch(iter_batches(src, tgt, batches, PAD_ID, BOS_ID, EOS_ID), torch.device("cpu")))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert (
            torch.equal(a.src, b.src)
            and torch.equal(a.tgt_in, b.tgt_in)
            and torch.equal(a.indices, b.indices)
        )

    def broken():
        yield expected[0]
        raise DataError("line 7 of something is broken")

    stream = prefetch(broken(), torch.device("cpu"))
    assert torch.equal(next(stream).src, expected[0].src)
    with pytest.raises(DataError, match="line 7"):
        next(stream)


def reference_batches(src_lengths, tgt_lengths, max_tokens, shuffle, seed, epoch, indices, chunk_batches):
    """make_batches as first written, in plain Python (one process): what the NumPy version must equal."""
    order = list(range(len(src_lengths))) if indices is None else list(indices)
    length = lambda i: (src_lengths[i], tgt_lengths[i])  # noqa: E731

    def cut(pairs):
        batches, batch, S, T = [], [], 0, 0
        for i in pairs:
            s, t = src_lengths[i] + 1, tgt_lengths[i] + 1
            if batch and (len(batch) + 1) * (max(S, s) + max(T, t)) > max_tokens:
                batches.append(batch)
                batch, S, T = [], 0, 0
            batch.append(i)
            S, T = max(S, s), max(T, t)
        return batches + [batch] if batch else batches

    if not shuffle:
        return cut(sorted(order, key=length))
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = [order[j] for j in torch.randperm(len(order), generator=generator).tolist()]
    batches, chunk, tokens = [], [], 0
    for i in order:
        chunk.append(i)
        tokens += src_lengths[i] + tgt_lengths[i] + 2
        if tokens >= chunk_batches * max_tokens:
            batches += cut(sorted(chunk, key=length))
            chunk, tokens = [], 0
    batches += cut(sorted(chunk, key=length)) if chunk else []
    return [batches[j] for j in torch.randperm(len(batches), generator=generator).tolist()]


@pytest.mark.parametrize("case", range(12))
def test_make_batches_equals_the_plain_python_reference(case):
    g = torch.Generator().manual_seed(case)
    n = [0, 1, 7, 300, 5000, 29000][case % 6]
    src, tgt = (
        torch.randint(0, 60, (n,), generator=g).tolist(),
        torch.randint(0, 60, (n,), generator=g).tolist(),
    )
    indices = None if case % 2 else sorted(torch.randperm(n, generator=g)[: n // 2].tolist())
    args = dict(max_tokens=[200, 4000][case % 2], shuffle=case % 3 != 0, seed=case, epoch=case % 4,
                indices=indices, chunk_batches=[1, 100][case // 6])  # fmt: skip
    assert as_lists(make_batches(src, tgt, **args)) == reference_batches(src, tgt, **args)
