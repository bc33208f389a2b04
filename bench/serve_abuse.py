"""The service under load and abuse: polite clients alone, then beside abusive ones, each phase against a
fresh ``serve.py`` (default settings) on 127.0.0.1. Polite clients send single Multi30k test sentences over
kept-alive connections, and on a 503 wait its Retry-After and send again, as a well-behaved client does.
Abusive clients, all at once, for as long as the polite ones run:

    bad Unicode         {"texts": ["x \\ud800"]}, every 50 ms                      expected: 422
    attention, largest  4 texts of 300 characters with 300-character prefixes,
                        attention: true, every 500 ms                              expected: 200 (or 503:
                                                                                   the queue is full)
    attention, too big  a 2000-character prefix with attention, every 200 ms       expected: 422
    huge body           2 MB announced, 64 KB sent, every 200 ms                   expected: 413 (or the
                                                                                   connection closed first)
    hang-ups            64 sentences at beam 4, the connection closed at once,
                        every 500 ms                                               expected: no answer read
    flood               every 3 s, 24 requests of 64 sentences at once (1536
                        texts, past --max-queue 512); each reads a 503 if one
                        (or its answer) within 1 s, else hangs up                 expected: 503 + Retry-After

Per phase it prints the polite sentences/s, p50 / p99 latency (retries included), how many polite requests
met a 503, lost / duplicated / different from the Translator; per abusive kind the statuses it got; the
slowest /health (asked every 500 ms) and the server's peak memory (VmHWM). Exit status 1 if a polite line
was lost or wrong, or an abusive request got a status it should not.

    python bench/serve_abuse.py --checkpoint runs/multi30k_de_en/best.pt [--clients 32] [--sentences 1000]
"""

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve_load import free_port, start_server  # noqa: E402

from transformer.inference.translator import Translator  # noqa: E402
from transformer.training.multi30k import load_multi30k  # noqa: E402

# the statuses each abusive kind may get (None: no answer read)
EXPECTED = {"bad Unicode": {422}, "attention, largest": {200, 503}, "attention, too big": {422},
            "huge body": {413, None}, "hang-ups": {None}, "flood": {200, 503, None}}  # fmt: skip


async def exchange(reader, writer, path: str, body: bytes, method: str = "POST", length: int | None = None):
    """One HTTP/1.1 request on an open connection -> (status, headers (lower-case names), body)."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(body) if length is None else length}\r\n\r\n".encode() + body)
    answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
    status = int(answer.split(b" ", 2)[1])
    headers = dict(re.findall(r"(?m)^([^:\r\n]+): *([^\r\n]*)", answer.decode("latin-1")))
    headers = {k.lower(): v for k, v in headers.items()}
    payload = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))), 60)
    return status, headers, payload


async def once(port: int, path: str, body: bytes, method: str = "POST", length: int | None = None, wait=60.0):
    """A request on a connection of its own: its status (None: no answer within ``wait`` s, hung up)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return (await asyncio.wait_for(exchange(reader, writer, path, body, method, length), wait))[0]
    except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()


async def hang_up(port: int, body: bytes) -> None:
    """Send a translation request and close the connection at once (status None: nothing read)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = "POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    writer.close()


async def polite(port: int, sentences: list[str], clients: int, deadline: float, results: dict) -> None:
    """``clients`` kept-alive connections sending the next sentence until none is left."""
    indices = iter(range(len(sentences)))

    async def client() -> None:
        connection = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < deadline and (i := next(indices, None)) is not None:
                body, start = json.dumps({"texts": [sentences[i]]}).encode(), time.perf_counter()
                while True:
                    try:
                        answer = await exchange(*connection, "/translate", body)
                    except (asyncio.IncompleteReadError, ConnectionError):  # closed while idle: again
                        connection[1].close()
                        connection = await asyncio.open_connection("127.0.0.1", port)
                        continue
                    if answer[0] != 503:
                        break
                    results["busy"] += 1
                    await asyncio.sleep(float(answer[1]["retry-after"]))
                if answer[0] != 200:
                    raise RuntimeError(f"polite request: HTTP {answer[0]}: {answer[2][:200]}")
                results["latencies"].append(time.perf_counter() - start)
                results["answers"].setdefault(i, []).append(json.loads(answer[2])["translations"][0]["text"])
        finally:
            connection[1].close()

    await asyncio.gather(*(client() for _ in range(clients)))


async def abuse(port: int, sentences: list[str], done: asyncio.Event, statuses: dict) -> None:
    """Every abusive client above, until ``done``."""
    text = (" ".join(sentences))[:300]
    largest = {"texts": [{"text": text, "prefix": text}] * 4, "attention": True}
    bodies = {
        "bad Unicode": (b'{"texts": ["x \\ud800"]}', 0.05, None),
        "attention, largest": (json.dumps(largest).encode(), 0.5, None),
        "attention, too big": (
            json.dumps({"texts": [{"text": "x", "prefix": "A" * 2000}], "attention": True}).encode(),
            0.2,
            None,
        ),  # fmt: skip
        "huge body": (b"{" * (64 << 10), 0.2, 2 << 20),
    }
    heavy = json.dumps({"texts": sentences[:64], "beam": 4}).encode()

    async def every(kind: str, seconds: float, send) -> None:
        while not done.is_set():
            statuses[kind].update(await asyncio.gather(*send()))
            await asyncio.sleep(seconds)

    loops = [every(kind, seconds, lambda b=body, n=length: [once(port, "/translate", b, length=n)])
             for kind, (body, seconds, length) in bodies.items()]  # fmt: skip
    loops.append(every("hang-ups", 0.5, lambda: [hang_up(port, heavy)]))
    loops.append(every("flood", 3.0, lambda: [once(port, "/translate", heavy, wait=1.0) for _ in range(24)]))
    await asyncio.gather(*loops)


async def watch_health(port: int, done: asyncio.Event, slowest: list[float]) -> None:
    while not done.is_set():
        start = time.perf_counter()
        assert await once(port, "/health", b"", "GET") == 200
        slowest[0] = max(slowest[0], time.perf_counter() - start)
        await asyncio.sleep(0.5)


async def phase(port: int, sentences: list[str], clients: int, max_seconds: float, abusive: bool) -> dict:
    results = {"answers": {}, "latencies": [], "busy": 0, "statuses": {k: Counter() for k in EXPECTED}}
    done, slowest = asyncio.Event(), [0.0]
    start = time.perf_counter()
    others = [watch_health(port, done, slowest)] + ([abuse(port, sentences, done, results["statuses"])]
                                                    if abusive else [])  # fmt: skip
    tasks = [asyncio.ensure_future(task) for task in others]
    await polite(port, sentences, clients, time.monotonic() + max_seconds, results)
    results["seconds"] = time.perf_counter() - start
    done.set()
    await asyncio.gather(*tasks)
    results["slowest_health"] = slowest[0]
    return results


def peak_memory_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def report(name: str, results: dict, expected: list[str], memory: float) -> bool:
    answers, n = results["answers"], len(expected)
    lost = [i for i in range(n) if i not in answers]
    doubled = [i for i, got in answers.items() if len(got) > 1]
    wrong = [i for i, got in answers.items() if got[0] != expected[i]]
    ms = sorted(1000 * x for x in results["latencies"]) or [float("nan")]
    p50, p99 = statistics.median(ms), ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    rate = len(answers) / results["seconds"]
    print(f"{name}: polite {rate:.1f} sentences/s, p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
          f"{results['busy']} met a 503; lost {len(lost)}, duplicated {len(doubled)}, "
          f"different {len(wrong)}; slowest /health {1000 * results['slowest_health']:.0f} ms; "
          f"server peak memory {memory:.0f} MB")  # fmt: skip
    unexpected = 0
    for kind, counts in results["statuses"].items():
        if counts:
            bad = sum(c for status, c in counts.items() if status not in EXPECTED[kind])
            unexpected += bad
            print(f"  {kind}: {dict(counts)}" + (f"  UNEXPECTED {bad}" if bad else ""))
    return not (lost or doubled or wrong or unexpected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="per phase")
    parser.add_argument(
        "--data-dir", default=None, help="Multi30k folder (else $MULTI30K_DIR, else your data folder)"
    )
    args = parser.parse_args(argv)
    sentences = load_multi30k("de", "en", args.data_dir)["test"].src[: args.sentences]
    expected = Translator.from_checkpoint(args.checkpoint).translate(sentences)
    good = True
    for name, abusive in (("polite alone", False), ("polite beside abuse", True)):
        port = free_port()
        with tempfile.TemporaryFile() as log:
            server = start_server(args.checkpoint, port, log)
            try:
                results = asyncio.run(phase(port, sentences, args.clients, args.max_seconds, abusive))
                memory = peak_memory_mb(server.pid)
            finally:
                server.terminate()
                server.wait(timeout=60)
        good &= report(name, results, expected, memory)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
