"""One linear layer at decoding's row counts in fp32, bf16 and int8 (``--precision int8``'s layer).

    python bench/int8_linear.py [--rows 16 64 256] [--calls 200]

For each linear layer shape of the main job's model (the attention's packed projections, the feed-forward
layers, the output layer) and each number of rows (a decoding step multiplies one row per live hypothesis),
times, in turn:
- fp32: ``nn.Linear`` (``F.linear``);
- bf16: the same layer cast to bf16, on a bf16 input (what ``--precision bf16``'s copy of the model runs);
- int8: ``transformer.inference.quantize.Int8Linear`` (torchao's int8 weights per output channel, the input
quantized
  per row at every call, oneDNN's int8 kernel on the weight laid out once), on an fp32 input.
Prints microseconds per call, the speed-ups over fp32, and the int8 layer's largest error relative to
fp32's output. Needs the extra ``.[int8]``; on a CPU without VNNI or AMX int8 runs a slow kernel, and bf16
without AVX512-BF16 or AMX an emulated one.
"""

import argparse
import copy
import sys
import time

import torch
from torch import nn

from transformer.inference.quantize import Int8Linear

SHAPES = [(256, 768), (256, 256), (256, 1024), (1024, 256), (256, 8000)]  # (in, out): qkv, out, ffn, vocab


def microseconds(layer, x: torch.Tensor, calls: int) -> float:
    for _ in range(10):
        layer(x)
    start = time.perf_counter()
    for _ in range(calls):
        layer(x)
    return (time.perf_counter() - start) / calls * 1e6


def compare(fp32: nn.Linear, rows: int, calls: int) -> str:
    """One line: the three layers' microseconds per call on ``rows`` random rows, speed-ups, int8's error."""
    bf16 = copy.deepcopy(fp32).bfloat16()
    int8 = Int8Linear.quantize(fp32.weight, fp32.bias, torch.float32, "int8")
    x = torch.randn(rows, fp32.in_features)  # (M, in)
    reference = fp32(x)  # (M, out)
    error = ((int8(x) - reference).abs().max() / reference.abs().max()).item()
    runs = ((fp32, x), (bf16, x.bfloat16()), (int8, x))
    t_fp32, t_bf16, t_int8 = (microseconds(layer, inputs, calls) for layer, inputs in runs)
    return (
        f"{fp32.in_features}->{fp32.out_features} rows {rows}: fp32 {t_fp32:.1f} us, bf16 {t_bf16:.1f} us, "
        f"int8 {t_int8:.1f} us; vs fp32: bf16 {t_fp32 / t_bf16:.2f}x, int8 {t_fp32 / t_int8:.2f}x; "
        f"int8 vs bf16 {t_bf16 / t_int8:.2f}x; int8 error {error:.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"cpu capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    with torch.no_grad():
        for n_in, n_out in SHAPES:
            fp32 = nn.Linear(n_in, n_out)
            for rows in args.rows:
                print(compare(fp32, rows, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
