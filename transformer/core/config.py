"""Configuration: frozen dataclasses of the model, training and decoding settings, the ONLY place their
defaults live, built from mappings (a YAML file's section, a checkpoint's) with strict keys.

A mapping holds overrides of the defaults only. An unknown key or a value of the wrong type is a
``ConfigError`` that names the key (and lists the valid ones).
"""

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


PRECISIONS = ("auto", "fp32", "bf16", "fp16")  # THE list of train.precision's values


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 512  # width of every layer's input and output (§3)
    n_heads: int = 8  # attention heads; d_model must divide by it (§3.2.2)
    d_ff: int = 2048  # inner width of the position-wise feed-forward network (§3.3)
    n_encoder_layers: int = 6  # encoder layers (§3.1)
    n_decoder_layers: int = 6  # decoder layers (§3.1)
    dropout: float = 0.1  # residual, embeddings and attention weights (§5.4)
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm
    share_embeddings: bool = True  # tie source, target and output embeddings (joint vocab, §3.4)
    max_positions: int = 1024  # length of the sinusoidal table

    def __post_init__(self):
        for name in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model.{name}={getattr(self, name)} must be >= 1")
        if self.d_model % self.n_heads != 0:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout} must be in [0, 1)")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1  # initial weights, dropout masks and batch order (the same seed, the same run)
    max_epochs: int = 0  # 0 = no limit
    max_steps: int = 0  # optimizer updates; 0 = no limit
    max_minutes: float = 0.0  # wall-clock budget for training; 0 = no limit
    warmup_steps: int = 4000  # §5.3
    lr_scale: float = 1.0  # lr = lr_scale · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)
    peak_lr: float = 0.0  # > 0: choose lr_scale so that the lr at step = warmup_steps is this
    cooldown: float = 0.0  # > 0: the lr falls linearly to 0 over this last fraction of the step/time budget
    adam_beta1: float = 0.9  # Adam's β1 (§5.3)
    adam_beta2: float = 0.98  # Adam's β2 (§5.3)
    adam_eps: float = 1.0e-9  # Adam's ε (§5.3)
    weight_decay: float = 0.0  # an L2 penalty added to the gradients (Adam's weight_decay); 0 = none
    label_smoothing: float = 0.1  # ε_ls, spread over the tokens the decoder can produce (§5.4)
    clip_grad_norm: float = 0.0  # 0 = no clipping
    accum_steps: int = 1  # gradient accumulation: batches per optimizer update
    init_from: str | None = None  # fine-tune: start from these weights (a best.pt or a Marian model)
    reset_optimizer: bool = True  # with init_from: a fresh optimizer, schedule and step count
    device: str = "auto"  # "auto" (cuda if present), "cpu", "cuda", "cuda:1", ...
    precision: str = "auto"  # "auto" (bf16 on cuda and on CPUs with AVX512-BF16 / AMX, else fp32), fp32, ...
    compile: bool = False  # torch.compile the model
    fast: bool = True  # faster equivalents of the modules, loss and search steps; false: the plain model
    ema_decay: float = 0.0  # > 0: evaluate and save an exponential moving average of the weights; the cap
    # of its decay min(ema_decay, (1 + n) / (10 + n)) after n updates (ema.py: 0.998 is reached at n = 4490)
    nonfinite_loss: str = "stop"  # "stop" (keep the last good checkpoint) or "skip" the update
    log_every: int = 50  # steps between TensorBoard scalars
    checkpoint_every: int = 0  # also write last.pt every N steps (besides every evaluation); 0 = off
    sync_every: int = 1  # steps between host syncs: the deferred non-finite check, the ranks' stop vote
    patience: int = 0  # > 0: stop after this many evaluations without improving eval.select_by
    keep_last: int = 0  # > 0: keep the checkpoints of the last N evaluations as step_<N>.pt (to average)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision={self.precision!r}: expected {', '.join(PRECISIONS)}")
        if self.nonfinite_loss not in ("stop", "skip"):
            raise ConfigError(f"train.nonfinite_loss={self.nonfinite_loss!r}: expected stop or skip")
        if self.accum_steps < 1:
            raise ConfigError(f"train.accum_steps={self.accum_steps} must be >= 1")
        if self.warmup_steps < 1:
            raise ConfigError(f"train.warmup_steps={self.warmup_steps} must be >= 1")
        if not 0.0 <= self.cooldown <= 1.0:
            raise ConfigError(f"train.cooldown={self.cooldown} must be in [0, 1]")
        if self.cooldown > 0 and not (self.max_steps or self.max_minutes > 0):
            raise ConfigError(
                f"train.cooldown={self.cooldown} needs train.max_steps or train.max_minutes: a budget"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing={self.label_smoothing} must be in [0, 1)")
        check_at_least(self, "train", log_every=1, sync_every=1, max_epochs=0, max_steps=0, max_minutes=0.0,
                        patience=0, keep_last=0, checkpoint_every=0)  # fmt: skip


@dataclass(frozen=True)
class EvalConfig:
    every_steps: int = 1000  # validation (loss + BLEU) every N optimizer updates; 0 = only at the end
    max_tokens: int = 8000  # per decoding batch: padded source tokens + as many again for the output
    beam_size: int = 1  # 1 = greedy
    length_penalty: float = 0.6  # α of the beam search length penalty
    max_len_offset: int = 50  # decode at most source length + this many tokens (§6.1)
    n_alignment_sentences: int = 3  # validation sentences drawn as attention heatmaps
    alignment_references: bool = False  # also draw them teacher-forced on the reference
    n_sample_translations: int = 5  # validation translations logged as text
    select_by: str = (
        "bleu"  # what picks best.pt and drives train.patience: bleu, chrf (higher) or loss (lower)
    )
    average_last: int = 0  # > 0: the final test uses the average of the last N evaluation checkpoints
    average_weights: str = "raw"  # what average_last averages: the raw weights (§6.1) or "ema" snapshots
    # more test sets for the final test, name: file prefix (<prefix>.<src_lang> and <prefix>.<tgt_lang>) or a
    # hub split, hub:NAME[:CONFIG]:SPLIT (e.g. hub:wmt14:de-en:validation)
    test_sets: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.select_by not in ("bleu", "chrf", "loss"):
            raise ConfigError(f"eval.select_by={self.select_by!r}: expected bleu, chrf or loss")
        if self.average_weights not in ("raw", "ema"):
            raise ConfigError(f"eval.average_weights={self.average_weights!r}: expected raw or ema")
        for name in self.test_sets:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name in ("validation", "test"):
                raise ConfigError(f"eval.test_sets: {name!r} is not a usable name (letters, digits, _ . -)")
        check_at_least(self, "eval", every_steps=0, max_tokens=1, beam_size=1, length_penalty=0.0,
                        max_len_offset=1, n_alignment_sentences=0, n_sample_translations=0,
                        average_last=0)  # fmt: skip


def check_at_least(section: Any, name: str, **minimums: float) -> None:
    """ConfigError naming the first key of ``section`` below its minimum."""
    for key, minimum in minimums.items():
        if getattr(section, key) < minimum:
            raise ConfigError(f"{name}.{key}={getattr(section, key)} must be >= {minimum}")


def coerce_value(value: Any, annotation: Any, key: str) -> Any:
    """Check (and gently convert) a YAML value to the field's type; errors name the key."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        annotation = next(a for a in options if a is not type(None))
    if typing.get_origin(annotation) is list:
        if isinstance(value, list) and all(isinstance(item, dict) for item in value):
            return [dict(item) for item in value]
        raise ConfigError(f"{key}: expected a list of mappings, got {value!r}")
    if typing.get_origin(annotation) is dict:
        if isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping of names to strings, got {value!r}")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads 1e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif annotation is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{key}: expected {annotation.__name__}, got {value!r}")


def build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: expected a mapping of keys, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        if name not in fields:
            raise ConfigError(f"unknown key {section}.{name}; valid keys in {section}: {', '.join(fields)}")
        kwargs[name] = coerce_value(value, hints[name], f"{section}.{name}")
    return cls(**kwargs)
