"""The corpus train.py loads: local text files and hub datasets (the hub faked here: no network)."""

import json

import datasets
import pytest
from conftest import ROOT

import train
from transformer.runtime.configs import DataConfig, load_config
from transformer.runtime.lines import DataError
from transformer.training.datasets import load_corpus, load_test_sets

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
    args = ["--config", str(ROOT / "configs/tiny.yaml"), "--run-dir", str(tmp_path / "run")]
    for override in ("data.dataset=text", f"data.text_prefix={tmp_path / 'toy'}", "data.vocab_size=60",
                     "train.max_steps=4", "eval.every_steps=0"):  # fmt: skip
        args += ["--set", override]
    assert train.main(args) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["steps"] == 4
    assert len((tmp_path / "run" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()) == 5


def test_the_wmt14_config_loads_through_a_local_file_in_the_hubs_format(tmp_path, monkeypatch):
    """configs/wmt14_en_de_base.yaml: hub wmt14 de-en read as en -> de; the hub stands in for a local JSON
    file of `translation` rows, as the hub's wmt14 builder returns them."""
    config = load_config(ROOT / "configs" / "wmt14_en_de_base.yaml")
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


def test_a_byte_order_mark_is_not_part_of_line_1(tmp_path):
    """Editors on Windows start UTF-8 files with a BOM: every reader drops it there, and only there."""
    import gzip

    from transformer.inference.text_lines import read_text
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
