"""The corpus train.py loads: local text files and hub datasets (the hub faked here: no network)."""

import gzip
import json
from pathlib import Path

import datasets
import pytest
from helpers import CONFIGS, ROOT

from transformer.commands import train
from transformer.runtime.configs import DataConfig, load_config
from transformer.runtime.lines import DataError
from transformer.training.corpus import load_hub_dataset, load_parallel_text, read_lines, read_parallel
from transformer.training.datasets import load_corpus, load_test_sets
from transformer.training.tokenizer_job import train_tokenizer

PAIRS = [
    ("Ein Hund läuft.", "A dog runs."),
    ("Zwei Kinder spielen im Park.", "Two children play in the park."),
    ("Eine Frau liest ein Buch.", "A woman reads a book."),
    ("Der Mann trägt einen roten Hut.", "The man wears a red hat."),
]


def write_text_corpus(prefix, n_train=60):
    for stem, n in (("train", n_train), ("valid", 6), ("test", 5)):
        rows = [PAIRS[i % len(PAIRS)] for i in range(n)]
        for lang, side in (("de", 0), ("en", 1)):
            (prefix.parent / f"{prefix.name}.{stem}.{lang}").write_text(
                "".join(row[side] + "\n" for row in rows), encoding="utf-8"
            )


def test_text_corpus_loads_every_split(tmp_path):
    write_text_corpus(tmp_path / "toy")
    corpus = load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "toy")))
    assert {k: len(v) for k, v in corpus.items()} == {"train": 60, "validation": 6, "test": 5}
    assert (corpus["validation"].src[1], corpus["validation"].tgt[1]) == PAIRS[1]


def test_text_corpus_errors_name_the_file_or_key(tmp_path):
    with pytest.raises(DataError, match="needs data.text_prefix"):
        load_corpus(DataConfig(dataset="text"))
    write_text_corpus(tmp_path / "toy")
    (tmp_path / "toy.test.en").write_text("only one line\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"toy.test.de has 5 lines, .*toy.test.en has 1"):
        load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "toy")))


def test_hub_corpus_needs_every_split(monkeypatch):
    with pytest.raises(DataError, match="needs data.hub_name"):
        load_corpus(DataConfig(dataset="hub"))
    rows = {"translation": [{"de": de, "en": en} for de, en in PAIRS]}
    fake = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "validation": datasets.Dataset.from_dict(rows)}
    )
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, **kw: fake)
    with pytest.raises(DataError, match=r"no test split \(it has: train, validation\)"):
        load_corpus(DataConfig(dataset="hub", hub_name="fake", hub_config="de-en"))


def test_train_py_runs_on_local_text_files(tmp_path):
    write_text_corpus(tmp_path / "toy", n_train=200)
    args = ["--config", str(ROOT / "transformer/configs/tiny.yaml"), "--run-dir", str(tmp_path / "run")]
    for override in ("data.dataset=text", f"data.text_prefix={tmp_path / 'toy'}", "data.vocab_size=60",
                     "train.max_steps=4", "eval.every_steps=0"):  # fmt: skip
        args += ["--set", override]
    assert train.main(args) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["steps"] == 4
    assert len((tmp_path / "run" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()) == 5


def test_the_wmt14_config_loads_through_a_local_file_in_the_hubs_format(tmp_path, monkeypatch):
    """wmt14_en_de_base.yaml: hub wmt14 de-en read as en -> de; the hub stands in for a local JSON
    file of `translation` rows, as the hub's wmt14 builder returns them."""
    config = load_config(CONFIGS / "wmt14_en_de_base.yaml")
    assert (config.data.hub_name, config.data.hub_config, config.data.src_lang) == ("wmt14", "de-en", "en")
    assert config.data.max_tokens * config.train.accum_steps == 50_000  # ~25k source + ~25k target tokens
    assert config.model.d_model == 512 and config.eval.average_last == 5 and config.data.vocab_size == 37000
    for split in ("train", "validation", "test"):
        rows = [{"translation": {"de": de, "en": en}} for de, en in PAIRS]
        lines = "".join(json.dumps(row) + "\n" for row in rows)
        (tmp_path / f"{split}.jsonl").write_text(lines, encoding="utf-8")
    asked = []

    def local_wmt14(name, config_name, **kwargs):
        asked.append((name, config_name, kwargs.get("split")))
        files = {split: str(tmp_path / f"{split}.jsonl") for split in ("train", "validation", "test")}
        return real_load_dataset("json", data_files=files, **kwargs)

    real_load_dataset = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", local_wmt14)
    corpus = load_corpus(config.data)
    assert asked == [("wmt14", "de-en", None)]
    assert corpus["test"].src == [en for _, en in PAIRS] and corpus["test"].tgt == [de for de, _ in PAIRS]
    with pytest.raises(DataError, match=r"news=hub:wmt14:de-en:dev2: no split 'dev2': .*train"):
        load_test_sets({"news": "hub:wmt14:de-en:dev2"}, config.data)
    with pytest.raises(DataError, match=r"news=hub:wmt14: expected hub:NAME\[:CONFIG\]:SPLIT"):
        load_test_sets({"news": "hub:wmt14"}, config.data)
    asked.clear()
    extra = load_test_sets({"newstest2013": "hub:wmt14:de-en:validation"}, config.data)  # eval.test_sets
    # the test set's split alone is prepared, not the whole dataset (a hub test set of WMT14: 3,000 lines)
    assert asked == [("wmt14", "de-en", "validation")]
    assert extra["test/newstest2013"].src == [en for _, en in PAIRS]


def test_a_byte_order_mark_is_not_part_of_line_1(tmp_path, monkeypatch):
    """Editors on Windows start UTF-8 files with a BOM: every reader drops it there, and only there."""
    import gzip
    import io

    from transformer.inference.text_lines import read_text, stream_lines
    from transformer.runtime.lines import BOM, split_lines
    from transformer.runtime.metrics import bleu_chrf
    from transformer.training.corpus import read_lines

    lines = ["Ein Hund läuft.", "\ufeffZwei Männer."]  # a U+FEFF inside the file is text: kept
    data = BOM + "".join(line + "\n" for line in lines).encode("utf-8")
    (tmp_path / "bom.de").write_bytes(data)
    (tmp_path / "bom.de.gz").write_bytes(gzip.compress(data))
    for name in ("bom.de", "bom.de.gz"):
        path = tmp_path / name
        assert read_lines(path) == lines and read_text(str(path), "--reference")[0] == lines
    assert round(bleu_chrf(lines, read_text(str(tmp_path / "bom.de"), "--reference")[0])["bleu"], 6) == 100
    assert split_lines(BOM + b"x\n", "<stdin>", starts_file=False) == ["\ufeffx"]  # a later stdin line
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))  # translate.py --stream's reader
    assert [text for _, text in stream_lines()] == lines


# -------- text files and hub tables, line by line ------------------------------------------------


def write_gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


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
