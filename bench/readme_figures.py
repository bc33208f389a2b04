"""The README's pictures, from a run folder: the validation curve and one cross-attention heatmap.

    python bench/readme_figures.py runs/multi30k_de_en [--sentence "Ein Hund rennt durch den Schnee."]

Writes docs/validation_curve.png (validation BLEU and loss against steps, from RUN_DIR/results.json) and
docs/cross_attention.png (the last decoder layer's cross-attention, mean of heads, for the sentence translated
greedily by RUN_DIR/best.pt).
"""

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere, no install
from transformer.checkpoint import load_for_inference  # noqa: E402
from transformer.evaluation import sentence_attention, translate_ids  # noqa: E402
from transformer.plotting import attention_figure  # noqa: E402


def validation_curve(results: dict, path: Path) -> None:
    history = results["validation"]
    steps = [entry["step"] for entry in history]
    fig, bleu_axis = plt.subplots(figsize=(5.0, 3.0), dpi=100)
    bleu_axis.plot(steps, [entry["val_bleu"] for entry in history], "o-", color="tab:blue")
    bleu_axis.set_xlabel("step (optimizer updates)")
    bleu_axis.set_ylabel("validation BLEU (greedy)", color="tab:blue")
    loss_axis = bleu_axis.twinx()
    loss_axis.plot(steps, [entry["val_loss"] for entry in history], "s--", color="tab:orange")
    loss_axis.set_ylabel("validation loss", color="tab:orange")
    title = (
        f"test BLEU {results['test_bleu']:.1f} ({results['decoding']}), {results['train_minutes']:.0f} min"
    )
    bleu_axis.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def cross_attention(checkpoint: Path, sentence: str, path: Path) -> str:
    model, tokenizer, config = load_for_inference(checkpoint)
    src_ids = tokenizer.encode(sentence)
    greedy = dataclasses.replace(config.eval, beam_size=1)
    hyp_ids = translate_ids(model, [src_ids], tokenizer, "cpu", contextlib.nullcontext, greedy)[0]
    attention, src_labels, tgt_labels, _ = sentence_attention(
        model, tokenizer, src_ids, hyp_ids, greedy.max_len_offset
    )
    last = len(attention.cross) - 1
    fig = attention_figure(
        attention.cross[last][0].mean(dim=0),
        src_labels,
        tgt_labels,
        f"cross-attention, layer {last} (mean of heads)",
    )
    fig.savefig(path)
    plt.close(fig)
    return tokenizer.decode(hyp_ids)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--sentence", default="Ein kleines Mädchen spielt mit einem Hund im Park.")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    results = json.loads((args.run_dir / "results.json").read_text())
    validation_curve(results, args.out_dir / "validation_curve.png")
    translation = cross_attention(
        args.run_dir / "best.pt", args.sentence, args.out_dir / "cross_attention.png"
    )
    print(f"{args.sentence} -> {translation}\nwrote {args.out_dir}/validation_curve.png, cross_attention.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
