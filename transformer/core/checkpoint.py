"""Checkpoints: plain dicts of tensors and primitives, written atomically, read with ``weights_only=True``.

A checkpoint carries everything needed to rebuild the model and tokenizer alone: the resolved config, the
model's state (unwrapped: no ``module.`` / ``_orig_mod.`` prefixes), the tokenizer as bytes (our
SentencePiece model, or a Marian model's files), and, for resuming, the optimizer, step, epoch, data
position and RNG state.
"""

import os
import pickle
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from transformer.core.config import Config, ConfigError, config_from_dict
from transformer.core.model import build_model
from transformer.core.optim import load_optimizer_state
from transformer.core.tokenizer import Tokenizer


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, truncated, unsafe or incompatible; the message says which."""


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Write to a temporary file in the same folder, then rename: a kill never leaves a broken file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def link_checkpoint(source: str | Path, path: str | Path) -> None:
    """Make ``path`` the same file as the checkpoint ``source`` without writing it again: a hard link under
    a temporary name, then a rename, so ``path`` is never partly written (a copy where links are refused).
    ``save_checkpoint`` replaces a file by renaming a new one over it: a link stays the old checkpoint."""
    source, path = Path(source), Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.link"
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(source, tmp)
        except OSError:  # a file system without hard links
            shutil.copyfile(source, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load with ``weights_only=True`` (arbitrary pickled objects are refused); one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; a cut-off one has no directory
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted: not a complete torch.save file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"checkpoint {path} was refused: it contains pickled objects other than tensors and "
            "primitive types (loaded with weights_only=True)"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupted: {first}") from None
    if not isinstance(state, dict) or not {"config", "model", "tokenizer"} <= state.keys():
        raise CheckpointError(f"checkpoint {path} lacks config / model / tokenizer: not one of ours")
    return state


def tokenizer_to_tensor(tokenizer: Tokenizer) -> torch.Tensor:
    return torch.frombuffer(bytearray(tokenizer.to_bytes()), dtype=torch.uint8)


def tokenizer_from_tensor(
    data: torch.Tensor, where: str, read_tokenizer: Callable[[bytes], Any] = Tokenizer.from_bytes
):
    """A checkpoint's ``tokenizer`` tensor -> the tokenizer (``read_tokenizer`` of its bytes: ours, or one
    that also reads a released model's, ``training.model_formats.read_tokenizer``); bytes it cannot read
    are a ``CheckpointError`` that starts with ``where``."""
    try:
        return read_tokenizer(bytes(data.numpy().tobytes()))
    except (ValueError, RuntimeError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{where}: its tokenizer cannot be read: {error}") from None


def load_for_inference(
    path: str | Path,
    device: str | torch.device = "cpu",
    read_tokenizer: Callable[[bytes], Any] = Tokenizer.from_bytes,
):
    """checkpoint -> (model in eval mode on ``device``, tokenizer, config)."""
    state = load_checkpoint(path)
    tokenizer = tokenizer_from_tensor(state["tokenizer"], f"checkpoint {path}", read_tokenizer)
    try:
        config = config_from_dict(state["config"])
        model = build_model(config.model, tokenizer)
        model.load_state_dict(state["model"])
    except (ConfigError, RuntimeError, KeyError, ValueError, TypeError) as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointError(f"checkpoint {path} does not match its config: {first}") from None
    return model.to(device).eval(), tokenizer, config


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module under DistributedDataParallel (``.module``) and torch.compile (``._orig_mod``)."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model


# -------- training checkpoints: everything --resume needs ------------------------------------------


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's random generators: the CPU one, and its GPU's when it runs on one."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"] if state["cuda"].dim() == 1 else state["cuda"][0])


def training_checkpoint(
    model, optimizer, scaler, ema, config, tokenizer: Tokenizer, state: dict, rng_states: list[dict]
) -> dict:
    """``model`` holds the weights to translate with (the moving average when there is one); the training
    weights, optimizer, loss scale, moving average and every rank's RNG states (``rng_states[rank]``,
    each rank draws its own dropout masks) are there to resume exactly."""
    model = unwrap(model)
    checkpoint = {
        "config": config.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),  # fp16 loss scale; empty when the scaler is off
        "tokenizer": tokenizer_to_tensor(tokenizer),
        "state": state,
        "rng": {"ranks": rng_states},
    }
    if ema is not None:
        checkpoint["train_model"] = checkpoint["model"]
        with ema.applied(model):
            checkpoint["model"] = {k: v.clone() for k, v in model.state_dict().items()}
        checkpoint["ema"] = ema.state_dict()
    return checkpoint


RESUME_IGNORES = ("data_dir", "cache_dir", "workers")  # where the data and cache are, how many processes


def located(value):
    """A data value as resuming compares it: ``data.corpora``'s entries without where their data are."""
    if isinstance(value, list):
        return [{k: v for k, v in entry.items() if k not in RESUME_IGNORES} for entry in value]
    return value


def changed_settings(ckpt: dict, config: Config) -> list[str]:
    """The ``train`` and ``eval`` keys a resume changes, as "key (old -> new)": a resume may change them (a
    new budget, another validation schedule), as they decide neither the weights' shapes nor the batches."""
    saved, now, default = ckpt["config"], config.to_dict(), Config().to_dict()
    return [f"{section}.{key} ({saved.get(section, {}).get(key, default[section][key])!r} -> {value!r})"
            for section in ("train", "eval") for key, value in now[section].items()
            if key != "seed" and saved.get(section, {}).get(key, default[section][key]) != value]  # fmt: skip


def check_resumable(ckpt: dict, path: Path, config: Config, world_size: int, precision: str) -> None:
    """Refuse to resume from ``ckpt`` (read from ``path``), before anything is written, when it was trained
    with other model or data settings or another seed (they decide the weights' shapes and the order of the
    batches), by another number of processes, or in another precision (a checkpoint that does not say
    trained in fp32); or when it lacks the moving average ``train.ema_decay`` asks for."""
    saved, now, default = ckpt["config"], config.to_dict(), Config().to_dict()  # a missing key: its default
    changed = [
        f"model.{k}" for k in now["model"] if saved["model"].get(k, default["model"][k]) != now["model"][k]
    ]
    changed += [
        f"data.{k}" for k in now["data"]
        if k not in RESUME_IGNORES
        and located(saved["data"].get(k, default["data"][k])) != located(now["data"][k])
    ]  # fmt: skip
    changed += ["train.seed"] if saved["train"].get("seed") != now["train"]["seed"] else []
    if changed:
        raise CheckpointError(f"{path} was trained with other values of {', '.join(changed)}; cannot resume")
    state = ckpt["state"]
    if state.get("world_size", 1) != world_size:
        raise CheckpointError(
            f"{path} was trained by {state.get('world_size', 1)} processes; resume with as many"
        )
    trained_in = state.get("precision") or "fp32"  # a checkpoint that does not say trained in fp32
    if trained_in != precision:
        raise CheckpointError(
            f"{path} was trained in {trained_in}; train.precision={config.train.precision} is {precision} "
            f"here: resume with --set train.precision={trained_in}"
        )
    if config.train.ema_decay > 0 and "ema" not in ckpt:
        raise CheckpointError(f"{path} has no moving average; cannot resume with train.ema_decay > 0")


def restore_training(ckpt: dict, path: Path, model, optimizer, scaler, ema, rank: int = 0) -> dict:
    """Load what ``training_checkpoint`` saved (``ckpt``, read from ``path`` and passed by
    ``check_resumable``) back into these objects and this rank's RNG state; returns the saved ``state``."""
    unwrap(model).load_state_dict(ckpt.get("train_model", ckpt["model"]))
    load_optimizer_state(optimizer, ckpt["optimizer"])
    if ckpt.get("scaler"):
        scaler.load_state_dict(ckpt["scaler"])
    if ema is not None:
        ema.load_state_dict(ckpt["ema"])
    ranks = ckpt["rng"].get("ranks", [ckpt["rng"]])  # older checkpoints: one state for every rank
    if rank >= len(ranks):
        raise CheckpointError(f"{path} was saved by {len(ranks)} processes; cannot resume with more")
    set_rng_state(ranks[rank])
    return ckpt["state"]
