"""Attention heatmaps: one figure per decoder layer (mean of heads) and a grid of one layer's heads.

Returns matplotlib figures (for PNG files) or HWC uint8 arrays (for TensorBoard ``add_image``). No writer
here: ``train.py`` and ``translate.py`` decide where the pictures go.
"""

import matplotlib

matplotlib.use("Agg")  # no screen needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402


def _draw(ax, weights: np.ndarray, src_labels: list[str], tgt_labels: list[str], title: str) -> None:
    ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6), aspect="auto")
    ax.set_xticks(range(len(src_labels)))
    ax.set_xticklabels(src_labels, rotation=90, fontsize=8)
    ax.set_yticks(range(len(tgt_labels)))
    ax.set_yticklabels(tgt_labels, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    ax.set_title(title, fontsize=9)


def attention_figure(weights: torch.Tensor, src_labels: list[str], tgt_labels: list[str], title: str):
    """weights (Tq, Tk) -> a labelled heatmap figure."""
    size = (max(4.0, 0.3 * len(src_labels) + 1.5), max(3.0, 0.3 * len(tgt_labels) + 1.5))
    fig, ax = plt.subplots(figsize=size, dpi=80)
    _draw(ax, weights.float().cpu().numpy(), src_labels, tgt_labels, title)
    fig.tight_layout()
    return fig


def heads_figure(weights: torch.Tensor, src_labels: list[str], tgt_labels: list[str], title: str):
    """weights (H, Tq, Tk) -> a grid of one heatmap per head."""
    H = weights.size(0)
    cols = min(H, 4)
    rows = (H + cols - 1) // cols
    cell = (max(3.0, 0.25 * len(src_labels) + 1.5), max(2.5, 0.25 * len(tgt_labels) + 1.5))
    fig, axes = plt.subplots(rows, cols, figsize=(cell[0] * cols, cell[1] * rows), dpi=70, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h < H:
            _draw(ax, weights[h].float().cpu().numpy(), src_labels, tgt_labels, f"{title} head {h}")
        else:
            ax.axis("off")
    fig.tight_layout()
    return fig


def figure_to_array(fig) -> np.ndarray:
    """A figure as an (H, W, 3) uint8 image for ``SummaryWriter.add_image(..., dataformats="HWC")``."""
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image


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
            layer.mean(dim=0), src_labels, tgt_labels, f"{kind} layer {i} (mean of heads)"
        )
    if heads:
        j = head_layer % len(attention)
        figures[f"{kind}/heads_layer_{j}"] = heads_figure(attention[j], src_labels, tgt_labels, f"layer {j}")
    return figures
