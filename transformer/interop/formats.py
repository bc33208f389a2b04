"""The models a run or a ``Translator`` reads, and the one door to the rest of ``interop/``: this project's
own checkpoints and the formats read beside them. It imports neither torch nor another module of
``interop/`` at import time: the token store's worker processes read tokenizers through it. Those modules
(and, through them, ``transformers``) are imported only when a released Marian model or a Marian tokenizer
is met: the rest of the package never imports them.

    checkpoint of ours  config, weights and tokenizer                     (runtime/checkpoints.py)
    released model     a Hugging Face Marian folder, or hf:NAME          (interop/released.py)
    Marian tokenizer   a zip of its files, inside a fine-tuned checkpoint (interop/marian_text.py)
"""

import json
from pathlib import Path

from transformer.core.tokenizer import Tokenizer

HUB_PREFIX = "hf:"  # hf:NAME, a model of the Hugging Face Hub
ZIP_SIGNATURE = b"PK\x03\x04"  # a Marian tokenizer's bytes are a zip; ours are a SentencePiece proto


RUN_CHECKPOINTS = ("best.pt", "last.pt", "averaged.pt")  # a folder with one of these is a run folder


def is_released(path: str | Path) -> bool:
    """``hf:NAME``, or a folder that is not a run folder (our checkpoints are files)."""
    return str(path).startswith(HUB_PREFIX) or (
        Path(path).is_dir() and not any((Path(path) / name).is_file() for name in RUN_CHECKPOINTS)
    )


def run_checkpoint(folder: Path) -> tuple[Path, str]:
    """The checkpoint a run folder stands for, and how to say which: the one its final test scored
    (results.json's ``tested``: best.pt, or averaged.pt with ``eval.average_last``), else best.pt, else
    last.pt (a run stopped before its first evaluation: its latest weights)."""
    try:
        tested = json.loads((folder / "results.json").read_text(encoding="utf-8")).get("tested")
    except (OSError, ValueError, AttributeError):
        tested = None
    if isinstance(tested, str) and tested in RUN_CHECKPOINTS and (folder / tested).is_file():
        return folder / tested, f"{tested}, the checkpoint its final test scored"
    if (folder / "best.pt").is_file():
        return folder / "best.pt", "its best.pt"
    return folder / "last.pt", "its last.pt (the run has no evaluation yet: its latest weights)"


def run_folder_note(path: str | Path) -> str | None:
    """What the commands say on stderr when ``path`` is a run folder of ours: which checkpoint it stands
    for (``run_checkpoint``); None for anything else."""
    if not Path(path).is_dir() or is_released(path):
        return None
    return f"{path} is a run folder: using {run_checkpoint(Path(path))[1]}"


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
    may be a Marian model's), or a run folder (``run_checkpoint``) -> (model in eval mode on ``device``,
    tokenizer, config)."""
    from transformer.runtime.checkpoints import load_for_inference  # torch: not for a tokenizing process

    if is_released(path):
        return load_released(path, device)
    if Path(path).is_dir():  # a run folder
        path = run_checkpoint(Path(path))[0]
    return load_for_inference(path, device, read_tokenizer, build_model)


def build_model(config, tokenizer):
    """The model a run's ``Config`` describes, with random weights: the core's ``Transformer``, or a
    released Marian model's variant of it (``config.variant``, interop/variant.py)."""
    from transformer.interop.variant import build_model as build  # torch: not for a tokenizing process

    return build(config, tokenizer)


def target_tokenizer(tokenizer):
    """The tokenizer of target sentences: a released Marian model's own target side, else ``tokenizer``
    itself (the vocabulary is joint)."""
    return tokenizer.target_side if hasattr(tokenizer, "target_side") else tokenizer
