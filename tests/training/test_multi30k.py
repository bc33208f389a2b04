"""Where Multi30k comes from (the one rule) and its download, end to end against a local HTTP server.

The server (the standard library's http.server on 127.0.0.1) serves a copy of the twelve files; a test may
corrupt a file, cut a transfer short, or stop the server, and the download must say so by name and leave
nothing behind that would later pass as valid.
"""

import http.server
import shutil
import threading
from pathlib import Path

import pytest

from transformer.runtime.lines import DataError
from transformer.training import multi30k
from transformer.training.corpus import read_lines
from transformer.training.multi30k import load_multi30k
from transformer.training.token_store import file_digest


class MirrorHandler(http.server.SimpleHTTPRequestHandler):
    """Serves ``server.root``; a file named in ``server.cut_short`` is announced whole but sent half."""

    def translate_path(self, path: str) -> str:
        return str(self.server.root / Path(path).name)

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.requests.append(Path(self.path).name)
        name = Path(self.path).name
        if name not in self.server.cut_short:
            return super().do_GET()
        data = (self.server.root / name).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])  # then the connection closes: an interrupted transfer
        self.close_connection = True

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def server(multi30k_dir, tmp_path, monkeypatch):
    """A mirror of the twelve files on 127.0.0.1; MULTI30K_URL points at it, the download folder is tmp."""
    root = tmp_path / "served"
    root.mkdir()
    for name in multi30k.file_names():
        shutil.copy(multi30k_dir / name, root / name)
        (root / name).chmod(0o644)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MirrorHandler)
    httpd.root, httpd.cut_short, httpd.requests = root, set(), []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    monkeypatch.setenv("MULTI30K_URL", f"http://127.0.0.1:{httpd.server_address[1]}/raw")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def download_dir() -> Path:
    return multi30k.default_dir()


def error_line(stderr: str) -> str:
    """The one error line after the progress bars of the files that did arrive."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_the_rule_flag_then_environment_then_the_users_data_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "env"))
    assert multi30k.locate(tmp_path / "flag") == (tmp_path / "flag", False)
    assert multi30k.locate() == (tmp_path / "env", False)
    monkeypatch.delenv("MULTI30K_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert multi30k.locate() == (tmp_path / "xdg" / "transformer-mt" / "multi30k", True)
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert multi30k.locate() == (tmp_path / "home" / ".local/share/transformer-mt/multi30k", True)


def test_a_full_download_verifies_every_file_and_nothing_is_fetched_twice(server, capsys):
    assert multi30k.main([]) == 0
    names = multi30k.file_names()
    assert sorted(server.requests) == sorted(names)
    assert sorted(path.name for path in download_dir().iterdir()) == sorted(names)  # no temp file left
    expected = multi30k.sha256sums()
    assert all(file_digest(download_dir() / name) == expected[name] for name in names)
    assert "match their SHA-256 sums" in capsys.readouterr().out

    server.requests.clear()
    assert multi30k.main([]) == 0
    corpus = multi30k.load_multi30k("cs", "fr")
    assert server.requests == []  # already there and verified: not fetched again
    assert [len(split) for split in corpus.values()] == [29000, 1014, 1000]


def test_load_fetches_only_the_pair_it_reads(server):
    multi30k.load_multi30k("de", "en")
    assert sorted(server.requests) == sorted(multi30k.file_names(("de", "en")))


def test_a_corrupted_file_is_named_and_not_kept(server, capsys):
    (server.root / "val.fr.gz").write_bytes(b"not the Multi30k file")
    assert multi30k.main([]) == 1
    error = error_line(capsys.readouterr().err)
    assert "val.fr.gz (not kept): SHA-256 mismatch, expected" in error
    assert not (download_dir() / "val.fr.gz").exists()
    assert all(path.name.endswith(".gz") for path in download_dir().iterdir())  # no .part file


def test_an_interrupted_transfer_leaves_no_file_that_passes_later(server, capsys):
    server.cut_short.add("train.en.gz")
    assert multi30k.main([]) == 1
    assert "train.en.gz: interrupted after 284" in error_line(capsys.readouterr().err)
    assert not (download_dir() / "train.en.gz").exists()
    assert all(path.name.endswith(".gz") for path in download_dir().iterdir())

    server.cut_short.clear()  # the next try fetches the file again, whole
    assert multi30k.main([]) == 0
    assert server.requests.count("train.en.gz") == 2


def test_a_missing_file_on_the_server_names_the_url(server):
    (server.root / "test_2016_flickr.cs.gz").unlink()
    url = multi30k.base_url() + "test_2016_flickr.cs.gz"
    with pytest.raises(DataError, match=f"cannot download {url}: HTTP 404"):
        multi30k.load_multi30k("en", "cs")


def test_an_unreachable_server_is_one_line_naming_the_ways_to_provide_the_data(server, capsys):
    port = server.server_address[1]
    server.shutdown()
    server.server_close()
    assert multi30k.main([]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    assert error.startswith(f"error: Multi30k: cannot download http://127.0.0.1:{port}/raw/train.en.gz")
    for way in ("--data-dir DIR", "DATA_DIR=DIR", "MULTI30K_DIR=DIR", "MULTI30K_URL=URL"):
        assert way in error
    assert not download_dir().exists() or not any(download_dir().iterdir())


def test_a_named_folder_is_only_read_never_downloaded_into(server, tmp_path, capsys):
    assert multi30k.main(["--data-dir", str(tmp_path / "empty")]) == 1
    assert "train.en.gz: file not found" in capsys.readouterr().err
    assert server.requests == []


# -------- the local files ------------------------------------------------------------------------


def test_multi30k_de_en(de_en, multi30k_dir):
    assert {split: len(ds) for split, ds in de_en.items()} == {
        "train": 29000,
        "validation": 1014,
        "test": 1000,
    }
    train = de_en["train"]
    assert (train.src[0], train.tgt[0]) == (
        read_lines(multi30k_dir / "train.de.gz")[0],
        read_lines(multi30k_dir / "train.en.gz")[0],
    )
    assert train.src[0].startswith("Zwei junge weiße Männer")


def test_multi30k_other_direction_from_env(multi30k_dir, monkeypatch):
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    fr_cs = load_multi30k("fr", "cs")
    assert [len(ds) for ds in fr_cs.values()] == [29000, 1014, 1000]
    assert fr_cs["test"].src[5] == read_lines(multi30k_dir / "test_2016_flickr.fr.gz")[5]
    assert fr_cs["test"].tgt[5] == read_lines(multi30k_dir / "test_2016_flickr.cs.gz")[5]


@pytest.mark.parametrize(
    ("src_lang", "tgt_lang", "message"),
    [("es", "en", "'es' not available; valid: en, de, fr, cs"), ("de", "de", "both 'de'")],
)
def test_multi30k_bad_language(multi30k_dir, src_lang, tgt_lang, message):
    with pytest.raises(DataError, match=message):
        load_multi30k(src_lang, tgt_lang, data_dir=multi30k_dir)


def copy_mirror(source: Path, target: Path, langs=("de", "en")) -> Path:
    target.mkdir()
    for stem in ("train", "val", "test_2016_flickr"):
        for lang in langs:
            shutil.copy(source / f"{stem}.{lang}.gz", target / f"{stem}.{lang}.gz")
    return target


def test_multi30k_checksum_mismatch(multi30k_dir, tmp_path):
    mirror = copy_mirror(multi30k_dir, tmp_path / "mirror")
    (mirror / "val.en.gz").chmod(0o644)
    with open(mirror / "val.en.gz", "ab") as f:
        f.write(b"\0")
    message = r"val\.en\.gz: SHA-256 mismatch, expected 14f7d2\w+, got \w+"
    with pytest.raises(DataError, match=message):
        load_multi30k("de", "en", data_dir=mirror)


def test_multi30k_missing_file(multi30k_dir, tmp_path):
    mirror = copy_mirror(multi30k_dir, tmp_path / "mirror")
    (mirror / "test_2016_flickr.de.gz").unlink()
    with pytest.raises(DataError, match=r"test_2016_flickr\.de\.gz: file not found"):
        load_multi30k("de", "en", data_dir=mirror)
