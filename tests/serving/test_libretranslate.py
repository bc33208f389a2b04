"""LibreTranslate's API under /libretranslate/, as its clients use it: a client library from the package
index (libretranslatepy: form bodies, the key as api_key), JSON with a list, the query string alone, a
repeated form field; LibreTranslate's error shape and statuses. The answers are translate.py's lines."""

import urllib.error
import urllib.parse

import pytest
from servers import LINES, Server, translate_py

pytest.importorskip("fastapi", reason='the serve extra: pip install -e ".[serve]"')
libretranslatepy = pytest.importorskip("libretranslatepy", reason='the dev extra: pip install -e ".[dev]"')

KEY = "lt-key"


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    running = Server(tiny_checkpoint, "--api-key-env", "TEST_LT_KEY", env={"TEST_LT_KEY": KEY})
    yield running
    assert running.stop() == 0


@pytest.fixture(scope="module")
def expected(tiny_checkpoint, tmp_path_factory) -> list[str]:
    return translate_py(tiny_checkpoint, LINES, tmp_path_factory.mktemp("lt"))


def test_a_libretranslate_client_library_gets_translate_py_s_lines(server, expected):
    client = libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{server.port}/libretranslate", KEY)
    lines = [(line, translation) for line, translation in zip(LINES, expected) if line]
    assert [client.translate(line, "de", "en") for line, _ in lines] == [t for _, t in lines]
    assert [client.translate(line, "auto", "en") for line, _ in lines] == [t for _, t in lines]
    with pytest.raises(urllib.error.HTTPError) as empty:  # as LibreTranslate: an empty q is a missing one
        client.translate("", "de", "en")
    assert empty.value.code == 400
    assert client.languages() == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": []},
    ]
    with pytest.raises(urllib.error.HTTPError) as refused:
        libretranslatepy.LibreTranslateAPI(
            f"http://127.0.0.1:{server.port}/libretranslate", "wrong"
        ).translate(LINES[0], "de", "en")
    assert refused.value.code == 403


def test_json_with_a_list_and_source_auto(server, expected):
    body = {"q": LINES, "source": "auto", "target": "en", "format": "text", "api_key": KEY}
    status, answer = server.request("POST", "/libretranslate/translate", body)
    assert status == 200 and answer["translatedText"] == expected
    assert answer["detectedLanguage"] == [{"language": "de", "confidence": 100.0}] * len(LINES)


def test_the_query_string_alone_and_a_repeated_form_field(server, expected):
    query = urllib.parse.urlencode({"q": LINES[0], "source": "de", "target": "en", "api_key": KEY})
    status, answer = server.request(
        "POST", f"/libretranslate/translate?{query}", raw=b"", headers={"Content-Type": ""}
    )
    assert (status, answer) == (200, {"translatedText": expected[0]})
    form = urllib.parse.urlencode([("q", LINES[0]), ("q", LINES[2]), ("source", "de"), ("target", "en")])
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Authorization": f"Bearer {KEY}"}
    status, answer = server.request("POST", "/libretranslate/translate", raw=form.encode(), headers=headers)
    assert (status, answer) == (200, {"translatedText": [expected[0], expected[2]]})


def test_alternatives_are_the_rest_of_translate_py_s_n_best_list(server, tiny_checkpoint, tmp_path):
    body = {"q": LINES[0], "source": "de", "target": "en", "alternatives": 2, "api_key": KEY}
    status, answer = server.request("POST", "/libretranslate/translate", body)
    nbest = [
        row.split("\t")[4]
        for row in translate_py(tiny_checkpoint, LINES[:1], tmp_path, "--beam", "3", "--nbest", "3")
    ]
    assert status == 200 and [answer["translatedText"], *answer["alternatives"]] == nbest


def test_json_nested_too_deep_is_a_400_not_a_500(server):
    deep = b'{"q": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert server.request("POST", "/libretranslate/translate", raw=deep) == (
        400,
        {"error": "Invalid JSON format"},
    )
    status, answer = server.request("POST", "/translate", raw=b'{"texts": ' + b"[" * 200_000)
    assert status == 422 and answer["error"].startswith("body: not valid JSON")


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        ({"source": "de", "target": "en"}, 400, "Invalid request: missing q parameter"),
        ({"q": "x", "target": "en"}, 400, "Invalid request: missing source parameter"),
        (
            {"q": "x", "source": "de", "target": "fr"},
            400,
            "fr is not supported as target: this model translates de to en",
        ),  # fmt: skip
        ({"q": "x", "source": "cs", "target": "en"}, 400, "cs is not supported as source"),
        ({"q": "x", "source": "de", "target": "en", "format": "html"}, 400, "html format is not supported"),
        ({"q": ["x"] * 65, "source": "de", "target": "en"}, 400, "65 texts in q, over the limit of 64"),
        (
            {"q": "x" * 2001, "source": "de", "target": "en"},
            400,
            "q has 2001 characters, over the limit of 2000",
        ),
        ({"q": [1], "source": "de", "target": "en"}, 400, "q must be a string or a list of strings"),
        (
            {"q": "x", "source": "de", "target": "en", "alternatives": 16},
            400,
            "alternatives must be a number",
        ),
        ({"q": "x", "source": "de", "target": "en", "alternatives": "²"}, 400, "alternatives must be"),
        ({"q": "", "source": "de", "target": "en"}, 400, "Invalid request: missing q parameter"),
        ({"q": [], "source": "de", "target": "en"}, 400, "Invalid request: missing q parameter"),
    ],
)
def test_errors_in_libretranslate_s_shape_and_statuses(server, body, status, error):
    got, answer = server.request("POST", "/libretranslate/translate", {**body, "api_key": KEY})
    assert got == status and set(answer) == {"error"} and error in answer["error"], answer
    missing = {"q": "x", "source": "de", "target": "en"}
    assert server.request("POST", "/libretranslate/translate", missing)[1] == {
        "error": "Please contact the server operator to get an API key"
    }


def test_the_readme_s_client_example_works_as_written(server, tiny_checkpoint, tmp_path):
    from helpers import ROOT

    for doc in ("README.md", "docs/serving.md"):
        lines = (ROOT / doc).read_text("utf-8").splitlines()
        example = next(line for line in lines if line.startswith('LibreTranslateAPI("http://127.0.0.1:8000/'))
        code = example.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}").replace('"KEY"', repr(KEY))
        got = eval(code, {"LibreTranslateAPI": libretranslatepy.LibreTranslateAPI})  # noqa: S307 -- our docs
        assert got == translate_py(tiny_checkpoint, ["Ein Hund."], tmp_path)[0], doc
