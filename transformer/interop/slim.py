"""Inference-only checkpoints: the config, the weights to translate with and the tokenizer — no optimizer,
no training weights under a moving average, no RNG state — small enough to carry to another machine.

    python -m transformer.interop.slim RUN/best.pt model.pt [--dtype bf16]

``load_for_inference`` (so ``translate.py`` and ``bench/decode_speed.py``) reads the result like any
checkpoint; ``--resume`` cannot start from it. ``--dtype bf16`` / ``fp16`` halves the file again: the weights
are stored rounded and read back into a float32 model.
"""

import argparse
import sys
from pathlib import Path

import torch

from transformer.core.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def slim_checkpoint(src: str | Path, dst: str | Path, dtype: str = "fp32") -> dict:
    """Write ``dst`` with ``src``'s config, model (floating tensors as ``dtype``) and tokenizer; returns
    that dict."""
    state = load_checkpoint(src)
    to = DTYPES[dtype]
    slim = {
        "config": state["config"],
        "model": {k: v.to(to) if v.is_floating_point() else v for k, v in state["model"].items()},
        "tokenizer": state["tokenizer"],
    }
    save_checkpoint(slim, dst)
    return slim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint written by train.py (best.pt, last.pt)")
    parser.add_argument("output", help="where to write the inference-only checkpoint")
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="stored weights (fp32: exact)")
    args = parser.parse_args(argv)
    try:
        slim_checkpoint(args.checkpoint, args.output, args.dtype)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    before, after = Path(args.checkpoint).stat().st_size, Path(args.output).stat().st_size
    print(f"{args.output}: {after / 2**20:.1f} MiB (from {before / 2**20:.1f} MiB), {args.dtype} weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
