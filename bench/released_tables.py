"""The tables of ``bench/released_model.py``: figures in, lines out (``log``); top entries picked here.

Layers and heads are counted from 0, as the block names (``decoder.2.cross``) and ``translate.py
--align-layer``; each title also gives the layer counted from 1, the way a reader would say it. Decoder rows
are labelled ``read -> predicted``: row i reads the decoder input token ``tgt_in[i]`` (the start token first,
then the translation shifted right) and predicts ``predicted[i]``.
"""

import torch
from mistakes import MISTAKES

from transformer.alignment import word_alignment, word_index

KIND_MASKS = {"encoder": "padding", "decoder": "causal", "cross": "padding"}
ROWS = "read -> predicted"  # the title of the decoder rows' labels
BLOCKS_PER_ROW = 6  # columns of the mistakes table before it wraps (18 blocks in a 6+6 model)


def layer_title(stack: str, layer: int, count: int) -> str:
    """'decoder layer 2 (from 0; layer 3 of 6 counted from 1)'."""
    return f"{stack} layer {layer} (from 0; layer {layer + 1} of {count} counted from 1)"


def row_labels(read: list[str], predicted: list[str]) -> list[str]:
    """'<pad> -> ▁Zwei': the decoder input token each row reads, and the token it predicts."""
    return [f"{r} -> {p}" for r, p in zip(read, predicted)]


def words(pieces: list[str]) -> list[str]:
    """Sub-word pieces merged into words (the rule of ``transformer.alignment``)."""
    index = word_index(pieces)
    merged = [""] * (index[-1] + 1 if index else 0)
    for piece, word in zip(pieces, index):
        merged[word] += piece
    return [word.replace("\u2581", "") or "\u2581" for word in merged]


def print_blocks(rows: dict, dtype: str, log=print) -> None:
    log(f"\n== 1. per-block differences, our attention vs Marian's modules (forward hooks, {dtype}) ==")
    log(f"{'block':<18} {'mask':<8} {'output max|Δ|':>14} {'weights max|Δ|':>15} {'max|output|':>12}")
    for name, row in rows.items():
        mask = KIND_MASKS[row["kind"]]
        log(f"{name:<18} {mask:<8} {row['output']:14.2e} {row['weights']:15.2e} {row['scale']:12.3f}")


def print_plain(rows: dict, dtype: str, log=print) -> None:
    """rows: {block: {"ours", "plain", "scale"}} for the three blocks of the first layer."""
    log(f"\n== 2. the plain formula (x @ W + b, scores / √d_k, -inf mask; {dtype}) on layer 0's blocks, fed "
        "Marian's inputs: max |Δ| from Marian's block output ==")  # fmt: skip
    log(f"{'block':<18} {'ours':>10} {'plain formula':>14} {'max|output|':>12}")
    for name, row in rows.items():
        log(f"{name:<18} {row['ours']:10.2e} {row['plain']:14.2e} {row['scale']:12.3f}")


def print_encoder_heads(weights: torch.Tensor, src_pieces: list[str], query: int, layer: int, count: int,
                        log=print) -> None:  # fmt: skip
    """weights (H, S, S) of one encoder layer's self-attention, padding dropped; the top 2 keys per head."""
    log(f"\n== 3. {layer_title('encoder', layer, count)} self-attention, query {src_pieces[query]!r} "
        f"(position {query}): top 2 keys per head ==")  # fmt: skip
    top_weights, top_keys = weights[:, query].topk(2, dim=-1)  # (H, 2) each
    for h in range(weights.size(0)):
        keys = ", ".join(f"({src_pieces[k]!r}, {w:.2f})" for w, k in zip(top_weights[h], top_keys[h]))
        log(f"  head {h}: [{keys}]")


def print_top_sources(weights: torch.Tensor, src_pieces: list[str], labels: list[str], title: str,
                      log=print) -> None:  # fmt: skip
    """weights (H, T, S) of one layer's cross-attention, padding columns dropped: the top source token of
    the heads' mean, then of each head."""
    H, width = weights.size(0), max(len(label) for label in [ROWS, *labels]) + 1
    log(f"\n== 4. top source token per head: {title} cross-attention (weight) ==")
    heads = "".join(f" {f'head {h}':<13}" for h in range(H))
    log(f"{ROWS:<{width}} {'mean of heads':<14}{heads}")
    mean_weight, mean_best = weights.mean(dim=0).max(dim=-1)  # (T,) each
    best_weight, best = weights.max(dim=-1)  # (H, T) each
    for t, label in enumerate(labels):
        cells = [f"{src_pieces[best[h, t]][:8]} {best_weight[h, t]:.2f}" for h in range(H)]
        mean = f"{src_pieces[mean_best[t]][:8]} {mean_weight[t]:.2f}"
        log(f"{label:<{width}} {mean:<14}" + "".join(f" {cell:<13}" for cell in cells))


def print_alignment(weights: torch.Tensor, src_pieces: list[str], tgt_pieces: list[str], title: str,
                    log=print) -> list[tuple[int, int]]:  # fmt: skip
    """weights (T', S') heads averaged, rows/columns with EOS; the pieces without EOS."""
    pairs = word_alignment(weights, src_pieces, tgt_pieces)
    src_words, tgt_words = words(src_pieces), words(tgt_pieces)
    log(f"\n== 5. word alignment: {title} cross-attention, heads averaged, sub-words merged ==")
    log(f"{'target word':<16} source word(s)")
    for j, word in enumerate(tgt_words):
        linked = [f"{i}:{src_words[i]}" for i, k in pairs if k == j]
        log(f"{str(j) + ':' + word:<16} {', '.join(linked) or '-'}")
    log("pharaoh (source-target): " + " ".join(f"{i}-{j}" for i, j in pairs))
    return pairs


def print_decoder_self(weights: torch.Tensor, labels: list[str], future: float, title: str, n: int = 5,
                       log=print) -> None:  # fmt: skip
    """weights (T, T): one decoder layer's self-attention, heads averaged; ``future``: the largest weight
    above the diagonal in every head of every decoder layer."""
    log(f"\n== 6. decoder self-attention: {title}, mean of heads, first {n} rows × {n} columns ==")
    log(f"weight above the diagonal (the future), every head of every decoder layer: max {future:.1e}")
    width = max(len(label) for label in [ROWS, *labels[:n]]) + 1
    keys = [label.split(" -> ")[0][:5] for label in labels[:n]]  # the keys are the tokens read
    log(f"{ROWS:<{width}}" + "".join(f" {key:>5}" for key in keys))
    for label, row in zip(labels[:n], weights[:n, :n]):
        log(f"{label:<{width}}" + "".join(f" {w:5.2f}" for w in row))


def print_mistakes(rows: dict, log=print) -> None:
    """rows: {block: {"ours": Δ, mistake: Δ or None (does not apply)}}; one row per mistake, one column per
    block, BLOCKS_PER_ROW blocks at a time."""
    log("\n== 7. the eight classic mistakes (bench/mistakes.py): max |Δ| from Marian's block, each block fed "
        "Marian's own inputs; '-': the block is causal already ==")  # fmt: skip
    names = list(rows)
    for start in range(0, len(names), BLOCKS_PER_ROW):
        blocks = names[start : start + BLOCKS_PER_ROW]
        log(f"{'':<22}" + "".join(f" {name:>15}" for name in blocks))
        for key, title in {"ours": "ours", **MISTAKES}.items():
            cells = ["-" if rows[b][key] is None else f"{rows[b][key]:.2e}" for b in blocks]
            log(f"{title:<22}" + "".join(f" {cell:>15}" for cell in cells))
