"""Attention heatmaps: one figure per layer (mean of heads) and a grid of one layer's heads.

``add_attention_figures`` is THE writer of these pictures, for ``train.py`` (validation sentences) and
``translate.py`` (translated lines): TensorBoard images through the caller's ``SummaryWriter``, and PNG files.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no screen needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

# what the keys (x axis) and queries (y axis) of each kind of attention are
AXES = {
    "cross": ("source", "target (predicted)"),
    "encoder_self": ("source (keys)", "source (queries)"),
    "decoder_self": ("target input (keys)", "target input (queries)"),
}


def _draw(
    ax, weights: np.ndarray, src_labels: list[str], tgt_labels: list[str], title: str, kind: str
) -> None:
    ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6), aspect="auto")
    ax.set_xticks(range(len(src_labels)))
    ax.set_xticklabels(src_labels, rotation=90, fontsize=8)
    ax.set_yticks(range(len(tgt_labels)))
    ax.set_yticklabels(tgt_labels, fontsize=8)
    ax.set_xlabel(AXES[kind][0])
    ax.set_ylabel(AXES[kind][1])
    ax.set_title(title, fontsize=9)


def attention_figure(
    weights: torch.Tensor, src_labels: list[str], tgt_labels: list[str], title: str, kind: str = "cross"
):
    """weights (Tq, Tk) -> a labelled heatmap figure."""
    size = (max(4.0, 0.3 * len(src_labels) + 1.5), max(3.0, 0.3 * len(tgt_labels) + 1.5))
    fig, ax = plt.subplots(figsize=size, dpi=80)
    _draw(ax, weights.float().cpu().numpy(), src_labels, tgt_labels, title, kind)
    fig.tight_layout()
    return fig


def heads_figure(
    weights: torch.Tensor, src_labels: list[str], tgt_labels: list[str], title: str, kind: str = "cross"
):
    """weights (H, Tq, Tk) -> a grid of one heatmap per head."""
    H = weights.size(0)
    cols = min(H, 4)
    rows = (H + cols - 1) // cols
    cell = (max(3.0, 0.25 * len(src_labels) + 1.5), max(2.5, 0.25 * len(tgt_labels) + 1.5))
    fig, axes = plt.subplots(rows, cols, figsize=(cell[0] * cols, cell[1] * rows), dpi=70, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h < H:
            _draw(ax, weights[h].float().cpu().numpy(), src_labels, tgt_labels, f"{title} head {h}", kind)
        else:
            ax.axis("off")
    fig.tight_layout()
    return fig


def alignment_figures(
    attention,
    src_labels: list[str],
    tgt_labels: list[str],
    kind: str = "cross",
    heads: bool = True,
    head_layer: int = -1,
) -> dict[str, "plt.Figure"]:
    """Figures for one sentence: ``{kind}/layer_i`` (mean of heads) and ``{kind}/heads_layer_j``.

    ``attention``: a list over layers of (H, Tq, Tk) weights for this sentence; ``kind`` is "cross",
    "encoder_self" or "decoder_self" (its labels: keys on x, queries on y). ``heads``: add the grid of
    the heads of layer ``head_layer``.
    """
    figures = {}
    for i, layer in enumerate(attention):
        figures[f"{kind}/layer_{i}"] = attention_figure(
            layer.mean(dim=0), src_labels, tgt_labels, f"{kind} layer {i} (mean of heads)", kind
        )
    if heads:
        j = head_layer % len(attention)
        figures[f"{kind}/heads_layer_{j}"] = heads_figure(
            attention[j], src_labels, tgt_labels, f"layer {j}", kind
        )
    return figures


def top_sources_table(
    attention: list[torch.Tensor], src_labels: list[str], tgt_labels: list[str], k: int = 3
) -> str:
    """The tabular view of cross-attention: for each layer, a Markdown table with a row per target token
    and a column per head, each cell the ``k`` source tokens that head attends to most, with their weights.
    ``attention``: a list over layers of (H, T, S) weights for one sentence."""
    cell = lambda label: label.replace("|", "\\|")  # noqa: E731 (a "|" would end the table cell)
    parts = []
    for i, layer in enumerate(attention):
        H = layer.size(0)
        weights, sources = layer.float().topk(min(k, layer.size(-1)), dim=-1)  # (H, T, k) each
        lines = [f"**layer {i}**", "", "| target | " + " | ".join(f"head {h}" for h in range(H)) + " |"]
        lines.append("|" + " --- |" * (H + 1))
        for t, label in enumerate(tgt_labels):
            cells = [
                ", ".join(
                    f"{cell(src_labels[s])} {w:.2f}"
                    for w, s in zip(weights[h, t].tolist(), sources[h, t].tolist())
                )
                for h in range(H)
            ]
            lines.append(f"| {cell(label)} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def add_attention_figures(
    writer,
    tag: str,
    attention,
    labels: tuple[list[str], list[str], list[str]],
    step: int,
    kinds: tuple[str, ...] = ("cross",),
    png_dir: Path | None = None,
) -> None:
    """One sentence's heatmaps to TensorBoard as ``{tag}/{kind}/layer_i`` (and the heads of the last layer
    for cross-attention); with ``png_dir``, also as files ``{tag}_{kind}_layer_i.png``. For
    cross-attention also the ``top_sources_table``: text ``{tag}/cross/top_sources``, file
    ``{tag}_cross_top_sources.md``.

    ``attention``: a ``model.Attention`` of batch size 1; ``labels``: (source pieces, pieces each decoder
    row predicted, pieces each decoder row read): ``translator.SentenceAttention.labels``.
    """
    src_labels, tgt_labels, in_labels = labels
    axes = {
        "cross": (src_labels, tgt_labels),
        "encoder_self": (src_labels,) * 2,
        "decoder_self": (in_labels,) * 2,
    }
    for kind in kinds:
        layers = [w[0] for w in getattr(attention, kind)]  # (H, Tq, Tk) per layer
        if kind == "cross":
            table = top_sources_table(layers, *axes[kind])
            writer.add_text(f"{tag}/cross/top_sources", table, step)
            if png_dir is not None:
                (png_dir / f"{tag}_cross_top_sources.md").write_text(table + "\n", encoding="utf-8")
        figures = alignment_figures(layers, *axes[kind], kind, heads=kind == "cross")
        for name, fig in figures.items():
            if png_dir is not None:
                fig.savefig(png_dir / f"{tag}_{name.replace('/', '_')}.png")
            writer.add_figure(f"{tag}/{name}", fig, step)  # closes the figure
