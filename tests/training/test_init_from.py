"""Fine-tuning (train.init_from, transformer/training/fine_tuning.py): a run starts from a trained
checkpoint's weights,
architecture and tokenizer, or from a released Marian folder's with its own tokenizer and special ids, with a
fresh optimizer and step count, and lowers the source's validation loss; conflicting settings are refused by
name. The fine-tuned Marian model translates, exports and re-imports exactly."""

import json
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
import yaml
from helpers import CONFIGS, DATA_DIR, needs_data, run_train

from transformer.core.checkpoint import load_checkpoint
from transformer.core.config import ConfigError
from transformer.inference.translator import Translator
from transformer.runtime.checkpoints import load_for_inference
from transformer.runtime.configs import load_config
from transformer.training.fine_tuning import load_source, with_source_model

TINY = CONFIGS / "tiny.yaml"


@needs_data
def test_fine_tuning_starts_from_the_source_and_lowers_its_validation_loss(tiny_checkpoint, tmp_path):
    source = load_checkpoint(tiny_checkpoint)
    source_loss = json.loads((tiny_checkpoint.parent / "results.json").read_text())["validation"][-1][
        "val_loss"
    ]
    overrides = [f"train.init_from={tiny_checkpoint}", "data.train_limit=3000", "train.max_steps=40",
                 "train.peak_lr=1e-3", "eval.every_steps=40"]  # fmt: skip
    assert run_train(tmp_path / "tuned", *overrides) == 0
    results = json.loads((tmp_path / "tuned" / "results.json").read_text())
    assert results["steps"] == 40  # the step count started again from 0
    tuned_loss = results["validation"][-1]["val_loss"]
    assert tuned_loss < source_loss, (tuned_loss, source_loss)
    config = yaml.safe_load((tmp_path / "tuned" / "config.yaml").read_text())
    assert config["model"] == load_checkpoint(tiny_checkpoint)["config"]["model"]  # the source's architecture
    assert (tmp_path / "tuned" / "tokenizer.model").read_bytes() == bytes(source["tokenizer"].tolist())
    random_start = run_train(tmp_path / "scratch", *[o for o in overrides if "init_from" not in o],
                             "model.d_model=32")  # fmt: skip
    assert random_start == 0
    scratch = json.loads((tmp_path / "scratch" / "results.json").read_text())["validation"][-1]["val_loss"]
    assert tuned_loss < scratch
    model, tokenizer, _ = load_for_inference(tmp_path / "tuned" / "best.pt")
    translator = Translator(model, tokenizer, load_config(TINY).eval)
    assert translator.translate(["Ein Hund rennt."])[0].strip()


@needs_data
def test_continuing_the_schedule_and_the_refusals(tiny_checkpoint, tmp_path):
    steps = int(load_checkpoint(tiny_checkpoint)["state"]["step"])
    keep = [f"train.init_from={tiny_checkpoint}", "train.reset_optimizer=false",
            f"train.max_steps={steps + 4}", "eval.every_steps=0"]  # fmt: skip
    assert run_train(tmp_path / "continued", *keep) == 0
    assert json.loads((tmp_path / "continued" / "results.json").read_text())["steps"] == steps + 4
    source = load_source(str(tiny_checkpoint))
    with pytest.raises(ConfigError, match=r"model.d_model=64 \(the source has 32\)"):
        with_source_model(load_config(TINY, ["model.d_model=64"]), source)
    with pytest.raises(ConfigError, match="brings its own tokenizer: data.tokenizer=x.model"):
        with_source_model(load_config(TINY, ["data.tokenizer=x.model"]), source)
    tuned = with_source_model(load_config(TINY, ["model.dropout=0.3"]), source)
    assert tuned.model.dropout == 0.3 and tuned.model.d_model == source.config.model.d_model
    torch.save({"model": {}}, tmp_path / "other.pt")
    assert run_train(tmp_path / "bad", f"train.init_from={tmp_path / 'other.pt'}") == 1


def marian_layout_folder(tiny_checkpoint, folder: Path, seed: int = 0):
    """A random MarianMTModel saved as a Hugging Face folder with a tokenizer in Marian's own layout: the tiny
    checkpoint's SentencePiece model as source.spm and target.spm, and a vocab.json that numbers its pieces
    as opus-mt models do (EOS 0, UNK 1, the pieces, PAD last; no <s>), so that no id is SentencePiece's."""
    transformers = pytest.importorskip("transformers")
    _, spm_tokenizer, _ = load_for_inference(tiny_checkpoint)
    pieces = spm_tokenizer.id_to_piece(list(range(4, spm_tokenizer.vocab_size)))
    vocab = {"</s>": 0, "<unk>": 1} | {piece: 2 + i for i, piece in enumerate(pieces)}
    vocab["<pad>"] = len(vocab)
    folder.mkdir()
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(spm_tokenizer.to_bytes())
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    settings = {"tokenizer_class": "MarianTokenizer", "source_lang": "de", "target_lang": "en"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    hf_config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        pad_token_id=vocab["<pad>"], eos_token_id=0, decoder_start_token_id=vocab["<pad>"],
        forced_eos_token_id=None, activation_function="swish", scale_embedding=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    transformers.MarianMTModel(hf_config).save_pretrained(folder)
    return vocab


def validation_loss(translator: Translator, n: int) -> float:
    """The per-token validation loss of the first ``n`` Multi30k validation pairs, as train.py reports it."""
    from transformer.core.batches import iter_batches, make_batches
    from transformer.runtime.metrics import evaluate_loss
    from transformer.training.multi30k import load_multi30k
    from transformer.training.splits import encode_split

    split = load_multi30k("de", "en", str(DATA_DIR))["validation"].head(n)
    src, tgt = encode_split(split, translator.tokenizer)
    batches = make_batches([len(s) for s in src], [len(t) for t in tgt], 600, False)
    model = translator.model
    loss = evaluate_loss(model, iter_batches(src, tgt, batches, *model.pad_start_eos), "cpu", nullcontext)
    return loss["loss"]


@needs_data
def test_fine_tuning_a_released_marian_folder(tiny_checkpoint, tmp_path):
    """A Marian folder on disk -> train.init_from -> a run with the folder's tokenizer (Marian's ids, EOS 0,
    PAD last, the decoder started from PAD) whose validation loss falls; its best.pt translates, exports to
    a Marian folder with the same tokenizer files, and that folder re-imports to the same weights and the
    same translations."""
    from transformer.interop.marian import main as marian_main
    from transformer.interop.marian_text import MarianText

    vocab = marian_layout_folder(tiny_checkpoint, tmp_path / "released")
    source = Translator.from_checkpoint(tmp_path / "released")
    assert source.model.pad_start_eos == (vocab["<pad>"], vocab["<pad>"], 0)
    overrides = [f"train.init_from={tmp_path / 'released'}", "data.train_limit=400", "train.max_steps=40",
                 "train.warmup_steps=8", "eval.every_steps=40",
                 f"data.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    assert run_train(tmp_path / "tuned", *overrides) == 0
    run = tmp_path / "tuned"
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 40
    assert results["validation"][-1]["val_loss"] < validation_loss(source, n=24) - 0.5
    assert (run / "tokenizer.marian.zip").is_file() and not (run / "tokenizer.model").exists()
    tuned = Translator.from_checkpoint(run / "best.pt")
    assert isinstance(tuned.tokenizer, MarianText) and tuned.model.pad_start_eos == source.model.pad_start_eos
    lines = ["Ein Hund rennt durch den Schnee.", "Zwei Männer spielen Fußball."]
    translations = tuned.translate(lines)
    assert translations != source.translate(lines) and all(t.strip() for t in translations)

    assert marian_main(["export", str(run / "best.pt"), str(tmp_path / "exported")]) == 0
    for name in ("source.spm", "target.spm", "vocab.json"):  # the Marian model's own tokenizer files
        assert (tmp_path / "exported" / name).read_bytes() == (tmp_path / "released" / name).read_bytes()
    again = Translator.from_checkpoint(tmp_path / "exported", max_len_offset=tuned.settings.max_len_offset)
    weights = load_checkpoint(run / "best.pt")["model"]
    assert again.model.state_dict().keys() == weights.keys()
    for name, tensor in again.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    assert again.translate(lines) == translations
    assert again.translate(lines, beam=3) == tuned.translate(lines, beam=3)
    more = [o.replace("max_steps=40", "max_steps=44") for o in overrides]
    assert run_train(run, *more, resume=True) == 0  # --resume reads tokenizer.marian.zip back
    assert json.loads((run / "results.json").read_text())["steps"] == 44
