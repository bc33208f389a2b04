"""Fine-tuning: a run that starts from a trained model instead of random weights: ``train.init_from: PATH``,
a checkpoint of this project, a Hugging Face Marian folder (an opus-mt model) or ``hf:NAME``.

What comes from the source, and what from the run's own config:

  source   the architecture (every ``model.*`` key but ``model.dropout``), the tokenizer and its special ids
           (a Marian model's own two SentencePiece models and vocabulary), the weights (``model``: the
           moving average when the source kept one, as ``translate.py`` uses);
  run      the data, ``model.dropout``, and everything under ``train`` and ``eval``. The optimizer, the
           learning-rate schedule and the step count start fresh (``train.reset_optimizer: true``, the
           default); ``false`` takes the source's optimizer state and step, to continue its schedule (a
           checkpoint of this project only: a released model has none).

A ``model.*`` key the run's config sets to something other than its default and the source's value is a
conflict, refused by name; so is ``data.tokenizer`` (the tokenizer is the source's). ``--resume`` of a
fine-tuning run reads its own ``last.pt`` as usual (the source decides only the architecture then).
"""

import dataclasses
from dataclasses import dataclass

import torch

from transformer.core.checkpoint import CheckpointError, load_checkpoint, tokenizer_from_tensor
from transformer.core.config import ConfigError, ModelConfig, TrainConfig
from transformer.core.tokenizer import Tokenizer
from transformer.interop.formats import is_released, load_released, read_tokenizer
from transformer.runtime.configs import Config, config_from_dict
from transformer.training.resume import load_optimizer_state

NOT_ARCHITECTURE = ("dropout",)


@dataclass
class Source:
    path: str
    config: Config
    tokenizer: Tokenizer
    weights: dict[str, torch.Tensor]  # what the source translates with (its moving average, if it kept one)
    optimizer: dict | None  # the source's optimizer state, when it is a training checkpoint
    step: int
    train_weights: dict[str, torch.Tensor] | None = None  # the raw weights its optimizer state belongs to
    ema: dict | None = None  # its moving average's state, when it kept one


def load_source(path: str) -> Source:
    if is_released(path):
        return released_source(path)
    checkpoint = load_checkpoint(path)
    tokenizer = tokenizer_from_tensor(checkpoint["tokenizer"], f"train.init_from={path}", read_tokenizer)
    try:
        config = config_from_dict(checkpoint["config"])
    except (ConfigError, KeyError, ValueError) as error:
        raise CheckpointError(f"train.init_from={path}: not a checkpoint of this project ({error})") from None
    step = int(checkpoint.get("state", {}).get("step", 0))
    return Source(
        path, config, tokenizer, checkpoint["model"], checkpoint.get("optimizer"), step,
        checkpoint.get("train_model"), checkpoint.get("ema"),
    )  # fmt: skip


def released_source(path: str) -> Source:
    """A Hugging Face Marian folder or ``hf:NAME``: its weights through ``from_marian``, its own tokenizer
    files and special ids (``marian_text.MarianText``); no optimizer state."""
    model, tokenizer, config = load_released(path)  # needs transformers
    try:
        tokenizer.files  # noqa: B018 -- made here, so that a tokenizer that cannot be kept is refused now
    except ValueError as error:
        raise ConfigError(f"train.init_from={path}: {error}") from None
    sizes = (model.encoder.embedding.embedding.num_embeddings, model.output_proj.out_features)
    if sizes != (tokenizer.vocab_size, tokenizer.vocab_size):
        raise ConfigError(
            f"train.init_from={path}: the model's source and target vocabularies {sizes} are not its "
            f"tokenizer's {tokenizer.vocab_size} pieces"
        )
    return Source(path, config, tokenizer, model.state_dict(), None, 0)


def with_source_model(config: Config, source: Source) -> Config:
    """The run's config with the source's architecture; a ``model.*`` key set against it is refused."""
    default, mine, theirs = ModelConfig(), config.model, source.config.model
    conflicts = [
        f"model.{f.name}={getattr(mine, f.name)!r} (the source has {getattr(theirs, f.name)!r})"
        for f in dataclasses.fields(ModelConfig)
        if f.name not in NOT_ARCHITECTURE
        and getattr(mine, f.name) != getattr(default, f.name)
        and getattr(mine, f.name) != getattr(theirs, f.name)
    ]
    if conflicts:
        raise ConfigError(
            f"train.init_from={source.path} decides the architecture, but the config sets "
            f"{', '.join(conflicts)}: leave these keys out or give the source's values"
        )
    if config.data.tokenizer:
        raise ConfigError(
            f"train.init_from={source.path} brings its own tokenizer: data.tokenizer={config.data.tokenizer} "
            "cannot be used with it"
        )
    model = dataclasses.replace(theirs, dropout=mine.dropout)
    return dataclasses.replace(config, model=model, variant=source.config.variant)


def check_source(source: Source, train: TrainConfig) -> None:
    """Refuse, before the run folder is written, a source that cannot continue as ``train`` asks."""
    if not train.reset_optimizer and source.optimizer is None:
        raise ConfigError(
            f"train.reset_optimizer=false needs the source's optimizer state: {source.path} has none "
            "(an inference-only checkpoint keeps only the weights)"
        )


def start_from(
    source: Source, model: torch.nn.Module, optimizer: torch.optim.Optimizer, train: TrainConfig
) -> int:
    """Load the source's weights; returns the first step. With ``train.reset_optimizer``, the weights it
    translates with, and a fresh optimizer at step 0. Without, training goes on as ``--resume`` would: its
    raw weights with its optimizer state (its moments, with the run's own Adam settings) and its step; the
    caller continues its moving average (``Source.ema``)."""
    if train.reset_optimizer:
        model.load_state_dict(source.weights)
        return 0
    check_source(source, train)
    model.load_state_dict(source.train_weights if source.train_weights is not None else source.weights)
    load_optimizer_state(optimizer, source.optimizer)
    for group in optimizer.param_groups:  # load_state_dict brought the source's settings: the run's win
        group.update(
            betas=(train.adam_beta1, train.adam_beta2), eps=train.adam_eps, weight_decay=train.weight_decay
        )
    return source.step
