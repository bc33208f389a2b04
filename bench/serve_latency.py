"""A lone caller's latency: one client sending one Multi30k test sentence at a time to ``serve.py`` (default
settings, one kept-alive connection), against ``Translator.translate`` of that sentence in this process,
greedy and beam 4. The two are timed in pairs, sentence by sentence, in alternating order and a few
milliseconds apart, so that the machine's drift falls on both. Prints p50 / p99 of both, what the service
adds at each and the median of the paired differences, and whether every answer equals the Translator's.

    python bench/serve_latency.py --checkpoint runs/multi30k_de_en/best.pt [--sentences 300]
"""

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve_load import free_port, start_server  # noqa: E402

from transformer.inference.translator import Translator  # noqa: E402
from transformer.training.multi30k import load_multi30k  # noqa: E402


def percentiles(seconds: list[float]) -> tuple[float, float]:
    ms = sorted(1000 * x for x in seconds)
    return statistics.median(ms), ms[min(len(ms) - 1, int(0.99 * len(ms)))]


def in_process(translator: Translator, sentence: str, beam: int) -> tuple[str, float]:
    start = time.perf_counter()
    text = translator.translate([sentence], beam=beam)[0]
    return text, time.perf_counter() - start


def served(connection: http.client.HTTPConnection, sentence: str, beam: int) -> tuple[str, float]:
    """The service's translation of ``sentence`` and its seconds. A kept-alive connection that the server
    closed while it was idle (uvicorn closes one after 5 s) is opened again, as clients do."""
    body = json.dumps({"texts": [sentence], "beam": beam})
    for attempt in (1, 2):
        start = time.perf_counter()
        try:
            connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            break
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            connection.close()
            if attempt == 2:
                raise
    answer = json.loads(response.read())
    seconds = time.perf_counter() - start
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {answer}")
    return answer["translations"][0]["text"], seconds


def paired(translator, connection, sentences: list[str], beam: int) -> tuple[list, list, list, list]:
    """Per sentence, both timings, in alternating order, 5 ms apart (the thread pools' spinning ends)."""
    direct, service, expected, got = [], [], [], []
    for n, sentence in enumerate(sentences):
        runs = [(in_process, translator, direct, expected), (served, connection, service, got)]
        for run, engine, seconds, texts in runs if n % 2 == 0 else runs[::-1]:
            text, elapsed = run(engine, sentence, beam)
            seconds.append(elapsed)
            texts.append(text)
            time.sleep(0.005)
    return direct, service, expected, got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument(
        "--data-dir", default=None, help="Multi30k folder (else $MULTI30K_DIR, else your data folder)"
    )
    args = parser.parse_args(argv)
    sentences = load_multi30k("de", "en", args.data_dir)["test"].src[: args.sentences]
    translator = Translator.from_checkpoint(args.checkpoint)
    port, same = free_port(), True
    with tempfile.TemporaryFile() as log:
        server = start_server(args.checkpoint, port, log)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            for beam in (1, 4):
                paired(translator, connection, sentences[:20], beam)  # warm-up
                direct, service, expected, got = paired(translator, connection, sentences, beam)
                (d50, d99), (s50, s99) = percentiles(direct), percentiles(service)
                added = statistics.median(1000 * (s - d) for s, d in zip(service, direct))
                same &= got == expected
                print(f"beam {beam}: Translator p50 {d50:.1f} ms p99 {d99:.1f} ms; service p50 {s50:.1f} ms "
                      f"p99 {s99:.1f} ms; added p50 {s50 - d50:.1f} ms p99 {s99 - d99:.1f} ms, median of the "
                      f"pairs {added:.1f} ms; {sum(a == b for a, b in zip(got, expected))}/{len(expected)} "
                      "equal")  # fmt: skip
        finally:
            connection.close()
            server.terminate()
            server.wait(timeout=60)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
