"""serve.py against careless and hostile callers: a job that fails fails alone, the queue and the answers
are bounded, callers who hang up cost nothing, keys are bytes, startup errors are one line, the defaults
are translate.py's, and the OpenAPI schema says exactly what is refused (schemathesis, the real server).
Every server is on 127.0.0.1; every loop is bounded in count and time."""

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
import torch
from servers import LINES, Server, translate_py

pytest.importorskip("fastapi", reason='the serve extra: pip install -e ".[serve]"')

from helpers import run_command

import transformer.serving.batcher as batcher_module
from transformer.commands import serve
from transformer.inference.translator import Translator
from transformer.serving.batcher import Batcher, Job, QueueFull

LONG = (
    "Ein Mann in einem roten Hemd und eine Frau mit einem blauen Hut gehen mit ihrem Hund durch den Park. "
    * 19
)[:1900]
HEAVY = {"texts": [LONG] * 64, "beam": 16}  # the largest request the default limits allow, about 2 s here


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    running = Server(tiny_checkpoint)
    yield running
    assert running.stop() == 0


# ---------------------------------------------------------------------------------------- isolation


def test_a_failing_job_fails_alone_and_its_batch_mates_get_their_answers(tiny_checkpoint):
    batcher = Batcher(lambda: Translator.from_checkpoint(tiny_checkpoint), max_wait_ms=300)
    translator = batcher.start()
    real_attention = translator.attention_ids
    broken = translator.encode([LINES[3]])[0]

    def attention_ids(source, *args):  # computing one text's attention fails
        if source == broken:
            raise RuntimeError("out of memory\nsecond line")
        return real_attention(source, *args)

    translator.attention_ids = attention_ids
    batcher.last_batch = 2  # as under load: the jobs below gather into one batch
    good = [Job([line], 1) for line in LINES]
    poison = Job(["x \ud800"], 1)  # what the door refuses (422), handed to the worker all the same
    attention_good, attention_bad = Job([LINES[0]], 1, attention=True), Job([LINES[3]], 1, attention=True)
    jobs = [good[0], poison, attention_good, good[1], attention_bad, *good[2:]]
    for job in jobs:
        batcher.submit(job)
    for job in jobs:
        job.future.exception(timeout=60)  # every job answered
    batcher.stop()
    assert batcher.batches == 1
    assert [job.future.result()[0]["text"] for job in good] == translator.translate(LINES)
    assert isinstance(poison.future.exception(), TypeError)  # SentencePiece's
    assert isinstance(attention_bad.future.exception(), RuntimeError)
    assert "attention" in attention_good.future.result()[0]


def test_a_poison_text_is_a_422_at_the_door_and_a_polite_request_beside_it_is_answered(
    server, tiny_checkpoint, tmp_path
):
    poison = b'{"texts": ["x \\ud800", "Ein Hund."]}'
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(server.request, "POST", "/translate", None, None, poison)
        good = pool.submit(server.translate, texts=LINES)
        (bad_status, bad_answer), (good_status, good_answer) = bad.result(), good.result()
    assert bad_status == 422 and "texts.0: not valid Unicode" in bad_answer["error"]
    assert good_status == 200
    assert [t["text"] for t in good_answer["translations"]] == translate_py(tiny_checkpoint, LINES, tmp_path)


# ------------------------------------------------------------------------------ bounded work and memory


def test_the_queue_refuses_past_max_queue_texts_at_once_then_serves_again(monkeypatch, tiny_checkpoint):
    gate, started = threading.Event(), threading.Event()
    real = batcher_module.answer_group

    def held(translator, jobs):  # the worker waits at the gate with its first batch
        started.set()
        gate.wait(timeout=60)
        return real(translator, jobs)

    monkeypatch.setattr(batcher_module, "answer_group", held)
    batcher = Batcher(lambda: Translator.from_checkpoint(tiny_checkpoint), max_queue=8)
    batcher.start()
    first = batcher.submit(Job(LINES[:1], 1))
    assert started.wait(timeout=60)  # taken: the queue is empty again
    queued = batcher.submit(Job(["Ein Hund."] * 5, 1))
    with pytest.raises(QueueFull) as full:
        batcher.submit(Job(["Eine Katze."] * 4, 1))  # 5 + 4 > 8
    assert 1 <= full.value.retry_after <= batcher_module.RETRY_AFTER_MAX
    assert "the limit is 8" in str(full.value)
    abandoned = Job(["Ein Vogel."] * 3, 1)
    batcher.submit(abandoned)  # 5 + 3
    batcher.withdraw(abandoned)  # its caller hung up: its room is free at once, but for its entry's one
    assert abandoned.future.cancelled() and batcher.queued == 6 and abandoned.texts == []
    late = batcher.submit(Job(["Eine Katze."] * 2, 1))
    gate.set()
    assert first.result(timeout=60) and len(queued.result(timeout=60)) == 5
    assert len(late.result(timeout=60)) == 2
    assert len(batcher.submit(Job(["Eine Katze."] * 8, 1)).result(timeout=60)) == 8  # drained: served
    batcher.stop()
    assert batcher.queued == 0


def test_a_flood_past_the_queue_gets_503_with_retry_after_then_200_again(tiny_checkpoint):
    flooded = Server(tiny_checkpoint, "--max-queue", "64")
    try:
        heavy = threading.Thread(target=flooded.request, args=("POST", "/translate", HEAVY))
        heavy.start()
        time.sleep(0.3)  # the worker is on it for about 2 s, the queue empty again
        flood = {"texts": [f"{line} {n}" for n in range(4) for line in LINES]}  # 16 texts
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda n: flooded.exchange("POST", "/translate", flood), range(6)))
        heavy.join(timeout=120)
        statuses = sorted(status for status, _, _ in answers)
        assert statuses == [200, 200, 200, 200, 503, 503]  # four of 16 texts fit in a queue of 64
        for status, payload, response in answers:
            if status == 503:
                assert int(response.getheader("Retry-After")) >= 1 and "busy" in payload["error"]
        assert flooded.translate(**flood)[0] == 200
    finally:
        assert flooded.stop() == 0


def test_abandoned_requests_do_not_delay_a_later_one_by_more_than_one_batch(server):
    start = time.monotonic()
    assert server.request("POST", "/translate", HEAVY)[0] == 200
    one_batch = time.monotonic() - start
    for _ in range(6):
        server.abandon(HEAVY)
    time.sleep(0.2)  # they have arrived
    start = time.monotonic()
    assert server.translate(texts=["Ein Hund."])[0] == 200
    waited = time.monotonic() - start
    assert waited < one_batch + 1.0, f"{waited:.1f} s behind 6 abandoned requests of {one_batch:.1f} s each"


def test_a_job_cancelled_while_its_batch_is_decoded_is_dropped_before_its_part(monkeypatch, tiny_checkpoint):
    decoded, real = [], batcher_module.answer_group

    def recorded(translator, jobs):
        decoded.extend(jobs)
        if len(decoded) == 1:  # the caller of the third job hangs up while the first is decoded
            third.future.cancel()
        return real(translator, jobs)

    monkeypatch.setattr(batcher_module, "answer_group", recorded)
    batcher = Batcher(lambda: Translator.from_checkpoint(tiny_checkpoint), max_wait_ms=300, max_tokens=10**6)
    batcher.start()
    batcher.last_batch = 2
    jobs = [Job([LONG] * 20, 1) for _ in range(3)]  # each about one decoding batch: a part of its own
    third = jobs[2]
    for job in jobs:
        batcher.submit(job)
    assert [len(job.future.result(timeout=60)) for job in jobs[:2]] == [20, 20]
    batcher.stop()
    assert batcher.batches == 1 and third.future.cancelled() and third not in decoded


def test_the_batcher_keeps_nothing_per_batch(tiny_checkpoint):
    batcher = Batcher(lambda: Translator.from_checkpoint(tiny_checkpoint))
    batcher.start()

    def sizes() -> dict:
        return {k: len(v) for k, v in vars(batcher).items() if isinstance(v, list | dict | set | tuple)}

    before = sizes()
    for n in range(30):
        batcher.submit(Job([f"{LINES[0]} {n}"], 1)).result(timeout=60)
    batcher.stop()
    assert batcher.batches == 30 and sizes() == before


def test_attention_is_bounded_and_health_answers_meanwhile(server):
    body = json.dumps({"texts": [{"text": "Ein Hund.", "prefix": "A" * (1 << 20)}], "attention": True})
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.putrequest("POST", "/translate")  # a megabyte of prefix: over the default body limit,
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(len(body)))
    connection.endheaders()  # refused on its announced length, before a byte of it is sent (a client
    response = connection.getresponse()  # still sending would find the connection closed under it)
    assert response.status == 413
    assert json.loads(response.read())["error"] == "body: over the limit of 1048576 bytes"
    connection.close()
    status, answer = server.translate(texts=[{"text": "Ein Hund.", "prefix": "A" * 2000}], attention=True)
    assert status == 422 and "texts.0.prefix: 2000 characters, over the limit of 300" in answer["error"]
    largest = {"texts": [{"text": LONG[:300], "prefix": LONG[:300]}] * 4, "attention": True}
    done = {}
    heavy = threading.Thread(target=lambda: done.update(r=server.exchange("POST", "/translate", largest)))
    heavy.start()
    start = time.monotonic()
    assert server.request("GET", "/health")[0] == 200 and time.monotonic() - start < 1.0
    heavy.join(timeout=120)
    status, answer, response = done["r"]
    assert status == 200 and int(response.getheader("Content-Length")) < 4 << 20  # MB
    assert len(answer["translations"]) == 4


def test_a_chunked_body_over_the_limit_is_413_in_the_service_s_format(tiny_checkpoint):
    small = Server(tiny_checkpoint, "--max-body-bytes", "1000")
    try:
        connection = http.client.HTTPConnection("127.0.0.1", small.port, timeout=30)
        chunks = (b'{"texts": ["' + b"x" * 500 + b'"]' for _ in range(4))  # no Content-Length
        connection.request("POST", "/translate", body=chunks, encode_chunked=True,
                           headers={"Content-Type": "application/json"})  # fmt: skip
        response = connection.getresponse()
        assert response.status == 413 and response.getheader("Connection") == "close"
        assert json.loads(response.read()) == {"error": "body: over the limit of 1000 bytes"}
        sneaky = socket.create_connection(("127.0.0.1", small.port), timeout=30)  # chunked, and a small
        sneaky.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"  # length
                       b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n"
                       + b"%x\r\n" % 3000 + b"x" * 3000 + b"\r\n0\r\n\r\n")  # fmt: skip
        assert sneaky.recv(100).startswith(b"HTTP/1.1 413")
        sneaky.close()
        chunked_ok = (part for part in (b'{"texts": ', b'["Ein Hund."]}'))
        connection = http.client.HTTPConnection("127.0.0.1", small.port, timeout=30)
        connection.request("POST", "/translate", body=chunked_ok, encode_chunked=True,
                           headers={"Content-Type": "application/json"})  # fmt: skip
        assert connection.getresponse().status == 200
    finally:
        assert small.stop() == 0


# ------------------------------------------------------------------------------------------- the key


def test_the_key_is_compared_as_bytes_and_any_header_is_a_401_never_a_500(tiny_checkpoint):
    key = "schlüssel"  # not ASCII
    guarded = Server(tiny_checkpoint, "--api-key-env", "TEST_TRANSLATE_KEY", env={"TEST_TRANSLATE_KEY": key})
    good = f"Bearer {key}".encode()  # its UTF-8 bytes, as clients send them
    try:
        for path in ("/health", "/", "/static/page.js", "/static/swagger-ui-bundle.js",
                     "/libretranslate/languages", "/libretranslate/frontend/settings"):  # fmt: skip
            assert guarded.request("GET", path)[0] == 200  # no data in these: the page asks for the key
        lt = {"q": "x", "source": "de", "target": "en"}
        routes = [("POST", "/translate", {"texts": ["x"]}), ("GET", "/model", None),
                  ("GET", "/openapi.json", None), ("GET", "/docs", None),
                  ("POST", "/libretranslate/translate", lt)]  # fmt: skip
        for method, path, body in routes:
            refused = [guarded.exchange(method, path, body, headers)[0] for headers in (
                {}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer \xfc"},
                {"Authorization": "Bearer schl\xfcssel"},  # the key's Latin-1 bytes: another key
                {"Authorization": b"Bearer \xff\xfe"}, {"Authorization": "Basic c2NobMO8c3NlbA=="},
            )]  # fmt: skip
            wanted = 400 if path.startswith("/libretranslate") else 401
            wrong = 403 if wanted == 400 else 401
            assert refused[0] == wanted and set(refused[1:]) == {wrong}, (path, refused)
            assert guarded.exchange(method, path, body, {"Authorization": good})[0] == 200, path
            as_cookie = {"Cookie": "transformer_mt_key=schl%C3%BCssel"}  # the key is never read from a cookie
            assert guarded.exchange(method, path, body, as_cookie)[0] == wanted, path
        status, _, response = guarded.exchange("POST", "/docs/access", None, {"Authorization": good})
        cookie = response.getheader("Set-Cookie")
        assert status == 204 and "HttpOnly" in cookie and "SameSite=strict" in cookie and key not in cookie
        docs_cookie = {"Cookie": cookie.split(";")[0]}  # opens the schema and its page, nothing else
        assert [guarded.exchange(m, p, b, docs_cookie)[0] for m, p, b in routes] == [401, 401, 200, 200, 400]
        assert guarded.exchange("POST", "/docs/access", None, docs_cookie)[0] == 401
        query = "/libretranslate/translate?q=Hund&source=de&target=en&api_key=" + quote(key)
        assert guarded.exchange("POST", query, None, {"Content-Type": ""}, raw=b"")[0] == 200
        assert "api_key=***" in guarded.output() and quote(key) not in guarded.output()  # not in the log
    finally:
        assert guarded.stop() == 0


# -------------------------------------------------------------------------------- startup and defaults


def serve_py(*flags: str) -> subprocess.CompletedProcess:
    """serve.py with these flags, in this process: for the runs refused before a server starts."""
    return run_command(serve.main, list(flags))


def test_a_bad_checkpoint_precision_device_or_port_is_one_line_before_the_server_starts(
    tiny_checkpoint, tmp_path
):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    cases = [
        (["--checkpoint", str(tmp_path / "missing.pt")], 1, "missing.pt"),
        (["--checkpoint", str(tiny_checkpoint), "--precision", "fp64"], 2, "--precision"),
        (["--checkpoint", str(tiny_checkpoint), "--device", "cuda:7" if torch.cuda.is_available() else
          "cuda"], 1, "--device cuda"),
        (["--checkpoint", str(tiny_checkpoint), "--device", "toaster"], 1, "--device toaster"),
        (["--checkpoint", str(tiny_checkpoint), "--port", "70000"], 2, "--port 70000"),
        (["--checkpoint", str(tiny_checkpoint), "--port", str(taken.getsockname()[1])], 1, "cannot listen"),
    ]  # fmt: skip
    try:
        for flags, status, named in cases:
            done = serve_py(*flags)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == status and len(lines) == 1, (flags, done.stderr)
            assert lines[0].startswith("error: ") and named in lines[0], (flags, lines)
            assert "Uvicorn" not in done.stderr and "Traceback" not in done.stderr
    finally:
        taken.close()


def test_a_run_folder_as_checkpoint_says_which_checkpoint_it_serves(tiny_checkpoint):
    """As translate.py: the run folder stands for the checkpoint its final test scored, and stderr says so
    before the model is loaded (here refused for its device, so no server starts)."""
    done = serve_py("--checkpoint", str(tiny_checkpoint.parent), "--port", "0", "--device", "toaster")
    note = f"serve.py: {tiny_checkpoint.parent} is a run folder: using best.pt, the checkpoint its final"
    assert done.returncode == 1 and done.stderr.splitlines()[0] == note + " test scored", done.stderr
    assert done.stderr.splitlines()[1].startswith("error: --device toaster")


def test_answers_on_a_kept_alive_connection_are_not_held_back_by_nagle(server):
    """serve.py opens its own socket: it must name IPPROTO_TCP, or asyncio leaves TCP_NODELAY off and each
    answer on a kept-alive connection waits ~40 ms for the client's delayed ACK."""
    with serve.listen("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    seconds = []
    for _ in range(10):
        start = time.perf_counter()
        connection.request("GET", "/health")
        connection.getresponse().read()
        seconds.append(time.perf_counter() - start)
    connection.close()
    assert sorted(seconds)[5] < 0.030, seconds  # Nagle's wait is 40 ms or more


def test_default_options_equal_translate_py_s_defaults(tiny_checkpoint, tmp_path):
    """A checkpoint whose eval.beam_size is 4: with no options, the service and translate.py both beam."""
    checkpoint = torch.load(tiny_checkpoint, weights_only=True)
    checkpoint["config"]["eval"]["beam_size"] = 4
    beamed = tmp_path / "beam4.pt"
    torch.save(checkpoint, beamed)
    expected = translate_py(beamed, LINES, tmp_path)
    assert expected != translate_py(beamed, LINES, tmp_path, "--beam", "1")  # the default matters here
    served = Server(beamed)  # --device auto, the default
    try:
        status, answer = served.translate(texts=LINES)
        assert status == 200 and [t["text"] for t in answer["translations"]] == expected
        assert served.request("GET", "/model")[1]["device"] == (
            "cuda:0" if torch.cuda.is_available() else "cpu"
        )
    finally:
        assert served.stop() == 0


def test_docs_are_served_from_this_machine(server):
    status, page = server.request("GET", "/docs")
    assert status == 200 and "swagger-ui-bundle.js" in page
    assert "http://" not in page and "https://" not in page  # nothing from a CDN
    for name in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert server.request("GET", f"/static/{name}")[0] == 200


# ------------------------------------------------------------------------------------------ the schema


def test_a_schema_fuzzer_finds_no_5xx_and_no_schema_valid_request_refused(tiny_checkpoint, tmp_path):
    """schemathesis, every check (server errors, schema-valid data refused, schema-invalid data accepted,
    undocumented status codes, answers that break their schema), with the key required."""
    guarded = Server(tiny_checkpoint, "--api-key-env", "TEST_TRANSLATE_KEY", env={"TEST_TRANSLATE_KEY": "k"})
    try:
        schema = f"http://127.0.0.1:{guarded.port}/openapi.json"
        command = [str(Path(sys.executable).with_name("schemathesis")), "run", schema,
                   "-H", "Authorization: Bearer k", "--checks", "all", "--max-examples", "40", "--seed", "1",
                   "--no-color"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-6000:]
        assert "No issues found" in done.stdout and "6 selected" in done.stdout
    finally:
        assert guarded.stop() == 0


def test_a_lone_caller_is_not_kept_waiting_for_company(tiny_checkpoint):
    """With nobody else sending, a batch does not gather: a 5-second --max-wait-ms costs a lone caller
    nothing (under load the window is what batches requests together)."""
    batcher = Batcher(lambda: Translator.from_checkpoint(tiny_checkpoint), max_wait_ms=5000)
    batcher.start()
    start = time.monotonic()
    assert batcher.submit(Job([LINES[0]], 1)).result(timeout=60)
    assert time.monotonic() - start < 2.0
    batcher.stop()


def test_the_smallest_group_of_a_batch_is_decoded_first(monkeypatch, tiny_checkpoint):
    order, real = [], batcher_module.answer_group

    def recorded(translator, jobs):
        order.extend(job.beam for job in jobs)
        return real(translator, jobs)

    monkeypatch.setattr(batcher_module, "answer_group", recorded)
    batcher = Batcher(lambda: Translator.from_checkpoint(tiny_checkpoint), max_wait_ms=300)
    batcher.start()
    batcher.last_batch = 2  # as under load
    large, small = Job([LONG] * 8, 4), Job([LINES[0]], 1)  # the large request arrives first
    for job in (large, small):
        batcher.submit(job)
    assert large.future.result(timeout=60) and small.future.result(timeout=60)
    batcher.stop()
    assert batcher.batches == 1 and order == [1, 4]
