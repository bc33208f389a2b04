"""CTranslate2 decoding in a process of its own, for ``bench/decode_speed.py --compare``.

Why a process of its own: in a process that runs PyTorch, a live ``ctranslate2.Translator`` that has
translated once makes PyTorch's small operations many times slower, until it is deleted. Measured on a
2-core CPU: 2000 additions on a (300, 256) tensor took 0.29 s instead of 0.023 s, and our cached greedy
decoding of Multi30k's test set ran at 0.6x its own speed (docs/experiments.md). The likely
cause: both libraries' OpenMP calls land in the one libgomp that PyTorch loads globally, which then manages
more threads than there are CPUs and stops letting its idle threads spin between parallel regions, so every
small operation pays for waking them. Here CTranslate2 runs alone: this file imports neither ``torch`` nor
the project, and while it waits for a request it sleeps (blocked on its input), taking no CPU.

Protocol, one JSON object per line each way:
  in:  {"model": DIR, "device": "cpu" | "cuda", "device_index": 0, "compute_types": ["float32", "int8"],
        "threads": 2}
  out: {"ready": true, "torch_loaded": whether ``torch`` got into this process after all}
  in:  {"compute_type": "int8", "batches": [[pieces of a source] per sentence] per batch,
        "max_lengths": [one limit per batch], "beam": K, "length_penalty": α}
  out: {"seconds": the time of the translate_batch calls only, "hypotheses": [pieces] per sentence}
A failure answers {"error": "..."}.
"""

import json
import subprocess
import sys
import time
import traceback
from pathlib import Path


def load_translators(setup: dict) -> dict:
    """{compute type: ctranslate2.Translator} for the setup request."""
    import ctranslate2

    where = {"device": setup["device"], "device_index": setup["device_index"]}
    if setup["device"] == "cpu":
        where["intra_threads"] = setup["threads"]
    return {
        kind: ctranslate2.Translator(setup["model"], compute_type=kind, **where)
        for kind in setup["compute_types"]
    }


def serve(lines, answer) -> None:
    """Load the translators of the first request, then decode each later one."""
    translators = load_translators(json.loads(next(lines)))
    answer({"ready": True, "torch_loaded": "torch" in sys.modules})
    for line in lines:
        request = json.loads(line)
        translator, hypotheses = translators[request["compute_type"]], []
        start = time.perf_counter()
        for batch, max_length in zip(request["batches"], request["max_lengths"], strict=True):
            results = translator.translate_batch(
                batch, beam_size=request["beam"], length_penalty=request["length_penalty"],
                max_decoding_length=max_length, min_decoding_length=0,
            )  # fmt: skip
            hypotheses += [result.hypotheses[0] for result in results]
        answer({"seconds": time.perf_counter() - start, "hypotheses": hypotheses})


class CTranslate2Process:
    """The parent's side: a worker process running this file, its translators loaded. A context manager:
    leaving it ends the worker, whatever happened."""

    def __init__(self, model: Path, device: str, compute_types: list[str], threads: int):
        """``device``: "cpu", "cuda" or "cuda:N"."""
        kind, _, index = device.partition(":")
        setup = {"model": str(model), "device": kind, "device_index": int(index or 0),
                 "compute_types": compute_types, "threads": threads}  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            self.torch_loaded = self._ask(setup)["torch_loaded"]
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "CTranslate2Process":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def translate(self, compute_type: str, batches, max_lengths, beam: int, length_penalty: float):
        """(hypotheses in batch order, seconds of the translate_batch calls): see the protocol above."""
        request = {"compute_type": compute_type, "batches": batches, "max_lengths": max_lengths,
                   "beam": beam, "length_penalty": length_penalty}  # fmt: skip
        reply = self._ask(request)
        return reply["hypotheses"], reply["seconds"]

    def _ask(self, request: dict) -> dict:
        """Send one request, wait for its answer; the worker's error, or its end, raised here by name."""
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
        """End the worker: its input closed (it stops reading), its output too (an answer nobody will read
        cannot block it), killed if it is not gone within 10 s."""
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:  # a broken pipe: the worker is gone already
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main() -> int:
    def answer(message: dict) -> None:
        print(json.dumps(message), flush=True)

    try:
        serve(iter(sys.stdin), answer)
    except Exception as error:
        traceback.print_exc()  # stderr is the parent's; the answer names the error to the code that asked
        try:
            answer({"error": f"{type(error).__name__}: {error}"})
        except OSError:  # the parent has stopped listening
            pass
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
