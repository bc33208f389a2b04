"""Text lines in and out for ``translate.py``: files, stdin (whole or a line at a time) and arguments, all
with the project's one line policy (``runtime/lines.py``: split on "\\n" only, invalid UTF-8 replaced with
a warning naming the line), and output streams written and flushed line by line, in UTF-8.
"""

import gzip
import io
import sys
import zlib
from pathlib import Path

from transformer.inference.translator import Translator, warn
from transformer.runtime.lines import split_lines
from transformer.runtime.usage import UsageError


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


def read_prefixes(args, translator: Translator, n_lines: int) -> list[list[int]] | None:
    """The target-side ids each translation starts with: --prefix-text for every line, or the --prefix
    file's line ([] for an empty one); None without either."""
    if args.prefix_text is not None:
        return translator.encode_targets([args.prefix_text], "--prefix-text") * n_lines
    if args.prefix is None:
        return None
    prefixes, name = read_text(args.prefix, "--prefix")
    if len(prefixes) != n_lines:
        raise InputError(f"--prefix {name} has {len(prefixes)} lines but the input has {n_lines}")
    return translator.encode_targets(prefixes, name.replace("{", "{{").replace("}", "}}") + " line {n}")


def read_constraints(args, translator: Translator, n_lines: int) -> list[list[list[int]]] | None:
    """The target phrases each translation must hold, as ids: --constraint's for every line, then the
    --constraints file's line (phrases separated by tabs, an empty line for none); None without either.
    A UsageError names the file line or the phrase that cannot be used."""
    if not args.constraint and args.constraints is None:
        return None
    per_line, where = [[] for _ in range(n_lines)], "--constraint"
    if args.constraints is not None:
        lines, name = read_text(args.constraints, "--constraints")
        if len(lines) != n_lines:
            raise UsageError(f"--constraints {name} has {len(lines)} lines but the input has {n_lines}")
        per_line = [line.split("\t") if line.strip() else [] for line in lines]
        where = "--constraints " + name.replace("{", "{{").replace("}", "}}") + " line {n}"
    try:
        return translator.encode_constraints([list(args.constraint) + extra for extra in per_line], where)
    except ValueError as error:
        raise UsageError(str(error)) from None
