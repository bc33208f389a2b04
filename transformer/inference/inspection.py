"""Looking inside translations: for each translated (or scored) sentence, its Pharaoh word alignments, every
attention weight as arrays (numpy ``.npz``), and cross-attention heatmaps (PNG and TensorBoard).

``translate.py``'s ``--alignments``, ``--attention-out`` and ``--attention`` write through ``Inspection``;
the weights come from ``Translator.attention_ids`` (one forward pass over the pair).
"""

from pathlib import Path

import numpy as np
import torch

from transformer.inference.alignment import pharaoh
from transformer.inference.translator import Translator
from transformer.runtime.attention_maps import SentenceAttention


def attention_arrays(key: str, attention: SentenceAttention) -> dict[str, np.ndarray]:
    """One sentence's weights and labels for ``--attention-out``: (L, H, Tq, Tk) per kind."""
    arrays = {f"{key}/{kind}": torch.stack(getattr(attention, kind)).numpy()  # (L, H, Tq, Tk)
              for kind in ("cross", "encoder_self", "decoder_self")}  # fmt: skip
    for name in ("source_pieces", "target_pieces", "input_pieces"):
        arrays[f"{key}/{name}"] = np.array(getattr(attention, name), dtype=str)
    return arrays


class Inspection:
    """The inspection outputs of a run: whichever of alignments (a text stream, one line per input line),
    arrays (saved to ``arrays_path`` at the end) and heatmaps (into ``heatmap_dir``) were asked for."""

    def __init__(
        self, translator: Translator, align_stream=None, align_layer: int | None = None,
        arrays_path: str | None = None, heatmap_dir: str | None = None, target_label: str = "hyp",
    ):  # fmt: skip
        self.translator, self.align_stream, self.align_layer = translator, align_stream, align_layer
        self.arrays_path, self.arrays = arrays_path, {} if arrays_path else None
        self.heatmap_dir, self.target_label, self.writer = heatmap_dir, target_label, None
        if heatmap_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(heatmap_dir))

    @property
    def wanted(self) -> bool:
        return self.align_stream is not None or self.arrays is not None or self.writer is not None

    def add(self, n: int, source: list[int] | None, target: list[int], ended: bool) -> str:
        """Line ``n``'s outputs; returns its alignment line ("" for a blank source or none asked for)."""
        if source is None or not self.wanted:
            return ""
        attention = self.translator.attention_ids(source, target, ended)
        tag = f"line_{n:05d}"
        if self.arrays is not None:
            self.arrays |= attention_arrays(tag, attention)
        if self.writer is not None:
            self.draw(tag, attention, source, target)
        if self.align_stream is None:
            return ""
        return pharaoh(self.translator.alignments_of(attention, self.align_layer))

    def draw(self, tag: str, attention: SentenceAttention, source: list[int], target: list[int]) -> None:
        """Cross-attention heatmaps (PNG and TensorBoard) and the top-source table of one line."""
        from transformer.runtime.plotting import (
            add_attention_figures,  # matplotlib loads when a figure is drawn
        )

        decode = self.translator.tokenizer.decode
        labels = attention.labels
        add_attention_figures(
            self.writer, tag, attention.batched(), labels, 0, png_dir=Path(self.heatmap_dir)
        )
        text = f"**src** {decode(source)}  \n**{self.target_label}** {decode(target)}"
        self.writer.add_text(f"{tag}/text", text, 0)

    def close(self) -> None:
        """Save the arrays and close the writer; an unwritable arrays file is an OSError naming it."""
        if self.writer is not None:
            self.writer.close()
        if self.arrays is not None:
            try:
                np.savez_compressed(self.arrays_path, **self.arrays)
            except OSError as error:
                raise OSError(f"cannot write --attention-out {self.arrays_path}: {error}") from None
