"""The token store (transformer/training/token_store.py), the cache of tokenizers and stores
(data_cache.py), streamed
training files (corpus.ParallelFiles) and the cleaning rules (data.clean_pairs)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import DATA_DIR, ROOT, needs_data

import transformer.training.cache as data_cache
from transformer.core.tokenizer import Tokenizer
from transformer.runtime.configs import DataConfig, load_config
from transformer.runtime.corpora import Part
from transformer.runtime.lines import DataError
from transformer.training import token_store
from transformer.training.corpus import ParallelFiles, ParallelText
from transformer.training.datasets import Loaded
from transformer.training.multi30k import load_multi30k
from transformer.training.ranks import Runtime
from transformer.training.splits import clean_pairs, encode_corpus, encode_split
from transformer.training.token_store import build_store, open_store, pair_hash
from transformer.training.tokenizer_job import train_tokenizer

SRC = ["Ein Hund läuft.", "Zwei Katzen schlafen im Haus.", "", "Ein Mann fährt Rad.", "Ein Hund läuft."] * 7
TGT = ["A dog runs.", "Two cats sleep in the house.", "Nothing.", "A man rides a bike.", "A dog runs."] * 7


def learn(train, fingerprint: str, data: DataConfig) -> Path:
    """The tokenizer a run on this one training split learns (``cache.cached_tokenizer``)."""
    part = Part(f"{data.src_lang}-{data.tgt_lang}", data)
    return data_cache.cached_tokenizer([Loaded(part, {"train": train}, fingerprint)], [], data)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Tokenizer:
    return train_tokenizer(SRC + TGT, tmp_path_factory.mktemp("sp") / "sp", 60)


def model(tokenizer: Tokenizer) -> tuple[bytes, int]:
    return tokenizer.to_bytes(), tokenizer.vocab_size


def write_pair(folder, src, tgt, name="train"):
    (folder / f"{name}.de").write_text("".join(line + "\n" for line in src), encoding="utf-8")
    (folder / f"{name}.en").write_text("".join(line + "\n" for line in tgt), encoding="utf-8")
    return ParallelFiles(folder / f"{name}.de", folder / f"{name}.en")


# ---------------------------------------------------------------- the store


@pytest.mark.parametrize("workers", [0, 2])
def test_a_store_holds_every_pairs_ids_and_reads_them_back(tmp_path, tokenizer, workers):
    files = write_pair(tmp_path, SRC, TGT)
    store = build_store(
        tmp_path / "store", files.chunks(4), tokenizer.to_bytes(), tokenizer.vocab_size, workers
    )
    assert len(store) == len(SRC) and store.src.tokens.dtype == np.uint16
    for i in range(len(SRC)):
        assert store.src[i] == tokenizer.encode(SRC[i]) and store.tgt[i] == tokenizer.encode(TGT[i])
    assert store.hashes[0] == pair_hash(SRC[0], TGT[0]) == store.hashes[4] != store.hashes[1]
    reopened, why = open_store(tmp_path / "store")
    assert why == "" and reopened.src[1] == store.src[1]


def test_workers_write_the_same_bytes(tmp_path, tokenizer):
    files = write_pair(tmp_path, SRC, TGT)
    for workers in (0, 2):
        build_store(
            tmp_path / f"w{workers}", files.chunks(3), tokenizer.to_bytes(), tokenizer.vocab_size, workers
        )
    for name in ("src.bin", "tgt.bin", "src.len", "tgt.len", "pairs.hash"):
        assert (tmp_path / "w0" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()


def test_a_damaged_store_is_refused_with_its_reason(tmp_path, tokenizer):
    files = write_pair(tmp_path, SRC, TGT)
    folder = tmp_path / "store"
    build_store(folder, files.chunks(8), *model(tokenizer), 0)
    data = bytearray((folder / "src.bin").read_bytes())
    data[3] ^= 0xFF
    (folder / "src.bin").write_bytes(bytes(data))
    assert open_store(folder) == (None, "src.bin does not match its SHA-256 (a corrupted store)")
    build_store(folder, files.chunks(8), *model(tokenizer), 0)  # a damaged store in the way is replaced
    assert open_store(folder)[1] == ""
    (folder / "tgt.len").write_bytes((folder / "tgt.len").read_bytes()[:-4])
    assert open_store(folder)[1] == "tgt.len is missing or has the wrong size (a partial or damaged store)"
    (folder / "manifest.json").unlink()
    assert open_store(folder) == (None, "no manifest (a partial store)")
    assert open_store(tmp_path / "nothing") == (None, "no store yet")


def test_the_cache_rebuilds_a_damaged_store_and_keys_on_content(tmp_path, tokenizer):
    data = DataConfig(cache_dir=str(tmp_path / "cache"))
    files = write_pair(tmp_path, SRC, TGT)
    runtime = Runtime(torch.device("cpu"), None)
    first = data_cache.train_store(files, files.fingerprint(), tokenizer, data, runtime)
    (first.folder / "pairs.hash").write_bytes(b"\0" * (first.folder / "pairs.hash").stat().st_size)
    said = []
    again = data_cache.train_store(files, files.fingerprint(), tokenizer, data, runtime, log=said.append)
    assert again.folder == first.folder and "does not match its SHA-256" in said[0]
    assert open_store(first.folder)[1] == ""
    (tmp_path / "other").mkdir()
    changed = write_pair(tmp_path / "other", SRC[:-1] + ["Ein anderer Satz."], TGT)  # other content
    assert changed.fingerprint() != files.fingerprint()
    assert (
        data_cache.train_store(changed, changed.fingerprint(), tokenizer, data, runtime).folder
        != first.folder
    )


# ---------------------------------------------------------------- streamed files


def test_streamed_files_name_their_problems(tmp_path):
    uneven = write_pair(tmp_path, SRC, TGT[:-2])
    with pytest.raises(DataError, match=r"train.en ends after line 33, .*train.de goes on"):
        list(uneven.chunks(10))
    (tmp_path / "bad.de").write_bytes(b"gut\n\xff kaputt\n")
    (tmp_path / "bad.en").write_bytes(b"good\nbroken\n")
    with pytest.raises(DataError, match=r"bad.de: line 2 is not valid UTF-8"):
        list(ParallelFiles(tmp_path / "bad.de", tmp_path / "bad.en").chunks(10))
    (tmp_path / "empty.de").write_bytes(b"")
    with pytest.raises(DataError, match="file is empty"):
        list(ParallelFiles(tmp_path / "empty.de", tmp_path / "bad.en").chunks(10))
    files = write_pair(tmp_path, SRC, TGT)
    assert list(files.sentences()) == SRC + TGT  # what the tokenizer learns from, in the old order
    assert [pair for chunk in files.chunks(6) for pair in zip(*chunk)] == list(zip(SRC, TGT))


# ---------------------------------------------------------------- the tokenizer cache


def test_a_cached_tokenizer_is_trained_once_per_files_and_settings(tmp_path, monkeypatch):
    files = write_pair(tmp_path, SRC, TGT)
    data = DataConfig(cache_dir=str(tmp_path / "cache"), vocab_size=40)
    first = learn(files, files.fingerprint(), data)

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(data_cache, "train_elsewhere", no_training)
    assert learn(files, files.fingerprint(), data) == first
    with pytest.raises(AssertionError, match="trained again"):
        learn(files, files.fingerprint(), DataConfig(cache_dir=data.cache_dir, vocab_size=61))


def test_the_tokenizer_learns_in_its_own_process_and_its_errors_come_back_by_name(tmp_path):
    files = write_pair(tmp_path, SRC, TGT)
    data = DataConfig(cache_dir=str(tmp_path / "cache"), vocab_size=40)
    model = learn(files, files.fingerprint(), data)
    in_process = train_tokenizer(SRC + TGT, tmp_path / "here", 40)  # the same sentences, in the same order
    learnt, everything = Tokenizer(model), range(in_process.vocab_size)
    assert learnt.id_to_piece(list(everything)) == in_process.id_to_piece(list(everything))
    assert learnt.encode_batch(SRC + TGT) == in_process.encode_batch(SRC + TGT)
    too_big = DataConfig(cache_dir=str(tmp_path / "cache"), vocab_size=5000)
    with pytest.raises(DataError, match=r"vocab_size=5000.*Vocabulary size too high"):
        learn(files, files.fingerprint(), too_big)
    (tmp_path / "bad").mkdir()
    bad = write_pair(tmp_path / "bad", SRC, TGT)
    bad.src_path.write_bytes(bad.src_path.read_bytes().replace("läuft".encode(), b"l\xe4uft", 1))
    with pytest.raises(DataError, match=r"train.de: line 1 is not valid UTF-8"):
        learn(bad, bad.fingerprint(), data)


def test_a_given_tokenizer_is_used_or_refused_by_name(tmp_path, tokenizer):
    import sentencepiece as spm

    files = write_pair(tmp_path, SRC, TGT)
    ours = tmp_path / "ours.model"
    ours.write_bytes(tokenizer.to_bytes())
    data = DataConfig(cache_dir=str(tmp_path / "cache"), tokenizer=str(ours))
    assert learn(files, files.fingerprint(), data) == ours
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SRC + TGT), model_prefix=str(tmp_path / "plain"), vocab_size=40, minloglevel=2
    )  # fmt: skip  (default ids: unk 0, bos 1, eos 2)
    for path, says in (
        (tmp_path / "plain.model", "special ids"),
        (tmp_path / "none.model", "file not found"),
    ):
        with pytest.raises(DataError, match=f"data.tokenizer={path}: .*{says}"):
            learn(files, files.fingerprint(), DataConfig(tokenizer=str(path)))


# ---------------------------------------------------------------- cleaning


def test_cleaning_rules_count_what_each_drops():
    src = [3, 0, 200, 2, 20, 3, 3]
    tgt = [4, 5, 3, 40, 19, 4, 4]
    hashes = np.array([7, 1, 2, 3, 4, 7, 8], dtype=np.uint64)  # pair 5 repeats pair 0
    kept, counts = clean_pairs(src, tgt, hashes, DataConfig(max_len=100, max_ratio=3.0, dedup=True))
    assert kept.tolist() == [0, 4, 6]
    assert counts == {"pairs": 7, "empty": 1, "too_long": 1, "ratio": 1, "duplicate": 1, "kept": 3}
    kept, counts = clean_pairs(src, tgt, hashes, DataConfig(max_len=100))
    assert kept.tolist() == [0, 3, 4, 5, 6] and counts["ratio"] == counts["duplicate"] == 0


# ---------------------------------------------------------------- the main job's data, unchanged


@needs_data
def test_the_store_gives_the_ids_and_pairs_the_old_in_memory_path_gave(tmp_path):
    config = load_config(
        "transformer/configs/multi30k_de_en.yaml", [f"data.cache_dir={tmp_path}", "data.train_limit=4000"]
    )
    corpus = load_multi30k("de", "en", DATA_DIR)
    assert isinstance(corpus["train"], ParallelFiles)
    in_memory = ParallelText(corpus["train"].src, corpus["train"].tgt)
    tokenizer = train_tokenizer(in_memory.src + in_memory.tgt, tmp_path / "sp", 8000)
    runtime = Runtime(torch.device("cpu"), None)
    store = data_cache.train_store(
        corpus["train"], corpus["train"].fingerprint(), tokenizer, config.data, runtime
    )
    part = Part("de-en", config.data)
    splits = encode_corpus(
        [Loaded(part, corpus, corpus["train"].fingerprint())], [store], [[]], tokenizer, config
    )
    src, tgt = encode_split(in_memory.head(4000), tokenizer)
    old_keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if len(s) + 1 <= 128 and len(t) + 1 <= 128]
    assert splits.train_indices.tolist() == old_keep
    assert all(splits.train[0][i] == src[i] and splits.train[1][i] == tgt[i] for i in range(0, 4000, 7))
    assert splits.cleaning["pairs"] == 4000 and splits.cleaning["kept"] == len(old_keep)


def test_results_json_reports_the_cleaning(tiny_checkpoint):
    results = json.loads((tiny_checkpoint.parent / "results.json").read_text())
    counts = results["data_cleaning"]
    assert counts["pairs"] == 3000 and counts["kept"] == 3000 - counts["too_long"] - counts["empty"]


def _build_in_another_process(args) -> str:
    folder, src, tgt, model_proto = args
    from pathlib import Path

    tokenizer = Tokenizer.from_bytes(model_proto)
    files = ParallelFiles(Path(folder) / "train.de", Path(folder) / "train.en")
    data = DataConfig(cache_dir=str(Path(folder) / "cache"))
    store = data_cache.train_store(
        files, files.fingerprint(), tokenizer, data, Runtime(torch.device("cpu"), None)
    )
    return str(store.folder) if store.src[1] == tokenizer.encode(SRC[1]) else "wrong ids"


def test_processes_building_the_same_entry_wait_for_each_other(tmp_path, tokenizer):
    import multiprocessing

    write_pair(tmp_path, SRC * 50, TGT * 50)
    jobs = [(str(tmp_path), None, None, tokenizer.to_bytes())] * 4
    with multiprocessing.get_context("fork").Pool(4) as pool:
        folders = pool.map(_build_in_another_process, jobs)
    assert len(set(folders)) == 1 and "wrong ids" not in folders
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == [
        Path(folders[0]).name
    ]


def test_bad_training_files_stop_the_run_before_its_folder_exists(tmp_path, capsys):
    from transformer.commands import train

    for split, n in (("train", 30), ("valid", 5), ("test", 5)):
        write_pair(tmp_path, SRC[:n], TGT[:n], name=f"c.{split}")
    (tmp_path / "c.train.en").write_text("".join(t + "\n" for t in TGT[:29]), encoding="utf-8")
    argv = ["--config", str(ROOT / "transformer/configs/tiny.yaml"), "--run-dir", str(tmp_path / "run"),
            "--set", "data.dataset=text", "--set", f"data.text_prefix={tmp_path / 'c'}",
            "--set", f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    assert train.main(argv) == 1
    assert "parallel files differ in length" in capsys.readouterr().err and not (tmp_path / "run").exists()
    (tmp_path / "c.train.en").write_bytes(b"")
    assert train.main(argv) == 1
    assert "c.train.en: file is empty" in capsys.readouterr().err and not (tmp_path / "run").exists()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_marian_tokenizer_stores_each_side_with_its_own_model(tmp_path, workers):
    """A released model's tokenizer (two SentencePiece models, ids from vocab.json) in the store: sources by
    source.spm, targets by target.spm, the same in worker processes; its bytes rebuild it exactly."""
    transformers = pytest.importorskip("transformers")
    from transformer.interop.marian_text import MarianText

    source = train_tokenizer(SRC, tmp_path / "src", 40)
    target = train_tokenizer(TGT, tmp_path / "tgt", 40)
    pieces = dict.fromkeys(source.id_to_piece(list(range(4, 40))) + target.id_to_piece(list(range(4, 40))))
    vocab = {"</s>": 0, "<unk>": 1} | {piece: 2 + i for i, piece in enumerate(pieces)}
    vocab["<pad>"] = len(vocab)
    folder = tmp_path / "marian"
    folder.mkdir()
    (folder / "source.spm").write_bytes(source.to_bytes())
    (folder / "target.spm").write_bytes(target.to_bytes())
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en"}))
    marian = MarianText(transformers.MarianTokenizer.from_pretrained(folder), vocab["<pad>"])
    data = marian.to_bytes()
    rebuilt = MarianText.from_bytes(data)
    special = (rebuilt.pad_id, rebuilt.bos_id, rebuilt.eos_id)
    assert rebuilt.to_bytes() == data and special == (marian.pad_id, marian.bos_id, marian.eos_id)
    assert special == (len(vocab) - 1,) * 2 + (0,)
    store = build_store(
        tmp_path / "store", write_pair(tmp_path, SRC, TGT).chunks(4), data, len(vocab), workers
    )
    for i in range(len(SRC)):
        assert store.src[i] == marian.hf(text=SRC[i], add_special_tokens=False).input_ids
        assert store.tgt[i] == marian.hf(text_target=TGT[i], add_special_tokens=False).input_ids
    assert store.tgt[1] != marian.encode(TGT[1])  # the source side would encode that target otherwise


# ---------------------------------------------------------------- a shared or read-only cache, killed builds


def test_a_cache_that_cannot_be_written_is_read_and_refuses_a_build_in_one_line(
    tmp_path, tokenizer, monkeypatch
):
    """Another user's cache, or one on a read-only disk: its entries' locks cannot be opened for writing."""
    data, runtime = (
        DataConfig(cache_dir=str(tmp_path / "cache"), vocab_size=40),
        Runtime(torch.device("cpu"), None),
    )
    files = write_pair(tmp_path, SRC, TGT)
    model = learn(files, files.fingerprint(), data)
    store = data_cache.train_store(files, files.fingerprint(), tokenizer, data, runtime)

    def refused(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(token_store, "_open_lock", refused)
    assert learn(files, files.fingerprint(), data) == model  # complete entries: read
    assert data_cache.train_store(files, files.fingerprint(), tokenizer, data, runtime).folder == store.folder
    other = DataConfig(cache_dir=data.cache_dir, vocab_size=41)  # an entry that is not there
    with pytest.raises(
        DataError, match=rf"the cache {tmp_path / 'cache'} cannot be written, and its entry tokenizer-"
    ):
        learn(files, files.fingerprint(), other)
    (tmp_path / "more").mkdir()
    more = write_pair(tmp_path / "more", SRC[:-1], TGT[:-1])
    with pytest.raises(
        DataError, match=r"cannot be written, and its entry store-\w+ cannot be used \(no store yet\)"
    ):
        data_cache.train_store(more, more.fingerprint(), tokenizer, data, runtime)


def test_the_tokenizer_entry_keeps_only_the_model_not_the_training_text(tmp_path):
    in_memory = ParallelText(
        SRC, TGT
    )  # a hub or in-memory corpus: its sentences are written out to learn from
    data = DataConfig(cache_dir=str(tmp_path / "cache"), vocab_size=40)
    model = learn(in_memory, "in-memory", data)
    assert [p.name for p in model.parent.iterdir()] == ["tokenizer.model"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        f".{model.parent.name}.lock",
        model.parent.name,
    ]


def test_a_killed_build_leaves_nothing_once_the_next_build_runs(tmp_path, tokenizer):
    import fcntl

    data, runtime = DataConfig(cache_dir=str(tmp_path / "cache")), Runtime(torch.device("cpu"), None)
    cache = tmp_path / "cache"
    cache.mkdir()
    killed = cache / ".store-0123abcd-x1y2z3"  # a build of another entry, killed: nobody holds its lock
    building = cache / ".store-4567ef89-a1b2c3"  # a build going on in another process: it holds its lock
    for partial in (killed, building):
        partial.mkdir()
        (partial / "src.bin").write_bytes(b"\0" * 1000)
    lock = open(cache / ".store-4567ef89.lock", "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    files = write_pair(tmp_path, SRC, TGT)
    store = data_cache.train_store(files, files.fingerprint(), tokenizer, data, runtime)
    assert not killed.exists() and building.exists()
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    own = (
        cache / f".{store.folder.name}-k9k9k9"
    )  # this entry's own killed build: its lock is ours when building
    own.mkdir()
    shutil.rmtree(store.folder)
    data_cache.train_store(files, files.fingerprint(), tokenizer, data, runtime)
    assert not own.exists() and not building.exists()


def test_data_workers_minus_one_is_one_process_per_core_at_most_8_for_a_big_corpus(monkeypatch):
    split, auto = ParallelText(["ein Satz"] * 4, ["a sentence"] * 4), DataConfig()
    monkeypatch.setattr(data_cache, "AUTO_WORKERS_BYTES", 0)  # this corpus counts as big
    monkeypatch.setattr(data_cache.os, "cpu_count", lambda: 64)
    assert (
        data_cache.workers_for(split, auto) == 8
        and data_cache.workers_for(split, DataConfig(workers=12)) == 12
    )
    monkeypatch.setattr(data_cache.os, "cpu_count", lambda: 3)
    assert data_cache.workers_for(split, auto) == 3
    monkeypatch.setattr(data_cache, "AUTO_WORKERS_BYTES", 1 << 30)  # a small corpus: the training process
    assert data_cache.workers_for(split, auto) == 0
