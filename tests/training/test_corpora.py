"""Several corpora in one run (``data.corpora``): the config's rules, the weighted epoch, the tokens in front
of the sources, and whole tiny runs: two tagged corpora into one language, a model of two directions, the
target language on the command line."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import CONFIGS, NO_HEATMAPS, run_command

from transformer.commands import train as train_command
from transformer.commands import translate as translate_command
from transformer.core.config import ConfigError
from transformer.runtime.configs import load_config
from transformer.runtime.corpora import parts_of, prefix_pieces, user_symbols
from transformer.runtime.lines import DataError
from transformer.training.datasets import load_parts
from transformer.training.mixing import epoch_counts, epoch_indices


def text_corpus(folder: Path, src: str, tgt: str, **keys) -> dict:
    """A corpus entry reading <folder>/{train,valid,test}.<lang>."""
    return {"dataset": "text", "train_prefix": f"{folder}/train", "valid_prefix": f"{folder}/valid",
            "test_prefix": f"{folder}/test", "src_lang": src, "tgt_lang": tgt, **keys}  # fmt: skip


@pytest.fixture(scope="module")
def three_languages(tmp_path_factory, multi30k_dir) -> Path:
    """The first 3,000 training pairs and 40 validation / test pairs of Multi30k in de, en and fr."""
    import gzip

    folder = tmp_path_factory.mktemp("three")
    for split, stem, n in (("train", "train", 3000), ("valid", "val", 40), ("test", "test_2016_flickr", 40)):
        for lang in ("de", "en", "fr"):
            with gzip.open(multi30k_dir / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def config_with(corpora: list[dict], *overrides: str):
    return load_config(CONFIGS / "tiny.yaml", [f"data.corpora={json.dumps(corpora)}", *overrides])


def train(tmp_path: Path, name: str, corpora: list[dict], *overrides: str) -> subprocess.CompletedProcess:
    sets = [
        x
        for override in (f"data.corpora={json.dumps(corpora)}", NO_HEATMAPS, *overrides)
        for x in ("--set", override)
    ]
    return run_command(train_command.main, ["--config", "tiny", "--run-dir", str(tmp_path / name), *sets])


def translate(checkpoint: Path, *args: str) -> subprocess.CompletedProcess:
    return run_command(translate_command.main, ["--checkpoint", str(checkpoint), *args])


# -------- the config's rules -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "corpora, message",
    [
        ([{"src_lang": "de", "tgt_lang": "en", "weight": 0}], r"data.corpora\[0\].weight=0.0 must be > 0"),
        ([{"src_lang": "de", "tgt_lang": "en", "weight": -1}], r"data.corpora\[0\].weight=-1.0 must be > 0"),
        (
            [{"src_lang": "de", "tgt_lang": "en", "weight": "inf"}],
            r"data.corpora\[0\].weight=inf must be > 0",
        ),
        (
            [{"src_lang": "de", "tgt_lang": "en"}, {"src_lang": "de", "tgt_lang": "en", "tag": "bt"}],
            r"data.corpora\[1\].name='de-en' is also data.corpora\[0\]'s",
        ),
        (
            [
                {"src_lang": "de", "tgt_lang": "en", "tag": "bt"},
                {"src_lang": "de", "tgt_lang": "en", "tag": "bt", "name": "two"},
            ],
            r"data.corpora\[1\].tag='bt' is also data.corpora\[0\]'s",
        ),
        ([{"src_lang": "de", "tgt_lang": "en", "tag": "unk"}], r"data.corpora\[0\].tag='unk'"),
        ([{"src_lang": "de", "tgt_lang": "en", "tag": "2en"}], r"data.corpora\[0\].tag='2en'"),
        ([{"src_lang": "de", "tgt_lang": "en", "wieght": 2}], r"unknown key data.corpora\[0\].wieght"),
        ([{"src_lang": "de"}], r"data.corpora\[0\]: no tgt_lang"),
        ([{"src_lang": "de", "tgt_lang": "en", "dataset": "wmt"}], r"data.corpora\[0\].dataset='wmt'"),
        ([{"src_lang": "de", "tgt_lang": "en", "name": "a b"}], r"data.corpora\[0\].name='a b'"),
    ],  # fmt: skip
)
def test_a_bad_corpus_is_an_error_naming_its_key(corpora, message):
    with pytest.raises(ConfigError, match=message):
        parts_of(config_with(corpora).data)


def test_a_corpus_key_left_at_the_top_is_an_error(tmp_path):
    config = config_with([{"src_lang": "de", "tgt_lang": "en"}], f"data.text_prefix={tmp_path}/x")
    with pytest.raises(ConfigError, match="data.text_prefix=.* with data.corpora: give it in its corpus"):
        parts_of(config.data)


def test_a_language_multi30k_lacks_names_the_corpus(multi30k_dir):
    config = config_with([{"src_lang": "de", "tgt_lang": "en"}, {"src_lang": "de", "tgt_lang": "xx"}])
    with pytest.raises(DataError, match=r"data.corpora\[1\] \(de-xx\): language 'xx' not available"):
        load_parts(parts_of(config.data), config.eval)


def test_a_refused_config_writes_nothing(tmp_path, three_languages):
    done = train(tmp_path, "run", [text_corpus(three_languages, "de", "en", weight=0)])
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["error: data.corpora[0].weight=0.0 must be > 0 and finite "
                                                "(leave a corpus out to drop it)"]  # fmt: skip
    assert not (tmp_path / "run").exists()


def test_the_one_corpus_of_a_run_without_corpora_is_its_data_section():
    config = load_config(CONFIGS / "tiny.yaml")
    (part,) = parts_of(config.data)
    assert (part.name, part.data, part.weight, part.tag) == ("de-en", config.data, 1.0, None)
    assert prefix_pieces(part, [part]) == [] and user_symbols([part]) == []


def test_the_tokens_in_front_of_each_source():
    corpora = [{"src_lang": "de", "tgt_lang": "en"}, {"src_lang": "en", "tgt_lang": "de"},
               {"src_lang": "fr", "tgt_lang": "en", "tag": "bt"}]  # fmt: skip
    parts = parts_of(config_with(corpora).data)
    # the token of the TARGET language, then the tag
    assert [prefix_pieces(part, parts) for part in parts] == [["<2en>"], ["<2de>"], ["<2en>", "<bt>"]]
    assert user_symbols(parts) == ["<2de>", "<2en>", "<bt>"]
    one_target = parts_of(config_with([corpora[0], corpora[2]]).data)  # one target language: no <2xx>
    assert [prefix_pieces(part, one_target) for part in one_target] == [[], ["<bt>"]]


# -------- the weighted epoch -----------------------------------------------------------------------------


def test_an_epoch_holds_weight_times_size_of_each_corpus():
    assert epoch_counts([1000, 100], [1.0, 1.0], 1.0) == [1000, 100]
    assert epoch_counts([1000, 100], [0.5, 2.5], 1.0) == [500, 250]
    # a higher temperature moves the shares towards equal ones; the epoch keeps its size
    hot = epoch_counts([1000, 100], [1.0, 1.0], 100.0)
    assert sum(hot) == 1100 and 540 < hot[1] < 560
    assert epoch_counts([900, 100], [1.0, 1.0], 2.0) == [750, 250]  # ∝ √900 : √100 = 3 : 1
    assert epoch_counts([900, 100, 0], [1.0, 1.0, 1.0], 0.001) == [1000, 0, 0]  # no overflow, no NaN


def test_upsampled_pairs_come_whole_and_downsampled_ones_change_every_epoch():
    general, in_domain = np.arange(0, 1000), np.arange(1000, 1100)
    counts = epoch_counts([1000, 100], [0.5, 2.5], 1.0)
    first, second = (epoch_indices([general, in_domain], counts, seed=1, epoch=e) for e in (0, 1))
    for epoch in (first, second):
        small = epoch[epoch >= 1000]
        assert len(small) == 250 and np.bincount(small - 1000).min() >= 2  # 2 copies + a random half
        big = epoch[epoch < 1000]
        assert len(big) == 500 and len(set(big.tolist())) == 500  # half, without repeats
    assert set(first[first < 1000].tolist()) != set(second[second < 1000].tolist())
    again = epoch_indices([general, in_domain], counts, seed=1, epoch=0)
    assert np.array_equal(first, again)  # the same seed and epoch, the same pairs (--resume)


# -------- whole runs --------------------------------------------------------------------------------------


def test_two_corpora_into_one_language_tagged_and_weighted(tmp_path, three_languages):
    corpora = [text_corpus(three_languages, "de", "en"),
               text_corpus(three_languages, "fr", "en", tag="fr", weight=0.5)]  # fmt: skip
    done = train(tmp_path, "run", corpora, "data.train_limit=600", "train.max_steps=20")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data: an epoch holds 900 pairs: de-en 600 × 1 -> 600, fr-en 600 × 0.5 -> 300" in done.stdout
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results["test_corpora"]) == {"de-en", "fr-en"}
    for scores in results["test_corpora"].values():
        assert scores["sentences"] == 24 and 0 <= scores["bleu"] <= 100
    mean = sum(s["bleu"] for s in results["test_corpora"].values()) / 2
    assert results["test_bleu"] == pytest.approx(mean)
    assert set(results["validation"][-1]["val_corpora"]) == {"de-en", "fr-en"}
    for name in ("de-en", "fr-en"):
        assert len((tmp_path / "run" / f"test_hypotheses.{name}.txt").read_text().splitlines()) == 24
    checkpoint = tmp_path / "run" / "best.pt"
    ok = translate(checkpoint, "--target-lang", "en", "Ein Hund läuft.")
    assert ok.returncode == 0 and ok.stdout.strip(), ok.stderr
    wrong = translate(checkpoint, "--target-lang", "de", "Ein Hund läuft.")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        "error: --target-lang: target language 'de': this model translates into en only (see translate.py "
        "--help)"
    ]


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory, three_languages) -> Path:
    """A tiny model of de→en and en→de (one target-language token each)."""
    folder = tmp_path_factory.mktemp("both_ways")
    corpora = [text_corpus(three_languages, "de", "en"), text_corpus(three_languages, "en", "de")]
    done = train(folder, "run", corpora, "data.train_limit=3000", "train.max_steps=300", "eval.every_steps=0")
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "run" / "best.pt"


def test_a_model_of_two_directions_translates_both_ways(both_ways):
    english = translate(both_ways, "--target-lang", "en", "Ein Mann steht auf der Straße.")
    german = translate(both_ways, "--target-lang", "de", "A man is standing on the street.")
    assert english.returncode == 0 and german.returncode == 0, english.stderr + german.stderr
    assert english.stdout.split()[0] in ("A", "Two", "The"), english.stdout
    assert german.stdout.split()[0] in ("Ein", "Eine", "Zwei", "Der", "Die"), german.stdout


def test_a_multilingual_model_needs_a_target_language(both_ways):
    for args, said in (
        ((), "this model translates into de, en: choose a target language"),
        (("--target-lang", "fr"), "target language 'fr': this model translates into de, en"),
    ):
        done = translate(both_ways, *args, "Ein Mann.")
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.strip().splitlines() == [f"error: --target-lang: {said} (see translate.py --help)"]


def test_the_translator_puts_the_target_language_first(both_ways):
    from transformer import Translator

    translator = Translator.from_checkpoint(both_ways)
    assert sorted(translator.languages) == ["de", "en"]
    ids = {lang: translator.encode(["Ein Mann."], target_lang=lang)[0] for lang in ("de", "en")}
    assert ids["de"][1:] == ids["en"][1:] == translator.tokenizer.encode("Ein Mann.")
    assert translator.tokenizer.id_to_piece([ids["de"][0], ids["en"][0]]) == ["<2de>", "<2en>"]
    with pytest.raises(ValueError, match="choose a target language"):
        translator.translate(["Ein Mann."])
    # word alignments count the source's words, not its language token
    assert {i for i, _ in translator.alignments("Ein Mann.", "A man.", target_lang="en")} <= {0, 1}


def test_tagged_back_translation_end_to_end(tmp_path, three_languages, both_ways):
    """The documented workflow on tiny data: English monolingual text translated into German by a model of
    the other direction (sampled), then de→en trained on the real pairs plus the tagged synthetic ones."""
    mono = [line for line in (three_languages / "train.en").read_text().splitlines()[2000:2200]]
    (tmp_path / "mono.en").write_text("".join(line + "\n" for line in mono), encoding="utf-8")
    done = translate(both_ways, "--target-lang", "de", "--input", str(tmp_path / "mono.en"),
                     "--output", str(tmp_path / "mono.de"), "--sample", "--top-k", "10")  # fmt: skip
    assert done.returncode == 0, done.stderr
    synthetic = (tmp_path / "mono.de").read_text(encoding="utf-8").splitlines()
    assert len(synthetic) == 200 and synthetic != mono
    corpora = [text_corpus(three_languages, "de", "en"),
               {"dataset": "text", "train_prefix": f"{tmp_path}/mono", "src_lang": "de", "tgt_lang": "en",
                "name": "bt", "tag": "bt", "weight": 0.5}]  # fmt: skip
    done = train(tmp_path, "run", corpora, "data.train_limit=600", "train.max_steps=20")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "de-en 600 × 1 -> 600, bt 200 × 0.5 -> 100" in done.stdout
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert list(results["test_corpora"]) == ["de-en"]  # the synthetic corpus trains only
    from transformer import Translator

    translator = Translator.from_checkpoint(tmp_path / "run" / "best.pt")
    assert translator.tokenizer.symbol_id("<bt>") is not None  # one piece of its own
    assert translator.language_ids() == []  # one target language: nothing in front at translation time


def test_fine_tuning_mixes_the_old_data_in(tmp_path, three_languages, tiny_checkpoint):
    corpora = [text_corpus(three_languages, "de", "en", name="domain"),
               {"dataset": "multi30k", "src_lang": "de", "tgt_lang": "en", "weight": 0.2}]  # fmt: skip
    done = train(tmp_path, "run", corpora, f"train.init_from={tiny_checkpoint}", "data.train_limit=500",
                 "train.max_steps=10")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "domain 500 × 1 -> 500, de-en 500 × 0.2 -> 100" in done.stdout
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results["test_corpora"]) == {"domain", "de-en"}


def test_a_tag_the_fine_tuned_model_lacks_is_refused_and_the_folder_left_as_it_was(
    tmp_path, three_languages, tiny_checkpoint
):
    corpora = [text_corpus(three_languages, "de", "en", tag="bt")]
    done = train(tmp_path, "run", corpora, f"train.init_from={tiny_checkpoint}")
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("error: data.corpora[0].tag: the run's tokenizer has no user-defined piece <bt>")
    )
    assert not (tmp_path / "run").exists()


def test_the_service_translates_into_the_language_asked_for(both_ways):
    from servers import Server

    server = Server(both_ways)
    try:
        status, model = server.request("GET", "/model")
        assert status == 200 and model["multilingual"] is True
        assert model["directions"] == [["de", "en"], ["en", "de"]] and model["target_languages"] == [
            "de",
            "en",
        ]
        status, answer = server.translate(texts=["Ein Mann steht auf der Straße."])
        assert status == 422 and "target_lang: this model translates into de, en" in answer["error"]
        status, answer = server.translate(texts=["Ein Mann."], target_lang="fr")
        assert status == 422 and "target_lang: target language 'fr'" in answer["error"]
        status, answer = server.translate(texts=["Ein Mann steht auf der Straße."], target_lang="en")
        expected = translate(both_ways, "--target-lang", "en", "Ein Mann steht auf der Straße.").stdout
        assert status == 200 and answer["translations"][0]["text"] == expected.removesuffix("\n")
        asked = {"q": "A man is standing on the street.", "source": "en", "target": "de"}
        status, answer = server.request("POST", "/libretranslate/translate", asked)
        expected = translate(both_ways, "--target-lang", "de", "A man is standing on the street.").stdout
        assert status == 200 and answer["translatedText"] == expected.removesuffix("\n")
        status, answer = server.request("POST", "/libretranslate/translate",
                                        {"q": "Ein Mann.", "source": "de", "target": "de"})  # fmt: skip
        assert (
            status == 400
            and answer["error"] == "de to de is not supported: this model translates de to en, en to de"
        )
        status, languages = server.request("GET", "/libretranslate/languages")
        assert [(one["code"], one["targets"]) for one in languages] == [("de", ["en"]), ("en", ["de"])]
    finally:
        server.stop()


def test_a_released_multilingual_marian_model_takes_the_same_flag(both_ways, tmp_path):
    """Our two-direction model exported as a Marian folder whose language tokens are spelt as released
    multilingual models spell them (>>de<<, >>en<<): --target-lang picks them, as ours picks <2de>."""
    from transformer.interop.marian import main as marian

    assert marian(["export", str(both_ways), str(tmp_path / "hf")]) == 0
    vocab_path = tmp_path / "hf" / "vocab.json"
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    vocab = {
        (f">>{piece[2:-1]}<<" if piece in ("<2de>", "<2en>") else piece): i for piece, i in vocab.items()
    }
    vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    from transformer import Translator

    sentence = "A man is standing on the street."
    ours = Translator.from_checkpoint(both_ways, target_lang="de")
    released = Translator.from_checkpoint(tmp_path / "hf", target_lang="de", max_len_offset=10)  # as ours
    assert released.languages == ours.languages == {"de": 4, "en": 5}
    for lang in (
        "de",
        "en",
    ):  # the same source ids, the same output ids (its tokenizer decodes spaces its way)
        sources = released.encode([sentence], target_lang=lang)
        assert sources == ours.encode([sentence], target_lang=lang)
        assert released.translate_ids(sources)[0][0].ids == ours.translate_ids(sources)[0][0].ids
    missing = translate(tmp_path / "hf", sentence)
    assert missing.returncode == 2 and "this model translates into de, en" in missing.stderr


def test_one_corpus_into_another_language_knows_its_target(tmp_path, three_languages):
    corpora = [text_corpus(three_languages, "en", "de", weight=2)]
    done = train(tmp_path, "run", corpora, "data.train_limit=300", "train.max_steps=6")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "data: an epoch holds 600 pairs: en-de 300 × 2 -> 600" in done.stdout  # a weight counts alone too
    checkpoint = tmp_path / "run" / "best.pt"
    assert translate(checkpoint, "--target-lang", "de", "A man.").returncode == 0
    wrong = translate(checkpoint, "--target-lang", "en", "A man.")
    assert wrong.returncode == 2 and "this model translates into de only" in wrong.stderr


def test_a_prefix_hides_no_empty_source_from_cleaning():
    from transformer.runtime.configs import DataConfig
    from transformer.training.splits import clean_pairs

    src, tgt = np.array([0, 3, 4, 1]), np.array([2, 2, 2, 4])  # empty; fits; too long with its tag; ratio 4
    keep, counts = clean_pairs(src, tgt, None, DataConfig(max_len=5, max_ratio=3.0), prefix_tokens=1)
    assert keep.tolist() == [1] and (counts["empty"], counts["too_long"], counts["ratio"]) == (1, 1, 1)


def test_libretranslate_matches_language_codes_whatever_their_case():
    from transformer.serving.libretranslate import checked
    from transformer.serving.schema import Limits

    routes = [("en", "pt_BR"), ("en", "de")]
    given = {"q": "A dog.", "source": "EN", "target": "pt_br"}
    assert checked(given, Limits(), routes) == (["A dog."], 0, "pt_BR")
