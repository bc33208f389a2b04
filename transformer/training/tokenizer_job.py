"""SentencePiece training in its own process, so that the training process never holds the trainer's memory.

    python -m transformer.training.tokenizer_job PREFIX VOCAB_SIZE TYPE COVERAGE SAMPLE SYMBOLS FILE ...

learns from the lines of the FILEs in order (plain or `.gz`, ``corpus.iter_lines``' rules) and writes
PREFIX.model / PREFIX.vocab (``tokenizer.train_tokenizer``); SYMBOLS: user-defined pieces, comma-separated
(none: an empty argument). The memory SentencePiece takes (most of a GB
for a
2M-sentence sample) is given back to the system when this process ends; in the training process it would
stay and add to the peak of its first step. This module imports neither torch nor the model.
"""

import itertools
import subprocess
import sys
from pathlib import Path

from transformer.core.tokenizer import train_tokenizer
from transformer.training.corpus import DataError, iter_lines


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
