"""Configuration: every shipped config loads; unknown keys and wrong types are errors naming the key."""

import re

import pytest
from helpers import CONFIGS

from transformer.core.config import ConfigError
from transformer.runtime.configs import Config, load_config

CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_config_loads(path):
    assert isinstance(load_config(path), Config)


def test_defaults_are_the_papers_base_model():
    c = load_config()
    assert (c.model.d_model, c.model.n_heads, c.model.d_ff, c.model.n_encoder_layers) == (512, 8, 2048, 6)
    assert (c.train.adam_beta2, c.train.adam_eps, c.train.label_smoothing) == (0.98, 1e-9, 0.1)


def test_overrides_are_typed(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 64\n  n_heads: 4\ntrain:\n  adam_eps: 1e-8\n")
    c = load_config(path, ["train.max_steps=200", "model.norm_first=true", "data.data_dir=/x"])
    assert c.model.d_model == 64 and c.train.max_steps == 200 and c.model.norm_first is True
    assert c.train.adam_eps == 1e-8  # PyYAML reads 1e-8 as a string; coerced to float
    assert c.data.data_dir == "/x"


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.max_stepz=3", "unknown key train.max_stepz; valid keys in train: seed, "),
        ("train.max_steps=many", r"train.max_steps: expected int, got 'many'"),
        ("model.dropout=true", r"model.dropout: expected float"),
        ("trian.seed=1", "unknown section 'trian'"),
        ("model.d_model=100", r"model.d_model=100 is not divisible by model.n_heads=8"),
        ("train.precision=fp8", r"train.precision='fp8'"),
        ("max_steps=3", "expected section.key=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(bad)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.log_every=0"], "train.log_every=0 must be >= 1"),
        (["eval.beam_size=0"], "eval.beam_size=0 must be >= 1"),
        (["eval.select_by=bleuu"], "eval.select_by='bleuu': expected bleu, chrf or loss"),
        (["model.max_positions=40", "eval.max_len_offset=39"], "leaves no room for a source"),
        (["model.max_positions=100"], "data.max_len=128 is more than model.max_positions=100"),
        (["train.patience=3", "eval.every_steps=0"], "train.patience counts evaluations"),
        (["eval.average_last=3", "train.keep_last=2"], "eval.average_last=3 needs train.keep_last >= it"),
    ],
)
def test_settings_that_cannot_work_are_refused_by_name(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)
