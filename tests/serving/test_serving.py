"""serve.py as a client meets it: the real server (uvicorn on a free port of 127.0.0.1) on the tiny model.
Every route, every bad input, concurrent clients, a client that goes away, SIGTERM with a request in flight;
the batcher in-process; and the page in a real browser (system Chromium, driven by Playwright)."""

import http.client
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason='the serve extra: pip install -e ".[serve]"')

from servers import LINES, Server, translate_py

from transformer.inference.translator import Translator
from transformer.serving.answers import answer_group, unpacked
from transformer.serving.batcher import Batcher, Job


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    running = Server(tiny_checkpoint)
    yield running
    assert running.stop() == 0


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_equal_translate_py_line_for_line_blank_lines_included(
    server, tiny_checkpoint, tmp_path, beam
):
    status, answer = server.translate(texts=LINES, beam=beam)
    assert status == 200
    assert [entry["text"] for entry in answer["translations"]] == translate_py(
        tiny_checkpoint, LINES, tmp_path, "--beam", str(beam)
    )
    assert answer["translations"][1] == {"text": ""}


def test_constraints_equal_translate_py_s_and_a_text_without_any_is_translated_as_without(
    server, tiny_checkpoint, tmp_path
):
    texts = [{"text": LINES[0], "constraints": ["red hat", "dog"]}, {"text": LINES[2], "prefix": ""}]
    status, answer = server.translate(texts=texts, beam=4, with_scores=True)
    assert status == 200
    (tmp_path / "terms.txt").write_text("red hat\tdog\n\n", encoding="utf-8")
    expected = translate_py(tiny_checkpoint, [LINES[0], LINES[2]], tmp_path, "--beam", "4", "--with-scores",
                            "--constraints", str(tmp_path / "terms.txt"))  # fmt: skip
    got = [f"{entry['score']:.6f}\t{entry['text']}" for entry in answer["translations"][:2]]
    assert got == expected and "red hat" in got[0] and "met" not in answer["translations"][0]
    status, nbest = server.translate(texts=texts[:1], beam=4, nbest=2)
    assert status == 200 and all("dog" in h["text"] for h in nbest["translations"][0])


def test_an_answer_whose_translation_misses_a_constraint_says_met_false(tiny_checkpoint, monkeypatch):
    def nothing_met(self, src_ids, settings, constraints, prefixes=None, nbest=1):
        return [[([5], -1.0, False)] for _ in src_ids]

    monkeypatch.setattr(Translator, "search_constrained", nothing_met)
    translator = Translator.from_checkpoint(tiny_checkpoint)
    (answers,) = answer_group(translator, [Job([LINES[0], LINES[2]], 4, constraints=[["dog"], []])])
    assert answers[0]["met"] is False and "met" not in answers[1]


@pytest.mark.parametrize(
    "constraints,message",
    [
        ([" "], "texts.0.constraints.0: no character the tokenizer keeps"),
        (["x"] * 9, "9 phrases, over the limit"),
    ],
)
def test_a_constraint_that_cannot_be_used_is_a_422_naming_it(server, constraints, message):
    status, answer = server.translate(texts=[{"text": LINES[0], "constraints": constraints}])
    assert status == 422 and message in answer["error"]


def test_scores_n_best_and_alignments_equal_translate_py(server, tiny_checkpoint, tmp_path):
    status, scored = server.translate(texts=LINES[:1], with_scores=True, alignments=True)
    assert status == 200
    expected = translate_py(
        tiny_checkpoint, LINES[:1], tmp_path, "--with-scores", "--alignments", str(tmp_path / "a")
    )
    log_prob, text = expected[0].split("\t")
    assert (
        scored["translations"][0]["text"] == text and f"{scored['translations'][0]['score']:.6f}" == log_prob
    )
    assert scored["translations"][0]["alignment"] == (tmp_path / "a").read_text().strip()
    status, nbest = server.translate(texts=LINES[:1], beam=4, nbest=3)
    rows = [
        line.split("\t")
        for line in translate_py(tiny_checkpoint, LINES[:1], tmp_path, "--beam", "4", "--nbest", "3")
    ]
    assert [(h["text"], f"{h['score']:.6f}") for h in nbest["translations"][0]] == [
        (r[4], r[3]) for r in rows
    ]


def test_attention_holds_every_layer_and_head_with_its_pieces(server, tiny_checkpoint):
    status, answer = server.translate(texts=LINES[:1], attention=True)
    attention = answer["translations"][0]["attention"]
    cross = unpacked(attention["cross"])  # (L, H, T, S)
    S, T = len(attention["source_pieces"]), len(attention["target_pieces"])
    assert attention["source_pieces"][-1] == "</s>" and cross.shape[2:] == (T, S)
    assert abs(cross.sum(-1) - 1.0).max() < 2e-3  # each row a distribution, in float16
    expected = Translator.from_checkpoint(tiny_checkpoint).attention(LINES[0]).cross  # per layer (H, T, S)
    assert cross.shape[:2] == (len(expected), expected[0].shape[0])
    assert all(abs(cross[i] - layer.numpy()).max() < 1e-3 for i, layer in enumerate(expected))


def test_health_the_model_description_and_the_openapi_schema(server):
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    status, schema = server.request("GET", "/openapi.json")
    assert status == 200 and "/translate" in schema["paths"] and "TranslateRequest" in json.dumps(schema)
    status, model = server.request("GET", "/model")
    assert status == 200 and (model["source_language"], model["target_language"]) == ("de", "en")
    assert (
        model["architecture"]["d_model"] == 32
        and model["vocab_size"] == 300
        and "beam_size" in model["evaluation"]
    )


@pytest.mark.parametrize(
    ("body", "status", "named"),
    [
        (b"not json", 422, "body: not valid JSON"),
        ({"texts": "Ein Hund."}, 422, "texts: Input should be a valid list"),
        ({"texts": []}, 422, "texts: List should have at least 1 item"),
        ({"texts": ["x" * 2001]}, 422, "texts.0: 2001 characters, over the limit of 2000"),
        ({"texts": ["x"] * 65}, 422, "texts: List should have at most 64 items"),
        ({"texts": ["x"], "beam": 2, "nbest": 3}, 422, "nbest: 3 is more than beam=2"),
        ({"texts": ["x"], "colour": "red"}, 422, "colour: unknown field"),
        ({"texts": ["x"], "beam": "4"}, 422, "beam: Input should be a valid integer"),
        ({"texts": ["x"], "prefix": ["A"]}, 422, "prefix: unknown field"),
        ({"texts": [{"prefix": "A"}]}, 422, "texts.0.text: Field required"),
        (
            {"texts": [{"text": "x", "constraints": "dog"}]},
            422,
            "texts.0.constraints: Input should be a valid list",
        ),
        (
            {"texts": [{"text": "x", "prefix": "", "colour": 1}]},
            422,
            "texts.0.colour: unknown field (known: text",
        ),
        ({"texts": [5]}, 422, 'texts.0: Input should be a string or {"text", "prefix", "constraints"}'),
        ({"texts": ["x", {"text": "y", "prefix": "A" * 2001}]}, 422, "texts.1.prefix: 2001 characters"),
        ({"texts": ["x"] * 5, "attention": True}, 422, "texts: 5 texts with attention, over the limit of 4"),
        ({"texts": ["x" * 301], "attention": True}, 422, "texts.0: 301 characters, over the limit of 300"),
        ({"texts": ["x"], "beam": 2.5}, 422, "beam: Input should be a valid integer"),
        (b'{"texts": ["x \\ud800"]}', 422, "texts.0: not valid Unicode (a lone surrogate U+D800"),
        (b"\xff\xfe{}", 422, "body: not valid JSON"),
    ],
)
def test_bad_input_gets_a_4xx_naming_the_field_and_the_service_goes_on(server, body, status, named):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, answer = server.request("POST", "/translate", raw=raw)
    assert got == status and named in answer["error"], answer
    assert server.translate(texts=["Ein Hund."])[0] == 200


def test_a_body_over_the_limit_is_refused_before_it_is_read(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.putrequest("POST", "/translate")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(1 << 30))  # a gigabyte announced, none of it sent
    connection.endheaders()
    response = connection.getresponse()
    assert response.status == 413 and "over the limit" in json.loads(response.read())["error"]
    connection.close()


def test_concurrent_clients_each_get_their_own_lines_back(server, tiny_checkpoint, tmp_path):
    sentences = [f"{line} {n}" for n in range(10) for line in LINES if line]  # 30 distinct sentences
    expected = dict(zip(sentences, translate_py(tiny_checkpoint, sentences, tmp_path)))

    def client(k: int) -> list[tuple[str, str]]:
        mine = [sentences[(k + i) % len(sentences)] for i in range(10)]
        return [(text, server.translate(texts=[text])[1]["translations"][0]["text"]) for text in mine]

    with ThreadPoolExecutor(32) as pool:  # 32 clients x 10 requests, every call with a 60 s timeout
        answers = [pair for pairs in pool.map(client, range(32)) for pair in pairs]
    assert len(answers) == 320 and all(expected[text] == got for text, got in answers)


def test_a_client_that_goes_away_does_not_break_the_others(server):
    server.abandon({"texts": LINES * 8, "beam": 4})
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: server.translate(texts=LINES)[0], range(4)))
    assert statuses == [200] * 4


def test_sigterm_answers_the_request_in_flight_then_exits(tiny_checkpoint):
    doomed = Server(tiny_checkpoint)
    answer = {}
    request = threading.Thread(target=lambda: answer.update(r=doomed.translate(texts=LINES * 16, beam=4)))
    request.start()
    time.sleep(0.3)  # the request is in the worker's hands
    doomed.process.send_signal(signal.SIGTERM)
    request.join(timeout=120)
    assert answer["r"][0] == 200 and len(answer["r"][1]["translations"]) == len(LINES) * 16
    assert doomed.stop() == 0


def test_the_batcher_decodes_what_arrives_together_as_one_batch_and_skips_cancelled_callers(tiny_checkpoint):
    batcher = Batcher(lambda: Translator.from_checkpoint(tiny_checkpoint), max_wait_ms=300)
    translator = batcher.start()
    batcher.last_batch = 2  # as under load: the next batch gathers
    jobs = [Job([line], 1) for line in LINES * 2]
    gone = Job([LINES[0]], 1)
    gone.future.cancel()
    futures = [batcher.submit(job) for job in [*jobs[:4], gone, *jobs[4:]]]
    results = [f.result(timeout=60) for f in futures if not f.cancelled()]
    batcher.stop()
    assert (batcher.batches, batcher.last_batch) == (1, 8)  # every live job in one batch, not the cancelled
    assert batcher.last_decode > 0  # what the next batch's gathering window is sized by
    assert [r[0]["text"] for r in results] == translator.translate(LINES * 2)


# ------------------------------------------------------------------------------------------- the page


def chromium() -> str:
    for path in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
        if Path(path).is_file():
            return path
    pytest.skip(
        "no Chromium: install it (Debian/Ubuntu: sudo apt install chromium) for the page's browser test"
    )


def test_the_page_s_terms_are_the_api_s_constraints(server):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    status, api = server.translate(
        texts=[{"text": LINES[0], "constraints": ["red hat", "dog"]}], with_scores=True
    )
    assert status == 200 and "red hat" in api["translations"][0]["text"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(f"http://127.0.0.1:{server.port}/")
        page.fill("#texts", LINES[0])
        page.fill("#constraints", " red hat ; dog ;")
        page.click("#translate")
        page.wait_for_selector("table.heatmap td", timeout=30000)
        assert page.inner_text("#results li.translation").startswith(api["translations"][0]["text"])
        browser.close()


def test_the_page_translates_and_draws_the_cross_attention_of_the_api(server, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    status, api = server.translate(texts=[LINES[0]], with_scores=True, alignments=True, attention=True)
    cross = unpacked(api["translations"][0]["attention"]["cross"]).tolist()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1200, "height": 1000})
        page.goto(f"http://127.0.0.1:{server.port}/")
        page.fill("#texts", LINES[0])
        page.click("#translate")
        page.wait_for_selector("table.heatmap td", timeout=30000)
        assert page.inner_text("#results li.translation").startswith(api["translations"][0]["text"])

        def drawn() -> list[list[float]]:
            cells = page.eval_on_selector_all(
                "table.heatmap td",
                "cells => cells.map(c => [+c.dataset.row, +c.dataset.col, +c.dataset.value])",
            )
            T, S = len(cross[0][0]), len(cross[0][0][0])
            grid = [[0.0] * S for _ in range(T)]
            for t, s, value in cells:
                grid[int(t)][int(s)] = value
            return grid

        for layer in range(len(cross)):
            page.select_option("#layer", str(layer))
            page.select_option("#head", "0")
            assert close(drawn(), cross[layer][0])
            page.select_option("#head", "mean")
            heads = cross[layer]
            mean = [
                [sum(h[t][s] for h in heads) / len(heads) for s in range(len(heads[0][0]))]
                for t in range(len(heads[0]))
            ]
            assert close(drawn(), mean)
        assert page.locator("#links line").count() == len(api["translations"][0]["alignment"].split())
        page.hover("table.heatmap td[data-row='0'][data-col='0']")
        assert page.locator("th.lit").count() == 2  # the target and the source piece of the cell
        page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
        browser.close()
    assert (tmp_path / "page.png").stat().st_size > 10_000


def close(a: list[list[float]], b: list[list[float]]) -> bool:
    return all(abs(x - y) < 1e-4 for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b)) and len(
        a
    ) == len(b)


def test_a_batch_gathers_longer_after_a_long_decode(monkeypatch):
    """Under load the callers of the last batch send again while the next one gathers: the window grows to
    GATHER_SHARE of the last decoding time (a fake clock; a job arrives every 20 ms, within max_wait)."""
    import transformer.serving.batcher as batcher_module

    clock = {"now": 0.0}

    class Arrivals:  # a job every 20 ms, for ever
        def get(self, timeout=None):
            clock["now"] += 0.020
            return Job(["Hund"], 1)

        def get_nowait(self):
            return self.get()

        def empty(self):
            return False

    monkeypatch.setattr(batcher_module.time, "monotonic", lambda: clock["now"])
    batcher = Batcher(lambda: None, max_wait_ms=25, max_tokens=10**6)
    batcher.jobs, batcher.last_batch = Arrivals(), 2
    assert len(batcher._gather()) == 6  # the first job, then 4 x 25 ms = 100 ms of arrivals every 20 ms
    batcher.last_decode = 2.0
    window = batcher_module.GATHER_SHARE * 2.0
    assert abs(len(batcher._gather()) - (1 + window / 0.020)) <= 1 and window > 0.1


def test_the_page_asks_for_the_key_once_then_translates_and_opens_docs(tiny_checkpoint):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the dev extra)")
    key = "schlüssel"
    guarded = Server(tiny_checkpoint, "--api-key-env", "TEST_TRANSLATE_KEY", env={"TEST_TRANSLATE_KEY": key})
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            page = browser.new_page()
            sent = []  # the Authorization header of each POST /translate
            page.on(
                "request",
                lambda r: r.url.endswith("/translate") and sent.append(r.headers.get("authorization")),
            )
            page.goto(f"http://127.0.0.1:{guarded.port}/")
            page.wait_for_selector("#key-form:not([hidden])", timeout=30000)  # /model answered 401
            page.fill("#key", key)
            page.click("#key-form button")
            page.wait_for_function("document.querySelector('#model').textContent.includes('de → en')")
            page.fill("#texts", LINES[0])
            page.click("#translate")
            page.wait_for_selector("table.heatmap td", timeout=30000)
            assert len(sent) == 1 and sent[0].startswith("Bearer ")
            page.reload()  # the key is kept for the tab: not asked again
            page.wait_for_function("document.querySelector('#model').textContent.includes('de → en')")
            assert page.is_hidden("#key-form")
            page.goto(f"http://127.0.0.1:{guarded.port}/docs")  # the cookie the page set carries the key
            page.wait_for_selector("text=/translate", timeout=30000)
            browser.close()
    finally:
        assert guarded.stop() == 0
