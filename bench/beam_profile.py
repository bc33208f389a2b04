"""Where a search's time goes: ``torch.profiler`` over ``Translator.translate`` of Multi30k test_2016_flickr.

    python bench/beam_profile.py CHECKPOINT [--beam 4] [--length-penalty 0.6] [--limit N] [--top 15]

Translates the test set once unprofiled (sentences/s), then once under the profiler, and prints the
operations by self CPU time, the matrix products split by weight shape, each with its calls, share and,
for the products, GFLOP/s (2 · rows · in · out per call, from the recorded shapes). The output layer is the
product with the vocabulary's rows. The profiler's per-call cost inflates small operations, and on some
CPUs the profiled self time of the output layer's oneDNN product is several times its real time (an Intel
Xeon with AMX: 2.8 s profiled, 0.8 s in wall-clock time), so the unprofiled pass also times the output
layer by the clock, between hooks on the module, and prints it above the table.
"""

import argparse
import collections
import dataclasses
import math
import sys
import time

from torch.profiler import ProfilerActivity, profile

from transformer.checkpoint import load_for_inference
from transformer.multi30k import load_multi30k
from transformer.translator import Translator


def product_shape(name: str, shapes: list[list[int]]) -> tuple[int, int, int] | None:
    """(rows, in, out) of one recorded product, or None: _linear_pointwise(x (..., in), weight (out, in),
    ...), addmm(bias, x (rows, in), weight.T (in, out)), mm(x (rows, in), (in, out))."""
    if name == "mkldnn::_linear_pointwise" and len(shapes) > 1 and len(shapes[1]) == 2:
        return math.prod(shapes[0][:-1]), shapes[1][1], shapes[1][0]
    matrices = [s for s in shapes if len(s) == 2]
    if name in ("aten::addmm", "aten::mm") and len(matrices) == 2:
        return matrices[0][0], matrices[0][1], matrices[1][1]
    return None


def grouped(events, vocab_size: int) -> list[tuple[str, int, float, float]]:
    """(label, calls, self ms, GFLOP or 0) per operation, products split by weight shape; most time first."""
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])  # calls, self ms, GFLOP
    for event in events:
        label, shape = event.key, product_shape(event.key, event.input_shapes or [])
        if shape is not None:  # a product: packed (the decoder's) or F.linear's
            rows, n_in, n_out = shape
            role = "the output layer" if n_out == vocab_size else f"weight {n_in}→{n_out}"
            label = f"{event.key} ({role})"
            groups[label][2] += event.count * 2 * rows * n_in * n_out / 1e9
        groups[label][0] += event.count
        groups[label][1] += event.self_cpu_time_total / 1e3
    return sorted(((k, calls, ms, gflop) for k, (calls, ms, gflop) in groups.items()), key=lambda g: -g[2])


class ModuleClock:
    """Wall-clock seconds, calls and GFLOP of an ``nn.Linear`` while the block runs, between a forward
    pre-hook and a forward hook (hooks run whatever ``forward`` the module has, packed or not)."""

    def __init__(self, linear):
        self.linear, self.seconds, self.calls, self.gflop, self._start = linear, 0.0, 0, 0.0, 0.0

    def _before(self, module, inputs):
        self._start = time.perf_counter()

    def _after(self, module, inputs, output):
        self.seconds += time.perf_counter() - self._start
        self.calls += 1
        rows = inputs[0].numel() // self.linear.in_features
        self.gflop += 2 * rows * self.linear.in_features * self.linear.out_features / 1e9

    def __enter__(self):
        self._hooks = [
            self.linear.register_forward_pre_hook(self._before),
            self.linear.register_forward_hook(self._after),
        ]
        return self

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a training or slim checkpoint")
    parser.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--limit", type=int, default=None, help="only the first N test sentences")
    parser.add_argument("--top", type=int, default=15, help="rows of the table")
    parser.add_argument("--data-dir", default=None, help="Multi30k folder (default: the project's rule)")
    args = parser.parse_args(argv)
    model, tokenizer, config = load_for_inference(args.checkpoint, "cpu")
    settings = dataclasses.replace(config.eval, beam_size=args.beam, length_penalty=args.length_penalty)
    translator = Translator(model, tokenizer, settings, "cpu", "fp32")
    sources = load_multi30k(config.data.src_lang, config.data.tgt_lang, args.data_dir)["test"].src
    sources = sources[: args.limit]
    translator.translate(sources[:8])  # warm-up
    with ModuleClock(model.output_proj) as output_layer:
        start = time.perf_counter()
        translator.translate(sources)
        seconds = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        translator.translate(sources)
    rows = grouped(profiler.key_averages(group_by_input_shape=True), model.output_proj.out_features)
    total_ms = sum(ms for _, _, ms, _ in rows)
    print(f"{len(sources)} sentences, beam {args.beam}: {len(sources) / seconds:.1f} sentences/s unprofiled; "
          f"{total_ms / 1e3:.2f} s of self CPU time profiled")  # fmt: skip
    print(f"the output layer unprofiled, by the clock: {output_layer.seconds:.2f} s of {seconds:.2f} s "
          f"({100 * output_layer.seconds / seconds:.1f} %), {output_layer.calls} calls, "
          f"{output_layer.gflop / output_layer.seconds:.0f} GFLOP/s\n")  # fmt: skip
    print("| operation | calls | self ms | share | GFLOP/s |\n| --- | --- | --- | --- | --- |")
    for label, calls, ms, gflop in rows[: args.top]:
        rate = f"{gflop / (ms / 1e3):.0f}" if gflop else ""
        print(f"| `{label}` | {calls} | {ms:.0f} | {100 * ms / total_ms:.1f} % | {rate} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
