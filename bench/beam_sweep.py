"""The beam size and length penalty α chosen on the development set, as §6.1 did ("beam size of 4 and length
penalty α = 0.6 ... chosen after experimentation on the development set").

    python bench/beam_sweep.py CHECKPOINT [--beams 4] [--alphas 0 0.3 0.6 1.0 1.5] [--limit N]

Decodes the validation set with every (beam, α) for a trained checkpoint (the run's tokenizer and eval
settings) and prints a markdown table, best validation BLEU first, with sacreBLEU's length ratio (the
hypotheses' words ÷ the references'; below 1 costs BLEU's brevity penalty). Test BLEU is printed for the
best row only, so that the table cannot be read as a choice made on the test set.
"""

import argparse
import dataclasses
import sys

from transformer.inference.translator import Translator
from transformer.runtime.checkpoints import load_for_inference
from transformer.training.multi30k import load_multi30k

Row = tuple[float, int, float, float, float | None]  # validation BLEU, beam, α, length ratio, test BLEU


def sweep(checkpoint: str, beams, alphas, data_dir=None, limit=None) -> list[Row]:
    """(validation BLEU, beam, α, validation length ratio, test BLEU or None) for every setting, best
    validation first; test BLEU for the first row only. Beam 1 (greedy) ignores α and is decoded once, as
    α 0."""
    model, tokenizer, config = load_for_inference(checkpoint)
    corpus = load_multi30k(config.data.src_lang, config.data.tgt_lang, data_dir)
    splits = {name: (corpus[name].src[:limit], corpus[name].tgt[:limit]) for name in ("validation", "test")}

    def bleu(split: str, beam: int, alpha: float) -> tuple[float, float]:
        """(BLEU, length ratio) of ``split`` decoded with this beam and α."""
        settings = dataclasses.replace(config.eval, beam_size=beam, length_penalty=alpha)
        translator = Translator(model, tokenizer, settings, "cpu", "fp32")
        src, references = splits[split]
        scores = translator.evaluate(tokenizer.encode_batch(src), references)[2]
        return scores["bleu"], scores["length_ratio"]

    settings = sorted({(beam, alpha if beam > 1 else 0.0) for beam in beams for alpha in alphas})
    rows = []
    for beam, alpha in settings:
        val, ratio = bleu("validation", beam, alpha)
        rows.append((val, beam, alpha, ratio, None))
        print(f"beam {beam}, α {alpha}: validation {val:.2f}", file=sys.stderr, flush=True)
    rows.sort(key=lambda row: -row[0])
    best_val, best_beam, best_alpha, best_ratio, _ = rows[0]
    rows[0] = (best_val, best_beam, best_alpha, best_ratio, bleu("test", best_beam, best_alpha)[0])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a training checkpoint (runs/NAME/best.pt)")
    parser.add_argument("--beams", type=int, nargs="+", default=[4])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.3, 0.6, 1.0, 1.5])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences of each split")
    args = parser.parse_args(argv)
    rows = sweep(args.checkpoint, args.beams, args.alphas, args.data_dir, args.limit)
    print(f"{args.checkpoint}: validation BLEU by beam and α, best first\n")
    print("| beam | α | validation BLEU | length ratio | test BLEU |\n| --- | --- | --- | --- | --- |")
    for val, beam, alpha, ratio, test in rows:
        if test is None:
            print(f"| {beam} | {alpha} | {val:.2f} | {ratio:.3f} | |")
        else:
            print(f"| **{beam}** | **{alpha}** | **{val:.2f}** | {ratio:.3f} | {test:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
