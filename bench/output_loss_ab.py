"""A training step with this checkout's ``output_loss`` against an earlier commit's, side by side.

    python bench/output_loss_ab.py --before 04bf73a

The two versions of ``transformer/loss.py`` (the earlier one read with ``git show``) alternate step by step
on the same model (default sizes) and real Multi30k batches, in fp32 and under bf16 autocast; the first
round warms up, the others are timed. Prints the median step time of each and the speed-up.
"""

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from train_throughput import SIZES, real_batches  # noqa: E402

from transformer.config import TrainConfig  # noqa: E402
from transformer.loss import output_loss  # noqa: E402
from transformer.model import Transformer  # noqa: E402
from transformer.optim import make_optimizer, set_lr  # noqa: E402


def loss_at(commit: str):
    """``output_loss`` as ``transformer/loss.py`` was at ``commit``."""
    source = subprocess.run(
        ["git", "show", f"{commit}:transformer/loss.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py") as f:
        f.write(source)
        f.flush()
        spec = importlib.util.spec_from_file_location("loss_before", f.name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module.output_loss


def timed_step(model, optimizer, batch, loss_fn, bf16: bool) -> float:
    """Seconds of one forward (under bf16 autocast or not), ``loss_fn``, backward and Adam step."""
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        features = model(batch.src, batch.tgt_in, project=False)  # (B, T, D)
        loss = loss_fn(features, model.output_proj, batch.tgt_out, 0, 0.1) / batch.n_tgt_tokens
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare with, e.g. 04bf73a")
    parser.add_argument("--data-dir", help="Multi30k folder (default: $MULTI30K_DIR, else data/multi30k)")
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3, help="over all batches; the first is not timed")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    batches, vocab = real_batches(args.data_dir, 4000, args.batches)
    model = Transformer(SIZES["default"], vocab, vocab, 0, 2, 3).train()
    optimizer = make_optimizer(model, TrainConfig())
    set_lr(optimizer, 1e-5)
    versions = {"before": loss_at(args.before), "after": output_loss}
    times = {(name, p): [] for name in versions for p in ("fp32", "bf16")}
    for round_ in range(args.rounds):
        for batch in batches:
            for precision in ("fp32", "bf16"):
                for name, loss_fn in versions.items():
                    seconds = timed_step(model, optimizer, batch, loss_fn, precision == "bf16")
                    if round_:
                        times[(name, precision)].append(seconds)
    for precision in ("fp32", "bf16"):
        before, after = (statistics.median(times[(name, precision)]) for name in versions)
        print(
            f"{precision}: before ({args.before}) {before * 1e3:.0f} ms a step, after {after * 1e3:.0f} ms,"
            f" speed-up {before / after:.3f}"
        )


if __name__ == "__main__":
    main()
