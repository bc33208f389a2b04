"""The tables of ``lesson/released_model.py``: figures in, lines out (``log``); top entries picked here.

Layers and heads are counted from 0, as the block names (``decoder.2.cross``) and ``translate.py
--align-layer``; each title also gives the layer counted from 1, the way a reader would say it. Decoder rows
are labelled ``read -> predicted``: row i reads the decoder input token ``tgt_in[i]`` (the start token first,
then the translation shifted right) and predicts ``predicted[i]``.
"""

import torch
from mistakes import MISTAKES

from transformer.inference.alignment import word_alignment, word_index

KIND_MASKS = {"encoder": "padding", "decoder": "causal", "cross": "padding"}
USES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}
ROWS = "read -> predicted"  # the title of the decoder rows' labels
BLOCKS_PER_ROW = 6  # columns of the mistakes table before it wraps (18 blocks in a 6+6 model)


def layer_title(stack: str, layer: int, count: int) -> str:
    """'decoder layer 2 (from 0; layer 3 of 6 counted from 1)'."""
    return f"{stack} layer {layer} (from 0; layer {layer + 1} of {count} counted from 1)"


def row_labels(read: list[str], predicted: list[str]) -> list[str]:
    """'<pad> -> ▁Zwei': the decoder input token each row reads, and the token it predicts."""
    return [f"{r} -> {p}" for r, p in zip(read, predicted)]


def words(pieces: list[str]) -> list[str]:
    """Sub-word pieces merged into words (the rule of ``transformer.inference.alignment``)."""
    index = word_index(pieces)
    merged = [""] * (index[-1] + 1 if index else 0)
    for piece, word in zip(pieces, index):
        merged[word] += piece
    return [word.replace("\u2581", "") or "\u2581" for word in merged]


def print_layout(pairs: dict, hf_config, log=print) -> None:
    """pairs: {block name: (ours, Marian's MarianAttention, kind)}. The first Marian block's projection
    shapes and its parameters counted on the model, beside 4 x D² + 4 x D; and whether all blocks agree."""
    counts = {name: sum(p.numel() for p in block.parameters()) for name, (_, block, _) in pairs.items()}
    name, (_, block, _) = next(iter(pairs.items()))
    D, H = hf_config.d_model, block.num_heads
    log(f"d_model {D}, heads {H}, d_k = d_v = {block.head_dim}, encoder layers {hf_config.encoder_layers}, "
        f"decoder layers {hf_config.decoder_layers}; one attention block ({name}):")  # fmt: skip
    for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
        log(f"  {proj:<8} weight {tuple(getattr(block, proj).weight.shape)}")
    same = "yes" if len(set(counts.values())) == 1 else f"NO: {counts}"
    log(f"parameters in one multi-head attention block: {counts[name]:,} (4 x {D} x {D} + 4 x {D} = "
        f"{4 * D * D + 4 * D:,}); the same in all {len(counts)} blocks: {same}")  # fmt: skip


def print_blocks(rows: dict, dtype: str, log=print) -> None:
    log(f"\n== 1. per-block differences, our attention vs Marian's modules (forward hooks, {dtype}) ==")
    log(f"{'block':<18} {'mask':<8} {'output max|Δ|':>14} {'weights max|Δ|':>15} {'max|output|':>12}")
    for name, row in rows.items():
        mask = KIND_MASKS[row["kind"]]
        log(f"{name:<18} {mask:<8} {row['output']:14.2e} {row['weights']:15.2e} {row['scale']:12.3f}")


def print_plain(rows: dict, dtype: str, log=print) -> None:
    """rows: {block: {"ours", "plain", "scale", "kind", "shapes"}} for the three blocks of the first layer;
    shapes: the plain formula's query input, key and value input, weights and output."""
    log(f"\n== 2. the plain formula (x @ W + b, scores / √d_k, -inf mask; {dtype}) on layer 0's blocks, fed "
        "Marian's inputs: max |Δ| from Marian's block output ==")  # fmt: skip
    log(f"{'block':<18} {'ours':>10} {'plain formula':>14} {'max|output|':>12}")
    for name, row in rows.items():
        log(f"{name:<18} {row['ours']:10.2e} {row['plain']:14.2e} {row['scale']:12.3f}")
    log("the three uses (the plain formula's shapes):")
    for name, row in rows.items():
        x, kv, weights, out = row["shapes"]
        if row["kind"] == "cross":
            chain = (
                f"queries {x} from the decoder, keys and values {kv} from the encoder -> weights {weights}"
            )
        else:
            chain = f"x {x} -> weights {weights}"
        log(f"  {USES[row['kind']]:<22} ({name}): {chain} -> output {out}")
    largest = ", ".join(f"{USES[row['kind']]} {row['scale']:.1f}" for row in rows.values())
    log(f"largest |output| of each block: {largest}")


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


def print_cross_row(weights: torch.Tensor, src_pieces: list[str], read: str, label: str, title: str,
                    log=print) -> list[tuple[str, float]]:  # fmt: skip
    """weights (H, S): one decoder row of one layer's cross-attention, padding dropped; the top 3 source
    tokens of the heads' mean."""
    top_weights, top_keys = weights.mean(dim=0).topk(min(3, weights.size(-1)))  # (3,) each
    top = [(src_pieces[k], w.item()) for w, k in zip(top_weights, top_keys)]
    keys = ", ".join(f"({piece!r}, {w:.2f})" for piece, w in top)
    log(f"{title} cross-attention, query {read!r} (row {label}), mean of {weights.size(0)} heads, top keys: "
        f"[{keys}]")  # fmt: skip
    return top


def future_weight(our_outputs: dict, n_layers: int) -> float:
    """The largest weight above the diagonal (a key in the query's future) of every decoder self-attention."""
    weights = [our_outputs[f"decoder.{i}.self"][1] for i in range(n_layers)]  # (1, H, T, T) each
    return max(w.triu(diagonal=1).abs().max().item() for w in weights)


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


def print_reading(our_outputs: dict, s, pick: dict, hf_config, log=print) -> dict:
    """Parts 3 to 6 from our blocks' outputs {name: (output, weights)}, padding columns dropped; s: the
    ``Sentence``; pick: the layers and rows asked for (``choices``, with "target")."""
    n_encoder, n_decoder, S = hf_config.encoder_layers, hf_config.decoder_layers, len(s.src_pieces)
    weights = {name: w[0].float() for name, (_, w) in our_outputs.items()}  # (H, Tq, Tk) each
    encoder = weights[f"encoder.{pick['encoder_layer']}.self"][:, :S, :S]  # (H, S, S)
    print_encoder_heads(encoder, s.src_pieces, pick["query"], pick["encoder_layer"], n_encoder, log)
    title = layer_title("decoder", pick["layer"], n_decoder)
    cross = weights[f"decoder.{pick['layer']}.cross"][:, :, :S]  # (H, T, S)
    labels = row_labels(s.read, s.predicted)
    print_top_sources(cross, s.src_pieces, labels, title, log)
    row = weights[f"decoder.{pick['cross_layer']}.cross"][:, pick["target"], :S]  # (H, S)
    cross_title = layer_title("decoder", pick["cross_layer"], n_decoder)
    read, label = s.read[pick["target"]], labels[pick["target"]]
    top3 = print_cross_row(row, s.src_pieces, read, label, cross_title, log)
    targets = s.predicted[: s.n_target]  # without EOS
    alignment = print_alignment(cross.mean(dim=0), s.src_pieces[:-1], targets, title, log)
    future = future_weight(our_outputs, n_decoder)
    last = weights[f"decoder.{n_decoder - 1}.self"].mean(dim=0)  # (T, T)
    last_title = layer_title("decoder", n_decoder - 1, n_decoder)
    print_decoder_self(last, labels, future, last_title, log=log)
    return {"alignment": alignment, "future": future, "labels": labels, "top3": top3}


def print_mistakes(rows: dict, log=print) -> None:
    """rows: {block: {"ours": Δ, mistake: Δ or None (does not apply)}}; one row per mistake, one column per
    block, BLOCKS_PER_ROW blocks at a time."""
    log("\n== 7. the eight classic mistakes (lesson/mistakes.py): max |Δ| from Marian's block, each block "
        "fed "
        "Marian's own inputs; '-': the block is causal already ==")  # fmt: skip
    names = list(rows)
    for start in range(0, len(names), BLOCKS_PER_ROW):
        blocks = names[start : start + BLOCKS_PER_ROW]
        log(f"{'':<22}" + "".join(f" {name:>15}" for name in blocks))
        for key, title in {"ours": "ours", **MISTAKES}.items():
            cells = ["-" if rows[b][key] is None else f"{rows[b][key]:.2e}" for b in blocks]
            log(f"{title:<22}" + "".join(f" {cell:>15}" for cell in cells))


def print_text_mistakes(text: dict, src_pieces: list[str], query: int, title: str, log=print) -> None:
    """text: ``text_mistakes``'s figures for one encoder block; its weights (H, S + pad, S + pad), of which
    the rows of the S real tokens count (the padded keys get 0 anyway)."""
    S = len(src_pieces)
    right, wrong = text["weights"][:, :S], text["no_scale_weights"][:, :S]  # (H, S, S + pad) each
    log(f"\n== 8. the walk-through's mistakes 1 and 3: {title} self-attention, fed Marian's input: max |Δ| "
        "from Marian's block output ==")  # fmt: skip
    log("mistake 1, no scale:")
    log(f"  query {src_pieces[query]!r}, head 0: top weight {right[0, query].max():.2f} with the scale, "
        f"{wrong[0, query].max():.2f} without")  # fmt: skip
    log(f"  largest weight in any row, all heads: {right.max():.3f} with the scale, {wrong.max():.3f} "
        "without")  # fmt: skip
    log(f"  output: max |Δ| {text['no_scale']:.2e}")
    shapes, right_split = text["split_shapes"], text["right_split"]
    shown = shapes[0] if len(set(shapes)) == 1 else ", ".join(map(str, shapes))
    looks = "look right" if set(shapes) == {right_split} else f"the right split gives {right_split}"
    merged = "looks right" if text["merge_shape"] == text["right_shape"] else f"right: {text['right_shape']}"
    log("mistake 3, wrong axes:")
    log(f"  split with view(batch, h, n, d_k), no transpose: shapes {shown} ({looks}), max |Δ| "
        f"{text['split']:.2e}")  # fmt: skip
    log(f"  right split, but merge with reshape and no transpose: output {text['merge_shape']} ({merged}), "
        f"max |Δ| {text['merge']:.2e}")  # fmt: skip
    log(f"  right split and right merge: max |Δ| {text['right']:.2e}")
