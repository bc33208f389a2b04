"""Lines of text: THE line policy of the project, for training files and for what ``translate.py`` reads.

Every error is a ``DataError`` that names the file and the line.
"""

from collections.abc import Callable


class DataError(ValueError):
    """A data file is missing, malformed, or not the file we expected; the message names it."""


BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark: editors on Windows start files with it; never part of line 1


def split_lines(
    data: bytes, name: str, warn: Callable[[str], None] | None = None, starts_file: bool = True
) -> list[str]:
    """Bytes -> lines, THE line reader of the project (training files and translate.py's input).

    Split on "\\n" alone, not with ``str.splitlines``, which also breaks at "\\x0b", "\\x1c", "\\u2028", ...
    and would silently misalign a parallel corpus; a trailing "\\r" is dropped, and a byte-order mark at the
    start of the file (``starts_file``: ``data`` is its beginning). Invalid UTF-8 is a ``DataError`` naming
    the line, or, given ``warn``, replaced by U+FFFD with a warning naming the line.
    """
    if starts_file:
        data = data.removeprefix(BOM)
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline that ends the last line does not start another one
    return [decode_line(line, n, name, warn) for n, line in enumerate(lines, start=1)]


def decode_line(line: bytes, n: int, name: str, warn: Callable[[str], None] | None = None) -> str:
    """Line ``n`` of ``name`` (without its "\n") as text, a trailing "\r" dropped: ``split_lines``'s rules."""
    line = line.removesuffix(b"\r")
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        if warn is None:
            raise DataError(f"{name}: line {n} is not valid UTF-8 ({error.reason})") from error
        warn(f"{name} line {n}: invalid UTF-8 ({error.reason}); undecodable bytes replaced by U+FFFD")
        return line.decode("utf-8", errors="replace")
