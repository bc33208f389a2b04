"""Decoding speed: greedy with the key/value cache vs. recomputing the whole prefix every step, and beam 4.

Decodes Multi30k test_2016_flickr (1000 sentences, in the checkpoint's direction, de→en for the default
config) with one checkpoint and the same length-sorted batches three ways, one run each: cached greedy,
uncached greedy (``use_cache=False``) and beam search (K=4, α=0.6, cached). Reports sentences per second
and BLEU, and checks that the cached and uncached outputs are identical.

    python bench/decode_speed.py --checkpoint RUN/best.pt [--data-dir DIR] [--limit N] [--max-tokens N]

The checkpoint may be a training one or an inference-only one made beforehand with
``python -m transformer.slim RUN/best.pt model.pt`` (config, weights and tokenizer: small enough to carry to
another machine). Without --checkpoint it uses runs/decode_bench/best.pt if it is there; otherwise it refuses,
unless ``--train-minutes N`` asks it to train one first with train.py (configs/multi30k_de_en.yaml).

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
SHARED_DATA = ROOT.parent / "shared/data/multi30k"  # the offline mirror beside the checkout, when there


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help=f"training or slim checkpoint (default: {DEFAULT_RUN}/best.pt)")
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("MULTI30K_DIR") or (str(SHARED_DATA) if SHARED_DATA.is_dir() else None),
        help="Multi30k folder (default: $MULTI30K_DIR, ../shared/data/multi30k, else the checkout's data/)",
    )
    parser.add_argument("--limit", type=int, default=0, help="only the first N test sentences (smoke runs)")
    parser.add_argument("--max-tokens", type=int, help="batch size (default: checkpoint eval.max_tokens)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, help="default: the checkpoint's eval.length_penalty")
    parser.add_argument("--train-minutes", type=float, help="no checkpoint: train one first for N minutes")
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def train_checkpoint(data_dir: str | None, minutes: float) -> Path:
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/multi30k_de_en.yaml"),
        "--run-dir", str(DEFAULT_RUN), "--set", f"train.max_minutes={minutes}", "--set", "eval.every_steps=0",
    ] + (["--data-dir", data_dir] if data_dir else [])  # fmt: skip
    print(f"no checkpoint given: training one ({minutes} min budget) into {DEFAULT_RUN}", flush=True)
    subprocess.run(command, check=True, cwd=ROOT)
    return DEFAULT_RUN / "best.pt"


def decode(
    model, src_ids, tokenizer, device, settings, method: dict, autocast=contextlib.nullcontext
) -> tuple[list[list[int]], float]:
    """(outputs in input order, seconds) of ``translate_ids`` with the decoding options in ``method``."""
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    use_cache = method.pop("use_cache", True)
    settings = dataclasses.replace(settings, **method)
    outputs = translate_ids(model, src_ids, tokenizer, device, autocast, settings, use_cache=use_cache)
    sync()
    return outputs, time.perf_counter() - start


def measure_decoding(
    model, tokenizer, settings, test, device, beam: int, autocast=contextlib.nullcontext, log=print
) -> dict:
    """Decode ``test`` (a ParallelText) three ways with the same batches (``settings``: an EvalConfig):
    {method: {seconds, sentences_per_s, bleu, chrf, mean_output_tokens}} plus whether cached and uncached
    greedy agree and the sacreBLEU signature. One warm-up on 8 sentences first."""
    src_ids = tokenizer.encode_batch(test.src)
    methods = {
        "greedy_cache": {"beam_size": 1},
        "greedy_no_cache": {"beam_size": 1, "use_cache": False},
        f"beam{beam}_cache": {"beam_size": beam},
    }
    for method in methods.values():  # warm-up: first-call allocations are no one's cost
        decode(model, src_ids[:8], tokenizer, device, settings, dict(method), autocast)
    results, outputs = {}, {}
    for name, method in methods.items():
        outputs[name], seconds = decode(model, src_ids, tokenizer, device, settings, dict(method), autocast)
        scores = bleu_chrf(tokenizer.decode_batch(outputs[name]), test.tgt)
        results[name] = {
            "seconds": seconds,
            "sentences_per_s": len(src_ids) / seconds,
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "mean_output_tokens": sum(len(o) for o in outputs[name]) / max(len(outputs[name]), 1),
        }
        log(
            f"{name:>16}: {seconds:7.1f} s  {results[name]['sentences_per_s']:8.1f} sentences/s  "
            f"BLEU {scores['bleu']:5.2f}  mean output {results[name]['mean_output_tokens']:.1f} tokens"
        )
        results["signature"] = scores["signature"]
    cached, uncached = outputs["greedy_cache"], outputs["greedy_no_cache"]
    results["cache_differs"] = sum(a != b for a, b in zip(cached, uncached))
    results["speedup_cache"] = (
        results["greedy_cache"]["sentences_per_s"] / results["greedy_no_cache"]["sentences_per_s"]
    )
    return results


def main(argv=None) -> int:
    args = parse_args(argv)
    checkpoint = Path(args.checkpoint) if args.checkpoint else DEFAULT_RUN / "best.pt"
    if args.checkpoint is None and not checkpoint.is_file():
        if args.train_minutes is None:
            print(
                f"error: no checkpoint ({checkpoint} does not exist): pass --checkpoint RUN/best.pt (or an "
                "inference-only one from python -m transformer.slim), or --train-minutes N to train one",
                file=sys.stderr,
            )
            return 1
        checkpoint = train_checkpoint(args.data_dir, args.train_minutes)
    try:
        model, tokenizer, config = load_for_inference(checkpoint, args.device)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    data = config.data
    test = load_multi30k(data.src_lang, data.tgt_lang, args.data_dir)["test"].head(args.limit)
    settings = dataclasses.replace(
        config.eval,
        max_tokens=args.max_tokens or config.eval.max_tokens,
        length_penalty=config.eval.length_penalty if args.length_penalty is None else args.length_penalty,
    )
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"{checkpoint}: {n_params / 1e6:.2f}M parameters, {data.src_lang}→{data.tgt_lang}, {len(test)} "
        f"sentences, batches of <= {settings.max_tokens} tokens, {args.device}, "
        f"{torch.get_num_threads()} threads",
        flush=True,
    )
    results = measure_decoding(
        model, tokenizer, settings, test, args.device, args.beam, log=lambda line: print(line, flush=True)
    )
    differ = results["cache_differs"]
    print(
        "cached and uncached greedy outputs identical: "
        + ("yes" if differ == 0 else f"NO, {differ} of {len(test)} sentences differ")
    )
    print(f"speedup_cache={results['speedup_cache']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
