"""Decoding speed: greedy with the key/value cache vs. recomputing the whole prefix every step, and beam 4.

Decodes Multi30k test_2016_flickr (1000 sentences, in the checkpoint's direction, de→en for the default
config) with one checkpoint and the same length-sorted batches three ways, one run each: cached greedy,
uncached greedy (``use_cache=False``) and beam search (K=4, α=0.6, cached). Reports sentences per second
and BLEU, and checks that the cached and uncached outputs are identical.

    python bench/decode_speed.py [--checkpoint RUN/best.pt] [--data-dir DIR] [--limit N] [--max-tokens N]

Without --checkpoint it uses runs/decode_bench/best.pt, training it first if needed with train.py
(configs/multi30k_de_en.yaml with a 5-minute budget: about 7 minutes in all on a 2-core CPU).

Last line: speedup_cache=<cached greedy sentences/s ÷ uncached greedy sentences/s>.
"""

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from transformer.checkpoint import CheckpointError, load_for_inference
from transformer.corpus import load_multi30k
from transformer.evaluation import bleu_chrf, translate_ids

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RUN = ROOT / "runs" / "decode_bench"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help=f"default: {DEFAULT_RUN}/best.pt, trained if absent")
    parser.add_argument(
        "--data-dir", default=os.environ.get("MULTI30K_DIR") or str(ROOT.parent / "shared/data/multi30k")
    )
    parser.add_argument("--limit", type=int, default=0, help="only the first N test sentences (smoke runs)")
    parser.add_argument("--max-tokens", type=int, help="batch size (default: checkpoint eval.max_tokens)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, help="default: the checkpoint's eval.length_penalty")
    parser.add_argument("--train-minutes", type=float, default=5.0, help="budget when training a checkpoint")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def train_checkpoint(data_dir: str, minutes: float) -> Path:
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/multi30k_de_en.yaml"),
        "--run-dir", str(DEFAULT_RUN), "--data-dir", data_dir,
        "--set", f"train.max_minutes={minutes}", "--set", "eval.every_steps=0",
    ]  # fmt: skip
    print(f"no checkpoint given: training one ({minutes} min budget) into {DEFAULT_RUN}", flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return DEFAULT_RUN / "best.pt"


def decode(model, src_ids, tokenizer, device, settings, method: dict) -> tuple[list[list[int]], float]:
    """(outputs in input order, seconds) of ``translate_ids`` with the decoding options in ``method``."""
    start = time.perf_counter()
    use_cache = method.pop("use_cache", True)
    settings = dataclasses.replace(settings, **method)
    outputs = translate_ids(
        model, src_ids, tokenizer, device, contextlib.nullcontext, settings, use_cache=use_cache
    )
    return outputs, time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    checkpoint = Path(args.checkpoint) if args.checkpoint else DEFAULT_RUN / "best.pt"
    if args.checkpoint is None and not checkpoint.is_file():
        checkpoint = train_checkpoint(args.data_dir, args.train_minutes)
    try:
        model, tokenizer, config = load_for_inference(checkpoint, args.device)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    data = config.data
    test = load_multi30k(data.src_lang, data.tgt_lang, args.data_dir)["test"].head(args.limit)
    src_ids, references = tokenizer.encode_batch(test.src), test.tgt
    settings = dataclasses.replace(config.eval, max_tokens=args.max_tokens or config.eval.max_tokens)
    max_tokens = settings.max_tokens
    penalty = config.eval.length_penalty if args.length_penalty is None else args.length_penalty
    methods = {
        "greedy, cache": {"beam_size": 1},
        "greedy, no cache": {"beam_size": 1, "use_cache": False},
        f"beam {args.beam}, cache": {"beam_size": args.beam, "length_penalty": penalty},
    }
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{checkpoint}: {n_params / 1e6:.2f}M parameters, {data.src_lang}→{data.tgt_lang}, {len(src_ids)} "
        f"sentences, batches of <= {max_tokens} tokens, {args.device}, {torch.get_num_threads()} threads",
        flush=True,
    )
    for method in methods.values():  # warm-up: first-call allocations are no one's cost
        decode(model, src_ids[:8], tokenizer, args.device, settings, dict(method))
    results = {}
    for name, method in methods.items():
        outputs, seconds = decode(model, src_ids, tokenizer, args.device, settings, dict(method))
        results[name] = (outputs, len(src_ids) / seconds)
        bleu = bleu_chrf(tokenizer.decode_batch(outputs), references)["bleu"]
        mean_length = sum(len(o) for o in outputs) / max(len(outputs), 1)
        print(
            f"{name:>16}: {seconds:7.1f} s  {len(src_ids) / seconds:8.1f} sentences/s  "
            f"BLEU {bleu:5.2f}  mean output {mean_length:.1f} tokens",
            flush=True,
        )
    cached, uncached = results["greedy, cache"][0], results["greedy, no cache"][0]
    differ = sum(a != b for a, b in zip(cached, uncached))
    print(
        "cached and uncached greedy outputs identical: "
        + ("yes" if differ == 0 else f"NO, {differ} of {len(cached)} sentences differ")
    )
    print(f"speedup_cache={results['greedy, cache'][1] / results['greedy, no cache'][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
