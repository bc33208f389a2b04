"""translate.py and the Translator on released models: a Hugging Face Marian folder (exported from our tiny
checkpoint, or a random Marian-layout model that starts the decoder from PAD) and hf:NAME offline."""

import gzip

import pytest
import torch
from helpers import DATA_DIR, as_pre_norm

from transformer.commands import translate
from transformer.inference.translator import Translator
from transformer.interop.marian import main as marian_main
from transformer.interop.marian import save_marian_tokenizer
from transformer.runtime.checkpoints import load_for_inference

transformers = pytest.importorskip("transformers")


def first_lines(n: int = 12) -> list[str]:
    with gzip.open(DATA_DIR / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.mark.parametrize("pre_norm", [False, True])
def test_an_exported_folder_translates_scores_and_aligns_as_the_checkpoint(
    tiny_checkpoint, tmp_path, pre_norm
):
    """Our checkpoint -> a Marian folder (a Pegasus one if pre-norm) -> back through from_marian and the
    MarianTokenizer: the same translations (greedy and beam), the same reference scores, the same
    attention."""
    if pre_norm:
        tiny_checkpoint = as_pre_norm(tiny_checkpoint, tmp_path / "pre_norm.pt")
    assert marian_main(["export", str(tiny_checkpoint), str(tmp_path / "hf")]) == 0
    ours = Translator.from_checkpoint(tiny_checkpoint)
    # a Marian folder carries no decoding settings: give it the checkpoint's length limit
    released = Translator.from_checkpoint(tmp_path / "hf", max_len_offset=ours.settings.max_len_offset)
    lines = first_lines()
    for beam in (1, 3):
        assert released.translate(lines, beam=beam) == ours.translate(lines, beam=beam)
    references = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow."]
    torch.testing.assert_close(
        torch.tensor(released.score(lines[:2], references)), torch.tensor(ours.score(lines[:2], references)),
        rtol=1e-4, atol=1e-4,
    )  # fmt: skip
    a, b = ours.attention(lines[0], references[0]), released.attention(lines[0], references[0])
    assert a.source_pieces == b.source_pieces and a.target_pieces == b.target_pieces
    torch.testing.assert_close(b.cross[-1], a.cross[-1], rtol=1e-4, atol=1e-5)


def pad_start_folder(tiny_checkpoint, folder):
    """A random Marian-layout model (decoder starts from PAD, swish, a final_logits_bias) on our tiny
    tokenizer's vocabulary, saved as a Hugging Face folder."""
    _, tokenizer, _ = load_for_inference(tiny_checkpoint)
    hf_config = transformers.MarianConfig(
        vocab_size=tokenizer.vocab_size, d_model=16, encoder_layers=1, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id, decoder_start_token_id=tokenizer.pad_id,
        forced_eos_token_id=None, activation_function="swish", scale_embedding=True,
    )  # fmt: skip
    torch.manual_seed(0)
    hf_model = transformers.MarianMTModel(hf_config).eval()
    with torch.no_grad():
        hf_model.final_logits_bias.normal_()
        hf_model.final_logits_bias[0, tokenizer.eos_id] = 3.0  # so that some translations end by themselves
    hf_model.save_pretrained(folder)
    save_marian_tokenizer(tokenizer, folder, "de", "en")
    return hf_model, transformers.MarianTokenizer.from_pretrained(folder)


def test_a_pad_start_marian_folder_decodes_as_generate(tiny_checkpoint, tmp_path):
    hf_model, hf_tokenizer = pad_start_folder(tiny_checkpoint, tmp_path / "marian")
    translator = Translator.from_checkpoint(tmp_path / "marian")
    assert translator.model.variant.decoder_start_token == "pad"
    offset = translator.settings.max_len_offset
    for line in first_lines(8):
        ids = hf_tokenizer(line).input_ids  # with </s>
        limit = len(ids) + offset
        out = hf_model.generate(torch.tensor([ids]), num_beams=1, do_sample=False, max_new_tokens=limit,
                                bad_words_ids=[[hf_tokenizer.pad_token_id]])[0].tolist()  # fmt: skip
        expected = hf_tokenizer.decode(out, skip_special_tokens=True)
        assert translator.translate([line])[0] == expected.replace("\n", " ")


def test_translate_py_on_a_released_folder_and_hf_names_offline(
    tiny_checkpoint, tmp_path, capsys, monkeypatch
):
    pad_start_folder(tiny_checkpoint, tmp_path / "marian")
    line = first_lines(1)[0]
    assert translate.main(["--checkpoint", str(tmp_path / "marian"), line]) == 0
    expected = Translator.from_checkpoint(tmp_path / "marian").translate([line])[0]
    assert capsys.readouterr().out == expected + "\n"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert translate.main(["--checkpoint", "hf:Helsinki-NLP/opus-mt-xx-yy", line]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "Helsinki-NLP/opus-mt-xx-yy" in err and "folder" in err
    assert translate.main(["--checkpoint", str(tmp_path), line]) == 1  # a folder that is not a model
    assert "is not a Marian model folder" in capsys.readouterr().err
    transformers.BertConfig(vocab_size=8).save_pretrained(tmp_path / "bert")  # a model, not Marian's
    assert translate.main(["--checkpoint", str(tmp_path / "bert"), line]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model_type='bert' is not a Marian model (expected marian or" in err
    assert marian_main(["export", str(tiny_checkpoint), str(tmp_path / "no_spm")]) == 0
    (tmp_path / "no_spm" / "source.spm").unlink()  # a model without its tokenizer
    assert translate.main(["--checkpoint", str(tmp_path / "no_spm"), line]) == 1
    err = capsys.readouterr().err  # transformers' weight-loading progress bar, then our one line
    assert "Traceback" not in err and err.endswith("\n") and "Marian tokenizer files" in err, err
    assert err.strip().splitlines()[-1].startswith(f"error: {tmp_path / 'no_spm'}: no readable")
