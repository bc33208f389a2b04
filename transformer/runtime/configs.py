"""A run's whole configuration: the core's model, training and decoding settings (``core/config.py``) and
where the data come from (``DataConfig``), as one ``Config``; read from a YAML file (a path, or the name of
a config the project ships) and dotted overrides from the command line (``--set train.max_steps=200``).

A YAML file holds overrides only, by section (``model``, ``data``, ``train``, ``eval``); an unknown key or a
value of the wrong type is a ``ConfigError`` that names the key (and lists the valid ones).
"""

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from transformer.core.config import (
    ConfigError,
    EvalConfig,
    ModelConfig,
    TrainConfig,
    build_section,
)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # the configs the package ships, found by name


@dataclass(frozen=True)
class VariantConfig:
    # -- Where a released Marian (opus-mt) model differs from the paper. Our own models keep these defaults;
    # -- a Marian model brought in sets them (interop/variant.py), so that ours computes the same function.
    activation: str = "relu"  # feed-forward non-linearity: relu (§3.3), gelu or swish (Marian)
    sinusoid_layout: str = "interleaved"  # sin/cos interleaved (§3.5) or "halves" (Marian, fairseq)
    scale_embeddings: bool = True  # multiply token embeddings by √d_model (§3.4)
    output_bias: bool = False  # a learned bias on the output projection (Marian's final_logits_bias)
    decoder_start_token: str = "bos"  # the token tgt_in starts with: "bos", or "pad" as in Marian

    def __post_init__(self):
        choices = {
            "activation": ("relu", "gelu", "swish"),
            "sinusoid_layout": ("interleaved", "halves"),
            "decoder_start_token": ("bos", "pad"),
        }
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ConfigError(f"variant.{name}={getattr(self, name)!r}: expected {' or '.join(valid)}")


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "multi30k"  # "multi30k", "text" (local parallel files) or "hub"
    src_lang: str = "de"  # source language code, as the corpus names it (files, hub columns)
    tgt_lang: str = "en"  # target language code
    data_dir: str | None = None  # local Multi30k mirror; else $MULTI30K_DIR; else download
    hub_name: str | None = None  # dataset == "hub": e.g. "wmt14"
    hub_config: str | None = None  # e.g. "de-en"
    text_prefix: str | None = None  # "text": <prefix>.<split>.<lang>[.gz], split: train, dev/valid/val, test
    train_prefix: str | None = None  # the training files <prefix>.<lang>[.gz], instead of text_prefix's
    valid_prefix: str | None = None  # the validation files <prefix>.<lang>[.gz], instead of text_prefix's
    test_prefix: str | None = None  # the test files <prefix>.<lang>[.gz], instead of text_prefix's
    valid_size: int = 0  # a corpus with no validation split: carve this many pairs off the training split
    test_size: int = 0  # a corpus with no test split: carve this many pairs off the training split
    split_seed: int = 1  # which pairs valid_size and test_size carve off (the same for every run)
    vocab_size: int = 8000  # joint SentencePiece vocabulary
    tokenizer_type: str = "bpe"  # "bpe" or "unigram"
    tokenizer: str | None = None  # a SentencePiece .model to use instead of training one (ids 0-3 as ours)
    tokenizer_sample: int = 2_000_000  # sentences (sampled at random) SentencePiece learns from
    character_coverage: float = 1.0  # SentencePiece: share of characters covered (e.g. 0.9995 for CJK)
    cache_dir: str | None = None  # the cache; None: $TRANSFORMER_MT_CACHE or $XDG_CACHE_HOME/transformer-mt
    workers: int = -1  # tokenizing processes; -1: one per CPU core (at most 8) for a corpus over 32 MB
    max_tokens: int = 4000  # padded source + target tokens per batch
    max_len: int = 128  # cleaning: drop training pairs with a side longer than this (in tokens)
    max_ratio: float = 0.0  # cleaning: drop pairs whose longer side has more than this x the tokens; 0 = off
    dedup: bool = False  # cleaning: drop exact duplicate pairs (the first one stays)
    train_limit: int = 0  # > 0: keep only the first N training pairs (smoke tests)
    eval_limit: int = 0  # > 0: keep only the first N validation / test pairs (smoke tests)
    # several corpora in one run, each a mapping of the corpus keys above plus name, weight and tag
    # (docs/training.md: Many corpora); empty: the one corpus above
    corpora: list[dict] = field(default_factory=list)
    sampling_temperature: float = 1.0  # corpora's shares of an epoch ∝ (weight × size)^(1/T)

    def __post_init__(self):
        if self.dataset not in ("multi30k", "text", "hub"):
            raise ConfigError(f"data.dataset={self.dataset!r}: expected multi30k, text or hub")
        if self.tokenizer_type not in ("bpe", "unigram"):
            raise ConfigError(f"data.tokenizer_type={self.tokenizer_type!r}: expected bpe or unigram")
        for name in ("vocab_size", "max_tokens", "max_len", "tokenizer_sample"):
            if getattr(self, name) < 1:
                raise ConfigError(f"data.{name}={getattr(self, name)} must be >= 1")
        for name in ("valid_size", "test_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"data.{name}={getattr(self, name)} must be >= 0 (0 = carve nothing)")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ConfigError(f"data.character_coverage={self.character_coverage} must be in (0, 1]")
        if self.max_ratio < 0.0 or 0.0 < self.max_ratio < 1.0:
            raise ConfigError(f"data.max_ratio={self.max_ratio} must be 0 (off) or >= 1")
        if self.sampling_temperature <= 0.0:
            raise ConfigError(f"data.sampling_temperature={self.sampling_temperature} must be > 0")


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    variant: VariantConfig = field(default_factory=VariantConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self):
        if source_token_limit(self.model, self.eval) < 1:
            raise ConfigError(
                f"model.max_positions={self.model.max_positions} leaves no room for a source with "
                f"eval.max_len_offset={self.eval.max_len_offset}"
            )
        if self.data.max_len > self.model.max_positions:
            raise ConfigError(
                f"data.max_len={self.data.max_len} is more than model.max_positions="
                f"{self.model.max_positions}: training sentences would not fit the position table"
            )
        if self.train.patience and not self.eval.every_steps:
            raise ConfigError("train.patience counts evaluations: it needs eval.every_steps > 0")
        if self.eval.average_last > self.train.keep_last:
            raise ConfigError(
                f"eval.average_last={self.eval.average_last} needs train.keep_last >= it "
                f"(got {self.train.keep_last}): the averaged checkpoints are the kept ones"
            )
        if self.eval.average_weights == "ema" and not self.train.ema_decay:
            raise ConfigError("eval.average_weights=ema needs a moving average: train.ema_decay > 0")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


VARIANT_KEYS = tuple(f.name for f in dataclasses.fields(VariantConfig))


def source_token_limit(model: ModelConfig, settings: EvalConfig) -> int:
    """The most source tokens (without EOS) the model can translate: the source with its EOS and up to
    ``eval.max_len_offset`` output tokens must fit the position table (``model.max_positions``)."""
    return model.max_positions - settings.max_len_offset - 1


def with_variant_section(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the variant's keys under ``variant``: a checkpoint written when they were ``model``
    keys reads as one written now."""
    model = dict(values.get("model") or {})
    moved = {key: model.pop(key) for key in VARIANT_KEYS if key in model}
    if not moved:
        return values
    return {**values, "model": model, "variant": {**moved, **(values.get("variant") or {})}}


def config_from_dict(values: dict[str, Any]) -> Config:
    values = with_variant_section(values)
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    sections = {name: typing.get_type_hints(Config)[name] for name in sections}
    for name in values:
        if name not in sections:
            raise ConfigError(f"unknown section {name!r}; valid sections: {', '.join(sections)}")
    built = {name: build_section(cls, values.get(name) or {}, name) for name, cls in sections.items()}
    return Config(**built)


def parse_override(text: str) -> tuple[str, str, Any]:
    """'train.max_steps=200' -> ('train', 'max_steps', 200)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"override {text!r}: expected section.key=value")
    dotted, raw = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    return section, key, yaml.safe_load(raw) if raw.strip() else None


def find_config(name: str | Path) -> Path:
    """A config's file: ``name`` as a path (from the current folder), else the config of that name the
    package ships, in transformer/configs/ ("tiny" is tiny.yaml there, from any folder)."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = CONFIGS / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    names = ", ".join(sorted(p.stem for p in CONFIGS.glob("*.yaml")))
    raise ConfigError(f"cannot read config {name}: no such file, nor a config of the project's ({names})")


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """YAML file (overrides of the defaults; a path or a name, see ``find_config``) + dotted overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        path = find_config(path)
        try:
            values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except OSError as error:
            raise ConfigError(f"cannot read config {path}: {error.strerror}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"config {path} is not valid YAML: {error}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"config {path}: expected a mapping of sections at the top level")
    for text in overrides:
        section, key, value = parse_override(text)
        values.setdefault(section, {})
        if not isinstance(values[section], dict):
            raise ConfigError(f"{section}: expected a mapping of keys")
        values[section][key] = value
    return config_from_dict(values)
