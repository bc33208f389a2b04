"""Fine-tuning (train.init_from, transformer/init_from.py): a run starts from a trained checkpoint's weights,
architecture and tokenizer, with a fresh optimizer and step count, and lowers the source's validation loss;
conflicting settings are refused by name."""

import json

import pytest
import torch
import yaml
from conftest import ROOT, needs_data
from test_train import run_train

from transformer.checkpoint import load_checkpoint, load_for_inference
from transformer.config import ConfigError, load_config
from transformer.init_from import load_source, with_source_model
from transformer.translator import Translator

TINY = ROOT / "configs" / "tiny.yaml"


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
    with pytest.raises(ConfigError, match="fine-tuning a released Marian model is not supported yet"):
        load_source("hf:Helsinki-NLP/opus-mt-en-de")
    torch.save({"model": {}}, tmp_path / "other.pt")
    assert run_train(tmp_path / "bad", f"train.init_from={tmp_path / 'other.pt'}") == 1
