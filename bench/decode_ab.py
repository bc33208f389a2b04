"""Decoding speed of two checkouts side by side: did a change make decoding faster, with the same outputs?

Each checkout decodes Multi30k test_2016_flickr (in the checkpoint's direction) with the same checkpoint and
settings (its ``eval`` ones; ``--precision``, fp32 by default; the CPU) through ``Translator.translate``, in
a fresh process of its own (its own code, nothing cached), the two in turn, ``--pairs`` times. On a shared
machine the speed of the same code moves from one minute to the next; taking turns puts both checkouts
through the same minutes.

    git worktree add /tmp/before COMMIT
    python bench/decode_ab.py /tmp/before . --checkpoint RUN/best.pt [--beam 4] [--pairs 4] [--limit N]

Prints each run's sentences/s, then ``mean_ratio=`` (the second checkout's mean sentences/s ÷ the
first's) and ``same_outputs=`` (yes / no: every line of every run compared).
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import hashlib, json, sys, time, warnings
warnings.filterwarnings("ignore")
tree, checkpoint, data_dir = sys.argv[1], sys.argv[2], sys.argv[4]
beam, limit, precision = int(sys.argv[3]), int(sys.argv[5]), sys.argv[6]
sys.path.insert(0, tree)
import dataclasses
from transformer.checkpoint import load_for_inference
from transformer.multi30k import load_multi30k
from transformer.translator import Translator
model, tokenizer, config = load_for_inference(checkpoint, "cpu")
translator = Translator(model, tokenizer, dataclasses.replace(config.eval, beam_size=beam), "cpu", precision)
test = load_multi30k(config.data.src_lang, config.data.tgt_lang, data_dir or None)["test"]
sources = test.src[:limit] if limit else test.src
translator.translate(sources[:8])  # warm-up
start = time.perf_counter()
lines = translator.translate(sources)
seconds = time.perf_counter() - start
digest = hashlib.sha256("\\n".join(lines).encode()).hexdigest()
print(json.dumps({"sentences_per_s": len(sources) / seconds, "sha256": digest}))
"""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", help="a checkout (the baseline)")
    parser.add_argument("second", help="another checkout (the change)")
    parser.add_argument("--checkpoint", required=True, help="training or slim checkpoint")
    parser.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    parser.add_argument("--pairs", type=int, default=4, help="runs of each checkout, in turn")
    parser.add_argument("--limit", type=int, default=0, help="only the first N test sentences")
    parser.add_argument("--precision", default="fp32", help="fp32 (default), bf16 or int8")
    parser.add_argument(
        "--data-dir", default="", help="Multi30k folder (default: $MULTI30K_DIR, else data/multi30k)"
    )
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs must be >= 1, got {args.pairs}")
    return args


def decode_once(tree: Path, args) -> dict:
    checkpoint = str(Path(args.checkpoint).resolve())
    command = [
        sys.executable,
        "-c",
        CHILD,
        str(tree),
        checkpoint,
        str(args.beam),
        args.data_dir,
        str(args.limit),
        args.precision,
    ]
    run = subprocess.run(command, capture_output=True, text=True, cwd=tree)
    if run.returncode != 0:
        raise SystemExit(f"error: decoding with {tree} failed:\n{run.stderr.strip()}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    args = parse_args(argv)
    trees = [Path(args.first).resolve(), Path(args.second).resolve()]
    for tree in trees:
        if not (tree / "transformer" / "translator.py").is_file():
            print(
                f"error: {tree} is not a checkout of this project (no transformer/translator.py)",
                file=sys.stderr,
            )
            return 1
    speeds, digests = ([], []), set()
    for pair in range(args.pairs):
        for i, tree in enumerate(trees):
            result = decode_once(tree, args)
            speeds[i].append(result["sentences_per_s"])
            digests.add(result["sha256"])
            print(f"pair {pair + 1}  {tree}: {result['sentences_per_s']:.1f} sentences/s", flush=True)
    print(f"mean_ratio={statistics.mean(speeds[1]) / statistics.mean(speeds[0]):.3f}")
    print(f"same_outputs={'yes' if len(digests) == 1 else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
