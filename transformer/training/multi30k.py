"""Multi30k task 1, the default corpus: where its files are, fetching them, checking them.

The one rule for where the files are, used by train.py, the benches and the tests alike:

    1. an explicit folder: train.py's --data-dir (make's DATA_DIR=), or data.data_dir in a config;
    2. else the MULTI30K_DIR environment variable;
    3. else the user's data folder, $XDG_DATA_HOME/transformer-mt/multi30k (by default
       ~/.local/share/transformer-mt/multi30k), where missing files are downloaded from MULTI30K_URL
       (default: the public multi30k/dataset repository) and checked against their SHA-256 sums.

A folder named by 1 or 2 is only read, never written. Every file, wherever it comes from, must match its sum
in ``multi30k_sha256sums.txt``. ``python -m transformer.training.multi30k`` (``make data``) fetches and
checks all twelve files before anything else runs.
"""

import argparse
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from transformer.runtime.lines import DataError
from transformer.training.corpus import Corpus, check_languages, load_parallel_text
from transformer.training.token_store import file_digest

LANGUAGES = ("en", "de", "fr", "cs")
FILE_STEMS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}  # split: file stem
DEFAULT_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
HOW_TO_PROVIDE = (
    "provide the files with --data-dir DIR (make ... DATA_DIR=DIR) or MULTI30K_DIR=DIR, "
    "or a reachable mirror with MULTI30K_URL=URL (see data/README.md)"
)


def file_names(langs: tuple[str, ...] = LANGUAGES) -> list[str]:
    """The raw files of these languages: train.de.gz, val.de.gz, test_2016_flickr.de.gz, ..."""
    return [f"{stem}.{lang}.gz" for stem in FILE_STEMS.values() for lang in langs]


def sha256sums() -> dict[str, str]:
    """{file name: hex digest} from the `sha256sum`-format file shipped next to this module."""
    text = Path(__file__).with_name("multi30k_sha256sums.txt").read_text(encoding="utf-8")
    return {name: digest for digest, name in (line.split() for line in text.splitlines() if line)}


def default_dir() -> Path:
    """Where the corpus is downloaded unless a folder is named: the user's data folder (XDG's rule), never
    the installed package or the current folder."""
    data_home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(data_home).expanduser() / "transformer-mt" / "multi30k"


def locate(data_dir: str | Path | None = None) -> tuple[Path, bool]:
    """(folder, downloadable): the rule above. Only the default folder is downloaded into."""
    named = data_dir if data_dir is not None else os.environ.get("MULTI30K_DIR") or None
    if named is not None:
        return Path(named).expanduser(), False
    return default_dir(), True


def base_url() -> str:
    url = os.environ.get("MULTI30K_URL") or DEFAULT_URL
    return url if url.endswith("/") else url + "/"


def check_sha256(path: Path, expected: str, name: str | None = None) -> None:
    actual = file_digest(path)
    if actual != expected:
        raise DataError(
            f"{name or path}: SHA-256 mismatch, expected {expected}, got {actual} "
            "(a truncated or different file?)"
        )


def download(url: str, path: Path, expected_sha256: str, progress: bool = True) -> None:
    """Fetch ``url`` into ``path``: the bytes go to a temp file beside it, checked, then renamed.

    An interrupted, failed or corrupted transfer leaves no ``path`` and no temp file behind.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=size, unit="B", unit_scale=True, desc=path.name, disable=not progress) as bar:
                while chunk := response.read(1 << 16):
                    out.write(chunk)
                    bar.update(len(chunk))
            if size is not None and bar.n != size:  # http.client ends a cut transfer quietly
                raise DataError(f"cannot download {url}: interrupted after {bar.n} of {size} bytes, not kept")
        check_sha256(Path(tmp_name), expected_sha256, name=f"{url} (not kept)")
        os.replace(tmp_name, path)
    except urllib.error.HTTPError as error:  # the server answered: its status
        reason = f"HTTP {error.code} {error.reason}"
        raise DataError(f"cannot download {url}: {reason}; {HOW_TO_PROVIDE}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:  # no (whole) answer
        reason = getattr(error, "reason", None) or f"{type(error).__name__} {error}".strip()
        raise DataError(f"cannot download {url}: {reason}; {HOW_TO_PROVIDE}") from None
    finally:
        Path(tmp_name).unlink(missing_ok=True)


def fetch(names: list[str], directory: Path, downloadable: bool, progress: bool = True) -> list[Path]:
    """The verified paths of ``names`` in ``directory``, downloading the missing ones if allowed.

    A file already there is checked, never fetched again; a file there with the wrong sum is an error.
    """
    expected = sha256sums()
    paths = []
    for name in names:
        path = directory / name
        if not path.is_file():
            if not downloadable:
                raise DataError(f"{path}: file not found (a Multi30k folder holds {', '.join(names)})")
            download(base_url() + name, path, expected[name], progress)
        check_sha256(path, expected[name])
        paths.append(path)
    return paths


def load_multi30k(src_lang: str = "de", tgt_lang: str = "en", data_dir: str | Path | None = None) -> Corpus:
    """Multi30k task 1: train 29000, validation 1014, test (test_2016_flickr) 1000 sentence pairs."""
    check_languages(src_lang, tgt_lang, valid=LANGUAGES)
    directory, downloadable = locate(data_dir)
    paths = fetch(file_names((src_lang, tgt_lang)), directory, downloadable)
    by_split = dict(zip(FILE_STEMS, zip(paths[0::2], paths[1::2])))  # names run split by split, src then tgt
    return load_parallel_text(by_split)


def main(argv: list[str] | None = None) -> int:
    """``make data``: all twelve files present and verified, or one line saying why not (exit 1)."""
    parser = argparse.ArgumentParser(prog="python -m transformer.training.multi30k", description=main.__doc__)
    parser.add_argument(
        "--data-dir", help="a folder with the files (else $MULTI30K_DIR, else your data folder)"
    )
    args = parser.parse_args(argv)
    directory, downloadable = locate(args.data_dir)
    try:
        fetch(file_names(), directory, downloadable, progress=True)
    except DataError as error:
        print(f"error: Multi30k: {error}", file=sys.stderr)
        return 1
    print(f"Multi30k: the 12 files in {directory} match their SHA-256 sums")
    return 0


if __name__ == "__main__":
    sys.exit(main())
