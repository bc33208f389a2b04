"""Text lines in and out for ``translate.py``: files, stdin (whole or a line at a time) and arguments, all
with the project's one line policy (``runtime/lines.py``: split on "\\n" only, invalid UTF-8 replaced with
a warning naming the line), and output streams written and flushed line by line, in UTF-8.
"""

import gzip
import io
import sys
import zlib
from pathlib import Path

from transformer.inference.translator import warn
from transformer.runtime.lines import split_lines


class InputError(RuntimeError):
    """An input, reference or output file cannot be used; the message says which and why."""


def read_text(path: str | None, what: str) -> tuple[list[str], str]:
    """The lines of a file (plain, or gzip if the name ends in `.gz`), or of stdin for None / '-'; and the
    name to use in messages."""
    if path is None or path == "-":
        return split_lines(sys.stdin.buffer.read(), "<stdin>", warn), "<stdin>"
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise InputError(f"cannot read {what} {path}: {error.strerror}") from None
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
            raise InputError(f"cannot read {what} {path}: corrupted gzip file ({error})") from None
    return split_lines(data, path, warn), path


def argument_lines(sentences: list[str]) -> list[str]:
    """One line per SENTENCE argument (a newline inside one is a space), with the same UTF-8 policy."""
    lines = []
    for n, sentence in enumerate(sentences, start=1):
        try:  # bytes the OS could not decode arrive as surrogate escapes
            data = sentence.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            data = sentence.encode("utf-8", "replace")
        text = data.decode("utf-8", errors="replace")
        if "\ufffd" in text and "\ufffd" not in sentence:
            warn(f"argument {n}: invalid UTF-8; undecodable bytes replaced by U+FFFD")
        lines.append(text.replace("\r", " ").replace("\n", " "))
    return lines


def stream_lines():
    """(line number, text) of each stdin line as soon as it arrives, with the same UTF-8 policy."""
    n = 0
    for data in iter(sys.stdin.buffer.readline, b""):
        n += 1
        # split_lines numbers the lines of its input: this one is line n of stdin
        renumbered = lambda m, n=n: warn(m.replace(" line 1:", f" line {n}:", 1))  # noqa: E731
        yield n, split_lines(data, "<stdin>", renumbered, starts_file=n == 1)[0]


def open_output(path: str | None, what: str):
    """A binary stream to write lines to: stdout for None / '-'; the file is created now."""
    if path is None or path == "-":
        sys.stdout.flush()
        return getattr(sys.stdout, "buffer", sys.stdout)  # UTF-8 whatever the locale says
    try:
        return open(path, "wb")
    except OSError as error:
        raise InputError(f"cannot write {what} {path}: {error.strerror}") from None


def write_lines(stream, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    stream.write(text if isinstance(stream, io.TextIOBase) else text.encode("utf-8"))
    stream.flush()
