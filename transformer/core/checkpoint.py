"""Checkpoints: plain dicts of tensors and primitives, written atomically, read with ``weights_only=True``.

A checkpoint carries everything needed to rebuild the model and tokenizer alone: the resolved config, the
model's state (unwrapped: no ``module.`` / ``_orig_mod.`` prefixes), the tokenizer as bytes (our
SentencePiece model, or a Marian model's files); a training run's also hold what resuming needs.
"""

import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

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
    """A checkpoint's ``tokenizer`` tensor -> the tokenizer (``read_tokenizer`` of its bytes: ours, or a
    reader of other formats too); unreadable bytes are a ``CheckpointError`` that starts with ``where``."""
    try:
        return read_tokenizer(bytes(data.numpy().tobytes()))
    except (ValueError, RuntimeError, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{where}: its tokenizer cannot be read: {error}") from None
