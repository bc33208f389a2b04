"""A lone caller's latency: one client sending one Multi30k test sentence at a time to ``serve.py`` (default
settings, one kept-alive connection), against ``Translator.translate`` of that sentence in this process, in
the same run, greedy and beam 4. Prints p50 / p99 of both and what the service adds at each, and whether
every answer equals the Translator's.

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


def in_process(translator: Translator, sentences: list[str], beam: int) -> tuple[list[str], list[float]]:
    texts, seconds = [], []
    for sentence in sentences:
        start = time.perf_counter()
        texts += translator.translate([sentence], beam=beam)
        seconds.append(time.perf_counter() - start)
    return texts, seconds


def served(port: int, sentences: list[str], beam: int) -> tuple[list[str], list[float]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    texts, seconds = [], []
    for sentence in sentences:
        body = json.dumps({"texts": [sentence], "beam": beam})
        start = time.perf_counter()
        connection.request("POST", "/translate", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        answer = json.loads(response.read())
        seconds.append(time.perf_counter() - start)
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {answer}")
        texts.append(answer["translations"][0]["text"])
    connection.close()
    return texts, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument(
        "--data-dir", default=None, help="Multi30k folder (else $MULTI30K_DIR, else data/multi30k)"
    )
    args = parser.parse_args(argv)
    sentences = load_multi30k("de", "en", args.data_dir)["test"].src[: args.sentences]
    translator = Translator.from_checkpoint(args.checkpoint)
    port, same = free_port(), True
    with tempfile.TemporaryFile() as log:
        server = start_server(args.checkpoint, port, log)
        try:
            for beam in (1, 4):
                in_process(translator, sentences[:20], beam)  # warm-up, both
                served(port, sentences[:20], beam)
                expected, direct = in_process(translator, sentences, beam)
                got, service = served(port, sentences, beam)
                (d50, d99), (s50, s99) = percentiles(direct), percentiles(service)
                same &= got == expected
                print(f"beam {beam}: Translator p50 {d50:.1f} ms p99 {d99:.1f} ms; service p50 {s50:.1f} ms "
                      f"p99 {s99:.1f} ms; added p50 {s50 - d50:.1f} ms p99 {s99 - d99:.1f} ms; "
                      f"{sum(a == b for a, b in zip(got, expected))}/{len(expected)} equal")  # fmt: skip
        finally:
            server.terminate()
            server.wait(timeout=60)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
