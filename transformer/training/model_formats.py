"""The one door from training and the ``Translator`` to ``interop/``: the model and tokenizer formats read
beside this project's own checkpoints. It imports neither torch nor ``interop/`` at import time: the
token store's worker processes read tokenizers through it. ``interop/`` (and, through it, ``transformers``)
is imported only when a released Marian model or a Marian tokenizer is met: the rest of the package never
imports it.

    released model     a Hugging Face Marian folder, or hf:NAME          (interop/released.py)
    Marian tokenizer   a zip of its files, inside a fine-tuned checkpoint (interop/marian_text.py)
"""

from pathlib import Path

from transformer.core.tokenizer import Tokenizer

HUB_PREFIX = "hf:"  # hf:NAME, a model of the Hugging Face Hub
ZIP_SIGNATURE = b"PK\x03\x04"  # a Marian tokenizer's bytes are a zip; ours are a SentencePiece proto


def is_released(path: str | Path) -> bool:
    """``hf:NAME``, or a folder that is not a run folder (our checkpoints are files)."""
    return str(path).startswith(HUB_PREFIX) or (
        Path(path).is_dir() and not (Path(path) / "best.pt").is_file()
    )


def read_tokenizer(data: bytes):
    """``to_bytes()`` of either kind of tokenizer -> the tokenizer: a SentencePiece model of this project
    (``Tokenizer``), or a released Marian model's own (``MarianText``: a run fine-tuned from such a model).
    One-line ``ValueError`` when it is neither."""
    if data[: len(ZIP_SIGNATURE)] == ZIP_SIGNATURE:
        from transformer.interop.marian_text import MarianText

        return MarianText.from_bytes(data)
    return Tokenizer.from_bytes(data)


def load_released(path: str | Path, device="cpu"):
    """A released model as (our model in eval mode, its tokenizer, a Config with default eval settings)."""
    from transformer.interop.released import load_released as load  # needs transformers

    from_hub = str(path).startswith(HUB_PREFIX)
    return load(str(path).removeprefix(HUB_PREFIX) if from_hub else path, device, from_hub)


def load_model(path: str | Path, device="cpu"):
    """Any model ``translate.py --checkpoint`` takes: a released one, a checkpoint of ours (whose tokenizer
    may be a Marian model's), or a run folder (its best.pt) -> (model in eval mode on ``device``, tokenizer,
    config)."""
    from transformer.core.checkpoint import load_for_inference  # torch: not for a tokenizing process

    if is_released(path):
        return load_released(path, device)
    if Path(path).is_dir():  # a run folder
        path = Path(path) / "best.pt"
    return load_for_inference(path, device, read_tokenizer)
