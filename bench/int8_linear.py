"""Why ``--precision int8`` decodes slower than fp32: one linear layer at decoding's row counts, three ways.

    python bench/int8_linear.py [--rows 8 64 256] [--calls 200]

For each linear layer shape of the main job's model (the attention's packed projections, the feed-forward
layers, the output layer) and each number of rows (a decoding step multiplies one row per live hypothesis),
times, in turn:
- fp32: ``nn.Linear`` (``F.linear``);
- torchao: the same layer after ``quantize_(Int8DynamicActivationInt8WeightConfig())``, as
  ``transformer/quantize.py`` makes it (int8 weights per output channel, the input quantized per token);
- lean: the same math with no tensor subclass: the input's per-token scale and int8 values in a few tensor
  operations (rounded as torchao rounds them), torchao's own ``int_scaled_matmul`` (``torch._int_mm`` and
  the rows' scales), then the weight's scales and the bias: what the int8 math costs without torchao's
  dispatch in Python.
Prints microseconds per call, the speed-ups, and each int8 layer's largest error relative to fp32's output.
Needs the extra ``.[int8]``; on a CPU without VNNI or AMX the int8 products run a slow reference kernel.
"""

import argparse
import copy
import logging
import sys
import time

import torch
from torch import nn

SHAPES = [(256, 768), (256, 256), (256, 1024), (1024, 256), (256, 8000)]  # (in, out): qkv, out, ffn, vocab
HALF_RANGE = 127.5  # torchao's symmetric int8 scale: the largest magnitude / ((127 - (-128)) / 2)
EPS = torch.finfo(torch.float32).eps  # torchao's smallest scale


def int8_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K) as int8 values (M, K) and one scale per row (M, 1), rounded as torchao rounds them."""
    scale = (x.abs().amax(-1, keepdim=True) / HALF_RANGE).clamp_min_(EPS)  # (M, 1)
    return (x * (1.0 / scale)).round_().clamp_(-128, 127).to(torch.int8), scale


def lean_int8(linear: nn.Linear):
    """``linear`` as int8 weights with one scale per output channel, and a function x -> its output."""
    from torchao.kernel.intmm import int_scaled_matmul

    weight_int8, weight_scale = int8_per_row(linear.weight.detach())  # (out, in), (out, 1)
    weight_int8_t, weight_scale = weight_int8.t().contiguous(), weight_scale.flatten()  # (in, out), (out,)
    bias = linear.bias.detach()  # (out,)

    def forward(x: torch.Tensor) -> torch.Tensor:  # (M, in) -> (M, out)
        x_int8, x_scale = int8_per_row(x)  # (M, in), (M, 1)
        rows_scaled = int_scaled_matmul(x_int8, weight_int8_t, x_scale)  # (M, out) fp32
        return rows_scaled.mul_(weight_scale).add_(bias)  # (M, out)

    return forward


def microseconds(layer, x: torch.Tensor, calls: int) -> float:
    for _ in range(10):
        layer(x)
    start = time.perf_counter()
    for _ in range(calls):
        layer(x)
    return (time.perf_counter() - start) / calls * 1e6


def compare(fp32: nn.Linear, torchao: nn.Module, rows: int, calls: int) -> str:
    """One line: the three layers' microseconds per call on ``rows`` random rows, speed-ups, errors."""
    lean = lean_int8(fp32)
    x = torch.randn(rows, fp32.in_features)  # (M, in)
    reference = fp32(x)  # (M, out)
    error = [((f(x) - reference).abs().max() / reference.abs().max()).item() for f in (torchao, lean)]
    t_fp32, t_torchao, t_lean = (microseconds(f, x, calls) for f in (fp32, torchao, lean))
    return (
        f"{fp32.in_features}->{fp32.out_features} rows {rows}: fp32 {t_fp32:.1f} us, torchao {t_torchao:.1f} "
        f"us, lean {t_lean:.1f} us; lean vs fp32 {t_fp32 / t_lean:.2f}x, vs torchao "
        f"{t_torchao / t_lean:.2f}x; error torchao {error[0]:.4f}, lean {error[1]:.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    logging.getLogger("torchao").setLevel(logging.ERROR)  # its optional GPU kernels fail to load on a CPU
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(0)
    print(f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    with torch.no_grad():
        for n_in, n_out in SHAPES:
            fp32 = nn.Linear(n_in, n_out)
            torchao = copy.deepcopy(fp32)
            quantize_(torchao, Int8DynamicActivationInt8WeightConfig())
            for rows in args.rows:
                print(compare(fp32, torchao, rows, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
