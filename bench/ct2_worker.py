"""CTranslate2 decoding in a process of its own, for ``bench/decode_speed.py --compare``.

Why a process of its own: in a process that runs PyTorch, a live ``ctranslate2.Translator`` that has
translated once makes PyTorch's small operations many times slower, until it is deleted. Measured on a
2-core CPU: 2000 additions on a (300, 256) tensor took 0.29 s instead of 0.023 s, and our cached greedy
decoding of Multi30k's test set ran at 0.6x its own speed (docs/benchmarks.md, 2026-12-04). The likely
cause: both libraries' OpenMP calls land in the one libgomp that PyTorch loads globally, which then manages
more threads than there are CPUs and stops letting its idle threads spin between parallel regions, so every
small operation pays for waking them. Here CTranslate2 runs alone: this file imports neither ``torch`` nor
the project, and while it waits for a request it sleeps (blocked on its input), taking no CPU.

Protocol, one JSON object per line each way:
  in:  {"model": DIR, "device": "cpu", "compute_types": ["float32", "int8"], "threads": 2}
  out: {"ready": true}
  in:  {"compute_type": "int8", "batches": [[pieces of a source] per sentence] per batch,
        "max_lengths": [one limit per batch], "beam": K, "length_penalty": α}
  out: {"seconds": the time of the translate_batch calls only, "hypotheses": [pieces] per sentence}
A failure answers {"error": "..."}.
"""

import json
import subprocess
import sys
import time
from pathlib import Path


def serve(lines, answer) -> None:
    """Load the translators of the first request, then decode each later one."""
    import ctranslate2

    setup = json.loads(next(lines))
    threads = {"intra_threads": setup["threads"]} if setup["device"] == "cpu" else {}
    translators = {
        kind: ctranslate2.Translator(setup["model"], device=setup["device"], compute_type=kind, **threads)
        for kind in setup["compute_types"]
    }
    answer({"ready": True})
    for line in lines:
        request = json.loads(line)
        translator, hypotheses = translators[request["compute_type"]], []
        start = time.perf_counter()
        for batch, max_length in zip(request["batches"], request["max_lengths"]):
            results = translator.translate_batch(
                batch, beam_size=request["beam"], length_penalty=request["length_penalty"],
                max_decoding_length=max_length, min_decoding_length=0,
            )  # fmt: skip
            hypotheses += [result.hypotheses[0] for result in results]
        answer({"seconds": time.perf_counter() - start, "hypotheses": hypotheses})


class CTranslate2Process:
    """The parent's side: a worker process running this file, its translators loaded."""

    def __init__(self, model: Path, device: str, compute_types: list[str], threads: int):
        self.process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        setup = {"model": str(model), "device": device, "compute_types": compute_types, "threads": threads}
        self._ask(setup)

    def translate(self, compute_type: str, batches, max_lengths, beam: int, length_penalty: float):
        """(hypotheses in batch order, seconds of the translate_batch calls): see the protocol above."""
        request = {"compute_type": compute_type, "batches": batches, "max_lengths": max_lengths,
                   "beam": beam, "length_penalty": length_penalty}  # fmt: skip
        reply = self._ask(request)
        return reply["hypotheses"], reply["seconds"]

    def _ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the CTranslate2 worker ({__file__}) exited with {self.process.wait()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the CTranslate2 worker ({__file__}): {reply['error']}")
        return reply

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def main() -> int:
    def answer(message: dict) -> None:
        print(json.dumps(message), flush=True)

    try:
        serve(iter(sys.stdin), answer)
    except Exception as error:  # the parent prints it: a bare traceback here would be lost in its pipe
        answer({"error": f"{type(error).__name__}: {error}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
