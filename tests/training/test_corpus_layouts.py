"""The corpus layouts people bring: gzip text files, a dev / val split, one prefix per split, and corpora
with a training split alone, whose validation and test sets are carved off it (the hub faked: no network)."""

import gzip
import json

import datasets
import pytest
from helpers import ROOT

from transformer.commands import train
from transformer.runtime.configs import DataConfig
from transformer.runtime.lines import DataError
from transformer.training.carving import Carved
from transformer.training.datasets import load_corpus

LANGS = ("de", "en")


def pairs(n: int, tag: str = "") -> list[tuple[str, str]]:
    """n distinct pairs, so that a carved-off pair can be told from the others."""
    return [(f"Satz {tag}{i} ist hier.", f"Sentence {tag}{i} is here.") for i in range(n)]


def write_split(stem, rows, gz=False) -> None:
    """<stem>.de and <stem>.en (each + .gz with gz)."""
    for lang, side in zip(LANGS, (0, 1)):
        text = "".join(row[side] + "\n" for row in rows).encode()
        path = stem.parent / f"{stem.name}.{lang}{'.gz' if gz else ''}"
        path.write_bytes(gzip.compress(text) if gz else text)


def tiny_run(tmp_path, *overrides: str) -> dict:
    """train.py's main on the tiny config with these overrides, 4 steps; its results.json."""
    args = ["--config", str(ROOT / "transformer/configs/tiny.yaml"), "--run-dir", str(tmp_path / "run")]
    for override in ("data.vocab_size=60", "train.max_steps=4", "eval.every_steps=0", *overrides):
        args += ["--set", override]
    assert train.main(args) == 0
    return json.loads((tmp_path / "run" / "results.json").read_text())


def test_a_gzip_corpus_named_train_dev_test_trains(tmp_path):
    for name, n in (("train", 200), ("dev", 6), ("test", 5)):
        write_split(tmp_path / f"corpus.{name}", pairs(n, name), gz=True)
    corpus = load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "corpus")))
    assert {split: len(part) for split, part in corpus.items()} == {"train": 200, "validation": 6, "test": 5}
    assert corpus["validation"].tgt[2] == "Sentence dev2 is here."  # decompressed, dev read as validation
    tiny_run(tmp_path, "data.dataset=text", f"data.text_prefix={tmp_path / 'corpus'}")
    hypotheses = (tmp_path / "run" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 5


@pytest.mark.parametrize("name", ["valid", "dev", "val", "validation"])
def test_every_name_of_the_validation_split_is_found(tmp_path, name):
    write_split(tmp_path / "c.train", pairs(8))
    write_split(tmp_path / f"c.{name}", pairs(3, "v"))
    write_split(tmp_path / "c.test", pairs(2, "t"))
    corpus = load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "c")))
    assert corpus["validation"].src == [de for de, _ in pairs(3, "v")]


def test_ambiguous_or_half_missing_files_are_errors_naming_them(tmp_path):
    write_split(tmp_path / "c.train", pairs(8))
    write_split(tmp_path / "c.dev", pairs(3))
    write_split(tmp_path / "c.valid", pairs(3))
    with pytest.raises(DataError, match=r"valid and dev each name a validation split.*data.valid_prefix"):
        load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "c")))
    (tmp_path / "c.valid.de").unlink()
    with pytest.raises(DataError, match=r"no file .*c\.valid\.de\[\.gz\]"):
        load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "c")))
    write_split(tmp_path / "c.test", pairs(2))
    write_split(tmp_path / "c.test", pairs(2), gz=True)
    with pytest.raises(DataError, match=r"both .*c\.test\.de and .*c\.test\.de\.gz exist"):
        load_corpus(
            DataConfig(
                dataset="text",
                train_prefix=str(tmp_path / "c.train"),
                valid_prefix=str(tmp_path / "c.dev"),
                test_prefix=str(tmp_path / "c.test"),
            )
        )


def test_each_split_can_have_its_own_prefix(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_split(tmp_path / "a" / "europarl", pairs(10, "tr"), gz=True)
    write_split(tmp_path / "b" / "newstest2013", pairs(4, "va"))
    write_split(tmp_path / "b" / "newstest2014", pairs(3, "te"))
    data = DataConfig(
        dataset="text",
        train_prefix=str(tmp_path / "a" / "europarl"),
        valid_prefix=str(tmp_path / "b" / "newstest2013"),
        test_prefix=str(tmp_path / "b" / "newstest2014"),
    )
    corpus = load_corpus(data)
    firsts = [corpus[split].src[0] for split in ("train", "validation", "test")]
    assert firsts == ["Satz tr0 ist hier.", "Satz va0 ist hier.", "Satz te0 ist hier."]
    write_split(tmp_path / "c.train", pairs(8, "c"))
    write_split(tmp_path / "c.valid", pairs(3, "c"))
    write_split(tmp_path / "c.test", pairs(2, "c"))  # text_prefix for two splits, test_prefix wins for test
    mixed = load_corpus(
        DataConfig(
            dataset="text", text_prefix=str(tmp_path / "c"), test_prefix=str(tmp_path / "b" / "newstest2014")
        )
    )
    assert len(mixed["validation"]) == 3 and mixed["test"].src[0] == "Satz te0 ist hier."
    with pytest.raises(DataError, match=r"data.test_prefix: no file .*nowhere\.de\[\.gz\] or .*nowhere\.en"):
        nowhere = str(tmp_path / "nowhere")
        load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "c"), test_prefix=nowhere))


def carve(tmp_path, n=100, **sizes) -> dict:
    write_split(tmp_path / "one.train", pairs(n))
    return load_corpus(DataConfig(dataset="text", text_prefix=str(tmp_path / "one"), **sizes))


def test_a_training_split_alone_gets_its_sets_carved_off_seeded_and_disjoint(tmp_path):
    corpus = carve(tmp_path, valid_size=10, test_size=5)
    train_split, valid, test = corpus["train"], corpus["validation"], corpus["test"]
    assert isinstance(train_split, Carved)
    assert (len(train_split), len(valid), len(test)) == (85, 10, 5)
    kept = [pair for src, tgt in train_split.chunks(7) for pair in zip(src, tgt)]  # streamed without them
    carved = list(zip(valid.src, valid.tgt)) + list(zip(test.src, test.tgt))
    assert len(kept) == 85 and not set(kept) & set(carved) and set(kept) | set(carved) == set(pairs(100))
    assert kept == [pair for pair in pairs(100) if pair in set(kept)]  # corpus order kept
    assert list(train_split.sentences()) == [de for de, _ in kept] + [en for _, en in kept]
    assert valid.src == sorted(valid.src, key=lambda s: int(s.split()[1]))  # carved sets in corpus order too
    again = carve(tmp_path, valid_size=10, test_size=5)
    assert again["validation"].src == valid.src and again["train"].fingerprint() == train_split.fingerprint()
    other = carve(tmp_path, valid_size=10, test_size=5, split_seed=2)
    assert other["validation"].src != valid.src and other["train"].fingerprint() != train_split.fingerprint()
    assert train_split.fingerprint() != train_split.source.fingerprint()  # another token store


def test_carved_sets_are_disjoint_from_training_by_content_in_a_corpus_that_repeats_pairs(tmp_path, capsys):
    write_split(tmp_path / "rep.train", pairs(50) * 20)  # 1,000 lines of 50 distinct pairs
    corpus = load_corpus(
        DataConfig(dataset="text", text_prefix=str(tmp_path / "rep"), valid_size=20, test_size=20)
    )
    valid, test = (set(zip(corpus[s].src, corpus[s].tgt)) for s in ("validation", "test"))
    kept = [pair for src, tgt in corpus["train"].chunks(64) for pair in zip(src, tgt)]
    assert not (valid | test) & set(kept) and not valid & test  # no copy of a carved pair anywhere else
    assert len(valid) == len(corpus["validation"]) and len(test) == len(corpus["test"])  # each pair once
    assert set(kept) | valid | test == set(pairs(50)) and len(corpus["train"]) == len(kept)
    assert len(kept) == 20 * (50 - len(valid) - len(test))  # every copy of the others still trains
    assert "repeat pairs drawn before them" in capsys.readouterr().out


def test_a_run_on_a_corpus_that_repeats_pairs_says_how_many_copies_carving_left_out(tmp_path, capsys):
    write_split(tmp_path / "rep.train", pairs(50) * 20)  # 1,000 lines of 50 distinct pairs
    carving = (f"data.text_prefix={tmp_path / 'rep'}", "data.valid_size=5", "data.test_size=5")
    results = tiny_run(tmp_path, "data.dataset=text", "data.train_limit=0", *carving)
    data = DataConfig(dataset="text", text_prefix=str(tmp_path / "rep"), valid_size=5, test_size=5)
    corpus = load_corpus(data)
    distinct = len(corpus["validation"]) + len(corpus["test"])
    copies = 20 * distinct - 10  # every line of a carved pair, less the 10 drawn
    assert results["data_cleaning"]["carved_copies"] == copies
    assert results["data_cleaning"]["pairs"] == 1000 - 10 - copies == 20 * (50 - distinct)
    assert f"(and {copies} copies of carved validation / test pairs left out)" in capsys.readouterr().out


def test_carving_is_refused_where_it_cannot_apply(tmp_path):
    with pytest.raises(DataError, match=r"no validation or test .*set data.valid_size and data.test_size"):
        carve(tmp_path)
    with pytest.raises(DataError, match=r"valid_size \+ data.test_size = 100 leave none of the 100"):
        carve(tmp_path, valid_size=60, test_size=40)
    write_split(tmp_path / "one.valid", pairs(3))
    with pytest.raises(DataError, match=r"data.valid_size=10, but the corpus has its own validation split"):
        carve(tmp_path, valid_size=10, test_size=5)


def test_a_hub_dataset_with_a_training_split_alone_trains_with_carved_off_sets(tmp_path, monkeypatch):
    rows = {"translation": [{"de": de, "en": en} for de, en in pairs(200)]}
    only_train = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)})
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, **kw: only_train)
    data = DataConfig(dataset="hub", hub_name="fake", valid_size=6, test_size=5)
    corpus = load_corpus(data)
    assert (len(corpus["train"]), len(corpus["validation"]), len(corpus["test"])) == (189, 6, 5)
    assert not set(corpus["test"].src) & {src for src, _ in corpus["train"].chunks(50) for src in src}
    tiny_run(tmp_path, "data.dataset=hub", "data.hub_name=fake", "data.valid_size=6", "data.test_size=5")
    hypotheses = (tmp_path / "run" / "test_hypotheses.txt").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 5
