"""SentencePiece training in its own process, so that the training process never holds the trainer's memory.

    python -m transformer.training.tokenizer_job PREFIX VOCAB_SIZE TYPE COVERAGE SAMPLE SYMBOLS FILE ...

learns from the lines of the FILEs in order (plain or `.gz`, ``corpus.iter_lines``' rules) and writes
PREFIX.model / PREFIX.vocab (``train_tokenizer``); SYMBOLS: user-defined pieces, comma-separated
(none: an empty argument). The memory SentencePiece takes (most of a GB
for a
2M-sentence sample) is given back to the system when this process ends; in the training process it would
stay and add to the peak of its first step. This module imports neither torch nor the model.
"""

import itertools
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from transformer.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from transformer.runtime.lines import DataError
from transformer.training.corpus import iter_lines

MODEL_TYPES = ("bpe", "unigram", "char", "word")


def train_tokenizer(
    sentences: Iterable[str],
    model_prefix: str | Path,
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    input_sentence_size: int = 2_000_000,
    user_defined_symbols: tuple[str, ...] = (),
) -> "Tokenizer":
    """Train SentencePiece on `sentences`, write `<model_prefix>.model` / `.vocab`, and load it.

    `input_sentence_size` caps how many sentences (sampled at random) the trainer keeps in memory.
    `user_defined_symbols` become pieces of their own, each always one token (tags such as ``<2en>``).
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown model_type {model_type!r}; valid: {', '.join(MODEL_TYPES)}")
    if vocab_size <= EOS_ID + 1:
        raise ValueError(f"vocab_size {vocab_size} leaves no room beside 4 special ids")
    model_prefix = Path(model_prefix)
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_prefix=str(model_prefix),
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            user_defined_symbols=list(user_defined_symbols),
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=2,
            minloglevel=2,  # errors only: the trainer's progress log is thousands of lines
        )
    except RuntimeError as error:  # e.g. "Vocabulary size too high (9000). ... <= 5374."
        raise ValueError(
            f"SentencePiece training of {model_prefix} (vocab_size={vocab_size}) failed: {error}"
        ) from error
    return Tokenizer(model_prefix.with_name(model_prefix.name + ".model"))


def train_elsewhere(
    files: list[Path], prefix: Path, vocab_size: int, model_type: str, coverage: float, sample: int,
    symbols: tuple[str, ...] = (),
) -> None:  # fmt: skip
    """Run this module in a child process; its error (bad data, an impossible vocabulary) comes back as a
    ``DataError`` with the child's own message."""
    command = [sys.executable, "-m", "transformer.training.tokenizer_job", str(prefix), str(vocab_size),
               model_type, str(coverage), str(sample), ",".join(symbols), *map(str, files)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise DataError(
            lines[-1].removeprefix("error: ") if lines else f"SentencePiece training failed ({done})"
        )


def main(argv: list[str]) -> int:
    prefix, vocab_size, model_type, coverage, sample, symbols, *files = argv
    sentences = itertools.chain.from_iterable(iter_lines(path) for path in files)
    try:
        train_tokenizer(sentences, Path(prefix), int(vocab_size), model_type, float(coverage), int(sample),
                        tuple(filter(None, symbols.split(","))))  # fmt: skip
    except ValueError as error:  # DataError (a file, a line) or SentencePiece's own refusal
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
