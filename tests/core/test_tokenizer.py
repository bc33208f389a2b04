"""Tokenizer: fixed special ids, exact round trips on real Multi30k text, serialisation, errors."""

import io

import pytest
import sentencepiece as spm
import torch

from transformer.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from transformer.training.corpus import read_lines
from transformer.training.tokenizer_job import train_tokenizer

ACCENTED = [
    "Ein Mädchen läuft über die Straße.",
    "Un garçon à côté d'un café.",
    "Zwei Männer grüßen einen älteren Herrn vor dem Geschäft.",
    "Une femme âgée fait du vélo près de l'hôpital.",
]


@pytest.fixture(scope="session")
def tokenizer(multi30k_dir, tmp_path_factory) -> Tokenizer:
    """A small joint de/en/fr BPE model: 3000 sentences per language, 1000 pieces (~0.3 s)."""
    files = [multi30k_dir / f"train.{lang}.gz" for lang in ("de", "en", "fr")]
    sentences = [line for path in files for line in read_lines(path)[:3000]]
    return train_tokenizer(sentences, tmp_path_factory.mktemp("spm") / "joint", vocab_size=1000)


def test_special_ids_are_fixed(tokenizer):
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tokenizer.id_to_piece([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tokenizer.vocab_size == 1000


def test_encode_adds_no_special_ids(tokenizer):
    for text in ACCENTED:
        ids = tokenizer.encode(text)
        assert ids and not {PAD_ID, BOS_ID, EOS_ID} & set(ids)


@pytest.mark.parametrize("text", ACCENTED)
def test_round_trip_accents(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_round_trip_real_validation_sentences(tokenizer, multi30k_dir):
    """Every normalised sentence without unknown characters decodes back to itself."""
    checked = 0
    for lang in ("de", "en", "fr"):
        lines = read_lines(multi30k_dir / f"val.{lang}.gz")
        for text, ids in zip(lines, tokenizer.encode_batch(lines), strict=True):
            if UNK_ID in ids or " ".join(text.split()) != text:  # see the module docstring
                continue
            assert tokenizer.decode(ids) == text
            checked += 1
    assert checked > 0.95 * 3 * 1014


def test_encode_batch_equals_encode(tokenizer):
    assert tokenizer.encode_batch(ACCENTED) == [tokenizer.encode(text) for text in ACCENTED]
    assert tokenizer.decode_batch(tokenizer.encode_batch(ACCENTED)) == ACCENTED


def test_decode_drops_special_ids(tokenizer):
    ids = tokenizer.encode(ACCENTED[0])
    assert tokenizer.decode([BOS_ID] + ids + [EOS_ID, PAD_ID, PAD_ID]) == ACCENTED[0]


def test_bytes_round_trip_through_a_checkpoint(tokenizer):
    buffer = io.BytesIO()
    torch.save({"tokenizer": tokenizer.to_bytes()}, buffer)
    buffer.seek(0)
    restored = Tokenizer.from_bytes(torch.load(buffer, weights_only=True)["tokenizer"])
    assert restored.vocab_size == tokenizer.vocab_size
    assert restored.encode_batch(ACCENTED) == tokenizer.encode_batch(ACCENTED)


def test_load_from_model_file(tokenizer, tmp_path):
    path = tmp_path / "copy.model"
    path.write_bytes(tokenizer.to_bytes())
    assert Tokenizer(path).encode(ACCENTED[1]) == tokenizer.encode(ACCENTED[1])


def test_invalid_model_type(tmp_path):
    with pytest.raises(ValueError, match="unknown model_type 'bep'.*bpe, unigram"):
        train_tokenizer(ACCENTED, tmp_path / "m", vocab_size=50, model_type="bep")


def test_vocab_size_too_large(tmp_path):
    with pytest.raises(ValueError, match=r"vocab_size=5000.*Vocabulary size too high"):
        train_tokenizer(ACCENTED * 10, tmp_path / "m", vocab_size=5000)


def test_rejects_model_with_other_special_ids(tmp_path):
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(ACCENTED * 10),
        model_prefix=str(tmp_path / "default_ids"),
        vocab_size=60,
        minloglevel=2,
    )  # SentencePiece's defaults: unk 0, bos 1, eos 2, no pad
    with pytest.raises(ValueError, match="special ids"):
        Tokenizer(tmp_path / "default_ids.model")
