"""The attention function alone, and the peak memory of a training step, over sequence lengths 16…1024.

    python bench/attention.py [--lengths 16 64 256 1024] [--repeats 10]

1. Time of forward + backward of our ``scaled_dot_product_attention`` vs ``F.scaled_dot_product_attention``
   on (B=8, H=8, L, Dh=64) float32 tensors with a causal mask, interleaved, median of ``--repeats``.
2. Peak memory of one training step (forward + backward + Adam) of the default config's model at each
   length, ours vs the same model on ``nn.Transformer``: on CUDA ``torch.cuda.max_memory_allocated``; on CPU
   (Linux) the peak resident set size (VmHWM, reset through /proc/self/clear_refs just before the step)
   minus the resident size then, each measurement in a fresh subprocess.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import SIZES, TorchTransformerMT  # noqa: E402

from transformer.core.attention import scaled_dot_product_attention  # noqa: E402
from transformer.core.loss import token_loss  # noqa: E402
from transformer.core.masks import causal_mask  # noqa: E402
from transformer.core.model import Transformer  # noqa: E402


def time_attention(length: int, repeats: int, device: str) -> tuple[float, float]:
    q, k, v = (torch.randn(8, 8, length, 64, device=device, requires_grad=True) for _ in range(3))
    mask = causal_mask(length, torch.device(device))
    fns = {
        "ours": lambda: scaled_dot_product_attention(q, k, v, mask)[0],
        "torch": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    }
    times = {name: [] for name in fns}
    for i in range(repeats + 1):
        for name, fn in fns.items():
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn().sum().backward()
            if device == "cuda":
                torch.cuda.synchronize()
            if i:
                times[name].append(time.perf_counter() - t0)
    return statistics.median(times["ours"]), statistics.median(times["torch"])


def _status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (given there in kB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def training_step_memory(which: str, length: int, device: str) -> float:
    """MiB of peak memory added by one training step on a batch of 8 sentences of ``length`` tokens."""
    torch.manual_seed(0)
    sizes = SIZES["default"]
    model = Transformer(sizes, 8000, 8000, 0, 2, 3)
    if which == "torch":
        model = TorchTransformerMT(model)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    src = torch.randint(4, 8000, (8, length), device=device)
    tgt = torch.randint(4, 8000, (8, length), device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS restarts from the current RSS
        before = _status_bytes("VmRSS")
    loss = token_loss(model(src, tgt), tgt, 0, 0.1) / tgt.numel()
    loss.backward()
    optimizer.step()
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _status_bytes("VmHWM")
    return (peak - before) / 2**20


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--memory-only", nargs=2, metavar=("WHICH", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_only:  # child process: one measurement, printed as JSON
        print(json.dumps(training_step_memory(args.memory_only[0], int(args.memory_only[1]), args.device)))
        return

    print(f"torch {torch.__version__} on {args.device}, {torch.get_num_threads()} threads")
    print("attention forward+backward, (B=8, H=8, L, Dh=64) float32, causal mask, median ms")
    print(f"{'L':>6} {'ours':>10} {'F.sdpa':>10} {'ours/sdpa':>10}")
    for length in args.lengths:
        ours, theirs = time_attention(length, args.repeats, args.device)
        print(f"{length:>6} {ours * 1e3:>10.2f} {theirs * 1e3:>10.2f} {ours / theirs:>10.2f}")

    print("peak memory of one training step (default config sizes, 8 sentences of L tokens), MiB")
    print(f"{'L':>6} {'ours':>10} {'nn.Transformer':>15} {'ours/torch':>10}")
    for length in args.lengths:
        mib = {}
        for which in ("ours", "torch"):
            cmd = [sys.executable, __file__, "--device", args.device, "--memory-only", which, str(length)]
            mib[which] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        print(f"{length:>6} {mib['ours']:>10.1f} {mib['torch']:>15.1f} {mib['ours'] / mib['torch']:>10.2f}")


if __name__ == "__main__":
    main()
