"""How good are the attention word alignments? Measures the rule of ``transformer/inference/alignment.py``
for every
decoder layer and both row conventions, on (source, reference) pairs of a split, teacher-forced:

  - diag: mean |(i + ½)/m - (j + ½)/n| over the links (source word i of m, target word j of n): 0 on the
    diagonal; Multi30k de→en is mostly monotone, so a layer that aligns should be near it;
  - mono: the share of adjacent target words whose mean linked source position does not go backwards;
  - entropy: the mean entropy (nats) of the head-averaged attention rows: how peaked the layer is;
  - with eflomal installed (``pip install eflomal``; ``--no-eflomal`` skips it): agreement with eflomal's
    statistical alignments, trained on the training split plus these pairs, over the same words:
    precision against its union of both directions, recall against their intersection, and
    AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|) with S = intersection, P = union (lower is better).

    .venv/bin/python bench/alignment_quality.py RUN_DIR [--split test] [--limit N] [--train-limit N]

RUN_DIR holds best.pt and config.yaml (the corpus comes from its data settings). Prints a Markdown table
(the one in docs/alignments.md) and writes RUN_DIR/alignment_quality.json.
"""

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from transformer.inference.alignment import WORD_START, word_alignment, word_index
from transformer.inference.translator import Translator
from transformer.runtime.configs import load_config
from transformer.training.datasets import load_corpus

ROWS = ("predicted", "input")


def words(pieces: list[str]) -> list[str]:
    """Sub-word pieces -> the words ``word_alignment`` counts (lowercased, for eflomal)."""
    out: list[str] = []
    for piece, w in zip(pieces, word_index(pieces)):
        if w == len(out):
            out.append("")
        out[w] += piece.replace(WORD_START, "")
    return [w.lower() or "_" for w in out]


def diagonal(links, m: int, n: int) -> list[float]:
    return [abs((i + 0.5) / m - (j + 0.5) / n) for i, j in links]


def monotone(links) -> list[float]:
    """1.0 / 0.0 per adjacent pair of linked target words: does the mean source position not go back?"""
    by_target: dict[int, list[int]] = {}
    for i, j in links:
        by_target.setdefault(j, []).append(i)
    means = [sum(v) / len(v) for _, v in sorted(by_target.items())]
    return [float(b >= a) for a, b in zip(means, means[1:])]


def attention_links(translator: Translator, pairs) -> tuple[dict, list, list]:
    """Links per (layer, rows) per pair, the pairs' word lists, and the mean row entropy per layer."""
    links, word_lists = {}, []
    entropy: dict[int, list[float]] = {}
    for src, tgt in pairs:
        attention = translator.attention_ids(src, tgt)
        src_pieces, tgt_pieces = attention.source_pieces[:-1], attention.target_pieces[:-1]
        word_lists.append((words(src_pieces), words(tgt_pieces)))
        for layer, weights in enumerate(attention.cross):
            mean = weights.mean(dim=0)  # (T, S) heads averaged
            rows_entropy = -(mean * mean.clamp(min=1e-12).log()).sum(dim=-1)  # (T,)
            entropy.setdefault(layer, []).extend(rows_entropy.tolist())
            for rows in ROWS:
                links.setdefault((layer, rows), []).append(word_alignment(mean, src_pieces, tgt_pieces, rows))
    return links, word_lists, [sum(v) / len(v) for _, v in sorted(entropy.items())]


def run_eflomal(train_words, eval_words) -> tuple[list[set], list[set]] | None:
    """eflomal's (intersection, union) link sets of the ``eval_words`` pairs, trained with ``train_words``."""
    try:
        import eflomal
    except ImportError:
        print("eflomal is not installed (pip install eflomal): no agreement columns", file=sys.stderr)
        return None
    pairs = train_words + eval_words
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = Path(tmp) / "fwd", Path(tmp) / "rev"
        eflomal.Aligner().align(
            [" ".join(s) for s, _ in pairs], [" ".join(t) for _, t in pairs],
            links_filename_fwd=str(fwd), links_filename_rev=str(rev), quiet=True,
        )  # fmt: skip
        read = (
            lambda path: [  # noqa: E731
                {tuple(map(int, link.split("-"))) for link in line.split()}
                for line in path.read_text().split("\n")[len(train_words) : len(pairs)]
            ]
        )
        forward, reverse = read(fwd), read(rev)
    return [f & r for f, r in zip(forward, reverse)], [f | r for f, r in zip(forward, reverse)]


def agreement(links: list, sure: list[set], possible: list[set]) -> dict[str, float]:
    a = sum(len(x) for x in links)
    a_s = sum(len(set(x) & s) for x, s in zip(links, sure))
    a_p = sum(len(set(x) & p) for x, p in zip(links, possible))
    n_s = sum(len(s) for s in sure)
    return {
        "precision": a_p / max(a, 1),
        "recall": a_s / max(n_s, 1),
        "aer": 1.0 - (a_s + a_p) / max(a + n_s, 1),
    }


def statistics(links: list, word_lists: list) -> dict[str, float]:
    diag = [d for x, (s, t) in zip(links, word_lists) for d in diagonal(x, len(s), len(t))]
    mono = [v for x in links for v in monotone(x)]
    return {"diag": sum(diag) / max(len(diag), 1), "mono": sum(mono) / max(len(mono), 1)}


def table(results: dict) -> str:
    agree = "eflomal" in results
    head = "| alignments | layer | rows | diag ↓ | mono ↑ | entropy |" + (
        " P ↑ | R ↑ | AER ↓ |" if agree else ""
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for row in results["rows"]:
        cells = [row["source"], str(row.get("layer", "")), row.get("rows", ""), f"{row['diag']:.3f}",
                 f"{row['mono']:.3f}", f"{row['entropy']:.2f}" if "entropy" in row else ""]  # fmt: skip
        if agree:
            cells += [f"{row[k]:.3f}" if k in row else "" for k in ("precision", "recall", "aer")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(args) -> dict:
    run_dir = Path(args.run_dir)
    config = load_config(run_dir / "config.yaml")
    translator = Translator.from_checkpoint(run_dir / "best.pt", args.device)
    corpus = load_corpus(config.data)
    split = corpus[args.split].head(args.limit)
    pairs = list(zip(translator.encode(split.src), translator.encode_targets(split.tgt)))
    pairs = [(s, t) for s, t in pairs if s is not None and t]
    t0 = time.perf_counter()
    links, word_lists, entropy = attention_links(translator, pairs)
    results = {"run_dir": str(run_dir), "split": args.split, "pairs": len(pairs), "rows": []}
    sure_possible = None
    if not args.no_eflomal:
        train = corpus["train"].head(args.train_limit)
        tokenizer = translator.tokenizer
        train_words = [(words(tokenizer.id_to_piece(s)), words(tokenizer.id_to_piece(t)))
                       for s, t in zip(tokenizer.encode_batch(train.src), tokenizer.encode_batch(train.tgt))
                       if s and t]  # fmt: skip
        sure_possible = run_eflomal(train_words, word_lists)
        if sure_possible is not None:
            results["eflomal"] = {"train_pairs": len(train_words)}
            for name, reference in zip(("eflomal ∩", "eflomal ∪"), sure_possible):
                results["rows"].append(
                    {"source": name} | statistics([sorted(x) for x in reference], word_lists)
                )
    for (layer, rows), found in sorted(links.items()):
        row = {"source": "attention", "layer": layer, "rows": rows, "entropy": entropy[layer]}
        row |= statistics(found, word_lists)
        if sure_possible is not None:
            row |= agreement(found, *sure_possible)
        results["rows"].append(row)
    results["seconds"] = time.perf_counter() - t0
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--split", default="test", choices=("train", "validation", "test"))
    parser.add_argument("--limit", type=int, default=0, help="first N pairs of the split (0: all)")
    parser.add_argument(
        "--train-limit", type=int, default=0, help="first N training pairs for eflomal (0: all)"
    )
    parser.add_argument("--no-eflomal", action="store_true", help="only the diagonal / monotone statistics")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None, help="JSON file (default: RUN_DIR/alignment_quality.json)")
    args = parser.parse_args(argv)
    results = measure(args)
    print(table(results))
    scored = [r for r in results["rows"] if r["source"] == "attention"]
    key = (lambda r: r["aer"]) if "eflomal" in results else (lambda r: r["diag"])
    best = min(scored, key=key)
    by = "AER" if "eflomal" in results else "diag"
    print(f"\nbest by {by}: layer {best['layer']}, rows {best['rows']} "
          f"({results['pairs']} pairs of {results['split']}, {results['seconds']:.0f} s)")  # fmt: skip
    out = Path(args.out) if args.out else Path(args.run_dir) / "alignment_quality.json"
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0 if all(math.isfinite(r["diag"]) for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
