"""The service under load: N concurrent clients on 127.0.0.1, each sending single sentences of the Multi30k
test set to ``serve.py``, against the Translator decoding the same sentences in one call (what
``translate.py`` runs). Prints sentences/s of both, their ratio, p50 / p99 latency, and whether every line
came back once, in its place and equal to the Translator's.

    python bench/serve_load.py --checkpoint runs/multi30k_de_en/best.pt [--clients 16] [--sentences 1000]
                               [--client asyncio|threads]

The clients run on the same machine as the service and share its cores. ``--client asyncio`` (the default)
drives every connection from one thread with hand-written HTTP/1.1 requests, as load generators such as wrk
do, so that the clients take as little of the service's CPU as they can; ``--client threads`` runs one
``http.client`` connection per thread, a heavier client. Bounded: every request has a 60 s timeout, and the
run stops after --max-seconds.
"""

import argparse
import asyncio
import http.client
import json
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformer.inference.translator import Translator  # noqa: E402
from transformer.training.multi30k import load_multi30k  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, texts: list[str], connection: http.client.HTTPConnection | None = None) -> list[dict]:
    """POST /translate, on ``connection`` (kept alive between a client's requests) or a new one."""
    own = connection is None
    connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"texts": texts})
    connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    body = json.loads(response.read())
    if own:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {body}")
    return body["translations"]


def start_server(checkpoint: str, port: int, log) -> subprocess.Popen:
    command = [sys.executable, "serve.py", "--checkpoint", checkpoint, "--port", str(port)]
    server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            post(port, ["Ein Hund."])
            return server
        except OSError:
            time.sleep(0.2)
    server.terminate()
    raise SystemExit("error: serve.py did not answer within 120 s")


def load(port: int, sentences: list[str], clients: int, max_seconds: float):
    """Each client takes the next sentence until none is left: (answers by index, latencies, seconds)."""
    answers: dict[int, list[str]] = {}
    latencies: list[float] = []
    next_index, lock = iter(range(len(sentences))), threading.Lock()
    deadline = time.monotonic() + max_seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)  # kept alive, as clients do
        while time.monotonic() < deadline:
            with lock:
                i = next(next_index, None)
            if i is None:
                return connection.close()
            start = time.perf_counter()
            text = post(port, [sentences[i]], connection)[0]["text"]
            with lock:
                latencies.append(time.perf_counter() - start)
                answers.setdefault(i, []).append(text)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers, latencies, time.perf_counter() - start


async def _async_clients(port: int, sentences: list[str], clients: int, deadline: float, record) -> None:
    """``clients`` kept-alive connections, each sending the next sentence until none is left."""
    indices = iter(range(len(sentences)))

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < deadline and (i := next(indices, None)) is not None:
                body = json.dumps({"texts": [sentences[i]]}).encode()
                head = "POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                start = time.perf_counter()
                writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
                answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
                length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", answer).group(1))
                payload = json.loads(await asyncio.wait_for(reader.readexactly(length), 60))
                if not answer.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"{answer.splitlines()[0].decode()}: {payload}")
                record(i, payload["translations"][0]["text"], time.perf_counter() - start)
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(clients)))


def load_async(port: int, sentences: list[str], clients: int, max_seconds: float):
    """``load``'s answers, latencies and seconds, from one thread of asyncio clients."""
    answers: dict[int, list[str]] = {}
    latencies: list[float] = []

    def record(i: int, text: str, seconds: float) -> None:
        answers.setdefault(i, []).append(text)
        latencies.append(seconds)

    start = time.perf_counter()
    asyncio.run(_async_clients(port, sentences, clients, time.monotonic() + max_seconds, record))
    return answers, latencies, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--client", choices=("asyncio", "threads"), default="asyncio",
                        help="asyncio connections in one thread, or a thread per connection")  # fmt: skip
    parser.add_argument(
        "--data-dir", default=None, help="Multi30k folder (else $MULTI30K_DIR, else your data folder)"
    )
    args = parser.parse_args(argv)
    sentences = load_multi30k("de", "en", args.data_dir)["test"].src[: args.sentences]

    translator = Translator.from_checkpoint(args.checkpoint)
    translator.translate(sentences[:64])  # warm-up
    start = time.perf_counter()
    expected = translator.translate(sentences)
    batch_seconds = time.perf_counter() - start
    del translator

    port = free_port()
    with tempfile.TemporaryFile() as log:
        server = start_server(args.checkpoint, port, log)
        try:
            post(port, sentences[:64])  # warm-up
            run_clients = load_async if args.client == "asyncio" else load
            answers, latencies, seconds = run_clients(port, sentences, args.clients, args.max_seconds)
        finally:
            server.terminate()
            server.wait(timeout=60)
    lost = [i for i in range(len(sentences)) if i not in answers]
    doubled = [i for i, got in answers.items() if len(got) > 1]
    wrong = [i for i, got in answers.items() if got[0] != expected[i]]
    served = len(answers) / seconds
    direct = len(sentences) / batch_seconds
    ms = sorted(1000 * x for x in latencies)
    p50, p99 = statistics.median(ms), ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    print(f"Translator, one call of {len(sentences)} sentences: {direct:.1f} sentences/s")
    print(f"serve.py, {args.clients} {args.client} clients, one sentence a request: {served:.1f} "
          f"sentences/s, p50 {p50:.0f} ms, p99 {p99:.0f} ms")  # fmt: skip
    print(f"lost {len(lost)}, duplicated {len(doubled)}, different from the Translator {len(wrong)}")
    print(f"ratio_served_vs_translate={served / direct:.2f} p50_ms={p50:.0f} p99_ms={p99:.0f} "
          f"lost={len(lost)} duplicated={len(doubled)} different={len(wrong)}")  # fmt: skip
    return int(bool(lost or doubled or wrong))


if __name__ == "__main__":
    sys.exit(main())
