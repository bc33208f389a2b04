"""How much of a batch is padding: token buckets (§5.1, `make_batches`) against random batches.

    .venv/bin/python bench/padding_fraction.py

Trains (once, then loads) a joint 8000-piece BPE model on Multi30k de-en train, builds one training
epoch of batches under a budget of `--max-tokens` padded tokens, and counts PAD tokens over all
tokens of `src` + `tgt_out` (`tgt_in` has the same padding as `tgt_out`). The random baseline cuts
a shuffled epoch under the same budget without sorting by length.
"""

import argparse
import time
from pathlib import Path

import torch

from transformer.core.batches import cut_into_batches, iter_batches, make_batches
from transformer.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transformer.training.multi30k import load_multi30k
from transformer.training.splits import encode_split
from transformer.training.tokenizer_job import train_tokenizer


def padding_fraction(batches, src_ids, tgt_ids) -> tuple[float, int]:
    """(PAD tokens / all tokens in src + tgt_out, all tokens) over the collated batches."""
    pad, total = 0, 0
    for batch in iter_batches(src_ids, tgt_ids, batches, PAD_ID, BOS_ID, EOS_ID):
        total += batch.src.numel() + batch.tgt_out.numel()
        pad += int((batch.src == PAD_ID).sum() + (batch.tgt_out == PAD_ID).sum())
    return pad / total, total


def report(name: str, batches: list[list[int]], src_ids, tgt_ids) -> None:
    fraction, total = padding_fraction(batches, src_ids, tgt_ids)
    sentences = sum(len(batch) for batch in batches)
    print(
        f"{name:<28} padding {fraction:6.1%}   batches {len(batches):5d}   "
        f"sentences/batch {sentences / len(batches):6.1f}   padded tokens {total}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="Multi30k folder (else $MULTI30K_DIR, else your data folder)")
    parser.add_argument("--tokenizer", default="runs/bench/spm_de_en_8000.model")
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    dataset = load_multi30k("de", "en", data_dir=args.data_dir)
    train = dataset["train"]
    if Path(args.tokenizer).is_file():
        tokenizer = Tokenizer(args.tokenizer)
    else:
        start = time.perf_counter()
        sentences = train.src + train.tgt
        prefix = Path(args.tokenizer).with_suffix("")
        tokenizer = train_tokenizer(sentences, prefix, vocab_size=8000)
        print(f"trained {prefix}.model in {time.perf_counter() - start:.1f} s")

    start = time.perf_counter()
    src_ids, tgt_ids = encode_split(train, tokenizer)
    print(f"encoded {len(train)} sentence pairs in {time.perf_counter() - start:.2f} s")
    src_lengths, tgt_lengths = [len(s) for s in src_ids], [len(t) for t in tgt_ids]
    n_real = sum(src_lengths) + sum(tgt_lengths) + 2 * len(train)  # + EOS / BOS per side
    print(f"{n_real} real tokens in src + tgt_out; max_tokens {args.max_tokens}\n")

    lengths = (src_lengths, tgt_lengths, args.max_tokens)
    start = time.perf_counter()
    bucketed = make_batches(*lengths, shuffle=True, seed=args.seed, epoch=0)
    seconds = time.perf_counter() - start
    report("token buckets (training)", bucketed, src_ids, tgt_ids)
    report("sorted (evaluation mode)", make_batches(*lengths, shuffle=False), src_ids, tgt_ids)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed))
    report("random order", cut_into_batches(order.tolist(), *lengths), src_ids, tgt_ids)
    print(f"\nmake_batches for one epoch: {seconds * 1000:.0f} ms")


if __name__ == "__main__":
    main()
