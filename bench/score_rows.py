"""How many rows beam search should score at a time on a CPU (``decoding.SCORE_ROWS``).

    python bench/score_rows.py CHECKPOINT [--rows 1200 600 200] [--blocks 128 256 512 1024] [--rounds 5]

Times ``decoding._row_best`` (the output layer on prepacked weights, the log-normaliser and each row's 2K
best tokens, the part of a beam search step that the block size changes) on random decoder outputs of
``--rows`` rows, once per block size in turn, ``--rounds`` times; each block size's fastest round counts.
Prints milliseconds per call and the speed-up over the first block size, and checks that every block size
gives the same scores and tokens.
"""

import argparse
import sys
import time

import torch

from transformer import decoding
from transformer.checkpoint import load_for_inference
from transformer.packed import packed_decoder

K = 4  # beams: each row's 2K best tokens


def time_blocks(model, rows: int, blocks: list[int], rounds: int) -> dict[int, float]:
    """The fastest seconds per ``_row_best`` call of ``rows`` rows for each block size."""
    features = torch.randn(rows, 1, model.config.d_model)  # (N, 1, D)
    fastest, results, configured = {}, {}, decoding.SCORE_ROWS
    try:
        for _ in range(rounds):
            for block in blocks:
                decoding.SCORE_ROWS = block
                results[block] = decoding._row_best(features, model, 2 * K, 1, None, torch.float32)  # warm-up
                start = time.perf_counter()
                for _ in range(5):
                    decoding._row_best(features, model, 2 * K, 1, None, torch.float32)
                fastest[block] = min(fastest.get(block, float("inf")), (time.perf_counter() - start) / 5)
    finally:
        decoding.SCORE_ROWS = configured
    first = results[blocks[0]]
    for block, (log_probs, tokens) in results.items():
        if not (torch.allclose(log_probs, first[0], atol=1e-5) and torch.equal(tokens, first[1])):
            raise SystemExit(f"block size {block} scores {rows} rows differently from {blocks[0]}")
    return fastest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--rows", type=int, nargs="+", default=[1200, 600, 200])
    parser.add_argument("--blocks", type=int, nargs="+", default=[128, 256, 512, 1024])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    model, _, _ = load_for_inference(args.checkpoint, "cpu")
    model.eval()
    with torch.no_grad(), packed_decoder(model):
        for rows in args.rows:
            fastest = time_blocks(model, rows, args.blocks, args.rounds)
            base = fastest[args.blocks[0]]
            cells = [f"{b}: {s * 1e3:.1f} ms ({base / s:.2f}x)" for b, s in fastest.items()]
            print(f"{rows} rows  " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
